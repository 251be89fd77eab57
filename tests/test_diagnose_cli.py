"""`evotrainer diagnose`: each finding with what it judged, its evidence values and the interventions
from the skills memory that address it (issue 17), on hand-written TRL trainer_state.json runs."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from evotrainer.cli import app


def _trl_run(root: Path, records: list[dict]) -> Path:
    run = root / "trl_run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": len(records), "log_history": records}))
    return run


def _diagnose(run: Path, *extra: str) -> dict:
    res = CliRunner().invoke(app, ["diagnose", str(run), "--json", "--no-plots", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_saturated_groups_point_at_harder_data_and_all_wrong_at_easier(tmp_path: Path):
    # two steps where every group is all correct: frac_reward_zero_std 1.0, accuracy 1.0 ->
    # zero variance from all-right groups: a warning whose first intervention raises the difficulty
    right = [{"step": s, "reward": 1.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0,
              "rewards/accuracy_reward/mean": 1.0} for s in (1, 2)]
    (tmp_path / "a").mkdir()
    (f,) = _diagnose(_trl_run(tmp_path / "a", right))["findings"]
    assert (f["kind"], f["severity"], f["judged"], f["data"]["cause"]) == ("zero_variance_groups", "warn", "level",
                                                                            "all_right")
    assert f["evidence_values"] == [{"series": "reward/frac_zero_std", "version": "trl_run", "n_points": 2,
                                     "steps": [1, 2], "values": [1.0, 1.0]}]
    assert f["interventions"][0]["id"] == "harder_data"
    assert f["interventions"][0]["recipe_path"] == "data.level" and f["interventions"][0]["value"]["by"] == 1
    # the same with accuracy 0: all-wrong groups, blocking, easier data first
    wrong = [{**r, "reward": 0.0, "rewards/accuracy_reward/mean": 0.0} for r in right]
    (tmp_path / "b").mkdir()
    (f,) = _diagnose(_trl_run(tmp_path / "b", wrong))["findings"]
    assert (f["severity"], f["data"]["cause"], f["interventions"][0]["id"]) == ("blocking", "all_wrong", "easier_data")
    # --no-skills: the same finding, no interventions
    (f,) = _diagnose(tmp_path / "b" / "trl_run", "--no-skills")["findings"]
    assert f["interventions"] == [] and f["severity"] == "blocking"


def test_text_report_prints_judgement_evidence_and_what_to_change(tmp_path: Path):
    # one logged step with completions/clipped_ratio 1.0 (as in a pasted TRL console line)
    run = _trl_run(tmp_path, [{"step": 1, "completions/clipped_ratio": 1.0, "completions/mean_length": 512.0,
                               "reward": 0.4, "reward_std": 0.3}])
    res = CliRunner().invoke(app, ["diagnose", str(run), "--no-plots"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())  # the table wraps lines; compare on single spaces
    assert "blocking" in out and "truncation" in out and "100% of completions hit the length cap" in out
    assert "judged: level" in out
    assert "evidence completions/clipped_ratio (1 points) at step 1: 1" in out
    assert "try Double the generation length cap: generate_max_len x2" in out
    # no tools/* metric in this run: tool-use changes (a larger tool-call budget) are not offered
    (f,) = [x for x in _diagnose(run)["findings"] if x["kind"] == "truncation"]
    assert [x["id"] for x in f["interventions"]] == ["raise_max_len", "overlong_shaping"]


def test_value_text_of_every_seed_rule_prints():
    """A crash found on our own compare runs: the text table formatted every op eagerly, so a `set` whose value
    is a list (dynamic_filtering_range [0.1, 0.9]) raised TypeError in float() and diagnose printed nothing."""
    from evotrainer.harness.cli import _value_text
    from evotrainer.skills_db.seed import seed_skills

    assert _value_text({"op": "set", "value": [0.1, 0.9]}) == "= [0.1, 0.9]"
    assert _value_text({"op": "add", "by": -1, "min": 1}) == "-1"
    assert _value_text({"op": "add", "by": 0.04}) == "+0.04"
    assert _value_text({"op": "mul", "by": 3}) == "x3"
    assert _value_text({"op": "toggle"}) == "toggle"
    assert all(_value_text(s.value) for s in seed_skills())
