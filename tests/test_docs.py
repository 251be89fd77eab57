"""The README's generated sections (config reference, MCP tool catalogue) match the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_generated_sections_are_current():
    r = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_opens_with_the_two_commands():
    head = (ROOT / "README.md").read_text().split("\n\n")[1]
    assert "make run" in head and "make test" in head
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.strip().splitlines()[-1] == "make test"
