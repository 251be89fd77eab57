"""Crash test: SIGKILL `evotrainer run` at several points; the resumed run ends with the same lineage.

The uninterrupted run and the killed-and-resumed run use the same config and seed (examples/tiny.yaml).
Kill points are chosen from the run's own state (read-only SQLite reads): while the base trains,
right after its decision, after round 1 branched, and while a child trains.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_orchestrator import lineage_signature

ROOT = Path(__file__).resolve().parents[1]


def _cmd(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "evotrainer.cli", "run", str(ROOT / "examples/tiny.yaml"), "--run-dir", str(run_dir),
            "--resume", "--no-live", "--json"]


def _state(run_dir: Path) -> dict:
    db = run_dir / "lineage.db"
    if not db.exists():
        return {}
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            kv = {r[0] for r in con.execute("SELECT key FROM kv")}
            jobs = con.execute("SELECT version_id, kind, status, steps_done FROM jobs").fetchall()
            decided = {r[0] for r in con.execute("SELECT version_id FROM decisions")}
        finally:
            con.close()
    except sqlite3.Error:
        return {}
    return {"kv": kv, "jobs": jobs, "decided": decided}


KILL_POINTS = [
    ("base training", lambda s: any(j[0] == "v0" and j[1] == "train" and j[2] == "running" and j[3] >= 1
                                    for j in s.get("jobs", []))),
    ("after base decision", lambda s: "v0" in s.get("decided", set())),
    ("after round-1 branch", lambda s: "loop/r1/branch" in s.get("kv", set())),
    ("child training", lambda s: any(j[0] != "v0" and j[1] == "train" and j[2] == "running"
                                     for j in s.get("jobs", []))),
]


def _env(run_dir: Path) -> dict:
    """Each run gets its own skill memory (a run records outcomes there, which steers the next run's choices)."""
    return {**os.environ, "EVOTRAINER_SKILLS_DIR": str(run_dir.parent / f"skills-{run_dir.name}")}


def _run_until(run_dir: Path, cond, timeout_s: float = 600) -> bool:
    """Start a resumed run; SIGKILL it once ``cond(state)`` holds. True if killed, False if it finished first."""
    env = _env(run_dir)
    p = subprocess.Popen(_cmd(run_dir), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                         start_new_session=True)
    t0 = time.time()
    while p.poll() is None and time.time() - t0 < timeout_s:
        if cond(_state(run_dir)):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return True
        time.sleep(0.05)
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError("run did not reach the kill point in time")
    assert p.returncode == 0, p.stderr.read().decode()[-2000:]
    return False


@pytest.mark.slow
def test_sigkill_at_several_points_then_resume_gives_the_same_lineage(tmp_path):
    ref = tmp_path / "uninterrupted"
    done = subprocess.run(_cmd(ref), cwd=ROOT, capture_output=True, text=True, timeout=900, env=_env(ref))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["finished"]

    crashed = tmp_path / "crashed"
    kills = []
    for name, cond in KILL_POINTS:
        if _run_until(crashed, cond):
            kills.append(name)
    assert len(kills) >= 3, kills  # the run was really interrupted several times
    final = subprocess.run(_cmd(crashed), cwd=ROOT, capture_output=True, text=True, timeout=900, env=_env(crashed))
    assert final.returncode == 0, final.stderr[-2000:]

    a, b = lineage_signature(ref), lineage_signature(crashed)
    assert b == a
    # no decision lost or repeated: exactly one keep/prune per version
    per_version = [d[0] for d in b["decisions"] if d[1] in ("keep", "prune")]
    assert sorted(per_version) == sorted(set(per_version)) == sorted(v[0] for v in b["versions"])


def test_a_run_killed_after_its_round_is_branched_trains_and_decides_those_arms_on_resume(tmp_path):
    """A bug the slow test above found: killed after round 1 had branched its arms (two changes and a control of v0,
    with examples/tiny.yaml's max_versions 3), the resumed run re-checked the round's room, counted the arms already
    branched as versions, found none left and stopped with v1-v3 never trained or decided."""
    run = tmp_path / "crashed"
    assert _run_until(run, dict(KILL_POINTS)["after round-1 branch"])
    final = subprocess.run(_cmd(run), cwd=ROOT, capture_output=True, text=True, timeout=900, env=_env(run))
    assert final.returncode == 0, final.stderr[-2000:]
    sig = lineage_signature(run)
    assert [v[0] for v in sig["versions"]] == ["v0", "v1", "v2", "v3"]
    assert all(v[3] != "proposed" for v in sig["versions"]), sig["versions"]  # every arm trained and decided
    per_version = sorted(d[0] for d in sig["decisions"] if d[1] in ("keep", "prune"))
    assert per_version == ["v0", "v1", "v2", "v3"]  # one decision each, none lost or repeated
