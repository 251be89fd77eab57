"""Process memory across versions: does RSS grow when one process trains and evaluates a chain of versions?

Trains a chain root -> v2 -> v3 ... (each a child of the previous one with a temperature
intervention, so each starts from its parent's checkpoint) with the local backend, in this process,
and prints after each version: RSS (psutil, MiB), the peak RSS so far (``ru_maxrss``), the live
Python heap (tracemalloc, MiB; only with ``--tracemalloc``), and the number of live
``torch.nn.Module`` / ``torch.optim.Optimizer`` objects (gc), which must be 0 between versions.

Usage: ``python benchmarks/memory_versions.py [--model tiny-random|smollm2-135m-instruct]
[--versions 4] [--steps 2] [--kl] [--eval] [--no-release] [--resident-reference] [--dense-embedding-grad]
[--dense-head-grad] [--json]``
(``--resident-reference``: the peer of the offloaded KL reference, docs/performance.md §11; ``--dense-embedding-grad``:
the peer of the in-place embedding backward, torch's ``nn.Embedding``, §12; ``--dense-head-grad``: the peer of the
LM head's in-place weight gradient, torch's ``nn.Linear``, §15; ``--no-release``: the peer,
without :func:`~evotrainer.rl_backend.models.release_memory`; run both, one after the other). SmolLM2 with 1 step per version and short
lengths takes ~1-2 minutes of CPU here.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def live_objects() -> dict[str, int]:
    """Live torch modules (top-level models: those with a ``config``) and optimizers, after a gc."""
    import warnings

    import torch

    gc.collect()
    models = opts = 0
    warnings.simplefilter("ignore", FutureWarning)  # isinstance on torch's deprecated aliases
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.nn.Module) and hasattr(o, "config") and hasattr(o, "generate"):
                models += 1
            elif isinstance(o, torch.optim.Optimizer):
                opts += 1
        except ReferenceError:
            continue
    return {"models": models, "optimizers": opts}


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--kl", action="store_true", help="init_kl_coef 0.01 (loads a reference model)")
    ap.add_argument("--eval", action="store_true", help="evaluate each version on 2 held-out problems, k=2")
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trim", action="store_true", help="also report RSS after glibc malloc_trim(0)")
    ap.add_argument("--no-release", action="store_true",
                    help="the peer: turn models.release_memory off (the behaviour before issue 21)")
    ap.add_argument("--resident-reference", action="store_true",
                    help="the peer: keep the KL reference's weights resident (offload_reference=False, before §11)")
    ap.add_argument("--dense-embedding-grad", action="store_true",
                    help="the peer: torch's nn.Embedding backward (inplace_embedding_grad=False, before §12)")
    ap.add_argument("--dense-head-grad", action="store_true",
                    help="the peer: torch's nn.Linear LM head backward (inplace_head_grad=False, before §15)")
    a = ap.parse_args(argv)

    from evotrainer.rl_backend.local import LocalBackend

    if a.resident_reference or a.dense_embedding_grad or a.dense_head_grad:
        import functools

        from evotrainer.rl_backend import local, models

        peer: dict[str, bool] = {}
        if a.resident_reference:
            peer["offload_reference"] = False
        if a.dense_embedding_grad:
            peer["inplace_embedding_grad"] = False
        if a.dense_head_grad:
            peer["inplace_head_grad"] = False
        local.load_policy = functools.partial(models.load_policy, **peer)

    if a.no_release:
        from evotrainer.rl_backend import local, models

        models.release_memory = local.release_memory = lambda: False

    from evotrainer.intervention import Intervention
    from evotrainer.recipe import validate_recipe
    from evotrainer.workspace import Workspace

    if a.tracemalloc:
        import tracemalloc

        tracemalloc.start()
    recipe = {"model": {"name_or_path": a.model}, "n_samples_per_prompt": 4, "rollout_batch_size": 2,
              "generate_max_len": 8, "init_kl_coef": 0.01 if a.kl else 0.0, "actor_learning_rate": 1e-5,
              "micro_train_batch_size": 8, "eval": {"k": 2, "max_problems": 2}}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(Path(tmp) / "run", writer=True)
        be = LocalBackend(checkpoint_every=100, num_threads=1)
        v = ws.lineage.create_root(validate_recipe(recipe))
        temp = 1.0
        for i in range(a.versions):
            t0 = time.time()
            be.train(ws, v.id, a.steps)
            if a.eval:
                be.evaluate(ws, v.id)
            row = {"version": v.id, "seconds": round(time.time() - t0, 2), "rss_mib": round(rss_mib(), 1),
                   "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                   **live_objects()}
            if a.tracemalloc:
                row["py_heap_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
            row["rss_after_gc_mib"] = round(rss_mib(), 1)
            if a.trim:
                import ctypes

                ctypes.CDLL("libc.so.6").malloc_trim(0)
                row["rss_after_trim_mib"] = round(rss_mib(), 1)
            rows.append(row)
            if not a.json:
                print(json.dumps(row), flush=True)
            if i + 1 < a.versions:
                new = round(temp - 0.05, 2)
                v = ws.lineage.branch(v.id, Intervention(path="temperature", old=temp, new=new, category="rollout"))
                temp = new
        ws.close()
    out = {"model": a.model, "release_memory": not a.no_release, "offload_reference": not a.resident_reference,
           "inplace_embedding_grad": not a.dense_embedding_grad, "inplace_head_grad": not a.dense_head_grad,
           "kl": a.kl, "eval": a.eval, "steps_per_version": a.steps, "versions": rows,
           "growth_after_v2_mib": round(rows[-1]["rss_after_gc_mib"] - rows[min(1, len(rows) - 1)]["rss_after_gc_mib"], 1),
           "load_avg_1m": os.getloadavg()[0]}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"growth after the 2nd version: {out['growth_after_v2_mib']} MiB (load {out['load_avg_1m']:.2f})")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
