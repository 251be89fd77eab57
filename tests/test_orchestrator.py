"""The autonomous loop end to end on the tiny random model: real training, real MCP servers, heuristic brain."""

from __future__ import annotations

import json

import pytest

from evotrainer.agents.runner import run_loop
from evotrainer.config import load_run_config
from evotrainer.workspace import Workspace

TINY = "examples/tiny.yaml"


def _cfg(**budget):
    cfg = load_run_config(TINY)
    if budget:
        cfg = cfg.model_copy(update={"budget": cfg.budget.model_copy(update=budget)})
    return cfg


def lineage_signature(run_dir) -> dict:
    """What must match between runs: tree shape, interventions, statuses, decisions (action, author)."""
    ws = Workspace.open(run_dir)
    try:
        return {
            "versions": [(v.id, v.parent_id, [iv.describe() for iv in v.interventions], v.status)
                         for v in ws.lineage.versions()],
            "decisions": [(d.version_id, d.action, d.author) for d in ws.lineage.decisions()],
        }
    finally:
        ws.close()


def test_tiny_loop_runs_to_budget_and_every_version_is_decided(tmp_path):
    # 2 versions x 2 steps keeps this in the fast suite (the analyzers then report "insufficient
    # evidence", so round 1 explores); the 8-step scenarios exercise the findings.
    cfg = _cfg(max_versions=2, steps_per_version=2, branches_per_round=1)
    events = []
    summary = run_loop(cfg, tmp_path / "run", "heuristic", "evotrainer", resume=False,
                       on_event=lambda k, d: events.append(k))
    assert summary["finished"] and summary["n_versions"] == cfg.budget.max_versions  # 3 versions
    ws = Workspace.open(tmp_path / "run")
    versions = ws.lineage.versions()
    # every version trained and decided once, with a rationale quoting numbers or findings
    assert all(v.status in ("kept", "pruned", "failed") for v in versions), [v.status for v in versions]
    decisions = ws.lineage.decisions()
    assert sorted(d.version_id for d in decisions if d.action in ("keep", "prune")) == [v.id for v in versions]
    assert all(d.rationale and d.author == "orchestrator/heuristic" for d in decisions)
    # the no-RL row was evaluated on the held-out set before training
    no_rl = ws.lineage.kv_get("loop/eval/v0/no_rl")
    assert no_rl["eval_name"] == "no_rl" and 0.0 <= no_rl["avg@k"] <= 1.0
    assert len(ws.lineage.eval_matrix("v0", "no_rl")) == cfg.recipe.eval.max_problems
    # children are single-factor changes of v0 (the best kept, or the root) with distinct paths
    kids = [v for v in versions if v.parent_id and not v.is_control]
    assert kids and all(len(v.interventions) == 1 and v.parent_id == "v0" for v in kids)
    # one control arm per round: v0's recipe continued, no intervention
    assert [(v.parent_id, v.interventions, v.recipe) for v in versions if v.is_control] == [("v0", [], versions[0].recipe)]
    assert len({v.interventions[0].path for v in kids}) == len(kids)
    assert ws.lineage.last_step("v1") == 1  # 2 steps, 0-based
    # stage records: diagnosis, proposal, ranking of round 1 replayable from kv
    assert ws.lineage.kv_get("loop/r1/propose")["candidates"]
    assert ws.lineage.kv_get("loop/diagnose/v0")["version_id"] == "v0"
    assert {"stage", "progress", "decision", "lineage"} <= set(events)
    ws.close()


def test_run_refuses_an_existing_run_without_resume(tmp_path):
    cfg = _cfg(max_versions=1)
    (tmp_path / "run").mkdir()
    Workspace(tmp_path / "run").close()
    with pytest.raises(ValueError, match="--resume"):
        run_loop(cfg, tmp_path / "run", "heuristic", "evotrainer", resume=False)


@pytest.mark.slow
def test_static_and_recipe_search_use_the_same_budget(tmp_path):
    cfg = _cfg(max_versions=2)
    s = run_loop(cfg, tmp_path / "static", "heuristic", "static", resume=False)
    assert s["n_versions"] == 1 and s["finished"]
    ws = Workspace.open(tmp_path / "static")
    assert ws.lineage.last_step("v0") == cfg.budget.max_versions * cfg.budget.steps_per_version - 1  # 4 steps
    ws.close()
    r = run_loop(cfg, tmp_path / "search", "heuristic", "recipe-search", resume=False)
    assert r["n_versions"] == 2 and r["finished"]
    ws = Workspace.open(tmp_path / "search")
    trial = ws.lineage.get("v1")
    assert trial.note == "recipe-search trial 1" and len(trial.interventions) >= 1
    assert json.loads(json.dumps(ws.lineage.kv_get("loop/trial/1")))["params"]
    ws.close()
