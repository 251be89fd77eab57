"""The promotion gate on a real run folder: paired CI above 0 and no blocking finding."""

from __future__ import annotations

import math

import pytest

from evotrainer import metrics as M
from evotrainer.harness.findings import DAMAGES_WEIGHTS, Finding
from evotrainer.harness.gate import gate
from evotrainer.intervention import Intervention
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace


def _evals(ws: Workspace, vid: str, k_correct: list[int], k: int = 4) -> None:
    ws.lineage.log_eval_samples(vid, "heldout", [(f"p{i:02d}", j, float(j < c), "") for i, c in enumerate(k_correct)
                                                 for j in range(k)])


def _child(ws: Workspace, parent: str, lr: float):
    iv = Intervention(path="actor_learning_rate", old=1e-6, new=lr, category="optimizer", hypothesis="test")
    return ws.lineage.branch(parent, iv)


def test_gate_promotes_clear_gain_and_blocks_the_rest(tmp_path):
    with Workspace(tmp_path / "run", writer=True) as ws:
        root = ws.lineage.create_root(Recipe())
        _evals(ws, root.id, [1] * 20)  # every problem 1 of 4 correct: Avg@4 0.25
        good = _child(ws, root.id, 2e-6)
        _evals(ws, good.id, [3] * 20)  # 3 of 4: gain +0.5 on every problem
        small = _child(ws, root.id, 3e-6)
        _evals(ws, small.id, [1, 2] * 10)  # gain 0 or +0.25, alternating
        flat_worse = _child(ws, root.id, 4e-6)
        _evals(ws, flat_worse.id, [0, 2] * 10)  # -0.25 / +0.25: mean 0
        broken = _child(ws, root.id, 5e-6)
        _evals(ws, broken.id, [3] * 20)
        for step in range(20):  # the loss goes NaN from step 12 and stays there
            ws.lineage.log_metrics(broken.id, step, {M.LOSS_POLICY: math.nan if step >= 12 else 0.01,
                                                     M.REWARD_MEAN: 0.3})

        g = gate(ws, good.id, n_resamples=2000)
        assert g.promote and g.gain == pytest.approx(0.5) and g.ci == pytest.approx((0.5, 0.5))
        assert g.n_problems == 20 and g.blocking == []
        # exact-size permutation null is Monte Carlo here (2^20 > 2000): only the observed sign pattern
        # reaches 0.5, p = 2 * (0 + 1) / (2000 + 1)
        assert g.p_value == pytest.approx(2 / 2001)
        assert g.evidence[:2] == [f"eval:heldout:{root.id}", f"eval:heldout:{good.id}"]

        g = gate(ws, small.id, n_resamples=2000)
        # gain mean(0, .25) = 0.125; bootstrap sd of a mean of 20 draws of {0, .25}: .125 / sqrt(20) = .028,
        # so the 95% CI is about .125 +- .055: a small but consistent gain is promoted
        assert g.gain == pytest.approx(0.125) and g.ci[0] == pytest.approx(0.07, abs=0.02) and g.promote

        g = gate(ws, flat_worse.id, n_resamples=2000)
        assert not g.promote and g.gain == pytest.approx(0.0) and "lower bound is not above 0" in g.reason

        g = gate(ws, broken.id, n_resamples=2000)
        assert not g.promote and g.gain == pytest.approx(0.5)  # held-out gain alone would promote it
        assert [f.kind for f in g.blocking] == ["nan_blowup"] and g.reason.startswith("blocked by nan_blowup")

        g = gate(ws, root.id)
        assert g.promote and g.parent_id is None and "baseline" in g.reason


def test_gate_needs_evaluations(tmp_path):
    with Workspace(tmp_path / "run", writer=True) as ws:
        root = ws.lineage.create_root(Recipe())
        child = _child(ws, root.id, 2e-6)
        _evals(ws, root.id, [1] * 5)
        g = gate(ws, child.id)
        assert not g.promote and g.gain is None and f"no held-out 'heldout' outcomes for {child.id}" in g.reason


def test_gate_stored_blocking_finding_blocks(tmp_path):
    with Workspace(tmp_path / "run", writer=True) as ws:
        root = ws.lineage.create_root(Recipe())
        child = _child(ws, root.id, 2e-6)
        _evals(ws, root.id, [0] * 10)
        _evals(ws, child.id, [4] * 10)
        ws.lineage.update_version(child.id, findings=[{"kind": "reward_hacking", "severity": "blocking",
                                                       "explanation": "test files edited", "analyzer": "swe"}])
        g = gate(ws, child.id, n_resamples=1000)
        assert not g.promote and [f.kind for f in g.blocking] == ["reward_hacking"]


def test_gate_merge_must_not_fall_below_a_source(tmp_path):
    # a merge of two kept siblings is compared with the parent AND must score at least as well as each
    # source (the fresh-clone default run kept a merge at 0.573 while its source scored 0.620)
    with Workspace(tmp_path / "run", writer=True) as ws:
        root = ws.lineage.create_root(Recipe())
        _evals(ws, root.id, [1] * 20)  # Avg@4 0.25
        iv_lr = Intervention(path="actor_learning_rate", old=1e-6, new=2e-6, category="optimizer", hypothesis="t")
        iv_len = Intervention(path="generate_max_len", old=64, new=128, category="rollout", hypothesis="t")
        a, b = ws.lineage.branch(root.id, iv_lr), ws.lineage.branch(root.id, iv_len)
        _evals(ws, a.id, [3] * 20)  # 0.75
        _evals(ws, b.id, [2] * 20)  # 0.50
        worse = ws.lineage.branch(root.id, [iv_lr, iv_len], note="merge")
        _evals(ws, worse.id, [2] * 20)  # 0.50: +0.25 over the parent, but below source a (0.75)
        g = gate(ws, worse.id, n_resamples=2000)
        assert not g.promote and g.gain == pytest.approx(0.25)
        assert g.reason.startswith(f"merge below its source(s): held-out Avg@k 0.500 < {a.id} 0.750")
        assert f"eval:heldout:{a.id}" in g.evidence and f"eval:heldout:{b.id}" not in g.evidence
        assert g.below_sources == [a.id]
        # a single-factor child at 0.50 is promoted by the same numbers: the rule is only for merges
        assert gate(ws, b.id, n_resamples=2000).promote
        both = ws.lineage.branch(root.id, [iv_lr, iv_len], note="merge 2")
        _evals(ws, both.id, [3] * 20)  # ties the best source: kept
        g = gate(ws, both.id, n_resamples=2000)
        assert g.promote and g.reason.startswith("promote:")


def test_gate_blocks_a_version_that_still_pays_a_leaky_term_an_ancestor_was_found_farming(tmp_path):
    # the SmolLM2 leaky-reward scenario kept a child (+0.219 held-out) whose recipe still paid the format
    # token that reward_hacking on its parent found paying wrong answers 0.688 vs right ones 0.522
    from evotrainer.harness.findings import Finding
    from evotrainer.recipe import set_path

    with Workspace(tmp_path / "run", writer=True) as ws:
        base = set_path(set_path(Recipe(), "reward.format_token.weight", 1.0), "reward.format_token.params",
                        {"token": "The"})
        root = ws.lineage.create_root(base)
        _evals(ws, root.id, [1] * 20)
        leaky = ws.lineage.branch(root.id, Intervention(path="generate_max_len", old=64, new=128, category="rollout"))
        fixed = ws.lineage.branch(root.id, Intervention(path="reward.format_token.weight", old=1.0, new=0.0,
                                                        category="reward"))
        _evals(ws, leaky.id, [3] * 20)
        _evals(ws, fixed.id, [3] * 20)
        hack = Finding(kind="reward_hacking", severity="warn", versions=[root.id], explanation="leaky",
                       evidence=["reward/format_token/mean"],
                       data={"payout": {"format_token": {"wrong": 0.688, "right": 0.522, "n_wrong": 77, "n_right": 67}}})
        g = gate(ws, leaky.id, n_resamples=2000, findings=[hack])
        assert not g.promote and g.gain == pytest.approx(0.5)  # the held-out gain alone would promote it
        assert [f.kind for f in g.blocking] == ["reward_hacking"] and g.reason.startswith("blocked by reward_hacking")
        assert g.blocking[0].explanation == (
            f"{leaky.id} still pays reward term 'format_token' (weight 1), which reward_hacking on {root.id} found "
            "paying whatever the answer (it paid 0.688 on wrong answers vs 0.522 on right ones); a held-out gain "
            "under a leaky term is not kept: set reward.format_token.weight to 0")
        g = gate(ws, fixed.id, n_resamples=2000, findings=[hack])  # the term removed: promoted on its gain
        assert g.promote and g.blocking == []
        # a finding of another kind, or without a payout table, does not block by inheritance
        other = Finding(kind="truncation", severity="warn", versions=[root.id], explanation="x", data={"payout": {}})
        assert gate(ws, leaky.id, n_resamples=2000, findings=[other]).promote


def test_a_dev_score_collapsed_against_its_start_point_damages_the_weights(tmp_path):
    # the lr 2e-4 variant's root: the base model scored 0.240 on dev (no_rl), the root 0.000 after its 8 steps, and
    # no analyzer had a finding for it (docs/compare.md §12): its children trained on from the broken weights
    with Workspace(tmp_path / "run", writer=True) as ws:
        root = ws.lineage.create_root(Recipe())
        ws.lineage.log_eval_samples(root.id, "no_rl", [(f"p{i:02d}", j, float(j < 1), "") for i in range(20)
                                                       for j in range(4)])  # the base model: Avg@4 0.25
        _evals(ws, root.id, [0] * 20)
        g = gate(ws, root.id, n_resamples=500, findings=[])
        assert not g.promote and g.damaged_weights == "eval_collapse", g.reason
        f = g.blocking[0]
        assert (f.kind, f.severity, f.versions, f.data["start"], f.data["start_eval"]) == \
            ("eval_collapse", "blocking", [root.id], root.id, "no_rl")
        assert f.data["start_score"] == pytest.approx(0.25) and f.data["score"] == 0.0
        assert f.data["ci"] == pytest.approx([-0.25, -0.25])  # every problem lost its one correct sample of 4
        assert "fell from 0.250 (the base model (no-RL)) to 0.000 on 20 paired problems" in f.explanation
        # a child against its parent: 0.75 -> 0.25 (-0.5 on every problem, ratio 1/3) is a collapse; 0.75 -> 0.5
        # (ratio 2/3) is a significant loss but no collapse; a drop within noise is none either
        _evals(ws, root.id, [3] * 20)  # (the same problem ids: the root now reads 0.75)
        for k_correct, damaged in (([1] * 20, "eval_collapse"), ([2] * 20, None), ([3, 2] * 10, None)):
            child = _child(ws, root.id, 2e-6)
            _evals(ws, child.id, k_correct)
            g = gate(ws, child.id, n_resamples=500, findings=[])
            assert g.damaged_weights == damaged and not g.promote, (k_correct, g.reason)
        # no stored start point (a root without a no-RL evaluation): nothing to compare, no finding
        other = Workspace(tmp_path / "run2", writer=True)
        r2 = other.lineage.create_root(Recipe())
        _evals(other, r2.id, [0] * 20)
        assert gate(other, r2.id, n_resamples=500, findings=[]).promote
        other.close()


def test_gate_names_the_damaged_weights_finding_of_the_version_itself(tmp_path):
    # the typed flag the decision stores (Finding.damages_weights, by kind from findings.DAMAGES_WEIGHTS): set
    # for a blocking entropy_collapse / nan_blowup / kl_blowup on this version alone, not for truncation, not
    # for a finding that covers the parent too
    assert DAMAGES_WEIGHTS == ("entropy_collapse", "nan_blowup", "kl_blowup", "eval_collapse")
    with Workspace(tmp_path / "run", writer=True) as ws:
        root = ws.lineage.create_root(Recipe())
        child = _child(ws, root.id, 2e-6)
        _evals(ws, root.id, [1] * 10)
        _evals(ws, child.id, [3] * 10)

        def blocking(kind, versions):
            return Finding(kind=kind, severity="blocking", versions=versions, explanation="test")

        g = gate(ws, child.id, n_resamples=500, findings=[blocking("truncation", [child.id]),
                                                         blocking("entropy_collapse", [child.id])])
        assert not g.promote and g.damaged_weights == "entropy_collapse"
        assert [f.damages_weights for f in g.blocking] == [False, True]
        g = gate(ws, child.id, n_resamples=500, findings=[blocking("truncation", [child.id])])
        assert not g.promote and g.damaged_weights is None
        g = gate(ws, child.id, n_resamples=500, findings=[blocking("nan_blowup", [child.id, root.id])])
        assert not g.promote and g.damaged_weights is None
        # an analyzer may say so for a kind outside the table; a stored finding without the field gets it by kind
        g = gate(ws, child.id, n_resamples=500, findings=[Finding(kind="weights_corrupt", severity="blocking",
                                                                  versions=[child.id], explanation="test",
                                                                  damages_weights=True)])
        assert g.damaged_weights == "weights_corrupt"
        ws.lineage.update_version(child.id, findings=[{"kind": "kl_blowup", "severity": "blocking",
                                                       "explanation": "stored", "versions": [child.id]}])
        assert gate(ws, child.id, n_resamples=500, findings=[]).damaged_weights == "kl_blowup"
