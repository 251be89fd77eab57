"""Experiment trackers of the local trainer: ``report_to`` (TRL's option of the same name) in the run config.

``evotrainer run`` stores the config's ``report_to`` in the run folder (lineage kv
:data:`evotrainer.config.REPORT_TO_KEY`); a run folder without it (``evotrainer init`` + MCP training) reports to
TensorBoard only. Each tracker gets what :mod:`evotrainer.rl_backend.tb_writer` writes to TensorBoard:

- every training step's scalars (our metric names) at the **lineage-global step** (``LineageStore.step_offset``);
- held-out (dev) scalars ``eval/avg@k``, ``eval/pass@k``, ``eval/pass@1`` (``eval/<name>/...`` for other eval
  sets) at the global step of the version's last trained step; never a test-split evaluation
  (:func:`write_eval` refuses the names of :data:`evotrainer.rl_backend.tasks.TEST_EVALS`);
- the recipe's flat fields as hyper-parameters (:func:`~evotrainer.rl_backend.tb_writer.hparams_of`);
- text samples: the first :data:`~evotrainer.rl_backend.tb_writer.N_TEXT_SAMPLES` rollouts of each step.

Where each one writes, all under the run folder and without network:

- ``tensorboard``: ``RUN/tb/<version>`` (:mod:`~evotrainer.rl_backend.tb_writer`);
- ``wandb``: offline runs in ``RUN/wandb/offline-run-*`` (``wandb sync RUN/wandb/offline-run-*`` uploads them
  later). W&B cannot resume a run offline, so a version's training is one run (``job_type`` train, name the
  version id, group the run folder's name, config the recipe) and each of its evaluations another (``job_type``
  eval, name ``<version>/<eval name>``); samples are an HTML table (``wandb.Html``: a ``wandb.Table`` is staged as
  an artifact under the user's home, outside the run folder). System metrics, git and code capture are off, and
  so is wandb's error reporting unless ``WANDB_ERROR_REPORTING`` is set. ``WANDB_PROJECT`` names the project
  (default ``evotrainer``). wandb-core writes its own debug log to ``~/.cache/wandb/logs`` (``WANDB_CACHE_DIR``).
- ``mlflow``: the SQLite store ``RUN/mlflow/mlflow.db`` (MLflow 3 refuses its file store unless
  ``MLFLOW_ALLOW_FILE_STORE`` is set and recommends SQLite), artifacts in ``RUN/mlflow/artifacts``; experiment =
  the run folder's name, one MLflow run per version (tag ``evotrainer.version``; its evaluations and a resumed
  training log into the same run); metric names with characters MLflow rejects are rewritten (``eval/avg@k`` ->
  ``eval/avg_at_k``: :func:`mlflow_name`); samples are ``samples/step_<global step>.md`` artifacts.
  ``mlflow ui --backend-store-uri sqlite:///RUN/mlflow/mlflow.db`` shows them.

wandb and mlflow are imported only when ``report_to`` names them; a missing package is a
:class:`~evotrainer.rl_backend.base.BackendError` naming ``report_to`` and the ``pip install`` fix (the run
config already refuses it at load time: :func:`evotrainer.config.missing_tracker`).
"""

from __future__ import annotations

import html
import importlib
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from evotrainer.config import REPORT_TO_KEY, TRACKERS, missing_tracker
from evotrainer.rl_backend.base import BackendError
from evotrainer.rl_backend.tasks import is_test_eval
from evotrainer.rl_backend.tb_writer import (
    N_TEXT_SAMPLES,
    TEXT_MAX_CHARS,
    TrainWriter,
    hparams_of,
    samples_markdown,
)
from evotrainer.rl_backend.tb_writer import write_eval as tb_write_eval

WANDB_DEFAULT_PROJECT = "evotrainer"
MLFLOW_DIR = "mlflow"  # RUN/mlflow: mlflow.db and artifacts/
VERSION_TAG = "evotrainer.version"  # MLflow tag of a version's run
EVAL_KEYS = ("avg@k", "pass@k", "pass@1")


def report_to_of(ws: Any) -> list[str]:
    """The run folder's trackers (kv :data:`~evotrainer.config.REPORT_TO_KEY`; ``["tensorboard"]`` without it).

    Raises:
        BackendError: the stored value names a tracker that does not exist.
    """
    got = ws.lineage.kv_get(REPORT_TO_KEY)
    names = ["tensorboard"] if got is None else list(got)
    bad = [n for n in names if n not in TRACKERS]
    if bad:
        raise BackendError(f"report_to={names!r} (kv {REPORT_TO_KEY} of {ws.root}): unknown {bad}; allowed: "
                           f"{', '.join(TRACKERS)}")
    return names


def _module(tracker: str, module: str) -> Any:
    """Import ``module`` for ``tracker``, or raise the ``report_to`` error with its ``pip install`` fix."""
    err = missing_tracker(tracker)
    if err:
        raise BackendError(err)
    return importlib.import_module(module)


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


def samples_html(records: list[dict[str, Any]]) -> str:
    """An HTML table of rollouts (prompt, completion, reward, correct), text escaped and cut to
    :data:`~evotrainer.rl_backend.tb_writer.TEXT_MAX_CHARS` like the TensorBoard text samples."""
    rows = "".join(
        f"<tr><td>{html.escape(str(r.get('prompt', ''))[:TEXT_MAX_CHARS])}</td>"
        f"<td><pre>{html.escape(str(r.get('completion', ''))[:TEXT_MAX_CHARS])}</pre></td>"
        f"<td>{float(r.get('reward', math.nan)):.3f}</td><td>{html.escape(str(r.get('correct')))}</td></tr>"
        for r in records)
    return f"<table><tr><th>prompt</th><th>completion</th><th>reward</th><th>correct</th></tr>{rows}</table>"


def eval_scalars(summary: dict[str, Any], eval_name: str) -> dict[str, float]:
    """``{eval/avg@k: ..., eval/pass@k: ..., eval/pass@1: ...}`` of an eval summary (``eval/<name>/...`` for an eval
    set other than ``heldout``), finite values only."""
    prefix = "eval" if eval_name == "heldout" else f"eval/{eval_name}"
    return _finite({f"{prefix}/{k}": summary.get(k) for k in EVAL_KEYS})


# --- wandb ------------------------------------------------------------------------------------------------
class WandbRun:
    """One offline W&B run in ``RUN/wandb`` (see the module docstring)."""

    def __init__(self, ws: Any, version_id: str, recipe: Any, job_type: str, name: str):
        wandb = _module("wandb", "wandb")
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # no crash reports sent anywhere from an offline run
        v = ws.lineage.get(version_id)
        config = {**hparams_of(recipe), "evotrainer/version": version_id, "evotrainer/parent": v.parent_id or ""}
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_machine_info=True,
                                  disable_git=True, save_code=False, x_save_requirements=False)
        self.run = wandb.init(mode="offline", dir=str(Path(ws.root)), project=os.environ.get("WANDB_PROJECT")
                              or WANDB_DEFAULT_PROJECT, group=Path(ws.root).name, job_type=job_type, name=name,
                              config=config, tags=[version_id], reinit="create_new", settings=settings)
        self.wandb = wandb

    def log(self, step: int, scalars: dict[str, float], records: list[dict[str, Any]] | None = None) -> None:
        data: dict[str, Any] = dict(scalars)
        if records:
            data["samples"] = self.wandb.Html(samples_html(records))
        if data:
            self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()


# --- mlflow -----------------------------------------------------------------------------------------------
_MLFLOW_BAD = re.compile(r"[^/\w.\- :]")


def mlflow_name(name: str) -> str:
    """A metric / param name MLflow accepts (slashes, word characters, ``.``, ``-``, space, ``:``): ``@`` becomes
    ``_at_`` (``eval/avg@k`` -> ``eval/avg_at_k``), any other character ``_``."""
    return _MLFLOW_BAD.sub(lambda m: "_at_" if m.group() == "@" else "_", name)


def mlflow_uri(ws: Any) -> str:
    """``sqlite:///RUN/mlflow/mlflow.db`` (the folder is created)."""
    d = Path(ws.root).resolve() / MLFLOW_DIR
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{d / 'mlflow.db'}"


class MlflowRun:
    """The MLflow run of one version in ``RUN/mlflow`` (found by tag, created with the recipe as params)."""

    def __init__(self, ws: Any, version_id: str, recipe: Any):
        tracking = _module("mlflow", "mlflow.tracking")
        entities = _module("mlflow", "mlflow.entities")
        self.Metric = entities.Metric
        self.client = tracking.MlflowClient(tracking_uri=mlflow_uri(ws))
        name = Path(ws.root).name
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(
            name, artifact_location=(Path(ws.root).resolve() / MLFLOW_DIR / "artifacts").as_uri())
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{VERSION_TAG}` = '{version_id}'",
                                        max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            return
        v = ws.lineage.get(version_id)
        run = self.client.create_run(exp_id, run_name=version_id,
                                     tags={VERSION_TAG: version_id, "evotrainer.parent": v.parent_id or "",
                                           "evotrainer.role": v.role})
        self.run_id = run.info.run_id
        params = [entities.Param(mlflow_name(k), str(val)[:6000]) for k, val in hparams_of(recipe).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, step: int, scalars: dict[str, float], records: list[dict[str, Any]] | None = None) -> None:
        now = int(time.time() * 1000)
        metrics = [self.Metric(mlflow_name(k), v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        if records:
            self.client.log_text(self.run_id, samples_markdown(records), f"samples/step_{step:06d}.md")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


# --- the fan-out ------------------------------------------------------------------------------------------
class TrainTrackers:
    """One version's training steps to every tracker of ``report_to`` (TensorBoard: :class:`TrainWriter`)."""

    def __init__(self, ws: Any, version_id: str, recipe: Any):
        names = report_to_of(ws)
        self.offset = ws.lineage.step_offset(version_id)
        self.tb = TrainWriter(ws, version_id, recipe) if "tensorboard" in names else None
        self.others: list[Any] = []
        try:
            if "wandb" in names:
                self.others.append(WandbRun(ws, version_id, recipe, "train", version_id))
            if "mlflow" in names:
                self.others.append(MlflowRun(ws, version_id, recipe))
        except BaseException:
            self.close()
            raise

    def step(self, step: int, metrics: dict[str, Any], records: list[dict[str, Any]]) -> None:
        """Scalars (finite values only) and the text samples of version-local ``step``, at the global step."""
        if self.tb is not None:
            self.tb.step(step, metrics, records)
        scalars = _finite(metrics)
        for t in self.others:
            t.log(self.offset + step, scalars, records[:N_TEXT_SAMPLES])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        for t in self.others:
            t.close()


def write_eval(ws: Any, version_id: str, summary: dict[str, Any], eval_name: str = "heldout") -> int | None:
    """Held-out scalars of one dev evaluation to every tracker of ``report_to``; returns the global step they are
    written at, None for a test evaluation (never written: the test split is sealed during a run).

    ``summary`` is ``EvalResult.summary()`` (keys ``avg@k``, ``pass@k``, ``pass@1``); the step is the global step
    of the version's last trained step (its offset for an untrained version), as in TensorBoard.
    """
    if is_test_eval(eval_name):
        return None
    names = report_to_of(ws)
    lin = ws.lineage
    g = lin.step_offset(version_id) + max(0, lin.last_step(version_id))
    if "tensorboard" in names:
        tb_write_eval(ws, version_id, summary, eval_name)
    scalars = eval_scalars(summary, eval_name)
    recipe = lin.get(version_id).recipe
    if "wandb" in names:
        run = WandbRun(ws, version_id, recipe, "eval", f"{version_id}/{eval_name}")
        try:
            run.log(g, scalars)
        finally:
            run.close()
    if "mlflow" in names:
        ml = MlflowRun(ws, version_id, recipe)
        try:
            ml.log(g, scalars)
        finally:
            ml.close()
    return g
