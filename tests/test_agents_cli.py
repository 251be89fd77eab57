"""`evotrainer run` / `report` command-line behaviour: errors are one clear line and a non-zero exit."""

from __future__ import annotations

from typer.testing import CliRunner

from evotrainer.agents.cli import lineage_table
from evotrainer.agents.runner import pick_brain
from evotrainer.cli import main
from evotrainer.config import RunConfig
from evotrainer.intervention import Intervention
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace


def _main(args, monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys, "argv", ["evotrainer", *args])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_claude_brain_without_key_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    code, _, err = _main(["run", "examples/tiny.yaml", "--brain", "claude", "--run-dir", str(tmp_path / "r")],
                         monkeypatch, capsys)
    assert code == 1
    assert "ANTHROPIC_API_KEY" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_bad_config_field_is_named(monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("budget: {max_versions: 0}\n")
    code, _, err = _main(["run", str(bad)], monkeypatch, capsys)
    assert code == 1 and "config.budget.max_versions=0" in err


def test_unknown_mode_is_refused(monkeypatch, capsys):
    code, out, err = _main(["run", "examples/tiny.yaml", "--mode", "magic"], monkeypatch, capsys)
    assert code != 0 and "magic" in (out + err)


def test_pick_brain_auto(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert pick_brain("auto", RunConfig()).name == "heuristic"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    b = pick_brain("auto", RunConfig(claude_model="claude-sonnet-4-6"))
    assert b.name == "claude" and b.model == "claude-sonnet-4-6"
    assert pick_brain("heuristic", RunConfig()).name == "heuristic"


def test_live_lineage_table_lists_versions_with_status(tmp_path):
    from rich.console import Console

    ws = Workspace(tmp_path / "run")
    ws.lineage.create_root(Recipe())
    ws.lineage.branch("v0", Intervention(path="temperature", old=1.0, new=1.2, category="rollout"))
    ws.lineage.update_version("v0", metrics_summary={"reward/mean": 0.25},
                              eval_summary={"avg@k": 0.5, "eval_name": "heldout"})
    ws.lineage.decide("v0", "keep", "root")
    console = Console(record=True, width=140)
    console.print(lineage_table(ws))
    text = console.export_text()
    assert "v0" in text and "kept" in text and "0.250" in text and "0.500" in text
    assert "temperature: 1.0 -> 1.2" in text and "proposed" in text
    CliRunner()  # typer's runner is importable (used by test_report's CLI test)
    ws.close()
