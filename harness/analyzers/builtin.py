"""Built-in analyzers of the training dynamics: ``nan_blowup``, ``truncation``, ``entropy_collapse``,
``length_collapse``, ``length_blowup``, ``kl_blowup``, ``grad_spike`` (kinds of ``harness.findings.KINDS``;
docs/design.md §2, step 6). The other kinds are judged in ``behaviour.py`` and ``zero_variance.py``.

Each reads metric series (logged, or derived from rollouts) and judges what it can see, saying
which (``Finding.judged``) with the numbers in ``data`` and the explanation:

* a **level** needs one step (``trends.level``): non-finite values, a clip ratio of 1.0, a batch
  in which every group has one reward (reward/min == reward/max, reward std or advantage std 0,
  reward/frac_zero_std or solve_none + solve_all at 1), a KL above the blow-up level;
* a **change** compares the first and last segments of the run (``trends.segments``: binary
  segmentation, so a collapse in the first 3% of a 1000-step run is seen) or the steps around a
  gradient spike;
* a **trend** (Mann-Kendall, Theil-Sen) needs ``trends.MIN_POINTS`` finite points: below that a
  trend-based analyzer gives an ``info`` "insufficient evidence" finding instead of a guess.

Thresholds are module constants, named and commented, so a backtest can judge them (those several
rule modules share are in ``rules.py``). Benign
artefacts raise nothing: a policy loss printing 0.0 (GRPO's surrogate is ~0 at the on-policy point
with group-normalised advantages) is not a failure while grad norm and reward move; isolated
gradient spikes that nothing suffers from are ``info``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from evotrainer import metrics as M
from evotrainer.harness.analyzers.rules import (
    ALPHA,
    CORRECTNESS,
    ENTROPY_FLOOR,
    ENTROPY_RATIO,
    ZERO_STD_TOL,
    ZV_BLOCK,
    ZV_WARN,
    AnalyzerTable,
    drop,
    insufficient,
    level_data,
    level_of,
    span,
    trend_data,
    trend_of,
    trend_or_note,
)
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding, Severity
from evotrainer.harness.trends import Trend, fmt, noise_sd, spikes

ANALYZERS = AnalyzerTable()
"""This module's built-in analyzers (registered by ``analyzers/registry.py``)."""

TRUNC_WARN, TRUNC_BLOCK = 0.2, 0.5  # late clipped ratio
LEN_COLLAPSE_RATIO, LEN_BLOWUP_RATIO = 0.5, 2.0  # late / early mean completion length
KL_WARN = 1.0  # nats per token: KL level that is a blow-up whatever the trend
KL_JUMP = 5.0  # change-point after/before ratio that is a blow-up (with after >= KL_JUMP_MIN)
KL_JUMP_MIN = 0.2
KL_START_STEPS = 50  # a log whose first step is at most this starts with its run (TRL logs every 10 steps by default);
# a paste from the middle of a run says nothing of where its policy started
GRAD_SPIKE_K, GRAD_SPIKES_WARN = 10.0, 3  # spike size in robust sds; spikes that warn when no series shows damage
GRAD_NORM_LEVEL = 1e4  # pre-clip grad norm at or above this is abnormal on one step (10^4 x verl / TRL / OpenRLHF max_norm 1.0)
GRAD_DAMAGE_WINDOW = 5  # logged steps before / after a spike compared for damage
REWARD_DROP_RANGE = 0.1  # a reward drop after a spike counts when >= this share of the run's p5-p95 range (and 3 noise sds)
NAN_CORE = (M.LOSS_POLICY, M.LOSS_KL, M.LOSS_TOTAL, M.POLICY_KL, M.POLICY_GRAD_NORM, M.POLICY_ENTROPY,
            M.REWARD_MEAN, M.REWARD_STD, M.COMPLETIONS_MEAN_LENGTH)
NAN_SIGNAL = (M.LOSS_POLICY, M.LOSS_TOTAL, M.REWARD_MEAN, M.POLICY_GRAD_NORM)
"""Series that move with the weights: while one of them is finite at every step, a series that is NaN at every step
from the run's first logged step on was never computed (TRL GRPO with ``beta=0.0`` loads no reference model and
prints ``kl`` as ``nan`` from step 1: "This is intentional behavior, not a bug", the maintainer in
https://github.com/huggingface/trl/issues/4040), not a divergence: corrupt weights make the loss and the
gradient non-finite too."""
NAN_UNCOMPUTED_MIN_STEPS = 2  # steps, all non-finite from the first: one step cannot tell "never" from "now"
# foreign series kept under their own names are core too when they are a loss or a gradient norm
# (verl critic/vf_loss, critic/grad_norm; ms-swift loss) -- never timing or throughput
_NAN_FOREIGN = ("loss", "grad_norm")
_CRITIC = re.compile(r"(?:^|/)(?:critic|value|vf)[/_]|/vf_|vpred", re.I)  # a critic's series (verl critic/vf_loss)


def _how(basis: str, t: Trend, unit: str) -> str:
    """The numbers behind a :func:`~evotrainer.harness.analyzers.rules.drop`, for an explanation."""
    if basis == "segments":
        return (f"first segment {fmt(t.start)} {unit} (steps {t.first_step}-{t.start_until}), last segment "
                f"{fmt(t.end)} (steps {t.end_from}-{t.last_step}); {t.n_segments} segments by binary segmentation; "
                f"medians of the first / last 20% of steps {fmt(t.early)} / {fmt(t.late)}")
    # the numbers before this are the 20% windows' medians (at least 3 points each, harness/trends.py); head / tail
    # are the first / last 5 points' (a new user read "0.263 at the start" as the 20% window's median)
    return (f"medians of the first and last 20% of steps, at least 3 points each; medians of the first / last 5 "
            f"points {fmt(t.head)} / {fmt(t.tail)}; "
            f"Mann-Kendall tau {fmt(t.tau)}, p={fmt(t.p_value)}"
            + (f", level shift at step {t.change_step}" if t.change_step is not None else ""))


def _drop_finding(kind: str, severity: Severity, v: str, t: Trend, d: tuple[str, float, float], evidence: list[str],
                  what: str, unit: str, tail: str, data: dict[str, Any] | None = None) -> Finding:
    """The finding of a metric that fell (``d``: :func:`~evotrainer.harness.analyzers.rules.drop`'s basis, start,
    end): judged as a change (segments) or a trend (windows), and ``"{v}: {what} fell from a to b {unit} (xr;
    how){tail}"``."""
    basis, start, end = d
    return Finding(kind=kind, severity=severity, versions=[v], steps=span(t),
                   judged="change" if basis == "segments" else "trend", evidence=evidence,
                   data={**trend_data(t), "basis": basis, "from": start, "to": end, **(data or {})},
                   explanation=f"{v}: {what} fell from {fmt(start)} to {fmt(end)} {unit} "
                               f"(x{fmt(end / start)}; {_how(basis, t, unit)}){tail}")


def _groups_emptied(ev: Evidence, v: str) -> Trend | None:
    """The zero-std-group fraction of ``v`` when it rose from under ZV_WARN to at least ZV_BLOCK, else None."""
    t = trend_of(ev, v, M.REWARD_FRAC_ZERO_STD)
    if t is None:
        return None
    return t if (t.early < ZV_WARN and t.late >= ZV_BLOCK) or (t.start < ZV_WARN and t.end >= ZV_BLOCK) else None


def _nan_series(ev: Evidence, v: str) -> list[str]:
    names = [n for n in NAN_CORE if ev.has(v, n)]
    return names + [n for n in ev.metric_names(v) if n not in NAN_CORE and any(k in n for k in _NAN_FOREIGN)
                    and not n.startswith(("timing", "perf", "time/"))]


@ANALYZERS.analyzer("nan_blowup", description="NaN / inf in losses, KL, grad norm, reward or entropy")
def nan_blowup(ev: Evidence) -> list[Finding]:
    """Non-finite (or > 1e8 in magnitude, grad norms excepted) values of core series (a level: one step is enough);
    blocking when they persist (two or more, or on the last step), warn for one that recovered. A series non-finite
    at every step from the run's first while a :data:`NAN_SIGNAL` series stays finite was never computed: an ``info``
    note, not a blow-up (:func:`_never_computed`)."""
    out = []
    for v in ev.versions:
        hits = []
        for name in _nan_series(ev, v):
            steps, values = ev.series(v, name)
            bad = ~np.isfinite(values)
            if "grad_norm" not in name:  # a huge pre-clip grad norm is grad_spike's (a level there), not corrupt weights
                bad |= np.abs(np.nan_to_num(values, nan=0.0)) > 1e8
            if bad.any():
                hits.append((name, steps[bad], int(bad.sum()), len(values), bool(bad[-1])))
        never = _never_computed(ev, v, hits)
        hits = [h for h in hits if h[0] not in never]
        if not hits:
            if never:
                out.append(_never_computed_note(v, never, ev))
            continue
        first = min(int(h[1][0]) for h in hits)
        last = max(int(h[1][-1]) for h in hits)
        persistent = any(h[2] >= 2 or h[4] for h in hits)
        parts = [f"{n}: {k}/{tot} steps from step {int(s[0])}" for n, s, k, tot, _ in hits]
        kl_before = ""
        steps, kl = ev.series(v, M.POLICY_KL)
        pre = kl[(steps < first) & np.isfinite(kl)]
        if len(pre) >= 6:
            kl_before = f"; KL before the blow-up rose from {fmt(np.median(pre[:3]))} to {fmt(np.median(pre[-3:]))}"
        critic_only = all(_CRITIC.search(h[0]) for h in hits)
        whose = "the critic's (value model's)" if critic_only else "the"
        if not persistent:
            tail = "An isolated value that recovered."
        elif len({int(x) for h in hits for x in h[1]}) == 1 and not any(h[2] >= 2 for h in hits):
            tail = (f"On the log's last step, the only one that shows it: {whose} weights are corrupt from there unless "
                    f"the next steps recover (the log does not show them).")
        else:
            tail = f"They persist: {whose} weights are corrupt from here on."
        if critic_only and persistent:
            tail += " The policy's own series are finite so far; the advantages come from the critic, so it is next."
        out.append(Finding(
            kind="nan_blowup", severity="blocking" if persistent else "warn", versions=[v], steps=[first, last],
            evidence=[h[0] for h in hits], judged="level",
            data={"first_step": first, "series": {h[0]: h[2] for h in hits},
                  "bad_steps": {h[0]: h[1][:20].tolist() for h in hits}, "critic_only": critic_only},
            explanation=f"{v}: non-finite values from step {first} ({'; '.join(parts)}){kl_before}. {tail}"))
    return out


def _logs_from_start(steps: np.ndarray) -> bool:
    """Whether logged ``steps`` (sorted) start at the run's first logging step: step 0 or 1, or no later than one
    logging interval (the smallest gap between logged steps): the HF Trainer logs first at step ``logging_steps``
    (``TrainingArguments`` default 500, TRL's configs 10 or 1: a beta=0 run logged every 10 steps shows ``kl`` nan from
    step 10), and a log read every n-th line starts at step n. An excerpt from step 300 of steps 300, 301, ... does
    not: a metric non-finite there may have been finite before it (ms-swift#4465's kl turned NaN at step 300)."""
    if len(steps) == 0:
        return False
    gaps = np.diff(steps)
    gap = int(gaps[gaps > 0].min()) if (gaps > 0).any() else 1
    return int(steps[0]) <= max(1, gap)


def _never_computed(ev: Evidence, v: str, hits: list[tuple[Any, ...]]) -> dict[str, int]:
    """The hit series (name -> steps), other than the :data:`NAN_SIGNAL` ones, that are non-finite at every logged
    step (CPPO#3: ``grad_norm`` NaN at every step on a V100 was excused as "never computed" because the loss, 0.0, stayed
    finite; every trainer computes its loss, reward and grad norm), at least
    :data:`NAN_UNCOMPUTED_MIN_STEPS` of them, from the run's first logging step (:func:`_logs_from_start`), while a
    :data:`NAN_SIGNAL` series that is not itself hit is finite at every one of those steps: a metric the trainer does
    not compute, not a blow-up."""
    hit = {h[0] for h in hits}
    out: dict[str, int] = {}
    for name, bad_steps, k, total, _ in hits:
        if (k != total or total < NAN_UNCOMPUTED_MIN_STEPS or not _logs_from_start(bad_steps)
                or name in NAN_SIGNAL):  # a loss, reward or grad norm is always computed: never excused
            continue
        for sig in NAN_SIGNAL:
            if sig in hit or not ev.has(v, sig):
                continue
            steps, values = ev.series(v, sig)
            at = np.isin(steps, bad_steps)
            if int(at.sum()) == total and np.isfinite(values[at]).all():
                out[name] = total
                break
    return out


def _never_computed_note(v: str, never: dict[str, int], ev: Evidence) -> Finding:
    names = ", ".join(f"{n} ({k}/{k} steps)" for n, k in never.items())
    steps = np.concatenate([ev.series(v, n)[0] for n in never])
    return Finding(kind="nan_blowup", severity="info", versions=[v], steps=[int(steps.min()), int(steps.max())],
                   evidence=list(never), judged="level", damages_weights=False,
                   data={"never_computed": never},
                   explanation=f"{v}: {names} non-finite at every logged step from the first, while the loss / reward / "
                               "grad norm stay finite: a metric the trainer does not compute (e.g. TRL's kl with "
                               "beta=0.0), not corrupt weights.")


TRUNC_UNIFORM_STEPS = 3
"""Logged steps whose mean completion length is one and the same whole number that make it the length cap when no
clipped ratio or max length is logged (TRL < 0.16 logs only ``completion_length``, the batch mean of the completion
masks' sums: a run whose every completion hits ``max_completion_length=256`` logs 256.0 at every step). The same whole
number repeated exactly over several batches of sampled completions practically needs every completion to have that
length; 3 is the fewest steps the analyzers judge a change on (``behaviour._hacking_from_few_points``)."""


def _uniform_length(ev: Evidence, v: str) -> float | None:
    """The mean completion length of ``v`` when its last :data:`TRUNC_UNIFORM_STEPS` finite values (or more) are one
    and the same positive whole number (the cap every completion reached), else None."""
    _, x = ev.series(v, M.COMPLETIONS_MEAN_LENGTH)
    x = x[np.isfinite(x)][-TRUNC_UNIFORM_STEPS:]
    if len(x) < TRUNC_UNIFORM_STEPS or x[-1] < 1 or x[-1] != np.round(x[-1]) or not (x == x[-1]).all():
        return None
    return float(x[-1])


@ANALYZERS.analyzer("truncation", description="completions cut at the length cap")
def truncation(ev: Evidence) -> list[Finding]:
    """Recent clipped ratio high (a level: the median of the last 20% of steps, one step when only one
    is logged), or mean length pinned at the cap when no clipped ratio is logged (the cap: the recipe's, a constant
    max length, or a mean length that is one whole number at the last :data:`TRUNC_UNIFORM_STEPS` steps)."""
    out = []
    for v in ev.versions:
        lv = level_of(ev, v, M.COMPLETIONS_CLIPPED_RATIO)
        if lv is not None:
            if lv.recent >= TRUNC_WARN:
                t = trend_of(ev, v, M.COMPLETIONS_CLIPPED_RATIO)
                sev = "blocking" if lv.recent >= TRUNC_BLOCK else "warn"
                where = (f"the only logged step ({lv.last_step})" if lv.n == 1 else
                         f"the last {lv.n_recent} logged steps (median, steps {lv.recent_from}-{lv.last_step})")
                early = f"; {fmt(100 * t.early)}% in the first 20% of steps" if t is not None else ""
                out.append(Finding(kind="truncation", severity=sev, versions=[v], steps=span(lv),
                                   evidence=[M.COMPLETIONS_CLIPPED_RATIO], judged="level",
                                   data={**level_data(lv), **(trend_data(t) if t is not None else {})},
                                   explanation=f"{v}: {fmt(100 * lv.recent)}% of completions hit the length cap in "
                                               f"{where}{early}; their rewards judge unfinished answers."))
            continue
        cap = (ev.recipes.get(v) or {}).get("generate_max_len")
        ll = level_of(ev, v, M.COMPLETIONS_MEAN_LENGTH)
        if ll is None:
            continue
        mx = trend_of(ev, v, M.COMPLETIONS_MAX_LENGTH)  # a max length constant over >= MIN_POINTS steps is the cap
        cap = cap or (mx.late if mx is not None and np.isclose(mx.early, mx.late) else None)
        uniform = None if cap else _uniform_length(ev, v)
        cap = cap or uniform
        if cap and ll.recent >= 0.98 * cap:
            how = (f"; the same whole number at each of the last {TRUNC_UNIFORM_STEPS} logged steps or more: every "
                   "completion had that length, which only a length cap gives (no clipped ratio or max length is "
                   "logged)" if uniform else "")
            out.append(Finding(kind="truncation", severity="blocking", versions=[v], steps=span(ll),
                               evidence=[M.COMPLETIONS_MEAN_LENGTH] + ([] if uniform else [M.COMPLETIONS_MAX_LENGTH]),
                               judged="level", data={**level_data(ll), "cap": float(cap),
                                                     **({"cap_from": "uniform_mean_length"} if uniform else {})},
                               explanation=f"{v}: mean completion length {fmt(ll.recent)} tokens sits at the cap "
                                           f"{fmt(cap)} in the last steps{how}: nearly every completion is truncated."))
    return out


@ANALYZERS.analyzer("entropy_collapse", description="policy entropy falls to a fraction of its start")
def entropy_collapse(ev: Evidence) -> list[Finding]:
    """Entropy at its end <= ENTROPY_RATIO of its start (or below ENTROPY_FLOOR nats from over twice it),
    judged as a change between the first and last segments of the run (binary segmentation) or as a
    trend of the first / last 20% windows (:func:`~evotrainer.harness.analyzers.rules.drop`); blocking when the zero-std group fraction
    rose with it from under ZV_WARN to ZV_BLOCK or more (the collapse emptied the groups)."""
    out = []
    for v in ev.versions:
        t = trend_of(ev, v, M.POLICY_ENTROPY)
        if (d := drop(t, ENTROPY_RATIO, ENTROPY_FLOOR) if t is not None else None) is None:
            if (f := _deterministic(ev, v)) is not None:
                out.append(f)
            elif t is None and (f := insufficient("entropy_collapse", v, M.POLICY_ENTROPY, ev)) is not None:
                out.append(f)
            continue
        basis = d[0]
        zt = _groups_emptied(ev, v)
        stop = (f" The groups followed: {fmt(100 * zt.early)}% -> {fmt(100 * zt.late)}% have zero reward "
                f"variance, so training has stopped (blocking)." if zt is not None else "")
        early_note = ""
        if basis == "segments" and t.start_until is not None and t.last_step > t.first_step:
            frac = (t.start_until - t.first_step) / (t.last_step - t.first_step)
            early_note = (f" It left its starting level after step {t.start_until} ({fmt(100 * frac)}% into the run) "
                          f"and holds the low level from step {t.end_from}.")
        out.append(_drop_finding(
            "entropy_collapse", "blocking" if zt is not None else "warn", v, t, d,
            [M.POLICY_ENTROPY] + ([M.REWARD_FRAC_ZERO_STD] if zt is not None else []), "policy entropy", "nats/token",
            f"; the policy stops exploring and groups lose reward variance.{early_note}{stop}",
            {"zero_std_frac_late": zt.late} if zt is not None else None))
    return out


ENTROPY_DETERMINISTIC = 0.01
"""nats/token: a recent entropy level at or below this is collapsed with no trend to judge (one logged step is enough):
a token distribution that puts 99.9% on one token has 0.0079 nats. Ours, far under the 0.05 floor a drop must reach
(ENTROPY_FLOOR) and under the ~0.1-0.3 where verl / DAPO runs call entropy collapsed; verl#1224's PPO run logged 0.001
on its one pasted step."""


def _deterministic(ev: Evidence, v: str) -> Finding | None:
    """``entropy_collapse`` (warn, judged on the level) where the recent entropy is at or below
    :data:`ENTROPY_DETERMINISTIC` and no drop was judged: a log too short for a trend, or one collapsed before it
    starts. An entropy of exactly 0 at every step beside a reward spread above 0 is none (not computed)."""
    lv = level_of(ev, v, M.POLICY_ENTROPY)
    if lv is None or not lv.recent <= ENTROPY_DETERMINISTIC:
        return None
    spread = level_of(ev, v, M.REWARD_STD)
    if lv.lo == lv.hi == 0.0 and spread is not None and spread.hi > ZERO_STD_TOL:
        # exactly 0 at every step while a group's samples scored apart: a placeholder for an entropy the trainer did
        # not compute (open-r1#704's TRL table: entropy 0 with reward_std 21.8), not a deterministic policy
        return None
    return Finding(kind="entropy_collapse", severity="warn", versions=[v], steps=span(lv), evidence=[M.POLICY_ENTROPY],
                   judged="level", data=level_data(lv),
                   explanation=f"{v}: policy entropy is {fmt(lv.recent)} nats/token over the last {lv.n_recent} logged "
                               f"step(s) (median), at or below {ENTROPY_DETERMINISTIC}: the policy samples almost "
                               "deterministically, so a group's samples barely differ and carry little reward "
                               "variance; raise the temperature, add an entropy bonus or lower the learning rate.")


@ANALYZERS.analyzer("length_collapse", description="completions shrink to a fraction of their start")
def length_collapse(ev: Evidence) -> list[Finding]:
    """Mean completion length at its end <= LEN_COLLAPSE_RATIO of its start and >= 5 tokens shorter
    (first / last segments, or first / last 20% windows with a falling trend; :func:`~evotrainer.harness.analyzers.rules.drop`)."""
    out = []
    for v in ev.versions:
        if (t := trend_or_note(ev, v, "length_collapse", M.COMPLETIONS_MEAN_LENGTH, out)) is None:
            continue
        d = drop(t, LEN_COLLAPSE_RATIO)
        if d is None or d[0] == "windows" and not t.falling(ALPHA) or d[1] - d[2] < 5:
            continue
        out.append(_drop_finding("length_collapse", "warn", v, t, d, [M.COMPLETIONS_MEAN_LENGTH],
                                 "mean completion length", "tokens",
                                 ": the policy is shortening its answers, often to satisfy a format or length term."))
    return out


@ANALYZERS.analyzer("length_blowup", description="completions grow to a multiple of their start")
def length_blowup(ev: Evidence) -> list[Finding]:
    """Mean length at its end >= LEN_BLOWUP_RATIO x its start: last vs first segment (a change), or the
    last vs first 20% windows with a rising trend or a 1.5x level shift; warn when truncation rises or
    correctness (else the reward) does not, info otherwise."""
    out = []
    for v in ev.versions:
        t = trend_of(ev, v, M.COMPLETIONS_MEAN_LENGTH)
        if t is None:
            continue
        if t.n_segments > 1 and t.start > 0 and t.end >= LEN_BLOWUP_RATIO * t.start:
            basis, a, b = "segments", t.start, t.end
        elif (t.early > 0 and t.ratio >= LEN_BLOWUP_RATIO
              and (t.rising(ALPHA) or (t.change_step is not None and t.after >= 1.5 * t.before))):
            basis, a, b = "windows", t.early, t.late
        else:
            continue
        ct = trend_of(ev, v, M.COMPLETIONS_CLIPPED_RATIO)
        cname = ev.first(v, *CORRECTNESS, M.REWARD_MEAN)
        cor = trend_of(ev, v, cname) if cname else None
        clip_up = ct is not None and (ct.late >= TRUNC_WARN or ct.late >= ct.early + 0.1)
        no_gain = cor is not None and cor.late <= cor.early + 0.01
        sev = "warn" if clip_up or no_gain else "info"
        why = []
        if clip_up:
            why.append(f"clipped ratio {fmt(ct.early)} -> {fmt(ct.late)}")
        if cor is not None:
            why.append(f"{cname} {fmt(cor.early)} -> {fmt(cor.late)}")
        out.append(Finding(kind="length_blowup", severity=sev, versions=[v], steps=span(t),
                           evidence=[M.COMPLETIONS_MEAN_LENGTH] + ([M.COMPLETIONS_CLIPPED_RATIO] if ct else []),
                           data={**trend_data(t), "basis": basis, "from": a, "to": b},
                           judged="change" if basis == "segments" else "trend",
                           explanation=f"{v}: mean completion length grew from {fmt(a)} to {fmt(b)} tokens "
                                       f"(x{fmt(b / a)}; {_how(basis, t, 'tokens')})"
                                       f"{'; ' + ', '.join(why) if why else ''}."
                                       + (f" Longer answers are buying no gain in {cname}." if no_gain else
                                          " More completions hit the length cap." if clip_up else
                                          " The reward rose with it, so this may be useful reasoning." if cor else
                                          " No reward or correctness series: insufficient evidence to call it a "
                                          "failure.")))
    return out


@ANALYZERS.analyzer("kl_blowup", description="KL to the reference policy explodes")
def kl_blowup(ev: Evidence) -> list[Finding]:
    """KL recent level >= KL_WARN nats (a level: one step is enough), or a level shift by >= KL_JUMP x
    to >= KL_JUMP_MIN (a change), or a start at >= KL_WARN (the median of the first 5 logged steps, in a log whose
    first step is at most KL_START_STEPS: a run starts at its reference, so a KL that high from the start is a
    reference that is not the starting policy, even when it decays later); info for a steady drift (a trend)."""
    out = []
    for v in ev.versions:
        lv = level_of(ev, v, M.POLICY_KL)
        t = trend_of(ev, v, M.POLICY_KL)
        if t is None and lv is not None and lv.recent >= KL_WARN:
            out.append(Finding(kind="kl_blowup", severity="warn", versions=[v], steps=span(lv), evidence=[M.POLICY_KL],
                               judged="level", data=level_data(lv),
                               explanation=f"{v}: KL to the reference is {fmt(lv.recent)} nats/token on the "
                                           f"{lv.n} logged step(s) (median), above the blow-up level {KL_WARN}; the "
                                           f"policy left the trust region; raise init_kl_coef or lower the learning rate."))
            continue
        if t is None:
            if (f := insufficient("kl_blowup", v, M.POLICY_KL, ev)) is not None:
                out.append(f)
            continue
        jump = (t.change_step is not None and t.after >= KL_JUMP_MIN
                and t.after >= KL_JUMP * max(t.before, 1e-6))
        if t.late >= KL_WARN or jump:
            why = (f"late median {fmt(t.late)} nats/token" if t.late >= KL_WARN else
                   f"a level shift at step {t.change_step} from {fmt(t.before)} to {fmt(t.after)} nats/token")
            out.append(Finding(kind="kl_blowup", severity="warn", versions=[v], steps=span(t),
                               evidence=[M.POLICY_KL], data=trend_data(t), judged="level" if t.late >= KL_WARN else "change",
                               explanation=f"{v}: KL to the reference shows {why} (early {fmt(t.early)}); the policy "
                                           f"left the trust region; raise init_kl_coef or lower the learning rate."))
        elif t.head >= KL_WARN and t.first_step <= KL_START_STEPS:
            out.append(Finding(kind="kl_blowup", severity="warn", versions=[v], steps=span(t),
                               evidence=[M.POLICY_KL], data=trend_data(t), judged="level",
                               explanation=f"{v}: KL to the reference is {fmt(t.head)} nats/token over the first 5 "
                                           f"logged steps (median), above the blow-up level {KL_WARN}, where a run "
                                           f"starts at its reference (KL 0 before the first update); it falls to "
                                           f"{fmt(t.late)} late. The reference is not the policy's starting weights "
                                           "(e.g. the base model without the LoRA or SFT weights the policy starts "
                                           "from), or the two score different tokens: point the reference at the "
                                           "starting policy, or set the KL coefficient to 0."))
        elif t.rising(ALPHA) and t.late >= 10 * max(t.early, 1e-4) and t.late >= 0.01:
            out.append(Finding(kind="kl_blowup", severity="info", versions=[v], steps=span(t),
                               evidence=[M.POLICY_KL], data=trend_data(t), judged="trend",
                               explanation=f"{v}: KL drifts up steadily from {fmt(t.early)} to {fmt(t.late)} nats/token "
                                           f"(tau {fmt(t.tau)}); below the blow-up level {KL_WARN}, worth watching."))
    return out


def _around(steps: np.ndarray, values: np.ndarray, at: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Finite values of the ``w`` logged steps before ``at`` and the ``w`` after it (``at`` excluded)."""
    ok = np.isfinite(values)
    s, x = steps[ok], values[ok]
    return x[max(0, np.searchsorted(s, at) - w):np.searchsorted(s, at)], x[np.searchsorted(s, at, "right"):][:w]


def _damage_after(ev: Evidence, v: str, at: int, until: int) -> list[str]:
    """What got worse right after a gradient spike at step ``at`` (up to step ``until``), in words.

    Damage (``GRAD_DAMAGE_WINDOW`` logged steps before vs after, medians): a non-finite core value in
    ``(at, until]``; the reward (or correctness) down by more than 3 noise sds (``trends.noise_sd``) and
    ``REWARD_DROP_RANGE`` of its p5-p95 range over the run; entropy x2 or x0.5; KL up KL_JUMP x to at
    least KL_JUMP_MIN; the grad norm itself staying x3 higher (a level shift, not a spike).
    """
    w, out = GRAD_DAMAGE_WINDOW, []
    for name in NAN_CORE:
        s, x = ev.series(v, name)
        if len(s) and (~np.isfinite(x[(s > at) & (s <= until)])).any():
            out.append(f"{name} non-finite after step {at}")
    rname = ev.first(v, M.REWARD_MEAN, *CORRECTNESS)
    if rname:
        s, x = ev.series(v, rname)
        pre, post = _around(s, x, at, w)
        fx = x[np.isfinite(x)]
        if len(pre) >= 2 and len(post) >= 2 and len(fx) >= 2 * w:
            fall = float(np.median(pre) - np.median(post))
            spread = float(np.percentile(fx, 95) - np.percentile(fx, 5))
            if fall > 3 * noise_sd(fx) and fall >= REWARD_DROP_RANGE * spread and fall > 0:
                out.append(f"{rname} {fmt(float(np.median(pre)))} -> {fmt(float(np.median(post)))}")
    checks = ((M.POLICY_ENTROPY, lambda a, b: a > 0 and (b >= 2 * a or b <= a / 2)),
              (M.POLICY_KL, lambda a, b: b >= KL_JUMP_MIN and b >= KL_JUMP * max(a, 1e-6)),
              (M.POLICY_GRAD_NORM, lambda a, b: a > 0 and b >= 3 * a))
    for name, bad in checks:
        s, x = ev.series(v, name)
        pre, post = _around(s, x, at, w)
        if len(pre) >= 2 and len(post) >= 2 and bad(float(np.median(pre)), float(np.median(post))):
            out.append(f"{name} {fmt(float(np.median(pre)))} -> {fmt(float(np.median(post)))}")
    return out


@ANALYZERS.analyzer("grad_spike", description="gradient-norm spikes that do damage, or a rising gradient norm")
def grad_spike(ev: Evidence) -> list[Finding]:
    """Spikes of the grad norm above GRAD_SPIKE_K robust sds of its trailing rolling median (and 3x it),
    judged by what follows them (a change: :func:`_damage_after`), or a 10x rising trend.

    A level first: any logged value at or above GRAD_NORM_LEVEL warns from one step.
    Severity: ``warn`` when a spike is followed by damage, when the grad norm rises 10x, or when
    GRAD_SPIKES_WARN or more spikes come with no reward, entropy or KL series to judge damage by;
    ``info`` for spikes the run shows no harm from, however many (healthy GRPO runs spike now and
    then: the loss of one batch of long or rare completions; the clipped update bounds their effect).
    """
    out = []
    for v in ev.versions:
        steps, g = ev.series(v, M.POLICY_GRAD_NORM)
        huge = np.isfinite(g) & (g >= GRAD_NORM_LEVEL)
        if huge.any():
            ok = np.isfinite(g)
            out.append(Finding(
                kind="grad_spike", severity="warn", versions=[v], steps=steps[huge][:50].tolist(), judged="level",
                evidence=[M.POLICY_GRAD_NORM],
                data={"n_huge": int(huge.sum()), "n_points": int(ok.sum()), "max": float(g[huge].max()),
                      "median": float(np.median(g[ok])), "level": GRAD_NORM_LEVEL},
                explanation=f"{v}: the gradient norm is {fmt(float(g[huge].max()))} at its peak, at or above "
                            f"{fmt(GRAD_NORM_LEVEL)} on {int(huge.sum())} of {int(ok.sum())} logged steps (steps "
                            f"{', '.join(map(str, steps[huge][:8].tolist()))}; median {fmt(float(np.median(g[ok])))}): "
                            f"an abnormal gradient (look for a loss-scale, precision or data cause); clipping "
                            f"bounds the update, not the cause."))
            continue
        if (t := trend_or_note(ev, v, "grad_spike", M.POLICY_GRAD_NORM, out)) is None:
            continue
        mask = spikes(g, k=GRAD_SPIKE_K)
        sp = steps[mask]
        rising = t.rising(ALPHA) and t.early > 0 and t.late >= 10 * t.early
        if len(sp) == 0 and not rising:
            continue
        fs = steps[np.isfinite(g)]
        damage: dict[int, list[str]] = {}
        for at in sp[:200].tolist():  # the first 200 spikes are judged (bounded cost on 10k-step runs)
            j = np.searchsorted(fs, at, "right") + GRAD_DAMAGE_WINDOW - 1
            if hurt := _damage_after(ev, v, at, int(fs[min(j, len(fs) - 1)])):
                damage[at] = hurt
        judgeable = any(ev.has(v, n) for n in (M.REWARD_MEAN, *CORRECTNESS, M.POLICY_ENTROPY, M.POLICY_KL))
        blind = not judgeable and len(sp) >= GRAD_SPIKES_WARN
        sev = "warn" if damage or rising or blind else "info"
        gf = g[np.isfinite(g)]
        peak = float(g[mask].max()) if len(sp) else float(gf.max())
        txt = (f"{len(sp)} spike(s) above {fmt(GRAD_SPIKE_K)} robust sds of the rolling median (peak {fmt(peak)}, "
               f"median {fmt(float(np.median(gf)))}) at steps {', '.join(map(str, sp[:8].tolist()))}"
               f"{' ...' if len(sp) > 8 else ''}" if len(sp) else "")
        if damage:
            txt += "; followed by damage: " + "; ".join(f"after step {at}: {', '.join(h)}"
                                                         for at, h in list(damage.items())[:4])
        elif len(sp):
            txt += ("; no series shows harm after them" if judgeable else
                    "; no reward, entropy or KL series to show whether they did harm")
        if rising:
            txt += ("; " if txt else "") + f"grad norm rose from {fmt(t.early)} to {fmt(t.late)} (tau {fmt(t.tau)})"
        out.append(Finding(kind="grad_spike", severity=sev, versions=[v],
                           steps=sp.tolist() if len(sp) else span(t), evidence=[M.POLICY_GRAD_NORM],
                           judged="trend" if rising and not len(sp) else "change",
                           data={**trend_data(t), "n_spikes": int(len(sp)), "spike_steps": sp[:50].tolist(),
                                 "damaged_after": {str(k): h for k, h in damage.items()}, "rising": bool(rising)},
                           explanation=f"{v}: {txt}." + ("" if sev == "warn" else " No action needed yet.")))
    return out
