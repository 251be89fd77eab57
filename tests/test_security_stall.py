"""Security suite: no number of concurrent tool calls can stall an MCP server (issue 22, the red team's
second probe set: "a tool thread past its deadline keeps running").

Measured before the fix (servers/common.py docstring, stdio server, ping every 50 ms, this 2-core machine):
20 concurrent pure-Python tool calls delayed a ping by 11.4 s (GIL convoy); 45 concurrent slow calls took
all 40 tokens of anyio's default thread limiter, and the stdio reader with them (a ping waited 10 s); over
HTTP another session's ``list_versions`` waited 24 s behind 45 ``run_analyzer_code`` calls, 45 sandboxes
running at once. Each test below failed on that code.

The servers are real: the stdio ones are subprocesses running ``build_server("logs", run)`` plus two probe
tools made with the product's own ``common.tool`` (a pure-Python spin, a sleep), over the product's stdio
transport; the HTTP one is ``evotrainer serve all --transport http`` with real sandboxes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from mcp_testlib import make_run

from evotrainer.sandbox import sandbox_info

SERVER = r'''
import os, sys, threading, time
from evotrainer.servers import common
from evotrainer.servers.app import build_server

server = build_server("logs", sys.argv[1])
lock, running, peak = threading.Lock(), [0], [0]


def _count(delta):
    with lock:
        running[0] += delta
        peak[0] = max(peak[0], running[0])


@common.tool(server, deadline_s=float(sys.argv[2]))
def spin(seconds: float, until: str = "") -> str:
    """A pure-Python loop (holds the GIL between switch intervals) for ``seconds``, or until the file ``until``
    exists (at most ``seconds``)."""
    _count(1)
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end and not (until and n % 1000 == 0 and os.path.exists(until)):
        n += 1
    _count(-1)
    return str(n)


@common.tool(server, deadline_s=float(sys.argv[2]))
def nap(seconds: float, until: str = "") -> str:
    """Sleeps (holds a worker thread, not the GIL) ``seconds``, or until the file ``until`` exists (at most
    ``seconds``)."""
    _count(1)
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (until and os.path.exists(until)):
        time.sleep(0.05)
    _count(-1)
    return "slept"


@common.tool(server)
def peak_running() -> str:
    """Most probe bodies that ran at once."""
    return str(peak[0])


server.run("stdio")
'''


class Stdio:
    """Raw JSON-RPC lines to a stdio server subprocess; replies collected by id in a reader thread."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.replies: dict[str, dict] = {}
        self.cv = threading.Condition()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        assert self.request("initialize", init, timeout=120) is not None
        self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.cv:
                self.replies[json.dumps(msg.get("id"))] = msg
                self.cv.notify_all()

    def _write(self, msg: dict) -> None:
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def send(self, method: str, params: dict) -> int:
        with self.cv:
            self.next_id += 1
            rid = self.next_id
        self._write({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return rid

    def wait(self, rid: int, timeout: float) -> dict | None:
        end = time.monotonic() + timeout
        with self.cv:
            while json.dumps(rid) not in self.replies:
                if not self.cv.wait(max(0.0, end - time.monotonic())):
                    return None
            return self.replies.pop(json.dumps(rid))

    def request(self, method: str, params: dict, timeout: float = 60) -> dict | None:
        return self.wait(self.send(method, params), timeout)

    def tool_text(self, rid: int, timeout: float) -> str:
        reply = self.wait(rid, timeout)
        assert reply is not None, f"call {rid}: no reply in {timeout} s"
        return reply["result"]["content"][0]["text"]

    def ping_latencies(self, seconds: float) -> list[float]:
        """Ping every 50 ms for ``seconds``; each latency from send to reply (99 if none came in 30 s)."""
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            out.append(time.monotonic() - t0 if self.request("ping", {}, timeout=30) is not None else 99.0)
            time.sleep(0.05)
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture
def probe_server(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    s = Stdio([sys.executable, str(script), str(make_run(tmp_path)), "3"])
    yield s
    s.close()


# The probe bodies run until the test creates a file (at most 120 s), not for a fixed time: with a 5 s body a call
# whose worker thread started 2 s late on a loaded machine could still get a slot when the first two ended, and
# count as a third "did not finish". Ping bounds: 5 s (the code before the fix: 11.4 s for the spins, 10 s for the
# naps).


def test_twenty_cpu_bound_calls_do_not_delay_a_ping(probe_server, tmp_path):
    s, flag = probe_server, str(tmp_path / "release")
    rids = [s.send("tools/call", {"name": "spin", "arguments": {"seconds": 120, "until": flag}}) for _ in range(20)]
    lat = s.ping_latencies(6)
    assert max(lat) < 5.0, f"ping latencies up to {max(lat):.2f} s while 20 spinning calls ran"
    texts = [s.tool_text(r, 60) for r in rids]
    # the 2 that got a slot ran past the 3 s deadline; the 18 others never got one
    assert all(t.startswith("Error executing tool spin") for t in texts)
    assert sum("did not finish within 3 s" in t for t in texts) == 2
    assert sum("server busy: 2 tool call(s) were running" in t for t in texts) == 18
    (tmp_path / "release").touch()
    assert s.tool_text(s.send("tools/call", {"name": "peak_running", "arguments": {}}), 60) == "2"


def test_many_slow_calls_leave_the_stdio_reader_its_threads(probe_server, tmp_path):
    s, flag = probe_server, str(tmp_path / "release")
    rids = [s.send("tools/call", {"name": "nap", "arguments": {"seconds": 120, "until": flag}}) for _ in range(45)]
    lat = s.ping_latencies(4)
    assert max(lat) < 5.0, f"ping latencies up to {max(lat):.2f} s while 45 slow calls were in flight"
    texts = [s.tool_text(r, 60) for r in rids]
    assert sum("did not finish within 3 s" in t for t in texts) == 2
    assert sum("server busy" in t for t in texts) == 43
    # the two abandoned naps kept their slots until they returned: nothing else ran meanwhile
    (tmp_path / "release").touch()
    assert s.tool_text(s.send("tools/call", {"name": "peak_running", "arguments": {}}), 60) == "2"


def test_sandbox_runs_are_bounded_and_other_sessions_keep_being_served(tmp_path):
    import httpx
    from test_security_mcp import HDR, _open_session, _ping, _sse_json, _start_http

    if sandbox_info()["backend"] not in ("bwrap", "docker"):
        pytest.fail("no isolating sandbox backend here; run `make sandbox-deps`")
    proc, url = _start_http(make_run(tmp_path))
    try:
        with httpx.Client(timeout=120) as a, httpx.Client(timeout=120) as b:
            sa, sb = _open_session(a, url), _open_session(b, url)
            hdr_a = {**HDR, "mcp-session-id": sa, "mcp-protocol-version": "2025-06-18"}
            code = "import time; time.sleep(5); print('[]')"
            done: list[float] = []
            t0 = time.monotonic()

            def analyze(i: int) -> None:
                httpx.post(url, json={"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call", "params": {
                    "name": "run_analyzer_code", "arguments": {"code": code, "version_ids": ["v0"], "timeout_s": 60}}},
                    headers=hdr_a, timeout=300)
                done.append(time.monotonic() - t0)

            threads = [threading.Thread(target=analyze, args=(i,)) for i in range(12)]
            for t in threads:
                t.start()
            time.sleep(3)
            assert _sse_json(_ping(b, url, sb))["result"] == {}
            t1 = time.monotonic()
            r = b.post(url, json={"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                                  "params": {"name": "list_versions", "arguments": {}}},
                       headers={**HDR, "mcp-session-id": sb, "mcp-protocol-version": "2025-06-18"})
            assert [v["id"] for v in _sse_json(r)["result"]["structuredContent"]["versions"]] == ["v0", "v1"]
            assert time.monotonic() - t1 < 5.0  # before: behind the 12 analyzers (up to 60 s each)
            for t in threads:
                t.join(300)
            # 12 five-second sandboxes, at most 4 at once: three rounds, so the last ends after >= 15 s
            assert len(done) == 12 and max(done) >= 15.0, sorted(round(d, 1) for d in done)
    finally:
        proc.terminate()
        proc.wait(30)


def test_slot_counts_come_from_the_environment(monkeypatch):
    from evotrainer.servers import common

    monkeypatch.setenv(common.TOOL_THREADS_ENV, "3")
    assert common._env_slots(common.TOOL_THREADS_ENV, 2) == 3
    monkeypatch.setenv(common.TOOL_THREADS_ENV, "0")
    with pytest.raises(ValueError, match=r"EVOTRAINER_MCP_TOOL_THREADS='0': give a positive integer"):
        common._env_slots(common.TOOL_THREADS_ENV, 2)


# --- review 3 (docs/security-probes.md): product tool bodies driven into one long GIL-holding C call -------------

def _run_with_long_completions(tmp_path, n_x: int = 30):
    """make_run plus two train rollouts of v0 at step 2 whose completion is ``"x" * n_x`` (a real completion is
    hundreds of characters; at 30, Python's ``re`` on ``(x+x+)+y`` takes ~40 s, 2.5 s at 26)."""
    from evotrainer.rollouts import make_record
    from evotrainer.workspace import Workspace

    run = make_run(tmp_path)
    with Workspace(run, writer=True) as ws:
        ws.rollouts.add([make_record(version_id="v0", step=2, prompt_id="p1", group_id="g0", sample_idx=i,
                                     prompt="What is 1+1?", completion="x" * n_x, reward=0.0, answer="2",
                                     correct=0.0, components={"correctness": 0.0}, length=n_x, finish_reason="eos")
                         for i in range(2)])
    return run


def _call_while_pinging(s: Stdio, name: str, args: dict, timeout: float = 120) -> tuple[dict, float]:
    """Send one tool call, ping back to back until it is answered; (reply, worst ping latency in s)."""
    rid, worst, end = s.send("tools/call", {"name": name, "arguments": args}), 0.0, time.monotonic() + timeout
    while time.monotonic() < end:
        t0 = time.monotonic()
        assert s.request("ping", {}, timeout=timeout) is not None
        worst = max(worst, time.monotonic() - t0)
        reply = s.wait(rid, 0.05)
        if reply is not None:
            return reply, worst
    raise AssertionError(f"{name}: no reply in {timeout} s")


@pytest.mark.parametrize("tool", ["rescore_rollouts", "check_inert"])
def test_a_catastrophic_format_pattern_does_not_stall_the_server(tmp_path, tool):
    # Before: reward.format.params.pattern went to Python's re, which held the GIL: at 26 characters a ping
    # waited 2.4-2.6 s (review 3, W-R1), doubling per character. Now RE2: linear, and it releases the GIL.
    run = _run_with_long_completions(tmp_path)
    s = Stdio([sys.executable, "-c", "import sys; from evotrainer.servers.app import build_server; "
               "build_server('analyzers', sys.argv[1]).run('stdio')", str(run)])
    try:
        # first a harmless pattern: the first call imports the tool's libraries (a one-off GIL hold of ~1 s under
        # load, not the caller's doing), then the catastrophic one, timed
        _call_while_pinging(s, tool, {"version_id": "v0", "path": "reward.format",
                                      "value": {"weight": 0.5, "params": {"pattern": "y"}}})
        value = {"weight": 0.5, "params": {"pattern": "(x+x+)+y"}}
        reply, worst = _call_while_pinging(s, tool, {"version_id": "v0", "path": "reward.format", "value": value})
        assert worst < 10, f"a ping waited {worst:.2f} s behind {tool}"  # Python's re: ~40 s at 30 characters
        out = reply["result"]["structuredContent"]
        if tool == "rescore_rollouts":
            # no completion has a 'y': format is 0 everywhere, so the rewards do not move (10 rollouts, 5 groups)
            assert (out["n_rollouts"], out["n_groups"]) == (10, 5)
            assert out["new_reward_mean"] == out["old_reward_mean"]
        else:
            assert out["inert"] is True
        # a pattern RE2 cannot run (a backreference) is refused, naming the field
        reply, _ = _call_while_pinging(s, tool, {"version_id": "v0", "path": "reward.format",
                                                 "value": {"weight": 0.5, "params": {"pattern": "(x)\\1"}}})
        text = reply["result"]["content"][0]["text"]
        assert reply["result"]["isError"] and "pattern" in text and "RE2" in text
    finally:
        s.close()


SLOW_READS = r'''
import sys, time
from evotrainer.servers import protocol
from evotrainer.servers.app import build_server


def slow_fingerprint(self):  # a read of a long lineage (3,000 versions took ~1 s): here a sleep
    time.sleep(3)
    return {"v0": 0.0, "v1": 0.0}


protocol.VersionWatcher.fingerprint = slow_fingerprint
build_server("logs", sys.argv[1]).run("stdio")
'''


def test_many_protocol_reads_leave_the_stdio_transport_its_threads(tmp_path):
    """Review 5: completions, prompts and resources read the lineage in worker threads of anyio's default limiter
    (the SDK's way to run sync prompt and resource functions), which the stdio transport's reader and writer need
    too: on a run of 3,000 versions, 45 ``completion/complete`` at once delayed a ping 4.7 s. They now run two at a
    time on their own limiter (protocol.protocol_limiter); here each read sleeps 3 s."""
    script = tmp_path / "server.py"
    script.write_text(SLOW_READS)
    s = Stdio([sys.executable, str(script), str(make_run(tmp_path))])
    try:
        ref = {"ref": {"type": "ref/prompt", "name": "diagnose_run"}, "argument": {"name": "version_id", "value": "v"}}
        rids = [s.send("completion/complete", ref) for _ in range(45)]
        lat = s.ping_latencies(4)
        assert max(lat) < 2.5, f"ping latencies up to {max(lat):.2f} s while 45 completions read the lineage"
        first = s.wait(rids[0], 120)
        assert first["result"]["completion"]["values"] == ["v0", "v1"]
    finally:
        s.close()


SLOW_WORKSPACE = r'''
import sys, time
from evotrainer.servers import common
from evotrainer.servers.app import build_server

_open = common.ServerState.workspace


def slow_workspace(self):  # a slow lineage read (review 10, M-R10: a crafted lineage.db, 11-37 s): here a sleep
    time.sleep(3)
    return _open(self)


common.ServerState.workspace = slow_workspace
build_server("training", sys.argv[1]).run("stdio")
'''


@pytest.mark.parametrize(("tool", "args", "said"), [
    ("start_training", {"version_id": "v9", "steps": 1}, "v9"),
    ("evaluate_version", {"version_id": "v9"}, "v9"),
    ("job_status", {"job_id": "j1"}, "'j1' not found"),
    ("cancel_job", {"job_id": "j1"}, "'j1' not found"),
])
def test_the_async_job_tools_read_the_lineage_off_the_event_loop(tmp_path, tool, args, said):
    """Review 10, M-R10: start_training, evaluate_version, job_status and cancel_job read the workspace and the
    lineage on the event loop before their first await, so a slow read (a generated column of a crafted lineage.db)
    stalled every session: a ping waited 37 s (start_training), 11 s (evaluate_version), 15 s (job_status). Their
    reads now run in a tool thread; here each workspace read sleeps 3 s."""
    script = tmp_path / "server.py"
    script.write_text(SLOW_WORKSPACE)
    s = Stdio([sys.executable, str(script), str(make_run(tmp_path))])
    try:
        reply, worst = _call_while_pinging(s, tool, args)
        assert worst < 2.5, f"a ping waited {worst:.2f} s behind {tool}'s lineage read"
        assert reply["result"]["isError"] and said in reply["result"]["content"][0]["text"]
    finally:
        s.close()


def test_stdio_eof_drops_the_calls_still_in_flight_after_a_grace_period(tmp_path):
    """Review 10, W-R10 (a): the client closed stdin while a run_analyzer_code call (a 120 s sandbox) ran; the server
    stayed alive until the sandbox ended, up to 600 s after its client left: the SDK cancels the calls in flight at
    EOF, but the interpreter's exit waited for their tool threads. The process now ends common.STDIO_EOF_GRACE_S
    after the EOF (1 s here) without waiting for them; the probe's nap would take 120 s."""
    script = tmp_path / "server.py"
    script.write_text(SERVER.replace("from evotrainer.servers import common\n",
                                     "from evotrainer.servers import common\ncommon.STDIO_EOF_GRACE_S = 1.0\n"))
    s = Stdio([sys.executable, str(script), str(make_run(tmp_path)), "300"])
    try:
        s.send("tools/call", {"name": "nap", "arguments": {"seconds": 120}})
        time.sleep(1)
        s.proc.stdin.close()
        assert s.proc.wait(60) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


_SERVE_ALL = r'''
import sys
from evotrainer.servers import common
from evotrainer.servers.app import build_server

common.STDIO_EOF_GRACE_S = 1.0
build_server("all", sys.argv[1]).run("stdio")
'''


def test_a_stdio_server_whose_client_stopped_reading_ends_after_eof(tmp_path):
    """Review 12, Y-R12: the client sent 5 tools/list, closed stdin and kept the server's stdout open without
    reading it (a hung or suspended client): the replies (~5 x 60 KB) filled the 64 KiB pipe, the SDK's writer
    blocked, and the EOF grace and exit were never reached: alive 60-90 s later, unbounded. Now EOF arms a
    watchdog: the process ends at most 2 x common.STDIO_EOF_GRACE_S + 5 s (7 s here) after EOF."""
    script = tmp_path / "server.py"
    script.write_text(_SERVE_ALL)
    proc = subprocess.Popen([sys.executable, str(script), str(make_run(tmp_path))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        def send(msg: dict) -> None:
            proc.stdin.write(json.dumps(msg).encode() + b"\n")
            proc.stdin.flush()

        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
        assert json.loads(proc.stdout.readline())["id"] == 1
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        for i in range(5):
            send({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/list", "params": {}})
        time.sleep(2)
        proc.stdin.close()  # EOF; stdout stays open and is never read again
        assert proc.wait(60) == 0  # before: still alive after 60 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
