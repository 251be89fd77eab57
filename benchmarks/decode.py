"""Rollout decode: the plain-torch Llama decode step against the HF forward, side by side in one process.

Both paths run ``sampling.generate`` (shared prefill, decode without finished rows) on SmolLM2-135M-Instruct
(fp32) with the settings of ``benchmarks/grpo_step.py``: ``--prompts`` 1-digit addition prompts (chat template) x
``--n`` samples, ``--max-new-tokens`` new tokens at temperature 1, ``--threads`` torch threads. ``HF step``: each
decode step the HF forward (``decode.HFDecodeStep``, ``generate``'s default); ``plain-torch step``:
``decode.LlamaDecodeStep`` (``fast_decode=True``).

Each repeat uses its own seed and runs both paths, in alternating order; they must sample the same tokens (checked
on every repeat; the log-prob difference is reported). Reported: CPU seconds of the process
(``time.process_time``; the steadier figure on a shared machine) and wall seconds per ``generate`` call,
completion tokens per CPU-second, the ratios on ``generate`` and on decode (``generate`` less the prefill, timed
alone), and the load average.

Usage: ``python benchmarks/decode.py [--repeats 3] [--prompts 2] [--n 8] [--max-new-tokens 64] [--threads 1]
[--profile]`` (``--profile``: torch.profiler's top ops of one call of each path). Figures: docs/performance.md §7.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="Seeds; both paths run once per seed.")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=8, help="Samples per prompt.")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0, help="First seed (prompt draw and sampling).")
    ap.add_argument("--profile", action="store_true", help="Print torch.profiler's top ops of one call of each.")
    a = ap.parse_args()

    import torch

    from evotrainer.recipe import DataSpec
    from evotrainer.rl_backend import decode, models
    from evotrainer.rl_backend.sampling import chat_prompts, generate
    from evotrainer.rl_backend.tasks import build_messages, load_problems

    models.configure_threads(a.threads)
    tok = models.load_tokenizer(models.DEFAULT_MODEL)
    model = models.load_base_model(models.DEFAULT_MODEL, tokenizer=tok).eval()
    model.config.pad_token_id = tok.pad_token_id
    assert decode.unsupported_reason(model) is None, decode.unsupported_reason(model)
    data = DataSpec(level=1)
    train, _ = load_problems(data)
    probs = random.Random(a.seed).sample(train, a.prompts)
    prompts = chat_prompts(tok, [build_messages(p, data) for p in probs])
    kw = dict(max_new_tokens=a.max_new_tokens, temperature=1.0)
    print(f"settings: {a.prompts} prompts x {a.n} samples, {a.max_new_tokens} new tokens, fp32, {a.threads} thread(s), "
          f"torch {torch.__version__}; load {os.getloadavg()[0]:.2f}", flush=True)

    paths = {"HF step": False, "plain-torch step": True}

    def run(path: str, seed: int):
        c, w = time.process_time(), time.perf_counter()
        rb = generate(model, tok, prompts, a.n, seed=seed, fast_decode=paths[path], **kw)
        return rb, time.process_time() - c, time.perf_counter() - w

    for path in paths:  # warm-up (allocator, one-time checks)
        run(path, a.seed)
    res: dict[str, list[tuple[float, float, int]]] = {p: [] for p in paths}
    max_lp = 0.0
    for r in range(a.repeats):
        seed = a.seed + r
        out = {}
        for path in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
            rb, cpu, wall = run(path, seed)
            out[path] = rb
            res[path].append((cpu, wall, sum(rb.lengths)))
        ref = out["HF step"]
        m = ref.completion_mask.bool()
        for path, rb in out.items():
            if not torch.equal(rb.completion_ids, ref.completion_ids):
                raise SystemExit(f"seed {seed}: {path} sampled other tokens than the HF step")
            max_lp = max(max_lp, (rb.sampling_logprobs[m] - ref.sampling_logprobs[m]).abs().max().item())
        print(f"seed {seed}: {sum(ref.lengths)} tokens, longest {max(ref.lengths)}; "
              + ", ".join(f"{p} {res[p][-1][0]:.2f}" for p in paths) + f" CPU-s (load {os.getloadavg()[0]:.2f})",
              flush=True)

    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    pre = []
    with torch.no_grad():
        for _ in range(3):
            c = time.process_time()
            model(input_ids=enc.input_ids[:, :-1], attention_mask=enc.attention_mask[:, :-1], position_ids=pos[:, :-1],
                  use_cache=True, logits_to_keep=1)
            pre.append(time.process_time() - c)
    prefill = statistics.median(pre)
    tokens = sum(x[2] for x in res["HF step"])
    cpu = {p: sum(x[0] for x in v) for p, v in res.items()}
    for p, v in res.items():
        print(f"{p}: generate {statistics.median(x[0] for x in v):.2f} CPU-s ({statistics.median(x[1] for x in v):.2f} s "
              f"wall) median, {tokens / cpu[p]:.1f} completion tokens per CPU-s")
    dec = {p: cpu[p] - prefill * a.repeats for p in paths}  # decode = generate - prefill
    print(f"ratio plain-torch / HF step (CPU-s summed over the {a.repeats} seeds): "
          f"{cpu['HF step'] / cpu['plain-torch step']:.2f}x on generate, {dec['HF step'] / dec['plain-torch step']:.2f}x "
          f"on decode (generate - prefill, {prefill:.2f} CPU-s timed alone); same tokens on {a.repeats} seeds, "
          f"log-probs within {max_lp:.1e}; load {os.getloadavg()[0]:.2f}")

    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        for path in paths:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run(path, a.seed)
            print(f"--- {path}")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
