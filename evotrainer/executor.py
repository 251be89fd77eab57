"""Executors: where "train version X for N steps" and "evaluate X" run.

A :class:`Task` is one branch of a round: train a version up to ``steps`` GRPO steps, then (optionally)
evaluate it on the held-out set. Both executors run a task the same way, through our own CLI::

    evotrainer train --run RUN --version X --steps N --json --job JOB --threads T [--backend openrlhf]
    evotrainer eval X --run RUN --json --job JOB --threads T [--k K] [--name NAME]

(:func:`run_task`, the worker entry point, calls the CLI's typer app in its process), so the lineage a
round leaves is the same whichever executor ran it; only the order of records differs. The app is
named, not imported (:data:`CLI_APP`, ``"module:attribute"``, resolved in the worker's process): core
imports nothing of the CLI edge above it.

- :class:`InlineExecutor` runs the tasks one after another in this process (today's behaviour).
- :class:`RayExecutor` runs each task as a Ray task (``ray.remote`` with the branch's resources: CPUs,
  GPUs, memory; ``max_retries=0`` so a dead worker is reported, not silently rerun; workers are reused
  across rounds, since importing torch and transformers is most of a short branch's time on a loaded
  machine, or fresh per branch with ``reuse_workers=False``), at most ``max_parallel`` at once, on the cluster at
  ``ray_address`` or on a local cluster started for the run (127.0.0.1, no dashboard) and stopped by
  :meth:`RayExecutor.close`. The OpenRLHF backend takes the same path (``backend="openrlhf"``: the
  worker's CLI builds and follows the version's OpenRLHF job), so a GPU cluster runs a round's
  OpenRLHF jobs side by side.

Concurrency: each worker opens the run as a writer of its own version only
(:class:`~evotrainer.workspace.Workspace` ``version=``), writes only that version's rows and folders,
and registers a ``jobs`` row with its pid; readers never block (SQLite WAL). A worker that dies
(SIGKILL, OOM) leaves its job ``running`` with a dead pid: the executor marks it ``interrupted``
(:meth:`~evotrainer.lineage.LineageStore.recover_jobs`) and returns status ``interrupted``; the other
branches go on. Running the same tasks again resumes: a version already trained to ``steps`` is not
retrained, an interrupted one continues from its last resume checkpoint (the local backend's resume).

Limits: workers find the run folder by path and processes by pid, so the Ray cluster is one machine
(or nodes that share the folder on a filesystem with working SQLite locks); the Jobs API (a dashboard
with ``ray[default]``) is not needed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import resource
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import typer
from pydantic import BaseModel, ConfigDict, Field

from evotrainer.errors import EvoTrainerError
from evotrainer.lineage import LineageError, LineageStore

# Environment a worker gets from the driver (a remote node's workers do not inherit it).
PASS_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "EVOTRAINER_SKILLS_DIR",
            "EVOTRAINER_NUM_THREADS", "HF_HOME", "EVOTRAINER_CACHE_DIR")
TaskStatus = Literal["done", "failed", "interrupted", "skipped"]
ProgressFn = Callable[[str, str, int, int], None]  # (version_id, "train" | "eval", done, total)
CLI_APP = "evotrainer.cli:app"
"""The typer app a worker runs ``train`` / ``eval`` with, as ``"module:attribute"`` (resolved in the worker)."""


class ExecutorError(EvoTrainerError, RuntimeError):
    """An executor cannot start (Ray missing or unreachable, bad settings); the message says the fix."""


class Task(BaseModel):
    """One branch: train ``version_id`` up to ``steps`` steps (None: no training), then evaluate it if asked."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    version_id: str = Field(..., min_length=1)
    steps: int | None = Field(None, ge=1, description="Total GRPO steps of the version (None: evaluate only).")
    evaluate: bool = Field(False, description="Evaluate on the held-out set after training.")
    k: int | None = Field(None, ge=1, description="Samples per held-out problem (None: recipe eval.k).")
    eval_name: str = "heldout"


class TaskResult(BaseModel):
    """What one task left: status, the CLI's JSON results, the job ids it registered, the error if any."""

    version_id: str
    status: TaskStatus = Field(..., description="done | failed (the CLI raised) | interrupted (the worker died) "
                                                "| skipped (already trained and nothing else asked)")
    train: dict[str, Any] | None = Field(None, description="TrainResult of the train command (--json).")
    eval: dict[str, Any] | None = Field(None, description="EvalResult of the eval command (--json).")
    jobs: list[str] = Field(default_factory=list)
    error: str = ""
    wall_s: float = Field(0.0, description="Seconds from submission to the result (queueing included).")
    started_at: float | None = Field(None, description="Unix seconds when the worker began the task.")
    finished_at: float | None = Field(None, description="Unix seconds when the worker ended it.")
    pid: int | None = Field(None, description="The worker process.")
    cpu_s: float = Field(0.0, description="User + system CPU-seconds the worker spent on the task.")


class Executor(Protocol):
    """Runs a round's tasks; results come back in the order of ``tasks``."""

    name: str
    max_parallel: int

    def run(self, run_dir: str | Path, tasks: list[Task], progress: ProgressFn | None = None) -> list[TaskResult]:
        ...

    def close(self) -> None:
        ...


# --- the worker entry point (same code inline and on a Ray worker) ---------------------------------------
def _already_trained(run_dir: Path, task: Task) -> bool:
    """True when the version must not be trained again: decided already, or trained to ``task.steps``."""
    store = LineageStore(run_dir / "lineage.db", readonly=True)
    try:
        v = store.get(task.version_id)
        if v.status in ("kept", "pruned", "reverted"):
            return True
        return (v.status == "trained" and bool(v.checkpoint) and Path(cast(str, v.checkpoint)).is_dir()
                and store.last_step(task.version_id) + 1 >= (task.steps or 0))
    finally:
        store.close()


def resolve_app(entry: str = CLI_APP) -> Any:
    """The object named by ``entry`` (``"package.module:attribute"``), imported in this process.

    Raises:
        ExecutorError: ``entry`` is not ``module:attribute`` or names nothing.
    """
    module, sep, attr = entry.partition(":")
    if not sep or not module or not attr:
        raise ExecutorError(f"cli_app={entry!r}: give 'package.module:attribute', e.g. {CLI_APP!r}")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ExecutorError(f"cli_app={entry!r}: cannot load it ({exc}); give an importable 'module:attribute'") from exc


def _cli(argv: list[str], cli_app: str = CLI_APP) -> dict[str, Any]:
    """Run ``evotrainer ARGV`` (with ``--json``) in this process; returns its JSON output.

    Raises:
        RuntimeError: the command exited non-zero (the message has its last output lines).
    """
    app = resolve_app(cli_app)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = app(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        rc = exc.exit_code
    if rc not in (None, 0):
        tail = (err.getvalue() + out.getvalue()).strip()[-1500:]
        raise RuntimeError(f"evotrainer {' '.join(argv[:2])} exited {rc}: {tail}")
    return json.loads(out.getvalue())


def run_task(run_dir: str, task: dict[str, Any], job_ids: dict[str, str], threads: int | None,
             device: str | None, backend: str, env: dict[str, str], train_args: tuple[str, ...] = (),
             cli_app: str = CLI_APP) -> dict[str, Any]:
    """Worker entry point: the task's ``evotrainer train`` then ``evotrainer eval`` commands, in this process.

    Args:
        run_dir: absolute run folder.
        task: a :class:`Task` as a dict.
        job_ids: ``{"train": id, "eval": id}``, the ``jobs`` rows the commands register (progress, pid).
        threads: torch CPU threads of this branch (None: the CLI's default).
        device: ``cpu`` / ``cuda`` / None.
        backend: ``local`` | ``openrlhf``.
        env: environment variables set before anything is imported (:data:`PASS_ENV` of the driver).
        train_args: more ``evotrainer train`` options (e.g. ``--cluster FILE`` for openrlhf).
        cli_app: the typer app of the commands, ``"module:attribute"`` (:data:`CLI_APP`).

    Returns:
        ``{"train": TrainResult | None, "eval": EvalResult | None, "skipped": bool, "started_at", "finished_at",
        "pid", "cpu_s"}`` (results as JSON dicts; times in Unix seconds; the task's CPU-seconds).
    """
    started_at, ru0 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    os.environ.update(env)
    t = Task.model_validate(task)
    root = Path(run_dir)
    extra = [*(["--threads", str(threads)] if threads else []), *(["--device", device] if device else [])]
    out: dict[str, Any] = {"train": None, "eval": None, "skipped": False, "started_at": started_at,
                           "pid": os.getpid()}
    if t.steps is not None:
        if _already_trained(root, t):
            out["skipped"] = True
        else:
            out["train"] = _cli(["train", "--run", str(root), "--version", t.version_id, "--steps", str(t.steps),
                                 "--json", "--job", job_ids["train"], "--backend", backend,
                                 *(extra if backend == "local" else []), *train_args], cli_app)
    if t.evaluate:
        out["eval"] = _cli(["eval", t.version_id, "--run", str(root), "--json", "--job", job_ids["eval"],
                            "--name", t.eval_name, *(["--k", str(t.k)] if t.k else []), *extra], cli_app)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["finished_at"] = time.time()
    out["cpu_s"] = round(ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime, 3)
    return out


def _job_ids(task: Task) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    return {"train": f"train-{task.version_id}-{tag}", "eval": f"eval-{task.version_id}-{tag}"}


def _env() -> dict[str, str]:
    return {k: os.environ[k] for k in PASS_ENV if k in os.environ}


def _result(task: Task, out: dict[str, Any], job_ids: dict[str, str], wall_s: float) -> TaskResult:
    jobs = [job_ids[k] for k in ("train", "eval") if out.get(k) is not None]
    skipped = out.get("skipped") and out.get("eval") is None
    return TaskResult(version_id=task.version_id, status="skipped" if skipped else "done", train=out.get("train"),
                      eval=out.get("eval"), jobs=jobs, wall_s=round(wall_s, 3), started_at=out.get("started_at"),
                      finished_at=out.get("finished_at"), pid=out.get("pid"), cpu_s=out.get("cpu_s") or 0.0)


class _Progress:
    """Reads the running tasks' ``jobs`` rows (written by the workers) and reports each branch's step."""

    def __init__(self, run_dir: Path, progress: ProgressFn | None):
        self.progress = progress
        self.store = None
        if progress is not None:
            self.store = LineageStore(run_dir / "lineage.db", readonly=True)
        self._last: dict[str, tuple[int, int]] = {}

    def poll(self, running: list[tuple[Task, dict[str, str]]]) -> None:
        if self.store is None or self.progress is None:
            return
        for task, ids in running:
            for kind in ("train", "eval"):
                try:
                    job = self.store.job(ids[kind])
                except LineageError:  # not started (yet, or at all)
                    continue
                now = (job.steps_done, job.steps_total)
                if self._last.get(ids[kind]) != now:
                    self._last[ids[kind]] = now
                    self.progress(task.version_id, kind, *now)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


# --- inline ------------------------------------------------------------------------------------------------
class InlineExecutor:
    """Runs the tasks one after another in this process (``max_parallel`` is 1).

    Args:
        threads: torch CPU threads per task (None: the CLI's default, the idle cores).
        device: ``cpu`` / ``cuda`` / None (auto).
        backend: ``local`` | ``openrlhf``.
        train_args: more ``evotrainer train`` options (``--cluster FILE`` for openrlhf).
        cli_app: the typer app the commands run with, ``"module:attribute"`` (:data:`CLI_APP`).
    """

    name = "inline"
    max_parallel = 1

    def __init__(self, threads: int | None = None, device: str | None = None, backend: str = "local",
                 train_args: tuple[str, ...] = (), cli_app: str = CLI_APP):
        self.threads, self.device, self.backend, self.train_args = threads, device, backend, tuple(train_args)
        self.cli_app = cli_app

    def run(self, run_dir: str | Path, tasks: list[Task], progress: ProgressFn | None = None) -> list[TaskResult]:
        """Run each task to its end before the next; a failing task is reported and the others still run."""
        root = Path(run_dir).expanduser().resolve()
        results = []
        for task in tasks:
            ids, t0 = _job_ids(task), time.monotonic()
            try:
                out = run_task(str(root), task.model_dump(), ids, self.threads, self.device, self.backend, {},
                               self.train_args, self.cli_app)
                results.append(_result(task, out, ids, time.monotonic() - t0))
            except Exception as exc:
                results.append(TaskResult(version_id=task.version_id, status="failed", error=str(exc)[:2000],
                                          jobs=list(ids.values()), wall_s=round(time.monotonic() - t0, 3)))
            if progress is not None:
                progress(task.version_id, "done", 1, 1)
        return results

    def close(self) -> None:
        """Nothing to release."""


# --- Ray -----------------------------------------------------------------------------------------------------
class RayExecutor:
    """Runs the tasks as Ray tasks, at most ``max_parallel`` at once (see the module docstring).

    Args:
        address: a running cluster (``ray://``, ``host:port`` or ``auto``); None starts a local cluster on
            127.0.0.1 for this executor (no dashboard) and stops it in :meth:`close`.
        max_parallel: branches running at the same time.
        threads: torch CPU threads per branch; also the task's Ray CPUs unless ``num_cpus`` is given.
        num_cpus / num_gpus / memory_mb: Ray resources of one task (a task waits until they are free).
        device, backend, train_args, cli_app: as for :class:`InlineExecutor`.
        temp_dir: Ray's session folder for a local cluster (None: Ray's default).
        poll_s: seconds between checks of the running tasks (progress, finished ones).
        reuse_workers: keep a worker process for the next task (False: ``max_calls=1``, a fresh process per
            branch, nothing carried over; each pays the imports again: about 30 s per branch measured here).

    Raises:
        ExecutorError: bad settings, ray not installed, or the cluster cannot be reached.
    """

    name = "ray"

    def __init__(self, address: str | None = None, max_parallel: int = 2, threads: int | None = 1,
                 num_cpus: float | None = None, num_gpus: float = 0.0, memory_mb: int | None = None,
                 device: str | None = None, backend: str = "local", temp_dir: str | None = None,
                 poll_s: float = 0.5, train_args: tuple[str, ...] = (), reuse_workers: bool = True,
                 cli_app: str = CLI_APP):
        if max_parallel < 1:
            raise ExecutorError(f"max_parallel={max_parallel}: run at least 1 branch at a time")
        if threads is not None and threads < 1:
            raise ExecutorError(f"threads={threads}: give at least 1 CPU thread per branch, or None for the default")
        self.address, self.max_parallel, self.threads = address, max_parallel, threads
        self.num_cpus = float(num_cpus if num_cpus is not None else (threads or 1))
        # an OpenRLHF branch's task only follows its job; the job's own actors take the GPUs from the cluster
        # (rl_backend.openrlhf.runner joins it), so a task holding a GPU would starve its own job
        if backend == "openrlhf" and num_gpus:
            raise ExecutorError(f"num_gpus={num_gpus} with backend=openrlhf: the OpenRLHF job's actors reserve the "
                                "GPUs themselves (ClusterSpec.num_gpus_per_node); leave num_gpus at 0")
        self.num_gpus, self.memory_mb = float(num_gpus), memory_mb
        self.device, self.backend, self.temp_dir, self.poll_s = device, backend, temp_dir, poll_s
        self.train_args = tuple(train_args)
        self.reuse_workers = reuse_workers
        self.cli_app = cli_app
        self._owns_cluster = False  # started the local cluster (close stops it)
        self._owns_driver = False  # connected to the cluster at address (close disconnects)
        self._remote: Any = None  # ray.remote(run_task) once connected

    def _ray(self) -> Any:
        try:
            import ray
        except ImportError:
            raise ExecutorError("executor=ray needs the ray package: pip install 'ray>=2.40'") from None
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "warning"}
            if self.address:
                try:
                    ray.init(address=self.address, **kwargs)
                    self._owns_driver = True
                except (ConnectionError, RuntimeError) as exc:
                    raise ExecutorError(f"ray_address={self.address!r}: cannot connect ({exc}); start the cluster "
                                        "(`ray start --head`) or fix the address, or leave ray_address empty for a "
                                        "local cluster") from None
            else:
                cpus = max(os.cpu_count() or 1, int(self.num_cpus * self.max_parallel + 0.999))
                ray.init(address="local", num_cpus=cpus, _node_ip_address="127.0.0.1",
                         **({"_temp_dir": self.temp_dir} if self.temp_dir else {}), **kwargs)
                self._owns_cluster = True
        if self._remote is None:
            opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                                    # a GPU task's worker exits after it (Ray's default: frees the GPU memory)
                                    "max_calls": 0 if self.reuse_workers and not self.num_gpus else 1,
                                    "max_retries": 0}
            if self.memory_mb:
                opts["memory"] = int(self.memory_mb) * 1024 * 1024
            self._remote = ray.remote(**opts)(run_task)
        return ray

    def start(self) -> None:
        """Connect to the cluster (or start the local one) now rather than at the first :meth:`run`.

        Raises:
            ExecutorError: ray is not installed or the cluster cannot be reached.
        """
        self._ray()

    def run(self, run_dir: str | Path, tasks: list[Task], progress: ProgressFn | None = None) -> list[TaskResult]:
        """Submit up to ``max_parallel`` tasks, start the next as each finishes; results in ``tasks`` order.

        A task whose CLI raised is ``failed`` (its message in ``error``); one whose worker died is
        ``interrupted`` (its jobs rows are marked so); the others are not affected.
        """
        ray = self._ray()
        from ray.exceptions import RayTaskError

        root = Path(run_dir).expanduser().resolve()
        env = _env()
        queue = list(enumerate(tasks))
        running: dict[Any, tuple[int, Task, dict[str, str], float]] = {}
        results: list[TaskResult | None] = [None] * len(tasks)
        watcher = _Progress(root, progress)
        try:
            while queue or running:
                while queue and len(running) < self.max_parallel:
                    i, task = queue.pop(0)
                    ids = _job_ids(task)
                    ref = self._remote.remote(str(root), task.model_dump(), ids, self.threads, self.device,
                                              self.backend, env, self.train_args, self.cli_app)
                    running[ref] = (i, task, ids, time.monotonic())
                ready, _ = ray.wait(list(running), num_returns=1, timeout=self.poll_s)
                watcher.poll([(t, ids) for _, t, ids, _ in (running[ref] for ref in ready)])  # their last steps
                for ref in ready:
                    i, task, ids, t0 = running.pop(ref)
                    wall = time.monotonic() - t0
                    try:
                        results[i] = _result(task, ray.get(ref), ids, wall)
                    except RayTaskError as exc:  # the command raised in the worker
                        results[i] = TaskResult(version_id=task.version_id, status="failed", jobs=list(ids.values()),
                                                error=str(exc.cause if exc.cause is not None else exc)[:2000],
                                                wall_s=round(wall, 3))
                    except ray.exceptions.RayError as exc:  # the worker died (SIGKILL, OOM, node lost)
                        results[i] = TaskResult(version_id=task.version_id, status="interrupted",
                                                jobs=list(ids.values()), wall_s=round(wall, 3),
                                                error=f"{type(exc).__name__}: {str(exc)[:1500]}")
                        _mark_interrupted(root, list(ids.values()))
                watcher.poll([(t, ids) for _, t, ids, _ in running.values()])
        finally:
            watcher.close()
        return [r for r in results if r is not None]

    def close(self) -> None:
        """Stop the local cluster this executor started, or disconnect from the one at ``address`` (it keeps
        running); a Ray session this process had opened before is left as it was."""
        if self._owns_cluster or self._owns_driver:
            import ray

            ray.shutdown()
            self._owns_cluster = self._owns_driver = False
        self._remote = None


def _mark_interrupted(root: Path, job_ids: list[str], wait_s: float = 10.0) -> list[str]:
    """The dead worker's jobs become ``interrupted`` now (not at the next open of the run).

    Ray may report the death before the process is gone (``recover_jobs`` sees a live pid): wait up to
    ``wait_s`` seconds for it.
    """
    store = LineageStore(root / "lineage.db")
    try:
        deadline = time.monotonic() + wait_s
        while True:
            store.recover_jobs()
            running = []
            for jid in job_ids:
                try:
                    if store.job(jid).status == "running":
                        running.append(jid)
                except LineageError:  # never registered (the worker died before)
                    pass
            if not running or time.monotonic() >= deadline:
                return [j for j in job_ids if j not in running]
            time.sleep(0.2)
    finally:
        store.close()


BRANCH_OVERHEAD_BYTES = 1 << 30
"""``executor: auto``'s estimate of one branch process's memory beyond its fp32 AdamW state: the libraries (torch,
transformers: ~0.4 GiB), a micro-batch's activations and the allocator's slack (SmolLM2-135M's worker: ~0.6 GiB
over its 2.1 GiB of weights, gradients and moments, docs/performance.md §14)."""


def _cpus() -> int:
    """CPUs this process may run on (its affinity mask, as a container's cpuset sees it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _mem_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (the kernel's estimate of what can be allocated without
    swapping); None where there is no such file (not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def choose_executor(kind: str, *, backend: str = "local", max_parallel: int = 2, threads: int | None = 1,
                    weights_bytes: int | None = None) -> tuple[str, str]:
    """The executor a run uses, and why: ``executor: inline`` / ``ray`` as given; ``auto`` picks Ray's branches
    side by side where they pay and fit, else inline.

    ``auto`` is ``ray`` when all hold: the local backend (an OpenRLHF job is a cluster's own business: name
    ``ray`` for it); Ray importable; at least 2 branches of ``threads`` CPUs each fit in this process's CPUs; and
    ``MemAvailable`` holds the branches side by side: ``min(max_parallel, CPUs // threads)`` x (4 x
    ``weights_bytes`` + :data:`BRANCH_OVERHEAD_BYTES`), i.e. fp32 weights, their gradients and AdamW's two moments
    per branch (``weights_bytes``: the root checkpoint's weight files; unknown: 0, the overhead alone). Measured on
    the default config, 2 cores: inline 1 branch at a time against 2 side by side, docs/performance.md §14.

    Args:
        kind: ``inline`` | ``ray`` | ``auto``.
        weights_bytes: size of the policy's saved weights in bytes (fp32 as the local backend saves them).

    Returns:
        ``(kind, reason)``: ``"inline"`` or ``"ray"``, and one sentence for the run's log.

    Raises:
        ExecutorError: unknown kind.
    """
    if kind in ("inline", "ray"):
        return kind, f"executor: {kind} (the config's)"
    if kind != "auto":
        raise ExecutorError(f"executor={kind!r}: allowed: auto, inline, ray")
    if backend != "local":
        return "inline", f"executor auto: inline (the {backend} backend: set executor: ray to run its jobs on Ray)"
    if importlib.util.find_spec("ray") is None:
        return "inline", "executor auto: inline (Ray is not installed: pip install 'ray>=2.40' to train branches " \
                         "side by side)"
    cpus, per = _cpus(), max(1, threads or 1)
    n = min(max_parallel, cpus // per)
    if n < 2:
        return "inline", (f"executor auto: inline ({cpus} CPU(s) for branches of {per} thread(s): fewer than 2 "
                          "side by side)")
    need = n * (4 * max(0, weights_bytes or 0) + BRANCH_OVERHEAD_BYTES)
    avail = _mem_available()
    if avail is not None and avail < need:
        return "inline", (f"executor auto: inline ({n} branches side by side need ~{need / 2**30:.1f} GiB, "
                          f"{avail / 2**30:.1f} GiB available)")
    return "ray", (f"executor auto: ray, {n} branches of {per} thread(s) side by side (~{need / 2**30:.1f} GiB of "
                   f"{'an unknown' if avail is None else f'{avail / 2**30:.1f} GiB'} available)")


def make_executor(kind: str = "inline", *, ray_address: str | None = None, max_parallel: int = 2,
                  threads: int | None = None, backend: str = "local", **kwargs: Any) -> Executor:
    """An executor by name (``executor:`` of the run config).

    Raises:
        ExecutorError: unknown kind.
    """
    if kind == "inline":
        return InlineExecutor(threads=threads, backend=backend, device=kwargs.get("device"),
                              train_args=kwargs.get("train_args", ()), cli_app=kwargs.get("cli_app", CLI_APP))
    if kind == "ray":
        return RayExecutor(address=ray_address, max_parallel=max_parallel, threads=threads or 1, backend=backend,
                           **kwargs)
    raise ExecutorError(f"executor={kind!r}: allowed: inline, ray")
