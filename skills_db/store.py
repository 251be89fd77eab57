"""SkillStore: the user-level LanceDB memory of skills, failed cases, search traces and version summaries.

Location: the ``path`` argument, else ``$EVOTRAINER_SKILLS_DIR``, else the XDG data dir
(``platformdirs.user_data_path("evotrainer") / "skills"``). Tables:

- ``skills``: one row per :class:`Skill`; ``text`` (name, description, finding kinds, path, tags)
  is embedded into ``vector`` (all-MiniLM-L6-v2, D = 384, cosine) by the registered
  ``MiniLMEmbeddings`` (:func:`~evotrainer.skills_db.embeddings.register_embedding_function`) on add, and indexed by LanceDB's
  native full-text index (BM25). JSON columns: ``value``, ``track_record``.
- ``failed_cases`` and ``version_summaries``: embedded and full-text searchable like skills.
- ``search_traces``: a log (no vectors).

Retrieval (:meth:`SkillStore.search`): ``vector`` (score = 1 - cosine distance), ``fts`` (score =
BM25) or ``hybrid`` (LanceDB hybrid query: both, fused by reciprocal rank, Cormack et al. 2009;
score = RRF relevance), with SQL pre-filters on kind, tags and finding kinds. The seed library
(:mod:`~evotrainer.skills_db.seed`) is loaded when the skills table is created. Every write is a
new LanceDB table version: :meth:`history` lists them and :meth:`restore` rolls a table back.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import ValidationError

from evotrainer.lazy import import_lancedb
from evotrainer.recipe import _shown
from evotrainer.rollouts import with_commit_retries
from evotrainer.skills_db.embeddings import (
    NDIMS,
    QUERY_CACHE,
    embed,
    embedding_function,
    register_embedding_function,
)
from evotrainer.skills_db.models import (
    DOMAIN_MAX_CHARS,
    MAX_COUNT,
    MAX_TRACK_DOMAINS,
    FailedCase,
    SearchTrace,
    Skill,
    SkillError,
    SkillHit,
    TrackRecord,
    VersionSummary,
    check_recipe_path,
)
from evotrainer.skills_db.seed import seed_skills

SKILLS_DIR_ENV = "EVOTRAINER_SKILLS_DIR"
SKILLS, FAILED_CASES, SEARCH_TRACES, VERSION_SUMMARIES = "skills", "failed_cases", "search_traces", "version_summaries"
TABLES: tuple[str, ...] = (SKILLS, FAILED_CASES, SEARCH_TRACES, VERSION_SUMMARIES)
SearchMode = Literal["hybrid", "vector", "fts"]
Outcome = Literal["helped", "hurt", "neutral"]
# Rows added after the FTS index was built are still searched, but flat (tokenised at query time, about
# 0.1 ms per row here) and each add is a small fragment; fold them in (optimize: compaction + index
# update, ~0.1-0.3 s at 10k rows) once this many are unindexed.
_REINDEX_UNINDEXED = 16
# From this many rows a vector index pays off: a flat cosine scan of 10k x 384 took ~18 ms CPU here,
# IVF_FLAT (32 partitions) ~6 ms with recall@10 = 1.0 on the benchmark's queries.
_VECTOR_INDEX_MIN_ROWS = 4096
# Up to this many rows a table's vectors are held in memory per table version and a vector search is an exact
# numpy cosine scan (10k x 384 float32: 15 MB, ~1 ms) instead of LanceDB's plan (IVF_FLAT, ~11 ms with its take);
# docs/performance.md, the skills benchmark. Past it, and for filtered searches, LanceDB's own vector search.
_EXACT_SCAN_MAX_ROWS = 50_000
_KEEP_VERSIONS = timedelta(days=365 * 100)  # optimize() must not prune the history users roll back to
RRF_K = 60  # reciprocal rank fusion constant: LanceDB's RRFReranker default (Cormack et al. 2009)

_STR, _F64, _I32, _STRS = pa.string(), pa.float64(), pa.int32(), pa.list_(pa.string())
_VEC = pa.list_(pa.float32(), NDIMS)
SCHEMAS: dict[str, pa.Schema] = {
    SKILLS: pa.schema([
        ("id", _STR), ("kind", _STR), ("name", _STR), ("description", _STR), ("addresses", _STRS),
        ("recipe_path", _STR), ("value", _STR), ("code", _STR), ("tags", _STRS), ("source", _STR),
        ("track_record", _STR), ("tried", _I32), ("helped", _I32), ("hurt", _I32),
        ("created_at", _F64), ("updated_at", _F64), ("text", _STR), ("vector", _VEC),
    ]),
    FAILED_CASES: pa.schema([
        ("id", _STR), ("run", _STR), ("version_id", _STR), ("domain", _STR), ("findings", _STRS),
        ("intervention", _STR), ("skill_id", _STR), ("outcome", _STR), ("evidence_summary", _STR),
        ("created_at", _F64), ("text", _STR), ("vector", _VEC),
    ]),
    SEARCH_TRACES: pa.schema([
        ("id", _STR), ("run", _STR), ("agent", _STR), ("query", _STR), ("filters", _STR),
        ("results", _STRS), ("chosen", _STR), ("rationale", _STR), ("created_at", _F64),
    ]),
    VERSION_SUMMARIES: pa.schema([
        ("id", _STR), ("run", _STR), ("version_id", _STR), ("domain", _STR), ("intervention", _STR),
        ("status", _STR), ("metrics", _STR), ("findings", _STRS), ("summary", _STR),
        ("created_at", _F64), ("text", _STR), ("vector", _VEC),
    ]),
}
_MODELS: dict[str, type] = {SKILLS: Skill, FAILED_CASES: FailedCase, SEARCH_TRACES: SearchTrace,
                            VERSION_SUMMARIES: VersionSummary}
_JSON_COLS = {"value", "track_record", "filters", "metrics"}


def default_skills_dir() -> Path:
    """``$EVOTRAINER_SKILLS_DIR`` if set, else ``<XDG data dir>/evotrainer/skills``."""
    env = os.environ.get(SKILLS_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return platformdirs.user_data_path("evotrainer") / "skills"


def sql_str(value: str) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + str(value).replace("'", "''") + "'"


def build_filter(kind: str | None = None, finding_kinds: Iterable[str] | None = None,
                 tags: Iterable[str] | None = None) -> str | None:
    """SQL predicate on the skills table: kind equals, addresses / tags share at least one value."""
    parts = []
    if kind:
        if kind not in ("intervention", "analyzer", "procedure"):
            raise SkillError(f"kind={kind!r}: allowed kinds: intervention, analyzer, procedure")
        parts.append(f"kind = {sql_str(kind)}")
    for col, vals in (("addresses", finding_kinds), ("tags", tags)):
        vals = [v for v in (vals or []) if v]
        if vals:
            parts.append(f"array_has_any({col}, [{', '.join(sql_str(v) for v in vals)}])")
    return " AND ".join(parts) or None


def _json_change(before: Any, after: Any) -> str | None:
    """Where ``after`` (a record's ``model_dump(mode="json")``) differs from ``before`` (its Python dump), as
    ``<path>: <before> would be stored as <after>``, or None (a tuple stored as a list is no change)."""
    stack: list[tuple[str, Any, Any]] = [("", before, after)]
    while stack:  # iterative: a deeply nested value is no RecursionError
        where, a, b = stack.pop()
        if isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b):
            stack.extend((f"{where}.{k}" if where else str(k), a[k], b[k]) for k in a)
        elif isinstance(a, (list, tuple)) and isinstance(b, list) and len(a) == len(b):
            stack.extend((f"{where}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b, strict=True)))
        elif type(a) is not type(b) or a != b:
            return f"{where or 'record'}: {_shown(a)} would be stored as {_shown(b)}"
    return None


def _to_row(record: Any, table: str) -> dict[str, Any]:
    """The table row of a record. Refused (review 10, K-R10: ``value: .nan`` was stored as ``value: null``, a row
    the model refuses, and every later listing failed on it): a record whose JSON form differs from it, or whose
    row does not read back.

    Raises:
        SkillError: names the record, the field and the fix.
    """
    data = record.model_dump(mode="json")
    what = f"{table} record {_shown(getattr(record, 'id', '?'))}"
    change = _json_change(record.model_dump(), data)
    if change:
        raise SkillError(f"{what}: {change}; give plain JSON values (finite numbers, strings, lists, mappings); "
                         "nothing was stored")
    row: dict[str, Any] = {}
    for field in SCHEMAS[table].names:
        if field == "vector":
            continue
        if field == "text":
            row["text"] = record.search_text()
        elif field in ("tried", "helped", "hurt"):
            row[field] = getattr(record.totals(), field)
        elif field in _JSON_COLS:
            row[field] = json.dumps(data.get(field))
        else:
            row[field] = data.get(field)
    try:
        _from_row(row, table)
    except (ValidationError, ValueError, TypeError, RecursionError) as err:
        raise SkillError(f"{what}: would be stored as a row that does not read back ({_why(err)}); "
                         "nothing was stored") from None
    return row


def _why(err: BaseException) -> str:
    """A record's validation error in one short line, without the row's values: ``<field>: <message>``."""
    if isinstance(err, ValidationError) and err.errors():
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "record"
        return f"{loc}: {first['msg'].removeprefix('Value error, ')}"[:300]
    return f"{type(err).__name__}: {err}"[:300]


def _unreadable(row: dict[str, Any], table: str, err: BaseException) -> str:
    """What an unreadable row is and how to be rid of it."""
    rid = _shown(row.get("id"))
    fix = (f"replace it (`evotrainer skills add --replace FILE` with a skill of id {rid})"
           if table == SKILLS else "remove it")
    return (f"{table} row {rid} is stored but does not validate ({_why(err)}); {fix}, or roll the table back "
            f"to a version before it (`evotrainer skills history --table {table}`, "
            f"`evotrainer skills restore VERSION --table {table}`)")


def _records(rows: list[dict[str, Any]], table: str) -> list[tuple[dict[str, Any], Any]]:
    """``(row, record)`` of each row that validates. One that does not (written before the write checks, or by
    other means) is skipped with a ``RuntimeWarning`` naming it and the fix, so one bad row does not end every
    listing and search of the memory (review 10, K-R10)."""
    out = []
    for r in rows:
        try:
            out.append((r, _from_row(r, table)))
        except (ValidationError, ValueError, TypeError, RecursionError) as err:
            warnings.warn(f"skills memory: skipped: {_unreadable(r, table, err)}", RuntimeWarning, stacklevel=3)
    return out


def _from_row(row: dict[str, Any], table: str) -> Any:
    model = _MODELS[table]
    data = {k: row[k] for k in model.model_fields if k in row}
    for k in _JSON_COLS & set(data):
        data[k] = json.loads(data[k]) if data[k] else None
    if table == SKILLS and data.get("track_record") is None:
        data["track_record"] = {}
    return model.model_validate({k: v for k, v in data.items() if v is not None or k == "value"})


def _seed_rows() -> list[dict[str, Any]]:
    """Rows of the seed library with their vectors; embedded once per process, then reused."""
    skills = seed_skills()
    rows = [_to_row(s, SKILLS) for s in skills]
    key = tuple(r["text"] for r in rows)
    if _SEED_VECTORS.get("key") != key:
        _SEED_VECTORS.update(key=key, vectors=embed(list(key)))
    for r, v in zip(rows, _SEED_VECTORS["vectors"], strict=True):
        r["vector"] = v
    return rows


_SEED_VECTORS: dict[str, Any] = {}


@functools.cache
def _leg_pool() -> ThreadPoolExecutor:
    """Worker threads for the full-text leg of hybrid searches (made once per process, on the first search)."""
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="skills-fts")


def rrf_fuse(vector_rows: list[dict], fts_rows: list[dict], limit: int) -> list[dict]:
    """Reciprocal rank fusion of two ranked result lists, exactly as LanceDB's ``RRFReranker`` (K = :data:`RRF_K`)
    with its hybrid query's merge: score(row) = sum over the lists holding it of 1 / (rank + K), rank from 1;
    the lists are concatenated (vector first) and each ``_rowid`` kept at its first occurrence; the score is
    rounded to float32 (LanceDB's ``_relevance_score`` column) and the rows stably sorted by it, best first
    (ties keep the concatenated order, as Arrow's stable ``sort_by``); the first ``limit`` are returned, each
    without ``_rowid``, ``_distance`` and ``_score``, with ``_relevance_score``.

    Args:
        vector_rows, fts_rows: rows of each leg in rank order, each with ``_rowid``.
        limit: rows returned at most.
    """
    scores: defaultdict[int, float] = defaultdict(float)
    for rows in (vector_rows, fts_rows):
        for rank, r in enumerate(rows, 1):
            scores[r["_rowid"]] += 1 / (rank + RRF_K)
    seen: set[int] = set()
    merged: list[tuple[float, dict]] = []
    for r in (*vector_rows, *fts_rows):
        rid = r["_rowid"]
        if rid in seen:
            continue
        seen.add(rid)
        row = {k: v for k, v in r.items() if k not in ("_rowid", "_distance", "_score")}
        row["_relevance_score"] = float(np.float32(scores[rid]))
        merged.append((row["_relevance_score"], row))
    merged.sort(key=lambda t: t[0], reverse=True)  # stable, as Arrow's sort_by
    return [row for _, row in merged[:limit]]


def _direct_queries_available(tbl: Any) -> bool:
    """Whether :func:`_submit_direct` can run on this LanceDB: the sync table wraps an ``AsyncTable`` (``_table``)
    with ``_execute_query`` and LanceDB's background event loop is reachable (both internal to LanceDB 0.40; where
    either is gone, hybrid searches take the sync path, :meth:`SkillStore._hybrid_rows_threaded`)."""
    from lancedb.background_loop import LOOP

    return hasattr(getattr(tbl, "_table", None), "_execute_query") and hasattr(LOOP, "loop")


async def _run_direct(tbl: Any, query: Any) -> pa.Table:
    reader = await tbl._table._execute_query(query)
    return pa.Table.from_batches([b async for b in reader], schema=reader.schema)


def _submit_direct(tbl: Any, query: Any) -> Any:
    """Run a LanceDB ``Query`` (from a sync builder's ``to_query_object()``) on LanceDB's own event loop as one
    coroutine: what the sync ``to_arrow`` does (``LanceTable._execute_query``, batches read into one table)
    without its per-batch round trips and schema reads. The query must ask for ``_rowid`` (``with_row_id``), so
    the sync path's blob-column post-processing is a no-op. Returns a ``concurrent.futures.Future`` of the
    ``pa.Table``."""
    from lancedb.background_loop import LOOP

    return asyncio.run_coroutine_threadsafe(_run_direct(tbl, query), LOOP.loop)


def _fuse_legs(pending: Any, query: str, limit: int, vector_leg: Any) -> list[dict]:
    """RRF of a running full-text leg (``pending``: a future of its ``pa.Table``) and the vector leg, run here on
    the query's embedding (``vector_leg(vec) -> pa.Table``) while the full-text leg runs; on an error the pending
    leg is cancelled or awaited first (no orphaned work), and the first error is the one raised."""
    try:
        vec = QUERY_CACHE.get(query)  # what LanceDB's hybrid query embeds it with (the table's function)
        vector_rows = vector_leg(vec).to_pylist()
    except BaseException:
        pending.cancel()
        try:
            pending.result()
        except BaseException:  # noqa: BLE001 (the first error is the one reported)
            pass
        raise
    return rrf_fuse(vector_rows, pending.result().to_pylist(), limit)


class _HeldVectors:
    """One table's rows at one version, for an exact vector search: unit vectors ``unit`` (N x NDIMS float32),
    the ``_rowid`` of each (N int64) and the other columns (``rows``, an Arrow table of N rows, no vector, no
    text). Built by :meth:`SkillStore._held_vectors`."""

    def __init__(self, version: int, unit: np.ndarray, rowids: np.ndarray, rows: pa.Table):
        self.version, self.unit, self.rowids, self.rows = version, unit, rowids, rows

    def search(self, vec: np.ndarray, limit: int) -> pa.Table:
        """The ``limit`` rows nearest ``vec`` by cosine distance (1 - cosine similarity, LanceDB's ``cosine``), in
        order, with ``_distance`` (float32) and ``_rowid``: the rows and order of LanceDB's flat vector search.

        Args:
            vec: the query vector, shape (NDIMS,).
            limit: rows returned at most.
        """
        q = np.asarray(vec, dtype=np.float32)
        norm = float(np.linalg.norm(q))
        dist = 1.0 - self.unit @ (q / norm if norm else q)
        k = min(limit, len(dist))
        top = np.argpartition(dist, k - 1)[:k] if 0 < k < len(dist) else np.arange(len(dist))
        top = top[np.lexsort((self.rowids[top], dist[top]))]  # by distance, then row id
        return (self.rows.take(pa.array(top)).append_column("_distance", pa.array(dist[top], pa.float32()))
                .append_column("_rowid", pa.array(self.rowids[top], pa.uint64())))


def _retry(fn: Any, what: str) -> Any:
    """``fn()`` retried on Lance commit conflicts (:func:`evotrainer.rollouts.with_commit_retries`). Review 3:
    three processes adding skills at once; one ``add`` raised Lance's raw "Retryable commit conflict ... This
    Rewrite transaction was preempted" (with a Rust source path) out of the compaction after its rows landed."""
    return with_commit_retries(fn, what, store="skill store")


class SkillStore:
    """Handle on the skills memory folder (see the module docstring).

    Args:
        path: the LanceDB folder; default :func:`default_skills_dir`.
        seed: load the seed library when the skills table is created (default True).

    Opening reads no model; a search loads the numpy query embedder (~0.1 s, once per process), an
    add loads the sentence-transformers model (a few seconds: torch, once per process). Safe to share between threads; other processes' writes become visible
    within one second.
    """

    def __init__(self, path: str | Path | None = None, seed: bool = True):
        lancedb = import_lancedb()

        register_embedding_function()  # before any table is opened: LanceDB rebuilds its function by name
        self.path = Path(path).expanduser() if path else default_skills_dir()
        self.path.mkdir(parents=True, exist_ok=True)
        self._seed = seed
        self._db = lancedb.connect(str(self.path), read_consistency_interval=timedelta(seconds=1))
        self._lock = threading.RLock()
        self._tables: dict[str, Any] = {}
        self._held: dict[str, _HeldVectors] = {}  # per table: its vectors at its latest version read (exact scans)
        self.lancedb_hybrid = False  # True: hybrid searches run LanceDB's own hybrid query (the reference path)
        self.threaded_hybrid = False  # True: the legs run through LanceDB's sync API, FTS in a worker thread (the path before)

    # --- tables ------------------------------------------------------------------------------------
    def _table(self, name: str) -> Any:
        with self._lock:
            if name in self._tables:
                return self._tables[name]
            tbl = self._try_open(name)
            if tbl is None:
                # Another handle may be creating it too: one creates (and seeds), the others wait. Whether it
                # exists is asked by opening it: a table being created is already listed (its folder exists)
                # before its first manifest is written, and opening it then fails.
                from filelock import FileLock

                with FileLock(str(self.path / ".create.lock")):
                    tbl = self._try_open(name)
                    if tbl is None:
                        self._create(name)
                        tbl = self._db.open_table(name)
            self._tables[name] = tbl
            return tbl

    def _try_open(self, name: str) -> Any:
        """The table, or None while it does not exist (or is half created by another handle)."""
        try:
            return self._db.open_table(name)
        except ValueError as exc:  # lancedb: "Table 'skills' was not found"
            if "was not found" not in str(exc):
                raise
            return None

    def _create(self, name: str) -> None:
        """Create a table: version 1 holds the seed library (skills), version 2 adds the FTS index."""
        from lancedb.embeddings import EmbeddingFunctionConfig

        schema = SCHEMAS[name]
        funcs = None
        if "vector" in schema.names:
            funcs = [EmbeddingFunctionConfig(source_column="text", vector_column="vector",
                                             function=embedding_function())]
        data = _seed_rows() if name == SKILLS and self._seed else None
        tbl = self._db.create_table(name, data=data, schema=schema, embedding_functions=funcs)
        if "text" in schema.names:
            self._build_fts(tbl)

    @staticmethod
    def _build_fts(tbl: Any) -> None:
        from lancedb.index import FTS

        tbl.create_index("text", config=FTS(), replace=True, name="text_idx")

    def _maybe_reindex(self, tbl: Any) -> None:
        """Keep search fast as rows arrive: FTS index always; an IVF_FLAT vector index from
        :data:`_VECTOR_INDEX_MIN_ROWS` rows; compaction + incremental index update (``optimize``,
        which keeps every version) once :data:`_REINDEX_UNINDEXED` rows are unindexed."""
        from lancedb.index import IvfFlat

        fts = tbl.index_stats("text_idx")
        if fts is None:
            _retry(lambda: self._build_fts(tbl), "building the skill store's full-text index")
            fts = tbl.index_stats("text_idx")
        vec = tbl.index_stats("vector_idx")
        # optimize() appends a delta segment to the vector index per call and each segment is probed
        # separately; past a few, one rebuilt index is faster (10k rows: ~3 s to build).
        if (vec is None and tbl.count_rows() >= _VECTOR_INDEX_MIN_ROWS) or (vec and vec.num_indices > 4):
            # IVF_FLAT: exact distances inside the probed partitions (LanceDB default nprobes=20 of 32)
            _retry(lambda: tbl.create_index("vector", config=IvfFlat(distance_type="cosine", num_partitions=32),
                                            replace=True, name="vector_idx"), "building the skill store's vector index")
            vec = tbl.index_stats("vector_idx")
        unindexed = max(fts.num_unindexed_rows, vec.num_unindexed_rows if vec else 0)
        if unindexed >= _REINDEX_UNINDEXED:
            _retry(lambda: tbl.optimize(cleanup_older_than=_KEEP_VERSIONS), "compacting the skill store")

    def _add_rows(self, name: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        tbl = self._table(name)
        _retry(lambda: tbl.add(rows), f"adding {name} rows")
        if "text" in SCHEMAS[name].names:
            self._maybe_reindex(tbl)

    # --- skills ------------------------------------------------------------------------------------
    def add(self, skills: Skill | Iterable[Skill], replace: bool = False, vectors: Any = None) -> list[str]:
        """Add skills (embedded on add); returns their ids.

        Args:
            skills: one skill or several (one table version per call).
            replace: overwrite skills whose id exists (the old rows stay in the table history).
            vectors: optional precomputed embeddings, shape (N, 384), of each skill's
                ``search_text()`` (e.g. copied from another store); skips the model.

        Raises:
            SkillError: an id already exists and ``replace`` is False, ``vectors`` has the wrong shape, or an
                intervention's ``recipe_path`` is no recipe field (:func:`check_recipe_path`).
        """
        items = [skills] if isinstance(skills, Skill) else list(skills)
        for s in items:
            check_recipe_path(s)
        if vectors is not None and (len(vectors) != len(items) or any(len(v) != NDIMS for v in vectors)):
            raise SkillError(f"vectors: need shape ({len(items)}, {NDIMS}), one embedding per skill")
        ids = [s.id for s in items]
        if len(set(ids)) != len(ids):
            raise SkillError(f"duplicate ids in one add: {sorted({i for i in ids if ids.count(i) > 1})}")
        tbl = self._table(SKILLS)
        with self._lock, self._rows_lock():  # review 7: two processes adding one new id both added it (2 rows)
            existing = self._existing_ids(tbl, ids)
            if existing and not replace:
                raise SkillError(f"skill id(s) {sorted(existing)} exist already; pick a new id or pass replace=True")
            if existing:
                tbl.delete(f"id IN ({', '.join(sql_str(i) for i in existing)})")
            for s in items:
                s.updated_at = time.time()
            rows = [_to_row(s, SKILLS) for s in items]
            if vectors is not None:
                for r, v in zip(rows, vectors, strict=True):
                    r["vector"] = [float(x) for x in v]
            self._add_rows(SKILLS, rows)
        return ids

    @contextmanager
    def _rows_lock(self) -> Iterator[None]:
        """One writer at a time across processes for a write that reads the skills table first (an add's id check, an
        outcome's read-modify-write), on the table's latest version: this handle reads one up to
        ``read_consistency_interval`` old, and its own lock is per process."""
        from filelock import FileLock

        with FileLock(str(self.path / ".rows.lock"), thread_local=False, timeout=60):
            self._table(SKILLS).checkout_latest()
            yield

    @staticmethod
    def _existing_ids(tbl: Any, ids: list[str]) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            where = f"id IN ({', '.join(sql_str(x) for x in chunk)})"
            found |= set(tbl.search().where(where).select(["id"]).limit(len(chunk)).to_arrow()["id"].to_pylist())
        return found

    def get(self, skill_id: str) -> Skill:
        """The skill with this id.

        Raises:
            SkillError: no such skill (list ids with ``evotrainer skills list``).
        """
        rows = (self._table(SKILLS).search().where(f"id = {sql_str(skill_id)}")
                .select([c for c in SCHEMAS[SKILLS].names if c != "vector"]).limit(1).to_list())
        if not rows:
            raise SkillError(f"no skill {skill_id!r}; list ids with `evotrainer skills list`")
        try:
            return _from_row(rows[0], SKILLS)
        except (ValidationError, ValueError, TypeError, RecursionError) as err:
            raise SkillError(_unreadable(rows[0], SKILLS, err)) from None

    def list(self, kind: str | None = None, finding_kinds: Iterable[str] | None = None,
             tags: Iterable[str] | None = None, limit: int | None = None) -> list[Skill]:
        """Skills matching the filters, sorted by (kind, id)."""
        where = build_filter(kind, finding_kinds, tags)
        q = self._table(SKILLS).search()
        if where:
            q = q.where(where)
        rows = q.select([c for c in SCHEMAS[SKILLS].names if c != "vector"]).limit(None).to_list()
        skills = sorted((s for _, s in _records(rows, SKILLS)), key=lambda s: (s.kind, s.id))
        return skills[:limit] if limit else skills

    def count(self, table: str = SKILLS) -> int:
        """Rows in a table."""
        return self._table(self._check_table(table)).count_rows()

    def search(self, query: str, kind: str | None = None, finding_kinds: Iterable[str] | None = None,
               tags: Iterable[str] | None = None, mode: SearchMode = "hybrid", limit: int = 10) -> list[SkillHit]:
        """Skills most relevant to ``query`` (free text, e.g. a finding's explanation), best first.

        Filters are applied before ranking (pre-filter). Scores: hybrid = RRF relevance (k = 60),
        vector = 1 - cosine distance, fts = BM25.

        Raises:
            SkillError: empty query, unknown mode or kind, or limit < 1.
        """
        rows = self._search_rows(SKILLS, query, build_filter(kind, finding_kinds, tags), mode, limit)
        score_col = {"hybrid": "_relevance_score", "vector": "_distance", "fts": "_score"}[mode]
        hits = []
        for r, s in _records(rows, SKILLS):
            score = 1.0 - float(r[score_col]) if mode == "vector" else float(r[score_col])
            hits.append(SkillHit(skill=s, score=score, mode=mode, record=s.totals()))
        return hits

    def _search_rows(self, table: str, query: str, where: str | None, mode: str, limit: int) -> list[dict]:
        if not query or not query.strip():
            raise SkillError("query is empty; pass a few words, e.g. a finding's explanation")
        if mode not in ("hybrid", "vector", "fts"):
            raise SkillError(f"mode={mode!r}: allowed modes: hybrid, vector, fts")
        if limit < 1:
            raise SkillError(f"limit={limit}: must be at least 1")
        if mode == "hybrid" and not self.lancedb_hybrid:
            if self.threaded_hybrid or not _direct_queries_available(self._table(table)):
                return self._hybrid_rows_threaded(table, query, where, limit)
            return self._hybrid_rows(table, query, where, limit)
        cols = [c for c in SCHEMAS[table].names if c not in ("vector", "text")]
        tbl = self._table(table)
        if mode == "fts":
            q = tbl.search(query, query_type="fts", fts_columns="text")
        else:
            q = tbl.search(query, query_type=mode, vector_column_name="vector").distance_type("cosine")
        if where:
            q = q.where(where, prefilter=True)
        if mode == "hybrid":
            from lancedb.rerankers import RRFReranker

            q = q.rerank(RRFReranker())
        if mode == "hybrid":  # hybrid rejects _score/_distance in select; lance warns if they are left out
            return q.limit(limit).to_list()
        return q.select([*cols, "_score" if mode == "fts" else "_distance"]).limit(limit).to_list()

    def _legs(self, table: str, query: str, where: str | None, limit: int) -> tuple[Any, Any]:
        """The FTS and vector query builders of a hybrid search, as LanceDB's hybrid query builds them (same
        limit, pre-filter, cosine distance, vector index, FTS columns), each returning ``_rowid`` and the
        non-vector columns; the vector builder is a function of the query vector."""
        cols = [c for c in SCHEMAS[table].names if c not in ("vector", "text")]
        tbl = self._table(table)
        fts = tbl.search(query, query_type="fts").select([*cols, "_score"]).limit(limit).with_row_id(True)
        if where:
            fts = fts.where(where, prefilter=True)

        def vector(vec: np.ndarray) -> Any:
            vq = (tbl.search(vec, query_type="vector", vector_column_name="vector").distance_type("cosine")
                  .select([*cols, "_distance"]).limit(limit).with_row_id(True))
            return vq.where(where, prefilter=True) if where else vq

        return fts, vector

    def _held_vectors(self, table: str) -> _HeldVectors | None:
        """The table's vectors held in memory at its current version (read again when another version is the latest
        this handle sees: a write here, or another process's within ``read_consistency_interval``); None past
        :data:`_EXACT_SCAN_MAX_ROWS` rows."""
        tbl = self._table(table)
        version = tbl.version
        held = self._held.get(table)
        if held is not None and held.version == version:
            return held
        n = tbl.count_rows()
        if n > _EXACT_SCAN_MAX_ROWS:
            self._held.pop(table, None)
            return None
        cols = [c for c in SCHEMAS[table].names if c not in ("vector", "text")]
        data = tbl.search().select([*cols, "vector"]).with_row_id(True).limit(max(n, 1)).to_arrow()
        mat = np.asarray(data.column("vector").combine_chunks().flatten(), dtype=np.float32).reshape(-1, NDIMS)
        norms = np.linalg.norm(mat, axis=1, keepdims=True)
        held = _HeldVectors(version, mat / np.where(norms > 0, norms, 1.0),
                            np.asarray(data.column("_rowid"), dtype=np.int64), data.select(cols))
        with self._lock:
            self._held[table] = held
        return held

    def _hybrid_rows(self, table: str, query: str, where: str | None, limit: int) -> list[dict]:
        """:meth:`_hybrid_rows_threaded` with each leg handed to LanceDB's event loop as one coroutine
        (:func:`_submit_direct`): the FTS leg is submitted before the query is embedded and runs in Rust on the
        loop while numpy embeds; the vector leg follows the embedding. LanceDB's sync ``to_arrow`` makes 4-5
        round trips to its loop thread per leg (two schema reads for blob columns, the query, one per batch;
        ~3 ms of a loaded machine's time per FTS leg in cProfile); each leg here is one. The queries are the
        same ``Query`` objects the sync builders produce (``to_query_object``), so the rows are the same.

        Without a ``where`` filter and up to :data:`_EXACT_SCAN_MAX_ROWS` rows the vector leg is an exact scan
        of the vectors held in memory (:meth:`_held_vectors`): LanceDB's flat search's rows (its IVF_FLAT index,
        from :data:`_VECTOR_INDEX_MIN_ROWS` rows, probes 20 of 32 partitions: recall@10 was 1.0 on the
        benchmark's queries), in ~1 ms instead of ~11 at 10k rows."""
        fts, vector = self._legs(table, query, where, limit)
        tbl = self._table(table)
        pending = _submit_direct(tbl, fts.to_query_object())
        try:
            held = None if where else self._held_vectors(table)
        except BaseException:
            pending.cancel()
            raise
        if held is not None:
            return _fuse_legs(pending, query, limit, lambda vec: held.search(vec, limit))
        return _fuse_legs(pending, query, limit, lambda vec: _submit_direct(tbl, vector(vec).to_query_object()).result())

    def _hybrid_rows_threaded(self, table: str, query: str, where: str | None, limit: int) -> list[dict]:
        """LanceDB's hybrid query with RRF (``tbl.search(query_type="hybrid").rerank(RRFReranker())``), the same
        rows in the same order with the same ``_relevance_score``, in less time: the full-text leg starts in a
        worker thread *before* the query is embedded, so the embedding (numpy) and the FTS search (Rust, without
        the GIL) overlap, and the vector leg follows the embedding; the fusion is :func:`rrf_fuse`. Also skipped:
        LanceDB's per-query thread pool, its schema reads and score normalisation (which RRF does not use).
        Each leg is LanceDB's own (same limit, pre-filter, distance, index and FTS columns as its hybrid query
        builds them); tests/test_skills_hybrid.py compares ids and scores with LanceDB's hybrid query.
        """
        fts, vector = self._legs(table, query, where, limit)
        return _fuse_legs(_leg_pool().submit(fts.to_arrow), query, limit, lambda vec: vector(vec).to_arrow())

    def record_outcome(self, skill_id: str, domain: str, outcome: Outcome) -> TrackRecord:
        """Count one trial of a skill in ``domain``: ``helped``, ``hurt`` or ``neutral`` (tried only).

        Returns the skill's updated track record in that domain.

        ``domain`` ("" means ``general``) is at most :data:`DOMAIN_MAX_CHARS` characters, and a skill's track record
        holds at most :data:`MAX_TRACK_DOMAINS` domains (review 19: every outcome rewrites the row with all of them).

        Raises:
            SkillError: no such skill, an unknown outcome, a domain name over :data:`DOMAIN_MAX_CHARS` characters, or
                a new domain past the skill's :data:`MAX_TRACK_DOMAINS`; nothing is recorded then.
        """
        if outcome not in ("helped", "hurt", "neutral"):
            raise SkillError(f"outcome={outcome!r}: allowed: helped, hurt, neutral")
        domain = domain or "general"
        if len(domain) > DOMAIN_MAX_CHARS:
            raise SkillError(f"domain: {len(domain):,} characters; a domain is a short name of at most "
                             f"{DOMAIN_MAX_CHARS} characters such as 'math', 'code' or 'swe'")
        # A read-modify-write of the skill's row (review 7: two processes recording 40 outcomes each on one skill
        # stored tried=40, not 80: every other trial lost, no error)
        with self._lock, self._rows_lock():
            skill = self.get(skill_id)
            if domain not in skill.track_record and len(skill.track_record) >= MAX_TRACK_DOMAINS:
                raise SkillError(f"domain: skill {skill_id} already has {len(skill.track_record):,} domains in its "
                                 f"track record, the most one skill keeps ({MAX_TRACK_DOMAINS}); record this outcome "
                                 "under one of its domains (get_skill lists them), e.g. 'general'; nothing was recorded")
            rec = skill.track_record.setdefault(domain, TrackRecord())
            rec.tried += 1
            if outcome != "neutral":
                setattr(rec, outcome, getattr(rec, outcome) + 1)
            tot = skill.totals()
            if max(tot.tried, tot.helped, tot.hurt) > MAX_COUNT:
                raise SkillError(f"skill {skill_id}: its track record is at {MAX_COUNT:,} trials, the most the store "
                                 "counts; nothing was recorded")
            self._table(SKILLS).update(where=f"id = {sql_str(skill_id)}", values={
                "track_record": json.dumps({k: v.model_dump() for k, v in skill.track_record.items()}),
                "tried": tot.tried, "helped": tot.helped, "hurt": tot.hurt, "updated_at": time.time()})
        return rec

    # --- failed cases, traces, version summaries ---------------------------------------------------------
    def add_failed_case(self, case: FailedCase) -> str:
        """Store a failed case (embedded); returns its id."""
        self._add_rows(FAILED_CASES, [_to_row(case, FAILED_CASES)])
        return case.id

    def search_failed_cases(self, query: str, limit: int = 5, mode: SearchMode = "hybrid") -> list[FailedCase]:
        """Failed cases most similar to ``query``, best first."""
        return [c for _, c in _records(self._search_rows(FAILED_CASES, query, None, mode, limit), FAILED_CASES)]

    def add_search_trace(self, trace: SearchTrace) -> str:
        """Log what an agent searched, found and chose; returns the trace id."""
        self._add_rows(SEARCH_TRACES, [_to_row(trace, SEARCH_TRACES)])
        return trace.id

    def add_version_summary(self, summary: VersionSummary) -> str:
        """Store (or replace) a version summary, keyed by ``<run>/<version_id>``; returns its id."""
        with self._lock:
            tbl = self._table(VERSION_SUMMARIES)
            tbl.delete(f"id = {sql_str(summary.id)}")
            self._add_rows(VERSION_SUMMARIES, [_to_row(summary, VERSION_SUMMARIES)])
        return summary.id

    def search_version_summaries(self, query: str, limit: int = 5, mode: SearchMode = "hybrid") -> list[VersionSummary]:
        """Version summaries most similar to ``query``, best first."""
        rows = self._search_rows(VERSION_SUMMARIES, query, None, mode, limit)
        return [v for _, v in _records(rows, VERSION_SUMMARIES)]

    def records(self, table: str, where: str | None = None, limit: int | None = 100) -> list[Any]:
        """Records of a table (newest first), optionally filtered by a SQL predicate.

        The newest ``limit`` are chosen on their ids and times alone (columns read apart: the table is columnar), and
        only their rows are read whole (review 14 F-R14: ``limit=10`` read a 178 MB table of 150 summaries whole)."""
        name = self._check_table(table)
        tbl = self._table(name)
        q = tbl.search()
        if where:
            q = q.where(where)
        keys = q.select(["id", "created_at"]).limit(None).to_list()
        keys.sort(key=lambda r: -r["created_at"])
        ids = [r["id"] for r in (keys if limit is None else keys[:limit])]
        if not ids:
            return []
        cols = [c for c in SCHEMAS[name].names if c not in ("vector", "text")]
        rows = []
        for i in range(0, len(ids), 500):
            chosen = f"id IN ({', '.join(sql_str(x) for x in ids[i:i + 500])})"
            rows += tbl.search().where(f"({where}) AND {chosen}" if where else chosen).select(cols).limit(None).to_list()
        rows.sort(key=lambda r: -r["created_at"])
        return [rec for _, rec in _records(rows, name)]

    # --- versions -----------------------------------------------------------------------------------
    @staticmethod
    def _check_table(table: str) -> str:
        if table not in TABLES:
            raise SkillError(f"table={table!r}: allowed tables: {', '.join(TABLES)}")
        return table

    def history(self, table: str = SKILLS) -> list[dict[str, Any]]:
        """Versions of a table, oldest first: ``{version, timestamp (ISO, UTC), rows}``."""
        tbl = self._table(self._check_table(table))
        out = []
        for v in tbl.list_versions():
            ts = v["timestamp"]
            out.append({"version": int(v["version"]), "timestamp": ts.isoformat() if hasattr(ts, "isoformat") else str(ts),
                        "rows": int(v.get("metadata", {}).get("total_rows", -1))})
        return out

    def restore(self, version: int, table: str = SKILLS) -> int:
        """Roll a table back to ``version``: its content becomes a new latest version (history kept).

        Returns the new latest version number.

        Raises:
            SkillError: no such version (see :meth:`history`).
        """
        tbl = self._table(self._check_table(table))
        versions = [int(v["version"]) for v in tbl.list_versions()]
        if version not in versions:
            raise SkillError(f"{table} has no version {version}; versions are {min(versions)}..{max(versions)} "
                             "(see `evotrainer skills history`)")
        with self._lock:
            tbl.restore(version)
            if "text" in SCHEMAS[table].names:
                self._maybe_reindex(tbl)
        return int(tbl.version)
