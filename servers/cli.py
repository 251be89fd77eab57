"""CLI commands of evotrainer.servers, added to the main app by :func:`register`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this subpackage's commands to the main evotrainer app."""
