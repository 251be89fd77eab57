"""Hardening of the MCP servers and the run store (issue 22, items 4 and 5): no call stalls a server, every
malformed JSON-RPC envelope gets an error reply, inputs are bounded, the rollout store never rebuilds its index
on a read, a run never dies on its own writer lock, and ``init`` is atomic.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from evotrainer.servers.jobs import JobManager

from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace, WorkspaceError


# --- the writer lock belongs to the handle, not to the thread that opened it ------------------------------
def test_writer_lock_released_from_another_thread(tmp_path):
    """The cause of "another process is writing this run" after a finished job: the job thread closed a handle
    opened by the request thread, filelock (thread_local=True) ignored the release, the lock stayed held."""
    Workspace.init(tmp_path / "run", Recipe())
    first = Workspace.open(tmp_path / "run", writer=True)  # opened here (the MCP request thread)
    closer = threading.Thread(target=first.close)  # closed there (the job thread)
    closer.start()
    closer.join()
    second = Workspace.open(tmp_path / "run", writer=True)  # raised WorkspaceError before the fix
    try:
        with pytest.raises(WorkspaceError, match=r"another process is writing this run \(lock .*\.writer\.lock\)"):
            Workspace.open(tmp_path / "run", writer=True)  # the lock still excludes a second live writer
    finally:
        second.close()
    del first  # kept alive until here: the garbage collector must not be what releases the lock


def test_next_job_starts_while_the_finished_job_handle_is_still_referenced(tmp_path):
    """The static-mode race: training finishes in its thread, evaluate_version starts the next job at once.
    The finished job's workspace stays referenced (as a traceback, a result or a reference cycle would keep it),
    so only an explicit release frees the lock; before the fix the second start raised a ToolError."""
    Workspace.init(tmp_path / "run", Recipe())
    jm = JobManager(tmp_path / "run")
    kept: list[Workspace] = []
    first = jm.start("train", "v0", 1, lambda ws, progress, stop: kept.append(ws) or {"ok": 1})
    assert first.done.wait(30) and first.result == {"ok": 1}
    second = jm.start("eval", "v0", 1, lambda ws, progress, stop: {"ok": 2})
    assert second.done.wait(30) and second.result == {"ok": 2}
    with Workspace.open(tmp_path / "run") as reader:
        assert [reader.lineage.job(j.id).status for j in (first, second)] == ["done", "done"]
    assert len(kept) == 1


# --- init is atomic ---------------------------------------------------------------------------------------
_KILL_INSIDE_INIT = """
import os, signal, sys
from evotrainer.lineage import LineageStore
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace
real = LineageStore.create_root
def create_root_then_die(self, *a, **k):
    real(self, *a, **k)           # v0 is committed in the temporary database ...
    os.kill(os.getpid(), signal.SIGKILL)  # ... and the process dies before the rename
LineageStore.create_root = create_root_then_die
Workspace.init(sys.argv[1], Recipe())
"""


def test_killed_init_leaves_no_half_made_run(tmp_path):
    run = tmp_path / "run"
    for _ in range(3):  # three killed inits in a row (the probe's case)
        r = subprocess.run([sys.executable, "-c", _KILL_INSIDE_INIT, str(run)], timeout=120)
        assert r.returncode == -signal.SIGKILL
        assert not (run / "lineage.db").exists()  # no lineage.db: not a run yet, nothing empty to trip on
        with pytest.raises(WorkspaceError, match=r"not a run folder \(no lineage\.db\); create one with `evotrainer "
                                                  r"init`"):
            Workspace.open(run)
    assert len(list(run.glob(".lineage.db.init-*"))) == 3  # the killed inits' temporary files ...
    v0 = Workspace.init(run, Recipe())
    assert v0.id == "v0" and list(run.glob(".lineage.db.init-*")) == []  # ... removed by the next init
    with Workspace.open(run) as ws:
        assert [v.id for v in ws.lineage.versions()] == ["v0"]
    with pytest.raises(WorkspaceError, match=r"has a lineage already \(root v0\); pick a new folder"):
        Workspace.init(run, Recipe())


def test_init_killed_at_random_times_is_all_or_nothing(tmp_path):
    """SIGKILL of `evotrainer init` at spread-out moments: each run folder has no lineage.db or one with v0."""
    outcomes = []
    for i, delay in enumerate((0.05, 0.6, 1.2, 1.8, 2.5, 4.0)):
        run = tmp_path / f"run{i}"
        proc = subprocess.Popen([sys.executable, "-m", "evotrainer.cli", "init", str(run)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        if (run / "lineage.db").exists():
            with Workspace.open(run) as ws:
                assert [v.id for v in ws.lineage.versions()] == ["v0"], f"delay {delay}: lineage without v0"
            outcomes.append("v0")
        else:
            outcomes.append("none")
    assert set(outcomes) <= {"v0", "none"}


def test_init_replaces_an_empty_lineage_left_by_an_older_init(tmp_path):
    run = tmp_path / "run"
    Workspace(run).close()  # what the old non-atomic init left when killed: lineage.db with no version
    assert (run / "lineage.db").exists()
    assert Workspace.init(run, Recipe()).id == "v0"
    with Workspace.open(run) as ws:
        assert ws.lineage.root().id == "v0"


def test_cli_init_twice_names_the_root(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "evotrainer.cli", "init", str(run)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"created run {run} with base version v0"
    r = subprocess.run([sys.executable, "-m", "evotrainer.cli", "init", str(run)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: {run} has a lineage already (root v0); pick a new folder"
