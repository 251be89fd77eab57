"""Harness evolution: the diagnostician writes an analyzer, runs it sandboxed, backtests it on versions of
known outcome, and registers it only if it discriminates (real MCP servers, real sandbox)."""

from __future__ import annotations

from evotrainer import metrics as M
from evotrainer.agents.decisions import Diagnosis
from evotrainer.agents.diagnostician import Diagnostician
from evotrainer.agents.heuristic import HeuristicBrain
from evotrainer.agents.mcp_client import ToolBox
from evotrainer.intervention import Intervention
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace


def _run(tmp_path, v1_len: float, v2_len: float):
    """v0 (root) at mean length 20; v1 (pruned) and v2 (kept) ramp from 20 to the given length over 8 steps."""
    ws = Workspace(tmp_path / "run")
    lin = ws.lineage
    lin.create_root(Recipe())
    lin.branch("v0", Intervention(path="temperature", old=1.0, new=1.2, category="rollout"))
    lin.branch("v0", Intervention(path="eps_clip_high", old=0.28, new=0.3, category="optimizer"))
    for vid, end in (("v0", 20.0), ("v1", v1_len), ("v2", v2_len)):
        for step in range(8):
            length = 20.0 + (end - 20.0) * step / 7  # linear ramp: steps 0-1 vs 6-7 compared
            lin.log_metrics(vid, step, {M.COMPLETIONS_MEAN_LENGTH: length, M.REWARD_MEAN: 0.1})
    lin.decide("v0", "keep", "root")
    lin.decide("v1", "prune", "held-out fell")
    lin.decide("v2", "keep", "held-out rose")
    ws.close()
    return tmp_path / "run"


def _evolve(run_dir):
    from evotrainer.servers.app import build_server

    with ToolBox(build_server("all", str(run_dir))) as tb:
        diag = Diagnosis(version_id="v2", findings=[], unexplained=True)
        return Diagnostician(HeuristicBrain(), tb).evolve_analyzer("v2", diag, {}, {"v1": True, "v2": False}), tb


def test_analyzer_that_discriminates_is_registered(tmp_path):
    # v1 (bad): first quarter mean (20 + 21.43) / 2 = 20.71, last quarter (28.57 + 30) / 2 = 29.29: +41% -> fires;
    # v2 (good) ramps 20 -> 21: 20.07 -> 20.93, +4% -> quiet
    run_dir = _run(tmp_path, v1_len=30.0, v2_len=21.0)
    out, _ = _evolve(run_dir)
    assert out["name"] == "length_shift" and out["registered"], out
    assert out["backtest"]["fired"] == {"v1": True, "v2": False}
    ws = Workspace.open(run_dir)
    assert "length_shift" in ws.lineage.kv_get("analyzers/registered")
    ws.close()


def test_analyzer_that_does_not_discriminate_is_not_registered(tmp_path):
    # both ramp 20 -> 30 (+41%): it fires on the good version too
    run_dir = _run(tmp_path, v1_len=30.0, v2_len=30.0)
    out, _ = _evolve(run_dir)
    assert not out["registered"] and "does not discriminate" in out["reason"], out
    ws = Workspace.open(run_dir)
    assert "length_shift" not in (ws.lineage.kv_get("analyzers/registered") or {})
    ws.close()
