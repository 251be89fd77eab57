"""Core CLI: init, lineage show / diff, recipe validate — exit codes and exact output."""

from __future__ import annotations

import json
import subprocess
import sys

from evotrainer.intervention import Intervention
from evotrainer.workspace import Workspace


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


def test_help_lists_core_commands():
    r = cli("--help")
    assert r.returncode == 0
    for cmd in ("init", "lineage", "recipe"):
        assert cmd in r.stdout


def test_init_show_diff(tmp_path):
    run = tmp_path / "run"
    r = cli("init", str(run))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"created run {run} with base version v0"
    with Workspace(run) as ws:
        ws.lineage.branch("v0", Intervention(path="temperature", old=1.0, new=0.8, category="rollout"))
        ws.lineage.decide("v1", "keep", "gain", author="test")
        ws.lineage.branch_control("v0")
    r = cli("lineage", "show", str(run))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("v0 proposed base")
    assert "v1 kept temperature: 1.0 -> 0.8" in lines[1]
    # a control arm is named as one (as in the report), not "base" like the root
    assert "v2 proposed continue (control)" in lines[2]
    # `--run` as in `lineage diff` (a new user typed `lineage show --run DIR`: "No such option: --run")
    assert cli("lineage", "show", "--run", str(run)).stdout == r.stdout
    r = cli("lineage", "show", str(run), "--json")
    data = json.loads(r.stdout)
    assert data["tree"]["children"][0]["id"] == "v1" and data["decisions"][0]["rationale"] == "gain"
    r = cli("lineage", "diff", "v0", "v1", "--run", str(run), "--json")
    assert json.loads(r.stdout) == [{"path": "temperature", "v0": 1.0, "v1": 0.8}]
    r = cli("lineage", "diff", "v0", "v7", "--run", str(run))
    assert r.returncode == 1
    assert r.stderr.strip() == "error: version 'v7' not found; known versions: v0, v1, v2"


def test_recipe_validate(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("n_samples_per_prompt: 4\n")
    r = cli("recipe", "validate", str(good))
    assert r.returncode == 0
    assert r.stdout.strip() == f"{good}: valid recipe (1 reward components, task arithmetic)"
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_samples_per_prompt: 1\ntemprature: 0.7\n")
    r = cli("recipe", "validate", str(bad))
    assert r.returncode == 1
    err = r.stderr.strip().splitlines()
    assert err[0] == "error: recipe.n_samples_per_prompt=1: group-relative advantages need at least 2 samples per prompt; set 2 or more"
    assert err[1] == "recipe.temprature: unknown field; did you mean 'temperature'?"


def test_missing_run_folder_is_one_clear_line(tmp_path):
    r = cli("lineage", "show", str(tmp_path / "nope"))
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"error: {tmp_path / 'nope'}: not a run folder (no lineage.db); create one with `evotrainer init`, or, for a "
        "run trained elsewhere, `evotrainer import PATH --run RUN`"
    )


def test_exit_code_of_a_command_reaches_the_shell(tmp_path):
    # A command ending with typer.Exit(1) (here: a missing run folder) must exit 1 from the console
    # script too; click returns that code instead of raising when standalone_mode=False.
    script = tmp_path / "exit3.py"
    script.write_text("import sys; sys.exit(3)\n")
    r = cli("sandbox", "run", str(script), "--json")
    assert r.returncode == 3, (r.stdout, r.stderr)


# T1-R19: store text a crafted lineage.db holds reaches the terminal neutralised, never as controls or markup
CRAFTED_ID = "v1\x1b]0;PWNED\x1b\\\x1b[2J[/x]"


def _crafted_run(tmp_path):
    import sqlite3

    from mcp_testlib import make_run

    run = make_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    db.execute("UPDATE versions SET id = ? WHERE id = 'v1'", (CRAFTED_ID,))
    db.commit()
    db.close()
    return run


def test_lineage_show_neutralises_a_crafted_version_id(tmp_path):
    run = _crafted_run(tmp_path)
    r = cli("lineage", "show", str(run))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    assert "v1\\x1b]0;PWNED\\x1b\\\\x1b[2J[/x] proposed" in r.stdout


def test_report_neutralises_a_crafted_version_id(tmp_path):
    from typer.testing import CliRunner

    from evotrainer.cli import app

    run = _crafted_run(tmp_path)
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "\x1b" not in r.stdout
    assert "v1\\x1b]0;PWNED\\x1b\\\\x1b[2J[/x]" in r.stdout.replace("\n", "")


def test_lineage_diff_prints_crafted_ids_and_recipe_values_as_text(tmp_path):
    """`lineage diff` built its table from markup strings: a crafted version id or a stored recipe value holding
    '[/x]' ended it in rich's MarkupError, and ESC reached the terminal."""
    import sqlite3

    run = _crafted_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    (recipe,) = db.execute("SELECT recipe FROM versions WHERE id = ?", (CRAFTED_ID,)).fetchone()
    data = json.loads(recipe)
    data["name"] = "x[/x]\x1b[2J"
    db.execute("UPDATE versions SET recipe = ? WHERE id = ?", (json.dumps(data), CRAFTED_ID))
    db.commit()
    db.close()
    r = cli("lineage", "diff", "v0", CRAFTED_ID, "--run", str(run))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    assert "'x[/x]\\x1b[2J'" in r.stdout and "[/x]" in r.stdout.splitlines()[1]
