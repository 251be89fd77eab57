"""The sequential gate (recipe ``eval.max_k``): a dev evaluation draws ``eval.k`` samples per problem, and only a
round comparison left undecided on them draws more, for the change and its control (tiny random model, real MCP
tools, real stores)."""

from __future__ import annotations

import os

import pytest

from evotrainer.agents.heuristic import HeuristicBrain
from evotrainer.agents.mcp_client import ToolBox
from evotrainer.agents.orchestrator import Orchestrator
from evotrainer.config import RunConfig
from evotrainer.intervention import Intervention
from evotrainer.recipe import EvalSpec, validate_recipe
from evotrainer.rl_backend.base import BackendError
from evotrainer.rl_backend.local import TOPUP_SEED_STRIDE, LocalBackend, topup_seed
from evotrainer.servers.app import build_server
from evotrainer.workspace import Workspace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {"model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 2, "rollout_batch_size": 2,
        "generate_max_len": 4, "init_kl_coef": 0.0, "actor_learning_rate": 1e-3, "micro_train_batch_size": 4,
        "eval": {"k": 1, "max_k": 2, "max_problems": 8}, "data": {"task": "arithmetic", "level": 1, "n_train": 16,
                                                                  "n_heldout": 8, "n_test": 0}}


def test_max_k_below_k_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"eval.max_k=1 is below eval.k=2.*at least 2, or null"):
        EvalSpec(k=2, max_k=1)
    assert EvalSpec(k=1, max_k=2).max_k == 2 and EvalSpec().max_k is None


def test_topup_seed_is_the_first_pass_seed_at_0_and_a_stream_of_its_own_after():
    assert topup_seed(42 * 7919 + 8, 0) == 332_606  # the first pass: unchanged
    assert topup_seed(42 * 7919 + 8, 1) == 332_606 + 1_000_003 == 332_606 + TOPUP_SEED_STRIDE
    assert topup_seed(0, 2) == 2_000_006


def test_a_top_up_appends_samples_and_the_summary_scores_all(tmp_path):
    ws = Workspace(tmp_path / "run", writer=True)
    vid = ws.lineage.create_root(validate_recipe(TINY)).id
    be = LocalBackend(num_threads=1)
    first = be.evaluate(ws, vid, eval_name="heldout")
    assert first.k == 1 and first.n_problems == 8
    before = ws.lineage.eval_samples(vid)
    assert [i for _p, i, _c, _t in before] == [0] * 8
    res = be.evaluate(ws, vid, k=1, eval_name="heldout", first_sample=1)
    m = ws.lineage.eval_matrix(vid)
    assert len(m) == 8 and all(len(xs) == 2 for xs in m.values())
    assert [s for s in ws.lineage.eval_samples(vid) if s[1] == 0] == before  # the first pass is kept as it was
    mean = sum(sum(xs) / 2 for xs in m.values()) / 8
    assert res.k == 2 and res.avg_at_k == pytest.approx(mean)
    assert res.pass_at_k == pytest.approx(sum(max(xs) for xs in m.values()) / 8)
    assert 0 < res.gen_tokens <= 8 * 4  # the top-up's own tokens: 8 problems x 1 sample x at most 4
    summary = ws.lineage.get(vid).eval_summary
    assert summary["k"] == 2 and summary["avg@k"] == pytest.approx(mean)
    assert summary["by_name"]["heldout"]["k"] == 2
    # a top-up a crash cut short is drawn again from the same index: replaced, never duplicated
    again = be.evaluate(ws, vid, k=1, eval_name="heldout", first_sample=1)
    assert all(len(xs) == 2 for xs in ws.lineage.eval_matrix(vid).values())
    assert again.avg_at_k == pytest.approx(res.avg_at_k)  # the same seeds: the same samples
    with pytest.raises(BackendError, match=r"fewer than 3 samples of problem .*evaluate it first"):
        be.evaluate(ws, vid, k=1, eval_name="heldout", first_sample=3)
    with pytest.raises(BackendError, match=r"holds no samples"):
        be.evaluate(ws, vid, k=1, eval_name="other", first_sample=1)
    with pytest.raises(BackendError, match=r"sealed test split.*never topped up"):
        be.evaluate(ws, vid, k=1, eval_name="test", first_sample=1)
    ws.close()


def _log(ws, vid, outcomes):
    """Hand-made first-pass outcomes (k = 1 on the 8 dev problems) and the evaluate stage's record of them."""
    probs = sorted(ws.lineage.eval_matrix("v0"))
    ws.lineage.log_eval_samples(vid, "heldout", [(p, 0, float(c), "") for p, c in zip(probs, outcomes, strict=True)])
    avg = sum(outcomes) / len(outcomes)
    ws.lineage.update_version(vid, eval_summary={"k": 1, "avg@k": avg, "eval_name": "heldout", "n_problems": 8})
    ws.lineage.kv_set(f"loop/eval/{vid}/heldout", {"k": 1, "avg@k": avg, "pass@k": avg, "pass@1": avg,
                                                   "n_problems": 8, "eval_name": "heldout", "gen_tokens": 20})
    toks = dict(ws.lineage.kv_get("loop/eval_tokens") or {})
    ws.lineage.kv_set("loop/eval_tokens", {**toks, f"eval/{vid}/heldout": 20})


@pytest.fixture()
def round_of_three(tmp_path):
    """A trained tiny root v0 with its 8 dev problems evaluated, two changes v1, v2 and the control v3."""
    ws = Workspace(tmp_path / "run")
    ws.lineage.create_root(validate_recipe(TINY))
    for new in (1.1, 1.2):
        ws.lineage.branch("v0", Intervention(path="temperature", old=1.0, new=new, category="rollout"))
    ws.close()
    tb = ToolBox(build_server("all", str(tmp_path / "run")))
    ws = Workspace.open(tmp_path / "run")
    cfg = RunConfig(recipe=validate_recipe(TINY), budget={"steps_per_version": 1, "max_versions": 6})
    orch = Orchestrator(cfg, tb, ws, HeuristicBrain())
    with tb:
        assert orch.train("v0", 1)
        orch.evaluate("v0")
        control = orch._control("v0", 1)
        yield orch, ws, control
    ws.close()


def test_only_an_undecided_comparison_draws_more_and_the_control_is_drawn_once(round_of_three):
    orch, ws, control = round_of_three
    _log(ws, control, [0] * 8)
    _log(ws, "v1", [1, 1, 0, 0, 0, 0, 0, 0])  # +0.250 over the control; the resampled count of 1s is Binomial(8,
    # 1/4): P(0) = (3/4)^8 = 10% > 2.5%, so the 95% CI's lower bound is 0 (undecided), and P(>= 5) = 2.7%, P(>= 6)
    # = 0.4%, so its upper bound is 5/8
    _log(ws, "v2", [0] * 8)  # gain 0: decided (a futility stop), never topped up
    orch._sequential_gate(control, ["v1", "v2"])
    assert orch._dev_k("v1") == 2 and orch._dev_k(control) == 2 and orch._dev_k("v2") == 1
    assert all(len(xs) == 2 for xs in ws.lineage.eval_matrix("v1").values())
    assert all(len(xs) == 1 for xs in ws.lineage.eval_matrix("v2").values())
    toks = ws.lineage.kv_get("loop/eval_tokens")
    assert {"eval/v1/heldout+1", f"eval/{control}/heldout+1"} <= set(toks) and "eval/v2/heldout+1" not in toks
    # the top-ups are dev-eval compute; the evaluation's record now scores both samples of each problem
    assert orch.compute()["eval_tokens"] == sum(n for k, n in toks.items() if not k.endswith("/no_rl"))
    rec = ws.lineage.kv_get("loop/eval/v1/heldout")
    m = ws.lineage.eval_matrix("v1")
    assert rec["k"] == 2 and rec["gen_tokens"] == 20
    assert rec["avg@k"] == pytest.approx(sum(sum(xs) / 2 for xs in m.values()) / 8)
    logs = [r["message"] for r in ws.read_logs() if "sequential gate" in str(r.get("message", ""))]
    assert logs == [f"sequential gate: v1 against its control {control} +0.250 [+0.000, +0.625] on 1 sample(s) per "
                    "problem: undecided; both drawn to 2"]
    # the arm estimate of the token budget counts the top-ups with their evaluation: 4 heldout evaluations (v0-v3),
    # not 6 (the two top-ups as evaluations of their own would make an arm look cheaper than it is)
    c = orch.compute()
    dev = sum(n for k, n in toks.items() if not k.endswith("/no_rl"))
    arm = 1 * c["train_tokens"] / 1 + dev / 4  # steps_per_version x train tokens per step + dev tokens per arm
    spent = c["train_tokens"] + c["eval_tokens"]
    assert orch.affordable_arms(spent + int(9.5 * arm)) == 10 and orch.affordable_arms(spent + int(8.5 * arm)) == 9
    # at max_k nothing more is drawn, and a second call (a resumed round) draws nothing again
    orch._sequential_gate(control, ["v1", "v2"])
    assert orch._dev_k("v1") == 2 and len(ws.lineage.kv_get("loop/eval_tokens")) == len(toks)


def test_a_clear_gain_is_decided_on_the_first_pass(round_of_three):
    orch, ws, control = round_of_three
    _log(ws, control, [0] * 8)
    _log(ws, "v1", [1] * 8)  # +1.000 [+1.000, +1.000]
    orch._sequential_gate(control, ["v1"])
    assert orch._dev_k("v1") == 1 and orch._dev_k(control) == 1
