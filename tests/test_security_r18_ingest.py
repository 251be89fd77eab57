"""Review 18 (C-R18b): a W&B chart export of 1,000 runs x 3 metrics (784 KB) made 1,000 versions: ``diagnose
--no-plots`` took 146 s and 462 MB, with plots it was killed at 300 s after 584 PNGs. One ingest reads at most
MAX_IMPORT_RUNS runs now (the first ones, said), and ``diagnose`` plots at most MAX_PLOTTED_VERSIONS versions."""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evotrainer import metrics as M
from evotrainer.cli import app
from evotrainer.harness import ingest_formats as F
from evotrainer.harness.findings import Finding
from evotrainer.harness.importer import RunImportError, import_run
from evotrainer.harness.ingest import MAX_IMPORT_RUNS, IngestWarning, ingest
from evotrainer.harness.plots import MAX_PLOTTED_VERSIONS, versions_to_plot

METRICS = ("reward/mean", "actor/entropy", "actor/kl")
STEPS = 40


def _wandb_csv(path: Path, n_runs: int) -> Path:
    """The reviewer's export: ``Step`` then ``r<i> - <metric>`` for each run and metric; run i's reward at step s
    is ``s * 0.01 + i`` (so a run's values say which run they are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = ["Step"] + [f"r{i} - {m}" for i in range(n_runs) for m in METRICS]
    rows = [[str(s)] + [x for i in range(n_runs) for x in (f"{s * 0.01 + i:.3f}", f"{2 * math.exp(-s / 3):.3f}",
                                                             f"{0.01 * s * s:.3f}")] for s in range(STEPS)]
    path.write_text("\n".join(",".join(r) for r in [head, *rows]) + "\n")
    return path


def _ingest_noted(path: Path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IngestWarning)
        ev = ingest(path)
    return ev, [str(w.message) for w in caught if issubclass(w.category, IngestWarning)]


def test_the_caps_are_named():
    assert MAX_IMPORT_RUNS == 64 and MAX_PLOTTED_VERSIONS == 16


def test_a_wandb_export_past_the_cap_reads_its_first_runs_and_says_so(tmp_path):
    n = MAX_IMPORT_RUNS + 36
    src = _wandb_csv(tmp_path / "export" / "export.csv", n)
    t0 = time.perf_counter()
    ev, notes = _ingest_noted(src.parent)
    took = time.perf_counter() - t0
    assert ev.versions == [f"r{i}" for i in range(MAX_IMPORT_RUNS)]  # the first ones, in column order
    assert ev.series("r63", M.REWARD_MEAN)[1][:2].tolist() == pytest.approx([63.0, 63.01])
    assert len(ev.series("r0", M.REWARD_MEAN)[0]) == STEPS
    said = [m for m in notes if "MAX_IMPORT_RUNS" in m]
    assert len(said) == 1 and "36 runs left out (r64, r65, r66, r67, r68, ...)" in said[0]
    assert f"the first {MAX_IMPORT_RUNS} runs are read" in said[0]
    assert took < 10, took  # 1,000 runs: 1.4 s on a loaded 2-core machine (the diagnose of all took 134 s)


def test_runs_of_several_chart_exports_merge_under_one_cap(tmp_path):
    """W&B exports one CSV per chart: the same runs in each. The first file's runs are kept in the second; a run only
    the second holds past the cap is left out."""
    folder = tmp_path / "charts"
    _wandb_csv(folder / "a.csv", MAX_IMPORT_RUNS)
    (folder / "b.csv").write_text("Step,r0 - actor/grad_norm,zz - actor/grad_norm\n1,0.5,0.7\n2,0.25,0.9\n")
    ev, notes = _ingest_noted(folder)
    assert len(ev.versions) == MAX_IMPORT_RUNS and "zz" not in ev.versions
    assert ev.series("r0", M.POLICY_GRAD_NORM)[1].tolist() == [0.5, 0.25]
    assert any("1 runs left out (zz)" in m for m in notes)


def test_an_mlflow_folder_past_the_cap_reads_its_first_runs(tmp_path):
    root = tmp_path / "mlruns"
    for i in range(MAX_IMPORT_RUNS + 3):
        d = root / "0" / f"run{i:03d}" / "metrics"
        d.mkdir(parents=True)
        (d / "loss").write_text(f"1700000000000 {i} 1\n")
    ev, notes = _ingest_noted(root)
    assert sorted(ev.versions) == [f"run{i:03d}" for i in range(MAX_IMPORT_RUNS)]
    assert any("3 runs left out (run064, run065, run066)" in m for m in notes)


def test_parse_wandb_csv_max_runs_keeps_the_first_and_lists_the_rest():
    text = "Step,a - x,b - x,loss,c - x,a - y\n1,1,2,3,4,5\n"
    left: list[str] = []
    runs = F.parse_wandb_csv(text, "t.csv", max_runs=1, left_out=left)
    assert set(runs) == {"a", None} and left == ["b", "c"]
    assert dict(runs["a"][1]) == {"x": 1.0, "y": 5.0} and dict(runs[None][1]) == {"loss": 3.0}
    with pytest.raises(ValueError, match="max_runs=0: give a positive whole number"):
        F.parse_wandb_csv(text, "t.csv", max_runs=0)


def test_import_of_a_wide_export_is_refused_quickly_naming_the_cap(tmp_path):
    src = _wandb_csv(tmp_path / "export" / "export.csv", 200)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IngestWarning)
        with pytest.raises(RunImportError, match=f"holds {MAX_IMPORT_RUNS} runs"):
            import_run(src, tmp_path / "run")
    assert time.perf_counter() - t0 < 10
    assert any("136 runs left out" in str(w.message) for w in caught)


def test_versions_to_plot_prefers_flagged_versions_and_caps(tmp_path):
    src = _wandb_csv(tmp_path / "e" / "export.csv", 20)
    ev = ingest(src)
    flagged = Finding(analyzer="t", kind="entropy_collapse", severity="warn", versions=["r19"], explanation="x")
    info = Finding(analyzer="t", kind="note_only", severity="info", versions=["r18"], explanation="x")
    chosen = versions_to_plot(ev, [flagged, info], max_versions=3)
    assert chosen == ["r0", "r1", "r19"]  # the flagged one first, then the first others; in the evidence's order
    assert versions_to_plot(ev, [], max_versions=MAX_PLOTTED_VERSIONS) == [f"r{i}" for i in range(16)]
    with pytest.raises(ValueError, match="max_versions=0: give a positive"):
        versions_to_plot(ev, [], max_versions=0)


def test_diagnose_of_a_wide_export_reads_and_plots_within_the_caps(tmp_path):
    src = _wandb_csv(tmp_path / "export" / "export.csv", MAX_IMPORT_RUNS + 10)
    out = tmp_path / "plots"
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["diagnose", str(src.parent), "--json", "--no-skills", "--out", str(out)])
    took = time.perf_counter() - t0
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert len(payload["summary"]["versions"]) == MAX_IMPORT_RUNS
    assert len(payload["plots"]) == MAX_PLOTTED_VERSIONS == len(list(out.glob("*.png")))
    assert payload["plots_note"].startswith(f"plots of {MAX_PLOTTED_VERSIONS} of {MAX_IMPORT_RUNS} versions "
                                            "(MAX_PLOTTED_VERSIONS")
    assert f"{MAX_IMPORT_RUNS - MAX_PLOTTED_VERSIONS} not plotted" in payload["plots_note"]
    assert took < 120, took
