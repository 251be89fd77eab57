"""Run one autonomous run: pick the brain, build the mode's loop on an in-process MCP session, run it.

:func:`run_loop` is what ``evotrainer run`` (``agents/cli.py``), ``evotrainer compare`` (:mod:`.compare`),
the scripts and the tests call; :func:`pick_brain` resolves ``--brain``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock, Timeout

from evotrainer.agents.brain import Brain
from evotrainer.agents.claude import ClaudeBrain
from evotrainer.agents.heuristic import HeuristicBrain
from evotrainer.agents.loop import LoopBase, open_toolbox
from evotrainer.agents.modes import MODES
from evotrainer.agents.orchestrator import Orchestrator
from evotrainer.agents.search import GreedySearch, PBTRun, RecipeSearch, StaticRun
from evotrainer.config import REPORT_TO_KEY, RunConfig
from evotrainer.workspace import Workspace, replace_file

__all__ = ["MODES", "BASELINES", "pick_brain", "run_loop"]

BASELINES: dict[str, type[LoopBase]] = {"static": StaticRun, "recipe-search": RecipeSearch, "greedy": GreedySearch,
                                        "pbt": PBTRun}
"""The baseline modes' loops (every mode of :data:`~evotrainer.agents.modes.MODES` but ``evotrainer``)."""


def pick_brain(choice: str, config: RunConfig) -> Brain:
    """The brain for ``--brain``: ``auto`` is Claude when ANTHROPIC_API_KEY is set, else heuristic.

    Raises:
        ValueError: ``claude`` was asked for but ANTHROPIC_API_KEY is not set.
    """
    if choice == "auto":
        choice = "claude" if os.environ.get("ANTHROPIC_API_KEY") else "heuristic"
    if choice == "claude":
        if not os.environ.get("ANTHROPIC_API_KEY"):
            raise ValueError("--brain claude needs ANTHROPIC_API_KEY in the environment (or use --brain heuristic)")
        return ClaudeBrain(model=config.claude_model)
    return HeuristicBrain()


def run_loop(config: RunConfig, run_dir: Path, brain_choice: str, mode: str, resume: bool,
             on_event: Callable[[str, dict[str, Any]], None] | None = None,
             backend: str | None = None) -> dict[str, Any]:
    """Run (or resume) one autonomous run; returns its summary. Used by the CLI and the tests.

    Raises:
        ValueError: the run folder has a lineage and ``resume`` is False, or another orchestrator runs it.
        LineageError: a value the loop resumes from (kv ``loop/*``) is not of the shape EvoTrainer writes (a run
            folder from elsewhere or a damaged lineage.db); names the file, the key and the fix.
    """
    run_dir = Path(run_dir)
    if (run_dir / "lineage.db").exists() and not resume:
        raise ValueError(f"{run_dir} holds a run already; pass --resume to continue it, or choose another run_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(run_dir / ".orchestrator.lock"))
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        raise ValueError(f"{run_dir}: another `evotrainer run` is driving this run; wait for it") from None
    except OSError as exc:  # review 7: a link planted there (filelock refuses it) ended `run` with a bare OSError
        raise ValueError(f"{run_dir / '.orchestrator.lock'}: cannot take the run's lock ({exc.strerror}; a run folder "
                         "from elsewhere may hold a link there): remove it and rerun") from None
    try:
        ws = Workspace(run_dir)
        stored_mode = ws.lineage.kv_get("loop/mode", expected=str)
        if stored_mode and stored_mode != mode:
            raise ValueError(f"{run_dir} was run in mode {stored_mode}; resume it with --mode {stored_mode}")
        ws.lineage.kv_set("loop/mode", mode)
        ws.lineage.kv_set(REPORT_TO_KEY, list(config.report_to))  # the trainer's trackers (rl_backend.trackers)
        # written beside its name and renamed over it, never through a link there: a run folder from elsewhere given
        # to `run --resume` may hold `run.yaml` as a link to a host file (review 7: write_text overwrote it)
        replace_file(ws.root / "run.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False).encode(),
                     root=ws.root)
        with open_toolbox(run_dir, backend or config.backend) as tb:
            loop: LoopBase
            if mode in BASELINES:
                loop = BASELINES[mode](config, tb, ws, on_event)
            else:
                loop = Orchestrator(config, tb, ws, pick_brain(brain_choice, config), on_event)
            if ws.lineage.kv_get("loop/finished"):
                # a finished run is not run again: replaying its stages spent ~0.1 CPU-s that save_compute added to
                # the run's compute at every `run --resume` (the answer and its test score are sealed records)
                if on_event is not None:
                    on_event("log", {"message": f"{run_dir} has finished; nothing to resume (its report is rewritten)",
                                     "version": None})
                summary = loop.summary()
            else:
                summary = loop.run()
        ws.close()
        return summary
    finally:
        lock.release()
