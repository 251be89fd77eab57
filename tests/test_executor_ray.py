"""Executors on a real local Ray cluster (127.0.0.1, no dashboard): a round of two tiny-model branches.

- the Ray round ends with the same lineage (versions, statuses, metric values, held-out outcomes) as
  the inline round on a copy of the same run;
- SIGKILL of one branch's Ray worker mid-training: that version's job is ``interrupted``, the other
  branch's records are intact, and running the round again retrains the killed one (resumed);
- per-version writer locks: two versions are written at once, a second writer of one version is refused;
- ``ray_address``: a cluster started with ``ray start --head`` on 127.0.0.1 runs a branch;
- (slow) ``evotrainer run`` with ``executor: ray`` decides as the inline run.

The cluster is started once for the module with its own session folder; the fixture stops it and checks
that no process of that session (raylet, gcs_server, workers) is left (so does the ``ray start`` test).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")

from evotrainer.executor import InlineExecutor, RayExecutor, Task  # noqa: E402
from evotrainer.intervention import Intervention  # noqa: E402
from evotrainer.lineage import LineageStore  # noqa: E402
from evotrainer.recipe import validate_recipe  # noqa: E402
from evotrainer.workspace import Workspace, WorkspaceError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = yaml.safe_load((ROOT / "examples/tiny.yaml").read_text())["recipe"]
STEPS = 2


def _session_pids(temp_dir: str) -> list[int]:
    """Live processes whose command line names this cluster's session folder (raylet, gcs_server, ...)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (p / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if temp_dir in cmd and state != "Z":
            out.append(int(p.name))
    return out


@pytest.fixture(scope="module")
def ray_executor():
    temp_dir = tempfile.mkdtemp(prefix="evr", dir="/tmp")  # short: Ray's socket paths live under it
    ex = RayExecutor(max_parallel=2, threads=1, temp_dir=temp_dir)
    try:
        yield ex
    finally:
        ex.close()
        deadline = time.time() + 30
        while _session_pids(temp_dir) and time.time() < deadline:
            time.sleep(0.5)
        left = _session_pids(temp_dir)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes left behind: {left}"


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A run whose v0 is trained (2 steps, inline) with two proposed children: v1 (lr 2e-4), v2 (temperature 0.9)."""
    root = tmp_path_factory.mktemp("base") / "run"
    r = validate_recipe(TINY)
    Workspace.init(root, r)
    [res] = InlineExecutor(threads=1).run(root, [Task(version_id="v0", steps=STEPS)])
    assert res.status == "done", res.error
    with Workspace.open(root) as ws:
        ws.lineage.branch("v0", Intervention(path="actor_learning_rate", old=r.actor_learning_rate, new=2e-4,
                                             category="optimizer"))
        ws.lineage.branch("v0", Intervention(path="temperature", old=r.temperature, new=0.9, category="rollout"))
    return root


def _copy(base: Path, dst: Path) -> Path:
    shutil.copytree(base, dst, ignore=shutil.ignore_patterns(".writer.lock", ".locks"))
    return dst


def _lineage(root: Path) -> dict:
    """What must match across executors: versions, statuses, metric values (perf/* are timings), eval outcomes."""
    s = LineageStore(root / "lineage.db", readonly=True)
    try:
        out = {}
        for v in s.versions():
            metrics = {name: pts for name, pts in s.all_metrics(v.id).items() if not name.startswith("perf/")}
            ev = {k: v.eval_summary.get(k) for k in ("k", "avg@k", "pass@k", "pass@1", "n_problems")}
            out[v.id] = {"parent": v.parent_id, "status": v.status, "metrics": metrics, "eval": ev,
                         "eval_matrix": s.eval_matrix(v.id)}
        return out
    finally:
        s.close()


def _stop_session(temp_dir: str) -> list[int]:
    """SIGTERM, then SIGKILL, the processes of one Ray session (by its folder; never `ray stop`, which stops every
    cluster of this user on the machine); returns those that were still alive at the end."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _session_pids(temp_dir):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        while _session_pids(temp_dir) and time.time() < deadline:
            time.sleep(0.3)
    return _session_pids(temp_dir)


def _round() -> list[Task]:
    return [Task(version_id="v1", steps=STEPS, evaluate=True), Task(version_id="v2", steps=STEPS, evaluate=True)]


def test_ray_round_matches_inline_round(base_run, ray_executor, tmp_path):
    inline_run = _copy(base_run, tmp_path / "inline")
    ray_run = _copy(base_run, tmp_path / "ray")
    inline = InlineExecutor(threads=1).run(inline_run, _round())
    seen: list[tuple[str, str, int, int]] = []
    t0 = time.monotonic()
    on_ray = ray_executor.run(ray_run, _round(), progress=lambda *a: seen.append(a))
    wall = time.monotonic() - t0
    assert [r.status for r in inline] == ["done", "done"], [r.error for r in inline]
    assert [r.status for r in on_ray] == ["done", "done"], [r.error for r in on_ray]
    a, b = _lineage(inline_run), _lineage(ray_run)
    assert a == b
    # both children trained 2 steps (metrics at steps 0 and 1) and evaluated on the 8 held-out problems, k=2
    for vid in ("v1", "v2"):
        assert b[vid]["status"] == "trained"
        assert [s for s, _ in b[vid]["metrics"]["reward/mean"]] == [0, 1]
        assert b[vid]["eval"]["k"] == 2 and b[vid]["eval"]["n_problems"] == 8
        assert len(b[vid]["eval_matrix"]) == 8 and all(len(x) == 2 for x in b[vid]["eval_matrix"].values())
    # the branches ran in two worker processes side by side (max_parallel 2, 1 CPU each on a 2-CPU cluster: both
    # submitted at once, the second began before the first ended); each registered its jobs with its pid
    with Workspace.open(ray_run) as ws:
        jobs = {j.version_id: j for j in ws.lineage.jobs() if j.kind == "train" and j.version_id != "v0"}
    assert {jobs["v1"].pid, jobs["v2"].pid} == {r.pid for r in on_ray} and len({r.pid for r in on_ray}) == 2
    assert os.getpid() not in {r.pid for r in on_ray} and {r.pid for r in inline} == {os.getpid()}
    assert jobs["v1"].status == jobs["v2"].status == "done"
    assert max(r.started_at for r in on_ray) < min(r.finished_at for r in on_ray)
    assert all(r.cpu_s > 0 for r in on_ray)  # the workers' CPU is measured (the run's compute counts it)
    # one progress line per branch reached the last step (2 of 2)
    assert {(v, d, t) for v, k, d, t in seen if k == "train"} >= {("v1", 2, 2), ("v2", 2, 2)}
    assert wall < 600


def test_sigkill_of_one_worker_interrupts_only_that_branch_and_resume_retrains_it(base_run, ray_executor, tmp_path):
    run = _copy(base_run, tmp_path / "killed")
    steps = 6  # long enough to kill v1 after its first step, before its last
    tasks = [Task(version_id="v1", steps=steps), Task(version_id="v2", steps=steps)]
    killed: list[int] = []

    def kill_v1(vid: str, kind: str, done: int, total: int) -> None:
        if vid == "v1" and kind == "train" and done >= 1 and not killed:
            s = LineageStore(run / "lineage.db", readonly=True)
            try:
                pid = next(j.pid for j in s.jobs("v1") if j.status == "running" and j.kind == "train")
            finally:
                s.close()
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    first = ray_executor.run(run, tasks, progress=kill_v1)
    assert killed, "v1 finished before it could be killed"
    assert [r.status for r in first] == ["interrupted", "done"], [r.error for r in first]
    s = LineageStore(run / "lineage.db", readonly=True)
    try:
        v1_job = next(j for j in s.jobs("v1") if j.kind == "train")
        assert v1_job.status == "interrupted" and v1_job.pid == killed[0]
        assert 1 <= v1_job.steps_done < steps
        assert s.get("v1").status == "training"  # not trained: resumable
        # the other branch is whole: 6 steps of metrics, its checkpoint, status trained
        v2 = s.get("v2")
        assert v2.status == "trained" and Path(v2.checkpoint).is_dir()
        assert [st for st, _ in s.metric_series("v2", "reward/mean")] == list(range(steps))
        v2_before = s.all_metrics("v2")
    finally:
        s.close()
    rollouts = Workspace.open(run).rollouts
    per_step = TINY["rollout_batch_size"] * TINY["n_samples_per_prompt"]  # 2 prompts x 2 samples = 4 rows
    assert rollouts.count("version_id = 'v2' AND split = 'train'") == steps * per_step  # 6 x 4 = 24
    # resume: the same round again retrains v1 only (v2 is trained to 6 steps: skipped)
    second = ray_executor.run(run, tasks)
    assert [r.status for r in second] == ["done", "skipped"], [r.error for r in second]
    assert second[0].train["steps_done"] == steps
    # v1 resumed from its resume checkpoint (every 4 steps) when the kill came after step 4, else from the start
    assert second[0].train["resumed_from_step"] in (None, 3)
    s = LineageStore(run / "lineage.db", readonly=True)
    try:
        assert s.get("v1").status == "trained"
        assert [st for st, _ in s.metric_series("v1", "reward/mean")] == list(range(steps))
        assert s.all_metrics("v2") == v2_before
    finally:
        s.close()
    # the killed attempt's rollouts of redone steps are replaced, not doubled: 24 rows each
    assert rollouts.count("version_id = 'v1' AND split = 'train'") == steps * per_step
    assert rollouts.count("version_id = 'v2' AND split = 'train'") == steps * per_step


def test_version_writers_side_by_side_and_one_writer_per_version(tmp_path):
    Workspace.init(tmp_path / "run", validate_recipe(TINY))
    with Workspace.open(tmp_path / "run") as ws:
        ws.lineage.branch("v0", Intervention(path="temperature", old=1.0, new=0.9, category="rollout"))
    a = Workspace.open(tmp_path / "run", writer=True, version="v0")
    b = Workspace.open(tmp_path / "run", writer=True, version="v1")  # another version: side by side
    try:
        with pytest.raises(WorkspaceError, match=r"another process is writing version v1 of this run \(lock .*"
                                                 r"\.locks/v1\.lock\)"):
            Workspace.open(tmp_path / "run", writer=True, version="v1")
        with pytest.raises(WorkspaceError, match="another process is writing this run"):
            Workspace.open(tmp_path / "run", writer=True)  # a run-wide writer waits for the version writers
        a.lineage.log_metrics("v0", 0, {"reward/mean": 0.25})
        b.lineage.log_metrics("v1", 0, {"reward/mean": 0.5})
        assert Workspace.open(tmp_path / "run").lineage.metric_series("v1", "reward/mean") == [(0, 0.5)]
    finally:
        a.close()
        b.close()
    whole = Workspace.open(tmp_path / "run", writer=True)  # free again once both closed
    try:
        with pytest.raises(WorkspaceError, match="another process is writing this run as a whole"):
            Workspace.open(tmp_path / "run", writer=True, version="v0")
    finally:
        whole.close()
    with pytest.raises(WorkspaceError, match=r"version='../x': not a version id"):
        Workspace.open(tmp_path / "run", writer=True, version="../x")


@pytest.mark.slow
def test_orchestrator_on_ray_decides_as_inline(ray_executor, tmp_path, monkeypatch):
    """`evotrainer run` with executor: ray trains round 1's arms (a child and the control) side by side on Ray
    workers and ends with the lineage, decisions and metric values of the inline run (same seed)."""
    from test_orchestrator import lineage_signature

    from evotrainer.agents.runner import run_loop
    from evotrainer.config import load_run_config

    base = load_run_config(ROOT / "examples/tiny.yaml")
    data = base.recipe.data.model_copy(update={"n_test": 8})  # a test split: the final test evaluations run too
    base = base.model_copy(update={"budget": base.budget.model_copy(update={"max_versions": 2,
                                                                          "steps_per_version": 2,
                                                                          "branches_per_round": 1}),
                                   "recipe": base.recipe.model_copy(update={"data": data}), "test_k": 2})
    runs = {}
    for name, update in (("inline", {}), ("ray", {"executor": "ray", "max_parallel": 2, "branch_threads": 1})):
        # each run its own skill memory: a run's recorded outcomes steer the next run's choices
        monkeypatch.setenv("EVOTRAINER_SKILLS_DIR", str(tmp_path / f"skills-{name}"))
        runs[name] = tmp_path / name
        summary = run_loop(base.model_copy(update=update), runs[name], "heuristic", "evotrainer", resume=False)
        assert summary["finished"]
    assert lineage_signature(runs["inline"]) == lineage_signature(runs["ray"])
    assert _lineage(runs["inline"]) == _lineage(runs["ray"])
    s = LineageStore(runs["ray"] / "lineage.db", readonly=True)
    try:
        round1 = [v for v in s.versions() if v.parent_id == "v0"]
        # round 1: one child and the control (examples/tiny.yaml's heuristic brain; 2 versions + the control)
        assert len(round1) == 2 and sum(v.is_control for v in round1) == 1
        jobs = [j for v in round1 for j in s.jobs(v.id) if j.kind == "train"]
        # trained by Ray workers (not this process; the inline run's jobs are this process's)
        assert len(jobs) == 2 and all(j.pid != os.getpid() for j in jobs)
        # their CPU-seconds are part of the run's compute (loop/compute cpu_s = this process + the workers)
        workers = s.kv_get("loop/worker_cpu_s")
        assert workers > 0 and s.kv_get("loop/compute")["cpu_s"] >= workers
        # the arms' dev evaluations on the workers count their CPU-seconds, as inline ones do (the report's
        # dev-eval CPU-s column read "-" for every Ray-evaluated version before)
        from evotrainer.agents.loop import version_compute

        assert all((version_compute(s, v.id)["eval_cpu_s"] or 0) > 0 for v in round1)
        # the two test evaluations ran side by side on Ray workers, with the inline run's outcomes
        tests = [j for j in s.jobs() if j.kind == "eval" and j.pid != os.getpid()]
        assert len(tests) == 2 + len(jobs)  # the arms' dev evaluations and the two test ones
    finally:
        s.close()

    def final(root: Path) -> tuple[dict, list]:
        import sqlite3

        s = LineageStore(root / "lineage.db", readonly=True)
        try:
            out = {k: ({f: v for f, v in e.items() if f not in ("wall_s", "cpu_s")} if isinstance(e, dict) else e)
                   for k, e in s.kv_get("loop/final").items()}
        finally:
            s.close()
        with sqlite3.connect(root / "lineage.db") as db:
            rows = db.execute("SELECT version_id, eval_name, problem_id, sample_idx, correct, completion FROM "
                              "eval_samples WHERE eval_name IN ('test', 'no_rl_test') ORDER BY 1, 2, 3, 4").fetchall()
        return out, rows

    (f_inline, rows_inline), (f_ray, rows_ray) = final(runs["inline"]), final(runs["ray"])
    assert f_inline == f_ray and f_ray["test"]["n_problems"] == 8 and f_ray["test"]["k"] == 2
    assert rows_inline == rows_ray and len(rows_ray) == 2 * 8 * 2


def test_an_evaluation_from_a_worker_is_stored_as_an_inline_one(tmp_path):
    """The record an executor's evaluation is stored as (``Orchestrator._store_eval``) is the inline evaluate
    stage's (``loop.eval_record``), CPU-seconds included: before, the Ray path dropped ``cpu_s``, so the run's
    report showed no dev-eval CPU-s for any version a worker evaluated."""
    from types import SimpleNamespace

    from evotrainer.agents.loop import EVAL_RECORD_SHAPE, eval_record, version_compute
    from evotrainer.agents.orchestrator import Orchestrator

    res = {"version_id": "v1", "avg_at_k": 0.5, "pass_at_k": 0.75, "pass_at_1": 0.5, "k": 2, "n_problems": 4,
           "gen_tokens": 37, "wall_s": 3.25, "cpu_s": 2.5, "split": "dev"}
    want = {"k": 2, "avg@k": 0.5, "pass@k": 0.75, "pass@1": 0.5, "n_problems": 4, "eval_name": "heldout",
            "gen_tokens": 37, "wall_s": 3.25, "cpu_s": 2.5}
    assert eval_record(res, "heldout") == want
    store = LineageStore(tmp_path / "lineage.db")
    try:
        Orchestrator._store_eval(SimpleNamespace(lineage=store), "v1", "heldout", res)  # type: ignore[arg-type]
        assert store.kv_get("loop/eval/v1/heldout", expected=EVAL_RECORD_SHAPE) == want
        # what LoopBase.evaluate then adds to the run's per-evaluation CPU, read back as the report does
        store.kv_set("loop/eval_cpu", {"eval/v1/heldout": want["cpu_s"]})
        assert version_compute(store, "v1")["eval_cpu_s"] == 2.5
    finally:
        store.close()


def test_executor_joins_a_cluster_started_with_ray_start(base_run, tmp_path):
    """``ray_address``: a head started with ``ray start --head`` on 127.0.0.1; the executor (in its own process: this
    one holds the module's cluster) trains v1 there, and its close disconnects without stopping the cluster."""
    temp_dir = tempfile.mkdtemp(prefix="evs", dir="/tmp")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Ray's token auth is not under test; with it, drivers of one account share ~/.ray/auth_token
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address=127.0.0.1",
                    f"--port={port}", "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp_dir}",
                    "--disable-usage-stats"], env=env, check=True, timeout=180, capture_output=True)
    try:
        run = _copy(base_run, tmp_path / "addr")
        code = (f"import json, ray\nfrom evotrainer.executor import RayExecutor, Task\n"
                f"ex = RayExecutor(address='127.0.0.1:{port}', max_parallel=2, threads=1)\n"
                f"[r] = ex.run({str(run)!r}, [Task(version_id='v1', steps={STEPS})])\n"
                f"ex.close()\nimport os\nprint(json.dumps({{'status': r.status, 'error': r.error, 'pid': r.pid, "
                f"'driver': os.getpid(), 'connected_after_close': ray.is_initialized()}}))\n")
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out["status"] == "done", out["error"]
        assert out["connected_after_close"] is False
        # a worker of the cluster trained it, not the driver process
        assert out["pid"] != out["driver"]
        s = LineageStore(run / "lineage.db", readonly=True)
        try:
            assert s.get("v1").status == "trained" and s.last_step("v1") == STEPS - 1
            [job] = [j for j in s.jobs("v1") if j.kind == "train"]
            assert job.pid == out["pid"] and job.status == "done"
        finally:
            s.close()
        assert len(_session_pids(temp_dir)) >= 2  # the cluster (gcs_server, raylet, ...) outlives the driver
    finally:
        left = _stop_session(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes left behind: {left}"


def test_bad_executor_settings_name_the_value_and_the_fix(tmp_path):
    from evotrainer.executor import ExecutorError, make_executor
    from evotrainer.recipe import RecipeError
    from evotrainer.rl_backend.cli import _cluster_spec

    with pytest.raises(ExecutorError, match=r"executor='dask': allowed: inline, ray"):
        make_executor("dask")
    with pytest.raises(ExecutorError, match=r"max_parallel=0: run at least 1 branch at a time"):
        RayExecutor(max_parallel=0)
    with pytest.raises(ExecutorError, match=r"num_gpus=1 with backend=openrlhf: .*leave num_gpus at 0"):
        RayExecutor(backend="openrlhf", num_gpus=1)
    # train --cluster FILE (the OpenRLHF branches' hardware): a ClusterSpec, or an error naming the field
    (tmp_path / "c.yaml").write_text("vllm_gpu_memory_utilization: 0.3\n")
    assert _cluster_spec(tmp_path / "c.yaml").vllm_gpu_memory_utilization == 0.3
    (tmp_path / "bad.yaml").write_text("num_gpus: 2\n")
    with pytest.raises(RecipeError, match=r"--cluster .*bad\.yaml: cluster\.num_gpus: unknown field; "
                                          r"did you mean 'num_gpus_per_node'\?"):
        _cluster_spec(tmp_path / "bad.yaml")


def test_the_worker_names_the_cli_app_and_resolves_it_in_its_process():
    # core does not import the CLI edge: the app is a "module:attribute" name, resolved where the task runs
    import ast

    from evotrainer import cli
    from evotrainer.executor import CLI_APP, ExecutorError, resolve_app

    assert CLI_APP == "evotrainer.cli:app" and resolve_app() is cli.app
    for bad in ("evotrainer.cli", "evotrainer.cli:nope", "no_such_module_x:app"):
        with pytest.raises(ExecutorError, match=r"cli_app="):
            resolve_app(bad)
    tree = ast.parse((ROOT / "evotrainer/executor.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.startswith("evotrainer.cli") for m in imported), imported
