"""Benchmark: MCP tool-call latency of EvoTrainer's servers vs a bare MCPServer echo tool, same run, same client.

Three transports: in-process (``mcp.Client(server)``), stdio (a server subprocess) and streamable HTTP
(a uvicorn subprocess on 127.0.0.1; ours with the bearer token and Origin check). For each, N sequential
rounds after a warm-up, the cases interleaved round-robin (same machine load for all), each call timed
with ``time.perf_counter``:

* ``bare``: ``echo(text) -> str`` on a plain ``MCPServer`` (the SDK's floor);
* ``ours:server_info``: the combined server's cheapest tool (no I/O): our plumbing (lifespan state,
  error mapping, typed result with its output schema, token / Origin middleware on HTTP) against the
  bare floor;
* ``ours:get_version`` (a 1.8 kB typed result the client validates against its output schema) and
  ``ours:list_analyzers`` (2.7 kB: the registry + the run's runtime analyzers): the common read tools of
  issue 21's goal (<= 1.5x the bare echo in-process at p50). Both are cached per lineage state (a repeated
  call with nothing written answers from the cache on the event loop; ``servers.common.cached_read``), so
  this measures the repeated-read path our agents hit; the first call after a write pays the SQLite read.

Reports p50 / p95 in milliseconds and the p50 ratio to the bare echo. In-process is measured twice: with the
SDK's ``Client`` as it comes (``in-process``: every structured result validated by ``jsonschema``) and with the
client our agents use (``in-process/agents``: ``agents.mcp_client.fast_result_validation``, the compiled
accept check in front of the same validator, on both the bare and our client).

Usage: ``python benchmarks/mcp_latency.py [--calls 200] [--json]``.
Internal: ``--bare-stdio`` and ``--bare-http PORT`` run the bare server (used by the benchmark itself).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOKEN = "bench-token-0123456789abcdef"


def bare_server():
    """The reference: a bare MCPServer with one echo tool."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bare", log_level="WARNING")

    @server.tool()
    async def echo(text: str) -> str:
        """Echo the text back (async, like server_info: neither pays the worker-thread hop of sync tools)."""
        return text

    return server


def make_run(root: Path) -> Path:
    """A run with a root and two children (untimed)."""
    from evotrainer.intervention import Intervention
    from evotrainer.recipe import Recipe
    from evotrainer.workspace import Workspace

    run = root / "run"
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(Recipe())
        ws.lineage.branch("v0", Intervention(path="eps_clip_high", old=0.28, new=0.3, category="optimizer"))
        ws.lineage.branch("v0", Intervention(path="temperature", old=1.0, new=0.8, category="rollout"))
    return run


def percentiles(xs: list[float]) -> tuple[float, float]:
    """(p50, p95) in milliseconds."""
    xs = sorted(xs)
    return 1000 * statistics.median(xs), 1000 * xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


async def time_interleaved(clients: dict, cases: dict, n: int, warmup: int = 20) -> dict[str, list[float]]:
    """Seconds per call of each case, calls interleaved round-robin (``n`` timed rounds after ``warmup``) so
    that every case sees the same machine load; every call must succeed."""
    out: dict[str, list[float]] = {c: [] for c in cases}
    for i in range(warmup + n):
        for case, (tool, args) in cases.items():
            client = clients["bare" if case == "bare" else "ours"]
            t0 = time.perf_counter()
            r = await client.call_tool(tool, args)
            dt = time.perf_counter() - t0
            if r.is_error:
                raise RuntimeError(f"{tool} failed: {r.content[0].text}")
            if i >= warmup:
                out[case].append(dt)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(port: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"no server on port {port} after {timeout} s")


def measure(run: Path, n: int) -> dict:
    """Time bare vs ours on the three transports; returns ``{transport: {case: {p50_ms, p95_ms}}}``."""
    import anyio
    import httpx2
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    from evotrainer.agents.mcp_client import fast_result_validation
    from evotrainer.servers.app import build_server

    cases = {"bare": ("echo", {"text": "hello"}), "ours:server_info": ("server_info", {}),
             "ours:get_version": ("get_version", {"version_id": "v1"}),
             "ours:list_analyzers": ("list_analyzers", {})}
    results: dict = {}

    async def bench(transport: str, make_client, fast: bool = False) -> None:
        async with make_client("bare") as bare, make_client("ours") as ours:
            if fast and not (fast_result_validation(bare) and fast_result_validation(ours)):
                raise RuntimeError("this mcp SDK has no output-schema validator hook; see agents/mcp_client.py")
            times = await time_interleaved({"bare": bare, "ours": ours}, cases, n)
        results[transport] = {}
        for case, xs in times.items():
            p50, p95 = percentiles(xs)
            results[transport][case] = {"p50_ms": round(p50, 3), "p95_ms": round(p95, 3)}

    servers = {"bare": bare_server(), "ours": build_server("all", run)}
    anyio.run(bench, "in-process", lambda which: Client(servers[which]))
    anyio.run(bench, "in-process/agents", lambda which: Client(servers[which]), True)

    here = Path(__file__).resolve()
    stdio = {"bare": StdioServerParameters(command=sys.executable, args=[str(here), "--bare-stdio"]),
             "ours": StdioServerParameters(command=sys.executable, args=["-m", "evotrainer.cli", "serve", "all",
                                                                         "--run", str(run)],
                                           env={"HF_HUB_OFFLINE": "1"})}
    anyio.run(bench, "stdio", lambda which: Client(stdio[which]))

    ports = {"bare": _free_port(), "ours": _free_port()}
    env = {**os.environ, "EVOTRAINER_MCP_TOKEN": TOKEN, "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, str(here), "--bare-http", str(ports["bare"])], env=env,
                              stderr=subprocess.DEVNULL),
             subprocess.Popen([sys.executable, "-m", "evotrainer.cli", "serve", "all", "--transport", "http", "--run",
                               str(run), "--port", str(ports["ours"])], env=env, stderr=subprocess.DEVNULL)]
    try:
        for p in ports.values():
            _wait_http(p)

        def http_client(which: str):
            headers = {"Authorization": f"Bearer {TOKEN}"} if which == "ours" else {}
            return Client(streamable_http_client(f"http://127.0.0.1:{ports[which]}/mcp",
                                                 http_client=httpx2.AsyncClient(headers=headers)))

        anyio.run(bench, "http", http_client)
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    for per in results.values():
        base = per["bare"]["p50_ms"]
        for r in per.values():
            r["ratio_p50"] = round(r["p50_ms"] / base, 3)
    return results


def main() -> None:
    """Measure every transport and case on a hand-sized run and print p50 / p95 in ms (or ``--json``);
    ``--bare-stdio`` / ``--bare-http PORT`` serve the bare echo server (the subprocesses the measurement starts)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="Timed calls per case and transport.")
    ap.add_argument("--json", action="store_true", help="Print JSON.")
    ap.add_argument("--bare-stdio", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bare-http", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.bare_stdio:
        bare_server().run("stdio")
        return
    if a.bare_http is not None:
        import uvicorn

        uvicorn.run(bare_server().streamable_http_app(), host="127.0.0.1", port=a.bare_http, log_level="warning")
        return
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(make_run(Path(tmp)), a.calls)
    if a.json:
        print(json.dumps(results, indent=2))
        return
    print(f"MCP tool-call latency, {a.calls} sequential calls per case (ms)")
    print(f"{'transport':<17} {'case':<22} {'p50':>8} {'p95':>8} {'p50 / bare':>11}")
    for transport, per in results.items():
        for case, r in per.items():
            print(f"{transport:<17} {case:<22} {r['p50_ms']:>8.2f} {r['p95_ms']:>8.2f} {r['ratio_p50']:>11.2f}")
    print("goals: in-process ours / bare <= 1.5 at p50 for the common read tools (get_version, list_analyzers; "
          "issue 21); server_info: the plumbing alone")


if __name__ == "__main__":
    main()
