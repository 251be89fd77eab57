"""Training and evaluation jobs through MCP with the real local backend on the tiny random model (1-2 steps):
progress notifications, one writer per run, consistent reads while training writes, cancellation, eval summary."""

from __future__ import annotations

import pytest
from mcp_testlib import SyncClient

from evotrainer.recipe import Recipe
from evotrainer.servers.app import build_server
from evotrainer.workspace import Workspace


@pytest.fixture
def client(tmp_path):
    run = tmp_path / "run"
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(Recipe(model={"name_or_path": "tiny-random"}, n_samples_per_prompt=2,
                                      rollout_batch_size=2, generate_max_len=8,
                                      data={"n_train": 8, "n_heldout": 2}, eval={"k": 2}))
    c = SyncClient(build_server("all", run))
    yield c
    c.close()


def test_train_progress_cancel_and_evaluate(client, tmp_path):
    # one writer per run: while another process holds the run's writer lock, a job is refused with the fix.
    # (Held by the test itself: a 1-step job of this server can finish before a second call arrives, and a
    # finishing job is now waited for rather than refused.)
    holder = Workspace.open(tmp_path / "run", writer=True)
    try:
        err = client.err("evaluate_version", {"version_id": "v0"})
        assert "another process is writing this run" in err and "wait for it or use another run folder" in err
    finally:
        holder.close()
    job = client.ok("start_training", {"version_id": "v0", "steps": 1})
    assert job["status"] == "running" and job["steps_total"] == 1 and job["id"].startswith("train-v0-")
    # a second job on the same version is refused while this one runs
    assert "has a running job" in client.err("start_training", {"version_id": "v0", "steps": 1})
    # a second client session reads while training writes: consistent snapshots (WAL + Lance versions),
    # counts only grow and are whole groups (2 samples per prompt)
    other = SyncClient(client.server)
    try:
        seen = []
        for _ in range(5):
            assert other.ok("get_version", {"version_id": "v0"})["status"] in ("proposed", "training", "trained")
            seen.append(other.ok("sample_rollouts", {"version_id": "v0", "limit": 1})["total"])
            assert [j["id"] for j in other.ok("list_jobs")["jobs"]] == [job["id"]]
        assert seen == sorted(seen) and all(n % 2 == 0 for n in seen)
    finally:
        other.close()
    notes = []

    async def on_progress(progress, total, message):
        notes.append((progress, total, message))

    done = client.ok("job_status", {"job_id": job["id"], "wait_s": 600}, progress=on_progress)
    assert done["status"] == "done" and done["steps_done"] == 1 and done["progress"] == 1.0
    assert done["result"]["steps_done"] == 1 and done["result"]["checkpoint"]
    assert notes and notes[-1][:2] == (1, 1) and "train v0" in notes[-1][2]
    v0 = client.ok("get_version", {"version_id": "v0"})
    assert v0["status"] == "trained" and v0["checkpoint"] and "reward/mean" in v0["metrics_summary"]
    assert [j["status"] for j in v0["jobs"]] == ["done"]
    # 1 step x 2 prompts x 2 samples = 4 train rollouts
    assert client.ok("sample_rollouts", {"version_id": "v0", "split": "train"})["total"] == 4
    assert client.ok("list_metrics", {"version_id": "v0"})["versions"][0]["n_steps"] == 1

    # a child trained for 2 steps, cancelled at once: it stops after its current step
    client.ok("propose_intervention", {"parent_id": "v0", "path": "temperature", "new_value": 0.7})
    child = client.ok("start_training", {"version_id": "v1", "steps": 2})
    stopped = client.ok("cancel_job", {"job_id": child["id"], "wait_s": 600})
    assert stopped["status"] == "cancelled" and stopped["steps_done"] < 2
    assert stopped["result"]["stopped_early"] is True
    assert "finished already" in client.err("cancel_job", {"job_id": child["id"]})

    ev = client.ok("evaluate_version", {"version_id": "v0", "k": 2, "wait_s": 600})
    assert ev["status"] == "done" and ev["kind"] == "eval"
    summary = client.ok("get_version", {"version_id": "v0"})["eval_summary"]
    assert summary["k"] == 2 and summary["n_problems"] == 2 and 0.0 <= summary["avg@k"] <= 1.0
    # per-sample outcomes make eval rollouts: 2 problems x k=2
    assert client.ok("sample_rollouts", {"version_id": "v0", "split": "eval"})["total"] == 4
    assert [j["kind"] for j in client.ok("list_jobs")["jobs"]] == ["train", "train", "eval"]


def test_untrained_parent_fails_fast(client):
    client.ok("propose_intervention", {"parent_id": "v0", "path": "temperature", "new_value": 0.7})
    err = client.err("start_training", {"version_id": "v1", "steps": 1})
    assert "parent v0 of v1 has no checkpoint" in err and "train v0 first" in err


def _held_eval_job(tmp_path):
    """A JobManager on a new run and an eval job of v0 that runs until the returned event is set (at most 30 s)."""
    import threading

    from evotrainer.servers.jobs import JobManager

    run = tmp_path / "run"
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(Recipe(model={"name_or_path": "tiny-random"}))
    release = threading.Event()
    jm = JobManager(run)
    job = jm.start("eval", "v0", 0, lambda ws, progress, should_stop: release.wait(30) and {"ok": True})
    return jm, job, release


def test_many_waiting_job_status_calls_are_capped_and_the_loop_stays_responsive(tmp_path):
    # review 19 (P1-R19): 2,000 job_status(wait_s=600) calls each polled every 50 ms; the server's ping took 16.2 s
    import time

    import anyio

    from evotrainer.servers.jobs import MAX_JOB_WAITERS

    jm, job, release = _held_eval_job(tmp_path)
    n_calls = 2000
    notes: list[str | None] = []
    lag: list[float] = []

    async def waiter() -> None:
        notes.append(await jm.wait(None, job.id, 600))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(n_calls):
                tg.start_soon(waiter)
            await anyio.sleep(0.5)
            for _ in range(5):  # the "ping": the event loop answers a short sleep promptly while they wait
                t0 = time.monotonic()
                await anyio.sleep(0.01)
                lag.append(time.monotonic() - t0)
            assert jm._waiters == MAX_JOB_WAITERS  # the rest answered at once
            release.set()

    anyio.run(main)
    assert max(lag) < 1.0
    turned_away = [n for n in notes if n]
    assert len(turned_away) == n_calls - MAX_JOB_WAITERS and len(notes) == n_calls
    assert turned_away[0].startswith(f"not waited: {MAX_JOB_WAITERS} calls already wait on jobs in this server")
    assert job.done.wait(10) and jm._waiters == 0 and job.result == {"ok": True}


def test_cancel_of_an_eval_job_is_refused_saying_it_ends_by_itself(tmp_path):
    # review 19 (P3-R19): cancel_job on an eval job answered as if stopping it; the job stayed running

    from mcp.server.mcpserver.exceptions import ToolError


    jm, job, release = _held_eval_job(tmp_path)
    with pytest.raises(ToolError, match="is an evaluation, which cannot be cancelled: it ends by itself"):
        jm.cancel(job.id)
    assert not job.cancel.is_set()
    release.set()
    assert job.done.wait(10) and job.result == {"ok": True}
