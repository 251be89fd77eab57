"""Write tests/data/openrlhf_tb/: a small OpenRLHF-style TensorBoard log (run once; the event file is committed).

Tags are OpenRLHF 0.11.2's own: ``TensorboardLogger.log_train`` writes ``train/<key>`` for every key
of the step status (``ppo_actor.py``: policy_loss, actor_lr, actor_grad_norm, entropy_loss, kl,
ppo_clip_ratio, ppo_kl, reward, score, response_length, total_length, truncated, response_clip_ratio
and the reward function's extra_logs; ``ppo_trainer.py``: timing/*, rollout/*,
dynamic_filtering_pass_rate) plus the text ``train/generated_samples``; ``log_eval`` writes
``eval/eval_<dataset>_pass1``. The values are synthetic (no GPU here): a run whose leaky
``format_token`` reward rises while correctness falls and entropy collapses, written with
``torch.utils.tensorboard.SummaryWriter`` exactly as OpenRLHF writes them
(``<tensorboard_dir>/<run_name>/events.out.tfevents.*``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

OUT = Path(__file__).parent / "openrlhf_tb"
RUN = "v0"  # --logger.wandb.run_name
STEPS = 16


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    w = SummaryWriter(log_dir=str(OUT / RUN))
    for s in range(1, STEPS + 1):
        f = (s - 1) / (STEPS - 1)  # 0 .. 1 over the run
        correct = round(0.35 - 0.2 * f, 4)  # correctness falls 0.35 -> 0.15
        fmt_tok = round(0.1 + 0.9 * f, 4)  # the leaky format_token reward rises 0.1 -> 1.0
        reward = round(correct + 0.5 * fmt_tok, 4)  # weights: correctness 1.0, format_token 0.5
        entropy = round(1.2 * (0.1 ** f), 4)  # 1.2 -> 0.12 nats/token
        length = round(40 - 20 * f, 2)
        status = {
            "policy_loss": round(0.02 - 0.001 * s, 4), "actor_lr": 1e-6, "actor_grad_norm": round(0.8 + 0.05 * s, 3),
            "entropy_loss": entropy, "kl": round(0.001 * s, 4), "logprobs_diff": 0.0, "ppo_clip_ratio": 0.01,
            "ppo_kl": 0.0005, "reward": reward, "score": correct, "response_length": length,
            "total_length": length + 30, "truncated": 0.0, "response_clip_ratio": 0.0,
            "correctness": correct, "format_token": fmt_tok, "correct": correct,
            "timing/make_experience": 4.0, "timing/ppo_train": 2.0, "timing/broadcast": 0.5,
            "timing/generation": 3.0, "timing/step_total": 9.5,
            "rollout/reward_mean": reward, "rollout/reward_std": 0.3, "rollout/response_length_mean": length,
            "rollout/truncated_rate": 0.0, "rollout/num_samples": 32.0, "dynamic_filtering_pass_rate": 0.75,
        }
        for k, v in status.items():
            w.add_scalar(f"train/{k}", v, s)
        w.add_text("train/generated_samples", f"Sample:\\nWhat is {s} + 2? Answer: {s + 2}\\n\\nReward: {reward:.4f}", s)
        if s % 4 == 0:
            w.add_scalar("eval/eval_heldout_pass1", round(0.3 - 0.02 * (s // 4), 4), s)
            w.add_scalar("eval/eval_heldout_pass8", round(0.6 - 0.03 * (s // 4), 4), s)
    w.close()


if __name__ == "__main__":
    main()
