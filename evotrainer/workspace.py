"""Workspace: the folder of one run (DESIGN.md §2).

Layout::

    RUN/
      lineage.db        versions, decisions, jobs, metrics, eval outcomes (SQLite, WAL)
      rollouts/         LanceDB dataset of rollouts (evotrainer.rollouts.RolloutStore)
      evals/ logs/ checkpoints/ reports/ tb/
      run.yaml          the run config this workspace was created with (if any)
      .writer.lock      held by the one process that may train / write

Writers take the lock (:meth:`Workspace.open` with ``writer=True``); readers never block.
Log records are JSON lines in ``logs/run.jsonl`` (``{time, level, version, source, message}``).
"""

from __future__ import annotations

import json
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
        self._lock: FileLock | None = None
        if writer:
            self._lock = FileLock(str(self.root / ".writer.lock"))
            try:
                self._lock.acquire(timeout=0.5)
            except Timeout:
                raise WorkspaceError(
                    f"{self.root}: another process is writing this run (lock {self.root / '.writer.lock'}); "
                    "wait for it or use another run folder"
                ) from None
        self.lineage = LineageStore(self.root / "lineage.db", readonly=False)
        self._rollouts = None
        self._log_lock = threading.Lock()

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
        self.lineage.close()
        if self._lock is not None and self._lock.is_locked:
            self._lock.release()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
