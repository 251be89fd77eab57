"""The ``openrlhf`` training backend: a workspace version trained by an OpenRLHF job.

:class:`OpenRLHFBackend` (the :class:`~evotrainer.rl_backend.base.Backend` protocol) ties the pieces
of this package to a workspace: the job of a version (:mod:`evotrainer.rl_backend.openrlhf.job`),
its submission and the check against OpenRLHF's own parser (:mod:`evotrainer.rl_backend.openrlhf.runner`)
and the metrics it logs (:mod:`evotrainer.rl_backend.openrlhf.ingest`). :func:`dry_run` is what
``evotrainer train RECIPE --backend openrlhf --dry-run`` prints.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from evotrainer import metrics as M
from evotrainer.recipe import Recipe, load_recipe
from evotrainer.rl_backend.base import EvalResult, TrainResult, run_data
from evotrainer.rl_backend.openrlhf.ingest import ingest_run, summarize
from evotrainer.rl_backend.openrlhf.job import (
    PINNED_VERSION,
    ClusterSpec,
    OpenRLHFError,
    build_job,
    format_job,
    installed_openrlhf_version,
)
from evotrainer.rl_backend.openrlhf.runner import cancel_job, check_job, job_logs, job_status, submit


def _hf_folder(path: str | None) -> str | None:
    return path if path and (Path(path) / "config.json").exists() else None


class OpenRLHFBackend:
    """The ``openrlhf`` training backend (``rl_backend.base.Backend`` protocol, docs/interfaces.md).

    ``train`` builds the version's job (starting from the parent's checkpoint when it is a HF
    folder, else from the recipe's model), submits it, follows it (ingesting TensorBoard scalars
    and samples every ``poll_s`` seconds, calling ``progress``, cancelling when ``should_stop()``)
    and records status (``trained``; ``failed`` when the job failed or was cancelled), checkpoint
    and ``metrics_summary``. The job reference is kept in the lineage kv store
    (``openrlhf/<version>``: ``{ref, job}``) so another process can follow or cancel it.
    ``evaluate`` reads OpenRLHF's own held-out evaluation of the last step (k samples per
    problem, scored by correctness): Avg@k and pass@k, without per-sample outcomes.

    Args:
        cluster: hardware and submission settings (:class:`~evotrainer.rl_backend.openrlhf.job.ClusterSpec`).
        poll_s: seconds between status polls.
    """

    name = "openrlhf"

    def __init__(self, cluster: Any = None, poll_s: float = 10.0):
        self.cluster = cluster
        self.poll_s = poll_s

    def train(self, ws, version_id: str, steps: int, progress=None, should_stop=None, after_step=None):
        """Train ``version_id`` for ``steps`` OpenRLHF steps; returns a ``rl_backend.base.TrainResult``
        (``stopped_early`` when ``should_stop`` cancelled the job). ``progress`` gets one call per step.
        ``after_step`` (the local trainer's mid-training hook) is not supported: the job runs on Ray.

        Raises:
            OpenRLHFError: the recipe cannot run on OpenRLHF, the job failed (the log tail is in the message), or
                ``after_step`` was given.
        """
        if after_step is not None:
            raise OpenRLHFError("after_step: the OpenRLHF backend has no after-step hook (the job runs on Ray); "
                                "train without it, or with the local backend")
        t0 = time.monotonic()
        v = ws.lineage.get(version_id)
        start = ws.lineage.start_version(version_id)  # the parent, or earlier when its weights are damaged
        parent_ckpt = start.checkpoint if start is not None else None
        job = build_job(v.recipe, ws.root, version_id=version_id, steps=steps, cluster=self.cluster,
                        model_path=_hf_folder(parent_ckpt), pinned=run_data(ws))
        ws.lineage.update_version(version_id, status="training")
        ref = submit(job)
        ws.lineage.kv_set(f"openrlhf/{version_id}", {"ref": ref, "job": job.model_dump()})
        ws.log(f"openrlhf job {ref} submitted ({job.openrlhf_version}, {steps} steps)", version=version_id,
               source="openrlhf")
        nan = float("nan")

        def emit(done: int, new: int) -> None:  # one progress call per new step (NaN: not logged)
            if new <= done or progress is None:
                return
            series = ws.lineage.all_metrics(version_id)
            for step in range(done + 1, new + 1):
                at = {name: dict(pts).get(step) for name, pts in series.items()}
                progress({"step": step, "steps": steps, **{key: nan if at.get(name) is None else at[name]
                          for key, name in (("reward", M.REWARD_MEAN), ("tokens_per_sec", M.PERF_TOKENS_PER_SEC),
                                            ("step_seconds", M.PERF_STEP_SECONDS))}})

        last, stopped = 0, False
        status = job_status(job, ref)
        while status in ("queued", "running"):
            time.sleep(self.poll_s)
            try:
                new = ingest_run(ws, version_id, job.tensorboard_dir, v.recipe.reward, since_step=last)
            except FileNotFoundError:
                new = last
            emit(last, new)
            last = new
            if not stopped and should_stop is not None and should_stop():
                cancel_job(job, ref)
                stopped = True
            status = job_status(job, ref)
        try:
            new = ingest_run(ws, version_id, job.tensorboard_dir, v.recipe.reward, checkpoint=job.save_path,
                             since_step=last)
            emit(last, new)
            last = new
        except FileNotFoundError:
            pass
        summary = summarize(ws, version_id)
        final = "trained" if status == "done" else "failed"
        ws.lineage.update_version(version_id, status=final, metrics_summary=summary)
        ws.log(f"openrlhf job {ref} {status} after {last} step(s)", version=version_id, source="openrlhf",
               level="info" if status in ("done", "cancelled") else "error")
        if status not in ("done", "cancelled"):
            tail = job_logs(job, ref)[-2000:]
            raise OpenRLHFError(f"openrlhf job {ref} of {version_id} ended {status} after {last} step(s); "
                                f"log tail:\n{tail}")
        return TrainResult(version_id=version_id, steps_done=last, steps_requested=steps,
                           checkpoint=ws.lineage.get(version_id).checkpoint, metrics_summary=summary,
                           stopped_early=status == "cancelled", wall_s=round(time.monotonic() - t0, 3))

    def evaluate(self, ws, version_id: str, k: int | None = None, eval_name: str = "heldout",
                 progress=None, first_sample: int = 0):
        """Held-out Avg@k / pass@k (``rl_backend.base.EvalResult``) from OpenRLHF's evaluation at the last
        training step: k samples per problem scored by correctness, so its pass1 is Avg@k (= unbiased
        pass@1) and its pass<k> (max over the k samples) the unbiased pass@k with n = k.

        Raises:
            OpenRLHFError: the version has no OpenRLHF evaluation (not trained here, or no eval step),
                ``k`` differs from the ``recipe.eval.k`` the job evaluated with, or ``first_sample`` > 0 (a top-up:
                OpenRLHF's evaluation stores no per-sample outcomes to add to).
        """
        if first_sample:
            raise OpenRLHFError(f"first_sample={first_sample}: the OpenRLHF job's evaluation keeps no per-sample "
                                "outcomes to top up; top up with the local backend on the checkpoint, or set "
                                "recipe.eval.max_k to null")
        v = ws.lineage.get(version_id)
        if k is not None and k != v.recipe.eval.k:
            raise OpenRLHFError(f"k={k}: the OpenRLHF job evaluated with recipe.eval.k={v.recipe.eval.k}; "
                                "evaluate other k with the local backend on the checkpoint")
        series = ws.lineage.all_metrics(version_id)
        if not series.get(M.EVAL_PASS_AT_1):
            raise OpenRLHFError(f"{version_id}: no OpenRLHF held-out evaluation stored (eval/pass@1); train it with "
                                "the openrlhf backend first")
        job = ws.lineage.kv_get(f"openrlhf/{version_id}") or {}
        held = Path(job["job"]["files"]["heldout"]) if job else None
        n = len(held.read_text().splitlines()) if held is not None and held.exists() else 0
        avg = series[M.EVAL_PASS_AT_1][-1][1]
        passk = series.get(M.EVAL_PASS_AT_K, [(0, avg)])[-1][1]
        res = EvalResult(version_id=version_id, eval_name=eval_name, k=v.recipe.eval.k, avg_at_k=avg,
                         pass_at_k=passk, pass_at_1=avg, n_problems=n, checkpoint=v.checkpoint)
        ws.lineage.update_version(version_id, eval_summary={**res.summary(), "source": "openrlhf", "per_sample": False})
        return res


def dry_run(recipe: Recipe, run_dir: str | Path, *, steps: int = 8, version_id: str = "v0",
            cluster: ClusterSpec | None = None) -> str:
    """What ``evotrainer train RECIPE --backend openrlhf --dry-run`` prints: the job (input files written,
    nothing submitted) and whether the installed OpenRLHF's own parser and checks accept it.

    Raises:
        OpenRLHFError: the recipe cannot be expressed, or the installed OpenRLHF rejects the command.
    """
    job = build_job(recipe, run_dir, version_id=version_id, steps=steps, cluster=cluster)
    text = format_job(job)
    installed = installed_openrlhf_version()
    if installed is None:
        return text + f"\n# not checked: openrlhf is not installed here (pip install --no-deps openrlhf=={PINNED_VERSION})"
    if installed != job.openrlhf_version:
        return text + f"\n# not checked: installed openrlhf {installed} is not the target {job.openrlhf_version}"
    check_job(job)
    return text + f"\n# checked: accepted by the installed OpenRLHF {installed} argument parser and checks"


if __name__ == "__main__":  # pragma: no cover - convenience: python -m ... RECIPE
    print(dry_run(load_recipe(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "runs/openrlhf"))
