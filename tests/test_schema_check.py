"""The compiled output-schema check (``evotrainer.schema_check``) never accepts what ``jsonschema`` rejects, and the
agents' client validates with it in front of the SDK's validator: same accept / reject, same error messages.

Soundness is checked three ways: hand cases at the edges of the two rule sets (bool vs integer, integral floats,
``Decimal``, enum typing, extra properties, nested ``anyOf``), every served output schema against real results and
~80 broken copies of each, and ~20,000 random instances of hand-written schemas.
"""

from __future__ import annotations

import random
from decimal import Decimal

import anyio
import jsonschema
import pytest
from mcp import Client
from mcp_testlib import SyncClient, make_run, result_mutants
from mcp_types import CallToolResult

from evotrainer.agents.mcp_client import ToolBox, fast_result_validation
from evotrainer.schema_check import FastAcceptValidator, compile_check
from evotrainer.servers.app import build_server

DRAFT = "https://json-schema.org/draft/2020-12/schema"
NULLABLE_STR = {"anyOf": [{"type": "string"}, {"type": "null"}]}
ITEM = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 4},
                                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                                         "note": NULLABLE_STR, "score": {"type": "number", "minimum": 0,
                                                                         "exclusiveMaximum": 1}},
        "required": ["id", "name"], "additionalProperties": False}
SCHEMAS = [
    {"type": "object", "properties": {"items": {"type": "array", "items": ITEM}, "total": {"type": "integer"}},
     "required": ["items"]},
    {"type": "object", "properties": {"kind": {"enum": ["a", "b", 1, True, None]}, "c": {"const": 0},
                                      "x": {"anyOf": [ITEM, {"type": "null"}, {"type": "array", "minItems": 1}]}},
     "additionalProperties": {"type": "number"}},
    {"allOf": [{"type": "object", "required": ["a"]}, {"properties": {"a": {"type": ["string", "integer"],
                                                                           "minLength": 1, "maximum": 10}}}]},
]


def _sound(schema, instances):
    check = compile_check(schema)
    assert check is not None, schema
    v = jsonschema.Draft202012Validator(schema)
    accepted = valid = 0
    for inst in instances:
        ok = v.is_valid(inst)
        valid += ok
        if check(inst):
            assert ok, (schema, inst)
            accepted += 1
    return accepted, valid


def test_hand_cases_at_the_edges():
    integer = compile_check({"type": "integer"})
    assert integer(3) and not integer(True) and not integer(3.5)
    assert not integer(3.0) and jsonschema.Draft202012Validator({"type": "integer"}).is_valid(3.0)  # "not sure"
    number = compile_check({"type": "number", "minimum": 1})
    assert number(1) and number(2.5) and not number(0) and not number(False)
    assert not number(Decimal("0.5"))  # jsonschema compares Decimals too: never accept unchecked
    assert not number(Decimal("5"))  # not an int / float: not sure
    assert compile_check({"minimum": 1})("text") and compile_check({"minimum": 1})(True)  # bounds: numbers only
    assert not compile_check({"minimum": 1})(float("nan"))
    enum = compile_check({"enum": [1, "a", None]})
    assert enum(1) and enum("a") and enum(None) and not enum(True) and not enum(1.0) and not enum("b")
    closed = compile_check({"type": "object", "properties": {"a": {}}, "additionalProperties": False})
    assert closed({"a": 1}) and closed({}) and not closed({"a": 1, "b": 2})
    nullable = compile_check({"type": "object", "properties": {"p": NULLABLE_STR}, "required": ["p"]})
    assert nullable({"p": None}) and nullable({"p": "x"}) and not nullable({"p": 3}) and not nullable({})
    assert compile_check({"properties": {"a": {"type": "string"}}})(["not", "an", "object"])  # type-specific
    assert compile_check({"minLength": 2})("ab") and not compile_check({"minLength": 2})("a")
    assert compile_check({"minLength": 2})("\u00e9\u00e9")  # code points, as jsonschema counts
    assert compile_check(True)(object()) and compile_check({})({"any": 1})


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^a"}, {"oneOf": [{"type": "string"}]}, {"$ref": "#/$defs/x", "$defs": {"x": {}}},
    {"not": {"type": "string"}}, {"prefixItems": [{}], "items": {}}, {"type": "object", "patternProperties": {}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"}, {"type": "any"}, {"enum": [[1]]},
    {"items": False}, {"uniqueItems": True}, {"properties": {"a": {"$schema": DRAFT}}}])
def test_keywords_outside_the_subset_are_not_compiled(schema):
    assert compile_check(schema) is None


def test_format_is_compiled_only_where_it_is_not_asserted():
    s = {"type": "string", "format": "date-time"}
    assert compile_check(s)("not a date")  # jsonschema without a format checker accepts it too
    assert compile_check(s, format_asserted=True) is None


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "bool", "str", "none", "decimal"] + (["list", "dict"] * 2 if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.choice([0, 1, -1, 10, 11, 2**63])
    if kind == "float":
        return rng.choice([0.0, 0.5, 1.0, -0.1, 9.99, float("nan")])
    if kind == "bool":
        return rng.choice([True, False])
    if kind == "str":
        return rng.choice(["", "a", "b", "abcd", "abcde", "\u00e9"])
    if kind == "none":
        return None
    if kind == "decimal":
        return Decimal(rng.choice(["0.5", "-1", "3"]))
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["items", "total", "kind", "c", "x", "a", "id", "name", "tags", "note", "score", "zz"]
    return {k: _random_value(rng, depth + 1) for k in rng.sample(keys, rng.randint(0, 5))}


def _near_valid(rng: random.Random):
    """Instances close to the schemas' shapes, so that many are accepted and the nested checks run."""
    def item():
        d = {"id": rng.choice([1, True, 2.0, "1"]), "name": rng.choice(["ab", "abcde", 3]),
             "tags": rng.choice([["a"], ["a", "b", "c"], [1], []]), "note": rng.choice([None, "n", 5]),
             "score": rng.choice([0, 0.5, 1, -1, Decimal("0.5"), True])}
        for k in rng.sample(list(d), rng.randint(0, 2)):
            del d[k]
        if rng.random() < 0.1:
            d["extra"] = 1
        return d
    return rng.choice([
        {"items": [item() for _ in range(rng.randint(0, 3))], "total": rng.choice([1, 1.0, "1"])},
        {"kind": rng.choice(["a", "b", 1, True, None, 1.0, False, "c"]), "c": rng.choice([0, False, 0.0]),
         "x": rng.choice([item(), None, [], [1], "s"]), "extra": rng.choice([1, 0.5, "s", True])},
        {"a": rng.choice(["", "x", 5, 11, 10.0, None])}])


def test_random_instances_are_never_accepted_wrongly():
    rng = random.Random(0)
    accepted = valid = 0
    for schema in SCHEMAS:
        for inst in ([_random_value(rng) for _ in range(3000)], [_near_valid(rng) for _ in range(4000)]):
            a, v = _sound(schema, inst)
            accepted, valid = accepted + a, valid + v
    # the fast path takes most valid instances (the rest: integral floats, Decimals, bools where "not sure")
    assert valid > 1500 and accepted > 0.6 * valid, (accepted, valid)


def _mutants(value):
    return result_mutants(value, (None, 7, 7.0, True, "x", [1], {"extra": 1}, Decimal("1")), nested_rows=True)


def test_every_served_output_schema_compiles_and_is_sound(tmp_path):
    server = build_server("all", make_run(tmp_path))
    c = SyncClient(server)
    try:
        results = {"get_version": c.ok("get_version", {"version_id": "v1"}), "list_analyzers": c.ok("list_analyzers"),
                   "server_info": c.ok("server_info"), "list_versions": c.ok("list_versions"),
                   "list_metrics": c.ok("list_metrics"), "search_logs": c.ok("search_logs", {"query": "NaN"})}
    finally:
        c.close()
    schemas = {t.name: t.fn_metadata.output_schema for t in server._tool_manager.list_tools()
               if t.fn_metadata.output_schema}
    assert len(schemas) >= 30
    compiled = {name for name, s in schemas.items() if compile_check(s) is not None}
    assert compiled == set(schemas)  # every tool's results take the fast path
    for name, result in results.items():
        assert compile_check(schemas[name])(result), name  # real results are accepted at once
    for name, s in schemas.items():
        _sound(s, _mutants(results.get(name, {})))


def test_agents_client_rejects_with_the_sdks_own_message(tmp_path):
    server = build_server("all", make_run(tmp_path))

    async def messages(fast: bool):
        async with Client(server) as client:
            if fast:
                assert fast_result_validation(client)
                assert fast_result_validation(client)  # idempotent: not wrapped twice
            await client.list_tools()
            detail = (await client.call_tool("get_version", {"version_id": "v1"})).structured_content
            out = []
            for bad in ({**detail, "parent_id": 5}, {k: v for k, v in detail.items() if k != "id"},
                        {**detail, "decisions": [{"id": "x"}]}, {**detail, "created_at": True}, detail):
                try:
                    await client.session.validate_tool_result(
                        "get_version", CallToolResult(content=[], structured_content=bad))
                    out.append(None)
                except RuntimeError as exc:
                    out.append(str(exc))
            v = client.session._output_schema_validator("get_version", client.session._tool_output_schemas["get_version"])
            return out, v

    stock, v_stock = anyio.run(messages, False)
    fast, v_fast = anyio.run(messages, True)
    assert fast == stock
    assert stock[-1] is None and all(m and "Invalid structured content returned by tool get_version" in m
                                     for m in stock[:-1])
    assert isinstance(v_fast, FastAcceptValidator) and not isinstance(v_stock, FastAcceptValidator)


def test_toolbox_validates_with_the_compiled_check(tmp_path):
    server = build_server("all", make_run(tmp_path))
    with ToolBox(server) as tb:
        assert tb.call("get_version", {"version_id": "v1"})["id"] == "v1"
        session = tb._client.session
        v = session._output_schema_validator("get_version", session._tool_output_schemas["get_version"])
        assert isinstance(v, FastAcceptValidator)
