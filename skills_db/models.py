"""Records of the skills memory (pydantic) and the value rules of intervention skills.

A :class:`Skill` is one reusable piece of know-how:

- ``intervention``: a single-factor recipe change: ``recipe_path`` and ``value``, where ``value``
  is a literal (``0.28``, ``true``, ``[0.1, 0.9]``) or a rule relative to the current value
  (:func:`resolve_value`): ``{"op": "set", "value": V}``, ``{"op": "mul", "by": F}``,
  ``{"op": "add", "by": D}``, ``{"op": "toggle"}``, each with optional ``"min"`` / ``"max"`` bounds.
- ``analyzer``: code that turns evidence into findings (``code``; ``builtin:<name>`` names a
  built-in of ``evotrainer.harness.analyzers``).
- ``procedure``: a way of working (how to backtest, when to merge), described in text.

``addresses`` lists the finding kinds (harness/findings.py) the skill is meant for; ``track_record``
counts, per domain (``math``, ``code``, ``swe``, ...), how often it was tried, helped and hurt.
Other records: :class:`FailedCase`, :class:`SearchTrace`, :class:`VersionSummary`.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evotrainer.errors import EvoTrainerError
from evotrainer.intervention import Intervention, category_of
from evotrainer.recipe import (
    Recipe,
    RecipeError,
    _shown,
    apply_value_rule,
    check_value_rule,
    current_value,
    field_type_error,
)

SkillKind = Literal["intervention", "analyzer", "procedure"]
SKILL_KINDS: tuple[str, ...] = ("intervention", "analyzer", "procedure")
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,127}$")
SKILL_NAMES_MAX = 32
SKILL_NAME_MAX_CHARS = 64
MAX_COUNT = 2**31 - 1
"""The most a track record count (and a skill's total over domains) may be: the store's int32 columns."""
DOMAIN_MAX_CHARS = 64
"""Characters in one track record domain name ('math', 'code', 'swe', ...), as in a tag (:data:`SKILL_NAME_MAX_CHARS`).
Review 19 (N1-R19): 800 outcomes of 2,000-character domains grew the store to 637 MB and ``get_skill`` to 3.3 MB."""
MAX_TRACK_DOMAINS = 64
"""Domains one skill's track record holds: each outcome rewrites the skill's row with all its domains and the store
keeps every version, so the row must stay small (64 short names: a few KB); real runs use a handful of domains."""
_RECORD_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)


class SkillError(EvoTrainerError, ValueError):
    """A skill record is malformed or its value rule cannot apply; the message says what to fix."""


def new_id(prefix: str) -> str:
    """A fresh record id ``<prefix>-<12 hex>``."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def json_value_problem(value: Any) -> str | None:
    """Why ``value`` is no plain JSON value that is stored and read back as it is, or None when it is one: a float
    that is not finite (NaN, infinity: JSON has neither, the store wrote them as ``null``), or a type that is not
    None, bool, int, float, str, list (tuple) or a mapping with string keys (a YAML date, ``!!binary`` bytes or
    ``!!set``, stored as a string or a list). Review 10, K-R10: a skill with ``value: .nan`` was stored as
    ``value: null``, which the model refuses, and every later listing of the memory failed on that row.
    The message names the place inside ``value`` (``by=inf``, ``[1]=nan``) and the fix.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:  # iterative: a deeply nested value is no RecursionError
        where, v = stack.pop()
        at = f"{where}=" if where else ""
        if v is None or isinstance(v, (bool, str)):
            continue
        if isinstance(v, int):
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                return f"{at}{v!r}: need a finite number (not .nan or .inf), e.g. 0.5"
            continue
        if isinstance(v, (list, tuple)):
            stack.extend((f"{where}[{i}]", x) for i, x in reversed(list(enumerate(v))))
            continue
        if isinstance(v, dict):
            for k, x in reversed(list(v.items())):
                if not isinstance(k, str):
                    return f"{where or 'value'} has the key {_shown(k)}: keys must be strings"
                stack.append((f"{where}.{k}" if where else k, x))
            continue
        return (f"{at}{_shown(v)} ({type(v).__name__}): not a plain value; give a number, a string, true/false, "
                "a list or a mapping")
    return None


class TrackRecord(BaseModel):
    """Outcomes of a skill in one domain: tried = helped + hurt + neutral."""

    model_config = _RECORD_CONFIG
    tried: int = Field(0, ge=0, le=MAX_COUNT, description="Times an intervention from this skill was trained and "
                       "judged.")
    helped: int = Field(0, ge=0, le=MAX_COUNT, description="Times the version was kept (held-out gain with CI "
                        "above 0).")
    hurt: int = Field(0, ge=0, le=MAX_COUNT, description="Times held-out score dropped or a blocking finding "
                      "appeared.")


class Skill(BaseModel):
    """One skill of the memory (see the module docstring for the kinds)."""

    model_config = _RECORD_CONFIG
    id: str = Field(..., description="Stable id: lowercase letters, digits, '_', '-', '.', ':'.")
    kind: SkillKind = Field(..., description="intervention | analyzer | procedure")
    name: str = Field(..., min_length=1, description="Short human name.")
    description: str = Field(..., min_length=1, description="What it does, when it helps, what it costs.")
    addresses: list[str] = Field(default_factory=list, description="Finding kinds this skill is meant for.")
    recipe_path: str | None = Field(None, description="Interventions: the one dotted recipe path it changes.")
    value: Any = Field(None, description="Interventions: literal new value or a rule {op: set|mul|add|toggle}.")
    code: str | None = Field(None, description="Analyzers: Python source, or 'builtin:<name>'.")
    tags: list[str] = Field(default_factory=list, description="Free tags (domain, category, paper).")
    source: str = Field("user", description="Where it comes from: paper, report, run id, or 'user'.")
    track_record: dict[str, TrackRecord] = Field(default_factory=dict, description="Outcomes per domain.")
    created_at: float = Field(default_factory=time.time, description="Unix seconds.")
    updated_at: float = Field(default_factory=time.time, description="Unix seconds.")

    @field_validator("tags", "addresses")
    @classmethod
    def _names(cls, v: list[str], info: Any) -> list[str]:
        """At most :data:`SKILL_NAMES_MAX` tags (finding kinds) of :data:`SKILL_NAME_MAX_CHARS` characters each: review
        14 (N-R14) stored 110 skills of 460 tags of 1,992 characters, and every search answered them all (177 MiB)."""
        if len(v) > SKILL_NAMES_MAX or any(len(x) > SKILL_NAME_MAX_CHARS for x in v):
            raise ValueError(f"{info.field_name}: {len(v):,} entries (the longest {max(map(len, v), default=0):,} "
                             f"characters); a skill has at most {SKILL_NAMES_MAX} of at most {SKILL_NAME_MAX_CHARS} "
                             "characters each, short names such as 'exploration' or 'entropy_collapse'")
        return v

    @field_validator("track_record")
    @classmethod
    def _domains(cls, v: dict[str, TrackRecord]) -> dict[str, TrackRecord]:
        """At most :data:`MAX_TRACK_DOMAINS` domains of at most :data:`DOMAIN_MAX_CHARS` characters each, on every
        write path (review 20, O2-R20: a skills file of 2,500 domains was accepted by ``skills add``, and 300
        outcomes then grew the store to 81 MB; review 19 capped only ``record_outcome``)."""
        longest = max(map(len, v), default=0)
        if len(v) > MAX_TRACK_DOMAINS or longest > DOMAIN_MAX_CHARS:
            raise ValueError(f"{len(v):,} domains (the longest name {longest:,} characters); a skill "
                             f"keeps at most {MAX_TRACK_DOMAINS} domains of at most {DOMAIN_MAX_CHARS} characters "
                             "each, short names such as 'math', 'code' or 'swe'")
        return v

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID_RE.match(v):
            raise ValueError(f"{v!r}: use lowercase letters, digits and _ - . : (max 128), e.g. 'clip_higher'")
        return v

    @field_validator("value")
    @classmethod
    def _plain_value(cls, v: Any) -> Any:
        problem = json_value_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _by_kind(self) -> Skill:
        over = [k for k, n in self.totals().model_dump().items() if n > MAX_COUNT]
        if over:
            raise ValueError(f"skill {self.id}: track_record: the {over[0]} counts of all domains sum past "
                             f"{MAX_COUNT:,}; give smaller counts")
        if self.kind == "intervention":
            if not self.recipe_path:
                raise ValueError(f"skill {self.id}: an intervention needs recipe_path (e.g. 'eps_clip_high')")
            if self.value is None:
                raise ValueError(f"skill {self.id}: an intervention needs value (a literal or {{op: ...}} rule)")
            check_rule(self.value, self.id)
        if self.kind == "analyzer" and not self.code:
            raise ValueError(f"skill {self.id}: an analyzer needs code (Python source or 'builtin:<name>')")
        return self

    def totals(self) -> TrackRecord:
        """Track record summed over domains (unchecked: the skill's validator bounds the sums)."""
        recs = list(self.track_record.values())
        return TrackRecord.model_construct(tried=sum(r.tried for r in recs), helped=sum(r.helped for r in recs),
                                           hurt=sum(r.hurt for r in recs))

    def search_text(self) -> str:
        """The text that is embedded and full-text indexed: name, description, finding kinds, path, tags."""
        kinds = ", ".join(k.replace("_", " ") + f" ({k})" for k in self.addresses)
        parts = [f"{self.name}.", self.description]
        if kinds:
            parts.append(f"Addresses: {kinds}.")
        if self.recipe_path:
            parts.append(f"Changes {self.recipe_path}.")
        if self.tags:
            parts.append("Tags: " + ", ".join(self.tags) + ".")
        return " ".join(parts)


class SkillHit(BaseModel):
    """A search result: the skill, its score under the search mode, and its summed track record."""

    skill: Skill
    score: float = Field(..., description="hybrid: RRF relevance; vector: 1 - cosine distance; fts: BM25.")
    mode: Literal["hybrid", "vector", "fts"]
    record: TrackRecord = Field(..., description="Track record summed over domains.")

    def summary(self) -> dict[str, Any]:
        """The CLI ``--json`` object, exactly: id, kind, name, score, addresses, recipe_path."""
        return skill_summary(self.skill, self.score)


def skill_summary(skill: Skill, score: float | None = None) -> dict[str, Any]:
    """JSON object of a skill for listings: exactly id, kind, name, score, addresses, recipe_path."""
    return {"id": skill.id, "kind": skill.kind, "name": skill.name,
            "score": None if score is None else round(float(score), 6),
            "addresses": list(skill.addresses), "recipe_path": skill.recipe_path}


class FailedCase(BaseModel):
    """A version that went wrong and why: what was tried, what came out."""

    model_config = _RECORD_CONFIG
    id: str = Field(default_factory=lambda: new_id("case"))
    run: str = Field("", description="Run folder or name.")
    version_id: str = Field(..., description="The failed version.")
    domain: str = Field("", description="Task domain (math, code, swe, ...).")
    findings: list[str] = Field(default_factory=list, description="Finding kinds raised against it.")
    intervention: str = Field("", description="The intervention, e.g. 'eps_clip_high: 0.28 -> 0.4'.")
    skill_id: str | None = Field(None, description="The skill the intervention came from, if any.")
    outcome: str = Field(..., description="pruned | reverted | failed | ... with the held-out delta.")
    evidence_summary: str = Field("", description="One paragraph with the numbers.")
    created_at: float = Field(default_factory=time.time)

    def search_text(self) -> str:
        return (f"{self.intervention}. Outcome: {self.outcome}. Findings: {', '.join(self.findings)}. "
                f"{self.evidence_summary}")


class SearchTrace(BaseModel):
    """What an agent searched, what it found, what it chose and why."""

    model_config = _RECORD_CONFIG
    id: str = Field(default_factory=lambda: new_id("trace"))
    run: str = Field("")
    agent: str = Field(..., description="Agent role or client name.")
    query: str
    filters: dict[str, Any] = Field(default_factory=dict)
    results: list[str] = Field(default_factory=list, description="Skill ids returned, best first.")
    chosen: str | None = Field(None, description="Skill id acted on, if any.")
    rationale: str = Field("")
    created_at: float = Field(default_factory=time.time)

    @field_validator("filters")
    @classmethod
    def _plain_filters(cls, v: dict[str, Any]) -> dict[str, Any]:
        problem = json_value_problem(v)
        if problem:
            raise ValueError(problem)
        return v


SUMMARY_FINDINGS_MAX = 64
"""Finding kinds one version summary holds, each a name of at most :data:`SUMMARY_NAME_MAX` characters."""
SUMMARY_NAME_MAX = 64
SUMMARY_METRICS_MAX = 1024
"""Metrics one version summary holds, each a name of at most :data:`SUMMARY_METRIC_NAME_MAX` characters: at most
~210 KB a summary, five in a 1 MiB ``list_version_summaries`` reply. The loop remembers a version's analyzer-synthesis
features here (every base statistic of every candidate series: 505-567 on the default run); the cap was 256 from
review 14 (F-R14) to 2026-12-06, and every such summary was refused ("harness evolution: add_version_summary
failed" in each run's log), so later runs remembered none."""
SUMMARY_METRIC_NAME_MAX = 200


class VersionSummary(BaseModel):
    """A version in a few lines, for later runs: recipe change, scores, findings, decision."""

    model_config = _RECORD_CONFIG
    id: str = Field(..., description="'<run>/<version_id>'.")
    run: str
    version_id: str
    domain: str = Field("")
    intervention: str = Field("", description="e.g. 'temperature: 1.0 -> 1.2'; empty for a root.")
    status: str = Field("", description="Lineage status (kept, pruned, ...).")
    metrics: dict[str, float] = Field(default_factory=dict, description="Headline metrics by metric name.")
    findings: list[str] = Field(default_factory=list)
    summary: str = Field("", description="One paragraph.")
    created_at: float = Field(default_factory=time.time)

    def search_text(self) -> str:
        return f"{self.intervention}. Status: {self.status}. Findings: {', '.join(self.findings)}. {self.summary}"


# --- value rules --------------------------------------------------------------------------------
def check_rule(value: Any, skill_id: str = "?") -> None:
    """Check the shape of a value rule (literals pass): :func:`evotrainer.recipe.check_value_rule`.

    Raises:
        SkillError: a dict with ``op`` that is not a known rule or lacks its operand.
    """
    try:
        check_value_rule(value)
    except RecipeError as exc:
        raise SkillError(f"skill {skill_id}: {exc}") from None


def resolve_value(skill: Skill, current_value: Any) -> Any:
    """The new value an intervention skill proposes, given the recipe's current value at its path.

    The rules are :func:`evotrainer.recipe.apply_value_rule` (their one home): a literal → itself;
    ``{"op": "set", "value": V}`` → V; ``{"op": "mul", "by": F}`` → current × F; ``{"op": "add", "by": D}``
    → current + D; ``{"op": "toggle"}`` → not current. Optional ``min`` / ``max`` and the field's own bounds
    clamp numeric results. An int current value stays an int (rounded: ``generate_max_len`` 64 × 0.5 → 32);
    floats keep 12 significant digits, so that 1e-6 × 0.5 gives 5e-07, not 4.9999999999999996e-07.

    Raises:
        SkillError: the skill is not an intervention, or the rule needs a number (mul, add) or a
            bool (toggle) and the current value is not one (e.g. the reward component is absent).
    """
    if skill.kind != "intervention":
        raise SkillError(f"skill {skill.id} is a {skill.kind}, not an intervention; it has no value")
    try:
        return apply_value_rule(skill.value, current_value, skill.recipe_path)
    except RecipeError as exc:
        raise SkillError(f"skill {skill.id}: {exc}") from None


def intervention_from_skill(skill: Skill, recipe: Any, hypothesis: str = "") -> Any:
    """The :class:`evotrainer.intervention.Intervention` that applies ``skill`` to ``recipe``.

    ``old`` is the recipe's current value at the skill's path (``None`` when a reward component is
    absent), ``new`` is :func:`resolve_value`; ``source`` is ``skill:<id>``. Call ``.apply(recipe)``
    on the result to get the child recipe (that validates it).

    Raises:
        SkillError: the skill is not an intervention or its rule cannot apply to the current value.
        evotrainer.recipe.RecipeError: the path does not exist in the recipe (outside ``reward.*``).
    """
    if skill.kind != "intervention" or not skill.recipe_path:
        raise SkillError(f"skill {skill.id} is a {skill.kind}; only intervention skills build interventions")
    old = current_value(recipe, skill.recipe_path)
    new = resolve_value(skill, old)
    return Intervention(path=skill.recipe_path, old=old, new=new, category=category_of(skill.recipe_path),
                        hypothesis=hypothesis or skill.description.split(". ")[0],
                        source=f"skill:{skill.id}")


def check_recipe_path(skill: Skill) -> None:
    """An intervention skill's ``recipe_path`` must name a field of the recipe (a ``reward.*`` path may name
    a component the recipe does not have yet), checked against the default :class:`Recipe`, whose field paths
    are those of every recipe, and its ``value`` must be of the type that field takes: a literal or a ``set``
    rule's value as it is (a number for a learning rate, not a list: review 8, H-R8), a ``mul`` / ``add`` /
    ``toggle`` rule as applied to the default recipe's value (where it has one). Called when a skill is added,
    so a typo or a wrong type fails then, not when a run applies it.

    Raises:
        SkillError: the path is no recipe field (the message names the closest field, ``did you mean``), or
            the value is not of the field's type (the message names the field, the type and the fix).
    """
    if skill.kind != "intervention" or not skill.recipe_path:
        return
    path, rule = skill.recipe_path, skill.value
    try:
        default = current_value(Recipe(), path)
    except RecipeError as exc:
        raise SkillError(f"skill {skill.id}: recipe_path: {exc}") from None
    if isinstance(rule, dict) and rule.get("op") in ("mul", "add", "toggle"):
        if default is None:  # a field without a default value, a reward component to come: checked when applied
            return
        try:
            new = apply_value_rule(rule, default, path)
        except RecipeError as exc:
            raise SkillError(f"skill {skill.id}: value: {exc}") from None
    else:
        new = rule["value"] if isinstance(rule, dict) and rule.get("op") == "set" else rule
    problem = field_type_error(path, new)
    if problem:
        raise SkillError(f"skill {skill.id}: value: {problem}") from None
