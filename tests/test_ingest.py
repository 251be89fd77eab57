"""Ingest of foreign runs: verl logs, TRL trainer_state.json, TensorBoard (OpenRLHF / TRL tags), JSONL, rollout dumps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evotrainer import metrics as M
from evotrainer.aliases import canonical, map_record
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.ingest import IngestError, IngestWarning, ingest, parse_verl_log

DATA = Path(__file__).parent / "data"
ING = DATA / "ingest"


def _s(ev: Evidence, name: str, v: str | None = None) -> list[tuple[int, float]]:
    steps, values = ev.series(v or ev.versions[0], name)
    return list(zip(steps.tolist(), values.tolist(), strict=True))


def test_alias_table_maps_foreign_names():
    assert canonical("actor/entropy_loss") == M.POLICY_ENTROPY  # old verl name of the entropy
    assert canonical("actor/entropy") == M.POLICY_ENTROPY
    assert canonical("critic/score/mean") == M.REWARD_MEAN
    assert canonical("val/test_score/openai/gsm8k") == M.EVAL_AVG_AT_K
    assert canonical("rewards/accuracy_reward/mean") == "reward/correctness/mean"
    assert canonical("rewards/format_reward/std") == "reward/format/std"
    assert canonical("train/actor_grad_norm") == M.POLICY_GRAD_NORM  # OpenRLHF TensorBoard
    assert canonical("eval/eval_gsm8k_pass1") == M.EVAL_PASS_AT_1
    assert canonical("policy/entropy") == M.POLICY_ENTROPY  # ours map to themselves
    assert canonical("critic/vf_loss") == "critic/vf_loss"  # unknown keys are kept


def test_map_record_collision_and_scaled_units():
    rec = map_record({"critic/kl": 0.1, "actor/kl_loss": 0.2, "actor/lr(1e-4)": 0.01})
    # actor/kl_loss comes first in the alias table, so it owns policy/kl; critic/kl keeps its name
    assert rec[M.POLICY_KL] == 0.2 and rec["critic/kl"] == 0.1
    assert rec[M.POLICY_LR] == pytest.approx(1e-6)  # 0.01 in units of 1e-4


def test_parse_verl_log_lines():
    text = (
        "\x1b[36m(main_task pid=1)\x1b[0m \"Initial validation metrics: {'test_score/openai/gsm8k': 0.25}\"\n"
        "(main_task pid=1) step:0 - actor/entropy_loss:0.500 - actor/pg_loss:nan - critic/score/mean:0.1\n"
        "noise line without steps\n"
        "(main_task pid=1) step:0 - response_length/mean:300.5\n"
        "(main_task pid=1) step:1 - actor/entropy_loss:0.400 - actor/grad_norm:inf - critic/score/mean:0.2\n"
        "\"Final validation metrics: {'test_score/openai/gsm8k': 0.5}\"\n"
    )
    recs = parse_verl_log(text)
    assert recs[0]["actor/entropy_loss"] == 0.5 and math.isnan(recs[0]["actor/pg_loss"])
    assert recs[0]["response_length/mean"] == 300.5  # a second line of step 0 merges
    assert recs[0]["test_score/openai/gsm8k"] == 0.25  # initial validation at step 0
    assert recs[1]["test_score/openai/gsm8k"] == 0.5  # final validation at the last step
    assert math.isinf(recs[1]["actor/grad_norm"])


def test_parse_verl_log_numpy_scalars():
    # verl's concat_dict_to_str prints each value with pprint.pformat: under numpy >= 2 a numpy scalar prints as
    # np.float64(0.323) (NEP 51), and these values were dropped (a log of them read as nothing)
    recs = parse_verl_log("(TaskRunner pid=7) step:3 - actor/entropy:np.float64(0.323) - actor/kl_loss:np.float64(nan)"
                          " - batch/solve_none:np.int64(128) - actor/lr:np.float32(1e-06) - x:np.float64(oops)\n")
    assert recs[3]["actor/entropy"] == 0.323 and math.isnan(recs[3]["actor/kl_loss"])
    assert recs[3]["batch/solve_none"] == 128.0 and recs[3]["actor/lr"] == 1e-06 and "x" not in recs[3]


def test_ingest_real_verl_log():
    ev = ingest(DATA / "verl_logs" / "Qwen2.5-0.5B-bsz256_2-prompt512-resp256-0.538.log.gz")
    v = ev.versions[0]
    assert v == "Qwen2.5-0.5B-bsz256_2-prompt512-resp256-0.538"
    ent = _s(ev, M.POLICY_ENTROPY)
    assert len(ent) == 435 and ent[0] == (0, 0.45)  # "step:0 - ... actor/entropy_loss:0.450"
    assert _s(ev, M.POLICY_GRAD_NORM)[0] == (0, 2.078)
    assert _s(ev, M.POLICY_LR)[0][1] == pytest.approx(0.010 * 1e-4)  # actor/lr(1e-4):0.010
    evals = _s(ev, M.EVAL_AVG_AT_K)
    assert evals[0] == (0, 0.0)  # "Initial validation metrics: {'test_score/openai/gsm8k': 0.0}"
    assert evals[-1][1] == pytest.approx(0.5190548780487805)  # the final validation, at the last step
    assert "critic/vf_loss" in ev.metrics[v]  # unknown keys kept


def test_ingest_trainer_state_case():
    ev = ingest(DATA / "cases" / "format_reward_hacking")
    assert ev.versions == ["format_reward_hacking"]
    assert _s(ev, M.REWARD_MEAN)[0] == (1, pytest.approx(0.6365933199901155))
    assert _s(ev, "reward/correctness/mean")[0][1] == pytest.approx(0.16652197367236718)  # accuracy_reward
    assert _s(ev, M.REWARD_FRAC_ZERO_STD)[0][1] == pytest.approx(0.22853031582702754)
    assert len(_s(ev, M.POLICY_ENTROPY)) == 100


def test_ingest_openrlhf_tensorboard():
    ev = ingest(ING / "openrlhf_tb")
    steps, values = ev.series(ev.versions[0], M.LOSS_POLICY)
    assert steps.tolist() == [1, 2, 3, 4] and values == pytest.approx([0.1, 0.2, 0.3, 0.4])  # float32 in TB
    assert _s(ev, M.POLICY_KL)[2] == (3, pytest.approx(0.03))
    assert _s(ev, M.COMPLETIONS_MEAN_LENGTH)[0] == (1, 101.0)
    assert _s(ev, M.POLICY_ENTROPY)[0] == (1, pytest.approx(0.4))
    assert _s(ev, M.COMPLETIONS_CLIPPED_RATIO)[0] == (1, 0.25)
    assert _s(ev, M.REWARD_KEPT_GROUP_FRAC)[0] == (1, 0.75)
    assert _s(ev, M.EVAL_PASS_AT_1) == [(2, pytest.approx(0.4))]
    assert _s(ev, M.EVAL_PASS_AT_K) == [(2, pytest.approx(0.7))]
    # OpenRLHF's PolicyLoss clip_ratio, the clipped-token fraction (verl's pg_clipfrac)
    assert _s(ev, M.POLICY_CLIP_FRAC)[0] == (1, pytest.approx(0.02))


def test_diagnose_openrlhf_run_with_our_reward_file_tags():
    # tests/data/openrlhf_tb (written by make_openrlhf_tb.py with OpenRLHF's tags): the leaky format_token
    # term rises 0.1 -> 1.0 (train/format_token) while train/correct falls 0.35 -> 0.15
    from evotrainer.harness.analyzers import run_analyzers

    ev = ingest(DATA / "openrlhf_tb")
    assert _s(ev, "reward/format_token/mean")[0] == (1, pytest.approx(0.1))
    assert _s(ev, M.CORRECT_MEAN)[-1] == (16, pytest.approx(0.15))
    kinds = {f.kind: f for f in run_analyzers(ev) if f.is_failure}
    assert kinds["reward_hacking"].severity == "blocking"
    assert "reward/format_token/mean" in kinds["reward_hacking"].evidence


def test_ingest_trl_tensorboard():
    ev = ingest(ING / "trl_tb")
    assert _s(ev, M.REWARD_MEAN) == [(10, pytest.approx(0.1)), (20, pytest.approx(0.2))]
    assert _s(ev, "reward/correctness/mean")[0][1] == pytest.approx(0.3)
    assert _s(ev, "reward/format/mean")[0][1] == pytest.approx(0.9)
    assert _s(ev, M.REWARD_FRAC_ZERO_STD)[0][1] == 0.5
    assert _s(ev, M.COMPLETIONS_CLIPPED_RATIO)[0][1] == 0.125


def test_ingest_several_tensorboard_runs_and_trainer_state_file(tmp_path):
    import shutil

    shutil.copytree(ING / "openrlhf_tb", tmp_path / "tb" / "run_a")
    shutil.copytree(ING / "trl_tb", tmp_path / "tb" / "run_b")
    ev = ingest(tmp_path / "tb")
    assert sorted(ev.versions) == ["run_a", "run_b"]
    assert _s(ev, M.REWARD_MEAN, "run_b") == [(10, pytest.approx(0.1)), (20, pytest.approx(0.2))]
    assert len(_s(ev, M.LOSS_POLICY, "run_a")) == 4
    one = ingest(DATA / "cases" / "zero_variance_easy_data" / "trainer_state.json")
    assert one.versions == ["zero_variance_easy_data"]  # the folder of a trainer_state.json names the run


def test_ingest_jsonl_metrics(tmp_path):
    ev = ingest(ING / "metrics.jsonl")
    assert _s(ev, M.REWARD_MEAN) == [(1, 0.5), (2, 0.6)]
    ent = _s(ev, M.POLICY_ENTROPY)
    assert ent[0] == (1, 0.7) and math.isnan(ent[1][1])  # "nan" strings are non-finite values, not dropped
    assert _s(ev, "my_custom") == [(1, 3.0), (2, 4.0)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"reward": 1}\n')
    with pytest.raises(IngestError, match="bad.jsonl:1: no step key"):
        ingest(bad)
    bad.write_text('{"step": 1, "reward": 1}\n\n{oops\n{"step": 2}\n')  # line 2 is blank (skipped), line 3 is broken
    with pytest.raises(IngestError, match=r"bad.jsonl:3: not JSON \(Expecting property name"):
        ingest(bad)
    # the same broken record as the last line is a paste's cut: left out, with a warning (its pairs name no step)
    bad.write_text('{"step": 1, "reward": 1}\n\n{oops\n')
    with pytest.warns(IngestWarning, match=r"bad.jsonl:3: the last line is cut off \(not JSON\) before its step"):
        assert _s(ingest(bad), M.REWARD_MEAN) == [(1, 1.0)]
    bad.write_text('oops\n')  # one line that is no record at all: refused
    with pytest.raises(IngestError, match=r"bad.jsonl:1: not JSON"):
        ingest(bad)
    bad.write_bytes('\ufeff{"step": 1, "reward": 1}\n{"step": 2, "reward": 0.5}\n'.encode())  # a BOM: dropped
    assert _s(ingest(bad), M.REWARD_MEAN) == [(1, 1.0), (2, 0.5)]


def test_ingest_verl_rollout_dump():
    ev = ingest(ING / "verl_dump")
    t = ev.rollouts
    assert t.num_rows == 8  # 2 steps x 2 prompts x 2 samples
    rows = t.to_pylist()
    assert {r["step"] for r in rows} == {3, 4}
    # groups: the 2 samples of one input within a step
    g = [r for r in rows if r["step"] == 3 and r["prompt"] == "What is 2+3?"]
    assert [r["sample_idx"] for r in g] == [0, 1] and len({r["group_id"] for r in g}) == 1
    # the group id is the same in every process: "p" + the first 12 hex digits of SHA-1("What is 2+3?")
    assert g[0]["group_id"] == g[0]["prompt_id"] == "p49f7c46309e7"
    assert [r["reward"] for r in g] == [1.0, 0.0] and g[0]["answer"] == "5"
    assert json.loads(g[0]["components"]) == {"acc": 1.0}
    # per-step metrics derived from the rollouts: reward mean (1+0+1+0)/4 = 0.5, every group has variance
    assert _s(ev, M.REWARD_MEAN) == [(3, 0.5), (4, 0.5)]
    assert _s(ev, M.REWARD_FRAC_ZERO_STD) == [(3, 0.0), (4, 0.0)]


def test_verl_dump_bad_line_is_named(tmp_path):
    from evotrainer.harness.ingest import read_verl_dump

    f = tmp_path / "3.jsonl"
    f.write_text('{"input": "q", "output": "a", "score": 1}\n{oops\n')
    with pytest.raises(IngestError, match=r"3.jsonl:2: not JSON"):
        read_verl_dump(f, "v")


def test_ingest_trl_completions_parquet():
    ev = ingest(ING / "trl_run")
    rows = ev.rollouts.to_pylist()
    assert len(rows) == 4
    assert [r["reward"] for r in rows] == [2.0, 1.0, 1.0, 2.0]  # accuracy + format, TRL's default weights 1
    assert [r["advantage"] for r in rows] == [0.7, -0.7, 0.0, 0.0]
    # group "Sum 1+1" has rewards (2, 1): variance; group "Sum 2+2" has (1, 2): variance -> 0 of 2 zero-std
    assert _s(ev, M.REWARD_FRAC_ZERO_STD) == [(5, 0.0)]
    # duplicates across prompts: "4" twice for the same prompt is not a cross-prompt duplicate
    assert _s(ev, M.COMPLETIONS_DUPLICATE_FRAC) == [(5, 0.0)]


def test_ingest_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        ingest(tmp_path / "missing")
    (tmp_path / "notes.log").write_text("hello\n")
    with pytest.raises(IngestError, match=r"notes.log: no training metrics found \(tried: verl 'step:N - key:value' "
                                          r"lines, AReaL 'Train step' tables, console dicts, tqdm bars with numbers \(OpenRLHF\), "
                                              r"mlx-lm 'Iter N: ...' lines, DeepSpeed-Chat 'epoch: E\|step: N\|...' "
                                              r"lines, NeMo-RL 'Training Results:' blocks, W&B's 'Run summary:', "
                                              r"'Step \| ...' tables, "
                                              r"'key=value' lines\)") as exc:
        ingest(tmp_path / "notes.log")
    # the error says what each readable format looks like, one line each
    msg = str(exc.value)
    assert "'step:12 - actor/entropy:0.41" in msg and "global_step/max_steps" in msg and "mlruns/<exp>" in msg
    assert len(msg.splitlines()) == 15  # the first line, then one line per format
    empty = tmp_path / "empty_run"
    empty.mkdir()
    with pytest.raises(IngestError, match="no run files"):
        ingest(empty)


def test_evidence_round_trip_through_files(tmp_path):
    ev = ingest(ING / "verl_dump")
    ev.add_series("dump", M.POLICY_KL, [(3, 0.1), (4, float("nan"))])
    back = Evidence.from_dir(ev.to_dir(tmp_path / "ev"))
    s, x = back.series("dump", M.POLICY_KL)
    assert s.tolist() == [3, 4] and x[0] == 0.1 and np.isnan(x[1])
    assert back.rollouts.num_rows == 8


def test_a_folder_of_separate_runs_read_as_one_version_is_said(tmp_path):
    """Two verl console logs side by side that log the same metric at the same steps with other values (separate
    runs) are read as one version, the later file's values kept: an IngestWarning names the file, the metric and
    the steps (a new user's report: a folder of three verl logs gave a divergence none of them has alone). A run
    resumed in a second file that re-logs two steps, and files with disjoint steps, say nothing."""
    import warnings

    from evotrainer.harness.ingest import CLASH_MIN_STEPS, IngestWarning

    def log(path: Path, steps: range, reward: float) -> None:
        path.write_text("".join(f"step:{s} - critic/score/mean:{reward + s / 100:.3f} - response_length/mean:10.0\n"
                                for s in steps))

    runs = tmp_path / "runs"
    runs.mkdir()
    log(runs / "a.log", range(1, 9), 0.1)
    log(runs / "b.log", range(1, 9), 0.5)  # same steps, other rewards: another run
    with pytest.warns(IngestWarning, match=r"b\.log logs critic/score/mean at 8 steps \(1\.\.8\) that the files "
                                           r"read before it \(from a\.log on\) logged with other values"):
        ev = ingest(runs)
    assert list(ev.metrics) == ["runs"]  # still one version, as before; the warning says so
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    log(resumed / "a.log", range(1, 9), 0.1)
    log(resumed / "b.log", range(9 - (CLASH_MIN_STEPS - 1), 15), 0.3)  # re-logs 2 steps, then goes on
    apart = tmp_path / "apart"
    apart.mkdir()
    log(apart / "a.log", range(1, 9), 0.1)
    log(apart / "b.log", range(9, 15), 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IngestWarning)
        for folder in (resumed, apart):
            ev = ingest(folder)
            assert len(ev.series(folder.name, M.REWARD_MEAN)[0]) == 14
