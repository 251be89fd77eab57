"""The ``openrlhf`` backend: GRPO training as an OpenRLHF ``train_ppo_ray`` job (Ray Jobs API or local).

Modules, bottom to top (each imports only the ones before it, plus core and the rest of
``rl_backend``):

- :mod:`~evotrainer.rl_backend.openrlhf.reward_func`: the reward function OpenRLHF loads (it imports
  the generated ``reward_func.py`` of a job by file path; that file calls :func:`make_reward_func`),
  the local trainer's ``rewards.compute_rewards``;
- :mod:`~evotrainer.rl_backend.openrlhf.job`: a recipe as an OpenRLHF job (flags of each release,
  prompt datasets, the reward file, warnings for what OpenRLHF cannot express);
- :mod:`~evotrainer.rl_backend.openrlhf.runner`: submit, follow, cancel a job; check a command against
  OpenRLHF's own argument parser;
- :mod:`~evotrainer.rl_backend.openrlhf.ingest`: a job's TensorBoard scalars and samples into a workspace;
- :mod:`~evotrainer.rl_backend.openrlhf.backend`: :class:`OpenRLHFBackend` (the ``Backend`` protocol of
  :mod:`evotrainer.rl_backend.base`) and :func:`dry_run`.
"""

from evotrainer.rl_backend.openrlhf.backend import OpenRLHFBackend, dry_run
from evotrainer.rl_backend.openrlhf.ingest import ingest_run, read_metrics, read_samples, summarize
from evotrainer.rl_backend.openrlhf.job import (
    PINNED_VERSION,
    ClusterSpec,
    OpenRLHFError,
    OpenRLHFJob,
    build_job,
    flag_scheme,
    format_job,
    installed_openrlhf_version,
    write_reward_file,
)
from evotrainer.rl_backend.openrlhf.reward_func import make_reward_func, split_completion
from evotrainer.rl_backend.openrlhf.runner import (
    cancel_job,
    check_job,
    job_logs,
    job_status,
    load_parser,
    submit,
)

__all__ = [
    "PINNED_VERSION", "ClusterSpec", "OpenRLHFBackend", "OpenRLHFError", "OpenRLHFJob",
    "build_job", "cancel_job", "check_job", "dry_run", "flag_scheme", "format_job", "ingest_run",
    "installed_openrlhf_version", "job_logs", "job_status", "load_parser", "make_reward_func", "read_metrics",
    "read_samples", "split_completion", "submit", "summarize", "write_reward_file",
]
