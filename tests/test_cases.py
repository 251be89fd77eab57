"""Acceptance: `evotrainer diagnose` on every diagnosis case and on the real verl logs.

Each case folder (copied from ../shared/cases into tests/data/cases) holds a run in another
framework's format and expected.json: every kind under `must` is reported with severity warn or
blocking, no kind under `must_not` is. The analyzers are general; nothing here is special-cased.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evotrainer.cli import app

DATA = Path(__file__).parent / "data"
CASES = sorted(p for p in (DATA / "cases").iterdir() if (p / "expected.json").exists())
VERL_LOGS = sorted((DATA / "verl_logs").glob("*.log.gz"))


def _diagnose(path: Path, out: Path) -> dict:
    res = CliRunner().invoke(app, ["diagnose", str(path), "--json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# Real cases whose `must` needs analyzers that judge levels (one step) rather than trends; the analyzers
# work (issue 17) makes them pass. strict: a case that starts passing fails here until it leaves this list.
AWAITING_LEVEL_ANALYZERS: dict[str, str] = {
    # emptied by issue 17's level analyzers: trl_all_groups_zero_std and rllm_verl_solve_none_all_prompts
    # (zero variance from one step's batch statistics), openr1_accuracy_falls_format_rises (reward hacking as a
    # change on 3 steps), slime_grad_norm_1e9 (grad norm ~3e9 as a level), trl_quickstart_all_truncated
    # (clipped ratio 1.0 as a level)
}


def _case_param(c: Path):
    reason = AWAITING_LEVEL_ANALYZERS.get(c.name)
    return pytest.param(c, id=c.name, marks=[pytest.mark.xfail(strict=True, reason=reason)] if reason else [])


@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_case_must_and_must_not(case: Path, tmp_path: Path):
    expected = json.loads((case / "expected.json").read_text())
    report = _diagnose(case, tmp_path)
    failures = {f["kind"] for f in report["findings"] if f["severity"] in ("warn", "blocking")}
    assert set(expected["must"]) <= failures, f"missing {set(expected['must']) - failures}: {report['findings']}"
    assert not failures & set(expected["must_not"]), f"false alarms {failures & set(expected['must_not'])}"
    assert report["plots"] and all(Path(p).exists() for p in report["plots"])


def test_cases_are_all_there():
    assert {c.name for c in CASES} >= {"format_reward_hacking", "nan_after_kl_overflow", "truncation_all_clipped",
                                       "zero_variance_easy_data"}
    assert len(CASES) >= 15 and sum(c.name.startswith("healthy_") for c in CASES) >= 5
    assert set(AWAITING_LEVEL_ANALYZERS) <= {c.name for c in CASES}
    for c in CASES:  # every real case cites its source; the first four are paraphrased (no SOURCE.md)
        if c.name not in ("format_reward_hacking", "nan_after_kl_overflow", "truncation_all_clipped",
                          "zero_variance_easy_data"):
            assert "https://" in (c / "SOURCE.md").read_text() or "verl-project/verl" in (c / "SOURCE.md").read_text(), c
        if c.name.startswith("healthy_"):
            assert json.loads((c / "expected.json").read_text())["must"] == [], c
    # the verl-log test checks Qwen and SFT logs by name: an empty or renamed set would pass it vacuously
    names = [p.name for p in VERL_LOGS]
    assert sum(n.startswith("Qwen2.5-0.5B") for n in names) == 2 and sum("sft" in n for n in names) == 1, names


def _kinds(report: dict, severities=("warn", "blocking")) -> set[str]:
    return {f["kind"] for f in report["findings"] if f["severity"] in severities}


@pytest.mark.parametrize("log", VERL_LOGS, ids=[p.name.split(".log")[0] for p in VERL_LOGS])
def test_real_verl_logs_diagnose(log: Path, tmp_path: Path):
    report = _diagnose(log, tmp_path)
    kinds = _kinds(report)
    # None of these runs diverged numerically, truncated everything or hacked a reward.
    assert not kinds & {"nan_blowup", "truncation", "reward_hacking", "train_eval_divergence", "zero_variance_groups"}
    name = log.name
    if name.startswith("Qwen2.5-0.5B"):
        # Checked against the series: actor/entropy_loss falls from ~0.5 (steps 0-10) to ~0.05 at the
        # end (x0.2): entropy_collapse. actor/grad_norm has spikes (65.96 at step 16 against a ~2
        # median), but nothing suffers from them: the score keeps rising right after (0.086 at step 16,
        # 0.18 at step 18), entropy and KL move by less than 2x and 5x around each spike, and the
        # validation score rises 0.0008 -> 0.57. Until issue 17 these spikes were a warning; calibrated
        # on healthy real runs, harmless spikes are info (the finding stays, with the steps).
        assert "entropy_collapse" in kinds and "grad_spike" not in kinds
        spikes = [f for f in report["findings"] if f["kind"] == "grad_spike"]
        assert [f["severity"] for f in spikes] == ["info"] and spikes[0]["data"]["n_spikes"] >= 5
        assert spikes[0]["data"]["damaged_after"] == {} and 33 in spikes[0]["steps"]  # a spike of both logs
    if "sft" in name:
        assert report["findings"] == []  # an SFT log: loss and lr only, nothing to judge


def test_diagnose_an_evotrainer_workspace(tmp_path: Path):
    import numpy as np

    from evotrainer import metrics as M
    from evotrainer.recipe import Recipe
    from evotrainer.workspace import Workspace

    with Workspace(tmp_path / "run", writer=True) as ws:
        v = ws.lineage.create_root(Recipe())
        for step in range(40):  # entropy decays 0.8 -> ~0.01; reward and grad norm healthy
            ws.lineage.log_metrics(v.id, step, {M.POLICY_ENTROPY: 0.8 * np.exp(-step / 6) + 0.01,
                                                M.REWARD_MEAN: 0.3 + 0.005 * step, M.POLICY_GRAD_NORM: 0.3})
    res = CliRunner().invoke(app, ["diagnose", str(tmp_path / "run"), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert _kinds(report) == {"entropy_collapse"}
    assert report["plots"] == [str(tmp_path / "run" / "reports" / "diagnose" / "v0.png")]
    # --fail-on warn turns a warn finding into exit code 2 for scripts / CI
    res = CliRunner().invoke(app, ["diagnose", str(tmp_path / "run"), "--no-plots", "--fail-on", "warn"])
    assert res.exit_code == 2 and "entropy_collapse" in res.stdout


def test_diagnose_plot_folder_drops_log_and_compression_suffixes():
    # the README's verl log wrote its plots to diagnose/<name>.log/ (only .gz was stripped)
    from evotrainer.harness.cli import _bare_name

    assert _bare_name(Path("logs/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log.gz")) == \
        "Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567"
    assert _bare_name(Path("metrics.jsonl")) == "metrics" and _bare_name(Path("trl_out")) == "trl_out"
    assert _bare_name(Path(".log")) == ".log"  # never an empty name
