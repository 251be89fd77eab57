"""GRPO on SWE episodes (rl_backend/swe/train.py through rl_backend/local.py) with the tiny random model.

The tiny model never writes a valid tool call, so every episode plays ``max_turns`` = 2 invalid
turns and fails the hidden tests (swe_tests = 0). With ``correctness`` alone all rewards tie; the
``repetition`` component (minus the repeated word 4-gram rate of the transcript) gives groups
with reward variance, so the update path runs too.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from evotrainer import metrics as M
from evotrainer.recipe import validate_recipe
from evotrainer.rl_backend.local import LocalBackend
from evotrainer.rl_backend.models import load_policy
from evotrainer.rl_backend.swe import train as swe_train
from evotrainer.rl_backend.swe.policies import ChatModelPolicy
from evotrainer.rl_backend.tasks import load_problems
from evotrainer.workspace import Workspace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SWE = {"model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 2, "rollout_batch_size": 2,
       "generate_max_len": 8, "init_kl_coef": 0.0, "actor_learning_rate": 1e-3,
       "data": {"task": "swe", "n_train": 2, "n_heldout": 1}, "tool_use": {"max_turns": 2},
       "eval": {"k": 2, "max_problems": 1}}
REPETITION = {"correctness": {"weight": 1.0}, "repetition": {"weight": 1.0}}
TOOL_METRICS = {n for n in M.ALL_STEP_METRICS if n.startswith("tools/")} | {M.tool_calls(t) for t in
                                                                             ("search", "view", "edit", "run_tests",
                                                                              "submit")}


def _recipe(**overrides):
    return validate_recipe({**SWE, **overrides})


def _policy_ids(turns):
    return [t["token_ids"] for t in turns if t["role"] == "assistant"]


def test_load_problems_routes_swe_to_the_task_set():
    train, held = load_problems(_recipe().data)
    # 4 projects, n_heldout / (n_train + n_heldout) = 1/3 → round(4/3) = 1 held-out project
    assert len(train) == 2 and len(held) == 1
    assert {p.meta["repo"] for p in held}.isdisjoint({p.meta["repo"] for p in train})
    assert all(p.meta["task"] == "swe" and p.answer == p.id for p in train + held)


def test_rollout_masks_policy_tokens_and_scores_them_in_context():
    recipe = _recipe(reward=REPETITION)
    train, _ = load_problems(recipe.data)
    bundle = load_policy(recipe.model, device=torch.device("cpu"))
    rb, rw, eps = swe_train.rollout(bundle, recipe, train, seed=1)
    assert rb.size == len(eps) == 4 and [e.task_id for e in eps] == [p.id for p in train for _ in range(2)]
    # the loss mask covers exactly the sampled tokens of every assistant turn (2 turns of <= 8 tokens)
    counts = [sum(len(ids) for ids in _policy_ids(e.turns)) for e in eps]
    assert rb.completion_mask.sum(-1).tolist() == counts == rb.lengths
    assert all(len(_policy_ids(e.turns)) == 2 and 2 <= c <= 16 for e, c in zip(eps, counts, strict=True))
    # observations stay in the context: attended, not trained on
    assert bool((rb.attention_mask >= rb.completion_mask).all()) and int(rb.attention_mask.sum()) > sum(counts)
    # old log-probs are filled (the episode runner leaves zeros): negative on the mask, 0 off it
    lp, mask = rb.sampling_logprobs, rb.completion_mask.bool()
    assert bool((lp[mask] < 0).all()) and bool((lp[~mask] == 0).all())
    # independent check of the layout: episode 0's first reply scored after its rendered opening chat
    tok, e = bundle.tokenizer, eps[0]
    head = tok.apply_chat_template(e.messages[:2], tokenize=False, add_generation_prompt=True)
    ids0 = _policy_ids(e.turns)[0]
    ctx = tok(head, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = bundle.model(input_ids=torch.tensor([ctx + ids0])).logits[0, len(ctx) - 1:-1]
    want = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids0)[:, None]).squeeze(-1)
    assert torch.allclose(lp[0][mask[0]][: len(ids0)], want, atol=1e-4)
    # rewards: the hidden tests fail (correctness 0), so the total is the repetition component
    assert rw.correct == [0.0] * 4 and rw.components["correctness"] == [0.0] * 4
    assert rw.total == rw.components["repetition"] and all(-1 <= x <= 0 for x in rw.total)
    m = swe_train.step_metrics(eps)
    # every reply is random text: 2 invalid calls per episode, every turn cut at the 8-token cap or ended
    assert TOOL_METRICS <= set(m) and m[M.TOOLS_TURNS_MEAN] == 2.0 and m[M.TOOLS_INVALID_FRAC] == 1.0
    # clipped = a reply without its end-of-turn token (8 replies in all)
    eos = set(ChatModelPolicy(bundle.model, tok).eos_ids)
    assert m[M.COMPLETIONS_CLIPPED_RATIO] == sum(i[-1] not in eos for e in eps for i in _policy_ids(e.turns)) / 8


def test_one_step_with_reward_variance_updates_the_policy():
    recipe = _recipe(reward=REPETITION)
    train, _ = load_problems(recipe.data)
    bundle = load_policy(recipe.model, device=torch.device("cpu"))
    bundle.model.train()
    before = {k: v.clone() for k, v in bundle.model.state_dict().items()}
    opt = torch.optim.AdamW(bundle.trainable_parameters(), lr=recipe.actor_learning_rate)
    m, records = LocalBackend(num_threads=1)._step(bundle, opt, recipe, train, "v0", 0)
    assert len(records) == 4 and math.isfinite(m[M.LOSS_TOTAL]) and m[M.POLICY_GRAD_NORM] > 0
    by_group: dict[str, list[dict]] = {}
    for r in records:
        by_group.setdefault(r["group_id"], []).append(r)
    n_var = 0
    for rows in by_group.values():
        r0, r1 = (r["reward"] for r in rows)
        if r0 == r1:  # a tie is dropped: no advantage, not kept
            assert [(r["advantage"], r["kept"]) for r in rows] == [(0.0, False)] * 2
            continue
        n_var += 1
        # group_norm with G=2: (r - mean) / std_unbiased = ±(d/2) / (|d|/√2) = ±1/√2
        for r in rows:
            assert r["kept"] and r["advantage"] == pytest.approx(math.copysign(2 ** -0.5, r["reward"] - (r0 + r1) / 2))
    assert n_var >= 1  # the repetition rates of random transcripts differ
    assert m[M.REWARD_KEPT_GROUP_FRAC] == n_var / 2 and m[M.REWARD_FRAC_ZERO_STD] == 1 - n_var / 2
    moved = [k for k, v in bundle.model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved  # a non-zero advantage moved the weights
    assert TOOL_METRICS <= set(m)
    for r in records:
        turns = json.loads(r["turns"])
        assert [t["role"] for t in turns] == ["assistant", "tool"] * 2 + ["outcome"]
        assert r["length"] == sum(len(t["token_ids"]) for t in turns if t["role"] == "assistant")
        assert json.loads(turns[-1]["content"])["outcome"]["resolved"] is False


def test_train_and_evaluate_on_swe_with_tied_rewards(tmp_path):
    """correctness alone: every episode fails, both groups tie, both are dropped and no update happens."""
    ws = Workspace(tmp_path / "run", writer=True)
    vid = ws.lineage.create_root(_recipe()).id
    be = LocalBackend(checkpoint_every=100, num_threads=1)
    res = be.train(ws, vid, 1)
    assert res.steps_done == 1
    m = {k: s[-1][1] for k, s in ws.lineage.all_metrics(vid).items()}
    # 2 groups, rewards [0, 0] each: frac_zero_std = 2/2, kept = 0/2, no update so the loss row is the 0.0 default
    assert (m[M.REWARD_MEAN], m[M.REWARD_FRAC_ZERO_STD], m[M.REWARD_KEPT_GROUP_FRAC]) == (0.0, 1.0, 0.0)
    assert (m[M.LOSS_TOTAL], m[M.POLICY_GRAD_NORM]) == (0.0, 0.0)
    assert TOOL_METRICS <= set(m) and m[M.TOOLS_TURNS_MEAN] == 2.0 and m[M.TOOLS_RESOLVED_FRAC] == 0.0
    # the saved weights are the base model's (no optimiser step ran)
    base = load_policy(validate_recipe(SWE).model, device=torch.device("cpu")).model.state_dict()
    saved = load_policy(validate_recipe(SWE).model, checkpoint=res.checkpoint, device=torch.device("cpu")).model
    assert all(torch.equal(v, base[k]) for k, v in saved.state_dict().items())
    rows = ws.rollouts.sql(f"SELECT * FROM rollouts WHERE version_id='{vid}' AND split='train'")
    assert len(rows) == 4 and not any(r["kept"] for r in rows)
    assert all(json.loads(r["turns"])[-1]["role"] == "outcome" for r in rows)
    # evaluation: k=2 episodes on 1 held-out task, all fail → Avg@2 = pass@2 = 0
    ev = be.evaluate(ws, vid)
    assert (ev.k, ev.n_problems, ev.avg_at_k, ev.pass_at_k) == (2, 1, 0.0, 0.0)
    ev_rows = ws.rollouts.sql(f"SELECT * FROM rollouts WHERE version_id='{vid}' AND split='eval'")
    assert len(ev_rows) == 2 and {r["prompt_id"] for r in ev_rows} == {load_problems(_recipe().data)[1][0].id}
    assert all(json.loads(r["turns"])[-1]["role"] == "outcome" for r in ev_rows)
    assert ws.lineage.get(vid).eval_summary["avg@k"] == 0.0
    ws.close()
