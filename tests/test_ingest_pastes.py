"""Readers of pasted logs added 2026-12-07 (late): DeepSpeed-Chat's step-3 console, LLaMA-Factory's trainer_log.jsonl
(``current_steps``), elision marks in JSONL, and evaluation dicts that TRL logs partly without the ``eval_`` prefix.
The real excerpts are cases in tests/data/cases (SOURCE.md there); these are hand-made lines with hand values."""

from __future__ import annotations

import math

import pytest

from evotrainer import metrics as M
from evotrainer.harness.ingest import (
    IngestWarning,
    ingest,
    join_verl_wraps,
    parse_jsonl_metrics,
    parse_text_log,
)
from evotrainer.harness.ingest_formats import eval_renamed, parse_dict_log, parse_dschat_log

DSCHAT = """\
|E2E latency=2.12s |Gather latency=0.00s (0.00%) |Generate time=1.59s (75.13%) |Others=0.11 (5.09%)|CurSamplesPerSec=1.89 |AvgSamplesPerSec=1.95
epoch: 0|step: 7|ppo_ep: 1|act_loss: 0.5|cri_loss: 0.25|unsuper_loss: 0.0
average reward score: -7.8125
-------------------------------------------------------------------------------------
|E2E latency=2.14s |Gather latency=0.00s (0.00%) |Generate time=1.62s (75.39%) |Others=0.10 (4.87%)|CurSamplesPerSec=1.87 |AvgSamplesPerSec=1.95
epoch: 0|step: 8|ppo_ep: 1|act_loss: inf|cri_loss: nan|unsuper_loss: 0.0
average reward score: -6.359375
epoch: 1|step: 0|ppo_ep: 1|act_loss: 0.125|cri_loss: 0.0625|unsuper_loss: 0.0
average reward score: 1.5
"""


def test_deepspeed_chat_step_lines_and_their_reward_lines():
    recs = parse_dschat_log(DSCHAT)
    # the throughput lines are no steps; epoch 1's step 0 continues after step 8
    assert sorted(recs) == [7, 8, 9]
    assert recs[7] == {"ppo_epoch": 1.0, "actor/pg_loss": 0.5, "critic/vf_loss": 0.25, "unsuper_loss": 0.0,
                       "reward": -7.8125}
    assert math.isinf(recs[8]["actor/pg_loss"]) and math.isnan(recs[8]["critic/vf_loss"])
    assert recs[8]["reward"] == -6.359375 and recs[9]["reward"] == 1.5
    records, reader = parse_text_log(DSCHAT)
    assert reader == "DeepSpeed-Chat 'epoch: E|step: N|...' lines" and sorted(records) == [7, 8, 9]


def test_deepspeed_chat_newer_wording_and_a_single_step_line(tmp_path):
    text = ("Epoch: 0 | Step: 100 | PPO Epoch: 1 | Actor Loss: 0.5 | Critic Loss: 0.25 | Unsupervised Loss: 0.0\n"
            "Average reward score: 1.5 Average kl: 0.02 Average length: 120\n")
    assert parse_dschat_log(text) == {100: {"ppo_epoch": 1.0, "actor/pg_loss": 0.5, "critic/vf_loss": 0.25,
                                            "unsupervised_loss": 0.0, "reward": 1.5, "kl": 0.02,
                                            "response_length/mean": 120.0}}
    # one step line alone is read (DeepSpeedExamples#307's paste: before, 'no training metrics found')
    (tmp_path / "train.log").write_text("[INFO] Grad overflow on iteration 1860\n"
                                        "epoch: 0|step: 3721|ppo_ep: 1|act_loss: nan|cri_loss: nan|unsuper_loss: 0.0\n"
                                        "average reward score: nan\n")
    ev = ingest(tmp_path / "train.log")
    steps, values = ev.series(ev.versions[0], M.REWARD_MEAN)
    assert steps.tolist() == [3721] and math.isnan(values[0])
    # a reward line before any step line belongs to no step
    assert parse_dschat_log("average reward score: 2.0\n") == {}


def test_llamafactory_current_steps_and_an_elision_line():
    lines = ['{"current_steps": 10, "total_steps": 1287, "loss": -0.1994, "reward": 0.13}',
             "...",
             '{"current_steps": 20, "total_steps": 1287, "loss": -0.1902, "reward": 0.1398}']
    with pytest.warns(IngestWarning, match=r"x.jsonl:2: 1 line\(s\) that are only an elision mark"):
        recs = parse_jsonl_metrics(lines, "x.jsonl")
    assert recs == {10: {"total_steps": 1287.0, "loss": -0.1994, "reward": 0.13},
                    20: {"total_steps": 1287.0, "loss": -0.1902, "reward": 0.1398}}
    # a line of other text is still refused
    with pytest.raises(Exception, match=r"x.jsonl:2: not JSON"):
        parse_jsonl_metrics([lines[0], "... and more", lines[2]], "x.jsonl")


def test_an_evaluation_dict_is_no_training_step_and_its_keys_go_under_eval():
    text = ("{'loss': 0.0, 'grad_norm': 0.0, 'completions/mean_length': 77.5, 'reward': 4.0, 'epoch': 0.01}\n"
            "{'eval_loss': 3.45e-08, 'eval_runtime': 62.4, 'num_tokens': 1001646.0, "
            "'completions/mean_length': 40.1, 'epoch': 0.01}\n"
            "{'loss': 0.0, 'grad_norm': 0.0, 'completions/mean_length': 78.5, 'reward': 4.0, 'epoch': 0.02}\n")
    recs = parse_dict_log(text)
    assert sorted(recs) == [1, 2]  # the eval dict joins step 1; before, it was step 2 and halved the length
    assert recs[1]["completions/mean_length"] == 77.5 and recs[1]["eval_completions/mean_length"] == 40.1
    assert recs[1]["eval_num_tokens"] == 1001646.0 and recs[2]["completions/mean_length"] == 78.5
    assert eval_renamed({"loss": 1.0, "reward": 2.0}) is None
    assert eval_renamed({"eval_reward": 1.0, "epoch": 0.5}) == {"eval_reward": 1.0, "epoch": 0.5}


PRIME_TRAINER = """\
[default0]:15:41:26    INFO Starting training step 9
[default0]:15:41:30 SUCCESS Step 9 | Time: 4.29s | Loss: 0.0000 | Entropy: 0.3571 | Mismatch KL: 0.0007 | Grad. Norm: 0.0000 | LR: 3.00e-06 | Peak Mem.: 17.4 GiB
[default0]:15:41:34 SUCCESS Step 10 | Time: 3.27s | Loss: 0.0000 | Entropy: 0.3794 | Mismatch KL: 0.0007 | Grad. Norm: 0.0000 | LR: 3.00e-06 | Peak Mem.: 17.4 GiB
"""


def test_labels_of_several_words_in_pipe_separated_fields():
    # prime-rl#1117's trainer console: 'Grad. Norm' was read as 'Norm', 'Mismatch KL' (trainer vs inference) as 'KL'
    records, reader = parse_text_log(PRIME_TRAINER)
    assert reader == "'key=value' lines" and sorted(records) == [9, 10]
    assert records[9] == {"time": 4.29, "loss": 0.0, "entropy": 0.3571, "mismatch_kl": 0.0007, "grad_norm": 0.0,
                          "lr": 3e-06, "peak_mem": 17.4}
    # a '|' line of 'key=value' pairs keeps the one-token reading
    text = "step 1 | loss=0.12 reward=0.5 kl=0.001\nstep 2 | loss=0.10 reward=0.6 kl=0.002\n"
    assert parse_text_log(text)[0] == {1: {"loss": 0.12, "reward": 0.5, "kl": 0.001},
                                       2: {"loss": 0.10, "reward": 0.6, "kl": 0.002}}


def test_a_line_without_a_step_belongs_to_the_next_line_with_one():
    # prime-rl#2280's orchestrator: the filter line before each 'Step N |' line was a step of its own (1, 3)
    text = ("00:27:06    INFO Detected 97/128 rollouts (gibberish=2, zero_advantage=95), enforced 95\n"
            "00:27:06 SUCCESS Step 9 | Time: 3.20s | Reward: 0.9912 | Seq. Length: 331.1 tokens/sample\n"
            "00:27:08    INFO Detected 97/128 rollouts (gibberish=1, zero_advantage=96), enforced 96\n"
            "00:27:08 SUCCESS Step 10 | Time: 2.20s | Reward: 0.9912 | Seq. Length: 332.0 tokens/sample\n")
    records, _ = parse_text_log(text)
    assert records == {9: {"gibberish": 2.0, "zero_advantage": 95.0, "time": 3.2, "reward": 0.9912, "seq_length": 331.1},
                       10: {"gibberish": 1.0, "zero_advantage": 96.0, "time": 2.2, "reward": 0.9912,
                            "seq_length": 332.0}}


NEMO = """\
Logged data to logs/exp_001/train_data_step3.jsonl

📊 Training Results:
  • Loss: 0.0502
  • Avg Reward: 0.0879
  • Mean Generation Length: 314.4863

⏱️  Timing:
  • Total step time: 10.82s

========================= Step 5/29687 =========================
▶ Generating responses for batch of size 512...
📊 Training Results:
  • Loss: 0.0498
  • Avg Reward: 0.0912
  • Mean Generation Length: 310.0
"""


def test_nemo_rl_result_blocks_belong_to_their_step_banner():
    records, reader = parse_text_log(NEMO)
    assert reader == "NeMo-RL 'Training Results:' blocks"
    # the first block precedes the first banner (a paste cut mid-step): it is step 5 - 1; the timing block is no record
    assert records == {4: {"loss": 0.0502, "reward": 0.0879, "response_length/mean": 314.4863},
                       5: {"loss": 0.0498, "reward": 0.0912, "response_length/mean": 310.0}}


def test_a_verl_step_line_the_paste_wrapped_is_joined_back():
    # verl#1224's shape: the line broke before ' - ' and inside tokens ('actor/ppo_kl:0.0' / '00', 'c' / 'ritic/...')
    text = ("(TaskRunner pid=3591053) step:1049 - global_seqlen/min:16832.000 - global_seqlen/mean:16842.000\n"
            " - actor/entropy_loss:0.001 - critic/vf_loss:0.087 - actor/ppo_kl:0.0\n"
            "00 - actor/grad_norm:0.629 - c\n"
            "ritic/score/mean:0.104 - critic/score/max:0.133\n"
            "When I check the log, the response length seems exceptional high.\n"
            "step:1050 - global_seqlen/min:16000.000 - actor/entropy_loss:0.002\n")
    records, reader = parse_text_log(text)
    assert reader == "verl 'step:N - k:v' lines"
    assert records == {1049: {"global_seqlen/min": 16832.0, "global_seqlen/mean": 16842.0, "actor/entropy_loss": 0.001,
                              "critic/vf_loss": 0.087, "actor/ppo_kl": 0.0, "actor/grad_norm": 0.629,
                              "critic/score/mean": 0.104, "critic/score/max": 0.133},
                       1050: {"global_seqlen/min": 16000.0, "actor/entropy_loss": 0.002}}
    # prose, a fence and a lone token after a step line are no continuation
    assert join_verl_wraps("step:1 - a:1.0 - b:2.0\n```\nNote - see the log: below\nINFO:x\n") == \
        "step:1 - a:1.0 - b:2.0\n```\nNote - see the log: below\nINFO:x\n"


def test_consecutive_verl_step_lines_are_not_joined():
    text = "".join(f"step:{i} - critic/score/mean:{i / 10} - timing_s/step:1.5\n" for i in range(1, 4))
    assert join_verl_wraps(text) == text
    assert sorted(parse_text_log(text)[0]) == [1, 2, 3]


def test_a_new_users_probes_of_the_new_readers():
    # a config printed first no longer hides the log's own format (DeepSpeed's config lines are console dicts)
    cfg = "[INFO] [config.py:1000:print] data_efficiency_config ... {'enabled': False, 'seed': 1234, 'num_epochs': 3}\n"
    steps = "".join(f"epoch: 0|step: {i}|ppo_ep: 1|act_loss: 0.5|cri_loss: 0.25|unsuper_loss: 0.0\n"
                    f"average reward score: {i / 10}\n" for i in range(5))
    records, reader = parse_text_log(cfg + steps)
    assert reader == "DeepSpeed-Chat 'epoch: E|step: N|...' lines" and sorted(records) == [0, 1, 2, 3, 4]
    # a dict holding a dict (DeepSpeed's engine configuration) is no step of the TRL dicts after it
    text = ("DeepSpeedEngine configuration: {'train_batch_size': 64, 'zero_optimization': {'stage': 2}, 'bf16': "
            "{'enabled': True}}\n{'loss': 0.1, 'reward': 0.2, 'epoch': 0.1}\n{'loss': 0.2, 'reward': 0.3, 'epoch': 0.2}\n")
    assert parse_dict_log(text) == {1: {"loss": 0.1, "reward": 0.2, "epoch": 0.1},
                                    2: {"loss": 0.2, "reward": 0.3, "epoch": 0.2}}
    # a step of nan is no step (it ended the file with "cannot convert float NaN to integer")
    kv = "iter: 1 | loss: 0.5 | reward: 0.1\niter: 2 | loss: 0.4 | reward: 0.2\niter: nan | loss: nan | reward: nan\n"
    recs = parse_text_log(kv)[0]
    assert sorted(recs) == [1, 2, 3] and math.isnan(recs[3]["loss"])  # the third line keeps its place: 3
    # step-less lines that outnumber the stepped ones keep their places (a checkpoint line now and then)
    lines = "".join(f"loss={i / 100} reward={i / 50}\n" for i in range(1, 41))
    lines += "saved at global_step 40 (loss=0.4, reward=0.8)\n"
    recs = parse_text_log(lines)[0]
    assert sorted(recs) == list(range(1, 41)) and recs[1] == {"loss": 0.01, "reward": 0.02}  # before: all at 40
    # NeMo-RL lines behind a logger's prefix
    nemo = ("2025-03-01 10:01:00 | ===== Step 3/100 =====\n2025-03-01 10:01:05 | 📊 Training Results:\n"
            "2025-03-01 10:01:05 |   • Loss: 0.05\n2025-03-01 10:01:05 |   • Avg Reward: 0.25\n")
    assert parse_text_log(nemo)[0] == {3: {"loss": 0.05, "reward": 0.25}}
    # a verl line that broke between ' -' and ' key'
    verl = "step:1 - a/x:1.0 -\n b/y:2.0 - c/z:3.0\nstep:2 - a/x:1.5 - b/y:2.5 - c/z:3.5\n"
    assert parse_text_log(verl)[0] == {1: {"a/x": 1.0, "b/y": 2.0, "c/z": 3.0}, 2: {"a/x": 1.5, "b/y": 2.5, "c/z": 3.5}}
