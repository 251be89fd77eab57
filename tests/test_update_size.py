"""Update-size metrics (issue 16): KL between the policy before and after a step's update, ratio
statistics, relative update norm. Hand values on the pure functions, a weight copy on an AdamW step,
and the local trainer on the tiny random model."""

from __future__ import annotations

import math
import os

import pytest
import torch

from evotrainer import metrics as M
from evotrainer.recipe import validate_recipe
from evotrainer.rl_backend import grpo
from evotrainer.rl_backend.local import LocalBackend, adamw_step_norms
from evotrainer.rl_backend.models import load_policy
from evotrainer.workspace import Workspace

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_update_stats_hand_values():
    # one sample, 2 tokens, π_old = (0.5, 0.25), π_new = (0.6, 0.3): ρ = 1.2 on both tokens.
    old = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    new = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding: ignored
    u = grpo.update_stats(new, old, torch.tensor([1.0]), mask, eps_low=0.2, eps_high=0.28)
    assert u.n_tokens == 2
    # k1 = -log ρ = -ln 1.2 = -0.182322 per token; k3 = (ρ - 1) - log ρ = 0.2 - 0.182322 = 0.017678
    assert u.kl_k1_sum / 2 == pytest.approx(-0.1823216, abs=1e-6)
    assert u.kl_k3_sum / 2 == pytest.approx(0.0176784, abs=1e-6)
    assert u.abs_dev_sum / 2 == pytest.approx(0.2, abs=1e-6)
    assert u.ratio_max == pytest.approx(1.2) and u.ratio_min == pytest.approx(1.2)
    assert u.clip_sum == 0  # 1.2 < 1 + 0.28
    # ε_high = 0.1: both tokens (A > 0) are past 1.1, the clip binds; with A < 0 only ρ < 0.8 would
    assert grpo.update_stats(new, old, torch.tensor([1.0]), mask, 0.2, 0.1).clip_sum == 2
    assert grpo.update_stats(new, old, torch.tensor([-1.0]), mask, 0.2, 0.1).clip_sum == 0
    # micro-batches add up: two halves give the sums of the whole
    both = grpo.update_stats(new[:, :1], old[:, :1], torch.tensor([1.0]), mask[:, :1]) + \
        grpo.update_stats(new[:, 1:], old[:, 1:], torch.tensor([1.0]), mask[:, 1:])
    assert both.kl_k3_sum == pytest.approx(u.kl_k3_sum) and both.n_tokens == 2
    with pytest.raises(ValueError, match=r"must all be \(B, T\)"):
        grpo.update_stats(new, old[:, :2], torch.tensor([1.0]), mask)


def test_adamw_step_norms_match_a_weight_copy():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 4)  # 24 parameters
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randn(8, 5)
    for step in range(3):
        before = [p.detach().clone() for p in lin.parameters()]
        opt.zero_grad()
        lin(x).pow(2).sum().backward()
        opt.step()
        d, t = adamw_step_norms(opt)
        exp_d = math.sqrt(sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(lin.parameters(), before, strict=True)))
        exp_t = math.sqrt(sum(float(b.pow(2).sum()) for b in before))
        assert d == pytest.approx(exp_d, rel=1e-4) and t == pytest.approx(exp_t, rel=1e-6)
        if step == 0:
            # first Adam step: m̂/√v̂ = g/|g| = ±1 per coordinate, so ||dθ|| ≈ lr·√24 plus weight decay
            # lr·wd·||θ||; the two are nearly orthogonal: √(0.01²·24 + (1e-3·||θ||)²)
            assert d == pytest.approx(math.sqrt(1e-4 * 24 + (1e-3 * exp_t) ** 2), rel=0.05)
    assert adamw_step_norms(torch.optim.SGD(lin.parameters(), lr=0.1))[0] != adamw_step_norms(opt)[0]  # nan


TINY = {"model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 8, "rollout_batch_size": 4,
        "generate_max_len": 6, "init_kl_coef": 0.0, "micro_train_batch_size": 32, "drop_zero_variance_groups": False,
        "reward": {"format_token": {"weight": 1.0, "params": {"token": "slice"}}}, "eval": {"k": 2, "max_problems": 2}}


def _train(tmp_path, name, steps=1, data=None, **over):
    ws = Workspace(tmp_path / name, writer=True)
    v = ws.lineage.create_root(validate_recipe({**TINY, **({"data": data} if data else {}), **over}))
    LocalBackend(checkpoint_every=100, num_threads=1).train(ws, v.id, steps)
    ms = {k: [x for _, x in s] for k, s in ws.lineage.all_metrics(v.id).items()}
    return ws, ws.lineage.get(v.id), ms


def test_a_step_without_reward_variance_logs_no_update(tmp_path):
    # a token the tiny model never writes: every reward 0, zero advantages, no update (every update metric 0,
    # ratio 1), and the weights stay those of the base model
    ws, v, ms = _train(tmp_path, "none", steps=1, actor_learning_rate=1e-3,
                       reward={"format_token": {"weight": 1.0, "params": {"token": "zzqqxx"}}})
    for name in M.UPDATE_STEP_METRICS:
        assert name in ms and all(math.isfinite(x) for x in ms[name]), name
    assert ms[M.REWARD_STD] == [0.0]
    assert ms[M.POLICY_UPDATE_NORM][0] == 0 and ms[M.POLICY_UPDATE_KL][0] == 0 and ms[M.POLICY_RATIO_MAX][0] == 1
    ws.close()


def test_local_trainer_logs_update_size_that_matches_the_weights(tmp_path):
    # step 0 on the default level-1 prompts: 1 of the 32 completions contains ' slice' (reward std 0.174),
    # so one group has variance and the step moves the weights
    ws, v, ms = _train(tmp_path, "one", steps=1, actor_learning_rate=1e-3)
    for name in M.UPDATE_STEP_METRICS:
        assert name in ms and all(math.isfinite(x) for x in ms[name]), name
    assert ms[M.REWARD_STD][0] > 0
    # ||dθ|| / ||θ|| of step 0, from the base weights and the saved checkpoint
    base = dict(load_policy(v.recipe.model).model.named_parameters())
    after = dict(load_policy(v.recipe.model, checkpoint=v.checkpoint).model.named_parameters())
    d2 = sum(float((after[k].detach().double() - p.detach().double()).pow(2).sum()) for k, p in base.items())
    t2 = sum(float(p.detach().double().pow(2).sum()) for p in base.values())
    assert ms[M.POLICY_UPDATE_REL_NORM][0] == pytest.approx(math.sqrt(d2 / t2), rel=1e-3)
    # one PPO epoch: the loss's ratio is 1, so the ratio extremes are those of the updated policy
    assert ms[M.POLICY_UPDATE_KL][0] > 0 and ms[M.POLICY_RATIO_MAX][0] > 1 > ms[M.POLICY_RATIO_MIN][0]
    assert ms[M.POLICY_GRAD_NORM_X_LR][0] == pytest.approx(ms[M.POLICY_GRAD_NORM][0] * 1e-3)
    ws.close()


def test_update_size_scales_with_the_learning_rate(tmp_path):
    # step 0 (it has reward variance) from the same weights and rollouts (same seeds): Adam's step is
    # lr·m̂/√v̂ with m̂/√v̂ independent of lr, so ||dθ|| ∝ lr exactly (x10); for small steps log ρ is linear
    # in dθ, so |ρ - 1| ∝ lr (x10) and the KL ≈ E[(log ρ)²]/2 ∝ lr² (x100).
    _, _, lo = _train(tmp_path, "lo", steps=1, actor_learning_rate=1e-5)
    _, _, hi = _train(tmp_path, "hi", steps=1, actor_learning_rate=1e-4)
    assert hi[M.POLICY_UPDATE_NORM][0] / lo[M.POLICY_UPDATE_NORM][0] == pytest.approx(10.0, rel=1e-3)
    # |ρ - 1| close to x10, KL below x100 as the larger step leaves the quadratic regime
    assert hi[M.POLICY_RATIO_MEAN_ABS_DEV][0] / lo[M.POLICY_RATIO_MEAN_ABS_DEV][0] == pytest.approx(10.0, rel=0.2)
    assert 50 < hi[M.POLICY_UPDATE_KL][0] / lo[M.POLICY_UPDATE_KL][0] < 150
