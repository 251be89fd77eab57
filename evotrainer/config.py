"""Run configuration: what `evotrainer run CONFIG` reads (a YAML file with a `recipe:` section).

The recipe is the base version's training configuration; the rest sets the autonomous loop's
budget and mode. Validation errors name the field path (``config.budget.max_versions=...``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evotrainer.recipe import SEED_LIMIT, Recipe, RecipeError, _format_error, read_yaml

Tracker = Literal["tensorboard", "wandb", "mlflow"]
TRACKERS: tuple[str, ...] = ("tensorboard", "wandb", "mlflow")
"""What ``report_to`` may name (TRL's ``report_to`` of the same name; tensorboard ships with evotrainer)."""
TRACKER_PACKAGES: dict[str, tuple[str, str]] = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow-skinny")}
"""Tracker -> (module it imports, the PyPI package that provides it)."""
REPORT_TO_KEY = "run/report_to"
"""Lineage kv key where ``evotrainer run`` stores the config's ``report_to`` for the trainer of the run folder
(absent: tensorboard only)."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install, or one hidden from this interpreter: missing as well
        return False


def missing_tracker(*names: str) -> str | None:
    """None when every tracker of ``names`` can be imported here, else the one-line error that names ``report_to``
    and the ``pip install`` fix (``importlib.util.find_spec``: nothing is imported)."""
    missing = [n for n in names if n in TRACKER_PACKAGES and not _installed(TRACKER_PACKAGES[n][0])]
    if not missing:
        return None
    listed = ", ".join(repr(n) for n in missing)
    pkgs = " ".join(TRACKER_PACKAGES[n][1] for n in missing)
    one = len(missing) == 1
    return (f"report_to lists {listed}, but {'its package is' if one else 'their packages are'} not installed here: "
            f"pip install {pkgs} (or pip install 'evotrainer[tracking]'), or remove {'it' if one else 'them'} "
            "from report_to")


WALL_CLOCK_MINUTES_MAX = 525_600
"""Largest ``budget.wall_clock_minutes``: one year (review 16, G-R16: inf and 1e308 were accepted; a deadline that
far is no deadline, and 1e308 minutes in seconds overflows a float to inf)."""
BRANCH_THREADS_MAX = 1024
"""Largest ``branch_threads``: torch CPU threads of one branch; the largest machines have a few hundred cores (review
16, G-R16: 10**9 was accepted and handed to ``torch.set_num_threads`` / Ray as CPUs)."""


class Budget(BaseModel):
    """Limits of one autonomous run."""

    # allow_inf_nan=False: every float field is finite; an inf or NaN is refused naming the field (review 16, G-R16).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    max_versions: int = Field(6, ge=1, le=10_000, description="Versions trained, the base included (the evotrainer mode's control "
                              "arms, one per parent, are not counted: the token and wall-clock budgets pay for them).")
    steps_per_version: int = Field(8, ge=1, le=1_000_000, description="GRPO steps per version.")
    wall_clock_minutes: float = Field(30.0, gt=0, le=WALL_CLOCK_MINUTES_MAX,
                                      description="Stop starting new work after this many minutes (<= 525,600: a year).")
    branches_per_round: int = Field(2, ge=1, le=64, description="Children trained per round.")
    probe_steps: int = Field(0, ge=0, le=1_000_000, description=(
        "evotrainer mode: when > 0 and more candidates than branches_per_round are proposed, up to twice as many are "
        "probed first: each trained this many steps from the parent and scored on dev with 1 sample per problem; "
        "the best branches_per_round continue to steps_per_version (successive halving, one rung). 0: off."))
    exploit_fraction: float = Field(0.0, ge=0.0, lt=1.0, description=(
        "evotrainer mode with a token budget (max_tokens): the share of it kept for exploiting the run's answer. The "
        "rounds stop starting arms once (1 - exploit_fraction) x max_tokens is spent; then the answer so far is "
        "continued alone (a control arm: its recipe from its checkpoint) in segments of steps_per_version until "
        "max_tokens is spent, the static mode's rule, and evaluated on dev once; it becomes the answer when its dev "
        "Avg@k is at least its parent's. 0: off (the rounds spend the whole budget)."))
    exploit_check_k: int = Field(0, ge=0, le=64, description=(
        "evotrainer mode with exploit_fraction > 0: when > 0, the exploited arm is scored on dev with this many "
        "samples per problem after each segment but the last; a segment that does not raise the best score so far "
        "ends the arm (evaluated and decided), and the exploit goes on from it as a child with actor_learning_rate / "
        "3 (a plateau: a smaller step, as ReduceLROnPlateau). 0: off (the arm is trained to the budget's end and "
        "evaluated once)."))
    max_tokens: int | None = Field(None, ge=1, le=2**53, description=(
        "Compute budget in generated tokens: training rollouts plus dev evaluations; every mode stops starting new "
        "work once it is spent (None: the version / step budget alone)."))


class RunConfig(BaseModel):
    """An autonomous run: where, how (mode, brain), how much (budget), from which recipe."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    run_dir: str = Field("runs/default", description="Run folder (workspace); relative to the current directory.")
    mode: Literal["evotrainer", "static", "recipe-search", "greedy", "pbt"] = Field(
        "evotrainer", description="evotrainer (harness + agents), static (base recipe only), recipe-search (Optuna "
        "TPE), greedy (keep / discard a random single change from the current best), pbt (population based training)."
    )
    brain: Literal["auto", "heuristic", "claude"] = Field(
        "auto", description="auto: Claude when ANTHROPIC_API_KEY is set, the offline heuristic brain otherwise."
    )
    claude_model: str = Field("claude-sonnet-5-5", description="Anthropic model id for the Claude brain.")
    backend: Literal["local", "openrlhf"] = Field("local", description="Training backend.")
    seed: int = Field(0, ge=0, lt=SEED_LIMIT, description="Seed of the loop's own choices.")
    executor: Literal["auto", "inline", "ray"] = Field(
        "inline", description="Where a round's branches train: inline (one after another, this process), ray "
                              "(Ray tasks side by side, evotrainer.executor), or auto (ray where Ray is installed and "
                              "2 branches fit the CPUs and the available memory, else inline; "
                              "evotrainer.executor.choose_executor).")
    ray_address: str | None = Field(None, description="executor=ray: the cluster to use (host:port, ray://..., "
                                                      "auto); empty: a local cluster started for the run.")
    max_parallel: int = Field(2, ge=1, le=1024, description="executor=ray (or auto): branches trained at the same time.")
    branch_threads: int | None = Field(
        1, ge=1, le=BRANCH_THREADS_MAX,
        description="executor=ray: torch CPU threads (and Ray CPUs) per branch (<= 1,024). 1: on a loaded 2-core "
                    "machine two 1-thread branches beat one 2-thread branch (benchmarks/ray_round.py).")
    budget: Budget = Field(default_factory=Budget)
    early_stop: bool = Field(
        False, description="Harness evolution's mid-training early stop (agents.evolution.stop_plan): a branch whose "
                           "evidence at half its steps makes a kept synthesised analyzer with a good record fire "
                           "(harness.synthesis.early_stop) stops there and is pruned unevaluated. Off by default: on "
                           "the measured runs no analyzer had earned a record to stop on (docs/evolution.md).")
    test_k: int | None = Field(None, ge=1, le=1024, description="Samples per test problem for the final answer's test Avg@k "
                               "(default: recipe eval.k).")
    report_to: list[Tracker] = Field(
        ["tensorboard"],
        description="Experiment trackers the local trainer writes to, like TRL's report_to: tensorboard (RUN/tb), wandb "
                    "(offline, RUN/wandb), mlflow (SQLite store RUN/mlflow/mlflow.db); a list, 'all' or 'none'. "
                    "wandb / mlflow need their package (pip install 'evotrainer[tracking]').")
    recipe: Recipe = Field(default_factory=Recipe)

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to_words(cls, v: Any) -> Any:
        """TRL's spellings: a single name, ``all`` (every tracker) or ``none`` (no tracker)."""
        if isinstance(v, str):
            return [] if v == "none" else list(TRACKERS) if v == "all" else [v]
        return v

    @field_validator("report_to")
    @classmethod
    def _report_to_installed(cls, v: list[str]) -> list[str]:
        if err := missing_tracker(*v):
            raise ValueError(err)
        return list(dict.fromkeys(v))


RUN_CONFIG_KEYS = frozenset(RunConfig.model_fields) - {"seed"}  # "seed" is a recipe field too


def is_run_config(data: object) -> bool:
    """True when a parsed YAML mapping is a run config (a ``recipe:`` section or another run-config key)."""
    return isinstance(data, dict) and bool(RUN_CONFIG_KEYS & set(data))


def load_run_config(path: str | Path) -> RunConfig:
    """Load a run config from YAML.

    Raises:
        RecipeError: missing file, bad YAML, or a field fails validation (message names the path).
    """
    data = read_yaml(path, "run config file")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise RecipeError(_format_error(err, prefix="config", root=RunConfig)) from None
