"""JSON lines reading, shared by the task loaders (``rl_backend``) and the log ingesters (``harness``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def iter_jsonl(lines: Iterable[str], source: str, error: type[Exception] = ValueError,
               hint: str = "") -> Iterator[tuple[int, Any]]:
    """``(line number from 1, parsed value)`` of each non-blank JSON line of ``lines``.

    Args:
        lines: the text lines (e.g. ``path.read_text().splitlines()`` or an open file).
        source: the name used in errors (a path).
        error: the exception class raised for a bad line (each caller's own error type).
        hint: appended to the error message (e.g. "; one task object per line").

    Raises:
        error: a line is not JSON; the message reads ``<source>:<line>: not JSON (<reason>)<hint>``.
    """
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{source}:{n}: not JSON ({exc.msg}){hint}") from None
