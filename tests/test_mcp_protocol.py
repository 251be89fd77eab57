"""MCP protocol and tool-contract details (issue 20): compare_versions vs the no-RL row, error codes,
logging, annotations, completions, per-version resources, the stateless revision.

Runs the real servers through the SDK's in-process ``Client`` (mcp_testlib.SyncClient) on small
hand-built run folders.
"""

from __future__ import annotations

import warnings

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_testlib import SyncClient, make_run
from mcp_types import PromptReference, ResourceTemplateReference
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from evotrainer.servers.app import build_server


# --- compare_versions keeps the no-RL evaluation apart -------------------------------------------
def _run_with_no_rl(root):
    """Root v0 with held-out eval rollouts and a no-RL base-model evaluation on the same two prompts.

    v0 heldout: p1 [1, 1], p2 [1, 0] -> mean 3/4 = 0.75
    no-RL:      p1 [0, 0, 1, 0], p2 [0, 0, 0, 0] -> mean 1/8 = 0.125
    pooled (the old answer for v0): 4/12 = 0.333..., which is neither model.
    """
    from evotrainer.recipe import Recipe
    from evotrainer.rollouts import make_record
    from evotrainer.workspace import Workspace

    run = root / "run"
    prompts = {"p1": ("What is 1+1?", "2"), "p2": ("What is 2+2?", "4")}
    evals = {"heldout": {"p1": [1.0, 1.0], "p2": [1.0, 0.0]},
             "no_rl": {"p1": [0.0, 0.0, 1.0, 0.0], "p2": [0.0, 0.0, 0.0, 0.0]}}
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(Recipe(model={"name_or_path": "tiny-random"}))
        recs = [make_record(version_id="v0", step=3, prompt_id=pid, group_id=f"{name}-{pid}", sample_idx=i,
                            prompt=prompts[pid][0], completion=f"{name}{i}", reward=r, answer=prompts[pid][1],
                            correct=r, split="eval")
                for name, per in evals.items() for pid, rs in per.items() for i, r in enumerate(rs)]
        ws.rollouts.add(recs)
    return run


@pytest.fixture(scope="module")
def no_rl_client(tmp_path_factory):
    c = SyncClient(build_server("rollouts", _run_with_no_rl(tmp_path_factory.mktemp("norl"))))
    yield c
    c.close()


def test_compare_root_against_the_named_no_rl_row(no_rl_client):
    cmp = no_rl_client.ok("compare_versions", {"version_a": "v0", "version_b": "no-rl", "samples_per_side": 4})
    assert cmp["reward_mean_a"] == 0.75 and cmp["reward_mean_b"] == 0.125  # not the pooled 1/3
    assert cmp["version_b"] == "no-rl" and cmp["n_common_prompts"] == 2
    first, second = cmp["prompts"]  # largest difference first: p1 |1 - 0.25| = 0.75, p2 |0.5 - 0| = 0.5
    assert (first["prompt_id"], second["prompt_id"]) == ("p1", "p2")
    assert first["a"]["n"] == 2 and first["b"]["n"] == 4 and first["b"]["reward_mean"] == 0.25
    assert first["a"]["completions"] == ["heldout0", "heldout1"]
    assert first["b"]["completions"] == ["no_rl0", "no_rl1", "no_rl2", "no_rl3"]
    base = no_rl_client.ok("compare_versions", {"version_a": "base", "version_b": "v0"})
    assert (base["reward_mean_a"], base["reward_mean_b"]) == (0.125, 0.75)  # "base" is an alias


def test_no_rl_row_errors(no_rl_client, tmp_path):
    assert "has eval rollouts only; use split='eval'" in no_rl_client.err(
        "compare_versions", {"version_a": "v0", "version_b": "no-rl", "split": "train"})
    c = SyncClient(build_server("rollouts", make_run(tmp_path)))  # a run without a no-RL evaluation
    try:
        assert "this run has no no-RL base-model evaluation" in c.err(
            "compare_versions", {"version_a": "v0", "version_b": "no-rl"})
        # the old behaviour stays for plain versions: v0 (1+0+0+0)/4 = 0.25, v1 (1+1+1+0)/4 = 0.75
        cmp = c.ok("compare_versions", {"version_a": "v0", "version_b": "v1"})
        assert (cmp["reward_mean_a"], cmp["reward_mean_b"]) == (0.25, 0.75)
    finally:
        c.close()


# --- protocol details through the SDK's in-process Client -------------------------------------------
MODES = ("legacy", "2026-07-28")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("proto"))


def _with_client(server, fn, **kwargs):
    async def main():
        async with Client(server, **kwargs) as c:
            return await fn(c)

    with warnings.catch_warnings():  # resources/subscribe and logging are deprecated for 2026-07-28 only
        warnings.simplefilter("ignore")
        return anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_prompts_get_errors_are_invalid_params(run, mode):
    server = build_server("all", run)

    async def go(c):
        out = []
        for name, args in (("nope", {}), ("propose_next_intervention", {}),
                           ("propose_next_intervention", {"version_id": "v0", "z": "1"})):
            with pytest.raises(MCPError) as e:
                await c.get_prompt(name, args)
            out.append((e.value.error.code, e.value.error.message))
        return out

    assert _with_client(server, go, mode=mode) == [
        (-32602, "unknown prompt 'nope'; prompts: diagnose_run, propose_next_intervention"),
        (-32602, "prompt 'propose_next_intervention': missing required argument version_id "
                 "(Parent version of the next child.)"),
        # review 15 P-R15: an unknown argument was a bare -32603 "Error rendering prompt"
        (-32602, "prompt 'propose_next_intervention': unknown argument z; allowed: version_id, findings"),
    ]


def test_initialize_and_discover_answer_the_same_capabilities(run):
    server = build_server("all", run)

    async def caps(c):
        return c.protocol_version, c.server_capabilities.model_dump(by_alias=True, exclude_none=True)

    legacy = _with_client(server, caps, mode="legacy")
    modern = _with_client(server, caps)  # "auto": server/discover, then the stateless revision
    expected = {"logging": {}, "completions": {}, "prompts": {"listChanged": False},
                "resources": {"subscribe": True, "listChanged": False}, "tools": {"listChanged": False}}
    assert legacy == ("2025-11-25", expected)
    assert modern == ("2026-07-28", expected)

    async def discover(c):
        return await c.session.discover()

    d = _with_client(server, discover)
    assert d.supported_versions == [*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS]
    assert d.supported_versions == ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"]


def test_titles_and_annotations_say_what_each_tool_does(run):
    from evotrainer.servers.app import TOOL_META

    server = build_server("all", run)
    tools = {t.name: t for t in _with_client(server, lambda c: c.list_tools()).tools}
    assert set(tools) == set(TOOL_META)  # every tool has an entry, no entry is stale
    for name, t in tools.items():
        assert t.title and t.annotations.title == t.title, name
        assert t.annotations.open_world_hint is False
    decide = tools["decide"].annotations
    assert (decide.read_only_hint, decide.destructive_hint, decide.idempotent_hint) == (False, True, False)
    assert tools["cancel_job"].annotations.destructive_hint is True
    read = [n for n, t in tools.items() if t.annotations.read_only_hint]
    assert all(tools[n].annotations.destructive_hint is False and tools[n].annotations.idempotent_hint for n in read)
    assert {"list_versions", "get_metric_series", "search_logs", "compare_versions", "gate_version"} <= set(read)
    for writes in ("propose_intervention", "start_training", "evaluate_version", "decide", "run_analyzer",
                   "add_skill", "record_skill_outcome"):
        assert tools[writes].annotations.read_only_hint is False, writes
    assert tools["propose_intervention"].annotations.destructive_hint is False  # adds a child, discards nothing


@pytest.mark.parametrize("mode", MODES)
def test_version_id_completions(run, mode):
    server = build_server("all", run)

    async def go(c):
        a = await c.complete(PromptReference(type="ref/prompt", name="diagnose_run"),
                             {"name": "version_id", "value": "v"})
        b = await c.complete(ResourceTemplateReference(type="ref/resource", uri="lineage://version/{version_id}"),
                             {"name": "version_id", "value": "v1"})
        other = await c.complete(PromptReference(type="ref/prompt", name="propose_next_intervention"),
                                 {"name": "findings", "value": "x"})
        return a.completion, b.completion, other.completion

    a, b, other = _with_client(server, go, mode=mode)
    assert (a.values, a.total, a.has_more) == (["v0", "v1"], 2, False)
    assert b.values == ["v1"] and other.values == []


def test_per_version_resource_and_its_errors(run):
    import json

    server = build_server("all", run)

    async def go(c):
        templates = await c.list_resource_templates()
        res = await c.read_resource("lineage://version/v1")
        with pytest.raises(MCPError) as e:
            await c.read_resource("lineage://version/v9")
        return templates, json.loads(res.contents[0].text), e.value.error

    templates, v1, err = _with_client(server, go, mode="legacy")
    assert [t.uri_template for t in templates.resource_templates] == ["lineage://version/{version_id}"]
    assert v1["id"] == "v1" and v1["parent_id"] == "v0" and v1["status"] == "proposed"
    assert v1["interventions"][0]["path"] == "eps_clip_high"
    assert err.code == -32602 and err.message.startswith("version 'v9' not found; known versions: v0, v1")


def test_an_unknown_resource_of_a_huge_uri_gets_a_cut_error(run):
    # review 17: a 3 MB URI to resources/read came back whole in the error (3,000,041 characters)
    from evotrainer.servers.protocol import MAX_ERROR_MESSAGE_CHARS

    server = build_server("all", run)

    async def go(c):
        with pytest.raises(MCPError) as e:
            await c.read_resource("lineage://" + "x" * 3_000_000)
        return e.value.error

    err = _with_client(server, go, mode="legacy")
    assert len(err.message) < MAX_ERROR_MESSAGE_CHARS + 40
    assert err.message.endswith(" more chars]") and "x" * 1_000 in err.message  # terminal.clip_text's marker


def test_subscribed_version_gets_update_notifications(tmp_path):
    from mcp_types import ResourceUpdatedNotification

    from evotrainer.servers import protocol
    from evotrainer.workspace import Workspace

    run = make_run(tmp_path)
    server = build_server("all", run)
    updates: list[str] = []

    async def on_message(msg):
        if isinstance(msg, ResourceUpdatedNotification):
            updates.append(str(msg.params.uri))

    async def go(c):
        await c.subscribe_resource("lineage://version/v1")
        await c.call_tool("decide", {"version_id": "v1", "action": "prune", "rationale": "no gain (test)"})
        after_decide = list(updates)
        await c.call_tool("list_versions", {})  # v0 untouched and not subscribed: nothing more
        no_more = list(updates)
        with Workspace(run) as ws:  # another process (the loop, a job) changes v1: the poll finds it
            ws.lineage.update_version("v1", note="changed elsewhere")
        with anyio.fail_after(protocol.POLL_S * 15):  # a poll every POLL_S; 15 of them for a loaded machine
            while len(updates) < 2:
                await anyio.sleep(0.1)
        return after_decide, no_more

    after_decide, no_more = _with_client(server, go, mode="legacy", message_handler=on_message)
    assert after_decide == ["lineage://version/v1"] and no_more == after_decide
    assert updates == ["lineage://version/v1", "lineage://version/v1"]


def test_tool_failures_reach_the_client_as_log_messages(run):
    server = build_server("all", run)
    logs: list[tuple[str, str]] = []

    async def on_log(params):
        logs.append((params.level, str(params.data)))

    async def go(c):
        await c.call_tool("get_version", {"version_id": "v9"})  # below the default level (warning): not sent
        quiet = list(logs)
        await c.set_logging_level("info")
        r = await c.call_tool("get_version", {"version_id": "v9"})
        return quiet, r.is_error

    quiet, is_error = _with_client(server, go, mode="legacy", logging_callback=on_log)
    assert quiet == [] and is_error
    assert logs == [("info", "Tool 'get_version' failed: \"Error executing tool get_version: version 'v9' not "
                             "found; known versions: v0, v1; call list_versions to see them\"")]


def test_stateless_requests_that_opt_in_get_log_messages(run):
    server = build_server("all", run)
    logs: list[tuple[str, str]] = []

    async def on_log(params):
        logs.append((params.level, str(params.data)))

    async def go(c):
        return (await c.call_tool("get_version", {"version_id": "v9"})).is_error

    assert _with_client(server, go, mode="2026-07-28", log_level="info", logging_callback=on_log)
    assert logs == [("info", "Tool 'get_version' failed: \"Error executing tool get_version: version 'v9' not "
                             "found; known versions: v0, v1; call list_versions to see them\"")]
    logs.clear()
    assert _with_client(server, go, mode="2026-07-28", logging_callback=on_log)  # no opt-in: no messages
    assert logs == []


def test_stdio_errors_are_codes_and_one_line_not_tracebacks(run):
    import json
    import subprocess
    import sys

    msgs = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "prompts/get", "params": {"name": "nope"}},
        {"jsonrpc": "2.0", "id": 3, "method": "prompts/get", "params": {"name": "propose_next_intervention"}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "get_version",
                                                                      "arguments": {"version_id": "v9"}}},
    ]
    proc = subprocess.Popen([sys.executable, "-m", "evotrainer.cli", "serve", "all", "--run", str(run)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    try:
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in msgs))
        proc.stdin.flush()
        replies = {}
        while len(replies) < 4:  # answers to ids 1-4 (the server answers in any order)
            line = proc.stdout.readline()
            assert line, "the server closed stdout before answering"
            m = json.loads(line)
            if "id" in m:
                replies[m["id"]] = m
        proc.stdin.close()
        stderr = proc.stderr.read()
        proc.wait(60)
    finally:
        proc.kill()
    assert replies[2]["error"]["code"] == -32602 and replies[3]["error"]["code"] == -32602  # was 0 over stdio
    assert replies[4]["result"]["isError"] is True
    assert "Traceback" not in stderr and stderr.count("\n") <= 2, stderr  # was ~145 lines per error


def test_stateless_listen_gets_version_updates(tmp_path):
    from mcp.shared.subscriptions import ResourceUpdated

    run = make_run(tmp_path)
    server = build_server("all", run)

    async def go(c):
        events = []
        async with c.listen(resource_subscriptions=["lineage://version/v1"]) as sub:
            await c.call_tool("decide", {"version_id": "v1", "action": "prune", "rationale": "no gain (test)"})
            with anyio.fail_after(10):
                async for event in sub:
                    events.append(event)
                    break
        return events

    events = _with_client(server, go, mode="2026-07-28")
    assert events == [ResourceUpdated(uri="lineage://version/v1")]


# --- over streamable HTTP ------------------------------------------------------------------------------
HTTP_TOKEN = "protocol-test-token-0123456789"


@pytest.fixture(scope="module")
def http_url(run):
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "evotrainer.cli", "serve", "training", "--transport", "http",
                             "--port", str(port), "--run", str(run)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "EVOTRAINER_MCP_TOKEN": HTTP_TOKEN, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(30)


def _post(url, body, **headers):
    import httpx

    hdr = {"Authorization": f"Bearer {HTTP_TOKEN}", "Content-Type": "application/json",
           "Accept": "application/json, text/event-stream", **headers}
    return httpx.post(url, json=body, headers=hdr, timeout=60)


def test_http_missing_protocol_version_header_is_named(http_url):
    r = _post(http_url, {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}})
    assert r.status_code == 400
    assert r.json() == {"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": (
        "'tools/list' without an MCP-Protocol-Version header or an Mcp-Session-Id: either send 'initialize' first "
        "and then the Mcp-Session-Id it returns (revisions 2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25), or set "
        "'MCP-Protocol-Version: 2026-07-28' and the per-request _meta envelope (stateless; server/discover lists "
        "the revisions served)")}}  # the SDK said "Bad Request: Missing session ID"


def test_http_discover_and_initialize_agree(http_url):
    import json

    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"}}
    d = _post(http_url, {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}},
              **{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"})
    assert d.status_code == 200, d.text
    disc = d.json()["result"]
    assert disc["supportedVersions"] == ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"]
    i = _post(http_url, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    assert i.status_code == 200, i.text
    line = next(ln for ln in i.text.splitlines() if ln.startswith("data: "))
    init = json.loads(line[len("data: "):])["result"]
    assert init["protocolVersion"] == "2025-11-25"
    assert init["capabilities"] == disc["capabilities"] == {
        "completions": {}, "logging": {}, "prompts": {"listChanged": False},
        "resources": {"listChanged": False, "subscribe": True}, "tools": {"listChanged": False}}


def test_first_tool_call_is_notified_before_the_poll_has_a_baseline(tmp_path, monkeypatch):
    """A CI failure: the poll's first baseline ran after (or raced) the listening client's first tool
    call, so the prune of v1 became part of the baseline and no ResourceUpdated was ever sent."""
    from mcp.shared.subscriptions import ResourceUpdated

    from evotrainer.servers import protocol

    async def no_poll(self):  # the poll has not taken its baseline yet when the tool call arrives
        await anyio.sleep_forever()

    monkeypatch.setattr(protocol.VersionWatcher, "poll", no_poll)
    server = build_server("all", make_run(tmp_path))

    async def go(c):
        async with c.listen(resource_subscriptions=["lineage://version/v1"]) as sub:
            await c.call_tool("decide", {"version_id": "v1", "action": "prune", "rationale": "no gain (test)"})
            with anyio.fail_after(10):
                async for event in sub:
                    return [event]
        return []

    assert _with_client(server, go, mode="2026-07-28") == [ResourceUpdated(uri="lineage://version/v1")]
