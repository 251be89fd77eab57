"""The report of a real tiny run (issue 20): which version won and is it real.

One tiny autonomous run (examples/tiny.yaml: a random 2-layer model, 1-digit arithmetic; 3 versions of 2
steps, one branch per round plus its control arm, 4 test problems) is made once for the module; every test
reads its lineage, rollouts and report. The run's shape: v0 (root, steps 0-1) -> round 1: v1 (branch) and
v2 (control) from v0 -> round 2: two children of the round-1 frontier.
"""

from __future__ import annotations

import base64
import html as htmllib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from evotrainer import metrics as M
from evotrainer.agents.loop import best_kept, run_summary
from evotrainer.agents.report import (
    answer_line,
    best_version,
    curve_panels,
    gain_text,
    lineage_curves,
    recipe_rows,
    render_html,
    sample_rows,
    score_rows,
    summary_table,
    write_report,
)
from evotrainer.agents.runner import run_loop
from evotrainer.cli import app
from evotrainer.config import load_run_config
from evotrainer.intervention import Intervention
from evotrainer.recipe import Recipe
from evotrainer.rl_backend.tasks import is_test_eval
from evotrainer.rollouts import make_record
from evotrainer.workspace import Workspace


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = load_run_config("examples/tiny.yaml")
    cfg = cfg.model_copy(update={
        "budget": cfg.budget.model_copy(update=dict(max_versions=3, steps_per_version=2, branches_per_round=1)),
        "recipe": cfg.recipe.model_copy(update={"data": cfg.recipe.data.model_copy(update={"n_test": 4})})})
    root = tmp_path_factory.mktemp("report") / "run"
    run_loop(cfg, root, "heuristic", "evotrainer", resume=False)
    return root


@pytest.fixture
def ws(run):
    w = Workspace.open(run)
    yield w
    w.close()


def _section(page: str, ident: str) -> str:
    i = page.index(f'id="{ident}"')
    return page[i:page.index("</table>", i)]


def test_best_version_block_names_the_final_answer_its_gains_and_checkpoint(ws):
    final = ws.lineage.kv_get("loop/final")
    vid = final["version"]
    v = ws.lineage.get(vid)
    b = best_version(ws)
    assert b["version"] == vid and b["source"] == "final" and b["finished"]
    assert b["checkpoint"] == str(ws.root / "checkpoints" / vid) and (ws.root / "checkpoints" / vid).is_dir()
    assert b["dev"]["avg@k"] == v.eval_summary["avg@k"] and b["dev_ci"] is not None
    assert b["vs_parent"]["version"] == v.parent_id  # the gate's paired gain over the parent
    if v.is_control:  # the control arm has no control of its own: the block says so
        assert b["vs_control"] is None
    else:
        assert b["vs_control"]["version"] == ws.lineage.control_of(vid).id
    assert b["vs_no_rl"]["version"] == "no-RL" and b["vs_no_rl"]["n_problems"] == 8  # every dev problem, paired
    # the run has finished: the final answer's test score is shown
    assert b["test"] == final["test"] and b["test"]["n_problems"] == 4
    block = render_html(ws)
    block = block[block.index('id="best-version"'):block.index("</div>", block.index('id="best-version"'))]
    assert f"Best version: {vid}" in block and htmllib.escape(b["checkpoint"]) in block
    assert gain_text(b["vs_parent"]) in block and "on 4 test problems" in block
    assert ("the round&#x27;s control arm" in block) == v.is_control


def test_test_outcomes_are_not_read_while_the_run_is_not_finished(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    w = Workspace.open(copy)
    try:
        w.lineage.kv_set("loop/finished", None)  # as during the run (the final record is still there)
        asked = []
        matrix = w.lineage.eval_matrix
        w.lineage.eval_matrix = lambda vid, name="heldout": asked.append(name) or matrix(vid, name)
        page = render_html(w)
        b = best_version(w)
        assert asked and not [n for n in asked if is_test_eval(n)]  # no test outcome was read
        assert "test" not in b and "no_rl_test" not in b and not b["finished"]
        assert "sealed: the run is not finished" in page and "test problems" not in page
        assert "test split (sealed during the run): final answer" not in page
        w.lineage.kv_set("loop/final", None)  # before the final record: the orchestrator's frontier is the answer
        b = best_version(w)
        assert b["source"] == "frontier" and b["version"] == w.lineage.kv_get("loop/frontier")
        assert "current frontier" in render_html(w)
    finally:
        w.close()


def test_curves_start_a_child_at_its_parent_last_global_step(ws):
    lin = ws.lineage
    curves = lineage_curves(ws)
    # v0 trained steps 0-1; round 1 (v1, v2) trains from v0: global steps 2-3, curves led by v0's last point (1)
    assert [s for s, _ in curves["v0"][M.POLICY_ENTROPY]] == [0, 1]
    for child in ("v1", "v2"):
        assert lin.get(child).parent_id == "v0" and lin.step_offset(child) == 2
        pts = curves[child][M.POLICY_ENTROPY]
        assert [s for s, _ in pts] == [1, 2, 3]
        assert pts[0] == curves["v0"][M.POLICY_ENTROPY][-1]  # the parent's last point, value included
    # round 2 trains from the round-1 frontier: global steps 4-5, led by that version's last step 3
    r2 = [v for v in lin.versions() if v.parent_id not in (None, "v0")]
    assert r2 and all(lin.step_offset(v.id) == 4 for v in r2)
    assert all([s for s, _ in curves[v.id][M.POLICY_ENTROPY]] == [3, 4, 5] for v in r2)
    page = render_html(ws)
    steps = page[page.index('id="global-steps"'):]
    for v in r2:
        assert (f"<td>{v.id}</td><td>{v.parent_id} (its last step 3)</td><td class='num'>4</td>"
                f"<td class='num'>5</td>") in steps
    assert "lineage-global step" in steps


def test_recipe_table_has_the_changes_against_the_root_roles_and_compute(ws):
    lin = ws.lineage
    rows = {r["version"]: r for r in recipe_rows(ws)}
    assert rows["no-RL"]["role"] == "baseline" and rows["v0"]["role"] == "root"
    assert {rows[v.id]["role"] for v in lin.versions() if v.is_control} == {"control"}
    for v in lin.versions():
        assert rows[v.id]["changes"] == lin.diff("v0", v.id) and rows[v.id]["status"] == v.status
    c = lin.kv_get("loop/compute")
    assert sum(r["train_tokens"] for r in rows.values()) == c["train_tokens"] > 0
    assert sum(r["eval_tokens"] for k, r in rows.items() if k != "no-RL") == c["eval_tokens"]
    assert rows["no-RL"]["eval_tokens"] == c["no_rl_tokens"]
    table = _section(render_html(ws), "recipe-table")
    branch = next(v for v in lin.versions() if v.interventions)
    path, old, new = lin.diff("v0", branch.id)[0]
    assert f"{path}: {old} &rarr; {new}" in table and f"root values: {path} = {old}" in table
    assert "control" in table and "baseline" in table


def test_summary_json_and_terminal_name_the_same_answer_as_the_html(ws, tmp_path):
    # `report --json` said best_version = the best kept, while the HTML's answer is loop/final
    vid = ws.lineage.kv_get("loop/final")["version"]
    res = CliRunner().invoke(app, ["report", str(ws.root), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)["summary"]
    assert summary["final_version"] == vid == best_version(ws)["version"] and summary["final_source"] == "final"
    assert summary["final_avg_at_k"] == ws.lineage.get(vid).eval_summary["avg@k"]
    assert summary["best_version"] == best_kept(ws.lineage)  # still there, under its own name
    page = render_html(ws)
    assert f"Best version: {vid}</h2>" in page
    # the header says when the run finished, not only that it did (a new user's report had no time)
    at = ws.lineage.kv_get("loop/finished_at")
    assert at >= ws.lineage.kv_get("loop/started_at")
    assert f" &middot; finished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(at))}</p>" in page
    # the terminal: the same answer, under the table, at 80 columns
    line = answer_line(ws)
    assert line.startswith(f"answer: {vid} (final, ") and str(ws.root / "checkpoints" / vid) in line
    # and the test score `evotrainer run` printed at its end (a new user found `report` without it)
    t, base = ws.lineage.kv_get("loop/final")["test"], ws.lineage.kv_get("loop/final")["no_rl_test"]
    assert f"; test Avg@{t['k']} {t['avg@k']:.3f} on {t['n_problems']} problems (no-RL {base['avg@k']:.3f});" in line
    res = CliRunner().invoke(app, ["report", str(ws.root)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert f"answer: {vid} (final" in res.stdout and max(len(x) for x in res.stdout.splitlines()) <= 80


def test_summary_final_version_is_the_frontier_before_the_run_chose_one(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    with Workspace(copy, writer=True) as w:
        w.lineage.kv_set("loop/final", None)
        w.lineage.kv_set("loop/finished", None)
        s = run_summary(w, "evotrainer")
        assert (s["final_version"], s["final_source"]) == (w.lineage.kv_get("loop/frontier"), "frontier")
        assert s["final_version"] == best_version(w)["version"]


def test_cpu_seconds_per_version_are_measured_for_training_and_evaluation(ws):
    lin = ws.lineage
    rows = {r["version"]: r for r in recipe_rows(ws)}
    c = lin.kv_get("loop/compute")
    cores = os.cpu_count() or 1
    trained = [v for v in lin.versions() if lin.last_step(v.id) >= 0]
    assert trained and all(rows[v.id]["steps"] == 2 for v in trained)
    for v in trained:
        r = rows[v.id]
        steps = [x for _, x in lin.metric_series(v.id, M.PERF_STEP_CPU_SECONDS)]
        assert len(steps) == 2 and all(x > 0 for x in steps) and r["train_cpu_s"] == pytest.approx(sum(steps))
        assert 0 < r["train_cpu_s"] <= r["train_s"] * cores * 1.05  # CPU-s cannot outrun wall x cores
        assert 0 < r["eval_cpu_s"] <= r["eval_s"] * cores * 1.05
    assert 0 < rows["no-RL"]["eval_cpu_s"] <= rows["no-RL"]["eval_s"] * cores * 1.05
    # the jobs run in the loop's process: their CPU-s are a part of the run's (getrusage, measured apart)
    per_version = sum(r["train_cpu_s"] + r["eval_cpu_s"] for r in rows.values())
    assert 0 < per_version <= c["cpu_s"]
    # the summary JSON and the HTML table carry the same numbers
    s = run_summary(ws, "evotrainer")
    for v in trained:
        got = s["compute_by_version"][v.id]
        assert got["train_cpu_s"] == rows[v.id]["train_cpu_s"] and got["eval_cpu_s"] == rows[v.id]["eval_cpu_s"]
    assert s["no_rl_compute"]["eval_cpu_s"] == rows["no-RL"]["eval_cpu_s"]
    table = _section(render_html(ws), "recipe-table")
    assert "<th class='num'>train CPU-s</th>" in table and "<th class='num'>dev-eval CPU-s</th>" in table
    r = rows[trained[0].id]
    assert (f"<td class='num'>{r['train_s']:.1f}</td><td class='num'>{r['train_cpu_s']:.1f}</td>"
            f"<td class='num'>{r['eval_s']:.1f}</td><td class='num'>{r['eval_cpu_s']:.1f}</td>") in table


def test_a_version_that_trained_no_step_spent_no_train_cpu(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    with Workspace(copy, writer=True) as w:
        v = w.lineage.branch("v0", Intervention(path="temperature", old=1.0, new=0.9, category="rollout"))
        r = {x["version"]: x for x in recipe_rows(w)}[v.id]
        assert (r["steps"], r["train_tokens"], r["train_s"], r["train_cpu_s"]) == (0, 0, 0.0, 0.0)
        assert r["eval_cpu_s"] is None  # not evaluated: nothing measured, shown as a dash
        assert run_summary(w, "evotrainer")["compute_by_version"][v.id]["train_cpu_s"] == 0.0
        assert ("<td class='num'>0</td><td class='num'>0</td><td class='num'>0.0</td><td class='num'>0.0</td>"
                "<td class='num'>0.0</td><td class='num'>&ndash;</td></tr>") in _section(render_html(w), "recipe-table")


def test_score_table_has_the_no_rl_row_and_the_control_arms(ws):
    rows = score_rows(ws)
    assert rows[0]["role"] == "baseline"
    controls = [v.id for v in ws.lineage.versions() if v.is_control]
    assert controls and {r["name"] for r in rows if r["role"] == "control"} == set(controls)
    table = _section(render_html(ws), "score-table")
    assert all(f"<td>{c}</td><td>control</td>" in table for c in controls)


def test_samples_table_sets_the_best_version_beside_the_base_model(ws):
    best = best_version(ws)["version"]
    label, rows = sample_rows(ws, best)
    assert label == "v0 no-RL (base model)" and len(rows) == 6
    assert all(r["base"]["prompt_id"] == r["best"]["prompt_id"] == r["problem_id"] for r in rows)
    assert all(r["base"]["sample_idx"] == r["best"]["sample_idx"] for r in rows)
    dev = ws.rollouts.to_arrow(where=f"split = 'eval' AND version_id = '{best}'").to_pylist()
    text = next(r["completion"] for r in dev if r["group_id"] == f"heldout-{rows[0]['problem_id']}"
                and r["sample_idx"] == rows[0]["sample_idx"])
    table = _section(render_html(ws), "samples")
    assert "<th>v0 no-RL (base model)</th>" in table and f"<th>{best} (best)</th>" in table
    assert htmllib.escape(text[:600]) in table and rows[0]["prompt"] and htmllib.escape(rows[0]["prompt"]) in table


def test_html_has_the_new_sections_and_stays_self_contained(ws):
    page = write_report(ws).read_text()
    for ident in ("best-version", "score-table", "recipe-table", "samples", "global-steps"):
        assert f'id="{ident}"' in page
    assert page.index('id="best-version"') < page.index('id="score-table"')  # the answer comes first
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(imgs) == 2 and all(base64.b64decode(i)[:4] == b"\x89PNG" for i in imgs)
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "budget max_versions 3, steps_per_version 2," in page and "report_to tensorboard" in page


def test_summary_table_is_readable_at_80_columns(ws, tmp_path):
    with open(tmp_path / "out.txt", "w") as f:
        console = Console(width=80, record=True, file=f)
        console.print(summary_table(ws))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for r in score_rows(ws):  # every number and CI whole on one line
        assert f"{r['avg']:.3f}" in text and f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" in text
        for g in (r.get("vs_control"), r.get("vs_parent")):
            if g:
                assert f"{g['gain']:+.3f} ({g['version']})" in text
                assert f"[{g['ci'][0]:+.3f}, {g['ci'][1]:+.3f}]" in text


def test_total_reward_is_never_overlaid_across_reward_definitions(tmp_path):
    with Workspace(tmp_path / "run", writer=True) as w:
        root = w.lineage.create_root(Recipe())
        same = w.lineage.branch(root.id, Intervention(path="generate_max_len", old=64, new=128, category="rollout"))
        other = w.lineage.branch(root.id, Intervention(path="reward.overlong.weight", old=None, new=1.0,
                                                       category="reward"))
        for vid in (root.id, same.id, other.id):
            for step in range(2):
                w.lineage.log_metrics(vid, step, {M.REWARD_MEAN: 0.5, M.CORRECT_MEAN: 0.4,
                                                  M.reward_component("correctness"): 0.4})
        w.lineage.log_metrics(other.id, 0, {M.reward_component("overlong"): -0.2})
        panels = {(t, n): vs for t, n, vs in curve_panels(w)}
        totals = {t: vs for (t, n), vs in panels.items() if n == M.REWARD_MEAN}
        assert len(totals) == 2 and sorted(totals.values()) == [[root.id, same.id], [other.id]]
        assert all(t.startswith("reward (total) = ") for t in totals)  # each titled with its definition
        assert panels[("correct fraction (verifier)", M.CORRECT_MEAN)] == [root.id, same.id, other.id]
        assert panels[("reward component overlong", M.reward_component("overlong"))] == [other.id]
        assert panels[("reward component correctness", M.reward_component("correctness"))] == [root.id, same.id,
                                                                                                 other.id]
        # a child's total-reward curve joins its parent's only under the same reward definition; correctness always
        curves = lineage_curves(w)
        assert [s for s, _ in curves[same.id][M.REWARD_MEAN]] == [1, 2, 3]
        assert [s for s, _ in curves[other.id][M.REWARD_MEAN]] == [2, 3]
        assert [s for s, _ in curves[other.id][M.CORRECT_MEAN]] == [1, 2, 3]
        assert "<img" in render_html(w)


def test_report_renders_in_headless_chromium(ws, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium) to render the report headless")
    page = write_report(ws)
    png = tmp_path / "report.png"
    res = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                          "--window-size=1280,2400", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and png.is_file(), res.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == 1280
    assert len(data) > 50_000  # a rendered page (text, tables, plots), not a blank one


def test_a_child_of_damaged_weights_starts_after_the_version_it_trains_from(tmp_path):
    # v1's weights are damaged (pruned for entropy collapse): its child v2 trains from v0, so its curve follows v0's
    with Workspace(tmp_path / "run", writer=True) as w:
        lin = w.lineage
        v0 = lin.create_root(Recipe())
        v1 = lin.branch(v0.id, Intervention(path="generate_max_len", old=64, new=128, category="rollout"))
        for vid, n in ((v0.id, 3), (v1.id, 2)):
            for step in range(n):
                lin.log_metrics(vid, step, {M.POLICY_ENTROPY: 1.0 + step})
        lin.decide(v1.id, "prune", "prune v1: entropy collapsed", damaged_weights="entropy_collapse")
        v2 = lin.branch(v1.id, Intervention(path="temperature", old=1.0, new=0.9, category="rollout"))
        lin.log_metrics(v2.id, 0, {M.POLICY_ENTROPY: 0.5})
        curves = lineage_curves(w)
        assert curves[v1.id][M.POLICY_ENTROPY] == [(2, 3.0), (3, 1.0), (4, 2.0)]
        assert curves[v2.id][M.POLICY_ENTROPY] == [(2, 3.0), (3, 0.5)]  # led by v0's last point, not v1's
        assert f"<td>{v2.id}</td><td>{v0.id} (its last step 2)</td><td class='num'>3</td>" in render_html(w)


def test_sample_completions_are_escaped(tmp_path):
    with Workspace(tmp_path / "run", writer=True) as w:
        lin = w.lineage
        v0 = lin.create_root(Recipe())
        lin.kv_set("loop/frontier", v0.id)
        recs = [make_record(version_id=v0.id, step=0, prompt_id="p0", group_id=f"{name}-p0", sample_idx=0,
                            prompt="What is 1 < 2?", completion=text, reward=c, answer="yes", correct=c, split="eval")
                for name, text, c in (("no_rl", "<script>alert(1)</script>", 0.0), ("heldout", "yes & <b>sure</b>", 1.0))]
        w.rollouts.add(recs)
        table = _section(render_html(w), "samples")
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in table and "<script" not in table
        assert "yes &amp; &lt;b&gt;sure&lt;/b&gt;" in table and "What is 1 &lt; 2?" in table
        assert "<th>v0 no-RL (base model)</th>" in table and "<th>v0 (best)</th>" in table



@pytest.fixture(scope="module")
def memory_seen_by_module_fixtures():
    """The skills folder a module-scoped fixture (like ``run`` above, which trains and decides through the loop)
    would write to: resolved before any function-scoped fixture of a test has run."""
    from evotrainer.skills_db.store import default_skills_dir

    return default_skills_dir().resolve()


def test_module_fixtures_never_write_the_users_skills_memory(memory_seen_by_module_fixtures):
    # the module-scoped `run` fixture wrote its learned analyzers into <XDG data dir>/evotrainer/skills: the
    # function-scoped isolation came too late for it, and the next `make run` on the machine inherited them
    import platformdirs

    user = (platformdirs.user_data_path("evotrainer") / "skills").resolve()
    assert memory_seen_by_module_fixtures != user
    assert str(memory_seen_by_module_fixtures).startswith(str(Path(tempfile.gettempdir()).resolve()))


def test_resuming_a_finished_run_changes_neither_its_compute_nor_its_answer(run, tmp_path):
    """`run --resume` of a finished run replayed every stage and added that process's ~0.1 CPU-s (and its wall time)
    to kv loop/compute each time (stop 28's new user); now it returns the stored summary and writes nothing."""
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    with Workspace.open(copy) as w:
        before = {k: w.lineage.kv_get(k) for k in ("loop/compute", "loop/process_compute", "loop/final",
                                                   "loop/finished_at")}
        n_decisions = len(w.lineage.decisions())
    cfg = load_run_config("examples/tiny.yaml")
    cfg = cfg.model_copy(update={
        "budget": cfg.budget.model_copy(update=dict(max_versions=3, steps_per_version=2, branches_per_round=1)),
        "recipe": cfg.recipe.model_copy(update={"data": cfg.recipe.data.model_copy(update={"n_test": 4})})})
    said: list[str] = []
    summary = run_loop(cfg, copy, "heuristic", "evotrainer", resume=True,
                       on_event=lambda kind, data: said.append(data.get("message", "")) if kind == "log" else None)
    with Workspace.open(copy) as w:
        after = {k: w.lineage.kv_get(k) for k in before}
        assert after == before
        assert len(w.lineage.decisions()) == n_decisions
    assert {k: summary["compute"][k] for k in before["loop/compute"]} == before["loop/compute"]
    assert summary["final_version"] == before["loop/final"]["version"]
    assert said == [f"{copy} has finished; nothing to resume (its report is rewritten)"]
