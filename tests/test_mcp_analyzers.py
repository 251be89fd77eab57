"""Analyzer server: built-in analyzers, sandboxed code, registration, backtests and the gate (hand-sized run)."""

from __future__ import annotations

import json

import pytest
from mcp_testlib import SyncClient, make_run

from evotrainer.sandbox import sandbox_info
from evotrainer.servers.app import build_server
from evotrainer.workspace import Workspace

# Fires a warn finding on every version whose eval rewards average below 0.5 (reads evidence files).
LOW_EVAL_CODE = """
import json, os, pyarrow.parquet as pq
d = os.environ["EVIDENCE_DIR"]
t = pq.read_table(os.path.join(d, "rollouts.parquet")).to_pylist()
out = []
for v in sorted({r["version_id"] for r in t}):
    rs = [r["reward"] for r in t if r["version_id"] == v and r["split"] == "eval"]
    if rs and sum(rs) / len(rs) < 0.5:
        out.append({"kind": "low_eval", "severity": "warn", "versions": [v], "steps": [],
                    "evidence": ["eval"], "explanation": f"eval reward {sum(rs) / len(rs):.2f} < 0.5"})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("a"))
    with Workspace(run, writer=True) as ws:  # per-sample held-out outcomes, as the eval backend logs them
        ws.lineage.log_eval_samples("v0", "heldout", [("p1", 0, 1.0, "2"), ("p1", 1, 0.0, "3"),
                                                      ("p2", 0, 0.0, "5"), ("p2", 1, 0.0, "5")])
        ws.lineage.log_eval_samples("v1", "heldout", [("p1", 0, 1.0, "2"), ("p1", 1, 1.0, "2"),
                                                      ("p2", 0, 1.0, "4"), ("p2", 1, 0.0, "5")])
    return run


@pytest.fixture(scope="module")
def client(run):
    c = SyncClient(build_server("analyzers", run))
    yield c
    c.close()


def test_list_and_run_builtin_analyzers(client):
    names = {a["name"]: a for a in client.ok("list_analyzers")["analyzers"]}
    assert {"entropy_collapse", "zero_variance_groups", "truncation", "reward_hacking"} <= set(names)
    assert names["truncation"]["builtin"] and not names["truncation"]["sandboxed"]
    res = client.ok("run_analyzer", {"version_ids": ["v0"], "names": ["zero_variance_groups", "truncation"]})
    assert res["versions"] == ["v0"] and res["analyzers"] == ["zero_variance_groups", "truncation"]
    # v0 has train rollouts at steps 0 and 1 only. Both analyzers judge a level, which needs no trend
    # (issue 17): clipped ratio 2/4 = 0.5 at step 0 and 0 at step 1, median 0.25 >= 0.2 -> truncation warn;
    # one group of two has all-equal rewards at each step (g1 [0, 0], then g0 [1, 1]): 0.5 >= 0.5 ->
    # zero_variance_groups warn, cause mixed (solve none: median(0.5, 0) = 0.25, solve all: 0.25)
    assert [(f["kind"], f["severity"], f["steps"], f["judged"]) for f in res["findings"]] == [
        ("truncation", "warn", [0, 1], "level"), ("zero_variance_groups", "warn", [0, 1], "level")]
    assert res["findings"][0]["data"]["recent"] == 0.25 and res["findings"][1]["data"]["cause"] == "mixed"
    assert (res["n_blocking"], res["n_warn"]) == (0, 2)
    assert "unknown analyzer 'nope'" in client.err("run_analyzer", {"names": ["nope"]})
    assert "not found" in client.err("run_analyzer", {"version_ids": ["v9"]})
    assert "empty" in client.err("run_analyzer", {"version_ids": []})


def test_run_analyzer_code_in_sandbox(client):
    res = client.ok("run_analyzer_code", {"code": LOW_EVAL_CODE, "name": "low_eval"})
    # eval rewards: v0 (1+0+0+0)/4 = 0.25 < 0.5 fires; v1 (1+1+1+0)/4 = 0.75 does not
    assert [(f["kind"], f["versions"]) for f in res["findings"]] == [("low_eval", ["v0"])]
    assert res["backend"] == sandbox_info()["backend"] and res["exit_code"] == 0
    assert "syntax error at line 1" in client.err("run_analyzer_code", {"code": "def ("})
    err = client.err("run_analyzer_code", {"code": "import sys; sys.exit(3)"})
    assert "exited 3" in err
    # a bad finding is named field by field on one line (it was pydantic's dump, with its URLs, over 5 lines)
    err = client.err("run_analyzer_code", {"code": "print('[{\"kind\": \"x\", \"severity\": \"bad\"}]')"})
    assert err.endswith("analyzer 'sandboxed': findings[0].severity='bad': Input should be 'info', 'warn' or "
                        "'blocking'; findings[0].explanation: required (a finding has kind, severity, versions, "
                        "steps, evidence, explanation)"), err


def test_register_backtest_and_persist_analyzer(client, run):
    labels = {"v0": True, "v1": False}  # v0 "turned out bad"
    bt = client.ok("backtest_analyzer", {"code": LOW_EVAL_CODE, "labels": labels})
    # fires on v0 only: tp=1, tn=1 -> precision 1, recall 1, discriminates
    assert (bt["tp"], bt["fp"], bt["fn"], bt["tn"]) == (1, 0, 0, 1) and bt["discriminates"]
    assert bt["precision"] == 1.0 and bt["fired"] == {"v0": True, "v1": False}
    flipped = client.ok("backtest_analyzer", {"code": LOW_EVAL_CODE, "labels": {"v0": False, "v1": True}})
    assert (flipped["tp"], flipped["fp"]) == (0, 1) and not flipped["discriminates"]
    info = client.ok("register_analyzer", {"name": "low_eval", "code": LOW_EVAL_CODE, "kind": "low_eval",
                                           "description": "eval reward below one half"})
    assert info == {"name": "low_eval", "description": "eval reward below one half", "kinds": ["low_eval"],
                    "builtin": False, "sandboxed": True, "log_error": None}
    assert "registered already" in client.err("register_analyzer", {"name": "low_eval", "code": "print('[]')"})
    assert "built-in" in client.err("register_analyzer", {"name": "truncation", "code": "print('[]')"})
    res = client.ok("run_analyzer", {"names": ["low_eval"]})
    assert [f["versions"] for f in res["findings"]] == [["v0"]]
    assert client.ok("backtest_analyzer", {"name": "low_eval", "labels": labels})["discriminates"]
    assert "exactly one" in client.err("backtest_analyzer", {"labels": labels})
    # stored in the run: a fresh server (another process in practice) knows it
    with Workspace.open(run) as ws:
        assert json.loads(json.dumps(ws.lineage.kv_get("analyzers/registered")))["low_eval"]["kinds"] == ["low_eval"]


def test_rescore_and_replay_filter(client):
    r = client.ok("rescore_rollouts", {"version_id": "v0", "path": "reward.correctness.weight", "value": 2.0})
    # stored rewards = correctness: step 0 [1,0,0,0], step 1 [1,1,1,0] -> mean 4/8 = 0.5; doubled -> 1.0
    assert r["old_value"] == 1.0 and r["n_rollouts"] == 8 and r["n_groups"] == 4
    assert r["old_reward_mean"] == pytest.approx(0.5) and r["new_reward_mean"] == pytest.approx(1.0)
    assert r["corr_with_correct_old"] == pytest.approx(1.0) and r["corr_with_correct_new"] == pytest.approx(1.0)
    assert r["frac_zero_std_old"] == 0.5 and r["frac_zero_std_new"] == 0.5
    # stored advantages are 0 (make_record default); recomputed ones are +-1 in the 2 groups with variance
    # (4 of 8 samples) and 0 elsewhere -> sign flips 4/8
    assert r["frac_advantage_sign_flips"] == 0.5
    assert "use replay_filter" in client.err("rescore_rollouts", {"version_id": "v0", "path": "temperature",
                                                                   "value": 0.5})
    assert "no stored train rollouts" in client.err("rescore_rollouts", {"version_id": "v1",
                                                                          "path": "reward.format.weight", "value": 1})
    f = client.ok("replay_filter", {"version_id": "v0", "path": "drop_zero_variance_groups", "value": False})
    # one of two groups per step has zero variance: kept 1/2 with the drop, 2/2 without
    assert f["steps"] == [0, 1] and f["old"]["per_step_kept_frac"] == [0.5, 0.5]
    assert f["informative_frac_old"] == 0.5 and f["informative_frac_new"] == 1.0
    assert f["old"]["effective_batch_mean"] == 2.0 and f["new"]["effective_batch_mean"] == 4.0
    assert "use rescore_rollouts" in client.err("replay_filter", {"version_id": "v0", "path": "reward.format.weight",
                                                                   "value": 1})
    assert "group_filter_top_p" in client.err("replay_filter", {"version_id": "v0", "path": "group_filter_top_p",
                                                                 "value": 2.0})


def test_gate_version(client):
    g = client.ok("gate_version", {"version_id": "v1", "n_resamples": 1000})
    # paired per-problem scores: v0 (0.5, 0.0), v1 (1.0, 0.5): gain 0.5 on both problems -> CI [0.5, 0.5]
    assert g["parent_id"] == "v0" and g["n_problems"] == 2 and g["gain"] == pytest.approx(0.5)
    assert g["ci"] == pytest.approx([0.5, 0.5])
    # v1 logged no step metrics and its eval rollouts trip no analyzer: nothing blocks, the gain promotes
    assert g["promote"] and g["blocking"] == [] and g["reason"]
    root = client.ok("gate_version", {"version_id": "v0", "n_resamples": 1000})
    assert root["parent_id"] is None and root["gain"] is None
    assert "not found" in client.err("gate_version", {"version_id": "v5"})


def test_runtime_analyzer_of_one_run_does_not_judge_another(tmp_path):
    # Regression: runtime analyzers live in a process-wide registry; a second run served by the same
    # process must see only the built-ins and its own. Run A registers `always_blocking`; run B's
    # run_analyzer, list_analyzers and gate_version must not use it.
    code = ('import json; print(json.dumps([{"kind": "always_blocking", "severity": "blocking", '
            '"versions": ["v1"], "steps": [], "evidence": [], "explanation": "fires on v1"}]))')
    run_a, run_b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    a = SyncClient(build_server("analyzers", run_a))
    try:
        a.ok("register_analyzer", {"name": "always_blocking_x", "code": code, "kind": "always_blocking"})
        assert "always_blocking_x" in [x["name"] for x in a.ok("list_analyzers")["analyzers"]]
    finally:
        a.close()
    b = SyncClient(build_server("analyzers", run_b))
    try:
        assert "always_blocking_x" not in [x["name"] for x in b.ok("list_analyzers")["analyzers"]]
        res = b.ok("run_analyzer", {"version_ids": ["v1"]})
        assert "always_blocking_x" not in res["analyzers"]
        assert all(f["kind"] != "always_blocking" for f in res["findings"])
    finally:
        b.close()
