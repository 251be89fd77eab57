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
  episodes; the only module here that imports torch);
- :mod:`~evotrainer.rl_backend.swe.cli`: ``evotrainer swe tasks|check|episodes`` (CLI edge).

The split of SWE problems into train / dev is :func:`evotrainer.rl_backend.tasks.load_swe_problems`,
beside the other task families.

Public API, by module (the package re-exports nothing, so ``evotrainer swe --help`` and
``rl_backend.tasks`` load no episode machinery; import the module you need):

- ``tasks``: ``SweTask``, ``BugSpec``, ``SweTaskError``, ``TASKSET_DIR``, ``load_taskset``, ``load_manifest``,
  ``load_swebench_jsonl``, ``materialize``, ``run_pytest``, ``PytestResult``, ``is_test_file``,
  ``test_file_digests``, ``write_snapshot``;
- ``env``: ``SweEnv``, ``SweOutcome``, ``EpisodeStats``, ``TOOLS``, ``parse_tool_calls``, ``repo_digest``;
- ``episode``: ``Episode``, ``Action``, ``Policy``, ``run_episodes``, ``encode_trajectory``, ``episode_extras``,
  ``episode_metrics``, ``episode_record``, ``EXTRA_COMPONENTS``;
- ``policies``: ``ScriptedPolicy``, ``ChatModelPolicy``, ``SCRIPTED``, ``snapshot_file``;
- ``train``: ``rollout``, ``step_metrics``, ``step_records``, ``evaluate_episodes``, ``episodes_to_rollout_batch``;
- ``cli``: ``register`` (adds the swe command group to the main app).
"""

__all__ = ["cli", "env", "episode", "policies", "tasks", "train"]
