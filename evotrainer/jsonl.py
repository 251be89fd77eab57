"""JSON reading shared by the task loaders (``rl_backend``), the log ingesters (``harness``), the MCP envelope
guard (``servers``) and ``compare --baseline`` (``agents``): JSON lines, and integers of a bounded length.

Python refuses an integer of more than 4,300 digits (``sys.get_int_max_str_digits``) with a ``ValueError`` that
tells the user to raise the interpreter's limit, and converting a digit string to an int costs time quadratic in its
length; review 18 (I-R18, M-R18): one such number refused a whole metrics file, a ``trainer_state.json`` or an MCP
message with that raw advice and no line or field. :func:`bounded_int` is the ``parse_int`` hook of every reader
here: a longer integer raises :class:`NumberTooLong`, which says how many digits it had and where.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from evotrainer.errors import EvoTrainerError

MAX_JSON_INT_DIGITS = 64
"""Digits (the sign not counted) of one JSON integer the readers accept. No metric, step, count or request id needs
more: a 64-bit integer has at most 19 digits, a 128-bit one 39; 64 leaves room for an id written as a big integer,
and keeps each conversion well under a microsecond (Python's own limit, 4,300, is what review 18 hit)."""


class NumberTooLong(EvoTrainerError, ValueError):
    """A JSON integer of more than :data:`MAX_JSON_INT_DIGITS` digits (raised by :func:`bounded_int`).

    ``digits`` is its number of digits; :meth:`line_in` finds the line it is on; ``where`` (may be empty) names the
    value holding it. The message never echoes the number.
    """

    def __init__(self, text: str):
        self.digits = len(text) - text.startswith("-")
        self._text = text
        self.where = ""  # set by a reader that knows more than the line (e.g. "log_history entry 7")
        super().__init__(f"a number of {self.digits:,} digits, past the {MAX_JSON_INT_DIGITS} a JSON integer may "
                         "have here (no metric, step, count or id needs more); write it as a string, or fix the "
                         "writer that made it")

    def line_in(self, text: str) -> int:
        """The line (from 1) of ``text`` where the number first appears (1 when it cannot be found)."""
        at = text.find(self._text)
        return text.count("\n", 0, at) + 1 if at >= 0 else 1

    def located(self, source: str, text: str) -> str:
        """The message prefixed by ``<source>:<line>: `` (its line in ``text``, the whole text that was parsed)."""
        where = f"{self.where}: " if self.where else ""
        return f"{source}:{self.line_in(text)}: {where}{self}"


def bounded_int(text: str) -> int:
    """``int(text)`` of a JSON integer literal (the ``parse_int`` hook of ``json.loads`` / ``json.JSONDecoder``).

    Raises:
        NumberTooLong: more than :data:`MAX_JSON_INT_DIGITS` digits.
    """
    if len(text) > MAX_JSON_INT_DIGITS and len(text) - text.startswith("-") > MAX_JSON_INT_DIGITS:  # one compare
        raise NumberTooLong(text)  # for the usual short number: this hook runs for every integer of a file
    return int(text)


_DECODER = json.JSONDecoder(parse_int=bounded_int)


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads`` with integers bounded (:func:`bounded_int`); ``kwargs`` go to ``json.loads``.

    Raises:
        json.JSONDecodeError: not JSON.
        NumberTooLong: an integer of more than :data:`MAX_JSON_INT_DIGITS` digits.
    """
    if kwargs or not isinstance(text, str) or text.startswith("\ufeff"):  # bytes, a BOM: json.loads's own handling
        return json.loads(text, parse_int=bounded_int, **kwargs)
    return _DECODER.decode(text)  # one decoder: json.loads builds a new one per call when given a hook (~3 us)


def iter_jsonl(lines: Iterable[str], source: str, error: type[Exception] = ValueError,
               hint: str = "") -> Iterator[tuple[int, Any]]:
    """``(line number from 1, parsed value)`` of each non-blank JSON line of ``lines``.

    Args:
        lines: the text lines (e.g. ``path.read_text().splitlines()`` or an open file).
        source: the name used in errors (a path).
        error: the exception class raised for a bad line (each caller's own error type).
        hint: appended to the error message (e.g. "; one task object per line").

    Raises:
        error: a line is not JSON (``<source>:<line>: not JSON (<reason>)<hint>``), or holds an integer of more
            than :data:`MAX_JSON_INT_DIGITS` digits (``<source>:<line>: a number of N digits, ...<hint>``).
    """
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{source}:{n}: not JSON ({exc.msg}){hint}") from None
        except NumberTooLong as exc:
            raise error(f"{source}:{n}: {exc}{hint}") from None
