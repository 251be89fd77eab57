"""The backend registry: a training backend by name (``local`` | ``openrlhf``).

The one place that imports the implementations, so :mod:`evotrainer.rl_backend.base` (the protocol)
imports none of them and no backend imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evotrainer.rl_backend.base import Backend, BackendError
from evotrainer.rl_backend.local import LocalBackend
from evotrainer.rl_backend.openrlhf.backend import OpenRLHFBackend

FACTORIES: dict[str, Callable[..., Backend]] = {"local": LocalBackend, "openrlhf": OpenRLHFBackend}
"""Backend name → the class (called with the backend's keyword arguments)."""
BACKENDS = tuple(FACTORIES)


def get_backend(name: str = "local", **kwargs: Any) -> Backend:
    """A backend by name, built with ``kwargs`` (e.g. ``device``, ``num_threads``; ``cluster``, ``poll_s``).

    Raises:
        BackendError: unknown name.
    """
    if name not in FACTORIES:
        raise BackendError(f"backend={name!r}: allowed: {', '.join(BACKENDS)}")
    return FACTORIES[name](**kwargs)
