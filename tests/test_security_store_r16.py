"""Review 16, the run store and its readers: a run folder crafted elsewhere (``report`` / ``lineage show`` /
``diagnose`` on a foreign run) or written through the MCP tools must not hang or flood its readers.

E2-R16: every intervention of a version was described in full (``lineage show`` 37 s, the report 89 s on a loaded
2-core machine); B2-R16: the report rendered every finding and read kv values without a total budget (20 s, 966 MB,
a 261 MB HTML); J-R16: an unknown version id listed every id (a 20 MB error); A2-R16: counting decisions read them
all; D-R16: a version left ``training`` with nothing trained and no job row stayed so for good.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time

import pytest
from typer.testing import CliRunner

from evotrainer.agents.loop import run_summary
from evotrainer.agents.report import REPORT_FINDINGS_MAX, REPORT_KV_MAX_CHARS, ReportLineage, render_html
from evotrainer.cli import LINEAGE_SHOW_MAX_CHARS, app
from evotrainer.intervention import Intervention
from evotrainer.lineage import DESCRIBE_INTERVENTIONS_MAX, LineageError, LineageStore
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace


def _iv(i: int, chars: int = 40) -> dict:
    return {"path": f"reward.format.params.p{i}", "old": "x" * chars, "new": "y" * chars, "category": "reward",
            "hypothesis": "", "expected_effect": None, "source": "user"}


def _crafted(run, n_versions: int, n_interventions: int, chars: int = 40, ids=None) -> None:
    """A run folder whose versions v1..vN (children of v0, 'kept') each hold ``n_interventions`` interventions,
    written in SQL as a crafted store would be."""
    Workspace.init(run, Recipe())
    db = sqlite3.connect(run / "lineage.db")
    recipe = db.execute("SELECT recipe FROM versions WHERE id='v0'").fetchone()[0]
    ivs = json.dumps([_iv(i, chars) for i in range(n_interventions)])
    now = time.time()
    ids = ids or [f"v{i}" for i in range(1, n_versions + 1)]
    db.executemany("INSERT INTO versions (id, parent_id, recipe, interventions, status, created_at, updated_at) "
                   "VALUES (?, 'v0', ?, ?, 'kept', ?, ?)", [(vid, recipe, ivs, now + i, now + i)
                                                           for i, vid in enumerate(ids, start=1)])
    db.commit()
    db.close()


# --- E2-R16 ------------------------------------------------------------------------------------------------------
def test_describe_change_spells_out_five_interventions_and_counts_the_rest(tmp_path):
    _crafted(tmp_path / "run", 1, 1000)
    with Workspace.open(tmp_path / "run") as ws:
        text = ws.lineage.get("v1").describe_change()
    one = "reward.format.params.p0: " + repr("x" * 40) + " -> " + repr("y" * 40)
    assert text.startswith(one + "; reward.format.params.p1: ")
    assert text.count(" -> ") == DESCRIBE_INTERVENTIONS_MAX == 5
    assert text.endswith("; and 995 more")
    assert len(text) < 1000  # was 1,000 interventions: ~100,000 characters


def test_lineage_show_cuts_its_output_at_64000_characters_and_says_so(tmp_path):
    run = tmp_path / "run"
    _crafted(run, 150, 30, chars=180)  # ~2 KB a label after the cut: ~300 KB of tree
    res = CliRunner().invoke(app, ["lineage", "show", str(run)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = res.stdout
    note = ("... output cut at 64,000 characters (the lineage has 151 versions); `evotrainer lineage show --json` or "
            "the MCP tool list_versions lists them all\n")
    assert out.endswith(note) and len(out) - len(note) <= LINEAGE_SHOW_MAX_CHARS == 64_000
    assert out.startswith("v0 proposed base")
    assert "; and 25 more" in out and "reward.format.params.p5:" not in out
    small = tmp_path / "small"
    _crafted(small, 2, 1)
    res = CliRunner().invoke(app, ["lineage", "show", str(small)], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "output cut" not in res.stdout and len(res.stdout.splitlines()) == 3


def _versions_reads(ws: Workspace) -> list[str]:
    """The statements that read every version, recorded from SQLite itself while the caller runs."""
    seen: list[str] = []
    ws.lineage._db.set_trace_callback(seen.append)
    return seen


def test_the_report_reads_the_versions_once_and_describes_five_interventions(tmp_path):
    run = tmp_path / "run"
    _crafted(run, 20, 100)
    with Workspace.open(run) as ws:
        seen = _versions_reads(ws)
        html = render_html(ws)
        ws.lineage._db.set_trace_callback(None)
    reads = [s for s in seen if s.startswith("SELECT * FROM versions WHERE 1 ")]
    assert len(reads) == 1  # was 10 (score rows, recipe rows, best version, tree, curves, findings, ...)
    assert html.count("and 95 more") == 2 * 20  # the tree's change and the interventions table, each version
    assert "reward.format.params.p5:" not in html


# --- B2-R16 ------------------------------------------------------------------------------------------------------
def _finding(i: int, severity: str = "warn") -> dict:
    return {"kind": f"k{i}", "severity": severity, "explanation": "e" * 100, "evidence": ["m"]}


def test_the_report_lists_50_findings_a_version_the_most_severe_first(tmp_path):
    with Workspace(tmp_path / "run") as ws:
        ws.lineage.create_root(Recipe())
        ws.lineage.kv_set("loop/diagnose/v0", {"findings": [_finding(i) for i in range(119)]
                                               + [_finding(119, "blocking")]})
        html = render_html(ws)
    assert html.count("<td class='finding'>") == REPORT_FINDINGS_MAX == 50
    assert html.index("<td>k119</td>") < html.index("<td>k0</td>")  # the blocking one first
    assert "Left out: 70 more findings of this version (the report lists 50 a version" in html
    assert "<td>k49</td>" not in html and "<td>k48</td>" in html


def test_the_report_reads_kv_values_under_a_16_mib_budget_and_says_what_it_left_out(tmp_path):
    """Five diagnose records of ~3.9 MB (each under the 4 MiB a key holds) are 19.6 MB together: four are read (15.7
    MB), the fifth is past REPORT_KV_MAX_CHARS and is named, with its size, at the top of the report."""
    _crafted(tmp_path / "run", 4, 0)
    one = json.dumps({"findings": [_finding(i) for i in range(22_100)]})
    assert 3_900_000 < len(one) < 4 << 20
    db = sqlite3.connect(tmp_path / "run" / "lineage.db")
    db.executemany("INSERT INTO kv VALUES (?, ?)", [(f"loop/diagnose/v{i}", one) for i in range(5)])
    db.commit()
    db.close()
    with Workspace.open(tmp_path / "run") as ws:
        lin = ReportLineage(ws.lineage)
        html = render_html(ws, lin)
    assert lin.kv_chars == 4 * len(one) <= REPORT_KV_MAX_CHARS < 5 * len(one)
    assert lin.left_out == {"loop/diagnose/v4": len(one)}
    assert (f"Left out of this report: 1 run-level records of {len(one):,} characters in all (characters in "
            f"brackets), past the 16,777,216 one report reads: <code>loop/diagnose/v4</code> ({len(one):,})") in html
    assert html.count("<td class='finding'>") == 4 * REPORT_FINDINGS_MAX  # v4's findings are not read
    assert len(html) < 1_000_000  # was 5 x 22,100 findings: ~19 MB of HTML


def test_kv_size_asks_sql_for_the_length(tmp_path):
    s = LineageStore(tmp_path / "lineage.db")
    s.kv_set("a", {"x": "y" * 10})
    assert (s.kv_size("a"), s.kv_size("missing")) == (len(json.dumps({"x": "y" * 10})), None)
    s.kv_set("loop/r1/x", [1, 2])
    assert s.kv_items_size("loop/r") == (1, 6) and s.kv_items_size("nothing") == (0, 0)
    s.close()


# --- J-R16 -------------------------------------------------------------------------------------------------------
def test_an_unknown_version_lists_the_20_closest_ids_and_how_many_there_are(tmp_path):
    """Review 16 J-R16: 20,000 crafted ids of 1,000 characters made `get`'s error 20 MB; it names the 20 closest
    (difflib over a pool of at most 1,000), each cut to 80 characters, and the count."""
    ids = [f"v{i}-" + "x" * 1000 for i in range(1, 3001)]
    _crafted(tmp_path / "run", 0, 0, ids=ids)
    tail = "(the 20 closest of 3,001; MCP list_versions or `evotrainer lineage show --json` lists them all)"
    with Workspace.open(tmp_path / "run") as ws:
        for call in (lambda: ws.lineage.get("v1234-typo"), lambda: ws.lineage.lineage_index().parent("v1234-typo")):
            with pytest.raises(LineageError) as e:
                call()
            msg = str(e.value)
            assert msg.startswith("version 'v1234-typo' not found; known versions: v1234-xxxx") and msg.endswith(tail)
            listed = msg[len("version 'v1234-typo' not found; known versions: "):-len(tail) - 1].split(", ")
            assert len(listed) == 20 and all(len(x) <= 80 for x in listed) and len(msg) < 2000
    with Workspace.open(tmp_path / "run") as ws, pytest.raises(LineageError) as e:  # a short id among long ones
        ws.lineage.get("v0x")
    assert "v0, " in str(e.value)


def test_an_unknown_version_of_a_small_run_still_lists_them_all(tmp_path):
    _crafted(tmp_path / "run", 3, 1)
    with Workspace.open(tmp_path / "run") as ws, pytest.raises(LineageError) as e:
        ws.lineage.get("v9")
    assert str(e.value) == "version 'v9' not found; known versions: v0, v1, v2, v3"


# --- A2-R16 ------------------------------------------------------------------------------------------------------
def test_count_decisions_counts_in_sql_and_damaged_reads_the_latest_decision_only(tmp_path):
    """Review 16 A2-R16: run_summary read every decision to count them, and damaged() every decision of a version
    to look at the last one; an older decision this store cannot read (evidence that is not JSON, crafted) ended
    both with a LineageError."""
    with Workspace(tmp_path / "run") as ws:
        lin = ws.lineage
        lin.create_root(Recipe())
        lin.branch("v0", Intervention(path="temperature", old=1.0, new=0.9, category="rollout"))
        lin.decide("v0", "keep", "root", author="t")
        lin.decide("v1", "keep", "good", author="t")
        lin.decide("v1", "prune", "entropy collapsed", author="t", damaged_weights="entropy_collapse")
    db = sqlite3.connect(tmp_path / "run" / "lineage.db")
    db.execute("UPDATE decisions SET evidence = 'not json' WHERE id IN (1, 2)")
    db.commit()
    db.close()
    with Workspace.open(tmp_path / "run") as ws:
        lin = ws.lineage
        assert (lin.count_decisions(), lin.count_decisions("v1"), lin.count_decisions("v9")) == (3, 2, 0)
        assert lin.damaged("v1") == "entropy_collapse" and lin.damaged("v0") is None
        assert run_summary(ws, "evotrainer")["decisions"] == 3
        with pytest.raises(LineageError, match="decision 2"):  # the full read still names the bad row
            lin.decisions("v1")


# --- D-R16 -------------------------------------------------------------------------------------------------------
def _stuck(tmp_path):
    """v1 left 'training' with no checkpoint, no metric and no job row (its process died before writing one)."""
    run = tmp_path / "run"
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(Recipe())
        ws.lineage.branch("v0", Intervention(path="temperature", old=1.0, new=0.9, category="rollout"))
        ws.lineage.update_version("v1", status="training")
    return run


def test_a_version_left_training_with_nothing_trained_and_no_job_is_proposed_again(tmp_path):
    """Review 16 D-R16 (D-R15's recovery needs a job row): the next open whose locks are free puts it back, and
    says so in the run log."""
    run = _stuck(tmp_path)
    with Workspace.open(run) as ws:
        assert ws.lineage.get("v1").status == "proposed"
        log = [r for r in ws.read_logs() if r.get("source") == "recovery"]
    assert [(r["version"], r["level"]) for r in log] == [("v1", "warning")]


def test_a_version_being_trained_is_left_training(tmp_path):
    """Its writer holds the version's lock (`evotrainer train` writes no job row), or a live job runs it, or it has
    trained a step: each open leaves it alone."""
    run = _stuck(tmp_path)
    with Workspace.open(run, writer=True, version="v1") as writer:  # a live trainer of v1, no job row
        assert writer.lineage.get("v1").status == "proposed"  # its own open found it stale (the lock is its own)
        writer.lineage.update_version("v1", status="training")  # and it starts training it
        with Workspace.open(run) as reader:
            assert reader.lineage.get("v1").status == "training"
    with Workspace.open(run, writer=True) as ws:  # a run-wide writer (a server job) holding the run
        ws.lineage.update_version("v1", status="training")
        with pytest.raises(Exception, match="another process is writing this run as a whole"):
            Workspace.open(run, writer=True, version="v1")
        with Workspace.open(run) as reader:
            assert reader.lineage.get("v1").status == "training"
        assert ws.lineage.create_job("j1", "v1", "train", steps_total=4).pid == os.getpid()  # a live job, running
    with Workspace.open(run) as ws:
        assert ws.lineage.get("v1").status == "training"
        ws.lineage.update_job("j1", status="done")
        ws.lineage.log_metrics("v1", 0, {"loss": 1.0})  # a step trained: resumable, not stale
    with Workspace.open(run) as ws:
        assert ws.lineage.get("v1").status == "training"


def test_the_mcp_change_watcher_reads_version_stamps_not_whole_versions(tmp_path):
    """Review 16 E2-R16 (servers): the change watcher's fingerprint read and validated every version at each look
    (8.3 s a look on the crafted store of 280 versions x 1,000 interventions); version_stamps() is two columns."""
    _crafted(tmp_path / "run", 3, 2)
    with Workspace.open(tmp_path / "run") as ws:
        seen = _versions_reads(ws)
        stamps = ws.lineage.version_stamps()
        ws.lineage._db.set_trace_callback(None)
        assert stamps == {v.id: v.updated_at for v in ws.lineage.versions()} and list(stamps) == ["v0", "v1", "v2", "v3"]
    assert seen == ["SELECT id, updated_at FROM versions ORDER BY created_at, id"]
