"""`evotrainer skills ...`: exit codes and exact JSON of list / search / show, add, history, restore.

Runs the real commands through typer's CliRunner on an app that registers only the skills
commands (skills_db.cli.register), against a skills folder in a temp dir.
"""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from evotrainer.skills_db import cli as skills_cli
from evotrainer.skills_db.embeddings import load_model
from evotrainer.skills_db.seed import seed_skills

FIELDS = ["id", "kind", "name", "score", "addresses", "recipe_path"]


@pytest.fixture(scope="module")
def app():
    load_model()
    a = typer.Typer()

    @a.callback()
    def _root() -> None:  # keeps `skills` a sub-command
        pass

    skills_cli.register(a)
    return a


@pytest.fixture(scope="module")
def skills_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli_skills")


def run(app, skills_dir, *args):
    res = CliRunner().invoke(app, ["skills", "--dir", str(skills_dir), *args])
    return res.exit_code, res.stdout, res.stderr


def test_list_json_exact_fields(app, skills_dir):
    code, out, _ = run(app, skills_dir, "list", "--json")
    assert code == 0
    rows = json.loads(out)
    assert len(rows) == len(seed_skills())
    assert all(list(r) == FIELDS for r in rows)
    by_id = {r["id"]: r for r in rows}
    assert by_id["dynamic_sampling"] == {"id": "dynamic_sampling", "kind": "intervention",
                                         "name": "Dynamic sampling (drop all-correct / all-wrong groups)",
                                         "score": None, "addresses": ["zero_variance_groups"],
                                         "recipe_path": "dynamic_filtering"}
    code, out, _ = run(app, skills_dir, "list", "--kind", "analyzer", "--finding", "grad_spike", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == ["analyzer.grad_spike"]


def test_search_json(app, skills_dir):
    code, out, _ = run(app, skills_dir, "search", "most completions are cut at the max length cap",
                       "--kind", "intervention", "-n", "3", "--json")
    assert code == 0
    rows = json.loads(out)
    assert len(rows) == 3 and all(list(r) == FIELDS for r in rows)
    assert rows[0]["score"] >= rows[1]["score"] >= rows[2]["score"] > 0
    assert any("truncation" in r["addresses"] for r in rows)
    code, _, err = run(app, skills_dir, "search", "x", "--mode", "semantic")
    assert code == 1 and "mode='semantic': allowed modes: hybrid, vector, fts" in err


def test_show_json_and_missing(app, skills_dir):
    code, out, _ = run(app, skills_dir, "show", "kl_estimator_k2", "--json")
    assert code == 0
    obj = json.loads(out)
    assert list(obj)[:6] == FIELDS and obj["recipe_path"] == "kl_estimator" and obj["score"] is None
    assert obj["skill"]["value"] == {"op": "set", "value": "k2"} and "Schulman" in obj["skill"]["source"]
    code, _, err = run(app, skills_dir, "show", "no_such_skill")
    assert code == 1 and err.strip() == "error: no skill 'no_such_skill'; list ids with `evotrainer skills list`"


def test_add_history_restore(app, skills_dir, tmp_path):
    f = tmp_path / "skill.yaml"
    f.write_text("id: cli_skill\nkind: intervention\nname: Top-p 0.9\ndescription: Cut the sampling tail.\n"
                 "addresses: [length_blowup]\nrecipe_path: top_p\nvalue: {op: set, value: 0.9}\nsource: user\n")
    code, out, _ = run(app, skills_dir, "history", "--json")
    assert code == 0
    before = json.loads(out)[-1]["version"]
    code, out, _ = run(app, skills_dir, "add", str(f))
    assert code == 0 and out.strip() == "added 1 skill(s): cli_skill"
    code, _, err = run(app, skills_dir, "add", str(f))
    assert code == 1 and "exist already" in err
    code, out, _ = run(app, skills_dir, "show", "cli_skill", "--json")
    assert json.loads(out)["addresses"] == ["length_blowup"]
    code, out, _ = run(app, skills_dir, "restore", str(before))
    assert code == 0 and out.startswith(f"restored skills to version {before}")
    code, _, err = run(app, skills_dir, "show", "cli_skill")
    assert code == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: Bad Id\nkind: analyzer\nname: x\ndescription: y\n")
    code, _, err = run(app, skills_dir, "add", str(bad))
    assert code == 1 and "entry 0 (Bad Id): id:" in err


def test_add_refuses_a_recipe_path_that_is_no_field(app, skills_dir, tmp_path):
    # `skills add` stored recipe_path 'actor_lr': the typo surfaced only when a run applied the skill
    f = tmp_path / "typo.yaml"
    f.write_text("id: lr_typo\nkind: intervention\nname: Lower LR\ndescription: Lower the learning rate.\n"
                 "recipe_path: actor_learning_rat\nvalue: {op: mul, by: 0.5}\n")
    code, _, err = run(app, skills_dir, "add", str(f))
    assert code == 1
    assert err.strip() == (f"error: {f}: entry 0 (lr_typo): skill lr_typo: recipe_path: recipe.actor_learning_rat: "
                           "no such field path; did you mean 'actor_learning_rate'?")
    code, _, _ = run(app, skills_dir, "show", "lr_typo")
    assert code == 1  # nothing was stored
    # a reward component the recipe does not have yet is a valid path
    f.write_text("id: fmt_on\nkind: intervention\nname: Format reward\ndescription: Pay for the format.\n"
                 "recipe_path: reward.format.weight\nvalue: 0.1\n")
    code, out, err = run(app, skills_dir, "add", str(f))
    assert code == 0, err
