"""Regenerate the ingest fixtures (run once; the files are committed).

Tag names are the real ones: OpenRLHF's TensorboardLogger writes ``train/<key>`` for the keys of
``ppo_actor.py`` / ``ppo_trainer.py`` (policy_loss, kl, reward, response_length, actor_grad_norm,
actor_lr, entropy_loss, rollout/truncated_rate, dynamic_filtering_pass_rate) and ``eval/<key>`` for
``eval_<dataset>_pass1``; TRL's GRPOTrainer logs ``train/reward``, ``train/kl``, ``train/entropy``,
``train/rewards/<func>/mean``, ``train/frac_reward_zero_std``, ``train/completions/clipped_ratio``.
"""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.tensorboard import SummaryWriter

HERE = Path(__file__).parent


def main() -> None:
    w = SummaryWriter(str(HERE / "openrlhf_tb"))
    for step in range(1, 5):
        w.add_scalar("train/policy_loss", 0.1 * step, step)
        w.add_scalar("train/kl", 0.01 * step, step)
        w.add_scalar("train/reward", 0.2 * step, step)
        w.add_scalar("train/response_length", 100.0 + step, step)
        w.add_scalar("train/actor_grad_norm", 1.5, step)
        w.add_scalar("train/actor_lr", 1e-6, step)
        w.add_scalar("train/entropy_loss", 0.5 - 0.1 * step, step)
        w.add_scalar("train/rollout/truncated_rate", 0.25, step)
        w.add_scalar("train/dynamic_filtering_pass_rate", 0.75, step)
        w.add_scalar("train/ppo_clip_ratio", 0.02, step)
    w.add_scalar("eval/eval_gsm8k_pass1", 0.40, 2)
    w.add_scalar("eval/eval_gsm8k_pass4", 0.70, 2)
    w.close()

    w = SummaryWriter(str(HERE / "trl_tb"))
    for step in (10, 20):
        w.add_scalar("train/reward", step / 100, step)
        w.add_scalar("train/kl", 0.001, step)
        w.add_scalar("train/entropy", 0.8, step)
        w.add_scalar("train/rewards/accuracy_reward/mean", 0.3, step)
        w.add_scalar("train/rewards/format_reward/mean", 0.9, step)
        w.add_scalar("train/frac_reward_zero_std", 0.5, step)
        w.add_scalar("train/completions/clipped_ratio", 0.125, step)
    w.close()

    with open(HERE / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 1, "reward/mean": 0.5, "actor/entropy": 0.7, "my_custom": 3}) + "\n")
        f.write(json.dumps({"global_step": 2, "reward/mean": 0.6, "actor/entropy": "nan", "my_custom": 4}) + "\n")

    dump = HERE / "verl_dump"
    dump.mkdir(exist_ok=True)
    for step in (3, 4):
        with open(dump / f"{step}.jsonl", "w") as f:
            for q, gt in (("What is 2+3?", "5"), ("What is 7+8?", "15")):
                for k in range(2):
                    score = 1.0 if k == 0 else 0.0
                    out = gt if score else "I think 9 because reasons"
                    f.write(json.dumps({"input": q, "output": out, "gts": gt, "score": score, "step": step,
                                        "acc": score}) + "\n")

    comp = HERE / "trl_run" / "completions"
    comp.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "step": [5, 5, 5, 5],
        "prompt": ["Sum 1+1", "Sum 1+1", "Sum 2+2", "Sum 2+2"],
        "completion": ["2", "3", "4", "4"],
        "accuracy_reward": [1.0, 0.0, 1.0, 1.0],
        "format_reward": [1.0, 1.0, 0.0, 1.0],
        "advantage": [0.7, -0.7, 0.0, 0.0],
    }), comp / "completions_00005.parquet")


if __name__ == "__main__":
    main()
