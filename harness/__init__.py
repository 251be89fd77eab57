"""The diagnostic harness: metrics, analyzers, ingest, statistics, backtests, gate, sandbox (docs/design.md §1).

Modules, in the order a diagnosis uses them:

* ``ingest`` + ``aliases``: runs of verl / TRL / OpenRLHF (logs, trainer_state.json, TensorBoard,
  JSONL, rollout dumps) → :class:`evidence.Evidence`, names mapped to ``evotrainer/metrics.py``;
* ``evidence``: metric series, rollouts, eval matrices, recipes and lineage of some versions
  (``Evidence.from_workspace`` for our own runs);
* ``rollout_metrics``: per-step metrics computed from rollouts (also callable by the trainer);
* ``trends``: robust series statistics (windows, Mann-Kendall, Theil-Sen, change point, spikes);
* ``findings`` + ``analyzers`` (registry) + ``builtin_analyzers`` / ``behaviour_analyzers`` /
  ``swe_analyzers`` (the built-ins);
* ``stats``: Avg@k, pass@k, paired bootstrap CI and permutation test;
* ``backtest``: re-score rollouts, replay group filters, judge analyzers;
* ``gate``: the promotion gate; ``plots`` and ``cli`` (``evotrainer diagnose``).
"""
