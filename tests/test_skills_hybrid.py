"""The skills store's hybrid search (``SkillStore._hybrid_rows``: the FTS leg overlapping the query embedding, its
own reciprocal rank fusion) returns what LanceDB's hybrid query with ``RRFReranker`` returns: the same rows, in the
same order, with the same ``_relevance_score``.

- :func:`rrf_fuse` by hand (scores 1 / (rank + 60), float32, ties in the vector-then-FTS order), and against
  LanceDB's own fusion (``LanceHybridQueryBuilder._combine_hybrid_results``) on the same two legs;
- end to end on the seed library: ids and scores of ``search`` equal those of LanceDB's hybrid query
  (``lancedb_hybrid = True``) for finding-style queries, with and without pre-filters, for the skills and the
  failed-cases tables;
- the FTS leg is submitted before the query is embedded (the overlap the speed-up comes from).
"""

from __future__ import annotations

import numpy as np
import pytest
from lancedb.query import LanceHybridQueryBuilder
from lancedb.rerankers import RRFReranker
from test_skills import EXPLANATIONS

import evotrainer.skills_db.store as store_mod
from evotrainer.skills_db.embeddings import QUERY_CACHE
from evotrainer.skills_db.models import FailedCase
from evotrainer.skills_db.store import SCHEMAS, SkillStore, build_filter, rrf_fuse

QUERIES = [*EXPLANATIONS.values(), "truncation", "entropy", "learning rate too high", "reward hacking format",
           "zero variance groups all samples same reward", "KL penalty"]
FILTERS = [{}, {"kind": "intervention"}, {"finding_kinds": ["truncation", "entropy_collapse"]},
           {"kind": "analyzer"}, {"tags": ["exploration"]}]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = SkillStore(tmp_path_factory.mktemp("hybrid") / "skills")
    s.count()  # seeded
    return s


def test_rrf_fuse_by_hand():
    vec = [{"_rowid": 1, "id": "a", "_distance": 0.1}, {"_rowid": 2, "id": "b", "_distance": 0.2},
           {"_rowid": 3, "id": "c", "_distance": 0.3}]
    fts = [{"_rowid": 3, "id": "c", "_score": 9.0}, {"_rowid": 4, "id": "d", "_score": 1.0}]
    out = rrf_fuse(vec, fts, 10)
    # c: 1/63 + 1/61; a: 1/61; b: 1/62 and d: 1/62 tie -> b first (vector rows come first)
    assert [r["id"] for r in out] == ["c", "a", "b", "d"]
    assert [r["_relevance_score"] for r in out] == [float(np.float32(x)) for x in (1 / 63 + 1 / 61, 1 / 61, 1 / 62,
                                                                                   1 / 62)]
    assert all(set(r) == {"id", "_relevance_score"} for r in out)
    assert [r["id"] for r in rrf_fuse(vec, fts, 2)] == ["c", "a"]
    assert rrf_fuse([], [], 5) == []


def _legs(tbl, query, where, limit):
    b = (tbl.search(query, query_type="hybrid", vector_column_name="vector").distance_type("cosine")
         .rerank(RRFReranker()).limit(limit))
    if where:
        b = b.where(where, prefilter=True)
    b._create_query_builders()
    return b._vector_query.with_row_id(True).to_arrow(), b._fts_query.with_row_id(True).to_arrow()


@pytest.mark.parametrize("limit", [3, 10])
def test_rrf_fuse_equals_lancedbs_fusion_on_the_same_legs(store, limit):
    tbl = store._table("skills")
    checked = 0
    for q in QUERIES:
        for f in FILTERS:
            vec, fts = _legs(tbl, q, build_filter(**f), limit)
            ref = LanceHybridQueryBuilder._combine_hybrid_results(
                fts_results=fts, vector_results=vec, norm="score", fts_query=q, reranker=RRFReranker(), limit=limit,
                with_row_ids=True).to_pylist()
            ours = rrf_fuse(vec.to_pylist(), fts.to_pylist(), limit)
            assert [(r["id"], r["_relevance_score"]) for r in ours] == [(r["id"], r["_relevance_score"]) for r in ref]
            checked += bool(ref)
    assert checked >= 40


def test_search_equals_lancedbs_hybrid_query(store):
    compared = 0
    for q in QUERIES:
        for f in FILTERS:
            for limit in (3, 10):
                store.lancedb_hybrid = False
                ours = [(h.skill.id, h.score) for h in store.search(q, limit=limit, **f)]
                store.lancedb_hybrid = True
                try:
                    ref = [(h.skill.id, h.score) for h in store.search(q, limit=limit, **f)]
                finally:
                    store.lancedb_hybrid = False
                assert ours == ref, (q, f, limit)
                compared += bool(ref)
    assert compared >= 80
    hit = store.search(EXPLANATIONS["truncation"], limit=3)[0]  # real results, not an empty agreement
    assert "truncation" in hit.skill.addresses and hit.mode == "hybrid"


def test_failed_cases_hybrid_equals_lancedbs(store):
    store.add_failed_case(FailedCase(run="r1", version_id="v3", domain="math", findings=["truncation"],
                                     intervention="generate_max_len 64 -> 32", outcome="hurt",
                                     evidence_summary="more truncation, answers cut off"))
    store.add_failed_case(FailedCase(run="r2", version_id="v1", domain="code", findings=["entropy_collapse"],
                                     intervention="temperature 1.0 -> 0.5", outcome="hurt",
                                     evidence_summary="entropy fell to 0.02"))
    for q in ("answers cut off by the length limit", "entropy collapse after lowering temperature"):
        store.lancedb_hybrid = False
        ours = [c.model_dump() for c in store.search_failed_cases(q, limit=2)]
        store.lancedb_hybrid = True
        try:
            ref = [c.model_dump() for c in store.search_failed_cases(q, limit=2)]
        finally:
            store.lancedb_hybrid = False
        assert ours == ref and len(ours) == 2


@pytest.mark.parametrize(("threaded", "held"), [(False, True), (False, False), (True, False)])
def test_the_fts_leg_starts_before_the_query_is_embedded(store, monkeypatch, threaded, held):
    """The FTS leg is submitted before the query is embedded; the vector leg follows the embedding: an exact scan
    of the held vectors (no LanceDB query) up to _EXACT_SCAN_MAX_ROWS rows, LanceDB's vector query past it."""
    if not held:
        monkeypatch.setattr(store_mod, "_EXACT_SCAN_MAX_ROWS", 0)
        monkeypatch.setattr(store, "_held", {})  # (the module's store holds them from the tests before)
    events: list[str] = []
    orig_get = QUERY_CACHE.get
    if threaded:
        pool = store_mod._leg_pool()
        orig_submit = pool.submit
        monkeypatch.setattr(pool, "submit", lambda fn, *a, **k: events.append("fts submitted") or orig_submit(fn, *a, **k))
    else:
        orig_direct = store_mod._submit_direct
        monkeypatch.setattr(store_mod, "_submit_direct",
                            lambda tbl, q: events.append("fts submitted" if q.full_text_query else "vector submitted")
                            or orig_direct(tbl, q))
    monkeypatch.setattr(QUERY_CACHE, "get", lambda text: events.append("embedded") or orig_get(text))
    QUERY_CACHE.clear()
    run = store._hybrid_rows_threaded if threaded else store._hybrid_rows
    rows = run("skills", "completions are cut off at the length limit", None, 3)
    assert events == ["fts submitted", "embedded", *([] if threaded or held else ["vector submitted"])]
    assert len(rows) == 3
    assert {k for k in rows[0]} == {*(c for c in SCHEMAS["skills"].names if c not in ("vector", "text")),
                                    "_relevance_score"}


def test_search_takes_the_direct_path_on_this_lancedb(store, monkeypatch):
    """The default hybrid search runs its legs on LanceDB's loop (internal API); if a LanceDB release moves it,
    searches fall back to the sync path and this test says so. (The vector leg is LanceDB's only past
    _EXACT_SCAN_MAX_ROWS rows, lowered to 0 here; below it the held vectors are scanned.)"""
    assert store_mod._direct_queries_available(store._table("skills"))
    monkeypatch.setattr(store_mod, "_EXACT_SCAN_MAX_ROWS", 0)
    monkeypatch.setattr(store, "_held", {})
    calls = []
    orig = store_mod._submit_direct
    monkeypatch.setattr(store_mod, "_submit_direct", lambda tbl, q: calls.append(q) or orig(tbl, q))
    store.search("truncation", limit=3)
    assert len(calls) == 2


def _sequential_rows(store, table, query, where, limit):
    """The hybrid search done one step after the other with LanceDB's sync API and the reference embedding:
    embed the query (``forward_reference``), the vector leg, the FTS leg, then :func:`rrf_fuse`."""
    from evotrainer.skills_db.embeddings import numpy_model

    model = numpy_model()
    model.use_reference = True
    try:
        vec = model.encode([query])[0]
    finally:
        model.use_reference = False
    fts, vector = store._legs(table, query, where, limit)
    return rrf_fuse(vector(vec).to_arrow().to_pylist(), fts.to_arrow().to_pylist(), limit)


def test_direct_and_threaded_paths_equal_the_sequential_one(store):
    store.add_failed_case(FailedCase(run="r3", version_id="v2", domain="math", findings=["reward_hacking"],
                                     intervention="format weight 1.0 -> 0.2", outcome="neutral",
                                     evidence_summary="format reward still rose"))
    compared = 0
    for table, filters in (("skills", FILTERS), ("failed_cases", [{}])):
        for q in QUERIES:
            for f in filters:
                where = build_filter(**f) if table == "skills" else None
                for limit in (3, 10):
                    ref = _sequential_rows(store, table, q, where, limit)
                    for run in (store._hybrid_rows, store._hybrid_rows_threaded):
                        QUERY_CACHE.clear()
                        rows = run(table, q, where, limit)
                        assert [r["id"] for r in rows] == [r["id"] for r in ref], (table, q, f, limit, run)
                        assert np.allclose([r["_relevance_score"] for r in rows],
                                           [r["_relevance_score"] for r in ref], rtol=1e-6, atol=0)
                        assert rows == ref  # every column, the score exactly
                    compared += bool(ref)
    assert compared >= 100


def test_the_held_vectors_scan_equals_lancedbs_vector_leg_and_follows_writes(tmp_path):
    """The exact scan of the held vectors (``_HeldVectors.search``) returns LanceDB's flat vector search's rows in
    its order, with its cosine distances (to float32 rounding), for each query; a skill added afterwards through
    the same handle is found by the next search (the held vectors are read again at the table's new version)."""
    from evotrainer.skills_db.embeddings import QUERY_CACHE
    from evotrainer.skills_db.models import Skill

    s = SkillStore(tmp_path / "skills")
    s.count()
    tbl = s._table("skills")
    held = s._held_vectors("skills")
    assert held is not None and held.unit.shape == (tbl.count_rows(), store_mod.NDIMS)
    np.testing.assert_allclose(np.linalg.norm(held.unit, axis=1), 1.0, rtol=1e-5)
    for q in QUERIES:
        vec = QUERY_CACHE.get(q)
        ours = held.search(vec, 7).to_pylist()
        ref = (tbl.search(vec, query_type="vector", vector_column_name="vector").distance_type("cosine")
               .select(["id", "_distance"]).limit(7).with_row_id(True).to_arrow().to_pylist())
        assert [r["_rowid"] for r in ours] == [r["_rowid"] for r in ref]
        assert [r["id"] for r in ours] == [r["id"] for r in ref]
        np.testing.assert_allclose([r["_distance"] for r in ours], [r["_distance"] for r in ref], atol=1e-5)
    before = tbl.version
    s.add(Skill(id="quokka_ladder", kind="intervention", name="quokka ladder", recipe_path="temperature", value=0.9,
                description="a quokka ladder description no seed skill has", addresses=["truncation"]))
    found = s.search("quokka ladder description no seed skill has", limit=3)
    assert found and found[0].skill.id == "quokka_ladder"
    assert s._held["skills"].version == tbl.version > before
