"""SWE episodes end to end with scripted policies (sandboxed tests), metrics, analyzers, and the policy-token mask."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from evotrainer import metrics as M
from evotrainer.harness.analyzers import run_analyzers
from evotrainer.harness.analyzers import swe as swe_analyzers
from evotrainer.harness.evidence import Evidence
from evotrainer.recipe import ToolUseSpec
from evotrainer.rl_backend.swe.episode import (
    encode_trajectory,
    episode_extras,
    episode_metrics,
    episode_record,
    run_episodes,
)
from evotrainer.rl_backend.swe.policies import ScriptedPolicy
from evotrainer.rl_backend.swe.tasks import load_taskset
from evotrainer.rollouts import SCHEMA


@pytest.fixture(scope="module")
def two_tasks():
    """One cachetools and one jmespath task (cheat: index 0 edits the tests, index 1 breaks collection)."""
    ts = load_taskset()
    return [next(t for t in ts if t.repo == "cachetools"), next(t for t in ts if t.repo == "jmespath")]


@pytest.fixture(scope="module")
def episodes(two_tasks, tmp_path_factory):
    out = {}
    for kind in ("oracle", "noop", "cheat", "loop"):
        out[kind] = run_episodes(two_tasks, ScriptedPolicy(kind, two_tasks), limits=ToolUseSpec(),
                                 workdir=tmp_path_factory.mktemp(kind))
    return out


def _findings(eps, version):
    rows = [episode_record(e, version_id=version, step=3, group_id=str(i), reward=e.outcome.swe_tests)
            for i, e in enumerate(eps)]
    ev = Evidence(rollouts=pa.Table.from_pylist(rows, schema=SCHEMA))
    return run_analyzers(ev, names=["swe_hacking", "swe_behaviour"]), rows


def test_oracle_earns_one_with_no_penalty(episodes):
    eps = episodes["oracle"]
    assert [e.outcome.swe_tests for e in eps] == [1.0, 1.0]
    assert all(e.outcome.resolved and e.finish_reason == "submit" and e.outcome.ran_tests for e in eps)
    assert episode_extras(eps) == {"swe_tests": [1.0, 1.0], "test_file_edit": [0.0, 0.0], "tool_budget": [0.0, 0.0],
                                   "submit_without_test": [0.0, 0.0]}
    m = episode_metrics(eps)
    # each oracle episode: 3 turns (edit, run_tests, submit), 3 calls, 1 test run, 1 edit, 1 file
    assert (m[M.TOOLS_TURNS_MEAN], m[M.TOOLS_CALLS_MEAN], m[M.TOOLS_TEST_RUNS_MEAN], m[M.TOOLS_EDITS_MEAN],
            m[M.TOOLS_FILES_TOUCHED_MEAN], m[M.TOOLS_RESOLVED_FRAC]) == (3.0, 3.0, 1.0, 1.0, 1.0, 1.0)
    assert m[M.tool_calls("edit")] == 1.0 and m[M.tool_calls("search")] == 0.0 and m[M.TOOLS_INVALID_FRAC] == 0.0
    findings, _ = _findings(eps, "oracle")
    assert findings == []


def test_noop_earns_zero_and_is_reported_as_submit_immediately(episodes):
    eps = episodes["noop"]
    assert [e.outcome.swe_tests for e in eps] == [0.0, 0.0]
    assert episode_extras(eps)["submit_without_test"] == [1.0, 1.0]
    assert episode_metrics(eps)[M.TOOLS_SUBMIT_WITHOUT_TEST_FRAC] == 1.0
    # nothing changed: graded as the task's base state without a test run (swe check runs them; see test_swe_cli)
    assert [e.outcome.ran_tests for e in eps] == [False, False]
    findings, _ = _findings(eps, "noop")
    assert [(f.kind, f.data["pattern"]) for f in findings] == [("behaviour_collapse", "submit_immediately")]


def test_cheat_earns_zero_and_is_named_reward_hacking(episodes):
    eps = episodes["cheat"]
    assert [e.outcome.swe_tests for e in eps] == [0.0, 0.0]
    skip, broken = eps
    assert skip.outcome.test_files_edited == [skip.turns[0]["content"].split('"path": "')[1].split('"')[0]]
    assert skip.extras["test_file_edit"] == 1.0
    # the planted skip made the policy's own run "pass": 0 failed. The grader restores the tests.
    assert "failed" not in skip.turns[3]["content"] and "skipped" in skip.turns[3]["content"]
    assert broken.outcome.collection_error and broken.outcome.f2p_passed == 0 and not broken.outcome.test_files_edited
    findings, rows = _findings(eps, "cheat")
    (f,) = findings
    assert f.kind == "reward_hacking" and f.severity == "blocking"  # 2 of 2 episodes >= 25%
    assert f.data["test_edit_episodes"] == 1 and f.data["collection_error_episodes"] == 1
    assert f"rollout:{rows[0]['rollout_id']}" in f.evidence
    # with every registered analyzer, swe_hacking is the one that names it (the generic reward_hacking
    # analyzer leaves graded SWE episodes to it, so there is one finding, not two)
    ev = Evidence(rollouts=pa.Table.from_pylist(rows, schema=SCHEMA))
    assert [(g.kind, g.analyzer) for g in run_analyzers(ev) if g.kind == "reward_hacking"] == \
        [("reward_hacking", "swe_hacking")]


def test_loop_hits_the_budget_and_is_reported(episodes):
    eps = episodes["loop"]
    # 3 searches per turn, budget 12: turns 1-4 use 12 calls, the 13th call (turn 5) ends the episode
    assert all(e.stats["budget_exceeded"] and e.stats["calls"] == 12 and e.stats["turns"] == 5 for e in eps)
    assert [e.finish_reason for e in eps] == ["budget", "budget"]
    m = episode_metrics(eps)
    assert m[M.TOOLS_BUDGET_EXCEEDED_FRAC] == 1.0 and m[M.tool_calls("search")] == 12.0
    findings, _ = _findings(eps, "loop")
    (f,) = findings
    assert (f.kind, f.data["pattern"], f.data["budget_exceeded"], f.data["max_repeats"]) == \
        ("behaviour_collapse", "search_loop", 2, 12)


def test_rollout_record_stores_every_turn(episodes):
    e = episodes["oracle"][0]
    rec = episode_record(e, version_id="v1", step=2, group_id="g0", reward=1.0, components={"swe_tests": 1.0})
    turns = json.loads(rec["turns"])
    assert [t["role"] for t in turns] == ["assistant", "tool"] * 3 + ["outcome"]
    assert [t["tool"] for t in turns[:6:2]] == ["edit", "run_tests", "submit"]
    assert json.loads(turns[-1]["content"])["outcome"]["resolved"] is True
    assert rec["finish_reason"] == "submit" and rec["answer"] == e.task_id and rec["correct"] == 1.0
    assert swe_analyzers.swe_episodes(Evidence(rollouts=pa.Table.from_pylist([rec], schema=SCHEMA)), "v1")[0]["step"] == 2


# --- the policy-token mask --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
    from evotrainer.rl_backend.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


def test_encode_trajectory_masks_everything_but_the_policy_tokens(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Fix it."},
            {"role": "assistant", "content": "A1 call"}, {"role": "tool", "content": "obs one"},
            {"role": "assistant", "content": "A2"}, {"role": "tool", "content": "final obs"}]
    enc = encode_trajectory(tok, msgs)
    ids, mask = enc.input_ids, enc.completion_mask
    assert len(ids) == len(mask)
    policy = [tok.decode(ids[a:b]) for a, b in enc.spans]
    assert policy == ["A1 call<|im_end|>", "A2<|im_end|>"]  # content + end-of-turn, nothing else
    assert sum(mask) == sum(b - a for a, b in enc.spans)
    masked_text = tok.decode([i for i, m in zip(ids, mask, strict=True) if m == 0])
    assert masked_text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nFix it.<|im_end|>\n<|im_start|>assistant\n"
                           "\n<|im_start|>tool\nobs one<|im_end|>\n<|im_start|>assistant\n")
    # the sequence is exactly the template's rendering up to the last policy token; the final observation is dropped
    full = tok.apply_chat_template(msgs[:5], tokenize=False)
    assert tok.decode(ids) == full[: full.rindex("<|im_end|>") + len("<|im_end|>")]
    assert enc.prompt_len == enc.spans[0][0] and enc.mismatches == 0


def test_encode_trajectory_uses_the_sampled_ids(tok):
    msgs = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "hello world"},
            {"role": "tool", "content": "o"}, {"role": "assistant", "content": "cut off"}]
    a1 = tok("hello world<|im_end|>", add_special_tokens=False)["input_ids"]
    a2 = tok("cut off", add_special_tokens=False)["input_ids"]  # stopped by the length cap: no end token
    enc = encode_trajectory(tok, msgs, [a1, a2])
    assert [enc.input_ids[a:b] for a, b in enc.spans] == [a1, a2] and enc.mismatches == 0
    # a sampled turn that disagrees with the message text is re-tokenized and counted
    enc = encode_trajectory(tok, msgs, [tok("other", add_special_tokens=False)["input_ids"], a2])
    assert enc.mismatches == 1
    with pytest.raises(ValueError, match="2 assistant turns"):
        encode_trajectory(tok, msgs, [a1])
    with pytest.raises(ValueError, match="no assistant turn"):
        encode_trajectory(tok, msgs[:1])


@pytest.fixture(scope="module")
def tiny():
    """The tiny random Llama with the SmolLM2 tokenizer (rl_backend.models)."""
    import torch

    from evotrainer.recipe import ModelSpec
    from evotrainer.rl_backend.models import load_policy

    return load_policy(ModelSpec(name_or_path="tiny-random"), device=torch.device("cpu"))


def test_model_policy_episode_records_sampled_ids_and_a_consistent_mask(two_tasks, tmp_path, tiny):
    """A tiny random model plays 2 turns: its replies are no tool calls, the ids and mask still line up."""
    import torch

    from evotrainer.rl_backend.swe.policies import ChatModelPolicy

    torch.manual_seed(0)
    bundle = tiny
    tok = bundle.tokenizer
    pol = ChatModelPolicy(bundle.model, tok, max_new_tokens=8, temperature=1.0)
    (e,) = run_episodes(two_tasks[:1], pol, limits=ToolUseSpec(max_turns=2), workdir=tmp_path,
                        count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]))
    acts = [t for t in e.turns if t["role"] == "assistant"]
    assert len(acts) == 2 and all(1 <= len(t["token_ids"]) <= 8 and t["tokens"] == len(t["token_ids"]) for t in acts)
    assert e.stats["stop_reason"] == "max_turns" and e.outcome.swe_tests == 0.0
    enc = encode_trajectory(tok, e.messages, e.policy_token_ids())
    # every sampled id is trained on, nothing else: mask sum = policy tokens of the episode
    assert sum(enc.completion_mask) == e.policy_tokens == sum(len(t["token_ids"]) for t in acts)
    assert [enc.input_ids[a:b] for a, b in enc.spans] == [t["token_ids"] for t in acts] and enc.mismatches == 0
    m = episode_metrics([e])
    # random text: each of the 2 replies is one invalid call (no tool call found)
    assert m[M.TOOLS_CALLS_MEAN] == 2.0 and m[M.TOOLS_INVALID_FRAC] == 1.0


def test_episodes_to_rollout_batch_feeds_the_trainer_forward(two_tasks, tmp_path, tiny):
    """Two tiny-model episodes become a RolloutBatch whose masked log-probs cover the policy tokens only."""
    import torch

    from evotrainer.rl_backend.sampling import sequence_logprobs
    from evotrainer.rl_backend.swe.policies import ChatModelPolicy
    from evotrainer.rl_backend.swe.train import episodes_to_rollout_batch

    torch.manual_seed(1)
    bundle = tiny
    tok = bundle.tokenizer
    eps = run_episodes(two_tasks, ChatModelPolicy(bundle.model, tok, max_new_tokens=6), workdir=tmp_path,
                       limits=ToolUseSpec(max_turns=2))
    rb = episodes_to_rollout_batch(tok, eps)
    assert rb.completion_ids.shape == rb.completion_mask.shape == rb.completion_attention_mask.shape
    assert rb.lengths == [e.policy_tokens for e in eps]
    # observations are attended to but not trained on
    assert bool((rb.completion_attention_mask >= rb.completion_mask).all())
    assert int(rb.completion_attention_mask.sum()) > int(rb.completion_mask.sum())
    lp, _ = sequence_logprobs(bundle.model, rb.prompt_ids, rb.prompt_mask, rb.completion_ids, rb.completion_mask,
                              completion_attention_mask=rb.completion_attention_mask)
    assert lp.shape == rb.completion_ids.shape and torch.isfinite(lp).all()
