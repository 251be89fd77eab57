"""Built-in analyzer ``zero_variance_groups``: groups whose rewards are all equal, read by their cause.

A group whose samples all get the same reward has zero group-relative advantage (GRPO, Shao et al.
2024, eq. 3; DAPO's dynamic sampling, Yu et al. 2025 sec. 3.2, exists to drop them): it carries no
learning signal. This is a **level** (one step shows it), estimated from whichever batch
statistics a run logs, best first:

1. ``reward/frac_zero_std`` (TRL ``frac_reward_zero_std``; EvoTrainer; rollout-derived);
2. ``reward/frac_solve_none + reward/frac_solve_all`` (groups with no / only correct samples; exact
   for a 0/1 correctness reward);
3. batches with no group-relative signal (:func:`constant_batches`): all advantages 0
   (``policy/advantage/min == max == 0``, verl ``critic/advantages/*``, or advantage std 0), or, where
   no advantage statistic is logged, every rollout with one reward (``reward/min == reward/max``,
   verl ``critic/score/min`` / ``max``; ``reward/std`` ~ 0, the batch std in verl, the mean
   within-group std in TRL: both 0 only when every group is constant). One reward with spread
   advantages is a critic's baseline (PPO with GAE): not counted. Their share of the recent steps
   is a lower bound of the fraction.

The **cause** decides the severity:

* ``all_wrong``: groups where no sample is correct (too hard data, or a reward that never pays:
  answer parsing, a broken verifier). Blocking at ZV_BLOCK or more: nothing is learned; easier
  data or a reward fix;
* ``all_right``: every sample correct (the policy saturated the data). A **warning** only, never
  blocking: the version learned what this data teaches; raise the difficulty;
* ``mixed`` / ``unknown``: blocking at ZV_BLOCK or more, as before the cause was known.

The cause comes from the solve fractions when logged; else from the constant reward's value at the
constant steps (<= 0, or the run's lowest reward: all-wrong; the run's highest reward when the run
also saw lower ones: all-right); else, with no correctness series, a mean reward of 0 in a run whose
reward is never negative while every group is constant (every reward is 0: all-wrong); else from
correctness ``c`` and the fraction ``z`` (per step, groups
split into all-right ``sa``, all-wrong ``sn`` and mixed ``m = 1 - z``; ``c = sa + (mixed share)`` with the
mixed share in ``[0, m]``, so ``sa >= c - m`` and ``sn >= z - c``). A cause is named when its share of
the zero-variance groups is at least CAUSE_SHARE.

A warning only, marked ``symptom_of: entropy_collapse``, when the fraction started under ZV_WARN
and entropy collapsed in the same version: the data had variance, the policy lost it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from evotrainer import metrics as M
from evotrainer.harness.analyzers.rules import (
    CORRECTNESS,
    ZERO_STD_TOL,
    ZV_BLOCK,
    ZV_WARN,
    AnalyzerTable,
    entropy_collapsed,
    level_data,
    span,
    trend_of,
)
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding
from evotrainer.harness.trends import fmt, level, trend

ANALYZERS = AnalyzerTable()
"""This module's built-in analyzer (registered by ``analyzers/registry.py``)."""

CAUSE_SHARE = 0.8  # all-wrong (or all-right) groups making up this share of the zero-variance groups name the cause
NEAR_EMPTY_TOKENS = 3.0  # mean completion length (tokens) at or under which the completions are near-empty
ZERO_MEAN_MIN_STEPS = 3  # logged steps a run needs before a mean reward of 0 alone says every reward was 0


def _aligned(ev: Evidence, v: str, a: str, b: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps logged by both ``a`` and ``b`` with finite values: (steps, a values, b values)."""
    sa, xa = ev.series(v, a)
    sb, xb = ev.series(v, b)
    common, ia, ib = np.intersect1d(sa, sb, assume_unique=False, return_indices=True)
    ok = np.isfinite(xa[ia]) & np.isfinite(xb[ib])
    return common[ok], xa[ia][ok], xb[ib][ok]


class Batches(NamedTuple):
    """Per-step verdicts of :func:`constant_batches` (all arrays ``(S,)`` over ``steps``)."""

    steps: np.ndarray  # int64 steps where any batch statistic is logged
    constant: np.ndarray  # bool: the batch carries no group-relative signal
    value: np.ndarray  # float64: the batch's one reward where reward min == max, NaN elsewhere
    sources: list[str]  # metric names that showed a constant batch
    vetoed: list[int]  # steps with one reward whose advantages still spread (a critic / global baseline)


def constant_batches(ev: Evidence, v: str) -> Batches:
    """Steps at which the batch carries no group-relative signal, from batch statistics.

    A step is constant when its advantages are all 0 (advantage max - min, or advantage std, at most
    ``ZERO_STD_TOL``: the direct evidence), or, where no advantage statistic is logged, when every
    rollout got one reward (reward max - min or reward std at most ``ZERO_STD_TOL``). A step with
    one reward whose advantages still spread is *vetoed*: a critic (PPO with GAE, verl's quickstart)
    or a batch-wide baseline gives advantages from equal rewards, so there is no zero-variance group
    in the GRPO sense. A zero std says every group is constant, not which value each has (TRL's
    ``reward_std`` is the mean within-group std), so ``value`` is known only where reward min == max.
    Where the run logs no spread statistic and no zero-variance fraction (OpenRLHF's console: ``reward``, ``kl``,
    ``policy_loss``), a step
    whose mean reward is 0 in a run of at least :data:`ZERO_MEAN_MIN_STEPS` steps whose mean reward is never
    negative is constant at 0: rewards that are never negative and average 0 are all 0 (read as ``reward/mean``).
    """
    reward_const: dict[int, bool] = {}
    value: dict[int, float] = {}
    adv_zero: dict[int, bool] = {}
    sources: list[str] = []

    def mark(table: dict[int, bool], steps: np.ndarray, spread: np.ndarray, names: list[str]) -> None:
        c = np.abs(spread) <= ZERO_STD_TOL
        if c.any():
            sources.extend(n for n in names if n not in sources)
        for st, ci in zip(steps.tolist(), c.tolist(), strict=True):
            table[st] = table.get(st, False) or ci

    s, lo, hi = _aligned(ev, v, M.REWARD_MIN, M.REWARD_MAX)
    mark(reward_const, s, hi - lo, [M.REWARD_MIN, M.REWARD_MAX])
    value.update({st: x for st, x, c in zip(s.tolist(), lo.tolist(), (np.abs(hi - lo) <= ZERO_STD_TOL).tolist(),
                                            strict=True) if c})
    ss, xs = ev.series(v, M.REWARD_STD)
    mark(reward_const, ss[np.isfinite(xs)], xs[np.isfinite(xs)], [M.REWARD_STD])
    s, lo, hi = _aligned(ev, v, M.POLICY_ADVANTAGE_MIN, M.POLICY_ADVANTAGE_MAX)
    mark(adv_zero, s, np.maximum(np.abs(hi), np.abs(lo)), [M.POLICY_ADVANTAGE_MIN, M.POLICY_ADVANTAGE_MAX])
    ss, xs = ev.series(v, M.POLICY_ADVANTAGE_STD)
    mark(adv_zero, ss[np.isfinite(xs)], xs[np.isfinite(xs)], [M.POLICY_ADVANTAGE_STD])
    if not reward_const and not adv_zero and _fraction(ev, v) is None:  # no spread statistic, no fraction at all
        ss, xs = ev.series(v, M.REWARD_MEAN)
        ok = np.isfinite(xs)
        ss, xs = ss[ok], xs[ok]
        if len(xs) >= ZERO_MEAN_MIN_STEPS and xs.min() >= -ZERO_STD_TOL:
            mark(reward_const, ss, xs, [M.REWARD_MEAN])
            value.update({st: 0.0 for st, x in zip(ss.tolist(), xs.tolist(), strict=True) if abs(x) <= ZERO_STD_TOL})
    steps = np.array(sorted(set(reward_const) | set(adv_zero)), dtype=np.int64)
    const = [adv_zero[x] if x in adv_zero else reward_const[x] for x in steps.tolist()]
    vetoed = [x for x in steps.tolist() if reward_const.get(x) and x in adv_zero and not adv_zero[x]]
    return Batches(steps, np.array(const, dtype=bool),
                   np.array([value.get(x, np.nan) if c else np.nan for x, c in zip(steps.tolist(), const, strict=True)],
                            dtype=np.float64), sources, vetoed)


def _fraction(ev: Evidence, v: str) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(name, steps, values) of the logged zero-variance fraction, or of solve_none + solve_all."""
    s, z = ev.series(v, M.REWARD_FRAC_ZERO_STD)
    if np.isfinite(z).any():
        return M.REWARD_FRAC_ZERO_STD, s, z
    s, sn, sa = _aligned(ev, v, M.REWARD_FRAC_SOLVE_NONE, M.REWARD_FRAC_SOLVE_ALL)
    if len(s):
        return f"{M.REWARD_FRAC_SOLVE_NONE} + {M.REWARD_FRAC_SOLVE_ALL}", s, sn + sa
    return None


def _recent(steps: np.ndarray, values: np.ndarray) -> float | None:
    lv = level(steps, values)
    return None if lv is None else lv.recent


def _cause(ev: Evidence, v: str, z: float, const_vals: np.ndarray) -> tuple[str, dict]:
    """``(cause, numbers)``: all_wrong | all_right | mixed | unknown (see module docstring)."""
    sn = _recent(*ev.series(v, M.REWARD_FRAC_SOLVE_NONE))
    sa = _recent(*ev.series(v, M.REWARD_FRAC_SOLVE_ALL))
    how: dict = {}
    if sn is not None and sa is not None and sn + sa > 0:
        how = {"frac_solve_none": sn, "frac_solve_all": sa, "from": "solve fractions"}
        wrong, right = sn, sa
    elif np.isfinite(const_vals).any():
        c = float(np.median(const_vals[np.isfinite(const_vals)]))
        _, lo = ev.series(v, M.REWARD_MIN)
        _, hi = ev.series(v, M.REWARD_MAX)
        _, mean = ev.series(v, M.REWARD_MEAN)
        pool = np.concatenate([x[np.isfinite(x)] for x in (lo, hi, mean)])
        low, high = (float(pool.min()), float(pool.max())) if len(pool) else (c, c)
        how = {"constant_reward": c, "run_reward_min": low, "run_reward_max": high, "from": "constant reward"}
        if c <= 0 or (c <= low + ZERO_STD_TOL and high > c + ZERO_STD_TOL):
            return "all_wrong", how
        if c >= high - ZERO_STD_TOL and low < c - ZERO_STD_TOL:
            return "all_right", how
        return "unknown", how
    else:
        cname = ev.first(v, *CORRECTNESS)
        c = _recent(*ev.series(v, cname)) if cname else None
        if c is None:
            rs, rm = ev.series(v, M.REWARD_MEAN)
            r = _recent(rs, rm)
            fin = rm[np.isfinite(rm)]
            if r is not None and abs(r) <= ZERO_STD_TOL and z >= ZV_BLOCK and fin.min() >= -ZERO_STD_TOL:
                # every group constant, mean reward 0 and the reward never negative: every reward is 0
                return "all_wrong", {"reward_mean": r, "from": M.REWARD_MEAN}
            if r is not None and r < -ZERO_STD_TOL and z >= ZV_BLOCK and r <= fin.min() + ZERO_STD_TOL:
                # every group constant at a penalty, the lowest mean the run shows (unsloth#2451: -1.0, the wrong
                # answer's score, on every step): as a constant reward <= 0 is read (all wrong)
                return "all_wrong", {"reward_mean": r, "from": M.REWARD_MEAN, "lowest": True}
            return "unknown", how
        m = 1.0 - z
        right, wrong = max(0.0, c - m), max(0.0, z - c)
        how = {"correct_mean": c, "frac_solve_all_lb": right, "frac_solve_none_lb": wrong, "from": cname}
    total = max(z, wrong + right, 1e-12)
    if wrong >= CAUSE_SHARE * total:
        return "all_wrong", how
    if right >= CAUSE_SHARE * total:
        return "all_right", how
    return "mixed", how


# What would fix each cause, in the words of the skills memory (the query of `diagnose`'s interventions)
_REMEDY = {
    "all_wrong": "groups are all wrong, the model solves almost no training prompt, reward near 0: easier problems "
                 "or a reward that pays",
    "all_right": "groups are all correct, the model already solves nearly every training prompt and the train reward "
                 "saturates near 1: harder problems",
    "mixed": "drop prompts the model always or never solves; refill the batch with groups that have reward variance",
    "unknown": "groups with all-equal rewards and zero advantage; refill the batch with groups that have variance",
}

_READING = {
    "all_wrong": ("no sample of those groups is correct: the data is too hard for the policy, or the reward "
                  "never pays (check the verifier / answer parsing); use easier data or fix the reward"),
    "all_right": ("every sample of those groups is correct: the policy saturated this data; move to harder "
                  "data (a warning, not a failure of the version: it learned what this data teaches)"),
    "mixed": "both all-wrong and all-right groups: the data is too easy for some prompts and too hard for others",
    "unknown": "data too easy or too hard for the policy, or a constant reward",
}


def _no_signal(ev: Evidence, v: str) -> str:
    """What equal rewards take away: the group-relative advantage (GRPO), or, where a value model is trained (PPO with
    a critic: verl's ``critic/vf_loss``, ``critic/values/*``), the reward's part of the advantage, which is then the
    value model's own error (TinyZero#101's PPO batch scored 0 on every rollout)."""
    critic = any(("vf_loss" in n or n.startswith("critic/values") or "vpred" in n) for n in ev.metric_names(v))
    return ("Equal rewards leave the advantages to the value model's own errors (a critic is trained here)" if critic
            else "Those groups get zero group-relative advantage")


@ANALYZERS.analyzer("zero_variance_groups", description="groups whose rewards are all equal (no GRPO signal), by cause")
def zero_variance_groups(ev: Evidence) -> list[Finding]:
    """Recent zero-variance fraction >= ZV_WARN (a level; see the module docstring for sources and cause)."""
    out = []
    for v in ev.versions:
        frac = _fraction(ev, v)
        cs, const, cvals, csrc, vetoed = constant_batches(ev, v)
        lz = level(frac[1], frac[2]) if frac else None
        lc = level(cs, const.astype(np.float64)) if len(cs) else None
        share = 0.0
        if lc is not None:  # share of constant batches among the recent steps
            share = float(np.mean(const[np.searchsorted(cs, lc.recent_from):]))
        z = max(lz.recent if lz is not None else 0.0, share)
        if z < ZV_WARN:
            if vetoed:
                out.append(Finding(
                    kind="zero_variance_groups", severity="info", versions=[v], steps=vetoed[:50], judged="level",
                    evidence=[M.REWARD_MIN, M.REWARD_MAX, M.POLICY_ADVANTAGE_MIN, M.POLICY_ADVANTAGE_MAX],
                    data={"vetoed_steps": vetoed[:50], "late_frac": z},
                    explanation=f"{v}: every rollout got the same reward at step(s) {', '.join(map(str, vetoed[:8]))}, "
                                f"but the advantages still spread there (a critic or batch-wide baseline, as in PPO "
                                f"with GAE): the policy gets a signal, so these are not zero-variance groups."))
            continue
        by_frac = lz is not None and lz.recent >= share
        name = frac[0] if by_frac else " / ".join(csrc)
        steps = span(lz if by_frac else lc)
        cause, how = _cause(ev, v, z, cvals[const] if len(cs) else np.array([]))
        sev = "warn" if cause == "all_right" else "blocking" if z >= ZV_BLOCK else "warn"
        t = trend(frac[1], frac[2]) if frac else None  # the fraction over the run, when it has enough points
        data = {"late_frac": z, "cause": cause, **how, "source": name, "remedy": _REMEDY[cause],
                **(level_data(lz) if by_frac else {"constant_share": share, "n_recent": lc.n_recent}),
                **({"early": t.early, "start": t.start} if t is not None else {})}
        reading = _READING[cause]
        et = trend_of(ev, v, M.POLICY_ENTROPY) if t is not None and t.early < ZV_WARN else None
        if cause != "all_right" and et is not None and entropy_collapsed(et):
            sev, data["symptom_of"] = "warn", "entropy_collapse"
            reading = (f"here a symptom of the entropy collapse ({fmt(et.early)} -> {fmt(et.late)} nats/token): the "
                       f"samples of a group became identical, while the data gave variance at the start")
        gn = ev.series(v, M.POLICY_GRAD_NORM)[1]
        gn = gn[np.isfinite(gn)]
        g = f"; grad norm median {fmt(float(np.median(gn)))}" if len(gn) else ""
        n_recent = lz.n_recent if by_frac else lc.n_recent
        if by_frac:
            what = (f"{fmt(100 * z)}% of groups have zero reward variance ({name}, median of the last {n_recent} "
                    f"logged step(s)" + (f"; {fmt(100 * t.early)}% in the first 20%" if t is not None else "") + ")")
        else:
            how_known = ("a mean reward of 0 in a run whose mean is never negative, so every reward was 0; no spread "
                         "statistic is logged" if name == M.REWARD_MEAN else f"no spread in {name}")
            what = (f"every rollout of the batch got the same reward in {fmt(100 * share)}% of the last {n_recent} "
                    f"logged step(s) ({how_known})")
        if "frac_solve_none" in how:
            what += f"; {fmt(100 * how['frac_solve_none'])}% solve none, {fmt(100 * how['frac_solve_all'])}% solve all"
        elif "constant_reward" in how:
            what += (f"; the one reward is {fmt(how['constant_reward'])} (the run's rewards span "
                     f"{fmt(how['run_reward_min'])}..{fmt(how['run_reward_max'])})")
        elif "correct_mean" in how:
            what += f"; correctness {fmt(how['correct_mean'])}"
        elif "reward_mean" in how and how.get("lowest"):
            what += f"; mean reward {fmt(how['reward_mean'])}, a penalty and the lowest the run shows"
        elif "reward_mean" in how:
            what += f"; mean reward {fmt(how['reward_mean'])}, never negative: every rollout scored 0"
        ls, lens = ev.series(v, M.COMPLETIONS_MEAN_LENGTH)
        short = _recent(ls, lens)
        if cause != "all_right" and short is not None and short <= NEAR_EMPTY_TOKENS:
            data["completion_tokens"] = short
            reading += (f"; the completions are near-empty ({fmt(short)} tokens on average): the policy emits almost "
                        f"nothing, so no answer can be right: look for weights that did not load (an adapter or "
                        f"checkpoint), a wrong chat template or stop token before the data or the reward")
        out.append(Finding(kind="zero_variance_groups", severity=sev, versions=[v], steps=steps, judged="level",
                           evidence=[n for n in (frac[0].split(" + ") if by_frac else csrc)], data=data,
                           explanation=f"{v}: {what}{g}. {_no_signal(ev, v)}: the batch carries "
                                       f"{'no' if z >= ZV_BLOCK else 'little'} learning signal; cause "
                                       f"{cause.replace('_', '-')}: {reading}."))
    return out
