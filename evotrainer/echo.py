"""Caller text repeated in error messages, bounded: :func:`echo` and :func:`closest_names`.

An error message names what the caller got wrong (``unknown tool 'get_verison'; did you mean 'get_version'?``),
so it repeats caller text. Repeated as it came, a 3.9 MB tool name made a 3.9 MB reply, and the work on it
(scrubbing internal paths with a backtracking regex, difflib against every candidate) took minutes on the event
loop (review 16, M-R16 / J-R16: a 60,000-character name took 9.08 s, a crafted input with many candidates 58.4 s
in difflib). Every error message that repeats a caller-given name or key goes through these helpers:

- :func:`echo` shows at most :data:`MAX_ECHO_CHARS` characters of it, with ``... (N characters)`` when cut;
- :func:`closest_names` compares an echoed prefix of the name with at most the first :data:`CLOSE_NAME_POOL`
  candidates and returns at most :data:`MAX_CLOSE_NAMES` of them, with the count of the candidates it left out.

The work of either is bounded whatever the input's size: O(:data:`MAX_ECHO_CHARS` x :data:`CLOSE_NAME_POOL`)
sequence comparisons, each of strings of at most a few hundred characters.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable, Sized

__all__ = ["CLOSE_NAME_POOL", "MAX_CLOSE_NAMES", "MAX_ECHO_CHARS", "MAX_NAME_CHARS", "closest_names", "echo", "name_list"]

MAX_ECHO_CHARS = 64  # characters of a caller's name shown in an error: every real name (tools, fields) is shorter
MAX_NAME_CHARS = 200  # characters of a candidate compared by closest_names (real names are under 64)
CLOSE_NAME_POOL = 200  # candidates closest_names compares (difflib is O(n*m) per pair: 200 keep it ~ms)
MAX_CLOSE_NAMES = 20  # names closest_names returns (a longer list helps no reader)
CLOSE_RATIO = 0.6  # difflib's own default cutoff: a similarity ratio below it is no suggestion


def echo(text: object, limit: int = MAX_ECHO_CHARS) -> str:
    """At most ``limit`` characters of ``text`` (``str()`` of it when it is no string), followed by
    ``... (N characters)`` when ``text`` was longer, N its full length; a short text comes back as it is (so
    ``f"{echo(name)!r}"`` reads as ``f"{name!r}"`` did for every real name).

    Args:
        text: what the caller gave (a name, a key, a path); any object.
        limit: characters shown, at least 1 (default :data:`MAX_ECHO_CHARS`).

    Raises:
        ValueError: ``limit`` below 1.
    """
    if limit < 1:
        raise ValueError(f"limit: at least 1 character, got {limit}")
    s = text if isinstance(text, str) else str(text)
    if len(s) <= limit:
        return s
    return f"{s[:limit]}... ({len(s):,} characters)"


def closest_names(name: object, candidates: Iterable[object], n: int = MAX_CLOSE_NAMES,
                  cutoff: float = CLOSE_RATIO) -> tuple[list[str], int]:
    """The candidates closest to a misspelt ``name``, best first, and how many candidates were not returned.

    Only the first :data:`MAX_ECHO_CHARS` characters of ``name`` and the first :data:`CLOSE_NAME_POOL` candidates
    (each cut to :data:`MAX_NAME_CHARS` characters) are compared (difflib ratio >= ``cutoff``); the rest of
    ``candidates`` is counted, not compared. ``candidates`` may be any iterable (a dict gives its keys).

    Args:
        name: what the caller gave.
        candidates: the names it could have meant.
        n: names returned at most, 1 to :data:`MAX_CLOSE_NAMES`.
        cutoff: the lowest difflib similarity ratio, 0 to 1, of a name returned.

    Returns:
        ``(names, rest)``: at most ``n`` close names, and the number of candidates not among them.

    Raises:
        ValueError: ``n`` or ``cutoff`` out of range.
    """
    if not 1 <= n <= MAX_CLOSE_NAMES:
        raise ValueError(f"n: 1 to {MAX_CLOSE_NAMES} names, got {n}")
    if not 0.0 <= cutoff <= 1.0:
        raise ValueError(f"cutoff: a ratio from 0 to 1, got {cutoff}")
    it = iter(candidates)
    pool = [str(c) for c in itertools.islice(it, CLOSE_NAME_POOL)]
    total = len(candidates) if isinstance(candidates, Sized) else len(pool) + sum(1 for _ in it)
    word = (name if isinstance(name, str) else str(name))[:MAX_ECHO_CHARS]
    close = difflib.get_close_matches(word, [c[:MAX_NAME_CHARS] for c in pool], n=n, cutoff=cutoff)
    full = {c[:MAX_NAME_CHARS]: c for c in reversed(pool)}  # a cut candidate maps back to its first full name
    names = [full[c] for c in close]
    return names, total - len(names)


def name_list(names: Iterable[object], limit: int = MAX_CLOSE_NAMES) -> str:
    """``"a, b, c"``: at most ``limit`` of ``names`` (each through :func:`echo`), then ``" and N more"`` for the
    rest; ``"none"`` when there are none. An error listing the known names (versions, fields) stays a line long
    however many there are.

    Raises:
        ValueError: ``limit`` below 1.
    """
    if limit < 1:
        raise ValueError(f"limit: at least 1 name, got {limit}")
    it = iter(names)
    shown = [echo(n) for n in itertools.islice(it, limit)]
    rest = sum(1 for _ in it)
    if not shown:
        return "none"
    return ", ".join(shown) + (f" and {rest:,} more" if rest else "")
