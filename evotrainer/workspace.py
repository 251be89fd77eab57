"""Workspace: the folder of one run (DESIGN.md §2).

Layout::

    RUN/
      lineage.db        versions, decisions, jobs, metrics, eval outcomes (SQLite, WAL)
      rollouts/         LanceDB dataset of rollouts (evotrainer.rollouts.RolloutStore)
      evals/ logs/ checkpoints/ reports/ tb/
      run.yaml          the run config this workspace was created with (if any)
      .writer.lock      held by the one process that may train / write

Writers take the lock (:meth:`Workspace.open` with ``writer=True``); readers never block. The lock
belongs to the handle, not to a thread: a server opens a job's writer handle in a request thread and the
job closes it in its own thread, so the lock is taken with ``thread_local=False`` (filelock's default
``thread_local=True`` keeps the held descriptor in the opening thread, a ``release()`` from another
thread is a silent no-op, and the next writer of the same process found the run "locked by another
process" until the garbage collector happened to drop the old handle).

:meth:`Workspace.init` creates a run atomically: ``lineage.db`` with its root version ``v0`` is built
under a temporary name and renamed into place, so a killed ``init`` leaves either no run or a run with v0.
Log records are JSON lines in ``logs/run.jsonl`` (``{time, level, version, source, message}``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from evotrainer.lineage import LineageStore

SUBDIRS = ("evals", "logs", "checkpoints", "reports", "tb")


class WorkspaceError(RuntimeError):
    """The run folder is missing, locked by another writer, or malformed."""


class Workspace:
    """Handle on a run folder: lineage store, rollout store, logs, checkpoints.

    Args:
        root: the run folder.
        writer: take the writer lock (raises :class:`WorkspaceError` if another process holds it).
        create: create the folder layout when missing.
    """

    def __init__(self, root: str | Path, writer: bool = False, create: bool = True):
        self.root = Path(root).expanduser().resolve()
        if not create and not (self.root / "lineage.db").exists():
            raise WorkspaceError(f"{self.root}: not a run folder (no lineage.db); create one with `evotrainer init`")
        self.root.mkdir(parents=True, exist_ok=True)
        for d in SUBDIRS:
            (self.root / d).mkdir(exist_ok=True)
        self._lock: FileLock | None = _take_writer_lock(self.root) if writer else None
        try:
            self.lineage = LineageStore(self.root / "lineage.db", readonly=False)
        except BaseException:
            self._release_lock()
            raise
        self._rollouts = None
        self._log_lock = threading.Lock()

    @classmethod
    def init(cls, root: str | Path, recipe: Any, note: str = "base recipe") -> Any:
        """Create the run folder ``root`` with its root version ``v0`` from ``recipe``; returns v0.

        Atomic: the lineage database is built as ``.lineage.db.init-<pid>`` beside its final place
        (journal mode DELETE, so the one file holds every committed row), then ``os.replace``-d onto
        ``lineage.db``. A kill at any point leaves either no ``lineage.db`` (rerun ``init``) or one with v0;
        stale temporary files of killed inits are removed by the next ``init``. A ``lineage.db`` without
        any version (made by a non-atomic init of an older release) is replaced.

        Raises:
            WorkspaceError: the folder has a lineage already, or another process writes it.
        """
        root = Path(root).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
        lock = _take_writer_lock(root)
        try:
            final = root / "lineage.db"
            if final.exists():
                existing = LineageStore(final)
                try:
                    head = existing.root()
                    n_versions = len(existing.versions())
                finally:
                    existing.close()
                if head is not None or n_versions:
                    raise WorkspaceError(f"{root} has a lineage already (root {head.id if head else '?'}); "
                                         "pick a new folder")
            for stale in root.glob(".lineage.db.init-*"):
                stale.unlink(missing_ok=True)
            tmp = root / f".lineage.db.init-{os.getpid()}"
            store = LineageStore(tmp)
            try:
                v0 = store.create_root(recipe, note=note)
                store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                store._db.execute("PRAGMA journal_mode=DELETE")  # one self-contained file to rename
            finally:
                store.close()
            _fsync(tmp)
            os.replace(tmp, final)
            _fsync(root)
            for d in SUBDIRS:
                (root / d).mkdir(exist_ok=True)
            return v0
        finally:
            lock.release()

    @classmethod
    def open(cls, root: str | Path, writer: bool = False) -> Workspace:
        """Open an existing run folder.

        Raises:
            WorkspaceError: the folder is not a run folder, or is locked by another writer.
        """
        return cls(root, writer=writer, create=False)

    @property
    def rollouts(self):
        """The run's :class:`evotrainer.rollouts.RolloutStore` (opened lazily)."""
        if self._rollouts is None:
            from evotrainer.rollouts import RolloutStore

            self._rollouts = RolloutStore(self.root / "rollouts")
        return self._rollouts

    def path(self, *parts: str) -> Path:
        """A path inside the run folder."""
        return self.root.joinpath(*parts)

    def checkpoint_dir(self, version_id: str) -> Path:
        """Checkpoint folder of a version (created)."""
        p = self.root / "checkpoints" / version_id
        p.mkdir(parents=True, exist_ok=True)
        return p

    def log(self, message: str, level: str = "info", version: str | None = None, source: str = "run",
            **extra: Any) -> None:
        """Append one JSON log record to ``logs/run.jsonl``."""
        rec = {"time": time.time(), "level": level, "version": version, "source": source, "message": message, **extra}
        with self._log_lock, open(self.root / "logs" / "run.jsonl", "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")

    def read_logs(self) -> list[dict[str, Any]]:
        """All log records, oldest first (a torn last line from a crash is skipped)."""
        p = self.root / "logs" / "run.jsonl"
        if not p.exists():
            return []
        out = []
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def close(self) -> None:
        """Close stores and release the writer lock."""
        try:
            self.lineage.close()
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None and self._lock.is_locked:
            self._lock.release()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _take_writer_lock(root: Path) -> FileLock:
    """The run's writer lock, held by this handle whatever thread later releases it.

    Raises:
        WorkspaceError: another handle (this process or another) holds it for more than 0.5 s.
    """
    lock = FileLock(str(root / ".writer.lock"), thread_local=False)
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        raise WorkspaceError(
            f"{root}: another process is writing this run (lock {root / '.writer.lock'}); "
            "wait for it or use another run folder"
        ) from None
    return lock


def _fsync(path: Path) -> None:
    """Flush a file or folder entry to disk (best effort: some filesystems refuse a folder fsync)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
