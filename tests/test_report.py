"""The HTML report: a rendering of a run's stored lineage, metrics, evals and stage records."""

from __future__ import annotations

import base64
import re

import pytest

from evotrainer import metrics as M
from evotrainer.agents.report import bootstrap_ci, render_html, score_rows, write_report
from evotrainer.intervention import Intervention
from evotrainer.lineage import LineageError
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace


def _run(tmp_path):
    """A hand-made two-version run: v0 (root, kept) and v1 (generate_max_len 64 -> 128, pruned)."""
    ws = Workspace(tmp_path / "run")
    lin = ws.lineage
    lin.kv_set("loop/mode", "evotrainer")
    lin.kv_set("loop/brain", "heuristic")
    v0 = lin.create_root(Recipe())
    lin.branch(v0.id, Intervention(path="generate_max_len", old=64, new=128, category="rollout",
                                        hypothesis="answers are cut at the cap", source="skill:overlong_cap"))
    for vid, rewards in (("v0", [0.1, 0.2, 0.3]), ("v1", [0.2, 0.2, 0.1])):
        for step, r in enumerate(rewards):
            lin.log_metrics(vid, step, {M.REWARD_MEAN: r, M.POLICY_ENTROPY: 1.0 - 0.1 * step,
                                        M.COMPLETIONS_MEAN_LENGTH: 20 + step, M.REWARD_FRAC_ZERO_STD: 0.5,
                                        M.POLICY_KL: 0.01 * step, "reward/correctness/mean": r})
    # held-out: 4 problems x 2 samples.  no-RL: 2/8 correct; v0: 4/8; v1: 3/8
    no_rl = [("p0", 0, 1, ""), ("p0", 1, 0, ""), ("p1", 0, 1, ""), ("p1", 1, 0, ""), ("p2", 0, 0, ""),
             ("p2", 1, 0, ""), ("p3", 0, 0, ""), ("p3", 1, 0, "")]
    v0s = [("p0", 0, 1, ""), ("p0", 1, 1, ""), ("p1", 0, 1, ""), ("p1", 1, 1, ""), ("p2", 0, 0, ""),
           ("p2", 1, 0, ""), ("p3", 0, 0, ""), ("p3", 1, 0, "")]
    v1s = [("p0", 0, 1, ""), ("p0", 1, 1, ""), ("p1", 0, 1, ""), ("p1", 1, 0, ""), ("p2", 0, 0, ""),
           ("p2", 1, 0, ""), ("p3", 0, 0, ""), ("p3", 1, 0, "")]
    lin.log_eval_samples("v0", "no_rl", no_rl)
    lin.log_eval_samples("v0", "heldout", v0s)
    lin.log_eval_samples("v1", "heldout", v1s)
    lin.kv_set("loop/eval/v0/no_rl", {"avg@k": 0.25, "k": 2, "pass@k": 0.5, "eval_name": "no_rl"})
    lin.kv_set("loop/eval/v0/heldout", {"avg@k": 0.5, "k": 2, "pass@k": 0.5, "eval_name": "heldout"})
    lin.kv_set("loop/eval/v1/heldout", {"avg@k": 0.375, "k": 2, "pass@k": 0.5, "eval_name": "heldout"})
    lin.update_version("v0", status="trained", eval_summary={"avg@k": 0.5, "k": 2, "eval_name": "heldout"})
    lin.update_version("v1", status="trained", eval_summary={"avg@k": 0.375, "k": 2, "eval_name": "heldout"})
    lin.decide("v0", "keep", "keep v0: root version, no blocking finding", ["eval:heldout:v0"], author="orchestrator")
    lin.decide("v1", "prune", "prune v1: held-out gain -0.125 (95% CI [-0.250, +0.000])", ["eval:heldout:v1"],
               author="orchestrator")
    lin.kv_set("loop/gate/v1", {"gain": -0.125, "ci": [-0.25, 0.0], "promote": False, "blocking": []})
    lin.kv_set("loop/diagnose/v0", {"version_id": "v0", "summary": "", "findings": [
        {"kind": "truncation", "severity": "warn", "explanation": "62% of completions hit the 64-token cap",
         "evidence": [M.COMPLETIONS_CLIPPED_RATIO]}]})
    lin.kv_set("loop/r1/propose", {"parent_id": "v0", "candidates": [], "skills_used": ["overlong_cap"]})
    lin.kv_set("loop/r1/evolve", [{"version": "v1", "name": "length_shift", "registered": False,
                                   "reason": "does not discriminate on known outcomes"}])
    return ws


def test_score_rows_have_the_no_rl_row_and_avg_with_ci(tmp_path):
    ws = _run(tmp_path)
    rows = score_rows(ws)
    assert [r["name"] for r in rows] == ["no-RL (base model)", "v0", "v1"]
    assert [r["avg"] for r in rows] == [0.25, 0.5, 0.375]
    # v0's per-problem means are [1, 1, 0, 0]: every bootstrap mean is in [0, 1] and the CI straddles 0.5
    lo, hi = rows[1]["ci"]
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    ws.close()


def test_bootstrap_ci_of_constant_outcomes_is_a_point():
    # per-problem means all 0.5 -> every resample mean is 0.5
    assert bootstrap_ci({"a": [1, 0], "b": [0, 1], "c": [1, 0]}) == pytest.approx((0.5, 0.5))
    assert bootstrap_ci({}) is None


def test_report_html_has_lineage_scores_plots_and_sections(tmp_path):
    ws = _run(tmp_path)
    path = write_report(ws)
    assert path == ws.root / "reports" / "report.html"
    html = path.read_text()
    # score table with the no-RL row and the Avg@k values
    table = html[html.index('id="score-table"'):]
    table = table[:table.index("</table>")]
    assert "no-RL (base model)" in table and "0.250" in table and "0.500" in table and "0.375" in table
    # lineage tree with both decisions and their rationales
    assert "generate_max_len: 64 -&gt; 128" in html
    assert "prune v1: held-out gain -0.125" in html and "keep v0: root version" in html
    # findings, interventions, analyzers, skills
    assert "62% of completions hit the 64-token cap" in html
    assert "overlong_cap" in html and "length_shift" in html
    # plots: inline base64 PNGs (score bars + metric grid), nothing fetched from outside
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(imgs) == 2
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in imgs)
    assert "http://" not in html and "https://" not in html and "<script" not in html
    ws.close()


def test_report_of_an_empty_run_renders(tmp_path):
    ws = Workspace(tmp_path / "empty")
    html = render_html(ws)
    assert "empty lineage" in html and "no training metrics logged yet" in html
    ws.close()


def test_report_cli(tmp_path):
    from typer.testing import CliRunner

    from evotrainer.cli import app

    _run(tmp_path).close()
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--json"])
    assert res.exit_code == 0, res.output
    import json

    out = json.loads(res.stdout)
    assert out["report"].endswith("reports/report.html")
    assert out["summary"]["best_version"] == "v0" and out["summary"]["no_rl_avg_at_k"] == 0.25


def test_summary_table_folds_long_changes_on_a_narrow_terminal(tmp_path):
    # the fresh-clone user's 80-column log cut "reward.overlong.weight: None -> 1.0; generate_max_len: 16 -> 32"
    from rich.console import Console

    from evotrainer.agents.report import summary_table
    from evotrainer.intervention import Intervention
    from evotrainer.recipe import Recipe
    from evotrainer.workspace import Workspace

    with Workspace(tmp_path / "run", writer=True) as ws:
        root = ws.lineage.create_root(Recipe())
        ivs = [Intervention(path="reward.overlong.weight", old=None, new=1.0, category="reward"),
               Intervention(path="generate_max_len", old=64, new=128, category="rollout")]
        child = ws.lineage.branch(root.id, ivs)
        ws.lineage.log_eval_samples(child.id, "heldout", [("p0", 0, 1.0, ""), ("p1", 0, 0.0, "")])
        ws.lineage.update_version(child.id, eval_summary={"avg@k": 0.5, "k": 1, "eval_name": "heldout"})
        t = summary_table(ws)
        change = t.columns[2]
        assert change.overflow == "fold"
        assert str(list(change.cells)[-1]) == "reward.overlong.weight: None -> 1.0; generate_max_len: 64 -> 128"
        console = Console(width=80, record=True, file=open(tmp_path / "out.txt", "w"))  # noqa: SIM115
        console.print(t)
        assert "…" not in console.export_text()  # folded over lines, never cut with an ellipsis


def test_stored_counts_of_a_foreign_run_cannot_inject_markup(tmp_path):
    """A run folder written elsewhere is input: the counts of the loop's analyzer and compute records went into
    the page unescaped, so a stored ``at_step`` of ``<script>...`` ran in the reader's browser, and a text
    ``n_candidates`` crashed the report (int + str). Every such value is now escaped; a non-number counts 0."""
    ws = _run(tmp_path)
    evil = "<script>alert(1)</script>"
    ws.lineage.kv_set("loop/r1/evolve", [
        {"type": "stopped", "version": "v1", "analyzer": "a", "at_step": evil, "steps_total": evil,
         "saved_steps": evil, "saved_tokens": evil, "reason": "r"},
        {"type": "early_stop", "version": "v1", "saved_steps": evil, "reason": "r", "actual": "bad"},
        {"type": "synthesis", "n_candidates": evil, "n_labels": evil, "n_bad": evil, "n_good": evil}])
    ws.lineage.kv_set("loop/compute", {"train_tokens": evil, "eval_tokens": evil, "no_rl_tokens": evil,
                                       "test_tokens": evil})
    page = render_html(ws)
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "0 candidate rules tried" in page


def test_an_evolve_item_whose_type_is_not_text_is_named_not_a_bare_type_error(tmp_path):
    """Review 20 C1-R20: an item of ``loop/r<n>/evolve`` with ``"type": ["x"]`` (a crafted run) ended ``report``
    with "TypeError: unhashable type: 'list'"; the shape check now names the file, the key, the field and the fix."""
    ws = _run(tmp_path)
    ws.lineage.kv_set("loop/r1/evolve", [{"type": ["x"], "loo": {}}])
    with pytest.raises(LineageError) as e:
        render_html(ws)
    msg = str(e.value)
    assert "lineage.db" in msg and "'loop/r1/evolve'" in msg and "[0].type" in msg
    assert "DELETE FROM kv WHERE key = 'loop/r1/evolve'" in msg
    ws.close()
