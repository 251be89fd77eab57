"""`evotrainer import PATH --run DIR`: a foreign run becomes a run folder the MCP tools work on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mcp_testlib import SyncClient

from evotrainer.servers.app import build_server

DATA = Path(__file__).parent / "data"
VERL_LOG = DATA / "verl_logs" / "Qwen2.5-0.5B-bsz256_2-prompt512-resp256-0.538.log.gz"
TRL_RUN = DATA / "ingest" / "trl_run"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True,
                          env={"COLUMNS": "80", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}, timeout=300)


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("verl") / "run"
    r = cli("import", str(VERL_LOG), "--run", str(run))
    assert r.returncode == 0, r.stderr
    # 437 non-empty log lines, 435 of them "step:N - ..." lines (steps 0..434), 42 metric names
    assert r.stdout.splitlines() == [
        f"imported {VERL_LOG} into {run} as v0: 435 steps, 42 metrics, 0 rollouts, 437 log lines; "
        # grad_spike is info since issue 17 (no harm follows the spikes); steps 7, 11, 12 have one reward but
        # spread advantages (the critic's baseline), an info note, not zero-variance groups
        "findings: entropy_collapse [warn], grad_spike [info], zero_variance_groups [info]",
        f"serve it: evotrainer serve all --run {run}",
    ]
    return run


def test_mcp_tools_work_on_an_imported_verl_log(verl_run):
    c = SyncClient(build_server("all", verl_run))
    try:
        s = c.ok("get_metric_series", {"version_id": "v0", "name": "reward/mean", "max_points": 1000})
        assert s["n_raw"] == 435 and s["points"][1] == {"step": 1, "value": 0.004, "min": 0.004, "max": 0.004, "n": 1}
        # the log line of step 1 ("step:1 - ..."; "step:10 - " does not contain it) is a run-log record
        logs = c.ok("search_logs", {"query": "step:1 -"})
        assert logs["total"] == 1 and "critic/score/mean:0.004" in logs["records"][0]["message"]
        found = c.ok("run_analyzer", {"version_ids": ["v0"]})
        # the same findings as `diagnose` on the log: the placeholder recipe is not judged (no truncation
        # against its 64-token generate_max_len)
        assert [(f["kind"], f["severity"]) for f in found["findings"]] == [
            ("entropy_collapse", "warn"), ("grad_spike", "info"), ("zero_variance_groups", "info")]
        v0 = c.ok("get_version", {"version_id": "v0"})
        assert v0["status"] == "trained" and [f["kind"] for f in v0["findings"]] == [
            "entropy_collapse", "grad_spike", "zero_variance_groups"]
    finally:
        c.close()


def test_import_a_trl_output_folder(tmp_path):
    run = tmp_path / "run"
    r = cli("import", str(TRL_RUN), "--run", str(run), "--json")
    assert r.returncode == 0, r.stderr
    c = SyncClient(build_server("all", run))
    try:
        assert c.ok("sample_rollouts", {"version_id": "v0"})["total"] == 4
        # rewards = accuracy + format per completion: 1+1, 0+1, 1+0, 1+1 -> mean 6/4 = 1.5 at step 5
        s = c.ok("get_metric_series", {"version_id": "v0", "name": "reward/mean"})
        assert s["points"] == [{"step": 5, "value": 1.5, "min": 1.5, "max": 1.5, "n": 1}]
        # one step: truncation and zero variance are judged as levels (nothing wrong: no finding); only the
        # length trend says it needs 8 points (an info note)
        assert {f["kind"] for f in c.ok("run_analyzer", {})["findings"]} == {"length_collapse"}
    finally:
        c.close()


def test_import_errors(tmp_path, verl_run):
    r = cli("import", str(VERL_LOG), "--run", str(verl_run))
    assert r.returncode == 1 and r.stderr == f"error: {verl_run} holds a run already; import into a new folder\n"
    r = cli("import", str(verl_run), "--run", str(tmp_path / "x"))
    assert r.stderr == (f"error: {verl_run} is an EvoTrainer run folder already; serve it directly with "
                        f"--run {verl_run}\n")
    r = cli("import", str(tmp_path / "nope.log"), "--run", str(tmp_path / "y"))
    assert r.returncode == 1 and r.stderr == f"error: {tmp_path / 'nope.log'}: no such file or folder\n"
    bad = tmp_path / "bad.log"
    bad.write_text("not a training log\n")
    r = cli("import", str(bad), "--run", str(tmp_path / "z"))
    assert r.returncode == 1 and r.stderr.startswith(f"error: {bad}: no training metrics found (tried: verl 'step:N - key:value' lines")
    assert not (tmp_path / "z").exists()  # read first, create the run folder only when there is a run


def test_an_imported_run_has_no_weights_to_evaluate_or_train(verl_run):
    # `eval v0 --run IMPORTED` loaded the placeholder recipe's SmolLM2 and filed its score as the verl run's v0
    r = cli("eval", "v0", "--run", str(verl_run))
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        f"error: cannot evaluate v0: the run was imported from {VERL_LOG} (metrics, rollouts and logs only: no "
        "weights, and a placeholder recipe, not the one it trained with); evaluate the run's own checkpoint with "
        "`evotrainer eval CHECKPOINT_DIR --recipe RECIPE.yaml`, or train it in a new run folder "
        "(`evotrainer init DIR --recipe RECIPE.yaml`)")
    c = SyncClient(build_server("all", verl_run))
    try:
        assert "eval_summary" not in c.ok("get_version", {"version_id": "v0"}) or not c.ok(
            "get_version", {"version_id": "v0"})["eval_summary"]  # nothing was filed under v0
        # training v0 itself would have started the placeholder's base model from scratch
        job = c.ok("start_training", {"version_id": "v0", "steps": 1, "wait_s": 60})
        assert job["status"] == "failed" and "cannot train v0: the run was imported" in job["message"], job
        assert c.ok("get_version", {"version_id": "v0"})["status"] == "trained"  # refused before it started
    finally:
        c.close()
