"""Promotion gate: keep a version only if it beats its parent on held-out problems and nothing blocks it.

``gate(ws, version_id)`` compares the version's held-out outcome matrix with its parent's on the
common problems (paired bootstrap CI and paired permutation test, ``harness.stats``), runs the
analyzers on both versions' evidence, and promotes only when the CI's lower bound is above 0 and no
``blocking`` finding stands against the version (fresh analysis, plus blocking findings stored on
the version). The verdict lists its evidence references so a decision can cite them. The root
version has no parent: it is promoted as the baseline when nothing blocks it (reason says so).
"""

from __future__ import annotations

import json
from typing import Any

from evotrainer.harness.findings import Finding
from pydantic import BaseModel, Field


class GateVerdict(BaseModel):
    """The gate's decision and everything it rests on."""

    version_id: str
    parent_id: str | None
    promote: bool
    gain: float | None = Field(None, description="Held-out Avg@k gain over the parent (fraction, paired problems).")
    ci: tuple[float, float] | None = Field(None, description="Bootstrap CI of the gain at `confidence`.")
    p_value: float | None = Field(None, description="Two-sided paired permutation p-value of the gain.")
    below_sources: list[str] = Field(default_factory=list,
                                     description="For a merge: the source siblings that score higher on held-out.")
    confidence: float = 0.95
    n_problems: int = 0
    blocking: list[Finding] = Field(default_factory=list)
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
    """
    from evotrainer.harness.analyzers import run_analyzers
    from evotrainer.harness.evidence import Evidence
    from evotrainer.harness.stats import compare_versions

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
    evidence = [f"finding:{f.kind}:{','.join(f.versions)}" for f in blocking]
    evidence += [m for f in blocking for m in f.evidence[:3]]
    verdict = GateVerdict(version_id=version_id, parent_id=parent, promote=False, confidence=confidence,
                          blocking=blocking, evidence=evidence)
    if parent is None:
        verdict.promote = not blocking
        verdict.reason = ("root version: the baseline, nothing to compare with" if not blocking else
                          f"root version blocked by {len(blocking)} finding(s): {', '.join(sorted(seen))}")
        return verdict
    a, b = ws.lineage.eval_matrix(parent, eval_name), ws.lineage.eval_matrix(version_id, eval_name)
    if not a or not b:
        missing = [x for x, m in ((parent, a), (version_id, b)) if not m]
        verdict.reason = f"no held-out '{eval_name}' outcomes for {', '.join(missing)}; evaluate before gating"
        return verdict
    try:
        cmp = compare_versions(a, b, n_resamples=n_resamples, confidence=confidence, seed=seed)
    except ValueError as exc:
        verdict.reason = f"cannot compare {version_id} with {parent}: {exc}"
        return verdict
    verdict.gain, verdict.ci, verdict.p_value, verdict.n_problems = cmp.gain, cmp.ci, cmp.p_value, cmp.n_problems
    verdict.evidence = [f"eval:{eval_name}:{parent}", f"eval:{eval_name}:{version_id}"] + verdict.evidence
    pct = int(round(100 * confidence))
    stats = (f"held-out Avg@k {cmp.score_a:.3f} -> {cmp.score_b:.3f}, gain {cmp.gain:+.3f} "
             f"({pct}% CI [{cmp.ci[0]:+.3f}, {cmp.ci[1]:+.3f}], p={cmp.p_value:.3g}, {cmp.n_problems} problems)")
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
                              + f" (the single-factor changes do not compose); vs the parent: {stats}")
    return verdict


def inherited_leaks(v: Any, findings: list[Finding]) -> list[Finding]:
    """Blocking findings for the reward terms ``v`` still pays that a leaky-term ``reward_hacking`` finding named.

    A leaky-term finding (``harness.behaviour_analyzers``: its ``data["payout"]`` maps each term to its
    payout on wrong vs right answers) on ``v`` or an ancestor means the term pays whatever the answer.
    While ``v``'s recipe still gives that term a non-zero weight, a held-out gain cannot be told apart
    from the policy farming it, so the version is not kept (issue 8: the loop never keeps a leaky
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
    from evotrainer.harness.stats import avg_at_k

    if len(v.interventions) < 2 or not v.parent_id:
        return []
    keys = {(iv.path, json.dumps(iv.new, sort_keys=True)) for iv in v.interventions}
    out = []
    for c in ws.lineage.children(v.parent_id):
        if c.id == v.id or len(c.interventions) != 1:
            continue
        iv = c.interventions[0]
        if (iv.path, json.dumps(iv.new, sort_keys=True)) not in keys:
            continue
        m = ws.lineage.eval_matrix(c.id, eval_name)
        if not m:
            continue
        src = avg_at_k(m)
        if src > score + 1e-12:
            out.append((c.id, src))
    return out
