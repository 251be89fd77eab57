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
