"""Caller-supplied regular expressions compiled with RE2 (``google-re2``): matching is linear in the text whatever
the pattern, and the GIL is released while it runs (docs/security-probes.md: Python's ``re`` on ``(x+x+)+y`` held
the GIL for seconds at 26 characters, doubling per character, and stalled every MCP session of the server)."""

from __future__ import annotations

from typing import Any

import re2

from evotrainer.errors import EvoTrainerError


class PatternError(EvoTrainerError, ValueError):
    """Not valid RE2 syntax (RE2 has no backreferences or look-around); the message is RE2's reason."""


def compile_re2(pattern: str, case_sensitive: bool = True) -> Any:
    """``pattern`` compiled with RE2, its error log off (the reason is in the exception, not on stderr).

    Raises:
        PatternError: RE2 cannot compile it; ``str(exc)`` is RE2's reason, decoded.
    """
    opts = re2.Options()
    opts.case_sensitive = case_sensitive
    opts.log_errors = False
    try:
        return re2.compile(pattern, opts)
    except re2.error as exc:
        why = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(why) from None
