"""JSON-RPC envelope guard of the MCP transports: every malformed message gets an error reply.

The MCP SDK (``mcp`` 2.3) drops or mis-answers malformed envelopes:

- stdio (``mcp.server.stdio.stdio_server``): a line that fails ``jsonrpc_message_adapter.validate_json`` is put
  on the read stream as an ``Exception``; the server's ``JSONRPCDispatcher._dispatch`` has no
  ``on_stream_exception`` observer on the server side, so it is debug-logged and dropped: truncated JSON, a
  wrong ``jsonrpc``, a non-string ``method``, non-object ``params``, deep nesting all get no reply. A request
  whose ``id`` has the wrong type (object, float, bool, null) validates as a *notification* (extra keys are
  ignored) and is dropped silently too;
- streamable HTTP (``StreamableHTTPServerTransport._handle_post_request``): bad JSON gets -32700, but an
  envelope that fails validation gets -32602 (invalid *params*) instead of -32600, and the wrong-``id``-type
  request is accepted as a notification (202, no reply).

:func:`check_envelope` applies JSON-RPC 2.0 §4-§5 and MCP's rules (``id`` a string or an integer, never
null; ``params`` an object; no batches since MCP 2025-06-18) before the SDK sees a message:
-32700 (parse error) for invalid JSON, invalid UTF-8 or nesting deeper than :data:`MAX_JSON_DEPTH`;
-32602 (invalid params) for an integer in ``params`` of more than
:data:`~evotrainer.jsonl.MAX_JSON_INT_DIGITS` digits (the field named, the number never echoed);
-32600 (invalid request) for everything else (such an integer as the ``id`` or elsewhere included), including a message past the parse budgets counted before any parse
(:data:`MAX_JSON_CONTAINERS` brackets, :data:`MAX_JSON_VALUES` values); the reply carries the request's ``id`` when
that id is valid, else ``null``. Over HTTP a large body (:func:`is_large`) is handled in turn, at most
:data:`LARGE_BODIES_AT_ONCE` at a time; one that gets no turn within :data:`LARGE_BODY_HOLD_S` is answered 503 with
-32000 (server busy); small messages (a ping) never wait for a turn. :func:`serve_stdio` and :class:`EnvelopeGuard`
(ASGI) put it in front of the SDK transports.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import re2
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCResponse, jsonrpc_message_adapter
from pydantic import ValidationError

from evotrainer.json_counts import as_bytes, comma_count, container_count, quote_count
from evotrainer.jsonl import MAX_JSON_INT_DIGITS, NumberTooLong, loads

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
SERVER_BUSY = -32000  # JSON-RPC's range for server errors: a large HTTP body that waited past LARGE_BODY_HOLD_S
MAX_JSON_DEPTH = 64  # nesting levels of arrays / objects in one message (tool arguments need a handful)
LARGE_BODY_BYTES = 64 << 10
"""An HTTP body past this many bytes is "large": checked in a worker thread and handled LARGE_BODIES_AT_ONCE at a
time (review 16, H-R16: at 256 KiB, bodies just under it with tens of thousands of values were parsed on the event
loop, every one at once)."""
LARGE_BODY_VALUES = 1_000
"""A body holding more '[', '{', ':' and ',' characters than this is "large" too, whatever its size: a parse makes
about one object per such character (an ordinary tool call holds a few dozen)."""
LARGE_BODIES_AT_ONCE = 2
"""Large HTTP bodies handled at once. The others wait their turn: unread when their Content-Length says they are
large, else read (a chunked body's size, and any body's density, are known only then)."""
LARGE_BODY_HOLD_S = 1.0
"""Seconds a large HTTP body may wait for its turn; past it the body is answered HTTP 503 with a JSON-RPC error
that says to retry (it is dropped, its memory freed): 100 sessions of large bodies cannot queue behind each other
for minutes, holding 4 MiB each. Handled in turn, a large body takes tens of milliseconds (a 4 MiB one ~0.1 s: its
values are bounded by MAX_JSON_VALUES), so an honest client's rare large call waits well under it."""
MAX_JSON_VALUES = 20_000
MAX_JSON_QUOTES = 200_000
"""'"' characters one message may hold (escaped ones included), counted before the string literals are stripped to
count values: review 17 H-R17, 4 MiB of ``["","",...]`` (1.4 M strings) took 3.95 s and 323 MB to strip and refuse
(~1 us a string). A message under :data:`MAX_JSON_VALUES` values holds at most ~2 x (20,000 + 100,000 containers)
strings; a tool's code argument of 200 KB holds at most 100,000 escaped quotes."""
"""',' characters outside strings one message may hold: a bound on the values a parse makes (review 16, H-R16: a
flat list of 2 M integers, 4 MiB, has 2 brackets and parsed for ~0.4 s; 100 such HTTP bodies at once stalled
another session's ping 2.90 s). Tool arguments hold a few dozen values (lists are at most 1,000 items: ``MAX_ITEMS``;
analyzer code is one string, whose commas do not count); 20,000 parse in ~1 ms."""
MAX_JSON_CONTAINERS = 100_000
"""'[', '{' and ':' characters one message may hold (strings included: a bound on the arrays, objects and object
members a parse makes; review 15 M-R15: one object of 390,000 keys has 4 brackets).
Review 14 (M-R14): a 3.7 MiB ``tools/call`` of 1.3 M empty lists cost ~2.7 s of parsing and validation before the
argument-size refusal, and the event loop answered nothing meanwhile (over HTTP, 16 such bodies stalled another
session 5 s). Tool arguments hold tens to a few thousand; 100,000 parse in ~0.2 s."""
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # one message (stdio line or HTTP body); the SDK's HTTP body cap
STDIO_EOF_DRAIN_S = 10.0  # s: at stdin EOF, the default wait for the requests already read to be answered


_LATIN1 = re2.Options()
_LATIN1.encoding = re2.Options.Encoding.LATIN1  # any byte is a character: invalid UTF-8 cannot stop a match
_LATIN1.log_errors = False
_JSON_STRING = re2.compile(rb'"(?:[^"\\]|\\.)*"', _LATIN1)  # a JSON string literal (RE2: linear time)


def structure_count(raw: bytes | str) -> int:
    """'[', '{', ':' and ',' characters of ``raw`` (strings included): ~1 ms for 4 MiB, no parse."""
    return container_count(raw) + comma_count(raw)


def is_large(raw: bytes | str) -> bool:
    """Whether a message is checked in a worker thread, and over HTTP handled in turn: over :data:`LARGE_BODY_BYTES`
    bytes, or over :data:`LARGE_BODY_VALUES` structural characters (:func:`structure_count`)."""
    return len(raw) > LARGE_BODY_BYTES or structure_count(raw) > LARGE_BODY_VALUES


def values_count(raw: bytes | str) -> int:
    """',' characters of ``raw`` outside JSON strings (the values past the first of each array or object). Counted
    with ``bytes.count`` first; only a message with more than :data:`MAX_JSON_VALUES` commas in all has its string
    literals taken out first (RE2, linear: ~75 ms for a 4 MiB string)."""
    n = comma_count(raw)
    if n <= MAX_JSON_VALUES:
        return n
    return _JSON_STRING.sub(b"", as_bytes(raw)).count(b",")


def error_reply(code: int, message: str, request_id: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response object."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def _too_deep_path(obj: Any, limit: int) -> str | None:
    """The path (``params.arguments.filters.a``) of the first array / object nested deeper than ``limit`` levels in
    ``obj``, or None when there is none. Iterative: the message was parsed within the counts of :func:`check_envelope`."""
    stack: list[tuple[Any, int, str]] = [(obj, 1, "")]
    while stack:
        node, d, path = stack.pop()
        if isinstance(node, dict):
            children: list[tuple[Any, str]] = [(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()]
        elif isinstance(node, list):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(node)]
        else:
            continue
        if d > limit:
            return path or "message"
        stack.extend((c, d + 1, p) for c, p in reversed(children) if isinstance(c, (dict, list)))
    return None


_TOKEN = re2.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # a string literal or a bracket (RE2: linear time)


def _top_level_id(text: str) -> Any:
    """The ``id`` member of the top-level object of ``text`` when it is a valid id (a string or an integer), else
    None: read by walking string literals and brackets, never nesting, so a message too deep for Python's parser
    (RecursionError) still gets its reply to the id it sent (review 19, N4-R19). The walk is bounded by the
    quote and bracket counts :func:`check_envelope` checked first."""
    depth, found = 0, None
    dec = json.JSONDecoder(parse_constant=_no_constant)
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in "[{":
            depth += 1
        elif tok in "]}":
            depth -= 1
        elif depth == 1 and tok == '"id"':
            rest = text[m.end():m.end() + MAX_JSON_INT_DIGITS + 64].lstrip()
            if not rest.startswith(":"):
                continue
            try:
                value, _ = dec.raw_decode(rest[1:].lstrip())
            except ValueError:  # a long number, a nested value cut off, anything else: no readable id
                value = None
            found = value if _valid_id(value) else None
    return found


def _too_deep(obj: Any, text: str | None = None) -> dict[str, Any] | None:
    """The error reply to a message nested deeper than :data:`MAX_JSON_DEPTH` levels, or None when it is not.

    ``obj`` is the parsed message, or None with ``text`` when the parse itself gave up (RecursionError). With a
    readable, valid ``id`` the reply carries it (review 19, N4-R19: -32700 with id null left the client waiting
    forever): -32602 naming the field for a part of ``params``, else -32600; without one it is -32700, id null."""
    if text is not None:
        rid, field = _top_level_id(text), None
    else:
        field = _too_deep_path(obj, MAX_JSON_DEPTH)
        if field is None:
            return None
        rid = obj.get("id") if isinstance(obj, dict) else None
    if not _valid_id(rid):
        return error_reply(PARSE_ERROR, f"Parse error: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if field is None:
        return error_reply(INVALID_REQUEST, f"Invalid Request: JSON nested deeper than {MAX_JSON_DEPTH} levels; "
                                            "send flatter arguments", rid)
    return _field_error(field, f"is nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects, the most a "
                               "message may hold; send flatter arguments", rid)


def _field_error(field: str, what: str, rid: Any) -> dict[str, Any]:
    """The error reply naming one field of a message (its path cut at :data:`MAX_FIELD_ECHO` characters, control
    characters escaped): -32602 for a field of ``params``, else -32600."""
    shown = json.dumps(field)[1:-1]  # control characters of a key escaped
    if len(shown) > MAX_FIELD_ECHO:
        shown = shown[:MAX_FIELD_ECHO] + "..."
    code, kind = (INVALID_PARAMS, "Invalid params") if field.startswith("params.") else (INVALID_REQUEST,
                                                                                         "Invalid Request")
    return error_reply(code, f"{kind}: '{shown}' {what}", rid)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_LONG = object()  # what _number_too_long's second parse puts in place of an integer past MAX_JSON_INT_DIGITS
MAX_FIELD_ECHO = 80  # characters of a field's path echoed in an error (keys are the sender's, of any length)


def _int_or_long(text: str) -> Any:
    return _LONG if len(text) - text.startswith("-") > MAX_JSON_INT_DIGITS else int(text)


def _long_number_path(obj: Any) -> str | None:
    """The path (``params.arguments.limit``, ``params.items[2]``) of the first :data:`_LONG` in ``obj`` (in document
    order, the one the first parse stopped at); ``None`` when there is none. Iterative: the message was parsed
    within the counts of :func:`check_envelope`, so the walk is bounded."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        node, path = stack.pop()
        if node is _LONG:
            return path or "message"
        if isinstance(node, dict):
            stack.extend((v, f"{path}.{k}" if path else k) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(node))))
    return None


def _number_too_long(text: str, digits: int) -> dict[str, Any]:
    """The error reply to a message holding an integer of more than :data:`~evotrainer.jsonl.MAX_JSON_INT_DIGITS`
    digits: parsed again with each such integer replaced by a marker, so the field is named and the request's
    ``id`` answered when it is readable (-32602 for a field of ``params``, else -32600; never the number itself);
    -32700 when the rest of the text is not JSON either."""
    try:  # the first parse stopped at the number: the text after it may still not be JSON
        obj = json.loads(text, parse_int=_int_or_long, parse_constant=_no_constant)
    except RecursionError:
        return _too_deep(None, text) or {}
    except ValueError as exc:  # JSONDecodeError: a position, never the number (no integer past the bound is made)
        return error_reply(PARSE_ERROR, f"Parse error: {exc}"[:300])
    deep = _too_deep(obj)
    if deep:
        return deep
    rid = obj.get("id") if isinstance(obj, dict) else None
    reply_id = rid if _valid_id(rid) else None
    return _field_error(_long_number_path(obj) or "message", f"is an integer of {digits:,} digits, past the "
                        f"{MAX_JSON_INT_DIGITS} a message may hold (no id, count or limit needs more); send a smaller "
                        "number, or a string", reply_id)


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


async def check_envelope_async(raw: bytes | str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """:func:`check_envelope`, in a worker thread for a large message (:func:`is_large`: over
    :data:`LARGE_BODY_BYTES`, or dense), so the event loop keeps serving other requests while it is parsed."""
    if not is_large(raw):
        return check_envelope(raw)
    return await anyio.to_thread.run_sync(check_envelope, raw)


def check_envelope(raw: bytes | str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(message, None)`` for a well-formed JSON-RPC 2.0 message, else ``(None, error reply)``.

    Args:
        raw: one message: a stdio line or an HTTP request body (UTF-8).
    """
    brackets = container_count(raw)
    if brackets > MAX_JSON_CONTAINERS:  # counted before any parse: a cheap bound on the objects it would make
        return None, error_reply(INVALID_REQUEST, f"Invalid Request: the message holds {brackets:,} '[', '{{' and "
                                                  f"':' characters, past the {MAX_JSON_CONTAINERS:,} one message may; send "
                                                  "large data as text (or a file the server reads), not as nested "
                                                  "JSON")
    quotes = quote_count(raw)
    if quotes > MAX_JSON_QUOTES:  # before values_count strips the strings (its cost grows with their number)
        return None, error_reply(INVALID_REQUEST, f"Invalid Request: the message holds {quotes:,} '\"' characters, "
                                                  f"past the {MAX_JSON_QUOTES:,} one message may; send large data as "
                                                  "text (one string), or split the call")
    values = values_count(raw)
    if values > MAX_JSON_VALUES:  # counted before any parse: a bound on the values it would make
        return None, error_reply(INVALID_REQUEST, f"Invalid Request: the message holds {values:,} ',' characters "
                                                  f"outside strings (values), past the {MAX_JSON_VALUES:,} one message "
                                                  "may; send large data as text (one string), or split the call")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        obj = loads(text, parse_constant=_no_constant)
    except RecursionError:
        return None, _too_deep(None, text)
    except NumberTooLong as exc:  # review 18 (M-R18): was -32700, id null, Python's "Exceeds the limit (4300 digits)"
        return None, _number_too_long(text, exc.digits)
    except (UnicodeDecodeError, ValueError) as exc:
        return None, error_reply(PARSE_ERROR, f"Parse error: {exc}"[:300])
    deep = _too_deep(obj)
    if deep:
        return None, deep
    if isinstance(obj, list):
        return None, error_reply(INVALID_REQUEST, "Invalid Request: batches are not supported (MCP removed JSON-RPC "
                                                  "batching in 2025-06-18); send one message at a time")
    if not isinstance(obj, dict):
        return None, error_reply(INVALID_REQUEST, f"Invalid Request: a message is a JSON object, got "
                                                  f"{type(obj).__name__ if obj is not None else 'null'}")
    rid = obj.get("id")
    reply_id = rid if _valid_id(rid) else None

    def bad(why: str) -> tuple[None, dict[str, Any]]:
        return None, error_reply(INVALID_REQUEST, f"Invalid Request: {why}", reply_id)

    if obj.get("jsonrpc") != "2.0":
        return bad(f"'jsonrpc' must be \"2.0\", got {json.dumps(obj.get('jsonrpc'))[:40]}")
    if "method" in obj:
        if not isinstance(obj["method"], str):
            return bad("'method' must be a string")
        if "id" in obj and not _valid_id(rid):
            return bad(f"'id' must be a string or an integer, got {json.dumps(rid)[:40]}")
        if obj.get("params") is not None and not isinstance(obj["params"], dict):
            return bad("'params' must be an object")
        if "result" in obj or "error" in obj:
            return bad("a request has no 'result' or 'error'")
    else:  # a response to one of the server's own requests (sampling, elicitation, roots)
        if not (_valid_id(rid) or (rid is None and "error" in obj)):
            return bad("a message without 'method' is a response and needs a string or integer 'id'")
        if ("result" in obj) == ("error" in obj):
            return bad("a response has exactly one of 'result' and 'error'; a request needs a 'method'")
        if "result" in obj and not isinstance(obj["result"], dict):
            return bad("'result' must be an object")
        err = obj.get("error")
        if "error" in obj and not (isinstance(err, dict) and isinstance(err.get("code"), int)
                                   and not isinstance(err.get("code"), bool) and isinstance(err.get("message"), str)):
            return bad("'error' must be an object with an integer 'code' and a string 'message'")
    try:
        jsonrpc_message_adapter.validate_python(obj, by_name=False)
    except ValidationError as exc:  # anything the checks above missed: one short line, no pydantic URLs
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid"}
        return bad(f"{'.'.join(str(p) for p in first['loc'][1:]) or 'message'}: {first['msg']}")
    return obj, None


# --- stdio ------------------------------------------------------------------------------------------------
TOO_LARGE = object()  # marker of a stdio line over MAX_MESSAGE_BYTES (already drained)


async def _read_lines(f: Any) -> AsyncIterator[Any]:
    """Lines (bytes) of a binary file read in a worker thread, each at most :data:`MAX_MESSAGE_BYTES` bytes
    (longer: ``TOO_LARGE``, the rest of the line is skipped)."""

    async def readline(n: int) -> bytes:
        return await anyio.to_thread.run_sync(f.readline, n, abandon_on_cancel=True)

    while True:
        line = await readline(MAX_MESSAGE_BYTES + 1)
        if line == b"":
            return
        if len(line) > MAX_MESSAGE_BYTES and not line.endswith(b"\n"):
            while True:  # drop the rest of the oversized line
                more = await readline(MAX_MESSAGE_BYTES)
                if more == b"" or more.endswith(b"\n"):
                    break
            yield TOO_LARGE
            continue
        yield line


class GuardedLines:
    """The stdin lines the SDK's stdio transport parses: malformed ones are answered here and never passed on.

    ``reply`` is set (:meth:`connect`) to a coroutine that writes one error response through the transport's
    own write stream (so replies never interleave with the SDK's output). At EOF the end of input is held back
    until each request passed on has been answered (:meth:`answered`, reported by :class:`_ObservedWrites`) or
    ``drain_s`` seconds have passed (default :data:`STDIO_EOF_DRAIN_S`). With ``exit_after_s``, EOF also arms a
    watchdog that ends the process (``os._exit(0)``) that many seconds later if it is still alive: a client that
    closed stdin but stopped reading stdout left the SDK's writer blocked on a full pipe, and the server alive for
    good (review 12, Y-R12: still alive 90 s after EOF); its job rows are marked interrupted at the next open.
    """

    def __init__(self, source: Any, drain_s: float | None = None, exit_after_s: float | None = None):
        self._source = source
        self._exit_after_s = exit_after_s
        self._reply: Callable[[dict[str, Any]], Awaitable[None]] | None = None
        self._ready = anyio.Event()
        self._drain_s = STDIO_EOF_DRAIN_S if drain_s is None else drain_s
        self._pending: dict[str, int] = {}  # JSON of a request id passed on -> requests with it not answered yet
        self._answered = anyio.Event()  # set whenever _pending empties

    def connect(self, reply: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self._reply = reply
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[str]:
        async for line in _read_lines(self._source):
            msg: dict[str, Any] | None = None
            if line is TOO_LARGE:
                err: dict[str, Any] | None = error_reply(INVALID_REQUEST, f"Invalid Request: message larger than "
                                                                          f"{MAX_MESSAGE_BYTES} bytes")
            elif not line.strip():
                continue  # a blank line is no message
            else:
                msg, err = await check_envelope_async(line.rstrip(b"\r\n"))  # strict UTF-8: bad byte = parse error
            if err is None:
                self._passed(msg)
                yield line.decode("utf-8")
                continue
            await self._ready.wait()
            assert self._reply is not None
            await self._reply(err)
        if self._exit_after_s is not None:
            watchdog = threading.Timer(self._exit_after_s, exit_now)
            watchdog.daemon = True
            watchdog.start()
        # EOF: the SDK's dispatcher cancels every handler still running when its read stream ends, so the requests
        # already read would go unanswered (review 11, K-R11: 57 of 100 pipelined register_analyzer calls answered,
        # some of the others stored with no reply). The end of input is passed on once they are all answered, or
        # after drain_s seconds at most (a client that left must not keep the server alive for a long call:
        # review 10, W-R10; those calls are then cancelled as before).
        with anyio.move_on_after(self._drain_s):
            while self._pending:
                self._answered = anyio.Event()
                await self._answered.wait()

    def _passed(self, msg: dict[str, Any] | None) -> None:
        """Note a message passed on to the SDK: a request awaits its response; a ``notifications/cancelled``
        means its request gets none (the SDK answers no cancelled request)."""
        if not isinstance(msg, dict) or "method" not in msg:
            return
        if "id" in msg:
            key = json.dumps(msg["id"])
            self._pending[key] = self._pending.get(key, 0) + 1
        elif msg["method"] == "notifications/cancelled" and isinstance(msg.get("params"), dict):
            self._pending.pop(json.dumps(msg["params"].get("requestId")), None)
            self._wake()

    def answered(self, request_id: Any) -> None:
        """A response to ``request_id`` went out (:class:`_ObservedWrites`)."""
        key = json.dumps(request_id)
        n = self._pending.get(key, 0)
        if n > 1:
            self._pending[key] = n - 1
        elif n == 1:
            del self._pending[key]
            self._wake()

    def _wake(self) -> None:
        if not self._pending:
            self._answered.set()


class _ObservedWrites:
    """The transport's write stream, as the SDK's server loop gets it: each response (result or error) sent is
    reported to :meth:`GuardedLines.answered` (which holds the end of input back until the requests read are
    answered)."""

    def __init__(self, inner: Any, lines: GuardedLines):
        self._inner = inner
        self._lines = lines

    async def send(self, item: Any) -> None:
        await self._inner.send(item)
        msg = getattr(item, "message", None)
        if isinstance(msg, (JSONRPCResponse, JSONRPCError)):
            self._lines.answered(msg.id)

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def clone(self) -> Any:
        return _ObservedWrites(self._inner.clone(), self._lines)

    async def __aenter__(self) -> _ObservedWrites:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _claim_stdin() -> tuple[Any, Callable[[], None]]:
    """A private binary stream on the wire's stdin; fd 0 points at /dev/null meanwhile (as the SDK does), so a
    tool or child process that reads stdin gets EOF instead of protocol bytes. Returns ``(stream, restore)``."""
    try:
        fd0 = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.stdin.buffer, lambda: None
    private = os.dup(fd0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, fd0)
    os.close(null)
    # closefd=False: a worker thread may still block on it after the transport ends (the SDK does the same)
    stream = os.fdopen(private, "rb", closefd=False)

    def restore() -> None:
        try:
            os.dup2(private, fd0)
        except OSError:
            pass

    return stream, restore


async def serve_stdio(server: Any, eof_drain_s: float = STDIO_EOF_DRAIN_S, exit_after_s: float | None = None) -> None:
    """Serve ``server`` (an ``MCPServer``) over stdio with :class:`GuardedLines` in front of the SDK transport.

    At stdin EOF the requests already read get up to ``eof_drain_s`` seconds to be answered before the SDK sees
    the end of input (and cancels the calls still running); with ``exit_after_s`` the process ends that many
    seconds after EOF whatever still runs or blocks (:class:`GuardedLines`)."""
    source, restore = _claim_stdin()
    lines = GuardedLines(source, drain_s=eof_drain_s, exit_after_s=exit_after_s)
    try:
        async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
            async def reply(err: dict[str, Any]) -> None:
                await write_stream.send(SessionMessage(JSONRPCError.model_validate(err)))

            lines.connect(reply)
            low = server._lowlevel_server
            await low.run(read_stream, _ObservedWrites(write_stream, lines),  # type: ignore[arg-type]
                          low.create_initialization_options())
    finally:
        restore()


def exit_now() -> None:
    """End the process at once (the watchdog of :class:`GuardedLines` and of a stdio server's SIGTERM): no flush,
    which could block too."""
    os._exit(0)


# --- streamable HTTP --------------------------------------------------------------------------------------
class EnvelopeGuard:
    """ASGI middleware: a JSON POST whose body is not a well-formed JSON-RPC message gets HTTP 400 with the
    JSON-RPC error (413 over :data:`MAX_MESSAGE_BYTES`); a well-formed one is replayed to the SDK app."""

    def __init__(self, app: Any, max_body: int = MAX_MESSAGE_BYTES):
        self.app = app
        self.max_body = max_body
        # (Mcp-Session-Id, JSON of the request id) of every request still being answered. The SDK keys its
        # response streams by request id alone and overwrites the first stream on a repeat: before this check,
        # each earlier request with a repeated in-flight id (review 3, H-R1: 8 concurrent calls with id 1 in one
        # session, 2-6 of them) was never answered, its connection and 4 MiB body held until the client gave up.
        # The value is the request's own token: a request frees only its own entry.
        self._in_flight: dict[tuple[str, str], object] = {}
        # bodies past LARGE_BODY_BYTES are checked and handled at most LARGE_BODIES_AT_ONCE at a time (review 15 H-R15:
        # 40 sessions each posting a 3.9 MB body under every cap took the server to 1 GB and stalled another session
        # 1.85 s: each body is parsed, validated again by the SDK on the event loop and re-serialised)
        self._large = anyio.Semaphore(LARGE_BODIES_AT_ONCE)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not headers.get("content-type", "").split(";")[0].strip().lower() == "application/json":
            await self.app(scope, receive, send)  # the SDK answers 415
            return
        try:
            declared = int(headers.get("content-length", ""))
        except ValueError:
            declared = None  # chunked: the size is known once the body is read
        # a body declared large waits for its turn before it is read: the bodies waiting hold no memory and cost the
        # event loop nothing (review 16, H-R16: 100 sessions posting 4 MB at once made the loop read 400 MB)
        if declared is not None and declared > self.max_body:  # refused unread
            await _json(send, 413, error_reply(INVALID_REQUEST, f"Invalid Request: body larger than {self.max_body} "
                                                                "bytes"))
            return
        turn = declared is not None and declared > LARGE_BODY_BYTES
        if turn and not await self._take_turn(send):
            return
        try:
            body = await self._read_body(receive, send)
            if body is None:
                return
            if not turn and is_large(body):
                if not await self._take_turn(send):
                    return
                turn = True
            await self._handle(scope, receive, send, headers, body)
        finally:
            if turn:
                self._large.release()

    async def _take_turn(self, send: Any) -> bool:
        """Wait up to :data:`LARGE_BODY_HOLD_S` for one of the :data:`LARGE_BODIES_AT_ONCE` turns of large bodies;
        False (and the request answered 503 "server busy") when none came."""
        with anyio.move_on_after(LARGE_BODY_HOLD_S):
            await self._large.acquire()
            return True
        await _json(send, 503, error_reply(SERVER_BUSY, f"Server busy: other large messages (over "
                                                        f"{LARGE_BODY_BYTES >> 10} KiB, or over {LARGE_BODY_VALUES:,} "
                                                        f"values) were being handled for {LARGE_BODY_HOLD_S:g} s; retry "
                                                        "this one in a moment"))
        return False

    async def _read_body(self, receive: Any, send: Any) -> bytes | None:
        """The request body, or None when the client left or the body is over ``max_body`` (answered 413)."""
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await _json(send, 413, error_reply(INVALID_REQUEST, f"Invalid Request: body larger than "
                                                                    f"{self.max_body} bytes"))
                return None
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)

    async def _handle(self, scope: dict[str, Any], receive: Any, send: Any, headers: dict[str, str],
                      body: bytes) -> None:
        """Check one JSON-RPC body and replay it to the SDK app (or answer its error)."""
        obj, err = await check_envelope_async(body)
        if err is not None:
            await _json(send, 400, err)
            return
        key = None
        if obj is not None and "method" in obj and "id" in obj and headers.get("mcp-session-id"):
            key = (headers["mcp-session-id"], json.dumps(obj["id"]))
            if key in self._in_flight:
                await _json(send, 400, error_reply(
                    INVALID_REQUEST, f"Invalid Request: id {key[1][:40]} is already used by a request of this session "
                    "that is still being answered; give each request in flight its own id", obj["id"]))
                return
            token = object()
            self._in_flight[key] = token
        sent = False

        def free() -> None:
            if key is not None and self._in_flight.get(key) is token:
                del self._in_flight[key]

        async def send_freeing(message: dict[str, Any]) -> None:
            # the id is free once the last byte of its response goes out, before it is sent: a client that got
            # its reply may reuse the id at once, while the SDK's handler is still returning (a repeat right after
            # the reply was refused as "still being answered", now and then, under load)
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                free()
            await send(message)

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            await self.app(scope, replay, send_freeing if key is not None else send)
        finally:
            free()


async def _json(send: Any, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
