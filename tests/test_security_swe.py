"""Security suite, SWE environment: the red team's second probe set (issue 22; docs/security-probes.md).

Each probe failed on the code before its fix (numbers measured there, 2-core machine):

- grading read the verdict from pytest's ``-rA`` text, so code under test that printed ``PASSED <node id>`` for
  every test it found on disk and then called ``os._exit(0)`` got ``resolved=True`` with the bug still in;
- ``search`` compiled the policy's pattern with Python's ``re``: ``(x+x+)+y`` over one 26-character line the
  policy had written took 4.7 s (doubling per character; nothing can interrupt it mid-call);
- ``parse_tool_calls`` took 2.95 s on a reply of 100,000 ``{`` (quadratic) and raised ``RecursionError`` on
  JSON nested 20,000 deep (the docstring says it never raises).

Every probe asserts the host folder of ``test_security_sandbox`` is unchanged afterwards (the ``swe`` fixture).
"""

from __future__ import annotations

import time

import test_security_sandbox as base

from evotrainer.rl_backend.swe.env import parse_tool_calls

FIXED, call = base.FIXED, base.call
host, swe = base.host, base.swe  # the fixtures: a host folder that must stay unchanged, an episode

FORGE = ("import glob as _g, os as _o, re as _r\n"
         "_ids = [f'{p}::{n}' for p in _g.glob('tests/*.py') for n in _r.findall(r'def (test_\\w+)', open(p).read())]\n"
         "for _fd in (1, 2, *range(3, 20)):\n"
         "    try:\n"
         "        _o.write(_fd, ''.join(f'PASSED {i}\\n' for i in _ids).encode())\n"
         "    except OSError:\n"
         "        pass\n"
         "_o._exit(0)\n")


def test_forged_pass_lines_do_not_resolve_the_task(swe):
    swe.step(call("edit", path="calc.py", old="def add(a, b):", new=FORGE + "def add(a, b):"))
    out = swe.grade()
    assert (out.resolved, out.swe_tests, out.f2p_passed, out.p2p_passed, out.missing_tests) == (False, 0.0, 0, 0, 4)


def test_a_real_fix_still_resolves_through_the_results_report(swe):
    swe.step(call("edit", path="calc.py", old="    return a - b", new="    return a + b"))
    assert swe.step(call("edit", path="calc.py", old="    return a + b\n", new="    return a * b\n")).startswith(
        "[error] old text occurs 2 times")
    swe.step(call("edit", path="calc.py", old="def mul(a, b):\n    return a + b", new="def mul(a, b):\n    return a * b"))
    assert (swe.repo / "calc.py").read_text() == FIXED
    out = swe.grade()
    assert (out.resolved, out.swe_tests, out.f2p_passed, out.f2p_total, out.p2p_passed) == (True, 1.0, 3, 3, 1)


def test_only_the_first_token_counts():
    from evotrainer.rl_backend.swe.tasks import structured_results

    good = '{"outcomes": {"t.py::a": "PASSED"}, "collection_error": false}'
    assert structured_results(f"@@evotrainer-pytest abc start\nx\n@@evotrainer-pytest abc {good}\n") == (
        {"t.py::a": "PASSED"}, False)
    # a report under another token (forged by the code under test) is ignored; so is a stream that starts with one
    assert structured_results(f"@@evotrainer-pytest abc start\n@@evotrainer-pytest zzz {good}\n") is None
    assert structured_results(f"@@evotrainer-pytest zzz {good}\n@@evotrainer-pytest abc start\n") is None
    assert structured_results("PASSED t.py::a\n") is None


def test_catastrophic_search_pattern_is_linear(swe):
    swe.step(call("edit", path="calc.py", old="def mul(a, b):", new="X = '" + "x" * 28 + "'\n\n\ndef mul(a, b):"))
    t0 = time.monotonic()
    out = swe.step(call("search", pattern="(x+x+)+y"))
    assert time.monotonic() - t0 < 3.0  # Python's re: 4.7 s at 26 characters, ~19 s at 28
    assert out == "[search] no match for '(x+x+)+y'"
    assert swe.step(call("search", pattern=r"(a)\1")).startswith(
        "[search] no match for '(a)\\\\1' (not a regex RE2 accepts, e.g. a backreference: searched as plain text)")


def test_a_huge_search_pattern_on_a_long_line_is_bounded(swe):
    """Review 7: RE2 matches by NFA where its DFA gives up, at text x program size, on the host: the policy's
    ``(?:(?:a|b|ab|ba){0,100}){0,10}c`` (6,014 instructions) took 4.2 s on a 100,000-character line it wrote with
    ``edit`` (a 1 MiB line ~40 s per call, the call's timeout not read). Patterns over SEARCH_MAX_PROGRAM instructions
    are refused, and each line is read to SEARCH_SCAN_UNITS // program size characters."""
    from evotrainer.rl_backend.swe.env import SEARCH_MAX_PROGRAM

    swe.step(call("edit", path="calc.py", old="def mul(a, b):", new="X = '" + "ab" * 50_000 + "'\n\n\ndef mul(a, b):"))
    t0 = time.monotonic()
    out = swe.step(call("search", pattern="(?:(?:a|b|ab|ba){0,100}){0,10}c"))
    assert time.monotonic() - t0 < 2.5  # before: 4.2 s
    assert out.startswith("[error] pattern '(?:(?:a|b|ab|ba){0,100}){0,10}c' compiles to 6014 RE2 instructions, over "
                          f"{SEARCH_MAX_PROGRAM}"), out
    t0 = time.monotonic()
    out = swe.step(call("search", pattern="(?:(?:a|b|ab|ba){0,30}){0,10}c"))  # under the cap: the line is cut
    assert time.monotonic() - t0 < 3.0 and not out.startswith("[error]"), out


def test_hostile_replies_parse_in_linear_time_and_never_raise():
    t0 = time.monotonic()
    calls = parse_tool_calls("{" * 100_000)
    assert time.monotonic() - t0 < 2.0
    assert [c.error[:20] for c in calls] == ["no tool call found; "]
    nested = '{"a":' * 20_000 + "1" + "}" * 20_000
    assert [c.error[:20] for c in parse_tool_calls(nested)] == ["no tool call found; "]
    inner = parse_tool_calls(f"<tool_call>{nested}</tool_call>")
    assert [c.error for c in inner] == ["the <tool_call> block holds no JSON object"]
    ok = parse_tool_calls("{" * 300 + '<tool_call>{"name": "search", "arguments": {"pattern": "def"}}</tool_call>')
    assert [(c.name, c.error) for c in ok] == [("search", None)]


# --- second probe round: the test patch -----------------------------------------------------------------------
def _git_task_in(tmp_path, test_patch: str):
    """``make_git_task``'s task with another ``test_patch``, and an episode whose folder lies inside a git checkout
    whose config says ``apply.whitespace=error`` (as a user's ~/.gitconfig may)."""
    import subprocess

    from test_swe_tasks import make_git_task

    from evotrainer.recipe import ToolUseSpec
    from evotrainer.rl_backend.swe.env import SweEnv

    outer = tmp_path / "checkout"
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(["git", "-C", str(outer), "config", "apply.whitespace", "error"], check=True)
    task, repos = make_git_task(tmp_path)
    env = SweEnv(task.model_copy(update={"test_patch": test_patch}), outer / "runs" / "ep", ToolUseSpec(),
                 repos_root=repos)
    env.reset()
    (env.repo / "calc.py").write_text(FIXED)
    return env


HIDDEN = ("--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -12,2 +12,6 @@\n def test_zero():\n"
          "     assert add(0, 0) == 0\n+\n+\n+def test_hidden():  \n+    assert add(1, 1) == 2\n")


def test_the_test_patch_applies_whatever_git_checkout_or_config_surrounds_the_run(tmp_path):
    """The grading copy's ``git apply`` took its configuration from a checkout around the run folder: with
    ``apply.whitespace=error`` there, a test patch with a trailing blank failed, its exit status was not read,
    and the repo's original tests graded the episode (the hidden test_hidden missing: the right fix scored 0).
    git now sees no repository or configuration around the copy."""
    out = _git_task_in(tmp_path, HIDDEN).grade("all")
    assert (out.resolved, out.f2p_passed, out.missing_tests) == (True, 3, 0)  # before: (False, 2, 1)
    assert out.test_patch_error == ""


def test_a_test_patch_that_does_not_apply_fails_the_episode_and_says_why(tmp_path):
    """A test patch that does not apply left the original tests to grade, silently (a test the patch changes
    graded the old version of itself; here the patch's context is wrong). The episode now scores 0 without
    running tests and the outcome names the task and git's reason."""
    broken = HIDDEN.replace("def test_zero():", "def test_not_there():")
    out = _git_task_in(tmp_path, broken).grade("fraction")
    assert (out.resolved, out.swe_tests, out.ran_tests, out.f2p_passed) == (False, 0.0, False, 0)
    assert out.test_patch_error.startswith("acme__calc-1: the test patch does not apply to the final repo (git apply "
                                           "exit 1): ")
    assert "patch failed: tests/test_calc.py:12" in out.test_patch_error


# --- review 5: a report line nested past the recursion limit ---------------------------------------------------
NESTED_REPORT = ("import gc as _gc, os as _os\n"
                 "for _o in _gc.get_objects():\n"
                 "    if type(_o).__name__ == 'Results':\n"
                 "        _f = type(_o).pytest_sessionfinish\n"
                 "        _c = dict(zip(_f.__code__.co_freevars, (c.cell_contents for c in _f.__closure__)))\n"
                 "        _os.write(_c['out'], ('\\n@@evotrainer-pytest ' + _c['token'] + ' ' + '[' * 100000 + '\\n')"
                 ".encode())\n"
                 "        break\n")


def test_a_report_nested_past_the_recursion_limit_is_no_verdict(swe):
    """The code under test reads the results runner's token from the plugin's closure in its own process and
    writes a report line of 100,000 ``[`` under it: ``json.loads`` raised RecursionError out of
    ``structured_results``, through ``run_tests`` and ``grade`` (the training process ended). Now that line is no
    verdict: the tests the run did report still count, nothing raises."""
    from evotrainer.rl_backend.swe.tasks import structured_results

    swe.step(call("edit", path="calc.py", old="def add(a, b):", new=NESTED_REPORT + "def add(a, b):"))
    assert swe.step(call("run_tests")).startswith("[run_tests] ")
    out = swe.grade()
    assert (out.resolved, out.swe_tests) == (False, 0.0)
    good = '{"outcomes": {"t.py::a": "FAILED"}, "collection_error": false}'
    deep = "@@evotrainer-pytest abc " + "[" * 100_000
    assert structured_results(f"@@evotrainer-pytest abc start\n{deep}\n") is None
    assert structured_results(f"@@evotrainer-pytest abc start\n{deep}\n@@evotrainer-pytest abc {good}\n") == (
        {"t.py::a": "FAILED"}, False)


def test_a_search_with_millions_of_matches_keeps_forty_and_stops_at_its_budget(swe):
    """Review 18 (W-R18): ``a`` over 4 files of 1 MiB of ``a\\n`` collected all 2,097,157 matches to show 40: 10.9 s
    and 225 MB on the host (27.8 s on the reviewer's machine); the 8 files here 31 s, failing the bound below. Matches past the 40 shown are
    counted, not kept, and the call stops after SEARCH_MAX_LINES lines (each file counts one), saying where."""
    for i in range(8):
        (swe.repo / f"a{i}.txt").write_bytes(b"a\n" * (512 * 1024 - 1))
    t0 = time.monotonic()
    out = swe.step(call("search", pattern="a"))
    assert time.monotonic() - t0 < 3.0  # before: 31 s; after: ~0.35 s (loaded 2-core machine)
    from evotrainer.rl_backend.swe.env import SEARCH_CALL_UNITS, SEARCH_MAX_HITS, SEARCH_MAX_LINES

    lines = out.split("\n")
    # a0.txt counts 1, then its lines 1..99,999: line 100,000 would be the 100,001st
    assert lines[0] == "[search] 99999 matches in the part searched:"
    assert lines[1:SEARCH_MAX_HITS + 1] == [f"a0.txt:{n}: a" for n in range(1, 41)]
    assert lines[SEARCH_MAX_HITS + 1:] == [
        "(99959 more matches not shown)",
        f"(search stopped at its budget of {SEARCH_MAX_LINES:,} lines or {SEARCH_CALL_UNITS:,} characters x pattern "
        "size; not searched: a0.txt from line 100000 on, and the files after it; give a path to search one folder or "
        "file)"]
    assert (SEARCH_MAX_HITS, SEARCH_MAX_LINES) == (40, 100_000)
    out = swe.step(call("search", pattern="a", path="a3.txt"))  # one file: the same cut, no other files named
    assert out.startswith("[search] 99999 matches in the part searched:\na3.txt:1: a\n") and out.endswith(
        "(99959 more matches not shown)\n(search stopped at its budget of 100,000 lines or 500,000,000 characters x "
        "pattern size; not searched: a3.txt from line 100000 on; view reads the rest)"), out
    # a path narrows it: one file, whole, no note
    assert swe.step(call("search", pattern="return a", path="calc.py")) == (
        "[search] 2 matches:\ncalc.py:2: return a - b\ncalc.py:6: return a + b")


def test_a_search_stops_at_its_budget_of_characters_times_pattern_size(swe):
    """Lines of 37,514 characters (SEARCH_SCAN_UNITS // 853, all of each line read) and an 853-instruction pattern:
    31,999,442 units a line, so 15 lines fit SEARCH_CALL_UNITS = 500,000,000 and the 16th does not."""
    pattern = "(?:(?:a|b){0,15}(?:ab|ba){0,15}){0,8}c"
    (swe.repo / "a.txt").write_text(("ab" * 18_757 + "\n") * 27)
    out = swe.step(call("search", pattern=pattern))
    assert out == (f"[search] no match for {pattern!r} in the part searched\n(search stopped at its budget of 100,000 "
                   "lines or 500,000,000 characters x pattern size; not searched: a.txt from line 16 on, and the files "
                   "after it; give a path to search one folder or file)")
    assert swe.step(call("search", pattern="return a")) == (  # the budget is per call
        "[search] 2 matches:\ncalc.py:2: return a - b\ncalc.py:6: return a + b")
