"""Inert-change backtests (harness/backtest.py ``inert_change``) with exact values, the MCP tool
``check_inert``, and the heuristic brain skipping inert candidates (issue 16: three of five children of
a default-variant run trained bit-identically: eps_clip_high 0.28 -> 0.32 with one PPO epoch,
init_kl_coef 0.001 -> 0, a repetition penalty where nothing repeats)."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from evotrainer import metrics as M
from evotrainer.harness.backtest import COEF_INERT, inert_change
from evotrainer.harness.evidence import Evidence
from evotrainer.recipe import Recipe, RecipeError, set_path
from evotrainer.rl_backend.rewards import compute_rewards
from evotrainer.rl_backend.tasks import Problem
from evotrainer.rollouts import SCHEMA, make_record
from evotrainer.workspace import Workspace


def _ev(**series):
    return Evidence(metrics={"v0": {name: [(i, x) for i, x in enumerate(xs)] for name, xs in series.items()}})


# a few stored groups (3 samples each) of a 1-digit addition run: plain numbers, nothing repeats
PLAIN = [("What is 3+4?", "7", ["7", "9", "7 is the sum"]), ("What is 5+5?", "10", ["10", "12", "11"])]
LOOPY = [("What is 3+4?", "7", ["7", "9", "so so so so so so so so 7"]), ("What is 5+5?", "10", ["10", "12", "11"])]


def _rollouts(groups, spec=None):
    spec = spec or {"correctness": {"weight": 1.0}}
    rows = []
    for gi, (q, a, comps) in enumerate(groups):
        p = Problem(id=f"q{gi}", prompt=q, answer=a, meta={"task": "arithmetic"})
        out = compute_rewards(spec, [p] * len(comps), comps, finish_reasons=["eos"] * len(comps),
                              lengths=[len(c.split()) for c in comps], generate_max_len=16)
        for k, c in enumerate(comps):
            rows.append(make_record(version_id="v0", step=0, prompt_id=p.id, group_id=f"g{gi}", sample_idx=k, prompt=q,
                                    completion=c, answer=a, reward=out.total[k], correct=out.correct[k],
                                    components={n: v[k] for n, v in out.components.items()}, length=len(c.split())))
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def test_clip_bound_with_one_epoch_is_structurally_inert():
    r = inert_change(Recipe(max_epochs=1), "eps_clip_high", 0.32)
    assert (r.inert, r.check, r.old, r.new) == (True, "structural", 0.28, 0.32)
    assert "ratio is exactly 1" in r.reason
    assert inert_change(Recipe(max_epochs=1), "eps_clip_low", 0.1).inert


def test_clip_bound_no_ratio_reaches_with_two_epochs():
    rec = Recipe(max_epochs=2)
    ev = _ev(**{M.POLICY_RATIO_MAX: [1.05, 1.12, 1.1], M.POLICY_RATIO_MIN: [0.97, 0.95, 0.96]})
    # largest ratio 1.12: 0.12 < min(0.28, 0.32) = 0.28, neither bound binds
    r = inert_change(rec, "eps_clip_high", 0.32, ev, "v0")
    assert (r.inert, r.check, r.data["ratio_seen"], r.data["bound"]) == (True, "clip_bound", 1.12, 0.28)
    # tightening to 0.1: 0.12 >= 0.1, tokens past 1.1 would be clipped
    assert not inert_change(rec, "eps_clip_high", 0.1, ev, "v0").inert
    # smallest ratio 0.95: 1 - 0.95 = 0.05 < min(0.2, 0.1) = 0.1
    assert inert_change(rec, "eps_clip_low", 0.1, ev, "v0").check == "clip_bound"
    no = inert_change(rec, "eps_clip_high", 0.32)  # no evidence: cannot tell, so not inert
    assert not no.inert and "no policy/ratio/max" in no.reason


def test_kl_coefficient_too_small_to_move_the_update():
    ev = _ev(**{M.POLICY_KL: [0.0005, 0.001, 0.002], M.POLICY_ADVANTAGE_STD: [0.8, 0.8, 0.8]})
    r = inert_change(Recipe(init_kl_coef=0.001), "init_kl_coef", 0.0, ev, "v0")
    # k3: g = √(2 x 0.002) = 0.0632456 per token; share = |Δβ|·g / σ_A = 0.001 x 0.0632456 / 0.8 = 7.906e-5
    assert r.inert and r.check == "coefficient"
    assert r.data["g_kl"] == pytest.approx(math.sqrt(0.004)) and r.data["share"] == pytest.approx(7.90569e-5, rel=1e-5)
    # k1's gradient is 1 per token: share = 0.001 x 1 / 0.8 = 1.25e-3, still under 0.01
    assert inert_change(Recipe(init_kl_coef=0.001, kl_estimator="k1"), "init_kl_coef", 0.0, ev, "v0").data["share"] \
        == pytest.approx(1.25e-3)
    # a KL of 0.5 nats/token and β 0.001 -> 0.1: g = √1 = 1, share = 0.099 / 0.8 = 0.124 >= 0.01: it acts
    big = _ev(**{M.POLICY_KL: [0.5] * 3, M.POLICY_ADVANTAGE_STD: [0.8] * 3})
    r = inert_change(Recipe(init_kl_coef=0.001), "init_kl_coef", 0.1, big, "v0")
    assert not r.inert and r.data["share"] == pytest.approx(0.12375) and r.data["share"] > COEF_INERT


def test_kl_in_the_reward_and_weight_decay_coefficients():
    ev = _ev(**{M.POLICY_KL: [0.002] * 3, M.COMPLETIONS_MEAN_LENGTH: [10.0] * 3, M.REWARD_STD: [0.4] * 3,
                M.POLICY_UPDATE_REL_NORM: [5e-6] * 3})
    r = inert_change(Recipe(init_kl_coef=0.001, use_kl_loss=False), "init_kl_coef", 0.0, ev, "v0")
    # |Δβ|·KL·L / σ_r = 0.001 x 0.002 x 10 / 0.4 = 5e-5
    assert r.inert and r.data["share"] == pytest.approx(5e-5)
    # weight decay 0 -> 0.01 at lr 2e-6: lr·Δwd = 2e-8 of ||θ|| per step against updates of 5e-6: share 4e-3
    r = inert_change(Recipe(actor_learning_rate=2e-6), "l2", 0.01, ev, "v0")
    assert r.inert and r.data["share"] == pytest.approx(4e-3)
    # at lr 1e-3: 1e-5 / 5e-6 = 2: it acts
    assert not inert_change(Recipe(actor_learning_rate=1e-3), "l2", 0.01, ev, "v0").inert


def test_structural_switches():
    assert inert_change(Recipe(init_kl_coef=0.0), "kl_estimator", "k2").check == "structural"
    assert inert_change(Recipe(init_kl_coef=0.0), "use_kl_loss", False).inert
    assert inert_change(Recipe(dynamic_filtering=False), "dynamic_filtering_range", [0.1, 0.9]).inert
    assert not inert_change(Recipe(dynamic_filtering=True), "dynamic_filtering_range", [0.1, 0.9]).inert
    assert inert_change(Recipe(), "temperature", 1.2).check == "none"  # no rule: not inert
    with pytest.raises(RecipeError):
        inert_change(Recipe(), "eps_clip_low", 2.0)  # invalid value: the recipe's own error


def test_repetition_penalty_where_nothing_repeats_is_inert():
    ev = Evidence(rollouts=_rollouts(PLAIN))
    r = inert_change(Recipe(), "reward.repetition.weight", 0.5, ev, "v0")
    # every completion has fewer than 4 words or no repeated 4-gram: repetition = 0 on all 6 rollouts,
    # the totals and so the group advantages are unchanged
    assert (r.inert, r.check) == (True, "no_behaviour")
    assert r.data["max_abs_advantage_change"] == 0.0 and r.data["n_rollouts"] == 6 and r.data["same_filter"]
    assert "[0.0]" in r.reason
    # one looping but correct completion ("so" x8 then 7: 6 4-grams, 2 distinct, repeat rate 2/3) gets
    # 1 - 0.5 x 2/3 = 0.667: its group (1, 0, 0.667) has three reward levels, so its advantages move (a
    # penalty on an already wrong sample of a two-level group would not: group_norm is affine-invariant)
    loopy = inert_change(Recipe(), "reward.repetition.weight", 0.5, Evidence(rollouts=_rollouts(LOOPY)), "v0")
    assert not loopy.inert and loopy.data["max_abs_advantage_change"] > 0.1
    # no stored rollouts: not inert, and says why
    assert "no stored train rollouts" in inert_change(Recipe(), "reward.repetition.weight", 0.5, Evidence(), "v0").reason


def test_a_constant_shift_within_every_group_is_inert_under_group_norm():
    # format pays 1 for a completion in the answer format: all six are bare numbers, so format = 1 on every
    # rollout: a constant within every group, and group-relative advantages do not move
    groups = [("What is 3+4?", "7", ["7", "9", "8"]), ("What is 5+5?", "10", ["10", "12", "11"])]
    r = inert_change(Recipe(), "reward.format.weight", 0.5, Evidence(rollouts=_rollouts(groups)), "v0")
    assert r.inert and r.data["max_abs_advantage_change"] < 1e-9


def test_scaling_the_only_reward_component_is_inert_under_group_norm_not_under_dr_grpo():
    # the default make run's round-3 candidate reward.correctness.weight 1 -> 2 (the only component): group_norm's
    # (r - mean) / (std + 1e-9) moves by A·eps/(2·std), 2.5e-9 on that run's rollouts, past the old absolute 1e-9
    # tolerance; now within 1e-6 of the largest advantage. Groups here: correctness (1, 0, 1) and (1, 0, 0).
    ev = Evidence(rollouts=_rollouts(PLAIN))
    r = inert_change(Recipe(), "reward.correctness.weight", 2.0, ev, "v0")
    assert (r.inert, r.check) == (True, "no_behaviour") and 0 < r.data["max_abs_advantage_change"] < 1e-8
    assert "only rescales a std-normalised reward" in r.reason
    # Dr. GRPO's advantage is r - mean, not normalised: doubling the reward doubles it, |Δ| = max |r - mean| = 2/3
    dr = inert_change(Recipe(advantage_estimator="dr_grpo"), "reward.correctness.weight", 2.0, ev, "v0")
    assert not dr.inert and dr.data["max_abs_advantage_change"] == pytest.approx(2 / 3)


def test_more_training_problems_than_the_task_has_are_inert():
    # the default make run's round-3 arm v7, data.n_train 256 -> 512, trained bit-identically to its control: level-1
    # arithmetic (a + b, operands 0..19) has 400 problems; 48 dev and 100 test leave 252 to train on either way
    data = {"task": "arithmetic", "level": 1, "n_train": 256, "n_heldout": 48, "n_test": 100, "seed": 0}
    r = inert_change(Recipe(data=data), "data.n_train", 512)
    assert (r.inert, r.check, r.data["n_train_effective"]) == (True, "structural", 252)
    assert r.reason == ("data.n_train 256 -> 512: the arithmetic task has no more problems to give (after the dev "
                        "and test splits): both train on the same 252")
    smaller = inert_change(Recipe(data={**data, "n_train": 100}), "data.n_train", 200)
    assert not smaller.inert and smaller.reason == "data.n_train 100 -> 200: 100 -> 200 training problems"
    assert not inert_change(Recipe(data=data), "data.n_train", 128).inert  # fewer: no rule, it changes the data


def test_check_inert_tool_and_the_heuristic_skips_inert_candidates(tmp_path):
    from evotrainer.agents.decisions import Candidate, Diagnosis, FindingRef, Proposal
    from evotrainer.agents.heuristic import INERT_SCORE, HeuristicBrain
    from evotrainer.agents.mcp_client import RoleTools, ToolBox, ToolCallError
    from evotrainer.servers.app import build_server

    ws = Workspace(tmp_path / "run", writer=True)
    v0 = ws.lineage.create_root(set_path(Recipe(), "init_kl_coef", 0.001))
    ws.rollouts.add(_rollouts(PLAIN).to_pylist())
    for step in range(3):
        ws.lineage.log_metrics(v0.id, step, {M.POLICY_KL: 0.002, M.POLICY_ADVANTAGE_STD: 0.8})
    ws.close()
    with ToolBox(build_server("all", str(tmp_path / "run"))) as tb:
        res = tb.call("check_inert", {"version_id": "v0", "path": "reward.repetition.weight", "value": 0.5})
        assert res["inert"] and res["check"] == "no_behaviour"
        assert tb.call("check_inert", {"version_id": "v0", "path": "temperature", "value": 1.2})["inert"] is False
        with pytest.raises(ToolCallError, match="eps_clip_low"):  # an invalid value: the recipe's error, as a tool error
            tb.call("check_inert", {"version_id": "v0", "path": "eps_clip_low", "value": 2.0})
        cands = [Candidate(path="eps_clip_high", new=0.32, addresses=["entropy_collapse"]),
                 Candidate(path="init_kl_coef", new=0.0, addresses=["entropy_collapse"]),
                 Candidate(path="reward.repetition.weight", new=0.5, addresses=["entropy_collapse"]),
                 Candidate(path="temperature", new=1.2, addresses=["entropy_collapse"]),
                 Candidate(path="actor_learning_rate", new=2e-7, addresses=["entropy_collapse"])]
        diag = Diagnosis(version_id="v0", findings=[FindingRef(kind="entropy_collapse", severity="warn",
                                                               versions=["v0"], data={"early": 1.0, "late": 0.5})])
        r = HeuristicBrain().rank(RoleTools(tb, "backtester"), "v0", Proposal(parent_id="v0", candidates=cands),
                                  diag, n_choose=3)
    # the three changes of the issue are inert (one epoch; share 7.9e-5; nothing repeats): never chosen
    by = {s.index: s for s in r.scores}
    assert [by[i].method for i in range(3)] == ["inert"] * 3 and all(by[i].score == INERT_SCORE for i in range(3))
    assert "ratio is exactly 1" in by[0].detail and "share 7.91e-05" in by[1].detail
    assert r.chosen == [3, 4]


def test_a_longer_budget_nothing_reaches_is_inert():
    # the default run's v7: generate_max_len 16 -> 32 when no completion was cut any more; it tied its control
    # on every dev sample (+0.000 [-0.026, +0.031])
    r = Recipe(generate_max_len=16)
    quiet = _ev(**{M.COMPLETIONS_CLIPPED_RATIO: [0.58, 0.2, 0.0, 0.0, 0.0, 0.0],
                   M.COMPLETIONS_MAX_LENGTH: [16, 16, 12, 11, 13, 12]})
    c = inert_change(r, "generate_max_len", 32, quiet, "v0")
    assert (c.inert, c.check, c.data) == (True, "no_behaviour", {"clipped_max": 0.0, "longest": 13.0})
    # one cut completion in the last 4 steps: the budget acts
    cut = _ev(**{M.COMPLETIONS_CLIPPED_RATIO: [0.0, 0.0, 0.04, 0.0], M.COMPLETIONS_MAX_LENGTH: [12, 12, 16, 12]})
    assert not inert_change(r, "generate_max_len", 32, cut, "v0").inert
    # overlong shaping reads the limit (L_max, buffer): not inert even with nothing cut
    shaped = set_path(r, "reward.overlong.weight", 1.0)
    c = inert_change(shaped, "generate_max_len", 32, quiet, "v0")
    assert not c.inert and c.reason == "generate_max_len 16 -> 32: overlong reads the limit"
    assert not inert_change(r, "generate_max_len", 8, quiet, "v0").inert  # a shorter budget is not this rule
