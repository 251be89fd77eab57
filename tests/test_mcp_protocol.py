"""MCP protocol and tool-contract details (issue 20): compare_versions vs the no-RL row, error codes,
logging, annotations, completions, per-version resources, the stateless revision.

Runs the real servers through the SDK's in-process ``Client`` (mcp_testlib.SyncClient) on small
hand-built run folders.
"""

from __future__ import annotations

import pytest
from evotrainer.servers import build_server
from mcp_testlib import SyncClient, make_run


# --- compare_versions keeps the no-RL evaluation apart -------------------------------------------
def _run_with_no_rl(root):
    """Root v0 with held-out eval rollouts and a no-RL base-model evaluation on the same two prompts.

    v0 heldout: p1 [1, 1], p2 [1, 0] -> mean 3/4 = 0.75
    no-RL:      p1 [0, 0, 1, 0], p2 [0, 0, 0, 0] -> mean 1/8 = 0.125
    pooled (the old answer for v0): 4/12 = 0.333..., which is neither model.
    """
    from evotrainer.recipe import Recipe
    from evotrainer.rollouts import make_record
    from evotrainer.workspace import Workspace

    run = root / "run"
    prompts = {"p1": ("What is 1+1?", "2"), "p2": ("What is 2+2?", "4")}
    evals = {"heldout": {"p1": [1.0, 1.0], "p2": [1.0, 0.0]},
             "no_rl": {"p1": [0.0, 0.0, 1.0, 0.0], "p2": [0.0, 0.0, 0.0, 0.0]}}
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(Recipe(model={"name_or_path": "tiny-random"}))
        recs = [make_record(version_id="v0", step=3, prompt_id=pid, group_id=f"{name}-{pid}", sample_idx=i,
                            prompt=prompts[pid][0], completion=f"{name}{i}", reward=r, answer=prompts[pid][1],
                            correct=r, split="eval")
                for name, per in evals.items() for pid, rs in per.items() for i, r in enumerate(rs)]
        ws.rollouts.add(recs)
    return run


@pytest.fixture(scope="module")
def no_rl_client(tmp_path_factory):
    c = SyncClient(build_server("rollouts", _run_with_no_rl(tmp_path_factory.mktemp("norl"))))
    yield c
    c.close()


def test_compare_root_against_the_named_no_rl_row(no_rl_client):
    cmp = no_rl_client.ok("compare_versions", {"version_a": "v0", "version_b": "no-rl", "samples_per_side": 4})
    assert cmp["reward_mean_a"] == 0.75 and cmp["reward_mean_b"] == 0.125  # not the pooled 1/3
    assert cmp["version_b"] == "no-rl" and cmp["n_common_prompts"] == 2
    first, second = cmp["prompts"]  # largest difference first: p1 |1 - 0.25| = 0.75, p2 |0.5 - 0| = 0.5
    assert (first["prompt_id"], second["prompt_id"]) == ("p1", "p2")
    assert first["a"]["n"] == 2 and first["b"]["n"] == 4 and first["b"]["reward_mean"] == 0.25
    assert first["a"]["completions"] == ["heldout0", "heldout1"]
    assert first["b"]["completions"] == ["no_rl0", "no_rl1", "no_rl2", "no_rl3"]
    base = no_rl_client.ok("compare_versions", {"version_a": "base", "version_b": "v0"})
    assert (base["reward_mean_a"], base["reward_mean_b"]) == (0.125, 0.75)  # "base" is an alias


def test_no_rl_row_errors(no_rl_client, tmp_path):
    assert "has eval rollouts only; use split='eval'" in no_rl_client.err(
        "compare_versions", {"version_a": "v0", "version_b": "no-rl", "split": "train"})
    c = SyncClient(build_server("rollouts", make_run(tmp_path)))  # a run without a no-RL evaluation
    try:
        assert "this run has no no-RL base-model evaluation" in c.err(
            "compare_versions", {"version_a": "v0", "version_b": "no-rl"})
        # the old behaviour stays for plain versions: v0 (1+0+0+0)/4 = 0.25, v1 (1+1+1+0)/4 = 0.75
        cmp = c.ok("compare_versions", {"version_a": "v0", "version_b": "v1"})
        assert (cmp["reward_mean_a"], cmp["reward_mean_b"]) == (0.25, 0.75)
    finally:
        c.close()
