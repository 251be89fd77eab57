"""Text that goes to a terminal: control characters a program, a log or an MCP client wrote are shown, not obeyed.

One rule for every command that prints text it did not write itself (``sandbox run`` output, skill names,
descriptions and code from the skills memory, version labels): :func:`neutralise`.
"""

from __future__ import annotations

import re

# C0 controls but \n and \t, DEL, and C1 (U+0080-U+009F): ESC starts OSC 52 (clipboard write), title
# and clear-screen sequences, 0x9B is a one-byte CSI. Rendered as visible \xNN escapes.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def neutralise(text: str) -> str:
    """``text`` with every terminal control character except newline and tab shown as ``\\xNN``."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
