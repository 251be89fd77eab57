"""The backend registry: a training backend by name (``local`` | ``openrlhf``).

The one place that imports the implementations, so :mod:`evotrainer.rl_backend.base` (the protocol)
imports none of them and no backend imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from evotrainer.lazy import lazy_module
from evotrainer.rl_backend.base import Backend, BackendError

if TYPE_CHECKING:
    from evotrainer.rl_backend import local
    from evotrainer.rl_backend.openrlhf import backend as openrlhf
else:  # loaded by the first get_backend: torch + transformers are ~2 s of `evotrainer serve` start-up otherwise
    local = lazy_module("evotrainer.rl_backend.local")
    openrlhf = lazy_module("evotrainer.rl_backend.openrlhf.backend")

FACTORIES: dict[str, Callable[..., Backend]] = {
    "local": lambda **kw: local.LocalBackend(**kw),
    "openrlhf": lambda **kw: openrlhf.OpenRLHFBackend(**kw),
}
"""Backend name → a factory of the class (called with the backend's keyword arguments)."""
BACKENDS = tuple(FACTORIES)


def get_backend(name: str = "local", **kwargs: Any) -> Backend:
    """A backend by name, built with ``kwargs`` (e.g. ``device``, ``num_threads``; ``cluster``, ``poll_s``).

    Raises:
        BackendError: unknown name.
    """
    if name not in FACTORIES:
        raise BackendError(f"backend={name!r}: allowed: {', '.join(BACKENDS)}")
    return FACTORIES[name](**kwargs)
