"""Attribution (issue 16): every round trains one control arm, the parent's recipe continued; an intervention is
kept only if it beats the control on dev; continuing is a decision too; a blocking finding every candidate shares
does not discard every branch's training."""

from __future__ import annotations

import pytest

from evotrainer.agents.runner import run_loop
from evotrainer.config import load_run_config
from evotrainer.harness.gate import gate, round_decisions, verdict_from_gate
from evotrainer.intervention import Intervention
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace


def _evals(ws, vid, k_correct, k=4):
    ws.lineage.log_eval_samples(vid, "heldout", [(f"p{i:02d}", j, float(j < c), "") for i, c in enumerate(k_correct)
                                                 for j in range(k)])


def test_control_arm_is_one_per_parent_and_the_gate_measures_against_it(tmp_path):
    with Workspace(tmp_path / "run", writer=True) as ws:
        root = ws.lineage.create_root(Recipe())
        ctl = ws.lineage.branch_control(root.id)
        assert ws.lineage.branch_control(root.id).id == ctl.id  # find-or-create: one control serves the round
        assert ctl.is_control and ctl.interventions == [] and ctl.recipe == root.recipe
        assert ctl.describe_change() == "continue (control)"
        child = ws.lineage.branch(root.id, Intervention(path="actor_learning_rate", old=1e-6, new=3e-6,
                                                        category="optimizer", hypothesis="t"))
        assert ws.lineage.control_of(child.id).id == ctl.id and ws.lineage.control_of(ctl.id) is None
        _evals(ws, root.id, [1] * 20)  # parent Avg@4 0.25
        _evals(ws, ctl.id, [2] * 20)  # training longer: 0.50
        _evals(ws, child.id, [2, 3] * 10)  # 0.50 / 0.75 alternating: mean 0.625
        g = gate(ws, child.id, n_resamples=2000)
        # vs control: per-problem d = 0 / +0.25 alternating, mean +0.125, CI within [0, 0.25]; vs parent +0.375
        assert g.baseline_id == ctl.id and g.control_id == ctl.id
        assert g.gain == pytest.approx(0.125) and 0.0 < g.ci[0] < 0.125 < g.ci[1] <= 0.25
        assert g.gain_vs_parent == pytest.approx(0.375) and g.ci_vs_parent[0] > 0.3
        assert g.promote and f"vs control {ctl.id}" in g.reason and "vs parent v0 +0.375" in g.reason
        # an intervention as good as the control is not kept, though it is +0.25 over its parent
        same = ws.lineage.branch(root.id, Intervention(path="temperature", old=1.0, new=0.9, category="rollout",
                                                       hypothesis="t"))
        _evals(ws, same.id, [2] * 20)
        g2 = gate(ws, same.id, n_resamples=2000)
        assert g2.gain == pytest.approx(0.0) and g2.gain_vs_parent == pytest.approx(0.25) and not g2.promote
        # the control itself is gated against its parent
        gc = gate(ws, ctl.id, n_resamples=2000)
        assert gc.is_control and gc.baseline_id == root.id and gc.gain == pytest.approx(0.25)


def _g(ci, ci_p=(0.0, 0.1), gain_p=0.05, kinds=(), parent="v0"):
    return {"parent_id": parent, "promote": bool(ci[0] > 0 and not kinds), "gain": sum(ci) / 2, "ci": list(ci),
            "gain_vs_parent": gain_p, "ci_vs_parent": list(ci_p), "reason": "r",
            "blocking": [{"kind": k, "severity": "blocking"} for k in kinds]}


def test_round_rule_beat_the_control_continue_otherwise():
    # a beats the control (CI lower bound 0.02 > 0), b does not (-0.05): keep a, prune b, the control is superseded
    out = round_decisions({"c": _g((-0.1, 0.1)), "a": _g((0.02, 0.2)), "b": _g((-0.05, 0.1))}, "c")
    assert [out[v]["promote"] for v in ("a", "b", "c")] == [True, False, False]
    assert out["c"]["reason"].startswith("superseded: a beat this control")
    # nothing beats the control and it is not worse than its parent (CI [-0.05, 0.1] reaches above 0): continue
    out = round_decisions({"c": _g((-0.05, 0.1), ci_p=(-0.05, 0.1)), "a": _g((-0.2, 0.0))}, "c")
    assert (out["a"]["promote"], out["c"]["promote"]) == (False, True) and out["c"]["reason"].startswith("continue")
    # the control made things worse than the parent (upper bound -0.01 < 0): nothing is kept
    out = round_decisions({"c": _g((-0.3, -0.1), ci_p=(-0.3, -0.01), gain_p=-0.15), "a": _g((-0.2, 0.0))}, "c")
    assert not out["c"]["promote"] and "worse than the parent" in out["c"]["reason"]
    # a blocking finding of the control alone stops it
    out = round_decisions({"c": _g((0.0, 0.1), kinds=("nan_blowup",)), "a": _g((-0.2, 0.0))}, "c")
    assert not out["c"]["promote"] and "nan_blowup" in out["c"]["reason"]


def test_round_rule_waives_a_blocking_finding_every_candidate_shares():
    # truncation on all three (control included): a property of the task / recipe; a beats the control -> kept
    gates = {"c": _g((0.0, 0.1), kinds=("truncation",)), "a": _g((0.03, 0.2), kinds=("truncation",)),
             "b": _g((0.05, 0.3), kinds=("truncation", "reward_hacking"))}
    out = round_decisions(gates, "c")
    assert out["a"]["promote"] and out["a"]["waived"] == ["truncation"] and out["a"]["blocking"] == []
    assert not out["b"]["promote"] and [f["kind"] for f in out["b"]["blocking"]] == ["reward_hacking"]
    assert not out["c"]["promote"] and "every candidate of the round" in out["a"]["reason"]
    # no change beats the control: the control continues despite the shared finding, so training accumulates
    gates["a"], gates["b"] = _g((-0.1, 0.1), kinds=("truncation",)), _g((-0.1, 0.05), kinds=("truncation",))
    out = round_decisions(gates, "c")
    assert out["c"]["promote"] and out["c"]["waived"] == ["truncation"] and not out["a"]["promote"]
    # a leaky reward (or damaged weights) every candidate shares still blocks: no leaky version is ever kept
    leak = {v: _g((0.05, 0.2), kinds=("reward_hacking", "truncation")) for v in ("c", "a")}
    out = round_decisions(leak, "c")
    assert out["a"]["waived"] == ["truncation"] and not out["a"]["promote"] and not out["c"]["promote"]
    # a finding only some candidates have is not waived
    out = round_decisions({"c": _g((0.0, 0.1)), "a": _g((0.1, 0.2), kinds=("truncation",))}, "c")
    assert not out["a"]["promote"] and out["a"]["waived"] == [] and out["c"]["promote"]


def test_round_rule_waives_a_blocking_finding_the_control_inherits_from_its_parent():
    # issue 16's seed 1: the parent v0 was truncated; its control c still is (+0.062 [+0.021, +0.109] over v0), the
    # length fix a is not truncated and loses to c, the other child b is truncated too: the finding is the recipe's
    gates = {"c": _g((0.0, 0.0), ci_p=(0.021, 0.109), gain_p=0.062, kinds=("truncation",)),
             "a": _g((-0.078, 0.026)), "b": _g((-0.05, 0.04), kinds=("truncation",))}
    assert not round_decisions(gates, "c")["c"]["promote"]  # (not every candidate shares it: no waiver)
    out = round_decisions(gates, "c", inherited=["truncation"])
    assert out["c"]["promote"] and out["c"]["waived"] == ["truncation"] and out["c"]["blocking"] == []
    assert "came with the parent's recipe" in out["c"]["reason"] and out["c"]["reason"].startswith("continue")
    assert not out["a"]["promote"] and not out["b"]["promote"]  # neither beats the control
    # a child's gain over the control still counts with the inherited finding waived
    gates["b"] = _g((0.02, 0.2), kinds=("truncation",))
    out = round_decisions(gates, "c", inherited=["truncation"])
    assert out["b"]["promote"] and not out["c"]["promote"]
    # damaged weights are never waived, inherited or not; nor a finding the parent did not have
    gates["c"] = _g((0.0, 0.0), ci_p=(0.021, 0.109), kinds=("entropy_collapse",))
    assert not round_decisions(gates, "c", inherited=["entropy_collapse"])["c"]["promote"]
    gates["c"] = _g((0.0, 0.0), ci_p=(0.021, 0.109), kinds=("truncation",))
    assert not round_decisions(gates, "c", inherited=["length_collapse"])["c"]["promote"]


def test_verdict_from_gate_is_the_gate_rule():
    assert verdict_from_gate("v2", {"promote": True, "parent_id": "v0", "gain": 0.1, "reason": "promote: x"}) == (
        "keep", "keep v2: promote: x")
    assert verdict_from_gate("v0", {"promote": True, "parent_id": None, "gain": None, "reason": "root"})[0] == "keep"
    assert verdict_from_gate("v3", {"promote": False, "reason": "blocked by truncation"})[0] == "prune"


def test_tiny_loop_trains_a_control_each_round_and_records_both_gains(tmp_path):
    cfg = load_run_config("examples/tiny.yaml")
    cfg = cfg.model_copy(update={"budget": cfg.budget.model_copy(update=dict(max_versions=4, steps_per_version=2,
                                                                              branches_per_round=1))})
    summary = run_loop(cfg, tmp_path / "run", "heuristic", "evotrainer", resume=False)
    ws = Workspace.open(tmp_path / "run")
    try:
        vs = ws.lineage.versions()
        controls = [v for v in vs if v.is_control]
        rounds = int(ws.lineage.kv_get("loop/round")) - 1
        # one control per round parent, trained the same steps as its siblings from the same checkpoint
        assert len(controls) == len({c.parent_id for c in controls}) == summary["n_controls"] >= 1
        assert all(ws.lineage.last_step(c.id) == 1 for c in controls)
        for v in vs:
            if v.parent_id is None or v.is_control or "avg@k" not in (v.eval_summary or {}):
                continue
            ev, g = v.eval_summary, ws.lineage.kv_get(f"loop/rgate/{v.id}")
            ctl = ws.lineage.control_of(v.id)
            assert ev["vs_control"]["version"] == ctl.id and ev["vs_parent"]["version"] == v.parent_id
            assert ev["vs_control"]["gain"] == pytest.approx(
                ev["avg@k"] - ctl.eval_summary["avg@k"])  # same dev problems: the paired mean is the Avg@k difference
            # kept only when it beat the control (CI lower bound above 0)
            assert (v.status == "kept") == (g["ci"][0] > 0 and not g["blocking"] and not g.get("below_sources"))
        assert rounds >= 1 and ws.lineage.kv_get("loop/frontier") in {v.id for v in vs}
        # the report shows both gains of every intervention, and the control's change as 'continue'
        from evotrainer.agents.report import gain_text, render_html

        page = render_html(ws)
        assert "gain vs control [95% CI]" in page and "continue (control)" in page
        child = next(v for v in vs if v.interventions and "vs_control" in v.eval_summary)
        assert gain_text(child.eval_summary["vs_control"]) in page and gain_text(child.eval_summary["vs_parent"]) in page
        assert gain_text({"gain": 0.125, "ci": [0.031, 0.219], "version": "v1"}) == "+0.125 [+0.031, +0.219] (v1)"
        assert summary["compute"]["train_tokens"] > 0 and "Compute and test" in page
    finally:
        ws.close()


def test_probe_rung_trains_runners_up_briefly_and_continues_the_best(tmp_path):
    cfg = load_run_config("examples/tiny.yaml")
    cfg = cfg.model_copy(update={"budget": cfg.budget.model_copy(update=dict(
        max_versions=3, steps_per_version=2, branches_per_round=1, probe_steps=1))})
    run_loop(cfg, tmp_path / "run", "heuristic", "evotrainer", resume=False)
    ws = Workspace.open(tmp_path / "run")
    try:
        kept_on = ws.lineage.kv_get("loop/r1/probe")
        pool = [v for v in ws.lineage.children("v0") if not v.is_control and v.id in
                {*kept_on, *(d.version_id for d in ws.lineage.decisions() if "probed out" in d.rationale)}]
        # 1 branch per round: the chosen child and 1 runner-up probe 1 step each (1 dev sample per problem, 8
        # problems); the better goes on to 2 steps, the other is pruned at 1 step
        assert len(kept_on) == 1 and len(pool) == 2
        (go,), (out,) = kept_on, [v.id for v in pool if v.id not in kept_on]
        assert ws.lineage.last_step(go) == 1 and ws.lineage.last_step(out) == 0
        assert len(ws.lineage.eval_matrix(out, "probe")) == 8 and ws.lineage.get(out).status == "pruned"
        assert all(len(x) == 1 for x in ws.lineage.eval_matrix(out, "probe").values())
    finally:
        ws.close()


def test_a_round_starts_no_more_arms_than_the_token_budget_pays_for(tmp_path):
    """A round is sized to the token budget (``LoopBase.affordable_arms``): it used to start with all its arms once
    the budget was not yet spent, so a loop could overshoot by a whole round (three arms) where static overshoots by
    less than one segment."""
    cfg = load_run_config("examples/tiny.yaml")
    b = cfg.budget.model_copy(update=dict(max_versions=20, steps_per_version=2, branches_per_round=2,
                                          wall_clock_minutes=600))
    root_only = cfg.model_copy(update={"budget": b.model_copy(update=dict(max_versions=1))})
    run_loop(root_only, tmp_path / "root", "heuristic", "evotrainer", resume=False)
    with Workspace.open(tmp_path / "root") as ws:
        c = ws.lineage.kv_get("loop/compute")
    root = c["train_tokens"] + c["eval_tokens"]  # one arm costs about this: the same steps and one dev evaluation
    cap = int(2.5 * root)  # after the root 1.5 arms are left: ceil(1.5) = 2 arms, the control and one child
    run_loop(cfg.model_copy(update={"budget": b.model_copy(update=dict(max_tokens=cap))}), tmp_path / "run",
             "heuristic", "evotrainer", resume=False)
    with Workspace.open(tmp_path / "run") as ws:
        lin = ws.lineage
        assert lin.kv_get("loop/r1/arms") == 2
        r1 = [v for v in lin.children("v0")]
        assert len(r1) == 2 and sum(v.is_control for v in r1) == 1  # 2 branches per round asked, 1 paid for
        assert lin.kv_get("loop/r2/arms") in (None, 0) and len(lin.versions()) == 3  # spent: no round 2 starts
        c = lin.kv_get("loop/compute")
        # the second arm started while the budget was not spent (root + one arm = 384 < cap 480); the child
        # doubled generate_max_len (8 -> 16), so it cost twice an arm of the root's recipe: the total overshoots
        assert 2 * root < cap <= c["train_tokens"] + c["eval_tokens"]


def test_the_exploit_phase_continues_the_answer_alone_until_the_token_budget_is_spent(tmp_path):
    """``budget.exploit_fraction``: the rounds stop starting arms at (1 - f) x max_tokens; then the answer so far is
    continued alone (a control arm of it) in segments of steps_per_version until max_tokens is spent, evaluated on
    dev once, and it is the answer when its dev Avg@k is at least its parent's. Before, a run of rounds alone ended
    a few segments deep (docs/compare.md: 24 steps against static's 64-80 at the same tokens)."""
    cfg = load_run_config("examples/tiny.yaml")
    b = cfg.budget.model_copy(update=dict(max_versions=20, steps_per_version=2, branches_per_round=1,
                                          wall_clock_minutes=600))
    run_loop(cfg.model_copy(update={"budget": b.model_copy(update=dict(max_versions=1))}), tmp_path / "root",
             "heuristic", "evotrainer", resume=False)
    with Workspace.open(tmp_path / "root") as ws:
        c = ws.lineage.kv_get("loop/compute")
        seg = ws.lineage.kv_get("loop/compute")["train_tokens"]  # one segment of the root's recipe
    root = c["train_tokens"] + c["eval_tokens"]
    cap = 6 * root  # the rounds may spend 3 root-arms: the root and round 1 (its control and one child)
    run_loop(cfg.model_copy(update={"budget": b.model_copy(update=dict(max_tokens=cap, exploit_fraction=0.5))}),
             tmp_path / "run", "heuristic", "evotrainer", resume=False)
    with Workspace.open(tmp_path / "run") as ws:
        lin = ws.lineage
        parent, arm = lin.kv_get("loop/exploit/parent"), lin.kv_get("loop/exploit/arm")
        assert lin.kv_get("loop/r1/arms") == 2 and lin.kv_get("loop/r2/parent") is None  # no round 2 started
        a = lin.get(arm)
        assert a.is_control and a.parent_id == parent and parent in [v.id for v in lin.children("v0")]
        assert lin.last_step(arm) + 1 > b.steps_per_version and (lin.last_step(arm) + 1) % b.steps_per_version == 0
        c = lin.kv_get("loop/compute")
        spent = c["train_tokens"] + c["eval_tokens"]
        # segments go on until the budget is spent; the last one overshoots it by less than a segment (of the arm's
        # recipe: a child of the root may have doubled its generation length) and the arm's dev evaluation
        dev = lin.kv_get(f"loop/eval/{arm}/heldout")
        assert cap <= spent < cap + 2 * seg + dev["gen_tokens"]
        before = lin.kv_get(f"loop/eval/{parent}/heldout")["avg@k"]
        final = lin.kv_get("loop/final")["version"]
        assert final == (arm if a.status == "kept" and dev["avg@k"] >= before else parent)
    # a resume of the finished run changes nothing
    with Workspace.open(tmp_path / "run") as ws:
        sig = [(v.id, v.status, v.parent_id) for v in ws.lineage.versions()]
    run_loop(cfg.model_copy(update={"budget": b.model_copy(update=dict(max_tokens=cap, exploit_fraction=0.5))}),
             tmp_path / "run", "heuristic", "evotrainer", resume=True)
    with Workspace.open(tmp_path / "run") as ws:
        assert [(v.id, v.status, v.parent_id) for v in ws.lineage.versions()] == sig
    # review 15 X-R15: replayed exploit records were checked for shape only; a crafted arm (the pruned root, no
    # version) or parent (no version) logged a lineage the run does not have. Each is now refused, naming the key.
    import shutil
    import sqlite3

    from evotrainer.lineage import LineageError

    for key, value, why in (("loop/exploit/arm", "v0", "names 'v0', no control arm with parent None"),
                            ("loop/exploit/arm", "v999", "names 'v999', no version of this run"),
                            ("loop/exploit/parent", "v999", "names 'v999', no version of this run")):
        crafted = tmp_path / f"crafted-{key.rsplit('/', 1)[1]}-{value}"
        shutil.copytree(tmp_path / "run", crafted)
        db = sqlite3.connect(crafted / "lineage.db")
        db.execute("DELETE FROM kv WHERE key IN ('loop/exploit/done', 'loop/answer', 'loop/final_test', "
                   "'loop/finished')")
        db.execute("UPDATE kv SET value = ? WHERE key = ?", (f'"{value}"', key))
        db.commit()
        db.close()
        with pytest.raises(LineageError, match=f"kv.value of key '{key}' {why}"):
            run_loop(cfg.model_copy(update={"budget": b.model_copy(update=dict(max_tokens=cap, exploit_fraction=0.5))}),
                     crafted, "heuristic", "evotrainer", resume=True)


def test_the_checked_exploit_cuts_the_step_size_at_a_plateau_and_replays_on_resume(tmp_path):
    """``budget.exploit_check_k``: the exploit arm is scored on dev (k samples per problem) after each segment but
    the last; a segment not above the best score so far ends the arm (evaluated, decided) and the exploit goes on
    from it as a child with actor_learning_rate / 3. docs/compare.md §8: seed 2's exploit arm trained 40 steps at a
    learning rate that had stopped paying. The tiny model scores 0 on dev, so every check is a plateau: the chain
    is control -> lr/3 -> lr/9 ... until the budget is spent; a resume of the finished run changes nothing."""
    cfg = load_run_config("examples/tiny.yaml")
    b = cfg.budget.model_copy(update=dict(max_versions=1, steps_per_version=2, branches_per_round=1,
                                          wall_clock_minutes=600))
    run_loop(cfg.model_copy(update={"budget": b}), tmp_path / "root", "heuristic", "evotrainer", resume=False)
    with Workspace.open(tmp_path / "root") as ws:
        c = ws.lineage.kv_get("loop/compute")
    root = c["train_tokens"] + c["eval_tokens"]
    run_cfg = cfg.model_copy(update={"budget": b.model_copy(update=dict(
        max_tokens=5 * root, exploit_fraction=0.6, exploit_check_k=1))})
    run_loop(run_cfg, tmp_path / "run", "heuristic", "evotrainer", resume=False)
    with Workspace.open(tmp_path / "run") as ws:
        lin = ws.lineage
        parent, first = lin.kv_get("loop/exploit/parent"), lin.kv_get("loop/exploit/arm")
        assert parent == "v0" and lin.get(first).is_control and lin.get(first).parent_id == "v0"
        chain, n = [first], 1
        while (nxt := lin.kv_get(f"loop/exploit/cut{n}")) is not None:
            chain.append(nxt)
            n += 1
        assert len(chain) >= 2, chain  # at least one plateau cut within 3 root-arms of exploit budget
        lr0 = lin.get("v0").recipe.actor_learning_rate
        for i, (a, child) in enumerate(zip(chain, chain[1:], strict=False)):
            v = lin.get(child)
            assert v.parent_id == a and len(v.interventions) == 1
            assert v.interventions[0].path == "actor_learning_rate"
            assert v.interventions[0].new == pytest.approx(lr0 / 3 ** (i + 1), rel=1e-3)
            assert lin.kv_get(f"loop/exploit/plateau/{a}") is True  # the arm stopped at a check
            checks = [k for k, _ in lin.kv_items(f"loop/eval/{a}/exploit-")]
            assert checks == [f"loop/eval/{a}/exploit-{b.steps_per_version}"]  # one segment, then the plateau
            assert lin.get(a).status in ("kept", "pruned")  # decided before the exploit went on
        assert lin.get(chain[-1]).status in ("kept", "pruned", "failed")
        c = lin.kv_get("loop/compute")
        assert c["train_tokens"] + c["eval_tokens"] >= 5 * root  # the budget was spent
        sig = [(v.id, v.status, v.parent_id) for v in lin.versions()]
        final = lin.kv_get("loop/final")["version"]
    run_loop(run_cfg, tmp_path / "run", "heuristic", "evotrainer", resume=True)
    with Workspace.open(tmp_path / "run") as ws:
        assert [(v.id, v.status, v.parent_id) for v in ws.lineage.versions()] == sig
        assert ws.lineage.kv_get("loop/final")["version"] == final
