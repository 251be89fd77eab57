"""Where one GRPO step of the local backend goes, against the roofline of the model on this CPU.

Runs ``--steps`` steps of the local backend (the first is a warm-up, not counted) with the settings
of ``benchmarks/grpo_step.py`` (SmolLM2-135M-Instruct fp32, 1-digit addition, ``--prompts`` x
``--n`` samples, ``--max-new-tokens``, no KL, one micro-batch) and times, by wrapping the product
functions (timing only; nothing else changes):

- ``generate`` (rollout: prefill + decode); prefill is timed again alone (the same prompts, one
  no-grad forward without their last token, as ``sampling.generate`` does), decode = the rest;
- log-prob forwards with grad (the update) and without (the update-size probe);
- ``backward``; the optimiser (``clip_grad_norm_`` + ``AdamW.step``);
- the rest of ``perf/step_seconds``: rewards, metrics, rollout and metric writes.

Roofline (measured here, same thread count): memory bandwidth (a numpy copy of 256 MiB) and fp32
matmul throughput (torch ``mm`` of (B*T, 576) x (576, 1536), the MLP shape). Lower bounds:
decode >= (decode steps) x (4 bytes x parameters: every weight is read once per decode step, the
tied 49152 x 576 head included) / bandwidth; training forward + backward >= 6 x parameters x
(tokens) / matmul FLOP/s (2N forward, 4N backward per token; Kaplan et al. 2020), tokens = the
prompt once per group (shared prompt forward) plus every completion token.

On a GPU (the local backend picks CUDA when it is there) each timed phase ends with ``torch.cuda.synchronize()``
so queued kernels count where they were launched, and the CPU roofline is not printed (a GPU's would need its
own peak figures). ``--model`` / ``--random-init`` / ``--tokenizer`` / ``--dtype`` as in ``grpo_step.py``.

Usage: ``python benchmarks/grpo_profile.py [--steps 2] [--prompts 2] [--n 8] [--max-new-tokens 64]
[--threads 1] [--model NAME_OR_FOLDER | --random-init {135m,0.5b}] [--dtype float32|bfloat16] [--json]``.
About 1-3 minutes of CPU here.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def roofline(threads: int) -> dict[str, float]:
    """Memory bandwidth (GB/s, read + write of a 256 MiB copy) and fp32 matmul GFLOP/s here."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    a = np.ones(2**26, dtype=np.float32)  # 256 MiB
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    bw = 2 * a.nbytes / best / 1e9
    x, w = torch.randn(1024, 576), torch.randn(576, 1536)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        torch.mm(x, w)
        best = min(best, time.perf_counter() - t)
    return {"bandwidth_gb_s": bw, "matmul_gflop_s": 2 * 1024 * 576 * 1536 / best / 1e9}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--random-init", choices=["135m", "0.5b"], default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    import sys

    import torch

    tmp = tempfile.TemporaryDirectory()
    if a.random_init:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from grpo_step import random_model_folder

        a.model = random_model_folder(a.random_init, tmp.name, a.tokenizer)
    cuda = torch.cuda.is_available()

    from evotrainer import metrics as M
    from evotrainer.recipe import validate_recipe
    from evotrainer.rl_backend import local
    from evotrainer.workspace import Workspace

    times: dict[str, list[float]] = defaultdict(list)
    step_no = {"i": -1}

    def timed(name_fn, fn):
        def wrapper(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                if cuda:
                    torch.cuda.synchronize()
                if step_no["i"] >= 1:  # step 0 is the warm-up
                    times[name_fn(*args, **kw) if callable(name_fn) else name_fn].append(time.perf_counter() - t)
        return wrapper

    captured: dict[str, object] = {}
    orig_generate = local.generate

    def generate(model, tok, prompts, n, **kw):
        captured.update(model=model, tok=tok, prompts=prompts)
        return orig_generate(model, tok, prompts, n, **kw)

    orig_step = local.LocalBackend._step

    def step(self, *args, **kw):
        step_no["i"] += 1
        return orig_step(self, *args, **kw)

    patches = [
        (local, "generate", timed("rollout (generate)", generate)),
        (local, "_piece_logprobs", timed(lambda *x, **k: "log-prob forward (grad)" if torch.is_grad_enabled()
                                         else "log-prob forward (no grad)", local._piece_logprobs)),
        (torch.Tensor, "backward", timed("backward", torch.Tensor.backward)),
        (torch.nn.utils, "clip_grad_norm_", timed("optimiser", torch.nn.utils.clip_grad_norm_)),
        (torch.optim.AdamW, "step", timed("optimiser", torch.optim.AdamW.step)),
        (local.LocalBackend, "_step", step),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, fn in patches:
        setattr(obj, name, fn)
    recipe = validate_recipe({
        "rollout_batch_size": a.prompts, "n_samples_per_prompt": a.n, "generate_max_len": a.max_new_tokens,
        "init_kl_coef": 0.0, "actor_learning_rate": 1e-6, "max_norm": 1.0, "temperature": 1.0,
        "drop_zero_variance_groups": False, "micro_train_batch_size": a.prompts * a.n,
        "loss_agg_mode": "token-mean", "data": {"level": 1},
        "model": {"name_or_path": a.model, "dtype": a.dtype}})
    try:
        with tempfile.TemporaryDirectory() as d, Workspace(d, writer=True) as ws:
            v = ws.lineage.create_root(recipe)
            local.LocalBackend(checkpoint_every=10_000, num_threads=a.threads).train(ws, v.id, a.steps)
            secs = [x for _, x in ws.lineage.metric_series(v.id, M.PERF_STEP_SECONDS)][1:]
            lens = [x for _, x in ws.lineage.metric_series(v.id, M.COMPLETIONS_MEAN_LENGTH)][1:]
            maxlens = [x for _, x in ws.lineage.metric_series(v.id, M.COMPLETIONS_MAX_LENGTH)][1:]
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    steps = len(secs)
    model, tok, prompts = captured["model"], captured["tok"], captured["prompts"]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(next(model.parameters()).device)
    pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    model.eval()
    with torch.no_grad():
        t = time.perf_counter()
        model(input_ids=enc.input_ids[:, :-1], attention_mask=enc.attention_mask[:, :-1], position_ids=pos[:, :-1],
              use_cache=True, logits_to_keep=1)
        if cuda:
            torch.cuda.synchronize()
        prefill = time.perf_counter() - t
    n_params = sum(p.numel() for p in model.parameters())
    prompt_len = int(enc.input_ids.shape[1])
    captured.clear()
    del model

    phase = {k: sum(v) / steps for k, v in times.items()}
    phase["prefill (timed alone)"] = prefill
    phase["decode (generate - prefill)"] = phase["rollout (generate)"] - prefill
    step_s = sum(secs) / steps
    accounted = sum(phase[k] for k in ("rollout (generate)", "log-prob forward (grad)", "log-prob forward (no grad)",
                                       "backward", "optimiser") if k in phase)
    phase["rest (rewards, metrics, writes)"] = step_s - accounted
    rf = roofline(a.threads) if not cuda else {"bandwidth_gb_s": float("nan"), "matmul_gflop_s": float("nan")}
    rows = a.prompts * a.n
    mean_len = sum(lens) / steps
    decode_steps = sum(maxlens) / steps  # generate runs until the longest row stops
    train_tokens = a.prompts * prompt_len + rows * mean_len
    bounds = {
        "decode_s_min": decode_steps * 4 * n_params / (rf["bandwidth_gb_s"] * 1e9),
        "train_fwd_bwd_s_min": 6 * n_params * train_tokens / (rf["matmul_gflop_s"] * 1e9),
        "train_fwd_s_min": 2 * n_params * train_tokens / (rf["matmul_gflop_s"] * 1e9),
    }
    out = {"settings": vars(a), "step_s": step_s, "completion_tokens_per_s": rows * mean_len / step_s,
           "params": n_params, "prompt_len": prompt_len, "mean_completion_len": mean_len,
           "decode_steps": decode_steps, "phases_s": phase, "roofline": rf, "lower_bounds_s": bounds,
           "load_avg_1m": os.getloadavg()[0]}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"step {step_s:.2f} s, {out['completion_tokens_per_s']:.1f} completion tokens/s "
              f"(load {out['load_avg_1m']:.2f}, {a.threads} thread(s), {a.dtype}, "
              f"{torch.cuda.get_device_name(0) if cuda else 'cpu'})")
        for k, v in sorted(phase.items(), key=lambda kv: -kv[1]):
            print(f"  {k:34s} {v:7.2f} s  {100 * v / step_s:5.1f}%")
        if cuda:
            return out
        print(f"roofline: {rf['bandwidth_gb_s']:.1f} GB/s, {rf['matmul_gflop_s']:.1f} GFLOP/s; N = {n_params / 1e6:.1f} M")
        print(f"  decode >= {bounds['decode_s_min']:.2f} s ({decode_steps:.0f} steps x {4 * n_params / 1e6:.0f} MB)")
        print(f"  forward + backward >= {bounds['train_fwd_bwd_s_min']:.2f} s ({train_tokens:.0f} tokens x 6N)")
    return out


if __name__ == "__main__":
    main()
