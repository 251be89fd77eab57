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
import importlib.util
import re
import sys
import threading
import warnings
from pathlib import Path
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


# --- a third-party package whose __init__ imports what a local caller never uses ----------------------------------
#: Packages whose ``__init__`` :func:`import_lancedb` defers: the generated OpenAPI client of LanceDB's REST namespace
#: (``lance-namespace``), which ``lancedb.db`` imports at module level. Its ``__init__`` imports all 9 API classes
#: (~0.5 s of pydantic ``validate_call`` wrappers) and ``models/__init__`` all ~150 pydantic models (~0.2 s), though
#: a local folder (the skills store, the rollout store) never talks to a REST namespace.
DEFERRED_INITS = ("lance_namespace_urllib3_client", "lance_namespace_urllib3_client.models")

_DEFER_LOCK = threading.Lock()
_FROM_IMPORT = re.compile(r"^from ([\w.]+) import (\w+)(?: as (\w+))?\s*(?:#.*)?$", re.MULTILINE)


def defer_package_init(name: str) -> bool:
    """Put package ``name`` in ``sys.modules`` without running its ``__init__``. On first read, each name that
    ``__init__`` imports on a line of its own (``from pkg.sub import Name``) is imported from its submodule, and a
    submodule's name imports that submodule (as ``from pkg import sub`` does on an eager package); any other read
    (``__all__``, a name defined in ``__init__`` itself, ``import *``) runs the whole ``__init__`` once, into the
    same module object, and is answered from it. So every read gives what the eager package gives; only what is
    never read is never imported.

    Returns True when deferred; False, changing nothing, when the package is already imported, is not installed,
    is not a package of source files, or its ``__init__`` cannot be read. Not thread-safe against a concurrent
    first import of the same package: call it before any thread imports it.
    """
    if name in sys.modules:
        return False
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None or spec.loader is None or not spec.submodule_search_locations:
        return False
    try:
        source = Path(spec.origin).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    names = {alias or attr: (module, attr) for module, attr, alias in _FROM_IMPORT.findall(source)}
    module = importlib.util.module_from_spec(spec)
    loaded = threading.Event()
    lock = threading.RLock()

    def run_init() -> None:
        with lock:
            if not loaded.is_set():
                loaded.set()
                delattr(module, "__getattr__")
                spec.loader.exec_module(module)  # type: ignore[union-attr]

    def __getattr__(attr: str) -> Any:
        if attr in names and not loaded.is_set():
            sub, real = names[attr]
            value = getattr(importlib.import_module(sub), real)
            setattr(module, attr, value)
            return value
        if loaded.is_set():  # __init__ ran and did not define it
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        if not attr.startswith("__") and importlib.util.find_spec(f"{name}.{attr}") is not None:
            return importlib.import_module(f"{name}.{attr}")  # a submodule (``from pkg import sub`` inside pkg)
        run_init()
        return getattr(module, attr)

    setattr(module, "__getattr__", __getattr__)  # noqa: B010 (a module attribute mypy reads as a method)
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], name.rpartition(".")[2], module)
    return True


LANCEDB_FORK_WARNING = "lancedb fork support is experimental"
"""The start of the RuntimeWarning LanceDB's after-fork hook (``lancedb.background_loop``) prints in a forked child.
Our processes fork only to exec (``subprocess`` with a ``preexec_fn``: the sandbox's limits, Ray's workers), and the
hook runs before the child's stderr is redirected, so the warning reached the user's terminal once per such start
(15 times over the three runs of an ``evotrainer compare``) about a deadlock risk of children that never run
LanceDB. :func:`import_lancedb` silences that one message."""


def import_lancedb() -> ModuleType:
    """``lancedb``, imported with the :data:`DEFERRED_INITS` deferred (:func:`defer_package_init`): ~0.6 s less per
    process on this machine (docs/performance.md §1), what ``evotrainer skills search`` from the shell pays, and
    its after-fork warning filtered (:data:`LANCEDB_FORK_WARNING`).
    Call it instead of ``import lancedb`` where a process may import LanceDB first."""
    with _DEFER_LOCK:  # one deferral per package, whichever thread gets here first
        if "lancedb" not in sys.modules:
            for name in DEFERRED_INITS:
                defer_package_init(name)
            warnings.filterwarnings("ignore", message=LANCEDB_FORK_WARNING, category=RuntimeWarning)
    return importlib.import_module("lancedb")
