"""From a progress finding to the heuristic's proposal, through the real MCP servers and seed skills
(issue 16): an "update too small" v0 gets a multiplicative learning-rate raise first, an "update too
large" one a cut; candidates that do not apply to the run's task (test_file_edit on arithmetic) are
never proposed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evotrainer import metrics as M
from evotrainer.agents.backtester import Backtester
from evotrainer.agents.decisions import Candidate, Diagnosis, FindingRef, Proposal
from evotrainer.agents.heuristic import HeuristicBrain
from evotrainer.agents.intervener import Intervener, task_mismatch
from evotrainer.agents.mcp_client import RoleTools, ToolBox
from evotrainer.recipe import Recipe, set_path
from evotrainer.workspace import Workspace

RUN = json.loads((Path(__file__).parent / "data" / "progress" / "smollm2_default_lr2e-6.json").read_text())


def _flat(n, **vals):
    return {name: [[i, x] for i in range(n)] for name, x in vals.items()}


TOO_LARGE = _flat(8, **{M.POLICY_UPDATE_KL: 0.06, M.POLICY_UPDATE_CLIP_FRAC: 0.25, M.REWARD_KEPT_GROUP_FRAC: 1.0,
                        M.REWARD_FRAC_ZERO_STD: 0.0, M.POLICY_UPDATE_NORM: 0.1})
TOO_LARGE[M.CORRECT_MEAN] = [[i, x] for i, x in enumerate([0.3, 0.2, 0.35, 0.25, 0.3, 0.2, 0.3, 0.25])]


@pytest.fixture()
def run_with(tmp_path):
    """A run whose root v0 (examples/default.yaml's recipe) logged the given metric series; yields a ToolBox."""
    from evotrainer.servers.app import build_server

    def make(metrics):
        ws = Workspace(tmp_path / "run", writer=True)
        v0 = ws.lineage.create_root(Recipe.model_validate(RUN["recipe"]))
        steps = sorted({s for series in metrics.values() for s, _ in series})
        for step in steps:
            ws.lineage.log_metrics(v0.id, step, {k: x for k, s in metrics.items() for t, x in s if t == step})
        recipe = ws.lineage.get(v0.id).recipe
        ws.close()
        return ToolBox(build_server("all", str(tmp_path / "run"))), recipe

    return make


def _top(tb, recipe):
    brain = HeuristicBrain()
    diag = brain.diagnose(RoleTools(tb, "diagnostician"), "v0", {})
    prop = brain.propose(RoleTools(tb, "intervener"), "v0", recipe, diag, set(), {"reward_mean": 0.2})
    rank = Backtester(brain, tb).rank("v0", prop, diag, n_choose=2)  # the agent's path (its distinct-change rule)
    return diag, prop, rank


def test_update_too_small_v0_proposes_a_multiplicative_lr_raise_first(run_with):
    tb, recipe = run_with(RUN["metrics"])
    with tb:
        diag, prop, rank = _top(tb, recipe)
        one = Backtester(HeuristicBrain(), tb).rank("v0", prop, diag, n_choose=1)
    assert "update_too_small" in [f.kind for f in diag.findings if f.severity == "warn"]
    top = prop.candidates[rank.chosen[0]]
    # lr 2e-6, update KL median 3.57e-4: factor to the target √(0.01 / 3.57e-4) = 5.29, nearer x3 than x10
    # in log scale (|log 3 - log 5.29| = 0.25 < |log 10 - log 5.29| = 0.28): 6e-6
    assert top.path == "actor_learning_rate" and top.new == pytest.approx(6e-6), rank.rationale
    lrs = sorted(c.new for c in prop.candidates if c.path == "actor_learning_rate")
    assert lrs == pytest.approx([6e-6, 2e-5])  # x3 and x10, never +50%
    # the second branch brackets the step on a log scale: x10 beside x3 (not the length cap of the truncation)
    second = prop.candidates[rank.chosen[1]]
    assert (second.path, second.new) == ("actor_learning_rate", pytest.approx(2e-5)), rank.rationale
    assert "bracketed on a log scale" in rank.rationale
    assert [prop.candidates[i].new for i in one.chosen] == [pytest.approx(6e-6)]  # one branch: the nearest only


def _scaled_kl(factor):
    """RUN's series with every update KL multiplied by ``factor`` (the learning rate stays 2e-6)."""
    out = dict(RUN["metrics"])
    out[M.POLICY_UPDATE_KL] = [[s, x * factor] for s, x in RUN["metrics"][M.POLICY_UPDATE_KL]]
    return out


def test_an_update_two_orders_under_target_gets_its_own_factor_beside_x10(run_with):
    # a base learning rate 10x too low moves the KL ~100x less: median 3.57e-6, factor √(0.01 / 3.57e-6) = 52.9;
    # the seed skills stop at x10, so the finding's own factor is proposed (2e-6 x 52.9 = 1.06e-4 -> 1.1e-4, two
    # significant digits), ranked first as the nearest to the factor, and bracketed by x10 (nearest to it in log
    # scale: |log 10 - log 52.9| = 0.72 < |log 3 - log 52.9| = 1.25), not x3
    tb, recipe = run_with(_scaled_kl(0.01))
    with tb:
        diag, prop, rank = _top(tb, recipe)
    small = [f for f in diag.findings if f.kind == "update_too_small"]
    assert small and small[0].data["lr_factor_to_target"] == pytest.approx(52.9, abs=0.05)
    lrs = sorted(c.new for c in prop.candidates if c.path == "actor_learning_rate")
    assert lrs == pytest.approx([6e-6, 2e-5, 1.1e-4])
    mine = next(c for c in prop.candidates if c.new == pytest.approx(1.1e-4))
    assert mine.source == "finding:update_too_small" and mine.addresses == ["update_too_small"]
    assert [prop.candidates[i].new for i in rank.chosen] == [pytest.approx(1.1e-4), pytest.approx(2e-5)], \
        rank.rationale


def test_the_factor_candidate_stops_at_x100_and_at_the_skills_cap(run_with):
    # KL 1e-5 of RUN's: factor 529 -> x100 (2e-4); with a base of 2e-5 the same x100 would be 2e-3, capped at 1e-3
    tb, recipe = run_with(_scaled_kl(1e-5))
    with tb:
        _, prop, rank = _top(tb, recipe)
    assert prop.candidates[rank.chosen[0]].new == pytest.approx(2e-4), rank.rationale
    from evotrainer.agents.heuristic import _lr_to_target

    diag = Diagnosis(version_id="v0", findings=[FindingRef(kind="update_too_small", severity="warn",
                                                           data={"lr_factor_to_target": 529.0})])
    assert [c.new for c in _lr_to_target(recipe.model_copy(update={"actor_learning_rate": 2e-5}), diag,
                                         "update_too_small")] == [1e-3]
    # within x10, infinite (no KL logged as moving at all), or an info finding: the seed skills' steps only
    for factor, sev in ((5.29, "warn"), (float("inf"), "warn"), (52.9, "info")):
        d = Diagnosis(version_id="v0", findings=[FindingRef(kind="update_too_small", severity=sev,
                                                            data={"lr_factor_to_target": factor})])
        assert _lr_to_target(recipe, d, "update_too_small") == []


def test_an_update_far_over_target_gets_its_own_cut_beside_div10(run_with):
    # KL 2.0 nats/token: factor √(0.01 / 2) = 0.0707 -> 2e-6 x 0.0707 = 1.4e-7, nearest the factor; /10 beside it
    tb, recipe = run_with({**TOO_LARGE, M.POLICY_UPDATE_KL: [[i, 2.0] for i in range(8)]})
    with tb:
        diag, prop, rank = _top(tb, recipe)
    assert [f.kind for f in diag.findings if f.severity == "warn"] == ["update_too_large"]
    assert [prop.candidates[i].new for i in rank.chosen] == [pytest.approx(1.4e-7), pytest.approx(2e-7)], \
        rank.rationale


def test_update_too_large_v0_proposes_a_cut_first(run_with):
    tb, recipe = run_with(TOO_LARGE)
    with tb:
        diag, prop, rank = _top(tb, recipe)
    assert [f.kind for f in diag.findings if f.severity == "warn"] == ["update_too_large"]
    top = prop.candidates[rank.chosen[0]]
    # KL 0.06: factor √(0.01 / 0.06) = 0.408, nearer /3 (log distance 0.09) than /10 (0.61): 2e-6 / 3
    assert top.path == "actor_learning_rate" and top.new == pytest.approx(2e-6 / 3, rel=1e-6), rank.rationale
    # /10 and /3 (the skill lr_down_x3 and the built-in fix give the same value: one candidate, not two
    # near-identical ones); kl_blowup's x0.3 is not proposed (no KL finding), nor the +/-50% of lr_down
    lrs = sorted(c.new for c in prop.candidates if c.path == "actor_learning_rate")
    assert lrs == [2e-7, 6.666666666e-7]
    # a base whose step is too large gets the cut bracketed too: /3 first, /10 beside it
    assert prop.candidates[rank.chosen[1]].new == pytest.approx(2e-7), rank.rationale


def test_task_mismatch_table():
    assert task_mismatch("reward.test_file_edit.weight", "arithmetic") == \
        "reward.test_file_edit applies to data.task swe only, not 'arithmetic'"
    assert task_mismatch("reward.test_file_edit.weight", "swe") is None
    assert task_mismatch("tool_use.max_turns", "gsm8k") and task_mismatch("reward.code_tests.weight", "math")
    assert task_mismatch("data.level", "gsm8k") and task_mismatch("data.level", "arithmetic") is None
    assert task_mismatch("reward.format.weight", "arithmetic") is None
    assert task_mismatch("reward.test_file_editx.weight", "arithmetic") is None  # a prefix, not a substring


def test_swe_only_reward_terms_are_never_proposed_on_a_math_task(tmp_path):
    # the failed child: a reward_hacking finding on arithmetic retrieved the seed skill test_edit_penalty
    # (reward.test_file_edit.weight = 1), which raised RewardError at the child's first step
    from evotrainer.servers.app import build_server

    ws = Workspace(tmp_path / "run", writer=True)
    ws.lineage.create_root(Recipe())
    ws.close()
    diag = Diagnosis(version_id="v0", findings=[FindingRef(
        kind="reward_hacking", severity="warn", versions=["v0"], evidence=["reward/format/mean"],
        explanation="v0: the reward pays for editing test files and submitting without running tests")])
    swe_only = {"reward.test_file_edit.weight", "reward.submit_without_test.weight", "reward.tool_budget.weight"}
    with ToolBox(build_server("all", str(tmp_path / "run"))) as tb:
        brain = HeuristicBrain()
        math_prop = brain.propose(RoleTools(tb, "intervener"), "v0", Recipe(), diag, set(), {})
        swe = set_path(Recipe(), "data.task", "swe")
        swe_prop = brain.propose(RoleTools(tb, "intervener"), "v0", swe, diag, set(), {})

        class Naive:  # a brain (e.g. Claude) that proposes the SWE term anyway: the intervener drops it
            def propose(self, tools, parent_id, recipe, diagnosis, tried, context):
                return Proposal(parent_id=parent_id, candidates=[
                    Candidate(path="reward.test_file_edit.weight", new=1.0, addresses=["reward_hacking"]),
                    Candidate(path="reward.format.weight", new=0.1, addresses=["reward_hacking"])])

        kept = Intervener(Naive(), tb).propose("v0", Recipe(), diag, set(), {})
    assert math_prop.candidates and not {c.path for c in math_prop.candidates} & swe_only
    assert {c.path for c in swe_prop.candidates} & swe_only  # on an SWE run the same skills do apply
    assert [c.path for c in kept.candidates] == ["reward.format.weight"]


def test_saturated_training_data_proposes_harder_data(run_with):
    # train pass rate 0.96 on level 1: a headroom finding (info, no failure) still calls for a change: level 2
    sat = _flat(8, **{M.CORRECT_MEAN: 0.96, M.REWARD_MEAN: 0.96, M.POLICY_UPDATE_KL: 3e-3, M.REWARD_KEPT_GROUP_FRAC: 0.25,
                      M.REWARD_FRAC_ZERO_STD: 0.75, M.POLICY_UPDATE_NORM: 0.1})
    tb, recipe = run_with(sat)
    with tb:
        brain = HeuristicBrain()
        diag = brain.diagnose(RoleTools(tb, "diagnostician"), "v0", {})
        prop = brain.propose(RoleTools(tb, "intervener"), "v0", recipe, diag, set(), {"reward_mean": 0.96})
        rank = brain.rank(RoleTools(tb, "backtester"), "v0", prop, diag, n_choose=1)
    assert [(f.kind, f.severity) for f in diag.findings if f.kind == "headroom"] == [("headroom", "info")]
    top = prop.candidates[rank.chosen[0]]
    assert (top.path, top.new) == ("data.level", 2), rank.rationale


def test_a_call_on_a_closed_toolbox_fails_at_once(run_with):
    """Found writing the bracket test: a call after the `with` block waited the whole 600 s timeout."""
    import time

    from evotrainer.agents.mcp_client import ToolCallError

    tb, _ = run_with(RUN["metrics"])
    with tb:
        assert tb.call("get_version", {"version_id": "v0"})["id"] == "v0"
    t0 = time.monotonic()
    with pytest.raises(ToolCallError, match="closed"):
        tb.call("get_version", {"version_id": "v0"})
    assert time.monotonic() - t0 < 5
