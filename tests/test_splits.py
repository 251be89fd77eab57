"""Three splits (issue 16): train / dev / test disjoint and recorded per version; the test split is sealed
from every MCP tool while a run is under way and scored only for the run's final answer at its end."""

from __future__ import annotations

import pytest

from evotrainer.agents.loop import open_toolbox
from evotrainer.agents.mcp_client import ToolCallError
from evotrainer.agents.runner import run_loop
from evotrainer.config import load_run_config
from evotrainer.recipe import DataSpec
from evotrainer.rl_backend.tasks import TaskError, load_problems, load_splits, split_manifest
from evotrainer.workspace import Workspace


def test_default_task_gives_each_split_enough_distinct_problems():
    data = load_run_config("examples/default.yaml").recipe.data
    sp = load_splits(data)
    # level 1 has 20 x 20 = 400 distinct sums; 48 dev + 100 test held out first, train gets 256 of the 252 left
    # -> 252 (the pool holds >= 2 x (48 + 100) = 296, so dev and test are as asked)
    assert (len(sp.train), len(sp.dev), len(sp.test)) == (252, 48, 100)
    keys = [{p.prompt for p in part} for part in sp]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    assert [p.meta["split"] for p in sp.test][:1] == ["test"] and sp.dev[0].meta["split"] == "heldout"
    # dev does not move when the test split is added or resized; test does not move with n_train
    assert [p.id for p in load_splits(data.model_copy(update={"n_test": 0})).dev] == [p.id for p in sp.dev]
    assert [p.id for p in load_splits(data.model_copy(update={"n_train": 10})).test] == [p.id for p in sp.test]
    assert load_problems(data) == (sp.train, sp.dev)
    assert load_splits(data) == sp  # deterministic given task / data / seed
    m = split_manifest(*sp)
    assert (m["n_train"], m["n_heldout"], m["n_test"]) == (252, 48, 100) and m["test"] == [p.id for p in sp.test]
    # without a test split the digest is the two-split digest runs recorded before
    assert split_manifest(sp.train, sp.dev)["digest"] == split_manifest(sp.train, sp.dev, [])["digest"] != m["digest"]


def test_a_version_on_another_level_keeps_the_runs_dev_and_test_and_never_trains_on_them():
    # a data.level 1 -> 2 child was judged on level 2's dev problems (ids arith-L2-...), which share none with its
    # control's: the gate could not compare them and pruned it, and 7 of its 256 training questions were in the
    # run's dev or test split (level 2 is 10..99 + 0..9; level 1 holds 10..19 + 0..9 too)
    root = load_run_config("examples/default.yaml").recipe.data
    l2 = root.model_copy(update={"level": 2})
    base, own, pinned = load_splits(root), load_splits(l2), load_splits(l2, pinned=root)
    held = {p.prompt for p in [*base.dev, *base.test]}
    assert not {p.id for p in own.dev} & {p.id for p in base.dev}
    assert len({p.prompt for p in own.train} & held) == 7 and len(own.train) == 256
    assert [p.id for p in pinned.dev] == [p.id for p in base.dev] and [p.id for p in pinned.test] == [p.id for p in base.test]
    assert not {p.prompt for p in pinned.train} & held and len(pinned.train) == 256 - 7
    assert all(p.id.startswith("arith-L2-") and p.meta["split"] == "train" for p in pinned.train)
    # the same split fields: the spec's own splits (n_train, the band and the prompt never move dev / test)
    assert load_splits(root, pinned=root) == base
    assert load_splits(root.model_copy(update={"n_train": 100}), pinned=root).dev == base.dev


def test_small_pool_shrinks_held_out_splits_and_too_small_is_an_error(tmp_path):
    # 400 < 2 x (150 + 100): a fifth (80) for each held-out split, train min(256, 400 - 160) = 240
    sp = load_splits(DataSpec(level=1, n_heldout=150, n_test=100))
    assert (len(sp.train), len(sp.dev), len(sp.test)) == (240, 80, 80)
    f = tmp_path / "two.jsonl"
    f.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n')
    with pytest.raises(TaskError, match="n_test"):  # 2 problems: 1 dev + 1 test leave no training problem
        load_splits(DataSpec(task="jsonl", path=str(f), n_test=1))


def _tiny(tmp_path, **data):
    cfg = load_run_config("examples/tiny.yaml")
    d = cfg.recipe.data.model_copy(update={"n_test": 6, **data})
    return cfg.model_copy(update={"budget": cfg.budget.model_copy(update=dict(max_versions=2, steps_per_version=2,
                                                                              branches_per_round=1)),
                                  "recipe": cfg.recipe.model_copy(update={"data": d})})


def test_test_split_is_sealed_from_mcp_tools_during_the_run_and_scored_at_the_end(tmp_path):
    cfg = _tiny(tmp_path)
    run = tmp_path / "run"
    errors: dict[str, str] = {}

    def probe(kind, data):
        # during the run (after the first decision): an agent asks for test-split outcomes through the MCP tools
        if kind != "decision" or errors:
            return
        with open_toolbox(run) as tb:
            for tool, args in (("evaluate_version", {"version_id": "v0", "eval_name": "test"}),
                               ("evaluate_version", {"version_id": "v0", "eval_name": "no_rl_test"}),
                               ("gate_version", {"version_id": "v0", "eval_name": "test"})):
                with pytest.raises(ToolCallError) as exc:
                    tb.call(tool, args)
                errors[f"{tool}:{args['eval_name']}"] = exc.value.message

    summary = run_loop(cfg, run, "heuristic", "evotrainer", resume=False, on_event=probe)
    assert len(errors) == 3
    assert all("sealed while the run is under way" in m and "heldout" in m for m in errors.values()), errors
    ws = Workspace.open(run)
    try:
        # no test outcome was computed during the run except the final answer's and the no-RL row's, at the end
        final = summary["final"]
        assert final["version"] in summary["statuses"] and final["test"]["n_problems"] == 6
        assert final["no_rl_test"]["n_problems"] == 6 and final["test"]["k"] == cfg.recipe.eval.k
        tested = [v.id for v in ws.lineage.versions() if ws.lineage.eval_matrix(v.id, "test")]
        assert tested == [final["version"]] and sorted(ws.lineage.eval_matrix("v0", "no_rl_test")) == \
            sorted(p.id for p in load_splits(cfg.recipe.data).test)
        # test outcomes never reach eval_summary or the rollout store (what the analyzers and tools read)
        assert all("test" not in (v.eval_summary or {}).get("by_name", {}) for v in ws.lineage.versions())
        groups = ws.rollouts.to_arrow(columns=["group_id"]).to_pydict()["group_id"]
        assert not [g for g in groups if g.startswith(("test-", "no_rl_test-"))]
        # the split is recorded per version (digest of train / dev / test ids)
        digest = split_manifest(*load_splits(cfg.recipe.data))["digest"]
        assert {v.metrics_summary.get("data_split") for v in ws.lineage.versions()} == {digest}
    finally:
        ws.close()
    with open_toolbox(run) as tb:  # after the run the seal is open
        job = tb.call("evaluate_version", {"version_id": "v0", "eval_name": "test"})
        while job["status"] == "running":
            job = tb.call("job_status", {"job_id": job["id"], "wait_s": 2.0})
        assert job["status"] == "done" and job["result"]["split"] == "test" and job["result"]["n_problems"] == 6
