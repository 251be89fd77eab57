"""Wall time of one round (2 children + the control arm: train, then evaluate) inline vs on Ray.

The same run is copied for each configuration: a base version v0 trained inline, then three
branches of it: two single-factor children (learning rate x2, temperature 0.9) and the control arm
(the parent's recipe continued from the same checkpoint; ``lineage.branch_control`` where the
lineage has it, else a child with another sampling seed, the same cost). Each configuration runs
the round's three tasks (train ``--steps`` steps, then evaluate) through :mod:`evotrainer.executor`:

- ``inline-2t``: one branch after another in this process, 2 torch threads (2 threads x 1 branch);
- ``inline-1t``: the same with 1 thread;
- ``ray-1t-x2``: Ray, 2 branches side by side, 1 thread each (1 thread x 2 branches);
- ``ray-2t-x1``: Ray, 1 branch at a time, 2 threads (Ray's overhead alone).

A Ray configuration's time includes starting its local cluster (printed apart). The lineage of
every configuration is checked to be the same (statuses, metric values, held-out outcomes).
``--model smollm2`` uses SmolLM2-135M-Instruct with a tiny budget (2 prompts x 2 samples, 16 new
tokens); ``tiny`` a random 2-layer model (startup-bound: measures the overhead).

Measured 2026-12-01 on this 2-core machine, shared with other engineers' jobs (load average 3-10 during
the runs, so the numbers move by tens of percent from run to run), 1 step per branch then a held-out
evaluation (4 problems x k=2):

- threads, SmolLM2: inline 1 thread 28.0 s per round, inline 2 threads 314.3 s (11x slower: oversubscribed
  threads wait on each other at load ~7); tiny: 10.1 s vs 48.8 s. Hence ``branch_threads: 1`` and 2
  branches of 1 thread, never 1 branch of 2 threads (ray-2t-x1 tiny: 83.9 s vs ray-1t-x2 65.1 s).
- inline vs Ray (1 thread x 2 branches), SmolLM2, ``--rounds 2``: inline 25.7 + 24.9 s; Ray 38.7 s (cluster
  start 4.4 s, two fresh workers importing torch / transformers: 26 s per branch) + 18.2 s on the warm
  workers: ratio inline / Ray 0.66 for the first round, 1.37 for the next, 0.89 over both. With fresh
  workers per branch (``reuse_workers=False``) one round took 89.9 s (ratio 0.31). The lineage was the same
  in every configuration (statuses, metric values, held-out outcomes).

Usage: ``python benchmarks/ray_round.py [--model tiny|smollm2] [--steps 2] [--rounds 1]
[--configs inline-2t,ray-1t-x2]``
(prints one line per configuration, the ratios, and ``--json`` writes them to a file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"inline-2t": ("inline", 2, 1), "inline-1t": ("inline", 1, 1), "ray-1t-x2": ("ray", 1, 2),
           "ray-2t-x1": ("ray", 2, 1)}


def recipe(model: str):
    import yaml

    from evotrainer.recipe import validate_recipe

    r = yaml.safe_load((ROOT / "examples/tiny.yaml").read_text())["recipe"]
    if model == "smollm2":
        r = {**r, "name": "bench-smollm2", "model": {"name_or_path": "smollm2-135m-instruct"},
             "generate_max_len": 16, "eval": {"k": 2, "max_problems": 4, "temperature": 0.7}}
    return validate_recipe(r)


def base_run(root: Path, model: str, steps: int) -> list[str]:
    """v0 trained inline, then its three branches; returns their ids."""
    from evotrainer.executor import InlineExecutor, Task
    from evotrainer.intervention import Intervention
    from evotrainer.workspace import Workspace

    r = recipe(model)
    Workspace.init(root, r)
    [res] = InlineExecutor(threads=1).run(root, [Task(version_id="v0", steps=steps)])
    if res.status != "done":
        sys.exit(f"base training failed: {res.error}")
    with Workspace.open(root) as ws:
        lin = ws.lineage
        ids = [lin.branch("v0", Intervention(path="actor_learning_rate", old=r.actor_learning_rate,
                                             new=r.actor_learning_rate * 2, category="optimizer")).id,
               lin.branch("v0", Intervention(path="temperature", old=r.temperature, new=0.9,
                                             category="rollout")).id]
        if hasattr(lin, "branch_control"):
            ids.append(lin.branch_control("v0", note="control (benchmark)").id)
        else:
            ids.append(lin.branch("v0", Intervention(path="seed", old=r.seed, new=r.seed + 1,
                                                     category="rollout")).id)
    return ids


def signature(root: Path) -> dict:
    """Statuses, metric values (not perf/* timings) and held-out outcomes of every version."""
    from evotrainer.lineage import LineageStore

    s = LineageStore(root / "lineage.db", readonly=True)
    try:
        return {v.id: (v.status, {n: p for n, p in s.all_metrics(v.id).items() if not n.startswith("perf/")},
                       s.eval_matrix(v.id)) for v in s.versions()}
    finally:
        s.close()


def run_config(name: str, base: Path, work: Path, ids: list[str], steps: int, rounds: int) -> dict:
    """``rounds`` rounds (each on a fresh copy of the base run) with one executor; wall time of each."""
    from evotrainer.executor import InlineExecutor, RayExecutor, Task

    kind, threads, parallel = CONFIGS[name]
    tasks = [Task(version_id=v, steps=steps, evaluate=True) for v in ids]
    temp_dir = tempfile.mkdtemp(prefix="evb", dir="/tmp")  # Ray's session folder (short: socket paths)
    t0 = time.monotonic()
    startup = 0.0
    if kind == "inline":
        ex = InlineExecutor(threads=threads)
    else:
        ex = RayExecutor(max_parallel=parallel, threads=threads, temp_dir=temp_dir)
        ex.start()  # the local cluster, timed apart
        startup = time.monotonic() - t0
    walls, branch_s, sigs = [], [], []
    try:
        for i in range(rounds):
            run = work / f"{name}-{i}"
            # v0's checkpoint stays in the base run (its path is absolute); the children's are written here
            shutil.copytree(base, run, ignore=shutil.ignore_patterns(".writer.lock", ".locks", "checkpoints"))
            (run / "checkpoints").mkdir()
            t1 = time.monotonic()
            results = ex.run(run, tasks)
            walls.append(round(time.monotonic() - t1 + (startup if i == 0 else 0.0), 1))
            bad = [(r.version_id, r.status, r.error[:300]) for r in results if r.status != "done"]
            if bad:
                sys.exit(f"{name}: {bad}")
            branch_s.append([r.wall_s for r in results])
            sigs.append(signature(run))
            shutil.rmtree(run, ignore_errors=True)  # SmolLM2 checkpoints are 0.5 GB each
    finally:
        ex.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return {"config": name, "wall_s": round(sum(walls), 1), "round_s": walls, "startup_s": round(startup, 1),
            "branch_s": branch_s, "signature": sigs[0], "same_rounds": all(x == sigs[0] for x in sigs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--configs", default="inline-2t,inline-1t,ray-1t-x2,ray-2t-x1")
    ap.add_argument("--rounds", type=int, default=1, help="Rounds per configuration (one executor: a Ray "
                                                          "cluster's workers stay warm across rounds).")
    ap.add_argument("--json", type=Path, default=None, help="Write the measurements here.")
    args = ap.parse_args()
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        sys.exit(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    work = Path(tempfile.mkdtemp(prefix="ray_round-"))
    try:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; model {args.model}, "
              f"{args.steps} steps per branch, then held-out evaluation", flush=True)
        ids = base_run(work / "base", args.model, args.steps)
        out = []
        for name in names:
            m = run_config(name, work / "base", work, ids, args.steps, args.rounds)
            out.append(m)
            rounds = "; ".join(f"{w:.1f} s (branches {', '.join(f'{s:.1f}' for s in b)})"
                               for w, b in zip(m["round_s"], m["branch_s"], strict=True))
            print(f"{name:10s} {args.rounds} round(s) {m['wall_s']:7.1f} s: {rounds} (cluster start "
                  f"{m['startup_s']:.1f} s, in the first)  load {os.getloadavg()[0]:.1f}", flush=True)
        same = all(m["signature"] == out[0]["signature"] and m["same_rounds"] for m in out)
        print(f"same lineage in every configuration: {same}")
        by = {m["config"]: m["wall_s"] for m in out}
        for a, b in (("inline-2t", "ray-1t-x2"), ("inline-1t", "ray-1t-x2"), ("ray-2t-x1", "ray-1t-x2")):
            if a in by and b in by:
                print(f"ratio {a} / {b} = {by[a] / by[b]:.2f}")
        if args.json:
            args.json.write_text(json.dumps([{k: v for k, v in m.items() if k != "signature"} for m in out]
                                            + [{"same_lineage": same, "load": os.getloadavg()[0]}], indent=2))
        if not same:
            sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
