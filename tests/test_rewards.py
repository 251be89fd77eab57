"""Reward components on hand-sized batches (values worked out in the comments)."""

from __future__ import annotations

import time

import pytest

from evotrainer.recipe import REWARD_COMPONENTS, RewardComponent
from evotrainer.rl_backend.math_verify_utils import extract_answer, is_correct
from evotrainer.rl_backend.rewards import (
    REWARD_FUNCTIONS,
    RewardError,
    compute_rewards,
    overlong_penalty,
)
from evotrainer.rl_backend.tasks import Problem
from evotrainer.text_stats import repeated_ngram_rate

ADD = Problem(id="a", prompt="What is 3 + 4?", answer="7", meta={"task": "arithmetic"})
FRAC = Problem(id="m", prompt="Simplify 10/12.", answer="\\frac56", meta={"task": "math"})


def _run(spec, problems, completions, lengths=None, finish=None, max_len=16, extras=None):
    n = len(completions)
    return compute_rewards(spec, problems, completions, finish_reasons=finish or ["eos"] * n,
                           lengths=lengths or [4] * n, generate_max_len=max_len, extras=extras)


def test_every_component_has_a_function():
    assert set(REWARD_FUNCTIONS) == set(REWARD_COMPONENTS)


@pytest.mark.parametrize(("text", "gold", "ok"), [
    ("7", "7", True), ("3 + 4 = 7.", "7", True), ("8", "7", False), ("no idea", "7", False),
    ("#### 1,000", "1000", True), ("The answer is 2.", "2", True), ("Answer: 12 apples", "12", True),
    ("so \\boxed{\\frac{5}{6}}", "\\frac56", True), ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{\\frac{36}{2}}", "18", True), ("\\boxed{(3, -1)}", "(3,-1)", True), ("\\boxed{3}", "\\frac56", False),
])
def test_is_correct(text, gold, ok):
    assert is_correct(text, gold) is ok


def test_extract_answer_priority():
    assert extract_answer("1 then \\boxed{x^{2}} then 5") == ("x^{2}", "boxed")
    assert extract_answer("3 #### 42 and 7") == ("42", "hash")
    assert extract_answer("answer is 9, not 10") == ("9, not 10", "answer_is")
    assert extract_answer("1 2 3") == ("3", "last_number")
    assert extract_answer("none") == (None, "none")


def test_numeric_fast_path_is_fast():
    t = time.perf_counter()
    for i in range(2000):
        is_correct(f"The sum is {i}", str(i))
    assert time.perf_counter() - t < 3.0  # no sympy on plain numbers


def test_weighted_total_and_components():
    spec = {"correctness": RewardComponent(weight=1.0), "format": RewardComponent(weight=0.5),
            "format_token": {"weight": 0.2}}
    out = _run(spec, [ADD], ["7", "Answer: 7", "Answer: 9", "8 or so"])
    # correctness 1,1,0,0; arithmetic format (just the number) 1,0,0,0; "Answer:" 0,1,1,0
    assert out.components == {"correctness": [1.0, 1.0, 0.0, 0.0], "format": [1.0, 0.0, 0.0, 0.0],
                              "format_token": [0.0, 1.0, 1.0, 0.0]}
    # totals: 1 + 0.5 = 1.5; 1 + 0.2 = 1.2; 0.2; 0
    assert out.total == pytest.approx([1.5, 1.2, 0.2, 0.0])
    assert out.correct == [1.0, 1.0, 0.0, 0.0]


def test_problems_per_prompt_are_repeated_group_major():
    out = _run({"correctness": {}}, [ADD, FRAC], ["7", "6", "\\boxed{5/6}", "\\boxed{1}"])
    assert out.correct == [1.0, 0.0, 1.0, 0.0]
    with pytest.raises(RewardError, match="2 problems for 3 completions"):
        _run({"correctness": {}}, [ADD, FRAC], ["7", "6", "5"])


def test_format_token_param_and_format_patterns():
    out = _run({"format_token": {"params": {"token": "<ok>"}}}, [ADD], ["x <ok>", "Answer: 7"])
    assert out.components["format_token"] == [1.0, 0.0]
    g = Problem(id="g", prompt="q", answer="5", meta={"task": "gsm8k"})
    assert _run({"format": {}}, [g], ["so #### 5", "5"]).components["format"] == [1.0, 0.0]
    assert _run({"format": {}}, [FRAC], ["\\boxed{1}", "1"]).components["format"] == [1.0, 0.0]
    assert _run({"format": {"params": {"pattern": "^A"}}}, [ADD], ["A7", "7A"]).components["format"] == [1.0, 0.0]


def test_overlong_dapo():
    # max_len 16, buffer 4: expected 12. L=12 -> 0; L=13 -> -(1/4); L=15 -> -(3/4); L=16 -> -1; factor 2 doubles
    assert [overlong_penalty(n, 16, 4) for n in (10, 12, 13, 15, 16, 20)] == [0.0, 0.0, -0.25, -0.75, -1.0, -1.0]
    assert overlong_penalty(14, 16, 4, penalty_factor=2.0) == -1.0  # -(2/4) * 2
    out = _run({"overlong": {"params": {"buffer_len": 4}}}, [ADD], ["a", "b", "c"], lengths=[12, 14, 9],
               finish=["eos", "eos", "length"])
    assert out.components["overlong"] == [0.0, -0.5, -1.0]  # a truncated sample counts as L = max_len
    out = _run({"overlong": {}}, [ADD], ["a"], lengths=[14])  # default buffer 16 // 4 = 4: -(14-12)/4
    assert out.components["overlong"] == [-0.5]
    with pytest.raises(RewardError, match="buffer_len=0"):
        overlong_penalty(3, 16, 0)


def test_length_penalty_and_repetition():
    out = _run({"length_penalty": {}}, [ADD], ["a", "b", "c"], lengths=[8, 12, 16])
    # target 16 // 2 = 8, per_token 1 / (16 - 8): 0, -4/8, -8/8
    assert out.components["length_penalty"] == [0.0, -0.5, -1.0]
    out = _run({"length_penalty": {"params": {"target_len": 10, "per_token": 0.1}}}, [ADD], ["a"], lengths=[13])
    assert out.components["length_penalty"] == [pytest.approx(-0.3)]
    # "a b c d a b c d": 4-grams abcd, bcda, cdab, dabc, abcd -> 5 grams, 4 distinct -> 1/5 repeated
    assert repeated_ngram_rate("a b c d a b c d") == pytest.approx(0.2)
    assert repeated_ngram_rate("a b c") == 0.0
    out = _run({"repetition": {}}, [ADD], ["a b c d a b c d", "7"])
    assert out.components["repetition"] == [pytest.approx(-0.2), 0.0]


def test_swe_components_read_extras():
    swe = Problem(id="s", prompt="fix", answer="", meta={"task": "swe"})
    spec = {"swe_tests": {}, "test_file_edit": {"weight": 0.5}, "tool_budget": {}, "submit_without_test": {}}
    extras = {"swe_tests": [1, 0], "test_file_edit": [0, 1], "tool_budget": [1, 0], "submit_without_test": [0, 0]}
    out = _run(spec, [swe], ["", ""], extras=extras)
    assert out.components == {"swe_tests": [1.0, 0.0], "test_file_edit": [0.0, -1.0], "tool_budget": [-1.0, 0.0],
                              "submit_without_test": [0.0, 0.0]}
    assert out.total == [0.0, -0.5]  # 1 + 0 - 1 + 0 ; 0 - 0.5 + 0 + 0
    assert out.correct == [1.0, 0.0]
    with pytest.raises(RewardError, match=r"extras\['tool_budget'\], which is missing"):
        _run({"tool_budget": {}}, [swe], [""], extras={})
    with pytest.raises(RewardError, match="has 1 values for 2 completions"):
        _run({"swe_tests": {}}, [swe], ["", ""], extras={"swe_tests": [1]})


def test_bad_inputs():
    with pytest.raises(RewardError, match="unknown reward component 'bogus'"):
        _run({"bogus": {}}, [ADD], ["7"])
    with pytest.raises(RewardError, match="lengths has 2 entries for 1 completions"):
        _run({"correctness": {}}, [ADD], ["7"], lengths=[1, 2])


def test_code_tests_use_the_sandbox_runner():
    from evotrainer.rl_backend.tasks import read_humaneval

    p = next(q for q in read_humaneval() if q.id == "HumanEval/0")
    good = "```python\n" + p.prompt + p.meta["canonical_solution"] + "```"
    out = _run({"code_tests": {}}, [p], [good, "```python\ndef has_close_elements(numbers, threshold):\n    return 1\n```"])
    assert out.components["code_tests"] == [1.0, 0.0] and out.correct == [1.0, 0.0]
