"""The in-process MCP call's fast paths (issue 21) change no answer.

- A read-only tool call is not followed by a lineage read (the version watcher's fingerprint); a writing
  tool call still is, and its change is still notified (tests/test_mcp_protocol.py covers the notification).
- ``simplify_schema`` rewrites output schemas into equivalent ones: hand cases, and every tool's output
  schema accepts and rejects the same instances before and after (real results plus broken copies).
- ``server_info``'s version string is read once.
"""

from __future__ import annotations

import jsonschema
import pytest
from mcp.server.mcpserver.tools import Tool
from mcp_testlib import SyncClient, make_run, result_mutants

from evotrainer.servers import app, protocol
from evotrainer.servers.app import build_server
from evotrainer.servers.common import inline_refs, simplify_schema


def test_read_only_calls_skip_the_lineage_check_and_writes_do_not(tmp_path, monkeypatch):
    calls: list[int] = []
    orig = protocol.VersionWatcher.fingerprint

    def counting(self):
        calls.append(1)
        return orig(self)

    monkeypatch.setattr(protocol.VersionWatcher, "fingerprint", counting)
    server = build_server("all", make_run(tmp_path))
    c = SyncClient(server)
    try:
        c.ok("get_version", {"version_id": "v1"})  # the first call takes the baseline (1 read), no check after
        first = len(calls)
        assert first >= 1
        for _ in range(5):
            c.ok("get_version", {"version_id": "v1"})
            c.ok("list_analyzers")
            c.ok("server_info")
        assert len(calls) == first  # 15 read-only calls: no lineage read
        c.ok("decide", {"version_id": "v1", "action": "prune", "rationale": "no gain (test)"})
        assert len(calls) == first + 1  # a write: the check runs (and notifies, test_mcp_protocol)
    finally:
        c.close()


def test_simplify_schema_by_hand():
    s = {"type": "object", "additionalProperties": True, "properties": {
        "a": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "A"},
        "b": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},  # not bare: kept
        "c": {"additionalProperties": False, "type": "object"}}}
    # nullable fields keep their anyOf (a type array is less portable: the Inspector's --strict warns on each)
    assert simplify_schema(s) == {"type": "object", "properties": {
        "a": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "A"},
        "b": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
        "c": {"additionalProperties": False, "type": "object"}}}


def _mutants(value):
    """Broken and edge copies of a result: each field set to null, a number, a string, a list, dropped."""
    return result_mutants(value, (None, 7, "x", [1], {"extra": 1}))


def test_every_output_schema_accepts_the_same_instances(tmp_path):
    server = build_server("all", make_run(tmp_path))
    c = SyncClient(server)
    try:
        results = {"get_version": c.ok("get_version", {"version_id": "v1"}), "list_analyzers": c.ok("list_analyzers"),
                   "server_info": c.ok("server_info"), "list_versions": c.ok("list_versions")}
    finally:
        c.close()
    tools = {t.name: t for t in server._tool_manager.list_tools()}
    assert set(results) <= set(tools)
    fns = {fn.__name__: fn for fns in app.TOOLSETS.values() for fn in fns} | {fn.__name__: fn for fn in app.TOOLS}
    checked = 0
    for name, fn in fns.items():
        fast = tools[name].fn_metadata.output_schema
        raw = Tool.from_function(fn).fn_metadata.output_schema  # the SDK's schema of the same function
        if not raw:
            continue
        plain = inline_refs(raw)  # what make_tool served before the rewrite
        assert fast == simplify_schema(plain)
        vp, vf = jsonschema.Draft202012Validator(plain), jsonschema.Draft202012Validator(fast)
        for inst in _mutants(results.get(name, {})):
            assert vp.is_valid(inst) == vf.is_valid(inst), (name, inst)
        checked += 1
    assert checked >= 30


def test_server_info_version_is_read_once(monkeypatch):
    app._version.cache_clear()
    seen: list[str] = []
    monkeypatch.setattr(app, "version", lambda name: seen.append(name) or "9.9")
    assert app._version() == "9.9" and app._version() == "9.9"
    assert seen == ["evotrainer"]
    app._version.cache_clear()


@pytest.mark.parametrize("name", ["get_version", "list_analyzers"])
def test_simplified_schema_is_smaller_to_walk(tmp_path, name):
    # precondition of the speed-up: the served schema has no additionalProperties: true; nullable fields stay
    # anyOf (portable to single-type schema dialects), never a type array
    server = build_server("all", make_run(tmp_path))
    t = {t.name: t for t in server._tool_manager.list_tools()}[name]
    text = repr(t.fn_metadata.output_schema)
    assert "'additionalProperties': True" not in text
    assert "'type': ['" not in text
