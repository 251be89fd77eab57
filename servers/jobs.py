"""Background train / evaluate jobs of the training-control server.

A job runs a backend call (``Backend.train`` / ``Backend.evaluate``, docs/interfaces.md) in a
daemon thread with its own writer handle on the workspace (the run's writer lock: one writing job
per run at a time). Its row in the lineage store (``jobs`` table) is updated after each step, so
any client, in this process or another, reads its progress; cancellation sets an event that the
backend polls through ``should_stop``. When the server exits (its stdio client closed the pipe, the HTTP
server stopped), :meth:`JobManager.shutdown` stops its jobs after their current step and marks them
``interrupted``; jobs of a server process that died are marked ``interrupted`` by the lineage store on the
next open. Either way they are resumable: training continues from the last logged step.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from evotrainer.workspace import Workspace, WorkspaceError

ProgressFn = Callable[[dict[str, Any]], None]
StopFn = Callable[[], bool]
RunFn = Callable[[Workspace, ProgressFn, StopFn], Any]
"""``run(ws, progress, should_stop)``: the backend call of a job, on the job's own writer handle."""
SHUTDOWN_WAIT_S = 60.0  # at the server's exit, how long its running jobs get to finish their current step
MAX_JOB_WAITERS = 64
"""Tool calls of one server that may wait on jobs at once (``wait_s`` > 0). Each polls every
:data:`WAIT_POLL_S`; review 19 (P1-R19) sent 2,000 ``job_status(wait_s=600)`` over stdio and the server's ping took
16.2 s (6,000: no answer in 100 s) vs 2.1 s without waits. 64 is far more than an agent's loop needs (one per job);
a call past it answers at once with the current status and a note saying to poll again."""
WAIT_POLL_S = 0.05  # how often a waiting call looks at its job (progress notifications, done)


def to_jsonable(obj: Any) -> Any:
    """A backend result (pydantic model, dataclass, mapping) as plain JSON-able data."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: to_jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


@dataclasses.dataclass
class RunningJob:
    """In-memory side of a job started by this process."""

    id: str
    kind: str
    version_id: str
    steps_total: int
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    finishing: threading.Event = dataclasses.field(default_factory=threading.Event)  # final status being written
    interrupted: threading.Event = dataclasses.field(default_factory=threading.Event)  # the server is going away
    steps_done: int = 0
    last: dict[str, Any] = dataclasses.field(default_factory=dict)
    result: Any = None
    started_at: float = dataclasses.field(default_factory=time.time)
    thread: threading.Thread | None = None


class JobManager:
    """Starts, tracks and cancels the background jobs of one server process.

    Args:
        run_dir: the run folder (a writer handle is opened on it per job).
    """

    def __init__(self, run_dir: Path | None):
        self.run_dir = run_dir
        self._jobs: dict[str, RunningJob] = {}
        self._lock = threading.Lock()
        self._waiters = 0  # calls inside wait() now (at most MAX_JOB_WAITERS)

    def running(self) -> list[RunningJob]:
        """Jobs of this process that have not finished."""
        with self._lock:
            return [j for j in self._jobs.values() if not j.done.is_set()]

    def get(self, job_id: str) -> RunningJob | None:
        """The in-memory job (None if it was started by another process)."""
        with self._lock:
            return self._jobs.get(job_id)

    def start(self, kind: str, version_id: str, steps_total: int, run: RunFn) -> RunningJob:
        """Open a writer handle, register the job row and start ``run(ws, progress, should_stop)`` in a thread.

        Raises:
            ToolError: no run folder, or another job / process holds the run's writer lock.
        """
        if self.run_dir is None:
            raise ToolError("this server was started without a run folder; restart it with --run PATH")
        # A job of ours whose result is in (the store already says done / failed) may still be closing its
        # writer handle: a client that polled job_status can start the next job in that window. Wait for it.
        for prev in self.running():
            if prev.finishing.is_set():
                prev.done.wait(timeout=120)
        try:
            ws = Workspace.open(self.run_dir, writer=True)
        except WorkspaceError as exc:
            busy = ", ".join(f"{j.id} ({j.kind} {j.version_id})" for j in self.running())
            hint = f"; running here: {busy} (wait with job_status or stop it with cancel_job)" if busy else ""
            raise ToolError(f"{exc}{hint}") from None
        job = RunningJob(id=f"{kind}-{version_id}-{uuid.uuid4().hex[:8]}", kind=kind, version_id=version_id,
                         steps_total=steps_total)
        try:
            ws.lineage.create_job(job.id, version_id, kind, steps_total=steps_total)
        except BaseException:
            ws.close()
            raise
        with self._lock:
            self._jobs[job.id] = job
        job.thread = threading.Thread(target=self._run, args=(job, ws, run), name=job.id, daemon=True)
        job.thread.start()
        return job

    def _run(self, job: RunningJob, ws: Workspace, run: RunFn) -> None:
        def progress(info: dict[str, Any]) -> None:
            job.last = dict(info)
            if isinstance(info.get("step"), int) and isinstance(info.get("steps"), int):
                # train: 1-based step of the version (resumed steps included) / eval: problems done
                job.steps_done, job.steps_total = info["step"], info["steps"]
            else:
                job.steps_done += 1
            frac = job.steps_done / job.steps_total if job.steps_total else 0.0
            ws.lineage.update_job(job.id, steps_done=job.steps_done, steps_total=job.steps_total,
                                  progress=min(1.0, frac), message=_progress_message(info))

        try:
            job.result = run(ws, progress, job.cancel.is_set)
            job.finishing.set()
            status = "interrupted" if job.interrupted.is_set() else "cancelled" if job.cancel.is_set() else "done"
            ws.lineage.update_job(job.id, status=status, progress=1.0 if status == "done" else
                                  (job.steps_done / job.steps_total if job.steps_total else 0.0),
                                  message=_result_message(job.result, status))
            # the status is stored: a run log that cannot take the record does not fail the job (review 12, F-R12)
            log_error = ws.log_after_commit(f"{job.kind} job {job.id} {status}", version=job.version_id, source="mcp")
            if log_error is not None and isinstance(job.result, dict):
                job.result = {**job.result, "log_error": log_error}
        except BaseException as exc:  # the job fails, the server keeps serving
            job.finishing.set()
            job.result = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                ws.lineage.update_job(job.id, status="failed", message=f"{type(exc).__name__}: {exc}"[:2000])
                log_error = ws.log_after_commit(f"{job.kind} job {job.id} failed: {exc}", level="error",
                                                version=job.version_id, source="mcp")
                if log_error is not None:
                    job.result["log_error"] = log_error
            except Exception as store_exc:  # the store cannot take the failure: keep it on the job's result
                job.result["store_error"] = f"{type(store_exc).__name__}: {store_exc}"
        finally:
            ws.close()
            job.done.set()

    def shutdown(self, timeout_s: float | None = None) -> list[RunningJob]:
        """Stop this process's running jobs because the server is going away (its stdio client left): each is asked
        to stop after its current step and is marked ``interrupted`` (resumable from its last step); waits up to
        ``timeout_s`` seconds (default :data:`SHUTDOWN_WAIT_S`) for them in all. Returns the jobs still running.

        Review 10 (W-R10): the server left a training thread running into interpreter teardown, which aborted the
        process (SIGABRT, "terminate called without an active exception"), and the job row stayed ``running``."""
        jobs = self.running()
        for job in jobs:
            job.interrupted.set()
            job.cancel.set()
        deadline = time.monotonic() + (SHUTDOWN_WAIT_S if timeout_s is None else timeout_s)
        for job in jobs:
            if job.thread is not None:
                job.thread.join(max(0.0, deadline - time.monotonic()))
        return [j for j in jobs if not j.done.is_set()]

    def cancel(self, job_id: str) -> RunningJob:
        """Ask a running job to stop after its current step.

        Raises:
            ToolError: the job is not running in this process, or is an ``eval`` job (it cannot be stopped).
        """
        job = self.get(job_id)
        if job is None:
            raise ToolError(f"job {job_id!r} was not started by this server process; cancel it where it runs")
        if job.done.is_set():
            raise ToolError(f"job {job_id!r} has finished already; nothing to cancel")
        if job.kind == "eval":  # review 19 (P3-R19): the backend's evaluate takes no should_stop; the job ran on
            raise ToolError(f"job {job_id!r} is an evaluation, which cannot be cancelled: it ends by itself when "
                            "its problems are scored (wait for it with job_status)")
        job.cancel.set()
        return job

    async def wait(self, ctx: Context[Any, Any] | None, job_id: str, wait_s: float) -> str | None:
        """Wait up to ``wait_s`` seconds for a job to finish, sending MCP progress notifications per step.

        Returns None, or a note when the call did not wait because :data:`MAX_JOB_WAITERS` calls of this server
        already wait (the caller adds it to its reply; the job is untouched).
        """
        job = self.get(job_id)
        if job is None or wait_s <= 0:
            return None
        with self._lock:
            if self._waiters >= MAX_JOB_WAITERS:
                return (f"not waited: {MAX_JOB_WAITERS} calls already wait on jobs in this server (the most it "
                        "serves at once); call job_status again, or wait in fewer calls")
            self._waiters += 1
        try:
            deadline = time.monotonic() + wait_s
            reported = -1
            while time.monotonic() < deadline:
                if job.steps_done != reported and ctx is not None:
                    reported = job.steps_done
                    try:
                        await ctx.report_progress(job.steps_done, job.steps_total or None,
                                                  f"{job.kind} {job.version_id}: {_progress_message(job.last)}")
                    except Exception:
                        pass  # a client that cannot take notifications still gets the result
                if job.done.is_set():
                    return None
                await anyio.sleep(WAIT_POLL_S)
            return None
        finally:
            with self._lock:
                self._waiters -= 1


def _progress_message(info: dict[str, Any]) -> str:
    if not info:
        return "starting"
    parts = []
    if "step" in info:
        parts.append(f"step {info['step']}" + (f"/{info['steps']}" if "steps" in info else ""))
    for key in ("reward", "tokens_per_sec"):
        if isinstance(info.get(key), (int, float)):
            parts.append(f"{key}={info[key]:.3g}")
    return ", ".join(parts) or ", ".join(f"{k}={v}" for k, v in list(info.items())[:4])


def _result_message(result: Any, status: str) -> str:
    data = to_jsonable(result)
    if isinstance(data, dict):
        brief = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool)) and len(str(v)) < 80}
        return f"{status}: " + ", ".join(f"{k}={v}" for k, v in list(brief.items())[:8])
    return status
