"""Findings: what an analyzer reports (docs/design.md §2, step 6).

A :class:`Finding` names a failure kind (one of :data:`KINDS` for built-in analyzers; runtime
analyzers may report new kinds), a severity (``info`` | ``warn`` | ``blocking``), the versions and
steps it covers, evidence references and a one-paragraph explanation with the numbers that
triggered it. ``warn`` and ``blocking`` are failure findings; ``info`` is context ("insufficient
evidence", a benign artefact). ``blocking`` findings stop the promotion gate (``harness/gate.py``).

Evidence references are strings: a metric name (``policy/entropy``, from ``evotrainer/metrics.py``)
or ``rollout:<rollout_id>`` for a stored rollout.

Whether a finding means the version's weights themselves are damaged is a typed field,
``Finding.damages_weights``, set from the one table :data:`DAMAGES_WEIGHTS` unless an analyzer says;
the gate carries it into its verdict (``GateVerdict.damaged_weights``) and the decision stores it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evotrainer.recipe import MAX_MESSAGE_CHARS, _shown
from evotrainer.terminal import MAX_ERRORS_SHOWN, capped_errors, clip_key, clip_text

Severity = Literal["info", "warn", "blocking"]
Judged = Literal["level", "change", "trend"]
SEVERITY_RANK = {"info": 0, "warn": 1, "blocking": 2}

# Built-in failure kinds. Runtime analyzers may report other kinds.
KINDS: tuple[str, ...] = (
    "truncation",
    "zero_variance_groups",
    "entropy_collapse",
    "template_collapse",
    "length_collapse",
    "length_blowup",
    "nan_blowup",
    "kl_blowup",
    "reward_hacking",
    "train_eval_divergence",
    "grad_spike",
)

DAMAGES_WEIGHTS: tuple[str, ...] = ("entropy_collapse", "nan_blowup", "kl_blowup", "eval_collapse")
"""Finding kinds that mean the version's weights themselves are damaged (a collapsed or diverged policy;
``eval_collapse`` is the gate's own, :func:`evotrainer.harness.gate.eval_collapse`, not an analyzer's kind):
a version pruned or reverted for a blocking one is no start point, so its children restart from its own
start point (``LineageStore.start_version``). The default of ``Finding.damages_weights``."""


class Finding(BaseModel):
    """One diagnosis: a failure kind seen in some versions over some steps.

    Attributes:
        kind: failure kind, e.g. ``entropy_collapse`` (see :data:`KINDS`).
        severity: ``info`` (context only), ``warn`` (a failure to act on) or ``blocking`` (the
            version must not be promoted while it stands).
        versions: version ids the finding covers.
        steps: ``[first, last]`` step of the evidence, or the list of steps (e.g. spike steps).
        evidence: metric names and ``rollout:<id>`` references that support it.
        explanation: one paragraph with the numbers that triggered it.
        analyzer: name of the analyzer that produced it.
        data: the numbers behind the explanation, machine-readable (early/late levels, p-values, ...).
        judged: what the analyzer judged (``harness/trends.py``): ``level`` (what the logged steps
            show, visible from one step: a NaN, a clip ratio of 1.0, a batch with one reward),
            ``change`` (the start of the run against its end, the steps around a spike, a version
            against its parent) or ``trend`` (a monotone drift, which needs several points); None
            for runtime analyzers that do not say.
        damages_weights: the finding means the weights of its versions are damaged (default: the
            kind is in :data:`DAMAGES_WEIGHTS`).
    """

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(..., min_length=1)
    severity: Severity
    versions: list[str] = Field(default_factory=list)
    steps: list[int] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    explanation: str = Field(..., min_length=1)
    analyzer: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    judged: Judged | None = None
    damages_weights: bool = False

    @model_validator(mode="before")
    @classmethod
    def _damage_by_kind(cls, data: Any) -> Any:
        """``damages_weights`` defaults to whether the kind is in :data:`DAMAGES_WEIGHTS`."""
        if isinstance(data, dict) and data.get("damages_weights") is None:
            data = {**data, "damages_weights": data.get("kind") in DAMAGES_WEIGHTS}
        return data

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if not v.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"kind={v!r}: use a snake_case name such as 'entropy_collapse'")
        return v

    @property
    def is_failure(self) -> bool:
        """True for ``warn`` and ``blocking`` findings."""
        return self.severity != "info"

    @property
    def is_blocking(self) -> bool:
        """True when this finding stops promotion."""
        return self.severity == "blocking"

    def headline(self) -> str:
        """``kind [severity] versions steps`` for tables and logs."""
        steps = f" steps {self.steps[0]}..{self.steps[-1]}" if self.steps else ""
        return f"{self.kind} [{self.severity}] {','.join(self.versions)}{steps}"


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by kind and first version (stable, deterministic)."""
    return sorted(findings, key=lambda f: (-SEVERITY_RANK[f.severity], f.kind, f.versions[:1], f.steps[:1]))


def parse_findings(payload: Any, analyzer: str = "") -> list[Finding]:
    """Validate findings from JSON (a list of dicts, or ``{"findings": [...]}``), e.g. printed by sandboxed code.

    Raises:
        ValueError: the payload is not a list of finding objects; the message names the bad item.
    """
    items = payload.get("findings") if isinstance(payload, dict) else payload
    if not isinstance(items, list):
        raise ValueError("findings JSON must be a list of objects or {\"findings\": [...]}")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"findings[{i}] is {type(item).__name__}; each finding must be a JSON object")
        item = {"analyzer": analyzer, **item}
        try:
            out.append(Finding.model_validate(item))
        except ValidationError as exc:  # restate each error on the finding's own field, without pydantic's URLs
            raise ValueError(_field_errors(exc, f"findings[{i}]")) from None
    return out


def _field_errors(err: ValidationError, prefix: str) -> str:
    """``prefix.field=value: rule`` per error, ``; ``-joined; a missing field names the ones a finding needs. At
    most :data:`~evotrainer.terminal.MAX_ERRORS_SHOWN` errors, the rest counted; values cut to
    :data:`~evotrainer.recipe.SHOWN_MAX` characters (Y-R16: a finding of 50,000 bad keys or a 1 MB value was
    restated whole)."""
    parts: list[str] = []
    for e in err.errors(include_url=False):
        if len(parts) == MAX_ERRORS_SHOWN:
            break
        path = ".".join([prefix, *(clip_key(p) for p in e["loc"])])
        msg = clip_text(e["msg"].removeprefix("Value error, "), MAX_MESSAGE_CHARS)
        if e["type"] == "missing":
            parts.append(f"{path}: required (a finding has kind, severity, versions, steps, evidence, explanation)")
        elif e["type"] == "extra_forbidden":
            parts.append(f"{path}: unknown field; allowed: {', '.join(Finding.model_fields)}")
        else:
            parts.append(f"{path}={_shown(e.get('input'))}: {msg}")
    return "; ".join(capped_errors(parts, err.error_count()))
