"""report_to (rl_backend/trackers.py): W&B (offline) and MLflow (SQLite store) get what TensorBoard gets, read back
with each library's own reader: wandb's ``wandb leet inspect --json`` on the run's .wandb file, MLflow's
``MlflowClient`` on RUN/mlflow/mlflow.db. A tiny random model trains a root for 3 steps and a child for 2 (global
steps 3-4), then the child is evaluated on dev.

wandb and mlflow are optional (``pip install 'evotrainer[tracking]'``; ``make test`` installs them with [dev]): the
tests that read their files skip, saying so, where the package is absent; the config and import checks always run.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evotrainer import cli_errors
from evotrainer import metrics as M
from evotrainer.cli import app
from evotrainer.config import REPORT_TO_KEY, RunConfig, load_run_config
from evotrainer.intervention import Intervention
from evotrainer.recipe import RecipeError, validate_recipe
from evotrainer.rl_backend.base import BackendError
from evotrainer.rl_backend.local import LocalBackend
from evotrainer.rl_backend.tb_writer import hparams_of, samples_markdown
from evotrainer.rl_backend.trackers import TrainTrackers, mlflow_name, mlflow_uri, report_to_of, write_eval
from evotrainer.workspace import Workspace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {"model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 4, "rollout_batch_size": 2,
        "generate_max_len": 4, "init_kl_coef": 0.0, "drop_zero_variance_groups": False,
        "eval": {"k": 2, "max_problems": 2}}


def _have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


needs_wandb = pytest.mark.skipif(not _have("wandb"), reason="wandb not installed (optional report_to tracker: "
                                 "pip install 'evotrainer[tracking]')")
needs_mlflow = pytest.mark.skipif(not _have("mlflow"), reason="mlflow not installed (optional report_to tracker: "
                                  "pip install 'evotrainer[tracking]')")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    if not (_have("wandb") and _have("mlflow")):
        pytest.skip("wandb / mlflow not installed (optional report_to trackers: pip install 'evotrainer[tracking]')")
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # offline: nothing may be sent (port 9: discard)
    ws = Workspace(tmp_path_factory.mktemp("trackers") / "run", writer=True)
    ws.lineage.kv_set(REPORT_TO_KEY, ["tensorboard", "wandb", "mlflow"])
    root = ws.lineage.create_root(validate_recipe(TINY))
    be = LocalBackend(checkpoint_every=100, num_threads=1)
    be.train(ws, root.id, 3)
    child = ws.lineage.branch(root.id, Intervention(path="temperature", old=1.0, new=0.7, category="rollout"))
    be.train(ws, child.id, 2)
    res = be.evaluate(ws, child.id)
    yield ws, root.id, child.id, res
    ws.close()
    mp.undo()


def _wandb_runs(run_dir: Path) -> dict[str, list[dict]]:
    """Every offline run's records, read by wandb's own reader, keyed by the run's display name."""
    out = {}
    for f in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        res = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(f)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        recs = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
        name = next(r["run"]["display_name"] for r in recs if r["type"] == "run")
        out[name] = recs
    return out


def _history(recs: list[dict]) -> list[dict]:
    return [r["history"]["item"] for r in recs if r["type"] == "history"]


@needs_wandb
def test_wandb_offline_runs_hold_the_train_scalars_on_the_global_step_config_and_samples(trained):
    ws, root, child, res = trained
    runs = _wandb_runs(ws.root)
    assert set(runs) == {root, child, f"{child}/heldout"}  # the root's training, the child's, its evaluation
    run = next(r["run"] for r in runs[child] if r["type"] == "run")
    assert run["job_type"] == "train" and run["run_group"] == ws.root.name and run["project"] == "evotrainer"
    config = run["config"]["update"]
    assert config["temperature"] == pytest.approx(0.7) and config["evotrainer/version"] == child
    assert config["evotrainer/parent"] == root
    assert set(hparams_of(ws.lineage.get(child).recipe)) <= set(config)
    hist = _history(runs[child])
    assert [h["_step"] for h in hist] == [3, 4]  # child steps 0, 1 on the lineage-global axis
    stored = [x for _, x in ws.lineage.metric_series(child, M.REWARD_MEAN)]
    assert [h[M.REWARD_MEAN] for h in hist] == pytest.approx(stored, abs=1e-6)
    assert all(h["samples._type"] == "html-file" for h in hist)  # the step's text samples
    media = list(ws.root.glob("wandb/offline-run-*/files/media/html/samples_*.html"))
    text = "".join(p.read_text() for p in media)
    first = ws.rollouts.to_arrow(where=f"version_id = '{child}' AND step = 0 AND split = 'train'").to_pylist()
    assert first and "<th>completion</th>" in text and f"{first[0]['reward']:.3f}" in text
    assert [h["_step"] for h in _history(runs[root])] == [0, 1, 2]


@needs_wandb
def test_wandb_eval_run_has_the_dev_scalars_at_the_last_global_step(trained):
    ws, _, child, res = trained
    recs = _wandb_runs(ws.root)[f"{child}/heldout"]
    assert next(r["run"] for r in recs if r["type"] == "run")["job_type"] == "eval"
    (h,) = _history(recs)
    assert h["_step"] == 4 and h[M.EVAL_AVG_AT_K] == pytest.approx(res.avg_at_k)
    assert h[M.EVAL_PASS_AT_K] == pytest.approx(res.pass_at_k) and h[M.EVAL_PASS_AT_1] == pytest.approx(res.pass_at_1)
    # every file the trackers wrote is under the run folder
    assert not list(ws.root.parent.glob("wandb")) and (ws.root / "wandb").is_dir()


@needs_mlflow
def test_mlflow_store_holds_one_run_per_version_with_params_scalars_eval_and_samples(trained):
    from mlflow.tracking import MlflowClient

    ws, root, child, res = trained
    assert mlflow_uri(ws) == f"sqlite:///{ws.root.resolve() / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=mlflow_uri(ws))
    exp = client.get_experiment_by_name(ws.root.name)
    runs = {r.data.tags["evotrainer.version"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {root, child}  # the evaluation logged into the child's run
    run = runs[child]
    assert run.info.run_name == child and run.data.tags["evotrainer.parent"] == root
    assert run.data.params["temperature"] == "0.7" and run.data.params["model.name_or_path"] == "tiny-random"
    assert run.info.status == "FINISHED"
    hist = client.get_metric_history(run.info.run_id, M.REWARD_MEAN)
    stored = [x for _, x in ws.lineage.metric_series(child, M.REWARD_MEAN)]
    assert [m.step for m in hist] == [3, 4] and [m.value for m in hist] == pytest.approx(stored, abs=1e-6)
    ev = client.get_metric_history(run.info.run_id, "eval/avg_at_k")  # eval/avg@k: MLflow rejects '@'
    assert [(m.step, m.value) for m in ev] == [(4, pytest.approx(res.avg_at_k))]
    assert client.get_metric_history(run.info.run_id, "eval/pass_at_1")[0].value == pytest.approx(res.pass_at_1)
    arts = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
    assert arts == ["samples/step_000003.md", "samples/step_000004.md"]
    first = ws.rollouts.to_arrow(where=f"version_id = '{child}' AND step = 0 AND split = 'train'").to_pylist()
    text = (Path(run.info.artifact_uri.removeprefix("file://")) / "samples" / "step_000003.md").read_text()
    head, rule, *rows = text.splitlines()
    assert "\n".join([head, rule]) == samples_markdown([]) and len(rows) == 3  # the step's first 3 rollouts
    made = {samples_markdown([r]).splitlines()[-1] for r in first}  # each stored rollout as its table row
    assert set(rows) <= made
    assert Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(ws.root.resolve())


@needs_mlflow
@needs_wandb
def test_a_test_split_evaluation_is_never_written(trained):
    from mlflow.tracking import MlflowClient

    ws, _, child, _ = trained
    before = sorted(ws.root.glob("wandb/offline-run-*"))
    assert write_eval(ws, child, {"avg@k": 1.0, "pass@k": 1.0, "pass@1": 1.0}, "test") is None
    assert write_eval(ws, child, {"avg@k": 1.0}, "no_rl_test") is None
    assert sorted(ws.root.glob("wandb/offline-run-*")) == before
    client = MlflowClient(tracking_uri=mlflow_uri(ws))
    exp = client.get_experiment_by_name(ws.root.name)
    for r in client.search_runs([exp.experiment_id]):
        assert not [k for k in r.data.metrics if "test" in k]


def test_mlflow_names_keep_what_mlflow_accepts():
    assert mlflow_name("eval/avg@k") == "eval/avg_at_k" and mlflow_name("eval/no_rl/pass@1") == "eval/no_rl/pass_at_1"
    assert mlflow_name("reward/correctness/mean") == "reward/correctness/mean"
    assert mlflow_name("reward.fmt(weight)") == "reward.fmt_weight_"


def test_report_to_defaults_to_tensorboard_and_takes_trls_spellings(tmp_path):
    assert RunConfig().report_to == ["tensorboard"]
    assert RunConfig(report_to="none").report_to == [] and RunConfig(report_to="tensorboard").report_to == [
        "tensorboard"]
    with pytest.raises(ValueError, match="report_to"):
        RunConfig(report_to=["tensorbaord"])
    with Workspace(tmp_path / "run", writer=True) as ws:
        assert report_to_of(ws) == ["tensorboard"]  # a run folder evotrainer run did not make
        ws.lineage.kv_set(REPORT_TO_KEY, [])
        root = ws.lineage.create_root(validate_recipe(TINY))
        t = TrainTrackers(ws, root.id, root.recipe)
        t.step(0, {M.REWARD_MEAN: 0.5}, [])
        t.close()
        assert t.tb is None and t.others == [] and not list(ws.root.glob("tb/**/events.*"))


class _Hide(importlib.abc.MetaPathFinder):
    """Makes ``wandb`` and ``mlflow`` unimportable, as in an environment without them."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("wandb", "mlflow"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def without_trackers(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [_Hide(), *sys.meta_path])
    for m in [m for m in sys.modules if m.split(".")[0] in ("wandb", "mlflow")]:
        monkeypatch.delitem(sys.modules, m)


def test_a_missing_tracker_package_is_a_config_error_naming_report_to_and_the_fix(tmp_path, without_trackers, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"report_to": ["tensorboard", "wandb"], "recipe": TINY}))
    with pytest.raises(RecipeError) as e:
        load_run_config(cfg)
    msg = str(e.value)
    assert msg.startswith("config.report_to=") and "pip install wandb" in msg and "evotrainer[tracking]" in msg
    assert cli_errors.run(app, ["recipe", "validate", str(cfg)]) == 1  # the CLI's one exit path: `error: <line>`
    err = capsys.readouterr().err
    assert err.startswith("error: config.report_to=") and "pip install wandb" in err and len(err.splitlines()) == 1
    cfg.write_text(yaml.safe_dump({"report_to": "all", "recipe": TINY}))
    with pytest.raises(RecipeError, match=r"report_to lists 'wandb', 'mlflow', but their packages are not installed "
                                          r"here: pip install wandb mlflow-skinny"):
        load_run_config(cfg)


def test_a_missing_tracker_package_fails_the_training_job_with_the_fix(tmp_path, without_trackers):
    with Workspace(tmp_path / "run", writer=True) as ws:
        ws.lineage.kv_set(REPORT_TO_KEY, ["mlflow"])  # e.g. a Ray worker without the package
        root = ws.lineage.create_root(validate_recipe(TINY))
        with pytest.raises(BackendError, match=r"report_to lists 'mlflow', but its package is not installed here: pip install mlflow-skinny"):
            TrainTrackers(ws, root.id, root.recipe)


def test_the_trainer_imports_no_tracker_library_unless_asked():
    code = ("import sys, evotrainer.rl_backend.local, evotrainer.rl_backend.trackers, evotrainer.agents.runner; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'wandb', 'mlflow'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
