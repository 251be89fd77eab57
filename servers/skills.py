"""Skill-retrieval tools over the skills memory (``skills_db.store.SkillStore``, LanceDB, user-level).

Tools: ``search_skills`` (hybrid vector + full-text, pre-filtered by kind / finding kinds / tags),
``get_skill``, ``add_skill``, ``record_skill_outcome``, ``add_failed_case``, ``add_search_trace``,
``add_version_summary`` and ``list_version_summaries``.
The store lives outside runs (``$EVOTRAINER_SKILLS_DIR`` or the user data dir), so this server works
without ``--run``. The embedding model (all-MiniLM-L6-v2, offline) loads on the first search or add.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field, ValidationError

from evotrainer.servers.common import MAX_LIMIT, JsonValue, ToolContext, state_of
from evotrainer.skills_db.models import (
    DOMAIN_MAX_CHARS,
    MAX_TRACK_DOMAINS,
    SKILL_NAMES_MAX,
    SUMMARY_FINDINGS_MAX,
    SUMMARY_METRIC_NAME_MAX,
    SUMMARY_METRICS_MAX,
    SUMMARY_NAME_MAX,
    FailedCase,
    SearchTrace,
    Skill,
    SkillError,
    VersionSummary,
    new_id,
)
from evotrainer.skills_db.store import VERSION_SUMMARIES, sql_str
from evotrainer.terminal import clip_text

SkillKindArg = Literal["intervention", "analyzer", "procedure"]


class SkillRecord(BaseModel):
    """Outcomes of a skill: tried = helped + hurt + neutral."""

    tried: int
    helped: int
    hurt: int


class SkillHitInfo(BaseModel):
    """A search hit: the skill's key fields, its relevance score and its summed track record."""

    id: str
    kind: str
    name: str
    description: str
    addresses: list[str] = Field(description="Finding kinds the skill is meant for.")
    recipe_path: str | None
    value: JsonValue = Field(description="Interventions: literal new value or a rule {op: set|mul|add|toggle}.")
    tags: list[str]
    score: float = Field(description="hybrid: RRF relevance; vector: 1 - cosine distance; fts: BM25.")
    record: SkillRecord


class SkillSearchResult(BaseModel):
    """Skills most relevant to the query, best first."""

    query: str
    mode: str
    hits: list[SkillHitInfo]
    omitted: int = Field(0, description="Hits within ``limit`` left out because the reply holds 1 MiB of JSON (each "
                                        "hit's description is cut to 4,000 characters; get_skill has it whole).")


class SkillInfo(BaseModel):
    """A full skill record."""

    id: str
    kind: str
    name: str
    description: str
    addresses: list[str]
    recipe_path: str | None
    value: JsonValue
    code: str | None
    tags: list[str]
    source: str
    track_record: dict[str, SkillRecord] = Field(description="Outcomes per domain (math, code, swe, ...).")
    record: SkillRecord = Field(description="Outcomes summed over domains.")
    created_at: float
    updated_at: float


class OutcomeResult(BaseModel):
    """A skill's track record in one domain after recording an outcome."""

    skill_id: str
    domain: str
    record: SkillRecord


class VersionSummaryList(BaseModel):
    """Version summaries, newest first (skills_db ``VersionSummary`` records)."""

    summaries: list[dict[str, Any]]
    omitted: int = Field(0, description="Summaries within ``limit`` left out because the reply holds 1 MiB of JSON.")


HIT_TEXT_MAX_CHARS = 4000
"""Characters of a search hit's name and description (get_skill gives the whole skill)."""
REPLY_SUMMARIES_MAX_CHARS = 1 << 20
"""JSON characters of one list_version_summaries reply (review 14 F-R14: 150 summaries of ~950 KB each were a 273 MiB
reply and a 3.6 s stall; limit went to 10,000 where every other list tool stops at MAX_LIMIT)."""


class RecordId(BaseModel):
    """Id of a stored record."""

    id: str


def _info(s: Skill) -> SkillInfo:
    tot = s.totals()
    return SkillInfo(id=s.id, kind=s.kind, name=s.name, description=s.description, addresses=list(s.addresses),
                     recipe_path=s.recipe_path, value=s.value, code=s.code, tags=list(s.tags), source=s.source,
                     track_record={k: SkillRecord(**v.model_dump()) for k, v in s.track_record.items()},
                     record=SkillRecord(**tot.model_dump()), created_at=s.created_at, updated_at=s.updated_at)


def search_skills(
    ctx: ToolContext,
    query: Annotated[str, Field(description="Free text, e.g. a finding's kind and explanation.", min_length=1,
                                max_length=2000)],
    kind: Annotated[SkillKindArg | None, Field(description="Only this kind of skill.")] = None,
    finding_kinds: Annotated[list[str] | None, Field(description="Only skills addressing one of these finding "
                                                                 "kinds, e.g. ['entropy_collapse'].")] = None,
    tags: Annotated[list[str] | None, Field(description="Only skills with one of these tags.")] = None,
    mode: Annotated[Literal["hybrid", "vector", "fts"], Field(description="hybrid (vector + BM25, RRF), vector "
                                                                          "or fts.")] = "hybrid",
    limit: Annotated[int, Field(description="Hits, best first.", ge=1, le=100)] = 10,
) -> SkillSearchResult:
    """Search the skill memory (interventions, analyzers, procedures) for what addresses a problem; each
    hit has its track record (tried / helped / hurt)."""
    hits = state_of(ctx).skill_store().search(query, kind=kind, finding_kinds=finding_kinds, tags=tags, mode=mode,
                                             limit=limit)
    out, size = [], 0
    for h in hits:  # each hit cut (a skill stored before the write caps, or by other means), the reply at 1 MiB
        hit = SkillHitInfo(id=h.skill.id, kind=h.skill.kind, name=clip_text(h.skill.name, HIT_TEXT_MAX_CHARS),
                           description=clip_text(h.skill.description, HIT_TEXT_MAX_CHARS),
                           addresses=[clip_text(a, 64) for a in h.skill.addresses[:SKILL_NAMES_MAX]],
                           recipe_path=h.skill.recipe_path, value=h.skill.value,
                           tags=[clip_text(t, 64) for t in h.skill.tags[:SKILL_NAMES_MAX]], score=h.score,
                           record=SkillRecord(**h.record.model_dump()))
        size += len(hit.model_dump_json())
        if out and size > REPLY_SUMMARIES_MAX_CHARS:
            break
        out.append(hit)
    return SkillSearchResult(query=query, mode=mode, hits=out, omitted=len(hits) - len(out))


def get_skill(
    ctx: ToolContext,
    skill_id: Annotated[str, Field(description="Skill id (search_skills shows them).", min_length=1)],
) -> SkillInfo:
    """The full record of one skill: description, recipe path and value rule or analyzer code, track record."""
    return _info(state_of(ctx).skill_store().get(skill_id))


def add_skill(
    ctx: ToolContext,
    kind: Annotated[SkillKindArg, Field(description="intervention (recipe change), analyzer (code) or "
                                                    "procedure (text).")],
    name: Annotated[str, Field(description="Short human name.", min_length=1)],
    description: Annotated[str, Field(description="What it does, when it helps, what it costs.", min_length=1)],
    skill_id: Annotated[str | None, Field(description="Stable id (lowercase, digits, _ - . :); generated when "
                                                      "omitted.")] = None,
    addresses: Annotated[list[str], Field(description="Finding kinds it is meant for.")] = [],  # noqa: B006
    recipe_path: Annotated[str | None, Field(description="Interventions: the dotted recipe path.")] = None,
    value: Annotated[JsonValue, Field(description="Interventions: literal value or rule {op: set|mul|add|toggle, "
                                            "value|by, min, max}.")] = None,
    code: Annotated[str | None, Field(description="Analyzers: Python source or 'builtin:<name>'.")] = None,
    tags: Annotated[list[str], Field(description="Free tags (domain, category, paper).")] = [],  # noqa: B006
    source: Annotated[str, Field(description="Paper, report, run id, or 'user'.")] = "mcp-client",
    replace: Annotated[bool, Field(description="Overwrite an existing skill with this id.")] = False,
) -> SkillInfo:
    """Add a skill to the memory (embedded for search)."""
    sid = skill_id or new_id(kind[:5])
    try:
        skill = Skill(id=sid, kind=kind, name=name, description=description, addresses=addresses,
                      recipe_path=recipe_path, value=value, code=code, tags=tags, source=source)
    except ValidationError as err:  # one line naming the argument, not pydantic's dump of every value (review 10)
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")[:500]
        raise SkillError(f"add_skill: {f'{loc}: ' if loc else ''}{msg}; fix that argument and call again") from None
    store = state_of(ctx).skill_store()
    store.add(skill, replace=replace)
    return _info(store.get(skill.id))


def record_skill_outcome(
    ctx: ToolContext,
    skill_id: Annotated[str, Field(description="Skill the intervention came from.", min_length=1)],
    outcome: Annotated[Literal["helped", "hurt", "neutral"], Field(
        description="helped (version kept), hurt (held-out drop or blocking finding), neutral.")],
    domain: Annotated[str, Field(description=f"Task domain: math, code, swe, ... (at most {DOMAIN_MAX_CHARS} "
                                             f"characters; a skill keeps at most {MAX_TRACK_DOMAINS} domains).")
                      ] = "general",
) -> OutcomeResult:
    """Count one trial of a skill in a domain (tried += 1, and helped or hurt += 1).

    Refused, with nothing recorded, for a domain over ``DOMAIN_MAX_CHARS`` (64) characters or a new domain past the
    skill's ``MAX_TRACK_DOMAINS`` (64): every outcome rewrites the skill's row with all its domains (review 19)."""
    rec = state_of(ctx).skill_store().record_outcome(skill_id, domain, outcome)
    return OutcomeResult(skill_id=skill_id, domain=domain or "general", record=SkillRecord(**rec.model_dump()))


def add_failed_case(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="The failed version.", min_length=1)],
    outcome: Annotated[str, Field(description="pruned | reverted | failed ... with the held-out delta.",
                                  min_length=1)],
    intervention: Annotated[str, Field(description="e.g. 'eps_clip_high: 0.28 -> 0.4'.")] = "",
    findings: Annotated[list[str], Field(description="Finding kinds raised against it.")] = [],  # noqa: B006
    skill_id: Annotated[str | None, Field(description="Skill the intervention came from.")] = None,
    domain: Annotated[str, Field(description="Task domain.")] = "",
    evidence_summary: Annotated[str, Field(description="One paragraph with the numbers.")] = "",
    run: Annotated[str, Field(description="Run folder or name (default: this server's run).")] = "",
) -> RecordId:
    """Remember a version that went wrong and why, so later runs avoid it."""
    st = state_of(ctx)
    case = FailedCase(run=run or str(st.run_dir or ""), version_id=version_id, domain=domain, findings=findings,
                      intervention=intervention, skill_id=skill_id, outcome=outcome,
                      evidence_summary=evidence_summary)
    return RecordId(id=st.skill_store().add_failed_case(case))


def add_search_trace(
    ctx: ToolContext,
    agent: Annotated[str, Field(description="Agent role or client name.", min_length=1)],
    query: Annotated[str, Field(description="What was searched.", min_length=1)],
    results: Annotated[list[str], Field(description="Skill ids returned, best first.")] = [],  # noqa: B006
    chosen: Annotated[str | None, Field(description="Skill id acted on, if any.")] = None,
    rationale: Annotated[str, Field(description="Why it was chosen (or why none).")] = "",
    filters: Annotated[dict[str, Any], Field(description="Filters used.")] = {},  # noqa: B006
    run: Annotated[str, Field(description="Run folder or name (default: this server's run).")] = "",
) -> RecordId:
    """Log what an agent searched, found and chose, and why."""
    st = state_of(ctx)
    trace = SearchTrace(run=run or str(st.run_dir or ""), agent=agent, query=query, filters=filters,
                        results=results, chosen=chosen, rationale=rationale)
    return RecordId(id=st.skill_store().add_search_trace(trace))


def add_version_summary(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="The version.", min_length=1)],
    status: Annotated[str, Field(description="Lineage status (kept, pruned, reverted, ...).")],
    domain: Annotated[str, Field(description="Task domain: math, code, swe, ...")] = "",
    intervention: Annotated[str, Field(description="e.g. 'temperature: 1.0 -> 1.2'; empty for a root.")] = "",
    metrics: Annotated[dict[str, float], Field(description="Numbers by name (headline metrics, or the "
                                                           "analyzer synthesiser's features).")] = {},  # noqa: B006
    findings: Annotated[list[str], Field(description="Finding kinds raised against it.")] = [],  # noqa: B006
    summary: Annotated[str, Field(description="One paragraph.")] = "",
    run: Annotated[str, Field(description="Run folder or name (default: this server's run).")] = "",
) -> RecordId:
    """Remember a version in a few lines for later runs (replaces the summary of the same run and version)."""
    st = state_of(ctx)
    run = run or str(st.run_dir or "")
    if len(findings) > SUMMARY_FINDINGS_MAX or any(len(f) > SUMMARY_NAME_MAX for f in findings):
        raise ToolError(f"findings: {len(findings):,} kinds (the longest {max(map(len, findings)):,} characters); a "
                        f"summary holds at most {SUMMARY_FINDINGS_MAX} finding kinds of at most {SUMMARY_NAME_MAX} "
                        "characters each, names such as 'truncation'")
    if len(metrics) > SUMMARY_METRICS_MAX or any(len(k) > SUMMARY_METRIC_NAME_MAX for k in metrics):
        raise ToolError(f"metrics: {len(metrics):,} entries; a summary holds at most {SUMMARY_METRICS_MAX} metrics "
                        f"with names of at most {SUMMARY_METRIC_NAME_MAX} characters: give the headline ones")
    vs = VersionSummary(id=f"{run}/{version_id}", run=run, version_id=version_id, domain=domain, status=status,
                        intervention=intervention, metrics=metrics, findings=findings, summary=summary)
    return RecordId(id=st.skill_store().add_version_summary(vs))


def list_version_summaries(
    ctx: ToolContext,
    domain: Annotated[str | None, Field(description="Only this task domain.")] = None,
    limit: Annotated[int, Field(description="Newest first.", ge=1, le=MAX_LIMIT)] = 200,
) -> VersionSummaryList:
    """Version summaries remembered by earlier runs (newest first), e.g. labelled versions to learn from; a reply ends
    before ``limit`` once it holds 1 MiB of JSON (``omitted`` counts the rest)."""
    where = f"domain = {sql_str(domain)}" if domain else None
    rows = state_of(ctx).skill_store().records(VERSION_SUMMARIES, where=where, limit=limit)
    out, size = [], 0
    for r in rows:
        d = r.model_dump(mode="json")
        size += len(json.dumps(d))
        if out and size > REPLY_SUMMARIES_MAX_CHARS:
            break
        out.append(d)
    return VersionSummaryList(summaries=out, omitted=len(rows) - len(out))


TOOLS = (search_skills, get_skill, add_skill, record_skill_outcome, add_failed_case, add_search_trace,
         add_version_summary, list_version_summaries)
"""The skill-memory tools, in catalogue order."""
