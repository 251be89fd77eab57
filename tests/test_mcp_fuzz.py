"""Fuzz the combined server: hundreds of random and malformed tool calls; it never dies and every reply is a
result (valid against the tool's output schema, checked by the client) or a tool error (isError) with a message.

Tools that would start real work (training, evaluation, sandboxed code, the embedding model) only get
arguments that fail validation, so the run stays fast; all other tools get random, partly valid arguments.
"""

from __future__ import annotations

import random

import pytest
from mcp_testlib import SyncClient, make_run

from evotrainer.servers.app import build_server

N_CALLS = 400
EXPENSIVE = {"start_training", "evaluate_version", "run_analyzer_code", "backtest_analyzer", "register_analyzer",
             "add_version_summary", "list_version_summaries",
             "search_skills", "get_skill", "add_skill", "record_skill_outcome", "add_failed_case", "add_search_trace"}
POOL = [None, True, False, 0, 1, -1, 3, 2**40, -1e308, 0.5, "", "v0", "v1", "v99", "g0", "reward/mean", "train",
        "eval", "keep", "merge", "temperature", "reward.format.weight", "x" * 5000, "'; DROP TABLE versions; --",
        "../../etc/passwd", "\x00\x01", "(", ".*", "2026-01-01T00:00:00Z", [], [1, "a", None], ["v0", "v1"],
        {"a": {"b": []}}, {"v0": True}]


def _bad_value(schema: dict) -> object:
    t = schema.get("type") or next((s.get("type") for s in schema.get("anyOf", []) if s.get("type") != "null"), None)
    return "not-a-number" if t in ("integer", "number") else {"not": "valid"} if t in ("string", "boolean") else 12.5


def _args(rng: random.Random, tool) -> dict:
    props = (tool.input_schema or {}).get("properties", {})
    required = (tool.input_schema or {}).get("required", [])
    if tool.name in EXPENSIVE:
        typed = [p for p, s in props.items() if (s.get("type") or s.get("anyOf")) and p in required] or list(props)
        victim = rng.choice(typed)
        args = {p: rng.choice(POOL) for p in props if rng.random() < 0.5}
        args[victim] = _bad_value(props[victim])
        return args
    mode = rng.random()
    if mode < 0.1:
        return {}
    args = {p: rng.choice(POOL) for p in props if p in required or rng.random() < 0.4}
    if mode > 0.85:
        args[rng.choice(["bogus", "__proto__", "limit" * 3])] = rng.choice(POOL)
    return args


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    c = SyncClient(build_server("all", make_run(tmp_path_factory.mktemp("f"))))
    yield c
    c.close()


def test_fuzz_tool_calls_never_kill_the_server(client):
    rng = random.Random(20261130)
    tools = client.tools()
    names = [t.name for t in tools] + ["", "nope", "list_versions ", "../x"]
    by_name = {t.name: t for t in tools}
    n_ok = n_err = 0
    for _ in range(N_CALLS):
        name = rng.choice(names)
        args = _args(rng, by_name[name]) if name in by_name else {"a": rng.choice(POOL)}
        r = client.call(name, args)  # a protocol error or a dead server raises here
        if r.is_error:
            n_err += 1
            assert r.content and r.content[0].text.strip(), (name, args)
            assert "Error executing tool" in r.content[0].text or "Unknown tool" in r.content[0].text
        else:
            n_ok += 1
            assert isinstance(r.structured_content, dict), (name, args)
    assert n_ok + n_err == N_CALLS and n_ok > 20 and n_err > 100  # both paths were exercised
    # still serving, and the store is consistent
    assert client.ok("get_version", {"version_id": "v0"})["id"] == "v0"
    assert client.ok("list_versions")["total"] >= 2


def test_internal_errors_are_reported_not_fatal(client):
    # an unparseable time and a NUL byte in a regex reach the tool bodies; both are tool errors
    assert "ISO 8601" in client.err("search_logs", {"since": "\x00"})
    assert client.ok("search_logs", {"query": "\x00"})["total"] == 0
