"""`evotrainer serve` over stdio and streamable HTTP (token, Origin, bind rules) and `evotrainer mcp-config`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from mcp_testlib import SyncClient, make_run

from evotrainer.servers.http import check_bind, check_port, origin_allowed, resolve_token

TOKEN = "test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("t"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stdio_server_subprocess(run):
    from mcp import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "evotrainer.cli", "serve", "logs", "--run",
                                                                 str(run)], env={"HF_HUB_OFFLINE": "1"})
    c = SyncClient(params)
    try:
        assert {t.name for t in c.tools()} == {"search_logs", "list_metrics", "get_metric_series", "metric_summary",
                                             "server_info"}
        assert c.ok("list_metrics")["names"] == ["reward/mean"]
        assert "not a valid regex" in c.err("search_logs", {"query": "[", "regex": True})
        assert c.ok("search_logs", {"level": "error"})["total"] == 1  # still serving after the error
    finally:
        c.close()


@pytest.fixture(scope="module")
def http_server(run):
    port = _free_port()
    env = dict(os.environ, EVOTRAINER_MCP_TOKEN=TOKEN, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "evotrainer.cli", "serve", "training", "--transport", "http",
                             "--run", str(run), "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    banner = proc.stderr.readline() + proc.stderr.readline()
    url = f"http://127.0.0.1:{port}/mcp"
    for _ in range(200):  # wait until uvicorn accepts connections
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    yield url, banner
    proc.terminate()
    proc.wait(30)


def test_http_banner_and_rejections(http_server):
    url, banner = http_server
    assert url in banner and "bearer token: the value of EVOTRAINER_MCP_TOKEN" in banner and TOKEN not in banner
    init = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    hdr = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    no_token = httpx.post(url, json=init, headers=hdr)
    assert no_token.status_code == 401 and no_token.headers["www-authenticate"].startswith("Bearer")
    bad_token = httpx.post(url, json=init, headers={**hdr, "Authorization": "Bearer wrong"})
    assert bad_token.status_code == 401
    foreign = httpx.post(url, json=init, headers={**hdr, "Authorization": f"Bearer {TOKEN}",
                                                  "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and "Origin" in foreign.text
    rebind = httpx.post(url, json=init, headers={**hdr, "Authorization": f"Bearer {TOKEN}", "Host": "evil.example"})
    assert rebind.status_code == 421  # the SDK's Host check (DNS rebinding) stays on for loopback binds


def test_http_malformed_requests_never_kill_the_server(http_server):
    url, _ = http_server
    hdr = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
           "Authorization": f"Bearer {TOKEN}"}
    bodies = [b"", b"{", b"null", b"[]", b"[1, 2]", b'{"jsonrpc": "1.0"}', b'{"jsonrpc": "2.0", "id": 1}',
              b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 5}}',
              b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}', b"\xff\xfe\x00" * 100,
              b'{"jsonrpc": "2.0", "id": 1, "method": "' + b"a" * 100_000 + b'"}']
    for i in range(60):
        r = httpx.post(url, content=bodies[i % len(bodies)], headers=hdr, timeout=30)
        assert 200 <= r.status_code < 500, (i, r.status_code, r.text[:200])  # a reply, never a crash (5xx)
    assert httpx.post(url, content=b"{}", headers={**hdr, "Content-Type": "text/plain"}).status_code in (400, 415)


def test_http_client_with_token(http_server):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    url, _ = http_server
    hc = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}", "Origin": "http://localhost:6274"})
    c = SyncClient(streamable_http_client(url, http_client=hc))
    try:
        assert c.ok("list_versions")["total"] == 2
        assert "not found" in c.err("get_version", {"version_id": "v9"})
        assert c.ok("diff_versions", {"a": "v0", "b": "v1"})["changes"][0]["path"] == "eps_clip_high"
    finally:
        c.close()


def test_port_out_of_range_or_in_use_is_refused_before_the_url_and_token_are_printed(tmp_path):
    """A new user's report: ``serve --transport http --port 99999`` printed the URL and bearer token, then uvicorn's
    traceback; a busy port printed them, then uvicorn's error. Now both are one error line, and nothing is announced."""
    import socket
    import subprocess
    import sys

    for bad in (0, 65536, 99999, -1):
        with pytest.raises(ValueError, match=rf"--port {bad}: a TCP port is 1-65535"):
            check_port("127.0.0.1", bad)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=rf"--port {port} on 127.0.0.1: cannot listen there: already in use"):
            check_port("127.0.0.1", port)
        r = subprocess.run([sys.executable, "-m", "evotrainer.cli", "serve", "logs", "--transport", "http", "--port",
                            str(port), "--run", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "already in use" in r.stderr
        assert "bearer token" not in r.stderr and "http://" not in r.stderr  # refused before the announcement
    check_port("127.0.0.1", port)  # free again once closed


def test_bind_and_token_rules(monkeypatch):
    check_bind("127.0.0.1", False)
    check_bind("::1", False)
    with pytest.raises(ValueError, match="--allow-public"):
        check_bind("0.0.0.0", False)
    check_bind("0.0.0.0", True)
    monkeypatch.delenv("EVOTRAINER_MCP_TOKEN", raising=False)
    tok, generated = resolve_token()
    assert generated and len(tok) >= 32
    monkeypatch.setenv("EVOTRAINER_MCP_TOKEN", "short")
    with pytest.raises(ValueError, match="at least 16"):
        resolve_token()
    assert origin_allowed(None) and origin_allowed("http://127.0.0.1:6274") and origin_allowed("https://localhost")
    assert not origin_allowed("http://localhost.evil.example") and not origin_allowed("null")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_serve_refuses_public_bind_and_bad_names():
    r = _cli("serve", "training", "--transport", "http", "--host", "0.0.0.0")
    assert r.returncode == 1 and "--allow-public" in r.stderr
    r = _cli("serve", "nope")
    assert r.returncode == 1 and "choose one of training, rollouts, logs, analyzers, skills, all" in r.stderr


def test_mcp_config_print_and_install(tmp_path, run):
    r = _cli("mcp-config", "--run", str(run))
    assert r.returncode == 0
    entry = json.loads(r.stdout)["mcpServers"]["evotrainer"]
    assert entry["command"] == sys.executable
    assert entry["args"] == ["-m", "evotrainer.cli", "serve", "all", "--transport", "stdio", "--run", str(run)]
    cfg = tmp_path / "claude_desktop_config.json"
    cfg.write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}, "theme": "dark"}))
    r = _cli("mcp-config", "--install", "--config-path", str(cfg), "--run", str(run), "--server", "skills")
    assert r.returncode == 0, r.stderr
    data = json.loads(cfg.read_text())
    assert data["theme"] == "dark" and data["mcpServers"]["other"] == {"command": "x"}
    assert data["mcpServers"]["evotrainer"]["args"][3] == "skills"
    cfg.write_text("{broken")
    r = _cli("mcp-config", "--install", "--config-path", str(cfg))
    assert r.returncode == 1 and "not valid JSON" in r.stderr
