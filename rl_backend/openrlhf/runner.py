"""Run and follow OpenRLHF jobs: Ray Jobs API or a local subprocess; check commands with OpenRLHF's own parser.

:func:`submit` starts an :class:`~evotrainer.rl_backend.openrlhf.job.OpenRLHFJob` through
``ray.job_submission.JobSubmissionClient`` (imported lazily; ``ray`` comes with the ``openrlhf``
extra) when ``job.ray_address`` is set, else as a local subprocess in its own session (output in
``job_dir/job.log``, exit code in ``job_dir/exit_code``); started by a Ray worker of
:mod:`evotrainer.executor`, that subprocess joins the worker's cluster (:func:`_executor_cluster_env`). :func:`job_status`, :func:`job_logs` and
:func:`cancel_job` take the reference :func:`submit` returned (``ray:<id>`` | ``local:<pid>``).

:func:`load_parser` / :func:`check_job` execute the argument-parsing part of OpenRLHF's
``openrlhf/cli/train_ppo_ray.py`` (installed, or a source file of another release) without
importing its GPU dependencies, so a dry run and the tests validate commands against the real
parser and checks of each supported version.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import importlib.util
import io
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from evotrainer.rl_backend.openrlhf.job import PINNED_VERSION, OpenRLHFError, OpenRLHFJob


# --- submission -----------------------------------------------------------------------------------
def _ray_client(address: str):
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise OpenRLHFError("submitting to Ray needs the ray package: pip install 'evotrainer[openrlhf]'") from None
    try:
        return JobSubmissionClient(address)
    except ConnectionError as exc:
        raise OpenRLHFError(f"cluster.ray_address={address!r}: cannot reach the Ray dashboard ({exc}); "
                            "start the cluster (`ray start --head`) or fix the address") from None
    except RuntimeError as exc:  # e.g. ray without its [default] extra (no aiohttp / requests)
        raise OpenRLHFError(f"Ray Jobs client unavailable: {exc}; pip install 'evotrainer[openrlhf]'") from None


def submit(job: OpenRLHFJob) -> str:
    """Start the job; returns a reference: ``ray:<submission id>`` or ``local:<pid>``.

    Local runs write ``job_dir/job.log`` and ``job_dir/exit_code`` and run in their own session.

    Raises:
        OpenRLHFError: ray is not installed or the job could not be started.
    """
    if job.ray_address:
        sid = _ray_client(job.ray_address).submit_job(entrypoint=job.entrypoint, runtime_env=job.runtime_env,
                                                      metadata={"evotrainer_version": job.version_id})
        return f"ray:{sid}"
    d = Path(job.job_dir)
    (d / "exit_code").unlink(missing_ok=True)
    (d / "cancelled").unlink(missing_ok=True)
    script = f"{job.entrypoint} > job.log 2>&1; echo $? > exit_code"
    env = {**os.environ, **_executor_cluster_env(), **job.env}
    proc = subprocess.Popen(["bash", "-c", script], cwd=d, env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (d / "pid").write_text(str(proc.pid))
    return f"local:{proc.pid}"


def _executor_cluster_env() -> dict[str, str]:
    """``RAY_ADDRESS`` of the Ray cluster this process is a worker of, when it is one.

    A round's OpenRLHF jobs run through :mod:`evotrainer.executor` like the local trainer: the Ray task
    runs ``evotrainer train --backend openrlhf --version X``, which starts the job here as a local
    subprocess. With this address, the job's own ``ray.init()`` joins the executor's cluster, so its actors
    and vLLM engines get GPUs from the same pool as the other branches' jobs (side by side when the
    cluster has the GPUs, queued by Ray's scheduler when not) instead of starting a second cluster on
    GPUs the first one also hands out. Empty outside a Ray worker or when ``RAY_ADDRESS`` is set already.
    """
    ray = sys.modules.get("ray")
    if "RAY_ADDRESS" in os.environ or ray is None or not ray.is_initialized():
        return {}
    return {"RAY_ADDRESS": ray.get_runtime_context().gcs_address}


RAY_STATUS = {"PENDING": "queued", "RUNNING": "running", "SUCCEEDED": "done", "FAILED": "failed", "STOPPED": "cancelled"}


def job_status(job: OpenRLHFJob, ref: str) -> str:
    """``queued`` | ``running`` | ``done`` | ``failed`` | ``cancelled`` of a submitted job."""
    kind, _, ident = ref.partition(":")
    if kind == "ray":
        return RAY_STATUS.get(str(_ray_client(job.ray_address or "").get_job_status(ident)).split(".")[-1], "running")
    d = Path(job.job_dir)
    code = (d / "exit_code").read_text().strip() if (d / "exit_code").exists() else ""
    if code:  # (empty while bash is still writing it)
        return "done" if code == "0" else ("cancelled" if code in ("130", "137", "143") else "failed")
    if _alive(int(ident)):
        return "running"
    return "cancelled" if (d / "cancelled").exists() else "failed"  # gone without writing its exit code


def _alive(pid: int) -> bool:
    try:  # reap it if it is our child (a killed child stays a zombie until its parent waits)
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def job_logs(job: OpenRLHFJob, ref: str) -> str:
    """The job's output so far."""
    kind, _, ident = ref.partition(":")
    if kind == "ray":
        return _ray_client(job.ray_address or "").get_job_logs(ident)
    log = Path(job.job_dir) / "job.log"
    return log.read_text(errors="replace") if log.exists() else ""


def cancel_job(job: OpenRLHFJob, ref: str) -> None:
    """Stop the job (Ray: ``stop_job``; local: SIGTERM to the job's own process group)."""
    kind, _, ident = ref.partition(":")
    if kind == "ray":
        _ray_client(job.ray_address or "").stop_job(ident)
        return
    (Path(job.job_dir) / "cancelled").touch()
    try:
        os.killpg(int(ident), signal.SIGTERM)
    except ProcessLookupError:
        pass


def _main_blocks(source: str | Path | None) -> tuple[Path, list, list]:
    """(source file, statements before ``args = parser.parse_args()``, statements after) of the main block."""
    if source is None:
        spec = importlib.util.find_spec("openrlhf")
        if spec is None or not spec.submodule_search_locations:
            raise OpenRLHFError(f"openrlhf is not installed: pip install --no-deps openrlhf=={PINNED_VERSION}")
        source = Path(list(spec.submodule_search_locations)[0]) / "cli" / "train_ppo_ray.py"
    source = Path(source)
    tree = ast.parse(source.read_text())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    for i, stmt in enumerate(main.body):
        if isinstance(stmt, ast.Assign) and "parse_args" in ast.unparse(stmt.value):
            return source, main.body[:i], main.body[i + 1:]
    raise OpenRLHFError(f"{source}: no parser.parse_args() in its __main__ block")


def _exec(stmts: list, source: Path, ns: dict[str, Any]) -> None:
    keep = [s for s in stmts if not (isinstance(s, ast.ImportFrom) and (s.module or "").startswith("openrlhf"))]
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(source), "exec"), ns)  # noqa: S102 - OpenRLHF's own code


def load_parser(source: str | Path | None = None):
    """OpenRLHF's own ``train_ppo_ray`` argument parser, built from its source without importing its GPU deps.

    Executes only the statements of the ``if __name__ == "__main__":`` block that come before
    ``args = parser.parse_args()`` (``parser = ArgumentParser()``, ``add_argument`` calls).
    ``source`` defaults to the installed package's ``openrlhf/cli/train_ppo_ray.py``.

    Raises:
        OpenRLHFError: openrlhf is not installed and no source was given.
    """
    path, before, _ = _main_blocks(source)
    ns: dict[str, Any] = {"argparse": argparse, "datetime": datetime.datetime}
    _exec(before, path, ns)
    return ns["parser"]


def check_job(job: OpenRLHFJob, source: str | Path | None = None):
    """Run OpenRLHF's own argument handling on the job's command, stopping before ``train(args)``.

    Parses ``job.argv`` with OpenRLHF's parser, then runs the validation that follows it in
    ``train_ppo_ray.py`` (its asserts and defaults; OpenRLHF imports are skipped, ``hierarchize``
    is read from the same release's ``openrlhf/utils/config.py``). Returns the final ``args``
    (nested namespaces for the dotted scheme).

    Raises:
        OpenRLHFError: the parser rejects the command or a check fails (with OpenRLHF's message).
    """
    path, before, after = _main_blocks(source)
    captured: dict[str, Any] = {}
    ns: dict[str, Any] = {"argparse": argparse, "datetime": datetime.datetime, "print": lambda *a, **k: None,
                          "train": lambda args: captured.setdefault("args", args)}
    cfg = path.parent.parent / "utils" / "config.py"
    if cfg.exists():
        exec(compile(cfg.read_text(), str(cfg), "exec"), ns)  # noqa: S102 - defines hierarchize()
    _exec(before, path, ns)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns["args"] = ns["parser"].parse_args(job.argv[3:])
    except SystemExit:
        raise OpenRLHFError(f"OpenRLHF's parser rejected the command: {err.getvalue().strip()}") from None
    try:
        _exec(after, path, ns)
    except AssertionError as exc:
        raise OpenRLHFError(f"OpenRLHF's argument checks failed: {exc}") from None
    return captured.get("args", ns["args"])
