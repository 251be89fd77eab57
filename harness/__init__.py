"""The diagnostic harness: metrics, analyzers, ingest, statistics, backtests, gate (docs/design.md §1-2).

Modules, in the order a diagnosis uses them:

* ``ingest`` + ``aliases``: runs of verl / TRL / OpenRLHF (logs, trainer_state.json, TensorBoard,
  JSONL, rollout dumps) → :class:`evidence.Evidence`, names mapped to ``evotrainer/metrics.py``;
  ``importer``: such a run written as an EvoTrainer run folder (``evotrainer import``);
* ``evidence``: metric series, rollouts, eval matrices, recipes and lineage of some versions
  (``Evidence.from_workspace`` for our own runs);
* ``rollout_metrics``: per-step metrics computed from rollouts (also callable by the trainer);
* ``trends``: robust series statistics (windows, Mann-Kendall, Theil-Sen, change point, spikes);
* ``findings`` + the ``analyzers`` subpackage (its ``__init__`` states the public API: registry,
  shared rule helpers, the built-in rule modules);
* ``stats``: Avg@k, pass@k, paired bootstrap CI and permutation test;
* ``backtest``: re-score rollouts, replay group filters, judge analyzers;
* ``gate``: the promotion gate; ``synthesis``: typed analyzer programs; ``watch``: follow a growing run;
  ``plots`` and ``cli`` (``evotrainer diagnose``, ``analyzers list``, ``watch``).

Dependencies: core (``evotrainer/*.py``), ``skills_db`` and, of ``rl_backend``, only its pure maths
(``grpo``, ``rewards``, ``tasks``) plus the eval names of ``rl_backend.base``; never ``servers`` or ``agents``.
"""
