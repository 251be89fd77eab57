"""The alias table: foreign metric names (verl, TRL, OpenRLHF) → ``evotrainer/metrics.py`` names.

One table for every ingest path. :func:`canonical` maps a name; names it does not know are kept
as they are (unknown keys are evidence too). Where two foreign keys map to the same metric in one
record (old verl logs ``critic/kl`` and newer ``actor/kl_loss``), the earlier entry of
:data:`ALIASES` wins and the other keeps its own name.

Sources of the foreign names:
* verl console / tracking logs (``step:N - key:value - ...``): ``actor/*``, ``critic/*``,
  ``response_length/*``, ``timing_s/*``, ``val/test_score/<data source>`` and, in old versions,
  ``actor/entropy_loss`` (the entropy itself), ``critic/kl`` (KL to the reference in the reward),
  ``actor/lr(1e-4)`` (a value in units of 1e-4; see :func:`split_scaled`);
* TRL ``GRPOTrainer`` logs (``trainer_state.json`` log_history, TensorBoard ``train/*``): ``reward``,
  ``reward_std``, ``frac_reward_zero_std``, ``kl``, ``entropy``, ``rewards/<func>/mean``,
  ``completions/*``, ``clip_ratio/low_mean`` ...;
* OpenRLHF TensorBoard (``TensorboardLogger.log_train`` writes ``train/<key>``; keys from
  ``ppo_actor.py`` / ``ppo_trainer.py``): ``policy_loss``, ``kl``, ``reward``, ``response_length``,
  ``actor_grad_norm``, ``actor_lr``, ``entropy_loss``, ``rollout/truncated_rate``,
  ``dynamic_filtering_pass_rate``; eval ``eval_<dataset>_pass1`` / ``eval_<dataset>_pass<n>``;
  and the ``extra_logs`` of EvoTrainer's own OpenRLHF reward file, ``train/<reward component>`` and
  ``train/correct``. OpenRLHF's ``score`` (the reward function's filter score) is kept as is.
"""

from __future__ import annotations

import re

from evotrainer import metrics as M
from evotrainer.recipe import REWARD_COMPONENTS

ALIASES: dict[str, str] = {
    # --- verl ---------------------------------------------------------------------------------
    "actor/entropy": M.POLICY_ENTROPY,
    "actor/entropy_loss": M.POLICY_ENTROPY,  # old verl logged the entropy under this name
    "actor/pg_loss": M.LOSS_POLICY,
    "actor/kl_loss": M.POLICY_KL,  # KL to the reference (use_kl_loss), before the coefficient
    "critic/kl": M.POLICY_KL,  # KL to the reference applied in the reward
    "actor/grad_norm": M.POLICY_GRAD_NORM,
    "actor/lr": M.POLICY_LR,
    "critic/score/mean": M.REWARD_MEAN,  # the reward function's score (before any KL penalty)
    "critic/score/std": M.REWARD_STD,
    "critic/advantages/mean": M.POLICY_ADVANTAGE_MEAN,
    "response_length/mean": M.COMPLETIONS_MEAN_LENGTH,
    "response_length/max": M.COMPLETIONS_MAX_LENGTH,
    "response_length/clip_ratio": M.COMPLETIONS_CLIPPED_RATIO,
    "timing_s/step": M.PERF_STEP_SECONDS,
    "perf/throughput": M.PERF_TOKENS_PER_SEC,
    # --- TRL (GRPOTrainer) ----------------------------------------------------------------------
    "loss": M.LOSS_TOTAL,
    "grad_norm": M.POLICY_GRAD_NORM,
    "reward": M.REWARD_MEAN,
    "reward_std": M.REWARD_STD,
    "frac_reward_zero_std": M.REWARD_FRAC_ZERO_STD,
    "kl": M.POLICY_KL,
    "entropy": M.POLICY_ENTROPY,
    "learning_rate": M.POLICY_LR,
    "clip_ratio/low_mean": M.POLICY_CLIP_RATIO_LOW,
    "clip_ratio/high_mean": M.POLICY_CLIP_RATIO_HIGH,
    "completions/mean_length": M.COMPLETIONS_MEAN_LENGTH,
    "completions/max_length": M.COMPLETIONS_MAX_LENGTH,
    "completions/clipped_ratio": M.COMPLETIONS_CLIPPED_RATIO,
    # --- OpenRLHF (TensorBoard tags without the train/ prefix) ----------------------------------
    "policy_loss": M.LOSS_POLICY,
    "actor_grad_norm": M.POLICY_GRAD_NORM,
    "actor_lr": M.POLICY_LR,
    "entropy_loss": M.POLICY_ENTROPY,  # OpenRLHF logs the entropy term's value (subtracted x coef)
    "response_length": M.COMPLETIONS_MEAN_LENGTH,
    "rollout/reward_mean": M.REWARD_MEAN,
    "rollout/reward_std": M.REWARD_STD,
    "rollout/response_length_mean": M.COMPLETIONS_MEAN_LENGTH,
    "rollout/truncated_rate": M.COMPLETIONS_CLIPPED_RATIO,
    "truncated": M.COMPLETIONS_CLIPPED_RATIO,
    "dynamic_filtering_pass_rate": M.REWARD_KEPT_GROUP_FRAC,
    "timing/step_total": M.PERF_STEP_SECONDS,
}

# Names built from parts: (regex, replacement builder).
_CORRECTNESS_FUNCS = {"accuracy", "acc", "correct", "correctness", "math", "answer", "exact_match", "em"}


def _component(func: str) -> str:
    """TRL reward function name → our component name (``accuracy_reward`` → ``correctness``)."""
    base = re.sub(r"(^reward_|_reward$|_reward_func$|_func$)", "", func)
    return "correctness" if base in _CORRECTNESS_FUNCS else base


PATTERNS: list[tuple[re.Pattern[str], object]] = [
    (re.compile(r"^rewards/(?P<f>[^/]+)/(?P<s>mean|std)$"), lambda m: M.reward_component(_component(m["f"]), m["s"])),
    (re.compile(r"^(val/)?test_score/.+$"), lambda m: M.EVAL_AVG_AT_K),  # verl held-out score per data source
    (re.compile(r"^val-core/.+/(reward|acc)/mean@\d+$"), lambda m: M.EVAL_AVG_AT_K),  # newer verl
    (re.compile(r"^eval/eval_(?!response|truncated|num).+_pass1$"), lambda m: M.EVAL_PASS_AT_1),  # OpenRLHF
    (re.compile(r"^eval/eval_(?!response|truncated|num).+_pass\d+$"), lambda m: M.EVAL_PASS_AT_K),
]

# EvoTrainer's OpenRLHF reward file logs each component and ``correct`` as extra_logs, which
# OpenRLHF's TensorBoard logger writes as ``train/<name>`` (rl_backend/reward_func_template.py).
_OWN_TB = {f"train/{c}": M.reward_component(c) for c in REWARD_COMPONENTS} | {"train/correct": M.CORRECT_MEAN}

_OURS = set(M.ALL_STEP_METRICS) | {M.EVAL_AVG_AT_K, M.EVAL_PASS_AT_K, M.EVAL_PASS_AT_1}
_SCALED = re.compile(r"^(?P<name>.+)\((?P<scale>[0-9.eE+-]+)\)$")


def split_scaled(key: str) -> tuple[str, float]:
    """``actor/lr(1e-4)`` → (``actor/lr``, 1e-4): old verl printed some values in scaled units."""
    m = _SCALED.match(key)
    if m:
        try:
            return m["name"], float(m["scale"])
        except ValueError:
            pass
    return key, 1.0


def canonical(name: str) -> str:
    """Our metric name for a foreign one, or ``name`` itself when unknown.

    A ``train/`` prefix (TensorBoard tags of TRL and OpenRLHF) is tried without the prefix.
    """
    if name in _OURS or (name.startswith("reward/") and name.count("/") == 2):
        return name
    if name in _OWN_TB:
        return _OWN_TB[name]
    for cand in (name, name[len("train/"):] if name.startswith("train/") else None):
        if cand is None:
            continue
        if cand in ALIASES:
            return ALIASES[cand]
        for pat, build in PATTERNS:
            m = pat.match(cand)
            if m:
                return build(m)  # type: ignore[operator]
    return name


def _priority(name: str) -> int:
    base = name[len("train/"):] if name.startswith("train/") else name
    keys = list(ALIASES)
    return keys.index(base) if base in ALIASES else len(keys)


def map_record(record: dict[str, float]) -> dict[str, float]:
    """Rename one step's ``{foreign name: value}`` to our names; collisions keep the higher-priority key."""
    out: dict[str, float] = {}
    for key in sorted(record, key=_priority):
        raw, scale = split_scaled(key)
        value = record[key]
        value = float(value) * scale
        name = canonical(raw)
        out[name if name not in out else raw] = value
    return out
