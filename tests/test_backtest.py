"""Backtests on a real run folder: re-score with a fixed reward, replay group filters, judge an analyzer."""

from __future__ import annotations

import numpy as np
import pytest

from evotrainer import metrics as M
from evotrainer.harness.backtest import backtest_analyzer, filter_keep, replay_filter, rescore_rollouts
from evotrainer.harness.evidence import Evidence
from evotrainer.recipe import Recipe, set_path
from evotrainer.rl_backend.rewards import compute_rewards
from evotrainer.rl_backend.tasks import Problem
from evotrainer.rollouts import make_record
from evotrainer.workspace import Workspace

LEAKY = {"correctness": {"weight": 1.0}, "format_token": {"weight": 1.0, "params": {"token": "Answer:"}}}
FIXED = {"correctness": {"weight": 1.0}}


def _store_scored(ws: Workspace, version: str, groups: list[tuple[str, str, list[str]]], spec: dict,
                  step: int = 0) -> None:
    """Score each group's completions with the trainer's reward code under ``spec`` and store them."""
    rows = []
    for gi, (question, answer, completions) in enumerate(groups):
        p = Problem(id=f"q{gi}", prompt=question, answer=answer, meta={"task": "arithmetic"})
        out = compute_rewards(spec, [p], completions, finish_reasons=["eos"] * len(completions),
                              lengths=[len(c.split()) for c in completions], generate_max_len=64)
        for k, c in enumerate(completions):
            rows.append(make_record(version_id=version, step=step, prompt_id=p.id, group_id=f"{step}-{gi}",
                                    sample_idx=k, prompt=question, completion=c, answer=answer,
                                    reward=out.total[k], components={n: v[k] for n, v in out.components.items()},
                                    correct=out.correct[k], length=len(c.split())))
    ws.rollouts.add(rows)


def test_rescore_under_fixed_reward_lowers_the_leaky_versions_reward(tmp_path):
    with Workspace(tmp_path / "run", writer=True) as ws:
        root = ws.lineage.create_root(set_path(Recipe(), "reward.format_token.weight", 1.0))
        # The policy learned to print the paid token, mostly with wrong answers.
        groups = [("What is 3+4?", "7", ["Answer: 7", "Answer: 9", "Answer: 1"]),
                  ("What is 5+5?", "10", ["Answer: 12", "Answer: 12", "10"])]
        _store_scored(ws, root.id, groups, LEAKY)
        t = ws.rollouts.to_arrow()
        res = rescore_rollouts(t, FIXED, generate_max_len=64, task="arithmetic")
    s = res.summary
    # leaky: group 1 (1+1, 0+1, 0+1) = (2, 1, 1); group 2 (0+1, 0+1, 1+0) = (1, 1, 1) -> mean 7/6
    # fixed: correctness only (1, 0, 0) and (0, 0, 1) -> mean 2/6
    assert s["old_reward_mean"] == pytest.approx(7 / 6)
    assert s["new_reward_mean"] == pytest.approx(2 / 6)
    assert s["reward_change"] == pytest.approx(-5 / 6)
    # group 2 was zero-variance under the leaky reward (1, 1, 1) and carries signal under the fixed one
    assert s["frac_zero_std_old"] == 0.5 and s["frac_zero_std_new"] == 0.0
    # best sample of group 2 moves from sample 0 (first of the ties) to sample 2 ("10")
    assert s["frac_groups_best_changed"] == 0.5
    # new group_norm advantages of group 1: rewards (1, 0, 0), mean 1/3, unbiased std sqrt(1/3)
    # -> (2/3) / 0.57735 = 1.1547 and -(1/3) / 0.57735 = -0.57735
    assert res.new_advantage[:3] == pytest.approx([1.1547005, -0.5773503, -0.5773503], abs=1e-6)


def test_filter_keep_by_hand():
    # 4 groups of 3: (1,1,1) zero var, (0,0,0) zero var, (1,0,0) mean 1/3, (1,1,0) mean 2/3
    r = np.array([1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 0], dtype=float)
    assert filter_keep(r, 3).tolist() == [False, False, True, True]
    # dynamic sampling keeps low < mean < high = (0.5, 1.0): only the 2/3 group (and it has variance)
    assert filter_keep(r, 3, dynamic_filtering=True, dynamic_filtering_range=(0.5, 1.0)).tolist() == \
        [False, False, False, True]
    # no zero-variance drop, top-p 0.5 by std: the two groups with std 0.577 (ties keep the earlier)
    assert filter_keep(r, 3, drop_zero_variance_groups=False, group_filter_top_p=0.5).tolist() == \
        [False, False, True, True]
    # as the trainer: top-p applies among the groups still kept -> ceil(0.5 x 2) = 1 of (1,0,0), (1,1,0);
    # equal std, the earlier wins
    assert filter_keep(r, 3, group_filter_top_p=0.5).tolist() == [False, False, True, False]


def test_replay_filter_reproduces_logged_kept_fraction(tmp_path):
    recipe = Recipe()  # drop_zero_variance_groups=True, no dynamic filtering, top-p 1
    with Workspace(tmp_path / "run", writer=True) as ws:
        v = ws.lineage.create_root(recipe)
        groups = [("What is 1+1?", "2", ["2", "2", "2"]), ("What is 2+2?", "4", ["5", "6", "7"]),
                  ("What is 3+3?", "6", ["6", "1", "1"]), ("What is 4+4?", "8", ["8", "8", "0"])]
        for step in range(3):
            _store_scored(ws, v.id, groups, FIXED, step=step)
            ws.lineage.log_metrics(v.id, step, {M.REWARD_KEPT_GROUP_FRAC: 0.5})  # 2 of 4 groups informative
        ev = Evidence.from_workspace(ws)
        t = ws.rollouts.to_arrow()
        rep = replay_filter(t, v.id, ws.lineage.get(v.id).recipe, evidence=ev)
        changed = replay_filter(t, v.id, recipe, dynamic_filtering=True, dynamic_filtering_range=(0.5, 1.0))
    assert rep.steps.tolist() == [0, 1, 2]
    assert rep.kept_frac.tolist() == [0.5, 0.5, 0.5] and rep.logged_kept_frac.tolist() == [0.5, 0.5, 0.5]
    assert rep.summary()["max_abs_diff_vs_logged"] == 0.0
    assert rep.effective_batch.tolist() == [6, 6, 6]  # 2 groups x 3 samples
    # kept rewards (1,0,0,1,1,0): mean 0.5, population std 0.5
    assert rep.reward_std_kept.tolist() == pytest.approx([0.5, 0.5, 0.5])
    assert changed.kept_frac.tolist() == [0.25, 0.25, 0.25]  # only the 2/3 group is in (0.5, 1)
    with pytest.raises(ValueError, match="no stored train rollouts"):
        replay_filter(t, "v9", recipe)


def test_backtest_analyzer_precision_recall():
    steps = np.arange(50)
    collapsed = (steps, 0.8 * np.exp(-steps / 8) + 0.01)
    stable = (steps, 0.6 + 0.01 * np.sin(steps))
    ev = Evidence(metrics={"v1": {M.POLICY_ENTROPY: collapsed}, "v2": {M.POLICY_ENTROPY: stable},
                           "v3": {M.POLICY_ENTROPY: collapsed}, "v4": {M.POLICY_ENTROPY: stable}},
                  statuses={"v1": "pruned", "v2": "kept", "v3": "kept", "v4": "reverted"})
    bt = backtest_analyzer("entropy_collapse", ev)
    # fires on v1 (bad) and v3 (good); quiet on v2 (good) and v4 (bad)
    assert bt.fired == {"v1": True, "v2": False, "v3": True, "v4": False}
    assert (bt.tp, bt.fp, bt.fn, bt.tn) == (1, 1, 1, 1)
    assert bt.precision == 0.5 and bt.recall == 0.5
    bt2 = backtest_analyzer("entropy_collapse", ev, outcomes={"v1": True, "v2": False})
    assert (bt2.precision, bt2.recall) == (1.0, 1.0)
    with pytest.raises(ValueError, match="no version of known outcome"):
        backtest_analyzer("entropy_collapse", Evidence(metrics={"v1": {M.POLICY_ENTROPY: stable}}))


def test_replay_and_rescore_on_a_version_trained_by_the_local_backend(tmp_path):
    """The real trainer (tiny random model, 2 steps) with a leaky reward and the top-p filter."""
    from evotrainer.rl_backend.backends import get_backend

    r = Recipe()
    for path, value in [("model.name_or_path", "tiny-random"), ("n_samples_per_prompt", 4),
                        ("rollout_batch_size", 4), ("generate_max_len", 8), ("group_filter_top_p", 0.5),
                        ("reward.format_token", {"weight": 1.0, "params": {"token": "ing"}})]:
        r = set_path(r, path, value)
    with Workspace(tmp_path / "run", writer=True) as ws:
        v = ws.lineage.create_root(r)
        get_backend("local").train(ws, v.id, steps=2)
        t = ws.rollouts.to_arrow()
        rep = replay_filter(t, v.id, ws.lineage.get(v.id).recipe, evidence=Evidence.from_workspace(ws))
        logged = [x for _, x in ws.lineage.metric_series(v.id, M.REWARD_KEPT_GROUP_FRAC)]
        res = rescore_rollouts(t, FIXED, generate_max_len=8, task=r.data.task)
    # the replay reproduces, step by step, the kept-group fraction the trainer logged
    assert rep.steps.tolist() == [0, 1]
    assert rep.kept_frac.tolist() == pytest.approx(logged) and rep.summary()["max_abs_diff_vs_logged"] == 0.0
    # stored rewards are what the trainer paid (format_token "ing" + correctness); the fixed reward pays
    # correctness only, so every sample's reward drops by exactly its format_token component
    from evotrainer.harness.backtest import components_of

    paid = components_of(t)
    assert res.old_reward == pytest.approx(paid["format_token"] + paid["correctness"])
    assert res.new_reward == pytest.approx(paid["correctness"])
    assert paid["format_token"].sum() > 0 and res.summary["new_reward_mean"] < res.summary["old_reward_mean"]


def test_backtest_builtin_analyzers_on_the_diagnosis_cases():
    """Each case is a version of known outcome per kind (must: bad, must_not: good)."""
    import json
    from pathlib import Path

    from evotrainer.harness.ingest import ingest

    # the four paraphrased cases; the real ones (with SOURCE.md) include kinds awaiting level analyzers
    cases = sorted(p for p in (Path(__file__).parent / "data" / "cases").glob("*/expected.json")
                   if not (p.parent / "SOURCE.md").exists())
    ev = Evidence()
    labels: dict[str, dict[str, bool]] = {}
    for exp in cases:
        one = ingest(exp.parent)
        v = one.versions[0]
        ev.metrics[v] = one.metrics[v]
        ev.parents[v] = None
        e = json.loads(exp.read_text())
        for kind in e["must"]:
            labels.setdefault(kind, {})[v] = True
        for kind in e["must_not"]:
            labels.setdefault(kind, {})[v] = False
    assert set(labels) == {"reward_hacking", "nan_blowup", "truncation", "zero_variance_groups"}
    for kind, outcomes in labels.items():
        bt = backtest_analyzer(kind, ev, outcomes=outcomes, kinds=(kind,))
        # every kind has at least one bad version, so tp >= 1 and precision is defined
        assert (bt.precision, bt.recall, bt.fp, bt.fn) == (1.0, 1.0, 0, 0), bt.to_dict()
