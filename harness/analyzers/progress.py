"""Progress analyzers: learning dynamics, not only failures (docs/design.md §2, step 6).

A run can be healthy and still waste its budget: at a learning rate of 2e-6 the SmolLM2 default
trained with KL ~0.002 to the reference and clip ratio 0 on every step, the reward flat, and
nothing said so. These analyzers judge how far each update moves the policy and whether the
reward still moves, and raise:

* ``update_too_small`` (warn): the median updating step's KL(π_old ‖ π_new)
  (``policy/update_kl``, k3 on the update's own tokens) is below :data:`KL_SMALL`, the clip acts
  on almost no token (median clip fraction at most :data:`CLIP_SMALL`), the reward slope's 95% CI
  contains 0 (no progress) and the train pass rate has headroom. The median is the statistic the
  learning-rate factor below is computed from: 48 to 64 steps of the SmolLM2 default at lr 2e-6
  had a median update KL of 5-6e-4 (a factor of 4.1-4.4 to the target) in each of three seeds,
  with 67-74% of the steps below KL_SMALL and clip fractions of a few tenths of a percent on
  the rest: a "75% of steps and no clipped token at all" rule never named it. ``data["lr_factor_to_target"] = √(KL_TARGET / KL)``: the learning-rate
  multiplier that would bring the update to the target, since for small steps the KL grows with
  the square of the step (KL ≈ ½ dθᵀ F dθ, Fisher F; dθ ∝ lr).
* ``update_too_large`` (warn): on most updating steps the update KL is above :data:`KL_LARGE`, or
  the clip binds on more than :data:`CLIP_LARGE` of the tokens, and the reward slope's CI contains 0;
  ``info`` while the reward still rises significantly (SmolLM2 on 1-digit addition at lr 2e-5 moved
  KL ~0.04 nats/token per step, 4x the target, and learned fastest: large steps that pay off are not
  a failure in themselves, but are what precedes a collapse).
* ``update_too_small`` (blocking; analyzer ``no_gradient``): the gradient norm is exactly 0 while the groups carry
  reward variance: no gradient reaches the weights at all (:func:`no_gradient`).
* ``plateau`` (warn): the reward rose in the first half of the steps and stopped in the second
  (its slope CI contains 0, its gain under a quarter of the first half's) with headroom left.
* ``headroom`` (info): the train pass rate is at or above ``1 - HEADROOM_MIN``: the data is
  saturated (move to harder data), not a failure of the version.

Every finding carries the numbers (medians, fractions of steps, slope and CI, train and dev pass
rates, the fraction of groups carrying signal ``1 - reward/frac_zero_std``) and the source of each
threshold in ``data["thresholds"]``. Steps with no kept group (no update at all) are left out of
the update-size judgement: there the bottleneck is the data, which ``zero_variance_groups`` names.

Threshold sources: PPO's adaptive-KL target d_targ = 0.01, with β halved below d_targ / 1.5 and
doubled above 1.5 d_targ (Schulman et al. 2017 §4); Spinning Up PPO (target_kl = 0.01, early stop
at 1.5 target_kl); the k3 ``approx_kl`` of CleanRL / "The 37 implementation details of PPO"
(Huang et al. 2022). The reward slope is Theil-Sen with its CI (``scipy.stats.theilslopes``; Sen 1968).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from evotrainer import metrics as M
from evotrainer.harness.analyzers.rules import CORRECTNESS, ZERO_STD_TOL, AnalyzerTable
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding
from evotrainer.harness.trends import MIN_POINTS, downsample, fmt

ANALYZERS = AnalyzerTable()
"""This module's built-in analyzers (registered by ``analyzers/registry.py``)."""

PROGRESS_KINDS = ("update_too_small", "update_too_large", "plateau", "headroom")

KL_TARGET = 0.01  # nats/token: PPO d_targ (Schulman et al. 2017 §4), Spinning Up target_kl
KL_SMALL = KL_TARGET / 10  # below: even lr x3 (KL x9) stays under the target
KL_LARGE = 1.5 * KL_TARGET  # above: PPO doubles beta, Spinning Up stops the epoch early
CLIP_SMALL = 0.01  # median clip fraction at or below which the clip does not act: a tenth of the 0.1 that PPO
# updates near the KL target clip (the same tenth as KL_SMALL; CleanRL / 37-details log clipfrac as the check)
CLIP_LARGE = 0.2  # a fifth of the tokens outside the trust region: the clip discards their gradient
# (a design choice, not a library default: at this level the update is governed by the clip, not the loss)
MOST = 0.75  # "most steps": fraction of the updating steps
HEADROOM_MIN = 0.1  # a pass rate at or above 1 - this has no headroom (saturated data)
SLOPE_CONFIDENCE = 0.95  # Theil-Sen CI of the reward slope
SLOPE_MAX_POINTS = 2000  # Theil-Sen on at most this many points (its memory is quadratic: 64 MB here)
PLATEAU_RISE = 0.1  # first-half gain of the pass rate (absolute, 0..1) that counts as "it rose"
PLATEAU_KEEP = 0.25  # second-half gain below this fraction of the first half's: it stopped

THRESHOLDS = {
    "kl_target": {"value": KL_TARGET, "source": "PPO adaptive-KL d_targ (Schulman et al. 2017 §4); Spinning Up "
                                                "PPO target_kl=0.01"},
    "kl_small": {"value": KL_SMALL, "source": "KL_TARGET / 10: an lr x3 step (KL x9, KL ∝ lr² for small steps) "
                                              "stays under the target"},
    "kl_large": {"value": KL_LARGE, "source": "1.5 x target: PPO doubles β (Schulman et al. 2017 §4), Spinning "
                                              "Up stops the update early"},
    "clip_large": {"value": CLIP_LARGE, "source": "design choice: a fifth of the tokens clipped (no library "
                                                  "default; CleanRL/37-details log clipfrac as the check)"},
    "most_steps": {"value": MOST, "source": "fraction of the updating steps (steps with a kept group) for "
                                            "update_too_large"},
    "clip_small": {"value": CLIP_SMALL, "source": "a tenth of the ~0.1 clip fraction of PPO updates at the KL "
                                                  "target (CleanRL / 37-details log clipfrac as the check), the "
                                                  "same tenth as kl_small"},
    "headroom_min": {"value": HEADROOM_MIN, "source": "pass rate >= 0.9: saturated"},
    "slope_confidence": {"value": SLOPE_CONFIDENCE, "source": "Theil-Sen CI, scipy.stats.theilslopes (Sen 1968)"},
}


def slope_ci(steps: np.ndarray, values: np.ndarray, confidence: float = SLOPE_CONFIDENCE
             ) -> tuple[float, float, float] | None:
    """Theil-Sen slope of a series and its CI, ``(slope, low, high)`` in metric units per step.

    ``scipy.stats.theilslopes(y, x, alpha=confidence)`` on the finite points (Sen 1968); a longer series than
    :data:`SLOPE_MAX_POINTS` on its bin means (:func:`~evotrainer.harness.trends.downsample`, as ``trends`` does):
    theilslopes holds two N x N float64 arrays, and a foreign log of 120,012 steps (6.6 MB, review 5) asked for
    107 GiB (MemoryError ended ``diagnose``, ``import`` and ``watch``; 30,000 steps would take 14 GB). None with
    fewer than 3 finite points; ``(0, 0, 0)`` for a constant series.
    """
    from scipy import stats

    x, y = downsample(steps, values, SLOPE_MAX_POINTS)  # the finite points, binned past SLOPE_MAX_POINTS
    if len(y) < 3:
        return None
    if np.ptp(y) == 0:
        return 0.0, 0.0, 0.0
    res = stats.theilslopes(y, x, alpha=confidence)
    return float(res.slope), float(res.low_slope), float(res.high_slope)


def _aligned(ev: Evidence, v: str, name: str, steps: np.ndarray) -> np.ndarray:
    """Values of ``name`` at ``steps`` (NaN where it was not logged)."""
    s, x = ev.series(v, name)
    lookup = dict(zip(s.tolist(), x.tolist(), strict=True))
    return np.array([lookup.get(int(t), math.nan) for t in steps], dtype=np.float64)


def _reward_series(ev: Evidence, v: str, trained: bool = True) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The series progress is judged on: with ``trained`` the signal the update climbs (``reward/mean``, else
    correctness), otherwise the pass rate (correctness, else ``reward/mean``) that headroom and plateaus read."""
    name = ev.first(v, M.REWARD_MEAN, *CORRECTNESS) if trained else ev.first(v, *CORRECTNESS, M.REWARD_MEAN)
    if name is None:
        return None
    steps, values = ev.series(v, name)
    return name, steps, values


def _late(values: np.ndarray, window: float = 0.25) -> float:
    """Median of the last ``window`` fraction of the finite points (at least 3)."""
    f = values[np.isfinite(values)]
    if not len(f):
        return math.nan
    return float(np.median(f[-max(3, int(round(window * len(f)))):]))


def dev_pass_rate(ev: Evidence, v: str) -> float | None:
    """The version's dev (else held-out) Avg@k from its eval summary, or None."""
    s = ev.eval_summaries.get(v) or {}
    by = s.get("by_name") or {}
    for name in ("dev", "heldout"):
        x = (by.get(name) or {}).get("avg@k")
        if isinstance(x, (int, float)):
            return float(x)
    x = s.get("avg@k")
    return float(x) if isinstance(x, (int, float)) else None


def progress_numbers(ev: Evidence, v: str) -> dict[str, Any] | None:
    """The numbers the progress analyzers judge, for one version (None without a reward series).

    Keys: ``reward_metric`` (the trained signal: ``reward/mean``, else correctness), ``slope`` /
    ``slope_ci`` (its Theil-Sen slope per step), ``pass_metric`` (correctness, else ``reward/mean``),
    ``train_pass_late`` (median of its last quarter), ``dev_pass``, ``n_steps``, ``lr`` (the recipe's
    learning rate, else the last logged one), ``data_level`` (the recipe's, or None), ``signal_frac``
    (median of ``1 - reward/frac_zero_std``), and when the trainer logged them: ``n_updating_steps``,
    ``update_kl_median``, ``frac_steps_kl_small`` / ``frac_steps_kl_large``, ``clip_frac_median``
    (``policy/update_clip_frac``, else the loss's ``clip_ratio`` low + high), ``update_rel_norm_median``,
    ``lr_factor_to_target`` (√(KL_TARGET / update_kl_median)).
    """
    rs = _reward_series(ev, v)
    if rs is None:
        return None
    rname, steps, values = rs
    ok = np.isfinite(values)
    if ok.sum() < MIN_POINTS:
        return None
    lr = (ev.recipes.get(v) or {}).get("actor_learning_rate")
    if not isinstance(lr, (int, float)):  # a foreign run: the last logged learning rate (after warm-up)
        lrs = ev.series(v, M.POLICY_LR)[1]
        lr = float(lrs[np.isfinite(lrs)][-1]) if np.isfinite(lrs).any() else None
    pname, _, pvalues = _reward_series(ev, v, trained=False)
    out: dict[str, Any] = {"reward_metric": rname, "pass_metric": pname, "n_steps": int(ok.sum()),
                           "first_step": int(steps[ok][0]), "last_step": int(steps[ok][-1]),
                           "train_pass_late": _late(pvalues), "dev_pass": dev_pass_rate(ev, v), "lr": lr,
                           "data_level": ((ev.recipes.get(v) or {}).get("data") or {}).get("level")}
    sc = slope_ci(steps, values)
    out["slope"], out["slope_ci"] = (sc[0], [sc[1], sc[2]]) if sc else (None, None)
    zs = ev.series(v, M.REWARD_FRAC_ZERO_STD)[1]
    zs = zs[np.isfinite(zs)]
    out["signal_frac"] = float(np.median(1.0 - zs)) if len(zs) else None
    ks, kl = ev.series(v, M.POLICY_UPDATE_KL)
    if len(ks):
        kept = _aligned(ev, v, M.REWARD_KEPT_GROUP_FRAC, ks)
        norm = _aligned(ev, v, M.POLICY_UPDATE_NORM, ks)
        # an updating step kept a group (or, where that is not logged, moved the weights)
        upd = np.where(np.isfinite(kept), kept > 0, np.nan_to_num(norm, nan=1.0) > 0) & np.isfinite(kl)
        out["n_updating_steps"] = int(upd.sum())
        if upd.any():
            u = kl[upd]
            med = float(np.median(u))
            out.update(update_kl_median=med, frac_steps_kl_small=float(np.mean(u < KL_SMALL)),
                       frac_steps_kl_large=float(np.mean(u > KL_LARGE)),
                       lr_factor_to_target=math.sqrt(KL_TARGET / med) if med > 0 else math.inf)
            clip = _aligned(ev, v, M.POLICY_UPDATE_CLIP_FRAC, ks)[upd]
            if not np.isfinite(clip).any():
                clip = (_aligned(ev, v, M.POLICY_CLIP_RATIO_LOW, ks) + _aligned(ev, v, M.POLICY_CLIP_RATIO_HIGH, ks))[upd]
            clip = clip[np.isfinite(clip)]
            out["clip_frac_median"] = float(np.median(clip)) if len(clip) else None
            rel = _aligned(ev, v, M.POLICY_UPDATE_REL_NORM, ks)[upd]
            rel = rel[np.isfinite(rel)]
            out["update_rel_norm_median"] = float(np.median(rel)) if len(rel) else None
    return out


def _ci_has_zero(n: dict[str, Any]) -> bool:
    ci = n.get("slope_ci")
    return ci is None or ci[0] <= 0 <= ci[1] or (n.get("slope") or 0) <= 0


def _finding(kind: str, severity: str, v: str, n: dict[str, Any], evidence: list[str], text: str) -> Finding:
    return Finding(kind=kind, severity=severity, versions=[v], steps=[n["first_step"], n["last_step"]],
                   evidence=evidence, data={**n, "thresholds": THRESHOLDS}, explanation=text)


def _slope_text(n: dict[str, Any]) -> str:
    if n.get("slope") is None:
        return f"{n['reward_metric']} has no slope"
    lo, hi = n["slope_ci"]
    return f"{n['reward_metric']} slope {fmt(n['slope'])}/step (95% CI [{fmt(lo)}, {fmt(hi)}])"


def _signal_text(n: dict[str, Any]) -> str:
    s = n.get("signal_frac")
    return "" if s is None else f"; {fmt(100 * s)}% of groups carry signal (1 - reward/frac_zero_std, median)"


@ANALYZERS.analyzer("update_size", kinds=("update_too_small", "update_too_large"),
          description="how far each update moves the policy: too small to learn, or too large to trust")
def update_size(ev: Evidence) -> list[Finding]:
    """``update_too_small`` / ``update_too_large`` from the update KL, clip fraction, reward slope and headroom."""
    out = []
    for v in ev.versions:
        n = progress_numbers(ev, v)
        if n is None or not n.get("n_updating_steps") or "update_kl_median" not in n:
            continue
        clip = n.get("clip_frac_median")
        ev_names = [M.POLICY_UPDATE_KL, M.POLICY_UPDATE_CLIP_FRAC, n["reward_metric"]]
        big_clip = clip is not None and clip > CLIP_LARGE
        if n["frac_steps_kl_large"] >= MOST or big_clip:
            rising = not _ci_has_zero(n)
            why = (f"the update's KL(π_old‖π_new) is above {fmt(KL_LARGE)} nats/token (1.5 x the PPO target "
                   f"{fmt(KL_TARGET)}) on {fmt(100 * n['frac_steps_kl_large'])}% of the {n['n_updating_steps']} "
                   f"updating steps (median {fmt(n['update_kl_median'])})")
            if big_clip:
                why += f"; the clip binds on {fmt(100 * clip)}% of tokens (median; above {fmt(100 * CLIP_LARGE)}%)"
            out.append(_finding(
                "update_too_large", "info" if rising else "warn", v, n, ev_names,
                f"{v}: {why}. Each step moves the policy further than PPO's trust region; a learning rate "
                f"x{fmt(n['lr_factor_to_target'])} would reach the target ({_slope_text(n)}{_signal_text(n)})."
                + (" The reward still rises significantly, so the large steps pay off for now: watch entropy "
                   "and KL (info)." if rising else " The reward does not rise: the steps are too large to pay off.")))
            continue
        train = n["train_pass_late"]
        headroom = math.isfinite(train) and train < 1 - HEADROOM_MIN
        no_clip = clip is None or clip <= CLIP_SMALL
        if n["update_kl_median"] < KL_SMALL and no_clip and _ci_has_zero(n) and headroom:
            rel = n.get("update_rel_norm_median")
            dev = n.get("dev_pass")
            out.append(_finding(
                "update_too_small", "warn", v, n, ev_names + [M.POLICY_UPDATE_REL_NORM],
                f"{v}: healthy but slow: the update's KL(π_old‖π_new) has a median of {fmt(n['update_kl_median'])} "
                f"nats/token over the {n['n_updating_steps']} updating steps, below {fmt(KL_SMALL)} (a tenth of the "
                f"PPO target {fmt(KL_TARGET)}) on {fmt(100 * n['frac_steps_kl_small'])}% of them, and the clip "
                f"barely acts (median clip fraction {fmt(clip) if clip is not None else 'n/a'})"
                + (f", relative update ||dθ||/||θ|| {fmt(rel)}" if rel is not None else "")
                + f", and {_slope_text(n)} shows no significant rise while the train pass rate "
                  f"({n['pass_metric']}) is {fmt(train)}"
                + (f" (dev {fmt(dev)})" if dev is not None else "") + f"{_signal_text(n)}. The policy barely "
                f"moves: a learning rate x{fmt(n['lr_factor_to_target'])} would reach the target (KL ∝ lr²)."))
    return out


@ANALYZERS.analyzer("no_gradient", kinds=("update_too_small",),
                    description="a gradient norm of exactly 0 while the groups carry reward variance: no update at all")
def no_gradient(ev: Evidence) -> list[Finding]:
    """``update_too_small`` (a level, one step shows it) where the logged gradient norm is exactly 0 on at least
    :data:`MOST` of the steps whose groups carry signal (``reward/frac_zero_std`` < 1, else the batch ``reward/std`` >
    :data:`~evotrainer.harness.analyzers.rules.ZERO_STD_TOL`), whose completions are not all cut at the cap (a
    trainer that masks truncated completions, TRL's ``mask_truncated_completions``, has no token to learn from there:
    ``truncation``'s finding) and whose group filters kept a group (``reward/kept_group_frac`` > 0 where logged: a step
    whose dynamic-sampling bounds dropped every group makes no update by design; EvoTrainer logs its grad norm 0). A group-relative advantage that is not 0 gives a gradient that is not 0, so a zero
    norm means no gradient reaches the trained weights: adapters not attached or frozen, a wrong optimiser group, a
    distributed-engine bug (ms-swift#5890: grad_norm 0.0 with reward_std 0.16 on an NPU, fixed by a DeepSpeed upgrade;
    ms-swift#5571: 0.0 with every group's rewards spread, LoRA). Blocking from 2 such steps, warn on one."""
    out = []
    for v in ev.versions:
        gs, g = ev.series(v, M.POLICY_GRAD_NORM)
        ok = np.isfinite(g)
        gs, g = gs[ok], g[ok]
        if not len(g):
            continue
        z = _aligned(ev, v, M.REWARD_FRAC_ZERO_STD, gs)
        sd = _aligned(ev, v, M.REWARD_STD, gs)
        clipped = _aligned(ev, v, M.COMPLETIONS_CLIPPED_RATIO, gs)
        kept = _aligned(ev, v, M.REWARD_KEPT_GROUP_FRAC, gs)
        signal = np.where(np.isfinite(z), z < 1.0 - 1e-9, np.nan_to_num(sd, nan=0.0) > ZERO_STD_TOL)
        # a step whose filters kept no group (dynamic sampling's accuracy bounds, top-p std) made no update by design
        judged = signal & ~(np.nan_to_num(clipped, nan=0.0) >= 0.99) & ~(np.nan_to_num(kept, nan=1.0) <= 0.0)
        n = int(judged.sum())
        zero = judged & (g == 0.0)
        if not n or zero.sum() < MOST * n:
            continue
        steps = gs[zero]
        sig = (f"{fmt(100 * float(np.nanmedian(1.0 - z[zero])))}% of groups carry reward variance (1 - "
               f"reward/frac_zero_std, median)" if np.isfinite(z[zero]).any() else
               f"the batch reward std is {fmt(float(np.nanmedian(sd[zero])))} (median)")
        _, kl = ev.series(v, M.POLICY_KL)
        kl_text = (" and the KL to the reference stays 0" if len(kl) and np.isfinite(kl).any()
                   and np.all(kl[np.isfinite(kl)] == 0.0) else "")
        out.append(Finding(
            kind="update_too_small", severity="blocking" if zero.sum() >= 2 else "warn", versions=[v],
            steps=[int(steps[0]), int(steps[-1])], evidence=[M.POLICY_GRAD_NORM, M.REWARD_FRAC_ZERO_STD, M.REWARD_STD],
            judged="level", data={"zero_grad_steps": int(zero.sum()), "judged_steps": n, "no_gradient": True},
            explanation=f"{v}: no update at all: the gradient norm is exactly 0 on {int(zero.sum())} of the {n} logged "
                        f"step(s) whose groups carry signal (steps {', '.join(map(str, steps[:8].tolist()))}), while "
                        f"{sig}{kl_text}. A non-zero advantage gives a non-zero gradient, so none reaches the trained "
                        f"weights: check that the trainable parameters (LoRA adapters) are attached and require "
                        f"gradients and are in the optimiser, and the distributed engine's version (a learning-rate "
                        f"change cannot help)."))
    return out


@ANALYZERS.analyzer("plateau", kinds=("plateau",), description="the reward rose, then stopped, with headroom left")
def plateau(ev: Evidence) -> list[Finding]:
    """First-half gain >= PLATEAU_RISE, second-half gain < PLATEAU_KEEP of it with its slope CI containing 0 and
    lying below the first half's slope (the slow-down is shown, not just possible: four noisy points of a second half
    give a CI like [-0.5, +0.5] per step, which holds 0 and the first half's pace alike; the default run's v7 was called
    a plateau on such a CI)."""
    out = []
    for v in ev.versions:
        n = progress_numbers(ev, v)
        if n is None:
            continue
        _, steps, values = _reward_series(ev, v, trained=False)
        ok = np.isfinite(values)
        x, y = steps[ok], values[ok]
        h = len(y) // 2
        first, second = slope_ci(x[: h + 1], y[: h + 1]), slope_ci(x[h:], y[h:])
        if first is None or second is None:
            continue
        gain1 = first[0] * float(x[h] - x[0])
        gain2 = second[0] * float(x[-1] - x[h])
        train = n["train_pass_late"]
        if not (gain1 >= PLATEAU_RISE and gain2 < PLATEAU_KEEP * gain1 and second[1] <= 0 <= second[2] < first[0]
                and math.isfinite(train) and train < 1 - HEADROOM_MIN):
            continue
        n = {**n, "gain_first_half": gain1, "gain_second_half": gain2, "slope_second_half": second[0],
             "slope_second_half_ci": [second[1], second[2]]}
        out.append(_finding(
            "plateau", "warn", v, n, [n["pass_metric"], M.POLICY_UPDATE_KL],
            f"{v}: {n['pass_metric']} rose by {fmt(gain1)} over steps {int(x[0])}-{int(x[h])} and then by "
            f"{fmt(gain2)} over steps {int(x[h])}-{int(x[-1])} (slope {fmt(second[0])}/step, 95% CI "
            f"[{fmt(second[1])}, {fmt(second[2])}]); the train pass rate {fmt(train)} leaves headroom"
            f"{_signal_text(n)}. Learning has stalled before the data is solved."))
    return out


@ANALYZERS.analyzer("headroom", kinds=("headroom",), description="train pass rate near 1: the data is saturated")
def headroom(ev: Evidence) -> list[Finding]:
    """Info when the late train pass rate is >= 1 - HEADROOM_MIN: harder data, not a failure."""
    out = []
    for v in ev.versions:
        n = progress_numbers(ev, v)
        if n is None or not math.isfinite(n["train_pass_late"]) or n["train_pass_late"] < 1 - HEADROOM_MIN:
            continue
        dev = n.get("dev_pass")
        out.append(_finding(
            "headroom", "info", v, n, [n["pass_metric"], M.REWARD_FRAC_ZERO_STD],
            f"{v}: no headroom on the training data: {n['pass_metric']} is {fmt(n['train_pass_late'])} in the "
            f"last steps (median)" + (f", dev {fmt(dev)}" if dev is not None else "") + f"{_signal_text(n)}. "
            f"Saturated groups carry no signal: move to harder data (a reason to change the data, not a "
            f"failure of the version)."))
    return out
