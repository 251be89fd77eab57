"""OpenRLHF backend: a recipe becomes an OpenRLHF ``train_ppo_ray`` GRPO job (docs/design.md §1).

:func:`build_job` writes, into ``RUN/openrlhf/<version>/``, the prompt datasets (``train.jsonl``,
``heldout.jsonl``: chat messages + a JSON label per problem), the reward function file OpenRLHF
loads (``reward_func.py``, see :mod:`evotrainer.rl_backend.openrlhf.reward_func`) and returns an
:class:`OpenRLHFJob`: the exact argv, environment and Ray ``runtime_env``. :func:`format_job` prints
it (``evotrainer train RECIPE --backend openrlhf --dry-run``).
:mod:`evotrainer.rl_backend.openrlhf.runner` submits it (Ray Jobs API or a local subprocess), follows
it and checks it against OpenRLHF's own parser;
:class:`~evotrainer.rl_backend.openrlhf.backend.OpenRLHFBackend` ties it to a workspace.
Metrics come back through :mod:`evotrainer.rl_backend.openrlhf.ingest`.

Flag spellings (read from OpenRLHF's own ``openrlhf/cli/train_ppo_ray.py``): 0.10.2 renamed
the flat flags (``--pretrain``, ``--remote_rm_url``, ``--dynamic_filtering``, ...; 0.10.0-0.10.1 and
0.9.x) to dotted groups (``--actor.model_name_or_path``, ``--reward.remote_url``,
``--algo.dynamic_filtering_enable``, ...; 0.10.2 - 0.11.x). ``--actor.loss_agg_mode`` exists from
0.11.2 only. :data:`FLAGS` holds both spellings; the tests parse generated commands with the real
parsers of 0.11.2, 0.10.4 and 0.10.1.

Mapping notes (departures are listed in ``job.warnings``): one EvoTrainer step = one OpenRLHF
rollout batch (``train_batch_size = rollout_batch_size x n_samples_per_prompt``, one optimiser step
per batch and PPO epoch); ``steps`` is set by writing ``steps x rollout_batch_size`` prompts.
All reward shaping (overlong included) happens in the reward file, so OpenRLHF's own overlong
flags stay off. ``drop_zero_variance_groups`` / ``dynamic_filtering`` map to OpenRLHF's dynamic
filtering, which keeps groups whose mean *score* (our correctness) lies strictly inside the range.
"""

from __future__ import annotations

import importlib.metadata
import json
import random
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evotrainer.errors import EvoTrainerError
from evotrainer.recipe import Recipe
from evotrainer.rl_backend.tasks import build_messages, load_splits

PINNED_VERSION = "0.11.2"
"""The OpenRLHF version of the ``openrlhf`` extra; the previous minor (0.10.x) is supported too."""

HF_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""Local model aliases → the Hugging Face ids OpenRLHF loads (it cannot read our GGUF copy)."""

# canonical key -> (dotted flag of 0.10.2+, flat flag of <= 0.10.1); None: not in that scheme
FLAGS: dict[str, tuple[str | None, str | None]] = {
    "pretrain": ("--actor.model_name_or_path", "--pretrain"),
    "remote_rm_url": ("--reward.remote_url", "--remote_rm_url"),
    "prompt_data": ("--data.prompt_dataset", "--prompt_data"),
    "input_key": ("--data.input_key", "--input_key"),
    "label_key": ("--data.label_key", "--label_key"),
    "apply_chat_template": ("--data.apply_chat_template", "--apply_chat_template"),
    "max_samples": ("--data.max_samples", "--max_samples"),
    "num_episodes": ("--train.num_episodes", "--num_episodes"),
    "advantage_estimator": ("--algo.advantage.estimator", "--advantage_estimator"),
    "n_samples_per_prompt": ("--rollout.n_samples_per_prompt", "--n_samples_per_prompt"),
    "eps_clip_low_high": ("--actor.eps_clip_low_high", "--eps_clip_low_high"),
    "init_kl_coef": ("--algo.kl.init_coef", "--init_kl_coef"),
    "kl_estimator": ("--algo.kl.estimator", "--kl_estimator"),
    "use_kl_loss": ("--algo.kl.use_loss", "--use_kl_loss"),
    "loss_agg_mode": ("--actor.loss_agg_mode", None),
    "max_epochs": ("--train.max_epochs", "--max_epochs"),
    "actor_learning_rate": ("--actor.adam.lr", "--actor_learning_rate"),
    "lr_warmup_ratio": ("--actor.lr_warmup_ratio", "--lr_warmup_ratio"),
    "l2": ("--actor.adam.weight_decay", "--l2"),
    "max_norm": ("--actor.max_norm", "--max_norm"),
    "micro_train_batch_size": ("--train.micro_batch_size", "--micro_train_batch_size"),
    "micro_rollout_batch_size": ("--rollout.micro_batch_size", "--micro_rollout_batch_size"),
    "train_batch_size": ("--train.batch_size", "--train_batch_size"),
    "rollout_batch_size": ("--rollout.batch_size", "--rollout_batch_size"),
    "temperature": ("--rollout.temperature", "--temperature"),
    "top_p": ("--rollout.top_p", "--top_p"),
    "max_new_tokens": ("--rollout.max_new_tokens", "--max_new_tokens"),
    "max_len": ("--data.max_len", "--max_len"),
    "dynamic_filtering": ("--algo.dynamic_filtering_enable", "--dynamic_filtering"),
    "dynamic_filtering_range": ("--algo.dynamic_filtering_range", "--dynamic_filtering_reward_range"),
    "entropy_coef": ("--actor.entropy_coef", "--entropy_loss_coef"),
    "seed": ("--train.seed", "--seed"),
    "actor_num_nodes": ("--actor.num_nodes", "--actor_num_nodes"),
    "actor_num_gpus_per_node": ("--actor.num_gpus_per_node", "--actor_num_gpus_per_node"),
    "ref_num_nodes": ("--ref.num_nodes", "--ref_num_nodes"),
    "ref_num_gpus_per_node": ("--ref.num_gpus_per_node", "--ref_num_gpus_per_node"),
    "vllm_num_engines": ("--vllm.num_engines", "--vllm_num_engines"),
    "vllm_tensor_parallel_size": ("--vllm.tensor_parallel_size", "--vllm_tensor_parallel_size"),
    "vllm_gpu_memory_utilization": ("--vllm.gpu_memory_utilization", "--vllm_gpu_memory_utilization"),
    "colocate_all_models": ("--train.colocate_all", "--colocate_all_models"),
    "vllm_enable_sleep": ("--vllm.enable_sleep", "--vllm_enable_sleep"),
    "deepspeed_enable_sleep": ("--ds.enable_sleep", "--deepspeed_enable_sleep"),
    "zero_stage": ("--ds.zero_stage", "--zero_stage"),
    "param_dtype": ("--ds.param_dtype", "--param_dtype"),
    "attn_implementation": ("--ds.attn_implementation", "--attn_implementation"),
    "gradient_checkpointing": ("--actor.gradient_checkpointing_enable", "--gradient_checkpointing"),
    "lora_rank": ("--ds.lora.rank", "--lora_rank"),
    "lora_alpha": ("--ds.lora.alpha", "--lora_alpha"),
    "lora_dropout": ("--ds.lora.dropout", "--lora_dropout"),
    "target_modules": ("--ds.lora.target_modules", "--target_modules"),
    "save_path": ("--ckpt.output_dir", "--save_path"),
    "ckpt_path": ("--ckpt.path", "--ckpt_path"),
    "save_steps": ("--ckpt.save_steps", "--save_steps"),
    "save_hf_ckpt": ("--ckpt.save_hf", "--save_hf_ckpt"),
    "logging_steps": ("--logger.logging_steps", "--logging_steps"),
    "tensorboard_dir": ("--logger.tensorboard_dir", "--use_tensorboard"),
    "run_name": ("--logger.wandb.run_name", "--wandb_run_name"),
    "eval_dataset": ("--eval.dataset", "--eval_dataset"),
    "eval_steps": ("--eval.steps", "--eval_steps"),
    "eval_temperature": ("--eval.temperature", "--eval_temperature"),
    "eval_n_samples_per_prompt": ("--eval.n_samples_per_prompt", "--eval_n_samples_per_prompt"),
}


class OpenRLHFError(EvoTrainerError, RuntimeError):
    """The recipe cannot be expressed as an OpenRLHF job, or the job cannot be submitted / followed."""


class ClusterSpec(BaseModel):
    """Where and on how much hardware the OpenRLHF job runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ray_address: str | None = Field(None, description="Ray dashboard address (http://host:8265) for the Jobs API; "
                                    "None runs a local subprocess.")
    num_nodes: int = Field(1, ge=1, description="Nodes for the actor (and reference) model.")
    num_gpus_per_node: int = Field(1, ge=1, description="GPUs per node.")
    vllm_num_engines: int = Field(1, ge=0, description="vLLM engines for rollouts (0: generate with the actor).")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine.")
    vllm_gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="Fraction of GPU memory vLLM takes.")
    colocate_all_models: bool = Field(True, description="Actor, reference and vLLM share the same GPUs.")
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    attn_implementation: str = Field("flash_attention_2", description="Attention kernel (eager / sdpa without flash-attn).")
    openrlhf_version: str | None = Field(None, description="Target OpenRLHF version; default: the installed one, "
                                         f"else {PINNED_VERSION}.")
    python: str = Field("python3", description="Python executable on the cluster / local machine.")
    output_dir: str | None = Field(None, description="Checkpoints and TensorBoard (a shared filesystem path for Ray); "
                                   "default: the job folder.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the job.")
    extra_args: list[str] = Field(default_factory=list, description="Extra train_ppo_ray arguments, appended as is.")


class OpenRLHFJob(BaseModel):
    """One OpenRLHF training job of a version: what runs, where, with which files."""

    version_id: str
    openrlhf_version: str
    scheme: Literal["dotted", "flat"]
    steps: int
    argv: list[str]
    env: dict[str, str]
    runtime_env: dict[str, Any]
    job_dir: str
    files: dict[str, str]
    tensorboard_dir: str
    run_name: str
    save_path: str
    ray_address: str | None = None
    warnings: list[str] = Field(default_factory=list)

    @property
    def entrypoint(self) -> str:
        """The shell command line (what the Ray Jobs API runs in ``job_dir``)."""
        return shlex.join(self.argv)


def installed_openrlhf_version() -> str | None:
    """Version of the installed ``openrlhf`` distribution, or None (read from metadata, nothing imported)."""
    try:
        return importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError:
        return None


def _vtuple(version: str) -> tuple[int, int, int]:
    nums = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in version.split("+")[0].split(".")[:3]]
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


def flag_scheme(version: str) -> Literal["dotted", "flat"]:
    """``dotted`` for OpenRLHF >= 0.10.2, ``flat`` before (the release that renamed the flags).

    Raises:
        OpenRLHFError: a version older than 0.9 (never checked against its parser).
    """
    parts = _vtuple(version)
    if parts < (0, 9, 0):
        raise OpenRLHFError(f"openrlhf {version}: versions before 0.9 are not supported; install {PINNED_VERSION}")
    return "dotted" if parts >= (0, 10, 2) else "flat"


def _flag(key: str, scheme: str, version: str) -> str:
    dotted, flat = FLAGS[key]
    name = dotted if scheme == "dotted" else flat
    if name is None:
        raise OpenRLHFError(f"openrlhf {version} has no option for {key}")
    return name


def _args(opts: dict[str, Any], scheme: str, version: str) -> list[str]:
    out: list[str] = []
    for key, val in opts.items():
        if val is None or val is False:
            continue
        name = _flag(key, scheme, version)
        if val is True:
            out.append(name)
        elif isinstance(val, (list, tuple)):
            out += [name, *(str(v) for v in val)]
        else:
            out += [name, str(val)]
    return out


def _dataset_rows(problems: list, recipe: Recipe) -> list[dict[str, Any]]:
    return [{"prompt": build_messages(p, recipe.data), "datasource": p.meta.get("split", "train"),
             "label": json.dumps({"id": p.id, "prompt": p.prompt, "answer": p.answer, "meta": p.meta})}
            for p in problems]


def write_reward_file(path: str | Path, recipe: Recipe, tokenizer: str | None) -> Path:
    """Write the reward function file OpenRLHF loads (a config plus ``make_reward_func``)."""
    config = {"reward": {k: v.model_dump(mode="json") for k, v in recipe.reward.items()},
              "generate_max_len": recipe.generate_max_len, "tokenizer": tokenizer, "task": recipe.data.task}
    text = (
        '"""OpenRLHF reward function generated by EvoTrainer from the recipe\'s reward spec.\n\n'
        "OpenRLHF imports this file and calls reward_func(queries, prompts, labels); the rewards are\n"
        'evotrainer.rl_backend.rewards.compute_rewards, the same code as the local trainer."""\n\n'
        "from evotrainer.rl_backend.openrlhf.reward_func import make_reward_func\n\n"
        f"CONFIG = {json.dumps(config, indent=4)}\n\n"
        "reward_func = make_reward_func(CONFIG)\n"
    )
    text = text.replace(": true", ": True").replace(": false", ": False").replace(": null", ": None")
    p = Path(path)
    p.write_text(text)
    return p


def build_job(recipe: Recipe, run_dir: str | Path, *, version_id: str = "v0", steps: int = 8,
              cluster: ClusterSpec | None = None, model_path: str | None = None,
              pinned: Any = None) -> OpenRLHFJob:
    """Turn a recipe into an OpenRLHF GRPO job and write its input files.

    Args:
        recipe: the version's recipe.
        pinned: the run's root data spec: its dev and test splits are held out of the job's training prompts and
            its dev split is the job's held-out file (``tasks.load_splits``); None: the recipe's own.
        run_dir: the run folder; files go to ``run_dir/openrlhf/<version_id>/``.
        version_id: the version this job trains.
        steps: training steps (rollout batches of ``recipe.rollout_batch_size`` prompts).
        cluster: hardware and submission settings (defaults: 1 node, 1 GPU, 1 colocated vLLM engine).
        model_path: start from this checkpoint (HF folder) instead of ``recipe.model.name_or_path``.

    Raises:
        OpenRLHFError: a recipe setting OpenRLHF cannot express (names the field and the fix).
        TaskError: the recipe's data cannot be loaded.
    """
    cluster = cluster or ClusterSpec()
    version = cluster.openrlhf_version or installed_openrlhf_version() or PINNED_VERSION
    scheme = flag_scheme(version)
    warnings: list[str] = []
    if steps < 1:
        raise OpenRLHFError(f"steps={steps}: train at least 1 step")
    model = model_path or HF_IDS.get(recipe.model.name_or_path, recipe.model.name_or_path)
    if model == "tiny-random":
        raise OpenRLHFError("recipe.model.name_or_path='tiny-random' is built in memory by the local backend; "
                            "give OpenRLHF a HF model id or folder")
    if recipe.data.task == "swe":
        raise OpenRLHFError("recipe.data.task='swe': multi-turn tool-use episodes run on the local backend only")
    has_agg = _vtuple(version) >= (0, 11, 2)  # --actor.loss_agg_mode appeared in 0.11.2
    if recipe.loss_agg_mode == "seq-mean-token-sum" or (recipe.loss_agg_mode != "token-mean" and not has_agg):
        raise OpenRLHFError(f"recipe.loss_agg_mode={recipe.loss_agg_mode!r}: openrlhf {version} supports "
                            f"{'token-mean and seq-mean-token-mean' if has_agg else 'token-mean only'}; set token-mean")
    if recipe.group_filter_top_p < 1:
        warnings.append(f"group_filter_top_p={recipe.group_filter_top_p}: OpenRLHF has no SNR top-p group filter; ignored")
    if recipe.model.dtype == "float32":
        warnings.append("model.dtype=float32: OpenRLHF trains with DeepSpeed in bf16 (--param_dtype bf16)")
    if not recipe.kl_enabled and recipe.use_kl_loss:
        warnings.append("init_kl_coef=0: no reference model; use_kl_loss has no effect")

    job_dir = (Path(run_dir) / "openrlhf" / version_id).resolve()
    job_dir.mkdir(parents=True, exist_ok=True)
    out_dir = Path(cluster.output_dir).resolve() / version_id if cluster.output_dir else job_dir
    train, heldout, _ = load_splits(recipe.data, pinned=pinned)
    rng = random.Random(recipe.seed)
    order: list = []
    while len(order) < steps * recipe.rollout_batch_size:  # epochs over the train set, reshuffled each time
        epoch = list(train)
        rng.shuffle(epoch)
        order += epoch
    order = order[: steps * recipe.rollout_batch_size]
    files = {"train": "train.jsonl", "heldout": "heldout.jsonl", "reward": "reward_func.py"}
    for name, probs in (("train", order), ("heldout", heldout)):
        with open(job_dir / files[name], "w") as f:
            for row in _dataset_rows(probs, recipe):
                f.write(json.dumps(row) + "\n")
    write_reward_file(job_dir / files["reward"], recipe, model)

    dyn = recipe.dynamic_filtering or recipe.drop_zero_variance_groups
    if dyn:
        warnings.append("dynamic filtering draws refill prompts from the same prompt file: the job can end "
                        f"before {steps} steps when many groups are filtered out")
    if recipe.drop_zero_variance_groups and not recipe.dynamic_filtering:
        warnings.append("drop_zero_variance_groups: mapped to OpenRLHF dynamic filtering on the correctness score "
                        f"with range {list(recipe.dynamic_filtering_range)} (drops all-wrong / all-right groups)")
    # Ray Jobs: relative paths inside the uploaded working_dir (OpenRLHF's actors inherit it; Ray merges the
    # job's runtime_env with the one train_ppo_ray passes to ray.init). Local: absolute paths, since the
    # local Ray cluster train_ppo_ray starts does not move its workers into the job folder.
    arg = {k: (v if cluster.ray_address else str(job_dir / v)) for k, v in files.items()}
    lora = recipe.model.lora
    n_gpus = cluster.num_nodes * cluster.num_gpus_per_node
    opts: dict[str, Any] = {
        "pretrain": model, "remote_rm_url": arg["reward"], "prompt_data": arg["train"],
        "input_key": "prompt", "label_key": "label", "apply_chat_template": True,
        "max_samples": len(order), "num_episodes": 1,
        "advantage_estimator": recipe.advantage_estimator, "n_samples_per_prompt": recipe.n_samples_per_prompt,
        "eps_clip_low_high": (recipe.eps_clip_low, recipe.eps_clip_high),
        "init_kl_coef": recipe.init_kl_coef, "kl_estimator": recipe.kl_estimator,
        "use_kl_loss": recipe.use_kl_loss and recipe.kl_enabled,
        "loss_agg_mode": recipe.loss_agg_mode if has_agg else None,
        "max_epochs": recipe.max_epochs, "actor_learning_rate": recipe.actor_learning_rate,
        "lr_warmup_ratio": recipe.lr_warmup_ratio, "l2": recipe.l2, "max_norm": recipe.max_norm,
        "micro_train_batch_size": recipe.micro_train_batch_size,
        "micro_rollout_batch_size": recipe.micro_train_batch_size,
        "train_batch_size": recipe.rollout_batch_size * recipe.n_samples_per_prompt,
        "rollout_batch_size": recipe.rollout_batch_size, "temperature": recipe.temperature, "top_p": recipe.top_p,
        "max_new_tokens": recipe.generate_max_len, "max_len": recipe.prompt_max_len + recipe.generate_max_len,
        "dynamic_filtering": dyn, "dynamic_filtering_range": recipe.dynamic_filtering_range if dyn else None,
        "entropy_coef": 0,  # 0 = log the entropy without an entropy bonus
        "seed": recipe.seed,
        "actor_num_nodes": cluster.num_nodes, "actor_num_gpus_per_node": cluster.num_gpus_per_node,
        "ref_num_nodes": cluster.num_nodes, "ref_num_gpus_per_node": cluster.num_gpus_per_node,
        "vllm_num_engines": cluster.vllm_num_engines or None,
        "vllm_tensor_parallel_size": cluster.vllm_tensor_parallel_size if cluster.vllm_num_engines else None,
        "vllm_gpu_memory_utilization": cluster.vllm_gpu_memory_utilization if cluster.vllm_num_engines else None,
        "colocate_all_models": cluster.colocate_all_models,
        "vllm_enable_sleep": cluster.colocate_all_models and cluster.vllm_num_engines > 0,
        "deepspeed_enable_sleep": cluster.colocate_all_models,
        "zero_stage": cluster.zero_stage, "param_dtype": "bf16", "attn_implementation": cluster.attn_implementation,
        "gradient_checkpointing": recipe.model.gradient_checkpointing,
        "lora_rank": lora.r if lora.enabled else None, "lora_alpha": lora.alpha if lora.enabled else None,
        "lora_dropout": lora.dropout if lora.enabled else None,
        "target_modules": lora.target_modules if lora.enabled else None,
        "save_path": str(out_dir / "final"), "ckpt_path": str(out_dir / "ckpt"), "save_steps": steps,
        "save_hf_ckpt": True, "logging_steps": 1, "tensorboard_dir": str(out_dir / "tensorboard"),
        "run_name": version_id,
        "eval_dataset": arg["heldout"], "eval_steps": steps, "eval_temperature": recipe.eval.temperature,
        "eval_n_samples_per_prompt": recipe.eval.k,
    }
    engines = cluster.vllm_num_engines * cluster.vllm_tensor_parallel_size
    if cluster.colocate_all_models and cluster.vllm_num_engines and engines != n_gpus:
        raise OpenRLHFError(f"cluster: colocated vLLM needs vllm_num_engines x vllm_tensor_parallel_size = {engines} "
                            f"to equal the actor's {n_gpus} GPUs; set vllm_num_engines={n_gpus // cluster.vllm_tensor_parallel_size}")
    if recipe.n_samples_per_prompt * recipe.rollout_batch_size // recipe.micro_train_batch_size < n_gpus:
        raise OpenRLHFError(f"rollout_batch_size x n_samples_per_prompt / micro_train_batch_size < {n_gpus} GPUs: "
                            "OpenRLHF needs at least one micro-batch per actor GPU; raise rollout_batch_size")
    argv = [cluster.python, "-m", "openrlhf.cli.train_ppo_ray", *_args(opts, scheme, version), *cluster.extra_args]
    env = {"TOKENIZERS_PARALLELISM": "false", "EVOTRAINER_VERSION_ID": version_id, **cluster.env}
    # Ray uploads working_dir (the inputs); outputs of earlier runs in it stay behind
    runtime_env = {"working_dir": str(job_dir), "env_vars": env,
                   "excludes": ["ckpt/", "final/", "tensorboard/", "job.log", "exit_code", "pid", "cancelled"]}
    if cluster.ray_address and not cluster.output_dir:
        warnings.append(f"cluster.output_dir unset: checkpoints and TensorBoard go to {out_dir} on the Ray nodes; "
                        "set a shared filesystem path so EvoTrainer can ingest them")
    return OpenRLHFJob(version_id=version_id, openrlhf_version=version, scheme=scheme, steps=steps, argv=argv,
                       env=env, runtime_env=runtime_env, job_dir=str(job_dir),
                       files={k: str(job_dir / v) for k, v in files.items()},
                       tensorboard_dir=str(out_dir / "tensorboard" / version_id), run_name=version_id,
                       save_path=str(out_dir / "final"), ray_address=cluster.ray_address, warnings=warnings)


def format_job(job: OpenRLHFJob) -> str:
    """The job as a user reads it: command (one flag per line), working dir, env, runtime_env, warnings."""
    lines = [f"# OpenRLHF {job.openrlhf_version} ({job.scheme} flags), version {job.version_id}, {job.steps} steps",
             f"# submit: {'Ray Jobs API at ' + job.ray_address if job.ray_address else 'local subprocess'}",
             f"cd {shlex.quote(job.job_dir)}"]
    parts, cur = [], shlex.join(job.argv[:3])
    for a in job.argv[3:]:
        if a.startswith("--"):
            parts.append(cur)
            cur = a
        else:
            cur += " " + shlex.quote(a)
    parts.append(cur)
    lines.append(" \\\n    ".join(parts))
    lines.append("# env: " + json.dumps(job.env, sort_keys=True))
    lines.append("# runtime_env: " + json.dumps(job.runtime_env, sort_keys=True))
    lines.append(f"# tensorboard: {job.tensorboard_dir}")
    lines.append(f"# checkpoint: {job.save_path}")
    lines += [f"# warning: {w}" for w in job.warnings]
    return "\n".join(lines)
