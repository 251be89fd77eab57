"""Benchmark: every built-in analyzer over a run of 1M stored rollouts and 10k steps.

Builds (untimed) one version with 10,000 steps x 100 rollouts (25 groups x 4 samples) in the
rollout-store schema, plus 10,000 steps of the step metrics a trainer logs, then times
``run_analyzers`` from a cold Evidence (rollout-derived metrics recomputed inside the timing):

* ``logged``: metrics logged by the trainer (text metrics included) + 1M rollouts;
* ``rollouts only``: no logged metrics, everything derived from the 1M rollouts (a foreign run's
  dump): distinct-2 / repetition on 200 sampled steps.

The logged grad norm has a spike every 100 steps (100 spikes, each judged by the damage checks
of ``grad_spike``) and the batch statistics of the zero-variance analyzer (reward min / max, solve
fractions) are logged, so the level, change and trend paths all run.

Usage: ``python benchmarks/analyzers.py [--rows 1000000] [--steps 10000]``; prints seconds.
Target (issue 17): under 2 s on this machine for both cases (issue 4 had 5 s for ``logged``).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pyarrow as pa

TARGET_S = 2.0  # issue 17: analyzers over 1M rollouts + 10k steps


def build(rows: int, steps: int, seed: int = 0) -> tuple[pa.Table, dict]:
    """One version ``v1`` of ``rows // steps * steps`` train rollouts and ``steps`` steps of logged metrics.

    Returns:
        (rollout table in ``evotrainer.rollouts.SCHEMA``: groups of 4 samples, reward 1 with probability
        0.4, 5% of finish reasons ``length``; ``{metric name: (steps, values)}`` for every step metric,
        N(1, 0.05), plus ``eval/avg@k`` every 50 steps).
    """
    from evotrainer import metrics as M
    from evotrainer.rollouts import SCHEMA

    rng = np.random.default_rng(seed)
    per_step = rows // steps
    G = 4
    n = per_step * steps
    step = np.repeat(np.arange(steps, dtype=np.int32), per_step)
    within = np.tile(np.arange(per_step), steps)
    group = within // G
    sample = (within % G).astype(np.int32)
    vocab = np.array(["the", "answer", "is", "so", "we", "add", "then", "get", "step", "result"] +
                     [str(i) for i in range(100)])
    pool = pa.array([" ".join(w) for w in vocab[rng.integers(0, len(vocab), size=(50_000, 12))]])
    completion = pool.take(pa.array(rng.integers(0, len(pool), n)))  # 50k distinct texts
    prompt_id = (step.astype(np.int64) * 1000 + group).astype(str)
    reward = (rng.random(n) < 0.4).astype(np.float64)
    t = pa.table({
        "rollout_id": pa.array(np.char.add(np.char.add(prompt_id, "/"), sample.astype(str))),
        "version_id": pa.array(["v1"] * n),
        "step": pa.array(step),
        "split": pa.array(["train"] * n),
        "prompt_id": pa.array(prompt_id),
        "group_id": pa.array(prompt_id),
        "sample_idx": pa.array(sample),
        "prompt": pa.array(np.char.add("What is the sum for problem ", prompt_id)),
        "completion": completion,
        "answer": pa.array((group % 97).astype(str)),
        "reward": pa.array(reward),
        "components": pa.array(["{}"] * n),
        "correct": pa.array(reward),
        "advantage": pa.array(rng.normal(0, 1, n)),
        "length": pa.array(rng.integers(20, 200, n).astype(np.int32)),
        "finish_reason": pa.array(np.where(rng.random(n) < 0.05, "length", "eos")),
        "kept": pa.array(rng.random(n) < 0.8),
        "turns": pa.array([""] * n),
        "created_at": pa.array(np.zeros(n)),
    }, schema=SCHEMA)
    s = np.arange(steps)
    logged = {name: (s, rng.normal(1.0, 0.05, steps)) for name in M.ALL_STEP_METRICS}
    g = logged[M.POLICY_GRAD_NORM][1]
    g[50::100] = 30.0  # 100 isolated spikes
    logged[M.REWARD_MIN] = (s, np.zeros(steps))
    logged[M.REWARD_MAX] = (s, np.ones(steps))
    logged[M.REWARD_FRAC_SOLVE_NONE] = (s, rng.uniform(0.1, 0.3, steps))
    logged[M.REWARD_FRAC_SOLVE_ALL] = (s, rng.uniform(0.1, 0.3, steps))
    logged[M.EVAL_AVG_AT_K] = (s[::50], rng.normal(0.5, 0.01, len(s[::50])))
    return t, logged


def time_run(t: pa.Table, logged: dict | None) -> tuple[float, int]:
    """(seconds, number of findings) of all built-in analyzers over a fresh Evidence of ``t`` (+ ``logged``)."""
    from evotrainer.harness.analyzers import list_analyzers, run_analyzers
    from evotrainer.harness.evidence import Evidence

    ev = Evidence(metrics={"v1": logged} if logged else {}, rollouts=t, parents={"v1": None})
    t0 = time.perf_counter()
    findings = run_analyzers(ev, names=[s.name for s in list_analyzers(builtin=True)])
    return time.perf_counter() - t0, len(findings)


def main() -> None:
    """Build the run (untimed), warm up on 1,000 rows, time both cases; print text or ``--json``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    import scipy.stats  # noqa: F401

    import evotrainer.harness.analyzers  # noqa: F401  (imports outside the timing)

    t0 = time.perf_counter()
    table, logged = build(args.rows, args.steps)
    setup = time.perf_counter() - t0
    time_run(table.slice(0, 1000), None)  # warm-up: lazy imports and caches, outside the timing
    s_logged, n1 = time_run(table, logged)
    s_rollouts, n2 = time_run(table, None)
    res = {"rows": table.num_rows, "steps": args.steps, "setup_s": round(setup, 2),
           "logged_s": round(s_logged, 3), "rollouts_only_s": round(s_rollouts, 3),
           "findings": [n1, n2], "target_s": TARGET_S, "ok": max(s_logged, s_rollouts) < TARGET_S}
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{table.num_rows:,} rollouts, {args.steps:,} steps (setup {setup:.1f} s, untimed)")
        for what, sec in (("trainer-logged metrics + rollouts", s_logged), ("metrics derived from the rollouts only",
                                                                             s_rollouts)):
            print(f"all built-in analyzers, {what}: {sec:.2f} s ({'under' if sec < TARGET_S else 'OVER'} the "
                  f"{TARGET_S:g} s target)")


if __name__ == "__main__":
    main()
