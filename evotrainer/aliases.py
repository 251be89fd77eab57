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
  ``actor_grad_norm``, ``actor_lr``, ``entropy_loss``, ``ppo_clip_ratio``, ``rollout/truncated_rate``,
  ``dynamic_filtering_pass_rate``; eval ``eval_<dataset>_pass1`` / ``eval_<dataset>_pass<n>``;
  and the ``extra_logs`` of EvoTrainer's own OpenRLHF reward file, ``train/<reward component>`` and
  ``train/correct``. OpenRLHF's ``score`` (the reward function's filter score) is kept as is;
* newer verl (``verl/trainer/ppo/metric_utils.py``, ``ray_trainer.py``): ``actor/entropy`` (computed
  with the old log-probs) beside ``actor/entropy_loss`` (the entropy term of the loss): where both
  exist ``actor/entropy`` wins; ``critic/score/{mean,max,min}`` (the reward function's score) and
  ``critic/rewards/*`` (score plus any in-reward KL; used only when the score is absent);
  ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``val-core/<source>/<var>/mean@<n>``. verl-based trainers
  (rllm / DeepScaleR ``agent_ppo_trainer.py``) log ``batch/solve_none`` / ``batch/solve_all`` /
  ``batch/solve_partial``: the *counts* of prompts (unique ``uid``) whose samples all scored <= 0 /
  all >= 1 / neither; prime-rl logs the same names as *fractions* beside ``batch/effective_batch_size``
  (1 - none - all). :func:`map_record` turns them into :data:`~evotrainer.metrics.REWARD_FRAC_SOLVE_NONE`
  / ``_ALL`` when the denominator is in the record, and keeps the raw keys either way;
* ms-swift GRPO (``logging.jsonl``): TRL's names plus ``rewards/<ORM class>/mean`` (``AccuracyORM``),
  ``entropy/mean``;
* slime (``train/*`` of ``megatron_utils/model.py``, ``rollout/*`` and ``eval/<dataset>`` of
  ``observability/``): ``train/pg_loss``, ``train/entropy_loss`` (the entropy itself),
  ``train/pg_clipfrac``, ``train/ppo_kl``, ``train/kl_loss``, ``train/lr-pg_0``,
  ``rollout/raw_reward``, ``rollout/response_len/*``, ``rollout/truncated_ratio``;
* AReaL (``areal/trainer/ppo/actor.py`` stats under the actor's scope, ``ppo_actor/`` or ``grpo_actor/``):
  ``task_reward/{avg,min,max}``, ``no_eos_ratios/avg`` (sequences that hit the length cap),
  ``update/{entropy,actor_loss,clip_ratio,approx_kl}/avg``, ``update/grad_norm``.
"""

from __future__ import annotations

import re
from functools import lru_cache

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
    "critic/score/max": M.REWARD_MAX,
    "critic/score/min": M.REWARD_MIN,
    "critic/rewards/mean": M.REWARD_MEAN,  # score + in-reward KL; only where critic/score/* is absent
    "critic/rewards/max": M.REWARD_MAX,
    "critic/rewards/min": M.REWARD_MIN,
    "actor/pg_clipfrac": M.POLICY_CLIP_FRAC,
    "actor/ppo_kl": M.POLICY_PPO_KL,
    "critic/advantages/mean": M.POLICY_ADVANTAGE_MEAN,
    "critic/advantages/max": M.POLICY_ADVANTAGE_MAX,
    "critic/advantages/min": M.POLICY_ADVANTAGE_MIN,
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
    "clip_ratio/region_mean": M.POLICY_CLIP_FRAC,
    "completion_length": M.COMPLETIONS_MEAN_LENGTH,  # TRL < 0.16
    "entropy/mean": M.POLICY_ENTROPY,  # ms-swift log_entropy
    # --- scripts' own prints (a `key=value` / `Label: value` console: Marin's `mean_reward=0.00`, NeMo-RL's `Avg
    # Reward`) -----------------------------------------------------------------------------------------------
    "mean_reward": M.REWARD_MEAN,
    "avg_reward": M.REWARD_MEAN,
    "lr": M.POLICY_LR,  # LLaMA-Factory's trainer_log.jsonl, prime-rl's 'LR:'
    # --- slime (train/ prefix stripped; rollout/*) --------------------------------------------------
    "pg_loss": M.LOSS_POLICY,
    "pg_clipfrac": M.POLICY_CLIP_FRAC,
    "ppo_kl": M.POLICY_PPO_KL,
    "kl_loss": M.POLICY_KL,
    "lr-pg_0": M.POLICY_LR,
    "rollout/raw_reward": M.REWARD_MEAN,
    "rollout/response_len/mean": M.COMPLETIONS_MEAN_LENGTH,
    "rollout/response_lengths": M.COMPLETIONS_MEAN_LENGTH,
    "rollout/response_len/max": M.COMPLETIONS_MAX_LENGTH,
    "rollout/truncated_ratio": M.COMPLETIONS_CLIPPED_RATIO,
    "rollout/truncated": M.COMPLETIONS_CLIPPED_RATIO,
    # --- OpenRLHF (TensorBoard tags without the train/ prefix) ----------------------------------
    "policy_loss": M.LOSS_POLICY,
    "actor_grad_norm": M.POLICY_GRAD_NORM,
    "ppo_clip_ratio": M.POLICY_CLIP_FRAC,  # experience.info["ppo_clip_ratio"]: the PolicyLoss's clipped-token fraction
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
    # --- TRL PPOTrainer (trl/trainer/ppo_trainer.py; per-token means only: its objective/kl and objective/entropy are
    # sums over a response's tokens and keep their own names) ----------------------------------------------------
    "objective/scores": M.REWARD_MEAN,  # the reward model's score (objective/rlhf_reward subtracts the KL penalty)
    "policy/entropy_avg": M.POLICY_ENTROPY,
    "policy/approxkl_avg": M.POLICY_PPO_KL,
    "policy/clipfrac_avg": M.POLICY_CLIP_FRAC,
    "loss/policy_avg": M.LOSS_POLICY,
    # --- AReaL (stats under the actor's scope) --------------------------------------------------
    **{f"{scope}/{k}": name for scope in ("ppo_actor", "grpo_actor") for k, name in {
        "task_reward/avg": M.REWARD_MEAN, "task_reward/min": M.REWARD_MIN, "task_reward/max": M.REWARD_MAX,
        "no_eos_ratios/avg": M.COMPLETIONS_CLIPPED_RATIO, "update/entropy/avg": M.POLICY_ENTROPY,
        "update/actor_loss/avg": M.LOSS_POLICY, "update/clip_ratio/avg": M.POLICY_CLIP_FRAC,
        "update/approx_kl/avg": M.POLICY_PPO_KL, "update/grad_norm": M.POLICY_GRAD_NORM,
        "update/lr": M.POLICY_LR, "advantages/avg": M.POLICY_ADVANTAGE_MEAN}.items()},
    # --- short names seen in pasted tables (trl#5697's "Step loss grad_norm reward_mean clipped_ratio") ----
    "reward_mean": M.REWARD_MEAN,
    "clipped_ratio": M.COMPLETIONS_CLIPPED_RATIO,
    "mean_length": M.COMPLETIONS_MEAN_LENGTH,
    # --- fallbacks: second sources of a metric, used when the first is absent ---------------------
    "rollout/entropy": M.POLICY_ENTROPY,  # slime, from the rollout log-probs
    "rollout/reward": M.REWARD_MEAN,  # AReaL's rollout-side mean
}

# Names built from parts: (regex, replacement builder).
_CORRECTNESS_FUNCS = {"accuracy", "acc", "correct", "correctness", "math", "answer", "exact_match", "em"}


def _component(func: str) -> str:
    """TRL / ms-swift reward function name → our component name.

    ``accuracy_reward`` and ms-swift's ``AccuracyORM`` → ``correctness``; CamelCase becomes snake_case
    (``ToolAccuracy`` → ``tool_accuracy``, also a correctness term: names ending in ``accuracy`` are).
    """
    base = re.sub(r"ORM$|PRM$", "", func)
    base = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower() if base != base.lower() else base
    base = re.sub(r"(^reward_|_reward$|_reward_func$|_func$)", "", base)
    return "correctness" if base in _CORRECTNESS_FUNCS or base.endswith("accuracy") else base


def _eval_reward(m: re.Match[str]) -> str:
    """``eval_rewards/<correctness func>/mean`` is the held-out score; other eval reward terms keep their name."""
    return M.EVAL_AVG_AT_K if _component(m["f"]) == "correctness" else m.string


_TRL_EVAL = "loss|runtime|samples_per_second|steps_per_second|reward|rewards|completions|kl|entropy|clip_ratio|frac"

PATTERNS: list[tuple[re.Pattern[str], object]] = [
    (re.compile(r"^rewards/(?P<f>[^/]+)/(?P<s>mean|std)$"), lambda m: M.reward_component(_component(m["f"]), m["s"])),
    (re.compile(r"^rewards/(?P<f>[^/]+)$"), lambda m: M.reward_component(_component(m["f"]))),  # TRL < 0.16
    (re.compile(r"^eval_rewards/(?P<f>[^/]+)/mean$"), _eval_reward),  # HF Trainer eval of TRL / ms-swift
    (re.compile(r"^eval_reward$"), lambda m: M.EVAL_AVG_AT_K),  # after the correctness term: it wins
    (re.compile(r"^(val/)?test_score/.+$"), lambda m: M.EVAL_AVG_AT_K),  # verl held-out score per data source
    (re.compile(r"^val-core/.+/(reward|acc)/mean@\d+$"), lambda m: M.EVAL_AVG_AT_K),  # newer verl
    (re.compile(r"^eval/eval_(?!response|truncated|num).+_pass1$"), lambda m: M.EVAL_PASS_AT_1),  # OpenRLHF
    (re.compile(r"^eval/eval_(?!response|truncated|num).+_pass\d+$"), lambda m: M.EVAL_PASS_AT_K),
    # slime eval/<dataset> (the mean reward on it); not TRL's eval/* TensorBoard tags, nor eval/<dataset>-truncated_ratio
    (re.compile(rf"^eval/(?!(?:{_TRL_EVAL}|step|epoch|grad_norm|num_tokens)$)[^/-]+$"), lambda m: M.EVAL_AVG_AT_K),
]

# EvoTrainer's OpenRLHF reward file logs each component and ``correct`` as extra_logs, which
# OpenRLHF's TensorBoard logger writes as ``train/<name>`` (rl_backend/openrlhf/reward_func.py).
_OWN_TB = {f"train/{c}": M.reward_component(c) for c in REWARD_COMPONENTS} | {"train/correct": M.CORRECT_MEAN}

_OURS = set(M.ALL_STEP_METRICS) | {M.EVAL_AVG_AT_K, M.EVAL_PASS_AT_K, M.EVAL_PASS_AT_1, M.POLICY_CLIP_FRAC,
                                    M.POLICY_PPO_KL}
_SCALED = re.compile(r"^(?P<name>.+)\((?P<scale>[0-9.eE+-]+)\)$")


@lru_cache(maxsize=65536)
def split_scaled(key: str) -> tuple[str, float]:
    """``actor/lr(1e-4)`` → (``actor/lr``, 1e-4): old verl printed some values in scaled units."""
    m = _SCALED.match(key)
    if m:
        try:
            return m["name"], float(m["scale"])
        except ValueError:
            pass
    return key, 1.0


@lru_cache(maxsize=65536)
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


_INDEX = {k: i for i, k in enumerate(ALIASES)}


@lru_cache(maxsize=65536)
def _priority(name: str) -> int:
    """Collision order: our own names, then ALIASES order, then PATTERNS order, then unknown names."""
    if name in _OURS:
        return -1
    base = name[len("train/"):] if name.startswith("train/") else name
    if base in _INDEX:
        return _INDEX[base]
    for i, (pat, _) in enumerate(PATTERNS):
        if pat.match(base):
            return len(_INDEX) + i
    return len(_INDEX) + len(PATTERNS)


def solve_fractions(record: dict[str, float]) -> dict[str, float]:
    """``reward/frac_solve_none`` / ``_all`` from ``batch/solve_*`` when the record gives the denominator.

    Counts (rllm / DeepScaleR, verl-based): the denominator is none + all + ``batch/solve_partial``
    (the prompts of the batch). Fractions (prime-rl): taken as they are when
    none + all + ``batch/effective_batch_size`` = 1. Otherwise ``{}`` (the raw counts stay under their names).
    """
    none, all_ = record.get("batch/solve_none"), record.get("batch/solve_all")
    if none is None or all_ is None:
        return {}
    if (part := record.get("batch/solve_partial")) is not None:
        den = none + all_ + part
    elif (eff := record.get("batch/effective_batch_size")) is not None and abs(none + all_ + eff - 1.0) < 1e-6:
        den = 1.0
    else:
        return {}
    if not den > 0:
        return {}
    return {M.REWARD_FRAC_SOLVE_NONE: none / den, M.REWARD_FRAC_SOLVE_ALL: all_ / den}


def map_record(record: dict[str, float]) -> dict[str, float]:
    """Rename one step's ``{foreign name: value}`` to our names; collisions keep the higher-priority key.

    A foreign key whose name is taken keeps its own name (``critic/kl`` beside ``actor/kl_loss``). Derived: the solve
    fractions (:func:`solve_fractions`); a clipped ratio of 1 where TRL's PPOTrainer logs ``val/num_eos_tokens`` 0 (no
    response of the batch ended: every one was cut at ``response_length``; a count above 0 gives no ratio, the batch
    size not being logged).
    """
    out: dict[str, float] = {}
    for key in sorted(record, key=_priority):
        raw, scale = split_scaled(key)
        value = float(record[key]) * scale
        name = canonical(raw)
        out[name if name not in out else raw] = value
    for name, value in solve_fractions(record).items():
        out.setdefault(name, value)
    if record.get("val/num_eos_tokens") == 0:  # TRL PPOTrainer: no response of the batch ended with EOS: all cut
        out.setdefault(M.COMPLETIONS_CLIPPED_RATIO, 1.0)
    return out
