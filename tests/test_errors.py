"""One error base and one CLI exit path.

- every error class of the product derives from ``EvoTrainerError`` and keeps its builtin base;
- a known error that reaches the console script (a ``BackendError``, a ``SkillError``) prints one line
  ``error: MESSAGE`` and exits 1: no traceback, no "unexpected" hint; ``--debug`` or ``EVOTRAINER_DEBUG=1``
  adds the traceback; an unexpected error prints its type and the ``--debug`` hint;
- ``cli_errors.fail`` is the one failure helper of the sub-commands: the same line, the given exit code.
"""

from __future__ import annotations

import ast
import errno
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from evotrainer import cli_errors
from evotrainer.errors import EvoTrainerError

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("evotrainer", "harness", "rl_backend", "servers", "agents", "skills_db")
BUILTIN_BASES = {"ValueError", "RuntimeError", "OSError", "Exception"}


def _error_classes() -> list[tuple[str, str, list[str]]]:
    """(file, class, base names) of every class in the product that derives from an exception."""
    found = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                    if any(b in BUILTIN_BASES or b.endswith(("Error", "Unavailable")) for b in bases):
                        found.append((str(path.relative_to(ROOT)), node.name, bases))
    return found


def test_every_error_class_derives_from_the_base():
    classes = _error_classes()
    names = {name for _, name, _ in classes}
    assert len(classes) >= 25, classes  # the scan sees the product's errors
    bad = [(f, name, bases) for f, name, bases in classes
           if bases[0] != "EvoTrainerError" and bases[0] not in names and name != "EvoTrainerError"]
    assert not bad, f"error classes without EvoTrainerError first: {bad}"


@pytest.mark.parametrize(("module", "name", "builtin"), [
    ("evotrainer.recipe", "RecipeError", ValueError),
    ("evotrainer.workspace", "WorkspaceError", RuntimeError),
    ("evotrainer.sandbox", "SandboxError", RuntimeError),
    ("evotrainer.sandbox", "UnsafePathError", OSError),
    ("evotrainer.rl_backend.base", "BackendError", RuntimeError),
    ("evotrainer.skills_db.models", "SkillError", ValueError),
    ("evotrainer.harness.ingest", "IngestError", ValueError),
    ("evotrainer.jsonl", "NumberTooLong", ValueError),
    ("evotrainer.harness.ingest_formats", "BudgetSpent", ValueError),
    ("evotrainer.agents.mcp_client", "ToolCallError", RuntimeError),
])
def test_error_classes_keep_their_builtin_base(module, name, builtin):
    cls = getattr(__import__(module, fromlist=[name]), name)
    assert issubclass(cls, EvoTrainerError) and issubclass(cls, builtin)


def test_unsafe_path_error_is_still_an_oserror_with_errno():
    from evotrainer.sandbox import UnsafePathError

    e = UnsafePathError(errno.ELOOP, "a link on the path", "a/b")
    assert e.errno == errno.ELOOP and e.filename == "a/b" and isinstance(e, OSError)


# --- the console script ------------------------------------------------------------------------------------
SCRIPT = """
import sys
from evotrainer.cli import app, main
from evotrainer.rl_backend.base import BackendError
from evotrainer.skills_db.models import SkillError

@app.command("boom-backend")
def _backend() -> None:
    raise BackendError("backend='nope': allowed: local, openrlhf")

@app.command("boom-skill")
def _skill() -> None:
    raise SkillError("skill s1: value rule op='pow': allowed ops: set, mul, add, toggle")

@app.command("boom-bug")
def _bug() -> None:
    raise KeyError("oops")

sys.argv[0] = "evotrainer"
main()
"""


def _script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "COLUMNS": "200", **(env or {})})


@pytest.mark.parametrize(("command", "line"), [
    ("boom-backend", "error: backend='nope': allowed: local, openrlhf"),
    ("boom-skill", "error: skill s1: value rule op='pow': allowed ops: set, mul, add, toggle"),
])
def test_known_errors_print_one_line_and_debug_adds_the_traceback(command, line):
    r = _script(command)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == line + "\n"  # one line: no traceback, no "unexpected" type prefix or --debug hint
    for args, env in (((("--debug", command)), None), (((command,)), {"EVOTRAINER_DEBUG": "1"})):
        r = _script(*args, env=env)
        assert r.returncode == 1
        assert r.stderr.startswith("Traceback (most recent call last):") and r.stderr.endswith(line + "\n")


def test_unexpected_errors_name_their_type_and_the_debug_flag():
    r = _script("boom-bug")
    assert r.returncode == 1
    assert r.stderr == "error: KeyError: 'oops' (rerun with --debug for the traceback)\n"
    r = _script("--debug", "boom-bug")
    assert r.returncode == 1 and "Traceback" in r.stderr and "KeyError: 'oops'" in r.stderr


# --- the one failure helper -----------------------------------------------------------------------------------
def test_fail_prints_one_line_and_exits_with_the_code():
    app = typer.Typer()

    @app.command()
    def go(code: int = 1) -> None:
        cli_errors.fail(f"--thing {code}: choose another", code)

    runner = CliRunner()
    for code in (1, 3):
        res = runner.invoke(app, ["--code", str(code)])
        assert res.exit_code == code and res.output == f"error: --thing {code}: choose another\n"
    assert cli_errors.run(app, ["--code", "4"]) == 4  # the console script's path: the code comes back


def test_an_error_line_shows_terminal_controls_escaped():
    """An error that repeats a hostile name (a version label, a key of a foreign run's file) prints its controls as
    visible escapes: ESC [2J would clear the user's terminal, a bidi override reverse the line."""
    app = typer.Typer()

    @app.command()
    def go() -> None:
        cli_errors.fail("unknown version 'v1\x1b[2J\u202e' (see lineage show)")

    res = CliRunner().invoke(app, [])
    assert res.exit_code == 1
    assert res.output == "error: unknown version 'v1\\x1b[2J\\u202e' (see lineage show)\n"
    assert "\x1b" not in res.output


def test_known_errors_are_the_loaded_subclasses():
    import evotrainer.recipe as recipe

    errs = cli_errors.known_errors()
    assert FileNotFoundError in errs and EvoTrainerError in errs and recipe.RecipeError in errs
    assert all(issubclass(e, EvoTrainerError) for e in errs if e is not FileNotFoundError)
    assert all(e.__module__ in sys.modules for e in errs)


def test_our_warnings_print_as_a_warning_line_and_others_as_python_shows_them(capsys):
    import warnings as w

    app = typer.Typer()

    @app.command()
    def cmd() -> None:
        # what harness.ingest / evotrainer.points raise: no real file and line, so Python showed "evotrainer:0: ..."
        w.warn_explicit("run.jsonl:4: 1 line(s) that are only an elision mark ('...') left out", UserWarning,
                        "evotrainer", 0, module="evotrainer.test")
        w.warn_explicit("someone else's", UserWarning, "lib.py", 7, module="lib")

    others: list[tuple[str, str, int]] = []
    shown = w.showwarning
    def record(m, c, f, n, file=None, line=None):
        others.append((str(m), f, n))

    w.showwarning = record
    try:
        assert cli_errors.run(app, []) == 0
        assert w.showwarning is record  # restored after the command
        assert others == [("someone else's", "lib.py", 7)]  # another's warning passed on as it was
    finally:
        w.showwarning = shown
    err = capsys.readouterr().err
    assert err == "warning: run.jsonl:4: 1 line(s) that are only an elision mark ('...') left out\n"
