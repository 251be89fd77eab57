"""The one exit path of the ``evotrainer`` command line (docs/design.md, "Errors and the CLI exit path").

* :func:`fail` is what a command calls on a user error it detects itself: it prints ``error: MESSAGE``
  on stderr, one line, and exits with ``code`` (1 unless the command documents another).
* :func:`run` is the handler around the whole app (``evotrainer.cli.main``): a known error that reaches
  it (any :class:`~evotrainer.errors.EvoTrainerError`, or ``FileNotFoundError``) prints the same one
  line and exits 1; click's usage errors print click's message and exit 2; anything else prints one line
  with its type and a hint. The traceback is shown only with the global ``--debug`` flag (or
  ``EVOTRAINER_DEBUG=1``), on stderr before the line.

Every sub-command module (``*/cli.py``) uses :func:`fail`; no other exit mechanism or output style.
The module sits in core and imports only core, so every ``cli.py`` can import it at module level.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from typing import Any, NoReturn

import typer

from evotrainer.errors import EvoTrainerError
from evotrainer.terminal import neutralise

__all__ = ["DEBUG_ENV", "KNOWN_BASES", "debug_enabled", "error_line", "fail", "is_known", "known_errors", "report",
           "run", "set_debug"]

DEBUG_ENV = "EVOTRAINER_DEBUG"  # "1": tracebacks as with --debug
KNOWN_BASES: tuple[type[BaseException], ...] = (EvoTrainerError, FileNotFoundError)
_STATE = {"debug": False}


def set_debug(on: bool) -> None:
    """Turn tracebacks on or off (the global ``--debug`` flag)."""
    _STATE["debug"] = bool(on)


def debug_enabled() -> bool:
    """True with ``--debug`` or ``EVOTRAINER_DEBUG`` set to anything but empty / ``0``."""
    return _STATE["debug"] or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def error_line(message: str) -> None:
    """Print ``error: MESSAGE`` on stderr: the text as given (no markup) but for terminal controls, shown as
    ``\\xNN`` (:func:`evotrainer.terminal.neutralise`: a message often repeats a name from a foreign run folder,
    a config or an MCP client), ``error:`` in red on a terminal only."""
    typer.echo(f"{typer.style('error:', fg='red', bold=True)} {neutralise(message)}", err=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: MESSAGE`` (:func:`error_line`) and exit with ``code``.

    Raises ``typer.Exit``: the console script exits with ``code``, and an in-process caller running the
    app with ``standalone_mode=False`` gets ``code`` back from click.
    """
    error_line(message)
    raise typer.Exit(code)


def is_known(exc: BaseException) -> bool:
    """True for the errors printed as one line: an :class:`EvoTrainerError` or a ``FileNotFoundError``."""
    return isinstance(exc, KNOWN_BASES)


def known_errors() -> tuple[type[BaseException], ...]:
    """``FileNotFoundError`` and every :class:`EvoTrainerError` class of a module loaded now (an error whose
    module never loaded cannot have been raised; nothing is imported to build the list)."""
    found: list[type[BaseException]] = []
    todo: list[type[BaseException]] = [EvoTrainerError]
    while todo:
        cls = todo.pop()
        if cls.__module__ in sys.modules and cls not in found:
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return (FileNotFoundError, *found)


def _traceback(exc: BaseException) -> None:
    sys.stderr.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    sys.stderr.flush()


def _usage_error(exc: BaseException) -> bool:
    """A click / typer usage error (it has its own message and exit code): typer >= 0.16 vendors click, so its
    errors are ``typer.TyperException``; a ``click.ClickException`` can only come from a loaded ``click``."""
    click = sys.modules.get("click")
    return (isinstance(exc, typer.TyperException) and hasattr(exc, "show")) or (
        click is not None and isinstance(exc, click.ClickException))


def _aborted(exc: BaseException) -> bool:
    click = sys.modules.get("click")
    return isinstance(exc, (typer.Abort, KeyboardInterrupt)) or (click is not None and isinstance(exc, click.Abort))


def report(exc: BaseException) -> int:
    """Print ``exc`` as the CLI does and return the exit code for it (see the module docstring)."""
    if is_known(exc):
        if debug_enabled():
            _traceback(exc)
        error_line(str(exc))
        return 1
    if _usage_error(exc):
        exc.show()  # type: ignore[attr-defined]
        return int(exc.exit_code)  # type: ignore[attr-defined]
    if debug_enabled():
        _traceback(exc)
        return 1
    error_line(f"{type(exc).__name__}: {exc} (rerun with --debug for the traceback)")
    return 1


def run(app: Any, args: list[str] | None = None) -> int:
    """Run the typer ``app`` (``args``: default ``sys.argv[1:]``) and return the process exit code.

    A command's own exit code passes through (``typer.Exit``, ``SystemExit``, a returned int); Ctrl-C and
    ``typer.Abort`` print ``aborted`` and give 130; every exception goes through :func:`report`.
    """
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if not _show_ours(message, filename, lineno):
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        rc = app(args=args, standalone_mode=False)  # click returns a command's exit code instead of exiting
        return rc if isinstance(rc, int) else 0
    except typer.Exit as e:
        return int(e.exit_code)
    except (Exception, KeyboardInterrupt) as exc:  # known errors, usage errors, Ctrl-C and anything unexpected
        if _aborted(exc):
            typer.echo("aborted", err=True)
            return 130
        return report(exc)
    finally:
        warnings.showwarning = shown


def _show_ours(message: Warning | str, filename: str, lineno: int) -> bool:
    """Show our own warning (raised with ``warn_explicit(..., "evotrainer", 0)``: a foreign run's lines left out,
    metric points thinned) as ``warning: MESSAGE`` on stderr, like :func:`fail`'s ``error:`` line (Python's form,
    ``evotrainer:0: IngestWarning: ...``, named a file and line that do not exist); False for anyone else's, which
    :func:`run` passes to the ``warnings.showwarning`` it found."""
    if filename != "evotrainer" or lineno != 0:
        return False
    typer.echo(f"warning: {neutralise(str(message))}", err=True)
    return True
