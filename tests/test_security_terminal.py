"""Security suite, text the CLI prints but did not write (issue 22's second probe set; docs/security-probes.md).

An MCP client (any holder of the HTTP token, or a model driving the tools) writes skills and version values; the
user's ``evotrainer skills show / list`` and ``lineage show`` print them. Before the fix a skill name carrying
``ESC ] 52 ; c ; <base64> BEL`` reached the terminal raw (OSC 52 writes the clipboard; ``ESC ] 0`` sets the
title, ``ESC [ 2 J`` clears the screen), and rich markup in a value was obeyed (``[link=...]`` makes a hyperlink;
an unmatched ``[/x]`` crashed ``lineage show`` with a MarkupError).
"""

from __future__ import annotations

import os
import subprocess
import sys

from mcp_testlib import SyncClient, make_run

from evotrainer.servers.app import build_server

ESC = "\x1b"
EVIL = f"{ESC}]52;c;ZXZpbA==\x07{ESC}]0;owned{ESC}\\{ESC}[2J[link=http://evil.example]x[/link][/x]\x9b31m"


def _cli(*args: str, env: dict[str, str]) -> bytes:
    r = subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-500:]
    return r.stdout + r.stderr


def _assert_inert(out: bytes) -> None:
    assert ESC.encode() not in out and "\x9b".encode() not in out, out[-300:]
    assert b"\\x1b]52;c;ZXZpbA==\\x07" in out  # shown, not obeyed
    assert b"[link=http://evil.example]x[/link][/x]" in out  # markup printed as text


def test_skill_text_from_an_mcp_client_is_shown_not_obeyed(tmp_path):
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"), "COLUMNS": "400"}
    code = ("from evotrainer.servers.app import build_server\nfrom mcp_testlib import SyncClient\n"
            "c = SyncClient(build_server('skills'))\n"
            f"c.ok('add_skill', {{'kind': 'analyzer', 'skill_id': 'rt-esc', 'name': {EVIL!r}, 'description': {EVIL!r},"
            f" 'code': 'print(1)  # ' + {EVIL!r}, 'tags': ['t']}})\nc.close()\n")
    subprocess.run([sys.executable, "-c", code], check=True, env={**env, "PYTHONPATH": os.path.dirname(__file__)},
                   timeout=300)
    _assert_inert(_cli("skills", "show", "rt-esc", env=env))
    out = _cli("skills", "list", env=env)
    assert ESC.encode() not in out and b"rt-esc" in out


def test_version_values_from_an_mcp_client_are_shown_not_obeyed(tmp_path):
    run = make_run(tmp_path)
    c = SyncClient(build_server("training", run))
    try:
        c.ok("propose_intervention", {"parent_id": "v0", "path": "model.name_or_path", "new_value": EVIL,
                                      "hypothesis": "h"})
    finally:
        c.close()
    out = _cli("lineage", "show", str(run), env={**os.environ, "COLUMNS": "400"})
    assert ESC.encode() not in out and "\x9b".encode() not in out
    assert b"[link=http://evil.example]x[/link][/x]" in out


def test_bidirectional_controls_are_shown_not_obeyed():
    """A sandboxed program (or a skill name) printing U+202E made a bidi terminal lay the rest of the line out
    backwards ("Trojan Source": ``exit 0 \\u202e1 edoc`` reads as ``exit 0 code 1``); every bidi control is shown
    as a ``\\uNNNN`` escape now, other non-ASCII text is printed as it is."""
    from evotrainer.terminal import neutralise

    bidi = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    out = neutralise(f"exit 0 {bidi}1 edoc é 中\n\t")
    assert not any(c in out for c in bidi)
    assert out == ("exit 0 \\u061c\\u200e\\u200f\\u202a\\u202b\\u202c\\u202d\\u202e\\u2066\\u2067\\u2068\\u2069"
                   "1 edoc é 中\n\t")
    assert neutralise("\x1b[2J\x9b") == "\\x1b[2J\\x9b"
