"""Seeded-fault scenarios: real GRPO training on the tiny random model, real servers, heuristic brain.

Each scenario seeds one fault in the base recipe of examples/tiny.yaml and checks that the loop
finds it (the finding kind in the base version's diagnosis), proposes the matching kind of fix,
and decides correctly. The tiny random model never solves arithmetic (held-out Avg@k is 0), so no
child can show a held-out gain: "fixed" is checked on the metric the fault moves, and the
SmolLM2 versions of these scenarios run with ``scripts/fault_scenarios.py`` (docs/scenarios.md).

The too-easy-data scenario runs in the fast suite; the others are marked slow.
"""

from __future__ import annotations

import pytest

from evotrainer.agents.runner import run_loop
from evotrainer.config import load_run_config
from evotrainer.recipe import set_path
from evotrainer.workspace import Workspace


def _scenario(tmp_path, changes: dict, max_versions: int = 2, branches: int = 1, steps: int = 8):
    cfg = load_run_config("examples/tiny.yaml")
    recipe = cfg.recipe
    for path, value in changes.items():
        recipe = set_path(recipe, path, value)
    cfg = cfg.model_copy(update={"recipe": recipe, "budget": cfg.budget.model_copy(
        update={"max_versions": max_versions, "branches_per_round": branches, "steps_per_version": steps})})
    run_loop(cfg, tmp_path / "run", "heuristic", "evotrainer", resume=False)
    return Workspace.open(tmp_path / "run")


def _kinds(ws, vid: str, severities=("warn", "blocking")) -> set[str]:
    d = ws.lineage.kv_get(f"loop/diagnose/{vid}") or {}
    return {f["kind"] for f in d.get("findings", []) if f["severity"] in severities}


def test_too_easy_data_zero_variance_found_and_data_fix_proposed(tmp_path):
    # The reward pays 1 for every completion (the empty token occurs in every string): every group
    # is all-equal, as on data far too easy for the policy.
    # (The random model also never stops before the cap, so truncation stands too: the ranking gives
    # each standing finding kind one branch.)
    ws = _scenario(tmp_path, {"reward.correctness.weight": 0.0, "reward.format_token.weight": 1.0,
                              "reward.format_token.params": {"token": ""}, "generate_max_len": 4},
                   max_versions=3, branches=2)
    assert "zero_variance_groups" in _kinds(ws, "v0")
    prop = ws.lineage.kv_get("loop/r1/propose")
    paths = [c["path"] for c in prop["candidates"]]
    assert any(p in ("dynamic_filtering", "data.level", "data.difficulty_band", "group_filter_top_p") for p in paths)
    kids = [v for v in ws.lineage.versions() if v.parent_id and not v.is_control]
    assert "data" in [v.interventions[0].category for v in kids], [v.interventions[0].describe() for v in kids]
    assert all(v.status in ("kept", "pruned") and ws.lineage.decisions(v.id) for v in kids)
    ws.close()


@pytest.mark.slow
def test_truncation_found_and_a_longer_budget_trained(tmp_path):
    ws = _scenario(tmp_path, {"generate_max_len": 2})
    assert "truncation" in _kinds(ws, "v0")
    child = ws.lineage.get("v1")
    assert child.interventions[0].path in ("generate_max_len", "reward.overlong.weight")
    if child.interventions[0].path == "generate_max_len":
        assert child.recipe.generate_max_len > 2
    ws.close()


@pytest.mark.slow
def test_lr_too_high_entropy_collapse_found_branch_not_kept(tmp_path):
    # A reward with variance so the advantages are non-zero and the oversized steps (lr 0.05 vs 1e-4)
    # move the policy: a space in a 2-token completion of the random model (~3 in 4 samples).
    ws = _scenario(tmp_path, {"actor_learning_rate": 0.05, "generate_max_len": 2, "n_samples_per_prompt": 4,
                              "rollout_batch_size": 4, "reward.format_token.weight": 1.0,
                              "reward.format_token.params": {"token": " "}}, max_versions=2)
    kinds = _kinds(ws, "v0")
    assert kinds & {"entropy_collapse", "template_collapse", "length_collapse", "nan_blowup", "kl_blowup"}, kinds
    prop = ws.lineage.kv_get("loop/r1/propose")
    assert any(c["path"] == "actor_learning_rate" and c["new"] < 0.05 for c in prop["candidates"])
    # no intervention trained at lr 0.05 is kept unless it beat its control on held-out (it cannot: Avg@k is 0);
    # the control arm continues the parent's lr-0.05 recipe by design (issue 16: continuing is a decision too)
    # and may be kept only with no damaged-weights finding of its own (those are never waived)
    for v in ws.lineage.versions():
        if v.parent_id and v.recipe.actor_learning_rate >= 0.05:
            if v.is_control and v.status == "kept":
                g = ws.lineage.kv_get(f"loop/rgate/{v.id}")
                assert not {b["kind"] for b in g["blocking"]} & {"entropy_collapse", "nan_blowup", "kl_blowup"}
            else:
                assert v.status != "kept"
    ws.close()


@pytest.mark.slow
def test_leaky_reward_named_reward_hacking_branch_never_kept(tmp_path):
    # format_token pays for the letter "a" whatever the answer (a leaky reward the policy can farm): the
    # random model writes it in ~half of its 2-token completions, a 3e-3 step makes it farm it (0.47 -> 1.0
    # in 12 steps) while correctness stays 0. 12 steps x 32 rollouts: enough points for a Mann-Kendall trend.
    ws = _scenario(tmp_path, {"reward.format_token.weight": 1.0, "reward.format_token.params": {"token": "a"},
                              "actor_learning_rate": 3e-3, "generate_max_len": 2, "n_samples_per_prompt": 4,
                              "rollout_batch_size": 8}, max_versions=3, branches=2, steps=12)
    d = ws.lineage.kv_get("loop/diagnose/v0")
    hack = [f for f in d["findings"] if f["kind"] == "reward_hacking" and f["severity"] == "blocking"]
    assert hack and "reward/format_token/mean" in hack[0]["evidence"], d["findings"]
    prop = ws.lineage.kv_get("loop/r1/propose")
    assert any(c["path"] == "reward.format_token.weight" and c["new"] == 0 for c in prop["candidates"]), prop
    # the fix of the term the finding names ranks first (evidence-targeted), ahead of skills' generic fixes
    first = ws.lineage.get("v1").interventions[0]
    assert (first.path, first.new) == ("reward.format_token.weight", 0.0)
    for v in ws.lineage.versions():
        leaky = (v.recipe.reward.get("format_token") is not None and v.recipe.reward["format_token"].weight > 0)
        if v.parent_id and leaky:
            assert v.status != "kept", (v.id, v.status)
    ws.close()
