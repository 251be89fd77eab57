"""Ingest of the formats users paste, each on a real sample under tests/data/ingest (see its SOURCE.md).

TRL console dicts, ms-swift logging.jsonl, newer verl keys, rllm batch/solve_*, slime, AReaL tables,
MLflow metric folders; W&B CSV / history JSON on files written here in W&B's export layout.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evotrainer import metrics as M
from evotrainer.aliases import canonical, map_record, solve_fractions
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.ingest import IngestError, IngestWarning, ingest
from evotrainer.harness.ingest_formats import literal_dict, parse_areal_log, parse_dict_log

ING = Path(__file__).parent / "data" / "ingest"


def _s(ev: Evidence, name: str, v: str | None = None) -> list[tuple[int, float]]:
    steps, values = ev.series(v or ev.versions[0], name)
    return list(zip(steps.tolist(), values.tolist(), strict=True))


def test_trl_console_dicts_real_sample():
    ev = ingest(ING / "trl_console" / "train.log")
    # one whole dict, then one cut off in the issue excerpt (its whole pairs kept): ordinals 1, 2
    assert _s(ev, M.REWARD_MEAN) == [(1, 0.5)]  # the cut dict stops before 'reward'
    assert _s(ev, M.COMPLETIONS_MEAN_LENGTH) == [(1, 506.75), (2, 449.25)]
    assert "reward/code/mean" in ev.metrics[ev.versions[0]] and len(_s(ev, "reward/code/mean")) == 1  # cut pair dropped
    assert _s(ev, M.REWARD_FRAC_ZERO_STD) == [(1, 0.0)]
    assert _s(ev, M.POLICY_ENTROPY) == [(1, pytest.approx(0.40187661349773407))]
    assert _s(ev, M.COMPLETIONS_CLIPPED_RATIO) == [(1, 0.0), (2, 0.0)]
    assert _s(ev, "reward/code/mean") == [(1, 0.5)]  # rewards/code_reward_func/mean
    assert _s(ev, M.POLICY_CLIP_FRAC) == [(1, 0.0)]  # clip_ratio/region_mean
    assert _s(ev, "step_time") == [(1, pytest.approx(238.3076013879995))]  # unknown keys kept


def test_trl_console_old_names_and_progress_bar_blank_line():
    ev = ingest(ING / "trl_console" / "noise.log")
    # four whole dicts and a cut fifth (its loss, grad_norm, learning_rate kept), ordinals 1..5;
    # the progress bar's blank-out line of spaces is skipped
    assert [s for s, _ in _s(ev, M.REWARD_MEAN)] == [1, 2, 3, 4]
    assert _s(ev, M.POLICY_GRAD_NORM)[4] == (5, pytest.approx(0.09924133121967316))
    assert _s(ev, M.REWARD_MEAN)[3][1] == pytest.approx(1.968537563085556)
    assert _s(ev, M.COMPLETIONS_MEAN_LENGTH)[0] == (1, 232.825)  # completion_length (TRL < 0.16)
    assert _s(ev, "reward/hint/mean")[1] == (2, pytest.approx(0.8844376325607299))  # rewards/hint_reward
    assert _s(ev, M.POLICY_KL)[0] == (1, pytest.approx(0.0005371240986278281))


def test_console_dicts_tqdm_on_the_same_line_nan_inf_eval_and_summary():
    text = (" 10%|█         | 1/10 [00:05<00:45,  5.0s/it]{'loss': 0.0, 'reward': nan, 'grad_norm': inf, "
            "'epoch': 0.1}\r 20%|██        | 2/10 [00:10<00:40,  5.0s/it]\n"
            "{'loss': 0.1, 'reward': -0.5, 'kl': tensor(0.25), 'epoch': 0.2}\n"
            "{'eval_loss': 1.0, 'eval_reward': 0.75, 'epoch': 0.2}\n"
            "{'train_runtime': 100.0, 'train_loss': 0.05, 'epoch': 0.2}\n")
    recs = parse_dict_log(text)
    assert sorted(recs) == [1, 2]  # the eval dict joins training record 2; the summary is skipped
    assert math.isnan(recs[1]["reward"]) and recs[1]["grad_norm"] == math.inf
    assert recs[2]["reward"] == -0.5 and recs[2]["kl"] == 0.25 and recs[2]["eval_reward"] == 0.75
    assert "train_runtime" not in recs[2]
    assert literal_dict("{'a': __import__('os')}") == {"a": None}  # parsed, never evaluated


def test_ms_swift_logging_jsonl_real_sample():
    ev = ingest(ING / "swift_jsonl" / "logging.jsonl")
    # "global_step/max_steps": "300/1296" -> step 300; bare NaN kept as NaN
    kl = _s(ev, M.POLICY_KL)
    assert kl[0][0] == 300 and math.isnan(kl[0][1])
    assert _s(ev, M.REWARD_MEAN) == [(300, 1.55)]
    assert _s(ev, "reward/correctness/mean") == [(300, 0.775)]  # rewards/ToolAccuracy/mean
    assert _s(ev, M.COMPLETIONS_CLIPPED_RATIO) == [(300, 0.175)]
    assert _s(ev, "train_speed(iter/s)") == [(300, 0.004094)]  # not read as a scaled unit
    assert "percentage" not in ev.metrics[ev.versions[0]]  # "23.15%" is not a number
    ev = ingest(ING / "swift_jsonl" / "multinode.jsonl")
    assert _s(ev, M.REWARD_FRAC_ZERO_STD) == [(1, 0.515625)]  # "1/547"
    assert _s(ev, "reward/correctness/mean") == [(1, 0.70703125)]  # PointwiseRMAccuracyORM


def test_newer_verl_keys_real_sample():
    ev = ingest(ING / "verl_new_keys" / "train.log")
    assert _s(ev, M.POLICY_ENTROPY) == [(34, pytest.approx(0.22266578674316406))]  # actor/entropy
    assert _s(ev, M.REWARD_MAX) == [(34, 1.0)] and _s(ev, M.REWARD_MIN) == [(34, -1.0)]
    assert _s(ev, M.REWARD_MEAN) == [(34, pytest.approx(-0.0182796623557806))]  # critic/score/mean
    assert _s(ev, "critic/rewards/mean") == [(34, pytest.approx(-0.0182796623557806))]  # second source kept
    assert _s(ev, M.POLICY_CLIP_FRAC) == [(34, pytest.approx(0.0007935191160472839))]
    assert _s(ev, M.POLICY_PPO_KL) == [(34, pytest.approx(-8.163164312320433e-06))]


def test_actor_entropy_wins_over_entropy_loss():
    rec = map_record({"actor/entropy_loss": 0.9, "actor/entropy": 0.4})
    assert rec[M.POLICY_ENTROPY] == 0.4 and rec["actor/entropy_loss"] == 0.9
    assert map_record({"actor/entropy_loss": 0.9})[M.POLICY_ENTROPY] == 0.9  # old verl: the entropy itself
    assert map_record({"critic/rewards/mean": 0.2})[M.REWARD_MEAN] == 0.2  # used when score is absent


def test_rllm_solve_counts_without_denominator_are_kept_raw():
    ev = ingest(ING / "verl_new_keys" / "rllm_solve_none.log")
    v = ev.versions[0]
    assert _s(ev, "batch/solve_none") == [(4, 128.0)] and _s(ev, "batch/solve_all") == [(4, 0.0)]
    assert M.REWARD_FRAC_SOLVE_NONE not in ev.metrics[v]  # no batch/solve_partial: denominator unknown
    assert _s(ev, M.REWARD_MAX) == [(4, 0.0)] and _s(ev, M.REWARD_MIN) == [(4, 0.0)]
    assert _s(ev, M.COMPLETIONS_CLIPPED_RATIO) == [(4, 0.062)]


def test_solve_fractions_with_denominator():
    # rllm counts: 96 none + 8 all + 24 partial = 128 prompts -> 96/128 = 0.75, 8/128 = 0.0625
    assert solve_fractions({"batch/solve_none": 96, "batch/solve_all": 8, "batch/solve_partial": 24}) == {
        M.REWARD_FRAC_SOLVE_NONE: 0.75, M.REWARD_FRAC_SOLVE_ALL: 0.0625}
    # prime-rl fractions: 0.2 + 0.1 + effective 0.7 = 1 -> taken as they are
    assert solve_fractions({"batch/solve_none": 0.2, "batch/solve_all": 0.1, "batch/effective_batch_size": 0.7}) \
        == {M.REWARD_FRAC_SOLVE_NONE: 0.2, M.REWARD_FRAC_SOLVE_ALL: 0.1}
    assert solve_fractions({"batch/solve_none": 128, "batch/solve_all": 0}) == {}
    rec = map_record({"batch/solve_none": 96, "batch/solve_all": 8, "batch/solve_partial": 24})
    assert rec[M.REWARD_FRAC_SOLVE_NONE] == 0.75 and rec["batch/solve_none"] == 96  # raw kept too


def test_slime_step_and_rollout_lines_real_samples():
    ev = ingest(ING / "slime" / "train.log")
    # "step 1: {...}" and "step 28: {...}"; train/ prefix stripped through the alias table
    assert _s(ev, M.POLICY_GRAD_NORM) == [(1, pytest.approx(2955012562.8240876)), (28, pytest.approx(2217390918.482301))]
    assert _s(ev, M.POLICY_ENTROPY) == [(1, pytest.approx(0.6176612973213196)), (28, pytest.approx(0.3434755206108093))]
    assert _s(ev, M.LOSS_POLICY)[1] == (28, pytest.approx(0.14517192542552948))
    assert _s(ev, M.POLICY_LR) == [(1, 1e-07), (28, 1e-07)]  # train/lr-pg_0
    assert "train/lr-pg_1" in ev.metrics[ev.versions[0]]
    ev = ingest(ING / "slime" / "rollout.log")  # "perf 0: {...}" between Ray-prefixed lines
    assert _s(ev, M.COMPLETIONS_CLIPPED_RATIO) == [(0, 0.46484375)]
    assert _s(ev, M.COMPLETIONS_MAX_LENGTH) == [(0, 4096.0)]
    assert _s(ev, "rollout/zero_std/count_0") == [(0, 12.0)]


def test_slime_eval_and_aliases():
    assert canonical("eval/gsm8k") == M.EVAL_AVG_AT_K
    assert canonical("eval/gsm8k-truncated_ratio") == "eval/gsm8k-truncated_ratio"
    assert canonical("eval/loss") == "eval/loss"  # a TRL TensorBoard tag, not a held-out score
    assert canonical("rollout/raw_reward") == M.REWARD_MEAN


def test_areal_table_real_sample():
    ev = ingest(ING / "areal" / "stats.log")
    # no step marker in the excerpt: one table, step 0; split cells ("ppo_actor/ approx_kl") skipped
    assert _s(ev, "ppo_actor/behave_imp_weight/min") == [(0, pytest.approx(0.72796))]
    assert _s(ev, M.POLICY_ADVANTAGE_MEAN) == [(0, 0.0)]  # ppo_actor/advantages/avg
    assert _s(ev, "ppo_actor/seq_len/max") == [(0, 4312.0)]
    assert not [k for k in ev.metrics[ev.versions[0]] if " " in k]


def test_areal_markers_assign_steps():
    text = ("StatsLogger INFO: Epoch 1/2 Step 1/23 Train step 1/46 done.\n╒═══╤═══╕\n"
            "│ grpo_actor/task_reward/avg │ 5.0000e-01 │ grpo_actor/no_eos_ratios/avg │ 1.0000e+00 │\n╘═══╧═══╛\n"
            "│ rollout/reward │ 9.9990e+00 │\n"  # after the table closed: no step
            "StatsLogger INFO: Epoch 1/2 Step 2/23 Train step 2/46 done.\n"
            "│ grpo_actor/task_reward/avg │ 7.5000e-01 │\n")
    assert parse_areal_log(text) == {1: {"grpo_actor/task_reward/avg": 0.5, "grpo_actor/no_eos_ratios/avg": 1.0},
                                     2: {"grpo_actor/task_reward/avg": 0.75}}
    assert map_record({"grpo_actor/no_eos_ratios/avg": 1.0}) == {M.COMPLETIONS_CLIPPED_RATIO: 1.0}


def test_mlflow_metrics_folder_real_sample_and_nested_keys(tmp_path):
    ev = ingest(ING / "mlflow")
    loss = _s(ev, M.LOSS_TOTAL)
    assert len(loss) == 10 and loss[0] == (0, pytest.approx(332.6841735839844)) and loss[9][0] == 9
    run = tmp_path / "mlruns" / "0" / "abc123"
    (run / "metrics" / "train").mkdir(parents=True)
    (run / "metrics" / "train" / "reward").write_text("1700000000000 0.25 10\n1700000000100 0.5 20\n")
    (run / "metrics" / "kl").write_text("1700000000000 nan 10\n")
    (run / "tags").mkdir()
    (run / "tags" / "mlflow.runName").write_text("grpo-lr1e-6")
    (tmp_path / "mlruns" / "0" / "def456" / "metrics").mkdir(parents=True)
    (tmp_path / "mlruns" / "0" / "def456" / "metrics" / "loss").write_text("1700000000000 1.5 3\n")
    ev = ingest(tmp_path / "mlruns")
    assert sorted(ev.versions) == ["def456", "grpo-lr1e-6"]  # one version per run, the run name if tagged
    assert _s(ev, M.REWARD_MEAN, "grpo-lr1e-6") == [(10, 0.25), (20, 0.5)]  # metrics/train/reward = train/reward
    assert math.isnan(_s(ev, M.POLICY_KL, "grpo-lr1e-6")[0][1])
    (run / "metrics" / "kl").write_text("oops\n")
    with pytest.raises(IngestError, match=r"kl:1: not an MLflow metric line"):
        ingest(run)


def test_wandb_csv_chart_export_and_history(tmp_path):
    # the chart export layout (wandb/wandb#5349): Step, "<run> - <metric>", __MIN / __MAX envelope columns
    f = tmp_path / "wandb_export.csv"
    f.write_text('"Step","run-a - train/reward","run-a - train/reward__MIN","run-a - train/reward__MAX",'
                 '"run-b - train/reward","run-b - train/reward__MIN","run-b - train/reward__MAX"\n'
                 '"10","0.25","0.2","0.3","","",""\n"20","0.5","0.4","0.6","0.125","0.1","0.15"\n')
    ev = ingest(f)
    assert sorted(ev.versions) == ["run-a", "run-b"]
    assert _s(ev, M.REWARD_MEAN, "run-a") == [(10, 0.25), (20, 0.5)]  # train/reward, prefix stripped
    assert _s(ev, M.REWARD_MEAN, "run-b") == [(20, 0.125)]  # the empty cell at step 10 is no value
    # a run.history() CSV: _step plus one column per metric, no run prefix -> the file's own version
    h = tmp_path / "history.csv"
    h.write_text("_step,_runtime,_timestamp,reward,kl\n0,1.0,1700000000,0.5,NaN\n1,2.0,1700000001,0.75,0.01\n")
    ev = ingest(h)
    assert ev.versions == ["history"] and _s(ev, M.REWARD_MEAN) == [(0, 0.5), (1, 0.75)]
    assert "_runtime" not in ev.metrics["history"] and math.isnan(_s(ev, M.POLICY_KL)[0][1])
    j = tmp_path / "run_history.json"
    j.write_text(json.dumps([{"_step": 5, "reward": 0.5, "note": "x"}, {"_step": 6, "reward": 0.25}]))
    assert _s(ingest(j), M.REWARD_MEAN) == [(5, 0.5), (6, 0.25)]
    bad = tmp_path / "table.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(IngestError, match=r"table.csv: a CSV without a step column.*columns found: a, b"):
        ingest(bad)


def test_json_that_is_no_run(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"lr": 1e-6}')
    with pytest.raises(IngestError, match=r"config.json: no training metrics found \(tried: trainer_state"):
        ingest(f)


CASES = Path(__file__).parent / "data" / "cases"


def test_wrapped_and_cut_dicts_in_a_paste():
    # a number wrapped by the paste ("4\n30.0" is 430.0); a dict cut off before the next one starts
    # (cut dicts keep their whole pairs; one without a step key takes the ordinal of training records, 1)
    text = "{'reward': 0.5, 'completions/min_length': 4\n30.0, 'step': 7}\n{'reward': 0.25, 'kl\n{'reward': 0.75, 'step': 9}"
    assert parse_dict_log(text) == {7: {"reward": 0.5, "completions/min_length": 430.0}, 1: {"reward": 0.25},
                                    9: {"reward": 0.75}}


def test_the_evidence_real_cases_give_the_analyzers():
    # what the level analyzers must see in the cases tests/test_cases.py awaits (AWAITING_LEVEL_ANALYZERS)
    ev = ingest(CASES / "trl_all_groups_zero_std")
    assert _s(ev, M.REWARD_FRAC_ZERO_STD) == [(1, 1.0)] and _s(ev, M.REWARD_STD) == [(1, 0.0)]
    assert _s(ev, M.POLICY_GRAD_NORM) == [(1, 0.0), (2, 0.0)]  # the second dict is cut after grad_norm
    ev = ingest(CASES / "rllm_verl_solve_none_all_prompts")
    assert _s(ev, M.REWARD_MIN) == _s(ev, M.REWARD_MAX) == [(4, 0.0)]
    assert _s(ev, M.POLICY_ADVANTAGE_MAX) == _s(ev, M.POLICY_ADVANTAGE_MIN) == [(4, 0.0)]  # critic/advantages/*
    ev = ingest(CASES / "openr1_accuracy_falls_format_rises")
    assert [round(x, 3) for _, x in _s(ev, "reward/format/mean")] == [0.476, 0.554, 0.857]
    assert [round(x, 3) for _, x in _s(ev, "reward/correctness/mean")] == [0.16, 0.118, 0.064]
    ev = ingest(CASES / "healthy_swift_grpo_step19")  # the record wrapped inside a number is read whole
    assert _s(ev, M.REWARD_MEAN) == [(19, pytest.approx(0.3872023820877075))]
    assert _s(ev, "completions/min_length") == [(19, 430.0)]
    ev = ingest(CASES / "healthy_verl_gsm8k_grpo_first_step")  # step 0 holds only the validation metrics
    assert _s(ev, M.EVAL_AVG_AT_K) == [(0, 0.508)]  # val-core/openai/gsm8k/acc/mean@1
    assert _s(ev, "val-aux/openai/gsm8k/reward/mean@1") == [(0, 0.565)]
    ev = ingest(CASES / "healthy_verl_quickstart_ppo")
    assert _s(ev, M.REWARD_MAX)[1] == (1, 0.0) and _s(ev, M.POLICY_ADVANTAGE_MAX)[1] == (1, 2.702)


def test_pasted_tables_real_samples():
    ev = ingest(ING / "tables" / "unsloth_notebook.md")  # the HF notebook table, markdown cells
    assert [s for s, _ in _s(ev, M.REWARD_MEAN)] == list(range(1, 12))  # row 12 is cut off: skipped
    assert _s(ev, M.REWARD_MEAN)[7] == (8, 7.5) and _s(ev, M.LOSS_TOTAL)[8] == (9, 0.0001)  # "Training Loss"
    assert _s(ev, M.REWARD_STD)[2] == (3, 0.0)
    assert _s(ev, "reward/match_format_exactly/mean")[0] == (1, 0.0)  # "rewards / match_format_exactly"
    assert _s(ev, M.COMPLETIONS_MEAN_LENGTH)[0] == (1, 445.5)  # completion_length
    ev = ingest(ING / "tables" / "trl_quickstart.txt")  # whitespace columns, a "..." row
    assert _s(ev, M.COMPLETIONS_CLIPPED_RATIO) == [(1, 1.0), (2, 1.0), (10, 1.0)]
    assert _s(ev, M.COMPLETIONS_MEAN_LENGTH) == [(1, 256.0), (2, 256.0), (10, 256.0)]
    assert _s(ev, M.REWARD_MEAN) == [(1, 0.0), (2, 0.0), (10, 0.0)]


def test_a_cut_dict_with_an_escaped_quote_keeps_its_whole_pairs():
    """Known since the redesign: the cut-dict completion ignored backslash escapes, so after ``'it\\'s, fine'`` it
    thought the string ended at ``\\'``, read the comma inside it as a separator and dropped 'reward'."""
    from evotrainer.harness.ingest_formats import complete_pairs, parse_dict_log

    cut = "{'loss': 0.5, 'note': 'it\\'s, fine', 'reward': 0.25, 'kl"
    assert complete_pairs(cut) == "{'loss': 0.5, 'note': 'it\\'s, fine', 'reward': 0.25}"
    assert parse_dict_log(cut) == {1: {"loss": 0.5, "reward": 0.25}}
    assert complete_pairs("{'a': 'x\\\\', 'b': 2, 'c") == "{'a': 'x\\\\', 'b': 2}"  # an escaped backslash ends nothing


def test_a_cut_dict_of_tensor_values_keeps_its_whole_pairs():
    # the comma inside tensor(0.86, device='cuda:0') is the value's, not the dict's: a dict cut inside the next
    # value keeps 'loss' and 'format' (it read as nothing: the cut fell after "tensor(0.86")
    from evotrainer.harness.ingest_formats import complete_pairs, parse_dict_log

    cut = "{'loss': 0.0045, 'format': tensor(0.86, device='cuda:0'), 'accuracy': tensor(0.064"
    assert complete_pairs(cut) == "{'loss': 0.0045, 'format': tensor(0.86, device='cuda:0')}"
    assert parse_dict_log(cut) == {1: {"loss": 0.0045, "format": 0.86}}


def test_a_key_wrapped_by_the_paste_is_joined():
    """CPPO#3's console, pasted at a fixed width: the wrap falls inside a key ('rewards/strict_format_re' / 'ward_func').
    The dict goes on: its 6 pairs after the wrap were dropped before (the span stopped at a line break inside a
    string). A cut dict followed by the next dict's line is still no wrap."""
    text = ("{'loss': 0.0, 'grad_norm': nan, 'rewards/strict_format_re\nward_func': 0.0, 'reward': 0.216, "
            "'reward_std': nan, 'kl': 0.0, 'epoch': 2.12}\n")
    rec = parse_dict_log(text)
    assert list(rec) == [1] and rec[1]["rewards/strict_format_reward_func"] == 0.0 and rec[1]["reward"] == 0.216
    assert math.isnan(rec[1]["reward_std"]) and rec[1]["kl"] == 0.0 and len(rec[1]) == 7
    cut = "{'loss': 0.5, 'rewa\n{'loss': 0.25, 'reward': 1.0}\n"
    assert parse_dict_log(cut) == {1: {"loss": 0.5}, 2: {"loss": 0.25, "reward": 1.0}}


def test_a_dict_pasted_without_its_opening_brace():
    """ms-swift#5571's one line, pasted without its leading '{' (as stored): read as the dict it is; its step from
    'global_step/max_steps' ('5/3766')."""
    line = ("'loss': -0.0, 'grad_norm': 0.0, 'reward': 0.34375, 'reward_std': 0.4397946, 'frac_reward_zero_std': 0.0, "
            "'kl': 0.0, 'global_step/max_steps': '5/3766', 'percentage': '0.13%'}\n")
    assert parse_dict_log(line) == {5: {"loss": -0.0, "grad_norm": 0.0, "reward": 0.34375, "reward_std": 0.4397946,
                                        "frac_reward_zero_std": 0.0, "kl": 0.0}}
    # a text with whole dicts is read as before: the brace is added only where no dict is found
    assert parse_dict_log("{'loss': 0.5}\n'noise': 1}\n") == {1: {"loss": 0.5}}


def test_jsonl_metrics_with_a_cut_last_line(tmp_path):
    """ms-swift#5890's logging.jsonl excerpt ends mid-record: its last line's whole pairs are read (step 10), with a
    warning; before, the whole file was refused ('logging.jsonl:2: not JSON')."""
    p = tmp_path / "logging.jsonl"
    p.write_text('{"loss": -0.0, "grad_norm": 0.0, "reward": 0.643, "global_step/max_steps": "9/547"}\n'
                 '{"loss": -0.0, "grad_norm": 0.0, "reward": 0.690, "global_step/max_steps": "10/547", "elapsed_ti\n',
                 encoding="utf-8")
    with pytest.warns(IngestWarning, match=r"logging.jsonl:2: the last line is cut off \(not JSON\): read its 4 whole"):
        ev = ingest(p)
    assert _s(ev, M.REWARD_MEAN) == [(9, 0.643), (10, 0.690)]
    # a cut line before the last is still an error naming it
    p.write_text('{"loss": 0.1, "step": 1, "rew\n{"loss": 0.2, "step": 2}\n', encoding="utf-8")
    with pytest.raises(IngestError, match=r"logging.jsonl:1: not JSON"):
        ingest(p)


def test_mlx_lm_iter_lines():
    """mlx-lm's GRPO report (mlx_lm/tuner/grpo_trainer.py's print, as pasted in mlx-examples#1233): the step is Iter's
    number; names go to TRL's (Grouped rewards std -> reward_std, <func> mean -> rewards/<func>/mean); units dropped."""
    from evotrainer.harness.ingest_formats import parse_mlx_log

    text = ("Iter 20: Train loss 0.000, Total rewards mean 0.125, Total rewards std 0.250, Grouped rewards mean 0.125, "
            "Grouped rewards std 0.062, KL 0.001, r1_count_xml mean 0.125, r1_count_xml std 0.125, Learning Rate "
            "1.000e-05, It/sec 0.025, Tokens/sec 49.688, Peak mem 34.745 GB\n"
            "Iter 0: Val loss 2.345, Val took 3.2s\n")
    rec = parse_mlx_log(text)
    assert rec[20] == {"loss": 0.0, "reward": 0.125, "reward/batch_std": 0.25, "reward/group_mean": 0.125,
                       "reward_std": 0.062, "kl": 0.001, "rewards/r1_count_xml/mean": 0.125,
                       "rewards/r1_count_xml/std": 0.125, "learning_rate": 1e-05, "it/sec": 0.025,
                       "tokens/sec": 49.688, "peak_mem": 34.745}
    assert rec[0] == {"eval_loss": 2.345, "val_took": 3.2}


def test_trl_ppo_trainer_names(tmp_path):
    """TRL PPOTrainer's console dicts (hongbomiao.com#37684): per-token means mapped; objective/kl (a sum over a
    response's tokens) keeps its name, not policy/kl; val/num_eos_tokens 0 means every response was cut."""
    p = tmp_path / "console.log"
    p.write_text("{'eps': 1, 'objective/kl': 6.81, 'objective/entropy': 114.4, 'objective/scores': 2.36, "
                 "'policy/approxkl_avg': 0.0027, 'policy/clipfrac_avg': 0.0093, 'loss/policy_avg': -0.0032, "
                 "'policy/entropy_avg': 1.111, 'val/num_eos_tokens': 0, 'lr': 9.2e-06, 'episode': 96, 'epoch': 0.11}\n"
                 "{'eps': 1, 'objective/kl': 6.95, 'objective/scores': 1.52, 'val/num_eos_tokens': 3, 'episode': 112}\n",
                 encoding="utf-8")
    ev = ingest(p)
    assert _s(ev, M.REWARD_MEAN) == [(1, 2.36), (2, 1.52)] and _s(ev, M.POLICY_ENTROPY) == [(1, 1.111)]
    assert _s(ev, M.POLICY_PPO_KL) == [(1, 0.0027)] and _s(ev, M.POLICY_CLIP_FRAC) == [(1, 0.0093)]
    assert _s(ev, M.LOSS_POLICY) == [(1, -0.0032)] and _s(ev, M.COMPLETIONS_CLIPPED_RATIO) == [(1, 1.0)]
    assert not ev.has(ev.versions[0], M.POLICY_KL) and _s(ev, "objective/kl") == [(1, 6.81), (2, 6.95)]


def test_wandb_run_summary_at_a_consoles_end(tmp_path):
    """The end of a verl console on Ray as pasted in issues (Agent-R1#32's shape): W&B's sparkline history (no values:
    not read) and its run summary, whose numbers are the last step's (here: every response clipped, a NaN loss)."""
    p = tmp_path / "tail.log"
    p.write_text("(main_task pid=82052) wandb: Run history:\n"
                 "(main_task pid=82052) wandb:                  actor/entropy_loss █▇▇█▆▆▅▆▅▆▄▄▅▅▄▅▃▄▄▃\n"
                 "(main_task pid=82052) wandb: \n"
                 "(main_task pid=82052) wandb: Run summary:\n"
                 "(main_task pid=82052) wandb:              actor/entropy_loss 0.41233\n"
                 "(main_task pid=82052) wandb:                   actor/pg_loss nan\n"
                 "(main_task pid=82052) wandb:                        run_name grpo-qwen\n"
                 "(main_task pid=82052) wandb:      response_length/clip_ratio 1.0\n"
                 "(main_task pid=82052) wandb:            training/global_step 54\n"
                 "(main_task pid=82052) wandb: \n"
                 "(main_task pid=82052) wandb: 🚀 View run at https://wandb.ai/x/y/runs/z\n", encoding="utf-8")
    ev = ingest(p)
    assert _s(ev, M.COMPLETIONS_CLIPPED_RATIO) == [(54, 1.0)] and _s(ev, M.POLICY_ENTROPY) == [(54, 0.41233)]
    (step, loss), = _s(ev, M.LOSS_POLICY)
    assert step == 54 and math.isnan(loss)


def test_a_scripts_own_key_value_lines():
    """A training script's own print (kirang89/ocamler-grpo's learning.log: '[Epoch 0.28]  loss=..  reward=0.102±0.077'):
    records in line order (an epoch is no step), mean±std split; a step word or key sets the step; one line of pairs
    alone (a command line, a config) is no run."""
    from evotrainer.harness.ingest_formats import parse_kv_log

    text = ("[Epoch 0.28]  loss=-0.0469  grad=0.0838  lr=3.58e-06  reward=0.102±0.077  entropy=0.155\n"
            "some other line\n"
            "[Epoch 0.28]  loss=-0.0333  grad=0.0362  lr=3.58e-06  reward=0.066±0.072  entropy=0.090\n")
    assert parse_kv_log(text) == {
        1: {"loss": -0.0469, "grad": 0.0838, "lr": 3.58e-06, "reward": 0.102, "reward/std": 0.077, "entropy": 0.155},
        2: {"loss": -0.0333, "grad": 0.0362, "lr": 3.58e-06, "reward": 0.066, "reward/std": 0.072, "entropy": 0.09}}
    assert parse_kv_log("Step 10: loss=0.12 reward=0.5 +/- 0.1\nstep=11 loss=0.1 reward=0.6\n") == {
        10: {"loss": 0.12, "reward": 0.5, "reward/std": 0.1}, 11: {"loss": 0.1, "reward": 0.6}}
    assert parse_kv_log("2025-01-02 12:00:01 INFO step: 3, loss: 0.5, reward: 0.25\n"
                        "2025-01-02 12:00:09 INFO step: 4, loss: 0.4, reward: 0.5\n") == {
        3: {"loss": 0.5, "reward": 0.25}, 4: {"loss": 0.4, "reward": 0.5}}
    assert parse_kv_log("lr: 1e-6\nbatch_size: 8\nepochs: 3\n") == {}  # a YAML config: one pair a line
    assert parse_kv_log("python train.py --lr=1e-6 --beta=0.04\n") == {}
    assert parse_kv_log("loss=0.1\nloss=0.2\n") == {}  # one pair a line: not enough to call it metrics


def test_windows_line_ends_and_terminal_colours(tmp_path):
    """A dict wrapped across Windows line ends reads as across Unix ones (the \\r\\n was two breaks, and the wrap
    was refused); wandb's own colours around 'wandb:' (as a terminal capture holds them) no longer hide its summary."""
    wrapped = "{'loss': 0.1, 'rew\r\nard': 0.5, 'kl': 0.0\r\n01, 'epoch': 0.1}\r\n"
    assert parse_dict_log(wrapped) == {1: {"loss": 0.1, "reward": 0.5, "kl": 0.001, "epoch": 0.1}}
    p = tmp_path / "tail.log"
    p.write_text("\x1b[34m\x1b[1mwandb\x1b[0m: Run summary:\n"
                 "\x1b[34m\x1b[1mwandb\x1b[0m:   response_length/clip_ratio \x1b[1;36m1.0\x1b[0m\n"
                 "\x1b[34m\x1b[1mwandb\x1b[0m: \n", encoding="utf-8")
    assert _s(ingest(p), M.COMPLETIONS_CLIPPED_RATIO) == [(1, 1.0)]


def test_key_value_lines_that_are_no_run():
    """A new user's pastes: shell exports, config dumps (keys differ line to line) are no run; a header line before
    the steps and a Ray prefix or a logger's file:line are not metrics."""
    from evotrainer.harness.ingest_formats import parse_kv_log

    assert parse_kv_log("export CUDA_VISIBLE_DEVICES=0,1 WORLD_SIZE=2 RANK=0\n"
                        "MASTER_PORT=29500 NNODES=1 NPROC=8 torchrun train.py\n") == {}
    assert parse_kv_log("Namespace(actor_learning_rate=1e-06, init_kl_coef=0.001)\n"
                        "GRPOConfig(output_dir='out', learning_rate=1e-06, beta=0.04)\n") == {}
    text = ("Starting training with lr=1e-6 batch=8\n"
            "(main_task pid=4567) step 1 | loss=0.1 reward=0.1 kl=0.001\n"
            "2025-01-01 - INFO - trainer.py:88 - step: 2, loss: 0.2, reward: 0.2, kl: 0.002\n")
    assert parse_kv_log(text) == {1: {"loss": 0.1, "reward": 0.1, "kl": 0.001},
                                  2: {"loss": 0.2, "reward": 0.2, "kl": 0.002}}


def test_two_wandb_summaries_of_a_resumed_run():
    """A run resumed and finished twice prints two summaries: both are read, each at its _step (the first alone was)."""
    from evotrainer.harness.ingest_formats import parse_wandb_summary

    block = "wandb: Run summary:\nwandb:   _step {}\nwandb:   reward {}\nwandb: \n"
    assert parse_wandb_summary(block.format(100, 0.25) + "training resumed\n" + block.format(200, 0.5)) == {
        100: {"reward": 0.25}, 200: {"reward": 0.5}}
    no_step = "wandb: Run summary:\nwandb:   reward {}\nwandb: \n"
    assert parse_wandb_summary(no_step.format(0.25) + no_step.format(0.5)) == {1: {"reward": 0.25}, 2: {"reward": 0.5}}
