"""`evotrainer swe tasks|check` through the real console script entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evotrainer.rl_backend.swe.tasks import load_taskset


def evotrainer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True, timeout=900)


def test_swe_tasks_json_lists_the_shipped_set():
    r = evotrainer("swe", "tasks", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    ids = [t["instance_id"] for t in data["tasks"]]
    assert ids == [t.instance_id for t in load_taskset()] and len(ids) >= 30
    assert data["manifest"]["seed"] == 0 and data["tasks"][0]["fail_to_pass"] >= 1


def test_swe_check_rejects_an_unknown_policy_in_one_line():
    from typer.testing import CliRunner

    from evotrainer.cli import app

    r = CliRunner().invoke(app, ["swe", "check", "--policy", "genius"])
    assert r.exit_code == 1
    assert r.output.strip() == "error: --policy 'genius': choose from oracle, noop, cheat, loop"


def test_swe_check_oracle_and_noop_on_one_task():
    task = next(t for t in load_taskset() if t.repo == "semver")
    r = evotrainer("swe", "check", "--policy", "oracle", "--policy", "noop", "--tasks", task.instance_id, "--json")
    assert r.returncode == 0, r.stderr
    res = {x["policy"]: x for x in json.loads(r.stdout)["results"]}
    assert res["oracle"]["mean_swe_tests"] == 1.0 and res["oracle"]["mean_reward"] == 1.0
    assert res["oracle"]["findings"] == []
    # noop: hidden tests fail (0), minus the submit-without-test penalty 0.1 -> total -0.1
    assert res["noop"]["mean_swe_tests"] == 0.0 and res["noop"]["mean_reward"] == pytest.approx(-0.1)
    assert res["noop"]["per_task"][0]["stop"] == "submit"


@pytest.mark.slow
def test_oracle_resolves_every_shipped_task():
    r = evotrainer("swe", "check", "--policy", "oracle", "--json")
    assert r.returncode == 0, r.stderr
    (res,) = json.loads(r.stdout)["results"]
    bad = [t["task"] for t in res["per_task"] if t["swe_tests"] != 1.0]
    assert bad == [] and res["episodes"] == len(load_taskset())


@pytest.mark.slow
def test_smollm2_plays_episodes_end_to_end(tmp_path):
    """SmolLM2-135M plays one 2-turn episode: it fails, but turns, token counts and the mask agree."""
    out = tmp_path / "traj.jsonl"
    r = evotrainer("swe", "episodes", "--model", "smollm2-135m-instruct", "--limit", "1", "--max-turns", "2",
                   "--max-new-tokens", "32", "--episode-timeout", "3000", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    acts = [t for t in row["turns"] if t["role"] == "assistant"]
    assert len(acts) == row["stats"]["turns"] == 2 and row["mask_mismatches"] == 0
    assert row["policy_tokens"] == sum(len(t["token_ids"]) for t in acts) <= 64
    assert row["outcome"]["swe_tests"] in (0.0, 1.0) and row["stats"]["calls"] >= 2
