"""Text that goes to a terminal: control characters a program, a log or an MCP client wrote are shown, not obeyed.

One rule for every command that prints text it did not write itself (``sandbox run`` output, skill names,
descriptions and code from the skills memory, version labels): :func:`neutralise`.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

# C0 controls but \n and \t, DEL, and C1 (U+0080-U+009F): ESC starts OSC 52 (clipboard write), title
# and clear-screen sequences, 0x9B is a one-byte CSI. Rendered as visible \xNN escapes.
# Unicode bidirectional controls (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069): a terminal that renders
# bidi lays the rest of the line out backwards ("Trojan Source"), so printed output reads other than it is
# (``exit 0 \u202e1 edoc``). Rendered as visible \uNNNN escapes.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def clip_text(text: str | None, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters with a marker saying how much was cut (``max_chars`` <= 0: whole)."""
    text = text or ""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return text[:max_chars] + f"... [{len(text) - max_chars} more chars]"


MAX_ERRORS_SHOWN = 20
"""Errors one message lists; the rest are counted. Review 16 (Y-R16): a 239 KB recipe of 25,000 unknown keys printed
25,000 lines, 12 MB, each listing the allowed fields. Twenty cover a config written by hand; fixing them and
validating again shows the next ones."""

MAX_KEY_CHARS = 64
"""Characters of a field name (a config key, a location part) an error echoes: real ones are under 40."""


def capped_errors(lines: list[str], total: int | None = None, max_shown: int = MAX_ERRORS_SHOWN) -> list[str]:
    """The first ``max_shown`` of ``lines`` and, when there are more (``total``: how many in all, default
    ``len(lines)``), a last line ``... and N more errors (fix these and validate again to see them)``."""
    total = len(lines) if total is None else total
    shown = lines[:max_shown]
    if total > len(shown):
        shown.append(f"... and {total - len(shown):,} more errors (fix these and validate again to see them)")
    return shown


def clip_key(key: object) -> str:
    """A field name or location part as an error echoes it: ``str(key)`` cut to :data:`MAX_KEY_CHARS`."""
    return clip_text(str(key), MAX_KEY_CHARS)


def has_controls(text: str) -> bool:
    """Whether ``text`` holds a character :func:`neutralise` would show escaped (a terminal control but newline
    and tab, or a bidi control), or a newline or tab (in a path or a name, they are no layout)."""
    return bool(_CONTROLS.search(text)) or "\n" in text or "\t" in text


def neutralise(text: str) -> str:
    """``text`` with every terminal control character except newline and tab shown as ``\\xNN`` (bidi controls
    as ``\\uNNNN``)."""
    return _CONTROLS.sub(lambda m: _shown(m.group()), text)


# Width of command output that goes to a pipe or a file. rich falls back to 80 columns there (when COLUMNS is unset),
# which squeezed `report`'s and `lineage show`'s tables into wrapped cells in a log or a `| less`; 160 holds the
# widest of our tables (the report's score table with both gains) on one line per row.
PIPED_WIDTH = 160


def output_console(stderr: bool = False, **kwargs: Any) -> Console:
    """A rich console for a command's output: the terminal's width on a terminal, and when the stream is piped or
    redirected ``COLUMNS`` if set, else :data:`PIPED_WIDTH` (rich alone would use 80). ``kwargs`` go to
    :class:`rich.console.Console` (``soft_wrap``, ...)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        tty = False
    width = None if tty or os.environ.get("COLUMNS", "").strip().isdigit() else PIPED_WIDTH
    return Console(stderr=stderr, width=width, **kwargs)
