"""MCP protocol details every EvoTrainer server shares (installed by :func:`install` from ``build_server``).

- ``prompts/get``: an unknown prompt, a missing or unknown argument, or an argument longer than
  :data:`MAX_PROMPT_ARGUMENT_CHARS` is JSON-RPC ``-32602`` (invalid params) with a message naming the fix, not
  ``0`` / ``-32603`` with a traceback in the server's stderr.
- Logging (spec 2025-11-25 "Logging"): the ``logging`` capability and ``logging/setLevel``; log
  records the server emits while it handles a request (tool failures, job messages) go to that
  client as ``notifications/message`` at or above its level (default ``warning``). Under 2026-07-28
  the SDK delivers them only when the request opts in (``_meta`` log level, SEP-2577). Server
  stderr gets one line per record (no tracebacks unless ``EVOTRAINER_DEBUG=1``).
- Completions (``completion/complete``): version ids for the prompt arguments and the
  ``lineage://version/{version_id}`` template.
- Per-version resources ``lineage://version/{version_id}`` with subscriptions: a legacy session's
  ``resources/subscribe`` and a 2026-07-28 ``subscriptions/listen`` both get
  ``notifications/resources/updated`` when a version changes (status, summaries, findings:
  its ``updated_at``), whoever changed it. Changes are looked for after every tool call and every
  :data:`POLL_S` seconds while a session is open.
- One capability set for both eras: ``initialize`` and ``server/discover`` answer the same
  capabilities, and ``server/discover`` lists every revision served (handshake and stateless).
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    Completion,
    CompletionsCapability,
    DiscoverResult,
    GetPromptRequestParams,
    LoggingCapability,
    PromptsCapability,
    RequestParams,
    ResourcesCapability,
    ServerCapabilities,
    SetLevelRequestParams,
    SubscribeRequestParams,
    ToolsCapability,
    UnsubscribeRequestParams,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from evotrainer.echo import closest_names, echo
from evotrainer.lineage import LineageError
from evotrainer.servers.common import ServerState, ToolContext, loop_limiter, state_of
from evotrainer.terminal import clip_text

VERSION_URI = "lineage://version/{version_id}"
VERSION_ARGS = ("version_id", "parent_id", "version_a", "version_b")  # arguments that take a version id
POLL_S = 2.0  # seconds between checks for versions changed by another process (a training job, the loop)
NOTIFY_TIMEOUT_S = 2.0  # a subscriber that does not take a notification within this long is forgotten
PROTOCOL_THREADS = 2  # worker threads for the reads of completions, prompts, resources and version checks
_PROTOCOL_LIMITER: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar("evotrainer_protocol")
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")  # RFC 5424
DEFAULT_LEVEL = "warning"
_PY_LEVEL = {"debug": logging.DEBUG, "info": logging.INFO, "notice": logging.INFO, "warning": logging.WARNING,
             "error": logging.ERROR, "critical": logging.CRITICAL, "alert": logging.CRITICAL,
             "emergency": logging.CRITICAL}
MAX_LOG_RECORD_CHARS = 2_000
"""Characters of a log record's message (and of its exception's text) on stderr and in ``notifications/message``:
the SDK logs an unknown tool's name whole (``Tool '<name>' not listed``): a 3.9 MB name made a 3.9 MB line."""
_captured: contextvars.ContextVar[list[logging.LogRecord] | None] = contextvars.ContextVar("mcp_log_capture",
                                                                                            default=None)


# --- stderr: one line per record -------------------------------------------------------------------
class OneLineFormatter(logging.Formatter):
    """``LEVEL logger: message (ExcType: text)``: an exception's type and text, not its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname} {record.name}: {echo(record.getMessage(), MAX_LOG_RECORD_CHARS)}"
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line += f" ({type(exc).__name__}: {echo(exc, MAX_LOG_RECORD_CHARS)})"
        return line.replace("\n", " ")


def one_line_stderr_logging() -> None:
    """Give the root logger a one-line stderr handler before the SDK installs its rich traceback one.

    The SDK's ``configure_logging`` calls ``logging.basicConfig``, which does nothing once the root
    logger has a handler. ``EVOTRAINER_DEBUG=1`` keeps full tracebacks.
    """
    root = logging.getLogger()
    if os.environ.get("EVOTRAINER_DEBUG") == "1" or any(isinstance(h, _OneLine) for h in root.handlers):
        return
    for h in list(root.handlers):  # the SDK's RichHandler (rich tracebacks, ~145 lines per error)
        if type(h).__name__ == "RichHandler":
            root.removeHandler(h)
    handler = _OneLine()
    handler.setFormatter(OneLineFormatter())
    handler.setLevel(logging.WARNING)
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.WARNING:
        root.setLevel(logging.WARNING)


class _OneLine(logging.StreamHandler):
    """The stderr handler :func:`one_line_stderr_logging` installs (a type to find it again)."""


class _CaptureHandler(logging.Handler):
    """Collects the records emitted while the current request is handled (a context variable)."""

    def emit(self, record: logging.LogRecord) -> None:
        buf = _captured.get()
        if buf is not None and not record.name.startswith(("mcp.shared", "mcp.server.lowlevel")):
            buf.append(record)


# --- reads off the event loop, two at a time ------------------------------------------------------
def protocol_limiter() -> anyio.CapacityLimiter:
    """This event loop's limiter of the worker threads that read the lineage for protocol requests (completions,
    prompts, resources, version checks): :data:`PROTOCOL_THREADS`, never anyio's default limiter.

    Review 5: on a run of 3,000 versions, 45 ``completion/complete`` (or ``prompts/get``) requests at once each read
    every version in a thread of the default limiter (the SDK's way to run a sync prompt or resource): 45 GIL-bound
    threads delayed a ping 4.7 s over stdio, whose reader and writer use that limiter too (tool bodies have their
    own slots, :data:`~evotrainer.servers.common.TOOL_SLOTS`). Two at a time keep the event loop answering.
    """
    return loop_limiter(_PROTOCOL_LIMITER, PROTOCOL_THREADS)


def off_loop(fn: Any) -> Any:
    """A sync prompt or resource function as an async one whose body runs in a :func:`protocol_limiter` thread
    (the SDK awaits an async function instead of running it in a default-limiter thread)."""

    @functools.wraps(fn)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=protocol_limiter())

    return wrapped


# --- version resources and change notifications --------------------------------------------------
class VersionWatcher:
    """Finds versions whose record changed and notifies their subscribers.

    ``fingerprint``: ``{version_id: updated_at}``. Legacy sessions subscribe per URI
    (``resources/subscribe``); 2026-07-28 listeners get :class:`ResourceUpdated` from the server's
    subscription bus (the SDK filters by the URIs each listen asked for).
    """

    def __init__(self, server: MCPServer[ServerState], state: ServerState):
        self.server = server
        self.state = state
        self.seen: dict[str, float] | None = None
        self.sessions: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()  # connection -> URIs
        self._lock = threading.Lock()

    def fingerprint(self) -> dict[str, float]:
        run = self.state.run_dir
        if run is None or not (run / "lineage.db").exists():
            return {}
        try:
            return self.state.workspace().lineage.version_stamps()  # (not versions(): E2-R16, seconds a look)
        except Exception:  # a run being created or a busy database: look again next time
            return self.seen or {}

    async def check(self) -> list[str]:
        """Notify about every version changed since the last check; returns their URIs."""
        now = await anyio.to_thread.run_sync(self.fingerprint, limiter=protocol_limiter())
        # A thread lock around the swap only, never across an await: one server object can serve sessions
        # on several event loops (in-process clients each run their own), and an anyio lock contended from
        # two loops never wakes its waiter. Whoever swaps a change in notifies it, exactly once.
        with self._lock:
            before, self.seen = self.seen, now
        if before is None:
            return []
        uris = [VERSION_URI.format(version_id=v) for v, t in now.items() if before.get(v) != t]
        for uri in uris:
            await self.server._subscriptions.publish(ResourceUpdated(uri=uri))
            for session, subs in list(self.sessions.items()):
                if uri in subs and not await _notify(session, uri):
                    self.sessions.pop(session, None)  # closed, or its reader stalled: forget it
        return uris

    async def poll(self) -> None:
        await self.check()  # the baseline the first change is measured against
        while True:
            await anyio.sleep(POLL_S)
            await self.check()


async def _notify(session: Any, uri: str) -> bool:
    """Send ``notifications/resources/updated`` for ``uri`` to a legacy subscriber; False when its session is closed
    or does not take it within :data:`NOTIFY_TIMEOUT_S`.

    Every check awaits these sends, and every write tool's reply awaits the check: a subscriber that stopped reading
    its GET stream (review 5: 3,002 URIs, a 4 KiB receive buffer, 2.8 MB queued on the socket) blocked the SDK's
    message router of its session, so the send never returned and another session's ``propose_intervention``
    was never answered (over 3 minutes; read-only tools, which skip the check, still were).
    """
    with anyio.move_on_after(NOTIFY_TIMEOUT_S):
        try:
            await session.send_resource_updated(uri)
            return True
        except Exception:  # a closed session
            return False
    return False


def lineage_version(ctx: ToolContext, version_id: str) -> str:
    """One version: recipe, interventions, status, checkpoint, metric / eval summaries, findings (JSON).
    Subscribe to be told when it changes."""
    try:
        v = state_of(ctx).workspace().lineage.get(version_id)
    except ToolError as exc:
        raise ResourceError(str(exc)) from None
    except LineageError as exc:
        raise ResourceNotFoundError(f"{exc}; complete the version_id argument or read lineage://tree") from None
    return json.dumps(v.model_dump(mode="json"), default=str)


# --- handlers --------------------------------------------------------------------------------------
def _capabilities() -> ServerCapabilities:
    """The one capability set of every era: tool and prompt lists never change (listChanged false);
    resources can be subscribed to (per-version updates); logging and completions are served."""
    return ServerCapabilities(prompts=PromptsCapability(list_changed=False),
                              resources=ResourcesCapability(subscribe=True, list_changed=False),
                              tools=ToolsCapability(list_changed=False), logging=LoggingCapability(),
                              completions=CompletionsCapability())


MAX_ERROR_MESSAGE_CHARS = 2_000  # characters of a protocol error's message (ours are under 1,000; the rest is echo)
MAX_PROMPT_ARGUMENT_CHARS = 64_000
"""Characters of one ``prompts/get`` argument: a version id is under 100, a diagnosis's findings (the longest real
argument: analyzer findings as text or JSON) fit in the budget of the lineage table a prompt carries
(``PROMPT_TABLE_MAX_CHARS``, about 16k tokens). Longer is refused with ``-32602`` naming the argument and this limit
(review 17: a 3 MB argument was copied into the prompt text whole, a 3 MB reply per request)."""


def install(server: MCPServer[ServerState], state: ServerState,
            read_only_tools: Iterable[str] = ()) -> VersionWatcher:
    """Install the handlers of the module docstring on ``server``; returns its version watcher.

    ``read_only_tools``: names of tools that never change a version (``read_only_hint``); a call of one is not
    followed by a lineage check (a full read of the versions table, ~0.4 ms of the ~0.8 ms in-process call of
    get_version: docs/performance.md). Changes other processes make are still found by the poll.
    """
    no_check = frozenset(read_only_tools)
    low = server._lowlevel_server
    watcher = VersionWatcher(server, state)
    levels: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
    capture = _CaptureHandler(level=logging.DEBUG)
    for name in ("evotrainer", "mcp"):
        lg = logging.getLogger(name)
        if not any(isinstance(h, _CaptureHandler) for h in lg.handlers):
            lg.addHandler(capture)
        lg.setLevel(min(lg.level or logging.WARNING, logging.INFO))  # tool failures (INFO) reach clients

    async def get_prompt(ctx: Any, params: GetPromptRequestParams) -> Any:
        prompts = {p.name: p for p in await server.list_prompts()}
        prompt = prompts.get(params.name)
        if prompt is None:
            known = ", ".join(prompts)
            close, _ = closest_names(params.name, prompts, n=3)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise MCPError(code=INVALID_PARAMS, message=f"unknown prompt {echo(params.name)!r}; {hint}prompts: {known}")
        missing = [a for a in prompt.arguments or [] if a.required and a.name not in (params.arguments or {})]
        if missing:
            raise MCPError(code=INVALID_PARAMS, message=f"prompt {echo(params.name)!r}: missing required argument "
                           + "; ".join(f"{a.name} ({a.description})" for a in missing))
        allowed = [a.name for a in prompt.arguments or []]
        unknown = [echo(k) for k in (params.arguments or {}) if k not in allowed]
        if unknown:  # (review 15 P-R15: answered a bare -32603 "Error rendering prompt" naming nothing)
            raise MCPError(code=INVALID_PARAMS, message=f"prompt {echo(params.name)!r}: unknown argument "
                           f"{', '.join(unknown[:5])}; allowed: {', '.join(allowed) or 'none'}")
        long = [(k, v) for k, v in (params.arguments or {}).items() if len(v) > MAX_PROMPT_ARGUMENT_CHARS]
        if long:
            k, v = long[0]
            raise MCPError(code=INVALID_PARAMS, message=f"prompt {echo(params.name)!r}: argument {k} is {len(v):,} "
                           f"characters, over the limit of {MAX_PROMPT_ARGUMENT_CHARS:,}; shorten it (findings: "
                           "their kinds, steps and evidence refs, not whole rollouts)")
        try:
            return await server._handle_get_prompt(ctx, params)
        except ValueError as exc:
            raise MCPError(code=INTERNAL_ERROR, message=f"prompt {echo(params.name)!r} failed: {exc}") from None

    async def set_level(ctx: Any, params: SetLevelRequestParams) -> dict[str, Any]:
        levels[_connection(ctx)] = params.level
        return {}

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> dict[str, Any]:
        watcher.sessions.setdefault(_connection(ctx), set()).add(str(params.uri))
        if watcher.seen is None:
            await watcher.check()  # the baseline the next change is measured against
        return {}

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> dict[str, Any]:
        watcher.sessions.get(_connection(ctx), set()).discard(str(params.uri))
        return {}

    async def discover(ctx: Any, params: Any) -> DiscoverResult:
        return DiscoverResult(supported_versions=[*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS],
                              capabilities=_capabilities(), instructions=server.instructions)

    low.add_request_handler("prompts/get", GetPromptRequestParams, get_prompt)
    low.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    low.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    low.add_request_handler("server/discover", RequestParams, discover)
    low.get_capabilities = lambda *a, **k: _capabilities()  # type: ignore[method-assign]  (initialize too)

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Completion | None:
        if argument.name not in VERSION_ARGS:
            return None
        ids = await anyio.to_thread.run_sync(lambda: list(watcher.fingerprint()), limiter=protocol_limiter())
        hits = [v for v in ids if v.startswith(argument.value or "")]
        return Completion(values=hits[:100], total=len(hits), has_more=len(hits) > 100)

    server.resource(VERSION_URI, name="lineage_version", title="One version of the lineage",
                    mime_type="application/json")(off_loop(lineage_version))

    async def middleware(ctx: Any, call_next: Any) -> Any:
        if ctx.request_id is None or ctx.method in ("initialize", "server/discover", "logging/setLevel"):
            return await call_next(ctx)
        if ctx.method == "tools/call" and watcher.seen is None:
            # The first tool call of a server: take the baseline before the tool writes, or its change is
            # folded into the baseline and never notified (the poll's own baseline may not have run yet).
            await watcher.check()
        buf: list[logging.LogRecord] = []
        token = _captured.set(buf)
        try:
            return await call_next(ctx)
        except MCPError as exc:  # an SDK error may repeat the caller's input whole (review 17: an unknown resource
            # URI of 3 MB came back as a 3,000,041-character error)
            if len(exc.message) <= MAX_ERROR_MESSAGE_CHARS:
                raise
            raise MCPError(code=exc.code, message=clip_text(exc.message, MAX_ERROR_MESSAGE_CHARS)) from None
        finally:
            _captured.reset(token)
            await _forward_logs(ctx, buf, levels)
            # only tools that write change versions (other processes: the poll)
            if ctx.method == "tools/call" and (ctx.params or {}).get("name") not in no_check:
                await watcher.check()

    low.middleware.append(middleware)
    return watcher


def _connection(ctx: Any) -> Any:
    """The client connection behind a request (``ctx.session`` is a per-request proxy; SDK 2.3)."""
    return getattr(ctx.session, "_connection", ctx.session)


async def _forward_logs(ctx: Any, records: list[logging.LogRecord], levels: Any) -> None:
    """Send the request's log records at or above the session's level as ``notifications/message``."""
    if not records:
        return
    try:
        session = ctx.session
        if getattr(session, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS:
            threshold = logging.DEBUG  # the request's own _meta log level filters (the SDK, SEP-2577)
        else:
            threshold = _PY_LEVEL[levels.get(_connection(ctx), DEFAULT_LEVEL)]
    except Exception:
        return
    for r in records:
        if r.levelno < threshold:
            continue
        level = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning",
                 logging.ERROR: "error"}.get(r.levelno, "critical")
        data = OneLineFormatter().format(r).split(": ", 1)[-1]
        try:
            with warnings.catch_warnings():  # the SDK marks logging deprecated for 2026-07-28 only
                warnings.simplefilter("ignore")
                await session.send_log_message(level, data, logger=r.name)
        except Exception:  # a closed session or a 2026 request that did not opt in
            return


def lifespan_with_watcher(inner: Any, holder: dict[str, VersionWatcher]) -> Any:
    """Wrap a lifespan so each session polls for version changes every :data:`POLL_S` seconds."""

    @asynccontextmanager
    async def lifespan(server: Any) -> AsyncIterator[Any]:
        async with inner(server) as ctx, anyio.create_task_group() as tg:
            if "watcher" in holder:
                tg.start_soon(holder["watcher"].poll)
            try:
                yield ctx
            finally:
                tg.cancel_scope.cancel()

    return lifespan


# --- streamable HTTP: a request with neither a session nor a protocol revision -----------------------
MAX_INSPECT_BYTES = 1 << 20  # bodies larger than this are passed on uninspected


class ProtocolVersionGuard:
    """ASGI middleware: a POST with no ``Mcp-Session-Id`` and no ``MCP-Protocol-Version`` header that is
    not ``initialize`` gets a JSON-RPC ``-32600`` naming both ways in, instead of the SDK's
    "Missing session ID" (which reads as if the 2026-07-28 stateless revision were not served).

    The request goes to the SDK unchanged (its Host, content-type and size checks keep their order);
    only the SDK's "Missing session ID" answer to such a request is rewritten.
    """

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        names = {k.lower() for k, _ in scope.get("headers", [])} if scope.get("type") == "http" else set()
        if scope.get("method") != "POST" or b"mcp-session-id" in names or b"mcp-protocol-version" in names:
            await self.app(scope, receive, send)
            return
        chunks: list[dict[str, Any]] = []
        size, more = 0, True
        while more and size <= MAX_INSPECT_BYTES:
            msg = await receive()
            chunks.append(msg)
            if msg["type"] != "http.request":
                break
            size += len(msg.get("body", b""))
            more = msg.get("more_body", False)
        req: Any = None
        if not more:
            try:
                req = json.loads(b"".join(c.get("body", b"") for c in chunks))
            except ValueError:
                req = None
        if not (isinstance(req, dict) and isinstance(req.get("method"), str) and req["method"] != "initialize"):
            req = None
        held: list[dict[str, Any]] = []

        async def replay() -> dict[str, Any]:
            return chunks.pop(0) if chunks else await receive()

        async def rewrite(msg: dict[str, Any]) -> None:
            if req is not None and msg["type"] == "http.response.start" and msg["status"] == 400 and not held:
                held.append(msg)
                return
            if held and msg["type"] == "http.response.body":
                start = held.pop()
                if b"Missing session ID" in msg.get("body", b"") and not msg.get("more_body"):
                    await _json_error(send, req.get("id"), _no_version_message(req["method"]))
                    return
                await send(start)
            await send(msg)

        await self.app(scope, replay, rewrite)


def _no_version_message(method: str) -> str:
    return (f"{method!r} without an MCP-Protocol-Version header or an Mcp-Session-Id: either send 'initialize' "
            f"first and then the Mcp-Session-Id it returns (revisions {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)}), "
            f"or set 'MCP-Protocol-Version: {MODERN_PROTOCOL_VERSIONS[-1]}' and the per-request _meta envelope "
            "(stateless; server/discover lists the revisions served)")


async def _json_error(send: Any, request_id: Any, message: str) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32600, "message": message}}).encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
