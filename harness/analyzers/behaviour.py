"""Built-in analyzers of behaviour: template collapse, reward hacking, train / held-out divergence.

Companion of ``builtin.py`` (same conventions; shared thresholds and helpers in ``rules.py``). These
look at what the policy produces and at what the reward pays for:

* ``template_collapse``: completions duplicated across different prompts (outputs stop depending on
  the input), distinct-2 falling, 4-gram repetition rising;
* ``reward_hacking``: a reward term (or the total) rises while correctness or the held-out score
  falls (a trend; on 3 to 7 steps, a change: every step moves that way); a rising reward term that pays wrong answers as much as right ones (a leaky term the
  policy farms whatever the answer: blocking when correctness stays flat, a warning when correctness
  rises more slowly); answers leaked in prompts;
  test files edited in code / SWE episodes;
* ``train_eval_divergence``: train reward up while the held-out score is flat or down, within a
  run (per-step eval series) and across versions (paired held-out gain over the parent).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow.compute as pc

from evotrainer import metrics as M
from evotrainer.harness.analyzers.rules import (
    ALPHA,
    CORRECTNESS,
    AnalyzerTable,
    span,
    trend_data,
    trend_of,
)
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding
from evotrainer.harness.stats import compare_versions
from evotrainer.harness.trends import MIN_POINTS, fmt

ANALYZERS = AnalyzerTable()
"""This module's built-in analyzers (registered by ``analyzers/registry.py``)."""

DUP_WARN = 0.3  # late fraction of completions duplicated across prompts
DISTINCT_RATIO = 0.5  # late / early distinct-2
HACK_RISE, HACK_FALL = 0.05, 0.02  # absolute rise of a reward term / fall of correctness
LEAK_WARN = 0.05  # fraction of prompts containing their answer
DIVERGE_RISE = 0.05  # train reward rise that makes a flat held-out score suspicious
DIVERGE_VAL_SHARE, DIVERGE_VAL_MAX = 0.2, 0.05  # held-out gain under this share of the train gain (and <= MAX) is flat
_TEST_PATH = re.compile(r"(^|[/\s\"'])(tests?/|test_[\w.-]*\.py|[\w.-]*_test\.py|conftest\.py)")
_EDIT_TOOLS = ("edit", "write", "create", "str_replace", "apply_patch", "patch")
EVAL_SERIES = (M.EVAL_AVG_AT_K, M.EVAL_PASS_AT_1)
LEAK_SAMPLE = 20_000  # distinct prompts checked for a leaked answer (all of them below this)
LEAK_PAY_RATIO = 0.8  # a term paying wrong answers >= this share of what it pays right ones pays 'whatever the answer'


@ANALYZERS.analyzer("template_collapse", description="outputs stop depending on the input / near-duplicate completions")
def template_collapse(ev: Evidence) -> list[Finding]:
    """Duplicate fraction late >= DUP_WARN and up; distinct-2 late/early <= DISTINCT_RATIO and falling
    (Mann-Kendall) or shifted down to <= DISTINCT_RATIO of its level (change point, as entropy_collapse)."""
    out = []
    for v in ev.versions:
        why, evid, data, steps = [], [], {}, None
        d = trend_of(ev, v, M.COMPLETIONS_DUPLICATE_FRAC)
        if d is not None and d.late >= DUP_WARN and d.late >= d.early + 0.1:
            why.append(f"{fmt(100 * d.late)}% of completions are identical to a completion of another prompt "
                       f"(was {fmt(100 * d.early)}%)")
            evid.append(M.COMPLETIONS_DUPLICATE_FRAC)
            data["duplicate_frac"], steps = trend_data(d), span(d)
        t = trend_of(ev, v, M.COMPLETIONS_DISTINCT_2)
        shift = t is not None and t.change_step is not None and t.after <= DISTINCT_RATIO * t.before
        if t is not None and t.early > 0 and t.ratio <= DISTINCT_RATIO and (t.falling(ALPHA) or shift):
            how = (f"Mann-Kendall p={fmt(t.p_value)}" if t.falling(ALPHA) else
                   f"level shift at step {t.change_step}: {fmt(t.before)} -> {fmt(t.after)}")
            why.append(f"distinct-2 fell from {fmt(t.early)} to {fmt(t.late)} ({how})")
            evid.append(M.COMPLETIONS_DISTINCT_2)
            data["distinct_2"], steps = trend_data(t), steps or span(t)
        r = trend_of(ev, v, M.COMPLETIONS_REPETITION)
        if r is not None and r.late >= 0.5 and r.late >= r.early + 0.2 and r.rising(ALPHA):
            why.append(f"4-gram repetition rose from {fmt(r.early)} to {fmt(r.late)}")
            evid.append(M.COMPLETIONS_REPETITION)
            data["repetition"], steps = trend_data(r), steps or span(r)
        if why:
            out.append(Finding(kind="template_collapse", severity="warn", versions=[v], steps=steps or [], judged="change",
                               evidence=evid, data=data,
                               explanation=f"{v}: {'; '.join(why)}. The policy answers with a template rather "
                                           f"than the input; rewards that pay for form can sustain it."))
    return out


def _component_names(ev: Evidence, v: str) -> list[str]:
    skip = set(CORRECTNESS)
    return [n for n in ev.metric_names(v)
            if n.startswith("reward/") and n.endswith("/mean") and n.count("/") == 2 and n not in skip]


def _hacking_from_series(ev: Evidence, v: str) -> list[Finding]:
    """A reward term (or the total) rises while correctness or the held-out score falls."""
    targets = [n for n in (ev.first(v, *CORRECTNESS), ev.first(v, *EVAL_SERIES)) if n]
    out = []
    for tname in targets:
        tt = trend_of(ev, v, tname)
        if tt is None or not (tt.late <= tt.early - HACK_FALL and (tt.falling(ALPHA) or tname in EVAL_SERIES)):
            continue
        risers = []
        for cname in _component_names(ev, v) + [M.REWARD_MEAN]:
            ct = trend_of(ev, v, cname)
            if ct is not None and ct.late >= ct.early + HACK_RISE and ct.rising(ALPHA):
                risers.append((cname, ct))
        if not risers:
            continue
        desc = ", ".join(f"{n} {fmt(t.early)} -> {fmt(t.late)}" for n, t in risers)
        out.append(Finding(kind="reward_hacking", severity="blocking", versions=[v], judged="trend",
                           steps=[min(t.first_step for _, t in risers), max(t.last_step for _, t in risers)],
                           evidence=[n for n, _ in risers] + [tname],
                           data={"rising": {n: trend_data(t) for n, t in risers}, "falling": {tname: trend_data(tt)}},
                           explanation=f"{v}: the reward rises ({desc}; Mann-Kendall p < {ALPHA}) while "
                                       f"{tname} falls from {fmt(tt.early)} to {fmt(tt.late)}: the policy is paid "
                                       f"for something other than solving the task."))
        break
    return out


def _steady(x: np.ndarray, sign: int) -> bool:
    """Every step moves in direction ``sign`` (+1 up, -1 down) or stays."""
    return bool(np.all(sign * np.diff(x) >= 0))


def _hacking_from_few_points(ev: Evidence, v: str) -> list[Finding]:
    """A change on 3 to MIN_POINTS - 1 steps, too few for a trend: correctness falls at every step by
    >= HACK_FALL in all while a reward term (not correctness) rises at every step by >= HACK_RISE in all.
    A warning (three points cannot make it blocking); judged ``change`` with every value listed."""
    cname = ev.first(v, *CORRECTNESS)
    if not cname:
        return []
    cs, cx = ev.series(v, cname)
    ok = np.isfinite(cx)
    cs, cx = cs[ok], cx[ok]
    if not 3 <= len(cx) < MIN_POINTS or not (_steady(cx, -1) and cx[0] - cx[-1] >= HACK_FALL):
        return []
    risers = []
    for n in _component_names(ev, v):
        s, x = ev.series(v, n)
        ok = np.isfinite(x)
        s, x = s[ok], x[ok]
        if 3 <= len(x) < MIN_POINTS and _steady(x, +1) and x[-1] - x[0] >= HACK_RISE:
            risers.append((n, s, x))
    if not risers:
        return []
    vals = lambda x: " -> ".join(fmt(float(a)) for a in x)  # noqa: E731
    desc = "; ".join(f"{n} {vals(x)}" for n, _, x in risers)
    return [Finding(kind="reward_hacking", severity="warn", versions=[v], judged="change",
                    steps=[int(min(cs[0], *(s[0] for _, s, _ in risers))), int(max(cs[-1], *(s[-1] for _, s, _ in risers)))],
                    evidence=[n for n, _, _ in risers] + [cname],
                    data={"rising": {n: x.tolist() for n, _, x in risers}, "falling": {cname: cx.tolist()},
                          "n_points": int(len(cx))},
                    explanation=f"{v}: at every logged step a reward term rises ({desc}) while {cname} falls "
                                f"({vals(cx)}): the policy is paid for something other than solving the task "
                                f"({len(cx)} steps: a change, too few for a trend test).")]


def _component_payout(ev: Evidence, v: str, names: list[str]) -> dict[str, dict] | None:
    """Mean payout of reward components on wrong vs right train rollouts of ``v`` (late half of steps).

    Returns ``{component: {"wrong": mean | None, "right": mean | None, "n_wrong": int, "n_right": int}}``
    (component names without the ``reward/`` prefix and ``/mean`` suffix), or None when the version has
    no rollouts with a known ``correct`` (NaN = unknown). Reads at most :data:`LEAK_SAMPLE` rows.
    """
    t = ev.rollouts_of(v)
    if t is None or "components" not in t.column_names or "correct" not in t.column_names:
        return None
    steps = t.column("step").to_numpy(zero_copy_only=False)
    known = np.isfinite(t.column("correct").to_numpy(zero_copy_only=False).astype(float))
    rows = np.flatnonzero(known & (steps >= np.median(steps)))
    if not len(rows):
        return None
    if len(rows) > LEAK_SAMPLE:
        rows = rows[np.linspace(0, len(rows) - 1, LEAK_SAMPLE).astype(np.int64)]
    sub = t.take(rows).select(["components", "correct"]).to_pydict()
    acc: dict[str, dict[str, list[float]]] = {n: {"wrong": [], "right": []} for n in names}
    for comp, correct in zip(sub["components"], sub["correct"], strict=True):
        try:
            c = json.loads(comp or "{}")
        except json.JSONDecodeError:
            continue
        side = "right" if correct >= 0.5 else "wrong"
        for n in names:
            if n in c and c[n] is not None:
                acc[n][side].append(float(c[n]))
    return {n: {"wrong": float(np.mean(a["wrong"])) if a["wrong"] else None,
                "right": float(np.mean(a["right"])) if a["right"] else None,
                "n_wrong": len(a["wrong"]), "n_right": len(a["right"])} for n, a in acc.items()}


def _leaky_component(ev: Evidence, v: str) -> list[Finding]:
    """A rising reward term that pays wrong answers as much as right ones (it pays whatever the answer).

    Series: the component's Mann-Kendall trend rises by >= ``HACK_RISE``. Rollouts (late half of the
    version): its mean payout on wrong answers is > 0 and at least ``LEAK_PAY_RATIO`` of its payout on
    right ones (or there are no right ones). Severity:

    * ``blocking`` when correctness stays flat (it neither rises at p < ``ALPHA`` nor gains more than
      ``HACK_FALL``): the reward rises and none of it is skill;
    * ``warn`` when correctness rises too but by less than the term: a term the policy farms alongside
      the task (some format rewards are meant to be; the held-out score decides);
    * ``warn`` from the series alone (flat correctness, no rollouts with a known ``correct``).
    """
    cname = ev.first(v, *CORRECTNESS)
    ct = trend_of(ev, v, cname) if cname else None
    if ct is None:
        return []
    flat = not (ct.late > ct.early + HACK_FALL or ct.rising(ALPHA))
    risers = []
    for n in _component_names(ev, v):
        t = trend_of(ev, v, n)
        if (t is not None and t.late >= t.early + HACK_RISE and t.rising(ALPHA)
                and (flat or t.late - t.early > ct.late - ct.early)):
            risers.append((n, t))
    if not risers:
        return []
    short = {n: n[len("reward/"):-len("/mean")] for n, _ in risers}
    pay = _component_payout(ev, v, list(short.values()))
    if pay is None and not flat:
        return []  # correctness rises and nothing shows the term pays wrong answers
    leaky, why = [], []
    for n, t in risers:
        p = (pay or {}).get(short[n])
        if pay is not None and (p is None or p["wrong"] is None or p["wrong"] <= 0
                                or (p["right"] is not None and p["wrong"] < LEAK_PAY_RATIO * p["right"])):
            continue  # the term pays right answers (more): not leaky by this signature
        leaky.append((n, t))
        paid = ("" if p is None else f", mean payout {fmt(p['wrong'])} on {p['n_wrong']} wrong answers vs "
                + (f"{fmt(p['right'])} on {p['n_right']} right ones" if p["right"] is not None else "no right answer"))
        why.append(f"{n} {fmt(t.early)} -> {fmt(t.late)}{paid}")
    if not leaky:
        return []
    if flat:
        sev = "blocking" if pay is not None else "warn"
        tail = (f"while {cname} stays flat ({fmt(ct.early)} -> {fmt(ct.late)}): the term pays whatever the answer, "
                f"and the policy is learning to collect it instead of solving the task.")
    else:
        sev = "warn"
        tail = (f"faster than {cname} ({fmt(ct.early)} -> {fmt(ct.late)}): the term pays whatever the answer and the "
                f"policy farms it alongside the task; unless it is meant to be paid regardless of correctness, part of "
                f"the train reward is not skill (the held-out score decides).")
    return [Finding(kind="reward_hacking", severity=sev, versions=[v], judged="trend",
                    steps=[min(t.first_step for _, t in leaky), max(t.last_step for _, t in leaky)],
                    evidence=[n for n, _ in leaky] + [cname],
                    data={"rising": {n: trend_data(t) for n, t in leaky}, "correctness": {cname: trend_data(ct)},
                          "correctness_flat": flat, "payout": {short[n]: (pay or {}).get(short[n]) for n, _ in leaky}},
                    explanation=f"{v}: a reward term rises ({'; '.join(why)}; Mann-Kendall p < {ALPHA}) {tail}")]


LEAK_CHANCE_SHIFTS = 5  # other prompts' answers (seeded random pairings) tried per prompt: _leaked_answers' chance


def _leaked_answers(ev: Evidence, v: str) -> list[Finding]:
    """Prompts that contain their own ground-truth answer (word-bounded, answers of >= 2 characters), beyond chance.

    Word-bounded: not inside a longer word or number ("12" is not in "0.125" or "312"), but at a sentence's end ("The
    answer is 12." holds it; the old bound, no '.' on either side, missed that).

    A number of the question can be its answer without any leak ("78 + 0", a GSM8K answer that restates a given
    quantity): the rate that matters is the excess over chance, the share of prompts holding their own answer less
    the share holding *another* prompt's answer (each prompt against the answers of :data:`LEAK_CHANCE_SHIFTS` other
    prompts drawn by seeded random permutations, not its neighbours, which share its numbers in ordered data: how
    often this data's answers appear in its prompts by coincidence). Warn at an excess of :data:`LEAK_WARN`, blocking at 0.2 (a template that prints the answer puts it
    in every prompt: excess ~1). Checks every distinct prompt up to :data:`LEAK_SAMPLE`, an evenly spaced sample of
    them beyond.
    """
    t = ev.rollouts_of(v, split=None)
    if t is None or "answer" not in t.column_names:
        return []
    codes = pc.dictionary_encode(t.column("prompt_id")).combine_chunks().indices.to_numpy()
    _, rows = np.unique(codes, return_index=True)  # first row of each prompt
    if len(rows) > LEAK_SAMPLE:  # a seeded, evenly spaced sample estimates the fraction to +-0.4% (sd)
        rows = rows[np.linspace(0, len(rows) - 1, LEAK_SAMPLE).astype(np.int64)]
    sub = t.take(rows).select(["prompt_id", "prompt", "answer", "reward"]).to_pydict()
    items = [(pid, prompt or "", re.compile(r"(?<!\w)(?<!\d\.)" + re.escape(a) + r"(?!\w)(?!\.\d)"))
             for pid, prompt, ans in zip(sub["prompt_id"], sub["prompt"], sub["answer"], strict=True)
             if len(a := (ans or "").strip()) >= 2]
    n = len(items)
    if not n:
        return []
    leaked = [pid for pid, prompt, pat in items if pat.search(prompt)]
    frac = len(leaked) / n
    if frac < LEAK_WARN:
        return []
    rng = np.random.default_rng(0)  # seeded: the same evidence gives the same finding
    pairs = [(i, j) for _ in range(LEAK_CHANCE_SHIFTS) for i, j in enumerate(rng.permutation(n).tolist()) if i != j]
    chance = sum(bool(items[j][2].search(items[i][1])) for i, j in pairs) / len(pairs) if pairs else 0.0
    excess = frac - chance
    if excess < LEAK_WARN:
        return []
    return [Finding(kind="reward_hacking", severity="blocking" if excess >= 0.2 else "warn", versions=[v],
                    judged="level", evidence=[f"prompt:{p}" for p in leaked[:10]],
                    data={"leaked_frac": frac, "chance_frac": chance, "n_prompts": n},
                    explanation=f"{v}: {len(leaked)} of {n} prompts ({fmt(100 * frac)}%) contain their own answer, "
                                f"against {fmt(100 * chance)}% that contain another prompt's answer by chance; the "
                                f"policy can copy it instead of solving the problem, so train reward and correctness "
                                f"overstate skill.")]


def _test_file_edits(ev: Evidence, v: str) -> list[Finding]:
    """Episodes whose tool calls edit test files (rollout turns), or a logged test-edit fraction."""
    out = []
    tt = trend_of(ev, v, M.TOOLS_TEST_EDIT_FRAC)
    steps, vals = ev.series(v, M.TOOLS_TEST_EDIT_FRAC)
    ok = np.isfinite(vals)
    steps, vals = steps[ok], vals[ok]
    t = ev.rollouts_of(v, split=None)
    hits = []
    if t is not None and "turns" in t.column_names and pc.max(pc.binary_length(t.column("turns"))).as_py():
        turns = t.column("turns")
        cand = pc.and_(pc.match_substring_regex(turns, _TEST_PATH.pattern),
                       pc.match_substring_regex(turns, "|".join(_EDIT_TOOLS)))
        # SWE episodes with a graded outcome turn are judged by swe.swe_hacking
        cand = pc.and_(cand, pc.invert(pc.match_substring(turns, '"role": "outcome"')))
        rows = pc.indices_nonzero(pc.fill_null(cand, False))
        if len(rows):
            sub = t.take(rows).select(["rollout_id", "turns", "reward"]).to_pydict()
            for rid, tj, rew in zip(sub["rollout_id"], sub["turns"], sub["reward"], strict=True):
                try:
                    turns_l = json.loads(tj)
                except json.JSONDecodeError:
                    continue
                for turn in turns_l if isinstance(turns_l, list) else []:
                    tool = str(turn.get("tool") or "")
                    if any(e in tool for e in _EDIT_TOOLS) and _TEST_PATH.search(json.dumps(turn.get("args", ""))
                                                                                + " " + str(turn.get("content", ""))):
                        hits.append((rid, rew))
                        break
    if hits:
        rewarded = sum(1 for _, r in hits if r and r > 0)
        out.append(Finding(kind="reward_hacking", severity="blocking" if rewarded else "warn", versions=[v], judged="level",
                           evidence=[f"rollout:{rid}" for rid, _ in hits[:10]],
                           data={"episodes": len(hits), "rewarded": rewarded},
                           explanation=f"{v}: {len(hits)} episode(s) edited test files ({rewarded} of them rewarded); "
                                       f"passing tests the policy rewrote is not solving the task."))
    elif len(steps) and vals.max() > 0:
        late = float(np.median(vals[-max(3, len(vals) // 5):]))
        out.append(Finding(kind="reward_hacking", severity="blocking" if late > 0 else "warn", versions=[v], judged="level",
                           steps=[int(steps[0]), int(steps[-1])], evidence=[M.TOOLS_TEST_EDIT_FRAC],
                           data={"max": float(vals.max()), "late": late, "trend": trend_data(tt) if tt else None},
                           explanation=f"{v}: up to {fmt(100 * float(vals.max()))}% of episodes edited test files "
                                       f"(late median {fmt(100 * late)}%): the policy can pass tests it rewrote."))
    return out


@ANALYZERS.analyzer("reward_hacking", description="reward rises while correctness / held-out falls; a term that pays wrong "
                                        "answers rises; leaked answers; test edits")
def reward_hacking(ev: Evidence) -> list[Finding]:
    """Four signatures of a reward paid for the wrong thing (see module docstring)."""
    out = []
    for v in ev.versions:
        series = _hacking_from_series(ev, v) or _hacking_from_few_points(ev, v)
        out += series or _leaky_component(ev, v)
        out += _leaked_answers(ev, v)
        out += _test_file_edits(ev, v)
    return out


def _train_gain(t) -> tuple[str, float, float]:
    """``(basis, start, end)`` of a train series: first / last segments when they show the larger rise
    (a saturation in the first few percent of a long run), else the first / last 20% medians."""
    if t.n_segments > 1 and t.end - t.start > t.late - t.early:
        return "segments", t.start, t.end
    return "windows", t.early, t.late


@ANALYZERS.analyzer("train_eval_divergence", description="train reward up, held-out score flat or down")
def train_eval_divergence(ev: Evidence) -> list[Finding]:
    """Within a run (a change): the train score (correctness, else the reward) rises by >= DIVERGE_RISE
    from its start to its end (first / last segments or 20% windows, with a rising Mann-Kendall trend
    for the windows) while the held-out series, however sparse (>= 2 evaluations, e.g. one before
    training and one every N steps), gains at most ``max(0.01, min(DIVERGE_VAL_MAX, DIVERGE_VAL_SHARE
    x train gain))``. The held-out start is the mean of its evaluations up to the end of the train
    score's first segment (else its first quarter), its end the mean of those from the start of the
    last segment (else its last quarter). Blocking when the held-out score falls by more than 0.02.

    Across versions: a child whose train reward beats its parent's while its paired held-out gain
    over the parent is not above 0 (bootstrap CI, ``harness.stats``).
    """
    out = []
    for v in ev.versions:
        rname = ev.first(v, *CORRECTNESS, M.REWARD_MEAN)
        rt = trend_of(ev, v, rname) if rname else None
        ename = ev.first(v, *EVAL_SERIES)
        if rt is not None and ename:
            basis, r0, r1 = _train_gain(rt)
            gain = r1 - r0
            if gain >= DIVERGE_RISE and (basis == "segments" or rt.rising(ALPHA)):
                out += _flat_heldout(ev, v, rname, rt, ename, basis, r0, r1)
        parent = ev.parents.get(v)
        if parent and v in ev.evals and parent in ev.evals:
            out += _versus_parent(ev, v, parent)
    return out


def _flat_heldout(ev: Evidence, v: str, rname: str, rt, ename: str, basis: str, r0: float, r1: float) -> list[Finding]:
    """The within-run finding of :func:`train_eval_divergence`, or [] when the held-out score kept up."""
    es, evals = ev.series(v, ename)
    ok = np.isfinite(evals)
    es, evals = es[ok], evals[ok]
    if len(evals) < 2:
        return [Finding(kind="train_eval_divergence", severity="info", versions=[v], evidence=[ename], judged="change",
                        data={"n_points": int(len(evals))},
                        explanation=f"insufficient evidence: {ename} has {len(evals)} point(s) in {v}; "
                                    f"train_eval_divergence needs at least 2 held-out evaluations")]
    w = max(1, len(evals) // 4)
    head = evals[es <= rt.start_until] if basis == "segments" and rt.start_until is not None else evals[:0]
    tail = evals[es >= rt.end_from] if basis == "segments" and rt.end_from is not None else evals[:0]
    head = head if len(head) and len(head) < len(evals) else evals[:w]
    tail = tail if len(tail) and len(tail) < len(evals) else evals[-w:]
    e0, e1 = float(np.mean(head)), float(np.mean(tail))
    tol = max(0.01, min(DIVERGE_VAL_MAX, DIVERGE_VAL_SHARE * (r1 - r0)))
    if e1 - e0 > tol:
        return []
    where = (f"first segment steps {rt.first_step}-{rt.start_until}, last segment from step {rt.end_from}"
             if basis == "segments" else "medians of the first and last 20% of steps")
    return [Finding(
        kind="train_eval_divergence", severity="blocking" if e1 < e0 - 0.02 else "warn", judged="change",
        versions=[v], steps=[rt.first_step, rt.last_step], evidence=[rname, ename],
        data={"train": trend_data(rt), "basis": basis, "train_from": r0, "train_to": r1, "heldout_early": e0,
              "heldout_late": e1, "heldout_tolerance": tol, "n_heldout": int(len(evals)),
              "heldout_steps": es[:50].tolist()},
        explanation=f"{v}: train {rname} rose from {fmt(r0)} to {fmt(r1)} ({where}) while the held-out "
                    f"{ename} went from {fmt(e0)} to {fmt(e1)} over {len(evals)} evaluations (steps {int(es[0])}.."
                    f"{int(es[-1])}; a gain of at most {fmt(tol)} counts as flat): a misleading high score.")]


def _versus_parent(ev: Evidence, v: str, parent: str) -> list[Finding]:
    rv, rp = ev.series(v, M.REWARD_MEAN)[1], ev.series(parent, M.REWARD_MEAN)[1]
    rv, rp = rv[np.isfinite(rv)], rp[np.isfinite(rp)]
    if not (len(rv) and len(rp)):
        return []
    tail = lambda x: float(np.median(x[-max(3, len(x) // 5):]))  # noqa: E731
    train_gain = tail(rv) - tail(rp)
    try:
        cmp = compare_versions(ev.evals[parent], ev.evals[v])
    except ValueError:
        return []
    if train_gain < DIVERGE_RISE or cmp.ci[0] > 0:
        return []
    sev = "blocking" if cmp.ci[1] < 0 else "warn"
    # the child's finding alone: its parent is the reference (data["parent"], the explanation), not a version the
    # finding covers; listing it made the parent's gate (harness/gate.py), `diagnose --best` / `--version` and the
    # brain's view of the parent count a child's divergence as the parent's own
    return [Finding(kind="train_eval_divergence", severity=sev, versions=[v], judged="change",
                    evidence=[M.REWARD_MEAN, "eval/heldout"],
                    data={"parent": parent, "train_gain": train_gain, "heldout_gain": cmp.gain, "ci": list(cmp.ci),
                          "p_value": cmp.p_value, "n_problems": cmp.n_problems},
                    explanation=f"{v} vs its parent {parent}: train reward up by {fmt(train_gain)} but the held-out "
                                f"Avg@k gain is {fmt(cmp.gain)} (95% CI [{fmt(cmp.ci[0])}, {fmt(cmp.ci[1])}], "
                                f"p={fmt(cmp.p_value)}, {cmp.n_problems} problems): the train score misleads.")]
