"""The GRPO update alone: packed groups (the default), length-trimmed padded pieces and the plain padded
micro-batch, same run.

One rollout batch of SmolLM2-135M-Instruct fp32 (``--prompts`` x ``--n`` samples of the 1-digit addition
prompts, ``--max-new-tokens`` at temperature 1, the settings of ``benchmarks/grpo_step.py``) is drawn once;
then ``LocalBackend._update`` (forward + backward + AdamW step + the update-size probe) runs on it from the
same weights, cycling through the paths ``--repeat`` times (peers interleaved, so all see the same machine
load): ``packed`` (``trim_padding=True, pack_completions=True``: each group one sequence of real tokens),
``trimmed`` (``pack_completions=False``: length-sorted runs, each padded to its longest row) and ``plain``
(``trim_padding=False``), and, with ``--paths ...,packed-dense``, the packed path with torch's ``nn.Embedding``
backward instead of the in-place one (``models.InPlaceGradEmbedding``, the default; docs/performance.md §12), with
``packed-dense-head`` the packed path with torch's ``nn.Linear`` LM head instead of the in-place weight gradient
(``models.InPlaceGradLinear``, the default; §15). Reports the median wall and CPU seconds of each, the ratios to ``plain``, the
tokens each path feeds (packed: prompt once per piece + completion tokens; padded paths: rows x width, plus
the prompt once per piece) and the largest relative difference of each path's metrics from ``plain``'s (they
must agree: the correctness test is tests/test_grpo_fast_paths.py).

Usage: ``python benchmarks/grpo_update.py [--repeat 3] [--paths packed,trimmed,plain] [--prompts 2] [--n 8]
[--max-new-tokens 64] [--threads 1] [--json]``. About 3-5 minutes of CPU here.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

from _report import print_result

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--paths", default="packed,trimmed,plain")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import torch

    from evotrainer.recipe import validate_recipe
    from evotrainer.rl_backend.local import LocalBackend, _pieces, make_optimizer, pack_attention_cost
    from evotrainer.rl_backend.models import configure_threads, load_policy
    from evotrainer.rl_backend.rewards import compute_rewards
    from evotrainer.rl_backend.sampling import chat_prompts, generate
    from evotrainer.rl_backend.tasks import build_messages, load_problems

    configure_threads(a.threads)
    recipe = validate_recipe({
        "rollout_batch_size": a.prompts, "n_samples_per_prompt": a.n, "generate_max_len": a.max_new_tokens,
        "init_kl_coef": 0.0, "actor_learning_rate": 1e-6, "max_norm": 1.0, "temperature": 1.0,
        "drop_zero_variance_groups": False, "micro_train_batch_size": a.prompts * a.n,
        "loss_agg_mode": "token-mean", "data": {"level": 1}})
    bundle = load_policy(recipe.model, kl=False)
    train, _ = load_problems(recipe.data)
    probs = train[: a.prompts]
    prompts = chat_prompts(bundle.tokenizer, [build_messages(p, recipe.data) for p in probs])
    rb = generate(bundle.model, bundle.tokenizer, prompts, a.n, max_new_tokens=a.max_new_tokens, temperature=1.0,
                  seed=0)
    rw = compute_rewards(recipe.reward, probs, rb.completions, finish_reasons=rb.finish_reasons, lengths=rb.lengths,
                         generate_max_len=a.max_new_tokens)
    rewards = torch.tensor(rw.total, dtype=torch.float64)
    state = copy.deepcopy(bundle.model.state_dict())
    settings = {"packed": (True, True), "trimmed": (True, False), "plain": (False, False),
                "packed-dense": (True, True), "packed-dense-head": (True, True)}
    emb = bundle.model.get_input_embeddings()
    fast_cls = type(emb)
    head = bundle.model.get_output_embeddings()
    fast_head_cls = type(head)
    paths = [p for p in a.paths.split(",") if p]
    secs: dict[str, list[float]] = {p: [] for p in paths}
    cpu: dict[str, list[float]] = {p: [] for p in paths}
    metrics: dict[str, dict] = {}
    loads: list[float] = []
    for _ in range(a.repeat):
        for path in paths:
            trim, pack = settings[path]
            bundle.model.load_state_dict(state)
            bundle.model.train()
            emb.__class__ = torch.nn.Embedding if path == "packed-dense" else fast_cls
            head.__class__ = torch.nn.Linear if path == "packed-dense-head" else fast_head_cls
            opt = make_optimizer(bundle, 1e-6, 0.0)  # the trainer's (fused) AdamW
            backend = LocalBackend(device="cpu", num_threads=a.threads, trim_padding=trim, pack_completions=pack)
            t0, c0 = time.perf_counter(), time.process_time()
            m = backend._update(bundle, opt, recipe, rb, rewards)
            secs[path].append(time.perf_counter() - t0)
            cpu[path].append(time.process_time() - c0)
            loads.append(os.getloadavg()[0])
            m.pop("_advantages")
            metrics[path] = m

    def fed(path: str) -> int:
        trim, pack = settings[path]
        pieces = _pieces(recipe, rb, trim, pack_attention_cost(bundle.model) if pack else None)
        prompt = [int(rb.prompt_mask[int(p.rows[0])].sum()) if p.packed else rb.prompt_ids.shape[1] - p.start
                  for p in pieces]
        return sum(prompt) + sum(sum(e - 1 for e in p.extents) if p.packed else len(p.rows) * p.width for p in pieces)

    med = {p: statistics.median(secs[p]) for p in paths}
    cmed = {p: statistics.median(cpu[p]) for p in paths}
    res: dict = {"completion_lengths": sorted(rb.lengths), "real_tokens": int(sum(rb.lengths))}
    for p in paths:
        res[f"{p}_s"], res[f"{p}_cpu_s"] = round(med[p], 2), round(cmed[p], 2)
        res[f"{p}_tokens_fed"] = fed(p)
        res[f"{p}_forwards"] = len(_pieces(recipe, rb, *settings[p][:1],
                                           pack_attention_cost(bundle.model) if settings[p][1] else None))
        base = "packed" if p.startswith("packed-dense") else "plain"
        if base in metrics and p != base:
            ref = metrics[base]
            res[f"{p}_cpu_speed-up"] = round(cmed[base] / cmed[p], 2)
            res[f"{p}_speed-up"] = round(med[base] / med[p], 2)
            rel = {k: abs(metrics[p][k] - ref[k]) / max(1e-12, abs(ref[k])) for k in ref if ref[k] == ref[k]}
            worst = max(rel, key=rel.__getitem__)
            res[f"{p}_max_rel_metric_diff"] = f"{rel[worst]:.1e} ({worst}: {ref[worst]:.3g})"
    res["all_cpu_s"] = {p: [round(x, 2) for x in cpu[p]] for p in paths}
    res["load_avg_1m"] = [round(min(loads), 2), round(max(loads), 2)]
    print_result(res, a.json, 22)
    return res


if __name__ == "__main__":
    main()
