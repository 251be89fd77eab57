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
    assert time.monotonic() - t0 < 1.0  # Python's re: 4.7 s at 26 characters, ~19 s at 28
    assert out == "[search] no match for '(x+x+)+y'"
    assert swe.step(call("search", pattern=r"(a)\1")).startswith(
        "[search] no match for '(a)\\\\1' (not a regex RE2 accepts, e.g. a backreference: searched as plain text)")


def test_hostile_replies_parse_in_linear_time_and_never_raise():
    t0 = time.monotonic()
    calls = parse_tool_calls("{" * 100_000)
    assert time.monotonic() - t0 < 0.5
    assert [c.error[:20] for c in calls] == ["no tool call found; "]
    nested = '{"a":' * 20_000 + "1" + "}" * 20_000
    assert [c.error[:20] for c in parse_tool_calls(nested)] == ["no tool call found; "]
    inner = parse_tool_calls(f"<tool_call>{nested}</tool_call>")
    assert [c.error for c in inner] == ["the <tool_call> block holds no JSON object"]
    ok = parse_tool_calls("{" * 300 + '<tool_call>{"name": "search", "arguments": {"pattern": "def"}}</tool_call>')
    assert [(c.name, c.error) for c in ok] == [("search", None)]
