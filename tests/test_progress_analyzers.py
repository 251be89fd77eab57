"""Progress analyzers (harness/analyzers/progress.py): update too small / too large, plateau, headroom,
on hand-made series and on a stored default-style run (SmolLM2-135M, examples/default.yaml, lr 2e-6)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evotrainer import metrics as M
from evotrainer.harness.analyzers import list_analyzers, run_analyzers
from evotrainer.harness.analyzers.progress import KL_TARGET, PROGRESS_KINDS, slope_ci
from evotrainer.harness.evidence import Evidence

DATA = Path(__file__).parent / "data" / "progress"
NAMES = ["update_size", "plateau", "headroom"]


def _ev(correct, update_kl, clip=0.0, kept=0.5, zero_std=0.5, dev=None, v="v0"):
    n = len(correct)
    steps = range(n)

    def ser(x):
        x = x if isinstance(x, (list, tuple, np.ndarray)) else [x] * n
        return list(zip(steps, x, strict=True))

    metrics = {M.CORRECT_MEAN: ser(correct), M.POLICY_UPDATE_KL: ser(update_kl), M.POLICY_UPDATE_CLIP_FRAC: ser(clip),
               M.REWARD_KEPT_GROUP_FRAC: ser(kept), M.REWARD_FRAC_ZERO_STD: ser(zero_std),
               M.POLICY_UPDATE_REL_NORM: ser(1e-6), M.POLICY_UPDATE_NORM: ser(0.01)}
    summaries = {v: {"by_name": {"dev": {"avg@k": dev}}}} if dev is not None else {}
    return Evidence(metrics={v: metrics}, eval_summaries=summaries)


def _kinds(ev):
    return [(f.kind, f.severity) for f in run_analyzers(ev, NAMES)]


def test_registered_as_builtins():
    names = {s.name for s in list_analyzers(builtin=True)}
    assert set(NAMES) <= names
    assert set(PROGRESS_KINDS) == {"update_too_small", "update_too_large", "plateau", "headroom"}


def test_slope_ci_hand_values():
    # y = 2x exactly: every pairwise slope is 2, so the slope and both CI ends are 2
    assert slope_ci(np.arange(5), 2.0 * np.arange(5)) == pytest.approx((2.0, 2.0, 2.0))
    assert slope_ci(np.arange(5), np.ones(5)) == (0.0, 0.0, 0.0)
    assert slope_ci(np.arange(2), np.ones(2)) is None


def test_flat_kl_flat_reward_is_update_too_small():
    correct = [0.30, 0.32, 0.29, 0.31, 0.30, 0.33, 0.30, 0.31]
    fs = run_analyzers(_ev(correct, 2e-5, dev=0.33), NAMES)
    assert [(f.kind, f.severity) for f in fs] == [("update_too_small", "warn")]
    d = fs[0].data
    # √(KL_TARGET / KL) = √(0.01 / 2e-5) = √500 = 22.36: the lr multiplier that reaches the target
    assert d["lr_factor_to_target"] == pytest.approx(math.sqrt(500))
    assert d["update_kl_median"] == pytest.approx(2e-5) and d["frac_steps_kl_small"] == 1.0
    assert d["n_updating_steps"] == 8 and d["signal_frac"] == pytest.approx(0.5)
    assert d["train_pass_late"] == pytest.approx(0.31)  # median of the last 3 (max(3, 25% of 8)): .33 .30 .31
    assert d["dev_pass"] == 0.33 and d["slope_ci"][0] <= 0 <= d["slope_ci"][1]
    assert d["thresholds"]["kl_target"]["value"] == KL_TARGET and "Schulman" in d["thresholds"]["kl_target"]["source"]
    assert "2e-05" in fs[0].explanation and "22.4" in fs[0].explanation


def test_median_kl_small_with_a_few_clipped_tokens_is_update_too_small():
    # the SmolLM2 default's seed-1 root (lr 2e-6): 5 of 8 steps below KL_SMALL (62.5%), median KL 6e-4, a median
    # clip fraction of 0.28%: the policy barely moves, so the finding must fire (a "75% of steps and no clipped
    # token" rule missed it)
    correct = [0.20, 0.22, 0.19, 0.21, 0.20, 0.23, 0.20, 0.21]
    kl = [3e-4, 5e-4, 6e-4, 1.5e-3, 6e-4, 2e-3, 4e-4, 1.2e-3]
    fs = run_analyzers(_ev(correct, kl, clip=0.0028), NAMES)
    assert [(f.kind, f.severity) for f in fs] == [("update_too_small", "warn")]
    d = fs[0].data
    assert d["frac_steps_kl_small"] == pytest.approx(5 / 8)
    assert d["update_kl_median"] == pytest.approx(6e-4)  # sorted: 3,4,5,6,6,12,15,20 (e-4): median (6 + 6) / 2
    assert d["lr_factor_to_target"] == pytest.approx(math.sqrt(0.01 / 6e-4))  # 4.08
    # the clip acting on 2% of the tokens (above CLIP_SMALL = 1%) or a median step at the KL_SMALL bound is not "too
    # small"
    assert _kinds(_ev(correct, kl, clip=0.02)) == []
    assert _kinds(_ev(correct, [1e-3] * 8, clip=0.0)) == []


def test_healthy_rising_run_raises_nothing():
    rng = np.random.default_rng(0)
    correct = list(np.linspace(0.3, 0.7, 10) + rng.normal(0, 0.02, 10))
    assert _kinds(_ev(correct, 3e-3, clip=0.01)) == []
    # slow updates but the reward rises significantly: learning, nothing to say either
    assert _kinds(_ev(correct, 2e-5)) == []


def test_update_too_large_and_its_factor():
    fs = run_analyzers(_ev([0.3, 0.35, 0.3, 0.4, 0.35, 0.3, 0.4, 0.35], 0.05, clip=0.05), NAMES)
    assert [(f.kind, f.severity) for f in fs] == [("update_too_large", "warn")]
    assert fs[0].data["lr_factor_to_target"] == pytest.approx(math.sqrt(0.01 / 0.05))  # 0.447: a cut
    # a clip binding on 30% of the tokens is too large whatever the KL
    fs = run_analyzers(_ev([0.3] * 8, 5e-3, clip=0.3), NAMES)
    assert [f.kind for f in fs] == ["update_too_large"]
    # large steps while the reward rises significantly (0.3 -> 0.65 in 8 steps): info, nothing to fix yet
    fs = run_analyzers(_ev(list(np.linspace(0.3, 0.65, 8)), 0.05), NAMES)
    assert [(f.kind, f.severity) for f in fs] == [("update_too_large", "info")]


def test_steps_without_update_are_not_judged_for_size():
    # 6 of 8 steps kept no group (zero variance): their update KL is 0 because nothing was updated; the two
    # updating steps moved 5e-3 (healthy): no update_too_small
    kept = [0, 0, 0.5, 0, 0, 0.5, 0, 0]
    kl = [0, 0, 5e-3, 0, 0, 5e-3, 0, 0]
    assert _kinds(_ev([0.3] * 8, kl, kept=kept)) == []
    fs = run_analyzers(_ev([0.3] * 8, [0, 0, 1e-5, 0, 0, 1e-5, 0, 0], kept=kept), NAMES)
    assert [f.kind for f in fs] == ["update_too_small"] and fs[0].data["n_updating_steps"] == 2


def test_plateau_after_a_rise():
    correct = [0.2, 0.3, 0.4, 0.5, 0.55, 0.55, 0.54, 0.55, 0.55]
    fs = run_analyzers(_ev(correct, 3e-3), NAMES)
    assert [(f.kind, f.severity) for f in fs] == [("plateau", "warn")]
    # first half (steps 0-4): Theil-Sen slope = median of the 10 pairwise slopes (.1 .1 .1 .0875 .1 .1 .0833
    # .1 .075 .05) = 0.1 per step x 4 steps = 0.4; second half (steps 4-8): slope 0, gain 0
    assert fs[0].data["gain_first_half"] == pytest.approx(0.4)
    assert fs[0].data["gain_second_half"] == pytest.approx(0.0)
    # the default run's v7 (8 steps): 0.375 over steps 0-4, then four points whose slope CI is about +-0.5 per step:
    # as likely still rising at the first half's pace (0.094 per step) as flat: no plateau
    noisy = [0.25, 0.375, 0.5, 0.5, 0.625, 0.5, 0.75, 0.5]
    assert [f.kind for f in run_analyzers(_ev(noisy, 3e-3), NAMES)] == []


def test_saturated_training_data_is_headroom_info_not_update_too_small():
    fs = run_analyzers(_ev([0.95, 0.97, 0.96, 0.95, 0.97, 0.96, 0.96, 0.97], 2e-5, dev=0.9), NAMES)
    assert [(f.kind, f.severity) for f in fs] == [("headroom", "info")]
    assert fs[0].data["train_pass_late"] == pytest.approx(0.96)  # median of the last 3: .96 .96 .97


def test_short_or_missing_series_raise_nothing():
    assert _kinds(_ev([0.3] * 5, 1e-5)) == []  # fewer than MIN_POINTS = 8
    ev = Evidence(metrics={"v0": {M.CORRECT_MEAN: [(i, 0.3) for i in range(8)]}})  # no update-size metrics
    assert _kinds(ev) == []


def test_stored_default_style_run_is_update_too_small():
    # tests/data/progress/smollm2_default_lr2e-6.json: 8 GRPO steps of examples/default.yaml's recipe
    # (SmolLM2-135M, lr 2e-6), metrics as the local trainer logged them (scripts in its "how" field)
    run = json.loads((DATA / "smollm2_default_lr2e-6.json").read_text())
    ev = Evidence(metrics={"v0": {k: [tuple(p) for p in s] for k, s in run["metrics"].items()}},
                  recipes={"v0": run["recipe"]})
    fs = run_analyzers(ev, NAMES)
    assert [(f.kind, f.severity) for f in fs] == [("update_too_small", "warn")], [f.explanation for f in fs]
    d = fs[0].data
    # step 6 kept no group (all 4 groups zero-variance): 7 updating steps; their update KLs sorted:
    # 1.44e-4 2.07e-4 3.45e-4 3.57e-4 3.82e-4 4.13e-4 1.19e-3 -> median 3.57e-4, 6 of 7 below 1e-3
    assert d["n_updating_steps"] == 7 and d["frac_steps_kl_small"] == pytest.approx(6 / 7)
    assert d["update_kl_median"] == pytest.approx(3.57e-4, rel=2e-3)
    assert d["lr_factor_to_target"] == pytest.approx(math.sqrt(0.01 / d["update_kl_median"]))  # ≈ 5.29
    assert d["lr"] == 2e-6 and d["clip_frac_median"] == 0.0 and d["train_pass_late"] < 0.9


@pytest.mark.parametrize(("lr", "expected"), [(1e-7, [("update_too_small", "warn")]),
                                              (5e-3, [("update_too_large", "warn")])])
def test_tiny_model_run_end_to_end(tmp_path, lr, expected):
    # The whole path: local trainer -> lineage metrics -> Evidence.from_workspace -> analyzers. The tiny random
    # model is paid for the token ' slice' (~3% of completions on level 1's 0..19 operands). At lr 1e-7 the
    # update KL is ~1e-8 and the reward drifts at random: too small. At lr 5e-3 the updates go far past PPO's
    # target while the rare token is not learned in 8 steps (no significant reward rise): too large to pay off
    # (warn). The paying-off case (info) is the hand-made series above. (On the 1-digit prompts of old, where
    # ' slice' was ~12%, the same run learned the token and read info.)
    from evotrainer.recipe import validate_recipe
    from evotrainer.rl_backend.local import LocalBackend
    from evotrainer.workspace import Workspace

    ws = Workspace(tmp_path / "run", writer=True)
    v = ws.lineage.create_root(validate_recipe({
        "model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 8, "rollout_batch_size": 4,
        "generate_max_len": 6, "init_kl_coef": 0.0, "actor_learning_rate": lr, "micro_train_batch_size": 32,
        "reward": {"format_token": {"weight": 1.0, "params": {"token": "slice"}}}, "eval": {"k": 2, "max_problems": 2}}))
    LocalBackend(checkpoint_every=100, num_threads=1).train(ws, v.id, 8)
    fs = run_analyzers(Evidence.from_workspace(ws, rollouts=False), NAMES)
    ws.close()
    assert [(f.kind, f.severity) for f in fs] == expected, [f.explanation for f in fs]
    assert fs[0].data["reward_metric"] == M.REWARD_MEAN and fs[0].data["pass_metric"] == M.CORRECT_MEAN


def _grad_ev(grad, zero_std=None, reward_std=None, clipped=None, kl=None):
    n = len(grad)

    def ser(x):
        return list(zip(range(1, n + 1), x, strict=True))

    m = {M.POLICY_GRAD_NORM: ser(grad)}
    for name, x in ((M.REWARD_FRAC_ZERO_STD, zero_std), (M.REWARD_STD, reward_std),
                    (M.COMPLETIONS_CLIPPED_RATIO, clipped), (M.POLICY_KL, kl)):
        if x is not None:
            m[name] = ser(x)
    return Evidence(metrics={"v0": m})


def test_a_zero_gradient_while_groups_carry_signal_is_no_update():
    """ms-swift#5890 (its logging.jsonl, steps 9-10): grad_norm 0.0 and kl 0.0 while 61% / 50% of groups had reward
    spread (frac_reward_zero_std 0.39 / 0.5): no gradient reaches the weights: blocking from two such steps."""
    fs = run_analyzers(_grad_ev([0.0, 0.0], zero_std=[0.390625, 0.5], kl=[0.0, 0.0]), ["no_gradient"])
    assert [(f.kind, f.severity) for f in fs] == [("update_too_small", "blocking")]
    assert fs[0].data == {"zero_grad_steps": 2, "judged_steps": 2, "no_gradient": True} and fs[0].steps == [1, 2]
    assert "55.5% of groups carry reward variance" in fs[0].explanation  # median of 0.609375 and 0.5
    assert "KL to the reference stays 0" in fs[0].explanation
    # one step (ms-swift#5571: every group spread, frac 0.0), judged by the batch reward std where no fraction is
    # logged: warn
    fs = run_analyzers(_grad_ev([0.0], reward_std=[0.44]), ["no_gradient"])
    assert [(f.kind, f.severity) for f in fs] == [("update_too_small", "warn")]


def test_zero_gradients_with_no_signal_or_all_truncated_are_not_judged():
    # every group constant: a zero gradient is expected (zero_variance_groups names it)
    assert run_analyzers(_grad_ev([0.0, 0.0], zero_std=[1.0, 1.0]), ["no_gradient"]) == []
    # every completion cut at the cap (a trainer masking truncated completions has no token to learn from)
    assert run_analyzers(_grad_ev([0.0, 0.0], zero_std=[0.3, 0.3], clipped=[1.0, 1.0]), ["no_gradient"]) == []
    # the group filters kept no group (EvoTrainer logs grad norm 0 and kept_group_frac 0 for a step it skipped)
    ev = _grad_ev([0.0, 0.0], zero_std=[0.3, 0.3])
    ev.metrics["v0"][M.REWARD_KEPT_GROUP_FRAC] = (np.array([1, 2]), np.array([0.0, 0.0]))
    assert run_analyzers(ev, ["no_gradient"]) == []
    # a gradient on most steps (3 of 4 non-zero): no finding; nor without any signal series
    assert run_analyzers(_grad_ev([0.0, 0.2, 0.3, 0.1], zero_std=[0.3] * 4), ["no_gradient"]) == []
    assert run_analyzers(_grad_ev([0.0, 0.0]), ["no_gradient"]) == []
