"""Training-control tools: the version lineage, branching, training / evaluation jobs, decisions.

Tools (:data:`TOOLS`): ``list_versions``, ``get_version``, ``diff_versions``, ``propose_intervention``,
``start_training``, ``evaluate_version``, ``job_status``, ``list_jobs``, ``cancel_job``, ``decide``, and the
writes of the autonomous loop and the baselines: ``create_root``, ``branch_control`` (a round's control arm),
``propose_recipe`` (a multi-field child: a search trial, a PBT member), ``record_gains``; resource
``lineage://tree``. Training and evaluation run as background jobs
(:mod:`evotrainer.servers.jobs`) through ``evotrainer.rl_backend.backends.get_backend`` (docs/interfaces.md);
``wait_s`` > 0 keeps the call open and streams MCP progress notifications, one per step.
"""

from __future__ import annotations

import functools
import json
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.mcpserver.resources import FunctionResource
from pydantic import BaseModel, ConfigDict, Field

from evotrainer.harness.gate import test_sealed
from evotrainer.harness.synthesis import Program, SynthesisError, stop_check
from evotrainer.intervention import ExpectedEffect, Intervention, category_of, merge
from evotrainer.lineage import SUMMARY_MAX, Decision, Job, LineageError, Version, capped_summary
from evotrainer.recipe import current_value, diff_recipes, get_path, set_path, validate_recipe
from evotrainer.rl_backend.backends import get_backend
from evotrainer.rl_backend.base import Backend, is_test_eval
from evotrainer.servers.common import (
    LOG_ERROR_DESCRIPTION,
    MAX_LIMIT,
    JsonValue,
    Page,
    ServerState,
    ToolContext,
    cached_read,
    in_tool_worker,
    lineage_token,
    page_fields,
    require_version,
    run_in_slot,
    state_of,
)
from evotrainer.servers.jobs import ProgressFn, StopFn, to_jsonable
from evotrainer.workspace import Workspace

StatusFilter = Literal["proposed", "training", "trained", "kept", "pruned", "reverted", "merged", "failed"]
VersionId = Annotated[str, Field(description="Version id, e.g. 'v0' (list_versions shows them).", min_length=1,
                                 max_length=64)]
WaitS = Annotated[float, Field(description="Seconds to wait for the job to finish, streaming progress "
                                           "notifications (0 = return at once).", ge=0, le=3600)]


class EarlyStopSpec(BaseModel):
    """A mid-training check of start_training: the analyzers that may stop the branch and when they are asked."""

    model_config = ConfigDict(extra="forbid")
    at_step: int = Field(description="Steps done (1-based, of the version's total) after which the analyzers are "
                                     "run on the evidence so far; training stops there when one is trusted and fires.",
                         ge=1, le=100000)
    analyzers: list[dict[str, Any]] = Field(
        description="Synthesised analyzers as stored in their skills' value: {name, program, loo: {tp, fp}, "
                    "track_record: {domain: {helped, hurt}}} (harness.synthesis.early_stop).", min_length=1,
        max_length=50)
    domain: str = Field("math", description="Task domain whose track record counts (math | code | swe).",
                        min_length=1, max_length=16)


EARLY_STOP_KEY = "early_stop"  # kv early_stop/<version>: the mid-training check's record (stop or not)


# --- result models -------------------------------------------------------------------------------
class VersionSummary(BaseModel):
    """One row of the lineage: id, parent, status, what changed, headline scores."""

    id: str
    parent_id: str | None
    status: str
    role: str = Field("", description="'control' for a control arm (the parent's recipe continued), '' otherwise.")
    interventions: list[str] = Field(description="'path: old -> new' per intervention (empty for the root), each value "
                                                 "cut to 200 characters; get_version has the full values.")
    interventions_omitted: int = Field(0, description="Interventions past the first 20 left out of this row.")
    avg_at_k: float | None = Field(None, description="Held-out Avg@k of the last evaluation, if any.")
    reward_mean: float | None = Field(None, description="Training reward/mean summary, if trained.")
    created_at: float = Field(description="Unix seconds.")


class VersionList(Page):
    """A page of versions in creation order."""

    versions: list[VersionSummary]


class DecisionInfo(BaseModel):
    """A recorded keep / prune / revert / merge decision."""

    id: int
    version_id: str
    action: str
    rationale: str
    evidence: list[str]
    author: str
    prev_status: str
    created_at: float
    damaged_weights: str | None = Field(None, description="The finding kind for which this prune / revert discards "
                                                          "the version's weights.")


class JobInfo(BaseModel):
    """A train / evaluate job and its progress."""

    id: str
    version_id: str | None
    kind: str
    status: str = Field(description="running | done | failed | cancelled | interrupted")
    progress: float = Field(description="Fraction done, 0..1.")
    steps_done: int
    steps_total: int
    message: str
    elapsed_s: float = Field(description="Seconds since the job started (to its last update once finished).")
    result: dict[str, Any] | None = Field(None, description="Backend result (TrainResult / EvalResult) once done, "
                                                            "when the job ran in this server process.")


class JobList(BaseModel):
    """Jobs, oldest first."""

    jobs: list[JobInfo]
    omitted: int = Field(0, description="Older jobs this reply leaves out (past ``limit``).")


REPLY_SUMMARY_MAX = SUMMARY_MAX
"""``metrics_summary`` entries one get_version reply carries (review 12 G-R12: a version's 2,500,000-entry summary was a
100 MB reply that stalled every tool for 22 s); the store's writers keep no more."""
REPLY_FINDINGS_MAX = 200
REPLY_DECISIONS_MAX = 50
"""Decisions one get_version reply carries, the last ones (review 14 A-R14: 200 decisions of ~1 MB each were a 372 MB
reply and a 6.8 s stall of every call); each is cut as :meth:`~evotrainer.lineage.LineageStore.decisions_brief` says,
to :data:`REPLY_RATIONALE_CHARS` and :data:`REPLY_EVIDENCE_REFS` references of :data:`REPLY_REF_CHARS` characters."""
REPLY_RATIONALE_CHARS = 4000
REPLY_JOBS_MAX = 50
"""Jobs one get_version reply carries, the last ones (review 14 J-R14: 100 crafted jobs of 2 MB messages each)."""
REPLY_EVIDENCE_REFS = 20
REPLY_REF_CHARS = 200
TREE_DECISIONS_MAX = 500
"""Decisions the ``lineage://tree`` resource carries, the run's last ones (each cut as in get_version)."""
REPLY_INTERVENTIONS_MAX = 20
"""Interventions one :class:`VersionSummary` row describes (a merge of many siblings has as many)."""
REPLY_LIST_MAX_CHARS = 1 << 20
"""JSON characters of the rows one list_versions page carries (1 MiB): a page ends early past it, with ``next_offset``
where the next starts (review 13 I-R13: 400 rows of ~1 MB interventions were an 800 MB reply and a 6.7 s stall)."""
"""Findings one get_version reply carries (G-R12: 400,000 stored findings were a 66 MB reply)."""


class VersionDetail(BaseModel):
    """Everything about one version: recipe, interventions, status, summaries, decisions, jobs."""

    id: str
    parent_id: str | None
    status: str
    role: str = Field("", description="'control' for a control arm (the parent's recipe continued), '' otherwise.")
    children: list[str]
    interventions: list[dict[str, Any]] = Field(description="Full intervention records (path, old, new, category, "
                                                            "hypothesis, expected_effect, source).")
    recipe: dict[str, Any]
    checkpoint: str | None
    metrics_summary: dict[str, Any] = Field(description=f"At most {REPLY_SUMMARY_MAX} entries (the headline metrics "
                                                        "first, then the first by name); get_metric_series reads any "
                                                        "series.")
    metrics_summary_omitted: int = Field(0, description="metrics_summary entries this reply leaves out.")
    eval_summary: dict[str, Any]
    findings: list[dict[str, Any]] = Field(description=f"The first {REPLY_FINDINGS_MAX} findings at most.")
    findings_omitted: int = Field(0, description="Findings this reply leaves out.")
    note: str
    decisions: list[DecisionInfo] = Field(description=(
        "The version's last decisions (at most 50), oldest first, each rationale cut to 4,000 characters and its "
        "evidence to 20 references of 200 characters (saying how much was cut)."))
    decisions_omitted: int = Field(0, description="Earlier decisions this reply leaves out.")
    jobs: list[JobInfo] = Field(description="The version's last 50 jobs, oldest first (messages cut to 4,000 "
                                            "characters).")
    jobs_omitted: int = Field(0, description="Older jobs of the version this reply leaves out.")
    damaged_weights: str | None = Field(None, description="The finding kind for which the version's last decision "
                                                          "(prune / revert) discarded its weights: there is nothing "
                                                          "to continue, its children start from its own start point.")
    created_at: float
    updated_at: float
    log_error: str | None = Field(None, description=LOG_ERROR_DESCRIPTION)


class RecipeChange(BaseModel):
    """One recipe path whose value differs."""

    path: str
    a_value: JsonValue = Field(description="Value in version a (null: absent).")
    b_value: JsonValue = Field(description="Value in version b (null: absent).")


class RecipeDiff(BaseModel):
    """Recipe paths that differ between two versions."""

    a: str
    b: str
    changes: list[RecipeChange]


class DecisionResult(BaseModel):
    """A decision and the version it applied to (the new merged child for a merge)."""

    decision: DecisionInfo
    version: VersionSummary
    log_error: str | None = Field(None, description=LOG_ERROR_DESCRIPTION)


# --- helpers -------------------------------------------------------------------------------------
def summary_of(v: Version) -> VersionSummary:
    """A :class:`VersionSummary` of a lineage ``Version``."""
    ev, ms = v.eval_summary or {}, v.metrics_summary or {}
    avg = ev.get("avg@k")
    rew = ms.get("reward/mean")
    ivs = v.interventions
    return VersionSummary(id=v.id, parent_id=v.parent_id, status=v.status, role=v.role,
                          interventions=[iv.describe() for iv in ivs[:REPLY_INTERVENTIONS_MAX]],
                          interventions_omitted=max(0, len(ivs) - REPLY_INTERVENTIONS_MAX),
                          avg_at_k=float(avg) if isinstance(avg, (int, float)) else None,
                          reward_mean=float(rew) if isinstance(rew, (int, float)) else None,
                          created_at=v.created_at)


def job_info(state: ServerState, row: Job) -> JobInfo:
    """A :class:`JobInfo` from a lineage ``Job`` row plus this process's in-memory result."""
    mem = state.jobs.get(row.id)
    result = to_jsonable(mem.result) if mem is not None and mem.done.is_set() else None
    if result is not None and not isinstance(result, dict):
        result = {"value": result}
    end = row.updated_at if row.status != "running" else time.time()
    return JobInfo(id=row.id, version_id=row.version_id, kind=row.kind, status=row.status, progress=row.progress,
                   steps_done=row.steps_done, steps_total=row.steps_total, message=row.message,
                   elapsed_s=round(end - row.created_at, 3), result=result)


def _decision(d: Decision) -> DecisionInfo:
    return DecisionInfo(**d.model_dump())


def _brief_decisions(ws: Workspace, version_id: str | None, last: int) -> tuple[list[Decision], int]:
    """The last ``last`` decisions of a version (None: of the run) cut for a reply, and how many there are."""
    return ws.lineage.decisions_brief(version_id, last=last, rationale_chars=REPLY_RATIONALE_CHARS,
                                      refs=REPLY_EVIDENCE_REFS, ref_chars=REPLY_REF_CHARS)


def _job_row(ws: Workspace, job_id: str) -> Job:
    try:
        return ws.lineage.job(job_id)
    except LineageError:
        known = ", ".join(j.id for j in ws.lineage.jobs(last=10)) or "none"
        raise ToolError(f"job {job_id!r} not found; recent jobs: {known} (list_jobs shows all)") from None


def _backend(state: ServerState) -> Backend:
    return get_backend(state.backend_name)


def _noted(info: JobInfo, note: str | None) -> JobInfo:
    """``info`` with ``note`` (from :meth:`~evotrainer.servers.jobs.JobManager.wait`) appended to its message."""
    if note:
        info.message = f"{info.message} ({note})" if info.message else note
    return info


async def _job_info_off_loop(name: str, state: ServerState, ws: Workspace, job_id: str) -> JobInfo:
    """The :class:`JobInfo` of ``job_id``, read from the lineage in a tool thread (an async tool's last read)."""
    return await run_in_slot(name, lambda: job_info(state, ws.lineage.job(job_id)))


def list_versions(
    ctx: ToolContext,
    status: Annotated[StatusFilter | None, Field(description="Only versions with this status.")] = None,
    offset: Annotated[int, Field(description="Index of the first version to return.", ge=0)] = 0,
    limit: Annotated[int, Field(description="Versions per page.", ge=1, le=MAX_LIMIT)] = 50,
) -> VersionList:
    """List the versions of the run (id, parent, status, intervention, headline scores), paginated; a page ends
    before ``limit`` rows once it holds 1 MiB of JSON (``next_offset`` says where to go on)."""
    ws = state_of(ctx).workspace()
    vs = [v for v in ws.lineage.versions() if status is None or v.status == status]
    rows: list[VersionSummary] = []
    size = 0
    for v in vs[offset:offset + limit]:
        row = summary_of(v)
        size += len(row.model_dump_json())
        if rows and size > REPLY_LIST_MAX_CHARS:
            break
        rows.append(row)
    return VersionList(versions=rows, **page_fields(len(vs), offset, len(rows)))


FINISHED_JOBS = frozenset({"done", "failed", "cancelled", "interrupted"})
"""Job statuses that no longer change by themselves (a running job's ``elapsed_s`` moves with the clock)."""


def _version_key(state: ServerState, blocking: bool, ctx: ToolContext, version_id: str) -> Any:
    token = lineage_token(state, blocking)
    return None if token is None else (token, version_id)


def _settled(state: ServerState, detail: VersionDetail) -> bool:
    """True when nothing in ``detail`` can change without a write to the lineage: every job it lists has finished,
    in the store and (for a job of this process, whose in-memory result it shows) in memory."""
    for j in detail.jobs:
        mem = state.jobs.get(j.id)
        if j.status not in FINISHED_JOBS or (mem is not None and not mem.done.is_set()):
            return False
    return True


@cached_read(_version_key, _settled)
def get_version(ctx: ToolContext, version_id: VersionId) -> VersionDetail:
    """Full record of one version: recipe, interventions, status and role (control arm or not), metric / eval
    summaries, findings, decisions and jobs."""
    st = state_of(ctx)
    ws = st.workspace()
    v = require_version(ws, version_id)
    summary, summary_omitted = capped_summary(v.metrics_summary, REPLY_SUMMARY_MAX)
    decisions, n_decisions = _brief_decisions(ws, v.id, REPLY_DECISIONS_MAX)
    jobs = ws.lineage.jobs(v.id, last=REPLY_JOBS_MAX)
    return VersionDetail(
        id=v.id, parent_id=v.parent_id, status=v.status, role=v.role,
        children=[c.id for c in ws.lineage.children(v.id)],
        interventions=[iv.model_dump(mode="json") for iv in v.interventions], recipe=v.recipe.to_dict(),
        checkpoint=v.checkpoint, metrics_summary=summary, metrics_summary_omitted=summary_omitted,
        eval_summary=v.eval_summary, findings=v.findings[:REPLY_FINDINGS_MAX],
        findings_omitted=max(0, len(v.findings) - REPLY_FINDINGS_MAX), note=v.note, decisions=[_decision(d) for d in decisions],
        decisions_omitted=n_decisions - len(decisions),
        jobs=[job_info(st, j) for j in jobs], jobs_omitted=ws.lineage.count_jobs(v.id) - len(jobs),
        damaged_weights=ws.lineage.damaged(v.id),
        created_at=v.created_at, updated_at=v.updated_at)


def diff_versions(ctx: ToolContext, a: VersionId, b: VersionId) -> RecipeDiff:
    """Recipe paths whose values differ between versions a and b (dotted paths, sorted)."""
    ws = state_of(ctx).workspace()
    require_version(ws, a)
    require_version(ws, b)
    return RecipeDiff(a=a, b=b, changes=[RecipeChange(path=p, a_value=va, b_value=vb)
                                         for p, va, vb in ws.lineage.diff(a, b)])


def propose_intervention(
    ctx: ToolContext,
    parent_id: VersionId,
    path: Annotated[str, Field(description="Dotted recipe path to change, e.g. 'eps_clip_high', "
                                           "'reward.format.weight', 'data.level'.", min_length=1)],
    new_value: Annotated[JsonValue, Field(description="New value (JSON): number, string, bool, list or object.")],
    hypothesis: Annotated[str, Field(description="Why this should help, citing the evidence.")] = "",
    expected_metric: Annotated[str | None, Field(description="Metric expected to move, e.g. 'eval/avg@k'.")] = None,
    expected_direction: Annotated[Literal["up", "down"] | None, Field(
        description="Direction expected for expected_metric.")] = None,
    category: Annotated[Literal["reward", "data", "rollout", "optimizer", "tool_use"] | None, Field(
        description="Category; inferred from the path when omitted.")] = None,
    source: Annotated[str, Field(description="Where the idea came from: 'skill:<id>', an agent role, "
                                             "or 'user'.")] = "mcp-client",
    note: Annotated[str, Field(description="Free-form note stored with the version.")] = "",
) -> VersionDetail:
    """Create a proposed child of parent_id whose recipe differs by one single-factor intervention
    (path: parent value -> new_value). Train it with start_training."""
    ws = state_of(ctx).workspace()
    parent = require_version(ws, parent_id)
    if (expected_metric is None) != (expected_direction is None):
        raise ToolError("give expected_metric and expected_direction together (or neither)")
    old = current_value(parent.recipe, path)
    child = set_path(parent.recipe, path, new_value)
    new = get_path(child, path) if not (new_value is None and path.startswith("reward.")) else None
    iv = Intervention(
        path=path, old=old, new=new, category=category or category_of(path), hypothesis=hypothesis,
        expected_effect=ExpectedEffect(metric=expected_metric, direction=expected_direction)
        if expected_metric else None, source=source)
    v = ws.lineage.branch(parent_id, iv, note=note)
    log_error = ws.log_after_commit(f"proposed {v.id} from {parent_id}: {iv.describe()}", version=v.id, source="mcp")
    return get_version(ctx, v.id).model_copy(update={"log_error": log_error})


async def start_training(
    ctx: ToolContext,
    version_id: VersionId,
    steps: Annotated[int, Field(description="Total GRPO steps of the version (one rollout batch each).", ge=1,
                                           le=100000)],
    wait_s: WaitS = 0.0,
    early_stop: Annotated[EarlyStopSpec | None, Field(
        description="Optional mid-training check: after at_step steps the given synthesised analyzers are run on "
                    "the evidence so far; when one fires and its precision record is good enough (Wilson 95% lower "
                    "bound >= 0.5) training stops there. The check's record is in the job result (early_stop) and "
                    "in the run's kv early_stop/<version>. Local backend only.")] = None,
) -> JobInfo:
    """Train a version up to `steps` GRPO steps in total as a background job, from its parent's checkpoint (an
    earlier one when the parent was pruned for collapsed / diverged weights; a partly trained version resumes
    from its last step). Returns the job; poll job_status or pass wait_s to
    stream progress notifications. With early_stop, trusted synthesised analyzers may stop it mid-training."""
    st = state_of(ctx)

    def prelude() -> tuple[Workspace, Backend]:
        ws = st.workspace()
        v = require_version(ws, version_id)
        if v.status in ("kept", "pruned", "reverted"):
            raise ToolError(f"{version_id} is {v.status} (decided); propose a child of it instead of retraining it")
        start = ws.lineage.start_version(version_id)  # the parent, or earlier when its weights are damaged
        if start is not None and (not start.checkpoint or not Path(start.checkpoint).is_dir()):
            # fail now rather than in the job (the backend starts from this checkpoint)
            role = "parent" if start.id == v.parent_id else "start point"
            raise ToolError(f"{role} {start.id} of {version_id} has no checkpoint (status {start.status}); "
                            f"train {start.id} first")
        busy = [j.id for j in st.jobs.running() if j.version_id == version_id]
        if busy:
            raise ToolError(f"{version_id} has a running job {busy[0]}; wait for it (job_status) or cancel_job")
        return ws, _backend(st)  # the backend imports torch

    # the lineage reads and the backend import in a tool thread, not on the event loop: a slow read (a crafted or
    # a big lineage.db) there stalled every session's pings (review 10, M-R10: 37 s)
    ws, backend = await run_in_slot("start_training", prelude)
    if early_stop is not None:
        if getattr(backend, "name", "") != "local":
            raise ToolError(f"early_stop: backend {getattr(backend, 'name', '?')!r} has no after-step hook; "
                            "only the local backend stops mid-training (drop early_stop)")
        try:
            for a in early_stop.analyzers:
                Program.from_dict(a.get("program") or {})
        except (SynthesisError, TypeError, ValueError) as exc:
            raise ToolError(f"early_stop.analyzers: {exc} (each needs a program as harness.synthesis.Program.to_dict "
                            "gives)") from None

    def run(wws: Workspace, progress: ProgressFn, should_stop: StopFn) -> Any:
        if early_stop is None:
            return backend.train(wws, version_id, steps, progress=progress, should_stop=should_stop)
        spec = early_stop

        def after_step(done: int) -> dict[str, Any] | None:
            if done != spec.at_step:
                return None
            rec = stop_check(wws, version_id, spec.analyzers, spec.domain, done, steps)
            wws.lineage.kv_set(f"{EARLY_STOP_KEY}/{version_id}", rec)
            return rec if rec["stop"] else None

        return backend.train(wws, version_id, steps, progress=progress, should_stop=should_stop,
                             after_step=after_step)

    # off the event loop: start() may wait for the previous job to release the writer lock
    job = await in_tool_worker(functools.partial(st.jobs.start, "train", version_id, steps, run))
    note = await st.jobs.wait(ctx, job.id, wait_s)
    return _noted(await _job_info_off_loop("start_training", st, ws, job.id), note)


async def evaluate_version(
    ctx: ToolContext,
    version_id: VersionId,
    k: Annotated[int | None, Field(description="Samples per held-out problem (default: recipe eval.k).",
                                   ge=1, le=256)] = None,
    eval_name: Annotated[str, Field(description="Name of the evaluation set.", min_length=1)] = "heldout",
    wait_s: WaitS = 0.0,
    first_sample: Annotated[int, Field(
        description="0: a new evaluation (replaces the stored outcomes of eval_name). N > 0: a top-up: k more "
                    "samples per problem appended after the first N stored ones, with sample seeds of their own; the "
                    "summary scores all. Dev evaluations only.", ge=0, le=1024)] = 0,
) -> JobInfo:
    """Evaluate a version on the dev (held-out) set (k samples per problem: Avg@k, pass@k) as a background
    job; the result lands in the version's eval_summary. Pass wait_s to stream progress. The test split
    (eval_name 'test' / 'no_rl_test') is sealed while a run is under way: an error says so. first_sample > 0
    tops up a dev evaluation (the loop's sequential gate: more samples only where a decision is undecided)."""
    st = state_of(ctx)

    def prelude() -> tuple[Workspace, Backend]:
        ws = st.workspace()
        require_version(ws, version_id)
        if (why := test_sealed(ws, eval_name)) is not None:
            raise ToolError(why)
        return ws, _backend(st)  # the backend imports torch

    ws, backend = await run_in_slot("evaluate_version", prelude)  # lineage reads: not on the event loop (M-R10)
    if is_test_eval(eval_name) and getattr(backend, "name", "") != "local":
        raise ToolError(f"eval {eval_name!r} scores the test split, which only the local backend evaluates; "
                        f"backend {getattr(backend, 'name', '?')!r} would score the dev problems under that name")

    def run(wws: Workspace, progress: ProgressFn, should_stop: StopFn) -> Any:
        if first_sample:
            return backend.evaluate(wws, version_id, k=k, eval_name=eval_name, progress=progress,
                                    first_sample=first_sample)
        return backend.evaluate(wws, version_id, k=k, eval_name=eval_name, progress=progress)

    job = await in_tool_worker(functools.partial(st.jobs.start, "eval", version_id, 0, run))
    note = await st.jobs.wait(ctx, job.id, wait_s)
    return _noted(await _job_info_off_loop("evaluate_version", st, ws, job.id), note)


async def job_status(
    ctx: ToolContext,
    job_id: Annotated[str, Field(description="Job id returned by start_training / evaluate_version.")],
    wait_s: WaitS = 0.0,
) -> JobInfo:
    """Status and progress of a job; with wait_s > 0, wait for it to finish while streaming progress."""
    st = state_of(ctx)

    def prelude() -> Workspace:
        ws = st.workspace()
        _job_row(ws, job_id)
        return ws

    ws = await run_in_slot("job_status", prelude)  # lineage reads: not on the event loop (M-R10)
    note = await st.jobs.wait(ctx, job_id, wait_s)
    return _noted(await _job_info_off_loop("job_status", st, ws, job_id), note)


def list_jobs(
    ctx: ToolContext,
    version_id: Annotated[str | None, Field(description="Only jobs of this version.")] = None,
    limit: Annotated[int, Field(description="The newest this many jobs.", ge=1, le=MAX_LIMIT)] = 100,
) -> JobList:
    """The run's newest train / evaluate jobs (``limit``), oldest first; ``omitted`` counts the older ones."""
    st = state_of(ctx)
    ws = st.workspace()
    if version_id is not None:
        require_version(ws, version_id)
    jobs = ws.lineage.jobs(version_id, last=limit)
    return JobList(jobs=[job_info(st, j) for j in jobs], omitted=ws.lineage.count_jobs(version_id) - len(jobs))


async def cancel_job(
    ctx: ToolContext,
    job_id: Annotated[str, Field(description="Job id to stop.")],
    wait_s: Annotated[float, Field(description="Seconds to wait for the job to stop.", ge=0, le=600)] = 30.0,
) -> JobInfo:
    """Stop a running job after its current step (the version keeps the steps done; training resumes
    from there next time)."""
    st = state_of(ctx)

    def prelude() -> Workspace:
        ws = st.workspace()
        _job_row(ws, job_id)
        st.jobs.cancel(job_id)
        return ws

    ws = await run_in_slot("cancel_job", prelude)  # lineage reads: not on the event loop (M-R10)
    note = await st.jobs.wait(None, job_id, wait_s)
    return _noted(await _job_info_off_loop("cancel_job", st, ws, job_id), note)


def decide(
    ctx: ToolContext,
    version_id: VersionId,
    action: Annotated[Literal["keep", "prune", "revert", "merge"], Field(
        description="keep (promote), prune (discard), revert (un-keep a kept version), merge (create the "
                    "merged child of version_id and merge_with, two kept siblings).")],
    rationale: Annotated[str, Field(description="Why, with the numbers (gain, CI, findings).", min_length=1)],
    evidence: Annotated[list[str], Field(description="Evidence refs: metric series, rollout ids, finding ids, "
                                                     "job ids.")] = [],  # noqa: B006 (pydantic copies it)
    merge_with: Annotated[str | None, Field(description="For action=merge: the kept sibling to merge with.")] = None,
    author: Annotated[str, Field(description="Who decides: an agent role or 'user'.")] = "mcp-client",
    damaged_weights: Annotated[str | None, Field(description="With prune / revert: the finding kind that damages "
                                                             "the version's weights (gate_version's "
                                                             "damaged_weights); its children then start from its "
                                                             "own start point.")] = None,
) -> DecisionResult:
    """Record a decision with its rationale and evidence and apply its status change. A merge creates a
    new child of the common parent with both siblings' interventions (it still needs training)."""
    ws = state_of(ctx).workspace()
    v = require_version(ws, version_id)
    target = v.id
    if action == "merge":
        if damaged_weights is not None:
            raise ToolError("damaged_weights is only for action=prune or revert (a merge keeps its sources)")
        if not merge_with:
            raise ToolError("action=merge needs merge_with: the id of a kept sibling of version_id")
        w = require_version(ws, merge_with)
        if v.parent_id is None or v.parent_id != w.parent_id or v.id == w.id:
            raise ToolError(f"merge needs two distinct siblings (same parent); {v.id} has parent {v.parent_id}, "
                            f"{w.id} has parent {w.parent_id}")
        not_kept = [x.id + f" ({x.status})" for x in (v, w) if x.status != "kept"]
        if not_kept:
            raise ToolError(f"merge needs two kept siblings; not kept: {', '.join(not_kept)}")
        evidence = [*evidence, v.id, w.id]
        # child + merge decision in one transaction: a crash leaves both or neither
        child = ws.lineage.branch(v.parent_id, merge(v.interventions, w.interventions),
                                  note=f"merge of {v.id} and {w.id}",
                                  merge_decision=(rationale, evidence, author))
        target = child.id
    elif merge_with:
        raise ToolError(f"merge_with is only for action=merge (action is {action})")
    if action != "merge":
        ws.lineage.decide(target, action, rationale, evidence=evidence, author=author, damaged_weights=damaged_weights)
    d = _brief_decisions(ws, target, 1)[0][-1]  # the reply carries it cut as get_version does
    # committed: a run log that cannot take the record must not make the answer an error (review 12, F-R12)
    log_error = ws.log_after_commit(f"decision {action} on {target}: {rationale}", version=target, source="mcp")
    return DecisionResult(decision=_decision(d), version=summary_of(ws.lineage.get(target)), log_error=log_error)


# --- the loop's writes: the run's root, control arms, multi-field children, gains -------------------------
class CreatedVersion(BaseModel):
    """A find-or-create result: the version, and whether this call created it."""

    created: bool = Field(description="True when this call created the version; false when it existed already.")
    version: VersionDetail
    log_error: str | None = Field(None, description=LOG_ERROR_DESCRIPTION)


class FieldValue(BaseModel):
    """One recipe path and its new value (an item of propose_recipe's changes)."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="Dotted recipe path, e.g. 'actor_learning_rate' or 'reward.format.weight'.",
                      min_length=1, max_length=200)
    value: JsonValue = Field(description="New value (JSON): number, string, bool, list or object.")


class Gain(BaseModel):
    """A dev Avg@k gain of a version over a baseline version, with its bootstrap CI (the gate's numbers)."""

    model_config = ConfigDict(extra="forbid")
    version: str | None = Field(description="The baseline version the gain is measured against.", max_length=64)
    gain: float | None = Field(description="Dev Avg@k gain over the baseline (fraction, paired problems).")
    ci: list[float] | None = Field(None, description="Bootstrap CI of the gain: [low, high].", min_length=2,
                                   max_length=2)


class ControlGain(Gain):
    """The gain over the round's control arm, with the permutation test's p-value."""

    version: str = Field(description="The round's control arm.", min_length=1, max_length=64)
    p_value: float | None = Field(None, description="Two-sided paired permutation p-value of the gain.", ge=0, le=1)


def create_root(
    ctx: ToolContext,
    recipe: Annotated[dict[str, Any], Field(description="The base recipe (recipe fields as in a run config's "
                                                        "'recipe:'; `evotrainer recipe validate` checks one).")],
    note: Annotated[str, Field(description="Free-form note stored with the root.")] = "base recipe",
) -> CreatedVersion:
    """Create the run's root version from a base recipe; when the run has its root already, return it
    (created=false). A root made from another recipe is an error: use a new run folder."""
    ws = state_of(ctx).workspace()
    want = validate_recipe(recipe)
    root, created, log_error = ws.lineage.root(), False, None
    if root is None:
        root, created = ws.lineage.create_root(want, note=note), True
        log_error = ws.log_after_commit(f"created the root {root.id}: {note}", version=root.id, source="mcp")
    elif root.recipe != want:
        paths = [p for p, _, _ in diff_recipes(root.recipe, want)]
        raise ToolError(f"this run was started with another base recipe (root {root.id} differs at "
                        f"{', '.join(paths[:10])}{', ...' if len(paths) > 10 else ''}); use a new run folder or the "
                        "original recipe")
    return CreatedVersion(created=created, version=get_version(ctx, root.id), log_error=log_error)


def branch_control(
    ctx: ToolContext,
    parent_id: VersionId,
    note: Annotated[str, Field(description="Free-form note stored with the control.")] = "",
) -> CreatedVersion:
    """Find-or-create the control arm of parent_id: a child with the parent's recipe and no change (role
    'control'), trained like its siblings from the parent's checkpoint, the baseline the gate measures them
    against. One per parent (created=false: it existed); none of a version pruned for damaged weights (nothing
    to continue). Train it with start_training."""
    ws = state_of(ctx).workspace()
    parent = require_version(ws, parent_id)
    existing = next((c for c in ws.lineage.children(parent.id) if c.is_control), None)
    if existing is not None:
        return CreatedVersion(created=False, version=get_version(ctx, existing.id))
    if (kind := ws.lineage.damaged(parent.id)) is not None:
        raise ToolError(f"{parent.id} was {parent.status} for damaged weights ({kind}): its recipe has nothing to "
                        "continue; gate its children against it instead of a control")
    v = ws.lineage.branch_control(parent.id, note=note)
    log_error = ws.log_after_commit(f"control arm {v.id} of {parent.id}: the parent's recipe continued",
                                    version=v.id, source="mcp")
    return CreatedVersion(created=True, version=get_version(ctx, v.id), log_error=log_error)


def propose_recipe(
    ctx: ToolContext,
    parent_id: VersionId,
    changes: Annotated[list[FieldValue], Field(description="The recipe paths to change and their new values, "
                                                            "applied in order; each path once.", min_length=1,
                                               max_length=64)],
    hypothesis: Annotated[str, Field(description="Why this recipe, e.g. the search that sampled it.")] = "",
    source: Annotated[str, Field(description="Who proposes it: a search mode ('recipe-search', 'pbt'), an agent "
                                             "role, or 'user'.")] = "mcp-client",
    note: Annotated[str, Field(description="Free-form note stored with the version.")] = "",
) -> VersionDetail:
    """Create a proposed child of parent_id whose recipe differs by several fields at once (one intervention
    per path: parent value -> new value), e.g. a recipe-search trial or a PBT member; each change is
    validated as in propose_intervention. Agents propose single-factor changes with propose_intervention."""
    ws = state_of(ctx).workspace()
    parent = require_version(ws, parent_id)
    dup = sorted(p for p, n in Counter(c.path for c in changes).items() if n > 1)
    if dup:
        raise ToolError(f"each path once: {', '.join(dup)} appear(s) more than once in changes")
    ivs, recipe = [], parent.recipe
    for c in changes:
        old = current_value(parent.recipe, c.path)
        recipe = set_path(recipe, c.path, c.value)
        new = get_path(recipe, c.path) if not (c.value is None and c.path.startswith("reward.")) else None
        ivs.append(Intervention(path=c.path, old=old, new=new, category=category_of(c.path), hypothesis=hypothesis,
                                source=source))
    v = ws.lineage.branch(parent.id, ivs, note=note)
    log_error = ws.log_after_commit(f"proposed {v.id} from {parent.id}: {v.describe_change()}", version=v.id,
                                    source="mcp")
    return get_version(ctx, v.id).model_copy(update={"log_error": log_error})


def record_gains(
    ctx: ToolContext,
    version_id: VersionId,
    vs_control: Annotated[ControlGain | None, Field(description="The gain over the round's control arm (gate_version's "
                                                                "gain, ci, p_value when its baseline is the control).")]
    = None,
    vs_parent: Annotated[Gain | None, Field(description="The gain over the parent (gate_version's gain_vs_parent, "
                                                        "ci_vs_parent); version is the parent.")] = None,
    waived: Annotated[list[str] | None, Field(description="Finding kinds the round waived for this version (shared "
                                                          "by every arm of the round).")] = None,
) -> VersionDetail:
    """Record a dev-evaluated version's gate gains (vs its round's control, vs its parent) and the waived
    finding kinds in its eval_summary (keys vs_control, vs_parent, waived), for reports and the lineage view.
    Keys not given are left as they are."""
    ws = state_of(ctx).workspace()
    v = require_version(ws, version_id)
    ev = dict(v.eval_summary or {})
    if "avg@k" not in ev:
        raise ToolError(f"{v.id} has no dev evaluation: a gain is measured on dev; evaluate_version it first")
    if vs_control is not None:
        if require_version(ws, vs_control.version).id == v.id:
            raise ToolError(f"vs_control.version is {v.id} itself; give the round's control arm")
        ev["vs_control"] = vs_control.model_dump()
    if vs_parent is not None:
        if vs_parent.version != v.parent_id:
            raise ToolError(f"vs_parent.version is {vs_parent.version!r}, but the parent of {v.id} is {v.parent_id!r}")
        ev["vs_parent"] = vs_parent.model_dump()
    if waived:
        ev["waived"] = list(waived)
    if ev != (v.eval_summary or {}):
        ws.lineage.update_version(v.id, eval_summary=ev)
    return get_version(ctx, v.id)


TOOLS = (list_versions, get_version, diff_versions, propose_intervention, start_training, evaluate_version,
         job_status, list_jobs, cancel_job, decide, create_root, branch_control, propose_recipe, record_gains)
"""The training-control tools, in catalogue order."""

LINEAGE_TREE_URI = "lineage://tree"


def lineage_tree(state: ServerState) -> str:
    """The run's version tree (nested id, status, intervention, summaries, children) and its last 500 decisions (each
    cut as in get_version; ``decisions_omitted`` counts the earlier ones), JSON."""
    try:
        ws = state.workspace()
        decisions, total = _brief_decisions(ws, None, TREE_DECISIONS_MAX)
        tree = ws.lineage.tree()
    except (ToolError, LineageError) as exc:  # (review 14 E-R14: a LineageError was a bare "Error reading resource")
        raise ResourceError(str(exc)) from None
    return json.dumps({"tree": tree, "decisions": [d.model_dump() for d in decisions],
                       "decisions_omitted": total - len(decisions)}, default=str)


def register(server: MCPServer[ServerState], state: ServerState) -> None:
    """Add the ``lineage://tree`` resource to ``server`` (the tools go to the server's constructor: ``TOOLS``).

    A static resource gets no request context, so it reads ``state`` bound here rather than the lifespan context.
    """
    server.add_resource(FunctionResource.from_function(
        functools.partial(lineage_tree, state), uri=LINEAGE_TREE_URI, name="lineage_tree",
        description=lineage_tree.__doc__, mime_type="application/json"))
