"""CLI: `evotrainer swe tasks|check` (the SWE tool-use domain)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the ``swe`` command group to the main app."""
