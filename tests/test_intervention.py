"""Interventions: exactly one path, stale / no-op detection, merge conflicts (exact messages)."""

from __future__ import annotations

import pytest

from evotrainer.intervention import Intervention, InterventionError, apply_all, category_of, change_key, merge
from evotrainer.recipe import Recipe, set_path


def test_between_builds_single_factor_change():
    r = Recipe()
    iv = Intervention.between(r, set_path(r, "eps_clip_high", 0.3), hypothesis="more exploration")
    assert (iv.path, iv.old, iv.new, iv.category) == ("eps_clip_high", 0.28, 0.3, "optimizer")


def test_between_rejects_zero_or_several_changes():
    r = Recipe()
    with pytest.raises(InterventionError) as e:
        Intervention.between(r, r)
    assert str(e.value) == (
        "an intervention changes exactly one recipe path; these recipes differ in 0 (none): "
        "split it into single-factor interventions"
    )
    two = set_path(set_path(r, "temperature", 0.7), "data.level", 2)
    with pytest.raises(InterventionError) as e:
        Intervention.between(r, two)
    assert str(e.value) == (
        "an intervention changes exactly one recipe path; these recipes differ in 2 (data.level, temperature): "
        "split it into single-factor interventions"
    )


def test_apply_checks_old_value_and_validates():
    r = Recipe()
    stale = Intervention(path="temperature", old=0.5, new=0.7, category="rollout")
    with pytest.raises(InterventionError) as e:
        stale.apply(r)
    assert str(e.value) == (
        "intervention on temperature: expected old value 0.5 but the recipe has 1.0; rebuild it from the current recipe"
    )
    noop = Intervention(path="temperature", old=1.0, new=1.0, category="rollout")
    with pytest.raises(InterventionError, match="new value equals old value 1.0; it changes nothing"):
        noop.apply(r)
    bad = Intervention(path="n_samples_per_prompt", old=8, new=1, category="rollout")
    with pytest.raises(InterventionError) as e:
        bad.apply(r)
    assert str(e.value) == (
        "intervention on n_samples_per_prompt: recipe.n_samples_per_prompt=1: group-relative advantages need "
        "at least 2 samples per prompt; set 2 or more"
    )
    section = Intervention(path="data", old=r.data.model_dump(mode="json"), new={"level": 2}, category="data")
    with pytest.raises(InterventionError) as e:
        section.apply(r)
    assert str(e.value) == "intervention on data changes 1 leaf path(s) (data.level); point it at one leaf field"


def test_merge_composes_independent_and_rejects_conflicts():
    r = Recipe()
    a = Intervention(path="temperature", old=1.0, new=0.8, category="rollout")
    b = Intervention(path="data.level", old=1, new=2, category="data")
    merged = merge(a, b)
    child = apply_all(r, merged)
    assert (child.temperature, child.data.level) == (0.8, 2)
    c = Intervention(path="temperature", old=1.0, new=1.2, category="rollout")
    with pytest.raises(InterventionError) as e:
        merge(a, c)
    assert str(e.value) == (
        "merge conflict on temperature: one sibling sets 0.8, the other temperature=1.2; "
        "merge only interventions on independent paths"
    )
    with pytest.raises(InterventionError, match="both siblings set it to 0.8; they are the same intervention"):
        merge(a, Intervention(path="temperature", old=1.0, new=0.8, category="rollout"))


def test_categories():
    assert category_of("reward.format.weight") == "reward"
    assert category_of("data.difficulty_band") == "data"
    assert category_of("generate_max_len") == "rollout"
    assert category_of("actor_learning_rate") == "optimizer"
    assert category_of("tool_use.max_turns") == "tool_use"


def test_change_key_is_the_one_identity_of_a_change():
    iv = Intervention(path="temperature", old=1.0, new=1.2, category="rollout")
    assert iv.key() == change_key("temperature", 1.2) == "temperature=1.2"
    assert change_key("data.difficulty_band", (0.1, 0.9)) == change_key("data.difficulty_band", [0.1, 0.9])
    assert change_key("reward.format.params", {"b": 1, "a": 2}) == 'reward.format.params={"a": 2, "b": 1}'
