"""The local GRPO backend end to end (rl_backend/local.py, rl_backend/cli.py) on real parts.

tiny-random runs the whole product path (sampling, rewards, filters, update, stores) in seconds;
the ``smoke`` test runs SmolLM2-135M-Instruct on 1-digit addition for one GRPO step.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import yaml

from evotrainer import metrics as M
from evotrainer.estimators import pass_at_k
from evotrainer.intervention import Intervention
from evotrainer.recipe import validate_recipe
from evotrainer.rl_backend.backends import get_backend
from evotrainer.rl_backend.base import BackendError
from evotrainer.rl_backend.local import LocalBackend
from evotrainer.workspace import Workspace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {"model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 8, "rollout_batch_size": 4,
        "generate_max_len": 6, "init_kl_coef": 0.0, "actor_learning_rate": 5e-3, "micro_train_batch_size": 32,
        "eval": {"k": 4, "max_problems": 3}}


def _run(tmp_path, name, **overrides):
    ws = Workspace(tmp_path / name, writer=True)
    v = ws.lineage.create_root(validate_recipe({**TINY, **overrides}))
    return ws, v.id


def test_pass_at_k_hand_values():
    # 1 - C(n-c, k) / C(n, k): n=4, c=1, k=2 → 1 - 3/6 = 0.5 ; c=0 → 0 ; n-c < k → 1
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 = c / n
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)


def test_grpo_learns_a_token_reward_and_not_with_the_sign_flipped(tmp_path):
    # format_token pays 1 when the literal token occurs. ' slice' is the tiny model's most frequent
    # token on 1-digit sums (~12% of completions at step 0; on level 1's 0..19 operands the most frequent
    # word is rarer, ~6%, too rare to learn in 10 steps of 4 prompts). weight -1 flips every advantage's sign.
    one_digit = tmp_path / "one_digit.jsonl"
    one_digit.write_text("".join(json.dumps({"id": f"arith-L1-{a}+{b}", "prompt": f"What is {a} + {b}?",
                                             "answer": str(a + b)}) + "\n" for a in range(10) for b in range(10)))
    data = {"task": "jsonl", "path": str(one_digit), "n_train": 80, "n_heldout": 20}
    series = {}
    for w in (1.0, -1.0):
        ws, vid = _run(tmp_path, f"w{w}", data=data,
                       reward={"format_token": {"weight": w, "params": {"token": "slice"}}})
        LocalBackend(checkpoint_every=100, num_threads=1).train(ws, vid, 10)
        series[w] = [x for _, x in ws.lineage.metric_series(vid, M.reward_component("format_token"))]
        # every kept group had reward variance (zero-variance groups are dropped)
        kept = ws.rollouts.sql(f"SELECT step, group_id, stddev_pop(reward) AS sd FROM rollouts WHERE version_id='{vid}'"
                               " AND kept GROUP BY step, group_id")
        assert kept and all(r["sd"] > 0 for r in kept)
        ws.close()
    up, down = series[1.0], series[-1.0]
    assert len(up) == len(down) == 10
    assert sum(up[-4:]) / 4 > 0.5, up  # learned: the token appears in most completions
    assert sum(down[-4:]) / 4 < 0.1, down  # flipped: it is avoided
    assert sum(up[-4:]) / 4 > sum(up[:2]) / 2 + 0.3


def test_resume_after_crash_keeps_one_copy_of_each_step(tmp_path):
    ws, vid = _run(tmp_path, "crash", rollout_batch_size=2, n_samples_per_prompt=4, generate_max_len=4,
                   drop_zero_variance_groups=False, reward={"format_token": {"weight": 1.0, "params": {"token": "e"}}})
    be = LocalBackend(checkpoint_every=2, num_threads=1)

    def crash(p):
        if p["step"] == 3:  # step index 2 is logged but only step 1 has a resume checkpoint
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        be.train(ws, vid, 4, progress=crash)
    assert ws.lineage.get(vid).status == "failed" and ws.lineage.last_step(vid) == 2
    res = be.train(ws, vid, 4)
    assert res.resumed_from_step == 1 and res.steps_done == 4
    v = ws.lineage.get(vid)
    assert v.status == "trained" and os.path.isdir(v.checkpoint)
    assert not (ws.root / "checkpoints" / f"{vid}.resume").exists()
    # 4 steps x 2 prompts x 4 samples, step 2 once only (the crashed copy was dropped)
    rows = ws.rollouts.sql(f"SELECT step, count(*) AS n FROM rollouts WHERE version_id='{vid}' AND split='train' "
                           "GROUP BY step ORDER BY step")
    assert [(r["step"], r["n"]) for r in rows] == [(0, 8), (1, 8), (2, 8), (3, 8)]
    assert [s for s, _ in ws.lineage.metric_series(vid, M.LOSS_TOTAL)] == [0, 1, 2, 3]
    logged = set(ws.lineage.metric_names(vid))
    assert {n for n in M.ALL_STEP_METRICS if not n.startswith("tools/")} <= logged  # single-turn: no tool metrics
    assert {M.reward_component("format_token"), M.reward_component("format_token", "std")} <= logged
    assert (ws.root / "tb" / vid).is_dir() and any((ws.root / "tb" / vid).iterdir())
    assert v.metrics_summary["steps"] == 4 and len(v.metrics_summary["data_split"]) == 64
    ws.close()


def test_step_with_no_kept_group_still_measures_entropy_and_kl(tmp_path):
    # correctness only: the tiny random model never answers, so every group is all-zero and the
    # zero-variance filter drops all of them: no update. Entropy must still be logged every step,
    # and at step 0 (same weights, same rollouts, same seed) equal what the update path measures
    # when the filter is off (its epoch-0 forward; advantages are all 0, so nothing moves).
    base = dict(rollout_batch_size=2, n_samples_per_prompt=4, generate_max_len=4, init_kl_coef=0.05,
                reward={"correctness": {"weight": 1.0}})
    ws, vid = _run(tmp_path, "filtered", drop_zero_variance_groups=True, **base)
    LocalBackend(checkpoint_every=100, num_threads=1).train(ws, vid, 3)
    assert [x for _, x in ws.lineage.metric_series(vid, M.REWARD_KEPT_GROUP_FRAC)] == [0.0, 0.0, 0.0]
    ent = ws.lineage.metric_series(vid, M.POLICY_ENTROPY)
    kl = ws.lineage.metric_series(vid, M.POLICY_KL)
    assert [s for s, _ in ent] == [0, 1, 2] and all(x > 0.1 for _, x in ent)  # ~log(vocab) for random weights
    assert [x for _, x in kl] == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)  # no update: policy == reference
    assert M.POLICY_ADVANTAGE_MEAN not in ws.lineage.metric_names(vid)  # no update, no advantages
    ws.close()
    ws2, vid2 = _run(tmp_path, "unfiltered", drop_zero_variance_groups=False, **base)
    LocalBackend(checkpoint_every=100, num_threads=1).train(ws2, vid2, 1)
    assert ws2.lineage.metric_series(vid2, M.REWARD_KEPT_GROUP_FRAC) == [(0, 1.0)]
    (_, updated), = ws2.lineage.metric_series(vid2, M.POLICY_ENTROPY)
    assert ent[0][1] == pytest.approx(updated, rel=1e-5)
    ws2.close()


def test_child_of_a_collapsed_version_trains_from_the_base_model(tmp_path):
    ws, vid = _run(tmp_path, "collapsed", rollout_batch_size=2, n_samples_per_prompt=4, generate_max_len=4)
    be = LocalBackend(checkpoint_every=100, num_threads=1)
    be.train(ws, vid, 1)
    ws.lineage.decide(vid, "prune", "truncation only", evidence=[f"finding:truncation:{vid}"])
    a = ws.lineage.branch(vid, Intervention(path="temperature", old=1.0, new=0.9, category="rollout"))
    assert be._parent_checkpoint(ws, ws.lineage.get(a.id)) == ws.lineage.get(vid).checkpoint
    ws.lineage.decide(vid, "prune", "entropy collapsed", evidence=[f"finding:entropy_collapse:{vid}"],
                      damaged_weights="entropy_collapse")
    assert be._parent_checkpoint(ws, ws.lineage.get(a.id)) is None  # the base model
    be.train(ws, a.id, 1)
    assert any(r["message"] == f"{a.id} starts from the base model: parent {vid} was pruned for entropy_collapse, "
               "its weights are no start point" for r in ws.read_logs())
    ws.close()


def test_evaluate_child_from_parent_checkpoint_lora_kl_and_epochs(tmp_path):
    ws, vid = _run(tmp_path, "lineage", rollout_batch_size=2, n_samples_per_prompt=4, generate_max_len=4,
                   init_kl_coef=0.05, max_epochs=2, model={"name_or_path": "tiny-random", "lora": {"enabled": True, "r": 4}},
                   drop_zero_variance_groups=False, reward={"format_token": {"weight": 1.0, "params": {"token": "s"}}})
    be = get_backend("local", num_threads=1)
    child = ws.lineage.branch(vid, Intervention(path="temperature", old=1.0, new=0.9, category="rollout"))
    with pytest.raises(BackendError, match=f"train {vid} first"):
        be.train(ws, child.id, 1)
    # an untrained root evaluates the base model
    res = be.evaluate(ws, vid, k=4)
    assert res.n_problems == 3 and res.k == 4
    matrix = ws.lineage.eval_matrix(vid)
    assert len(matrix) == 3 and all(len(x) == 4 for x in matrix.values())
    assert res.avg_at_k == pytest.approx(sum(sum(x) for x in matrix.values()) / 12)
    assert ws.lineage.get(vid).eval_summary["avg@k"] == res.avg_at_k
    assert ws.rollouts.count("split = 'eval'") == 12
    be.train(ws, vid, 1)
    m = {k: s[-1][1] for k, s in ws.lineage.all_metrics(vid).items()}
    # two PPO epochs: the second sees ratios != 1; KL to the adapter-free base is >= 0 (k3)
    assert math.isfinite(m[M.LOSS_TOTAL]) and m[M.POLICY_KL] >= 0 and m[M.POLICY_GRAD_NORM] > 0
    assert 0 <= m[M.POLICY_CLIP_RATIO_LOW] <= 1 and 0 <= m[M.POLICY_CLIP_RATIO_HIGH] <= 1
    assert os.path.exists(os.path.join(ws.lineage.get(vid).checkpoint, "adapter_model.safetensors"))
    res = be.train(ws, child.id, 1)  # starts from v0's adapter
    assert res.steps_done == 1 and ws.lineage.get(child.id).status == "trained"
    ws.close()


def test_cli_train_and_eval(tmp_path):
    from typer.testing import CliRunner

    from evotrainer.cli import app

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, "rollout_batch_size": 2, "n_samples_per_prompt": 2,
                                      "generate_max_len": 3}))
    run = tmp_path / "run"
    runner = CliRunner()
    r = runner.invoke(app, ["train", str(recipe), "--run", str(run), "--steps", "1", "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["version_id"] == "v0" and out["steps_done"] == 1 and os.path.isdir(out["checkpoint"])
    r = runner.invoke(app, ["eval", "v0", "--run", str(run), "--k", "2", "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    ev = json.loads(r.output)
    assert ev["k"] == 2 and ev["n_problems"] == 3 and 0 <= ev["avg_at_k"] <= ev["pass_at_k"] <= 1
    r = runner.invoke(app, ["eval", str(tmp_path / "nope")])
    assert r.exit_code == 1


@pytest.mark.smoke
def test_smollm2_one_grpo_step_on_addition(tmp_path):
    ws = Workspace(tmp_path / "smoke", writer=True)
    v = ws.lineage.create_root(validate_recipe({
        "rollout_batch_size": 2, "n_samples_per_prompt": 4, "generate_max_len": 12, "actor_learning_rate": 1e-5,
        "drop_zero_variance_groups": False, "data": {"level": 1},
        # 12 tokens rarely finish an answer (correctness is 0 for every sample of this seed, all 12 tokens long): the
        # repeated-word rate gives the groups reward variance, so the gradient is real, not the rounding noise of
        # KL(π ‖ π_ref) with π_ref = π
        "reward": {"correctness": {"weight": 1.0}, "repetition": {"weight": 0.1, "params": {"n": 1}}}}))
    be = LocalBackend(checkpoint_every=100)
    from evotrainer.rl_backend.models import load_base_model

    before = load_base_model("smollm2-135m-instruct").model.layers[0].self_attn.q_proj.weight.clone()
    res = be.train(ws, v.id, 1)
    assert res.steps_done == 1
    m = {k: s[-1][1] for k, s in ws.lineage.all_metrics(v.id).items()}
    assert math.isfinite(m[M.LOSS_TOTAL]) and m[M.POLICY_GRAD_NORM] > 0
    assert -0.1 <= m[M.REWARD_MEAN] <= 1 and m[M.COMPLETIONS_MEAN_LENGTH] > 0  # correctness - 0.1 x repeated rate
    assert ws.rollouts.count("split = 'train'") == 8
    from transformers import AutoModelForCausalLM

    after = AutoModelForCausalLM.from_pretrained(res.checkpoint).model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(before, after)  # parameters moved
    ws.close()


def test_a_training_stopped_before_its_first_step_leaves_the_version_untrained(tmp_path):
    """Review 14 D-R14: a job cancelled (SIGTERM) before step 0 of 100,000 left the version 'trained' with a checkpoint
    of the base weights and metrics_summary.steps = 0, which list_versions and the gate took for a trained version.
    Now nothing is saved or marked: the version keeps its status, no checkpoint, steps_done 0; a later call trains."""
    ws, vid = _run(tmp_path, "stop0")
    be = LocalBackend(checkpoint_every=100, num_threads=1)
    res = be.train(ws, vid, 100_000, should_stop=lambda: True)
    v = ws.lineage.get(vid)
    assert (res.steps_done, res.checkpoint, res.stopped_early) == (0, None, True)
    assert (v.status, v.checkpoint, ws.lineage.last_step(vid)) == ("proposed", None, -1)
    assert not (ws.root / "checkpoints" / vid).exists()
    res = be.train(ws, vid, 1)
    assert res.steps_done == 1 and ws.lineage.get(vid).status == "trained" and ws.lineage.last_step(vid) == 0
    ws.close()


def test_a_child_on_another_level_is_judged_on_the_runs_dev_problems(tmp_path):
    # before: a data.level 1 -> 2 child was evaluated on level 2's dev problems (arith-L2-...), none of them its
    # parent's or control's, so the gate could not pair them ("cannot compare") and pruned it whatever it learned
    from evotrainer.harness.gate import gate

    ws, vid = _run(tmp_path, "level", data={"task": "arithmetic", "level": 1, "n_train": 16, "n_heldout": 6,
                                             "n_test": 4, "seed": 0})
    be = LocalBackend(checkpoint_every=100, num_threads=1)
    be.train(ws, vid, 1)
    child = ws.lineage.branch(vid, Intervention(path="data.level", old=1, new=2, category="data"))
    be.train(ws, child.id, 1)
    for v in (vid, child.id):
        be.evaluate(ws, v, k=2)
    dev = ws.lineage.eval_matrix(vid)
    assert sorted(ws.lineage.eval_matrix(child.id)) == sorted(dev) and len(dev) == 3  # eval.max_problems
    assert all(p.startswith("arith-L1-") for p in dev)
    trained_on = {r["prompt_id"] for r in ws.rollouts.query(f"version_id = '{child.id}' AND split = 'train'",
                                                            limit=1000, columns=["prompt_id"])}
    assert trained_on and all(p.startswith("arith-L2-") for p in trained_on)
    verdict = gate(ws, child.id, findings=[])
    assert verdict.n_problems == 3 and "cannot compare" not in verdict.reason
    be.evaluate(ws, child.id, k=2, eval_name="test")  # the test split is the run's too: its 4 level-1 problems
    test = ws.lineage.eval_matrix(child.id, "test")
    assert len(test) == 4 and all(p.startswith("arith-L1-") for p in test)
    ws.close()
