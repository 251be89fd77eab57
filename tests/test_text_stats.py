"""The one home of the text statistics (evotrainer/text_stats.py): the repetition reward, the trainer's
completions/* metrics and the harness's recomputation from rollouts share one implementation."""

from __future__ import annotations

import pytest

from evotrainer import text_stats
from evotrainer.harness import rollout_metrics
from evotrainer.rl_backend.rewards import compute_rewards
from evotrainer.rl_backend.tasks import Problem
from evotrainer.text_stats import distinct_n, repeated_ngram_rate, repetition_rate

TEXTS = ["a b c d a b c d", "x y z w x y z w x y z w", "one two three", ""]


def test_repetition_rate_is_the_mean_of_the_per_text_rate():
    assert repetition_rate(TEXTS, 4) == pytest.approx(sum(repeated_ngram_rate(t, 4) for t in TEXTS) / len(TEXTS))
    assert repetition_rate([], 4) != repetition_rate([], 4)  # NaN for an empty batch
    assert distinct_n(["a b", "a b"], 2) == 0.5


def test_the_repetition_reward_and_the_harness_use_the_core_functions():
    p = Problem(id="a", prompt="q", answer="1", meta={"task": "arithmetic"})
    out = compute_rewards({"repetition": {"weight": 1.0, "params": {"n": 4}}}, [p] * len(TEXTS), TEXTS,
                          finish_reasons=["eos"] * len(TEXTS), lengths=[1] * len(TEXTS), generate_max_len=8)
    assert out.components["repetition"] == [-repeated_ngram_rate(t, 4) + 0.0 for t in TEXTS]
    assert rollout_metrics.repetition_rate is text_stats.repetition_rate
    assert rollout_metrics.distinct_n is text_stats.distinct_n
