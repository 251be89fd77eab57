"""MCP client helpers: a synchronous, role-filtered handle on the EvoTrainer MCP tools.

The agents act only through MCP tools (docs/design.md §1). :class:`ToolBox` opens one
``mcp.Client`` session to a server (an in-process ``MCPServer`` built with
``evotrainer.servers.app.build_server(name, run_dir)``, or a stdio command) on a private event-loop
thread, so the synchronous orchestrator and the brains can call tools with
``toolbox.call(name, args)``. :class:`RoleTools` is the subset of tools one agent role may use
(:data:`ROLE_TOOLS`), and is what a brain sees.

Tool results are returned as their structured content (a dict); a tool error (``isError``) raises
:class:`ToolCallError` with the server's message, which says what to fix. The SDK client validates every
structured result against the tool's output schema; :func:`fast_result_validation` puts a compiled check in
front of its ``jsonschema`` validator (same accept / reject, same errors; docs/performance.md §4).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from evotrainer.errors import EvoTrainerError
from evotrainer.schema_check import FastAcceptValidator, compile_check

# Tools each agent role may call (docs/design.md §3). A tool the server lacks is simply absent.
ROLE_TOOLS: dict[str, tuple[str, ...]] = {
    "diagnostician": (
        "list_versions", "get_version", "sample_rollouts", "get_group", "group_stats", "search_rollouts",
        "compare_versions", "search_logs", "list_metrics", "get_metric_series", "metric_summary",
        "list_analyzers", "run_analyzer", "run_analyzer_code", "backtest_analyzer", "register_analyzer",
        "search_skills", "get_skill",
    ),
    "intervener": (
        "list_versions", "get_version", "diff_versions", "search_skills", "get_skill", "metric_summary",
        "group_stats",
    ),
    "backtester": (
        "list_versions", "get_version", "rescore_rollouts", "replay_filter", "check_inert", "backtest_analyzer",
        "group_stats", "metric_summary", "compare_versions",
    ),
    "decider": (
        "list_versions", "get_version", "gate_version", "compare_versions", "metric_summary", "run_analyzer",
    ),
}


LOOP_TOOLS: tuple[str, ...] = (
    "list_versions", "get_version", "create_root", "branch_control", "propose_intervention", "propose_recipe",
    "start_training", "job_status", "evaluate_version", "gate_version", "decide", "record_gains",
)
"""Tools the loop itself calls on the whole :class:`ToolBox` (``agents.loop.LoopBase`` and the modes): the run's
root, control arms, children, training, evaluation, the gate, decisions and recorded gains (a server without one
of them cannot drive a run: ``LoopError``). The brains see only their role's tools (:data:`ROLE_TOOLS`); the
memory tools the loop calls are optional (skipped when absent)."""


class ToolCallError(EvoTrainerError, RuntimeError):
    """A tool call failed: the server returned a tool error, or the tool does not exist."""

    def __init__(self, tool: str, message: str):
        super().__init__(f"{tool}: {message}")
        self.tool = tool
        self.message = message


def fast_result_validation(client: Any) -> bool:
    """Make an entered ``mcp.Client`` validate structured tool results with a compiled check first.

    The SDK's ``ClientSession`` builds one ``jsonschema`` validator per tool's output schema (cached, evicted when
    the tool's listed schema changes) and calls its ``iter_errors`` on every result. This wraps each such
    validator, once per validator object, in :class:`~evotrainer.schema_check.FastAcceptValidator`: a result the
    compiled check accepts is accepted at once (``jsonschema`` would accept it too), any other goes to the SDK's
    validator, so rejections and their messages are unchanged. A schema outside the compiled subset keeps the
    SDK's validator. Measured: ~10x less validation time for ``get_version`` / ``list_analyzers`` results.

    Returns:
        False (and changes nothing) when the SDK session has no such hook (an SDK release that moved it; the
        test suite checks it is there with the pinned SDK).
    """
    session = client.session
    sdk_validator = getattr(session, "_output_schema_validator", None)
    if sdk_validator is None or getattr(sdk_validator, "__fast__", False):
        return sdk_validator is not None
    wrapped: dict[str, tuple[Any, Any]] = {}

    def validator(name: str, output_schema: dict[str, Any]) -> Any:
        v = sdk_validator(name, output_schema)  # the SDK's cached validator (a bad schema raises as before)
        entry = wrapped.get(name)
        if entry is None or entry[0] is not v:
            check = compile_check(output_schema, format_asserted=getattr(v, "format_checker", None) is not None)
            entry = (v, FastAcceptValidator(v, check) if check is not None else v)
            wrapped[name] = entry
        return entry[1]

    validator.__fast__ = True  # type: ignore[attr-defined]
    session._output_schema_validator = validator
    return True


def _result_to_dict(result: Any) -> Any:
    """Structured content of a CallToolResult, else its text content parsed as JSON (or raw text)."""
    if getattr(result, "structured_content", None) is not None:
        sc = result.structured_content
        # MCPServer wraps non-object results as {"result": ...}
        return sc
    texts = [getattr(b, "text", "") for b in (result.content or []) if getattr(b, "type", "") == "text"]
    text = "\n".join(texts)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return {"text": text}


class ToolBox:
    """A live MCP client session, callable synchronously from any thread.

    Args:
        server: what ``mcp.Client`` connects to: an ``MCPServer`` instance (in-process), a
            ``StdioServerParameters`` (subprocess), or a streamable-HTTP URL.
        timeout_s: seconds allowed per tool call (training is started as an async job, so calls are short).

    Use as a context manager, or call :meth:`close`.

    Raises:
        ToolCallError: from :meth:`call` when the tool is unknown or returns a tool error.
    """

    def __init__(self, server: Any, timeout_s: float = 600.0):
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        self._ready: Future = Future()
        self._stop: asyncio.Event | None = None
        self._client: Any = None
        self._tools: dict[str, Any] = {}
        asyncio.run_coroutine_threadsafe(self._main(server), self._loop)
        err = self._ready.result(timeout=120)
        if err is not None:
            self._shutdown_loop()
            raise err

    async def _main(self, server: Any) -> None:
        from mcp import Client

        self._stop = asyncio.Event()
        try:
            async with Client(server, raise_exceptions=False) as client:
                fast_result_validation(client)
                self._client = client
                listed = await client.list_tools()
                self._tools = {t.name: t for t in listed.tools}
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 (reported to the caller of __init__)
            if not self._ready.done():
                self._ready.set_result(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout or self.timeout_s)

    # --- public API ------------------------------------------------------------------------------------
    @property
    def tool_names(self) -> list[str]:
        """Names of the tools the server lists."""
        return sorted(self._tools)

    def has(self, name: str) -> bool:
        """True when the server offers tool ``name``."""
        return name in self._tools

    def tool_specs(self, names: list[str] | tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """``[{name, description, input_schema}]`` of the listed tools (all when ``names`` is None)."""
        chosen = [n for n in (names or self.tool_names) if n in self._tools]
        return [{"name": n, "description": self._tools[n].description or "",
                 "input_schema": self._tools[n].input_schema or {"type": "object"}} for n in chosen]

    def call(self, name: str, args: dict[str, Any] | None = None, progress: Callable[..., Any] | None = None,
             timeout_s: float | None = None) -> Any:
        """Call tool ``name`` with ``args``; return its structured result (dict).

        Raises:
            ToolCallError: unknown tool, or the server answered with a tool error (message included).
        """
        if name not in self._tools:
            raise ToolCallError(name, f"no such tool on this server; available: {', '.join(self.tool_names)}")
        if not self._loop.is_running():  # closed: the call would wait for its whole timeout, then fail obscurely
            raise ToolCallError(name, "this ToolBox is closed; open a new one (or call inside its `with` block)")
        client = self._client

        async def _call() -> Any:
            cb = None
            if progress is not None:
                async def cb(p: float, total: float | None, message: str | None) -> None:
                    progress(p, total, message)
            return await client.call_tool(name, args or {}, progress_callback=cb)

        result = self._run(_call(), timeout_s)
        if result.is_error:
            texts = [getattr(b, "text", "") for b in (result.content or [])]
            raise ToolCallError(name, " ".join(t for t in texts if t) or "tool error")
        return _result_to_dict(result)

    def call_optional(self, name: str, args: dict[str, Any], log: Callable[[str], Any], *, what: str = "tool",
                      prefix: str = "") -> Any:
        """:meth:`call` where best effort is enough (memory, harness evolution): None when the tool is missing
        (``log`` gets ``{prefix}{what} NAME not available; skipped``) or answers with an error (``{prefix}NAME
        failed: MESSAGE``, the message cut to 200 characters)."""
        if not self.has(name):
            log(f"{prefix}{what} {name} not available; skipped")
            return None
        try:
            return self.call(name, args)
        except ToolCallError as exc:
            log(f"{prefix}{name} failed: {exc.message[:200]}")
            return None

    def _shutdown_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def close(self) -> None:
        """Close the session and stop the client thread."""
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        # give the session a moment to close cleanly
        try:
            self._run(asyncio.sleep(0.05), timeout=5)
        except Exception:  # noqa: BLE001
            pass
        self._shutdown_loop()

    def __enter__(self) -> ToolBox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RoleTools:
    """The tools of one agent role (:data:`ROLE_TOOLS`) on a :class:`ToolBox`, with a call log.

    Every call is appended to :attr:`trace` as ``{tool, args, ok, result|error}`` so the search trace
    of each decision can be stored in memory.
    """

    def __init__(self, toolbox: ToolBox, role: str):
        if role not in ROLE_TOOLS:
            raise ValueError(f"role={role!r}: allowed roles: {', '.join(ROLE_TOOLS)}")
        self.toolbox = toolbox
        self.role = role
        self.names = [n for n in ROLE_TOOLS[role] if toolbox.has(n)]
        self.trace: list[dict[str, Any]] = []

    def specs(self) -> list[dict[str, Any]]:
        """Tool specs (name, description, input_schema) of this role."""
        return self.toolbox.tool_specs(self.names)

    def has(self, name: str) -> bool:
        """True when this role may call ``name`` and the server offers it."""
        return name in self.names

    def call(self, name: str, args: dict[str, Any] | None = None) -> Any:
        """Call one of this role's tools (see :meth:`ToolBox.call`).

        Raises:
            ToolCallError: the tool is not one of this role's, or the call failed.
        """
        if name not in self.names:
            self.trace.append({"tool": name, "args": args or {}, "ok": False, "error": "not allowed"})
            raise ToolCallError(name, f"not a tool of the {self.role} role; its tools: {', '.join(self.names)}")
        try:
            out = self.toolbox.call(name, args)
        except ToolCallError as exc:
            self.trace.append({"tool": name, "args": args or {}, "ok": False, "error": exc.message})
            raise
        self.trace.append({"tool": name, "args": args or {}, "ok": True})
        return out
