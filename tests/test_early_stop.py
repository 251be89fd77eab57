"""The mid-training early stop: the trainer's after_step hook, start_training's early_stop check, and the loop
pruning a branch a registered synthesised analyzer stopped (tiny random model, real MCP tools, real stores)."""

from __future__ import annotations

import os

from evotrainer import metrics as M
from evotrainer.agents import evolution as E
from evotrainer.agents.heuristic import HeuristicBrain
from evotrainer.agents.loop import train_tokens
from evotrainer.agents.mcp_client import ToolBox
from evotrainer.agents.orchestrator import Orchestrator
from evotrainer.agents.report import render_html
from evotrainer.config import RunConfig
from evotrainer.harness import synthesis as S
from evotrainer.intervention import Intervention
from evotrainer.recipe import validate_recipe
from evotrainer.rl_backend.local import LocalBackend
from evotrainer.servers.app import build_server
from evotrainer.workspace import Workspace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {"model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 4, "rollout_batch_size": 2,
        "generate_max_len": 4, "init_kl_coef": 0.0, "actor_learning_rate": 1e-3, "micro_train_batch_size": 8,
        "eval": {"k": 2, "max_problems": 2}, "data": {"task": "arithmetic", "level": 1, "n_train": 32,
                                                      "n_heldout": 4, "n_test": 0}}
# fires on any version with a logged step (a completion has >= 1 token); the hook asks it once, after 4 of 8 steps
ALWAYS = S.Program(series=M.COMPLETIONS_MEAN_LENGTH, stat="level", window=0.5, direction="above", threshold=0.0)


def test_after_step_hook_stops_training_at_the_step_it_returns_a_record(tmp_path):
    ws = Workspace(tmp_path / "run", writer=True)
    vid = ws.lineage.create_root(validate_recipe(TINY)).id
    calls: list[int] = []

    def after_step(done: int):
        calls.append(done)
        return {"stop": True, "reason": "test"} if done == 3 else None

    res = LocalBackend(checkpoint_every=100, num_threads=1).train(ws, vid, 6, after_step=after_step)
    assert calls == [1, 2, 3]
    assert res.steps_done == 3 and res.stopped_early and res.early_stop == {"stop": True, "reason": "test"}
    assert ws.lineage.last_step(vid) == 2  # steps 0, 1, 2 logged; 3..5 never ran
    v = ws.lineage.get(vid)
    assert v.status == "trained" and v.metrics_summary["steps"] == 3 and os.path.isdir(v.checkpoint)
    ws.close()


def _run(tmp_path, early_stop: bool):
    """A trained tiny root v0, a branch v1 and a control v2 of it; ALWAYS registered and in scope with 8 right
    leave-one-out fires (Wilson 95% lower bound 8 / (8 + 1.96^2) = 0.676 >= 0.5: trusted)."""
    ws = Workspace(tmp_path / "run")
    ws.lineage.create_root(validate_recipe(TINY))
    ws.lineage.branch("v0", Intervention(path="temperature", old=1.0, new=1.1, category="rollout"))
    ws.close()
    tb = ToolBox(build_server("all", str(tmp_path / "run")))
    ws = Workspace.open(tmp_path / "run")
    cfg = RunConfig(early_stop=early_stop, recipe=validate_recipe(TINY),
                    budget={"steps_per_version": 8, "max_versions": 3, "branches_per_round": 1})
    orch = Orchestrator(cfg, tb, ws, HeuristicBrain())
    return tb, ws, orch


def test_a_registered_analyzer_stops_a_branch_at_half_its_steps_and_the_loop_prunes_it(tmp_path):
    tb, ws, orch = _run(tmp_path, early_stop=True)
    with tb:
        assert orch.train("v0", 8)  # the root is never checked (nothing to compare with)
        assert ws.lineage.last_step("v0") == 7
        control = orch._control("v0", 1)
        tb.call("register_analyzer", {"name": ALWAYS.name, "code": S.compile_program(ALWAYS),
                                      "kind": ALWAYS.kind, "description": "test rule"})
        ws.lineage.kv_set(E.SCOPE_KEY, {ALWAYS.name: {"skill_id": None, "program": ALWAYS.to_dict(),
                                                      "loo": {"tp": 8, "fp": 0}, "origin": "test"}})
        assert E.stop_plan(orch, control, 8) == {}  # the control arm is the round's reference: never stopped
        plan = E.stop_plan(orch, "v1", 8)["early_stop"]
        assert plan["at_step"] == 4 and [a["name"] for a in plan["analyzers"]] == [ALWAYS.name]
        assert not orch.train_and_evaluate("v1")
        tokens = train_tokens(ws.lineage, "v1")
    assert ws.lineage.last_step("v1") == 3  # 4 of 8 steps trained
    v1 = ws.lineage.get("v1")
    assert v1.status == "pruned" and not (v1.eval_summary or {}).get("avg@k")  # no dev evaluation
    assert ws.lineage.kv_get("loop/eval/v1/heldout") is None
    rationale = ws.lineage.decisions("v1")[-1].rationale
    assert f"stopped early after 4 of 8 steps by analyzer {ALWAYS.name}" in rationale
    check = ws.lineage.kv_get("early_stop/v1")
    assert check["stop"] and check["analyzer"] == ALWAYS.name and check["saved_steps"] == 4
    assert round(check["precision_lower"], 4) == round(8 / (8 + 1.96 ** 2), 4)
    stops = ws.lineage.kv_get(E.STOPS_KEY)
    assert stops["v1"]["saved_steps"] == 4 and stops["v1"]["saved_tokens"] == round(tokens / 4 * 4)
    summary = orch.summary()
    assert summary["early_stops"]["v1"]["analyzer"] == ALWAYS.name
    assert summary["compute"]["saved_steps"] == 4 and summary["compute"]["saved_tokens"] == stops["v1"]["saved_tokens"]
    # the stopped branch is no label (its outcome is unknown), and the round's entries and report name the analyzer
    with ToolBox(build_server("all", str(ws.root))) as tb2:
        orch.tb = tb2
        out = E.evolve_round(orch, 1, ["v1"])
    assert [e["version"] for e in out if e["type"] == "stopped"] == ["v1"]
    assert not [e for e in out if e["type"] == "use"]  # no outcome scored on it
    ws.lineage.kv_set("loop/r1/evolve", out)
    html = render_html(ws)
    assert "Branches stopped mid-training by an analyzer" in html and f"stopped by <code>{ALWAYS.name}" in html
    ws.close()


def test_switch_off_or_untrusted_record_plans_no_check(tmp_path):
    tb, ws, orch = _run(tmp_path, early_stop=False)
    with tb:
        ws.lineage.kv_set(E.SCOPE_KEY, {ALWAYS.name: {"skill_id": None, "program": ALWAYS.to_dict(),
                                                      "loo": {"tp": 8, "fp": 0}, "origin": "test"}})
        assert E.stop_plan(orch, "v1", 8) == {}  # config early_stop off (the default)
        orch.config = orch.config.model_copy(update={"early_stop": True})
        assert E.stop_plan(orch, "v1", 8)["early_stop"]["at_step"] == 4
        assert E.stop_plan(orch, "v1", 4) == {}  # a probe's shorter training is not the version's budget
        # 3 right, 1 wrong: Wilson lower bound of 3/4 = 0.30 < 0.5, not trusted
        ws.lineage.kv_set(E.SCOPE_KEY, {ALWAYS.name: {"skill_id": None, "program": ALWAYS.to_dict(),
                                                      "loo": {"tp": 3, "fp": 1}, "origin": "test"}})
        assert round(E.precision_lower({"loo": {"tp": 3, "fp": 1}}, "math"), 2) == 0.30
        assert E.stop_plan(orch, "v1", 8) == {}
    ws.close()


def test_in_scope_analyzers_are_scored_on_the_control_and_a_blocked_root_once(tmp_path):
    from evotrainer.recipe import Recipe

    ws = Workspace(tmp_path / "run")
    lin = ws.lineage
    lin.create_root(Recipe())
    fix = lin.branch("v0", Intervention(path="generate_max_len", old=64, new=128, category="rollout"))
    control = lin.branch_control("v0")
    for vid, clipped in (("v0", 1.0), (fix.id, 0.1), (control.id, 0.95)):
        for step in range(8):
            lin.log_metrics(vid, step, {M.COMPLETIONS_CLIPPED_RATIO: clipped})
    lin.decide("v0", "prune", "blocked: truncation")
    lin.decide(fix.id, "keep", "beat the control")
    lin.decide(control.id, "prune", "superseded")
    prog = S.Program(series=M.COMPLETIONS_CLIPPED_RATIO, stat="level", window=0.25, direction="above", threshold=0.9)
    lin.kv_set(E.SCOPE_KEY, {prog.name: {"skill_id": None, "program": prog.to_dict(), "loo": {"tp": 4, "fp": 1},
                                         "origin": "test"}})
    ws.close()
    tb = ToolBox(build_server("all", str(tmp_path / "run")))
    ws = Workspace.open(tmp_path / "run")
    orch = Orchestrator(RunConfig(), tb, ws, HeuristicBrain())
    with tb:
        out = E.evolve_round(orch, 1, [fix.id])
        again = E.evolve_round(orch, 2, [])  # round 2 decided nothing new: nothing scored again
        rerun = E.evolve_round(orch, 1, [fix.id])  # a resumed round 1 scores the same versions
    uses = sorted((e["version"], e["fired"], e["correct"]) for e in out if e["type"] == "use")
    # the blocked root (clipped 1.0) and the superseded control (0.95) fire and are bad; the fix (0.1) is quiet
    assert uses == [("v0", True, True), (fix.id, False, True), (control.id, True, True)]
    # the early-stop counterfactual is for branches only (the hook never stops the root or a control)
    assert [e["version"] for e in out if e["type"] == "early_stop"] == []
    assert not [e for e in again if e["type"] == "use"]
    assert sorted((e["version"], e["fired"]) for e in rerun if e["type"] == "use") == [
        ("v0", True), (fix.id, False), (control.id, True)]
    ws.close()
