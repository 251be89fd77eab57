"""Streamable-HTTP transport with the project's security rules (docs/design.md §3).

- binds 127.0.0.1 by default; a non-loopback address needs ``allow_public=True`` (``--allow-public``);
- every request needs ``Authorization: Bearer <token>`` (token from ``EVOTRAINER_MCP_TOKEN`` or
  generated and printed at start); a wrong or missing token gets 401 with ``WWW-Authenticate``;
- a request with a foreign ``Origin`` header gets 403 (DNS-rebinding protection: only
  ``http(s)://127.0.0.1|localhost|[::1]`` on any port, plus ``allowed_origins``). The SDK's own
  ``Host`` header check stays on for loopback binds.

The check is a plain ASGI middleware around the SDK's ``streamable_http_app`` (``/mcp``); tokens are
compared in constant time (``hmac.compare_digest``).

Behind the security check, :class:`~evotrainer.servers.envelope.EnvelopeGuard` answers malformed JSON-RPC
bodies (-32700 / -32600). Sessions expire after ``session_idle_s`` seconds without a request (default
:data:`SESSION_IDLE_S`, or ``$EVOTRAINER_MCP_SESSION_IDLE_S``) and at most ``max_sessions`` are open at once
(default :data:`MAX_SESSIONS`, or ``$EVOTRAINER_MCP_MAX_SESSIONS``); past the cap a new session closes the least
recently used session that has had no request or stream in flight for at least the eviction floor (default
:data:`EVICT_IDLE_S` or half the idle timeout, or ``$EVOTRAINER_MCP_EVICT_IDLE_S``; :func:`evict_idle_sessions`),
and gets HTTP 503 with ``Retry-After`` when there is none. Measured cost of an idle session: see ``tests/test_security_mcp.py``.

Below HTTP (:class:`GuardedH11Protocol`, before any token is seen): a connection that has not sent a whole
request head within ``header_timeout_s`` (default :data:`HEADER_TIMEOUT_S`, or ``$EVOTRAINER_MCP_HEADER_TIMEOUT_S``)
is closed, and past ``max_connections`` open connections (default :data:`MAX_CONNECTIONS`, at most half the
process's file-descriptor limit, or ``$EVOTRAINER_MCP_MAX_CONNECTIONS``) a new one gets 503 and is closed at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import hmac
import ipaddress
import json
import math
import os
import resource
import secrets
import signal
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import h11
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from uvicorn.protocols.http.h11_impl import H11Protocol

from evotrainer.errors import EvoTrainerError
from evotrainer.servers import common
from evotrainer.servers.common import prefer_the_event_loop
from evotrainer.servers.envelope import EnvelopeGuard
from evotrainer.servers.protocol import ProtocolVersionGuard

TOKEN_ENV = "EVOTRAINER_MCP_TOKEN"
SESSION_IDLE_ENV = "EVOTRAINER_MCP_SESSION_IDLE_S"
MAX_SESSIONS_ENV = "EVOTRAINER_MCP_MAX_SESSIONS"
SESSION_IDLE_S = 30 * 60.0  # an HTTP session without a request for this long is closed (the SDK's default)
MAX_SESSIONS = 1000  # open HTTP sessions at once (the SDK allows 10,000)
EVICT_IDLE_ENV = "EVOTRAINER_MCP_EVICT_IDLE_S"
EVICT_IDLE_S = 60.0  # at the cap, a new session may close one idle this long (or half the idle timeout, if less)
HEADER_TIMEOUT_ENV = "EVOTRAINER_MCP_HEADER_TIMEOUT_S"
MAX_CONNECTIONS_ENV = "EVOTRAINER_MCP_MAX_CONNECTIONS"
HEADER_TIMEOUT_S = 10.0  # a connection gets this long to send each request's head (line and headers)
BODY_TIMEOUT_FACTOR = 6  # ... and this many head timeouts (60 s by default) to send its body (capped at 5 MiB)
MAX_CONNECTIONS = 1000  # open TCP connections at once (SSE streams included), and at most half of RLIMIT_NOFILE
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
MCP_PATH = "/mcp"


class ServeError(EvoTrainerError, ValueError):
    """The server cannot be started with these options (public bind without consent, bad token)."""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, allow_public: bool) -> None:
    """Refuse a non-loopback bind address unless ``allow_public``.

    Raises:
        ServeError: ``host`` is reachable from other machines and ``allow_public`` is False.
    """
    if not is_loopback(host) and not allow_public:
        raise ServeError(f"--host {host} exposes the MCP server (training control, code execution) beyond this "
                         "machine; pass --allow-public to do it deliberately (the bearer token stays required)")


def check_port(host: str, port: int) -> None:
    """Refuse a port outside 1-65535, or one another process already listens on at ``host``, before anything is
    announced: before, ``--port 99999`` printed the URL and the bearer token and then uvicorn's traceback, and a busy
    port printed them and then uvicorn's "address already in use" (a new user's report).

    The check binds a socket as uvicorn will (``SO_REUSEADDR``) and closes it at once; a process that takes the port
    in the moment between is still reported by uvicorn.

    Raises:
        ServeError: the port is out of range, in use, or cannot be bound at ``host`` (the message says which).
    """
    if not 1 <= port <= 65535:
        raise ServeError(f"--port {port}: a TCP port is 1-65535; choose one (default 8765)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            why = "already in use (another server on it?)" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
            raise ServeError(f"--port {port} on {host}: cannot listen there: {why}; choose another --port") from None


def resolve_token(token: str | None = None) -> tuple[str, bool]:
    """``(token, generated)``: the given token, else ``$EVOTRAINER_MCP_TOKEN``, else a new random one.

    Raises:
        ServeError: the token is shorter than 16 characters.
    """
    tok = token or os.environ.get(TOKEN_ENV)
    generated = not tok
    tok = tok or secrets.token_urlsafe(32)
    if len(tok) < 16:
        raise ServeError(f"the MCP token must be at least 16 characters (got {len(tok)}); set {TOKEN_ENV} "
                         "to a longer secret or unset it to generate one")
    return tok, generated


def origin_allowed(origin: str | None, extra: tuple[str, ...] = ()) -> bool:
    """True when there is no Origin header, or it is a loopback origin, or it is listed in ``extra``."""
    if not origin:
        return True
    if origin in extra:
        return True
    try:
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and is_loopback(parts.hostname or "")
    except ValueError:
        return False


class SecurityMiddleware:
    """ASGI middleware: reject foreign Origins (403) and requests without the bearer token (401)."""

    def __init__(self, app: Any, token: str, allowed_origins: tuple[str, ...] = ()):
        self.app = app
        self._token = token.encode()
        self.allowed_origins = allowed_origins

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not origin_allowed(headers.get("origin"), self.allowed_origins):
            await _respond(send, 403, "forbidden: foreign Origin header (DNS-rebinding protection)")
            return
        auth = headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
            await _respond(send, 401, f"unauthorized: send 'Authorization: Bearer <token>' (the token printed at "
                                      f"start or ${TOKEN_ENV})", [(b"www-authenticate", b'Bearer realm="evotrainer"')])
            return
        await self.app(scope, receive, send)


async def _respond(send: Any, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def _positive(value: Any, env: str, default: Any, kind: type) -> Any:
    """``value``, else ``$env``, else ``default``, as a positive finite ``kind`` (int or float).

    Raises:
        ServeError: a value that is not a positive number.
    """
    raw = value if value is not None else os.environ.get(env)
    if raw is None or raw == "":
        return default
    try:
        out = kind(raw)
    except ValueError:
        out = None
    if out is None or not out > 0 or out != out or out == float("inf"):
        raise ServeError(f"{env}={raw!r}: give a positive {'integer' if kind is int else 'number of seconds'}")
    return out


def session_limits(session_idle_s: float | None = None, max_sessions: int | None = None) -> tuple[float, int]:
    """``(idle seconds, session cap)`` from the arguments, else the environment, else the defaults.

    Raises:
        ServeError: a value that is not a positive number.
    """
    return (_positive(session_idle_s, SESSION_IDLE_ENV, SESSION_IDLE_S, float),
            _positive(max_sessions, MAX_SESSIONS_ENV, MAX_SESSIONS, int))


def connection_limits(header_timeout_s: float | None = None, max_connections: int | None = None
                      ) -> tuple[float, int]:
    """``(header timeout in seconds, connection cap)`` from the arguments, else the environment, else the defaults;
    the default cap is at most half the soft ``RLIMIT_NOFILE`` (the server needs descriptors for its stores too).

    Raises:
        ServeError: a value that is not a positive number.
    """
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    default_cap = MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(8, min(MAX_CONNECTIONS, soft // 2))
    return (float(_positive(header_timeout_s, HEADER_TIMEOUT_ENV, HEADER_TIMEOUT_S, float)),
            int(_positive(max_connections, MAX_CONNECTIONS_ENV, default_cap, int)))


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head and a cap on open connections.

    uvicorn closes a connection only when it is idle after a response (keep-alive); one that connects and sends
    part of a request line, or of its headers, was kept open forever, before the bearer token is ever checked:
    about 20,000 such connections from one local process used up the server's file descriptors (its accept()
    failing with EMFILE in a loop), and no client could connect until they went away. Here a connection must
    complete each request head within :attr:`header_timeout_s` (a request being answered, a long SSE stream
    included, is not timed), and a connection past :attr:`max_connections` gets 503 and is closed at accept, so
    the descriptors stay bounded. Class attributes are set per server by :func:`guarded_protocol`.
    """

    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_since = 0.0
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._evict_oldest_waiting():
            transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
                            b"connection: close\r\ncontent-length: 43\r\n\r\n"
                            b"too many connections to the MCP server now\n")
            transport.close()
            return
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_head():
            self._arm_head_timer()
        else:
            self._cancel_head_timer()
        if self.conn.their_state is h11.SEND_BODY:
            self._arm_body_timer()
        else:
            self._cancel_body_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        super().connection_lost(exc)

    # Review 6 (H-R6b): a client with the token sent a head with Content-Length: 1000000 and one body byte, then
    # nothing: the connection stayed open for good (it is in a request, so neither timed nor evicted), and such
    # connections could fill the cap. A request body must arrive within BODY_TIMEOUT_FACTOR head timeouts.
    def _arm_body_timer(self) -> None:
        if getattr(self, "_body_timer", None) is None:
            self._body_timer: asyncio.TimerHandle | None = self.loop.call_later(
                BODY_TIMEOUT_FACTOR * self.header_timeout_s, self._body_timed_out)

    def _cancel_body_timer(self) -> None:
        timer, self._body_timer = getattr(self, "_body_timer", None), None
        if timer is not None:
            timer.cancel()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self.transport.close()

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_since = self.loop.time()
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _evict_oldest_waiting(self) -> bool:
        """At the cap, close the connection that has waited longest for a request head (a half-sent head, or an
        idle keep-alive), so the newcomer is served; False when every other one is in a request or a stream.

        Review 6: refusing the newcomer let one local process without the token keep the cap full by reopening
        half-sent heads as the head timeout closed them: an authenticated client got 503 for 108 of 109 requests
        in 35 s (cap 50). A connection waiting for a head holds nothing of the server's, so it is the one to go."""
        waiting = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol)
                   and getattr(c, "_head_timer", None) is not None and not c.transport.is_closing()]
        if not waiting:
            return False
        min(waiting, key=lambda c: c._head_since).transport.close()
        return True

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(header_timeout_s: float | None = None, max_connections: int | None = None
                     ) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` subclass with these limits (:func:`connection_limits`), for ``uvicorn.run(http=)``."""
    timeout, cap = connection_limits(header_timeout_s, max_connections)
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": timeout, "max_connections": cap})


def eviction_floor(value: float | None = None, session_idle_s: float = SESSION_IDLE_S) -> float:
    """Seconds a session must have been idle before a newcomer at the cap may close it: ``value``, else
    ``$EVOTRAINER_MCP_EVICT_IDLE_S``, else :data:`EVICT_IDLE_S` or half the idle timeout, whichever is less.

    Raises:
        ServeError: a value that is not a positive number.
    """
    return float(_positive(value, EVICT_IDLE_ENV, min(EVICT_IDLE_S, session_idle_s / 2), float))


def _idle_sessions(manager: Any, now: float) -> list[tuple[float, str]]:
    """``(idle since, id)`` of each open session with no request or stream in flight (the SDK's transport sets
    its idle deadline to the end of its last request plus the idle timeout; infinite while one is in flight);
    a session still opening (no idle scope yet) or being closed is left out."""
    idle_timeout = manager.session_idle_timeout
    out = []
    for sid, transport in list(manager._server_instances.items()):
        scope = getattr(transport, "idle_scope", None)
        if (scope is None or scope.cancel_called or getattr(transport, "_requests_in_flight", 1) != 0
                or getattr(transport, "is_terminated", False) or not math.isfinite(scope.deadline)
                or idle_timeout is None):
            continue
        out.append((min(now, scope.deadline - idle_timeout), sid))
    return out


def _least_recently_used_idle(manager: Any, floor_s: float = 0.0) -> str | None:
    """The id of the open session whose last request ended earliest among those with no request or stream in flight
    and idle for at least ``floor_s`` seconds, or None when there is none."""
    now = asyncio.get_running_loop().time()
    idle = [(since, sid) for since, sid in _idle_sessions(manager, now) if now - since >= floor_s]
    return min(idle)[1] if idle else None


_REFUSAL: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("evotrainer_session_refusal",
                                                                                 default=None)


def evict_idle_sessions(manager: Any, floor_s: float = EVICT_IDLE_S) -> None:
    """Make ``manager`` (the SDK's ``StreamableHTTPSessionManager``) close, at its session cap, the least recently
    used session idle (no request or stream in flight) for at least ``floor_s`` seconds to admit a new one, as
    :class:`GuardedH11Protocol` does for connections; when there is none the newcomer gets 503 with a JSON-RPC
    error naming the cap, the floor and the fix, and ``Retry-After`` (seconds until the first idle session passes
    the floor, or the floor).

    Review 10 (H-R10): 1,000 ``initialize`` requests with the token and nothing after filled the cap in 3.3 s, and
    every newcomer got 503 for up to the idle timeout (30 min). The evicted session is forgotten at once (its id
    answers 404) and its idle scope is cancelled, which ends its server task the way an idle expiry does.

    Review 11 (H-R11): evicting any idle session let a token holder end every other client's session at will
    (5 ``initialize`` with a cap of 5, and a client's next ping got 404 "Session not found"). Only a session idle
    past the floor is closed now; a session in use is kept and the flood is refused instead.
    """
    admit = manager._admit_session

    def admit_or_evict(requestor: Any) -> Any:
        cap = manager.max_sessions
        if cap is not None and len(manager._server_instances) >= cap:
            sid = _least_recently_used_idle(manager, floor_s)
            if sid is not None:
                transport = manager._server_instances.pop(sid)
                manager._session_owners.pop(sid, None)
                transport.idle_scope.cancel()
            else:
                box = _REFUSAL.get()
                if box is not None:
                    now = asyncio.get_running_loop().time()
                    waits = [floor_s - (now - since) for since, _ in _idle_sessions(manager, now)]
                    box["sessions"] = len(manager._server_instances)
                    box["retry_after"] = max(1, math.ceil(min(waits, default=floor_s)))
        return admit(requestor)

    manager._admit_session = admit_or_evict
    inner = manager.asgi_app

    async def explain_refusal(scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Replace the SDK's bare 503 'Too many open sessions' with the cap, the floor, the fix and Retry-After."""
        box: dict[str, Any] = {}
        token = _REFUSAL.set(box)
        replaced = False

        async def send_explained(message: dict[str, Any]) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and message.get("status") == 503 and "sessions" in box:
                replaced = True
                text = (f"the server holds {box['sessions']} sessions (its cap), none idle past {floor_s:g} s; close "
                        f"a session (DELETE) or raise {MAX_SESSIONS_ENV}")
                body = json.dumps({"jsonrpc": "2.0", "id": None,
                                   "error": {"code": -32603, "message": text}}).encode()
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()),
                                        (b"retry-after", str(box["retry_after"]).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            if replaced and message["type"] == "http.response.body":
                return
            await send(message)

        try:
            await inner(scope, receive, send_explained)
        finally:
            _REFUSAL.reset(token)

    manager.asgi_app = explain_refusal


def http_app(server: MCPServer[Any], token: str, host: str = "127.0.0.1", allowed_origins: tuple[str, ...] = (),
             session_idle_s: float | None = None, max_sessions: int | None = None,
             evict_idle_s: float | None = None) -> Any:
    """The ASGI app: the SDK's streamable-HTTP app at ``/mcp`` behind :class:`EnvelopeGuard` and
    :class:`SecurityMiddleware` (outermost), with idle expiry and a cap on sessions (:func:`session_limits`) that
    closes only sessions idle past :func:`eviction_floor`."""
    idle, cap = session_limits(session_idle_s, max_sessions)
    floor = eviction_floor(evict_idle_s, idle)
    security = None if is_loopback(host) else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    inner = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host, transport_security=security,
                                       session_idle_timeout=idle, max_sessions=cap)
    evict_idle_sessions(server.session_manager, floor)
    return SecurityMiddleware(EnvelopeGuard(ProtocolVersionGuard(inner)), token, allowed_origins)


def serve_http(server: MCPServer[Any], *, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
               allow_public: bool = False, allowed_origins: tuple[str, ...] = (),
               announce: Any = None) -> None:
    """Serve ``server`` over streamable HTTP until interrupted.

    Args:
        announce: called with ``(url, token, generated)`` before serving (the CLI prints them).

    Raises:
        ServeError: public bind without ``allow_public``, a port out of range or in use, or a too-short token.
    """
    check_bind(host, allow_public)
    check_port(host, port)
    tok, generated = resolve_token(token)
    app = http_app(server, tok, host, allowed_origins)
    protocol = guarded_protocol()
    if announce is not None:
        shown = f"[{host}]" if ":" in host else host
        announce(f"http://{shown}:{port}{MCP_PATH}", tok, generated)
    prefer_the_event_loop()
    # uvicorn re-raises the SIGTERM it caught once its graceful shutdown is over; with the default action the
    # process died right there, before the jobs below were stopped (a job row left 'running'). A SystemExit
    # instead unwinds through the finally.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", lifespan="on", http=protocol,
                    timeout_graceful_shutdown=max(1, math.ceil(common.STDIO_EOF_GRACE_S)))
    finally:  # stop the jobs (marked interrupted) before the interpreter's teardown (review 10, W-R10)
        stop_jobs = getattr(server, "stop_jobs", None)
        left = stop_jobs() if stop_jobs is not None else []
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        # tool bodies still running (a sandbox of up to 600 s) get the grace period, then the process ends without
        # waiting for them, as the stdio server does at EOF: the interpreter's exit would wait for their threads
        end = time.monotonic() + common.STDIO_EOF_GRACE_S
        while common.tool_threads() and time.monotonic() < end:
            time.sleep(0.05)
        if main:
            common.exit_if_busy(left)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)
