"""The skills memory understands users' words (issue 17): a symptom typed in plain language, the way
a user describes a run, finds a skill for that failure kind in the top 3 of `evotrainer skills search`
(hybrid search, the CLI's default). Phrasings are our own, across every built-in kind; the seed
descriptions were written with the words users use, not with these sentences."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from evotrainer.skills_db import cli as skills_cli
from evotrainer.skills_db.embeddings import load_model
from evotrainer.skills_db.store import SkillStore

PHRASINGS = [
    ("truncation", "my responses keep getting cut off at max length"),
    ("truncation", "half of my generations stop abruptly because they reach the token limit"),
    ("truncation", "responses are chopped off before the boxed answer"),
    ("length_collapse", "completions are getting shorter and shorter"),
    ("length_collapse", "outputs became one word"),
    ("length_collapse", "the model now answers with just a number and no working"),
    ("length_collapse", "replies got really brief after a few hundred steps"),
    ("length_blowup", "outputs keep getting longer until they hit the limit"),
    ("entropy_collapse", "policy became deterministic, it stopped exploring"),
    ("zero_variance_groups", "every rollout in the group is wrong so there is no gradient"),
    ("zero_variance_groups", "the model solves every problem, reward stuck at 1"),
    ("nan_blowup", "I get nan loss"),
    ("kl_blowup", "kl keeps growing exponentially"),
    ("reward_hacking", "the model found a shortcut to get reward"),
    ("train_eval_divergence", "reward is high on training data but eval accuracy does not improve"),
    ("grad_spike", "grad_norm is sometimes 100x larger than usual"),
    ("template_collapse", "the model outputs the same boilerplate for every input"),
]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    load_model()
    return SkillStore(tmp_path_factory.mktemp("phrasing"))


@pytest.mark.parametrize(("kind", "phrase"), PHRASINGS, ids=[p for _, p in PHRASINGS])
def test_plain_words_find_a_skill_of_the_kind_in_the_top_3(seeded, kind, phrase):
    hits = seeded.search(phrase, mode="hybrid", limit=3)
    assert any(kind in h.skill.addresses for h in hits), [(h.skill.id, h.skill.addresses) for h in hits]


def test_the_cli_search_answers_a_user_phrasing(tmp_path):
    load_model()
    app = typer.Typer()

    @app.callback()
    def _root() -> None:  # keeps `skills` a sub-command
        pass

    skills_cli.register(app)
    res = CliRunner().invoke(app, ["skills", "--dir", str(tmp_path), "search", "outputs became one word", "--limit",
                                   "3", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 3 and any("length_collapse" in r["addresses"] for r in rows), rows
