"""The diagnostic analyzers: evidence in, findings out (docs/design.md §2, step 6).

Public API (re-exported from ``registry``): :func:`run_analyzers`, :func:`list_analyzers`,
:func:`get_analyzer`, :func:`registry_generation`, :func:`register_analyzer` / :func:`unregister_analyzer` (runtime analyzers:
a callable, or code run in the sandbox), :func:`run_analyzer_code`, :func:`registry_snapshot` /
:func:`restore_registry` / :func:`put_back_analyzer`, :class:`AnalyzerSpec`, :class:`AnalyzerError`, ``AnalyzerFn`` and
:data:`BUILTIN_MODULES`.

Modules, imports pointing one way (``registry`` -> rule modules -> ``rules``):

* ``registry``: the registry and the explicit list of built-in rule modules it registers;
* ``rules``: what the rule modules share (the ``AnalyzerTable`` declaration, shared thresholds,
  series helpers such as ``trend_of``, ``trend_data``, ``drop``, ``entropy_collapsed``);
* rule modules, each with its ``ANALYZERS`` table: ``builtin`` (NaN, truncation, entropy / length
  collapse, length / KL blow-up, gradient spikes), ``behaviour`` (template collapse, reward hacking,
  train / held-out divergence), ``zero_variance`` (zero-variance groups by cause), ``progress``
  (update size, plateau, headroom) and ``swe`` (SWE-episode hacking and tool-use collapse).
"""

from evotrainer.harness.analyzers.registry import (
    BUILTIN_MODULES,
    AnalyzerError,
    AnalyzerFn,
    AnalyzerSpec,
    get_analyzer,
    list_analyzers,
    put_back_analyzer,
    register_analyzer,
    registry_generation,
    registry_snapshot,
    restore_registry,
    run_analyzer_code,
    run_analyzers,
    unregister_analyzer,
)

__all__ = [
    "BUILTIN_MODULES",
    "AnalyzerError",
    "AnalyzerFn",
    "AnalyzerSpec",
    "get_analyzer",
    "list_analyzers",
    "put_back_analyzer",
    "register_analyzer",
    "registry_generation",
    "registry_snapshot",
    "restore_registry",
    "run_analyzer_code",
    "run_analyzers",
    "unregister_analyzer",
]
