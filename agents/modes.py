"""The run modes and brain choices of ``evotrainer run`` (a leaf module: the CLI reads it for ``--help``).

The modes are the EvoTrainer loop (:mod:`.orchestrator`) and the baselines at equal compute (:mod:`.search`);
:func:`evotrainer.agents.runner.run_loop` runs one. They are the values of ``RunConfig.mode`` and
``RunConfig.brain`` (``evotrainer/config.py``; a test checks the two agree).
"""

from __future__ import annotations

MODES: tuple[str, ...] = ("evotrainer", "static", "recipe-search", "greedy", "pbt")
"""Run modes: the EvoTrainer loop and the baselines at equal compute (agents/search.py)."""

BRAINS: tuple[str, ...] = ("auto", "heuristic", "claude")
"""Brain choices: ``auto`` is Claude when ANTHROPIC_API_KEY is set, else the offline heuristic brain."""
