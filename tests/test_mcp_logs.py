"""Log- and metric-search server on the hand-sized run of mcp_testlib."""

from __future__ import annotations

import pytest
from mcp_testlib import SyncClient, make_run

from evotrainer.servers.app import build_server
from evotrainer.servers.logs import downsample, stats_of


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    c = SyncClient(build_server("logs", make_run(tmp_path_factory.mktemp("l"))))
    yield c
    c.close()


def test_search_logs(client):
    assert client.ok("search_logs")["total"] == 3
    assert [r["message"] for r in client.ok("search_logs", {"level": "warning"})["records"]] == [
        "reward spike at step 3", "NaN loss at step 2"]
    assert [r["message"] for r in client.ok("search_logs", {"query": "nan"})["records"]] == ["NaN loss at step 2"]
    rx = client.ok("search_logs", {"query": r"step \d$", "regex": True, "version_id": "v0"})
    assert [r["level"] for r in rx["records"]] == ["warning"]
    assert client.ok("search_logs", {"until": "2000-01-01T00:00:00Z"})["total"] == 0
    assert client.ok("search_logs", {"since": "0", "limit": 1})["next_offset"] == 1
    assert "not a valid regex" in client.err("search_logs", {"query": "(", "regex": True})
    assert "ISO 8601" in client.err("search_logs", {"since": "yesterday"})
    assert "since" in client.err("search_logs", {"since": "100", "until": "50"})


def test_metrics_tools(client):
    ml = client.ok("list_metrics")
    assert ml["names"] == ["reward/mean"]
    assert ml["versions"] == [{"version_id": "v0", "n_steps": 4, "last_step": 3, "names": ["reward/mean"],
                              "names_omitted": 0}]
    assert client.ok("list_metrics", {"version_id": "v1"})["versions"][0]["n_steps"] == 0
    s = client.ok("get_metric_series", {"version_id": "v0", "name": "reward/mean", "max_points": 2})
    # buckets [0.25, 0.5] -> 0.375 at step 1, [0.5, 0.75] -> 0.625 at step 3
    assert s["downsampled"] and [(p["step"], p["value"], p["min"], p["max"]) for p in s["points"]] == [
        (1, 0.375, 0.25, 0.5), (3, 0.625, 0.5, 0.75)]
    assert client.ok("get_metric_series", {"version_id": "v0", "name": "reward/mean", "step_min": 2})["n_raw"] == 2
    assert "it has: reward/mean" in client.err("get_metric_series", {"version_id": "v0", "name": "policy/kl"})
    assert "no metrics yet" in client.err("get_metric_series", {"version_id": "v1", "name": "reward/mean"})
    m = client.ok("metric_summary", {"version_id": "v0"})["metrics"][0]
    # slope: x mean 1.5, y mean 0.5; sum dx*dy = 0.375 + 0 + 0 + 0.375 = 0.75; sum dx^2 = 5 -> 0.15
    assert (m["n"], m["first"], m["last"], m["min"], m["max"], m["mean"]) == (4, 0.25, 0.75, 0.25, 0.75, 0.5)
    assert m["slope_per_step"] == pytest.approx(0.15) and m["last_k_mean"] == 0.5
    assert "not logged for v0: policy/kl" in client.err("metric_summary", {"version_id": "v0", "names": ["policy/kl"]})


def test_downsample_and_stats_skip_nan():
    pts = downsample([(0, 1.0), (1, float("nan")), (2, 3.0)], 1)
    assert [(p.step, p.value, p.n) for p in pts] == [(2, 2.0, 3)]  # (1 + 3) / 2
    assert stats_of("x", [(0, float("nan"))]).n == 0
