"""Lineage store: tree queries, append-only decisions, jobs, metrics, and crash safety under SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from evotrainer.intervention import Intervention
from evotrainer.lineage import LineageError, LineageStore
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace, WorkspaceError


def _iv(path, old, new, cat="rollout"):
    return Intervention(path=path, old=old, new=new, category=cat)


def test_tree_frontier_path_and_diff(tmp_path):
    s = LineageStore(tmp_path / "lineage.db")
    v0 = s.create_root(Recipe())
    v1 = s.branch(v0.id, _iv("temperature", 1.0, 0.8))
    v2 = s.branch(v0.id, _iv("data.level", 1, 2, "data"))
    v3 = s.branch(v1.id, _iv("eps_clip_high", 0.28, 0.3, "optimizer"))
    assert [v.id for v in (v0, v1, v2, v3)] == ["v0", "v1", "v2", "v3"]
    s.decide("v0", "keep", "base", author="orchestrator")
    s.decide("v1", "keep", "gain +0.05, CI [0.01, 0.09]", evidence=["eval/avg@k"], author="backtester")
    s.decide("v2", "prune", "no gain")
    assert [v.id for v in s.frontier()] == ["v1"]
    s.decide("v3", "keep", "gain")
    assert [v.id for v in s.frontier()] == ["v3"]
    assert [v.id for v in s.path_to_root("v3")] == ["v3", "v1", "v0"]
    assert s.diff("v2", "v3") == [("data.level", 2, 1), ("eps_clip_high", 0.28, 0.3), ("temperature", 1.0, 0.8)]
    tree = s.tree()
    assert tree["id"] == "v0" and [c["id"] for c in tree["children"]] == ["v1", "v2"]
    assert tree["children"][0]["children"][0]["intervention"] == ["eps_clip_high: 0.28 -> 0.3"]
    s.decide("v3", "revert", "held-out regressed on re-evaluation")
    assert s.get("v3").status == "reverted" and [v.id for v in s.frontier()] == ["v1"]
    d = s.decisions("v3")
    assert [(x.action, x.prev_status) for x in d] == [("keep", "proposed"), ("revert", "kept")]


def test_children_of_damaged_weights_start_from_the_last_healthy_version(tmp_path):
    # v0 kept -> v1 pruned for truncation (its weights are fine: children continue from it)
    #         -> v2 pruned for entropy_collapse (collapsed: children start from v0) -> v3 pruned for
    #            nan_blowup -> v4 starts from v0 too. A collapsed root's child starts from the base model.
    s = LineageStore(tmp_path / "lineage.db")
    v0 = s.create_root(Recipe())
    s.decide(v0.id, "keep", "kept for the test")
    v1 = s.branch(v0.id, _iv("temperature", 1.0, 0.8))
    s.decide(v1.id, "prune", "truncation", evidence=["finding:truncation:v1", "completions/clipped_ratio"])
    v2 = s.branch(v0.id, _iv("temperature", 1.0, 1.2))
    s.decide(v2.id, "prune", "collapsed", evidence=["finding:entropy_collapse:v2", "policy/entropy"],
             damaged_weights="entropy_collapse")
    v3 = s.branch(v2.id, _iv("eps_clip_high", 0.28, 0.3, "optimizer"))
    s.decide(v3.id, "prune", "nan", evidence=["finding:nan_blowup:v3"], damaged_weights="nan_blowup")
    v4 = s.branch(v3.id, _iv("temperature", 1.2, 1.0))
    v5 = s.branch(v1.id, _iv("eps_clip_high", 0.28, 0.3, "optimizer"))
    assert [s.damaged(v) for v in ("v0", "v1", "v2", "v3")] == [None, None, "entropy_collapse", "nan_blowup"]
    assert s.start_version(v5.id).id == "v1" and s.start_version(v3.id).id == "v0" and s.start_version(v4.id).id == "v0"
    assert s.start_version(v0.id) is None
    # the collapse finding must be on that version: a parent's finding cited by a child is not the child's damage
    v6 = s.branch(v1.id, _iv("temperature", 0.8, 0.9))
    s.decide(v6.id, "prune", "inherited", evidence=["finding:entropy_collapse:v1"])
    assert s.damaged(v6.id) is None
    # a collapsed root: its children start from the base model
    t = LineageStore(tmp_path / "root.db")
    r = t.create_root(Recipe())
    t.decide(r.id, "prune", "collapsed", evidence=["finding:kl_blowup:v0"], damaged_weights="kl_blowup")
    assert t.start_version(t.branch(r.id, _iv("temperature", 1.0, 0.8)).id) is None


def test_damaged_weights_is_a_typed_field_of_the_decision(tmp_path):
    # the store reads Decision.damaged_weights, never the evidence strings; only a prune / revert carries it
    s = LineageStore(tmp_path / "lineage.db")
    v0 = s.create_root(Recipe())
    v1 = s.branch(v0.id, _iv("temperature", 1.0, 0.8))
    s.decide(v1.id, "prune", "cites a collapse, not flagged", evidence=["finding:entropy_collapse:v1"])
    assert s.damaged(v1.id) is None and s.decisions(v1.id)[-1].damaged_weights is None
    with pytest.raises(LineageError, match="damaged weights are a reason to prune or revert"):
        s.decide(v0.id, "keep", "kept", damaged_weights="entropy_collapse")
    s.decide(v0.id, "keep", "kept")
    s.decide(v0.id, "revert", "collapsed later", damaged_weights="nan_blowup")
    assert s.damaged(v0.id) == "nan_blowup" and s.decisions(v0.id)[-1].damaged_weights == "nan_blowup"


def test_migration_003_types_the_damage_of_decisions_written_before_it(tmp_path):
    # a lineage.db from before 003_decision_damaged_weights: its decisions cite the finding among the evidence
    path = tmp_path / "lineage.db"
    s = LineageStore(path)
    v0 = s.create_root(Recipe())
    s.decide(v0.id, "keep", "kept for the test", evidence=["finding:entropy_collapse:v0"])
    v1 = s.branch(v0.id, _iv("temperature", 1.0, 0.8))
    s.decide(v1.id, "prune", "truncation", evidence=["finding:truncation:v1", "completions/clipped_ratio"])
    v2 = s.branch(v0.id, _iv("temperature", 1.0, 1.2))
    s.decide(v2.id, "prune", "collapsed", evidence=["policy/entropy", "finding:kl_blowup:v2", "finding:nan_blowup:v2"])
    v3 = s.branch(v0.id, _iv("temperature", 1.0, 0.9))
    s.decide(v3.id, "prune", "inherited", evidence=["finding:entropy_collapse:v1", "finding:entropy_collapse:v3,v0"])
    s.close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE decisions DROP COLUMN damaged_weights")
    db.execute("DELETE FROM _migrations WHERE name = '003_decision_damaged_weights'")
    db.commit()
    db.close()
    s = LineageStore(path)
    assert [s.damaged(v) for v in ("v0", "v1", "v2", "v3")] == [None, None, "kl_blowup", None]
    assert s.decisions("v0")[-1].damaged_weights is None  # a keep is never damage


def test_errors_name_the_fix(tmp_path):
    s = LineageStore(tmp_path / "lineage.db")
    s.create_root(Recipe())
    with pytest.raises(LineageError, match="version 'v9' not found; known versions: v0"):
        s.get("v9")
    with pytest.raises(LineageError, match="has a root version already"):
        s.create_root(Recipe())
    with pytest.raises(LineageError, match="only a kept version can be reverted"):
        s.decide("v0", "revert", "x")
    with pytest.raises(LineageError, match="needs a rationale"):
        s.decide("v0", "keep", "  ")
    with pytest.raises(LineageError, match="action='drop': allowed: keep, prune, revert, merge"):
        s.decide("v0", "drop", "x")


def test_metrics_eval_jobs_kv(tmp_path):
    s = LineageStore(tmp_path / "lineage.db")
    s.create_root(Recipe())
    s.log_metrics("v0", 0, {"reward/mean": 0.25, "policy/kl": 0.0})
    s.log_metrics("v0", 1, {"reward/mean": 0.5})
    assert s.metric_series("v0", "reward/mean") == [(0, 0.25), (1, 0.5)]
    assert s.last_step("v0") == 1 and s.metric_names() == ["policy/kl", "reward/mean"]
    s.log_eval_samples("v0", "heldout", [("p1", 0, 1.0, "5"), ("p1", 1, 0.0, "6"), ("p2", 0, 1.0, "7")])
    assert s.eval_matrix("v0") == {"p1": [1.0, 0.0], "p2": [1.0]}
    s.create_job("j1", "v0", "train", steps_total=4)
    s.update_job("j1", steps_done=2, progress=0.5)
    assert s.job("j1").progress == 0.5 and s.job("j1").pid == os.getpid()
    s.kv_set("cursor", {"round": 2})
    assert s.kv_get("cursor") == {"round": 2}


def test_kv_items_by_literal_prefix_in_key_order(tmp_path):
    s = LineageStore(tmp_path / "lineage.db")
    for key, value in [("loop/r2/evolve", [{"type": "synthesis"}]), ("loop/r1/evolve", []), ("loop/round", 3),
                       ("loop/rgate/v1", {"waived": ["truncation"]}), ("loopXr1", 1), ("loop_r1", 2), ("other", None)]:
        s.kv_set(key, value)
    assert s.kv_items("loop/r") == [("loop/r1/evolve", []), ("loop/r2/evolve", [{"type": "synthesis"}]),
                                    ("loop/rgate/v1", {"waived": ["truncation"]}), ("loop/round", 3)]
    assert s.kv_items("loop_") == [("loop_r1", 2)]  # '_' is a character, not a LIKE wildcard
    assert s.kv_items("loop%") == [] and s.kv_items("nothing/") == []
    assert [k for k, _ in s.kv_items()] == sorted(["loop/r2/evolve", "loop/r1/evolve", "loop/round", "loop/rgate/v1",
                                                   "loopXr1", "loop_r1", "other"])


def test_kv_update_from_two_handles_at_once_loses_no_update(tmp_path):
    """Review 11, K-R11: a read-modify-write of one kv row (kv_get -> change -> kv_set) from two callers at once
    lost updates; kv_update does it in one write transaction. Two handles (two connections, as two processes
    have) x 2 threads x 25 increments of one object: every increment counted."""
    import threading

    path = tmp_path / "lineage.db"
    LineageStore(path).close()
    stores = [LineageStore(path), LineageStore(path)]
    start = threading.Barrier(4)
    failures: list[str] = []

    def bump(s: LineageStore, who: str) -> None:
        start.wait()
        try:
            for _ in range(25):
                s.kv_update("counts", lambda d: {**(d or {}), "n": (d or {}).get("n", 0) + 1, who: 1}, expected=dict)
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=bump, args=(stores[i % 2], f"t{i}")) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert failures == []
    assert stores[0].kv_get("counts") == {"n": 100, "t0": 1, "t1": 1, "t2": 1, "t3": 1}
    assert stores[1].kv_update("missing", lambda v: [v], default="d") == ["d"]
    assert stores[1].kv_get("missing") == ["d"]


def test_kv_update_of_a_wrongly_shaped_value_is_refused_and_writes_nothing(tmp_path):
    s = LineageStore(tmp_path / "lineage.db")
    s.kv_set("analyzers/registered", [1])
    with pytest.raises(LineageError) as err:
        s.kv_update("analyzers/registered", lambda d: {**d, "x": {}}, expected=dict)
    assert str(err.value) == (
        f"{s.path}: kv.value of key 'analyzers/registered' holds a JSON list [1], where EvoTrainer writes a JSON "
        f"object (a crafted or damaged file); not read. Use a run folder EvoTrainer wrote, or remove the value "
        f"(`sqlite3 {s.path} \"DELETE FROM kv WHERE key = 'analyzers/registered'\"`: the run forgets it)")
    assert s.kv_get("analyzers/registered") == [1]
    with pytest.raises(ZeroDivisionError):  # an error of fn rolls back: the row keeps its value
        s.kv_update("analyzers/registered", lambda v: 1 / 0)
    assert s.kv_get("analyzers/registered") == [1]


def test_dead_jobs_become_interrupted(tmp_path):
    s = LineageStore(tmp_path / "lineage.db")
    s.create_root(Recipe())
    s.create_job("j1", "v0", "train")
    with s.tx() as db:  # a job owned by a process that no longer exists
        db.execute("UPDATE jobs SET pid=? WHERE id='j1'", (2**22 + 12345,))
    s.close()
    s2 = LineageStore(tmp_path / "lineage.db")
    assert s2.job("j1").status == "interrupted"


def test_workspace_writer_lock(tmp_path):
    ws = Workspace(tmp_path / "run", writer=True)
    with pytest.raises(WorkspaceError, match="another process is writing this run"):
        Workspace(tmp_path / "run", writer=True)
    reader = Workspace.open(tmp_path / "run")  # readers never block
    assert reader.lineage.versions() == []
    ws.close()
    Workspace(tmp_path / "run", writer=True).close()
    with pytest.raises(WorkspaceError, match="not a run folder"):
        Workspace.open(tmp_path / "nowhere")


WRITER = textwrap.dedent(
    """
    import random, sys
    from evotrainer.intervention import Intervention
    from evotrainer.lineage import LineageStore
    from evotrainer.recipe import Recipe
    s = LineageStore(sys.argv[1])
    rng = random.Random(int(sys.argv[2]))
    if s.root() is None:
        s.create_root(Recipe()); print("version v0", flush=True)
    while True:
        vs = s.versions()
        parent = rng.choice(vs)
        t = round(rng.uniform(0.1, 2.0), 6)
        if t == parent.recipe.temperature:
            continue
        v = s.branch(parent.id, Intervention(path="temperature", old=parent.recipe.temperature, new=t, category="rollout"))
        print("version", v.id, flush=True)
        s.log_metrics(v.id, 0, {f"m{i}": float(i) for i in range(20)})
        print("metrics", v.id, flush=True)
        d = s.decide(v.id, rng.choice(["keep", "prune"]), "random decision", evidence=["x"], author="test")
        print("decision", d.id, v.id, d.action, flush=True)
    """
)


def _check_consistent(db_path, committed):
    s = LineageStore(db_path)  # reopening also recovers jobs
    vs = {v.id: v for v in s.versions()}
    for v in vs.values():  # no orphan version; every child is its parent's recipe + one intervention
        if v.parent_id is not None:
            assert v.parent_id in vs
            assert len(v.interventions) == 1
            assert v.interventions[0].apply(vs[v.parent_id].recipe) == v.recipe
    decisions = s.decisions()
    last = {}
    for d in decisions:  # no half decision: the status matches the decision that set it
        last[d.version_id] = d
    for vid, d in last.items():
        assert vs[vid].status == {"keep": "kept", "prune": "pruned"}[d.action]
    for v in vs.values():
        if v.id not in last and v.parent_id is not None:
            assert v.status == "proposed"
    for kind, *rest in committed:  # every committed record is present
        if kind == "version":
            assert rest[0] in vs
        elif kind == "metrics":
            assert len(s.metric_series(rest[0], "m19")) == 1
            assert len(s.all_metrics(rest[0])) == 20  # all or nothing
        elif kind == "decision":
            assert any(d.id == int(rest[0]) and d.version_id == rest[1] for d in decisions)
    n_metric_rows = sqlite3.connect(db_path).execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
    assert n_metric_rows % 20 == 0
    s.close()


def test_sigkill_during_writes_leaves_consistent_store(tmp_path):
    db = tmp_path / "lineage.db"
    rng = random.Random(7)
    committed: list[list[str]] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for trial in range(12):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(trial)], stdout=subprocess.PIPE, text=True,
                             env=env)
        time.sleep(0.6 + rng.random() * 1.2)  # interpreter start-up ~0.5 s, then writes
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        # only whole lines: a kill between print's text and its newline leaves 'metrics' without its version id
        # (seen once under a loaded machine: an IndexError in the check, not an inconsistent store)
        committed += [line.split() for line in out.split("\n")[:-1] if line.strip()]
        _check_consistent(db, committed)
    assert sum(1 for c in committed if c[0] == "decision") > 10  # the kills landed mid-stream


def test_merge_child_and_decision_in_one_transaction(tmp_path):
    s = LineageStore(tmp_path / "lineage.db")
    s.create_root(Recipe())
    a = s.branch("v0", _iv("temperature", 1.0, 0.8))
    b = s.branch("v0", _iv("data.level", 1, 2, "data"))
    from evotrainer.intervention import merge

    m = s.branch("v0", merge(a.interventions, b.interventions), note="merge of v1 and v2",
                 merge_decision=("both kept; independent paths", ["v1", "v2"], "orchestrator"))
    assert m.status == "merged" and (m.recipe.temperature, m.recipe.data.level) == (0.8, 2)
    (d,) = s.decisions(m.id)
    assert (d.action, d.prev_status, d.evidence, d.author) == ("merge", "proposed", ["v1", "v2"], "orchestrator")


def test_a_training_job_that_died_before_its_first_step_leaves_its_version_proposed(tmp_path):
    """Review 15 D-R15: after a SIGKILL of the server before step 0, the next open marked the job interrupted but
    left the version 'training' with 0 steps and no checkpoint for good. Recovery now puts such a version back to
    proposed; one with trained steps stays 'training' (resumable)."""
    import sqlite3

    from evotrainer.intervention import Intervention
    from evotrainer.lineage import LineageStore
    from evotrainer.recipe import Recipe

    path = tmp_path / "lineage.db"
    s = LineageStore(path)
    s.create_root(Recipe())
    s.branch("v0", Intervention(path="temperature", old=1.0, new=0.9, category="rollout", hypothesis="h"))
    for vid, job in (("v0", "j0"), ("v1", "j1")):
        s.create_job(job, vid, "train", steps_total=5)
        s.update_version(vid, status="training")
    s.log_metrics("v1", 0, {"loss": 1.0})  # v1 trained a step before its process died
    s.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE jobs SET status='running', pid=999999999")  # a pid no process has
    db.commit()
    db.close()
    s = LineageStore(path)
    assert [j.status for j in s.jobs()] == ["interrupted"] * 2  # (the open recovered them)
    assert (s.get("v0").status, s.get("v1").status) == ("proposed", "training")
    s.close()


def test_kv_items_refuses_a_prefix_whose_values_pass_the_total_cap(tmp_path, monkeypatch):
    """Review 15 B-R15: `report` read every kv value under `loop/r` whole (30 values of 4 MiB: 452 MB), though each
    value was under its own cap. A prefix read past KV_ITEMS_MAX_CHARS (32 MiB; lowered here) is refused."""
    from evotrainer import lineage
    from evotrainer.lineage import LineageError, LineageStore

    s = LineageStore(tmp_path / "lineage.db")
    for i in range(5):
        s.kv_set(f"loop/r{i}/x", "v" * 1000)
    assert len(s.kv_items("loop/r")) == 5
    monkeypatch.setattr(lineage, "KV_ITEMS_MAX_CHARS", 4000)
    with pytest.raises(LineageError, match="the 5 kv values under 'loop/r' hold 5,010 characters, past the 4,000"):
        s.kv_items("loop/r")
    s.close()


def test_checkpoint_paths_are_stored_relative_so_a_copied_run_reads_its_own_weights(tmp_path):
    """Review 15 (a note of X-R15): checkpoint paths were stored absolute, so a copied run folder named and loaded
    the original folder's weights. A path inside the run folder is stored relative (``checkpoints/v0``) and read back
    absolute under the folder it is read from; an older run's absolute ``.../checkpoints/<version>`` is read as the
    copy's own when the copy has that folder; a path outside the run folder is kept as given."""
    import shutil
    import sqlite3

    run = tmp_path / "run"
    s = LineageStore(run / "lineage.db")
    v0 = s.create_root(Recipe())
    (run / "checkpoints" / v0.id).mkdir(parents=True)
    s.update_version(v0.id, checkpoint=str(run / "checkpoints" / v0.id))
    s.close()
    db = sqlite3.connect(run / "lineage.db")
    assert db.execute("SELECT checkpoint FROM versions WHERE id=?", (v0.id,)).fetchone() == ("checkpoints/v0",)
    db.close()
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    c = LineageStore(copy / "lineage.db")
    assert c.get(v0.id).checkpoint == str(copy.resolve() / "checkpoints" / "v0")
    c.close()
    db = sqlite3.connect(copy / "lineage.db")  # as an older run stored it: the original folder's absolute path
    db.execute("UPDATE versions SET checkpoint=? WHERE id=?", (str(run / "checkpoints" / "v0"), v0.id))
    db.commit()
    db.close()
    c = LineageStore(copy / "lineage.db")
    assert c.get(v0.id).checkpoint == str(copy.resolve() / "checkpoints" / "v0")
    elsewhere = tmp_path / "disk" / "weights"
    c.update_version(v0.id, checkpoint=str(elsewhere))
    assert c.get(v0.id).checkpoint == str(elsewhere)
    c.close()
