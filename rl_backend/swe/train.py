"""GRPO on SWE episodes: the glue between the local trainer (``local.py``) and the SWE domain.

``LocalBackend`` calls into this module when ``recipe.data.task == "swe"``; everything else of a
training step (group filters, advantages, PPO update, stores) is the single-turn code path.

One rollout (:func:`rollout`), for P tasks and G = ``n_samples_per_prompt``:

1. the current policy plays G episodes per task (``swe.episode.run_episodes`` with
   ``swe.policies.ChatModelPolicy``: ``generate_max_len`` tokens per reply, ``temperature`` /
   ``top_p`` of the recipe, limits from ``recipe.tool_use``), seeded;
2. the reward spec is evaluated with the episodes' outcomes as ``extras`` (``swe_tests``,
   ``test_file_edit``, ``tool_budget``, ``submit_without_test``; ``correctness`` reads
   ``swe_tests``); the hidden tests grade with ``reward.swe_tests.params.mode`` (``all`` or
   ``fraction``, default ``all``);
3. the episodes become one ``RolloutBatch`` (:func:`episodes_to_rollout_batch`): each
   trajectory laid out with the chat template, ``completion_mask`` = 1 on the policy's sampled
   tokens only, observations attended (``completion_attention_mask``) but not trained on;
4. the batch's ``sampling_logprobs`` (zeros from the episode runner, which keeps no log-probs) are
   filled by one no-grad ``sequence_logprobs`` pass under the same weights (:func:`policy_logprobs`),
   so the KL-in-reward path (``use_kl_loss: false``) and any reader of the batch see real values.
   The PPO ratio's old log-probs are the update's first-epoch forward, as single-turn.

Departures: the policy samples each reply from a context cut to :data:`CONTEXT_TOKENS` (opening
messages plus the latest turns) while the update scores the whole trajectory; with short episodes
the two agree. ``completions/clipped_ratio`` is the fraction of *policy turns* cut at
``generate_max_len`` (an episode itself ends by ``submit`` or a limit, never by ``length``).

Evaluation (:func:`evaluate_episodes`): k episodes per held-out task at ``eval.temperature``,
graded ``all`` (1 resolved / 0), so Avg@k and pass@k are those of ``swe_tests``.

Shapes: P tasks, G samples per task, B = P x G episodes (task-major), T trajectory tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from evotrainer import metrics as M
from evotrainer.rl_backend.rewards import compute_rewards
from evotrainer.rl_backend.sampling import RolloutBatch, sequence_logprobs
from evotrainer.rl_backend.swe.episode import (
    Episode,
    encode_trajectory,
    episode_extras,
    episode_metrics,
    episode_record,
    run_episodes,
)
from evotrainer.rl_backend.swe.policies import ChatModelPolicy
from evotrainer.rl_backend.swe.tasks import (
    TASKSET_DIR,
    SweTask,
    SweTaskError,
    load_swebench_jsonl,
    load_taskset,
)

CONTEXT_TOKENS = 3072
"""Context the policy samples a reply from (at least ``recipe.prompt_max_len``), tokens."""


@lru_cache(maxsize=8)
def _tasks_at(source: str) -> dict[str, SweTask]:
    src = Path(source)
    tasks = load_taskset(src) if src.is_dir() else load_swebench_jsonl(src)
    return {t.instance_id: t for t in tasks}


def tasks_for(problems: Sequence[Any]) -> tuple[list[SweTask], Path | None]:
    """The SWE tasks behind ``tasks.load_swe_problems``'s problems, and their task set folder (None for a JSONL file).

    Raises:
        SweTaskError: a problem is not a SWE problem, the problems come from several task sources,
            or an instance id is missing from its source.
    """
    sources = {p.meta.get("source") for p in problems}
    if any(p.meta.get("task") != "swe" for p in problems) or len(sources) != 1 or None in sources:
        raise SweTaskError("swe training needs problems from one task source (rl_backend.tasks.load_swe_problems)"
                           f"; got sources {sorted(map(str, sources))}")
    (source,) = sources
    by_id = _tasks_at(str(source))
    missing = [p.id for p in problems if p.id not in by_id]
    if missing:
        raise SweTaskError(f"instance ids {missing[:3]} are not in {source}; reload the problems from data.path")
    return [by_id[p.id] for p in problems], Path(source) if Path(source).is_dir() else None


def _reward_mode(recipe: Any) -> str:
    comp = recipe.reward.get("swe_tests")
    return str(comp.params.get("mode", "all")) if comp is not None else "all"


def play(bundle: Any, recipe: Any, problems: Sequence[Any], n: int, *, seed: int, temperature: float,
         top_p: float, reward_mode: str, progress: Callable[[dict[str, Any]], None] | None = None) -> list[Episode]:
    """``n`` episodes of each problem's task with the current policy (eval mode, seeded); B = P x n, task-major."""
    tasks, root = tasks_for(problems)
    tok, model = bundle.tokenizer, bundle.model
    policy = ChatModelPolicy(model, tok, max_new_tokens=recipe.generate_max_len, temperature=temperature, top_p=top_p,
                             max_prompt_tokens=max(recipe.prompt_max_len, CONTEXT_TOKENS))
    was_training = model.training
    model.eval()
    torch.manual_seed(seed)
    try:
        return run_episodes(tasks, policy, limits=recipe.tool_use, samples_per_task=n, reward_mode=reward_mode,
                            taskset_root=root if root is not None else TASKSET_DIR,
                            count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]),
                            progress=progress)
    finally:
        model.train(was_training)


@torch.no_grad()
def policy_logprobs(model: Any, rb: RolloutBatch, temperature: float, group_size: int, micro_batch: int) -> torch.Tensor:
    """(B, T) log-probs of the batch's completion tokens under ``model`` (0 off the mask), nats; no gradient.

    Runs ``sequence_logprobs`` over whole groups, ``micro_batch`` rows at a time (rounded to whole groups).
    """
    G = group_size
    mb = max(G, micro_batch // G * G)
    out = []
    for i in range(0, rb.size, mb):
        s = slice(i, min(rb.size, i + mb))
        lp, _ = sequence_logprobs(model, rb.prompt_ids[s], rb.prompt_mask[s], rb.completion_ids[s],
                                  rb.completion_mask[s], temperature=temperature,
                                  completion_attention_mask=rb.attention_mask[s], group_size=G)
        out.append(lp.float().cpu() * rb.completion_mask[s])
    return torch.cat(out)


def episodes_to_rollout_batch(tokenizer: Any, episodes: Sequence[Episode], pad_id: int | None = None) -> RolloutBatch:
    """Episodes as the local trainer's ``RolloutBatch`` (``rl_backend/sampling.py``) for the GRPO loss.

    Each episode is laid out by :func:`~evotrainer.rl_backend.swe.episode.encode_trajectory`: the opening messages are the prompt
    (left-padded, ``P``), everything after is the completion (right-padded, ``T``) with
    ``completion_mask`` = 1 on the policy's sampled tokens only and ``completion_attention_mask`` = 1
    on all real tokens (observations stay in the context). ``sampling_logprobs`` are zeros: the
    episode runner does not keep them, so the trainer computes the old log-probs with one
    ``sequence_logprobs`` pass before its update (same weights, so the same distribution).

    Raises:
        ValueError: an episode without an assistant turn.
    """
    pad = tokenizer.pad_token_id if pad_id is None else pad_id
    encs = [encode_trajectory(tokenizer, e.messages, e.policy_token_ids()) for e in episodes]
    P = max(x.prompt_len for x in encs)
    T = max(len(x.input_ids) - x.prompt_len for x in encs)
    B = len(encs)
    prompt_ids = torch.full((B, P), pad, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    comp_ids = torch.full((B, T), pad, dtype=torch.long)
    comp_mask = torch.zeros((B, T), dtype=torch.long)
    comp_attn = torch.zeros((B, T), dtype=torch.long)
    for b, x in enumerate(encs):
        p, c = x.input_ids[: x.prompt_len], x.input_ids[x.prompt_len:]
        prompt_ids[b, P - len(p):] = torch.tensor(p)  # (P,) left padding
        prompt_mask[b, P - len(p):] = 1
        comp_ids[b, : len(c)] = torch.tensor(c)  # (T,) right padding
        comp_mask[b, : len(c)] = torch.tensor(x.completion_mask[x.prompt_len:])
        comp_attn[b, : len(c)] = 1
    return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=comp_ids,
                        completion_mask=comp_mask, sampling_logprobs=torch.zeros((B, T)),
                        completions=[e.transcript() for e in episodes],
                        finish_reasons=[e.finish_reason for e in episodes],
                        lengths=[int(comp_mask[b].sum()) for b in range(B)],
                        prompts=[tokenizer.decode(x.input_ids[: x.prompt_len]) for x in encs],
                        turns=[e.turns for e in episodes], completion_attention_mask=comp_attn)


def rollout(bundle: Any, recipe: Any, problems: Sequence[Any], *, seed: int) -> tuple[RolloutBatch, Any, list[Episode]]:
    """One GRPO rollout on SWE tasks: ``(RolloutBatch (B rows), RewardOutput, episodes)``, B = P x G.

    Args:
        bundle: the policy (``models.PolicyBundle``), trained in place by the caller.
        recipe: the version's recipe (``n_samples_per_prompt``, ``generate_max_len``, ``temperature``,
            ``top_p``, ``tool_use``, ``reward``, ``micro_train_batch_size``).
        problems: (P,) SWE problems (``tasks.load_problems`` with ``data.task: swe``).
        seed: seeds the policy's sampling.

    Raises:
        SweTaskError: problems not from one SWE task source. RewardError: a bad reward spec.
    """
    G = recipe.n_samples_per_prompt
    eps = play(bundle, recipe, problems, G, seed=seed, temperature=recipe.temperature, top_p=recipe.top_p,
               reward_mode=_reward_mode(recipe))
    rb = episodes_to_rollout_batch(bundle.tokenizer, eps)
    rb.sampling_logprobs = policy_logprobs(bundle.model, rb, recipe.temperature, G, recipe.micro_train_batch_size)
    rw = compute_rewards(recipe.reward, list(problems), rb.completions, finish_reasons=rb.finish_reasons,
                         lengths=rb.lengths, generate_max_len=recipe.generate_max_len, extras=episode_extras(eps))
    return rb, rw, eps


def step_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """The step's ``tools/*`` metrics plus ``completions/clipped_ratio`` over policy turns (module docstring)."""
    m = episode_metrics(episodes)
    acts = [t for e in episodes for t in e.turns if t["role"] == "assistant"]
    m[M.COMPLETIONS_CLIPPED_RATIO] = sum(t.get("finish_reason") == "length" for t in acts) / len(acts) if acts else 0.0
    return m


def step_records(episodes: Sequence[Episode], *, version_id: str, step: int, group_size: int, rewards: Sequence[float],
                 components: dict[str, list[float]], advantages: Sequence[float], kept: set[int]) -> list[dict[str, Any]]:
    """One train rollout row per episode (``swe.episode.episode_record``: every turn plus the outcome turn).

    ``group_id`` is ``g<row // G>`` (the row's group in the step, as single-turn rollouts).
    """
    return [episode_record(e, version_id=version_id, step=step, group_id=f"g{i // group_size}", reward=rewards[i],
                           components={k: v[i] for k, v in components.items()}, advantage=float(advantages[i]),
                           split="train", kept=i in kept)
            for i, e in enumerate(episodes)]


def evaluate_episodes(bundle: Any, recipe: Any, held: Sequence[Any], k: int, *, eval_name: str, version_id: str,
                      step: int, batch_tasks: int = 8, progress: Callable[[dict[str, Any]], None] | None = None,
                      ) -> tuple[list[list[float]], list[tuple[str, int, float, str]], list[dict[str, Any]]]:
    """k episodes per held-out task, graded ``all``: ``(per-task outcomes, eval samples, eval rollout rows)``.

    Returns:
        ``per_problem`` (n_tasks lists of k 1/0 outcomes, ``swe_tests``), ``samples``
        ``[(task_id, sample_idx, correct, transcript)]`` for ``lineage.log_eval_samples``, and one
        rollout row per episode (split ``eval``, ``turns`` with the outcome turn).
    """
    per_problem: list[list[float]] = []
    samples: list[tuple[str, int, float, str]] = []
    records: list[dict[str, Any]] = []
    for bi in range(0, len(held), batch_tasks):
        probs = list(held[bi: bi + batch_tasks])
        eps = play(bundle, recipe, probs, k, seed=recipe.seed * 7919 + bi, temperature=recipe.eval.temperature,
                   top_p=1.0, reward_mode="all")
        for j in range(len(probs)):
            outs = []
            for e in eps[j * k:(j + 1) * k]:
                c = 0.0 if math.isnan(e.outcome.swe_tests) else float(e.outcome.swe_tests)
                outs.append(c)
                samples.append((e.task_id, e.sample_idx, c, e.transcript()))
                records.append(episode_record(e, version_id=version_id, step=step, group_id=f"{eval_name}-{e.task_id}",
                                              reward=c, components={"correctness": c}, split="eval"))
            per_problem.append(outs)
        if progress is not None:
            progress({"step": min(len(held), bi + len(probs)), "steps": len(held), "problems_done": len(per_problem),
                      "avg@k": sum(sum(x) / k for x in per_problem) / len(per_problem)})
    return per_problem, samples, records
