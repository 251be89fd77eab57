"""The SWE tool-use domain: repository tasks, the episode environment, policies, GRPO on episodes.

Modules, bottom to top (each imports only the ones before it, plus core):

- :mod:`~evotrainer.rl_backend.swe.tasks`: tasks in SWE-bench form (the shipped generated set in
  ``rl_backend/data/swe_tasks/``, a SWE-bench JSONL loader), building a task's repository, the
  sandboxed pytest runner;
- :mod:`~evotrainer.rl_backend.swe.env`: one episode's environment (five tools, tool-call parsing,
  limits, grading by the hidden tests);
- :mod:`~evotrainer.rl_backend.swe.episode`: batched episodes of a policy, trajectories and their
  policy-token mask, tool-use metrics, rollout rows;
- :mod:`~evotrainer.rl_backend.swe.policies`: scripted policies (oracle, noop, cheat, loop) and a chat model;
- :mod:`~evotrainer.rl_backend.swe.train`: the local trainer's hooks (rollouts, metrics, evaluation of
  episodes); imports torch, so it is not re-exported here: ``from evotrainer.rl_backend.swe import train``;
- :mod:`~evotrainer.rl_backend.swe.cli`: ``evotrainer swe tasks|check|episodes`` (CLI edge).

The split of SWE problems into train / dev is :func:`evotrainer.rl_backend.tasks.load_swe_problems`,
beside the other task families. The public API below imports no torch.
"""

from evotrainer.rl_backend.swe.env import TOOLS, EpisodeStats, SweEnv, SweOutcome, parse_tool_calls
from evotrainer.rl_backend.swe.episode import (
    EXTRA_COMPONENTS,
    Action,
    Episode,
    Policy,
    encode_trajectory,
    episode_extras,
    episode_metrics,
    episode_record,
    run_episodes,
)
from evotrainer.rl_backend.swe.policies import SCRIPTED, ChatModelPolicy, ScriptedPolicy, snapshot_file
from evotrainer.rl_backend.swe.tasks import (
    TASKSET_DIR,
    BugSpec,
    PytestResult,
    SweTask,
    SweTaskError,
    load_manifest,
    load_swebench_jsonl,
    load_taskset,
    materialize,
    run_pytest,
)

__all__ = [
    "EXTRA_COMPONENTS", "SCRIPTED", "TASKSET_DIR", "TOOLS",
    "Action", "BugSpec", "ChatModelPolicy", "Episode", "EpisodeStats", "Policy", "PytestResult", "ScriptedPolicy",
    "SweEnv", "SweOutcome", "SweTask", "SweTaskError",
    "encode_trajectory", "episode_extras", "episode_metrics", "episode_record", "load_manifest",
    "load_swebench_jsonl", "load_taskset", "materialize", "parse_tool_calls", "run_episodes", "run_pytest",
    "snapshot_file",
]
