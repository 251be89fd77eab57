"""Rollout-inspection server on the hand-sized run of mcp_testlib (values checked by hand)."""

from __future__ import annotations

import pytest
from mcp_testlib import SyncClient, make_run

from evotrainer.servers.app import build_server


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    c = SyncClient(build_server("rollouts", make_run(tmp_path_factory.mktemp("r"))))
    yield c
    c.close()


def test_sample_rollouts_filters_and_pages(client):
    # v0 train: 8 rollouts; page of 3 -> next_offset 3
    page = client.ok("sample_rollouts", {"version_id": "v0", "split": "train", "limit": 3})
    assert page["total"] == 8 and page["next_offset"] == 3
    assert [r["rollout_id"] for r in page["rollouts"]] == ["v0/train/0/g0/0", "v0/train/0/g0/1", "v0/train/0/g1/0"]
    # zero-variance groups of v0 train: step0/g1 [0,0] and step1/g0 [1,1] -> 4 rollouts
    zv = client.ok("sample_rollouts", {"version_id": "v0", "split": "train", "zero_variance_group": True})
    assert sorted(r["rollout_id"] for r in zv["rollouts"]) == [
        "v0/train/0/g1/0", "v0/train/0/g1/1", "v0/train/1/g0/0", "v0/train/1/g0/1"]
    # truncated: only step0/g1
    tr = client.ok("sample_rollouts", {"finish_reason": "length"})
    assert tr["total"] == 2 and {r["group_id"] for r in tr["rollouts"]} == {"g1"}
    # step 1, reward >= 0.5: g0 [1,1] and g1 sample 0 -> 3
    assert client.ok("sample_rollouts", {"version_id": "v0", "split": "train", "step_min": 1,
                                         "reward_min": 0.5})["total"] == 3
    # text: completions "6" appear once (step0/g1/1)
    assert [r["rollout_id"] for r in client.ok("sample_rollouts", {"text": "6"})["rollouts"]] == ["v0/train/0/g1/1"]
    # seeded random order is reproducible and a permutation
    a = client.ok("sample_rollouts", {"seed": 7, "limit": 100})
    b = client.ok("sample_rollouts", {"seed": 7, "limit": 100})
    assert [r["rollout_id"] for r in a["rollouts"]] == [r["rollout_id"] for r in b["rollouts"]]
    assert a["total"] == 16  # 8 train + 8 eval
    plain = [r["rollout_id"] for r in client.ok("sample_rollouts", {"limit": 100})["rollouts"]]
    shuffled = [r["rollout_id"] for r in a["rollouts"]]
    assert len(set(plain)) == 16 and sorted(shuffled) == sorted(plain)  # every rollout once, in another order
    assert shuffled != plain
    r0 = page["rollouts"][0]
    assert r0["components"] == {"correctness": 1.0} and r0["correct"] == 1.0 and r0["length"] == 3


def test_sample_rollouts_errors(client):
    assert "step_min=3 > step_max=1" in client.err("sample_rollouts", {"step_min": 3, "step_max": 1})
    assert "not found" in client.err("sample_rollouts", {"version_id": "v7"})
    assert "finish_reason" in client.err("sample_rollouts", {"finish_reason": "timeout"})


def test_get_group_and_group_stats(client):
    g = client.ok("get_group", {"version_id": "v0", "step": 0, "group_id": "g0"})
    # rewards [1, 0]: mean 0.5, population std 0.5
    assert (g["reward_mean"], g["reward_std"], g["zero_variance"]) == (0.5, 0.5, False)
    assert [r["completion"] for r in g["rollouts"]] == ["2", "3"] and g["answer"] == "2"
    assert "no group 'g9'" in client.err("get_group", {"version_id": "v0", "step": 0, "group_id": "g9"})
    s = client.ok("group_stats", {"version_id": "v0"})
    # 4 groups, 2 zero-variance -> 0.5; step 0 reward mean (1+0+0+0)/4 = 0.25; group stds (0.5, 0) -> 0.25;
    # truncation 2/4 = 0.5. step 1 reward mean 3/4 = 0.75, truncation 0.
    assert s["n_groups"] == 4 and s["frac_zero_variance"] == 0.5
    st0, st1 = s["steps"]
    assert (st0["step"], st0["n_groups"], st0["n_rollouts"]) == (0, 2, 4)
    assert st0["reward_mean"] == pytest.approx(0.25) and st0["mean_group_std"] == pytest.approx(0.25)
    assert st0["truncation_rate"] == pytest.approx(0.5) and st0["frac_zero_variance"] == pytest.approx(0.5)
    assert st1["reward_mean"] == pytest.approx(0.75) and st1["truncation_rate"] == 0.0
    assert st0["mean_length"] == pytest.approx(3.5)  # lengths 3, 4 per group
    assert client.ok("group_stats", {"version_id": "v0", "step_min": 1})["n_groups"] == 2
    assert client.ok("group_stats", {"version_id": "v1"})["n_groups"] == 0  # v1 has eval rollouts only


def test_search_rollouts_full_text(client):
    # the token "6" occurs once: the completion of v0/train/0/g1/1
    hits = client.ok("search_rollouts", {"query": "6"})
    assert [r["rollout_id"] for r in hits["rollouts"]] == ["v0/train/0/g1/1"] and hits["rollouts"][0]["score"] > 0
    assert client.ok("search_rollouts", {"query": "6", "version_id": "v1"})["rollouts"] == []
    # pages of the ranking ("2" occurs in every p1 / p2 prompt): pages do not overlap
    first = client.ok("search_rollouts", {"query": "2", "limit": 2})
    second = client.ok("search_rollouts", {"query": "2", "limit": 2, "offset": 2})
    assert first["next_offset"] == 2 and len(second["rollouts"]) == 2
    assert not {r["rollout_id"] for r in first["rollouts"]} & {r["rollout_id"] for r in second["rollouts"]}
    both = client.ok("search_rollouts", {"query": "4", "split": "eval"})  # answer-free: completions "4" of v1 only
    assert {r["rollout_id"] for r in both["rollouts"]} == {"v1/eval/0/p2/0"}
    assert "query" in client.err("search_rollouts", {"query": ""})


def test_compare_versions_on_same_prompts(client):
    cmp = client.ok("compare_versions", {"version_a": "v0", "version_b": "v1", "samples_per_side": 1})
    # eval means: v0 (1+0+0+0)/4 = 0.25, v1 (1+1+1+0)/4 = 0.75; both prompts differ by 0.5 -> sorted by id
    assert cmp["n_common_prompts"] == 2 and cmp["reward_mean_a"] == 0.25 and cmp["reward_mean_b"] == 0.75
    p1, p2 = cmp["prompts"]
    assert p1["prompt_id"] == "p1" and p1["a"]["reward_mean"] == 0.5 and p1["b"]["reward_mean"] == 1.0
    assert p2["a"]["correct_mean"] == 0.0 and p2["b"]["correct_mean"] == 0.5 and p2["b"]["completions"] == ["4"]
    assert "share no prompts" in client.err("compare_versions", {"version_a": "v0", "version_b": "v1",
                                                                  "split": "train"})
