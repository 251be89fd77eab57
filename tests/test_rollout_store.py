"""Rollout store: append, count, SQL aggregates through DuckDB, native full-text search."""

from __future__ import annotations

import json
import math

from evotrainer.rollouts import RolloutStore, make_record


def _rows():
    # 2 prompts x 3 samples; prompt p0 all correct (a zero-variance group), p1 one of three.
    rows = []
    for g, (prompt, rewards) in enumerate([("What is 2+3?", [1, 1, 1]), ("What is 4+4?", [0, 1, 0])]):
        for i, r in enumerate(rewards):
            rows.append(make_record(version_id="v1", step=0, prompt_id=f"p{g}", group_id=f"g{g}", sample_idx=i,
                                    prompt=prompt, completion=f"The answer is {5 if g == 0 else 8 - (r == 0)}",
                                    reward=float(r), components={"correctness": float(r)}, correct=float(r),
                                    length=4 + i, finish_reason="length" if i == 2 else "eos"))
    return rows


def test_add_query_aggregate_search(tmp_path):
    s = RolloutStore(tmp_path / "rollouts")
    assert s.count() == 0 and s.query() == [] and s.search("answer") == []
    assert s.add(_rows()) == 6
    assert s.count() == 6 and s.count("group_id = 'g1'") == 3
    first = s.query("group_id = 'g1'", limit=1)[0]
    assert first["rollout_id"] == "v1/train/0/g1/0" and json.loads(first["components"]) == {"correctness": 0.0}
    # per-group reward std: g0 -> 0 (zero variance), g1 -> population std of (0,1,0) = sqrt(2/9) = 0.4714
    stats = s.sql("SELECT group_id, stddev_pop(reward) AS sd, avg(length) AS L FROM rollouts GROUP BY group_id "
                  "ORDER BY group_id")
    assert stats[0]["sd"] == 0.0
    assert math.isclose(stats[1]["sd"], math.sqrt(2 / 9), rel_tol=1e-12)
    assert stats[1]["L"] == 5.0  # lengths 4, 5, 6
    assert s.sql("SELECT avg(CASE WHEN finish_reason='length' THEN 1 ELSE 0 END) AS t FROM rollouts")[0]["t"] == 2 / 6
    hits = s.search("4+4", limit=3)
    assert hits and all(h["prompt"] == "What is 4+4?" for h in hits)
    # re-opened store sees the same rows (a reader in another process)
    assert RolloutStore(tmp_path / "rollouts").count() == 6
    s.add([make_record(version_id="v2", step=0, prompt_id="p0", group_id="g0", sample_idx=0, prompt="What is 2+3?",
                       completion="answer 5", reward=1.0)])
    assert len(s.search("answer", limit=50)) == 7  # FTS index rebuilt after new rows


def test_delete_by_predicate(tmp_path):
    s = RolloutStore(tmp_path / "rollouts")
    assert s.delete("step > 0") == 0  # no table yet
    s.add(_rows())
    assert s.delete("group_id = 'g1' AND sample_idx > 0") == 2  # samples 1 and 2 of g1
    assert s.count() == 4
