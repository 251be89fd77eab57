"""A fake Anthropic Messages API on 127.0.0.1 for the Claude-brain tests.

It serves ``POST /v1/messages`` as the real API does (JSON in, a ``message`` object out), records
every request body the anthropic SDK sends (:attr:`FakeAnthropic.requests`), and answers with the
content blocks returned by a ``policy(request_body) -> list[block]`` callable: scripted
``tool_use`` blocks, like a model that calls tools. Point the SDK at it with
``base_url=fake.url``. It can also fail the first N requests with an HTTP status (to test the SDK's
retries).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Policy = Callable[[dict[str, Any]], list[dict[str, Any]]]


def tool_use(name: str, input: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_use`` content block (the id is filled in by the server)."""
    return {"type": "tool_use", "name": name, "input": input}


def text(t: str) -> dict[str, Any]:
    """A ``text`` content block."""
    return {"type": "text", "text": t}


class FakeAnthropic:
    """The fake API server; use as a context manager.

    Args:
        policy: maps a request body to the reply's content blocks.
        fail_first: answer the first ``fail_first`` requests with HTTP ``fail_status``.
        usage: (input_tokens, output_tokens) reported per reply.
    """

    def __init__(self, policy: Policy, fail_first: int = 0, fail_status: int = 529,
                 usage: tuple[int, int] = (1000, 200)):
        self.policy = policy
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.usage = usage
        self._ids = itertools.count()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                if not self.path.startswith("/v1/messages"):
                    self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
                    return
                if fake.fail_first > 0:
                    fake.fail_first -= 1
                    fake.requests.append({"failed": True, **body})
                    self._send(fake.fail_status, {"type": "error",
                                                  "error": {"type": "overloaded_error", "message": "overloaded"}})
                    return
                fake.requests.append(body)
                try:
                    blocks = fake.policy(body)
                except Exception as exc:  # noqa: BLE001 (a policy bug becomes an API error the test sees)
                    self._send(500, {"type": "error", "error": {"type": "api_error", "message": repr(exc)}})
                    return
                for b in blocks:
                    if b["type"] == "tool_use":
                        b.setdefault("id", f"toolu_{next(fake._ids):04d}")
                stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
                self._send(200, {"id": f"msg_{next(fake._ids):04d}", "type": "message", "role": "assistant",
                                 "model": body.get("model", "fake"), "content": blocks, "stop_reason": stop,
                                 "stop_sequence": None,
                                 "usage": {"input_tokens": fake.usage[0], "output_tokens": fake.usage[1]}})

            def _send(self, status: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeAnthropic:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def last_tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool_result blocks of the last user message, content parsed as JSON when possible."""
    msgs = body.get("messages", [])
    if not msgs or not isinstance(msgs[-1].get("content"), list):
        return []
    out = []
    for b in msgs[-1]["content"]:
        if b.get("type") == "tool_result":
            c = b.get("content")
            if isinstance(c, list):
                c = "".join(x.get("text", "") for x in c)
            try:
                c = json.loads(c)
            except (TypeError, json.JSONDecodeError):
                pass
            out.append({"is_error": b.get("is_error", False), "content": c})
    return out


def submit_tool(body: dict[str, Any]) -> str:
    """Name of the ``submit_*`` tool offered in this request (which role call this is)."""
    return next(t["name"] for t in body.get("tools", []) if t["name"].startswith("submit_"))


def turn(body: dict[str, Any]) -> int:
    """Number of assistant turns already in the conversation."""
    return sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
