"""Built-in analyzers, one per failure kind of ``harness.findings.KINDS`` (DESIGN.md §4).

Each reads metric series (logged, or derived from rollouts), judges trends over the run with the
robust statistics of ``harness/trends.py`` (early vs late medians, Mann-Kendall, change points,
rolling-median spikes) and never a single step, and returns findings whose explanation carries
the numbers. A series with fewer than ``trends.MIN_POINTS`` finite points gives an ``info``
"insufficient evidence" finding instead of a guess. Thresholds are module constants, named and
commented, so a backtest can judge them.

Benign artefacts raise nothing: a policy loss printing 0.0 (GRPO's surrogate is ~0 at the
on-policy point with group-normalised advantages) is not a failure while grad norm and reward move.
"""

from __future__ import annotations

import numpy as np
from evotrainer.harness.analyzers import analyzer
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding
from evotrainer.harness.trends import MIN_POINTS, Trend, fmt, spikes, trend

from evotrainer import metrics as M

ALPHA = 0.01  # Mann-Kendall significance for "rising" / "falling"

CORRECTNESS = (M.CORRECT_MEAN, M.reward_component("correctness"))
ENTROPY_RATIO = 0.3  # late / early entropy at or below this: collapse
ENTROPY_FLOOR = 0.05  # nats per token: collapsed whatever the start
TRUNC_WARN, TRUNC_BLOCK = 0.2, 0.5  # late clipped ratio
ZV_WARN, ZV_BLOCK = 0.5, 0.99  # late fraction of zero-variance groups
LEN_COLLAPSE_RATIO, LEN_BLOWUP_RATIO = 0.5, 2.0  # late / early mean completion length
KL_WARN = 1.0  # nats per token: KL level that is a blow-up whatever the trend
KL_JUMP = 5.0  # change-point after/before ratio that is a blow-up (with after >= KL_JUMP_MIN)
KL_JUMP_MIN = 0.2
GRAD_SPIKE_K, GRAD_SPIKES_WARN = 10.0, 3  # spike size in robust sds; number of spikes for a warning
DUP_WARN = 0.3  # late fraction of completions duplicated across prompts
DISTINCT_RATIO = 0.5  # late / early distinct-2
HACK_RISE, HACK_FALL = 0.05, 0.02  # absolute rise of a reward term / fall of correctness
LEAK_WARN = 0.05  # fraction of prompts containing their answer
DIVERGE_RISE = 0.05  # train reward rise that makes a flat held-out score suspicious
NAN_CORE = (M.LOSS_POLICY, M.LOSS_KL, M.LOSS_TOTAL, M.POLICY_KL, M.POLICY_GRAD_NORM, M.POLICY_ENTROPY,
            M.REWARD_MEAN, M.REWARD_STD, M.COMPLETIONS_MEAN_LENGTH)


def _trend(ev: Evidence, v: str, name: str) -> Trend | None:
    steps, values = ev.series(v, name)
    return trend(steps, values) if len(steps) else None


def _insufficient(kind: str, v: str, name: str, ev: Evidence) -> Finding | None:
    steps, values = ev.series(v, name)
    n = int(np.isfinite(values).sum())
    if 0 < n < MIN_POINTS:
        return Finding(kind=kind, severity="info", versions=[v], steps=[int(steps[0]), int(steps[-1])],
                       evidence=[name], data={"n_points": n},
                       explanation=f"insufficient evidence: {name} has {n} finite point(s) in {v}; "
                                   f"{kind} needs at least {MIN_POINTS} to judge a trend")
    return None


def _trend_or_note(ev: Evidence, v: str, kind: str, name: str, out: list[Finding]) -> Trend | None:
    """The trend of series ``name`` in version ``v``, or None; when None and the series has 1 to
    ``MIN_POINTS - 1`` finite points, an "insufficient evidence" info finding of ``kind`` is appended to ``out``."""
    t = _trend(ev, v, name)
    if t is None and (f := _insufficient(kind, v, name, ev)) is not None:
        out.append(f)
    return t


def _span(t: Trend) -> list[int]:
    return [t.first_step, t.last_step]


def _tdata(t: Trend) -> dict:
    return {"early": t.early, "late": t.late, "head": t.head, "tail": t.tail, "tau": t.tau, "p_value": t.p_value,
            "slope": t.slope, "change_step": t.change_step, "n_points": t.n}


def _entropy_collapsed(t: Trend | None) -> bool:
    """Whether a policy-entropy trend collapsed (the rule of :func:`entropy_collapse`)."""
    if t is None or not (t.early > 0 and (t.ratio <= ENTROPY_RATIO or (t.late <= ENTROPY_FLOOR < t.early / 2))):
        return False
    return t.falling(ALPHA) or (t.change_step is not None and t.after < t.before / 2)


def _groups_emptied(ev: Evidence, v: str) -> Trend | None:
    """The zero-std-group fraction of ``v`` when it rose from under ZV_WARN to at least ZV_BLOCK, else None."""
    t = _trend(ev, v, M.REWARD_FRAC_ZERO_STD)
    return t if t is not None and t.early < ZV_WARN and t.late >= ZV_BLOCK else None


@analyzer("nan_blowup", description="NaN / inf in losses, KL, grad norm, reward or entropy")
def nan_blowup(ev: Evidence) -> list[Finding]:
    """Non-finite (or > 1e8 in magnitude) values of core series; blocking when they persist."""
    out = []
    for v in ev.versions:
        hits = []
        for name in NAN_CORE:
            steps, values = ev.series(v, name)
            bad = ~np.isfinite(values) | (np.abs(np.nan_to_num(values, nan=0.0)) > 1e8)
            if bad.any():
                hits.append((name, steps[bad], int(bad.sum()), len(values), bool(bad[-1])))
        if not hits:
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
        out.append(Finding(
            kind="nan_blowup", severity="blocking" if persistent else "warn", versions=[v], steps=[first, last],
            evidence=[h[0] for h in hits], data={"first_step": first, "series": {h[0]: h[2] for h in hits}},
            explanation=f"{v}: non-finite values from step {first} ({'; '.join(parts)})"
                        f"{kl_before}. {'They persist: the weights are corrupt from here on.' if persistent else 'An isolated value that recovered.'}"))
    return out


@analyzer("truncation", description="completions cut at the length cap")
def truncation(ev: Evidence) -> list[Finding]:
    """Late clipped ratio high (or mean length pinned at the cap when no clipped ratio is logged)."""
    out = []
    for v in ev.versions:
        t = _trend(ev, v, M.COMPLETIONS_CLIPPED_RATIO)
        if t is not None:
            if t.late >= TRUNC_WARN:
                sev = "blocking" if t.late >= TRUNC_BLOCK else "warn"
                out.append(Finding(kind="truncation", severity=sev, versions=[v], steps=_span(t),
                                   evidence=[M.COMPLETIONS_CLIPPED_RATIO], data=_tdata(t),
                                   explanation=f"{v}: {fmt(100 * t.late)}% of completions hit the length cap in the "
                                               f"last steps (median; {fmt(100 * t.early)}% early, steps "
                                               f"{t.first_step}-{t.last_step}); their rewards judge unfinished answers."))
            continue
        if (f := _insufficient("truncation", v, M.COMPLETIONS_CLIPPED_RATIO, ev)) is not None:
            out.append(f)
            continue
        cap = (ev.recipes.get(v) or {}).get("generate_max_len")
        lt = _trend(ev, v, M.COMPLETIONS_MEAN_LENGTH)
        if lt is None:
            continue
        mx = _trend(ev, v, M.COMPLETIONS_MAX_LENGTH)
        cap = cap or (mx.late if mx is not None and np.isclose(mx.early, mx.late) else None)
        if cap and lt.late >= 0.98 * cap:
            out.append(Finding(kind="truncation", severity="blocking", versions=[v], steps=_span(lt),
                               evidence=[M.COMPLETIONS_MEAN_LENGTH, M.COMPLETIONS_MAX_LENGTH], data=_tdata(lt),
                               explanation=f"{v}: mean completion length {fmt(lt.late)} tokens sits at the cap "
                                           f"{fmt(cap)} in the last steps: nearly every completion is truncated."))
    return out


@analyzer("zero_variance_groups", description="groups whose rewards are all equal (no GRPO signal)")
def zero_variance_groups(ev: Evidence) -> list[Finding]:
    """Late fraction of zero-std groups high (or the whole batch's reward std ~0). A warning only, marked
    ``symptom_of: entropy_collapse``, when the fraction started under ZV_WARN and entropy collapsed in
    the same version: the data had variance, the policy lost it (entropy_collapse then blocks)."""
    out = []
    for v in ev.versions:
        t = _trend(ev, v, M.REWARD_FRAC_ZERO_STD)
        name = M.REWARD_FRAC_ZERO_STD
        if t is None:
            if (f := _insufficient("zero_variance_groups", v, name, ev)) is not None:
                out.append(f)
                continue
            st = _trend(ev, v, M.REWARD_STD)
            if st is None or st.late > 1e-6:
                continue
            t, name = st, M.REWARD_STD
            late = 1.0
        else:
            late = t.late
        if late < ZV_WARN:
            continue
        sev = "blocking" if late >= ZV_BLOCK else "warn"
        data = {**_tdata(t), "late_frac": late}
        cause = "data too easy or too hard for the policy, or a constant reward"
        et = _trend(ev, v, M.POLICY_ENTROPY) if name == M.REWARD_FRAC_ZERO_STD and t.early < ZV_WARN else None
        if et is not None and _entropy_collapsed(et):  # the groups had variance and lost it as the policy turned deterministic
            sev, data["symptom_of"] = "warn", "entropy_collapse"
            cause = (f"here a symptom of the entropy collapse ({fmt(et.early)} -> {fmt(et.late)} nats/token): the "
                     f"samples of a group became identical, while the data gave variance at the start")
        gn = ev.series(v, M.POLICY_GRAD_NORM)[1]
        gn = gn[np.isfinite(gn)]
        g = f"; grad norm median {fmt(float(np.median(gn)))}" if len(gn) else ""
        what = (f"{fmt(100 * late)}% of groups have zero reward variance (median of the last steps; "
                f"{fmt(100 * t.early)}% early)" if name == M.REWARD_FRAC_ZERO_STD else
                "the reward std of every batch is 0 in the last steps, so every group has zero variance")
        out.append(Finding(kind="zero_variance_groups", severity=sev, versions=[v], steps=_span(t), evidence=[name],
                           data=data,
                           explanation=f"{v}: {what}{g}. Those groups get zero group-relative advantage: the batch "
                                       f"carries {'no' if late >= ZV_BLOCK else 'little'} learning signal ({cause})."))
    return out


@analyzer("entropy_collapse", description="policy entropy falls to a fraction of its start")
def entropy_collapse(ev: Evidence) -> list[Finding]:
    """Entropy late/early <= ENTROPY_RATIO (or below ENTROPY_FLOOR nats) with a falling trend or a level
    shift to under half; blocking when the zero-std group fraction rose with it from under ZV_WARN to
    ZV_BLOCK or more (the collapse emptied the groups: no learning signal is left)."""
    out = []
    for v in ev.versions:
        if (t := _trend_or_note(ev, v, "entropy_collapse", M.POLICY_ENTROPY, out)) is None:
            continue
        if _entropy_collapsed(t):
            zt = _groups_emptied(ev, v)
            stop = (f" The groups followed: {fmt(100 * zt.early)}% -> {fmt(100 * zt.late)}% have zero reward "
                    f"variance, so training has stopped (blocking)." if zt is not None else "")
            out.append(Finding(kind="entropy_collapse", severity="blocking" if zt is not None else "warn",
                               versions=[v], steps=_span(t),
                               evidence=[M.POLICY_ENTROPY] + ([M.REWARD_FRAC_ZERO_STD] if zt is not None else []),
                               data={**_tdata(t), **({"zero_std_frac_late": zt.late} if zt is not None else {})},
                               explanation=f"{v}: policy entropy fell from {fmt(t.early)} to {fmt(t.late)} nats/token "
                                           f"(medians of the first and last 20% of steps; {fmt(t.head)} at the start, "
                                           f"{fmt(t.tail)} at the end; x{fmt(t.ratio)}; Mann-Kendall tau {fmt(t.tau)}, p={fmt(t.p_value)}"
                                           f"{f', level shift at step {t.change_step}' if t.change_step is not None else ''}); "
                                           f"the policy stops exploring and groups lose reward variance.{stop}"))
    return out


@analyzer("length_collapse", description="completions shrink to a fraction of their start")
def length_collapse(ev: Evidence) -> list[Finding]:
    """Mean completion length late/early <= LEN_COLLAPSE_RATIO with a falling trend."""
    out = []
    for v in ev.versions:
        if (t := _trend_or_note(ev, v, "length_collapse", M.COMPLETIONS_MEAN_LENGTH, out)) is None:
            continue
        if t.early > 0 and t.ratio <= LEN_COLLAPSE_RATIO and t.early - t.late >= 5 and t.falling(ALPHA):
            out.append(Finding(kind="length_collapse", severity="warn", versions=[v], steps=_span(t),
                               evidence=[M.COMPLETIONS_MEAN_LENGTH], data=_tdata(t),
                               explanation=f"{v}: mean completion length fell from {fmt(t.early)} to {fmt(t.late)} "
                                           f"tokens (x{fmt(t.ratio)}, tau {fmt(t.tau)}, p={fmt(t.p_value)}): the policy "
                                           f"is shortening its answers, often to satisfy a format or length term."))
    return out


@analyzer("length_blowup", description="completions grow to a multiple of their start")
def length_blowup(ev: Evidence) -> list[Finding]:
    """Mean length late/early >= LEN_BLOWUP_RATIO and rising; warn when truncation rises or correctness
    (else the reward) does not, info otherwise."""
    out = []
    for v in ev.versions:
        t = _trend(ev, v, M.COMPLETIONS_MEAN_LENGTH)
        if t is None or t.early <= 0 or t.ratio < LEN_BLOWUP_RATIO:
            continue
        if not (t.rising(ALPHA) or (t.change_step is not None and t.after >= 1.5 * t.before)):
            continue
        ct = _trend(ev, v, M.COMPLETIONS_CLIPPED_RATIO)
        cname = ev.first(v, *CORRECTNESS, M.REWARD_MEAN)
        cor = _trend(ev, v, cname) if cname else None
        clip_up = ct is not None and (ct.late >= TRUNC_WARN or ct.late >= ct.early + 0.1)
        no_gain = cor is not None and cor.late <= cor.early + 0.01
        sev = "warn" if clip_up or no_gain else "info"
        why = []
        if clip_up:
            why.append(f"clipped ratio {fmt(ct.early)} -> {fmt(ct.late)}")
        if cor is not None:
            why.append(f"{cname} {fmt(cor.early)} -> {fmt(cor.late)}")
        out.append(Finding(kind="length_blowup", severity=sev, versions=[v], steps=_span(t),
                           evidence=[M.COMPLETIONS_MEAN_LENGTH] + ([M.COMPLETIONS_CLIPPED_RATIO] if ct else []),
                           data=_tdata(t),
                           explanation=f"{v}: mean completion length grew from {fmt(t.early)} to {fmt(t.late)} tokens "
                                       f"(x{fmt(t.ratio)}){'; ' + ', '.join(why) if why else ''}."
                                       + (f" Longer answers are buying no gain in {cname}." if no_gain else
                                          " More completions hit the length cap." if clip_up else
                                          " The reward rose with it, so this may be useful reasoning." if cor else
                                          " No reward or correctness series: insufficient evidence to call it a "
                                          "failure.")))
    return out


@analyzer("kl_blowup", description="KL to the reference policy explodes")
def kl_blowup(ev: Evidence) -> list[Finding]:
    """KL late level >= KL_WARN nats, or a level shift by >= KL_JUMP x to >= KL_JUMP_MIN; info for a steady drift."""
    out = []
    for v in ev.versions:
        if (t := _trend_or_note(ev, v, "kl_blowup", M.POLICY_KL, out)) is None:
            continue
        jump = (t.change_step is not None and t.after >= KL_JUMP_MIN
                and t.after >= KL_JUMP * max(t.before, 1e-6))
        if t.late >= KL_WARN or jump:
            why = (f"late median {fmt(t.late)} nats/token" if t.late >= KL_WARN else
                   f"a level shift at step {t.change_step} from {fmt(t.before)} to {fmt(t.after)} nats/token")
            out.append(Finding(kind="kl_blowup", severity="warn", versions=[v], steps=_span(t),
                               evidence=[M.POLICY_KL], data=_tdata(t),
                               explanation=f"{v}: KL to the reference shows {why} (early {fmt(t.early)}); the policy "
                                           f"left the trust region; raise init_kl_coef or lower the learning rate."))
        elif t.rising(ALPHA) and t.late >= 10 * max(t.early, 1e-4) and t.late >= 0.01:
            out.append(Finding(kind="kl_blowup", severity="info", versions=[v], steps=_span(t),
                               evidence=[M.POLICY_KL], data=_tdata(t),
                               explanation=f"{v}: KL drifts up steadily from {fmt(t.early)} to {fmt(t.late)} nats/token "
                                           f"(tau {fmt(t.tau)}); below the blow-up level {KL_WARN}, worth watching."))
    return out


@analyzer("grad_spike", description="gradient-norm spikes or a rising gradient norm")
def grad_spike(ev: Evidence) -> list[Finding]:
    """Rolling-median spikes of the grad norm: warn for >= GRAD_SPIKES_WARN spikes or a 10x rising trend."""
    out = []
    for v in ev.versions:
        if (t := _trend_or_note(ev, v, "grad_spike", M.POLICY_GRAD_NORM, out)) is None:
            continue
        steps, g = ev.series(v, M.POLICY_GRAD_NORM)
        mask = spikes(g, k=GRAD_SPIKE_K)
        sp = steps[mask]
        rising = t.rising(ALPHA) and t.early > 0 and t.late >= 10 * t.early
        if len(sp) == 0 and not rising:
            continue
        sev = "warn" if len(sp) >= GRAD_SPIKES_WARN or rising else "info"
        gf = g[np.isfinite(g)]
        peak = float(g[mask].max()) if len(sp) else float(gf.max())
        txt = (f"{len(sp)} spike(s) above {fmt(GRAD_SPIKE_K)} robust sds of the rolling median (peak {fmt(peak)}, "
               f"median {fmt(float(np.median(gf)))}) at steps {', '.join(map(str, sp[:8].tolist()))}"
               f"{' ...' if len(sp) > 8 else ''}" if len(sp) else "")
        if rising:
            txt += ("; " if txt else "") + f"grad norm rose from {fmt(t.early)} to {fmt(t.late)} (tau {fmt(t.tau)})"
        out.append(Finding(kind="grad_spike", severity=sev, versions=[v],
                           steps=sp.tolist() if len(sp) else _span(t), evidence=[M.POLICY_GRAD_NORM],
                           data={**_tdata(t), "n_spikes": int(len(sp))},
                           explanation=f"{v}: {txt}." + ("" if sev == "warn" else " Isolated; no action needed yet.")))
    return out


from evotrainer.harness import behaviour_analyzers as _behaviour  # noqa: E402,F401  (registers the rest)
