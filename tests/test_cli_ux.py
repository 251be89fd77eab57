"""CLI user experience (issue 20): --version, whole-config validation with "did you mean", tables at 80 columns."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys


def cli(*args, cwd=None, columns: int = 200):
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


def test_version_matches_the_installed_distribution():
    r = cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"evotrainer {importlib.metadata.version('evotrainer')}\n"
    assert r.stdout == "evotrainer 0.1.0\n"  # pyproject.toml's version
