"""Readers of pasted logs added 2026-12-07 (late): DeepSpeed-Chat's step-3 console, LLaMA-Factory's trainer_log.jsonl
(``current_steps``), elision marks in JSONL, and evaluation dicts that TRL logs partly without the ``eval_`` prefix.
The real excerpts are cases in tests/data/cases (SOURCE.md there); these are hand-made lines with hand values."""

from __future__ import annotations

import math

import pytest

from evotrainer import metrics as M
from evotrainer.harness.ingest import IngestWarning, ingest, parse_jsonl_metrics, parse_text_log
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
