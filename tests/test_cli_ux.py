"""CLI user experience (issue 20): --version, whole-config validation with "did you mean", tables at 80 columns."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys


def cli(*args, cwd=None, columns: int = 200):
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


def test_version_matches_the_installed_distribution():
    r = cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"evotrainer {importlib.metadata.version('evotrainer')}\n"
    assert r.stdout == "evotrainer 0.1.0\n"  # pyproject.toml's version


# --- recipe validate: whole run configs, reward params, required data fields, did you mean ----------
def _validate(tmp_path, text: str, name: str = "c.yaml"):
    f = tmp_path / name
    f.write_text(text)
    return cli("recipe", "validate", str(f), cwd=tmp_path, columns=80)


def test_run_config_budget_errors_fail(tmp_path):
    r = _validate(tmp_path, "budget:\n  max_versions: 0\n  stepz: 3\nrecipe:\n  n_samples_per_prompt: 4\n")
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "error: config.budget.max_versions=0: Input should be greater than or equal to 1; set a value >= 1",
        "config.budget.stepz: unknown field; allowed: max_versions, steps_per_version, wall_clock_minutes, "
        "branches_per_round",
    ]


def test_run_config_valid_line_is_whole_at_80_columns(tmp_path):
    r = _validate(tmp_path, "mode: static\nbudget: {max_versions: 3, steps_per_version: 2}\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"{tmp_path / 'c.yaml'}: valid run config (mode static, 3 versions x 2 steps; "
                        "recipe: 1 reward components, task arithmetic)\n")


def test_typo_says_did_you_mean_instead_of_listing_fields(tmp_path):
    r = _validate(tmp_path, "recipe:\n  actor_learning_rte: 1.0e-6\n  model: {lora: {rnak: 8}}\n")
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        # no allowed name is close to "rnak" (difflib ratio < 0.6), so the five allowed ones are listed
        "error: config.recipe.model.lora.rnak: unknown field; allowed: enabled, r, alpha, dropout, target_modules",
        "config.recipe.actor_learning_rte: unknown field; did you mean 'actor_learning_rate'?",
    ]


def test_reward_params_are_checked_per_component(tmp_path):
    r = _validate(tmp_path, "reward:\n  correctness: {weight: 1.0, params: {x: 1}}\n"
                            "  overlong: {weight: 0.5, params: {buffer: 4}}\n", "r.yaml")
    assert r.returncode == 1
    # the reward validator stops at the first bad param; a plain recipe file is prefixed "recipe."
    assert r.stderr.splitlines() == [
        "error: recipe.reward.correctness.params.x=1: unknown parameter; 'correctness' takes no params, remove it",
    ]
    r = _validate(tmp_path, "reward:\n  overlong: {params: {buffer: 4}}\n", "r.yaml")
    assert r.stderr.splitlines() == [
        "error: recipe.reward.overlong.params.buffer=4: unknown parameter of 'overlong'; did you mean 'buffer_len'?"]
    r = _validate(tmp_path, "reward:\n  correctness: {}\n  repetition: {weight: -0.1, params: {n: '4'}}\n", "r.yaml")
    assert r.stderr.splitlines() == ["error: recipe.reward.repetition.params.n='4': need an integer, e.g. n: 4"]
    r = _validate(tmp_path, "reward:\n  swe_tests: {params: {mode: any}}\n", "r.yaml")
    assert r.stderr.splitlines() == [
        "error: recipe.reward.swe_tests.params.mode='any': allowed values: 'all' or 'fraction'"]
    r = _validate(tmp_path, "reward:\n  overlong: {params: {max_len: 64, buffer_len: 16, penalty_factor: 1}}\n",
                  "r.yaml")
    assert r.returncode == 0, r.stderr  # an int is accepted where a number (float) is read


def test_required_and_missing_data_path(tmp_path):
    r = _validate(tmp_path, "recipe:\n  data: {task: jsonl}\n")
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "error: config.recipe.data.path=None: task 'jsonl' reads its problems from a file; set data.path to "
        'a JSONL file of {"prompt": ..., "answer": ...} lines']
    r = _validate(tmp_path, "data: {task: gsm8k, path: nope.parquet}\n", "r.yaml")
    assert r.stderr.splitlines() == [
        f"error: recipe.data.path='nope.parquet': no such file or folder (from {tmp_path}); "
        "fix the path or run from the folder it is relative to"]
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    r = _validate(tmp_path, "data: {task: jsonl, path: d.jsonl}\n", "r.yaml")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{tmp_path / 'r.yaml'}: valid recipe (1 reward components, task jsonl)\n"
