"""Rollout store: every sampled completion of a run, in a LanceDB table (docs/design.md §2).

One row per sample. Columns (:data:`SCHEMA`): ``rollout_id`` (``<version>/<step>/<group>/<sample>``),
``version_id``, ``step``, ``split`` (``train`` | ``eval``), ``prompt_id``, ``group_id``,
``sample_idx``, ``prompt``, ``completion``, ``answer`` (ground truth), ``reward`` (total),
``components`` (JSON ``{name: value}``), ``correct`` (0/1, NaN when unknown), ``advantage``,
``length`` (completion tokens), ``finish_reason`` (``eos`` | ``length`` | ``submit`` | ``budget`` |
``error``), ``kept`` (group kept by the group filter), ``turns`` (JSON list of turns for multi-turn
episodes: ``{role, content, tokens, tool, ok}``; ``""`` for single completions), ``created_at``.

Full-text search over prompts and completions uses LanceDB's native FTS index; aggregates go
through DuckDB over the Arrow table (:meth:`RolloutStore.sql`).

Index maintenance happens on write only: :meth:`RolloutStore.add` creates the FTS indices when missing
and folds new rows into them (``Table.optimize``) once :data:`FTS_OPTIMIZE_ROWS` rows are unindexed; a
search never writes (LanceDB searches the unindexed tail of the table by a flat scan, so results are
complete between updates). Every write retries Lance's "Retryable commit conflict" (concurrent writers
of one table: two processes, or a job and an index update) with exponential backoff and jitter
(:func:`with_commit_retries`); after the last try it is a :class:`RolloutStoreError` without Lance's
internal text.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evotrainer.errors import EvoTrainerError
from evotrainer.lazy import import_lancedb

if TYPE_CHECKING:
    import pyarrow as pa

COLUMNS: tuple[tuple[str, str], ...] = (
    ("rollout_id", "string"),
    ("version_id", "string"),
    ("step", "int32"),
    ("split", "string"),
    ("prompt_id", "string"),
    ("group_id", "string"),
    ("sample_idx", "int32"),
    ("prompt", "string"),
    ("completion", "string"),
    ("answer", "string"),
    ("reward", "float64"),
    ("components", "string"),
    ("correct", "float64"),
    ("advantage", "float64"),
    ("length", "int32"),
    ("finish_reason", "string"),
    ("kept", "bool_"),
    ("turns", "string"),
    ("created_at", "float64"),
)
"""The columns of :data:`SCHEMA`: (name, the pyarrow type factory that makes its type)."""


@functools.cache
def schema() -> pa.Schema:
    """The Arrow schema of the rollouts table (built on first use: pyarrow loads only when rollouts are read
    or written, not with every module that imports this one)."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind in COLUMNS])


def __getattr__(name: str) -> Any:
    """``SCHEMA`` (the Arrow schema, :func:`schema`), made on first access."""
    if name == "SCHEMA":
        return schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TABLE = "rollouts"
FTS_COLUMNS = ("completion", "prompt")
FTS_OPTIMIZE_ROWS = 2_000  # unindexed rows after which the next add() folds them into the FTS indices
COMMIT_RETRIES = 8  # tries of one write under commit conflicts (backoff 0.05 s, doubling: ~6 s in all)
RETRY_BASE_S = 0.05
_INCOMPLETE = object()  # marker: the table folder exists but has no committed version yet


class RolloutStoreError(EvoTrainerError, RuntimeError):
    """A write to the rollout store kept conflicting with concurrent writers."""


def _is_commit_conflict(exc: BaseException) -> bool:
    """Lance's "Retryable commit conflict" and "Incompatible transaction" (a concurrent commit the operation
    cannot be rebased onto): neither committed anything, so running the same operation again is safe for our
    writes (append, delete by predicate, index create / update)."""
    text = str(exc).lower()
    return "commit conflict" in text or "incompatible transaction" in text


def with_commit_retries(fn: Callable[[], Any], what: str, tries: int = COMMIT_RETRIES,
                        base_s: float = RETRY_BASE_S, store: str = "rollout store") -> Any:
    """``fn()``, retried on Lance commit conflicts with exponential backoff (``base_s * 2**k``, jitter x0.5-1.5).

    Raises:
        RolloutStoreError: still conflicting after ``tries`` tries (the message says what to do).
        Exception: any other error of ``fn`` at once.
    """
    for attempt in range(tries):
        try:
            return fn()
        except Exception as exc:
            if not _is_commit_conflict(exc):
                raise
            if attempt == tries - 1:
                raise RolloutStoreError(f"{what}: the {store} kept conflicting with concurrent writers after "
                                        f"{tries} tries; retry later") from None
            time.sleep(base_s * 2**attempt * (0.5 + random.random()))
    raise AssertionError("unreachable")


def make_record(*, version_id: str, step: int, prompt_id: str, group_id: str, sample_idx: int, prompt: str,
                completion: str, reward: float, components: dict[str, float] | None = None,
                answer: str = "", correct: float | None = None, advantage: float = 0.0, length: int = 0,
                finish_reason: str = "eos", kept: bool = True, split: str = "train",
                turns: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Build one rollout row with the store's schema (see module docstring for the fields)."""
    return {
        "rollout_id": f"{version_id}/{split}/{step}/{group_id}/{sample_idx}",
        "version_id": version_id, "step": int(step), "split": split, "prompt_id": str(prompt_id),
        "group_id": str(group_id), "sample_idx": int(sample_idx), "prompt": prompt, "completion": completion,
        "answer": str(answer), "reward": float(reward), "components": json.dumps(components or {}),
        "correct": math.nan if correct is None else float(correct), "advantage": float(advantage),
        "length": int(length), "finish_reason": finish_reason, "kept": bool(kept),
        "turns": json.dumps(turns) if turns else "", "created_at": time.time(),
    }


def _refuse_special_entries(path: Path) -> None:
    """Refuse a dataset folder holding anything but folders and regular files (a link, a FIFO, a device, a socket).

    Lance opens its files following links and blocking: review 7 put a FIFO in place of a data file of a run folder
    from elsewhere, and reading the rollouts (``diagnose``, ``report``, ``sample_rollouts``) blocked for good; a link
    would read a file out of the run folder. One iterative walk of the dataset's entries, following no link.

    Raises:
        RolloutStoreError: names the entry and the fix.
    """
    stack = [path]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif not entry.is_file(follow_symlinks=False):
                    raise RolloutStoreError(f"{entry.path}: not a regular file or folder (a link, a FIFO or a device); "
                                            "a rollout dataset holds none (a run folder from elsewhere may): remove "
                                            "it and rerun")


class RolloutStore:
    """Append-only LanceDB table of rollouts in ``path``.

    Writers append batches (one Lance fragment per batch, atomic); readers see the latest committed
    version at each call, so a server reading while a trainer writes gets consistent snapshots.
    """

    def __init__(self, path: str | Path):
        lancedb = import_lancedb()

        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        _refuse_special_entries(self.path)
        self._db = lancedb.connect(str(self.path))
        self._lock = threading.Lock()

    def _open(self) -> Any:
        """The table, None when there is none, or :data:`_INCOMPLETE` when its folder exists without a committed
        version (another writer is creating it right now, or a creator died half-way)."""
        if TABLE not in self._db.list_tables().tables:
            return None
        try:
            return self._db.open_table(TABLE)
        except ValueError:  # "Table 'rollouts' was not found": listed, but no manifest committed yet
            return _INCOMPLETE

    def _table(self, create: bool = False):
        with self._lock:
            tbl = self._open()
            if tbl is not None and tbl is not _INCOMPLETE:
                return tbl
            if tbl is None and not create:
                return None
            # Two writers creating the table at once commit two Lance "Overwrite" transactions; the later one
            # would replace rows the other had appended meanwhile. One creator at a time, across processes; a
            # reader that finds the table half-made waits for its creator the same way.
            from filelock import FileLock

            with FileLock(str(self.path / ".create.lock"), thread_local=False, timeout=60):
                tbl = self._open()
                if tbl is not None and tbl is not _INCOMPLETE:
                    return tbl
                if not create:
                    return None  # a creator died before its first commit: no rows to read
                # a half-made folder (creator died before committing) holds no rows: overwrite it
                return self._db.create_table(TABLE, schema=schema(), mode="overwrite" if tbl is _INCOMPLETE else "create")

    def add(self, records: Iterable[dict[str, Any]]) -> int:
        """Append rows built with :func:`make_record`; returns the number added (atomic per call).

        Then maintains the FTS indices (:meth:`maintain_index`, best effort).

        Raises:
            RolloutStoreError: the append itself kept conflicting with concurrent writers.
        """
        rows = list(records)
        if not rows:
            return 0
        import pyarrow as pa

        batch = pa.Table.from_pylist(rows, schema=schema())
        tbl = self._table(create=True)
        with_commit_retries(lambda: tbl.add(batch), "adding rollouts")
        self.maintain_index(tbl)
        return len(rows)

    def maintain_index(self, tbl: Any = None, min_unindexed: int | None = None) -> bool:
        """Create the FTS indices on prompt and completion when missing; fold unindexed rows into them once at
        least ``min_unindexed`` (default :data:`FTS_OPTIMIZE_ROWS`) are pending. A write: writers call it.

        Best effort: one writer at a time does it (a non-blocking file lock ``.index.lock``; a writer that
        finds it taken skips, the holder is doing the work), and an update still conflicting after the
        retries is skipped too: the rows are committed already and searches scan unindexed rows, so only
        speed waits for the next write. Returns True when the indices are up to date after the call.
        """
        from filelock import FileLock, Timeout
        from lancedb.index import FTS

        tbl = tbl if tbl is not None else self._table()
        if tbl is None:
            return True
        lock = FileLock(str(self.path / ".index.lock"), thread_local=False)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        try:
            have = {tuple(ix.columns) for ix in tbl.list_indices()}
            for col in FTS_COLUMNS:
                if (col,) not in have:
                    # mypy infers no type for a lambda with a default argument where Callable[[], Any] is due
                    with_commit_retries(lambda c=col: tbl.create_index(c, config=FTS(), replace=True),  # type: ignore[misc]
                                        f"creating the full-text index on {col}")
            threshold = FTS_OPTIMIZE_ROWS if min_unindexed is None else min_unindexed
            pending = max((getattr(tbl.index_stats(f"{c}_idx"), "num_unindexed_rows", 0) or 0) for c in FTS_COLUMNS)
            if pending and pending >= threshold:
                with_commit_retries(tbl.optimize, "updating the full-text index")
            return True
        except RolloutStoreError:
            return False
        finally:
            lock.release()

    def delete(self, where: str) -> int:
        """Delete the rows matching a SQL predicate (e.g. rollouts of steps redone after a crash).

        Returns the number of rows deleted.

        Raises:
            ValueError: an empty predicate (deleting everything needs an explicit ``"true"``).
        """
        if not where.strip():
            raise ValueError("delete needs a predicate, e.g. \"version_id = 'v1' AND step > 3\"")
        tbl = self._table()
        if tbl is None:
            return 0
        before = tbl.count_rows()
        with_commit_retries(lambda: tbl.delete(where), "deleting rollouts")
        return before - tbl.count_rows()

    def count(self, where: str | None = None) -> int:
        """Number of rows (optionally matching a SQL filter)."""
        tbl = self._table()
        if tbl is None:
            return 0
        return tbl.count_rows(where) if where else tbl.count_rows()

    def to_arrow(self, where: str | None = None, columns: list[str] | None = None) -> pa.Table:
        """The rows as an Arrow table (optionally filtered by a SQL predicate / projected)."""
        tbl = self._table()
        if tbl is None:
            return schema().empty_table() if columns is None else schema().empty_table().select(columns)
        if where is None and columns is None:
            return tbl.to_arrow()
        q = tbl.search().where(where) if where else tbl.search()
        if columns:
            q = q.select(columns)
        return q.limit(None).to_arrow()

    def query(self, where: str | None = None, limit: int = 50, offset: int = 0,
              columns: list[str] | None = None) -> list[dict[str, Any]]:
        """Rows matching a SQL predicate, ordered by (version, step, group, sample), paginated."""
        sql_where = f"WHERE {where}" if where else ""
        cols = ", ".join(columns) if columns else "*"
        return self.sql(
            f"SELECT {cols} FROM rollouts {sql_where} ORDER BY version_id, step, group_id, sample_idx "
            f"LIMIT {int(limit)} OFFSET {int(offset)}"
        )

    def sql(self, query: str) -> list[dict[str, Any]]:
        """Run a DuckDB query where the table is named ``rollouts``; rows as dicts."""
        import duckdb

        rollouts = self.to_arrow()  # noqa: F841 (referenced by name in the query)
        con = duckdb.connect()
        try:
            con.register("rollouts", rollouts)
            res = con.execute(query)
            names = [d[0] for d in res.description]
            return [dict(zip(names, row, strict=True)) for row in res.fetchall()]
        finally:
            con.close()

    def search(self, text: str, where: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """Full-text search over prompt and completion (LanceDB native FTS), best first. Read only: rows not yet
        in the index are searched by a flat scan (see the module docstring). Each row has a ``_score`` (BM25)."""
        tbl = self._table()
        if tbl is None:
            return []
        out: dict[str, dict[str, Any]] = {}
        for col in FTS_COLUMNS:
            q = tbl.search(text, query_type="fts", fts_columns=col)
            if where:
                q = q.where(where, prefilter=True)
            for row in q.limit(limit).to_list():
                rid = row["rollout_id"]
                if rid not in out or row.get("_score", 0) > out[rid].get("_score", 0):
                    out[rid] = row
        return sorted(out.values(), key=lambda r: -r.get("_score", 0.0))[:limit]
