"""Build the MCP servers: one per toolset, or all of them as one server (docs/design.md §3).

``build_server(name, run_dir)`` returns an ``MCPServer`` (official SDK 2.x) for ``training``,
``rollouts``, ``logs``, ``analyzers``, ``skills`` or ``all``. Each toolset module lists its tools,
module-level typed functions, in ``TOOLS`` (:data:`TOOLSETS`); they become SDK ``Tool`` objects
(:func:`~evotrainer.servers.common.make_tool`, with the titles and hints of :data:`TOOL_META`) that the
server is constructed with. Every server has a typed :class:`~evotrainer.servers.common.ServerState` as its
lifespan context, the tool ``server_info`` and the prompts ``diagnose_run`` and
``propose_next_intervention``; :mod:`evotrainer.servers.protocol` adds the protocol details (error codes,
logging, completions, per-version resources and subscriptions, one capability set for both protocol eras).
Transports live in :mod:`evotrainer.servers.http` (streamable HTTP with a bearer token) and
:func:`run_stdio`; both put :mod:`evotrainer.servers.envelope` in front of the SDK transport (every
malformed JSON-RPC message gets an error reply).
"""

from __future__ import annotations

import functools
import json
import signal
import threading
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, Field

from evotrainer.servers import analyzers, common, logs, protocol, rollouts, skills, training
from evotrainer.servers.common import (
    ServerState,
    ToolContext,
    ToolMeta,
    argument_error_middleware,
    make_lifespan,
    make_tool,
    prefer_the_event_loop,
    state_of,
)
from evotrainer.servers.envelope import exit_now, serve_stdio

ToolFn = Callable[..., Any]

TOOLSETS: dict[str, tuple[ToolFn, ...]] = {
    "training": training.TOOLS,
    "rollouts": rollouts.TOOLS,
    "logs": logs.TOOLS,
    "analyzers": analyzers.TOOLS,
    "skills": skills.TOOLS,
}
"""The tools of each toolset, in catalogue order."""

SERVER_NAMES: tuple[str, ...] = (*TOOLSETS, "all")

INSTRUCTIONS = {
    "training": "Training control of an EvoTrainer run: versions (lineage), recipe diffs, proposing single-factor "
                "interventions, training / evaluation jobs with progress, keep / prune / revert / merge decisions; "
                "the run's root, control arms, multi-field children (search baselines) and recorded gains.",
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
TOOL_META: dict[str, ToolMeta] = {
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
    "create_root": ("Create the run's root version (find-or-create)", False, False, True),
    "branch_control": ("Branch the control arm of a version (find-or-create)", False, False, True),
    "propose_recipe": ("Propose a multi-field recipe (new child version)", False, False, False),
    "record_gains": ("Record a version's gate gains in its eval summary", False, True, True),
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


class GuardedMCPServer(MCPServer[ServerState]):
    """``MCPServer`` whose stdio transport answers malformed JSON-RPC envelopes (:func:`envelope.serve_stdio`)."""

    # what ends this process's training jobs at its exit (the state's job manager; the state itself stays the
    # lifespan context, not a server attribute)
    stop_jobs: Callable[[], list] | None = None

    async def run_stdio_async(self) -> None:
        prefer_the_event_loop()
        # at EOF the requests already read get the grace period to be answered first (review 11, K-R11)
        # and whatever blocks (a client that stopped reading stdout: review 12, Y-R12), the process ends at most
        # the drain, the tool threads' grace and 5 s after EOF
        exit_after_s = 2 * common.STDIO_EOF_GRACE_S + 5.0
        async with anyio.create_task_group() as tg:
            if threading.current_thread() is threading.main_thread():
                tg.start_soon(_end_on_sigterm, tg.cancel_scope, exit_after_s)
            await serve_stdio(self, eof_drain_s=common.STDIO_EOF_GRACE_S, exit_after_s=exit_after_s)
            tg.cancel_scope.cancel()
        # The client closed stdin (review 10, W-R10). Stop this process's jobs (marked interrupted): a training
        # thread still running into the interpreter's teardown aborted it (SIGABRT) and left its row 'running'.
        left = self.stop_jobs() if self.stop_jobs is not None else []
        # The SDK has cancelled the calls in flight, but their tool threads run on, and the interpreter's exit
        # waited for them: a sandbox of up to 600 s kept the server alive after its client left. They get a grace
        # period; then the process ends without waiting (a job row left 'running' is marked interrupted at the
        # next open; an evidence copy or sandbox folder is swept by owner; a sandbox dies with its parent).
        end = time.monotonic() + common.STDIO_EOF_GRACE_S
        while common.tool_threads() and time.monotonic() < end:
            await anyio.sleep(0.05)
        common.exit_if_busy(left)


async def _end_on_sigterm(serving: anyio.CancelScope, exit_after_s: float) -> None:
    """At SIGTERM, end the stdio serving (``serving`` cancelled: the calls in flight are cancelled, the server's exit
    path stops the jobs, marked interrupted) and arm the watchdog that ends the process ``exit_after_s`` later
    whatever blocks. Before, SIGTERM's default action killed the process where it stood: a job row stayed 'running'
    until the next open (the HTTP server unwinds since review 10's W-R10 residue; stdio did not)."""
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            watchdog = threading.Timer(exit_after_s, exit_now)
            watchdog.daemon = True
            watchdog.start()
            serving.cancel()
            return


def build_server(name: str, run_dir: str | Path | None = None, *, backend: str = "local") -> GuardedMCPServer:
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
    sets = list(TOOLSETS) if name == "all" else [name]
    state = ServerState(Path(run_dir) if run_dir else None, backend_name=backend, server_name=f"evotrainer-{name}",
                        toolsets=tuple(sets))
    instructions = " ".join(INSTRUCTIONS[s] for s in sets)
    tools = [make_tool(fn, TOOL_META.get(fn.__name__)) for s in sets for fn in TOOLSETS[s]]
    tools += [make_tool(fn, TOOL_META.get(fn.__name__)) for fn in TOOLS]
    protocol.one_line_stderr_logging()  # before the SDK's rich handler (basicConfig keeps the first)
    holder: dict[str, protocol.VersionWatcher] = {}
    server = GuardedMCPServer(f"evotrainer-{name}", instructions=instructions, tools=tools,
                              lifespan=protocol.lifespan_with_watcher(make_lifespan(state), holder),
                              log_level="WARNING", version=_version())
    server.stop_jobs = state.jobs.shutdown
    if "training" in sets:
        training.register(server, state)
    server.middleware.append(argument_error_middleware(tools))
    for prompt in PROMPTS:
        server.prompt()(protocol.off_loop(prompt))  # reads the lineage in a protocol thread
    holder["watcher"] = protocol.install(server, state, [t.name for t in tools if t.annotations
                                                         and t.annotations.read_only_hint])
    return server


@functools.cache
def _version() -> str:
    """The installed package's version (read once: ``importlib.metadata`` parses the METADATA file, ~1 ms)."""
    try:
        return version("evotrainer")
    except PackageNotFoundError:
        return "0"


def _lineage_table(state: ServerState) -> str:
    try:
        ws = state.workspace()
    except Exception as exc:
        return f"(run not available: {exc})"
    rows, size = [], 0
    versions = ws.lineage.versions()
    for i, v in enumerate(versions):
        # (review 15 E-R15: every intervention of 62 versions of 2,000 was a 54 MiB prompt): 5 interventions a row,
        # the table at PROMPT_TABLE_MAX_CHARS
        ivs = "; ".join(iv.describe() for iv in v.interventions[:5]) or "base"
        if len(v.interventions) > 5:
            ivs += f"; ... {len(v.interventions) - 5} more"
        if size > PROMPT_TABLE_MAX_CHARS:
            rows.append(f"- ... {len(versions) - i} more versions (list_versions pages through them)")
            break
        ev = v.eval_summary.get("avg@k")
        rew = v.metrics_summary.get("reward/mean")
        rows.append(f"- {v.id} (parent {v.parent_id}) {v.status}: {ivs}"
                    + (f"; Avg@k={ev:.3f}" if isinstance(ev, (int, float)) else "")
                    + (f"; reward/mean={rew:.3f}" if isinstance(rew, (int, float)) else ""))
        size += len(rows[-1])
    return "\n".join(rows) or "(empty lineage)"


PROMPT_TABLE_MAX_CHARS = 64_000
"""Characters of the lineage table a prompt carries (about 16k tokens of a model's context)."""


class ServerInfo(BaseModel):
    """What this server is and what it acts on."""

    server: str = Field(description="Server name, e.g. evotrainer-all.")
    version: str = Field(description="EvoTrainer version.")
    toolsets: list[str]
    run_dir: str | None = Field(description="Run folder the tools act on (null: none given).")
    run_exists: bool = Field(description="The run folder has a lineage database.")
    backend: str = Field(description="Training backend of start_training / evaluate_version.")
    running_jobs: list[str] = Field(description="Jobs running in this server process.")


async def server_info(ctx: ToolContext) -> ServerInfo:
    """Which EvoTrainer server this is, its run folder and running jobs: a cheap health check."""
    st = state_of(ctx)
    return ServerInfo(server=st.server_name, version=_version(), toolsets=list(st.toolsets),
                      run_dir=str(st.run_dir) if st.run_dir else None,
                      run_exists=bool(st.run_dir and (st.run_dir / "lineage.db").exists()),
                      backend=st.backend_name, running_jobs=[j.id for j in st.jobs.running()])


TOOLS = (server_info,)
"""The tools every server has, after its toolsets' tools."""


def diagnose_run(
    ctx: ToolContext,
    version_id: Annotated[str | None, Field(description="Version to diagnose (default: the latest trained).")]
    = None,
) -> str:
    """Diagnose a trained version: read its metrics, rollouts and logs, run analyzers, and report findings
    with evidence."""
    target = version_id or "the most recently trained version"
    return (
        f"Diagnose {target} of this EvoTrainer run.\n\nLineage now:\n{_lineage_table(state_of(ctx))}\n\n"
        "Steps: (1) metric_summary and get_metric_series for reward/mean, reward/frac_zero_std, policy/entropy, "
        "completions/mean_length, completions/clipped_ratio, policy/kl; (2) group_stats and sample_rollouts "
        "(look at zero-variance groups, truncated completions, high-reward completions that look wrong); "
        "(3) list_analyzers then run_analyzer on the version; (4) search_logs for warnings and errors. "
        "Report each finding as: kind, severity (info | warn | blocking), steps, evidence refs (metric "
        "names, rollout ids), and a one-line explanation. Do not propose fixes yet."
    )


def propose_next_intervention(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="Parent version of the next child.")],
    findings: Annotated[str, Field(description="Findings of the diagnosis (text or JSON, at most "
                                             f"{protocol.MAX_PROMPT_ARGUMENT_CHARS:,} characters).")] = "",
) -> str:
    """Propose the next single-factor intervention on a version from its findings and the skill memory."""
    return (
        f"Propose the next intervention on {version_id}.\n\nLineage now:\n{_lineage_table(state_of(ctx))}\n\n"
        f"Findings:\n{findings or '(run diagnose_run first, or call run_analyzer)'}\n\n"
        "Steps: (1) search_skills with the finding kinds; (2) pick ONE recipe path to change (single factor), "
        "with a hypothesis and the metric expected to move; (3) where possible backtest it first "
        "(rescore_rollouts for a reward change, replay_filter for a filter change); (4) call "
        "propose_intervention(parent_id, path, new_value, hypothesis, expected_metric, expected_direction, "
        "source='skill:<id>'). Avoid interventions already tried in the lineage above."
    )


PROMPTS = (diagnose_run, propose_next_intervention)
"""The prompts every server has."""


def run_stdio(name: str, run_dir: str | Path | None, backend: str = "local") -> None:
    """Serve ``name`` over stdio until the client closes the pipe."""
    build_server(name, run_dir, backend=backend).run("stdio")


def describe(name: str) -> str:
    """JSON list of the tools of a server (name and first line of the description), for docs and --json."""
    server = build_server(name, None)
    tools = anyio.run(server.list_tools)
    return json.dumps([{"name": t.name, "description": (t.description or "").strip().splitlines()[0]}
                       for t in tools], indent=2)
