"""Review 17, reading a run's lineage store (a run folder from elsewhere is hostile within the store's caps).

E2-R17: a store of 30 versions with two 1.0 MB summaries each (under every cap) made ``lineage show --json`` take
27.1 s and 1.76 GB and print 428 MB on a loaded 2-core machine: printed at ``indent=2``, every entry of a summary's
list took a line indented ``2 * (2d + 3)`` spaces for a version ``d`` deep, and nothing held the whole output.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from evotrainer.cli import JSON_SHOW_FIELD_MAX_CHARS, MAX_JSON_SHOW_CHARS, app, show_json_text
from evotrainer.intervention import Intervention
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace


def _chain(run, n: int, per_sample: int, metric_chars: int, decisions: int = 0) -> None:
    """A run of v0 and a chain v1..vN under it, written through LineageStore's own API: each version kept, with an
    ``eval_summary`` holding a ``per_sample`` list of ``per_sample`` zeros and a 256-entry ``metrics_summary`` of
    names ``metric_chars`` long."""
    Workspace.init(run, Recipe())
    with Workspace.open(run, writer=True) as ws:
        parent = "v0"
        for i in range(n):
            v = ws.lineage.branch(parent, Intervention(path="actor_learning_rate", old=1e-6 * (i + 1),
                                                       new=1e-6 * (i + 2), category="optimizer"))
            ms = {f"m{j:03d}" + "x" * metric_chars: 0.5 for j in range(256)}
            ws.lineage.update_version(v.id, status="kept", metrics_summary=ms,
                                      eval_summary={"avg@k": 0.25, "k": 4, "per_sample": [0] * per_sample})
            for d in range(decisions):
                ws.lineage.decide(v.id, "keep", f"{v.id} decision {d} " + "r" * 500)
            parent = v.id


def _show_json(run) -> str:
    res = CliRunner().invoke(app, ["lineage", "show", str(run), "--json"])
    assert res.exit_code == 0, res.output
    return res.stdout


def test_show_json_prints_summaries_compact_not_once_per_indent_level(tmp_path):
    """The cause: 12 versions deep with 20,000-entry lists (each summary under the field cap, so nothing is cut)
    printed each list entry on its own indented line; now each summary is one line, so the output is about the store's own size."""
    run = tmp_path / "run"
    _chain(run, 12, per_sample=20_000, metric_chars=4)
    out = _show_json(run)
    data = json.loads(out)
    assert data["truncated"] is False and data["cut"] == []
    node, depth = data["tree"], 0
    while node["children"]:
        node, depth = node["children"][0], depth + 1
        assert node["eval_summary"]["per_sample"] == [0] * 20_000 and len(node["metrics_summary"]) == 256
    assert depth == 12
    stored = 12 * len(json.dumps({"avg@k": 0.25, "k": 4, "per_sample": [0] * 20_000}))
    assert len(out) < 1.5 * stored  # was ~12 x 20,000 lines of up to 55 spaces: 9.0 MB for 0.72 MB of summaries


def test_show_json_cuts_each_large_summary_and_says_so(tmp_path):
    run = tmp_path / "run"
    _chain(run, 6, per_sample=100_000, metric_chars=1200)  # two ~300 KB summaries a version
    out = _show_json(run)
    data = json.loads(out)  # valid JSON
    assert data["truncated"] is True
    cuts = {(c["version"], c["field"]): c for c in data["cut"]}
    assert sorted(cuts) == sorted((f"v{i}", f) for i in range(1, 7) for f in ("eval_summary", "metrics_summary"))
    ev = cuts[("v1", "eval_summary")]
    assert ev["left_out"] == 1 and ev["left_out_keys"] == ["per_sample"] and ev["chars"] > 300_000
    ms = cuts[("v1", "metrics_summary")]
    assert ms["left_out"] == 256 - 52 and ms["kept_chars"] <= JSON_SHOW_FIELD_MAX_CHARS  # 1,220 chars an entry
    v1 = data["tree"]["children"][0]
    assert v1["eval_summary"] == {"avg@k": 0.25, "k": 4}  # the headline kept, the long list left out
    assert len(v1["metrics_summary"]) == 52 and all(x == 0.5 for x in v1["metrics_summary"].values())
    assert len(out) < 12 * JSON_SHOW_FIELD_MAX_CHARS + 20_000 < MAX_JSON_SHOW_CHARS  # was 3.6 MB of summaries


def test_show_json_holds_the_whole_output_to_its_budget(tmp_path):
    """Past the total budget the versions after it (pre-order) are left out, then the oldest decisions; the JSON
    stays valid and says what it left out. (The budget is a parameter so the run stays small.)"""
    run = tmp_path / "run"
    _chain(run, 10, per_sample=5_000, metric_chars=10, decisions=20)
    with Workspace.open(run) as ws:
        tree = ws.lineage.tree()
        decisions, total = ws.lineage.decisions_brief(None, last=1000)
    text = show_json_text(tree, [d.model_dump() for d in decisions], total - len(decisions), budget=100_000)
    assert len(text) <= 100_000
    data = json.loads(text)
    assert data["truncated"] is True
    ids, node = [], data["tree"]
    while node:
        ids.append(node["id"])
        node = node["children"][0] if node["children"] else None
    assert 1 < len(ids) < 11
    assert {"field": "tree", "versions_left_out": 11 - len(ids)} in data["cut"]
    left = next(c["left_out"] for c in data["cut"] if c["field"] == "decisions")
    assert data["decisions_omitted"] == left > 0 and len(data["decisions"]) == 200 - left
    assert data["decisions"][-1]["rationale"].startswith("v10 decision 19 ")  # the newest kept


def test_show_json_of_a_normal_run_is_whole_and_says_nothing_was_cut(tmp_path):
    run = tmp_path / "run"
    _chain(run, 3, per_sample=8, metric_chars=20, decisions=2)
    with Workspace.open(run) as ws:
        tree = json.loads(json.dumps(ws.lineage.tree()))
        decisions = [json.loads(json.dumps(d.model_dump(), default=str)) for d in ws.lineage.decisions()]
    assert json.loads(_show_json(run)) == {"tree": tree, "decisions": decisions, "decisions_omitted": 0,
                                           "truncated": False, "cut": []}


# --- review 16's residue: the report's eval matrices and metric series under a total budget ---------------------
def _measured_run(run, n: int, samples: int, steps: int) -> None:
    """v0 and n kept children, each with ``samples`` heldout eval samples and 5 metric series of ``steps`` points."""
    Workspace.init(run, Recipe())
    with Workspace.open(run, writer=True) as ws:
        for i in range(n):
            v = ws.lineage.branch("v0", Intervention(path="actor_learning_rate", old=1e-6, new=1e-6 * (i + 2),
                                                     category="optimizer"))
            ws.lineage.log_eval_samples(v.id, "heldout", [(f"p{j // 4}", j % 4, float(j % 2), "")
                                                          for j in range(samples)])
            with ws.lineage.tx() as db:  # one transaction (log_metrics makes one a step)
                db.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)",
                               [(v.id, s, f"reward/c{k}", 0.5) for s in range(steps) for k in range(5)])
            ws.lineage.update_version(v.id, status="kept", eval_summary={"avg@k": 0.5, "k": 4})


def test_the_report_reads_eval_matrices_and_metric_points_within_its_budgets_and_says_so(tmp_path):
    from evotrainer.agents.report import REPORT_SERIES_POINTS_MAX, ReportLineage, render_html

    run = tmp_path / "run"
    _measured_run(run, 4, samples=400, steps=6_000)
    with Workspace.open(run) as ws:
        lin = ReportLineage(ws.lineage, eval_budget=1_000, points_budget=60_000)
        html = render_html(ws, lin)
    assert lin.eval_samples <= 1_000 and len(lin.evals_left_out) == 2  # two matrices of 400 fit, two do not
    assert all(n == 400 for n in lin.evals_left_out.values())
    assert "Left out of this report: 2 eval matrices of 800 samples in all" in html
    # 4 versions x 5 series x 6,000 points: each version's share of 60,000 is 15,000: 3,000 a series
    assert lin.metric_points <= 60_000 and sorted(lin.metrics_cut) == ["v1", "v2", "v3", "v4"]
    assert all(rows == 30_000 and 0 < kept <= 15_000 for rows, kept in lin.metrics_cut.values())
    assert "Thinned in this report: the metric series of 4 versions" in html
    with Workspace.open(run) as ws:  # the default budgets: each series thinned to REPORT_SERIES_POINTS_MAX
        lin = ReportLineage(ws.lineage)
        series = lin.all_metrics("v1")
    assert len(series) == 5 and all(len(p) <= REPORT_SERIES_POINTS_MAX < 6_000 for p in series.values())


def test_the_report_of_a_normal_run_reads_everything_and_says_nothing_is_left_out(tmp_path):
    from evotrainer.agents.report import ReportLineage, render_html

    run = tmp_path / "run"
    _measured_run(run, 2, samples=40, steps=50)
    with Workspace.open(run) as ws:
        lin = ReportLineage(ws.lineage)
        html = render_html(ws, lin)
        assert lin.eval_matrix("v1") == ws.lineage.eval_matrix("v1") and len(lin.eval_matrix("v1")) == 10
        assert lin.all_metrics("v2") == ws.lineage.all_metrics("v2")
    assert lin.eval_samples == 80 and lin.metric_points == 500 and not lin.evals_left_out and not lin.metrics_cut
    assert "evals-left-out" not in html and "metrics-left-out" not in html


def test_the_report_draws_a_stored_score_outside_its_own_ci(tmp_path):
    """A crafted store whose stored Avg@k (0.95) lies above the CI of its own samples (all wrong: [0, 0]) ended the
    report in matplotlib's "'yerr' must not contain negative values"; the bar is drawn with no upper whisker."""
    from evotrainer.agents.report import ReportLineage, render_html

    run = tmp_path / "run"
    Workspace.init(run, Recipe())
    with Workspace.open(run, writer=True) as ws:
        v = ws.lineage.branch("v0", Intervention(path="actor_learning_rate", old=1e-6, new=3e-6, category="optimizer"))
        ws.lineage.log_eval_samples(v.id, "heldout", [(f"p{j // 4}", j % 4, 0.0, "") for j in range(40)])
        ws.lineage.update_version(v.id, status="kept", eval_summary={"avg@k": 0.95, "k": 4})
    with Workspace.open(run) as ws:
        html = render_html(ws, ReportLineage(ws.lineage))
    assert "0.950" in html and "data:image/png;base64," in html
