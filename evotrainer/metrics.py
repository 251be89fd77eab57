"""Metric names: the API between the trainer, the ingest alias table, the analyzers and the MCP tools.

Every metric the project logs or reads is named here, once. Names are slash namespaces as in
STYLE.md. Renaming one is a breaking change. Per-component reward metrics are built with
:func:`reward_component` (``reward/<component>/mean``).
"""

from __future__ import annotations

# --- reward (per step, over all rollouts of the step) -------------------------------------------
REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
REWARD_FRAC_ZERO_STD = "reward/frac_zero_std"  # fraction of groups whose rewards are all equal
REWARD_KEPT_GROUP_FRAC = "reward/kept_group_frac"  # fraction of groups kept by the group filter
CORRECT_MEAN = "reward/correct/mean"  # fraction of rollouts whose answer verifies (0..1)
REWARD_MIN = "reward/min"  # lowest reward of the step's rollouts (verl critic/score/min)
REWARD_MAX = "reward/max"  # highest reward of the step's rollouts (verl critic/score/max)
REWARD_FRAC_SOLVE_NONE = "reward/frac_solve_none"  # fraction of groups with no correct rollout (0..1)
REWARD_FRAC_SOLVE_ALL = "reward/frac_solve_all"  # fraction of groups whose rollouts are all correct (0..1)

# --- losses and policy statistics -----------------------------------------------------------------
LOSS_POLICY = "loss/policy"
LOSS_KL = "loss/kl"
LOSS_TOTAL = "loss/total"
POLICY_KL = "policy/kl"  # nats per token, k3 estimator unless the recipe says otherwise
POLICY_ENTROPY = "policy/entropy"  # nats per token, mean over completion tokens
POLICY_CLIP_RATIO_LOW = "policy/clip_ratio/low"  # fraction of tokens clipped at 1 - eps_low
POLICY_CLIP_RATIO_HIGH = "policy/clip_ratio/high"  # fraction of tokens clipped at 1 + eps_high
POLICY_GRAD_NORM = "policy/grad_norm"  # L2 norm before clipping
POLICY_LR = "policy/lr"
POLICY_ADVANTAGE_MEAN = "policy/advantage/mean"
POLICY_ADVANTAGE_STD = "policy/advantage/std"
# Read from foreign logs (evotrainer.aliases): verl actor/pg_clipfrac, TRL clip_ratio/region_mean, slime
# train/pg_clipfrac, AReaL update/clip_ratio; verl actor/ppo_kl, slime train/ppo_kl, AReaL update/approx_kl.
# Not in ALL_STEP_METRICS: the local trainer does not log them.
POLICY_CLIP_FRAC = "policy/clip_frac"  # fraction of tokens where the PPO clip is active (either side)
POLICY_PPO_KL = "policy/ppo_kl"  # KL(old policy || new policy) within the update (not the reference KL)
# Read from foreign logs (verl critic/advantages/min, /max; harness.analyzers.zero_variance): min == max == 0 is a
# batch with no policy-gradient signal; a spread under a constant reward is a critic / global baseline
# (PPO with GAE), where equal rewards still give advantages. Not in ALL_STEP_METRICS.
POLICY_ADVANTAGE_MIN = "policy/advantage/min"
POLICY_ADVANTAGE_MAX = "policy/advantage/max"

# --- completions ----------------------------------------------------------------------------------
COMPLETIONS_MEAN_LENGTH = "completions/mean_length"  # tokens
COMPLETIONS_P95_LENGTH = "completions/p95_length"  # tokens
COMPLETIONS_MAX_LENGTH = "completions/max_length"  # tokens
COMPLETIONS_CLIPPED_RATIO = "completions/clipped_ratio"  # fraction with finish_reason == "length"
COMPLETIONS_DISTINCT_2 = "completions/distinct_2"  # distinct bigrams / all bigrams
COMPLETIONS_REPETITION = "completions/repetition_rate"  # fraction of repeated 4-grams
COMPLETIONS_DUPLICATE_FRAC = "completions/duplicate_frac"  # identical completions across prompts

# --- tool use (agentic episodes) ------------------------------------------------------------------
TOOLS_TURNS_MEAN = "tools/turns_mean"
TOOLS_CALLS_MEAN = "tools/calls_mean"
TOOLS_INVALID_FRAC = "tools/invalid_call_frac"
TOOLS_TEST_EDIT_FRAC = "tools/test_file_edit_frac"
TOOLS_SUBMIT_WITHOUT_TEST_FRAC = "tools/submit_without_test_frac"
TOOLS_BUDGET_EXCEEDED_FRAC = "tools/budget_exceeded_frac"
TOOLS_TEST_RUNS_MEAN = "tools/test_runs_mean"  # run_tests calls per episode
TOOLS_EDITS_MEAN = "tools/edits_mean"  # successful edits per episode
TOOLS_FILES_TOUCHED_MEAN = "tools/files_touched_mean"  # distinct files edited per episode
TOOLS_COLLECTION_ERROR_FRAC = "tools/collection_error_frac"  # episodes whose hidden tests failed to collect
TOOLS_SUBMIT_FRAC = "tools/submit_frac"  # episodes ended by submit (not by a limit)
TOOLS_RESOLVED_FRAC = "tools/resolved_frac"  # episodes whose hidden tests all pass


def tool_calls(tool: str) -> str:
    """Metric name of the mean calls per episode of one tool, e.g. ``tools/calls/search_mean``."""
    return f"tools/calls/{tool}_mean"

# --- evaluation (per version, held-out) -----------------------------------------------------------
EVAL_AVG_AT_K = "eval/avg@k"
EVAL_PASS_AT_K = "eval/pass@k"
EVAL_PASS_AT_1 = "eval/pass@1"

# --- performance ----------------------------------------------------------------------------------
PERF_TOKENS_PER_SEC = "perf/tokens_per_sec"
PERF_STEP_SECONDS = "perf/step_seconds"
PERF_STEP_CPU_SECONDS = "perf/step_cpu_seconds"  # user + system CPU-s of the training process during the step
# (``time.process_time``: all its threads, torch's intra-op pool included, and whatever else runs in that process)
PERF_PEAK_MEMORY_MB = "perf/peak_memory_mb"


def reward_component(name: str, stat: str = "mean") -> str:
    """Metric name of one reward component's statistic, e.g. ``reward/format/mean``.

    Args:
        name: the reward component's name as in the recipe (``correctness``, ``format``, ...).
        stat: ``mean`` or ``std``.

    Raises:
        ValueError: if ``stat`` is not ``mean`` or ``std``.
    """
    if stat not in ("mean", "std"):
        raise ValueError(f"stat={stat!r}: must be 'mean' or 'std'")
    return f"reward/{name}/{stat}"


ALL_STEP_METRICS: tuple[str, ...] = (
    REWARD_MEAN, REWARD_STD, REWARD_FRAC_ZERO_STD, REWARD_KEPT_GROUP_FRAC, CORRECT_MEAN,
    REWARD_MIN, REWARD_MAX, REWARD_FRAC_SOLVE_NONE, REWARD_FRAC_SOLVE_ALL,
    LOSS_POLICY, LOSS_KL, LOSS_TOTAL, POLICY_KL, POLICY_ENTROPY, POLICY_CLIP_RATIO_LOW,
    POLICY_CLIP_RATIO_HIGH, POLICY_GRAD_NORM, POLICY_LR, POLICY_ADVANTAGE_MEAN, POLICY_ADVANTAGE_STD,
    COMPLETIONS_MEAN_LENGTH, COMPLETIONS_P95_LENGTH, COMPLETIONS_MAX_LENGTH, COMPLETIONS_CLIPPED_RATIO,
    COMPLETIONS_DISTINCT_2, COMPLETIONS_REPETITION, COMPLETIONS_DUPLICATE_FRAC,
    TOOLS_TURNS_MEAN, TOOLS_CALLS_MEAN, TOOLS_INVALID_FRAC, TOOLS_TEST_EDIT_FRAC,
    TOOLS_SUBMIT_WITHOUT_TEST_FRAC, TOOLS_BUDGET_EXCEEDED_FRAC, TOOLS_TEST_RUNS_MEAN, TOOLS_EDITS_MEAN,
    TOOLS_FILES_TOUCHED_MEAN, TOOLS_COLLECTION_ERROR_FRAC, TOOLS_SUBMIT_FRAC, TOOLS_RESOLVED_FRAC,
    PERF_TOKENS_PER_SEC, PERF_STEP_SECONDS, PERF_STEP_CPU_SECONDS, PERF_PEAK_MEMORY_MB,
)


# --- update size: how far one step's update moves the policy --------------------------------------
# Logged by the local trainer on every step (0.0 on a step with no kept group: nothing was updated); the
# KL / post-update ratio / clip metrics are measured on the first micro-batch of the kept batch.
# Targets they are judged against: PPO's KL target d_targ = 0.01 (Schulman et al. 2017 §4; Spinning Up
# PPO target_kl = 0.01, early stop at 1.5 x target_kl); see harness/analyzers/progress.py.
POLICY_UPDATE_KL = "policy/update_kl"  # nats/token, k3 estimate of KL(pi_old || pi_new) on the step's kept tokens
POLICY_UPDATE_KL_K1 = "policy/update_kl_k1"  # nats/token, k1 estimate mean(log pi_old - log pi_new), same tokens
POLICY_RATIO_MAX = "policy/ratio/max"  # largest pi_theta / pi_old over kept tokens, PPO epochs and the updated policy
POLICY_RATIO_MIN = "policy/ratio/min"  # smallest, same tokens
POLICY_RATIO_MEAN_ABS_DEV = "policy/ratio/mean_abs_dev"  # token mean |pi_new / pi_old - 1| after the update
POLICY_UPDATE_CLIP_FRAC = "policy/update_clip_frac"  # tokens the clip would bind on after the update (next epoch's clip ratio)
POLICY_UPDATE_NORM = "policy/update_norm"  # ||theta_after - theta_before||_2 over trainable parameters
POLICY_UPDATE_REL_NORM = "policy/update_rel_norm"  # ||dtheta|| / ||theta_before|| (relative update size)
POLICY_GRAD_NORM_X_LR = "policy/grad_norm_x_lr"  # grad norm (before clipping) x learning rate (SGD-equivalent step)

UPDATE_STEP_METRICS: tuple[str, ...] = (
    POLICY_UPDATE_KL, POLICY_UPDATE_KL_K1, POLICY_RATIO_MAX, POLICY_RATIO_MIN, POLICY_RATIO_MEAN_ABS_DEV,
    POLICY_UPDATE_CLIP_FRAC, POLICY_UPDATE_NORM, POLICY_UPDATE_REL_NORM, POLICY_GRAD_NORM_X_LR,
)
ALL_STEP_METRICS = ALL_STEP_METRICS + UPDATE_STEP_METRICS
