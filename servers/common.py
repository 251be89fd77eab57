"""Shared plumbing of the MCP servers: the typed server state (lifespan context), tool construction, error
mapping, argument bounds, pagination.

Every toolset module (``training``, ``rollouts``, ``logs``, ``analyzers`` with ``backtests``, ``skills``)
defines its tools as module-level typed functions and lists them in ``TOOLS``; a tool takes
``ctx: ToolContext``, reaches the run through :func:`state_of` (``ctx.request_context.lifespan_context``,
a :class:`ServerState`, as in the SDK's lifespan examples) and raises :class:`ToolError` with a message
that says what to fix. :func:`make_tool` turns such a function into the SDK ``Tool`` that
:func:`~evotrainer.servers.app.build_server` serves, with the error mapping of :func:`guard`: a known
domain error (``LineageError``, ``RecipeError``, ...) becomes a tool error with its own message; anything
else becomes a tool error that names the exception (the server keeps serving either way).

Bounds every tool gets from :func:`make_tool`:

- a deadline (:data:`DEFAULT_DEADLINE_S`, or ``deadline_s``; :data:`SANDBOX_DEADLINE_S` for the tools that run
  sandboxed code, :data:`SANDBOX_TOOLS`, whose own wall clock goes to 600 s): a call still running after it is
  answered with a tool error that says what to do; the work runs in a worker thread (``anyio.to_thread``), so
  the event loop keeps answering other requests (ping, other sessions) meanwhile. One exception: a read-only
  tool marked :func:`cached_read` (get_version, list_analyzers) whose result is cached under a key that a
  write would have changed (the lineage's :meth:`~evotrainer.lineage.LineageStore.state_token`, read without
  waiting) is answered on the event loop from the cache: a dict lookup and a ``PRAGMA data_version``, nothing
  that can run past a deadline; any miss runs the body in a worker thread as above;
- a bounded number of tool bodies at once (:class:`WorkSlots`): :data:`MAX_TOOL_THREADS` (``$EVOTRAINER_MCP_TOOL_THREADS``)
  for ordinary tools, :data:`MAX_SANDBOX_RUNS` (``$EVOTRAINER_MCP_SANDBOX_RUNS``) for :data:`SANDBOX_TOOLS`. A body
  past its deadline keeps its slot until it really returns (Python threads cannot be killed), so abandoned work
  cannot pile up; a call that gets no slot before its deadline is answered "server busy". Tool threads come from
  their own capacity limiter, never from anyio's default one, which the stdio transport needs to read stdin.
  Why (measured on this 2-core machine, stdio server, ping every 50 ms; tests/test_security_mcp.py): with the
  default pool, 20 concurrent pure-Python tool calls delayed a ping by 11.4 s (GIL convoy: the event-loop thread
  waits behind every CPU-bound thread), 4 by 0.84 s, 2 by 0.25 s; 45 concurrent slow calls took all 40 tokens
  of anyio's default limiter and the stdio reader with them (ping answered after 10 s); over HTTP another
  session's ``list_versions`` waited 24 s behind 45 analyzer runs, 45 sandboxes running at once. A single C call
  that holds the GIL (e.g. Python's ``re`` on a catastrophic pattern: 3.4 s at 27 characters) still stalls the
  process whatever the pool, so tool bodies must not make one on caller-sized input (regex search uses RE2);
- argument bounds applied to the argument model (:func:`bounded_arg_model`): strings at most
  :data:`MAX_TEXT_CHARS` (free-text fields: hypothesis, rationale, description, note, ...) or
  :data:`MAX_STR_CHARS` (ids, names, paths, ...) unless the tool sets its own ``max_length``; lists at most
  :data:`MAX_ITEMS` items; integers within signed 64 bits (DuckDB's BIGINT, SQLite's INTEGER); floats
  finite. The whole ``arguments`` object of a call is at most :data:`MAX_ARGUMENTS_BYTES` of JSON;
- error text without internal paths (:func:`scrub`): no site-packages paths, no Rust source locations
  (LanceDB's errors carry them), no raw DuckDB exception text.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import threading
import time
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
from annotated_types import Ge, Le, MaxLen
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import AllowInfNan, BaseModel, Field, create_model

from evotrainer.echo import closest_names, echo
from evotrainer.intervention import InterventionError
from evotrainer.lineage import LineageError, Version
from evotrainer.patterns import compile_re2
from evotrainer.recipe import RecipeError
from evotrainer.servers.jobs import JobManager
from evotrainer.skills_db.store import SkillStore
from evotrainer.workspace import Workspace, WorkspaceError

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

MAX_LIMIT = 500  # the largest page any list tool returns
DEFAULT_DEADLINE_S = 300.0  # a tool call still running after this many seconds is answered with a tool error
SANDBOX_DEADLINE_S = 900.0  # tools that run sandboxed code: their sandbox stops itself first (timeout_s <= 600)
SANDBOX_TOOLS = frozenset({"run_analyzer", "run_analyzer_code", "register_analyzer", "backtest_analyzer"})
TOOL_THREADS_ENV, SANDBOX_RUNS_ENV = "EVOTRAINER_MCP_TOOL_THREADS", "EVOTRAINER_MCP_SANDBOX_RUNS"
MAX_TOOL_THREADS = 2  # ordinary tool bodies at once: 2 kept a ping under 0.25 s while they spun (module doc)
MAX_SANDBOX_RUNS = 4  # sandbox-running tool bodies at once (each sandbox may hold memory_mb <= 16 GiB)
MAX_TOOL_WORKERS = 64  # worker threads of tool calls (running or waiting for a slot); more calls wait without one
SWITCH_INTERVAL_S = 0.001  # GIL switch interval of a serving process (CPython's default: 0.005)
MAX_TEXT_CHARS = 20_000  # free-text arguments (hypothesis, rationale, ...): ~5,000 tokens
MAX_STR_CHARS = 2_000  # every other string argument without its own max_length (ids, names, paths, times)
MAX_CODE_CHARS = 200_000  # analyzer source (a compiled synthesised analyzer is ~6,000 characters)
CODE_FIELDS = frozenset({"code"})
MAX_ITEMS = 1_000  # items of a list argument
MAX_ARGUMENTS_BYTES = 1_000_000  # JSON size of one call's whole arguments object
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FREE_TEXT = frozenset({"hypothesis", "rationale", "description", "note", "notes", "findings", "evidence_summary",
                       "message", "summary", "reason", "intervention", "value", "new_value", "results", "evidence"})

LOG_ERROR_DESCRIPTION = ("Set when the change was stored but its record could not be added to the run log (e.g. a full "
                         "disk): what went wrong and the fix; the change itself took effect (do not retry it).")
"""The ``log_error`` field of a write tool's result (:meth:`~evotrainer.workspace.Workspace.log_after_commit`)."""

# A JSON value (recipe values, rules): declared as a union of the JSON types so the schema constrains it.
JsonScalar = str | int | float | bool | None
JsonValue = str | int | float | bool | list[JsonScalar | dict[str, Any]] | dict[str, Any] | None


MISS: Any = object()
"""What :meth:`ResultCache.get` returns for a key it does not hold."""


class ResultCache:
    """Results of read-only tools under a key that changes whenever their inputs may have changed (:class:`CachedRead`).

    Holds at most ``max_entries`` results (the oldest entries go first): an entry whose key went stale (the run was
    written since) is never looked up again and ages out. :meth:`get` takes no lock (one dict read, atomic under the
    GIL), so the event loop may call it; :meth:`put` runs in worker threads under a lock.
    """

    def __init__(self, max_entries: int = 256):
        if max_entries < 1:
            raise ValueError(f"max_entries: at least 1, got {max_entries}")
        self.max_entries = max_entries
        self._data: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Hashable) -> Any:
        """The result stored under ``key``, or :data:`MISS`."""
        r = self._data.get(key, MISS)
        if r is MISS:
            self.misses += 1
        else:
            self.hits += 1
        return r

    def put(self, key: Hashable, result: Any) -> None:
        """Store ``result`` under ``key`` (evicting the oldest entries beyond ``max_entries``)."""
        with self._lock:
            self._data.pop(key, None)
            self._data[key] = result
            while len(self._data) > self.max_entries:
                self._data.pop(next(iter(self._data)))

    def clear(self) -> None:
        """Forget every result."""
        with self._lock:
            self._data.clear()


@dataclass(frozen=True)
class CachedRead:
    """How :func:`guard` caches the results of a sync read-only tool (attached by :func:`cached_read`).

    ``key(state, blocking, **arguments)`` returns a hashable value that changes whenever the tool's result may
    change (e.g. the lineage's :meth:`~evotrainer.lineage.LineageStore.state_token` and the arguments), or None
    when it cannot tell (then the call is neither looked up nor stored). With ``blocking=False`` it is called on
    the event loop and must not wait (no lock it could block on, no I/O beyond a lookup that cannot block); with
    ``blocking=True`` it runs in the worker thread, *before* the body, so that a write during the body makes the
    next key differ (an entry may be newer than its key, never older). ``keep(state, result)`` says whether a
    result may be stored (e.g. not while a job it reports is running: its elapsed time moves without a write).
    """

    key: Callable[..., Hashable | None]
    keep: Callable[[Any, Any], bool] | None = None


def cached_read(key: Callable[..., Hashable | None], keep: Callable[[Any, Any], bool] | None = None
                ) -> Callable[[F], F]:
    """Decorator: mark a sync read-only tool as cached (:class:`CachedRead`); the function itself is unchanged
    (a direct call, e.g. ``propose_intervention`` calling ``get_version``, always runs the body)."""

    def deco(fn: F) -> F:
        fn.__cached_read__ = CachedRead(key, keep)  # type: ignore[attr-defined]
        return fn

    return deco


def lineage_token(state: ServerState, blocking: bool) -> Hashable | None:
    """The run's lineage :meth:`~evotrainer.lineage.LineageStore.state_token` (None when it cannot be read
    without waiting, or the run cannot be opened: then the call is not cached)."""
    if blocking:
        try:
            ws = state.workspace()
        except ToolError:
            return None
    else:
        ws = state.opened_workspace()
        if ws is None:
            return None
    return ws.lineage.state_token(blocking=blocking)


@dataclass
class ServerState:
    """Handles shared by all tools of one server process: the typed lifespan context.

    Every tool reaches it as ``ctx.request_context.lifespan_context`` (:func:`state_of`), the pattern of
    the SDK's lifespan examples; the same state is yielded to every session (:func:`make_lifespan`),
    because it outlives them: jobs keep running between sessions. The workspace is opened lazily and
    read-only in spirit (no writer lock): training and evaluation jobs open their own writer handle
    (:mod:`evotrainer.servers.jobs`). SQLite WAL and Lance snapshots give readers consistent views while
    a job writes.

    Args:
        run_dir: the run folder the tools act on (None: the tools that need a run say so).
        backend_name: training backend of start_training / evaluate_version (``local`` | ``openrlhf``).
        server_name: the server's name, e.g. ``evotrainer-all`` (server_info).
        toolsets: the toolsets the server serves (server_info).
    """

    run_dir: Path | None = None
    backend_name: str = "local"
    server_name: str = ""
    toolsets: tuple[str, ...] = ()
    jobs: JobManager = field(init=False)
    _ws: Workspace | None = field(default=None, init=False, repr=False)
    _skills: SkillStore | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    results: ResultCache = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir).expanduser().resolve() if self.run_dir else None
        self.jobs = JobManager(self.run_dir)
        self.results = ResultCache()

    def opened_workspace(self) -> Workspace | None:
        """The workspace if it is open already, else None; never blocks (the event loop's cache lookups)."""
        return self._ws

    def workspace(self) -> Workspace:
        """The run's :class:`~evotrainer.workspace.Workspace` (opened on first use).

        Raises:
            ToolError: no run folder was given, or it is not a run folder.
        """
        with self._lock:
            if self._ws is None:
                if self.run_dir is None:
                    raise ToolError("this server was started without a run folder; restart it with --run PATH")
                try:
                    self._ws = Workspace.open(self.run_dir)
                except WorkspaceError as exc:
                    raise ToolError(str(exc)) from None
            return self._ws

    def skill_store(self) -> SkillStore:
        """The process-wide :class:`~evotrainer.skills_db.store.SkillStore` (opened on first use; the seed
        library is loaded when its table is created)."""
        with self._lock:
            if self._skills is None:
                self._skills = SkillStore()
            return self._skills

    def close(self) -> None:
        """Close the workspace (jobs keep their own handles) and forget the cached tool results."""
        with self._lock:
            if self._ws is not None:
                self._ws.close()
                self._ws = None
            self.results.clear()


Lifespan = Callable[[MCPServer[ServerState]], AbstractAsyncContextManager[ServerState]]


def make_lifespan(state: ServerState) -> Lifespan:
    """A lifespan that hands ``state`` to every session (state outlives sessions: jobs keep running)."""

    @asynccontextmanager
    async def lifespan(_server: MCPServer[ServerState]) -> AsyncIterator[ServerState]:
        yield state

    return lifespan


ToolContext = Context[ServerState, Any]
"""The ``ctx`` argument of every tool: the request's MCP context, whose lifespan context is the :class:`ServerState`."""


def state_of(ctx: ToolContext) -> ServerState:
    """The :class:`ServerState` of the server handling this request (its lifespan context).

    Raises:
        ToolError: the call came without a request context (``MCPServer.call_tool`` outside a session).
    """
    try:
        return ctx.request_context.lifespan_context
    except ValueError:
        raise ToolError("this tool needs an MCP session (its lifespan context holds the run): call it through a "
                        "client, e.g. mcp.Client(server)") from None


_KNOWN_ERRORS: tuple[type[BaseException], ...] = (
    LineageError, RecipeError, InterventionError, WorkspaceError, ValueError, KeyError, FileNotFoundError,
    PermissionError, TimeoutError)


def _to_tool_error(name: str, exc: BaseException) -> ToolError:
    if isinstance(exc, ToolError):
        return ToolError(scrub(str(exc)))
    if type(exc).__module__.split(".")[0] in ("duckdb", "_duckdb"):
        return ToolError(f"{name} failed: the rollout query was rejected ({type(exc).__name__}); check that numbers "
                         f"are within range (integers within signed 64 bits, finite floats) and retry")
    if isinstance(exc, _KNOWN_ERRORS):
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return ToolError(scrub(str(msg)))
    return ToolError(f"{name} failed: {type(exc).__name__}: {scrub(str(exc))}")


MAX_SCRUB_CHARS = 20_000
"""Characters of an error text :func:`scrub` keeps (the rest is cut, its length said): an error names what is wrong
in a line or a few; a longer one only repeats caller input (review 16, M-R16: a 3.9 MB tool name in "Unknown tool")."""
_INTERNAL_PATHS = [  # RE2 (linear time; Python's re backtracked: a 20,000-character "/a/a/..." name took 4.6 s)
    (compile_re2(r"(?:[A-Za-z]:)?[\\/][^\s'\"():,]*?[\\/](?:site|dist)-packages[\\/][^\s'\"():,]*"), "<library>"),
    (compile_re2(r"[^\s'\"(),]*\.rs(?::\d+){1,2}"), "<library>"),  # Rust source locations (lance, lancedb)
    (compile_re2(r"(?:[A-Za-z]:)?[\\/][^\s'\"():,]*?[\\/]lib[\\/]python3\.\d+[\\/][^\s'\"():,]*"), "<library>"),
]


def scrub(text: str) -> str:
    """``text`` with library-internal paths (site-packages, the Python stdlib, Rust ``*.rs:line``) replaced
    by ``<library>``; the run folder's own paths stay (the user needs them).

    At most :data:`MAX_SCRUB_CHARS` characters are kept (a longer text ends ``... (cut: N characters)``), and
    the patterns run with RE2: linear in the text, so a hostile text costs milliseconds, never seconds."""
    if len(text) > MAX_SCRUB_CHARS:
        text = f"{text[:MAX_SCRUB_CHARS]}... (cut: {len(text):,} characters)"
    for pat, repl in _INTERNAL_PATHS:
        text = pat.sub(repl, text)
    return text


ToolMeta = tuple[str, bool, bool, bool]
"""``(title, read_only, destructive, idempotent)`` of a tool (``app.TOOL_META``)."""


class WorkSlots:
    """At most ``n`` tool bodies of one kind running at once, counted until each body really returns.

    :meth:`run` is called in the worker thread: it waits for a slot until ``deadline`` (``time.monotonic()``
    seconds), then runs the body unless the caller has gone (``gone`` set: the call was answered at its deadline
    or cancelled while it waited). A body that outlives its call keeps its slot, so work past its deadline cannot
    pile up beyond ``n`` threads.
    """

    def __init__(self, name: str, n: int):
        if n < 1:
            raise ValueError(f"{name}: at least 1 slot, got {n}")
        self.name, self.n = name, n
        self._sem = threading.BoundedSemaphore(n)
        self._lock = threading.Lock()
        self._threads = 0  # bodies running or waiting for a slot

    @property
    def threads(self) -> int:
        """Worker threads in :meth:`run` now: bodies running or waiting for a slot (answered calls' included)."""
        return self._threads

    def busy(self, tool_name: str) -> str:
        """The tool error of a call that got no slot before its deadline."""
        return (f"{tool_name}: server busy: {self.n} {self.name} call(s) were running for the whole time this call "
                f"may take; retry later (or raise ${SANDBOX_RUNS_ENV if self.name == 'sandbox' else TOOL_THREADS_ENV})")

    def run(self, call: Callable[[], Any], gone: threading.Event, started: threading.Event, deadline: float) -> Any:
        with self._lock:
            self._threads += 1
        try:
            if not self._sem.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise ToolError(self.busy(getattr(call, "func", call).__name__))
            try:
                if gone.is_set():
                    return None
                started.set()
                return call()
            finally:
                self._sem.release()
        finally:
            with self._lock:
                self._threads -= 1


def _env_slots(env: str, default: int) -> int:
    raw = os.environ.get(env, "")
    try:
        n = int(raw) if raw.strip() else default
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{env}={raw!r}: give a positive integer (tool bodies at once), e.g. {default}")
    return n


TOOL_SLOTS = WorkSlots("tool", _env_slots(TOOL_THREADS_ENV, MAX_TOOL_THREADS))
SANDBOX_SLOTS = WorkSlots("sandbox", _env_slots(SANDBOX_RUNS_ENV, MAX_SANDBOX_RUNS))
# after a stdio client closed stdin: how long the requests already read get to be answered (envelope.serve_stdio),
# then how long the tool bodies still running (cancelled) get before the process exits
STDIO_EOF_GRACE_S = 10.0


def tool_threads() -> int:
    """Tool worker threads still in a body or waiting for a slot (:class:`WorkSlots`), sandbox runs included."""
    return TOOL_SLOTS.threads + SANDBOX_SLOTS.threads


def exit_if_busy(jobs_left: list) -> None:
    """End the process at once (``os._exit(0)``, stdout and stderr flushed) when training jobs or tool threads
    still run: the interpreter's exit would wait for their threads (a sandbox of up to 600 s). Called by a server
    going away after its grace period (stdio EOF, HTTP shutdown); a job row left 'running' is marked interrupted at
    the next open, an evidence copy or sandbox folder is swept by owner."""
    if jobs_left or tool_threads():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


_WORKERS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar("evotrainer_tool_workers")


def loop_limiter(var: anyio.lowlevel.RunVar[anyio.CapacityLimiter], tokens: int) -> anyio.CapacityLimiter:
    """This event loop's limiter held in ``var``, made with ``tokens`` threads at its first use on the loop."""
    try:
        return var.get()
    except LookupError:
        lim = anyio.CapacityLimiter(tokens)
        var.set(lim)
        return lim


def _workers() -> anyio.CapacityLimiter:
    """This event loop's limiter of tool worker threads (not anyio's default one: the stdio reader needs that)."""
    return loop_limiter(_WORKERS, MAX_TOOL_WORKERS)


def prefer_the_event_loop() -> None:
    """Set this process's GIL switch interval to :data:`SWITCH_INTERVAL_S` (the servers call it when they start
    serving stdio or HTTP): a thread waiting for the GIL gets it after at most that long, so the event-loop thread
    answers between the time slices of CPU-bound tool threads. Measured (stdio server, 20 calls of a pure-Python
    spin sent at once, 2 of them running; ping every 50 ms; 2 runs each): worst ping 1.22 s and 0.48 s at 5 ms,
    0.27 s and 0.20 s at 1 ms; spin iterations of 2 running calls over 3 x 3 s: 43.9 M and 43.1 M at 5 ms,
    63.6 M and 52.4 M at 1 ms (no throughput lost).
    """
    sys.setswitchinterval(SWITCH_INTERVAL_S)


async def run_in_slot(name: str, call: Callable[[], Any], sandbox: bool = False, deadline_s: float | None = None
                      ) -> Any:
    """``call()`` in a tool worker thread once it has a slot of :data:`SANDBOX_SLOTS` (``sandbox``) or
    :data:`TOOL_SLOTS`, answered with a :class:`ToolError` ("server busy" / "did not finish") after ``deadline_s``
    seconds (default :data:`SANDBOX_DEADLINE_S` or :data:`DEFAULT_DEADLINE_S`, read at call time): the body of a
    sync tool (:func:`guard`), and the lineage reads of an async tool (start_training, job_status, ...), which must
    not run on the event loop: a slow read there (a crafted ``lineage.db``, review 10 M-R10) stalls every session.
    """
    slots = SANDBOX_SLOTS if sandbox else TOOL_SLOTS
    limit = deadline_s if deadline_s is not None else SANDBOX_DEADLINE_S if sandbox else DEFAULT_DEADLINE_S
    gone, started = threading.Event(), threading.Event()
    body = functools.partial(slots.run, call, gone, started, time.monotonic() + limit)
    try:
        with anyio.move_on_after(limit) as scope:
            return await anyio.to_thread.run_sync(body, abandon_on_cancel=True, limiter=_workers())
        if scope.cancelled_caught:
            if not started.is_set():
                raise ToolError(slots.busy(name))
            raise ToolError(f"{name} did not finish within {limit:g} s; narrow the request "
                            "(a version, a step range, a smaller limit) or retry later")
    finally:
        gone.set()


async def in_tool_worker(call: Callable[[], T]) -> T:
    """``call()`` in a tool worker thread (:data:`MAX_TOOL_WORKERS`, not anyio's default limiter, which the stdio
    reader needs), without a slot or a deadline: work that mostly waits (a job's start waits for the writer lock)."""
    return await anyio.to_thread.run_sync(call, limiter=_workers())


def guard(fn: Callable[..., Any], deadline_s: float | None = None, sandbox: bool | None = None
          ) -> Callable[..., Awaitable[Any]]:
    """``fn`` as an async tool body with domain errors mapped to tool errors, a deadline and a work slot.

    A sync ``fn`` runs in a worker thread once it has a slot of :data:`SANDBOX_SLOTS` (``sandbox``; default: the
    name is in :data:`SANDBOX_TOOLS`) or :data:`TOOL_SLOTS`; after ``deadline_s`` seconds (default
    :data:`SANDBOX_DEADLINE_S` or :data:`DEFAULT_DEADLINE_S`, read at call time) the call is answered with a tool
    error: "did not finish" (the thread finishes in the background, holding its slot: Python threads cannot be
    killed, so long loops also check their own deadline, e.g. ``search_logs``) or "server busy" (no slot came).
    """
    name = fn.__name__
    in_sandbox = name in SANDBOX_TOOLS if sandbox is None else sandbox
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                raise _to_tool_error(name, exc) from exc
    else:
        cache: CachedRead | None = getattr(fn, "__cached_read__", None)

        @functools.wraps(fn)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            if cache is not None and not args:
                hit, call = _cached_call(name, cache, fn, kwargs, convert)
                if hit is not MISS:
                    return hit  # answered on the event loop from the cache: no thread, nothing that can block
            else:
                call = functools.partial(fn, *args, **kwargs)
            try:
                return await run_in_slot(name, call, in_sandbox, deadline_s)
            except Exception as exc:
                raise _to_tool_error(name, exc) from exc

        convert: list[Callable[[Any], Any]] = []  # the SDK's result conversion of this tool (make_tool sets it)
        wrapped.__result_converter__ = convert  # type: ignore[attr-defined]
    return wrapped


def _cached_call(name: str, cache: CachedRead, fn: Callable[..., Any], kwargs: dict[str, Any],
                 convert: list[Callable[[Any], Any]]) -> tuple[Any, Callable[[], Any]]:
    """``(result, _)`` of a cache hit found without waiting, else ``(MISS, body)``: ``body`` runs in the worker
    thread, takes the key first (blocking), looks it up again and else runs ``fn`` and stores what it returned.

    What is stored is the SDK's conversion of the result (``convert``: ``FuncMetadata.convert_result``, a
    ``CallToolResult`` with the structured content and its JSON text), so a hit skips the model dump and the JSON
    encoding too; the SDK passes a ``CallToolResult`` through (after validating its structured content), and
    each call gets its own copy. A result whose conversion fails is not stored (the SDK reports it as before).
    """
    try:
        state = state_of(kwargs["ctx"])
        key = cache.key(state, False, **kwargs)
    except Exception:  # no session, no run: the body says what is wrong
        return MISS, functools.partial(fn, **kwargs)
    if key is not None:
        hit = state.results.get((name, key))
        if hit is not MISS:
            return hit.model_copy(), _never

    def body() -> Any:
        try:
            key = cache.key(state, True, **kwargs)
        except Exception:  # the body reports what is wrong with the run
            key = None
        if key is not None and (hit := state.results.get((name, key))) is not MISS:
            return hit.model_copy()
        result = fn(**kwargs)
        if key is None or not convert or (cache.keep is not None and not cache.keep(state, result)):
            return result
        try:
            converted = convert[0](result)
        except Exception:  # the SDK raises its own error for it
            return result
        if not isinstance(converted, CallToolResult):
            return result
        state.results.put((name, key), converted)
        return converted.model_copy()

    body.__name__ = name
    return MISS, body


def _never() -> None:
    raise AssertionError("a cache hit has no body to run")


def description_of(fn: Callable[..., Any]) -> str:
    """The tool description clients see: ``fn``'s docstring on one line."""
    return " ".join((fn.__doc__ or "").split())


def make_tool(fn: Callable[..., Any], meta: ToolMeta | None = None) -> Tool:
    """The SDK :class:`~mcp.server.mcpserver.tools.Tool` of a module-level tool function.

    The docstring is the tool description; arguments carry ``Field(description=...)``; the return
    annotation (a pydantic model) is the output schema; ``meta`` gives the title and the behaviour hints
    (without it: read-only, not destructive). The body runs under :func:`guard`. The argument model is
    strict (unknown argument names such as ``limt`` are errors, not silently dropped) and bounded
    (:func:`bounded_arg_model`); the output schema has its ``$ref`` inlined (:func:`inline_refs`). The
    result goes to ``MCPServer(tools=[...])``, the SDK's public way to serve a prepared ``Tool``.
    """
    if meta is None:
        title, annotations = None, ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
    else:
        title, read_only, destructive, idempotent = meta
        annotations = ToolAnnotations(title=title, read_only_hint=read_only, destructive_hint=destructive,
                                      idempotent_hint=idempotent, open_world_hint=False)
    t = Tool.from_function(guard(fn), name=fn.__name__, title=title, description=description_of(fn),
                           annotations=annotations)
    converter = getattr(t.fn, "__result_converter__", None)
    base = t.fn_metadata.arg_model
    strict = type(base.__name__, (base,), {"model_config": {**base.model_config, "extra": "forbid"}})
    t.fn_metadata.arg_model = bounded_arg_model(strict)
    t.parameters = t.fn_metadata.arg_model.model_json_schema(by_alias=True)
    t.parameters["additionalProperties"] = False
    if t.fn_metadata.output_schema:
        t.fn_metadata.output_schema = simplify_schema(inline_refs(t.fn_metadata.output_schema))
    if converter is not None:
        converter.append(t.fn_metadata.convert_result)
    return t


def tool(server: MCPServer[Any], *, read_only: bool = True, destructive: bool = False,
         deadline_s: float | None = None) -> Callable[[F], F]:
    """Decorator: add ``fn`` to any ``server`` through the SDK's ``add_tool``, under :func:`guard`.

    For a one-off tool outside the catalogue (tests, experiments): the SDK builds its argument model, so it
    is neither strict nor bounded; the catalogue's tools are made with :func:`make_tool`.
    """

    def deco(fn: F) -> F:
        server.add_tool(guard(fn, deadline_s), description=description_of(fn),
                        annotations=ToolAnnotations(read_only_hint=read_only, destructive_hint=destructive,
                                                    open_world_hint=False))
        return fn

    return deco


def _bound(annotation: Any, field: str) -> Any:
    """``annotation`` with default bounds on its str / int / float / list parts (see the module docstring)."""
    origin = typing.get_origin(annotation)
    if annotation is str:
        limit = MAX_CODE_CHARS if field in CODE_FIELDS else MAX_TEXT_CHARS if field in FREE_TEXT else MAX_STR_CHARS
        return Annotated[str, MaxLen(limit)]
    if annotation is int:
        return Annotated[int, Ge(INT64_MIN), Le(INT64_MAX)]
    if annotation is float:
        return Annotated[float, AllowInfNan(False)]
    if origin is Annotated:
        inner, *meta = typing.get_args(annotation)
        return Annotated[(_bound(inner, field), *meta)]
    if origin in (typing.Union, types.UnionType):
        parts = tuple(_bound(a, field) for a in typing.get_args(annotation))
        return typing.Union[parts]  # noqa: UP007 (built from a tuple)
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        return Annotated[list[_bound(item, field)], MaxLen(MAX_ITEMS)]
    return annotation


def bounded_arg_model(model: type[BaseModel]) -> type[BaseModel]:
    """A subclass of a tool's argument model whose fields carry the default bounds (a field's own constraints,
    e.g. ``max_length=500`` or ``ge=0``, come after them and win)."""
    overrides: dict[str, Any] = {}
    for fname, fi in model.model_fields.items():
        ann = _bound(fi.annotation, fname)
        if ann == fi.annotation:
            continue
        if fi.metadata:
            ann = Annotated[(ann, *fi.metadata)]
        kw: dict[str, Any] = {"description": fi.description, "title": fi.title, "alias": fi.alias}
        if fi.default_factory is not None:
            kw["default_factory"] = fi.default_factory
        elif not fi.is_required():
            kw["default"] = fi.default
        overrides[fname] = (ann, Field(**{k: v for k, v in kw.items() if v is not None or k == "default"}))
    if not overrides:
        return model
    return create_model(model.__name__, __base__=model, **overrides)


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every local ``$ref`` to ``#/$defs/X`` replaced by the definition (no ``$defs`` left).

    Clients validate each structured result against the output schema (the SDK client with
    ``jsonschema``), and resolving ``$ref`` is most of that cost; our models are not recursive,
    so inlining is exact and makes validation several times faster.
    """
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs:
                rest = {k: walk(v) for k, v in node.items() if k != "$ref"}
                return {**walk(defs[ref[8:]]), **rest}
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def simplify_schema(schema: Any) -> Any:
    """``schema`` rewritten into an equivalent one that a JSON Schema validator walks faster.

    One rewrite, exact (the same instances validate, JSON Schema 2020-12 §10.3.2.3): ``"additionalProperties":
    true`` is dropped (it is the default; the ``jsonschema`` package still descends into every extra property
    against it: the ~60 recipe fields of get_version). The SDK client validates every structured result against
    its tool's output schema. Nullable fields keep pydantic's ``anyOf`` of ``{"type": T}`` and ``{"type":
    "null"}``: a ``"type": [T, "null"]`` array would validate the same and faster, but a client that maps tool
    schemas onto a single-``type`` dialect (the OpenAPI subset of Gemini function declarations) cannot read it,
    and the MCP Inspector's ``--strict`` flags each one (121 warnings over 33 tools).
    """
    if isinstance(schema, list):
        return [simplify_schema(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: simplify_schema(v) for k, v in schema.items() if not (k == "additionalProperties" and v is True)}


_HEADER = re.compile(r"^Error executing tool (\S+): (\d+) validation errors? for \w+Arguments$")
MAX_LISTED_ERRORS = 20  # bad arguments (or items) named in one error; the rest are counted
_DETAIL = re.compile(r"^  (.*?) \[type=([\w_]+), input_value=(.*), input_type=\w+\]$")


def explain_validation_error(text: str, schema: dict[str, Any] | None) -> str | None:
    """Rewrite the SDK's pydantic argument error into one line per bad argument with the rule and the fix.

    ``Error executing tool get_version: invalid arguments: version_id: required argument missing
    (Version id, ...)``. Returns None when ``text`` is not an argument-validation error. At most
    :data:`MAX_LISTED_ERRORS` are named, the rest counted: 40,000 bad values in one 600 KB ``metrics`` object made a
    6.6 MB reply, and the rewrite and :func:`scrub` of it took ~1 s on the event loop per call (review 5: 8 such
    calls delayed a ping 3.4 s).
    """
    lines = text.splitlines()
    head = _HEADER.match(lines[0]) if lines else None
    if not head:
        return None
    props = (schema or {}).get("properties", {})
    items, loc = [], None
    for line in lines[1:]:
        if len(items) == MAX_LISTED_ERRORS:
            break
        if not line.startswith(" "):
            loc = line.strip()
            continue
        m = _DETAIL.match(line)
        if not m or loc is None:
            continue
        msg, kind, value = m.groups()
        top = loc.split(".")[0]
        loc = echo(loc)  # a caller's argument name, shown cut
        desc = props.get(top, {}).get("description")
        hint = f" ({desc})" if desc else ""
        if kind == "missing":
            items.append(f"{loc}: required argument missing{hint}")
        elif kind == "extra_forbidden":
            items.append(f"{loc}: unknown argument; allowed: {', '.join(props) or 'none'}")
        else:
            shown = value if len(value) <= 80 else value[:77] + "..."
            items.append(f"{loc}={shown}: {msg}{hint}")
    if not items:
        return None
    more = int(head.group(2)) - len(items)
    return (f"Error executing tool {head.group(1)}: invalid arguments: " + "; ".join(items)
            + (f"; and {more} more like these" if more > 0 else ""))


UNKNOWN_TOOL = "Unknown tool: "  # how the SDK's tool manager begins its error for a name it does not serve


def unknown_tool_error(name: object, tools: Iterable[str]) -> str:
    """The error of a call of a tool this server does not serve: the name as :func:`~evotrainer.echo.echo` shows
    it (at most 64 characters) and the closest served names (:func:`~evotrainer.echo.closest_names`), else the
    first served names; a few hundred characters whatever the name's length (the SDK's own text repeated it whole:
    a 3.9 MB name made a 3.9 MB reply, scrubbed for minutes; review 16, M-R16)."""
    names = list(tools)
    close, _ = closest_names(name, names, n=3)
    if close:
        hint = f"did you mean {' or '.join(repr(c) for c in close)}?"
    else:
        shown = names[:MAX_LISTED_ERRORS]
        more = f" and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
        hint = f"this server's tools: {', '.join(shown) or 'none'}{more}"
    return f"Unknown tool {echo(name)!r}; {hint} (tools/list lists them with their arguments)"


def argument_error_middleware(tools: Iterable[Tool]) -> Callable[..., Any]:
    """Server middleware for ``tools/call``: arguments over :data:`MAX_ARGUMENTS_BYTES` are refused before
    validation; argument-validation errors get :func:`explain_validation_error` (with the argument schema of
    the tool, from ``tools``: the server's own :func:`make_tool` results); error text is :func:`scrub`-bed."""
    schemas = {t.name: t.parameters for t in tools}

    async def middleware(ctx: Any, call_next: Any) -> Any:
        if ctx.method == "tools/call" and isinstance(ctx.params, dict):
            size = len(json.dumps(ctx.params.get("arguments") or {}, default=str))
            if size > MAX_ARGUMENTS_BYTES:
                name = ctx.params.get("name")
                text = (f"Error executing tool {echo(name)}: arguments are {size} bytes of JSON; the limit is "
                        f"{MAX_ARGUMENTS_BYTES} bytes: send less text (cut long fields) or split the call")
                return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True).model_dump(
                    by_alias=True, mode="json", exclude_none=True)
        result = await call_next(ctx)
        if ctx.method != "tools/call" or not isinstance(result, dict) or not result.get("isError"):
            return result
        try:
            content = result.get("content") or []
            text = content[0].get("text", "") if content and isinstance(content[0], dict) else ""
            name = (ctx.params or {}).get("name")
            schema = schemas.get(name) if isinstance(name, str) else None
            if text.startswith(UNKNOWN_TOOL) and name not in schemas:
                better = unknown_tool_error(name, schemas)
            else:
                better = scrub(explain_validation_error(text[:MAX_SCRUB_CHARS], schema) or text)
            if better != text:
                result = {**result, "content": [{**content[0], "text": better}, *content[1:]]}
        except Exception:  # never let error formatting break a reply
            pass
        return result

    return middleware


# --- pagination ---------------------------------------------------------------------------------
class Page(BaseModel):
    """Pagination fields of every list result: pass ``next_offset`` as ``offset`` for the next page."""

    total: int = Field(..., description="Number of items matching the query.")
    offset: int = Field(..., description="Offset of the first item of this page.")
    next_offset: int | None = Field(None, description="Offset of the next page; null on the last page.")


def page_fields(total: int, offset: int, n_returned: int) -> dict[str, Any]:
    """``{total, offset, next_offset}`` for a page of ``n_returned`` items starting at ``offset``."""
    nxt = offset + n_returned
    return {"total": total, "offset": offset, "next_offset": nxt if nxt < total and n_returned > 0 else None}


def require_version(ws: Workspace, version_id: str) -> Version:
    """The version ``version_id`` of the run, or a tool error listing the known ids."""
    try:
        return ws.lineage.get(version_id)
    except LineageError as exc:  # a version refused as unreadable (G-R12: a column past the cap) is no unknown id
        hint = "; call list_versions to see them" if " not found; known versions: " in str(exc) else ""
        raise ToolError(f"{exc}{hint}") from None
