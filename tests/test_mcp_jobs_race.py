"""Regression: a client that sees a job `done` in the store and starts the next job at once must not hit
the writer lock the finishing job has not released yet (seen in a real `make run`: "another process is
writing this run" when training v2 right after v1's evaluation)."""

from __future__ import annotations

import time

from evotrainer.recipe import Recipe
from evotrainer.servers.jobs import JobManager
from evotrainer.workspace import Workspace


def test_next_job_waits_for_the_previous_one_to_release_the_lock(tmp_path, monkeypatch):
    with Workspace(tmp_path / "run") as ws:
        ws.lineage.create_root(Recipe())
    real_close = Workspace.close

    def slow_close(self):  # widen the window between "status done" and "lock released" to 1.5 s
        time.sleep(1.5)
        real_close(self)

    monkeypatch.setattr(Workspace, "close", slow_close)
    jm = JobManager(tmp_path / "run")
    first = jm.start("eval", "v0", 1, lambda ws, progress, stop: {"ok": 1})
    reader = Workspace.open(tmp_path / "run")
    deadline = time.time() + 30
    while reader.lineage.job(first.id).status != "done":  # what job_status reports to the client
        assert time.time() < deadline
        time.sleep(0.01)
    second = jm.start("train", "v0", 1, lambda ws, progress, stop: {"ok": 2})  # raised ToolError before the fix
    assert second.done.wait(30) and second.result == {"ok": 2}
    assert reader.lineage.job(second.id).status == "done"
