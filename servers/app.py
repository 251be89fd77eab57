"""Build the MCP servers: one per toolset, or all of them as one server (docs/design.md §3).

``build_server(name, run_dir)`` returns an ``MCPServer`` (official SDK 2.x) for ``training``,
``rollouts``, ``logs``, ``analyzers``, ``skills`` or ``all``. Each server has the shared
:class:`~evotrainer.servers.common.ServerState` as its lifespan context and the prompts
``diagnose_run`` and ``propose_next_intervention``; :mod:`evotrainer.servers.protocol` adds the
protocol details (error codes, logging, completions, per-version resources and subscriptions,
one capability set for both protocol eras). Transports live in :mod:`evotrainer.servers.http`
(streamable HTTP with a bearer token) and :func:`run_stdio`; both put
:mod:`evotrainer.servers.envelope` in front of the SDK transport (every malformed JSON-RPC message gets an
error reply).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Annotated

from evotrainer.servers.common import ServerState, argument_error_middleware, make_lifespan, tool
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, Field

TOOLSETS: dict[str, str] = {
    "training": "evotrainer.servers.training",
    "rollouts": "evotrainer.servers.rollouts",
    "logs": "evotrainer.servers.logs",
    "analyzers": "evotrainer.servers.analyzers",
    "skills": "evotrainer.servers.skills",
}
SERVER_NAMES: tuple[str, ...] = (*TOOLSETS, "all")

INSTRUCTIONS = {
    "training": "Training control of an EvoTrainer run: versions (lineage), recipe diffs, proposing single-factor "
                "interventions, training / evaluation jobs with progress, keep / prune / revert / merge decisions.",
    "rollouts": "Rollout inspection of an EvoTrainer run: sample and filter rollouts, groups and their reward "
                "variance, full-text search, side-by-side comparison of versions on the same prompts.",
    "logs": "Log and metric search of an EvoTrainer run: run log records, metric names, downsampled series, "
            "summaries (trend, last values).",
    "analyzers": "Diagnostic analyzers of an EvoTrainer run: run built-in analyzers, run sandboxed analyzer code, "
                 "register and backtest analyzers, re-score rollouts, replay filters, the promotion gate.",
    "skills": "EvoTrainer's skill memory: search, read and add skills (interventions, analyzers), record outcomes, "
              "failed cases and search traces.",
}


# Title and behaviour hints of every tool (MCP ``Tool.title`` and ``ToolAnnotations``, spec 2025-11-25):
# ``{name: (title, read_only, destructive, idempotent)}``. readOnlyHint: the tool changes nothing;
# destructiveHint: it may discard or overwrite state (prune / revert a version, stop a job, replace a
# stored analyzer, skill or findings); idempotentHint: calling it again with the same arguments has
# no further effect. No tool reaches outside the run and the skill memory (openWorldHint false).
TOOL_META: dict[str, tuple[str, bool, bool, bool]] = {
    # training
    "list_versions": ("List versions", True, False, True),
    "get_version": ("Get a version", True, False, True),
    "diff_versions": ("Diff two versions' recipes", True, False, True),
    "propose_intervention": ("Propose an intervention (new child version)", False, False, False),
    "start_training": ("Start training a version", False, False, False),
    "evaluate_version": ("Evaluate a version on the held-out set", False, False, False),
    "job_status": ("Job status and progress", True, False, True),
    "list_jobs": ("List jobs", True, False, True),
    "cancel_job": ("Cancel a job", False, True, True),
    "decide": ("Decide: keep, prune, revert or merge a version", False, True, False),
    # rollouts
    "sample_rollouts": ("Sample rollouts", True, False, True),
    "get_group": ("Get a group of samples", True, False, True),
    "group_stats": ("Group statistics per step", True, False, True),
    "search_rollouts": ("Search rollouts (full text)", True, False, True),
    "compare_versions": ("Compare two versions on the same prompts", True, False, True),
    # logs
    "search_logs": ("Search the run log", True, False, True),
    "list_metrics": ("List metrics", True, False, True),
    "get_metric_series": ("Get a metric series", True, False, True),
    "metric_summary": ("Summarise a version's metrics", True, False, True),
    # analyzers
    "list_analyzers": ("List analyzers", True, False, True),
    "run_analyzer": ("Run analyzers (record=true overwrites stored findings)", False, True, True),
    "run_analyzer_code": ("Run analyzer code in the sandbox", False, False, True),
    "register_analyzer": ("Register an analyzer (replace=true overwrites one)", False, True, True),
    "rescore_rollouts": ("Re-score rollouts under a changed reward", True, False, True),
    "replay_filter": ("Replay a changed group filter", True, False, True),
    "backtest_analyzer": ("Backtest an analyzer", True, False, True),
    "check_inert": ("Check whether an intervention can act (inert-change backtest)", True, False, True),
    "gate_version": ("Promotion gate (held-out gain and CI)", True, False, True),
    # skills
    "search_skills": ("Search skills", True, False, True),
    "get_skill": ("Get a skill", True, False, True),
    "add_skill": ("Add a skill (replace=true overwrites one)", False, True, True),
    "record_skill_outcome": ("Record a skill's outcome", False, False, False),
    "add_failed_case": ("Remember a failed case", False, False, False),
    "add_search_trace": ("Log a search trace", False, False, False),
    "add_version_summary": ("Remember a version's outcome and features", False, False, False),
    "list_version_summaries": ("List remembered version summaries", True, False, True),
    # every server
    "server_info": ("Server info (health check)", True, False, True),
}


def _apply_tool_meta(server: MCPServer) -> None:
    """Set each registered tool's title and annotations from :data:`TOOL_META`.

    A tool without an entry keeps the hints its ``@tool`` decorator gave (tests/test_mcp_protocol.py
    fails until it has one).
    """
    from mcp_types import ToolAnnotations

    for t in server._tool_manager.list_tools():  # SDK: list_tools reads these fields live
        if t.name not in TOOL_META:
            continue
        title, read_only, destructive, idempotent = TOOL_META[t.name]
        t.title = title
        t.annotations = ToolAnnotations(title=title, read_only_hint=read_only, destructive_hint=destructive,
                                        idempotent_hint=idempotent, open_world_hint=False)


class GuardedMCPServer(MCPServer):
    """``MCPServer`` whose stdio transport answers malformed JSON-RPC envelopes (:func:`envelope.serve_stdio`)."""

    async def run_stdio_async(self) -> None:
        from evotrainer.servers.envelope import serve_stdio

        await serve_stdio(self)


def build_server(name: str, run_dir: str | Path | None = None, *, backend: str = "local") -> MCPServer:
    """An MCP server with the tools of ``name`` (one toolset or ``all``) over the run in ``run_dir``.

    Args:
        name: ``training`` | ``rollouts`` | ``logs`` | ``analyzers`` | ``skills`` | ``all``.
        run_dir: the run folder (a workspace made by ``evotrainer init`` / ``run``); tools that need a
            run return a tool error when it is missing. The skills server works without one.
        backend: training backend for start_training / evaluate_version (``local`` | ``openrlhf``).

    Raises:
        ValueError: unknown server name.
    """
    if name not in SERVER_NAMES:
        raise ValueError(f"server {name!r}: choose one of {', '.join(SERVER_NAMES)}")
    from evotrainer.servers import protocol

    state = ServerState(run_dir)
    state.extras["backend_name"] = backend
    sets = list(TOOLSETS) if name == "all" else [name]
    instructions = " ".join(INSTRUCTIONS[s] for s in sets)
    protocol.one_line_stderr_logging()  # before the SDK's rich handler (basicConfig keeps the first)
    holder: dict[str, protocol.VersionWatcher] = {}
    server = GuardedMCPServer(f"evotrainer-{name}", instructions=instructions,
                       lifespan=protocol.lifespan_with_watcher(make_lifespan(state), holder),
                       log_level="WARNING", version=_version())
    for s in sets:
        importlib.import_module(TOOLSETS[s]).register(server, state)
    _add_server_info(server, state, name, sets)
    _apply_tool_meta(server)
    server.middleware.append(argument_error_middleware(server))
    _add_prompts(server, state)
    holder["watcher"] = protocol.install(server, state)
    server.evotrainer_state = state  # type: ignore[attr-defined]  (tests and the CLI reach jobs through it)
    return server


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("evotrainer")
    except Exception:
        return "0"


def _lineage_table(state: ServerState) -> str:
    try:
        ws = state.workspace()
    except Exception as exc:
        return f"(run not available: {exc})"
    rows = []
    for v in ws.lineage.versions():
        ivs = "; ".join(iv.describe() for iv in v.interventions) or "base"
        ev = v.eval_summary.get("avg@k")
        rew = v.metrics_summary.get("reward/mean")
        rows.append(f"- {v.id} (parent {v.parent_id}) {v.status}: {ivs}"
                    + (f"; Avg@k={ev:.3f}" if isinstance(ev, (int, float)) else "")
                    + (f"; reward/mean={rew:.3f}" if isinstance(rew, (int, float)) else ""))
    return "\n".join(rows) or "(empty lineage)"


class ServerInfo(BaseModel):
    """What this server is and what it acts on."""

    server: str = Field(description="Server name, e.g. evotrainer-all.")
    version: str = Field(description="EvoTrainer version.")
    toolsets: list[str]
    run_dir: str | None = Field(description="Run folder the tools act on (null: none given).")
    run_exists: bool = Field(description="The run folder has a lineage database.")
    backend: str = Field(description="Training backend of start_training / evaluate_version.")
    running_jobs: list[str] = Field(description="Jobs running in this server process.")


def _add_server_info(server: MCPServer, state: ServerState, name: str, sets: list[str]) -> None:
    @tool(server)
    async def server_info() -> ServerInfo:
        """Which EvoTrainer server this is, its run folder and running jobs: a cheap health check."""
        return ServerInfo(server=f"evotrainer-{name}", version=server.version, toolsets=sets,
                          run_dir=str(state.run_dir) if state.run_dir else None,
                          run_exists=bool(state.run_dir and (state.run_dir / "lineage.db").exists()),
                          backend=state.extras.get("backend_name", "local"),
                          running_jobs=[j.id for j in state.jobs.running()] if state.jobs else [])


def _add_prompts(server: MCPServer, state: ServerState) -> None:
    @server.prompt()
    def diagnose_run(
        version_id: Annotated[str | None, Field(description="Version to diagnose (default: the latest trained).")]
        = None,
    ) -> str:
        """Diagnose a trained version: read its metrics, rollouts and logs, run analyzers, and report findings
        with evidence."""
        target = version_id or "the most recently trained version"
        return (
            f"Diagnose {target} of this EvoTrainer run.\n\nLineage now:\n{_lineage_table(state)}\n\n"
            "Steps: (1) metric_summary and get_metric_series for reward/mean, reward/frac_zero_std, policy/entropy, "
            "completions/mean_length, completions/clipped_ratio, policy/kl; (2) group_stats and sample_rollouts "
            "(look at zero-variance groups, truncated completions, high-reward completions that look wrong); "
            "(3) list_analyzers then run_analyzer on the version; (4) search_logs for warnings and errors. "
            "Report each finding as: kind, severity (info | warn | blocking), steps, evidence refs (metric "
            "names, rollout ids), and a one-line explanation. Do not propose fixes yet."
        )

    @server.prompt()
    def propose_next_intervention(
        version_id: Annotated[str, Field(description="Parent version of the next child.")],
        findings: Annotated[str, Field(description="Findings of the diagnosis (text or JSON).")] = "",
    ) -> str:
        """Propose the next single-factor intervention on a version from its findings and the skill memory."""
        return (
            f"Propose the next intervention on {version_id}.\n\nLineage now:\n{_lineage_table(state)}\n\n"
            f"Findings:\n{findings or '(run diagnose_run first, or call run_analyzer)'}\n\n"
            "Steps: (1) search_skills with the finding kinds; (2) pick ONE recipe path to change (single factor), "
            "with a hypothesis and the metric expected to move; (3) where possible backtest it first "
            "(rescore_rollouts for a reward change, replay_filter for a filter change); (4) call "
            "propose_intervention(parent_id, path, new_value, hypothesis, expected_metric, expected_direction, "
            "source='skill:<id>'). Avoid interventions already tried in the lineage above."
        )


def run_stdio(name: str, run_dir: str | Path | None, backend: str = "local") -> None:
    """Serve ``name`` over stdio until the client closes the pipe."""
    build_server(name, run_dir, backend=backend).run("stdio")


def describe(name: str) -> str:
    """JSON list of the tools of a server (name and first line of the description), for docs and --json."""
    import anyio

    server = build_server(name, None)
    tools = anyio.run(server.list_tools)
    return json.dumps([{"name": t.name, "description": (t.description or "").strip().splitlines()[0]}
                       for t in tools], indent=2)
