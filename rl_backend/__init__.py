"""GRPO training backends (local torch trainer; OpenRLHF on Ray), tasks, rewards (docs/design.md §1, §2).

Modules (the package re-exports nothing: import the module you need):

- pure maths and data (no model code), the only modules the harness may import:
  :mod:`~evotrainer.rl_backend.grpo` (advantages, loss, KL, group filters, on torch tensors), and,
  importable without torch, :mod:`~evotrainer.rl_backend.rewards` (reward components),
  :mod:`~evotrainer.rl_backend.tasks` (task families, splits, chat prompts, the test eval names),
  :mod:`~evotrainer.rl_backend.code_tasks` (HumanEval tests in the sandbox),
  :mod:`~evotrainer.rl_backend.math_verify_utils` (answer checking);
- the backend protocol :mod:`~evotrainer.rl_backend.base` and the registry
  :mod:`~evotrainer.rl_backend.backends` (``get_backend(name)``);
- the local backend: :mod:`~evotrainer.rl_backend.local` (the trainer), ``models``, ``sampling``,
  ``decode`` (the rollout decode loop and a plain-torch Llama decode step), ``tb_writer`` (TensorBoard),
  ``trackers`` (``report_to``: TensorBoard, W&B, MLflow);
- subpackages :mod:`~evotrainer.rl_backend.swe` (the SWE tool-use domain) and
  :mod:`~evotrainer.rl_backend.openrlhf` (the OpenRLHF backend);
- ``cli`` (``evotrainer train`` / ``eval``) and ``swe.cli``: the CLI edge.

rl_backend imports core and itself only (never harness, servers, agents or skills_db).
"""
