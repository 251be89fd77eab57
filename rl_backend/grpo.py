"""GRPO maths: group advantages, the clipped policy loss, KL estimators, group filters, entropy.

Pure functions, tensors in and tensors out; no model, no I/O. Shapes: ``B`` = prompts × samples per
prompt (rows are grouped: samples of one prompt are contiguous, ``G`` per group), ``T`` =
completion tokens (right-padded; ``completion_mask`` (B, T) is 1 on trainable tokens and 0 on
padding and, in multi-turn episodes, on observation / tool-output tokens).

Sources, formula by formula:

* group_norm advantages: GRPO (Shao et al. 2024, DeepSeekMath §4.1.2): ``(r - mean_g) / std_g``;
  unbiased std and ``+1e-9`` as OpenRLHF 0.11 ``experience_maker`` (``group_norm``).
* dr_grpo advantages: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", eq. 3):
  ``r - mean_g`` without std scaling.
* rloo: leave-one-out baseline (Ahmadian et al. 2024): ``r_i - (sum_g - r_i) / (G - 1)``.
* reinforce_baseline: ``r - mean_g`` then normalised over the batch (REINFORCE++-baseline,
  OpenRLHF).
* PPO clipped surrogate with Clip-Higher: Schulman et al. 2017 eq. 7 with asymmetric bounds
  ``[1 - eps_low, 1 + eps_high]`` (DAPO, Yu et al. 2025 eq. 10); identical to OpenRLHF's
  ``PolicyLoss`` (ppo, no dual clip) and TRL's GRPO loss.
* KL estimators k1 / k2 / k3: Schulman 2020, "Approximating KL divergence"
  (http://joschu.net/blog/kl-approx.html), value clamps as OpenRLHF ``compute_approx_kl``.
* Update size (``update_stats``): KL(π_old ‖ π_new) on the update's own tokens with k1 and k3
  (Schulman 2020; k3 = ``(ρ - 1) - log ρ`` is CleanRL's / "The 37 implementation details of PPO"
  ``approx_kl``), ratio extremes and the fraction of tokens the clip would bind on.
* Loss aggregation: token-mean (DAPO eq. 12), seq-mean-token-mean (GRPO eq. 3),
  seq-mean-token-sum (Dr. GRPO-style sums), named as verl's ``loss_agg_mode``.
* Group filters: zero-variance groups carry no gradient under group_norm (DAPO §3.2);
  dynamic sampling keeps groups with ``low < mean < high`` (OpenRLHF ``dynamic_filtering_range``);
  top-p by reward std (RAGEN, Wang et al. 2025, SNR-based rollout filtering).

Departure from OpenRLHF and TRL: a sample with no trainable token (empty or fully masked
completion) is excluded from its group's baseline and gets advantage 0 (``valid`` argument); both
libraries include such samples in the group mean/std, which shifts the other samples' advantages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from evotrainer.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:  # imported at first use: the harness and the MCP servers load this module without running a model
    torch = lazy_module("torch")

ADVANTAGE_ESTIMATORS = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3")


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected shape (B,), got {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards has {rewards.numel()} rows, not a multiple of group_size={group_size}; "
            "pass the samples of each prompt contiguously, G per prompt"
        )
    return rewards.reshape(-1, group_size)  # (B/G, G)


def group_advantages(rewards: torch.Tensor, group_size: int, estimator: str = "group_norm",
                     valid: torch.Tensor | None = None, eps: float = 1e-9) -> torch.Tensor:
    """Group-relative advantages, one scalar per sample.

    Args:
        rewards: (B,) total reward of each sample, groups contiguous.
        group_size: G, samples per prompt.
        estimator: ``group_norm`` | ``dr_grpo`` | ``rloo`` | ``reinforce_baseline`` (module docstring).
        valid: (B,) bool; False marks a sample with no trainable token. It is left out of its
            group's mean / std / leave-one-out baseline and gets advantage 0. Default: all valid.
        eps: added to the std (group_norm, reinforce_baseline), as OpenRLHF.

    Returns:
        (B,) float advantages. A group with fewer than 2 valid samples gets 0 everywhere under
        group_norm and rloo (its std / leave-one-out baseline is undefined).

    Raises:
        ValueError: unknown estimator or B not a multiple of G.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage_estimator={estimator!r}: allowed: {', '.join(ADVANTAGE_ESTIMATORS)}")
    r = _groups(rewards.double(), group_size)  # (N, G)
    v = torch.ones_like(r, dtype=torch.bool) if valid is None else _groups(valid.bool(), group_size)
    vf = v.double()
    n = vf.sum(-1, keepdim=True)  # (N, 1) valid samples per group
    mean = (r * vf).sum(-1, keepdim=True) / n.clamp(min=1)
    if estimator == "group_norm":
        var = (((r - mean) * vf) ** 2).sum(-1, keepdim=True) / (n - 1).clamp(min=1)
        adv = (r - mean) / (var.sqrt() + eps)
        adv = torch.where(n >= 2, adv, torch.zeros_like(adv))
    elif estimator == "rloo":
        baseline = ((r * vf).sum(-1, keepdim=True) - r) / (n - 1).clamp(min=1)
        adv = torch.where(n >= 2, r - baseline, torch.zeros_like(r))
    else:  # dr_grpo, reinforce_baseline
        adv = r - mean
    adv = adv * vf
    if estimator == "reinforce_baseline":
        flat, vflat = adv.reshape(-1), v.reshape(-1)
        if vflat.sum() >= 2:
            mu, sd = flat[vflat].mean(), flat[vflat].std()
            adv = ((adv - mu) / (sd + eps)) * vf
    return adv.reshape(-1).to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def group_reward_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B/G,) unbiased reward std of each group (0 for G = 1)."""
    r = _groups(rewards.double(), group_size)
    return r.std(-1) if group_size > 1 else torch.zeros(r.shape[0], dtype=torch.float64)


def zero_variance_groups(rewards: torch.Tensor, group_size: int, tol: float = 1e-8) -> torch.Tensor:
    """(B/G,) bool: True where every reward of the group is the same (max - min <= tol).

    Such groups have zero group_norm advantage and give no policy gradient (DAPO §3.2).
    """
    r = _groups(rewards.double(), group_size)
    return (r.max(-1).values - r.min(-1).values) <= tol


def dynamic_filter_keep(rewards: torch.Tensor, group_size: int, low: float, high: float) -> torch.Tensor:
    """(B/G,) bool: keep groups whose mean reward lies strictly inside (low, high).

    OpenRLHF semantics (``samples_generator``: ``min_r < avg_reward < max_r``); with rewards in
    [0, 1] and the default (0, 1) this drops all-wrong and all-right groups (DAPO dynamic sampling).
    """
    if not low < high:
        raise ValueError(f"dynamic_filtering_range=({low}, {high}): need low < high")
    m = _groups(rewards.double(), group_size).mean(-1)
    return (m > low) & (m < high)


def top_p_std_keep(rewards: torch.Tensor, group_size: int, top_p: float) -> torch.Tensor:
    """(B/G,) bool: keep the ``ceil(top_p × n_groups)`` groups with the largest reward std.

    RAGEN's SNR filter keeps the high-variance (high signal-to-noise) groups. Ties keep the
    earlier group. ``top_p = 1`` keeps all; at least one group is always kept.

    Raises:
        ValueError: top_p outside (0, 1].
    """
    if not 0 < top_p <= 1:
        raise ValueError(f"group_filter_top_p={top_p}: must be in (0, 1], e.g. 0.5")
    std = group_reward_std(rewards, group_size)
    n = std.numel()
    k = max(1, math.ceil(top_p * n - 1e-9))
    keep = torch.zeros(n, dtype=torch.bool)
    # stable sort on -std: among equal std the earlier group comes first
    order = torch.sort(-std, stable=True).indices
    keep[order[:k]] = True
    return keep


def group_filter_keep(rewards: torch.Tensor, group_size: int, *, drop_zero_variance_groups: bool = True,
                      dynamic_filtering: bool = False, dynamic_filtering_range: tuple[float, float] = (0.0, 1.0),
                      group_filter_top_p: float = 1.0) -> torch.Tensor:
    """(B/G,) bool keep mask of the group filters, in the trainer's order (the one implementation).

    Drop zero-variance groups (:func:`zero_variance_groups`), then keep groups inside the
    dynamic-sampling range (:func:`dynamic_filter_keep`), then, among the groups still kept, the top-p by
    reward std (:func:`top_p_std_keep`). The local trainer applies it to each refill round (with
    ``group_filter_top_p=1``) and to the whole step; the harness's backtests replay it on stored groups.

    Args:
        rewards: (B,) total reward of each sample, groups contiguous.
        group_size: G, samples per prompt.
        drop_zero_variance_groups, dynamic_filtering, dynamic_filtering_range, group_filter_top_p:
            the recipe's fields of the same names.

    Raises:
        ValueError: B not a multiple of G (when a filter is on), a bad range or top_p.
    """
    n_groups = rewards.numel() // group_size
    keep = torch.ones(n_groups, dtype=torch.bool)
    if drop_zero_variance_groups:
        keep &= ~zero_variance_groups(rewards, group_size)
    if dynamic_filtering:
        keep &= dynamic_filter_keep(rewards, group_size, *dynamic_filtering_range)
    if group_filter_top_p < 1.0 and keep.any():
        kept_idx = keep.nonzero().squeeze(-1)
        sub = rewards.reshape(n_groups, group_size)[kept_idx].reshape(-1)
        top = top_p_std_keep(sub, group_size, group_filter_top_p)
        keep[kept_idx[~top]] = False
    return keep


def aggregate_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                   num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss (B, T) to a scalar.

    Args:
        loss: (B, T) per-token loss.
        mask: (B, T) 1 on trainable tokens.
        mode: ``token-mean``: sum over all tokens / number of tokens (DAPO);
            ``seq-mean-token-mean``: per-sequence token mean, averaged over sequences with at
            least one token (GRPO; OpenRLHF ``token_level_loss=False``);
            ``seq-mean-token-sum``: per-sequence token sum, averaged over sequences.
        num_tokens: denominator of token-mean (default ``mask.sum()``); pass the whole batch's
            count when accumulating micro-batches so the sum of micro-losses equals the batch loss.
        num_seqs: denominator of the seq-mean modes (default: sequences with a token).

    Raises:
        ValueError: unknown mode.
    """
    mask = mask.to(loss.dtype)
    if mode == "token-mean":
        denom = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=loss.dtype)
        return (loss * mask).sum() / denom.clamp(min=1)
    counts = mask.sum(-1)  # (B,)
    has = (counts > 0).to(loss.dtype)
    if mode == "seq-mean-token-mean":
        seq = (loss * mask).sum(-1) / counts.clamp(min=1)
    elif mode == "seq-mean-token-sum":
        seq = (loss * mask).sum(-1)
    else:
        raise ValueError(f"loss_agg_mode={mode!r}: allowed: {', '.join(LOSS_AGG_MODES)}")
    denom = has.sum() if num_seqs is None else torch.as_tensor(num_seqs, dtype=loss.dtype)
    return (seq * has).sum() / denom.clamp(min=1)


@dataclass
class PolicyLossOutput:
    """Result of :func:`policy_loss`: the scalar loss and clipping statistics (token fractions)."""

    loss: torch.Tensor  # scalar, differentiable
    per_token_loss: torch.Tensor  # (B, T)
    clip_ratio_low: torch.Tensor  # fraction of trainable tokens with ratio < 1 - eps_low and A < 0
    clip_ratio_high: torch.Tensor  # fraction of trainable tokens with ratio > 1 + eps_high and A > 0
    ratio: torch.Tensor  # (B, T) π_θ / π_old, detached


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                completion_mask: torch.Tensor, eps_low: float = 0.2, eps_high: float = 0.28,
                loss_agg_mode: str = "token-mean", num_tokens: float | None = None,
                num_seqs: float | None = None) -> PolicyLossOutput:
    """PPO clipped surrogate with Clip-Higher, per token: ``-min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A)``.

    ``ρ = exp(logprobs - old_logprobs)`` with the log-ratio clamped to ±20 (as OpenRLHF). The
    clipped fractions are the tokens where the clipped term is the smaller one: ``ρ > 1+ε_high``
    with A > 0 (high) and ``ρ < 1-ε_low`` with A < 0 (low); low + high equals OpenRLHF's
    ``clip_ratio`` and matches TRL's ``clip_ratio/low_mean`` / ``high_mean``.

    Args:
        logprobs: (B, T) log π_θ of the sampled tokens (differentiable), nats.
        old_logprobs: (B, T) log-probs of the sampling policy.
        advantages: (B,) per sample or (B, T) per token.
        completion_mask: (B, T) 1 on trainable tokens (0: padding, tool observations).
        eps_low, eps_high: clip range (DAPO Clip-Higher: 0.2, 0.28).
        loss_agg_mode, num_tokens, num_seqs: see :func:`aggregate_loss`.

    Raises:
        ValueError: shape mismatch.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != completion_mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
            f"completion_mask {tuple(completion_mask.shape)} must all be (B, T)"
        )
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    adv = adv.to(logprobs.dtype)
    ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0).exp()  # (B, T)
    surr1 = ratio * adv
    surr2 = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    per_token = -torch.min(surr1, surr2)
    loss = aggregate_loss(per_token, completion_mask, loss_agg_mode, num_tokens, num_seqs)
    m = completion_mask.to(logprobs.dtype)
    ntok = m.sum().clamp(min=1)
    with torch.no_grad():
        r = ratio.detach()
        low = ((r < 1 - eps_low) & (adv < 0)).to(m.dtype)
        high = ((r > 1 + eps_high) & (adv > 0)).to(m.dtype)
        clip_low = (low * m).sum() / ntok
        clip_high = (high * m).sum() / ntok
    return PolicyLossOutput(loss, per_token, clip_low, clip_high, ratio.detach())


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate from sampled-token log-probs, (B, T) → (B, T), nats.

    With ``log_r = logprobs - ref_logprobs`` (Schulman 2020): k1 = ``log_r``; k2 = ``log_r² / 2``;
    k3 = ``exp(-log_r) - 1 + log_r`` (unbiased, non-negative). As OpenRLHF
    ``compute_approx_kl``: k3's log-ratio is clamped below at -10 and every value to [-10, 10].

    Raises:
        ValueError: unknown estimator.
    """
    log_r = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        kl = log_r
    elif estimator == "k2":
        kl = log_r**2 / 2.0
    elif estimator == "k3":
        lr = log_r.clamp(min=-10)
        kl = (-lr).exp() - 1 + lr
    else:
        raise ValueError(f"kl_estimator={estimator!r}: allowed: {', '.join(KL_ESTIMATORS)}")
    return kl.clamp(-10, 10)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution, (..., V) → (...), nats.

    ``H = logsumexp(z) - Σ softmax(z) z`` (as OpenRLHF ``compute_entropy`` and TRL).
    """
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[index] without materialising the full (B, T, V) log-softmax twice.

    Args:
        logits: (B, T, V); index: (B, T) token ids. Returns (B, T) float32 log-probs, nats.
    """
    logits = logits.float()
    picked = torch.gather(logits, -1, index.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 when the mask is empty)."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1)


@dataclass
class UpdateStats:
    """Size of one update on the tokens it trained on (see :func:`update_stats`); token sums, so
    micro-batches add up. Divide the sums by ``n_tokens`` for means."""

    kl_k3_sum: float
    kl_k1_sum: float
    abs_dev_sum: float  # Σ |ρ - 1|
    clip_sum: float  # tokens where the clipped surrogate would bind (ρ > 1+ε_high, A > 0 or ρ < 1-ε_low, A < 0)
    ratio_max: float
    ratio_min: float
    n_tokens: float

    def __add__(self, other: UpdateStats) -> UpdateStats:
        return UpdateStats(self.kl_k3_sum + other.kl_k3_sum, self.kl_k1_sum + other.kl_k1_sum,
                           self.abs_dev_sum + other.abs_dev_sum, self.clip_sum + other.clip_sum,
                           max(self.ratio_max, other.ratio_max), min(self.ratio_min, other.ratio_min),
                           self.n_tokens + other.n_tokens)


def update_stats(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 completion_mask: torch.Tensor, eps_low: float = 0.2, eps_high: float = 0.28) -> UpdateStats:
    """How far an update moved the policy on its own tokens: π_old (before) vs π_new (after).

    With ``log ρ = new_logprobs - old_logprobs`` per token (samples drawn from π_old):
    k1 = ``-log ρ`` and k3 = ``(ρ - 1) - log ρ`` estimate KL(π_old ‖ π_new) (Schulman 2020; k3 is
    the ``approx_kl`` of CleanRL's PPO and of "The 37 implementation details of PPO", which PPO
    practice holds near a target of ~0.01: Schulman et al. 2017 §4 d_targ, Spinning Up target_kl).
    The clip count uses the rule of :func:`policy_loss` (the clip fraction the next PPO epoch would see).

    Args:
        new_logprobs, old_logprobs: (B, T) log-probs of the sampled tokens after / before the update, nats.
        advantages: (B,) or (B, T). completion_mask: (B, T) 1 on trained tokens.

    Returns:
        :class:`UpdateStats` with sums over the masked tokens (ratio extremes: 1.0 when no token).

    Raises:
        ValueError: shape mismatch.
    """
    if new_logprobs.shape != old_logprobs.shape or new_logprobs.shape != completion_mask.shape:
        raise ValueError(f"new_logprobs {tuple(new_logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
                         f"completion_mask {tuple(completion_mask.shape)} must all be (B, T)")
    with torch.no_grad():
        m = completion_mask.bool()
        log_r = (new_logprobs.double() - old_logprobs.double()).clamp(-20.0, 20.0)[m]  # (N,) masked tokens
        ratio = log_r.exp()
        adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
        adv = adv.double().expand_as(new_logprobs)[m]
        clip = ((ratio > 1 + eps_high) & (adv > 0)) | ((ratio < 1 - eps_low) & (adv < 0))
        n = int(m.sum())
        return UpdateStats(kl_k3_sum=float(((ratio - 1) - log_r).sum()), kl_k1_sum=float((-log_r).sum()),
                           abs_dev_sum=float((ratio - 1).abs().sum()), clip_sum=float(clip.sum()),
                           ratio_max=float(ratio.max()) if n else 1.0, ratio_min=float(ratio.min()) if n else 1.0,
                           n_tokens=float(n))
