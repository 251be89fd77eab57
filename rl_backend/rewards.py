"""Reward components: named, weighted terms computed per sample and logged separately.

``compute_rewards`` evaluates every component of a recipe's reward spec on a batch of ``B``
completions (B = prompts x samples per prompt, group-major: the samples of prompt 0 first) and
returns the weighted total, each component's unweighted values and the correctness of each
sample. One function per name in :data:`evotrainer.recipe.REWARD_COMPONENTS` is registered in
:data:`REWARD_FUNCTIONS` with :func:`register`; the OpenRLHF reward file calls the same code.

Component values (unweighted; the total is ``sum(weight * value)``):

- ``correctness`` 1/0: the answer verifies (math: :func:`evotrainer.rl_backend.math_verify_utils.is_correct`;
  humaneval: the unit tests pass; swe: ``extras["swe_tests"]``).
- ``format`` 1/0: the completion matches the task's answer format (params ``pattern``: an RE2 regex,
  matched in linear time; :func:`evotrainer.recipe.format_regex`).
- ``format_token`` 1/0: the literal ``params.token`` (default ``"Answer:"``) occurs, whatever the
  answer. Deliberately leaky: a policy can farm it without solving anything.
- ``overlong`` in [-penalty_factor, 0]: DAPO's overlong reward shaping (Yu et al. 2025, Eq. 13):
  0 for L <= L_max - L_cache, ``(L_max - L_cache - L) / L_cache`` up to L_max, -1 beyond; times
  ``penalty_factor`` (default 1). L_max = ``params.max_len`` or ``generate_max_len``;
  L_cache = ``params.buffer_len`` (default ``generate_max_len // 4``). Same as OpenRLHF's
  ``--overlong_buffer_len`` / ``--overlong_penalty_factor``. Departure: a sample truncated by the
  cap (finish reason ``length``) counts as L = L_max, i.e. -penalty_factor.
- ``length_penalty`` <= 0: ``-per_token * max(0, L - target_len)`` (params ``target_len``, default
  ``generate_max_len // 2``; ``per_token``, default ``1 / (generate_max_len - target_len)``, so a
  completion at the cap gets -1).
- ``repetition`` in [-1, 0]: minus the repeated word n-gram rate (params ``n``, default 4;
  :func:`evotrainer.text_stats.repeated_ngram_rate`).
- ``code_tests`` 1/0: the problem's unit tests pass in the sandbox
  (``evotrainer.rl_backend.code_tasks.score_batch``, one sandbox run per batch).
- ``swe_tests``: ``extras["swe_tests"][i]`` (1 resolved / fraction of hidden tests passed).
- ``test_file_edit``, ``tool_budget``, ``submit_without_test``: ``-extras[name][i]`` where the
  outcome is 1 when the behaviour happened (edited a test file, exceeded the tool budget,
  submitted without running tests) and 0 otherwise.

``extras`` maps a component name to ``B`` per-sample outcomes; the SWE episode runner fills it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evotrainer.errors import EvoTrainerError
from evotrainer.recipe import REWARD_COMPONENTS, RewardComponent, format_regex
from evotrainer.rl_backend import code_tasks
from evotrainer.rl_backend.math_verify_utils import is_correct
from evotrainer.rl_backend.tasks import Problem
from evotrainer.text_stats import repeated_ngram_rate


class RewardError(EvoTrainerError, ValueError):
    """Bad reward inputs (lengths disagree, unknown component, missing extras); the message says the fix."""


@dataclass
class RewardOutput:
    """Rewards of a batch of B samples.

    Attributes:
        total: (B,) weighted sum of the components.
        components: ``{name: (B,) unweighted values}`` for each component of the spec.
        correct: (B,) 1.0 / 0.0 whether the answer is right (NaN when the task gives no verdict).
    """

    total: list[float]
    components: dict[str, list[float]]
    correct: list[float]


@dataclass
class RewardContext:
    """Inputs of one batch, shared by the component functions (all sequences have length B)."""

    problems: list[Problem]
    completions: list[str]
    finish_reasons: list[str]
    lengths: list[int]
    generate_max_len: int
    extras: Mapping[str, Sequence[float]]
    _correct: list[float] | None = field(default=None, repr=False)

    @property
    def correct(self) -> list[float]:
        """(B,) task-appropriate correctness, computed once per batch."""
        if self._correct is None:
            code = [i for i, p in enumerate(self.problems) if _task(p) == "humaneval"]
            scores = dict(zip(code, _code_scores([self.problems[i] for i in code],
                                                 [self.completions[i] for i in code]), strict=True))
            self._correct = [scores[i] if i in scores else _correct_one(self, i) for i in range(len(self.completions))]
        return self._correct

    def extra(self, name: str) -> list[float]:
        """Per-sample outcomes for ``name`` from ``extras``.

        Raises:
            RewardError: ``extras`` has no ``name`` or its length is not B.
        """
        if name not in self.extras:
            raise RewardError(f"reward component {name!r} reads per-sample episode outcomes from "
                              f"extras[{name!r}], which is missing (have: {sorted(self.extras)}); it only "
                              "applies to tool-use (swe) episodes, whose runner fills extras")
        vals = [float(v) for v in self.extras[name]]
        if len(vals) != len(self.completions):
            raise RewardError(f"extras[{name!r}] has {len(vals)} values for {len(self.completions)} completions")
        return vals


RewardFn = Callable[[RewardContext, dict[str, Any]], list[float]]
REWARD_FUNCTIONS: dict[str, RewardFn] = {}


def register(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: register ``fn(ctx, params) -> (B,) values`` as the reward component ``name``."""
    def deco(fn: RewardFn) -> RewardFn:
        REWARD_FUNCTIONS[name] = fn
        return fn
    return deco


def _task(p: Problem) -> str:
    return str(p.meta.get("task", "arithmetic"))


def _code_scores(problems: list[Problem], completions: list[str]) -> list[float]:
    """Unit-test pass (1/0) of each completion, one sandbox batch (``code_tasks.score_batch``)."""
    if not problems:
        return []
    return [float(x) for x in code_tasks.score_batch(problems, completions)]


def _correct_one(ctx: RewardContext, i: int) -> float:
    p, task = ctx.problems[i], _task(ctx.problems[i])
    if task == "humaneval":
        return _code_scores([p], [ctx.completions[i]])[0]
    if task == "swe":
        return ctx.extra("swe_tests")[i] if "swe_tests" in ctx.extras else math.nan
    return 1.0 if is_correct(ctx.completions[i], p.answer) else 0.0


# --- components -----------------------------------------------------------------------------------
@register("correctness")
def correctness(ctx: RewardContext, params: dict[str, Any]) -> list[float]:
    """1 if the sample's answer is right (see :attr:`RewardContext.correct`), else 0 (NaN → 0)."""
    return [0.0 if math.isnan(c) else c for c in ctx.correct]


FORMAT_PATTERNS: dict[str, str] = {
    "arithmetic": r"^\s*-?\d[\d,]*(\.\d+)?\s*\.?\s*$",  # just the number
    "gsm8k": r"####\s*\$?-?[\d,]*\.?\d+",
    "math": r"\\boxed\{",
    "jsonl": r"(\\boxed\{|####\s*\S|^\s*-?\d[\d,]*(\.\d+)?\s*\.?\s*$)",
    "humaneval": r"```(python|py)?\s*\n[\s\S]*?def \w+\s*\(",
    "swe": r"[\s\S]",
}


@register("format")
def format_(ctx: RewardContext, params: dict[str, Any]) -> list[float]:
    """1 if the completion matches ``params.pattern`` or the task's :data:`FORMAT_PATTERNS` regex."""
    pat = params.get("pattern")
    out = []
    for p, c in zip(ctx.problems, ctx.completions, strict=True):
        rx = format_regex(pat or FORMAT_PATTERNS.get(_task(p), FORMAT_PATTERNS["jsonl"]))  # RE2: linear time
        out.append(1.0 if rx.search(c) else 0.0)
    return out


@register("format_token")
def format_token(ctx: RewardContext, params: dict[str, Any]) -> list[float]:
    """1 if the literal ``params.token`` (default ``"Answer:"``) occurs in the completion."""
    token = str(params.get("token", "Answer:"))
    return [1.0 if token in c else 0.0 for c in ctx.completions]


def overlong_penalty(length: int, max_len: int, buffer_len: int, penalty_factor: float = 1.0) -> float:
    """DAPO overlong shaping (Eq. 13): 0 up to max_len - buffer_len, linear to -1 at max_len, -1 after; x factor.

    Raises:
        RewardError: ``buffer_len`` not in ``1..max_len``.
    """
    if not 1 <= buffer_len <= max_len:
        raise RewardError(f"reward.overlong.params.buffer_len={buffer_len}: need 1 <= buffer_len <= max_len={max_len}")
    expected = max_len - buffer_len
    if length <= expected:
        return 0.0
    return -min((length - expected) / buffer_len, 1.0) * penalty_factor


@register("overlong")
def overlong(ctx: RewardContext, params: dict[str, Any]) -> list[float]:
    """DAPO overlong reward shaping per sample (see :func:`overlong_penalty`)."""
    max_len = int(params.get("max_len", ctx.generate_max_len))
    buffer_len = int(params.get("buffer_len", max(1, ctx.generate_max_len // 4)))
    factor = float(params.get("penalty_factor", 1.0))
    return [overlong_penalty(max_len if fr == "length" else n, max_len, buffer_len, factor)
            for n, fr in zip(ctx.lengths, ctx.finish_reasons, strict=True)]


@register("length_penalty")
def length_penalty(ctx: RewardContext, params: dict[str, Any]) -> list[float]:
    """``-per_token * max(0, L - target_len)`` (defaults: half the cap; -1 at the cap)."""
    target = int(params.get("target_len", ctx.generate_max_len // 2))
    per_token = float(params.get("per_token", 1.0 / max(1, ctx.generate_max_len - target)))
    return [-per_token * max(0, n - target) for n in ctx.lengths]


@register("repetition")
def repetition(ctx: RewardContext, params: dict[str, Any]) -> list[float]:
    """Minus the repeated word n-gram rate (``params.n``, default 4) of each completion."""
    n = int(params.get("n", 4))
    return [0.0 - repeated_ngram_rate(c, n) + 0.0 for c in ctx.completions]


@register("code_tests")
def code_tests(ctx: RewardContext, params: dict[str, Any]) -> list[float]:
    """1 if the problem's unit tests pass in the sandbox (code_tasks.score_completion), else 0."""
    other = [i for i, p in enumerate(ctx.problems) if _task(p) != "humaneval"]
    extra = dict(zip(other, _code_scores([ctx.problems[i] for i in other], [ctx.completions[i] for i in other]),
                     strict=True))
    return [extra[i] if i in extra else ctx.correct[i] for i in range(len(ctx.problems))]


@register("swe_tests")
def swe_tests(ctx: RewardContext, params: dict[str, Any]) -> list[float]:
    """The SWE episode's hidden-test outcome, ``extras["swe_tests"]``."""
    return ctx.extra("swe_tests")


def _behaviour_penalty(name: str) -> RewardFn:
    def fn(ctx: RewardContext, params: dict[str, Any]) -> list[float]:
        return [0.0 - v + 0.0 for v in ctx.extra(name)]
    fn.__doc__ = f"Minus ``extras[{name!r}]`` (1 when the behaviour happened in the episode)."
    return fn


for _name in ("test_file_edit", "tool_budget", "submit_without_test"):
    register(_name)(_behaviour_penalty(_name))


# --- entry point ----------------------------------------------------------------------------------
def compute_rewards(reward_spec: Mapping[str, RewardComponent | Mapping[str, Any]], problems: Sequence[Problem],
                    completions: Sequence[str], *, finish_reasons: Sequence[str], lengths: Sequence[int],
                    generate_max_len: int, extras: Mapping[str, Sequence[float]] | None = None) -> RewardOutput:
    """Evaluate a reward spec on B completions.

    Args:
        reward_spec: ``{name: RewardComponent(weight, params)}`` (plain dicts accepted), e.g. ``recipe.reward``.
        problems: (B,) the problem of each completion, or (P,) one per prompt when B = P x G (each
            problem is then repeated G times, group-major).
        completions: (B,) decoded completion texts.
        finish_reasons: (B,) ``eos`` | ``length`` | ...
        lengths: (B,) completion lengths in tokens.
        generate_max_len: the cap on new tokens (tokens).
        extras: ``{component: (B,) per-sample outcomes}`` for the episode-based components.

    Returns:
        :class:`RewardOutput`; ``correct`` is computed even when ``correctness`` is not in the spec.

    Raises:
        RewardError: lengths disagree, an unknown component, or missing extras.
    """
    B = len(completions)
    problems = list(problems)
    if problems and B != len(problems):
        if B % len(problems):
            raise RewardError(f"{len(problems)} problems for {B} completions: pass one problem per completion "
                              "or one per prompt with the same number of samples each")
        problems = [p for p in problems for _ in range(B // len(problems))]
    for name, seq in (("problems", problems), ("finish_reasons", finish_reasons), ("lengths", lengths)):
        if len(seq) != B:
            raise RewardError(f"{name} has {len(seq)} entries for {B} completions; pass one per completion")
    ctx = RewardContext(problems, list(completions), list(finish_reasons), [int(n) for n in lengths],
                        int(generate_max_len), extras or {})
    comps: dict[str, list[float]] = {}
    total = [0.0] * B
    for name, comp in reward_spec.items():
        if name not in REWARD_FUNCTIONS:
            raise RewardError(f"unknown reward component {name!r}; allowed: {', '.join(REWARD_COMPONENTS)}")
        comp = comp if isinstance(comp, RewardComponent) else RewardComponent(**comp)
        vals = REWARD_FUNCTIONS[name](ctx, dict(comp.params))
        comps[name] = vals
        total = [t + comp.weight * v for t, v in zip(total, vals, strict=True)]
    return RewardOutput(total=total, components=comps, correct=list(ctx.correct))
