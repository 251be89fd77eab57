"""A third-party client: the MCP Inspector CLI (@modelcontextprotocol/inspector 2.12.0) against `evotrainer serve all`.

It lists every tool of the combined server (the same catalogue as the in-process server, with no schema-
portability warning under ``--strict``) and calls one tool of each toolset. The Inspector is installed by
``make mcp-inspector`` (a ``make test`` prerequisite) into ``$EVOTRAINER_INSPECTOR_DIR`` (default
``~/.cache/evotrainer/inspector``); the test fails, saying so, where node or the install is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_testlib import SyncClient, make_run

from evotrainer.servers.app import build_server

INSPECTOR_DIR = Path(os.environ.get("EVOTRAINER_INSPECTOR_DIR", Path.home() / ".cache" / "evotrainer" / "inspector"))
INSPECTOR = INSPECTOR_DIR / "node_modules" / ".bin" / "mcp-inspector"


@pytest.fixture(scope="module", autouse=True)
def _inspector_installed():
    # a `make test` prerequisite, not hardware: a missing install is a broken setup, not a reason to skip
    if shutil.which("node") is None:
        pytest.fail("node is not installed (the Inspector is a node CLI); install nodejs, then `make mcp-inspector`")
    if not INSPECTOR.exists():
        pytest.fail(f"MCP Inspector not installed at {INSPECTOR}; run `make mcp-inspector`")


def _inspector(tmp: Path, run: Path, *method_args: str) -> subprocess.Popen:
    env = {**os.environ, "MCP_CATALOG_PATH": str(tmp / "catalog.json"), "HF_HUB_OFFLINE": "1"}
    cmd = [str(INSPECTOR), "--cli", "--connect-timeout", "300000", *(["--strict"] if "tools/list" in method_args else []),
           sys.executable, "-m", "evotrainer.cli", "serve", "all", "--run", str(run), *method_args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_inspector_lists_all_tools_and_calls_one_per_server(tmp_path):
    run = make_run(tmp_path)
    calls = {  # one tool of each server, run concurrently (each starts its own server process)
        "training": ("diff_versions", ["a=v0", "b=v1"]),
        "rollouts": ("group_stats", ["version_id=v0"]),
        "logs": ("get_metric_series", ["version_id=v0", "name=reward/mean", "max_points=2"]),
        "analyzers": ("list_analyzers", []),
        "skills": ("get_skill", ["skill_id=clip_higher"]),
    }
    procs = {"list": _inspector(tmp_path, run, "--method", "tools/list")}
    for server, (tool, args) in calls.items():
        targs = [x for a in args for x in ("--tool-arg", a)]
        procs[server] = _inspector(tmp_path, run, "--method", "tools/call", "--tool-name", tool, *targs)
    out = {}
    for key, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, f"{key}: exit {p.returncode}\n{stderr[-2000:]}"
        out[key] = (json.loads(stdout), stderr)

    listed, stderr = out["list"]
    c = SyncClient(build_server("all", run))
    try:
        expected = {t.name for t in c.tools()}
    finally:
        c.close()
    assert {t["name"] for t in listed["tools"]} == expected and len(expected) == 41  # + create_root, branch_control, propose_recipe, record_gains
    assert all(t.get("outputSchema") and t.get("description") for t in listed["tools"])
    assert "warning" not in stderr.lower() or "0 warnings" in stderr.lower()

    def structured(key: str) -> dict:
        res = out[key][0]
        assert res.get("isError") is False, res
        return res["structuredContent"]

    assert structured("training")["changes"] == [{"path": "eps_clip_high", "a_value": 0.28, "b_value": 0.3}]
    assert structured("rollouts")["n_groups"] == 4 and structured("rollouts")["frac_zero_variance"] == 0.5
    assert [p["value"] for p in structured("logs")["points"]] == [0.375, 0.625]
    assert "truncation" in {a["name"] for a in structured("analyzers")["analyzers"]}
    assert structured("skills")["recipe_path"] == "eps_clip_high"


def test_inspector_calls_the_log_tools_on_an_imported_verl_log(tmp_path):
    """Issue 20's acceptance through the third-party client: a shipped verl log imported with `evotrainer import`
    gets get_metric_series, search_logs and run_analyzer over stdio like a run folder of our own."""
    log = Path(__file__).parent / "data" / "verl_logs" / "Qwen2.5-0.5B-bsz256_2-prompt512-resp256-0.538.log.gz"
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "evotrainer.cli", "import", str(log), "--run", str(run)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    calls = {"series": ("get_metric_series", ["version_id=v0", "name=reward/mean", "max_points=1000"]),
             "logs": ("search_logs", ["query=step:1 -"]),
             "analyze": ("run_analyzer", ["version_ids=[\"v0\"]"])}
    procs = {k: _inspector(tmp_path, run, "--method", "tools/call", "--tool-name", tool,
                           *[x for a in args for x in ("--tool-arg", a)]) for k, (tool, args) in calls.items()}
    out = {}
    for key, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, f"{key}: exit {p.returncode}\n{stderr[-2000:]}"
        res = json.loads(stdout)
        assert res.get("isError") is False, res
        out[key] = res["structuredContent"]
    # the same values the in-process client reads (tests/test_import.py): 435 steps 0..434 of verl's reward mean
    c = SyncClient(build_server("all", run))
    try:
        assert out["series"] == c.ok("get_metric_series", {"version_id": "v0", "name": "reward/mean",
                                                           "max_points": 1000})
        assert out["logs"] == c.ok("search_logs", {"query": "step:1 -"})
    finally:
        c.close()
    assert len(out["series"]["points"]) == 435 and out["series"]["points"][0]["step"] == 0
    assert "entropy_collapse" in {f["kind"] for f in out["analyze"]["findings"]}
