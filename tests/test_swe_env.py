"""SWE environment: tool-call parsing, tools, limits, and hidden-test grading in the sandbox."""

from __future__ import annotations

import json
import time

import pytest
from test_swe_tasks import make_git_task

from evotrainer.recipe import ToolUseSpec
from evotrainer.rl_backend.swe.env import SweEnv, parse_tool_calls
from evotrainer.rl_backend.swe.tasks import load_taskset


def call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


# --- parsing --------------------------------------------------------------------------------------
def test_parse_hermes_blocks_in_order_and_unclosed_last_block():
    text = ('I will look.\n<tool_call>{"name": "search", "arguments": {"pattern": "def add"}}</tool_call>\n'
            '<tool_call>{"name": "view", "arguments": {"path": "calc.py", "start": 2}}')
    a, b = parse_tool_calls(text)
    assert (a.name, a.args.pattern, a.args.path, a.error) == ("search", "def add", ".", None)
    assert (b.name, b.args.path, b.args.start, b.args.end, b.error) == ("view", "calc.py", 2, None, None)


def test_parse_bare_json_fenced_json_and_openai_string_arguments():
    (c,) = parse_tool_calls('Let me submit: {"name": "submit", "arguments": {}}')
    assert c.name == "submit" and c.error is None
    (c,) = parse_tool_calls('```json\n{"name": "run_tests", "arguments": {"tests": ["t.py::x"]}}\n```')
    assert c.name == "run_tests" and c.args.tests == ["t.py::x"]
    (c,) = parse_tool_calls('<tool_call>{"name": "edit", "arguments": "{\\"path\\": \\"a.py\\", '
                            '\\"old\\": \\"x\\", \\"new\\": \\"y\\"}"}</tool_call>')
    assert (c.name, c.args.path, c.args.old, c.args.new) == ("edit", "a.py", "x", "y")


def test_parse_bad_calls_become_errors_not_exceptions():
    (c,) = parse_tool_calls("I think the bug is in add.")
    assert c.name is None and "no tool call found" in c.error
    (c,) = parse_tool_calls(call("delete", path="x"))
    assert c.error == "unknown tool 'delete'; use one of: search, view, edit, run_tests, submit"
    (c,) = parse_tool_calls(call("edit", path="a.py", old="x"))
    assert c.error.startswith("bad arguments for edit: new: Field required")
    (c,) = parse_tool_calls(call("view", path="a.py", line=3))
    assert "line: Extra inputs are not permitted" in c.error
    (c,) = parse_tool_calls("<tool_call>{broken json</tool_call>")
    assert c.error == "the <tool_call> block holds no JSON object"


# --- tools and limits (no test runs) --------------------------------------------------------------
@pytest.fixture
def env(tmp_path):
    task = next(t for t in load_taskset() if t.repo == "cachetools")
    e = SweEnv(task, tmp_path, ToolUseSpec(max_turns=4, tool_budget=5))
    e.reset()
    return e


def test_search_view_edit_and_their_errors(env):
    bug = env.task.bug
    obs = env.step(call("search", pattern="def cached", path="cachetools"))
    assert obs.startswith("[search] ") and "cachetools/__init__.py:" in obs
    obs = env.step(call("view", path=bug.path, start=1, end=3) + call("view", path=bug.path, start=5, end=2))
    assert f"[view] {bug.path} lines 1-3 of" in obs and "end=2 is before start=5" in obs
    obs = env.step(call("edit", path=bug.path, old="this text is not in the file", new="x")
                   + call("edit", path="../outside.py", old="a", new="b"))
    assert obs.count("[error]") == 2
    assert "old text occurs 0 times" in obs and "outside the repository" in obs
    assert env.stats.invalid_calls == 3 and env.stats.edits == 0
    # 5 calls so far = the budget; the next call is refused and ends the episode
    obs = env.step(call("edit", path=bug.path, old=bug.new, new=bug.old))
    assert "tool budget of 5 calls exhausted" in obs and env.done
    assert env.stats.budget_exceeded and env.stats.stop_reason == "tool_budget" and env.stats.calls == 5
    assert env.stats.calls_by_tool == {"search": 1, "view": 2, "edit": 2, "run_tests": 0, "submit": 0}
    with pytest.raises(RuntimeError, match="episode is done"):
        env.step(call("submit"))


def test_edit_replaces_exactly_once_and_tracks_test_files(env):
    bug = env.task.bug
    obs = env.step(call("edit", path=bug.path, old=bug.new, new=bug.old))
    assert obs.startswith(f"[edit] edited {bug.path}")
    assert bug.old in (env.repo / bug.path).read_text()
    test_file = env.task.FAIL_TO_PASS[0].split("::")[0]
    text = (env.repo / test_file).read_text()
    anchor = next(line for line in text.splitlines(keepends=True) if line.strip() and text.count(line) == 1)
    assert env.step(call("edit", path=test_file, old=anchor, new=anchor)).startswith("[edit]")
    assert env.stats.test_file_edit_calls == 1 and env.stats.files_touched == {bug.path, test_file}
    assert env.step(call("view", path="/etc/passwd")).startswith("[error] path '/etc/passwd' is absolute")


def test_max_turns_and_episode_timeout(tmp_path):
    task = load_taskset()[0]
    e = SweEnv(task, tmp_path / "a", ToolUseSpec(max_turns=2))
    e.reset()
    e.step("thinking...")
    obs = e.step("still thinking")
    assert e.done and e.stats.stop_reason == "max_turns" and "turn limit of 2" in obs
    assert e.stats.invalid_calls == 2
    e = SweEnv(task, tmp_path / "b", ToolUseSpec(per_episode_timeout_s=0.05))
    e.reset()
    time.sleep(0.1)  # the policy took longer than the episode allows: the call is not run
    obs = e.step(call("search", pattern="x"))
    assert e.done and e.stats.stop_reason == "timeout" and obs == "[episode time limit 0.05 s reached]"
    assert e.stats.calls == 0


# --- grading in the sandbox -----------------------------------------------------------------------
def test_grade_swebench_task_fraction_missing_and_collection_error(tmp_path):
    task, repos = make_git_task(tmp_path)
    e = SweEnv(task, tmp_path / "ep", ToolUseSpec(), repos_root=repos)
    e.reset()
    e.step(call("edit", path="calc.py", old="return a - b", new="return a + b"))
    # add fixed: test_add and test_hidden (added by test_patch at grading) pass; mul still fails
    out = e.grade("fraction")
    assert (out.f2p_passed, out.f2p_total, out.p2p_passed, out.p2p_total) == (2, 3, 1, 1)
    assert out.swe_tests == pytest.approx(2 / 3) and not out.resolved  # 2 of 3 FAIL_TO_PASS
    assert e.grade("all").swe_tests == 0.0
    (e.repo / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n")
    out = e.grade("all")
    assert out.resolved and out.swe_tests == 1.0 and out.missing_tests == 0 and out.backend in ("bwrap", "docker")
    # a syntax error in the library: nothing collects -> failure, never a pass
    (e.repo / "calc.py").write_text("def add(a, b):\n    return a + b\n)(\n")
    out = e.grade("all")
    assert out.collection_error and out.swe_tests == 0.0 and out.f2p_passed == 0


def test_grade_counts_missing_tests_and_test_edits_as_failure(tmp_path):
    task, repos = make_git_task(tmp_path)
    ghost = task.model_copy(update={"FAIL_TO_PASS": task.FAIL_TO_PASS + ["tests/test_calc.py::test_ghost"]})
    e = SweEnv(ghost, tmp_path / "ep", ToolUseSpec(), repos_root=repos)
    e.reset()
    (e.repo / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n")
    out = e.grade("all")
    assert out.missing_tests == 1 and not out.resolved and out.swe_tests == 0.0
    e2 = SweEnv(task, tmp_path / "ep2", ToolUseSpec(), repos_root=repos)
    e2.reset()
    (e2.repo / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n")
    (e2.repo / "tests" / "conftest.py").write_text("# planted\n")
    out = e2.grade("all")
    # the code is right, but a planted conftest.py is a test-file edit: failure; the hidden tests ran on a
    # fresh copy without it (3 FAIL_TO_PASS pass), and the repo is left as the policy left it
    assert out.test_files_edited == ["tests/conftest.py"] and out.swe_tests == 0.0 and not out.resolved
    assert (e2.repo / "tests" / "conftest.py").exists() and out.f2p_passed == 3
    assert sorted(p.name for p in e2.workdir.iterdir()) == ["repo"]  # the grading copy is gone
