"""Training-control server through the in-process MCP client: every tool, its errors, the resource, prompts."""

from __future__ import annotations

import pytest
from mcp_testlib import SyncClient, make_run

from evotrainer.servers.app import build_server
from evotrainer.workspace import Workspace

TRAINING_TOOLS = {"list_versions", "get_version", "diff_versions", "propose_intervention", "start_training",
                  "evaluate_version", "job_status", "list_jobs", "cancel_job", "decide", "server_info"}


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path)


@pytest.fixture
def client(run):
    c = SyncClient(build_server("training", run))
    yield c
    c.close()


def test_tool_catalogue_has_schemas_and_descriptions(client):
    tools = {t.name: t for t in client.tools()}
    assert set(tools) == TRAINING_TOOLS
    for t in tools.values():
        assert t.description and t.output_schema, t.name
    # arguments carry descriptions (units) for the model
    assert "GRPO steps" in tools["start_training"].input_schema["properties"]["steps"]["description"]


def test_server_info(client, run):
    info = client.ok("server_info")
    assert info["server"] == "evotrainer-training" and info["toolsets"] == ["training"]
    assert info["run_dir"] == str(run.resolve()) and info["run_exists"] and info["running_jobs"] == []


def test_list_get_diff(client):
    page = client.ok("list_versions", {"limit": 1})
    assert page["total"] == 2 and page["next_offset"] == 1
    assert page["versions"][0]["id"] == "v0" and page["versions"][0]["interventions"] == []
    page2 = client.ok("list_versions", {"offset": 1})
    assert [v["id"] for v in page2["versions"]] == ["v1"] and page2["next_offset"] is None
    assert client.ok("list_versions", {"status": "kept"})["total"] == 0
    v1 = client.ok("get_version", {"version_id": "v1"})
    assert v1["parent_id"] == "v0" and v1["recipe"]["eps_clip_high"] == 0.3
    assert v1["interventions"][0]["path"] == "eps_clip_high"
    assert client.ok("get_version", {"version_id": "v0"})["children"] == ["v1"]
    diff = client.ok("diff_versions", {"a": "v0", "b": "v1"})
    assert diff["changes"] == [{"path": "eps_clip_high", "a_value": 0.28, "b_value": 0.3}]


def test_unknown_versions_and_bad_arguments_are_tool_errors(client):
    assert "'v9' not found; known versions: v0, v1" in client.err("get_version", {"version_id": "v9"})
    assert "not found" in client.err("diff_versions", {"a": "v0", "b": "nope"})
    assert "limit" in client.err("list_versions", {"limit": 0})
    assert "status" in client.err("list_versions", {"status": "weird"})
    # argument errors: one clause per bad argument, with the rule and the argument's description
    assert client.err("list_versions", {"limt": 5, "limit": 0}) == (
        "Error executing tool list_versions: invalid arguments: limit=0: Input should be greater than or equal "
        "to 1 (Versions per page.); limt: unknown argument; allowed: status, offset, limit")
    assert client.err("get_version", {}) == ("Error executing tool get_version: invalid arguments: version_id: "
                                             "required argument missing (Version id, e.g. 'v0' (list_versions "
                                             "shows them).)")
    # the server keeps serving after errors
    assert client.ok("list_versions")["total"] == 2


def test_propose_intervention_creates_single_factor_child(client):
    v = client.ok("propose_intervention", {
        "parent_id": "v1", "path": "temperature", "new_value": 0.8, "hypothesis": "cooler sampling",
        "expected_metric": "eval/avg@k", "expected_direction": "up", "source": "skill:temperature_down"})
    assert v["id"] == "v2" and v["parent_id"] == "v1" and v["status"] == "proposed"
    iv = v["interventions"][0]
    assert (iv["path"], iv["old"], iv["new"], iv["category"]) == ("temperature", 1.0, 0.8, "rollout")
    assert iv["expected_effect"] == {"metric": "eval/avg@k", "direction": "up"}
    # a new reward component: old value is null
    v3 = client.ok("propose_intervention", {"parent_id": "v0", "path": "reward.format.weight", "new_value": 0.5})
    assert v3["interventions"][0]["old"] is None and v3["recipe"]["reward"]["format"]["weight"] == 0.5
    # errors name the field and the fix
    assert "no such field path" in client.err("propose_intervention", {"parent_id": "v0", "path": "eps_clip_hig",
                                                                        "new_value": 0.3})
    assert "changes nothing" in client.err("propose_intervention", {"parent_id": "v0", "path": "temperature",
                                                                     "new_value": 1.0})
    assert "at least 2 samples" in client.err("propose_intervention", {"parent_id": "v0",
                                                                        "path": "n_samples_per_prompt", "new_value": 1})
    assert "together" in client.err("propose_intervention", {"parent_id": "v0", "path": "temperature",
                                                              "new_value": 0.5, "expected_metric": "eval/avg@k"})


def test_decide_keep_prune_revert_merge(client):
    client.ok("propose_intervention", {"parent_id": "v0", "path": "temperature", "new_value": 0.8})  # v2
    d = client.ok("decide", {"version_id": "v1", "action": "keep", "rationale": "gain 0.1, CI [0.02, 0.18]",
                             "evidence": ["eval:heldout"]})
    assert d["decision"]["prev_status"] == "proposed" and d["version"]["status"] == "kept"
    assert "merge needs two kept siblings; not kept: v2 (proposed)" in client.err(
        "decide", {"version_id": "v1", "action": "merge", "rationale": "x", "merge_with": "v2"})
    client.ok("decide", {"version_id": "v2", "action": "keep", "rationale": "gain 0.05"})
    m = client.ok("decide", {"version_id": "v1", "action": "merge", "rationale": "independent paths",
                             "merge_with": "v2"})
    assert m["version"]["id"] == "v3" and m["version"]["status"] == "merged" and m["version"]["parent_id"] == "v0"
    assert m["version"]["interventions"] == ["eps_clip_high: 0.28 -> 0.3", "temperature: 1.0 -> 0.8"]
    assert m["decision"]["evidence"] == ["v1", "v2"]
    r = client.ok("decide", {"version_id": "v2", "action": "revert", "rationale": "held-out drop on rerun"})
    assert r["version"]["status"] == "reverted"
    assert "only a kept version can be reverted" in client.err(
        "decide", {"version_id": "v2", "action": "revert", "rationale": "again"})
    assert "needs merge_with" in client.err("decide", {"version_id": "v1", "action": "merge", "rationale": "x"})
    assert "only for action=merge" in client.err("decide", {"version_id": "v1", "action": "prune", "rationale": "x",
                                                            "merge_with": "v2"})
    assert "rationale" in client.err("decide", {"version_id": "v1", "action": "prune", "rationale": ""})
    assert "decided" in client.err("start_training", {"version_id": "v1", "steps": 1})
    assert [x["action"] for x in client.ok("get_version", {"version_id": "v2"})["decisions"]] == ["keep", "revert"]


def test_decide_stores_the_gates_damaged_weights(client, run):
    # gate_version's damaged_weights travels typed into the decision: the lineage restarts v1's children from v0
    assert "not to keep or merge it" in client.err("decide", {"version_id": "v1", "action": "keep", "rationale": "x",
                                                              "damaged_weights": "entropy_collapse"})
    d = client.ok("decide", {"version_id": "v1", "action": "prune", "rationale": "entropy collapsed",
                             "evidence": ["finding:entropy_collapse:v1"], "damaged_weights": "entropy_collapse"})
    assert d["decision"]["damaged_weights"] == "entropy_collapse"
    with Workspace.open(run) as ws:
        assert ws.lineage.damaged("v1") == "entropy_collapse"


def test_job_errors_and_lineage_resource(client):
    assert "job 'nope' not found" in client.err("job_status", {"job_id": "nope"})
    assert "not found" in client.err("cancel_job", {"job_id": "nope"})
    assert client.ok("list_jobs") == {"jobs": []}
    assert "steps" in client.err("start_training", {"version_id": "v1", "steps": 0})
    tree = client.read("lineage://tree")
    assert tree["tree"]["id"] == "v0" and [c["id"] for c in tree["tree"]["children"]] == ["v1"]
    assert tree["decisions"] == []


def test_prompts_list_the_lineage(client):
    text = client.prompt("diagnose_run", {"version_id": "v1"})
    assert "Diagnose v1" in text and "- v1 (parent v0) proposed: eps_clip_high: 0.28 -> 0.3" in text
    assert "propose_intervention" in client.prompt("propose_next_intervention", {"version_id": "v1"})


def test_missing_run_is_a_tool_error(tmp_path):
    c = SyncClient(build_server("training", tmp_path / "nothing"))
    try:
        assert "not a run folder" in c.err("list_versions")
        assert c.call("list_versions").is_error  # still serving
    finally:
        c.close()
    c = SyncClient(build_server("training", None))
    try:
        assert "--run PATH" in c.err("list_versions")
    finally:
        c.close()
