"""Running a policy over SWE episodes: turns, trajectories, the policy-token mask, outcomes, metrics.

:func:`run_episodes` steps a batch of :class:`~evotrainer.rl_backend.swe.env.SweEnv` episodes
together (one policy call per turn for all live episodes, so a model policy generates in batches),
grades each final repo with the hidden tests, and returns :class:`Episode` records: every turn
(the policy's reply with its sampled token ids, then the environment's observation), the episode
counters, the hidden-test outcome and the per-sample ``extras`` that
``evotrainer.rl_backend.rewards`` reads (``swe_tests``, ``test_file_edit``, ``tool_budget``,
``submit_without_test``).

Training on a multi-turn trajectory: :func:`encode_trajectory` lays the whole chat out as one token
sequence with the chat template and returns ``completion_mask`` = 1 exactly on the policy's own
tokens (its sampled ids, end-of-turn token included) and 0 on the prompt, the observations and the
template glue between turns, so the GRPO loss never trains on environment text (as verl's and
RAGEN's multi-turn rollouts mask tool responses).

Shapes: B = tasks x samples per task episodes; T = tokens of one encoded trajectory.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from evotrainer import metrics as M
from evotrainer.recipe import ToolUseSpec
from evotrainer.rl_backend.swe.env import TOOLS, SweEnv, SweOutcome, parse_tool_calls
from evotrainer.rl_backend.swe.tasks import TASKSET_DIR, SweTask
from evotrainer.rollouts import make_record
from evotrainer.sandbox.fs import remove_tree

EXTRA_COMPONENTS = ("swe_tests", "test_file_edit", "tool_budget", "submit_without_test")


@dataclass
class Action:
    """One policy reply: its text and, for a model, the sampled token ids (end-of-turn token included).

    ``finish_reason``: ``eos`` (stopped at its end-of-turn token) or ``length`` (cut at the token cap).
    """

    text: str
    token_ids: list[int] | None = None
    finish_reason: str = "eos"


class Policy(Protocol):
    """Anything that answers a batch of chats: ``act([messages, ...]) -> [Action, ...]`` (same length)."""

    def act(self, batch: list[list[dict[str, str]]]) -> list[Action]: ...


@dataclass
class Episode:
    """One finished episode.

    Attributes:
        task_id / sample_idx: which task, which sample of its group.
        messages: the full chat (system, user, then assistant / tool turns alternating).
        turns: ``[{role, content, tokens, tool, ok, token_ids?, finish_reason?}]`` after the opening
            messages: the rollout store's ``turns`` JSON (``tokens`` = token count, 0 when unknown).
        stats: the episode counters (:class:`~evotrainer.rl_backend.swe.env.EpisodeStats` as a dict).
        outcome: the hidden-test verdict.
        extras: ``{component: value}`` for the behaviour and test reward components.
        finish_reason: ``submit`` when the policy submitted, else ``budget`` (turns, tool budget or time).
        seconds: time spent in this episode's tool calls and grading (the policy's time is shared
            by the batch and not counted).
    """

    task_id: str
    sample_idx: int
    messages: list[dict[str, str]]
    turns: list[dict[str, Any]]
    stats: dict[str, Any]
    outcome: SweOutcome
    extras: dict[str, float]
    finish_reason: str
    seconds: float
    policy_tokens: int = 0

    @property
    def prompt(self) -> str:
        """The opening user message (the problem statement)."""
        return next(m["content"] for m in self.messages if m["role"] == "user")

    def transcript(self) -> str:
        """The turns as text (``assistant:`` / ``tool:`` blocks), for full-text search."""
        return "\n\n".join(f"{t['role']}: {t['content']}" for t in self.turns)

    def policy_token_ids(self) -> list[list[int]] | None:
        """Sampled ids of each assistant turn, or None when the policy gave no ids (scripted)."""
        ids: list[list[int] | None] = [t.get("token_ids") for t in self.turns if t["role"] == "assistant"]
        known = [i for i in ids if i is not None]
        return known if ids and len(known) == len(ids) else None


def run_episodes(tasks: Sequence[SweTask], policy: Policy, *, limits: ToolUseSpec | None = None,
                 samples_per_task: int = 1, reward_mode: str = "all", workdir: str | Path | None = None,
                 taskset_root: str | Path = TASKSET_DIR, repos_root: str | Path | None = None,
                 observation_role: str = "tool", count_tokens: Callable[[str], int] | None = None,
                 skip_unchanged: bool = True,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> list[Episode]:
    """Run ``samples_per_task`` episodes of each task with ``policy``; returns B episodes, task-major.

    Args:
        tasks: the tasks (a group of ``samples_per_task`` episodes each).
        policy: answers all live episodes of a turn in one ``act`` call.
        limits: the recipe's ``tool_use`` section (defaults when None).
        reward_mode: ``all`` | ``fraction`` (see :meth:`SweEnv.grade`).
        workdir: where repos are built (a temp dir, removed afterwards, when None).
        observation_role: chat role of environment observations (``tool``; ``user`` for templates
            without a tool role).
        count_tokens: token counter for observations (the tokenizer's); counts are 0 without it.
        skip_unchanged: grade an episode that changed no file without running its tests (see
            :meth:`SweEnv.grade`); ``swe check`` turns this off to measure every verdict.
        progress: called with ``{"episode", "episodes", "task", "reward"}`` as each episode ends.

    Raises:
        ValueError: ``samples_per_task`` < 1, or the policy returns the wrong number of actions.
    """
    if samples_per_task < 1:
        raise ValueError(f"samples_per_task={samples_per_task}: need at least 1")
    limits = limits or ToolUseSpec()
    tmp: str | None = None  # a temp dir of our own, removed afterwards
    if workdir is None:
        tmp = tempfile.mkdtemp(prefix="swe-")
        root = Path(tmp)
    else:
        root = Path(workdir)
    try:
        envs: list[SweEnv] = []
        chats: list[list[dict[str, str]]] = []
        turns: list[list[dict[str, Any]]] = []
        env_s: list[float] = []
        for i, task in enumerate(tasks):
            for s in range(samples_per_task):
                env = SweEnv(task, root / f"{i:04d}-{s:02d}", limits, taskset_root, repos_root)
                chats.append(env.reset())
                envs.append(env)
                turns.append([])
                env_s.append(0.0)
        episodes: list[Episode | None] = [None] * len(envs)
        live = list(range(len(envs)))
        while live:
            actions = policy.act([chats[i] for i in live])
            if len(actions) != len(live):
                raise ValueError(f"policy returned {len(actions)} actions for {len(live)} chats; return one per chat")
            for i, act in zip(live, actions, strict=True):
                calls = parse_tool_calls(act.text)
                t0 = time.monotonic()
                obs = envs[i].step(act.text)
                env_s[i] += time.monotonic() - t0
                names = ",".join(c.name or "invalid" for c in calls)
                ok = all(c.error is None for c in calls) and not obs.startswith("[error]")
                n_act = len(act.token_ids) if act.token_ids is not None else (count_tokens(act.text) if count_tokens else 0)
                turns[i].append({"role": "assistant", "content": act.text, "tokens": n_act, "tool": names, "ok": ok,
                                 "token_ids": act.token_ids, "finish_reason": act.finish_reason})
                turns[i].append({"role": observation_role, "content": obs,
                                 "tokens": count_tokens(obs) if count_tokens else 0, "tool": names, "ok": ok})
                chats[i] = chats[i] + [{"role": "assistant", "content": act.text},
                                       {"role": observation_role, "content": obs}]
            for i in [i for i in live if envs[i].done]:
                ep = episodes[i] = _finish(envs[i], i % samples_per_task, chats[i], turns[i], reward_mode, env_s[i],
                                           skip_unchanged)
                if progress:
                    progress({"episode": sum(e is not None for e in episodes), "episodes": len(envs),
                              "task": envs[i].task.instance_id, "reward": ep.outcome.swe_tests})
            live = [i for i in live if not envs[i].done]
        return [e for e in episodes if e is not None]
    finally:
        if tmp:  # not shutil.rmtree: it recurses, and a policy's test run can leave a 1,100-deep tree
            remove_tree(tmp)


def _finish(env: SweEnv, sample_idx: int, chat: list[dict[str, str]], turns: list[dict[str, Any]],
            reward_mode: str, env_seconds: float, skip_unchanged: bool) -> Episode:
    t0 = time.monotonic()
    outcome = env.grade(reward_mode, skip_unchanged=skip_unchanged)
    st = env.stats
    extras = {"swe_tests": outcome.swe_tests,
              "test_file_edit": 1.0 if (outcome.test_files_edited or st.test_file_edit_calls) else 0.0,
              "tool_budget": 1.0 if st.budget_exceeded else 0.0,
              "submit_without_test": 1.0 if st.submit_without_test else 0.0}
    policy_tokens = sum(t["tokens"] for t in turns if t["role"] == "assistant")
    return Episode(task_id=env.task.instance_id, sample_idx=sample_idx, messages=chat, turns=turns,
                   stats=st.to_dict(), outcome=outcome, extras=extras,
                   finish_reason="submit" if st.stop_reason == "submit" else "budget",
                   seconds=round(env_seconds + time.monotonic() - t0, 3), policy_tokens=policy_tokens)


def episode_extras(episodes: Sequence[Episode]) -> dict[str, list[float]]:
    """``{component: (B,) values}`` for ``rewards.compute_rewards(..., extras=...)``."""
    return {c: [e.extras[c] for e in episodes] for c in EXTRA_COMPONENTS}


# --- the policy-token mask ----------------------------------------------------------------------------
@dataclass
class EncodedTrajectory:
    """A multi-turn trajectory as one sequence: ``input_ids`` (T,), ``completion_mask`` (T,) 1 on policy tokens.

    ``prompt_len``: tokens before the first policy token. ``mismatches``: assistant turns whose
    sampled ids did not decode to a prefix of the template's rendering (their rendered text was
    tokenized instead; 0 in a consistent run).
    """

    input_ids: list[int]
    completion_mask: list[int]
    prompt_len: int
    mismatches: int = 0
    spans: list[tuple[int, int]] = field(default_factory=list)


def encode_trajectory(tokenizer: Any, messages: list[dict[str, str]],
                      policy_token_ids: list[list[int]] | None = None) -> EncodedTrajectory:
    """Token ids and policy-token mask of a chat, laid out with the tokenizer's chat template.

    The text before each assistant turn is ``template(messages[:k], add_generation_prompt=True)``;
    the part not yet emitted (the previous observation and the turn headers) is tokenized with mask
    0. The assistant turn is its sampled ids when given (mask 1), else the tokenization of its
    content plus the end-of-turn token (``tokenizer.eos_token``) when the template writes that.
    Text after the last assistant turn (the final observation) is not included.

    Raises:
        ValueError: no assistant turn, or the template does not render the chat as a growing prefix
            (then turns cannot be separated).
    """
    render = tokenizer.apply_chat_template
    idx = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    if not idx:
        raise ValueError("the chat has no assistant turn: nothing for the policy to learn from")
    if policy_token_ids is not None and len(policy_token_ids) != len(idx):
        raise ValueError(f"{len(policy_token_ids)} sampled id lists for {len(idx)} assistant turns")

    def tok(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    ids: list[int] = []
    mask: list[int] = []
    spans: list[tuple[int, int]] = []
    consumed, prompt_len, mismatches = "", 0, 0
    eos = tokenizer.eos_token or ""
    for j, k in enumerate(idx):
        head = render(messages[:k], tokenize=False, add_generation_prompt=True)
        full = render(messages[:k + 1], tokenize=False)
        if not head.startswith(consumed) or not full.startswith(head):
            raise ValueError("the chat template does not render the chat as a growing prefix; "
                             "cannot separate policy tokens from observations")
        glue = tok(head[len(consumed):])
        ids += glue
        mask += [0] * len(glue)
        if j == 0:
            prompt_len = len(ids)
        rendered = full[len(head):]
        if policy_token_ids is not None:
            a_ids = list(policy_token_ids[j])
            a_text = tokenizer.decode(a_ids, skip_special_tokens=False)
            if not rendered.startswith(a_text):
                mismatches += 1
                a_text = rendered
                a_ids = tok(rendered)
        else:
            content = messages[k]["content"]
            a_text = content + eos if eos and rendered.startswith(content + eos) else content
            a_ids = tok(a_text)
        spans.append((len(ids), len(ids) + len(a_ids)))
        ids += a_ids
        mask += [1] * len(a_ids)
        consumed = head + a_text
    return EncodedTrajectory(ids, mask, prompt_len, mismatches, spans)


# --- metrics and rollout records ------------------------------------------------------------------
def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Tool-use metrics of a batch of episodes (names from ``evotrainer.metrics``, ``tools/*``): means per episode."""
    n = len(episodes)
    if not n:
        return {}

    def mean(f: Callable[[Episode], float]) -> float:
        return sum(float(f(e)) for e in episodes) / n

    calls = sum(e.stats["calls"] for e in episodes)
    out = {
        M.TOOLS_TURNS_MEAN: mean(lambda e: e.stats["turns"]),
        M.TOOLS_CALLS_MEAN: mean(lambda e: e.stats["calls"]),
        M.TOOLS_INVALID_FRAC: sum(e.stats["invalid_calls"] for e in episodes) / calls if calls else 0.0,
        M.TOOLS_TEST_EDIT_FRAC: mean(lambda e: e.extras["test_file_edit"]),
        M.TOOLS_SUBMIT_WITHOUT_TEST_FRAC: mean(lambda e: e.extras["submit_without_test"]),
        M.TOOLS_BUDGET_EXCEEDED_FRAC: mean(lambda e: e.extras["tool_budget"]),
        M.TOOLS_TEST_RUNS_MEAN: mean(lambda e: e.stats["test_runs"]),
        M.TOOLS_EDITS_MEAN: mean(lambda e: e.stats["edits"]),
        M.TOOLS_FILES_TOUCHED_MEAN: mean(lambda e: len(e.stats["files_touched"])),
        M.TOOLS_COLLECTION_ERROR_FRAC: mean(lambda e: e.outcome.collection_error),
        M.TOOLS_SUBMIT_FRAC: mean(lambda e: e.stats["submitted"]),
        M.TOOLS_RESOLVED_FRAC: mean(lambda e: e.outcome.resolved),
    }
    for t in TOOLS:
        out[M.tool_calls(t)] = sum(float(e.stats["calls_by_tool"].get(t, 0)) for e in episodes) / n
    return out


def episode_record(ep: Episode, *, version_id: str, step: int, group_id: str, reward: float,
                   components: dict[str, float] | None = None, advantage: float = 0.0, split: str = "train",
                   kept: bool = True) -> dict[str, Any]:
    """A rollout-store row for an episode (``evotrainer.rollouts.make_record``) with its ``turns`` JSON.

    ``completion`` is the transcript; ``length`` the policy's own tokens; ``answer`` the task id;
    ``correct`` the hidden-test reward. The episode counters and the grader's outcome are appended as
    a last turn ``{"role": "outcome", "content": json({"outcome", "stats"})}`` (read by
    ``harness/analyzers/swe.py``); sampled ``token_ids`` stay in the assistant turns.
    """
    comps = dict(components or {})
    turns = [{k: v for k, v in t.items() if v is not None} for t in ep.turns]
    turns.append({"role": "outcome", "content": json.dumps({"outcome": ep.outcome.to_dict(), "stats": ep.stats}),
                  "tokens": 0, "tool": "", "ok": ep.outcome.resolved})
    return make_record(version_id=version_id, step=step, prompt_id=ep.task_id, group_id=group_id,
                       sample_idx=ep.sample_idx, prompt=ep.prompt, completion=ep.transcript(), reward=reward,
                       components=comps, answer=ep.task_id, correct=ep.outcome.swe_tests, advantage=advantage,
                       length=ep.policy_tokens, finish_reason=ep.finish_reason, kept=kept, split=split, turns=turns)
