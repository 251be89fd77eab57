"""Shared plumbing of the MCP servers: server state (lifespan context), error mapping, pagination.

Every toolset module (``training``, ``rollouts``, ``logs``, ``analyzers``, ``skills``) exposes
``register(server)``; its tools reach the run through :func:`state_of` (the lifespan context,
as in the SDK's ``lifespan_example.py``) and raise :class:`ToolError` with a message that says what
to fix. :func:`tool` registers a function with that error mapping: a known domain error
(``LineageError``, ``RecipeError``, ...) becomes a tool error with its own message; anything else
becomes a tool error that names the exception (the server keeps serving either way).
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

F = TypeVar("F", bound=Callable[..., Any])

MAX_LIMIT = 500  # the largest page any list tool returns
# A JSON value (recipe values, rules): declared as a union of the JSON types so the schema constrains it.
JsonScalar = str | int | float | bool | None
JsonValue = str | int | float | bool | list[JsonScalar | dict[str, Any]] | dict[str, Any] | None


class ServerState:
    """Handles shared by all tools of one server process (the lifespan context).

    The workspace is opened lazily and read-only in spirit (no writer lock): training and
    evaluation jobs open their own writer handle (:mod:`evotrainer.servers.training`). SQLite WAL
    and Lance snapshots give readers consistent views while a job writes.

    Args:
        run_dir: the run folder the tools act on (None: the tools that need a run say so).
    """

    def __init__(self, run_dir: str | Path | None):
        self.run_dir = Path(run_dir).expanduser().resolve() if run_dir else None
        self._ws = None
        self._lock = threading.Lock()
        self.jobs: Any = None  # training.JobManager, set by training.register
        self.extras: dict[str, Any] = {}  # lazily opened handles of other toolsets (skill store, ...)

    def workspace(self):
        """The run's :class:`~evotrainer.workspace.Workspace` (opened on first use).

        Raises:
            ToolError: no run folder was given, or it is not a run folder.
        """
        from evotrainer.workspace import Workspace, WorkspaceError

        with self._lock:
            if self._ws is None:
                if self.run_dir is None:
                    raise ToolError("this server was started without a run folder; restart it with --run PATH")
                try:
                    self._ws = Workspace.open(self.run_dir)
                except WorkspaceError as exc:
                    raise ToolError(str(exc)) from None
            return self._ws

    def extra(self, key: str, factory: Callable[[], Any]) -> Any:
        """A lazily created shared handle (one per server process), e.g. the skill store."""
        with self._lock:
            if key not in self.extras:
                self.extras[key] = factory()
            return self.extras[key]

    def close(self) -> None:
        """Close the workspace (jobs keep their own handles)."""
        with self._lock:
            if self._ws is not None:
                self._ws.close()
                self._ws = None


def make_lifespan(state: ServerState):
    """A lifespan that hands ``state`` to every session (state outlives sessions: jobs keep running)."""

    @asynccontextmanager
    async def lifespan(_server: MCPServer) -> AsyncIterator[ServerState]:
        yield state

    return lifespan


def state_of(ctx: Context) -> ServerState:
    """The :class:`ServerState` of the server handling this request (the lifespan context; for a direct
    ``server.call_tool`` without a session, the state :func:`~evotrainer.servers.app.build_server` attached)."""
    try:
        return ctx.request_context.lifespan_context
    except ValueError:
        return ctx.mcp_server.evotrainer_state  # type: ignore[attr-defined]


def _known_errors() -> tuple[type[BaseException], ...]:
    from evotrainer.intervention import InterventionError
    from evotrainer.lineage import LineageError
    from evotrainer.recipe import RecipeError
    from evotrainer.workspace import WorkspaceError

    return (LineageError, RecipeError, InterventionError, WorkspaceError, ValueError, KeyError,
            FileNotFoundError, PermissionError, TimeoutError)


def _to_tool_error(name: str, exc: BaseException) -> ToolError:
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, _known_errors()):
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return ToolError(str(msg))
    return ToolError(f"{name} failed: {type(exc).__name__}: {exc}")


def tool(server: MCPServer, *, read_only: bool = True, destructive: bool = False) -> Callable[[F], F]:
    """Register ``fn`` as a tool of ``server`` with domain errors mapped to tool errors.

    The docstring is the tool description; arguments carry ``Field(description=...)``; the return
    annotation (a pydantic model) is the output schema.
    """

    def deco(fn: F) -> F:
        name = fn.__name__
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def wrapped(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except Exception as exc:
                    raise _to_tool_error(name, exc) from exc
        else:
            @functools.wraps(fn)
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                try:
                    return fn(*args, **kwargs)
                except Exception as exc:
                    raise _to_tool_error(name, exc) from exc

        description = " ".join((fn.__doc__ or "").split())  # one line: the docstring, unwrapped
        server.add_tool(wrapped, description=description, annotations=ToolAnnotations(read_only_hint=read_only, destructive_hint=destructive,
                                                              open_world_hint=False))
        registered = server._tool_manager.get_tool(name)  # SDK: fields of fn_metadata are read live
        if registered is not None:
            # unknown argument names (typos such as 'limt') are errors, not silently dropped
            base = registered.fn_metadata.arg_model
            registered.fn_metadata.arg_model = type(base.__name__, (base,),
                                                    {"model_config": {**base.model_config, "extra": "forbid"}})
            registered.parameters["additionalProperties"] = False
            if registered.fn_metadata.output_schema:
                registered.fn_metadata.output_schema = inline_refs(registered.fn_metadata.output_schema)
        return fn

    return deco


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


_HEADER = re.compile(r"^Error executing tool (\S+): \d+ validation errors? for \w+Arguments$")
_DETAIL = re.compile(r"^  (.*?) \[type=([\w_]+), input_value=(.*), input_type=\w+\]$")


def explain_validation_error(text: str, schema: dict[str, Any] | None) -> str | None:
    """Rewrite the SDK's pydantic argument error into one line per bad argument with the rule and the fix.

    ``Error executing tool get_version: invalid arguments: version_id: required argument missing
    (Version id, ...)``. Returns None when ``text`` is not an argument-validation error.
    """
    lines = text.splitlines()
    head = _HEADER.match(lines[0]) if lines else None
    if not head:
        return None
    props = (schema or {}).get("properties", {})
    items, loc = [], None
    for line in lines[1:]:
        if not line.startswith(" "):
            loc = line.strip()
            continue
        m = _DETAIL.match(line)
        if not m or loc is None:
            continue
        msg, kind, value = m.groups()
        top = loc.split(".")[0]
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
    return f"Error executing tool {head.group(1)}: invalid arguments: " + "; ".join(items)


def argument_error_middleware(server: MCPServer) -> Callable[..., Any]:
    """Server middleware: tool-call results that are argument-validation errors get :func:`explain_validation_error`."""

    async def middleware(ctx: Any, call_next: Any) -> Any:
        result = await call_next(ctx)
        if ctx.method != "tools/call" or not isinstance(result, dict) or not result.get("isError"):
            return result
        try:
            content = result.get("content") or []
            text = content[0].get("text", "") if content and isinstance(content[0], dict) else ""
            name = (ctx.params or {}).get("name")
            registered = server._tool_manager.get_tool(name) if isinstance(name, str) else None
            better = explain_validation_error(text, registered.parameters if registered else None)
            if better:
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


def clip_text(text: str | None, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters with a marker saying how much was cut."""
    text = text or ""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return text[:max_chars] + f"... [{len(text) - max_chars} more chars]"


def require_version(ws: Any, version_id: str) -> Any:
    """The version ``version_id`` of the run, or a tool error listing the known ids."""
    from evotrainer.lineage import LineageError

    try:
        return ws.lineage.get(version_id)
    except LineageError as exc:
        raise ToolError(f"{exc}; call list_versions to see them") from None
