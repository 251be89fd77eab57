"""The agents' boundary: the Brain protocol, the one gate rule of every brain and baseline, and the heuristic's
proposals from the seed skills (the one home of the fixes) with the core value rules."""

from __future__ import annotations

from typing import get_args

import pytest

from evotrainer.agents.brain import Brain
from evotrainer.agents.claude import ClaudeBrain
from evotrainer.agents.decisions import Diagnosis, FindingRef, gate_verdict
from evotrainer.agents.heuristic import EXPLORE_SKILLS, ZERO_SUSPECT_REWARD, HeuristicBrain, seed_library
from evotrainer.agents.modes import BRAINS, MODES
from evotrainer.config import RunConfig
from evotrainer.harness.gate import verdict_from_gate
from evotrainer.recipe import Recipe, set_path
from evotrainer.skills_db.seed import seed_skills


class NoTools:
    """Role tools of a server without skills tools: the heuristic falls back to the seed library alone."""

    def has(self, name: str) -> bool:
        return False


def _diag(kind: str, severity: str = "warn", **data) -> Diagnosis:
    return Diagnosis(version_id="v0", findings=[FindingRef(kind=kind, severity=severity, data=data)])


def test_both_brains_are_brains():
    assert isinstance(HeuristicBrain(), Brain)
    assert isinstance(ClaudeBrain(api_key="k"), Brain)
    assert not isinstance(object(), Brain)


def test_modes_and_brains_are_the_run_configs():
    assert MODES == get_args(RunConfig.model_fields["mode"].annotation)
    assert BRAINS == get_args(RunConfig.model_fields["brain"].annotation)


@pytest.mark.parametrize("gate", [
    {"promote": True, "parent_id": "v0", "gain": 0.1, "ci": [0.02, 0.2], "reason": "promote: x"},
    {"promote": True, "parent_id": None, "gain": None, "reason": "root"},
    {"promote": False, "parent_id": "v0", "gain": -0.1, "ci": [-0.2, 0.01], "reason": "gain not established"},
    {"promote": False, "reason": "blocked by truncation", "blocking": [{"kind": "truncation"}]},
])
def test_every_decider_applies_the_gate_rule(gate):
    action, _ = verdict_from_gate("v1", gate)
    assert gate_verdict("v1", gate).action == action
    assert HeuristicBrain().decide(None, "v1", gate, Diagnosis(version_id="v1")).action == action
    # a blocking finding of the diagnosis blocks even where the gate did not count it
    blocked = HeuristicBrain().decide(None, "v1", gate, _diag("reward_hacking", "blocking"))
    assert blocked.action == "prune" and (action == "prune" or "reward_hacking" in blocked.rationale)


def test_the_heuristic_proposes_the_seed_skills_of_a_finding():
    recipe = Recipe()
    prop = HeuristicBrain().propose(NoTools(), "v0", recipe, _diag("truncation"), set(), {})
    by_id = {s.id: s for s in seed_skills()}
    assert prop.candidates and all(c.source.startswith("skill:") for c in prop.candidates)
    for c in prop.candidates:
        assert by_id[c.source.split(":", 1)[1]].recipe_path == c.path and "truncation" in c.addresses
    assert [c.key() for c in prop.candidates] == ["generate_max_len=128", "reward.overlong.weight=1.0"]


def test_a_tiny_learning_rate_is_cut_not_dropped():
    # lr 1e-10 on an update far too large: /10 is 1e-11 (a fixed number of decimals made it 0: dropped)
    recipe = set_path(Recipe(), "actor_learning_rate", 1e-10)
    prop = HeuristicBrain().propose(NoTools(), "v0", recipe, _diag("update_too_large"), set(), {})
    lrs = sorted(c.new for c in prop.candidates if c.path == "actor_learning_rate")
    assert lrs == [1e-11, pytest.approx(1e-10 / 3)]


def test_integer_fields_stay_integers_in_proposals():
    recipe = set_path(Recipe(), "n_samples_per_prompt", 40)
    prop = HeuristicBrain().propose(NoTools(), "v0", recipe, _diag("update_too_small"), set(), {})
    n = [c.new for c in prop.candidates if c.path == "n_samples_per_prompt"]
    assert n == [64] and isinstance(n[0], int)  # 40 x 2 clamped to the skill's max 64


def test_suspect_reward_terms_and_exploration_come_from_the_seed_library():
    ids = {s["id"] for s in seed_library()}
    assert ZERO_SUSPECT_REWARD in ids and set(EXPLORE_SKILLS) <= ids
    recipe = set_path(Recipe(), "reward.format_token.weight", 1.0)
    diag = Diagnosis(version_id="v0", findings=[FindingRef(kind="reward_hacking", severity="blocking",
                                                           evidence=["reward/format_token/mean"])])
    prop = HeuristicBrain().propose(NoTools(), "v0", recipe, diag, set(), {})
    assert "reward.format_token.weight=0.0" in [c.key() for c in prop.candidates]
    explore = HeuristicBrain().propose(NoTools(), "v0", Recipe(), Diagnosis(version_id="v0"), set(), {})
    assert [c.source for c in explore.candidates] == [f"skill:{s}" for s in EXPLORE_SKILLS[:3]]  # 0.28: the default


def test_a_superseded_control_is_pruned_as_superseded_not_as_a_gain_not_established():
    # the control's CI over its parent cleared 0, but a change beat it: the headline said "held-out gain not
    # established (+0.083, 95% CI [+0.031, +0.135])", contradicting its own numbers
    gate = {"promote": False, "gain": 0.083, "ci": [0.031, 0.135], "p_value": 0.01, "blocking": [],
            "reason": "superseded: v1, v2 beat this control (dev gain over the parent +0.083 [+0.031, +0.135])"}
    v = gate_verdict("v3", gate)
    assert v.action == "prune"
    assert v.rationale == ("prune v3: superseded: v1, v2 beat this control (dev gain over the parent +0.083 "
                           "[+0.031, +0.135])")
