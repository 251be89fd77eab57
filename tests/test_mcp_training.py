"""Training-control server through the in-process MCP client: every tool, its errors, the resource, prompts."""

from __future__ import annotations

import pytest
from mcp_testlib import SyncClient, make_run

from evotrainer.agents.mcp_client import LOOP_TOOLS
from evotrainer.servers.app import build_server
from evotrainer.workspace import Workspace

TRAINING_TOOLS = {"list_versions", "get_version", "diff_versions", "propose_intervention", "start_training",
                  "evaluate_version", "job_status", "list_jobs", "cancel_job", "decide", "server_info",
                  "create_root", "branch_control", "propose_recipe", "record_gains"}


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
    assert "no such field path; did you mean 'eps_clip_high'?" in client.err(
        "propose_intervention", {"parent_id": "v0", "path": "eps_clip_hig", "new_value": 0.3})
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
    assert client.ok("list_jobs") == {"jobs": [], "omitted": 0}
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


# --- the loop's writes -----------------------------------------------------------------------------------
TINY_RECIPE = {"name": "tiny", "model": {"name_or_path": "tiny-random"}, "temperature": 0.9, "generate_max_len": 8}


def test_create_root_is_find_or_create_and_refuses_another_recipe(tmp_path):
    run = tmp_path / "run"
    Workspace(run).close()  # an empty run folder, as `evotrainer run` opens one
    c = SyncClient(build_server("training", run))
    try:
        made = c.ok("create_root", {"recipe": TINY_RECIPE, "note": "base recipe (static mode)"})
        v = made["version"]
        assert made["created"] and (v["id"], v["parent_id"], v["role"], v["status"]) == ("v0", None, "", "proposed")
        assert (v["recipe"]["temperature"], v["recipe"]["generate_max_len"], v["recipe"]["name"]) == (0.9, 8, "tiny")
        assert v["interventions"] == [] and v["note"] == "base recipe (static mode)"
        again = c.ok("create_root", {"recipe": TINY_RECIPE})
        assert not again["created"] and again["version"]["id"] == "v0" and c.ok("list_versions")["total"] == 1
        assert again["version"]["note"] == "base recipe (static mode)"  # returned as it is, not rewritten
        err = c.err("create_root", {"recipe": {**TINY_RECIPE, "temperature": 0.7}})
        assert "another base recipe (root v0 differs at temperature)" in err and "new run folder" in err
        assert "recipe.temperature" in c.err("create_root", {"recipe": {**TINY_RECIPE, "temperature": "hot"}})
        assert "unknown field" in c.err("create_root", {"recipe": {**TINY_RECIPE, "temprature": 0.9}})
        # a loop that started the run seals the test split: the new tools open no way around it
        with Workspace.open(run) as ws:
            ws.lineage.kv_set("loop/started_at", 1.0)
        assert "sealed" in c.err("evaluate_version", {"version_id": "v0", "eval_name": "test"})
        assert "sealed" in c.err("evaluate_version", {"version_id": "v0", "eval_name": "no_rl_test"})
    finally:
        c.close()


def test_branch_control_is_one_per_parent_and_not_of_damaged_weights(client):
    made = client.ok("branch_control", {"parent_id": "v0", "note": "control of v0 (round 1)"})
    ctl = made["version"]
    v0 = client.ok("get_version", {"version_id": "v0"})
    assert made["created"] and (ctl["id"], ctl["parent_id"], ctl["role"], ctl["status"]) == ("v2", "v0", "control",
                                                                                             "proposed")
    assert ctl["recipe"] == v0["recipe"] and ctl["interventions"] == [] and ctl["note"] == "control of v0 (round 1)"
    again = client.ok("branch_control", {"parent_id": "v0"})
    assert not again["created"] and again["version"]["id"] == "v2"
    assert v0["children"] == ["v1", "v2"] and v0["damaged_weights"] is None
    rows = client.ok("list_versions")["versions"]
    assert [(r["id"], r["role"]) for r in rows] == [("v0", ""), ("v1", ""), ("v2", "control")]
    assert "not found" in client.err("branch_control", {"parent_id": "v9"})
    client.ok("decide", {"version_id": "v1", "action": "prune", "rationale": "entropy collapsed",
                         "damaged_weights": "entropy_collapse"})
    assert client.ok("get_version", {"version_id": "v1"})["damaged_weights"] == "entropy_collapse"
    err = client.err("branch_control", {"parent_id": "v1"})
    assert "damaged weights (entropy_collapse)" in err and "nothing to continue" in err
    assert client.ok("list_versions")["total"] == 3


def test_propose_recipe_makes_one_child_with_several_interventions(client):
    v = client.ok("propose_recipe", {
        "parent_id": "v0", "hypothesis": "TPE sample", "source": "recipe-search", "note": "recipe-search trial 1",
        "changes": [{"path": "actor_learning_rate", "value": 1e-11}, {"path": "temperature", "value": 0.9},
                    {"path": "generate_max_len", "value": 128}]})
    assert (v["id"], v["parent_id"], v["role"], v["status"], v["note"]) == ("v2", "v0", "", "proposed",
                                                                            "recipe-search trial 1")
    assert [(iv["path"], iv["old"], iv["new"], iv["category"], iv["source"], iv["hypothesis"])
            for iv in v["interventions"]] == [
        ("actor_learning_rate", 1e-06, 1e-11, "optimizer", "recipe-search", "TPE sample"),  # 1e-11 is not rounded to 0
        ("temperature", 1.0, 0.9, "rollout", "recipe-search", "TPE sample"),
        ("generate_max_len", 64, 128, "rollout", "recipe-search", "TPE sample")]
    assert (v["recipe"]["actor_learning_rate"], v["recipe"]["temperature"], v["recipe"]["generate_max_len"]) == (
        1e-11, 0.9, 128)
    diff = client.ok("diff_versions", {"a": "v0", "b": "v2"})["changes"]
    assert {d["path"] for d in diff} == {"actor_learning_rate", "temperature", "generate_max_len"}
    # validated like propose_intervention: each change must apply to the parent's recipe
    two = [{"path": "temperature", "value": 0.9}, {"path": "temperature", "value": 0.8}]
    assert "temperature appear(s) more than once" in client.err("propose_recipe", {"parent_id": "v0", "changes": two})
    assert "changes nothing" in client.err("propose_recipe", {"parent_id": "v0", "changes": [
        {"path": "temperature", "value": 0.9}, {"path": "eps_clip_high", "value": 0.28}]})
    assert "no such field path" in client.err("propose_recipe", {"parent_id": "v0", "changes": [
        {"path": "eps_clip_hig", "value": 0.3}]})
    assert "at least 2 samples" in client.err("propose_recipe", {"parent_id": "v0", "changes": [
        {"path": "n_samples_per_prompt", "value": 1}]})
    assert "changes" in client.err("propose_recipe", {"parent_id": "v0", "changes": []})
    assert "value" in client.err("propose_recipe", {"parent_id": "v0", "changes": [{"path": "temperature"}]})
    assert client.ok("list_versions")["total"] == 3  # no error left a version behind


def test_record_gains_stores_the_gate_numbers_in_the_eval_summary(client, run):
    assert "no dev evaluation" in client.err("record_gains", {"version_id": "v1", "waived": ["truncation"]})
    with Workspace.open(run) as ws:
        ws.lineage.update_version("v1", eval_summary={"k": 2, "avg@k": 0.75, "eval_name": "heldout"})
    ctl = client.ok("branch_control", {"parent_id": "v0"})["version"]["id"]
    vs_control = {"version": ctl, "gain": 0.25, "ci": [0.05, 0.45], "p_value": 0.03}
    vs_parent = {"version": "v0", "gain": 0.5, "ci": [0.25, 0.75]}
    v = client.ok("record_gains", {"version_id": "v1", "vs_control": vs_control, "vs_parent": vs_parent,
                                   "waived": ["truncation"]})
    assert v["eval_summary"] == {"k": 2, "avg@k": 0.75, "eval_name": "heldout", "vs_control": vs_control,
                                 "vs_parent": vs_parent, "waived": ["truncation"]}
    # keys not given stay as they are
    v = client.ok("record_gains", {"version_id": "v1", "vs_parent": {**vs_parent, "gain": 0.4}})
    assert v["eval_summary"]["vs_control"] == vs_control and v["eval_summary"]["vs_parent"]["gain"] == 0.4
    with Workspace.open(run) as ws:
        assert ws.lineage.get("v1").eval_summary["vs_parent"] == {**vs_parent, "gain": 0.4}
    assert "the parent of v1 is 'v0'" in client.err("record_gains", {"version_id": "v1",
                                                                     "vs_parent": {**vs_parent, "version": ctl}})
    assert "v1 itself" in client.err("record_gains", {"version_id": "v1", "vs_control": {**vs_control, "version": "v1"}})
    assert "not found" in client.err("record_gains", {"version_id": "v1", "vs_control": {**vs_control,
                                                                                         "version": "v9"}})
    assert "ci" in client.err("record_gains", {"version_id": "v1", "vs_parent": {**vs_parent, "ci": [0.1]}})


def test_the_loops_tools_are_in_the_catalogue(client):
    names = {t.name for t in client.tools()}
    assert set(LOOP_TOOLS) - names <= {"gate_version"}  # gate_version is on the analyzers server
    assert {"create_root", "branch_control", "propose_recipe", "record_gains"} <= set(LOOP_TOOLS)
