"""Rollout store: every sampled completion of a run, in a LanceDB table (DESIGN.md §2).

One row per sample. Columns (:data:`SCHEMA`): ``rollout_id`` (``<version>/<step>/<group>/<sample>``),
``version_id``, ``step``, ``split`` (``train`` | ``eval``), ``prompt_id``, ``group_id``,
``sample_idx``, ``prompt``, ``completion``, ``answer`` (ground truth), ``reward`` (total),
``components`` (JSON ``{name: value}``), ``correct`` (0/1, NaN when unknown), ``advantage``,
``length`` (completion tokens), ``finish_reason`` (``eos`` | ``length`` | ``submit`` | ``budget`` |
``error``), ``kept`` (group kept by the group filter), ``turns`` (JSON list of turns for multi-turn
episodes: ``{role, content, tokens, tool, ok}``; ``""`` for single completions), ``created_at``.

Full-text search over prompts and completions uses LanceDB's native FTS index; aggregates go
through DuckDB over the Arrow table (:meth:`RolloutStore.sql`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

SCHEMA = pa.schema([
    ("rollout_id", pa.string()),
    ("version_id", pa.string()),
    ("step", pa.int32()),
    ("split", pa.string()),
    ("prompt_id", pa.string()),
    ("group_id", pa.string()),
    ("sample_idx", pa.int32()),
    ("prompt", pa.string()),
    ("completion", pa.string()),
    ("answer", pa.string()),
    ("reward", pa.float64()),
    ("components", pa.string()),
    ("correct", pa.float64()),
    ("advantage", pa.float64()),
    ("length", pa.int32()),
    ("finish_reason", pa.string()),
    ("kept", pa.bool_()),
    ("turns", pa.string()),
    ("created_at", pa.float64()),
])
TABLE = "rollouts"


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


class RolloutStore:
    """Append-only LanceDB table of rollouts in ``path``.

    Writers append batches (one Lance fragment per batch, atomic); readers see the latest committed
    version at each call, so a server reading while a trainer writes gets consistent snapshots.
    """

    def __init__(self, path: str | Path):
        import lancedb

        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._db = lancedb.connect(str(self.path))
        self._lock = threading.Lock()
        self._fts_rows = -1

    def _table(self, create: bool = False):
        with self._lock:
            if TABLE in self._db.list_tables().tables:
                return self._db.open_table(TABLE)
            if not create:
                return None
            return self._db.create_table(TABLE, schema=SCHEMA)

    def add(self, records: Iterable[dict[str, Any]]) -> int:
        """Append rows built with :func:`make_record`; returns the number added (atomic per call)."""
        rows = list(records)
        if not rows:
            return 0
        batch = pa.Table.from_pylist(rows, schema=SCHEMA)
        tbl = self._table(create=True)
        tbl.add(batch)
        return len(rows)

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
        tbl.delete(where)
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
            return SCHEMA.empty_table() if columns is None else SCHEMA.empty_table().select(columns)
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
        """Full-text search over prompt and completion (LanceDB native FTS), best first.

        The FTS index is (re)built when rows were added since the last build. Each row has a
        ``_score`` (BM25).
        """
        tbl = self._table()
        if tbl is None:
            return []
        n = tbl.count_rows()
        with self._lock:
            if n != self._fts_rows:
                from lancedb.index import FTS

                tbl.create_index("completion", config=FTS(), replace=True)
                tbl.create_index("prompt", config=FTS(), replace=True)
                self._fts_rows = n
        out: dict[str, dict[str, Any]] = {}
        for col in ("completion", "prompt"):
            q = tbl.search(text, query_type="fts", fts_columns=col)
            if where:
                q = q.where(where, prefilter=True)
            for row in q.limit(limit).to_list():
                rid = row["rollout_id"]
                if rid not in out or row.get("_score", 0) > out[rid].get("_score", 0):
                    out[rid] = row
        return sorted(out.values(), key=lambda r: -r.get("_score", 0.0))[:limit]
