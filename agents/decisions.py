"""Typed outputs of the agents (docs/design.md §2): both brains (Claude, heuristic) produce these models.

- :class:`Diagnosis` (diagnostician): findings on a version, and whether its held-out move is unexplained;
- :class:`Proposal` (intervener): single-factor intervention candidates for a parent version;
- :class:`Ranking` (backtester): a score per candidate from backtests and track record, and the chosen ones;
- :class:`Verdict` (decider): keep / prune / revert / merge with rationale and evidence refs;
- :class:`AnalyzerDraft` (diagnostician, harness evolution): code of a new analyzer.

:func:`gate_verdict` turns a promotion gate's result into a :class:`Verdict` with the one gate rule
(:func:`evotrainer.harness.gate.verdict_from_gate`): every brain and every baseline decides through it.

Every model is stored as JSON in the lineage store's kv (the orchestrator's stage records), so a
resumed run replays the same decisions instead of asking the brain again.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evotrainer.harness.gate import verdict_from_gate
from evotrainer.intervention import CATEGORIES, ExpectedEffect, Intervention, category_of, change_key


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FindingRef(_Out):
    """A finding as the analyzer tools return it (harness ``Finding``, read over MCP)."""

    kind: str = Field(..., description="Finding kind, e.g. 'truncation', 'reward_hacking'.")
    severity: Literal["info", "warn", "blocking"] = Field("warn", description="info | warn | blocking.")
    versions: list[str] = Field(default_factory=list, description="Versions the finding is about.")
    steps: list[int] = Field(default_factory=list, description="Steps (first/last or list).")
    evidence: list[str] = Field(default_factory=list, description="Evidence refs: metric names, rollout ids.")
    explanation: str = Field("", description="One paragraph with the numbers.")
    analyzer: str = Field("", description="Analyzer that produced it.")
    data: dict[str, Any] = Field(default_factory=dict,
                                 description="Numbers behind it (analyzer-specific: early, late, change_step, ...).")


class Diagnosis(_Out):
    """What is wrong (or right) with one version's training."""

    version_id: str
    findings: list[FindingRef] = Field(default_factory=list)
    summary: str = Field("", description="Two or three sentences: the main problem and the numbers behind it.")
    unexplained: bool = Field(
        False, description="Held-out moved significantly and no finding explains it (triggers analyzer evolution)."
    )

    def kinds(self) -> list[str]:
        """Distinct finding kinds, warn/blocking first."""
        order = {"blocking": 0, "warn": 1, "info": 2}
        seen: list[str] = []
        for f in sorted(self.findings, key=lambda f: order[f.severity]):
            if f.kind not in seen:
                seen.append(f.kind)
        return seen

    def blocking(self) -> list[FindingRef]:
        """The blocking findings."""
        return [f for f in self.findings if f.severity == "blocking"]


class Candidate(_Out):
    """One single-factor intervention candidate: set recipe ``path`` to ``new``."""

    path: str = Field(..., description="Dotted recipe path, e.g. 'generate_max_len' or 'reward.format_token.weight'.")
    new: Any = Field(..., description="New value (JSON).")
    category: str = Field("", description="reward | data | rollout | optimizer | tool_use (derived from the path if empty).")
    hypothesis: str = Field("", description="Why this should help, citing the finding.")
    expected_metric: str = Field("eval/avg@k", description="Metric expected to move (a name from evotrainer/metrics.py).")
    expected_direction: Literal["up", "down"] = Field("up", description="Expected direction of that metric.")
    addresses: list[str] = Field(default_factory=list, description="Finding kinds this candidate addresses.")
    source: str = Field("", description="skill:<id>, or the brain that invented it.")

    def to_intervention(self, old: Any) -> Intervention:
        """The core :class:`Intervention` from ``old`` (the parent's value) to ``new``."""
        cat = self.category if self.category in CATEGORIES else category_of(self.path)
        return Intervention(
            path=self.path, old=old, new=self.new, category=cat, hypothesis=self.hypothesis,
            expected_effect=ExpectedEffect(metric=self.expected_metric, direction=self.expected_direction),
            source=self.source or "intervener",
        )

    def key(self) -> str:
        """Identity of the change: ``path=new`` (JSON; :func:`evotrainer.intervention.change_key`)."""
        return change_key(self.path, self.new)


class Proposal(_Out):
    """Candidates for children of ``parent_id``, best idea first."""

    parent_id: str
    candidates: list[Candidate] = Field(default_factory=list)
    skills_used: list[str] = Field(default_factory=list, description="Skill ids retrieved for the findings.")
    rationale: str = ""


class Score(_Out):
    """Backtest score of one candidate (higher is better)."""

    index: int = Field(..., description="Index into the proposal's candidates.")
    score: float
    method: str = Field("prior", description="rescore | replay | prior (track record / finding match).")
    detail: str = ""


class Ranking(_Out):
    """Candidates ranked by backtests; ``chosen`` are the indices to branch and train."""

    scores: list[Score] = Field(default_factory=list)
    chosen: list[int] = Field(default_factory=list)
    rationale: str = ""


class Verdict(_Out):
    """A keep / prune / revert / merge decision on one version."""

    version_id: str
    action: Literal["keep", "prune", "revert", "merge"]
    rationale: str = Field(..., min_length=1, description="Why, with the numbers (gain, CI, findings).")
    evidence: list[str] = Field(default_factory=list, description="Refs: metric names, rollout ids, eval names.")
    damaged_weights: str | None = Field(None, description="With prune / revert: the gate's damaged_weights (the finding "
                                                          "kind that damages the version's weights).")


class AnalyzerDraft(_Out):
    """A new analyzer written at run time (code run sandboxed, kept only if it discriminates)."""

    name: str = Field(..., pattern=r"^[a-z][a-z0-9_]{2,40}$")
    kind: str = Field(..., description="Finding kind the analyzer emits.")
    description: str = ""
    code: str = Field(..., description="Python source reading the evidence files and printing findings JSON.")


# --- the gate rule as a decision -----------------------------------------------------------------------
def blocking_kinds(gate: dict[str, Any]) -> list[str]:
    """Finding kinds of the gate's blocking findings (dicts from ``gate_version``, or plain kinds)."""
    return [b.get("kind", "?") if isinstance(b, dict) else str(b) for b in gate.get("blocking", []) or []]


def gate_verdict(version_id: str, gate: dict[str, Any], diagnosis: Diagnosis | None = None) -> Verdict:
    """The keep / prune :class:`Verdict` of the gate rule (:func:`evotrainer.harness.gate.verdict_from_gate`).

    A blocking finding of ``diagnosis`` that the gate did not count blocks too (the brains diagnose with the
    round's shared findings waived). The rationale quotes the gain, its CI and p-value, the blocking kinds
    and the gate's own reason; the evidence is the gate's (``eval:heldout`` when it has none).
    """
    blocking = sorted(set(blocking_kinds(gate)) | {f.kind for f in (diagnosis.blocking() if diagnosis else [])})
    action, _ = verdict_from_gate(version_id, {**gate, "promote": bool(gate.get("promote")) and not blocking})
    nums = _gate_numbers(gate.get("gain"), gate.get("ci"), gate.get("p_value"))
    reason = f" Gate: {gate['reason']}" if gate.get("reason") else ""
    if action == "keep" and gate.get("parent_id") is None and gate.get("gain") is None:
        why = f"keep {version_id}: the root (baseline) version, no blocking finding.{reason}"
    elif action == "keep":
        why = f"keep {version_id}: held-out gain {nums}; no blocking finding.{reason}"
    elif blocking:
        why = f"prune {version_id}: blocking finding(s) {', '.join(blocking)} stand ({nums}).{reason}"
    elif gate.get("below_sources"):
        why = f"prune {version_id}: the merge scores below a source it composes ({nums} over the parent).{reason}"
    elif str(gate.get("reason") or "").startswith(("superseded:", "continue:")):
        # a control arm: the round rule (harness.gate.round_decisions) decided it, and its reason carries the
        # gain over the parent; "gain not established" would contradict a CI above 0 ("superseded: v1 beat ...")
        why = f"prune {version_id}: {gate['reason']}"
    else:
        why = f"prune {version_id}: held-out gain not established ({nums}).{reason}"
    evidence = [str(e) for e in gate.get("evidence", [])][:20] or ["eval:heldout"]
    return Verdict(version_id=version_id, action=action, rationale=why, evidence=evidence,
                   damaged_weights=gate.get("damaged_weights") if action == "prune" else None)


def _gate_numbers(gain: Any, ci: Any, p: Any) -> str:
    parts = []
    if isinstance(gain, (int, float)):
        parts.append(f"{gain:+.3f}")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci):
        parts.append(f"95% CI [{ci[0]:+.3f}, {ci[1]:+.3f}]")
    if isinstance(p, (int, float)):
        parts.append(f"p={p:.3f}")
    return ", ".join(parts) or "no paired held-out comparison"
