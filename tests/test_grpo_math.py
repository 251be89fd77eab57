"""GRPO maths (rl_backend/grpo.py): hand-computed values, and agreement with OpenRLHF 0.11.2's loss code.

The reference tests import OpenRLHF's ``openrlhf.models.loss.PolicyLoss`` and
``openrlhf.models.utils.compute_approx_kl`` / ``compute_entropy`` on CPU: install it with
``pip install --no-deps openrlhf==0.11.2 pylatexenc``; ``deepspeed`` is stubbed in ``sys.modules``
and ``openrlhf.models`` is registered as a bare package (its ``__init__`` imports flash-attn).
They skip, saying so, only when the openrlhf package is not installed.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types

import numpy as np
import pytest
import torch

from evotrainer.harness.backtest import filter_keep
from evotrainer.rl_backend import grpo

L2 = math.log(2.0)


# --- advantages -------------------------------------------------------------------------------------
def test_group_norm_hand_computed():
    # group 1 [1,0,0]: mean 1/3, unbiased var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3, std 0.57735
    #   → (2/3)/0.57735 = 1.154701, (-1/3)/0.57735 = -0.577350
    # group 2 [1,1,0]: mean 2/3 → 0.577350, 0.577350, -1.154701
    r = torch.tensor([1.0, 0, 0, 1, 1, 0])
    adv = grpo.group_advantages(r, 3, "group_norm")
    torch.testing.assert_close(adv, torch.tensor([1.154701, -0.577350, -0.577350, 0.577350, 0.577350, -1.154701]),
                               atol=1e-6, rtol=0)


def test_dr_grpo_and_rloo_hand_computed():
    r = torch.tensor([1.0, 0, 0, 1, 1, 0])
    # dr_grpo: r - mean: group 1 mean 1/3, group 2 mean 2/3
    torch.testing.assert_close(grpo.group_advantages(r, 3, "dr_grpo"),
                               torch.tensor([2 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -2 / 3]))
    # rloo: r_i - mean of the other two: 1-0, 0-0.5, 0-0.5 | 1-0.5, 1-0.5, 0-1
    torch.testing.assert_close(grpo.group_advantages(r, 3, "rloo"),
                               torch.tensor([1.0, -0.5, -0.5, 0.5, 0.5, -1.0]))


def test_sample_without_tokens_is_left_out_of_the_baseline():
    # group [1, 0, 0*] with the third sample empty: baseline from [1, 0] only:
    # mean 0.5, unbiased std sqrt(0.5) = 0.707107 → +0.707107, -0.707107, and 0 for the empty one.
    r = torch.tensor([1.0, 0.0, 0.0])
    valid = torch.tensor([True, True, False])
    adv = grpo.group_advantages(r, 3, "group_norm", valid=valid)
    torch.testing.assert_close(adv, torch.tensor([0.707107, -0.707107, 0.0]), atol=1e-6, rtol=0)
    # With it included (the OpenRLHF behaviour) the advantages differ: 1.154701, -0.577350, -0.577350
    assert abs(grpo.group_advantages(r, 3)[0].item() - 1.154701) < 1e-6
    # rloo with the empty sample left out: 1 - 0 = 1, 0 - 1 = -1, 0
    torch.testing.assert_close(grpo.group_advantages(r, 3, "rloo", valid=valid), torch.tensor([1.0, -1.0, 0.0]))


def test_zero_variance_group_has_zero_advantage_and_bad_shapes_raise():
    adv = grpo.group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2)
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="multiple of group_size=3"):
        grpo.group_advantages(torch.zeros(4), 3)
    with pytest.raises(ValueError, match="advantage_estimator='ppo'"):
        grpo.group_advantages(torch.zeros(4), 2, "ppo")


# --- policy loss ------------------------------------------------------------------------------------
def _loss_case():
    # row 0 (A=+1): ratios 1.5, 1.1, pad ; row 1 (A=-1): ratios 0.5, 1.0, 1.5
    ratio = torch.tensor([[1.5, 1.1, 1.0], [0.5, 1.0, 1.5]])
    old = torch.full((2, 3), -1.0)
    logp = old + ratio.log()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -1.0])
    return logp, old, adv, mask


def test_clipped_loss_both_sides_hand_computed():
    logp, old, adv, mask = _loss_case()
    out = grpo.policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # per token -min(ρA, clip(ρ)A):
    #   row 0: ρ=1.5 → -min(1.5, 1.28) = -1.28 (high clip); ρ=1.1 → -1.1
    #   row 1: ρ=0.5 → -min(-0.5, -0.8) = 0.8 (low clip); ρ=1.0 → 1.0; ρ=1.5 → -min(-1.5, -1.28) = 1.5
    # token-mean: (-1.28 - 1.1 + 0.8 + 1.0 + 1.5) / 5 = 0.92 / 5 = 0.184
    assert out.loss.item() == pytest.approx(0.184, abs=1e-6)
    assert out.clip_ratio_high.item() == pytest.approx(0.2)  # 1 of 5 tokens
    assert out.clip_ratio_low.item() == pytest.approx(0.2)  # 1 of 5 tokens
    # seq-mean-token-mean: row 0 -2.38/2 = -1.19, row 1 3.3/3 = 1.1 → (-1.19 + 1.1) / 2 = -0.045
    seq = grpo.policy_loss(logp, old, adv, mask, 0.2, 0.28, loss_agg_mode="seq-mean-token-mean")
    assert seq.loss.item() == pytest.approx(-0.045, abs=1e-6)
    # seq-mean-token-sum: (-2.38 + 3.3) / 2 = 0.46
    ssum = grpo.policy_loss(logp, old, adv, mask, 0.2, 0.28, loss_agg_mode="seq-mean-token-sum")
    assert ssum.loss.item() == pytest.approx(0.46, abs=1e-6)


def test_clipped_tokens_have_no_gradient_and_micro_batches_add_up():
    logp, old, adv, mask = _loss_case()
    logp = logp.clone().requires_grad_(True)
    grpo.policy_loss(logp, old, adv, mask, 0.2, 0.28).loss.backward()
    g = logp.grad
    # d/dlogp of -ρA/5 = -ρA/5 where unclipped; 0 where clipped or masked
    torch.testing.assert_close(g, torch.tensor([[0.0, -1.1 / 5, 0.0], [0.0, 1.0 / 5, 1.5 / 5]]))
    # two micro-batches with num_tokens=5 sum to the full token-mean loss
    full = grpo.policy_loss(logp, old, adv, mask).loss
    parts = sum(grpo.policy_loss(logp[i:i + 1], old[i:i + 1], adv[i:i + 1], mask[i:i + 1], num_tokens=5).loss
                for i in range(2))
    torch.testing.assert_close(parts, full)


# --- KL, entropy ------------------------------------------------------------------------------------
def test_kl_estimators_hand_computed():
    lp = torch.tensor([[L2, -L2]])
    ref = torch.zeros(1, 2)
    # k1 = log r = ±0.693147; k2 = (log r)^2 / 2 = 0.240227
    torch.testing.assert_close(grpo.kl_penalty(lp, ref, "k1"), torch.tensor([[L2, -L2]]))
    torch.testing.assert_close(grpo.kl_penalty(lp, ref, "k2"), torch.tensor([[0.240227, 0.240227]]), atol=1e-6, rtol=0)
    # k3 = exp(-log r) - 1 + log r: 0.5 - 1 + 0.693147 = 0.193147 ; 2 - 1 - 0.693147 = 0.306853
    torch.testing.assert_close(grpo.kl_penalty(lp, ref, "k3"), torch.tensor([[0.193147, 0.306853]]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="kl_estimator='k4'"):
        grpo.kl_penalty(lp, ref, "k4")


def test_entropy_and_selective_log_softmax():
    # uniform over V=4: H = log 4 = 1.386294; one-hot-ish logits → H ≈ 0
    logits = torch.tensor([[0.0, 0, 0, 0], [100.0, 0, 0, 0]])
    torch.testing.assert_close(grpo.entropy_from_logits(logits), torch.tensor([math.log(4), 0.0]), atol=1e-6, rtol=0)
    lg = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    idx = torch.randint(0, 7, (2, 3), generator=torch.Generator().manual_seed(1))
    ref = torch.log_softmax(lg, -1).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(grpo.selective_log_softmax(lg, idx), ref)


# --- group filters ----------------------------------------------------------------------------------
def test_group_filters_hand_computed():
    r = torch.tensor([0.0, 0, 1, 0, 1, 1, 0.5, 0.5])  # G=2: means 0, 0.5, 1, 0.5
    assert grpo.zero_variance_groups(r, 2).tolist() == [True, False, True, True]
    # OpenRLHF: keep low < mean < high (strict) → (0, 1) keeps the groups with mean 0.5
    assert grpo.dynamic_filter_keep(r, 2, 0.0, 1.0).tolist() == [False, True, False, True]
    # G=3 stds: [0,0,0] → 0 ; [0,0,1] → 0.57735 ; [0,2,4] → 2. top_p=0.5 of 3 → ceil(1.5) = 2 groups
    r3 = torch.tensor([0.0, 0, 0, 0, 0, 1, 0, 2, 4])
    assert grpo.top_p_std_keep(r3, 3, 0.5).tolist() == [False, True, True]
    assert grpo.top_p_std_keep(r3, 3, 1.0).tolist() == [True, True, True]
    assert grpo.top_p_std_keep(r3, 3, 0.1).tolist() == [False, False, True]  # at least one group
    with pytest.raises(ValueError, match="group_filter_top_p=0"):
        grpo.top_p_std_keep(r3, 3, 0.0)


# --- agreement with OpenRLHF ------------------------------------------------------------------------
def _openrlhf():
    spec = importlib.util.find_spec("openrlhf")
    if spec is None:
        pytest.skip("reference package openrlhf not installed: pip install --no-deps openrlhf==0.11.2 pylatexenc")
    root = spec.submodule_search_locations[0]
    stub = "deepspeed" not in sys.modules
    if stub:  # only used by ZeRO-3 helpers; removed again below, or transformers' find_spec("deepspeed") breaks
        sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    try:
        if "openrlhf.models" not in sys.modules:
            pkg = types.ModuleType("openrlhf.models")
            pkg.__path__ = [root + "/models"]  # bare package: its __init__ imports flash-attn
            sys.modules["openrlhf.models"] = pkg
        from openrlhf.models.loss import PolicyLoss
        from openrlhf.models.utils import compute_approx_kl, compute_entropy
    finally:
        if stub:
            del sys.modules["deepspeed"]

    return PolicyLoss, compute_approx_kl, compute_entropy


def _random_batch(seed=0, B=6, T=9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3  # ratios spread over both clips
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.25).to(torch.float64)
    mask[:, 0] = 1
    return logp, old, adv, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policy_loss_matches_openrlhf(seed):
    PolicyLoss, _, _ = _openrlhf()
    logp, old, adv, mask = _random_batch(seed)
    adv_t = adv.unsqueeze(-1).expand_as(logp)  # OpenRLHF takes per-token advantages
    for token_level, mode in ((True, "token-mean"), (False, "seq-mean-token-mean")):
        ref_loss, ref_clip, *_ = PolicyLoss(0.2, 0.28, token_level_loss=token_level)(logp, old, adv_t, mask)
        ours = grpo.policy_loss(logp, old, adv, mask, 0.2, 0.28, loss_agg_mode=mode)
        torch.testing.assert_close(ours.loss, ref_loss, atol=1e-6, rtol=0)
        # OpenRLHF's clip_ratio counts both sides; ours splits it into low + high
        torch.testing.assert_close(ours.clip_ratio_low + ours.clip_ratio_high, ref_clip, atol=1e-6, rtol=0)
        assert ours.clip_ratio_low > 0 and ours.clip_ratio_high > 0  # the case exercises both sides
    # gradients agree too
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    PolicyLoss(0.2, 0.28)(a, old, adv_t, mask)[0].backward()
    grpo.policy_loss(b, old, adv, mask, 0.2, 0.28).loss.backward()
    torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_kl_and_entropy_match_openrlhf(est):
    _, compute_approx_kl, compute_entropy = _openrlhf()
    logp, old, _, _ = _random_batch(3)
    logp[0, 0] = old[0, 0] - 15  # exercises the clamps
    torch.testing.assert_close(grpo.kl_penalty(logp, old, est), compute_approx_kl(logp, old, kl_estimator=est),
                               atol=1e-6, rtol=0)
    logits = torch.randn(4, 5, 11, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(grpo.entropy_from_logits(logits), compute_entropy(logits), atol=1e-6, rtol=0)


@pytest.mark.parametrize("est", ["group_norm", "dr_grpo", "rloo"])
def test_advantages_match_openrlhf_formula(est):
    # OpenRLHF computes advantages inline in experience_maker.py (no importable function); these are
    # its lines for 0.11.2, verbatim apart from the variable names.
    _openrlhf()
    g = torch.Generator().manual_seed(5)
    n = 8
    rewards = (torch.rand(5 * n, generator=g) > 0.6).double() + torch.rand(5 * n, generator=g, dtype=torch.float64) * 0.1
    ref = rewards.reshape(-1, n)
    if est == "rloo":
        ref = ref - (ref.sum(-1, keepdim=True) - ref) / (n - 1)
    elif est == "dr_grpo":
        ref = ref - ref.mean(-1, keepdim=True)
    else:
        ref = (ref - ref.mean(-1, keepdim=True)) / (ref.std(-1, keepdim=True) + 1e-9)
    torch.testing.assert_close(grpo.group_advantages(rewards, n, est), ref.reshape(-1), atol=1e-6, rtol=0)


def test_group_filter_keep_applies_the_filters_in_the_trainers_order():
    # groups of 3: all-zero (zero variance), mean 1/3, mean 2/3 (higher std than the next), all-one
    r = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert grpo.group_filter_keep(r, 3).tolist() == [False, True, True, False]
    assert grpo.group_filter_keep(r, 3, drop_zero_variance_groups=False).tolist() == [True] * 4
    assert grpo.group_filter_keep(r, 3, dynamic_filtering=True, dynamic_filtering_range=(0.5, 1.0)).tolist() == \
        [False, False, True, False]
    # top-p among the groups still kept: of the two kept groups (equal std) the earlier one stays
    assert grpo.group_filter_keep(r, 3, group_filter_top_p=0.5).tolist() == [False, True, False, False]


def test_the_backtest_replays_the_trainers_group_filter():
    rng = np.random.default_rng(3)
    for _ in range(20):
        r = rng.integers(0, 3, size=24).astype(np.float64) / 2
        for kw in ({}, {"dynamic_filtering": True}, {"group_filter_top_p": 0.5},
                   {"drop_zero_variance_groups": False, "group_filter_top_p": 0.3}):
            assert filter_keep(r, 4, **kw).tolist() == grpo.group_filter_keep(torch.tensor(r), 4, **kw).tolist()

