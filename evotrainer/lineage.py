"""Lineage store: versions, decisions, jobs, step metrics and eval outcomes in SQLite (WAL).

Every multi-row change is one transaction (``with store.tx():``), so a crash at any point leaves a
consistent tree: a version row exists with its recipe and intervention or not at all; a decision
exists together with the status change it caused or not at all. Decisions are append-only.
Jobs left ``running`` by a dead process are marked ``interrupted`` on open, so they can be resumed.

Schema migrations are named and ordered (:data:`MIGRATIONS`), applied once each, recorded in
``_migrations``.
"""

from __future__ import annotations

import difflib
import functools
import heapq
import itertools
import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from evotrainer import metrics as M
from evotrainer import points
from evotrainer.errors import EvoTrainerError
from evotrainer.intervention import Intervention, apply_all
from evotrainer.points import note_thinned, thin_series
from evotrainer.processes import PID_MAX, pid_alive
from evotrainer.recipe import Recipe, diff_recipes, validate_recipe
from evotrainer.terminal import clip_text

Status = Literal["proposed", "training", "trained", "kept", "pruned", "reverted", "merged", "failed"]
STATUSES: tuple[str, ...] = ("proposed", "training", "trained", "kept", "pruned", "reverted", "merged", "failed")
Action = Literal["keep", "prune", "revert", "merge"]
ACTION_STATUS = {"keep": "kept", "prune": "pruned", "revert": "reverted", "merge": "merged"}


class LineageError(EvoTrainerError, ValueError):
    """A lineage operation is invalid (unknown version, bad parent, bad status)."""


MIGRATIONS: list[tuple[str, str]] = [
    (
        "001_core",
        """
        CREATE TABLE versions (
            id TEXT PRIMARY KEY,
            parent_id TEXT REFERENCES versions(id),
            recipe TEXT NOT NULL,
            interventions TEXT NOT NULL,
            status TEXT NOT NULL,
            checkpoint TEXT,
            metrics_summary TEXT NOT NULL DEFAULT '{}',
            eval_summary TEXT NOT NULL DEFAULT '{}',
            findings TEXT NOT NULL DEFAULT '[]',
            note TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX versions_parent ON versions(parent_id);
        CREATE TABLE decisions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            version_id TEXT NOT NULL REFERENCES versions(id),
            action TEXT NOT NULL,
            rationale TEXT NOT NULL,
            evidence TEXT NOT NULL DEFAULT '[]',
            author TEXT NOT NULL,
            prev_status TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            version_id TEXT REFERENCES versions(id),
            kind TEXT NOT NULL,
            status TEXT NOT NULL,
            progress REAL NOT NULL DEFAULT 0,
            steps_done INTEGER NOT NULL DEFAULT 0,
            steps_total INTEGER NOT NULL DEFAULT 0,
            pid INTEGER,
            message TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE TABLE metrics (
            version_id TEXT NOT NULL,
            step INTEGER NOT NULL,
            name TEXT NOT NULL,
            value REAL,
            PRIMARY KEY (version_id, name, step)
        ) WITHOUT ROWID;
        CREATE TABLE eval_samples (
            version_id TEXT NOT NULL,
            eval_name TEXT NOT NULL,
            problem_id TEXT NOT NULL,
            sample_idx INTEGER NOT NULL,
            correct REAL NOT NULL,
            completion TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (version_id, eval_name, problem_id, sample_idx)
        ) WITHOUT ROWID;
        CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        """,
    ),
    (
        # a control arm, the parent's recipe continued for the same steps from the same checkpoint
        "002_version_role",
        "ALTER TABLE versions ADD COLUMN role TEXT NOT NULL DEFAULT ''",
    ),
    (
        # the finding kind that marks a pruned / reverted version's weights as damaged, typed (the gate's
        # damaged_weights). Decisions written before it cited the finding as 'finding:<kind>:<version>' among
        # their evidence with one of the three kinds that meant damage then; those rows are filled in once here.
        "003_decision_damaged_weights",
        """
        ALTER TABLE decisions ADD COLUMN damaged_weights TEXT;
        UPDATE decisions SET damaged_weights = (
            SELECT substr(j.value, 9, length(j.value) - 9 - length(decisions.version_id))
            FROM json_each(decisions.evidence) AS j
            WHERE j.value IN ('finding:entropy_collapse:' || decisions.version_id,
                              'finding:nan_blowup:' || decisions.version_id,
                              'finding:kl_blowup:' || decisions.version_id)
            ORDER BY j.key LIMIT 1)
        WHERE action IN ('prune', 'revert')
        """,
    ),
]

CONTROL = "control"
"""``Version.role`` of a control arm: the parent's recipe, no change, trained for the same steps from the same
checkpoint as its siblings (one per parent), the baseline the gate measures an intervention against."""


class Version(BaseModel):
    """A node of the lineage tree (docs/design.md §2)."""

    id: str
    parent_id: str | None
    recipe: Recipe
    interventions: list[Intervention] = Field(default_factory=list)
    status: Status
    checkpoint: str | None = None
    metrics_summary: dict[str, Any] = Field(default_factory=dict)
    eval_summary: dict[str, Any] = Field(default_factory=dict)
    findings: list[dict[str, Any]] = Field(default_factory=list)
    note: str = ""
    role: str = Field("", description="'' for a version, 'control' for a control arm (no change: 'continue').")
    created_at: float
    updated_at: float

    @property
    def is_control(self) -> bool:
        """True for a control arm (:data:`CONTROL`)."""
        return self.role == CONTROL

    def describe_change(self) -> str:
        """The change of this version in one line: its interventions, ``continue`` for a control, ``base``.

        At most :data:`DESCRIBE_INTERVENTIONS_MAX` interventions are spelt out (each value cut to
        :data:`~evotrainer.intervention.DESCRIBE_VALUE_CHARS` characters), then ``and N more``: a few KB whatever
        the store holds."""
        if self.is_control:
            return "continue (control)"
        shown = [iv.describe() for iv in self.interventions[:DESCRIBE_INTERVENTIONS_MAX]]
        more = len(self.interventions) - len(shown)
        return "; ".join(shown + ([f"and {more:,} more"] if more > 0 else [])) or "base"

    @property
    def intervention(self) -> Intervention | None:
        """The single intervention of a non-merged child (None for the root)."""
        return self.interventions[0] if len(self.interventions) == 1 else None


class Decision(BaseModel):
    """An append-only decision record: keep / prune / revert / merge with rationale and evidence."""

    id: int
    version_id: str
    action: Action
    rationale: str
    evidence: list[str]
    author: str
    prev_status: str
    created_at: float
    damaged_weights: str | None = Field(None, description="The finding kind that marks the version's weights as "
                                                          "damaged (a prune / revert for it): its children start "
                                                          "from its own start point.")




JOB_MESSAGE_MAX_CHARS = 4000
"""Characters of a job's message read (EvoTrainer's are one line; the rest is cut, saying how much)."""
_JOB_COLUMNS = ("id, version_id, kind, status, progress, steps_done, steps_total, pid, substr(message, 1, ?) AS message, "
                "length(message) AS message_len, created_at, updated_at")


def _row_to_job(r: sqlite3.Row) -> Job:
    """A :class:`Job` of a row selected with :data:`_JOB_COLUMNS` (its message cut, saying how much)."""
    d = dict(r)
    n = d.pop("message_len")
    if isinstance(n, int) and isinstance(d["message"], str) and n > len(d["message"]):
        d["message"] += f"... [{n - len(d['message'])} more chars]"
    return Job(**d)


class Job(BaseModel):
    """A train / eval job of a version, with progress."""

    id: str
    version_id: str | None
    kind: str
    status: Literal["queued", "running", "done", "failed", "cancelled", "interrupted"]
    progress: float
    steps_done: int
    steps_total: int
    pid: int | None
    message: str
    created_at: float
    updated_at: float

    @field_validator("pid", mode="before")
    @classmethod
    def _no_pid_is_none(cls, v: Any) -> Any:
        """A stored pid that is no process id (text, a float, a blob, outside 1..PID_MAX: review 8's foreign
        lineage.db) reads as None, the job of no live process, instead of failing every read of the jobs."""
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < PID_MAX else None


_pid_alive = pid_alive  # looked up here at each call (tests wrap it)


def _brief(value: Any) -> str:
    """A stored value for an error message, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_STORE_SERIALS = itertools.count(1)
STALE_TRAINING_MAX = 1000  # versions LineageStore.stale_training names per open (a run trains a few at a time)
BUSY_TIMEOUT_S = 30  # how long a statement waits for another connection's lock (sqlite3's busy handler)
MAX_LINEAGE_DEPTH = 256  # versions on one path from the root (LineageStore._refuse_parent_cycles, branch)
# The metric rows read: those log_metrics writes (an integer step, a number or NULL). SQLite keeps any type in any
# column, and review 7's crafted lineage.db with a step of 1e30 (REAL) and one of 'abc' ended `diagnose` with a bare
# OverflowError and `report` with "ValueError: invalid literal for int()"; such rows are not read.
_METRIC_ROW_OK = "typeof(step) = 'integer' AND typeof(value) IN ('real', 'integer', 'null')"

_SUMMARY_TEXT = frozenset({"data_split"})  # the one metrics_summary entry that is text (rl_backend.local: a digest)
SUMMARY_MAX = 256
"""Entries a version's ``metrics_summary`` keeps (:func:`capped_summary`): the headline metrics first, then the first
by name; the full series stay in the ``metrics`` table. Review 12 G-R12: an import of a foreign run with 1,000,000
one-point series wrote one mean per series (a 34 MB summary) that every read of the version then decoded."""
COLUMN_MAX_CHARS = 1 << 20
"""Characters of one JSON / text column of a ``versions`` row that the store reads (1 MiB): what EvoTrainer writes
there stays far below it (a summary of :data:`SUMMARY_MAX` entries is some 20 KB), and a longer one (G-R12: a crafted
41 MB ``metrics_summary`` made ``lineage show`` take 8.3 s and 796 MB, MCP ``get_version`` 22.4 s) is refused by its
``length()`` before the row is fetched."""
_CAPPED_COLUMNS: dict[str, str | None] = {
    "recipe": None, "interventions": None, "checkpoint": "NULL", "metrics_summary": "'{}'", "eval_summary": "'{}'",
    "findings": "'[]'", "note": "''"}
"""The ``versions`` columns held to :data:`COLUMN_MAX_CHARS`, each with the value that resets it (None: none does)."""
VERSIONS_READ_MAX_CHARS = 64 << 20
"""Characters of the capped columns of all the versions one read takes in (64 MiB): a version EvoTrainer writes holds
a few KB to a few hundred KB (its summary and findings capped), so this is hundreds of versions at the worst. Review
14 E-R14: 300 versions of ~1 MB interventions each (each column under :data:`COLUMN_MAX_CHARS`) made
``list_versions(limit=1)`` read 290 MB whole (22.2 s, 2.4 GB), ``lineage show`` 97.9 s and 3.4 GB."""
INTERVENTIONS_MAX = 64
"""Interventions one version holds (a child has one, a merge two, ``propose_recipe`` a few)."""
TREE_INTERVENTIONS_MAX = 20
"""Interventions one node of :meth:`LineageStore.tree` describes (review 14 E-R14: 2,000 a version, uncut)."""
DESCRIBE_INTERVENTIONS_MAX = 5
"""Interventions :meth:`Version.describe_change` spells out ("...; and N more" for the rest): a child has one, a merge
two, ``propose_recipe`` a few. Review 16 E2-R16: a crafted store of 280 versions of 1,000 interventions each made
``lineage show`` print every one (37 s, 707 MB, 34.7 MB of text on a loaded 2-core machine) and the report 89 s."""
_SUMMARY_FIRST = ("steps", *M.ALL_STEP_METRICS)
FINDINGS_MAX = 500
"""Findings a version keeps (:func:`capped_findings`): the analyzers raise a handful per version; review 12 G-R12's
crafted 400,000 findings were a 66 MB ``get_version`` reply, and nothing but the read cap bounded what a writer stored."""
_SEVERITY_RANK = {"blocking": 0, "warn": 1, "info": 2}
KV_ITEMS_MAX_CHARS = 32 << 20
"""Characters of the kv values one prefix read takes in (the loop's records under ``loop/r`` are KBs a round)."""
METRIC_NAME_MAX_CHARS = 1024
"""Characters of a metric name read (real ones are under 100: ``val-core/openai/gsm8k/reward/mean@1``); a longer one
is left out of every listing (review 15 J-R15: 25,000 names just under an earlier 4,096 cap)."""
KV_VALUE_MAX_CHARS = 4 << 20
"""Characters of one run-level (kv) value as JSON, written or read (4 MiB): the loop's records are a few KB, the run's
registered analyzers (their code, one object) the largest. Review 14 B-R14: 150 ``register_analyzer`` calls of
~1 MB each grew one value to 146.6 MB; every later registration re-read and rewrote it (7.2 s a call, 1.75 GB), and
``list_analyzers`` answered 228 MiB."""
DECISIONS_PER_VERSION_MAX = 200
"""Decisions one version takes (the loop makes one to three: keep / prune, a revert, a merge's). Review 14 A-R14: a
client that repeated ``decide(v0, keep)`` with ~1 MB of rationale and evidence 200 times made ``get_version(v0)`` a
372 MB reply (9.1 s, a 6.8 s stall of every call); past the cap a decision is refused."""
EVIDENCE_MAX = 64
"""Evidence references one decision holds (metric series, rollout ids, finding ids, job ids)."""
EVIDENCE_REF_MAX_CHARS = 1000
"""Characters of one evidence reference: an id or a series name, not a copy of the evidence."""


VERSION_IDS_LISTED_MAX = 20
"""Version ids an unknown-version error lists: every one up to this many, else the closest to the id asked for
(review 16 J-R16: the error listed every id; 20,000 crafted ids of 1,000 characters made a 20 MB error line, and an
MCP reply as long)."""
VERSION_IDS_MATCHED_MAX = 1000
"""Ids difflib compares with an unknown one (those nearest to it in length first): difflib's ratio costs the product
of the two lengths, so the pool is bounded whatever the run holds."""
VERSION_ID_SHOWN_CHARS = 80
"""Characters of a version id an error shows (EvoTrainer's ids are ``v<n>``)."""


def known_versions_text(wanted: str, ids: Sequence[str], total: int | None = None) -> str:
    """The known-versions part of an unknown-version error: ``v0, v1, v2`` when there are at most
    :data:`VERSION_IDS_LISTED_MAX`, else the :data:`VERSION_IDS_LISTED_MAX` closest to ``wanted`` (difflib, over at
    most :data:`VERSION_IDS_MATCHED_MAX` ids of ``ids``) and how many there are; ``none`` for none. Each id cut to
    :data:`VERSION_ID_SHOWN_CHARS` characters.

    ``ids``: every id, or a pool of them (:func:`_id_pool`) when ``total`` (the number of versions) is given."""
    n = len(ids) if total is None else total
    if n == 0:
        return "none"
    cut = [str(i)[:VERSION_ID_SHOWN_CHARS] for i in ids]
    if n <= VERSION_IDS_LISTED_MAX:
        return ", ".join(cut)
    key = str(wanted)[:VERSION_ID_SHOWN_CHARS]
    pool = cut if total is not None else _id_pool(key, cut)
    # similarity of each id's start (10 characters past the id asked for): a long id that begins like it ranks above
    # a short one that does not (the whole-id ratio ranked 'v0' above 'v1234-xxx...' for 'v1234-typo')
    close = heapq.nlargest(VERSION_IDS_LISTED_MAX, dict.fromkeys(pool),
                           key=lambda i: difflib.SequenceMatcher(None, key, i[:len(key) + 10]).ratio())
    return (f"{', '.join(close)} (the {len(close)} closest of {n:,}; MCP list_versions or `evotrainer lineage show "
            "--json` lists them all)")


def _id_prefix(key: str) -> str:
    """The start an id close to ``key`` likely shares: its first half (``v12`` of ``v123x``)."""
    return key[:max(1, len(key) // 2)]


def _id_pool(key: str, ids: list[str]) -> list[str]:
    """At most :data:`VERSION_IDS_MATCHED_MAX` of ``ids`` (cut) for difflib: those starting with
    :func:`_id_prefix` (half the pool at most), then those nearest to ``key`` in length."""
    half = VERSION_IDS_MATCHED_MAX // 2
    prefix = _id_prefix(key)
    pool = list(dict.fromkeys(itertools.islice((i for i in ids if i.startswith(prefix)), half)))
    seen = set(pool)
    pool += heapq.nsmallest(VERSION_IDS_MATCHED_MAX - len(pool), (i for i in ids if i not in seen),
                            key=lambda i: abs(len(i) - len(key)))
    return pool


def unknown_version_error(wanted: str, ids: Sequence[str], total: int | None = None) -> LineageError:
    """``version 'x' not found; known versions: ...`` (:func:`known_versions_text`)."""
    return LineageError(f"version {str(wanted)[:VERSION_ID_SHOWN_CHARS]!r} not found; known versions: "
                        f"{known_versions_text(wanted, ids, total)}")


def check_evidence(evidence: list[str] | None) -> list[str]:
    """``evidence`` (None: none) when it holds at most :data:`EVIDENCE_MAX` references of at most
    :data:`EVIDENCE_REF_MAX_CHARS` characters each.

    Raises:
        LineageError: names the bound that does not hold, and the fix.
    """
    refs = list(evidence or [])
    if len(refs) > EVIDENCE_MAX:
        raise LineageError(f"evidence: {len(refs):,} references, past the {EVIDENCE_MAX} a decision holds; cite the "
                           "most telling ones (ids of metric series, rollouts, findings, jobs), not all")
    long = next((i for i, r in enumerate(refs) if len(r) > EVIDENCE_REF_MAX_CHARS), None)
    if long is not None:
        raise LineageError(f"evidence[{long}]: {len(refs[long]):,} characters, past the {EVIDENCE_REF_MAX_CHARS:,} a "
                           "reference holds; give the id of what you cite (a metric series, a rollout, a finding, a "
                           "job), and the reasoning in the rationale")
    return refs


def _fitting_columns(what: str, **texts: str) -> dict[str, str]:
    """``texts`` (column -> its text as stored) when each fits :data:`COLUMN_MAX_CHARS`.

    Review 14 O-R14: ``branch`` (``propose_recipe`` with 46 changes of long text, or a merge of two siblings of
    ~0.5 MB interventions each) wrote an ``interventions`` column of 1,056,270 characters that every later read refused
    as "a crafted or damaged file": one call bricked the run. Every writer of ``versions`` now checks first.

    Raises:
        LineageError: names ``what``, the column, its size and the fix; nothing is written.
    """
    for col, text in texts.items():
        if len(text) > COLUMN_MAX_CHARS:
            raise LineageError(f"{what}: its {col} would hold {len(text):,} characters, past the {COLUMN_MAX_CHARS:,} "
                               f"the store reads back; not written. Make the change smaller (fewer interventions, "
                               "shorter values, hypotheses and notes)")
    return texts


def capped_findings(findings: list[Any], cap: int = FINDINGS_MAX) -> list[Any]:
    """At most ``cap`` of ``findings``, the most severe first (blocking, warn, info, anything else), each severity
    in its given order."""
    def rank(i: int) -> tuple[int, int]:
        f = findings[i]
        sev = f.get("severity") if isinstance(f, dict) else None
        return _SEVERITY_RANK.get(sev, 3) if isinstance(sev, str) else 3, i

    return [findings[i] for i in sorted(range(len(findings)), key=rank)[:cap]]


def capped_summary(summary: dict[str, Any], cap: int | None = None) -> tuple[dict[str, Any], int]:
    """``(summary kept, entries left out)``: at most ``cap`` (default :data:`SUMMARY_MAX`) entries of a
    ``metrics_summary``, the headline metrics (``steps``, ``data_split``, ``metrics.ALL_STEP_METRICS``) first, then
    the others in name order."""
    cap = SUMMARY_MAX if cap is None else cap
    if len(summary) <= cap:
        return summary, 0
    first = [k for k in (*_SUMMARY_FIRST, *sorted(_SUMMARY_TEXT)) if k in summary]
    rest = sorted(k for k in summary if k not in set(first))
    keep = (first + rest)[:cap]
    return {k: summary[k] for k in keep}, len(summary) - len(keep)
_MIGRATIONS_SQL = "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL)"

_decode_text = functools.partial(str, encoding="utf-8", errors="replace")
"""The stores' ``text_factory``: TEXT that is not UTF-8 reads with U+FFFD in place of the bad bytes. Review 10 U-R10: a
crafted ``metrics.name`` of invalid UTF-8 (``CAST(X'...FF' AS TEXT)``) ended ``report`` and ``diagnose`` with a bare
"OperationalError: Could not decode to UTF-8 column 'name'", and the MCP metric tools failed for the whole run."""


def _norm_sql(sql: Any) -> str | None:
    """A CREATE statement with its whitespace made canonical, for comparing schemas written by other SQLite builds."""
    if sql is None:
        return None
    return re.sub(r"\s*([(),])\s*", r"\1", re.sub(r"\s+", " ", str(sql))).strip()


@functools.lru_cache(maxsize=1)
def _expected_schema() -> tuple[dict[str, list[list[tuple]]], dict[str, set[str]], dict[str, tuple[str, str | None]]]:
    """What :data:`MIGRATIONS` make, after each of them (a store written before a migration opens too):
    ``(columns, tables, indexes)``: every ``PRAGMA table_xinfo`` row list a table has had (``{table: [rows, ...]}``),
    every normalised CREATE TABLE it has had, and every index (``{name: (table, normalised sql)}``; SQLite's own
    ``sqlite_autoindex_*`` have none). Built once, in memory, by running the migrations as :meth:`LineageStore._migrate`
    does."""
    db = sqlite3.connect(":memory:")
    try:
        db.execute(_MIGRATIONS_SQL)
        columns: dict[str, list[list[tuple]]] = {}
        tables: dict[str, set[str]] = {}
        indexes: dict[str, tuple[str, str | None]] = {}
        for _name, sql in MIGRATIONS:
            for stmt in filter(str.strip, sql.split(";")):
                db.execute(stmt)
            for typ, name, tbl, text in db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"):
                if typ == "table":
                    cols = [tuple(r[1:]) for r in db.execute(f'PRAGMA table_xinfo("{name}")')]
                    if cols not in columns.setdefault(name, []):
                        columns[name].append(cols)
                    tables.setdefault(name, set()).add(_norm_sql(text) or "")
                elif typ == "index":
                    indexes[name] = (tbl, _norm_sql(text))
        return columns, tables, indexes
    finally:
        db.close()



class LineageIndex:
    """The parent links of every version, read in one query, and the walks up the lineage done in memory.

    Review 8 M-R8: ``report`` on a crafted lineage.db of four chains of 250 versions took minutes, because each
    version's :meth:`LineageStore.step_offset` walked to the root with several queries a step (versions x depth
    queries). Here the parents are one query (on construction), the latest decision of every version one more
    and every version's last step one more (each on first need), whatever the depth; the walks are memoised. A
    snapshot: build a new one to see later writes.

    Made by :meth:`LineageStore.lineage_index`. Every method raises :class:`LineageError` for a version that is not
    in the lineage (the message lists the known ids, or the 20 closest of many), or that names a parent missing from
    it.
    """

    def __init__(self, store: LineageStore):
        self._store = store
        self._parent: dict[str, str | None] = {
            r[0]: r[1] for r in store._q("SELECT id, parent_id FROM versions ORDER BY created_at, id")}
        self._damaged: dict[str, str] | None = None
        self._last: dict[str, int] | None = None
        self._depth: dict[str, int] = {}
        self._start: dict[str, str | None] = {}
        self._offset: dict[str, int] = {}

    def ids(self) -> list[str]:
        """Every version id, in creation order."""
        return list(self._parent)

    def parent(self, version_id: str) -> str | None:
        """``version_id``'s parent id (None for the root).

        Raises:
            LineageError: no such version, or its parent is not in the lineage (a crafted or damaged file).
        """
        if version_id not in self._parent:
            raise unknown_version_error(version_id, list(self._parent))
        p = self._parent[version_id]
        if p is not None and p not in self._parent:
            raise LineageError(f"{self._store.path}: version {version_id!r} names parent {str(p)[:80]!r}, which is "
                               "not in the lineage (a crafted or damaged file); not read. Use a run folder EvoTrainer "
                               "wrote")
        return p

    def _too_deep(self, version_id: str) -> LineageError:
        return LineageError(f"{self._store.path}: version {version_id!r} is its own ancestor (a parent cycle written "
                            "after this store was opened; a crafted or damaged file). Use a run folder EvoTrainer wrote")

    def ancestors(self, version_id: str) -> list[str]:
        """``[version_id, parent, ..., root]``.

        Raises:
            LineageError: an unknown version, a missing parent or a parent cycle.
        """
        out = [version_id]
        p = self.parent(version_id)
        while p is not None:
            out.append(p)
            if len(out) > len(self._parent):
                raise self._too_deep(version_id)
            p = self.parent(p)
        return out

    def depth(self, version_id: str) -> int:
        """Versions on the path from the root to ``version_id``, both counted (the root is 1). Memoised.

        Raises:
            LineageError: an unknown version, a missing parent or a parent cycle.
        """
        path: list[str] = []
        v: str | None = version_id
        while v is not None and v not in self._depth:
            path.append(v)
            if len(path) > len(self._parent):
                raise self._too_deep(version_id)
            v = self.parent(v)
        d = 0 if v is None else self._depth[v]
        for u in reversed(path):
            d += 1
            self._depth[u] = d
        return self._depth[version_id]

    def damaged(self, version_id: str) -> str | None:
        """As :meth:`LineageStore.damaged`: the ``damaged_weights`` of the version's latest decision when that is a
        prune or revert, else None (a value that is no text, in a crafted file, counts as none)."""
        if self._damaged is None:
            rows = self._store._q(
                "SELECT d.version_id, d.action, d.damaged_weights FROM decisions d JOIN "
                "(SELECT version_id, MAX(id) AS id FROM decisions GROUP BY version_id) m ON d.id = m.id")
            self._damaged = {r[0]: r[2] for r in rows if r[1] in ("prune", "revert") and isinstance(r[2], str) and r[2]}
        return self._damaged.get(version_id)

    def last_step(self, version_id: str) -> int:
        """As :meth:`LineageStore.last_step`: the last step with logged metrics, -1 if none."""
        if self._last is None:
            self._last = {r[0]: int(r[1]) for r in self._store._q(
                f"SELECT version_id, MAX(step) FROM metrics WHERE {_METRIC_ROW_OK} GROUP BY version_id")}
        return self._last.get(version_id, -1)

    def start_id(self, version_id: str) -> str | None:
        """The id of the version whose checkpoint ``version_id`` trains from (:meth:`LineageStore.start_version`);
        None for the base model. Memoised.

        Raises:
            LineageError: an unknown version, a missing parent or a parent cycle.
        """
        if version_id not in self._start:
            p = self.parent(version_id)
            steps = 0
            while p is not None and self.damaged(p):
                steps += 1
                if steps > len(self._parent):
                    raise self._too_deep(version_id)
                p = self.parent(p)
            self._start[version_id] = p
        return self._start[version_id]

    def step_offset(self, version_id: str) -> int:
        """Steps trained before ``version_id``'s first step along the weights it continues
        (:meth:`LineageStore.step_offset`: ``offset(v) = offset(s) + last_step(s) + 1``, ``s`` its start version; 0
        from the base model). Memoised.

        Raises:
            LineageError: an unknown version, a missing parent or a parent cycle.
        """
        todo: list[str] = []
        v = version_id
        while v not in self._offset:
            s = self.start_id(v)
            if s is None:
                self._offset[v] = 0
                break
            todo.append(v)
            if len(todo) > len(self._parent):
                raise self._too_deep(version_id)
            v = s
        for u in reversed(todo):
            s = self.start_id(u)
            assert s is not None
            self._offset[u] = self._offset[s] + self.last_step(s) + 1
        return self._offset[version_id]


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_CORRUPT (any extended code): a damaged page, not a lock or a missing permission."""
    return str(getattr(exc, "sqlite_errorname", "")).startswith("SQLITE_CORRUPT") or "malformed" in str(exc)


NUM = (int, float)
"""A number in a :data:`Shape` (never a bool)."""


class KvMap:
    """A :data:`Shape`: a JSON object of any keys whose values all have ``shape`` (``{"eval/v0/heldout": 12.5}``)."""

    def __init__(self, shape: Shape):
        self.shape = shape


Shape = Any
"""What :meth:`LineageStore.kv_get` checks a stored value against: a type or a tuple of types (``dict``, ``str``,
:data:`NUM`); ``{field: Shape}``, a JSON object whose listed fields, when present, have those shapes (others are not
checked); ``[Shape]``, a JSON list of items of that shape; :class:`KvMap`. None (JSON null) matches anything."""

_KINDS = {dict: "a JSON object", list: "a JSON list", str: "text", bool: "true or false", int: "a number",
          float: "a number"}


def _json_kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _shape_name(shape: Shape) -> str:
    if isinstance(shape, (dict, KvMap)):
        return "a JSON object"
    if isinstance(shape, list):
        return "a JSON list"
    types = shape if isinstance(shape, tuple) else (shape,)
    return " or ".join(dict.fromkeys(_KINDS.get(t, getattr(t, "__name__", str(t))) for t in types))


def _shape_mismatch(value: Any, shape: Shape, at: str) -> tuple[str, Any, str] | None:
    """``(field path, value found, shape wanted)`` of the first part of ``value`` not of ``shape``, else None."""
    if value is None:
        return None
    if isinstance(shape, (dict, KvMap)):
        if not isinstance(value, dict):
            return at, value, _shape_name(shape)
        fields = value.items() if isinstance(shape, KvMap) else ((k, value[k]) for k in shape if k in value)
        for k, x in fields:
            bad = _shape_mismatch(x, shape.shape if isinstance(shape, KvMap) else shape[k], f"{at}.{k}" if at else k)
            if bad:
                return bad
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return at, value, _shape_name(shape)
        for i, x in enumerate(value):
            bad = _shape_mismatch(x, shape[0], f"{at}[{i}]")
            if bad:
                return bad
        return None
    types = shape if isinstance(shape, tuple) else (shape,)
    if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
        return None
    return at, value, _shape_name(shape)


class LineageStore:
    """SQLite-backed lineage of one run. Thread-safe; readers never block (WAL).

    Args:
        path: the ``lineage.db`` file (created with its schema when missing).
        readonly: open for reading only (no migrations, no job recovery).
    """

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._commits = 0  # write transactions committed through this handle (see state_token)
        self._serial = next(_STORE_SERIALS)  # unique in this process (an id() can be reused after close)
        self._token_db: sqlite3.Connection | None = None  # state_token's own connection (opened on first use)
        self._token_lock = threading.Lock()
        self._closed = False
        if readonly:
            if not self.path.exists():
                raise LineageError(f"{self.path}: no lineage database here; is this a run folder?")
            uri = f"file:{self.path}?mode=ro"
            try:
                self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
            except sqlite3.DatabaseError as exc:
                raise self._open_error(exc) from None
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_symlink():  # review 6: `lineage.db -> HOST_DB` had `lineage show` migrate a host database
                raise LineageError(f"{self.path}: a link to {os.readlink(self.path)}; EvoTrainer opens a run's lineage "
                                   "database (and writes it: migrations, WAL) only as a file of its own in the run "
                                   "folder, never through a link (a run folder from elsewhere may link it to another "
                                   "SQLite database, which opening would change): copy the file there instead")
            try:
                self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=BUSY_TIMEOUT_S,
                                           isolation_level=None)
            except sqlite3.DatabaseError as exc:
                raise self._open_error(exc) from None
        self._db.text_factory = _decode_text
        self._schema_pending = False  # a read-only open that found the file locked checks it at the first read
        try:
            if readonly:
                self._refuse_foreign_schema_unless_locked()
            else:
                self._refuse_foreign_schema()
            if not readonly:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA foreign_keys=ON")
                self._migrate()
                self.recover_jobs()
        except sqlite3.DatabaseError as exc:  # not SQLite at all, damaged, or not this user's to write: name the file
            self._db.close()
            raise self._open_error(exc) from None
        except BaseException:
            self._db.close()
            raise
        self._db.row_factory = sqlite3.Row

    def _open_error(self, exc: sqlite3.DatabaseError) -> LineageError:
        """The error of an open that failed: a permission problem says so (review 5: as a user who may only read a
        run, ``diagnose`` said "unable to open database file" without the file, or called a readable file "not a
        readable lineage database"); anything else is not a lineage database."""
        text = str(exc)
        links = [f"{self.path}{end}" for end in ("-wal", "-shm", "-journal")
                 if os.path.islink(f"{self.path}{end}")]
        if links:  # SQLite refuses a linked WAL / shm file (nothing written) but calls it a permission problem
            return LineageError(f"{', '.join(links)}: a symbolic link, not the file SQLite keeps beside "
                                f"{self.path.name}; not opened (nothing was written through it). Remove the link(s) or "
                                "use a copy of the run folder without them")
        if "unable to open" in text or "readonly" in text:
            how = "read" if self.readonly else "read and write (SQLite WAL: every open writes, to read too)"
            return LineageError(f"{self.path}: this user cannot open it ({text}); it must be able to {how} the file "
                                f"and its folder: check `ls -l {self.path}`, or work on a copy of the run folder")
        if _is_damage(exc):
            return self._damaged_error(exc)
        return LineageError(f"{self.path}: not a readable lineage database ({text}); is this a run folder?")

    def _damaged_error(self, exc: sqlite3.DatabaseError) -> LineageError:
        """The error of a damaged file, at open or at any later read (review 10 D-R10: a damaged page of ``metrics`` or
        ``kv``, read after a clean open, ended ``report`` with a bare "DatabaseError: database disk image is
        malformed" that named no file)."""
        return LineageError(f"{self.path}: damaged, not a readable lineage database ({exc}); not read. Use an "
                            "undamaged copy of the run folder (what still reads can be saved with `sqlite3 "
                            f"{self.path} .recover`)")

    def _refuse_foreign_schema(self) -> None:
        """Refuse a database holding triggers or views: the schema this store makes has neither.

        A run folder may come from elsewhere (a downloaded run given to ``diagnose`` or ``report``), and opening
        one writes to it (migrations, :meth:`recover_jobs`): a trigger planted on ``jobs`` ran on that open (a
        recursive INSERT wrote 200 MB into the file in one ``diagnose``; unbounded, it fills the disk), and a view
        in place of a table runs whatever query it holds, a recursive one forever.

        Raises:
            LineageError: the file holds a trigger or a view (names them).
        """
        rows = self._db.execute("SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view') "
                                "ORDER BY type, name LIMIT 20").fetchall()
        if rows:
            found = ", ".join(f"{t} {n!r}" for t, n in rows)
            raise LineageError(f"{self.path}: holds SQL {found}, which EvoTrainer's lineage schema never has (a "
                               "crafted or foreign file); not opened. Use a run folder EvoTrainer wrote")
        self._refuse_foreign_objects()
        self._refuse_parent_cycles()

    def _refuse_foreign_objects(self) -> None:
        """Refuse tables, columns and indexes the store never makes (:data:`MIGRATIONS`, after any of them).

        Review 10 L-R10: a VIRTUAL generated column added to ``versions`` of a 57 KB file from elsewhere costs what its
        expression costs each time a row is read (``SELECT *``): ``lineage show`` took 16 s and ``report`` 207 s for
        one version, and scaling it gives hours. A CHECK constraint naming ``jobs.status`` did the same to every
        writable open (:meth:`recover_jobs`' UPDATE, 8 s per job), an expression or partial index to every write.
        So each table's columns (``PRAGMA table_xinfo``: generated ones are hidden 2 / 3) and its CREATE TABLE (a
        CHECK, another default or foreign key) must be what some migration made, each index one the store makes,
        and there are no other tables (nothing reads them, but a foreign key of one to a store's table makes each
        delete there scan it).

        Raises:
            LineageError: names the file, the object and the fix.
        """
        columns, tables, indexes = _expected_schema()
        fix = "not opened. Use a run folder EvoTrainer wrote"
        where = f"{self.path}: holds"
        never = "which EvoTrainer's lineage schema never has (a crafted or foreign file)"
        for typ, name, tbl, sql in self._db.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE type IN ('table', 'index') "
                "ORDER BY type DESC, name").fetchall():
            name, shown = str(name), repr(str(name)[:80])
            if typ == "index":
                if indexes.get(name) != (tbl, _norm_sql(sql)):
                    raise LineageError(f"{where} index {shown} on table {str(tbl)[:80]!r}, {never}; {fix}, or drop it "
                                       f"(`sqlite3 {self.path} 'DROP INDEX \"{name[:80]}\"'`)")
                continue
            if name not in columns:
                raise LineageError(f"{where} table {shown}, {never}; {fix}, or drop it (`sqlite3 {self.path} 'DROP "
                                   f"TABLE \"{name[:80]}\"'`)")
            got = [tuple(r[1:]) for r in self._db.execute(f'PRAGMA table_xinfo("{name}")')]
            if got not in columns[name]:
                known = {c[0] for cols in columns[name] for c in cols}
                mine = {c[0]: c for cols in columns[name] for c in cols}
                for col in got:
                    what = f"column {name}.{str(col[0])[:80]}"
                    drop = f", or drop it (`sqlite3 {self.path} 'ALTER TABLE \"{name[:80]}\" DROP COLUMN \"{str(col[0])[:80]}\"'`)"
                    if col[5] in (2, 3):
                        raise LineageError(f"{where} a generated {what}, {never}: it is computed each time a row is "
                                           f"read; {fix}{drop}")
                    if col[0] not in known:
                        raise LineageError(f"{where} {what}, {never}; {fix}{drop}")
                    if col != mine[col[0]]:
                        raise LineageError(f"{where} {what} declared as {' '.join(str(x) for x in col[1:5])[:200]!r}, "
                                           f"which EvoTrainer's lineage schema never declares so (a crafted or foreign "
                                           f"file); {fix}")
                raise LineageError(f"{where} table {shown} with the columns {', '.join(str(c[0]) for c in got)[:400]}, "
                                   f"which no EvoTrainer lineage schema has (a crafted or damaged file); {fix}")
            if _norm_sql(sql) not in tables[name]:
                check = re.search(r"\bCHECK\b", str(sql), re.I)
                what = "a CHECK constraint on" if check else "another definition of"
                raise LineageError(f"{where} {what} table {shown} ({_brief(str(sql)[check.start() if check else 0:])}), "
                                   f"{never}; {fix}")

    def _refuse_parent_cycles(self) -> None:
        """Refuse versions that are their own ancestors: :meth:`branch` only adds a child of an existing version, so
        a cycle comes from a crafted file. Review 7: ``v2.parent_id = v3, v3.parent_id = v2`` in a run folder from
        elsewhere made :meth:`path_to_root` grow its list for good (MemoryError after 45 s under a 3 GB limit; the
        machine's memory without one: the MCP ``gate_version`` of v2 took its server down) and ``report`` spin
        forever in :meth:`step_offset`. One pass over ``(id, parent_id)``, each version walked once.

        A lineage deeper than :data:`MAX_LINEAGE_DEPTH` is refused too (:meth:`branch` makes none): review 7's chain of
        5,000 versions ended ``lineage show`` and ``lineage show --json`` with RecursionError (the JSON one from about
        490 deep) and kept ``report`` busy past 120 s (each version's :meth:`step_offset` walks to the root: 13 s at
        300 deep, quadratic).

        Raises:
            LineageError: a cycle (names its versions), or a version deeper than :data:`MAX_LINEAGE_DEPTH`.
        """
        if not self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'versions'").fetchone():
            return  # a new file: the schema is made next
        parent = {row[0]: row[1] for row in self._db.execute("SELECT id, parent_id FROM versions")}
        depth: dict[str, int] = {}  # versions on the path from the root, the root 1
        for start in parent:
            path: list[str] = []
            on_path: set[str] = set()
            v = start
            while v is not None and v not in depth:
                if v in on_path:
                    cycle = " -> ".join([*path[path.index(v):], v])
                    raise LineageError(f"{self.path}: versions {cycle} are their own ancestors (a parent cycle), "
                                       "which EvoTrainer never writes (a crafted or damaged file); not opened. Use "
                                       "a run folder EvoTrainer wrote")
                on_path.add(v)
                path.append(v)
                v = parent.get(v)  # a parent missing from the table ends the walk (reading it names it)
            d = 0 if v is None else depth[v]
            for u in reversed(path):
                d += 1
                depth[u] = d
                if d > MAX_LINEAGE_DEPTH:
                    raise LineageError(f"{self.path}: version {u} is {d} versions deep, past the {MAX_LINEAGE_DEPTH} "
                                       "EvoTrainer makes (a crafted file); not opened. Use a run folder EvoTrainer "
                                       "wrote")

    def _refuse_foreign_schema_unless_locked(self) -> None:
        """:meth:`_refuse_foreign_schema` without waiting for another connection's lock (a read-only handle on a
        live run's store, which its writer may hold locked: opening it must not wait ``BUSY_TIMEOUT_S`` or fail);
        when the file is locked the check runs at the first read (:meth:`_q`). Nothing is written through a
        read-only handle, so no planted trigger can run before that."""
        self._db.execute("PRAGMA busy_timeout=0")
        try:
            self._refuse_foreign_schema()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            self._schema_pending = True
        finally:
            self._db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")

    # --- plumbing -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (and :meth:`state_token`'s)."""
        with self._token_lock:
            self._closed = True
            if self._token_db is not None:
                self._token_db.close()
                self._token_db = None
        self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT; ROLLBACK on error)."""
        if self.readonly:
            raise LineageError("lineage store opened read-only")
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise self._write_error(exc) from None
            try:
                yield self._db
            except BaseException as exc:
                if self._db.in_transaction:  # SQLite may have ended it itself (SQLITE_FULL: review 11, A-R11)
                    self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError):
                    raise self._write_error(exc) from None
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.OperationalError as exc:  # the pages reach the file (the WAL) only now: a full disk
                if self._db.in_transaction:  # fails here (review 12, F-R12: kv_update of a 190 KB analyzer)
                    self._db.execute("ROLLBACK")
                raise self._write_error(exc) from None
            finally:  # counted even when COMMIT itself fails: a token that moves too often only costs a cache miss
                self._commits += 1

    def _write_error(self, exc: sqlite3.OperationalError) -> Exception:
        """The error to raise for a write that SQLite refused: a :class:`LineageError` naming the file, the cause
        and the fix for a full disk (SQLITE_FULL) or a lock held past ``BUSY_TIMEOUT_S``; ``exc`` itself
        otherwise."""
        text = str(exc)
        if "full" in text:
            return LineageError(f"{self.path}: could not write ({text}): the disk is full, or a table's row id "
                                "counter (sqlite_sequence) is at its maximum in a lineage.db from elsewhere; nothing "
                                "was written. Free disk space and retry, or copy the run with `evotrainer import`")
        if "locked" in text or "busy" in text:
            return LineageError(f"{self.path}: could not write ({text}): another process held the run's store "
                                f"locked for more than {BUSY_TIMEOUT_S} s; nothing was written. Retry when it is "
                                "done (a long `evotrainer` command or a sqlite3 shell on the file)")
        return exc

    def state_token(self, blocking: bool = True) -> tuple[int, int, int] | None:
        """A value that changes whenever the database's content may have changed: for caches of what was read.

        ``(serial of this handle in the process, PRAGMA data_version, commits through this handle)``.
        ``data_version`` is read on a connection of its own (read-only, opened on the first call), so it moves when
        any other connection commits, this handle's included; this handle's commit count (:meth:`tx`) is part of the
        token too (redundant with it, and free). Read the token *before* reading the data it guards: a write in
        between then makes the next token differ, so an entry can be newer than its token but never older. That
        connection never waits for a lock (busy timeout 0): when SQLite would have to wait (WAL recovery after a
        crash, another connection's exclusive lock), the token is None ("unknown": the caller reads the data itself
        and caches nothing).

        Args:
            blocking: False: return None at once when another thread is reading the token (the caller is the event
                loop and must not wait).
        """
        if not self._token_lock.acquire(blocking=blocking):
            return None
        try:
            if self._closed:
                return None
            if self._token_db is None:
                self._token_db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                                 check_same_thread=False, timeout=0)
            (dv,) = self._token_db.execute("PRAGMA data_version").fetchone()
            return self._serial, int(dv), self._commits
        except sqlite3.OperationalError:  # SQLITE_BUSY, or the file is gone
            return None
        finally:
            self._token_lock.release()

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute(_MIGRATIONS_SQL)
            done = {r[0] for r in self._db.execute("SELECT name FROM _migrations")}
            for name, sql in MIGRATIONS:
                if name in done:
                    continue
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for stmt in filter(str.strip, sql.split(";")):
                        self._db.execute(stmt)
                    self._db.execute("INSERT INTO _migrations VALUES (?, ?)", (name, time.time()))
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")

    def recover_jobs(self) -> list[str]:
        """Mark ``interrupted`` the running / queued jobs whose process is gone (and a version whose training died
        before its first step ``proposed`` again); returns their ids.

        Done on every writable open; a long-lived handle (an executor that saw a worker die) calls it
        again. The process is looked up by pid on this machine, so the jobs' workers must run here
        (one-machine Ray cluster; docs/interfaces.md).
        """
        rows = self._q("SELECT id, pid FROM jobs WHERE status IN ('running', 'queued')")
        # each pid asked once: review 7's crafted lineage.db held 300,000 "running" jobs of pid 1, and the checks
        # (a signal and a /proc read each) made every writable open take 9 s
        alive: dict[Any, bool] = {}
        for r in rows:
            if r[1] not in alive:
                alive[r[1]] = _pid_alive(r[1])
        dead = [r[0] for r in rows if not alive[r[1]]]
        if dead:
            with self.tx() as db:
                for jid in dead:
                    db.execute(
                        "UPDATE jobs SET status='interrupted', message='process died; resumable', updated_at=? "
                        "WHERE id=?",
                        (time.time(), jid),
                    )
                    # a training that died before its first step leaves nothing trained: its version goes back to
                    # proposed (review 15 D-R15: after a SIGKILL it stayed 'training' with 0 steps for good)
                    db.execute("UPDATE versions SET status='proposed' WHERE status='training' AND checkpoint IS NULL "
                               "AND id IN (SELECT version_id FROM jobs WHERE id=? AND kind='train') "
                               "AND NOT EXISTS (SELECT 1 FROM metrics WHERE metrics.version_id = versions.id)", (jid,))
        return dead

    _STALE_TRAINING_SQL = ("status='training' AND checkpoint IS NULL "
                           "AND NOT EXISTS (SELECT 1 FROM metrics WHERE metrics.version_id = versions.id) "
                           "AND id NOT IN (SELECT version_id FROM jobs WHERE status IN ('running', 'queued') "
                           "AND version_id IS NOT NULL)")

    def stale_training(self) -> list[str]:
        """Versions in status ``training`` with nothing trained (no checkpoint, no metric row) and no running or
        queued job: a training that died before its job row was written (or before its first step, with no job
        row), or a crafted store. At most :data:`STALE_TRAINING_MAX`, oldest first. Whether one is really stale
        depends on its locks (a live ``evotrainer train`` without a job row holds its version's lock): the caller
        that knows them (:class:`~evotrainer.workspace.Workspace`) passes the free ones to
        :meth:`reset_stale_training`. Run :meth:`recover_jobs` first (a dead job's row is still 'running' before)."""
        return [r[0] for r in self._q(f"SELECT id FROM versions WHERE {self._STALE_TRAINING_SQL} "
                                      "ORDER BY created_at, id LIMIT ?", (STALE_TRAINING_MAX,))]

    def reset_stale_training(self, version_ids: list[str]) -> list[str]:
        """Put back to ``proposed`` each of ``version_ids`` that is still stale (:meth:`stale_training`, checked again
        in the same write) and return those. Review 16 D-R16: such a version stayed ``training`` for good (the D-R15
        recovery of :meth:`recover_jobs` needs a job row)."""
        if not version_ids:
            return []
        with self.tx() as db:
            arg = json.dumps(list(version_ids))
            done = [r[0] for r in db.execute(f"SELECT id FROM versions WHERE id IN (SELECT value FROM json_each(?)) AND "
                                             f"{self._STALE_TRAINING_SQL}", (arg,)).fetchall()]
            db.execute("UPDATE versions SET status='proposed', updated_at=? WHERE id IN (SELECT value FROM json_each(?))",
                       (time.time(), json.dumps(done)))
        return done

    def _q(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            if self._schema_pending:  # a read-only open found the file locked (_refuse_foreign_schema_unless_locked)
                self._refuse_foreign_schema()
                self._schema_pending = False
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as exc:
                if _is_damage(exc):  # a damaged page met after the open (D-R10): name the file
                    raise self._damaged_error(exc) from None
                raise

    # --- versions ---------------------------------------------------------------------------------
    def _next_id(self, db: sqlite3.Connection) -> str:
        """``v<count>``, or the next free ``v<n>`` after it: a run folder from elsewhere may lack ids below its count
        (review 7: versions ``v0, v2`` made every :meth:`branch` fail with a raw "sqlite3.IntegrityError: UNIQUE
        constraint failed: versions.id", so the run could not go on)."""
        n = db.execute("SELECT COUNT(*) FROM versions").fetchone()[0]
        while db.execute("SELECT 1 FROM versions WHERE id = ?", (f"v{n}",)).fetchone():
            n += 1
        return f"v{n}"

    def create_root(self, recipe: Recipe, note: str = "base recipe") -> Version:
        """Create the root version ``v0`` (status proposed).

        Raises:
            LineageError: a root exists already, or its recipe or note would not fit :data:`COLUMN_MAX_CHARS`.
        """
        text = _fitting_columns("the root", recipe=json.dumps(recipe.to_dict()), note=note)["recipe"]
        with self.tx() as db:
            if db.execute("SELECT 1 FROM versions WHERE parent_id IS NULL").fetchone():
                raise LineageError("this run has a root version already; branch from it instead")
            self._check_room(db, "the root", {"recipe": text, "note": note})
            vid = self._next_id(db)
            now = time.time()
            db.execute(
                "INSERT INTO versions (id, parent_id, recipe, interventions, status, note, created_at, updated_at)"
                " VALUES (?, NULL, ?, '[]', 'proposed', ?, ?, ?)",
                (vid, text, note, now, now),
            )
        return self.get(vid)

    def branch(self, parent_id: str, interventions: Intervention | list[Intervention], note: str = "",
               merge_decision: tuple[str, list[str], str] | None = None) -> Version:
        """Create a proposed child of ``parent_id`` whose recipe is the parent's with the interventions applied.

        With ``merge_decision=(rationale, evidence, author)`` the child is a merge: it is created with status
        ``merged`` and its merge decision is recorded in the SAME transaction (a crash leaves both or neither).

        Raises:
            LineageError: unknown parent, or no intervention.
            InterventionError: an intervention does not apply to the parent's recipe.
        """
        ivs = interventions if isinstance(interventions, list) else [interventions]
        if not ivs:
            raise LineageError("a child version needs at least one intervention")
        if len(ivs) > INTERVENTIONS_MAX:
            raise LineageError(f"{len(ivs):,} interventions in one child, past the {INTERVENTIONS_MAX} a version holds; "
                               "a child is one change away from its parent (or a few, together): split them over "
                               "children")
        if merge_decision is not None and not merge_decision[0].strip():
            raise LineageError("a decision needs a rationale; say why, with the numbers")
        if merge_decision is not None:
            check_evidence(merge_decision[1])
        parent = self._deepest_parent(parent_id)
        recipe = apply_all(parent.recipe, ivs)
        texts = _fitting_columns(f"the new child of {parent_id}", recipe=json.dumps(recipe.to_dict()),
                                 interventions=json.dumps([iv.model_dump(mode="json") for iv in ivs]), note=note)
        with self.tx() as db:
            self._check_room(db, f"the new child of {parent_id}", {**texts, "note": note})
            vid = self._next_id(db)
            now = time.time()
            status = "proposed" if merge_decision is None else "merged"
            db.execute(
                "INSERT INTO versions (id, parent_id, recipe, interventions, status, note, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (vid, parent_id, texts["recipe"], texts["interventions"], status, note, now, now),
            )
            if merge_decision is not None:
                rationale, evidence, author = merge_decision
                db.execute(
                    "INSERT INTO decisions (version_id, action, rationale, evidence, author, prev_status, created_at)"
                    " VALUES (?, 'merge', ?, ?, ?, 'proposed', ?)",
                    (vid, rationale, json.dumps(evidence or []), author, now),
                )
        return self.get(vid)

    def _deepest_parent(self, parent_id: str) -> Version:
        """``parent_id``'s version, when a child of it stays within :data:`MAX_LINEAGE_DEPTH`.

        Raises:
            LineageError: unknown parent, or one :data:`MAX_LINEAGE_DEPTH` versions deep already.
        """
        chain = self.path_to_root(parent_id)
        if len(chain) >= MAX_LINEAGE_DEPTH:
            raise LineageError(f"{parent_id} is {len(chain)} versions deep; a lineage holds at most "
                               f"{MAX_LINEAGE_DEPTH} on one path: branch from an earlier version")
        return chain[0]

    def branch_control(self, parent_id: str, note: str = "") -> Version:
        """Find-or-create the control arm of ``parent_id``: a child with the parent's recipe and no
        intervention (``role = 'control'``), trained like its siblings from the parent's checkpoint.

        Raises:
            LineageError: unknown parent.
        """
        for c in self.children(parent_id):
            if c.is_control:
                return c
        parent = self._deepest_parent(parent_id)
        _fitting_columns(f"the control of {parent_id}", note=note)
        with self.tx() as db:
            self._check_room(db, f"the control of {parent_id}", {"recipe": json.dumps(parent.recipe.to_dict()),
                                                                 "note": note})
            vid = self._next_id(db)
            now = time.time()
            db.execute(
                "INSERT INTO versions (id, parent_id, recipe, interventions, status, note, role, created_at, "
                "updated_at) VALUES (?, ?, ?, '[]', 'proposed', ?, ?, ?, ?)",
                (vid, parent_id, json.dumps(parent.recipe.to_dict()), note or f"control of {parent_id}: continue",
                 CONTROL, now, now),
            )
        return self.get(vid)

    def control_of(self, version_id: str) -> Version | None:
        """The control arm among ``version_id``'s siblings (None for the root, a control, or when there is none)."""
        v = self.get(version_id)
        if v.parent_id is None or v.is_control:
            return None
        return next((c for c in self.children(v.parent_id) if c.is_control), None)

    def _version_rows(self, cond: str = "1", args: tuple = (), order: str = "") -> list[sqlite3.Row]:
        """``SELECT * FROM versions WHERE {cond} {order}``, after a check of the lengths of its JSON / text columns that reads none
        of them into Python (:data:`COLUMN_MAX_CHARS`).

        Raises:
            LineageError: a column past the cap, naming the file, the version, the column, its length and the fix.
        """
        cap = int(COLUMN_MAX_CHARS)
        cols = list(_CAPPED_COLUMNS)
        over = " OR ".join(f"length({c}) > {cap}" for c in cols)
        lengths = ", ".join(f"length({c})" for c in cols)
        bad = self._q(f"SELECT substr(id, 1, 80), {lengths} FROM versions WHERE ({cond}) AND ({over}) {order} LIMIT 1",
                      args)
        if bad:
            vid, n, col = bad[0][0], 0, ""
            for i, c in enumerate(cols, start=1):
                if (bad[0][i] or 0) > cap:
                    n, col = bad[0][i], c
                    break
            reset = _CAPPED_COLUMNS[col]
            fix = ("Use a run folder EvoTrainer wrote" if reset is None else
                   f"Reset it (`sqlite3 {self.path} \"UPDATE versions SET {col} = {reset} WHERE id = "
                   f"'{str(vid).replace(chr(39), chr(39) * 2)}'\"`) or use a run folder EvoTrainer wrote")
            raise LineageError(f"{self.path}: version {str(vid)!r}: its versions.{col} holds {n:,} characters, past "
                               f"the {cap:,} EvoTrainer reads (it writes at most {SUMMARY_MAX} metrics_summary "
                               f"entries; a crafted or damaged file); not read. {fix}")
        total = self._q(f"SELECT count(*), sum({' + '.join(f'coalesce(length({c}), 0)' for c in cols)}) FROM versions "
                        f"WHERE {cond}", args)[0]
        if total[0] > 1 and (total[1] or 0) > VERSIONS_READ_MAX_CHARS:
            raise LineageError(f"{self.path}: its {total[0]:,} versions hold {total[1]:,} characters of recipes, "
                               f"interventions, summaries, findings and notes, past the {VERSIONS_READ_MAX_CHARS:,} "
                               "one read takes in (EvoTrainer writes a few KB to a few hundred KB a version; a crafted "
                               "or damaged file); not read. Use a run folder EvoTrainer wrote")
        return self._q(f"SELECT * FROM versions WHERE {cond} {order}", args)

    def _row_to_version(self, r: sqlite3.Row) -> Version:
        try:
            recipe = json.loads(r["recipe"])
            interventions, summaries = json.loads(r["interventions"]), [
                json.loads(r[k]) for k in ("metrics_summary", "eval_summary", "findings")]
        except (RecursionError, json.JSONDecodeError) as exc:  # review 5: a recipe nested 100,000 deep
            why = "JSON nested deeper than Python reads" if isinstance(exc, RecursionError) else f"not JSON ({exc})"
            raise LineageError(f"{self.path}: version {str(r['id'])[:80]!r} holds {why} (a crafted or damaged file); "
                               "not read. Use a run folder EvoTrainer wrote") from None
        ms = summaries[0]
        bad = ("" if isinstance(ms, dict) else f"{_brief(ms)}") or next(
            (f"{k!r}: {_brief(x)}" for k, x in ms.items()
             if not (x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))
                     or (k in _SUMMARY_TEXT and isinstance(x, str)))), "")
        if bad:  # review 10 V-R10: {"reward/mean": "abc"} or [1] ended `lineage show` with a bare ValueError / TypeError
            raise LineageError(f"{self.path}: version {str(r['id'])[:80]!r}: its versions.metrics_summary holds {bad}, "
                               "where EvoTrainer writes a JSON object of metric numbers (a crafted or damaged file); "
                               "not read. Use a run folder EvoTrainer wrote")
        try:
            return Version(
                id=r["id"], parent_id=r["parent_id"], recipe=validate_recipe(recipe),
                interventions=[Intervention.model_validate(d) for d in interventions],
                status=r["status"], checkpoint=self._checkpoint_read(r["id"], r["checkpoint"]),
                metrics_summary=summaries[0], eval_summary=summaries[1],
                findings=summaries[2], note=r["note"], role=r["role"] if "role" in r.keys() else "",
                created_at=r["created_at"], updated_at=r["updated_at"],
            )
        except ValueError as exc:  # RecipeError, pydantic's ValidationError: review 7, no file or version named
            raise LineageError(f"{self.path}: version {str(r['id'])[:80]!r} is not a valid version "
                               f"({str(exc).splitlines()[0][:600]}); not read. Use a run folder EvoTrainer wrote, "
                               "or an EvoTrainer release that reads it") from None

    def get(self, version_id: str) -> Version:
        """One version.

        Raises:
            LineageError: no such version (the message lists the known ids, or the 20 closest of many:
                :func:`known_versions_text`).
        """
        rows = self._version_rows("id=?", (version_id,))
        if not rows:
            raise self._unknown_version(version_id)
        return self._row_to_version(rows[0])

    def _unknown_version(self, version_id: str) -> LineageError:
        """The error for an id not in the lineage (:func:`unknown_version_error`), its pool read in SQL: every id (cut)
        up to :data:`VERSION_IDS_LISTED_MAX`, else the :data:`VERSION_IDS_MATCHED_MAX` nearest in length."""
        total = self._q("SELECT count(*) FROM versions")[0][0]
        cut = VERSION_ID_SHOWN_CHARS
        if total <= VERSION_IDS_LISTED_MAX:
            pool = [r[0] for r in self._q(f"SELECT substr(id, 1, {cut}) FROM versions ORDER BY created_at, id")]
        else:  # _id_pool's in SQL: ids sharing the first half of the one asked for, then those nearest in length
            key = str(version_id)[:cut]
            prefix = _id_prefix(key)
            pool = [r[0] for r in self._q(
                f"SELECT substr(id, 1, {cut}) FROM versions WHERE substr(id, 1, ?) = ? ORDER BY created_at, id LIMIT ?",
                (len(prefix), prefix, VERSION_IDS_MATCHED_MAX // 2))]
            pool += [r[0] for r in self._q(
                f"SELECT substr(id, 1, {cut}) FROM versions WHERE substr(id, 1, ?) != ? "
                f"ORDER BY abs(min(length(id), {cut}) - ?), created_at, id LIMIT ?",
                (len(prefix), prefix, len(key), VERSION_IDS_MATCHED_MAX - len(pool)))]
        return unknown_version_error(version_id, pool, total)

    def versions(self) -> list[Version]:
        """All versions in creation order."""
        return [self._row_to_version(r) for r in self._version_rows(order="ORDER BY created_at, id")]

    def version_stamps(self) -> dict[str, float]:
        """``{version id: updated_at}`` of every version, from two columns in SQL: what a watcher of changes needs,
        without reading (and validating) each version's recipe and interventions as :meth:`versions` does (review
        16 E2-R16: a crafted store's versions took seconds to read, at every look)."""
        return {r[0]: r[1] for r in self._q("SELECT id, updated_at FROM versions ORDER BY created_at, id")}

    def root(self) -> Version | None:
        """The root version, or None in an empty run."""
        rows = self._version_rows("parent_id IS NULL")
        return self._row_to_version(rows[0]) if rows else None

    def children(self, version_id: str) -> list[Version]:
        """Direct children of a version, in creation order."""
        self.get(version_id)
        return [self._row_to_version(r) for r in
                self._version_rows("parent_id=?", (version_id,), "ORDER BY created_at, id")]

    def lineage_index(self) -> LineageIndex:
        """The parent links of every version (one query) with the walks up the lineage in memory: depth, ancestors,
        start version and step offset of any version, a constant number of queries whatever the depth (review 8's
        M-R8: a walk to the root with queries at each step made ``report`` quadratic). A snapshot of now."""
        return LineageIndex(self)

    def path_to_root(self, version_id: str) -> list[Version]:
        """``[version, parent, ..., root]``: two queries (the parent links, then the versions on the path).

        Raises:
            LineageError: no such version, or a parent missing from the lineage (a crafted file).
        """
        ids = self.lineage_index().ancestors(version_id)
        rows = {r["id"]: r for r in self._version_rows("id IN (SELECT value FROM json_each(?))",
                                                       (json.dumps(ids),))}
        return [self._row_to_version(rows[i]) if i in rows else self.get(i) for i in ids]

    def damaged(self, version_id: str) -> str | None:
        """The finding kind that marks ``version_id``'s weights as damaged, or None.

        A version is damaged when its latest decision pruned or reverted it for damaged weights
        (``Decision.damaged_weights``: the gate's ``damaged_weights``, a blocking finding on the version
        itself whose kind damages weights): a policy whose entropy collapsed or whose update diverged is
        no start point for a fix (the usual roll-back-to-the-last-good-checkpoint practice after a blow-up).
        """
        # the latest decision only, its action and kind read in SQL (review 16 A2-R16: every decision of the
        # version was read whole, rationale and evidence included, to look at the last one)
        r = self._q("SELECT action, damaged_weights FROM decisions WHERE version_id=? ORDER BY id DESC LIMIT 1",
                    (version_id,))
        if not r or r[0][0] not in ("prune", "revert"):
            return None
        kind = r[0][1]
        return kind if isinstance(kind, str) and kind else None

    def start_version(self, version_id: str) -> Version | None:
        """The version whose checkpoint ``version_id`` trains from; None for the base model.

        Its parent, unless the parent is :meth:`damaged`; then the parent's own start, and so on up
        the lineage (a child of a collapsed root starts from the base model). Walked in memory
        (:meth:`lineage_index`).

        Raises:
            LineageError: no such version, or a parent missing from the lineage (a crafted file).
        """
        start = self.lineage_index().start_id(version_id)
        return None if start is None else self.get(start)

    def step_offset(self, version_id: str) -> int:
        """Steps trained before ``version_id``'s first step along the weights it continues: its
        **lineage-global** step is ``step_offset(v) + step`` (TensorBoard and the report plot a lineage on this
        one axis; CleanRL logs against its global step the same way).

        ``offset(v) = offset(s) + steps(s)`` where ``s = start_version(v)`` (the parent, or an earlier
        version when the parent's weights are damaged) and ``steps(s) = last_step(s) + 1``; 0 for a
        version trained from the base model. Units: optimizer steps. A constant number of queries whatever the
        depth (:meth:`lineage_index`; for many versions, walk one index: :meth:`LineageIndex.step_offset`).

        Raises:
            LineageError: no such version, or a parent missing from the lineage (a crafted file).
        """
        return self.lineage_index().step_offset(version_id)

    def frontier(self) -> list[Version]:
        """Kept versions none of whose descendants is kept (the kept leaves)."""
        versions = self.versions()
        by_parent: dict[str | None, list[Version]] = {}
        for v in versions:
            by_parent.setdefault(v.parent_id, []).append(v)

        def has_kept_descendant(vid: str) -> bool:
            return any(c.status == "kept" or has_kept_descendant(c.id) for c in by_parent.get(vid, []))

        return [v for v in versions if v.status == "kept" and not has_kept_descendant(v.id)]

    def tree(self, versions: list[Version] | None = None) -> dict[str, Any]:
        """Nested ``{id, status, intervention, eval_summary, children: [...]}`` from the root; each node describes at
        most :data:`TREE_INTERVENTIONS_MAX` interventions (``interventions_omitted``: the rest), each value cut to
        :data:`~evotrainer.intervention.DESCRIBE_VALUE_CHARS` characters. ``versions``: the caller's
        :meth:`versions` already read (a crafted store's versions cost seconds to read: read them once); None reads
        them."""
        versions = self.versions() if versions is None else versions
        nodes: dict[str, dict[str, Any]] = {
            v.id: {"id": v.id, "parent_id": v.parent_id, "status": v.status,
                   "intervention": [iv.describe() for iv in v.interventions[:TREE_INTERVENTIONS_MAX]],
                   "interventions_omitted": max(0, len(v.interventions) - TREE_INTERVENTIONS_MAX), "role": v.role,
                   "eval_summary": v.eval_summary, "metrics_summary": v.metrics_summary, "children": []}
            for v in versions
        }
        root = None
        for v in versions:
            if v.parent_id is None:
                root = nodes[v.id]
            else:
                nodes[v.parent_id]["children"].append(nodes[v.id])
        return root or {}

    def diff(self, a: str, b: str) -> list[tuple[str, Any, Any]]:
        """Recipe paths that differ between two versions: ``[(path, value_in_a, value_in_b)]``."""
        return diff_recipes(self.get(a).recipe, self.get(b).recipe)

    def _check_room(self, db: sqlite3.Connection, what: str, new: dict[str, str | None],
                    version_id: str | None = None) -> None:
        """Refuse a write that would take the versions' capped columns past :data:`VERSIONS_READ_MAX_CHARS` (``new``:
        column -> its new text; ``version_id``: the row whose columns ``new`` replaces, None for a new row).

        Review 15 O-R15: ~95 ordinary ``propose_recipe`` calls of ~0.8 MB each took the table past the cap every read
        takes in, and from then on every reader refused the run as "a crafted or damaged file": the product's own
        writes bricked it. A run that is full says so at the write instead, and stays readable.

        Raises:
            LineageError: names ``what``, the sizes and the fix; nothing is written.
        """
        cols = list(_CAPPED_COLUMNS)
        total = db.execute(f"SELECT sum({' + '.join(f'coalesce(length({c}), 0)' for c in cols)}) FROM versions"
                           ).fetchone()[0] or 0
        if version_id is not None:
            shown = [c for c in new if c in _CAPPED_COLUMNS]
            if shown:
                total -= db.execute(f"SELECT {' + '.join(f'coalesce(length({c}), 0)' for c in shown)} FROM versions "
                                    "WHERE id=?", (version_id,)).fetchone()[0] or 0
        grow = sum(len(t) for c, t in new.items() if c in _CAPPED_COLUMNS and isinstance(t, str))
        if total + grow > VERSIONS_READ_MAX_CHARS:
            raise LineageError(f"{what}: the run's versions would hold {total + grow:,} characters of recipes, "
                               f"interventions, summaries, findings and notes, past the {VERSIONS_READ_MAX_CHARS:,} a "
                               "read takes in; not written (the run stays readable). Make the change smaller, or go on "
                               "in a new run from this one's best recipe (`evotrainer init --recipe`)")

    def _checkpoint_written(self, path: str) -> str:
        """A checkpoint path as stored: relative to the run folder when it lies inside it (``checkpoints/v3``), so a
        copied or moved run folder reads its own weights; else as given (weights kept elsewhere on purpose)."""
        run = self.path.parent.resolve()
        p = Path(path)
        try:
            return p.relative_to(run).as_posix() if p.is_absolute() else path
        except ValueError:
            try:
                return p.resolve().relative_to(run).as_posix()
            except (ValueError, OSError, RuntimeError):
                return path

    def _checkpoint_read(self, version_id: str, stored: str | None) -> str | None:
        """A stored checkpoint path as the readers use it: absolute, under this run folder when stored relative.

        Review 15 (X-R15, a note): checkpoint paths were stored absolute, so in a copied run folder every reader
        (resume, evaluation, the report) named and loaded the ORIGINAL folder's weights. Stored relative since;
        an absolute path of an older run that ends in ``checkpoints/<version>`` outside this folder is read as this
        folder's ``checkpoints/<version>`` when that folder exists (a copy of such a run)."""
        if not stored:
            return stored
        run = self.path.parent.resolve()
        p = Path(stored)
        if not p.is_absolute():
            return str(run / p)
        if p.parts[-2:] == ("checkpoints", version_id) and not p.is_relative_to(run):
            local = run / "checkpoints" / version_id
            if local.is_dir():
                return str(local)
        return stored

    def update_version(self, version_id: str, **fields: Any) -> Version:
        """Update status, checkpoint, metrics_summary, eval_summary, findings or note of a version.

        Raises:
            LineageError: unknown version, field or status; a column whose JSON / text would pass
                :data:`COLUMN_MAX_CHARS` (nothing is written that the store would refuse to read back). More than
                :data:`FINDINGS_MAX` findings are cut to it, the most severe kept (:func:`capped_findings`).
        """
        allowed = {"status", "checkpoint", "metrics_summary", "eval_summary", "findings", "note"}
        bad = set(fields) - allowed
        if bad:
            raise LineageError(f"cannot update {sorted(bad)}; updatable fields: {sorted(allowed)}")
        if "status" in fields and fields["status"] not in STATUSES:
            raise LineageError(f"status={fields['status']!r}: allowed: {', '.join(STATUSES)}")
        self.get(version_id)
        if isinstance(fields.get("metrics_summary"), dict):  # the callers say what they left out; this holds the cap
            fields["metrics_summary"] = capped_summary(fields["metrics_summary"])[0]
        if isinstance(fields.get("findings"), list) and len(fields["findings"]) > FINDINGS_MAX:
            fields["findings"] = capped_findings(fields["findings"])
        if isinstance(fields.get("checkpoint"), str):
            fields["checkpoint"] = self._checkpoint_written(fields["checkpoint"])
        sets, args = [], []
        for k, v in fields.items():
            sets.append(f"{k}=?")
            value = json.dumps(v) if k in ("metrics_summary", "eval_summary", "findings") else v
            if isinstance(value, str) and len(value) > COLUMN_MAX_CHARS:
                raise LineageError(f"version {version_id}: its {k} would hold {len(value):,} characters, past the "
                                   f"{COLUMN_MAX_CHARS:,} the store reads back; not written. Write a shorter {k}")
            args.append(value)
        sets.append("updated_at=?")
        texts: dict[str, str | None] = {k: a for k, a in zip(fields, args, strict=True) if isinstance(a, str)}
        args += [time.time(), version_id]
        with self.tx() as db:
            self._check_room(db, f"version {version_id}", texts, version_id)
            db.execute(f"UPDATE versions SET {', '.join(sets)} WHERE id=?", tuple(args))
        return self.get(version_id)

    # --- decisions --------------------------------------------------------------------------------
    def decide(self, version_id: str, action: Action, rationale: str, evidence: list[str] | None = None,
               author: str = "user", damaged_weights: str | None = None) -> Decision:
        """Record a decision and apply its status change in one transaction.

        keep → kept, prune → pruned, revert → reverted (only a kept version), merge → merged (the
        merged child; its parents keep their status). ``damaged_weights``: the finding kind for which a
        prune / revert discards the version's weights (see :meth:`damaged`).

        Raises:
            LineageError: unknown version or action, empty rationale, revert of a non-kept version, or
                ``damaged_weights`` on a keep / merge.
        """
        if action not in ACTION_STATUS:
            raise LineageError(f"action={action!r}: allowed: keep, prune, revert, merge")
        if not rationale.strip():
            raise LineageError("a decision needs a rationale; say why, with the numbers")
        v = self.get(version_id)
        if action == "revert" and v.status != "kept":
            raise LineageError(f"revert {version_id}: only a kept version can be reverted (status is {v.status})")
        if damaged_weights is not None and action not in ("prune", "revert"):
            raise LineageError(f"damaged_weights={damaged_weights!r} with action={action!r}: damaged weights are a "
                               "reason to prune or revert a version, not to keep or merge it")
        evidence = check_evidence(evidence)
        now = time.time()
        with self.tx() as db:
            n = db.execute("SELECT count(*) FROM decisions WHERE version_id=?", (version_id,)).fetchone()[0]
            if n >= DECISIONS_PER_VERSION_MAX:
                raise LineageError(f"{version_id} has {n:,} decisions, the most a version takes "
                                   f"({DECISIONS_PER_VERSION_MAX}); nothing was recorded. Its status is {v.status}: "
                                   "decide another version, or branch a child to change this one")
            cur = db.execute(
                "INSERT INTO decisions (version_id, action, rationale, evidence, author, prev_status, created_at,"
                " damaged_weights) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (version_id, action, rationale, json.dumps(evidence or []), author, v.status, now, damaged_weights),
            )
            db.execute("UPDATE versions SET status=?, updated_at=? WHERE id=?", (ACTION_STATUS[action], now, version_id))
            did = cur.lastrowid
        return self.decisions(version_id=None, decision_id=did)[0]

    def decisions(self, version_id: str | None = None, decision_id: int | None = None) -> list[Decision]:
        """Decision records, oldest first, optionally for one version.

        Raises:
            LineageError: a decision row that is not one EvoTrainer writes (a crafted or damaged file: evidence that
                is not a JSON list of text, a column of the wrong type); names the decision, the column and the fix.
        """
        sql = "SELECT * FROM decisions"
        args: tuple[Any, ...] = ()
        if decision_id is not None:
            sql, args = sql + " WHERE id=?", (decision_id,)
        elif version_id is not None:
            sql, args = sql + " WHERE version_id=?", (version_id,)
        return [self._row_to_decision(r) for r in self._q(sql + " ORDER BY id", args)]

    def count_decisions(self, version_id: str | None = None) -> int:
        """How many decisions the run (or one version) has, counted in SQL: none is read (review 16 A2-R16: callers
        that needed the number read every decision whole, each rationale up to 1 MiB)."""
        where, args = ("WHERE version_id=?", (version_id,)) if version_id is not None else ("", ())
        return int(self._q(f"SELECT count(*) FROM decisions {where}", args)[0][0])

    def decisions_brief(self, version_id: str | None = None, last: int = 50, rationale_chars: int = 4000,
                        refs: int = 20, ref_chars: int = 200) -> tuple[list[Decision], int]:
        """``(the last decisions, how many there are)``, oldest first, of one version (or of the run), each cut to
        fit a reply: at most ``last`` of them, a rationale of ``rationale_chars`` characters and ``refs`` evidence
        references of ``ref_chars`` characters (each cut saying how much; :func:`~evotrainer.terminal.clip_text`).
        The cut is made in SQL, so a store holding megabytes of rationale (written before the writers' caps, or
        crafted) is not read whole (review 14 A-R14: 200 decisions of ~1 MB each were one 372 MB get_version reply).

        Raises:
            LineageError: as :meth:`decisions`.
        """
        where, args = ("WHERE version_id=?", (version_id,)) if version_id is not None else ("", ())
        total = self.count_decisions(version_id)
        rows = self._q(
            "SELECT id, version_id, action, substr(rationale, 1, ?) AS rationale, length(rationale) AS rationale_len, "
            "CASE WHEN length(evidence) <= ? THEN evidence ELSE '[]' END AS evidence, length(evidence) AS evidence_len, "
            f"author, prev_status, created_at, damaged_weights FROM decisions {where} ORDER BY id DESC LIMIT ?",
            (rationale_chars, COLUMN_MAX_CHARS, *args, max(0, last)))
        out = []
        for r in reversed(rows):
            d = self._row_to_decision(r)
            rationale = d.rationale
            if isinstance(r["rationale_len"], int) and r["rationale_len"] > len(rationale):
                rationale += f"... [{r['rationale_len'] - len(rationale)} more chars]"
            ev = [clip_text(e, ref_chars) for e in d.evidence[:refs]]
            if len(d.evidence) > refs:
                ev.append(f"... [{len(d.evidence) - refs} more references]")
            elif isinstance(r["evidence_len"], int) and r["evidence_len"] > COLUMN_MAX_CHARS:
                ev = [f"[evidence of {r['evidence_len']:,} characters not read]"]
            out.append(d.model_copy(update={"rationale": rationale, "evidence": ev}))
        return out, int(total)

    def _row_to_decision(self, r: sqlite3.Row) -> Decision:
        """One decision row read. Review 8 G-R8: a crafted lineage.db with ``decisions.evidence = 'not json'`` ended
        ``lineage show --json`` and ``report`` with a bare JSONDecodeError; as the JSON columns of a version
        (:meth:`_row_to_version`), a bad column is a LineageError naming the file, the decision and the column."""
        what = f"{self.path}: decision {str(r['id'])[:40]} (of version {str(r['version_id'])[:80]!r})"
        fix = (f"Use a run folder EvoTrainer wrote, or repair the row (`sqlite3 {self.path} \"UPDATE decisions SET "
               f"evidence = '[]' WHERE id = {str(r['id'])[:40]}\"` for its evidence)")
        try:
            evidence = json.loads(r["evidence"]) if isinstance(r["evidence"], (str, bytes)) else r["evidence"]
        except (RecursionError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            why = ("JSON nested deeper than Python reads" if isinstance(exc, RecursionError)
                   else f"not JSON ({str(exc)[:200]})")
            raise LineageError(f"{what}: its decisions.evidence holds {why}, where EvoTrainer writes a JSON list of "
                               f"text (a crafted or damaged file); not read. {fix}") from None
        try:
            return Decision(**{**dict(r), "evidence": evidence})
        except ValueError as exc:  # pydantic's ValidationError: the first error names the column
            raise LineageError(f"{what}: not a valid decision row ({' '.join(str(exc).splitlines()[:3])[:600]}); "
                               f"not read (a crafted or damaged file). {fix}") from None

    # --- jobs -------------------------------------------------------------------------------------
    def create_job(self, job_id: str, version_id: str | None, kind: str, steps_total: int = 0) -> Job:
        """Register a job as running in this process."""
        now = time.time()
        with self.tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO jobs (id, version_id, kind, status, progress, steps_done, steps_total, pid,"
                " message, created_at, updated_at) VALUES (?, ?, ?, 'running', 0, 0, ?, ?, '', ?, ?)",
                (job_id, version_id, kind, steps_total, os.getpid(), now, now),
            )
        return self.job(job_id)

    def update_job(self, job_id: str, **fields: Any) -> Job:
        """Update status, progress, steps_done, steps_total or message of a job."""
        allowed = {"status", "progress", "steps_done", "steps_total", "message"}
        bad = set(fields) - allowed
        if bad:
            raise LineageError(f"cannot update job fields {sorted(bad)}; allowed: {sorted(allowed)}")
        sets = [f"{k}=?" for k in fields] + ["updated_at=?"]
        with self.tx() as db:
            db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id=?", (*fields.values(), time.time(), job_id))
        return self.job(job_id)

    def job(self, job_id: str) -> Job:
        """One job.

        Raises:
            LineageError: no such job.
        """
        rows = self._q(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (JOB_MESSAGE_MAX_CHARS, job_id))
        if not rows:
            raise LineageError(f"job {job_id!r} not found")
        return _row_to_job(rows[0])

    def jobs(self, version_id: str | None = None, last: int | None = None) -> list[Job]:
        """All jobs (the newest ``last`` when given), oldest first, optionally of one version; each message cut to
        :data:`JOB_MESSAGE_MAX_CHARS` characters in SQL (review 14 J-R14: 100 crafted jobs of 2 MB messages were a
        381 MiB list_jobs reply and a 4.6 s stall)."""
        where, args = ("WHERE version_id=?", (version_id,)) if version_id else ("", ())
        limit = "" if last is None else f" LIMIT {max(0, int(last))}"
        rows = self._q(f"SELECT {_JOB_COLUMNS} FROM jobs {where} ORDER BY created_at DESC, id DESC{limit}",
                       (JOB_MESSAGE_MAX_CHARS, *args))
        return [_row_to_job(r) for r in reversed(rows)]

    def count_jobs(self, version_id: str | None = None) -> int:
        """How many jobs the run (or one version) has."""
        where, args = ("WHERE version_id=?", (version_id,)) if version_id else ("", ())
        return int(self._q(f"SELECT count(*) FROM jobs {where}", args)[0][0])

    # --- metrics ----------------------------------------------------------------------------------
    def log_metrics(self, version_id: str, step: int, metrics: dict[str, float]) -> None:
        """Store one step's scalar metrics (replacing values of the same step)."""
        rows = [(version_id, int(step), k, None if v is None else float(v)) for k, v in metrics.items()]
        with self.tx() as db:
            db.executemany("INSERT OR REPLACE INTO metrics VALUES (?, ?, ?, ?)", rows)

    def metric_names(self, version_id: str | None = None) -> list[str]:
        """Names of the metrics logged (for one version or all); a name longer than :data:`METRIC_NAME_MAX_CHARS` is
        left out (no writer makes one: imported names are cut to it; review 14 J-R14: 100 crafted names of 1 MB made
        list_metrics a 381 MiB reply)."""
        if version_id:
            return [r[0] for r in self._q("SELECT DISTINCT name FROM metrics WHERE version_id=? AND length(name) <= ? "
                                          "ORDER BY name", (version_id, METRIC_NAME_MAX_CHARS))]
        return [r[0] for r in self._q("SELECT DISTINCT name FROM metrics WHERE length(name) <= ? ORDER BY name",
                                      (METRIC_NAME_MAX_CHARS,))]

    def metric_series(self, version_id: str, name: str) -> list[tuple[int, float]]:
        """``[(step, value)]`` of one metric of one version, by step."""
        return [(r[0], r[1]) for r in
                self._q(f"SELECT step, value FROM metrics WHERE version_id=? AND name=? AND {_METRIC_ROW_OK} ORDER BY step",
                        (version_id, name))]

    def all_metrics(self, version_id: str, max_points: int | None = None) -> dict[str, list[tuple[int, float]]]:
        """Every metric series of one version: ``{name: [(step, value)]}``, each thinned evenly past ``max_points``.

        The rows are read one at a time; a series of more than ``max_points`` points (default, ``None``:
        :data:`evotrainer.points.MAX_METRIC_STEPS`, 100,000; ``0``: every point) keeps every n-th of them from its first step to
        its last (:func:`evotrainer.points.thin_series`), with a :class:`evotrainer.points.MetricsThinnedWarning`
        naming the file, the version and the points read and dropped. Review 11 (D-R11c): a ``lineage.db`` of
        1,500,000 metric rows took 0.6 GB in ``diagnose`` and ``report``; a real run logs tens of thousands of
        steps of each metric. At most :data:`evotrainer.points.MAX_METRIC_SERIES` series are kept (the first by
        name; ``max_points=0``: all), the warning counting the rest.
        """
        out: dict[str, list[tuple[int, float]]] = {}
        sql = (f"SELECT name, step, value FROM metrics WHERE version_id=? AND length(name) <= {METRIC_NAME_MAX_CHARS} "
               "ORDER BY name, step")  # (a longer name: no writer makes one; review 14 J-R14)
        cap = (points.MAX_METRIC_STEPS if max_points is None else max_points) or 1 << 62
        most = points.MAX_METRIC_SERIES if max_points != 0 else 1 << 62
        read = dropped = left = 0
        bad = [0]  # rows of another SQL type (_METRIC_ROW_OK), filtered here to count them (review 7 residue, M-R7)

        def typed(rows: Iterator[Any]) -> Iterator[tuple[int, float]]:
            for r in rows:
                if type(r[1]) is int and (r[2] is None or type(r[2]) in (float, int)):
                    yield r[1], r[2]
                else:
                    bad[0] += 1

        with self._lock:
            for name, rows in itertools.groupby(self._each(sql, (version_id,)), key=lambda r: r[0]):
                if len(out) >= most:  # past the series cap: counted, not kept
                    n = sum(1 for _ in typed(rows))
                    read, dropped, left = read + n, dropped + n, left + 1
                    continue
                pts, n = thin_series(typed(rows), cap)
                if pts or n:
                    out[name] = pts
                read, dropped = read + len(pts) + n, dropped + n
        if bad[0]:
            note_thinned(f"{self.path}: version {version_id}: {bad[0]:,} metric row(s) of another SQL type (a step "
                         "that is not an integer, or a value that is not a number) skipped; a file EvoTrainer wrote "
                         "has none: is it a crafted or damaged lineage.db?")
        if dropped:
            more = (f"; {left:,} series past the first {most:,} by name are left out (MAX_METRIC_SERIES)" if left
                    else "")
            note_thinned(f"{self.path}: version {version_id}: read {read:,} metric points, kept {read - dropped:,}, "
                         f"{dropped:,} dropped: every series of more than {cap:,} points is thinned evenly from "
                         f"its first step to its last (MAX_METRIC_STEPS){more}")
        return out

    def _each(self, sql: str, args: tuple = ()) -> Iterator[Any]:
        """The rows of a query one at a time (the caller holds ``self._lock`` while it iterates); as :meth:`_q`."""
        if self._schema_pending:
            self._refuse_foreign_schema()
            self._schema_pending = False
        try:
            yield from self._db.execute(sql, args)
        except sqlite3.DatabaseError as exc:
            if _is_damage(exc):
                raise self._damaged_error(exc) from None
            raise

    def last_step(self, version_id: str) -> int:
        """Last step with logged metrics (-1 if none): where a resumed training continues."""
        r = self._q(f"SELECT MAX(step) FROM metrics WHERE version_id=? AND {_METRIC_ROW_OK}", (version_id,))
        return -1 if r[0][0] is None else int(r[0][0])

    # --- eval outcomes ----------------------------------------------------------------------------
    def log_eval_samples(self, version_id: str, eval_name: str,
                         samples: list[tuple[str, int, float, str]]) -> None:
        """Store per-sample eval outcomes ``[(problem_id, sample_idx, correct, completion)]`` in one transaction."""
        with self.tx() as db:
            db.execute("DELETE FROM eval_samples WHERE version_id=? AND eval_name=?", (version_id, eval_name))
            db.executemany(
                "INSERT INTO eval_samples VALUES (?, ?, ?, ?, ?, ?)",
                [(version_id, eval_name, str(p), int(i), float(c), comp) for p, i, c, comp in samples],
            )

    def eval_samples(self, version_id: str, eval_name: str = "heldout") -> list[tuple[str, int, float, str]]:
        """The stored per-sample outcomes ``[(problem_id, sample_idx, correct, completion)]`` of ``(version_id,
        eval_name)`` (what :meth:`log_eval_samples` wrote), by problem and sample index; ``correct`` checked as in
        :meth:`eval_matrix`.

        Raises:
            LineageError: as :meth:`eval_matrix`.
        """
        self.eval_matrix(version_id, eval_name)  # the check of every sample's ``correct``
        return [(str(r[0]), int(r[1]), float(r[2]), str(r[3] or "")) for r in self._q(
            "SELECT problem_id, sample_idx, correct, completion FROM eval_samples WHERE version_id=? AND eval_name=? "
            "ORDER BY problem_id, sample_idx", (version_id, eval_name))]

    def eval_sample_count(self, version_id: str, eval_name: str = "heldout") -> int:
        """Eval samples :meth:`eval_matrix` would read for ``(version_id, eval_name)``, counted in SQL (none read)."""
        return int(self._q("SELECT count(*) FROM eval_samples WHERE version_id=? AND eval_name=?",
                           (version_id, eval_name))[0][0])

    def metric_counts(self, version_id: str) -> tuple[int, int]:
        """``(metric rows, series)`` :meth:`all_metrics` would read for ``version_id``, counted in SQL (none read)."""
        r = self._q(f"SELECT count(*), count(DISTINCT name) FROM metrics WHERE version_id=? AND "
                    f"length(name) <= {METRIC_NAME_MAX_CHARS}", (version_id,))[0]
        return int(r[0]), int(r[1])

    def eval_matrix(self, version_id: str, eval_name: str = "heldout") -> dict[str, list[float]]:
        """``{problem_id: [correct of sample 0..k-1]}`` for paired comparisons.

        Raises:
            LineageError: a sample whose ``correct`` is not a number (a crafted or damaged file: review 8 G-R8,
                ``correct = 'yes'`` ended ``report`` with a bare numpy TypeError); names the sample, the column and
                the fix.
        """
        out: dict[str, list[float]] = {}
        for r in self._q("SELECT problem_id, correct, typeof(correct), sample_idx FROM eval_samples "
                         "WHERE version_id=? AND eval_name=? ORDER BY problem_id, sample_idx", (version_id, eval_name)):
            if r[2] not in ("real", "integer"):
                raise LineageError(
                    f"{self.path}: eval_samples.correct of version {version_id!r}, eval {eval_name!r}, problem "
                    f"{str(r[0])[:80]!r}, sample {str(r[3])[:40]} is {r[2]} {_brief(r[1])}, where EvoTrainer writes a "
                    "number (1 correct, 0 not; a crafted or damaged file); not read. Use a run folder EvoTrainer "
                    f"wrote, or evaluate the version again (`evotrainer eval {version_id} --run RUN --name {eval_name}` "
                    "rewrites these samples)")
            out.setdefault(r[0], []).append(r[1])
        return out

    # --- key/value (run-level state, e.g. orchestrator cursor) ------------------------------------
    def kv_get(self, key: str, default: Any = None, expected: Shape | None = None, required: tuple[str, ...] = (),
               fix: str | None = None) -> Any:
        """Run-level JSON value stored under ``key``.

        Args:
            expected: the :data:`Shape` the caller reads (``dict``, ``list``, :data:`NUM`, ``{"test": dict}``, ...);
                a stored value of another shape (JSON ``null`` aside, which reads as None) is refused
                (:meth:`kv_typed`).
            required: fields a stored JSON object must have (not null), with ``expected`` an object shape.
            fix: the fix the error names, in place of "use a run folder EvoTrainer wrote, or remove the value".

        Raises:
            LineageError: the stored value is not JSON, longer than :data:`KV_VALUE_MAX_CHARS`, not of the
                ``expected`` type, or lacks a ``required`` field (a crafted or damaged file; :meth:`_kv_value`,
                :meth:`kv_typed`).
        """
        r = self._q("SELECT length(value), CASE WHEN length(value) <= ? THEN value END FROM kv WHERE key=?",
                    (KV_VALUE_MAX_CHARS, key))
        if not r:
            return default
        self._kv_size_ok(key, r[0][0], fix)
        value = self._kv_value(key, r[0][1], fix)
        return value if expected is None else self.kv_typed(key, value, expected, required, fix)

    def kv_typed(self, key: str, value: Any, expected: Shape, required: tuple[str, ...] = (),
                 fix: str | None = None) -> Any:
        """``value`` (read under ``key``) when it is None or of the ``expected`` :data:`Shape` (and, an object, has
        each ``required`` field, not null).

        Review 10 V-R10: ``loop/compute``, ``loop/config``, ``loop/final``, ``loop/diagnose/<v>`` ... set to a JSON
        string, list or number in a foreign lineage.db (or holding one where a field is read as an object or a
        number) ended ``report`` with a bare AttributeError, TypeError or ValueError that named neither the file nor
        the key. A number is never a bool here; null is accepted anywhere (the readers take it as missing). Review
        11 C-R11: the same for ``import/source`` and the search modes' ``loop/*`` keys (``required``: a stored
        trial without its ``params``).

        Raises:
            LineageError: names the file, the key, the field (when inside the value), what it holds, what EvoTrainer
                writes there and the fix (``fix``, or :meth:`kv_fix`'s).
        """
        bad = _shape_mismatch(value, expected, "")
        if bad is None:
            missing = [f for f in required if isinstance(value, dict) and value.get(f) is None]
            if not missing:
                return value
            raise LineageError(f"{self.path}: kv.value of key {str(key)[:200]!r} has no field {missing[0]!r} (or it is "
                               f"null), where EvoTrainer writes {_shape_name(expected)} with "
                               f"{', '.join(map(repr, required))} (a crafted or damaged file); not read. "
                               f"{fix or self.kv_fix(key)}")
        at, found, want = bad
        where = f" at {at[:200]}" if at else ""
        raise LineageError(f"{self.path}: kv.value of key {str(key)[:200]!r} holds {_json_kind(found)} "
                           f"{_brief(found)}{where}, where EvoTrainer writes {want} (a crafted or damaged file); not "
                           f"read. {fix or self.kv_fix(key)}")

    def kv_model(self, key: str, value: Any, model: type[BaseModel], fix: str | None = None) -> Any:
        """``value`` (read under ``key``) as a ``model`` instance (pydantic validation).

        Review 10 V-R10's class for the loop's typed stage records (``loop/diagnose/<v>``, ``loop/verdict/<v>``,
        ``loop/r<n>/propose`` ...): a stored value that does not validate ended ``evotrainer run --resume`` with a
        bare pydantic ValidationError that named neither the file nor the key.

        Raises:
            LineageError: names the file, the key, the first field that does not validate, what it holds and the
                fix (``fix``, or :meth:`kv_fix`'s).
        """
        try:
            return model.model_validate(value)
        except ValidationError as exc:
            errs = exc.errors()
            at = ".".join(str(x) for x in errs[0]["loc"]) if errs else ""
            msg = errs[0]["msg"] if errs else str(exc)
            where = f" at {at[:200]}" if at else ""
            raise LineageError(f"{self.path}: kv.value of key {str(key)[:200]!r} holds {_json_kind(value)} "
                               f"{_brief(value)} that is no {model.__name__}{where} ({msg[:200]}), where EvoTrainer "
                               f"writes a {model.__name__} (a crafted or damaged file); not read. "
                               f"{fix or self.kv_fix(key)}") from None

    def kv_fix(self, key: Any) -> str:
        shown = str(key)[:200].replace("'", "''")
        return (f"Use a run folder EvoTrainer wrote, or remove the value (`sqlite3 {self.path} \"DELETE FROM kv WHERE "
                f"key = '{shown}'\"`: the run forgets it)")

    def _kv_value(self, key: Any, raw: Any, fix: str | None = None) -> Any:
        """A stored run-level value read. Review 8 G-R8's class: ``kv.value = 'not json'`` under ``loop/finished`` in
        a foreign lineage.db ended ``report`` with a bare JSONDecodeError; as the other JSON columns, a LineageError
        names the file, ``kv.value``, the key and the fix."""
        try:
            return json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        except (RecursionError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            why = ("JSON nested deeper than Python reads" if isinstance(exc, RecursionError)
                   else f"not JSON ({str(exc)[:200]})")
            raise LineageError(f"{self.path}: kv.value of key {str(key)[:200]!r} holds {why}, where EvoTrainer writes "
                               f"JSON (a crafted or damaged file); not read. {fix or self.kv_fix(key)}") from None

    def _kv_size_ok(self, key: Any, n: Any, fix: str | None = None) -> None:
        """Refuse a stored kv value longer than :data:`KV_VALUE_MAX_CHARS` (``n``: its SQL ``length()``) before it is
        read (review 14 B-R14's class: a 146.6 MB value was parsed by every call that read it)."""
        if isinstance(n, int) and n > KV_VALUE_MAX_CHARS:
            raise LineageError(f"{self.path}: kv.value of key {str(key)[:200]!r} holds {n:,} characters, past the "
                               f"{KV_VALUE_MAX_CHARS:,} the store reads for one key (a crafted or damaged file, or one "
                               f"written before that cap); not read. {fix or self.kv_fix(key)}")

    def _kv_encoded(self, key: str, value: Any, fix: str | None) -> str:
        """``value`` as the JSON the store keeps under ``key``.

        Raises:
            LineageError: it would be longer than :data:`KV_VALUE_MAX_CHARS`; names the key, the size and ``fix``.
        """
        text = json.dumps(value)
        if len(text) > KV_VALUE_MAX_CHARS:
            raise LineageError(f"kv {key[:200]!r}: the value would hold {len(text):,} characters of JSON, past the "
                               f"{KV_VALUE_MAX_CHARS:,} the store keeps for one key; not written. "
                               f"{fix or 'Store less under it'}")
        return text

    def kv_set(self, key: str, value: Any, fix: str | None = None) -> None:
        """Store a run-level JSON value.

        Raises:
            LineageError: its JSON would be longer than :data:`KV_VALUE_MAX_CHARS` (``fix`` says what to do instead).
        """
        text = self._kv_encoded(key, value, fix)
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, text))

    def kv_update(self, key: str, fn: Callable[[Any], Any], default: Any = None,
                  expected: Shape | None = None, fix: str | None = None) -> Any:
        """Read, change and store the run-level value under ``key`` in one write transaction; returns the value
        stored.

        ``fn`` gets the stored value (``default`` when there is none; checked against ``expected`` as
        :meth:`kv_get` does) and returns the new one. The read and the write happen under ``BEGIN IMMEDIATE``, so
        no other thread or process writes in between (review 11, K-R11: ``register_analyzer`` did ``kv_get`` ->
        change -> ``kv_set`` of one JSON object while two tool calls ran at once, and 11 of 100 acknowledged
        registrations were lost). ``fn`` runs inside the transaction: keep it short, and free of other writes
        through another handle.

        Raises:
            LineageError: the stored value is not JSON, longer than :data:`KV_VALUE_MAX_CHARS` or not of the
                ``expected`` shape (:meth:`kv_typed`: names the file, the key and the fix), or the new value would be
                longer than that cap (``fix`` says what to do instead); nothing is written. An exception ``fn`` raises
                rolls the transaction back and propagates.
        """
        with self.tx() as db:
            r = db.execute("SELECT length(value), CASE WHEN length(value) <= ? THEN value END FROM kv WHERE key=?",
                           (KV_VALUE_MAX_CHARS, key)).fetchall()
            if r:
                self._kv_size_ok(key, r[0][0])
                value = self._kv_value(key, r[0][1])
                if expected is not None:
                    value = self.kv_typed(key, value, expected)
            else:
                value = default
            new = fn(value)
            db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, self._kv_encoded(key, new, fix)))
        return new

    def kv_size(self, key: str) -> int | None:
        """Characters of the JSON stored under ``key`` (SQL ``length()``: the value is not read), None when unset.
        A reader with a budget asks this first (review 16 B2-R16: the report read every value whole)."""
        r = self._q("SELECT length(value) FROM kv WHERE key=?", (key,))
        return int(r[0][0] or 0) if r else None

    def kv_items_size(self, prefix: str = "") -> tuple[int, int]:
        """``(values, characters)`` stored under keys that start with ``prefix`` (literally), from SQL alone."""
        total = self._q("SELECT count(*), sum(length(value)) FROM kv WHERE substr(key, 1, ?) = ?",
                        (len(prefix), prefix))[0]
        return int(total[0]), int(total[1] or 0)

    def kv_items(self, prefix: str = "") -> list[tuple[str, Any]]:
        """``[(key, value)]`` of every run-level value whose key starts with ``prefix`` (literally: ``_`` and
        ``%`` are no wildcards), in key order.

        Raises:
            LineageError: a stored value is not JSON or is longer than :data:`KV_VALUE_MAX_CHARS` (a crafted or
                damaged file; :meth:`_kv_value`, :meth:`_kv_size_ok`).
        """
        total = self.kv_items_size(prefix)
        if total[1] > KV_ITEMS_MAX_CHARS:  # review 15 B-R15: 30 values of 4 MiB under one prefix, read whole
            raise LineageError(f"{self.path}: the {total[0]:,} kv values under {prefix[:200]!r} hold {total[1]:,} "
                               f"characters, past the {KV_ITEMS_MAX_CHARS:,} one read takes in (a crafted or damaged "
                               f"file); not read. {self.kv_fix(prefix + '%')}")
        rows = self._q("SELECT key, length(value), CASE WHEN length(value) <= ? THEN value END FROM kv "
                       "WHERE substr(key, 1, ?) = ? ORDER BY key", (KV_VALUE_MAX_CHARS, len(prefix), prefix))
        out = []
        for key, n, value in rows:
            self._kv_size_ok(key, n)
            out.append((key, self._kv_value(key, value)))
        return out


IMPORT_SOURCE_KEY = "import/source"
"""kv key of an imported run's origin, ``{"path", "foreign_version", "version_id"}`` (``evotrainer import``:
:mod:`evotrainer.harness.importer` writes it; the evidence, ``watch`` and the local backend read it)."""
IMPORT_SOURCE_SHAPE = {"path": str, "version_id": str}


def import_source(store: LineageStore) -> dict[str, Any] | None:
    """The run's :data:`IMPORT_SOURCE_KEY` record, or None for a run that was not imported.

    Raises:
        LineageError: the stored value is not an object with a text ``version_id`` (review 11, C-R11: ``[1, 2]`` in
            a run folder from elsewhere ended ``diagnose RUN`` with "AttributeError: 'list' object has no attribute
            'get'"); names the file, the key, the shape EvoTrainer writes and the fix (import the foreign run
            again, or delete the row).
    """
    fix = (f"Import the foreign run again into a new run folder (`evotrainer import SOURCE --run NEW_RUN`), or "
           f"remove the value (`sqlite3 {store.path} \"DELETE FROM kv WHERE key = '{IMPORT_SOURCE_KEY}'\"`: the run is "
           "then no longer treated as imported)")
    return store.kv_get(IMPORT_SOURCE_KEY, expected=IMPORT_SOURCE_SHAPE, required=("version_id",), fix=fix)
