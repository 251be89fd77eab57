"""Text that goes to a terminal: control characters a program, a log or an MCP client wrote are shown, not obeyed.

One rule for every command that prints text it did not write itself (``sandbox run`` output, skill names,
descriptions and code from the skills memory, version labels): :func:`neutralise`.
"""

from __future__ import annotations

import re

# C0 controls but \n and \t, DEL, and C1 (U+0080-U+009F): ESC starts OSC 52 (clipboard write), title
# and clear-screen sequences, 0x9B is a one-byte CSI. Rendered as visible \xNN escapes.
# Unicode bidirectional controls (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069): a terminal that renders
# bidi lays the rest of the line out backwards ("Trojan Source"), so printed output reads other than it is
# (``exit 0 \u202e1 edoc``). Rendered as visible \uNNNN escapes.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def neutralise(text: str) -> str:
    """``text`` with every terminal control character except newline and tab shown as ``\\xNN`` (bidi controls
    as ``\\uNNNN``)."""
    return _CONTROLS.sub(lambda m: _shown(m.group()), text)
