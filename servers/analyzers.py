"""Analyzer tools: the diagnostic harness over the run's evidence (``harness/``, docs/interfaces.md).

Tools: ``list_analyzers``, ``run_analyzer`` (registered analyzers over ``Evidence.from_workspace``),
``run_analyzer_code`` (untrusted code in ``evotrainer.sandbox``, evidence mounted read-only),
``register_analyzer`` (kept in the run's lineage store, re-registered in every server process),
plus ``backtest_analyzer``, ``rescore_rollouts``, ``replay_filter`` and ``gate_version``
(:mod:`evotrainer.servers.backtests`); :data:`TOOLS` lists all of them. What these tools share with the
backtests (the run's evidence and runtime analyzers, the finding model) is in :mod:`evotrainer.servers.analysis`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from evotrainer.harness import analyzers as reg
from evotrainer.harness.findings import Finding
from evotrainer.sandbox import sandbox_info
from evotrainer.servers.analysis import (
    KV_KEY,
    REGISTRY_LOCK,
    STORED_KINDS_MAX,
    STORED_NAME_MAX,
    FindingInfo,
    evidence_of,
    finding_info,
    sync_registry,
)
from evotrainer.servers.backtests import TOOLS as BACKTEST_TOOLS
from evotrainer.servers.common import (
    LOG_ERROR_DESCRIPTION,
    ServerState,
    ToolContext,
    cached_read,
    lineage_token,
    state_of,
)

VersionIds = Annotated[list[str] | None, Field(description="Versions to analyze (default: all versions of the run).")]


class AnalyzerInfo(BaseModel):
    """A registered analyzer."""

    name: str
    description: str
    kinds: list[str] = Field(description="Finding kinds it reports.")
    builtin: bool
    sandboxed: bool = Field(description="Runtime analyzer code run in the sandbox.")
    log_error: str | None = Field(None, description=LOG_ERROR_DESCRIPTION)


class AnalyzerList(BaseModel):
    """All registered analyzers, built-ins first."""

    analyzers: list[AnalyzerInfo]


class AnalysisResult(BaseModel):
    """Findings of one analysis, most severe first."""

    versions: list[str]
    analyzers: list[str] = Field(description="Analyzers that ran.")
    findings: list[FindingInfo]
    n_blocking: int
    n_warn: int
    wall_s: float = Field(description="Seconds.")
    backend: str | None = Field(None, description="Sandbox backend (run_analyzer_code only).")
    exit_code: int | None = Field(None, description="Sandboxed code's exit status (0 when findings were parsed).")


def _result(versions: list[str], names: list[str], findings: list[Finding], t0: float, **extra: Any) -> AnalysisResult:
    infos = [finding_info(f) for f in findings]
    return AnalysisResult(versions=versions, analyzers=names, findings=infos,
                          n_blocking=sum(f.severity == "blocking" for f in infos),
                          n_warn=sum(f.severity == "warn" for f in infos), wall_s=round(time.perf_counter() - t0, 4),
                          **extra)


def _analyzers_key(state: ServerState, blocking: bool, ctx: ToolContext) -> Any:
    """The registry's generation and the run's lineage token (the run's runtime analyzers live in its kv table)."""
    if state.run_dir is None:
        return (reg.registry_generation(),)
    token = lineage_token(state, blocking)
    return None if token is None else (reg.registry_generation(), token)


@cached_read(_analyzers_key)
def list_analyzers(ctx: ToolContext) -> AnalyzerList:
    """List the registered analyzers (built-ins and runtime ones) with the finding kinds they report."""
    st = state_of(ctx)
    scope = [s.name for s in reg.list_analyzers(builtin=True)]
    if st.run_dir is not None:
        try:
            ws = st.workspace()
        except ToolError:
            ws = None  # no run yet: built-ins only
        if ws is not None:  # a run's stored analyzers of a wrong shape are named, not hidden (review 11, C-R11)
            scope = sync_registry(ws)
    return AnalyzerList(analyzers=[
        AnalyzerInfo(name=s.name, description=s.description, kinds=list(s.kinds), builtin=s.builtin,
                     sandboxed=s.code is not None) for s in (reg.get_analyzer(n) for n in scope)])


def run_analyzer(
    ctx: ToolContext,
    version_ids: VersionIds = None,
    names: Annotated[list[str] | None, Field(description="Analyzers to run (default: all registered).")] = None,
    record: Annotated[bool, Field(description="Store the findings on each version they cover "
                                              "(get_version shows them).")] = False,
) -> AnalysisResult:
    """Run registered analyzers on the run's evidence (metrics, rollouts, evals) and return the findings,
    most severe first."""
    ws = state_of(ctx).workspace()
    scope = sync_registry(ws)
    t0 = time.perf_counter()
    ev = evidence_of(ws, version_ids)
    ran = names or scope
    findings = reg.run_analyzers(ev, ran)
    if record:
        by_version: dict[str, list[dict[str, Any]]] = {}
        for f in findings:
            for v in f.versions:
                by_version.setdefault(v, []).append(f.model_dump(mode="json"))
        for v, fs in by_version.items():
            ws.lineage.update_version(v, findings=fs)
    return _result(list(ev.versions), ran, findings, t0)


def run_analyzer_code(
    ctx: ToolContext,
    code: Annotated[str, Field(description="Python source. It reads the evidence files in $EVIDENCE_DIR "
                                           "(metrics.json, metrics.parquet, rollouts.parquet, evals.json, "
                                           "meta.json) and prints a JSON list of findings {kind, severity, "
                                           "versions, steps, evidence, explanation} as its last stdout line.",
                               min_length=1, max_length=200_000)],
    version_ids: VersionIds = None,
    timeout_s: Annotated[float, Field(description="Wall-clock limit, seconds.", gt=0, le=600)] = 60.0,
    memory_mb: Annotated[int, Field(description="Memory limit, MiB.", ge=64, le=16384)] = 1024,
    name: Annotated[str, Field(description="Label for the findings' analyzer field.")] = "sandboxed",
) -> AnalysisResult:
    """Run untrusted analyzer code in the sandbox (no network, read-only evidence, CPU / memory / time
    limits) and return the findings it prints."""
    ws = state_of(ctx).workspace()
    try:
        compile(code, "<analyzer>", "exec")
    except SyntaxError as exc:
        raise ToolError(f"code has a syntax error at line {exc.lineno}: {exc.msg}; fix it and retry") from None
    t0 = time.perf_counter()
    ev = evidence_of(ws, version_ids)
    findings = reg.run_analyzer_code(code, ev, name=name, timeout_s=timeout_s, memory_mb=memory_mb)
    return _result(list(ev.versions), [name], findings, t0, backend=sandbox_info().get("backend"), exit_code=0)


def register_analyzer(
    ctx: ToolContext,
    name: Annotated[str, Field(description="Unique snake_case name, e.g. 'reward_spike'.", min_length=1,
                               max_length=STORED_NAME_MAX)],
    code: Annotated[str, Field(description="Analyzer source (same contract as run_analyzer_code).",
                               min_length=1, max_length=200_000)],
    description: Annotated[str, Field(description="One line for listings.")] = "",
    kind: Annotated[str | None, Field(description="The finding kind it reports (shorthand for kinds=[kind]).")]
    = None,
    kinds: Annotated[list[str], Field(description="Finding kinds it reports.")] = [],  # noqa: B006
    replace: Annotated[bool, Field(description="Overwrite a runtime analyzer of the same name.")] = False,
    timeout_s: Annotated[float, Field(description="Sandbox wall-clock limit per run, seconds.", gt=0, le=600)]
    = 60.0,
    memory_mb: Annotated[int, Field(description="Sandbox memory limit, MiB.", ge=64, le=16384)] = 1024,
) -> AnalyzerInfo:
    """Register analyzer code (run sandboxed) so run_analyzer includes it; it is stored in the run and
    survives server restarts. Backtest it first (backtest_analyzer)."""
    ws = state_of(ctx).workspace()
    all_kinds = list(dict.fromkeys([*([kind] if kind else []), *kinds]))
    if len(all_kinds) > STORED_KINDS_MAX or any(len(k) > STORED_NAME_MAX for k in all_kinds):
        # review 14 B-R14: 380 kinds of 1,994 characters an analyzer made list_analyzers a 228 MiB reply
        raise ToolError(f"kinds: {len(all_kinds):,} finding kinds (the longest {max(map(len, all_kinds)):,} "
                        f"characters); an analyzer reports at most {STORED_KINDS_MAX} kinds of at most "
                        f"{STORED_NAME_MAX} characters each, snake_case names such as 'reward_spike'")
    entry = {"code": code, "kinds": all_kinds, "description": description, "timeout_s": timeout_s,
             "memory_mb": memory_mb}
    with REGISTRY_LOCK:  # the sync, the check of the name and the registration at once (review 12, K-R12)
        sync_registry(ws)
        before = reg.registry_snapshot().get(name)
        spec = reg.register_analyzer(name, code, kinds=tuple(all_kinds), description=description, replace=replace,
                                     timeout_s=timeout_s, memory_mb=memory_mb)
        try:
            # one read-modify-write in one write transaction (review 11, K-R11: kv_get -> change -> kv_set while two
            # tool calls ran at once lost 11 of 100 acknowledged registrations)
            ws.lineage.kv_update(KV_KEY, lambda stored: {**(stored or {}), name: entry}, expected=dict, fix=(
                "The run's registered analyzers are at the store's limit: replace one (same name, replace=True) "
                "or register shorter code"))
        except BaseException:  # not stored: not registered either (review 12, F-R12: on a full disk the analyzer
            reg.put_back_analyzer(name, before)  # stayed runnable in the process, unlisted, and a retry was refused)
            raise
    log_error = ws.log_after_commit(f"registered analyzer {name}", source="mcp")
    return AnalyzerInfo(name=spec.name, description=spec.description, kinds=list(spec.kinds), builtin=False,
                        sandboxed=True, log_error=log_error)

TOOLS = (list_analyzers, run_analyzer, run_analyzer_code, register_analyzer, *BACKTEST_TOOLS)
"""The analyzer server's tools in catalogue order: its own, then the backtest and gate tools."""
