"""Analyzer tools: the diagnostic harness over the run's evidence (``harness/``, docs/interfaces.md).

Tools: ``list_analyzers``, ``run_analyzer`` (registered analyzers over ``Evidence.from_workspace``),
``run_analyzer_code`` (untrusted code in ``evotrainer.sandbox``, evidence mounted read-only),
``register_analyzer`` (kept in the run's lineage store, re-registered in every server process),
plus ``backtest_analyzer``, ``rescore_rollouts``, ``replay_filter`` and ``gate_version``
(:mod:`evotrainer.servers.backtests`).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from evotrainer.servers.common import ServerState, require_version, state_of, tool
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

KV_KEY = "analyzers/registered"  # {name: {code, kinds, description, timeout_s, memory_mb}}
VersionIds = Annotated[list[str] | None, Field(description="Versions to analyze (default: all versions of the run).")]


class AnalyzerInfo(BaseModel):
    """A registered analyzer."""

    name: str
    description: str
    kinds: list[str] = Field(description="Finding kinds it reports.")
    builtin: bool
    sandboxed: bool = Field(description="Runtime analyzer code run in the sandbox.")


class AnalyzerList(BaseModel):
    """All registered analyzers, built-ins first."""

    analyzers: list[AnalyzerInfo]


class FindingInfo(BaseModel):
    """One finding: a failure kind seen in some versions over some steps (harness/findings.py)."""

    kind: str
    severity: str = Field(description="info | warn | blocking")
    versions: list[str]
    steps: list[int]
    evidence: list[str] = Field(description="Metric names and rollout:<id> references.")
    explanation: str
    analyzer: str
    data: dict[str, Any] = Field(default_factory=dict)
    judged: str | None = Field(None, description="level (one step shows it) | change (start vs end, around a "
                                                 "spike, vs the parent) | trend (a drift over many steps)")
    damages_weights: bool = Field(False, description="The finding means its versions' weights are damaged.")


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


def finding_info(f: Any) -> FindingInfo:
    """A :class:`FindingInfo` from a harness ``Finding``."""
    return FindingInfo(**f.model_dump(mode="json"))


def evidence_of(ws: Any, version_ids: list[str] | None) -> Any:
    """``Evidence.from_workspace`` for the given versions (each checked first)."""
    from evotrainer.harness.evidence import Evidence

    if version_ids is not None:
        if not version_ids:
            raise ToolError("version_ids is empty; pass at least one version id, or omit it for all versions")
        for v in version_ids:
            require_version(ws, v)
    return Evidence.from_workspace(ws, version_ids)


def sync_registry(ws: Any) -> list[str]:
    """Register, in this process, the runtime analyzers stored in the run (idempotent).

    Returns the analyzers in scope for this run: the built-ins and the run's own runtime analyzers. The process
    registry may hold runtime analyzers of other runs (several runs served by one process); they are not in scope.
    """
    from evotrainer.harness import analyzers as reg

    stored = ws.lineage.kv_get(KV_KEY, {}) or {}
    known = {s.name for s in reg.list_analyzers()}
    for name, spec in stored.items():
        if name not in known:
            reg.register_analyzer(name, spec["code"], kinds=tuple(spec.get("kinds", ())),
                                  description=spec.get("description", ""), timeout_s=spec.get("timeout_s", 60.0),
                                  memory_mb=spec.get("memory_mb", 1024))
    return [s.name for s in reg.list_analyzers(builtin=True)] + sorted(stored)


def _result(versions: list[str], names: list[str], findings: list[Any], t0: float, **extra: Any) -> AnalysisResult:
    infos = [finding_info(f) for f in findings]
    return AnalysisResult(versions=versions, analyzers=names, findings=infos,
                          n_blocking=sum(f.severity == "blocking" for f in infos),
                          n_warn=sum(f.severity == "warn" for f in infos), wall_s=round(time.perf_counter() - t0, 4),
                          **extra)


def register(server: MCPServer, state: ServerState) -> None:
    """Add the analyzer tools to ``server`` (and the backtest / gate tools where the harness has them)."""

    @tool(server)
    def list_analyzers(ctx: Context) -> AnalyzerList:
        """List the registered analyzers (built-ins and runtime ones) with the finding kinds they report."""
        from evotrainer.harness import analyzers as reg

        st = state_of(ctx)
        scope = [s.name for s in reg.list_analyzers(builtin=True)]
        if st.run_dir is not None:
            try:
                scope = sync_registry(st.workspace())
            except ToolError:
                pass  # no run yet: built-ins only
        return AnalyzerList(analyzers=[
            AnalyzerInfo(name=s.name, description=s.description, kinds=list(s.kinds), builtin=s.builtin,
                         sandboxed=s.code is not None) for s in (reg.get_analyzer(n) for n in scope)])

    @tool(server, read_only=False)
    def run_analyzer(
        ctx: Context,
        version_ids: VersionIds = None,
        names: Annotated[list[str] | None, Field(description="Analyzers to run (default: all registered).")] = None,
        record: Annotated[bool, Field(description="Store the findings on each version they cover "
                                                  "(get_version shows them).")] = False,
    ) -> AnalysisResult:
        """Run registered analyzers on the run's evidence (metrics, rollouts, evals) and return the findings,
        most severe first."""
        from evotrainer.harness import analyzers as reg

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

    @tool(server, read_only=False)
    def run_analyzer_code(
        ctx: Context,
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
        from evotrainer.harness import analyzers as reg

        from evotrainer.sandbox import sandbox_info

        ws = state_of(ctx).workspace()
        try:
            compile(code, "<analyzer>", "exec")
        except SyntaxError as exc:
            raise ToolError(f"code has a syntax error at line {exc.lineno}: {exc.msg}; fix it and retry") from None
        t0 = time.perf_counter()
        ev = evidence_of(ws, version_ids)
        findings = reg.run_analyzer_code(code, ev, name=name, timeout_s=timeout_s, memory_mb=memory_mb)
        return _result(list(ev.versions), [name], findings, t0, backend=sandbox_info().get("backend"), exit_code=0)

    @tool(server, read_only=False)
    def register_analyzer(
        ctx: Context,
        name: Annotated[str, Field(description="Unique snake_case name, e.g. 'reward_spike'.", min_length=1,
                                   max_length=64)],
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
        from evotrainer.harness import analyzers as reg

        ws = state_of(ctx).workspace()
        sync_registry(ws)
        all_kinds = list(dict.fromkeys([*([kind] if kind else []), *kinds]))
        spec = reg.register_analyzer(name, code, kinds=tuple(all_kinds), description=description, replace=replace,
                                     timeout_s=timeout_s, memory_mb=memory_mb)
        stored = ws.lineage.kv_get(KV_KEY, {}) or {}
        stored[name] = {"code": code, "kinds": all_kinds, "description": description, "timeout_s": timeout_s,
                        "memory_mb": memory_mb}
        ws.lineage.kv_set(KV_KEY, stored)
        ws.log(f"registered analyzer {name}", source="mcp")
        return AnalyzerInfo(name=spec.name, description=spec.description, kinds=list(spec.kinds), builtin=False,
                            sandboxed=True)

    from evotrainer.servers import backtests

    backtests.register(server, state)
