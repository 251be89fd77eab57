"""MCP servers: training control, rollouts, logs, analyzers, skills (docs/design.md §3).

``build_server(name, run_dir)`` (from :mod:`evotrainer.servers.app`) is imported lazily so that
``evotrainer --help`` does not load the MCP SDK.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_server", "SERVER_NAMES"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from evotrainer.servers import app

        return getattr(app, name)
    raise AttributeError(f"module 'evotrainer.servers' has no attribute {name!r}")
