"""EvoTrainer: autonomous RL post-training of LLMs that co-evolves the policy and its harness.

Core domain (this package): recipe, intervention, version lineage, workspace, rollout store,
metric names, CLI. Subpackages mapped from the top-level folders: ``evotrainer.rl_backend``,
``evotrainer.harness``, ``evotrainer.skills_db``, ``evotrainer.servers``, ``evotrainer.agents``.
"""

__version__ = "0.1.0"
