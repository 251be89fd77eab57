"""Promotion gate: keep an intervention only if it beats its control on dev problems and nothing blocks it.

``gate(ws, version_id)`` compares the version's dev (``heldout``) outcome matrix with its
**baseline** on the common problems (paired bootstrap CI and paired permutation test,
``harness.stats``): the baseline is the round's control arm (``lineage.control_of``: the parent's
recipe continued for the same steps from the same checkpoint) when it has been evaluated, else the
parent. The gain over the parent is reported beside it (``gain_vs_parent``), so a decision shows
both what the change did (vs control) and what the round did (vs parent). It runs the analyzers on
the version's evidence, and promotes only when the CI's lower bound is above 0 and no ``blocking``
finding stands against the version (fresh analysis, plus blocking findings stored on the version).
The verdict lists its evidence references so a decision can cite them. The root version has no
parent: it is promoted as the baseline when nothing blocks it (reason says so). A control arm is
gated against its parent; whether it advances the frontier is a round decision
(:func:`round_decisions`: continuing is a decision too).

The test split is sealed: gating on a test eval name while a run is under way raises (see
:func:`test_sealed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

from evotrainer.harness.analyzers import run_analyzers
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import DAMAGES_WEIGHTS, Finding
from evotrainer.harness.stats import avg_at_k, compare_versions
from evotrainer.rl_backend.tasks import is_test_eval


def test_sealed(ws: Any, eval_name: str) -> str | None:
    """Why ``eval_name``'s outcomes may not be read now, or None when they may.

    Test eval names (``rl_backend.base.TEST_EVALS``) are sealed while a run is under way: from the
    loop's start (kv ``loop/started_at``) until it has made its last decision and opened the seal
    (kv ``loop/test_unsealed``) to score its final answer. Selecting on test outcomes would make the
    reported test score a winner's-curse estimate; the gate, the agents and the analyzers
    use the dev split (``heldout``).
    """
    if not is_test_eval(eval_name):
        return None
    if ws.lineage.kv_get("loop/started_at") is None or ws.lineage.kv_get("loop/test_unsealed"):
        return None
    return (f"eval {eval_name!r} scores the test split, which is sealed while the run is under way: the gate, the "
            "agents and the analyzers use the dev split (eval_name 'heldout'); test outcomes are computed for the "
            "run's final answer when it ends")


class GateVerdict(BaseModel):
    """The gate's decision and everything it rests on."""

    version_id: str
    parent_id: str | None
    promote: bool
    baseline_id: str | None = Field(None, description="What the gain is measured against: the control arm, else the "
                                                      "parent (None for the root).")
    control_id: str | None = Field(None, description="The round's control arm, when the version is an intervention.")
    is_control: bool = Field(False, description="The version is itself a control arm (gated against its parent).")
    gain: float | None = Field(None, description="Dev Avg@k gain over the baseline (fraction, paired problems).")
    ci: tuple[float, float] | None = Field(None, description="Bootstrap CI of the gain at `confidence`.")
    p_value: float | None = Field(None, description="Two-sided paired permutation p-value of the gain.")
    gain_vs_parent: float | None = Field(None, description="Dev Avg@k gain over the parent (the same as `gain` when "
                                                          "the baseline is the parent).")
    ci_vs_parent: tuple[float, float] | None = Field(None, description="Bootstrap CI of `gain_vs_parent`.")
    score: float | None = Field(None, description="Dev Avg@k of the version on the paired problems.")
    below_sources: list[str] = Field(default_factory=list,
                                     description="For a merge: the source siblings that score higher on held-out.")
    confidence: float = 0.95
    n_problems: int = 0
    blocking: list[Finding] = Field(default_factory=list)
    damaged_weights: str | None = Field(None, description="The kind of a blocking finding on this version alone that "
                                                          "damages its weights (Finding.damages_weights): a prune or "
                                                          "revert for it restarts its children from its start point.")
    evidence: list[str] = Field(default_factory=list)
    reason: str = ""


def gate(ws: Any, version_id: str, eval_name: str = "heldout", confidence: float = 0.95,
         n_resamples: int = 10_000, seed: int = 0, findings: list[Finding] | None = None,
         analyzer_names: list[str] | None = None) -> GateVerdict:
    """Decide whether ``version_id`` may be kept (see module docstring).

    Args:
        ws: the run's :class:`evotrainer.workspace.Workspace`.
        version_id: the version to judge.
        eval_name: which held-out evaluation to compare.
        confidence, n_resamples, seed: bootstrap settings (seeded, reproducible).
        findings: findings to use instead of running the analyzers (e.g. already computed).
        analyzer_names: analyzers to run (default: every registered one); a server passes the built-ins plus
            the analyzers registered for this run, so runtime analyzers of another run never judge this one.

    Raises:
        LineageError: unknown version.
        ValueError: ``eval_name`` is a sealed test eval (:func:`test_sealed`).
    """
    if (why := test_sealed(ws, eval_name)) is not None:
        raise ValueError(why)
    v = ws.lineage.get(version_id)
    parent = v.parent_id
    ids = [x.id for x in ws.lineage.path_to_root(version_id)]  # the version, its parent, ..., the root
    if findings is None:
        findings = run_analyzers(Evidence.from_workspace(ws, ids), analyzer_names)
    blocking = [f for f in findings if f.is_blocking and version_id in f.versions]
    blocking += inherited_leaks(v, [f for f in findings if set(f.versions) & set(ids)])
    seen = {f.kind for f in blocking}
    for stored in v.findings or []:
        if stored.get("severity") == "blocking" and stored.get("kind") not in seen:
            try:
                blocking.append(Finding.model_validate({**stored, "versions": stored.get("versions") or [version_id]}))
            except Exception:  # a malformed stored finding still blocks, with what we know
                blocking.append(Finding(kind=str(stored.get("kind") or "stored_finding"), severity="blocking",
                                        versions=[version_id], explanation=str(stored)[:500], analyzer="stored"))
    if eval_name == "heldout" and (f := eval_collapse(ws, v, n_resamples, confidence, seed)) is not None:
        blocking.append(f)
        seen.add(f.kind)
    evidence = [f"finding:{f.kind}:{','.join(f.versions)}" for f in blocking]
    evidence += [m for f in blocking for m in f.evidence[:3]]
    damaged = next((f.kind for f in blocking if f.damages_weights and f.versions == [version_id]), None)
    verdict = GateVerdict(version_id=version_id, parent_id=parent, promote=False, confidence=confidence,
                          blocking=blocking, damaged_weights=damaged, evidence=evidence, is_control=v.is_control)
    if parent is None:
        verdict.promote = not blocking
        verdict.reason = ("root version: the baseline, nothing to compare with" if not blocking else
                          f"root version blocked by {len(blocking)} finding(s): {', '.join(sorted(seen))}")
        return verdict
    control = ws.lineage.control_of(version_id)
    ctrl_m = ws.lineage.eval_matrix(control.id, eval_name) if control is not None else {}
    base_id = control.id if ctrl_m else parent
    verdict.control_id = control.id if control is not None else None
    verdict.baseline_id = base_id
    a, b = ctrl_m or ws.lineage.eval_matrix(parent, eval_name), ws.lineage.eval_matrix(version_id, eval_name)
    if not a or not b:
        missing = [x for x, m in ((base_id, a), (version_id, b)) if not m]
        verdict.reason = f"no held-out '{eval_name}' outcomes for {', '.join(missing)}; evaluate before gating"
        return verdict
    try:
        cmp = compare_versions(a, b, n_resamples=n_resamples, confidence=confidence, seed=seed)
        cmp_p = cmp if base_id == parent else compare_versions(
            ws.lineage.eval_matrix(parent, eval_name) or a, b, n_resamples=n_resamples, confidence=confidence,
            seed=seed)
    except ValueError as exc:
        verdict.reason = f"cannot compare {version_id} with {base_id}: {exc}"
        return verdict
    verdict.gain, verdict.ci, verdict.p_value, verdict.n_problems = cmp.gain, cmp.ci, cmp.p_value, cmp.n_problems
    verdict.gain_vs_parent, verdict.ci_vs_parent, verdict.score = cmp_p.gain, cmp_p.ci, cmp.score_b
    verdict.evidence = [f"eval:{eval_name}:{base_id}", f"eval:{eval_name}:{version_id}"] + verdict.evidence
    pct = int(round(100 * confidence))
    what = f"vs control {base_id}" if base_id != parent else f"vs parent {parent}"
    stats = (f"held-out Avg@k {cmp.score_a:.3f} -> {cmp.score_b:.3f} {what}, gain {cmp.gain:+.3f} "
             f"({pct}% CI [{cmp.ci[0]:+.3f}, {cmp.ci[1]:+.3f}], p={cmp.p_value:.3g}, {cmp.n_problems} problems)")
    if base_id != parent:
        stats += f"; vs parent {parent} {cmp_p.gain:+.3f} [{cmp_p.ci[0]:+.3f}, {cmp_p.ci[1]:+.3f}]"
    if blocking:
        verdict.reason = f"blocked by {', '.join(sorted(seen | {f.kind for f in blocking}))}; {stats}"
    elif cmp.ci[0] <= 0:
        verdict.reason = f"gain not established: the CI's lower bound is not above 0; {stats}"
    else:
        verdict.promote = True
        verdict.reason = f"promote: {stats}; no blocking finding"
        below = _merge_below_sources(ws, v, cmp.score_b, eval_name)
        if below:
            verdict.promote = False
            verdict.below_sources = [sid for sid, _ in below]
            verdict.evidence += [f"eval:{eval_name}:{sid}" for sid, _ in below]
            verdict.reason = (f"merge below its source(s): held-out Avg@k {cmp.score_b:.3f} < "
                              + ", ".join(f"{sid} {score:.3f}" for sid, score in below)
                              + f" (the single-factor changes do not compose); {stats}")
    return verdict


COLLAPSE_RATIO = 0.5
"""A version whose dev Avg@k is at most this fraction of its start point's, with the paired CI of the difference
below 0, has damaged weights (:func:`eval_collapse`). Ours, not a literature value: half of what the weights could
do before this version's training is lost, well beyond the sampling noise the CI already excludes; the case it was
written for fell from 0.240 to 0.000 (docs/compare.md §12)."""


def eval_collapse(ws: Any, v: Any, n_resamples: int = 10_000, confidence: float = 0.95,
                  seed: int = 0) -> Finding | None:
    """A blocking ``eval_collapse`` finding (damaged weights) when ``v``'s dev Avg@k collapsed against the weights it
    trained from, else None.

    The start point's dev outcomes: the parent's dev evaluation, or for the root the base model's (eval ``no_rl``,
    the same dev problems and sample seeds); none stored, or no common problem: None. Collapsed: the paired CI's
    upper bound of (version - start) is below 0 **and** the version scores at most :data:`COLLAPSE_RATIO` of the
    start. Why it matters: a version pruned for a blocking finding that damages weights is no start point, so its
    children train from its own start point (``LineageStore.start_version``: the base model for the root) instead
    of inheriting the collapse. The SmolLM2 default at lr 2e-4 (100x) fell from the base model's dev 0.240 to
    0.000 in the root's 8 steps (update KL 3.0 nats/token at step 0) with no entropy collapse, so no other analyzer
    marked it: its children continued from the broken weights.
    """
    start, name = (v.parent_id, "heldout") if v.parent_id else (v.id, "no_rl")
    a, b = ws.lineage.eval_matrix(start, name), ws.lineage.eval_matrix(v.id, "heldout")
    if not a or not b:
        return None
    try:
        cmp = compare_versions(a, b, n_resamples=n_resamples, confidence=confidence, seed=seed)
    except ValueError:
        return None
    if not (cmp.ci[1] < 0 and cmp.score_b <= COLLAPSE_RATIO * cmp.score_a):
        return None
    what = f"its parent {start}" if v.parent_id else "the base model (no-RL)"
    pct = int(round(100 * confidence))
    return Finding(
        kind="eval_collapse", severity="blocking", versions=[v.id], analyzer="gate", judged="change",
        evidence=[f"eval:heldout:{v.id}", f"eval:{name}:{start}"],
        data={"start": start, "start_eval": name, "start_score": cmp.score_a, "score": cmp.score_b,
              "diff": cmp.gain, "ci": list(cmp.ci), "n_problems": cmp.n_problems},
        explanation=f"{v.id}: dev Avg@k fell from {cmp.score_a:.3f} ({what}) to {cmp.score_b:.3f} on "
                    f"{cmp.n_problems} paired problems ({cmp.gain:+.3f}, {pct}% CI [{cmp.ci[0]:+.3f}, "
                    f"{cmp.ci[1]:+.3f}]): at most {COLLAPSE_RATIO:g}x what the weights it trained from scored. "
                    "Its training broke the policy (typically a step size far too large): its weights are no "
                    "start point, so its children train from where it started.")


def inherited_leaks(v: Any, findings: list[Finding]) -> list[Finding]:
    """Blocking findings for the reward terms ``v`` still pays that a leaky-term ``reward_hacking`` finding named.

    A leaky-term finding (``harness.analyzers.behaviour``: its ``data["payout"]`` maps each term to its
    payout on wrong vs right answers) on ``v`` or an ancestor means the term pays whatever the answer.
    While ``v``'s recipe still gives that term a non-zero weight, a held-out gain cannot be told apart
    from the policy farming it, so the version is not kept (the loop never keeps a leaky
    branch); the fix is ``reward.<term>.weight = 0``. One finding per term.
    """
    out: dict[str, Finding] = {}
    for f in findings:
        if f.kind != "reward_hacking" or not isinstance((f.data or {}).get("payout"), dict):
            continue
        for term, pay in f.data["payout"].items():
            comp = v.recipe.reward.get(term)
            if comp is None or comp.weight == 0 or term in out:
                continue
            paid = (f" (it paid {pay['wrong']:.3f} on wrong answers vs "
                    + (f"{pay['right']:.3f} on right ones)" if pay.get("right") is not None else "nothing right)")
                    if isinstance(pay, dict) and pay.get("wrong") is not None else "")
            out[term] = Finding(
                kind="reward_hacking", severity="blocking", versions=[v.id], analyzer="gate",
                evidence=[f"reward/{term}/mean", f"finding:reward_hacking:{','.join(f.versions)}"],
                data={"term": term, "weight": comp.weight, "found_on": f.versions},
                explanation=f"{v.id} still pays reward term '{term}' (weight {comp.weight:g}), which reward_hacking "
                            f"on {', '.join(f.versions)} found paying whatever the answer{paid}; a held-out gain "
                            f"under a leaky term is not kept: set reward.{term}.weight to 0")
    return list(out.values())


def _merge_below_sources(ws: Any, v: Any, score: float, eval_name: str) -> list[tuple[str, float]]:
    """For a merged child (two or more interventions): its source siblings that score higher on held-out.

    A source is a child of the same parent whose single intervention is one of the merge's. A merge is kept
    only if it is at least as good (point estimate of Avg@k) as each source it composes, besides beating the
    parent: otherwise keeping it would move the frontier to a worse recipe than a kept sibling.
    """
    if len(v.interventions) < 2 or not v.parent_id:
        return []
    keys = {iv.key() for iv in v.interventions}
    out = []
    for c in ws.lineage.children(v.parent_id):
        if c.id == v.id or len(c.interventions) != 1:
            continue
        iv = c.interventions[0]
        if iv.key() not in keys:
            continue
        m = ws.lineage.eval_matrix(c.id, eval_name)
        if not m:
            continue
        src = avg_at_k(m)
        if src > score + 1e-12:
            out.append((c.id, src))
    return out


def _kinds(gate: dict[str, Any]) -> set[str]:
    return {b.get("kind", "?") if isinstance(b, dict) else str(b) for b in gate.get("blocking", []) or []}


def verdict_from_gate(version_id: str, gate: dict[str, Any]) -> tuple[str, str]:
    """``(action, rationale)`` of the gate rule: keep exactly what the gate promotes, prune the rest.

    The one verdict every mode shares (the baselines' decisions, the heuristic brain's rule); ``gate`` is a
    :class:`GateVerdict` dump or the ``gate_version`` tool's result (possibly adjusted by :func:`round_decisions`).
    """
    keep = bool(gate.get("promote"))
    reason = gate.get("reason") or ""
    if keep and gate.get("parent_id") is None and gate.get("gain") is None:
        return "keep", f"keep {version_id}: the root (baseline) version, no blocking finding. Gate: {reason}"
    return ("keep" if keep else "prune"), f"{'keep' if keep else 'prune'} {version_id}: {reason}"


NEVER_WAIVED = ("reward_hacking", *DAMAGES_WEIGHTS)
"""Blocking kinds a round never waives even when every candidate shares them: a leaky reward (a gain under it
cannot be told from farming the term) and damaged weights (``findings.DAMAGES_WEIGHTS``: nothing to build on)."""


def round_decisions(gates: dict[str, dict[str, Any]], control_id: str | None,
                    inherited: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """The gate verdicts of one round's candidates adjusted to the round: which may be kept.

    Rules:

    - An intervention is kept only if it beats the control: the lower bound of the CI of its dev gain over
      the gate's baseline (the control) is above 0, no blocking finding of its own stands, and (a merge) it
      is not below a source it composes.
    - A blocking finding that **every** candidate of the round shares, the control included (two or more
      candidates), is a property of the task or the recipe, not of a change: it is waived for this round's
      decision (listed under ``waived``; the finding still stands and the next round's diagnosis sees it),
      so the lineage keeps accumulating training instead of discarding every branch (e.g. truncation that
      the base recipe's length budget causes). :data:`NEVER_WAIVED` kinds always block.
    - Likewise a blocking finding the **parent** already had (``inherited``) and the control still has: the
      control changes nothing, so the finding comes with the recipe, not with training longer or with a
      change; it is waived the same way (a child that fixed it does not need the waiver, one that did not is
      judged on its gain). docs/compare.md, seed 1: v0 truncated at the 16-token cap, its control gained +0.062
      [+0.021, +0.109] over it and was pruned for the same truncation while the length fix lost to it.
    - The control (continuing: a decision too) is kept when no intervention is kept, no blocking finding of
      its own stands, and it is not established worse than its parent (upper CI bound of ``gain_vs_parent``
      >= 0): the frontier then advances by training longer. When an intervention is kept the control is not
      (superseded), so each round advances the frontier by at most its best candidate.

    Args:
        gates: version id -> gate dict (``gate_version`` result / :class:`GateVerdict` dump) of every trained,
            evaluated candidate of the round (failed ones left out).
        control_id: the round's control arm (None: no control; interventions are then judged as gated).
        inherited: the blocking finding kinds of the round's parent (its own gate); only used with a control.

    Returns:
        version id -> a copy of its gate with ``promote`` set by these rules, ``blocking`` without the waived
        kinds, ``waived`` (kinds) and ``reason`` saying which rule decided.
    """
    kinds = {vid: _kinds(g) for vid, g in gates.items()}
    shared = set.intersection(*kinds.values()) if len(gates) >= 2 and control_id in gates else set()
    shared -= set(NEVER_WAIVED)
    from_parent = (set(inherited) & kinds[control_id]) - set(NEVER_WAIVED) - shared if control_id in gates else set()
    note = (f"; blocking finding(s) {', '.join(sorted(shared))} stand on every candidate of the round (control "
            "included): a property of the task / recipe, waived for this decision") if shared else ""
    if from_parent:
        note += (f"; blocking finding(s) {', '.join(sorted(from_parent))} came with the parent's recipe (the parent "
                 "and its unchanged control both have them): waived for this decision")
    shared |= from_parent
    out: dict[str, dict[str, Any]] = {}
    for vid, g in gates.items():
        if vid == control_id:
            continue
        own = kinds[vid] - shared
        ci = g.get("ci")
        beats = isinstance(ci, (list, tuple)) and len(ci) == 2 and ci[0] > 0
        keep = beats and not own and not g.get("below_sources")
        blocking = [b for b in g.get("blocking", []) or [] if (b.get("kind") if isinstance(b, dict) else b) not in shared]
        reason = g.get("reason") or ""
        if shared and keep and not g.get("promote"):
            reason = "promote: " + reason.split("; ", 1)[-1]
        out[vid] = {**g, "promote": keep, "blocking": blocking, "waived": sorted(shared), "reason": reason + note}
    if control_id in gates:
        g = gates[control_id]
        own = kinds[control_id] - shared
        ci_p = g.get("ci_vs_parent") or g.get("ci")
        worse = isinstance(ci_p, (list, tuple)) and len(ci_p) == 2 and ci_p[1] < 0
        kept = [vid for vid, x in out.items() if x["promote"]]
        gain = g.get("gain_vs_parent", g.get("gain"))
        nums = (f"dev gain over the parent {gain:+.3f} [{ci_p[0]:+.3f}, {ci_p[1]:+.3f}]"
                if isinstance(gain, (int, float)) and isinstance(ci_p, (list, tuple)) else "no paired dev gain")
        if kept:
            keep, reason = False, f"superseded: {', '.join(kept)} beat this control ({nums})"
        elif own:
            keep, reason = False, f"continue blocked by {', '.join(sorted(own))} ({nums})"
        elif worse:
            keep, reason = False, f"continue: training longer made it worse than the parent ({nums})"
        elif gain is None:
            keep, reason = False, f"continue: not compared with the parent ({g.get('reason') or 'no dev outcomes'})"
        else:
            keep, reason = True, (f"continue: no change beat the control, and the control is not worse than the "
                                  f"parent ({nums}): the frontier advances by training longer")
        blocking = [b for b in g.get("blocking", []) or [] if (b.get("kind") if isinstance(b, dict) else b) not in shared]
        out[control_id] = {**g, "promote": keep, "blocking": blocking, "waived": sorted(shared), "reason": reason + note}
    return out
