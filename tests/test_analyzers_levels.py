"""Levels, changes and trends (issue 17): what one step shows, what a long run's start and end show.

Hand-made series with the arithmetic in comments; the real logs are in tests/test_cases.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from evotrainer import metrics as M
from evotrainer.harness.analyzers import run_analyzers
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding
from evotrainer.harness.trends import level, segments, trend

RNG = np.random.default_rng(7)


def ev_of(series: dict[str, list[float] | np.ndarray], steps: dict[str, np.ndarray] | None = None) -> Evidence:
    steps = steps or {}
    return Evidence(metrics={"v1": {k: (steps.get(k, np.arange(len(x))), np.asarray(x, float))
                                    for k, x in series.items()}})


def only(findings: list[Finding], kind: str) -> Finding:
    got = [f for f in findings if f.kind == kind]
    assert len(got) == 1, got
    return got[0]


# --- levels: one step is enough ------------------------------------------------------------------------
def test_clip_ratio_of_one_on_the_only_step_blocks():
    # verl `response_length/clip_ratio: 1.000` on the only logged step: every completion hit the cap
    f = only(run_analyzers(ev_of({M.COMPLETIONS_CLIPPED_RATIO: [1.0]}), names=["truncation"]), "truncation")
    assert (f.severity, f.judged, f.steps) == ("blocking", "level", [0, 0])
    assert f.data["recent"] == 1.0 and "the only logged step (0)" in f.explanation
    assert "insufficient" not in f.explanation
    # three steps 0.1, 0.3, 0.25: median 0.25 >= 0.2 (TRUNC_WARN) and < 0.5: a warning
    f = only(run_analyzers(ev_of({M.COMPLETIONS_CLIPPED_RATIO: [0.1, 0.3, 0.25]}), names=["truncation"]), "truncation")
    assert (f.severity, f.data["recent"]) == ("warn", 0.25)
    # 0.1 on the only step: nothing (below 0.2), and no "insufficient evidence" either: a level needs no trend
    assert run_analyzers(ev_of({M.COMPLETIONS_CLIPPED_RATIO: [0.1]}), names=["truncation"]) == []


def test_nan_on_one_step_and_foreign_loss_names():
    # ms-swift logging.jsonl with a bare NaN loss on its only step: non-finite on the last step -> blocking
    f = only(run_analyzers(ev_of({M.LOSS_TOTAL: [float("nan")]}), names=["nan_blowup"]), "nan_blowup")
    assert (f.severity, f.judged, f.steps) == ("blocking", "level", [0, 0])
    # a foreign loss kept under its own name (verl critic/vf_loss) is core too; one inf that recovered -> warn
    f = only(run_analyzers(ev_of({"critic/vf_loss": [1.3, np.inf, 1.2, 1.1]}), names=["nan_blowup"]), "nan_blowup")
    assert (f.severity, f.steps, f.data["series"]) == ("warn", [1, 1], {"critic/vf_loss": 1})
    # timing series are not evidence of a blow-up
    assert run_analyzers(ev_of({"timing_s/update_actor_loss": [np.nan, np.nan]}), names=["nan_blowup"]) == []


def test_kl_level_from_two_steps():
    # KL 1.4 and 2.2 nats/token on the only two steps: median 1.8 >= KL_WARN 1.0 -> warn, a level
    f = only(run_analyzers(ev_of({M.POLICY_KL: [1.4, 2.2]}), names=["kl_blowup"]), "kl_blowup")
    assert (f.severity, f.judged, f.data["recent"]) == ("warn", "level", pytest.approx(1.8))
    # KL 0.01: below the level; the trend cannot be judged from 2 points -> the info note, judged "trend"
    f = only(run_analyzers(ev_of({M.POLICY_KL: [0.01, 0.02]}), names=["kl_blowup"]), "kl_blowup")
    assert (f.severity, f.judged) == ("info", "trend") and f.explanation.startswith("insufficient evidence")


# --- zero variance from batch statistics, read by its cause ---------------------------------------------
def test_one_reward_for_the_whole_batch_all_wrong_blocks():
    # verl critic/score/min == max == 0 on one step: every rollout scored 0 -> every group all-wrong
    ev = ev_of({M.REWARD_MIN: [0.0], M.REWARD_MAX: [0.0], M.REWARD_MEAN: [0.0]})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.judged, f.data["cause"], f.data["late_frac"]) == ("blocking", "level", "all_wrong", 1.0)
    assert f.data["constant_reward"] == 0.0 and "easier data or fix the reward" in f.explanation
    assert set(f.evidence) == {M.REWARD_MIN, M.REWARD_MAX}


def test_batch_reaching_the_top_reward_is_saturation_a_warning():
    # 10 steps: min 0 / max 1 on steps 0-5, then min == max == 1 on steps 6-9. Recent window
    # = max(3, round(0.2 * 10)) = 3 steps (7-9), all constant -> share 1.0 >= ZV_BLOCK. The one reward 1
    # is the run's highest and the run also saw 0: all-right groups, saturated -> warn, never blocking.
    lo = [0.0] * 6 + [1.0] * 4
    ev = ev_of({M.REWARD_MIN: lo, M.REWARD_MAX: [1.0] * 10, M.REWARD_MEAN: [0.5] * 6 + [1.0] * 4})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"], f.data["constant_share"]) == ("warn", "all_right", 1.0)
    assert "harder data" in f.explanation and f.steps == [0, 9]
    # one step at min == max == 1 and nothing else: a constant reward of 1 is not known to be the top
    # (a reward that always pays 1 looks the same) -> cause unknown, blocking
    ev = ev_of({M.REWARD_MIN: [1.0], M.REWARD_MAX: [1.0]})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"]) == ("blocking", "unknown")


def test_solve_fractions_name_the_cause():
    # solve_none 1.0 on the only step (verl batch/solve_none == batch size): blocking, all-wrong
    ev = ev_of({M.REWARD_FRAC_SOLVE_NONE: [1.0], M.REWARD_FRAC_SOLVE_ALL: [0.0]})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"], f.data["late_frac"]) == ("blocking", "all_wrong", 1.0)
    # solve_all 0.97 + solve_none 0.02 = 0.99 >= ZV_BLOCK, but 0.97 / 0.99 = 98% are all-right -> warn
    ev = ev_of({M.REWARD_FRAC_SOLVE_NONE: [0.02], M.REWARD_FRAC_SOLVE_ALL: [0.97]})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"], f.data["late_frac"]) == ("warn", "all_right", pytest.approx(0.99))
    # 0.3 + 0.3 = 0.6: warn, cause mixed (neither is 80% of the 0.6)
    ev = ev_of({M.REWARD_FRAC_SOLVE_NONE: [0.3], M.REWARD_FRAC_SOLVE_ALL: [0.3]})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"]) == ("warn", "mixed")
    # 0.1 + 0.2 = 0.3 < ZV_WARN: nothing
    ev = ev_of({M.REWARD_FRAC_SOLVE_NONE: [0.1], M.REWARD_FRAC_SOLVE_ALL: [0.2]})
    assert run_analyzers(ev, names=["zero_variance_groups"]) == []


def test_zero_std_with_correctness_bounds_the_cause():
    # TRL reward_std (mean within-group std) 0 on 4 steps: every group constant (z = 1, no mixed groups).
    # Correctness 0.02: all-wrong groups >= z - c = 1 - 0.02 = 0.98 >= 0.8 * z -> all-wrong, blocking
    ev = ev_of({M.REWARD_STD: [0.0] * 4, M.CORRECT_MEAN: [0.02] * 4})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"], f.data["frac_solve_none_lb"]) == ("blocking", "all_wrong", pytest.approx(0.98))
    # correctness 0.95: all-right >= 0.95 - 0 = 0.95 >= 0.8 -> saturated, a warning
    ev = ev_of({M.REWARD_STD: [0.0] * 4, M.CORRECT_MEAN: [0.95] * 4})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"]) == ("warn", "all_right")
    # frac_zero_std 0.9 and correctness 0.9: mixed groups m = 0.1 carry at most 0.1 of the mean, so
    # all-right >= 0.9 - 0.1 = 0.8 >= 0.8 * 0.9 = 0.72 -> all-right; 0.9 < ZV_BLOCK anyway -> warn
    ev = ev_of({M.REWARD_FRAC_ZERO_STD: [0.9] * 3, M.CORRECT_MEAN: [0.9] * 3})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.data["cause"], f.data["frac_solve_all_lb"]) == ("all_right", pytest.approx(0.8))


def test_all_zero_rewards_without_correctness_are_all_wrong():
    # TRL: frac_reward_zero_std 1.0, reward 0.0 on 4 steps, no accuracy series: every group constant and
    # the mean 0 with no negative reward -> every reward is 0: all-wrong, blocking
    ev = ev_of({M.REWARD_FRAC_ZERO_STD: [1.0] * 4, M.REWARD_MEAN: [0.0] * 4})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"]) == ("blocking", "all_wrong") and "every rollout scored 0" in f.explanation
    # a reward that goes negative (-1 / +1 rewards): a mean of 0 may be half -1 groups and half +1 -> unknown
    ev = ev_of({M.REWARD_FRAC_ZERO_STD: [1.0] * 4, M.REWARD_MEAN: [-0.5, 0.0, 0.0, 0.0]})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"]) == ("blocking", "unknown")


def test_healthy_batch_statistics_raise_nothing():
    # min 0 / max 1, std 0.45, a third of the groups constant: signal in the batch
    ev = ev_of({M.REWARD_MIN: [0.0] * 5, M.REWARD_MAX: [1.0] * 5, M.REWARD_STD: [0.45] * 5,
                M.REWARD_FRAC_SOLVE_NONE: [0.2] * 5, M.REWARD_FRAC_SOLVE_ALL: [0.13] * 5})
    assert run_analyzers(ev, names=["zero_variance_groups"]) == []


# --- changes: start and end of a long run ---------------------------------------------------------------
def test_segments_find_an_early_collapse_in_a_long_run():
    n = 1200
    s = np.arange(n)
    # entropy 0.6 falling linearly to 0.05 over steps 0-30 (2.5% of the run), then flat at 0.05
    ent = np.where(s < 30, 0.6 - 0.55 * s / 30, 0.05) + RNG.normal(0, 0.004, n)
    t = trend(s, ent)
    # the medians of the first and last 20% (240 steps each) are both ~0.05: x~1, averaged away
    assert t.early == pytest.approx(0.05, abs=0.005) and t.late == pytest.approx(0.05, abs=0.005)
    # binary segmentation: the first segment ends within the fall, the last is the flat 0.05
    assert t.start > 0.3 and t.end == pytest.approx(0.05, abs=0.003) and t.start_until <= 30
    f = only(run_analyzers(ev_of({M.POLICY_ENTROPY: ent}), names=["entropy_collapse"]), "entropy_collapse")
    assert (f.severity, f.judged, f.data["basis"]) == ("warn", "change", "segments")
    assert f.data["to"] / f.data["from"] <= 0.3 and "into the run" in f.explanation
    # a healthy long run, entropy 0.6 -> 0.5 with noise: no collapse
    calm = np.linspace(0.6, 0.5, n) + RNG.normal(0, 0.01, n)
    assert run_analyzers(ev_of({M.POLICY_ENTROPY: calm}), names=["entropy_collapse"]) == []


def test_segments_of_pure_noise_and_of_a_step():
    y = RNG.normal(0, 1, 400)
    assert segments(y) == [0]  # the BIC penalty 2 sd^2 log n keeps noise whole
    step = np.r_[np.zeros(100), np.full(100, 5.0)] + RNG.normal(0, 0.1, 200)
    assert segments(step) == [0, 100]


def test_sparse_validation_feeds_train_eval_divergence():
    n = 1200
    s = np.arange(n)
    # train correctness 0.3 -> 0.95 over the first 60 steps, then saturated at 0.95
    train = np.where(s < 60, 0.3 + 0.65 * s / 60, 0.95) + RNG.normal(0, 0.01, n)
    vs = np.arange(0, n + 1, 100)  # validation every 100 steps: 13 points, flat at 0.40
    val = np.full(len(vs), 0.40) + np.array([0, 0.004, -0.003, 0.002, 0, 0.003, -0.002, 0, 0.001, 0.002, -0.001, 0, 0.003])
    ev = ev_of({M.CORRECT_MEAN: train, M.EVAL_AVG_AT_K: val}, steps={M.EVAL_AVG_AT_K: vs})
    f = only(run_analyzers(ev, names=["train_eval_divergence"]), "train_eval_divergence")
    # train gain ~0.65 (segments); tolerance max(0.01, min(0.05, 0.2 * 0.65)) = 0.05; the held-out start is
    # step 0's 0.40 (the only evaluation inside the first segment), its end the mean of the later ones ~0.401
    assert (f.severity, f.judged, f.data["basis"]) == ("warn", "change", "segments")
    assert f.data["heldout_tolerance"] == pytest.approx(0.05) and f.data["n_heldout"] == 13
    assert f.data["heldout_late"] - f.data["heldout_early"] < 0.01
    # held-out rising with the train score (0.40 -> 0.60): nothing
    ev = ev_of({M.CORRECT_MEAN: train, M.EVAL_AVG_AT_K: np.r_[0.40, np.full(12, 0.60)]}, steps={M.EVAL_AVG_AT_K: vs})
    assert run_analyzers(ev, names=["train_eval_divergence"]) == []
    # only two evaluations, before training and at the end: 0.40 -> 0.41, a gain of 0.01 <= 0.05 -> warn
    ev = ev_of({M.CORRECT_MEAN: train, M.EVAL_AVG_AT_K: [0.40, 0.41]}, steps={M.EVAL_AVG_AT_K: np.array([0, 1199])})
    f = only(run_analyzers(ev, names=["train_eval_divergence"]), "train_eval_divergence")
    assert (f.severity, f.data["heldout_early"], f.data["heldout_late"]) == ("warn", 0.40, 0.41)


# --- gradient spikes judged by what follows them --------------------------------------------------------
def test_grad_spike_followed_by_nan_warns_and_blind_repeats_warn():
    g = np.full(40, 1.0) + RNG.normal(0, 0.02, 40)
    g[20] = 30.0
    loss = np.full(40, 0.1)
    loss[22:] = np.nan  # two steps after the spike the loss is NaN
    ev = ev_of({M.POLICY_GRAD_NORM: g, M.LOSS_TOTAL: loss, M.REWARD_MEAN: np.linspace(0.2, 0.5, 40)})
    f = only(run_analyzers(ev, names=["grad_spike"]), "grad_spike")
    assert (f.severity, f.steps) == ("warn", [20]) and f.data["damaged_after"] == {"20": ["loss/total non-finite after step 20"]}
    # three spikes and no reward, entropy or KL series to judge harm by: warn, as before calibration
    g3 = np.full(60, 1.0) + RNG.normal(0, 0.02, 60)
    g3[[15, 30, 45]] = 25.0
    f = only(run_analyzers(ev_of({M.POLICY_GRAD_NORM: g3}), names=["grad_spike"]), "grad_spike")
    assert f.severity == "warn" and "no reward, entropy or KL series" in f.explanation


def test_every_builtin_finding_says_what_it_judged():
    n = 60
    ev = ev_of({M.COMPLETIONS_CLIPPED_RATIO: np.full(n, 0.7), M.POLICY_ENTROPY: np.geomspace(1.0, 0.01, n),
                M.REWARD_STD: np.zeros(n), M.POLICY_KL: np.r_[np.full(30, 0.01), np.full(30, 3.0)],
                M.COMPLETIONS_MEAN_LENGTH: np.linspace(400, 40, n), M.LOSS_TOTAL: np.r_[np.zeros(n - 2), np.nan, np.nan]})
    found = run_analyzers(ev)
    assert {f.kind for f in found if f.is_failure} >= {"truncation", "entropy_collapse", "zero_variance_groups",
                                                        "kl_blowup", "length_collapse", "nan_blowup"}
    assert all(f.judged in ("level", "change", "trend") for f in found), [(f.kind, f.judged) for f in found]


def test_level_helper():
    lv = level(np.array([3, 5, 9]), np.array([0.2, np.nan, 0.6]))
    # finite points 0.2 (step 3) and 0.6 (step 9): window min(2, max(3, 0)) = 2, median 0.4
    assert (lv.n, lv.recent, lv.last, lv.recent_from, lv.first_step, lv.last_step) == (2, 0.4, 0.6, 3, 3, 9)
    assert level(np.array([1]), np.array([np.nan])) is None


# --- changes on a handful of steps; levels of a gradient norm; a critic's baseline ------------------------
def test_reward_hacking_as_a_change_on_three_steps():
    # open-r1#255 shape: format 0.476 -> 0.554 -> 0.857 (+0.381 >= HACK_RISE 0.05, up at every step) while
    # correctness 0.160 -> 0.118 -> 0.064 (-0.096 >= HACK_FALL 0.02, down at every step): a warning
    ev = ev_of({"reward/format/mean": [0.476, 0.554, 0.857], M.reward_component("correctness"): [0.16, 0.118, 0.064]})
    f = only(run_analyzers(ev, names=["reward_hacking"]), "reward_hacking")
    assert (f.severity, f.judged, f.steps, f.data["n_points"]) == ("warn", "change", [0, 2], 3)
    assert "0.476 -> 0.554 -> 0.857" in f.explanation
    # correctness not falling at every step (0.16 -> 0.2 -> 0.064): no steady change, nothing
    ev = ev_of({"reward/format/mean": [0.476, 0.554, 0.857], M.reward_component("correctness"): [0.16, 0.2, 0.064]})
    assert run_analyzers(ev, names=["reward_hacking"]) == []


def test_grad_norm_of_a_billion_is_a_level_not_a_nan():
    # slime: grad_norm 2.96e9 (step 1) and 2.22e9 (step 28) with losses ~0.1: >= GRAD_NORM_LEVEL 1e4 -> warn
    ev = ev_of({M.POLICY_GRAD_NORM: [2.955e9, 2.217e9], M.LOSS_TOTAL: [0.10, 0.15]},
               steps={M.POLICY_GRAD_NORM: np.array([1, 28]), M.LOSS_TOTAL: np.array([1, 28])})
    found = run_analyzers(ev, names=["grad_spike", "nan_blowup"])
    f = only(found, "grad_spike")
    assert (f.severity, f.judged, f.steps, f.data["n_huge"]) == ("warn", "level", [1, 28], 2)
    assert not [x for x in found if x.kind == "nan_blowup"]  # finite: the weights are not NaN
    # a loss of 1e9 is still a blow-up (> 1e8 in magnitude)
    f = only(run_analyzers(ev_of({M.LOSS_TOTAL: [0.1, 1e9]}), names=["nan_blowup"]), "nan_blowup")
    assert f.severity == "blocking"


def test_one_reward_with_spread_advantages_is_a_critic_not_zero_variance():
    # verl PPO quickstart: step 1 has critic/score min == max == 0 but advantages -2.6..2.7 (GAE with a
    # critic): not a zero-variance batch -> only an info note; advantages min == max == 0 would be one
    ev = ev_of({M.REWARD_MIN: [0.0, 0.0], M.REWARD_MAX: [1.0, 0.0],
                M.POLICY_ADVANTAGE_MIN: [-3.0, -2.6], M.POLICY_ADVANTAGE_MAX: [2.1, 2.7]})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["vetoed_steps"]) == ("info", [1])
    ev = ev_of({M.REWARD_MIN: [0.0, 0.0], M.REWARD_MAX: [0.0, 0.0],
                M.POLICY_ADVANTAGE_MIN: [0.0, 0.0], M.POLICY_ADVANTAGE_MAX: [0.0, 0.0]})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"]) == ("blocking", "all_wrong")


def test_length_blowup_early_in_a_long_run_is_a_change():
    n = 1200
    s = np.arange(n)
    # length 100 -> 400 tokens over steps 0-40, then 400: the first / last 20% medians are both ~400 (x1),
    # the first / last segments ~100-250 / 400 (>= x2); the clipped ratio follows 0 -> 0.3 (>= TRUNC_WARN 0.2)
    length = np.where(s < 40, 100 + 300 * s / 40, 400) + RNG.normal(0, 3, n)
    clip = np.where(s < 40, 0.3 * s / 40, 0.3) + RNG.normal(0, 0.005, n)
    f = only(run_analyzers(ev_of({M.COMPLETIONS_MEAN_LENGTH: length, M.COMPLETIONS_CLIPPED_RATIO: clip}),
                           names=["length_blowup"]), "length_blowup")
    assert (f.severity, f.judged, f.data["basis"]) == ("warn", "change", "segments")
    assert f.data["to"] == pytest.approx(400, abs=2) and f.data["to"] / f.data["from"] >= 2
    assert f.data["early"] == pytest.approx(400, abs=5)  # what the windows alone saw: no change


def test_evidence_excerpt_at_a_findings_steps():
    ev = ev_of({M.POLICY_GRAD_NORM: [1.0, 1.1, 30.0, 1.0, np.nan, 25.0, 1.2, 1.0, 0.9, 1.0]})
    # more than two steps are points (spike steps): their values, in order
    assert ev.excerpt("v1", M.POLICY_GRAD_NORM, [2, 5, 9]) == {
        "series": M.POLICY_GRAD_NORM, "version": "v1", "n_points": 10, "steps": [2, 5, 9], "values": [30.0, 25.0, 1.0]}
    # a span [2, 6]: 5 logged steps, k=3 evenly spaced with the ends -> indices 0, 2, 4 of steps 2..6 = 2, 4, 6;
    # step 4 is NaN -> None
    x = ev.excerpt("v1", M.POLICY_GRAD_NORM, [2, 6], k=3)
    assert (x["steps"], x["values"]) == ([2, 4, 6], [30.0, None, 1.2])
    assert ev.excerpt("v1", "policy/nope") is None


def test_nan_never_computed_from_the_first_step_is_info_not_a_blowup():
    # TRL GRPO with beta=0.0 prints kl as nan from step 1 (trl#4040: "intentional behavior, not a bug"). Steps 1-4:
    # kl nan 4/4 from step 1 while the loss (-0.2836, -0.1491, -0.1105, -0.0145) and reward are finite at all 4 ->
    # never computed: one info note, no warn / blocking
    steps = {n: np.arange(1, 5) for n in (M.POLICY_KL, M.LOSS_TOTAL, M.REWARD_MEAN)}
    ev = ev_of({M.POLICY_KL: [np.nan] * 4, M.LOSS_TOTAL: [-0.2836, -0.1491, -0.1105, -0.0145],
                M.REWARD_MEAN: [13.44, 6.93, 6.25, 6.42]}, steps)
    f = only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup")
    assert (f.severity, f.steps, f.data["never_computed"]) == ("info", [1, 4], {M.POLICY_KL: 4})
    assert not f.damages_weights  # a metric never computed says nothing about the weights
    # the same nan kl from step 3 on (finite on steps 1-2): it became nan mid-run -> 2 steps, the last one: blocking
    ev = ev_of({M.POLICY_KL: [0.01, 0.02, np.nan, np.nan], M.LOSS_TOTAL: [0.1] * 4}, steps)
    assert only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup").severity == "blocking"
    # nan from step 1 but the loss is nan too: nothing finite to vouch for the weights -> blocking
    ev = ev_of({M.POLICY_KL: [np.nan] * 4, M.LOSS_TOTAL: [np.nan] * 4}, steps)
    assert only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup").severity == "blocking"
    # one step only (ms-swift's kl NaN at step 1 of its only record): one step cannot say "never" -> blocking
    ev = ev_of({M.POLICY_KL: [np.nan], M.LOSS_TOTAL: [0.1]}, {M.POLICY_KL: np.array([1]), M.LOSS_TOTAL: np.array([1])})
    assert only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup").severity == "blocking"
    # an excerpt from step 300 on, kl nan at every step: not the run's start, so no claim that it was never computed
    late = {n: np.arange(300, 304) for n in (M.POLICY_KL, M.LOSS_TOTAL)}
    ev = ev_of({M.POLICY_KL: [np.nan] * 4, M.LOSS_TOTAL: [0.1] * 4}, late)
    assert only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup").severity == "blocking"


def test_a_grad_norm_nan_from_the_first_step_is_never_excused():
    """CPPO#3 (a V100, fp16): grad_norm nan at every logged step from the first while the loss (0.0) and the reward
    stay finite. A grad norm is always computed: the rule for a never-computed metric (kl with beta=0) does not apply
    to the loss, reward or grad norm; this is a blow-up (blocking), not an info note."""
    steps = {n: np.arange(1, 5) for n in (M.POLICY_GRAD_NORM, M.LOSS_TOTAL, M.REWARD_MEAN)}
    ev = ev_of({M.POLICY_GRAD_NORM: [np.nan] * 4, M.LOSS_TOTAL: [0.0] * 4, M.REWARD_MEAN: [0.216, 0.2, 0.25, 0.22]},
               steps)
    f = only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup")
    assert (f.severity, f.steps, f.data["series"]) == ("blocking", [1, 4], {M.POLICY_GRAD_NORM: 4})
    assert "never_computed" not in f.data


def test_nan_never_computed_logged_every_n_steps_starts_at_step_n():
    # the same beta=0 run logged every 10 steps (logging_steps=10): steps 10, 20, 30, 40, kl nan at all 4, the loss
    # finite. The smallest gap between logged steps is 10 and the first step 10 <= 10: the run's first logging step,
    # so never computed (an info note), as with steps 1-4
    every10 = {n: np.array([10, 20, 30, 40]) for n in (M.POLICY_KL, M.LOSS_TOTAL)}
    ev = ev_of({M.POLICY_KL: [np.nan] * 4, M.LOSS_TOTAL: [-0.2836, -0.1491, -0.1105, -0.0145]}, every10)
    f = only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup")
    assert (f.severity, f.steps, f.data["never_computed"]) == ("info", [10, 40], {M.POLICY_KL: 4})
    # steps 20, 30, 40 (gap 10, first 20 > 10): a step was logged before, which the excerpt left out -> blocking
    late = {n: np.array([20, 30, 40]) for n in (M.POLICY_KL, M.LOSS_TOTAL)}
    ev = ev_of({M.POLICY_KL: [np.nan] * 3, M.LOSS_TOTAL: [0.1] * 3}, late)
    assert only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup").severity == "blocking"


def test_truncation_from_a_mean_length_that_is_one_whole_number():
    # TRL < 0.16 logs completion_length only (no clipped ratio, no max length): 256.0 at each of the last 3 steps
    # (TRUNC_UNIFORM_STEPS) is the cap every completion reached -> blocking, the cap 256
    f = only(run_analyzers(ev_of({M.COMPLETIONS_MEAN_LENGTH: [240.5, 256.0, 256.0, 256.0]}), names=["truncation"]),
             "truncation")
    assert (f.severity, f.data["cap"], f.data["cap_from"]) == ("blocking", 256.0, "uniform_mean_length")
    # two steps only, or a mean that varies (255.5 among them), or one that is not a whole number: no cap known
    for x in ([256.0, 256.0], [256.0, 255.5, 256.0], [232.825, 232.825, 232.825]):
        assert run_analyzers(ev_of({M.COMPLETIONS_MEAN_LENGTH: x}), names=["truncation"]) == [], x


def test_nan_on_the_last_step_only_and_a_critic_nan_say_what_the_log_shows():
    """A NaN on the log's only step is blocking, but the text does not claim it persists (the log ends there); a NaN of
    the critic's series alone (verl#498: critic/vf_loss and critic/grad_norm nan at step 1, the actor finite) names
    the critic's weights, not the policy's."""
    one = {n: np.array([1]) for n in ("critic/vf_loss", "critic/grad_norm", M.LOSS_POLICY)}
    ev = ev_of({"critic/vf_loss": [np.nan], "critic/grad_norm": [np.nan], M.LOSS_POLICY: [-0.013]}, one)
    f = only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup")
    assert f.severity == "blocking" and f.data["critic_only"] is True
    assert "the critic's (value model's) weights are corrupt from there unless the next steps recover" in f.explanation
    assert "They persist" not in f.explanation
    steps = {n: np.arange(1, 5) for n in (M.LOSS_POLICY, M.REWARD_MEAN)}
    ev = ev_of({M.LOSS_POLICY: [0.1, 0.2, np.nan, np.nan], M.REWARD_MEAN: [0.5] * 4}, steps)
    f = only(run_analyzers(ev, names=["nan_blowup"]), "nan_blowup")
    assert f.data["critic_only"] is False and "They persist: the weights are corrupt from here on." in f.explanation


def test_a_constant_penalty_with_near_empty_completions_reads_all_wrong():
    """unsloth#2451 (a LoRA reloaded wrong): reward -1.0 (the wrong answer's score) with reward_std 0 at every step,
    completions of 1.44 / 1.38 / 1.38 tokens. Every group is constant at the lowest mean the run shows and at a
    penalty: all wrong (it read 'cause unknown'); the near-empty completions are named (median 1.38)."""
    ev = ev_of({M.REWARD_MEAN: [-1.0] * 3, M.REWARD_STD: [0.0] * 3, M.COMPLETIONS_MEAN_LENGTH: [1.4375, 1.375, 1.375]})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"], f.data["lowest"]) == ("blocking", "all_wrong", True)
    assert f.data["completion_tokens"] == 1.375 and "near-empty (1.38 tokens on average)" in f.explanation
    # the same -1.0 after a step whose mean was lower (-1.5) is not the run's floor: the cause stays unknown
    ev = ev_of({M.REWARD_MEAN: [-1.5, -1.0, -1.0, -1.0], M.REWARD_STD: [0.3, 0.0, 0.0, 0.0],
                M.COMPLETIONS_MEAN_LENGTH: [40.0] * 4})
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert f.data["cause"] == "unknown" and "completion_tokens" not in f.data


def test_zero_variance_wording_with_a_critic():
    """TinyZero#101 (verl PPO with a critic): every rollout scored 0 at the step. The reading is not GRPO's 'zero
    group-relative advantage' (there are no groups), but that equal rewards leave the advantages to the value model."""
    one = {n: np.array([5]) for n in (M.REWARD_MIN, M.REWARD_MAX, M.REWARD_MEAN, "critic/vf_loss")}
    ev = ev_of({M.REWARD_MIN: [0.0], M.REWARD_MAX: [0.0], M.REWARD_MEAN: [0.0], "critic/vf_loss": [0.3]}, one)
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert "leave the advantages to the value model's own errors" in f.explanation
    assert "group-relative" not in f.explanation
    ev = ev_of({M.REWARD_MIN: [0.0], M.REWARD_MAX: [0.0], M.REWARD_MEAN: [0.0]}, one)
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert "Those groups get zero group-relative advantage" in f.explanation


def test_a_mean_reward_stuck_at_zero_without_spread_statistics():
    """OpenRLHF's console logs reward, kl and policy_loss, no spread: 25 steps of reward 0 (never negative) mean every
    reward was 0: zero variance, all wrong, blocking (it raised nothing). A run that starts at 0 and then rises does
    not; nor one of 2 steps (too few to say a mean of 0 is the rule)."""
    s25 = {n: np.arange(1, 26) for n in (M.REWARD_MEAN, M.POLICY_KL)}
    ev = ev_of({M.REWARD_MEAN: np.zeros(25), M.POLICY_KL: np.zeros(25)}, s25)
    f = only(run_analyzers(ev, names=["zero_variance_groups"]), "zero_variance_groups")
    assert (f.severity, f.data["cause"]) == ("blocking", "all_wrong")
    assert "a mean reward of 0 in a run whose mean is never negative" in f.explanation
    rising = np.r_[np.zeros(5), np.linspace(0.1, 0.5, 20)]
    assert [g for g in run_analyzers(ev_of({M.REWARD_MEAN: rising}, s25), names=["zero_variance_groups"])
            if g.is_failure] == []
    two = {M.REWARD_MEAN: np.arange(1, 3)}
    assert [g for g in run_analyzers(ev_of({M.REWARD_MEAN: np.zeros(2)}, two), names=["zero_variance_groups"])
            if g.is_failure] == []
