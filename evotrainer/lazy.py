"""One lazy-module accessor: a module imported on its first attribute access, not when its importer loads.

Why: ``evotrainer serve`` imports every toolset, and through them the GRPO maths (torch) and the training
backends (torch + transformers); a server that answers ``list_versions`` never needs them, yet paid ~2.5 s
of imports at start-up (docs/performance.md). The rule that keeps imports visible (tests/test_architecture.py:
no function-level import of our own or standard-library modules outside the CLI edge) stays intact:
``lazy_module("x")`` at module level *is* an import of ``x`` for that test (it counts the call as a module-level
import statement, so layers and cycles are checked through it), only its execution is deferred.

Use it at module level, with the real import under ``if TYPE_CHECKING:`` for the type checker::

    if TYPE_CHECKING:
        import torch
    else:
        torch = lazy_module("torch")

The first attribute read (``torch.tensor``) imports the module (``importlib.import_module``: the ordinary
import system, so ``sys.modules`` holds the real module and every later ``import torch`` is the same object)
and every later read is forwarded to it (never cached on the proxy, so a value patched on the real module,
e.g. by a test's ``monkeypatch``, is what the proxy gives; the forward costs ~0.3 µs). Import errors surface
at that first use, with the module's own message.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any

_LOCK = threading.Lock()


class LazyModule:
    """Stands for module ``name`` until an attribute is read; then every attribute is the real module's.

    ``repr`` says whether it has loaded. Writing attributes through the proxy is refused (``TypeError``):
    set them on the real module (``lazy.load()``) so no two copies of a value exist.
    """

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def load(self) -> ModuleType:
        """The real module (imported now if it was not yet)."""
        mod = object.__getattribute__(self, "_module")
        if mod is None:
            with _LOCK:
                mod = object.__getattribute__(self, "_module")
                if mod is None:
                    mod = importlib.import_module(object.__getattribute__(self, "_name"))
                    object.__setattr__(self, "_module", mod)
        return mod

    def __getattr__(self, attr: str) -> Any:  # called for every name but the slots and methods above
        return getattr(self.load(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise TypeError(f"cannot set {attr!r} on the lazy module {self._name!r}; set it on lazy.load()")

    def __dir__(self) -> list[str]:
        return dir(self.load())

    def __repr__(self) -> str:
        state = "loaded" if object.__getattribute__(self, "_module") is not None else "not loaded"
        return f"<lazy module {object.__getattribute__(self, '_name')!r} ({state})>"


def lazy_module(name: str) -> Any:
    """A :class:`LazyModule` for the absolute module name ``name`` (e.g. ``"torch"``); typed ``Any`` so
    attribute reads type-check (declare the real import under ``TYPE_CHECKING`` for precise types)."""
    if not name or name.startswith("."):
        raise ValueError(f"lazy_module({name!r}): give an absolute module name, e.g. 'torch'")
    return LazyModule(name)
