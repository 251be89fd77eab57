"""CLI: `evotrainer sandbox info|run` (the untrusted-code sandbox)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the ``sandbox`` command group to the main app."""
