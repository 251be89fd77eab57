"""Caller text repeated in error messages is bounded (review 16, M-R16 / J-R16): the echo of a caller's name,
the closest-name suggestions and the scrub of internal paths cost milliseconds and a short reply whatever the input."""

from __future__ import annotations

import time

from mcp_testlib import SyncClient

from evotrainer.echo import CLOSE_NAME_POOL, MAX_CLOSE_NAMES, MAX_ECHO_CHARS, closest_names, echo, name_list
from evotrainer.recipe import Recipe, RecipeError, get_path, validate_recipe
from evotrainer.servers.app import build_server
from evotrainer.servers.common import MAX_SCRUB_CHARS, scrub, unknown_tool_error


def test_echo_cuts_a_long_name_and_says_its_length():
    assert echo("get_version") == "get_version"
    assert echo("x" * 100_000) == "x" * MAX_ECHO_CHARS + "... (100,000 characters)"
    assert echo(12345, limit=3) == "123... (5 characters)"


def test_closest_names_on_100000_candidates_returns_at_most_20_with_the_count():
    candidates = [f"metric_{i}" for i in range(100_000)]
    t = time.perf_counter()
    names, rest = closest_names("metric_1", candidates)
    took = time.perf_counter() - t
    assert len(names) == MAX_CLOSE_NAMES and names[0] == "metric_1"
    assert all(int(n.split("_")[1]) < CLOSE_NAME_POOL for n in names)  # only the pool was compared
    assert rest == 100_000 - MAX_CLOSE_NAMES
    assert took < 1.0, took  # difflib over all 100,000: tens of seconds with a long name
    # a 3.9 MB name against long candidates: a 64-character prefix against 200-character cuts
    names, rest = closest_names("a" * 3_900_000, ("a" * 10_000 + str(i) for i in range(100_000)))
    assert names == [] and rest == 100_000
    assert closest_names("serch_logs", {"search_logs": 1, "list_metrics": 2}) == (["search_logs"], 1)


def test_name_list_counts_the_names_it_does_not_show():
    assert name_list([]) == "none"
    assert name_list(["v0", "v1"]) == "v0, v1"
    assert name_list((f"v{i}" for i in range(1000)), limit=3) == "v0, v1, v2 and 997 more"


def test_scrub_is_linear_and_cut():
    hostile = "/a" * 2_000_000  # Python's re backtracked on it: 20,000 characters took 4.6 s
    t = time.perf_counter()
    out = scrub(hostile)
    assert time.perf_counter() - t < 0.5
    assert out == hostile[:MAX_SCRUB_CHARS] + "... (cut: 4,000,000 characters)"
    assert scrub("at /x/.venv/lib/python3.11/site-packages/lance/a.py, src/io.rs:12:3") == "at <library>, <library>"


def test_a_3_9_mb_unknown_tool_name_gets_a_short_reply_fast():
    c = SyncClient(build_server("logs", None))
    try:
        name = "/a" * 1_950_000  # 3.9 MB
        t = time.perf_counter()
        r = c.call(name, {})
        took = time.perf_counter() - t
        text = r.content[0].text
        assert r.is_error and len(text.encode()) < 1024, len(text)
        assert text.startswith("Unknown tool '" + name[:MAX_ECHO_CHARS] + "... (3,900,000 characters)'; ")
        assert took < 5.0, took  # minutes before (the SDK's text scrubbed whole with Python's re)
        assert c.call("serch_logs", {}).content[0].text == (
            "Unknown tool 'serch_logs'; did you mean 'search_logs'? (tools/list lists them with their arguments)")
    finally:
        c.close()


def test_unknown_tool_error_without_a_close_name_lists_the_tools():
    assert unknown_tool_error("zzz", ["search_logs", "list_metrics"]) == (
        "Unknown tool 'zzz'; this server's tools: search_logs, list_metrics (tools/list lists them with their "
        "arguments)")


def test_a_recipe_with_40000_unknown_keys_gets_20_lines_fast():
    fields = list(Recipe.model_fields)
    data = {f"{fields[i % len(fields)]}x{i}": 1 for i in range(40_000)}
    t = time.perf_counter()
    try:
        validate_recipe(data)
    except RecipeError as exc:
        msg = str(exc)
    took = time.perf_counter() - t
    lines = msg.splitlines()
    assert len(lines) == 21 and lines[0] == "recipe.namex0: unknown field; did you mean 'name'?"
    assert lines[-1] == "... and 39,980 more errors (fix these and validate again to see them)"
    assert took < 2.0, took  # 4.8 s and a 5.1 MB message before


def test_a_long_unknown_recipe_key_and_path_are_echoed_cut():
    key = "k" * 500_000
    try:
        validate_recipe({key: 1})
    except RecipeError as exc:
        msg = str(exc)
    assert msg.startswith("recipe." + "k" * MAX_ECHO_CHARS + "... [499936 more chars]: unknown field")  # terminal.clip_key
    assert len(msg) < 2_000
    try:
        get_path(Recipe(), "actor_learning_rat" + "e" * 10_000)
    except RecipeError as exc:
        msg = str(exc)
    assert msg.startswith("recipe.actor_learning_rat" + "e" * (MAX_ECHO_CHARS - 18) + "... (10,018 characters): no such")
