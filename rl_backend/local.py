"""The local GRPO backend: torch + transformers on one machine (docs/design.md §2, step 4).

One training step (CleanRL-style, top to bottom in :meth:`LocalBackend._step`):

1. draw ``rollout_batch_size`` training prompts (seeded by recipe seed and step: resumable);
2. sample ``n_samples_per_prompt`` completions each (:func:`sampling.generate`, KV cache);
3. score them (``rewards.compute_rewards``: weighted components; overlong shaping is a component);
4. filter groups (``grpo.group_filter_keep``): drop zero-variance groups, DAPO dynamic filtering with
   refill rounds (only when ``dynamic_filtering`` is on), then keep the top-p groups by reward std (RAGEN);
5. group-relative advantages (samples without a trainable token left out of the baseline);
6. ``max_epochs`` PPO epochs, each one optimiser step over the kept batch in micro-batches of
   ``micro_train_batch_size`` rows rounded to whole groups (each group's prompt runs through the
   model once; losses normalised by the whole batch's token / sequence count),
   Clip-Higher loss + β·KL (k1/k2/k3), gradient clipping at ``max_norm``. ``old_logprobs`` are the
   first epoch's log-probs, detached (the weights have not moved yet), so no extra forward pass;
   after the last epoch, the update's size: ``||dθ||/||θ||`` from the AdamW state
   (:func:`adamw_step_norms`) and KL(π_old ‖ π_new), ratio and clip statistics from one no-grad
   forward of the kept batch's first micro-batch (``grpo.update_stats``; ``policy/update_*`` metrics);
7. log metrics (evotrainer/metrics.py names), rollouts, TensorBoard scalars; every
   ``checkpoint_every`` steps save a resume checkpoint (weights + optimiser).

SWE tasks (``data.task: swe``): step 2 plays ``n_samples_per_prompt`` multi-turn episodes per
task and step 3 scores them with the episodes' outcomes; the loss trains the policy's own tokens
only, and the step logs ``tools/*`` metrics and one rollout row per episode with its turns
(``rl_backend/swe/train.py``). Evaluation plays k episodes per held-out task.

Departures: the LR is constant after linear warm-up (OpenRLHF decays it); with
``use_kl_loss=False`` the KL is subtracted from each sample's reward as ``β·Σ_t k(t)`` (sequence
level) before the advantages; zero-variance groups are dropped without refill (they carry no
group_norm gradient), refill rounds run only with dynamic filtering.
"""

from __future__ import annotations

import json
import math
import random
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evotrainer import metrics as M
from evotrainer.estimators import avg_at_k, mean_pass_at_k
from evotrainer.lineage import import_source
from evotrainer.recipe import RewardComponent
from evotrainer.rl_backend import grpo
from evotrainer.rl_backend.base import (
    AfterStepFn,
    BackendError,
    EvalResult,
    ProgressFn,
    StopFn,
    TrainResult,
    run_data,
)
from evotrainer.rl_backend.models import (
    PolicyBundle,
    configure_threads,
    load_policy,
    pick_device,
    release_memory,
    save_checkpoint,
)
from evotrainer.rl_backend.rewards import compute_rewards
from evotrainer.rl_backend.sampling import (
    RolloutBatch,
    chat_prompts,
    concat_batches,
    generate,
    packed_logprobs,
    sequence_logprobs,
)
from evotrainer.rl_backend.swe import train as swe_train
from evotrainer.rl_backend.tasks import (
    NO_RL_TEST_EVAL,
    build_messages,
    is_test_eval,
    load_splits,
    split_manifest,
)
from evotrainer.rl_backend.trackers import TrainTrackers, write_eval
from evotrainer.rollouts import make_record
from evotrainer.text_stats import distinct_n, duplicate_frac, repetition_rate

RESUME_SUFFIX = ".resume"


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process, MiB: CUDA max allocated, else peak RSS (``ru_maxrss``)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _stats(x: list[float]) -> tuple[float, float]:
    a = np.asarray(x, dtype=np.float64)
    return (float(a.mean()), float(a.std())) if a.size else (math.nan, math.nan)


# Update-size metrics of a step with no kept group: nothing was updated, the policy did not move.
NO_UPDATE = {M.POLICY_UPDATE_KL: 0.0, M.POLICY_UPDATE_KL_K1: 0.0, M.POLICY_RATIO_MAX: 1.0, M.POLICY_RATIO_MIN: 1.0,
             M.POLICY_RATIO_MEAN_ABS_DEV: 0.0, M.POLICY_UPDATE_CLIP_FRAC: 0.0, M.POLICY_UPDATE_NORM: 0.0,
             M.POLICY_UPDATE_REL_NORM: 0.0, M.POLICY_GRAD_NORM_X_LR: 0.0}


CHUNK = 1 << 16  # elements per slice when recomputing AdamW steps (bounded temporaries, L2-sized; fp32 dots this long)


def adamw_step_norms(opt: torch.optim.Optimizer) -> tuple[float, float]:
    """``(||θ_after - θ_before||, ||θ_before||)`` of the AdamW step just taken, from the optimiser state.

    No copy of the weights is kept: torch's AdamW (Loshchilov & Hutter 2019; ``torch.optim.AdamW``,
    amsgrad off) steps ``θ ← θ(1 - lr·wd) - lr·m̂/(√v̂ + eps)`` with ``m̂ = m/(1-β1^t)``,
    ``v̂ = v/(1-β2^t)``, so ``θ_before = (θ_after + lr·m̂/(√v̂+eps)) / (1 - lr·wd)`` and
    ``dθ = -lr·wd·θ_before - lr·m̂/(√v̂+eps)``, recomputed per parameter. Parameters without a
    gradient this step were not touched and are left out of both norms. L2 norms over all trainable
    parameters; (nan, nan) for another optimiser or amsgrad (tests check it against a weight copy).
    Per slice of :data:`CHUNK` elements: ``a = m/(√v̂+eps)`` and ``(1-lr·wd)·θ_before = θ_after + (lr/(1-β1^t))·a``
    (the scalar factors folded into the sums), squared norms as fp32 dot products summed in float64
    (about 1e-7 relative on SmolLM2's 134.5 M weights); ~6 elementwise passes over the weights.
    """
    if not isinstance(opt, torch.optim.AdamW):
        return math.nan, math.nan
    d2 = t2 = 0.0
    with torch.no_grad():
        for g in opt.param_groups:
            if g.get("amsgrad") or g.get("maximize"):
                return math.nan, math.nan
            lr, wd, (b1, b2), eps = float(g["lr"]), float(g["weight_decay"]), g["betas"], float(g["eps"])
            keep = 1 - lr * wd
            for p in g["params"]:
                st = opt.state.get(p)
                if p.grad is None or not st:
                    continue
                t = float(st["step"])
                bc1, bc2 = 1 - b1**t, 1 - b2**t
                for th, m, v in zip(p.detach().reshape(-1).split(CHUNK), st["exp_avg"].reshape(-1).split(CHUNK),
                                    st["exp_avg_sq"].reshape(-1).split(CHUNK), strict=True):  # bounded temporaries
                    a = v.sqrt().mul_(1 / math.sqrt(bc2)).add_(eps)  # √v̂ + eps
                    torch.div(m, a, out=a)  # m/(√v̂+eps) = (1-β1^t)·m̂/(√v̂+eps)
                    before = torch.add(th, a, alpha=lr / bc1)  # (1 - lr·wd)·θ_before
                    t2 += float(torch.dot(before, before)) / keep**2
                    if wd:
                        dv = before.mul_(lr * wd / keep).add_(a, alpha=lr / bc1)  # -dθ
                        d2 += float(torch.dot(dv, dv))
                    else:
                        d2 += float(torch.dot(a, a)) * (lr / bc1) ** 2
    return math.sqrt(d2), math.sqrt(t2)


def make_optimizer(bundle: PolicyBundle, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """The trainer's AdamW (betas 0.9, 0.95) over the trainable parameters; torch's fused kernel on CPU and CUDA
    (one pass over the weights per step instead of the per-tensor loop's several: ~0.09 vs ~0.6 CPU-s for
    SmolLM2's 134.5 M weights, 1 thread). Same update up to float rounding (~1 ulp of a weight per step), same
    state dict (resume checkpoints load in either)."""
    fused = bundle.device.type in ("cpu", "cuda")
    return torch.optim.AdamW(bundle.trainable_parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay,
                             fused=fused or None)


def _micro_batches(recipe: Any, n_rows: int) -> list[slice]:
    """Row slices of at most ``micro_train_batch_size`` rows, whole GRPO groups each (at least one group),
    so the rows of a slice share prompt forwards (``sequence_logprobs(group_size=G)``)."""
    G = recipe.n_samples_per_prompt
    mb = max(G, recipe.micro_train_batch_size // G * G)
    return [slice(i, min(n_rows, i + mb)) for i in range(0, n_rows, mb)]


PIECE_OVERHEAD_TOKENS = 32  # per-forward cost of a piece in token-equivalents (call overhead; measured below)


@dataclass(frozen=True)
class Piece:
    """The rows of one forward (and backward) in :meth:`LocalBackend._update`.

    Attributes:
        chunk: index of the micro-batch (:func:`_micro_batches`) the rows belong to.
        rows: (n,) long row indices into the kept batch.
        width: completion columns kept (``<= T``): every kept row's last attended or trained token lies before it.
        start: first prompt column kept (the columns before it are left padding in all ``rows``).
        group_size: rows sharing one prompt forward (``sequence_logprobs(group_size=...)``).
        packed: the rows run as one packed sequence (``sampling.packed_logprobs``): the prompt's real tokens
            once, then each row's completion up to its extent, block-diagonal causal mask.
        extents: with ``packed``, (n,) completion tokens scored per row (its last attended or trained token + 1).
    """

    chunk: int
    rows: torch.Tensor
    width: int
    start: int
    group_size: int
    packed: bool = False
    extents: tuple[int, ...] = ()


def _split_sorted(lengths: list[int], overhead: float) -> list[int]:
    """Cut points of ascending ``lengths`` into runs minimising ``Σ_run (rows x longest + overhead)``.

    Exact dynamic programme over the n(n+1)/2 runs of the sorted list (optimal: an optimal partition
    into padded batches never interleaves lengths). Returns the run ends, e.g. ``[3, 8]``.
    """
    return _best_cuts(len(lengths), lambda i, j: (j - i) * lengths[j - 1] + overhead)


def _split_packed(lengths: list[int], prompt: int, attn_cost: float, overhead: float) -> list[int]:
    """Cut points of ascending ``lengths`` into packed runs minimising ``Σ_run (L + attn_cost·L² + overhead)``,
    ``L = prompt + Σ_run (length - 1)`` the run's packed length (:func:`sampling.packed_logprobs`).

    Exact dynamic programme over the contiguous runs of the sorted list (as :func:`_split_sorted`; for this
    cost, contiguous runs of the sorted order are a heuristic restriction, not a proven optimum).
    """
    pre = [0]
    for x in lengths:
        pre.append(pre[-1] + x - 1)

    def cost(i: int, j: int) -> float:
        L = prompt + pre[j] - pre[i]
        return L + attn_cost * L * L + overhead

    return _best_cuts(len(lengths), cost)


def _best_cuts(n: int, cost: Callable[[int, int], float]) -> list[int]:
    """Run ends ``[e1, ..., n]`` of the partition of ``0..n`` into contiguous runs ``[i, j)`` minimising
    ``Σ cost(i, j)``: the O(n²) dynamic programme ``best[j] = min_i best[i] + cost(i, j)``; ties keep the
    earliest cut."""
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            c = best[i] + cost(i, j)
            if c < best[j]:
                best[j], cut[j] = c, i
    ends, j = [], n
    while j > 0:
        ends.append(j)
        j = cut[j]
    return ends[::-1]


def pack_attention_cost(model: Any) -> float | None:
    """Cost of one (query, key) pair of a packed forward, in token-equivalents (one token through every linear
    layer = 1); None when the model's attention does not take a custom 4D mask (no packing).

    Per layer, attention costs ``4·hidden`` FLOP per (query, key) pair forward (``QKᵀ`` and ``AV``) against
    ``2N`` per token for the weights (N parameters); CPU SDPA with a dense mask ran at about half the matmul
    rate (SmolLM2-135M, L = 324, 1 thread: 15 ms per layer forward + backward), hence ``4·hidden·layers / N``.
    """
    cfg = getattr(model, "config", None)
    if getattr(cfg, "_attn_implementation", None) not in ("sdpa", "eager"):
        return None
    hidden, layers = getattr(cfg, "hidden_size", None), getattr(cfg, "num_hidden_layers", None)
    if not hidden or not layers:
        return None
    n = sum(p.numel() for p in model.parameters())
    return 4.0 * hidden * layers / max(1, n)


def _pieces(recipe: Any, rb: RolloutBatch, trim: bool = True, pack_cost: float | None = None) -> list[Piece]:
    """The forwards of one pass over the kept batch ``rb``.

    Without ``trim`` (the plain path): one piece per micro-batch, all its rows, the whole padded width.
    With ``trim``: each GRPO group of each micro-batch is split by completion length into runs that are
    padded only to their own longest row (:func:`_split_sorted`, cost = padded tokens + the prompt's real
    tokens + :data:`PIECE_OVERHEAD_TOKENS` per forward), with the left padding all rows share dropped.
    One micro-batch of 16 rows of the SmolLM2 benchmark (lengths 6..64, mean 35) spends 41% of its
    forward and backward on padding after EOS (docs/performance.md §3); causal attention means tokens
    after a row's last real one never change its log-probs, so the values are the plain path's (up to
    float summation order) and, the loss being a sum with the whole batch's denominators, so are the
    gradients (tests/test_grpo_fast_paths.py).

    With ``trim`` and ``pack_cost`` (:func:`pack_attention_cost`): each group is instead cut into packed runs
    (:func:`_split_packed`: cost = packed length + ``pack_cost``·length² + :data:`PIECE_OVERHEAD_TOKENS`), each
    run one sequence of real tokens only (``sampling.packed_logprobs``); a group whose rows do not share one
    prompt, or whose prompt has no real token, falls back to the padded runs.
    """
    G = recipe.n_samples_per_prompt
    chunks = _micro_batches(recipe, rb.size)
    T, P = rb.completion_ids.shape[1], rb.prompt_ids.shape[1]
    if not trim:
        return [Piece(ci, torch.arange(s.start, s.stop), T, 0, G) for ci, s in enumerate(chunks)]
    used = rb.attention_mask.bool() | rb.completion_mask.bool()  # (B, T)
    extent = (used.long() * torch.arange(1, T + 1)).amax(-1).clamp(min=1).tolist() if T else [1] * rb.size
    real_prompt = rb.prompt_mask.bool()
    out: list[Piece] = []
    for ci, s in enumerate(chunks):
        for g0 in range(s.start, s.stop, G):
            rows = sorted(range(g0, min(s.stop, g0 + G)), key=lambda r: extent[r])
            n_prompt = int(real_prompt[rows[0]].sum())
            if pack_cost is not None and n_prompt > 0 and all(
                    torch.equal(rb.prompt_ids[r], rb.prompt_ids[rows[0]])
                    and torch.equal(rb.prompt_mask[r], rb.prompt_mask[rows[0]]) for r in rows):
                lo = 0
                for hi in _split_packed([min(T, extent[r]) for r in rows], n_prompt, pack_cost, PIECE_OVERHEAD_TOKENS):
                    run = rows[lo:hi]
                    ext = tuple(min(T, extent[r]) for r in run)
                    out.append(Piece(ci, torch.tensor(run, dtype=torch.long), max(ext), 0, len(run), True, ext))
                    lo = hi
                continue
            cols = real_prompt[rows].any(0).nonzero()
            start = int(cols[0]) if cols.numel() else P
            lo = 0
            for hi in _split_sorted([extent[r] for r in rows], (P - start) + PIECE_OVERHEAD_TOKENS):
                run = rows[lo:hi]
                out.append(Piece(ci, torch.tensor(run, dtype=torch.long), min(T, extent[run[-1]]), start, len(run)))
                lo = hi
    return out


def _piece_logprobs(model: Any, rb: RolloutBatch, recipe: Any, pc: Piece,
                    entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sequence_logprobs`` (``packed_logprobs`` for a packed piece) of piece ``pc`` of ``rb``: log-probs
    (n, width) and, with ``entropy``, entropy."""
    r, w = pc.rows, pc.width
    if pc.packed:
        r0 = int(r[0])
        return packed_logprobs(model, rb.prompt_ids[r0][rb.prompt_mask[r0].bool()], rb.completion_ids[r, :w],
                               rb.attention_mask[r, :w], list(pc.extents), temperature=recipe.temperature,
                               with_entropy=entropy)
    return sequence_logprobs(model, rb.prompt_ids[r, pc.start:], rb.prompt_mask[r, pc.start:],
                             rb.completion_ids[r, :w], rb.completion_mask[r, :w], temperature=recipe.temperature,
                             with_entropy=entropy, completion_attention_mask=rb.attention_mask[r, :w],
                             group_size=pc.group_size)


def _scatter(pieces: list[Piece], values: list[torch.Tensor], shape: tuple[int, int]) -> torch.Tensor:
    """The per-piece (n, width) tensors put back into one (B, T) tensor (0 outside the pieces)."""
    full = torch.zeros(shape, dtype=values[0].dtype if values else torch.float32)
    for pc, v in zip(pieces, values, strict=True):
        full[pc.rows, : pc.width] = v.detach().to(full.device)
    return full


class LocalBackend:
    """Embedded GRPO trainer and evaluator (the ``local`` backend of docs/interfaces.md).

    Args:
        device: ``cpu`` / ``cuda`` (default: CUDA when available).
        checkpoint_every: save a resume checkpoint (weights + AdamW state) every this many steps.
        eval_batch_prompts: held-out prompts per ``generate`` call at evaluation.
        num_threads: torch CPU threads (default: :func:`models.configure_threads`'s choice, made
            at each train / evaluate call).
        trim_padding: run the update's forwards and backwards on length-sorted pieces of each group, each
            padded to its own longest row (:func:`_pieces`); False runs one forward per micro-batch padded
            to the batch's longest row (the plain path; same values and gradients, slower).
        pack_completions: with ``trim_padding``, run each group's completions packed behind one copy of their
            prompt (real tokens only, block-diagonal causal mask; :func:`_pieces`) when the model's attention
            takes a 4D mask (:func:`pack_attention_cost`); False keeps the padded length-sorted runs.
    """

    name = "local"

    def __init__(self, device: str | None = None, checkpoint_every: int = 4, eval_batch_prompts: int = 8,
                 num_threads: int | None = None, trim_padding: bool = True, pack_completions: bool = True):
        self.device = pick_device(device)
        self.trim_padding = trim_padding
        self.pack_completions = pack_completions
        self.checkpoint_every = max(1, checkpoint_every)
        self.eval_batch_prompts = eval_batch_prompts
        self.num_threads = num_threads
        _quiet_transformers()

    # --- train ---------------------------------------------------------------------------------------
    def train(self, ws: Any, version_id: str, steps: int, progress: ProgressFn | None = None,
              should_stop: StopFn | None = None, after_step: AfterStepFn | None = None) -> TrainResult:
        """Train ``version_id`` until it has ``steps`` steps (resuming a partly trained version).

        Starts from the parent's checkpoint (the base model for the root). Sets status training,
        then trained (failed on error, re-raised). Writes per-step metrics, rollouts (split
        ``train``), scalars, hparams and text samples to the run's ``report_to`` trackers (rl_backend.trackers; TensorBoard
        under ``ws.root/tb/<version>`` by default), the checkpoint in
        ``ws.checkpoint_dir(version)`` and ``metrics_summary`` (mean of each metric over the steps,
        plus ``steps`` and ``data_split`` digest).

        ``after_step(steps_done)`` (``rl_backend.base.AfterStepFn``) runs after each step is stored; when it returns
        a dict, training stops there (checkpoint and summary at that step, ``stopped_early``, the dict as
        ``TrainResult.early_stop``).

        Raises:
            BackendError: steps < 1, or the parent has no checkpoint.
        """
        if steps < 1:
            raise BackendError(f"steps={steps}: train at least 1 step")
        v = ws.lineage.get(version_id)
        start_ckpt = self._parent_checkpoint(ws, v)
        if start_ckpt is None and not (v.checkpoint and Path(v.checkpoint).is_dir()):
            _refuse_imported(ws, version_id, "train")
        if v.parent_id and (why := ws.lineage.damaged(v.parent_id)):
            start = ws.lineage.start_version(version_id)
            ws.log(f"{version_id} starts from {start.id if start else 'the base model'}: parent {v.parent_id} was "
                   f"pruned for {why}, its weights are no start point", version=version_id, source="local")
        ws.lineage.update_version(version_id, status="training")
        ws.log(f"training {version_id} for {steps} steps (local backend, {self.device})", version=version_id,
               source="local")
        try:
            return self._train(ws, v, steps, start_ckpt, progress, should_stop, after_step)
        except BaseException as exc:
            ws.lineage.update_version(version_id, status="failed")
            ws.log(f"training {version_id} failed: {type(exc).__name__}: {exc}", level="error", version=version_id,
                   source="local")
            raise
        finally:
            release_memory()  # the policy, reference and AdamW state of _train are garbage now

    def _parent_checkpoint(self, ws: Any, v: Any) -> str | None:
        """The checkpoint ``v`` starts from: ``ws.lineage.start_version`` (its parent's, or an earlier
        one when the parent's weights are damaged); None for the base model.

        Raises:
            BackendError: that version has no checkpoint on disk (train it first).
        """
        start = ws.lineage.start_version(v.id)
        if start is None:
            return None
        if not start.checkpoint or not Path(start.checkpoint).is_dir():
            role = "parent" if start.id == v.parent_id else "start point"
            raise BackendError(f"{role} {start.id} of {v.id} has no checkpoint (status {start.status}); "
                               f"train {start.id} first")
        return start.checkpoint

    def _train(self, ws: Any, v: Any, steps: int, start_ckpt: str | None, progress: ProgressFn | None,
               should_stop: StopFn | None, after_step: AfterStepFn | None = None) -> TrainResult:
        t_call = time.time()
        configure_threads(self.num_threads)
        recipe, vid = v.recipe, v.id
        resume_dir = ws.root / "checkpoints" / f"{vid}{RESUME_SUFFIX}"
        first_step, load_from, optim_state = 0, start_ckpt, None
        if (resume_dir / "optimizer.pt").exists():
            meta = json.loads((resume_dir / "evotrainer_checkpoint.json").read_text())
            first_step, load_from = int(meta["step"]) + 1, str(resume_dir)
            optim_state = torch.load(resume_dir / "optimizer.pt", map_location="cpu", weights_only=True)
        elif v.checkpoint and Path(v.checkpoint).is_dir() and ws.lineage.last_step(vid) >= 0:
            first_step, load_from = ws.lineage.last_step(vid) + 1, v.checkpoint  # a trained version, continued
        resumed = first_step - 1 if first_step > 0 else None
        # train rollouts after the resume point are stale: a killed attempt's steps are redone (from step 0
        # when it died before its first resume checkpoint)
        _drop_rollouts_after(ws, vid, first_step - 1)
        if resumed is not None:
            ws.log(f"resuming {vid} after step {resumed}", version=vid, source="local")
        pinned = run_data(ws)
        train_set = load_splits(recipe.data, pinned=pinned).train
        kl_on = recipe.kl_enabled
        bundle = load_policy(recipe.model, checkpoint=load_from, kl=kl_on, device=self.device)
        bundle.model.train()
        opt = make_optimizer(bundle, recipe.actor_learning_rate, recipe.l2)
        if optim_state is not None:
            opt.load_state_dict(optim_state)
        tb = TrainTrackers(ws, vid, recipe)  # report_to: scalars at the lineage-global step, hparams, text samples
        stopped, early = False, None
        step = first_step - 1
        try:
            for step in range(first_step, steps):
                if should_stop is not None and should_stop():
                    stopped, step = True, step - 1
                    break
                t0, cpu0 = time.time(), time.process_time()
                lr = recipe.actor_learning_rate * min(1.0, (step + 1) / max(1.0, recipe.lr_warmup_ratio * steps))
                for g in opt.param_groups:
                    g["lr"] = lr
                metrics, records = self._step(bundle, opt, recipe, train_set, vid, step)
                metrics[M.POLICY_LR] = lr
                metrics[M.PERF_STEP_SECONDS] = time.time() - t0
                metrics[M.PERF_STEP_CPU_SECONDS] = time.process_time() - cpu0
                metrics[M.PERF_TOKENS_PER_SEC] = metrics.pop("_gen_tokens") / max(1e-9, metrics[M.PERF_STEP_SECONDS])
                metrics[M.PERF_PEAK_MEMORY_MB] = peak_memory_mb(self.device)
                if (step + 1) % self.checkpoint_every == 0 and step + 1 < steps:
                    save_checkpoint(bundle, resume_dir, recipe.model.name_or_path, {"step": step, "version": vid},
                                    optimizer=opt)
                ws.rollouts.add(records)
                ws.lineage.log_metrics(vid, step, metrics)
                tb.step(step, metrics, records)
                if progress is not None:
                    progress({"step": step + 1, "steps": steps, "reward": metrics[M.REWARD_MEAN],
                              "tokens_per_sec": metrics[M.PERF_TOKENS_PER_SEC],
                              "step_seconds": metrics[M.PERF_STEP_SECONDS], "loss": metrics[M.LOSS_TOTAL]})
                if after_step is not None and step + 1 < steps and (early := after_step(step + 1)) is not None:
                    stopped = True
                    ws.log(f"{vid} stopped early after step {step + 1} of {steps}: "
                           f"{str(early.get('reason', early))[:300]}", version=vid, source="local")
                    break
        finally:
            tb.close()
        if step < 0:  # stopped before its first step: nothing was trained, so nothing is saved or marked trained
            # (review 14 D-R14: a job cancelled at step 0 of 100,000 left the version 'trained' with a checkpoint of
            # the base weights and 0 steps, which list_versions and the gate then took for a trained version)
            shutil.rmtree(resume_dir, ignore_errors=True)
            ws.lineage.update_version(vid, status=v.status)
            ws.log(f"{vid}: stopped before its first step; nothing trained (status {v.status})", version=vid,
                   source="local")
            return TrainResult(version_id=vid, steps_done=0, steps_requested=steps, stopped_early=True,
                               wall_s=time.time() - t_call)
        ckpt = save_checkpoint(bundle, ws.checkpoint_dir(vid), recipe.model.name_or_path,
                               {"version": vid, "steps": step + 1})
        shutil.rmtree(resume_dir, ignore_errors=True)
        summary: dict[str, Any] = {name: float(np.nanmean([x for _, x in series if x is not None] or [math.nan]))
                                   for name, series in ws.lineage.all_metrics(vid).items()}
        summary.update(steps=step + 1, data_split=split_manifest(*load_splits(recipe.data, pinned=pinned))["digest"])
        ws.lineage.update_version(vid, status="trained", checkpoint=str(ckpt), metrics_summary=summary)
        ws.log(f"trained {vid}: {step + 1} steps, reward/mean {summary.get(M.REWARD_MEAN, math.nan):.3f}",
               version=vid, source="local")
        return TrainResult(version_id=vid, steps_done=step + 1, steps_requested=steps, checkpoint=str(ckpt),
                           metrics_summary=summary, resumed_from_step=resumed, stopped_early=stopped, early_stop=early,
                           wall_s=time.time() - t_call)

    # --- one GRPO step -------------------------------------------------------------------------------
    def _pieces(self, bundle: PolicyBundle, recipe: Any, rb: RolloutBatch) -> list[Piece]:
        """The forwards of one pass over ``rb`` under this backend's settings (:func:`_pieces`)."""
        pack = pack_attention_cost(bundle.model) if self.trim_padding and self.pack_completions else None
        return _pieces(recipe, rb, self.trim_padding, pack)

    def _rollout(self, bundle: PolicyBundle, recipe: Any, problems: list[Any], seed: int
                 ) -> tuple[RolloutBatch, Any, list[Any]]:
        """(batch, rewards, SWE episodes): single completions, or multi-turn episodes for ``data.task: swe``."""
        if recipe.data.task == "swe":
            return swe_train.rollout(bundle, recipe, problems, seed=seed)

        prompts = chat_prompts(bundle.tokenizer, [build_messages(p, recipe.data) for p in problems])
        rb = generate(bundle.model, bundle.tokenizer, prompts, recipe.n_samples_per_prompt,
                      max_new_tokens=recipe.generate_max_len, temperature=recipe.temperature, top_p=recipe.top_p,
                      prompt_max_len=recipe.prompt_max_len, seed=seed, device=self.device)
        rw = compute_rewards(recipe.reward, problems, rb.completions, finish_reasons=rb.finish_reasons,
                             lengths=rb.lengths, generate_max_len=recipe.generate_max_len)
        return rb, rw, []

    def _step(self, bundle: PolicyBundle, opt: torch.optim.Optimizer, recipe: Any, train_set: list[Any],
              vid: str, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        G, bs = recipe.n_samples_per_prompt, recipe.rollout_batch_size
        rng = random.Random(f"{recipe.seed}-{step}")
        order = rng.sample(range(len(train_set)), len(train_set))
        cursor = 0

        def draw(k: int) -> list[Any]:
            nonlocal cursor
            out = [train_set[order[(cursor + i) % len(order)]] for i in range(k)]
            cursor += k
            return out

        batches, problems, rewards, correct = [], [], [], []
        comps: dict[str, list[float]] = {}
        episodes: list[Any] = []  # SWE episodes, in row order (empty for single completions)
        n_kept, rnd = 0, 0
        while True:  # first round, then DAPO refill rounds while dynamic filtering leaves the batch short
            probs = draw(bs if rnd == 0 else bs - n_kept)
            rb, rw, eps = self._rollout(bundle, recipe, probs, seed=recipe.seed * 100003 + step * 101 + rnd)
            batches.append(rb)
            episodes += eps
            problems += probs
            rewards += rw.total
            correct += rw.correct
            for name, vals in rw.components.items():
                comps.setdefault(name, []).extend(vals)
            keep = grpo.group_filter_keep(torch.tensor(rw.total), G, **_filters(recipe), group_filter_top_p=1.0)
            n_kept += int(keep.sum())
            rnd += 1
            if not recipe.dynamic_filtering or n_kept >= bs or rnd > recipe.max_refill_rounds:
                break
        rb = concat_batches(batches, bundle.tokenizer.pad_token_id)
        r_all = torch.tensor(rewards, dtype=torch.float64)
        n_groups = len(problems)
        zero_var = grpo.zero_variance_groups(r_all, G)
        keep = grpo.group_filter_keep(r_all, G, **_filters(recipe), group_filter_top_p=recipe.group_filter_top_p)
        rows = [g * G + j for g in keep.nonzero().squeeze(-1).tolist() for j in range(G)]
        train_stats = self._update(bundle, opt, recipe, rb.select(rows), r_all[rows]) if rows else {}
        # the gradients are not read again before the next update's zero_grad: freed now, they are not held under
        # the next step's rollouts and reference forward (docs/performance.md §11)
        opt.zero_grad(set_to_none=True)
        adv_all = torch.zeros(len(rewards))
        if rows:
            adv_all[rows] = train_stats.pop("_advantages")
        mean_r, std_r = _stats(rewards)
        lengths = np.asarray(rb.lengths, dtype=np.float64)
        m: dict[str, float] = {
            M.REWARD_MEAN: mean_r, M.REWARD_STD: std_r, M.CORRECT_MEAN: float(np.nanmean(correct)),
            M.REWARD_FRAC_ZERO_STD: float(zero_var.double().mean()), M.REWARD_KEPT_GROUP_FRAC: len(rows) / G / n_groups,
            M.COMPLETIONS_MEAN_LENGTH: float(lengths.mean()), M.COMPLETIONS_P95_LENGTH: float(np.percentile(lengths, 95)),
            M.COMPLETIONS_MAX_LENGTH: float(lengths.max()),
            M.COMPLETIONS_CLIPPED_RATIO: float(np.mean([f == "length" for f in rb.finish_reasons])),
            M.COMPLETIONS_DISTINCT_2: distinct_n(rb.completions, 2), M.COMPLETIONS_REPETITION: repetition_rate(rb.completions),
            M.COMPLETIONS_DUPLICATE_FRAC: duplicate_frac(rb.completions, [p.id for p in problems for _ in range(G)]),
            M.REWARD_MIN: float(min(rewards)), M.REWARD_MAX: float(max(rewards)),
            "_gen_tokens": float(lengths.sum()),
        }
        solved = np.nan_to_num(np.asarray(correct, dtype=np.float64)).reshape(n_groups, G) > 0.5  # (groups, G)
        m[M.REWARD_FRAC_SOLVE_NONE] = float((~solved.any(axis=1)).mean())
        m[M.REWARD_FRAC_SOLVE_ALL] = float(solved.all(axis=1).mean())
        for name, vals in comps.items():
            m[M.reward_component(name, "mean")], m[M.reward_component(name, "std")] = _stats(vals)
        m.update(train_stats or {M.LOSS_POLICY: 0.0, M.LOSS_KL: 0.0, M.LOSS_TOTAL: 0.0, M.POLICY_GRAD_NORM: 0.0,
                                 **NO_UPDATE, **self._measure(bundle, recipe, rb)})
        kept_rows = set(rows)
        if episodes:  # SWE: tools/* metrics, one row per episode with its turns
            m.update(swe_train.step_metrics(episodes))
            return m, swe_train.step_records(episodes, version_id=vid, step=step, group_size=G, rewards=rewards,
                                             components=comps, advantages=adv_all.tolist(), kept=kept_rows)
        records = [
            make_record(version_id=vid, step=step, prompt_id=problems[i // G].id, group_id=f"g{i // G}",
                        sample_idx=i % G, prompt=problems[i // G].prompt, completion=rb.completions[i],
                        reward=rewards[i], components={k: v[i] for k, v in comps.items()},
                        answer=problems[i // G].answer, correct=correct[i], advantage=float(adv_all[i]),
                        length=rb.lengths[i], finish_reason=rb.finish_reasons[i], kept=i in kept_rows, split="train",
                        turns=rb.turns[i] if rb.turns else None)
            for i in range(len(rewards))]
        return m, records

    def _update(self, bundle: PolicyBundle, opt: torch.optim.Optimizer, recipe: Any, rb: RolloutBatch,
                rewards: torch.Tensor) -> dict[str, Any]:
        """PPO epochs over the kept batch; returns the step's loss / policy metrics."""
        beta = recipe.init_kl_coef
        mask = rb.completion_mask
        ntok = float(mask.sum().clamp(min=1))
        nseq = float((mask.sum(-1) > 0).sum().clamp(min=1))
        pieces = self._pieces(bundle, recipe, rb)

        def fwd(model: Any, pc: Piece, entropy: bool = False):
            return _piece_logprobs(model, rb, recipe, pc, entropy)

        ref_lp: list[torch.Tensor] = []
        if bundle.kl:  # the reference forward only when KL is on (no reference model is loaded otherwise)
            with torch.no_grad(), bundle.reference() as ref:
                ref_lp = [fwd(ref, pc)[0].cpu() for pc in pieces]
        adv = self._advantages(recipe, rewards, mask, _scatter(pieces, ref_lp, tuple(mask.shape)) if ref_lp else None,
                               rb.sampling_logprobs)
        # Old log-probs: on-policy, the weights have not moved before epoch 0's optimiser step, so π_old is the
        # policy of epoch 0's own forward; its log-probs, detached, are old_logprobs for every epoch (no separate
        # no-grad forward; ratio exactly 1 in epoch 0, tests/test_grpo_fast_paths.py checks loss and gradients
        # against an explicit old-log-prob forward).
        old_lp: list[torch.Tensor] = []
        ent_sum = kl_sum = 0.0
        ratio_max = ratio_min = 1.0  # epoch 0's ratio is exactly 1 (old_logprobs are its own log-probs)
        upd_norm, theta_norm = 0.0, math.nan
        for epoch in range(recipe.max_epochs):
            opt.zero_grad(set_to_none=True)
            stats = dict.fromkeys(("pol", "kl_loss", "low", "high"), 0.0)
            for ci, pc in enumerate(pieces):
                lp, ent = fwd(bundle.model, pc, entropy=epoch == 0)
                lp_cpu_mask = mask[pc.rows, : pc.width].to(lp.device)
                if epoch == 0:
                    old_lp.append(lp.detach())
                    ent_sum += float((ent * lp_cpu_mask).sum())
                out = grpo.policy_loss(lp, old_lp[ci], adv[pc.rows].to(lp.device), lp_cpu_mask, recipe.eps_clip_low,
                                       recipe.eps_clip_high, recipe.loss_agg_mode, num_tokens=ntok, num_seqs=nseq)
                loss = out.loss
                if epoch > 0 and (r := out.ratio[lp_cpu_mask.bool()]).numel():
                    ratio_max, ratio_min = max(ratio_max, float(r.max())), min(ratio_min, float(r.min()))
                if bundle.kl:
                    kl = grpo.kl_penalty(lp, ref_lp[ci].to(lp.device), recipe.kl_estimator)
                    if epoch == 0:
                        kl_sum += float((kl.detach() * lp_cpu_mask).sum())
                    if recipe.use_kl_loss:
                        kl_loss = beta * grpo.aggregate_loss(kl, lp_cpu_mask, recipe.loss_agg_mode, ntok, nseq)
                        loss = loss + kl_loss
                        stats["kl_loss"] += float(kl_loss.detach())
                loss.backward()
                frac = float(lp_cpu_mask.sum()) / ntok
                stats["pol"] += float(out.loss.detach())
                stats["low"] += float(out.clip_ratio_low) * frac
                stats["high"] += float(out.clip_ratio_high) * frac
            grad_norm = float(torch.nn.utils.clip_grad_norm_(bundle.trainable_parameters(), recipe.max_norm))
            opt.step()
            step_norm, before_norm = adamw_step_norms(opt)
            upd_norm += step_norm  # several epochs: the sum of their norms, an upper bound of the step's ||dθ||
            theta_norm = before_norm if epoch == 0 else theta_norm
        # The updated policy on the update's own tokens: how far did it move? One extra no-grad forward of
        # the first micro-batch only (whole groups, at most micro_train_batch_size rows): a sample of the kept
        # batch, not the batch. Its pieces are the update's (packed or trimmed), so it costs that micro-batch's
        # real tokens. Kept at the micro-batch (not one group) so the progress analyzers' update-size series
        # (harness/analyzers/progress.py) keep their sample size and meaning.
        us = grpo.UpdateStats(0.0, 0.0, 0.0, 0.0, -math.inf, math.inf, 0.0)
        old_full = _scatter(pieces, old_lp, tuple(mask.shape))
        with torch.no_grad():
            for pc in (pc for pc in pieces if pc.chunk == 0):
                lp, _ = fwd(bundle.model, pc)
                us = us + grpo.update_stats(lp, old_full[pc.rows, : pc.width].to(lp.device),
                                            adv[pc.rows].to(lp.device), mask[pc.rows, : pc.width].to(lp.device),
                                            recipe.eps_clip_low, recipe.eps_clip_high)
        if us.n_tokens == 0:
            us = grpo.UpdateStats(us.kl_k3_sum, us.kl_k1_sum, us.abs_dev_sum, us.clip_sum, 1.0, 1.0, 0.0)
        n_upd = max(1.0, us.n_tokens)
        lr = float(opt.param_groups[0]["lr"])
        a = adv.double()
        return {
            M.POLICY_UPDATE_KL: us.kl_k3_sum / n_upd, M.POLICY_UPDATE_KL_K1: us.kl_k1_sum / n_upd,
            M.POLICY_RATIO_MAX: max(ratio_max, us.ratio_max), M.POLICY_RATIO_MIN: min(ratio_min, us.ratio_min),
            M.POLICY_RATIO_MEAN_ABS_DEV: us.abs_dev_sum / n_upd, M.POLICY_UPDATE_CLIP_FRAC: us.clip_sum / n_upd,
            M.POLICY_UPDATE_NORM: upd_norm,
            M.POLICY_UPDATE_REL_NORM: upd_norm / theta_norm if theta_norm > 0 else math.nan,
            M.POLICY_GRAD_NORM_X_LR: grad_norm * lr,
            M.LOSS_POLICY: stats["pol"], M.LOSS_KL: stats["kl_loss"], M.LOSS_TOTAL: stats["pol"] + stats["kl_loss"],
            M.POLICY_KL: kl_sum / ntok if bundle.kl else 0.0, M.POLICY_ENTROPY: ent_sum / ntok,
            M.POLICY_CLIP_RATIO_LOW: stats["low"], M.POLICY_CLIP_RATIO_HIGH: stats["high"],
            M.POLICY_GRAD_NORM: grad_norm, M.POLICY_ADVANTAGE_MEAN: float(a.mean()),
            M.POLICY_ADVANTAGE_STD: float(a.std()) if a.numel() > 1 else 0.0, "_advantages": adv.float().cpu(),
        }

    def _measure(self, bundle: PolicyBundle, recipe: Any, rb: RolloutBatch) -> dict[str, float]:
        """Entropy (and KL to the reference) of a step with no kept group, measured without an update.

        When every group is filtered out (zero reward variance, dynamic filtering) there is no
        training forward, yet the policy's entropy is what tells an entropy collapse (a learning
        rate so high the policy turns deterministic) from data that is too easy or too hard. The
        step's completions, all ``B`` rows of ``rb``, go through the policy (and the reference when
        KL is on) under ``torch.no_grad``; the values are token means over the completion mask,
        the same estimators as :meth:`_update` (``grpo.kl_penalty`` with ``recipe.kl_estimator``).

        Returns:
            ``{policy/entropy: nats per token}`` plus ``{policy/kl: nats per token}`` when KL is on;
            ``{}`` for a batch without completion tokens.
        """
        mask = rb.completion_mask
        ntok = float(mask.sum())
        if ntok == 0:
            return {}
        ent_sum = kl_sum = 0.0
        with torch.no_grad():
            for pc in self._pieces(bundle, recipe, rb):
                lp, ent = _piece_logprobs(bundle.model, rb, recipe, pc, entropy=True)
                msk = mask[pc.rows, : pc.width].to(lp.device)
                ent_sum += float((ent * msk).sum())
                if bundle.kl:
                    with bundle.reference() as ref:
                        ref_lp, _ = _piece_logprobs(ref, rb, recipe, pc)
                    kl_sum += float((grpo.kl_penalty(lp, ref_lp.to(lp.device), recipe.kl_estimator) * msk).sum())
        out = {M.POLICY_ENTROPY: ent_sum / ntok}
        if bundle.kl:
            out[M.POLICY_KL] = kl_sum / ntok
        return out

    def _advantages(self, recipe: Any, rewards: torch.Tensor, mask: torch.Tensor, ref_lp: torch.Tensor | None,
                    sampling_lp: torch.Tensor) -> torch.Tensor:
        r = rewards.clone()
        if ref_lp is not None and not recipe.use_kl_loss:  # KL in the reward: β Σ_t k(t) per sample
            kl = grpo.kl_penalty(sampling_lp, ref_lp, recipe.kl_estimator)
            r = r - recipe.init_kl_coef * (kl * mask).sum(-1).double()
        valid = mask.sum(-1) > 0
        return grpo.group_advantages(r, recipe.n_samples_per_prompt, recipe.advantage_estimator, valid=valid).float()

    # --- evaluate ------------------------------------------------------------------------------------
    def evaluate(self, ws: Any, version_id: str, k: int | None = None, eval_name: str = "heldout",
                 progress: ProgressFn | None = None, first_sample: int = 0) -> EvalResult:
        """k samples per dev problem of ``version_id``'s weights (its parent's / the base model's if
        untrained): Avg@k, pass@k, pass@1; per-sample outcomes into ``ws.lineage.log_eval_samples``,
        rollouts (split ``eval``, step = the version's last step), and ``eval_summary`` (for
        ``eval_name == "heldout"`` the top-level keys; every name also under ``eval_summary["by_name"]``).

        The test eval names (``base.TEST_EVALS``: ``test`` = the version's weights, ``no_rl_test`` = the
        base model) score the test split and write its outcomes to ``log_eval_samples`` only: no rollouts
        and nothing in ``eval_summary``, so no analyzer or tool that reads those sees test outcomes.

        ``first_sample`` > 0 is a top-up of a dev evaluation (the loop's sequential gate, ``recipe.eval.max_k``):
        ``k`` more samples per problem, sample indices ``first_sample .. first_sample + k - 1`` with sample seeds of
        their own (:func:`topup_seed`; the same for every version, so two versions topped up alike stay paired
        sample by sample), appended to the stored samples of indices below ``first_sample`` (those at or above it,
        left by a top-up a crash cut short, are replaced). The returned result and ``eval_summary`` score all the
        samples (``k`` = ``first_sample + k``); ``gen_tokens``, ``wall_s`` and ``cpu_s`` are the top-up's own.

        Raises:
            BackendError: ``first_sample`` > 0 on a test eval name, or where fewer than ``first_sample`` samples of
                every problem are stored (evaluate first, then top up).
        """
        v = ws.lineage.get(version_id)
        test = is_test_eval(eval_name)
        if first_sample:
            return self._top_up(ws, v, k or v.recipe.eval.k, eval_name, first_sample, progress)
        ckpt = None if eval_name == NO_RL_TEST_EVAL else self._weights_of(ws, v)
        if ckpt is None:
            _refuse_imported(ws, version_id, "evaluate")
        res, samples, records = self.evaluate_checkpoint(v.recipe, ckpt, k=k, eval_name=eval_name, progress=progress,
                                                         version_id=version_id,
                                                         step=max(0, ws.lineage.last_step(version_id)),
                                                         split="test" if test else "dev", pinned=run_data(ws))
        ws.lineage.log_eval_samples(version_id, eval_name, samples)
        if not test:
            ws.rollouts.add(records)
            summary = dict(v.eval_summary or {})
            by_name = {**summary.get("by_name", {}), eval_name: res.summary()}
            if eval_name == "heldout" or not summary:
                summary.update(res.summary())
            summary["by_name"] = by_name
            ws.lineage.update_version(version_id, eval_summary=summary)
            write_eval(ws, version_id, res.summary(), eval_name)  # eval/* scalars to report_to's trackers (never test)
        ws.log(f"evaluated {version_id} ({eval_name}): Avg@{res.k}={res.avg_at_k:.3f} pass@{res.k}={res.pass_at_k:.3f}",
               version=version_id, source="local")
        return res.model_copy(update={"version_id": version_id})

    def _weights_of(self, ws: Any, v: Any) -> str | None:
        """The checkpoint an evaluation of version ``v`` scores: its own, else its parent's (an untrained child), else
        None (the base model: an untrained root)."""
        if v.checkpoint and Path(v.checkpoint).is_dir():
            return str(v.checkpoint)
        return self._parent_checkpoint(ws, v) if v.parent_id else None

    def _top_up(self, ws: Any, v: Any, k: int, eval_name: str, first: int, progress: ProgressFn | None) -> EvalResult:
        """:meth:`evaluate` with ``first_sample`` = ``first`` > 0 (see there)."""
        if is_test_eval(eval_name):
            raise BackendError(f"first_sample={first}: eval {eval_name!r} scores the sealed test split, which is "
                               "evaluated once, never topped up; top up a dev evaluation (e.g. heldout)")
        have = {p: xs[:first] for p, xs in ws.lineage.eval_matrix(v.id, eval_name).items()}
        short = sorted(p for p, xs in have.items() if len(xs) < first)
        if not have or short:
            raise BackendError(f"first_sample={first}: {v.id}'s eval {eval_name!r} holds "
                               + (f"fewer than {first} samples of problem {short[0]!r}" if short else "no samples")
                               + "; evaluate it first (evaluate_version without first_sample), then top up from the "
                               "number of samples it holds")
        if (ckpt := self._weights_of(ws, v)) is None:
            _refuse_imported(ws, v.id, "evaluate")
        res, samples, records = self.evaluate_checkpoint(v.recipe, ckpt, k=k, eval_name=eval_name, progress=progress,
                                                         version_id=v.id, step=max(0, ws.lineage.last_step(v.id)),
                                                         pinned=run_data(ws), first_sample=first)
        kept = [(p, i, c, comp) for p, i, c, comp in ws.lineage.eval_samples(v.id, eval_name) if i < first]
        ws.lineage.log_eval_samples(v.id, eval_name, kept + samples)
        ws.rollouts.add(records)
        merged = [xs for _p, xs in sorted(ws.lineage.eval_matrix(v.id, eval_name).items())]
        n = first + k
        res = res.model_copy(update={
            "version_id": v.id, "k": n, "avg_at_k": avg_at_k(merged), "n_problems": len(merged),
            "pass_at_k": mean_pass_at_k([(len(x), int(sum(x))) for x in merged], n),
            "pass_at_1": mean_pass_at_k([(len(x), int(sum(x))) for x in merged], 1)})
        summary = dict(v.eval_summary or {})
        summary["by_name"] = {**summary.get("by_name", {}), eval_name: res.summary()}
        if eval_name == "heldout":
            summary.update(res.summary())
        ws.lineage.update_version(v.id, eval_summary=summary)
        write_eval(ws, v.id, res.summary(), eval_name)
        ws.log(f"topped up {v.id} ({eval_name}) by {k} sample(s) per problem: Avg@{n}={res.avg_at_k:.3f} "
               f"pass@{n}={res.pass_at_k:.3f}", version=v.id, source="local")
        return res

    def evaluate_checkpoint(self, recipe: Any, checkpoint: str | None, k: int | None = None,
                            eval_name: str = "heldout", progress: ProgressFn | None = None, version_id: str = "",
                            step: int = 0, split: str = "dev", pinned: Any = None, first_sample: int = 0,
                            ) -> tuple[EvalResult, list[tuple[str, int, float, str]], list[dict[str, Any]]]:
        """Evaluate weights (a checkpoint folder, or the recipe's base model when None) on the dev split
        (the first ``eval.max_problems`` dev problems) or, with ``split="test"``, on the whole test split; with
        ``pinned`` (the run's root data spec), the splits of that spec (``tasks.load_splits``).

        Correctness alone is scored (the ``correctness`` component), whatever the recipe's reward; for
        ``data.task: swe`` each sample is an episode graded by the hidden tests (``swe_train.evaluate_episodes``).
        Sample seeds depend on the recipe's seed, the problem batch and ``first_sample`` only (:func:`topup_seed`:
        the samples of a top-up are numbered from ``first_sample`` and drawn from a stream of their own), so two
        versions evaluated on the same split are paired sample by sample.

        Returns:
            ``(EvalResult, [(problem_id, sample_idx, correct, completion)], rollout records)``.

        Raises:
            BackendError: ``split`` is not dev / test, or the recipe has no test split (``data.n_test: 0``).
        """
        t0, cpu0 = time.time(), time.process_time()
        configure_threads(self.num_threads)
        k = k or recipe.eval.k
        if split not in ("dev", "test"):
            raise BackendError(f"split={split!r}: allowed: dev, test")
        sp = load_splits(recipe.data, pinned=pinned)
        if split == "test":
            held = sp.test
            if not held:
                raise BackendError(f"eval {eval_name!r} scores the test split, but the recipe has none "
                                   f"(data.n_test={recipe.data.n_test}); set data.n_test, e.g. 100")
        else:
            held = sp.dev[: recipe.eval.max_problems] if recipe.eval.max_problems else sp.dev
        bundle = load_policy(recipe.model, checkpoint=checkpoint, kl=False, device=self.device)
        bundle.model.eval()
        if recipe.data.task == "swe":
            per_problem, samples, records = swe_train.evaluate_episodes(
                bundle, recipe, held, k, eval_name=eval_name, version_id=version_id, step=step,
                batch_tasks=self.eval_batch_prompts, progress=progress)
        else:
            per_problem, samples, records = self._eval_completions(bundle, recipe, held, k, eval_name, progress,
                                                                   version_id, step, first_sample)
        avg = avg_at_k(per_problem)
        pk = mean_pass_at_k([(k, int(sum(x))) for x in per_problem], k)
        p1 = mean_pass_at_k([(k, int(sum(x))) for x in per_problem], 1)
        gen = int(sum(int(r.get("length") or 0) for r in records))
        res = EvalResult(version_id=version_id, eval_name=eval_name, k=k, avg_at_k=avg, pass_at_k=pk, pass_at_1=p1,
                         n_problems=len(per_problem), checkpoint=checkpoint, wall_s=time.time() - t0, split=split,
                         gen_tokens=gen, cpu_s=time.process_time() - cpu0)
        return res, samples, records

    def _eval_completions(self, bundle: PolicyBundle, recipe: Any, held: list[Any], k: int, eval_name: str,
                          progress: ProgressFn | None, version_id: str, step: int, first_sample: int = 0,
                          ) -> tuple[list[list[float]], list[tuple[str, int, float, str]], list[dict[str, Any]]]:
        """k single completions per held-out problem, numbered from ``first_sample``: (per-problem outcomes, samples,
        rollout records)."""
        samples, records, per_problem = [], [], []
        for bi in range(0, len(held), self.eval_batch_prompts):
            probs = held[bi: bi + self.eval_batch_prompts]
            prompts = chat_prompts(bundle.tokenizer, [build_messages(p, recipe.data) for p in probs])
            rb = generate(bundle.model, bundle.tokenizer, prompts, k, max_new_tokens=recipe.generate_max_len,
                          temperature=recipe.eval.temperature, top_p=1.0, prompt_max_len=recipe.prompt_max_len,
                          seed=topup_seed(recipe.seed * 7919 + bi, first_sample), device=self.device)
            rw = compute_rewards({"correctness": RewardComponent()}, probs, rb.completions,
                                 finish_reasons=rb.finish_reasons, lengths=rb.lengths,
                                 generate_max_len=recipe.generate_max_len)
            for i, c in enumerate(rw.correct):
                p = probs[i // k]
                c = 0.0 if math.isnan(c) else float(c)
                idx = first_sample + i % k
                samples.append((p.id, idx, c, rb.completions[i]))
                records.append(make_record(
                    version_id=version_id, step=step, prompt_id=p.id, group_id=f"{eval_name}-{p.id}", sample_idx=idx,
                    prompt=p.prompt, completion=rb.completions[i], reward=c, components={"correctness": c},
                    answer=p.answer, correct=c, length=rb.lengths[i], finish_reason=rb.finish_reasons[i], split="eval"))
            for j in range(len(probs)):
                per_problem.append([s[2] for s in samples[-len(rw.correct):][j * k:(j + 1) * k]])
            if progress is not None:
                progress({"step": min(len(held), bi + len(probs)), "steps": len(held), "problems_done": len(per_problem),
                          "avg@k": float(np.mean([np.mean(x) for x in per_problem]))})
        return per_problem, samples, records


TOPUP_SEED_STRIDE = 1_000_003
"""Seed offset per first sample index of a top-up (a prime above any batch offset ``bi`` a dev split reaches), so the
samples a top-up adds come from a stream of their own, not a replay of the first pass's."""


def topup_seed(seed: int, first_sample: int) -> int:
    """The generation seed of a dev evaluation's batch whose first pass seeds with ``seed``, for the samples numbered
    from ``first_sample`` (0: ``seed`` itself, the first pass)."""
    return seed + TOPUP_SEED_STRIDE * first_sample


def _filters(recipe: Any) -> dict[str, Any]:
    """The recipe's zero-variance and dynamic-sampling settings, as ``grpo.group_filter_keep`` keywords."""
    return {"drop_zero_variance_groups": recipe.drop_zero_variance_groups,
            "dynamic_filtering": recipe.dynamic_filtering,
            "dynamic_filtering_range": tuple(recipe.dynamic_filtering_range)}


def _drop_rollouts_after(ws: Any, vid: str, step: int) -> None:
    """Delete train rollouts of steps after ``step`` (written before a crash, redone on resume); no commit when
    there are none (a first training), so concurrent branches do not contend for nothing."""
    where = f"version_id = '{vid}' AND split = 'train' AND step > {int(step)}"
    if ws.rollouts.count(where):
        ws.rollouts.delete(where)


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # noqa: BLE001 (cosmetic)
        pass


def _refuse_imported(ws: Any, version_id: str, what: str) -> None:
    """Refuse to train or evaluate the base model in place of an imported foreign run's weights.

    ``evotrainer import`` stores a foreign run's metrics, rollouts and logs (``import/source`` in the kv
    table) under a placeholder recipe (the default one, whose model is not the run's), and no checkpoint;
    with no checkpoint to start from, the local backend would load that placeholder's base model and file
    its scores under the foreign run's version.

    Raises:
        BackendError: the run was imported; the message names the source and the fix.
        LineageError: its kv ``import/source`` is not an object with a text ``version_id`` (a run folder from
            elsewhere; :func:`evotrainer.lineage.import_source` names the file, the key and the fix).
    """
    src = import_source(ws.lineage)  # checked: a LineageError names a wrongly shaped row (review 11, C-R11)
    if not src:
        return
    raise BackendError(f"cannot {what} {version_id}: the run was imported from {src.get('path')} (metrics, rollouts "
                       "and logs only: no weights, and a placeholder recipe, not the one it trained with); evaluate "
                       "the run's own checkpoint with `evotrainer eval CHECKPOINT_DIR --recipe RECIPE.yaml`, or "
                       "train it in a new run folder (`evotrainer init DIR --recipe RECIPE.yaml`)")
