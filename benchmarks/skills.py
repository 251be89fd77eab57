"""Skills memory benchmark: add throughput and hybrid query latency with 10k skills.

Builds a fresh store in a temp dir (the seed library plus N synthetic variants of the seed
interventions, about 60 words each, embedded on add by all-MiniLM-L6-v2 on CPU), then times:

- add throughput: skills/s for batched adds (``--batch`` skills per call, embedding included) and
  the p50 latency of a single-skill add;
- query latency (ms): p50 / p95 of hybrid (vector + native FTS, RRF), vector and fts searches,
  ``limit=10``, over distinct queries (cold: the query embedding is computed each time), and of
  hybrid searches that repeat a query (warm: the query embedding comes from the LRU cache). Hybrid is
  timed four ways, interleaved query by query: ``hybrid`` (the store's path: each leg one coroutine on LanceDB's
  event loop, the FTS leg overlapping the query embedding, the fast numpy forward, its own RRF),
  ``hybrid_threaded`` (the same with LanceDB's sync API, the FTS leg in a worker thread), ``hybrid_old`` (that,
  with the reference numpy forward: the path before the fast forward) and ``hybrid_lancedb`` (LanceDB's hybrid
  query with ``RRFReranker`` and the reference forward, the reference the tests compare with);
  ``vector_warm`` / ``fts_warm`` are the searches of one mode alone (LanceDB's), and ``vector_leg_exact`` /
  ``vector_leg_lancedb`` a hybrid query's vector leg alone, the exact scan of the vectors held in memory (the
  store's path up to ``_EXACT_SCAN_MAX_ROWS`` rows) against LanceDB's vector query;
- the query embedding alone: the numpy MiniLM forward shell searches use, beside the torch MiniLM.

``--embedded M`` (default: all N) sends only the first M skills through the embedding model (timed
for the add throughput); the other N - M rows are written with stand-in vectors (their base seed
skill's vector plus Gaussian noise, re-normalised) through ``SkillStore.add(vectors=...)``, so the
table reaches N rows on a CPU too busy to embed them all. Query latency does not depend on the vector
values (flat cosine scan over all rows; the FTS index holds the real texts).

Wall-clock figures depend on what else runs on the machine (``load_avg_1m`` is reported); the
``*_cpu_p50_ms`` figures are the CPU time of all threads of this process per query.

Usage: ``python benchmarks/skills.py [--n 10000] [--embedded M] [--queries 200] [--batch 500]
[--threads T] [--json]``.
Goal (issue 6): hybrid p50 under 20 ms with 10k skills.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

from _report import print_result

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DOMAINS = ("math", "code", "swe", "gsm8k", "arithmetic", "humaneval")
SYMPTOMS = (
    "{p:.0%} of completions were truncated at generate_max_len={n}",
    "reward std was zero in {p:.0%} of groups over steps {a}-{b}",
    "policy entropy fell to {x:.3f} nats per token by step {b}",
    "KL to the reference grew to {y:.1f} nats per token at step {b}",
    "mean completion length rose from {a} to {n} tokens without accuracy gains",
    "loss became NaN at step {b} after a gradient norm of {y:.0f}",
    "format reward rose to {p:.2f} while correctness fell to {x:.2f}",
    "train reward {p:.2f} but held-out avg@8 flat at {x:.2f}",
    "near-duplicate completions across prompts: distinct-2 {x:.2f}",
    "completions shrank to {a} tokens; answers lost their reasoning",
    "grad norm spiked to {y:.0f}, {a}x the running median",
)


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of xs, nearest-rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def synthetic_skills(n: int, seed: int = 0) -> list:
    """N variants of the seed interventions: same path and finding kinds, new run notes and tags."""
    from evotrainer.skills_db.models import Skill
    from evotrainer.skills_db.seed import seed_skills

    rng = random.Random(seed)
    base = [s for s in seed_skills() if s.kind == "intervention"]
    out = []
    for i in range(n):
        b = base[i % len(base)]
        dom = rng.choice(DOMAINS)
        note = rng.choice(SYMPTOMS).format(p=rng.random(), x=rng.random(), y=rng.uniform(1, 900),
                                           n=rng.choice((64, 256, 1024, 4096)), a=rng.randint(2, 90),
                                           b=rng.randint(91, 900))
        out.append(Skill(id=f"bench_{i}", kind="intervention", name=f"{b.name} ({dom}, run r{i % 97})",
                         description=f"{b.description} Observed in run r{i % 97} on {dom}: {note}.",
                         addresses=b.addresses, recipe_path=b.recipe_path, value=b.value,
                         tags=[*b.tags, dom], source=f"run:r{i % 97}/v{i % 13}"))
    return out


def _fill_with_stand_in_vectors(store, skills: list, batch: int) -> None:
    """Write skills with their base seed skill's vector plus noise (see the module docstring)."""
    import numpy as np

    from evotrainer.skills_db.embeddings import embed
    from evotrainer.skills_db.seed import seed_skills

    base = [s for s in seed_skills() if s.kind == "intervention"]
    base_vecs = embed([s.search_text() for s in base])  # (36, 384)
    rng = np.random.default_rng(0)
    for i in range(0, len(skills), batch):
        chunk = skills[i:i + batch]
        idx = [int(s.id.split("_")[1]) % len(base) for s in chunk]
        vecs = base_vecs[idx] + rng.normal(0, 0.02, size=(len(chunk), base_vecs.shape[1]))  # (b, 384)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        store.add(chunk, vectors=vecs.astype(np.float32))


def queries(n: int, seed: int = 1) -> list[str]:
    """N distinct finding-like queries (numbers differ, so no query-cache hits)."""
    rng = random.Random(seed)
    qs: list[str] = []
    while len(qs) < n:
        q = rng.choice(SYMPTOMS).format(p=rng.random(), x=rng.random(), y=rng.uniform(1, 900),
                                        n=rng.choice((64, 256, 1024)), a=rng.randint(2, 90), b=rng.randint(91, 900))
        if q not in qs:
            qs.append(q)
    return qs


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="Synthetic skills to add (besides the seed).")
    ap.add_argument("--queries", type=int, default=200, help="Distinct queries per mode.")
    ap.add_argument("--batch", type=int, default=500, help="Skills per add call.")
    ap.add_argument("--embedded", type=int, default=None,
                    help="Skills embedded by the model on add (default: all); the rest get stand-in vectors.")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's).")
    ap.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from rich.progress import Progress

    from evotrainer.skills_db.embeddings import QUERY_CACHE, load_model, numpy_model
    from evotrainer.skills_db.store import SkillStore

    load_start = round(os.getloadavg()[0], 2)
    t0 = time.perf_counter()
    load_model()
    load_s = time.perf_counter() - t0
    res: dict = {"n_skills_added": args.n, "model_load_s": round(load_s, 2)}
    with tempfile.TemporaryDirectory() as tmp:
        store = SkillStore(os.path.join(tmp, "skills"))
        store.count()  # seed
        skills = synthetic_skills(args.n)
        m = args.n if args.embedded is None else min(args.embedded, args.n)
        t0 = time.perf_counter()
        with Progress(transient=True) as bar:
            task = bar.add_task(f"adding {m} skills (embedding on add)", total=m)
            for i in range(0, m, args.batch):
                chunk = skills[i:min(i + args.batch, m)]
                store.add(chunk)
                bar.advance(task, len(chunk))
        add_s = time.perf_counter() - t0
        res.update(n_embedded_on_add=m, add_s=round(add_s, 2), add_skills_per_s=round(m / add_s, 1))
        if m < args.n:
            t0 = time.perf_counter()
            _fill_with_stand_in_vectors(store, skills[m:], args.batch)
            res["stand_in_fill_s"] = round(time.perf_counter() - t0, 2)
        res["total_skills"] = store.count()
        singles = []
        for j, s in enumerate(synthetic_skills(20, seed=7)):
            s.id = f"single_{j}"
            t = time.perf_counter()
            store.add(s)
            singles.append((time.perf_counter() - t) * 1000)
        res["single_add_p50_ms"] = round(statistics.median(singles), 1)

        qs = queries(args.queries)
        model = numpy_model()
        paths = ("hybrid", "hybrid_threaded", "hybrid_old", "hybrid_lancedb")

        def use(path: str) -> None:  # which hybrid path (and numpy forward) the next search takes
            store.lancedb_hybrid = path == "hybrid_lancedb"
            store.threaded_hybrid = path in ("hybrid_threaded", "hybrid_old")
            model.use_reference = path in ("hybrid_old", "hybrid_lancedb")

        for path in paths:  # first-query setup (index load, the reference weights)
            use(path)
            QUERY_CACHE.clear()
            store.search("warm-up query", mode="hybrid")
        # the four paths interleaved query by query, each with a fresh query embedding (cache cleared each time)
        timed = {path: ([], []) for path in paths}
        for q in qs:
            for path in paths:
                use(path)
                QUERY_CACHE.clear()
                t, c = time.perf_counter(), time.process_time()
                store.search(q, mode="hybrid", limit=10)
                timed[path][0].append((time.perf_counter() - t) * 1000)
                timed[path][1].append((time.process_time() - c) * 1000)
        use("hybrid")
        for mode in ("vector", "fts"):
            QUERY_CACHE.clear()
            timed[mode] = ([], [])
            for q in qs:
                t, c = time.perf_counter(), time.process_time()
                store.search(q, mode=mode, limit=10)
                timed[mode][0].append((time.perf_counter() - t) * 1000)
                timed[mode][1].append((time.process_time() - c) * 1000)
        for mode, (lat, cpu) in timed.items():
            res[f"{mode}_p50_ms"] = round(percentile(lat, 0.5), 2)
            res[f"{mode}_p95_ms"] = round(percentile(lat, 0.95), 2)
            # CPU time of all threads of this process per query: the work, independent of other load
            res[f"{mode}_cpu_p50_ms"] = round(percentile(cpu, 0.5), 2)
        for path in paths[1:]:
            res[f"hybrid_over_{path.removeprefix('hybrid_')}_p50"] = round(res["hybrid_p50_ms"] / res[f"{path}_p50_ms"], 3)
        # repeated queries (embedding from the LRU cache), both paths interleaved
        warm: dict[str, list[float]] = {"hybrid": [], "hybrid_threaded": [], "hybrid_lancedb": []}
        for q in qs[:50]:
            store.search(q, mode="hybrid", limit=10)
            for path in warm:
                use(path)
                t = time.perf_counter()
                store.search(q, mode="hybrid", limit=10)
                warm[path].append((time.perf_counter() - t) * 1000)
        use("hybrid")
        for path, lat in warm.items():
            res[f"{path}_warm_p50_ms"] = round(percentile(lat, 0.5), 2)
        # the legs alone with a cached embedding: where a hybrid query's time goes
        for mode in ("vector", "fts"):
            lat = []
            for q in qs[:50]:
                t = time.perf_counter()
                store.search(q, mode=mode, limit=10)
                lat.append((time.perf_counter() - t) * 1000)
            res[f"{mode}_warm_p50_ms"] = round(percentile(lat, 0.5), 2)
        # the vector leg of a hybrid query alone, cached embedding, interleaved: the exact scan of the vectors held
        # in memory (the store's path up to _EXACT_SCAN_MAX_ROWS rows) against LanceDB's vector query (its index)
        tbl = store._table("skills")
        _, vector_query = store._legs("skills", "x", None, 10)
        legs: dict[str, list[float]] = {"vector_leg_exact": [], "vector_leg_lancedb": []}
        for q in qs[:100]:
            v = QUERY_CACHE.get(q)
            t = time.perf_counter()
            held = store._held_vectors("skills")
            held.search(v, 10).to_pylist()
            legs["vector_leg_exact"].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            vector_query(v).to_arrow().to_pylist()
            legs["vector_leg_lancedb"].append((time.perf_counter() - t) * 1000)
        for key, lat in legs.items():
            res[f"{key}_p50_ms"] = round(percentile(lat, 0.5), 2)
        res["vector_leg_exact_over_lancedb_p50"] = round(res["vector_leg_exact_p50_ms"]
                                                         / res["vector_leg_lancedb_p50_ms"], 3)
        # recall@10 of the vector index (IVF_FLAT from 4096 rows) against an exact flat scan
        hits = 0
        for q in qs[:50]:
            v = QUERY_CACHE.get(q)
            approx = tbl.search(v).distance_type("cosine").select(["id", "_distance"]).limit(10).to_list()
            exact = (tbl.search(v).distance_type("cosine").bypass_vector_index().select(["id", "_distance"])
                     .limit(10).to_list())
            hits += len({r["id"] for r in approx} & {r["id"] for r in exact})
        res["vector_index"] = getattr(tbl.index_stats("vector_idx"), "index_type", "none (flat)")
        res["vector_recall_at_10"] = round(hits / (10 * len(qs[:50])), 3)
        QUERY_CACHE.clear()
        from evotrainer.skills_db.embeddings import embed

        # the query embedding alone: the numpy MiniLM a shell search uses (fast and reference forward), and the
        # torch MiniLM (TorchMiniLM: a process with torch loaded, the loop), interleaved query by query
        embedders = {"query_embed_p50_ms": lambda q: model.encode([q]),
                     "query_embed_reference_p50_ms": lambda q: model.encode([q]),
                     "query_embed_torch_p50_ms": lambda q: embed([q])}
        lats: dict[str, list[float]] = {key: [] for key in embedders}
        for q in qs[:100]:
            for key, fn in embedders.items():
                model.use_reference = key == "query_embed_reference_p50_ms"
                t = time.perf_counter()
                fn(q)
                lats[key].append((time.perf_counter() - t) * 1000)
        model.use_reference = False
        for key, lat in lats.items():
            res[key] = round(percentile(lat, 0.5), 2)
    res["goal_hybrid_p50_under_20ms"] = res["hybrid_p50_ms"] < 20.0
    res["load_avg_1m"] = round(os.getloadavg()[0], 2)
    res["load_avg_1m_at_start"] = load_start
    res["cpus"] = os.cpu_count()
    import torch

    res["torch_threads"] = torch.get_num_threads()
    print_result(res, args.json, 28)
    return res


if __name__ == "__main__":
    main()
