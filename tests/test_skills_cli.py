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


def _skill_ids(app, skills_dir):
    code, out, err = run(app, skills_dir, "list", "--json")
    assert code == 0, err
    return sorted(r["id"] for r in json.loads(out))


def test_add_refuses_an_alias_bomb_value_before_it_is_expanded(app, skills_dir, tmp_path):
    """Review 8 H-R8: a 655-byte skill file whose `value:` is an alias nesting 10 items 9 levels deep (10^9 leaves)
    loaded at once as shared lists and was then expanded when the skill was stored: a MemoryError, a Rust
    allocation abort in LanceDB or minutes. The loader now counts what the aliases expand to while composing and
    refuses the file at the alias that crosses the bound, naming it, its line and the fix; nothing is stored.
    (This test could not finish if the value were expanded.)"""
    lines = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    f = tmp_path / "bomb.yaml"
    f.write_text("value:\n" + "\n".join("  " + ln for ln in lines) + "\nid: bomb\nkind: intervention\n"
                 "name: Bomb\ndescription: An alias bomb, 10^9 leaves once written\nrecipe_path: eps_clip_high\n")
    assert len(f.read_bytes()) == 655
    before = _skill_ids(app, skills_dir)
    code, out, err = run(app, skills_dir, "add", str(f))
    assert code == 1 and out == ""
    assert err.splitlines()[:2] == [
        f"error: {f}: refused: the aliases up to *a4 expand the document by 1,135,768 characters, past the bound "
        "of 1,000,000 (an alias bomb?); write the values out instead of nesting aliases",
        f'  in "{f}", line 7, column 27:']
    assert _skill_ids(app, skills_dir) == before and "bomb" not in before
    # a value that contains itself is refused too (it never ends when written out)
    f.write_text("id: loop\nkind: intervention\nname: Loop\ndescription: A list in itself.\n"
                 "recipe_path: eps_clip_high\nvalue: &v [1, *v]\n")
    code, _, err = run(app, skills_dir, "add", str(f))
    assert code == 1
    assert err.splitlines()[0] == (f"error: {f}: refused: found a recursive alias *v (a value that contains itself); "
                                   "write the value out instead")
    assert _skill_ids(app, skills_dir) == before
    # aliases within the bound still load: a tag list shared by two skills
    f.write_text("skills:\n- id: shared_a\n  kind: procedure\n  name: A\n  description: First.\n"
                 "  tags: &t [math, clip]\n- id: shared_b\n  kind: procedure\n  name: B\n  description: Second.\n"
                 "  tags: *t\n")
    code, out, err = run(app, skills_dir, "add", str(f))
    assert code == 0 and out.strip() == "added 2 skill(s): shared_a, shared_b", err
    code, out, _ = run(app, skills_dir, "show", "shared_b", "--json")
    assert code == 0 and json.loads(out)["skill"]["tags"] == ["math", "clip"]


def test_add_refuses_a_value_of_another_type_than_its_recipe_field(app, skills_dir, tmp_path):
    """Review 8 H-R8: `value:` was never checked against the field of `recipe_path`: a list for the learning rate
    was stored and failed only when a run applied it. The error names the field, the type it takes and the fix."""
    before = _skill_ids(app, skills_dir)
    f = tmp_path / "typed.yaml"
    f.write_text("id: lr_list\nkind: intervention\nname: Two rates\ndescription: A list for a float field.\n"
                 "recipe_path: actor_learning_rate\nvalue: [0.000001, 0.000002]\n")
    code, _, err = run(app, skills_dir, "add", str(f))
    assert code == 1
    assert err.strip() == (f"error: {f}: entry 0 (lr_list): skill lr_list: value: actor_learning_rate takes a number, "
                           "not [1e-06, 2e-06] (Input should be a valid number); give a number, e.g. 1e-06 "
                           "(the default)")
    # a set rule's value, a choice that is not one, a rule operand that is no number, a mul on a bool field
    for path, value, msg in [
        ("eps_clip_high", "{op: set, value: [0.3, 0.4]}",
         "eps_clip_high takes a number, not [0.3, 0.4] (Input should be a valid number); give a number, e.g. 0.28 "
         "(the default)"),
        ("kl_estimator", "k9", "kl_estimator takes one of 'k1', 'k2', 'k3', not 'k9' (Input should be 'k1', 'k2' or "
                               "'k3'); give one of 'k1', 'k2', 'k3', e.g. \"k3\" (the default)"),
        ("temperature", "{op: mul, by: [2, 3]}", None),
        ("use_kl_loss", "{op: mul, by: 2}", "op mul needs a number at use_kl_loss, found True; set the field first "
                                            "or use {op: set, value: ...}"),
    ]:
        f.write_text(f"id: wrong_type\nkind: intervention\nname: Wrong type\ndescription: x.\n"
                     f"recipe_path: {path}\nvalue: {value}\n")
        code, _, err = run(app, skills_dir, "add", str(f))
        assert code == 1, (path, err)
        if msg is None:  # the rule's own shape, checked by the skill model
            assert err.strip() == (f"error: {f}: entry 0 (wrong_type): skill: skill wrong_type: value rule by=[2, 3]: "
                                   "need a finite number (not .nan or .inf), e.g. {op: mul, by: 2}")
        else:
            assert err.strip() == f"error: {f}: entry 0 (wrong_type): skill wrong_type: value: {msg}", err
    assert _skill_ids(app, skills_dir) == before
    # the right types are stored: an int for a float field, a literal choice, a rule on a number
    f.write_text("skills:\n"
                 "- {id: lr_int, kind: intervention, name: LR, description: x., recipe_path: max_norm, value: 2}\n"
                 "- {id: k2, kind: intervention, name: K2, description: x., recipe_path: kl_estimator, value: k2}\n"
                 "- {id: hot, kind: intervention, name: Hot, description: x., recipe_path: temperature, "
                 "value: {op: mul, by: 1.2}}\n")
    code, out, err = run(app, skills_dir, "add", str(f))
    assert code == 0 and out.strip() == "added 3 skill(s): lr_int, k2, hot", err


@pytest.mark.parametrize(("value", "msg"), [
    (".nan", "value: nan: need a finite number (not .nan or .inf), e.g. 0.5"),
    ("{op: mul, by: .inf}", "value: by=inf: need a finite number (not .nan or .inf), e.g. 0.5"),
    ("{op: add, by: 1, min: -.inf}", "value: min=-inf: need a finite number (not .nan or .inf), e.g. 0.5"),
    ("2026-12-04", "value: datetime.date(2026, 12, 4) (date): not a plain value; give a number, a string, true/false, "
                   "a list or a mapping"),
    ("!!binary MC41", "value: b'0.5' (bytes): not a plain value; give a number, a string, true/false, a list or a "
                      "mapping"),
    ("!!set {0.1: null}", "value: {0.1} (set): not a plain value; give a number, a string, true/false, a list or a "
                          "mapping"),
])
def test_add_refuses_a_value_json_cannot_keep_and_the_memory_stays_readable(app, skills_dir, tmp_path, value, msg):
    """Review 10, K-R10: `value: .nan` was added (stored as `value: null`) and from then on `skills list`, `search`
    and `show` of any skill ended with a raw pydantic ValidationError; `by: .inf` was stored as `by: null`; a date,
    bytes or a set as a string or a list."""
    before = _skill_ids(app, skills_dir)
    f = tmp_path / "nan.yaml"
    f.write_text(f"id: rt-nan\nkind: intervention\nname: t\ndescription: t\nrecipe_path: actor_learning_rate\n"
                 f"value: {value}\n")
    code, _, err = run(app, skills_dir, "add", str(f))
    assert code == 1 and err.strip() == f"error: {f}: entry 0 (rt-nan): {msg}", err
    assert _skill_ids(app, skills_dir) == before


def test_add_refuses_a_count_past_the_store_column(app, skills_dir, tmp_path):
    """`track_record.tried: 10000000000` ended `skills add` in pyarrow's int32 overflow (a traceback)."""
    f = tmp_path / "big.yaml"
    f.write_text("id: rt-big\nkind: procedure\nname: t\ndescription: t\ntrack_record: {m: {tried: 10000000000}}\n")
    code, _, err = run(app, skills_dir, "add", str(f))
    assert code == 1 and err.strip() == (f"error: {f}: entry 0 (rt-big): track_record.m.tried: Input should be less "
                                         "than or equal to 2147483647"), err


def test_list_search_and_show_go_on_past_an_unreadable_row(app, tmp_path):
    """A row stored before the checks (planted here with the table API) is one warning line naming it and the fix;
    the other skills are listed, searched and shown; `show` of it is a one-line error."""
    from evotrainer.skills_db.store import SKILLS, SkillStore, _to_row

    d = tmp_path / "poisoned"
    store = SkillStore(d)
    row = _to_row(seed_skills()[0].model_copy(update={"id": "rt-nan"}), SKILLS)
    row["value"] = "null"
    store._table(SKILLS).add([{**row, "vector": [0.0] * 383 + [1.0]}])
    seed_ids = sorted(s.id for s in seed_skills())
    warning = ("warning: skipped: skills row 'rt-nan' is stored but does not validate (record: skill rt-nan: an "
               "intervention needs value (a literal or {op: ...} rule)); replace it (`evotrainer skills add --replace "
               "FILE` with a skill of id 'rt-nan'), or roll the table back to a version before it (`evotrainer skills "
               "history --table skills`, `evotrainer skills restore VERSION --table skills`)")
    code, out, err = run(app, d, "list", "--json")
    assert code == 0 and sorted(r["id"] for r in json.loads(out)) == seed_ids and err.strip() == warning, err
    code, out, err = run(app, d, "search", row["text"], "--mode", "fts", "--json")
    assert code == 0 and "rt-nan" not in out and json.loads(out) and err.strip() == warning, err
    code, out, err = run(app, d, "show", seed_ids[0])
    assert code == 0 and err == "", err
    code, out, err = run(app, d, "show", "rt-nan")
    assert code == 1 and err.strip() == "error: " + warning.removeprefix("warning: skipped: "), err
