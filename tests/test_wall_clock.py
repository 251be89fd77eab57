"""The wall-clock budget: the test evaluations' reserve and how many arms a round may start in time.

A `make run` of the default on a loaded machine (2026-12-06) stopped after one round at 19 of its 28 minutes without
a word: the reserve for the two test evaluations was estimated per dev sample (838 s) where they took 211 s, because
an evaluation of k = 8 samples a prompt costs far less per sample than one of k = 2 (agents/loop.py
``test_reserve_s``). Hand-computed values on a run folder whose clocks are planted in its kv store.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from evotrainer.agents.heuristic import HeuristicBrain
from evotrainer.agents.loop import open_toolbox
from evotrainer.agents.orchestrator import Orchestrator
from evotrainer.config import RunConfig, load_run_config
from evotrainer.intervention import Intervention
from evotrainer.workspace import Workspace


def _config(minutes: float) -> RunConfig:
    """tiny.yaml with a test split of 100 problems at test k 8, dev 8 problems at k 2, no token budget."""
    cfg = load_run_config("examples/tiny.yaml")
    return cfg.model_copy(update={
        "test_k": 8,
        "budget": cfg.budget.model_copy(update=dict(max_versions=10, wall_clock_minutes=minutes, max_tokens=None)),
        "recipe": cfg.recipe.model_copy(update={"data": cfg.recipe.data.model_copy(update={"n_test": 100})})})


def _run(tmp_path: Path, cfg: RunConfig) -> Path:
    """v0 and v1 trained (8 steps each), 600 s of wall clock spent in all (kv), a 40 s no-RL and a 20 s dev
    evaluation recorded."""
    run = tmp_path / "run"
    now = time.time()
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(cfg.recipe)
        ws.lineage.branch("v0", Intervention(path="actor_learning_rate", old=1.0e-4, new=3.0e-4, category="optimizer"))
        for vid in ("v0", "v1"):
            for step in range(8):
                ws.lineage.log_metrics(vid, step, {"reward/mean": 0.5})
        ws.lineage.kv_set("loop/started_at", now - 600.0)
        ws.lineage.kv_set("loop/mode", "evotrainer")
    db = sqlite3.connect(run / "lineage.db")
    db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", [
        ("loop/process_compute", '{"cpu_s": 500.0, "wall_s": 600.0}'),
        ("loop/eval_walls", '{"eval/v0/no_rl": 40.0, "eval/v0/heldout": 20.0}')])
    db.commit()
    db.close()
    return run


@pytest.mark.parametrize("minutes, arms", [(45, 2), (40, 1), (36, 0), (600, 121)])
def test_a_round_starts_only_the_arms_that_end_before_the_wall_clock(tmp_path, minutes, arms):
    """Reserve: the mean of the recorded evaluations (40 s and 20 s: 30 s) over 8 dev problems x sqrt 2, times 100
    test problems x sqrt 8, for two evaluations: 2 x 750 s = 1,500 s (the per-sample rule it replaces gave
    2 x 30 / 16 x 800 = 3,000 s). An arm: (600 s - the 40 s no-RL row) / 2 versions trained = 280 s. At 45 minutes:
    2,700 - 600 - 1,500 = 600 s left, floor(600 / 280) = 2 arms; at 40: 300 s, 1; at 36: 60 s, none; at 600:
    33,900 s, 121."""
    cfg = _config(minutes)
    run = _run(tmp_path, cfg)
    with Workspace(run) as ws, open_toolbox(run) as tb:
        loop = Orchestrator(cfg, tb, ws, HeuristicBrain())
        assert loop.test_reserve_s() == pytest.approx(1500.0)
        assert loop.arms_in_time() == arms
        assert loop._arms_left() == arms  # no token budget: the wall clock alone sizes the round
        note = loop.budget_note()
        assert note.startswith("wall clock 10.0 min spent + 25.0 min kept for the test evaluations, of ")
        assert note.endswith(f"of {minutes:g}") and "tokens" not in note


def test_a_version_of_more_synthesis_features_than_a_summary_holds_is_remembered(tmp_path):
    """Every `make run` since review 14 logged "harness evolution: add_version_summary failed: metrics: 505 entries;
    a summary holds at most 256 metrics": the loop remembers a labelled version's synthesis features (16 base
    statistics a candidate series) as a version summary, and the cap refused them all, so later runs remembered
    nothing. The cap is 1,024 now, and a version of more (80 series: 1,280 features) is remembered with the first
    1,024 by name."""
    from evotrainer.agents.evolution import remember
    from evotrainer.harness import synthesis as S
    from evotrainer.skills_db.models import SUMMARY_METRICS_MAX

    assert SUMMARY_METRICS_MAX == 1024
    cfg = _config(600)
    run = _run(tmp_path, cfg)
    names = [f"reward/c{i:02d}/mean" for i in range(80)]
    feats = {S.feature_key(b): float(i) for i, b in enumerate(S._bases(names))}
    assert len(feats) == 1280 and len(S.example_features(S.Example(None, "v0", False, features=feats))) == 1280
    with Workspace(run, writer=True) as ws, open_toolbox(run) as tb:
        loop = Orchestrator(cfg, tb, ws, HeuristicBrain())
        assert remember(loop, [S.Example(None, "v0", False, features=feats)], "arithmetic") == 1
        got = tb.call("list_version_summaries", {"domain": "arithmetic", "limit": 10})["summaries"]
    mine = [s for s in got if s["run"] == str(run)]
    assert len(mine) == 1 and len(mine[0]["metrics"]) == 1024
    assert mine[0]["metrics"] == dict(sorted(feats.items())[:1024])
    assert mine[0]["summary"] == "labelled good for analyzer synthesis (1024 features of 1280, the first by name)"
