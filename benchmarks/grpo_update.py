"""The GRPO update alone: length-trimmed pieces (the default) against the plain padded micro-batch, same run.

One rollout batch of SmolLM2-135M-Instruct fp32 (``--prompts`` x ``--n`` samples of the 1-digit addition
prompts, ``--max-new-tokens`` at temperature 1, the settings of ``benchmarks/grpo_step.py``) is drawn once;
then ``LocalBackend._update`` (forward + backward + AdamW step + the update-size probe) runs on it from the
same weights, alternating ``trim_padding=True`` / ``False`` ``--repeat`` times (peers interleaved, so both see
the same machine load). Reports the median seconds of each, their ratio, the padded tokens each path runs
(rows x width summed over forwards) and the largest difference of their metrics (they must agree: the
correctness test is tests/test_grpo_fast_paths.py).

Usage: ``python benchmarks/grpo_update.py [--repeat 3] [--prompts 2] [--n 8] [--max-new-tokens 64]
[--threads 1] [--json]``. About 2-4 minutes of CPU here.
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
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import torch

    from evotrainer.recipe import validate_recipe
    from evotrainer.rl_backend.local import LocalBackend, _pieces
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
    secs: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    metrics: dict[bool, dict] = {}
    for _ in range(a.repeat):
        for trim in (True, False):
            bundle.model.load_state_dict(state)
            bundle.model.train()
            opt = torch.optim.AdamW(bundle.trainable_parameters(), lr=1e-6, betas=(0.9, 0.95), weight_decay=0.0)
            t0, c0 = time.perf_counter(), time.process_time()
            m = LocalBackend(device="cpu", num_threads=a.threads, trim_padding=trim)._update(bundle, opt, recipe, rb,
                                                                                           rewards)
            secs[trim].append(time.perf_counter() - t0)
            cpu[trim].append(time.process_time() - c0)
            m.pop("_advantages")
            metrics[trim] = m
    padded = {t: sum(len(p.rows) * p.width for p in _pieces(recipe, rb, t)) for t in (True, False)}
    diff = max(abs(metrics[True][k] - metrics[False][k]) / max(1e-12, abs(metrics[False][k]))
               for k in metrics[False] if metrics[False][k] == metrics[False][k])
    res = {
        "completion_lengths": sorted(rb.lengths), "real_tokens": int(sum(rb.lengths)),
        "trimmed_s": round(statistics.median(secs[True]), 2), "plain_s": round(statistics.median(secs[False]), 2),
        "speed-up": round(statistics.median(secs[False]) / statistics.median(secs[True]), 2),
        "trimmed_cpu_s": round(statistics.median(cpu[True]), 2), "plain_cpu_s": round(statistics.median(cpu[False]), 2),
        "cpu_speed-up": round(statistics.median(cpu[False]) / statistics.median(cpu[True]), 2),
        "padded_tokens_trimmed": padded[True], "padded_tokens_plain": padded[False],
        "forwards_trimmed": len(_pieces(recipe, rb, True)), "max_rel_metric_diff": f"{diff:.1e}",
        "all_s": {"trimmed": [round(x, 2) for x in secs[True]], "plain": [round(x, 2) for x in secs[False]]},
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print_result(res, a.json, 22)
    return res


if __name__ == "__main__":
    main()
