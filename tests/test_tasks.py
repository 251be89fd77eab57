"""Tasks: arithmetic levels, verl parquet, JSONL, HumanEval; seeded disjoint splits; difficulty band."""

from __future__ import annotations

import json

import pytest

from evotrainer.recipe import DataSpec
from evotrainer.rl_backend.tasks import (
    DATA_DIR,
    EST_PASS_RATE,
    VERL_GSM8K_SUFFIX,
    Problem,
    TaskError,
    arithmetic_problems,
    build_messages,
    dedupe,
    estimate_pass_rates,
    filter_by_pass_rate,
    load_problems,
    read_verl_parquet,
    split_manifest,
)


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5, 6])
def test_arithmetic_answers_are_right(level):
    for p in arithmetic_problems(level, 30, seed=3):
        expr = p.prompt.removeprefix("What is ").removesuffix("?").replace("x", "*")
        assert str(eval(expr)) == p.answer  # the generator's answer is the true value
        assert p.meta["level"] == level and p.meta["est_pass_rate"] == EST_PASS_RATE[level]


def test_arithmetic_level_shapes():
    (p1,) = arithmetic_problems(1, 1, seed=0)
    a, b = p1.prompt.removeprefix("What is ").removesuffix("?").split(" + ")
    assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9
    for p in arithmetic_problems(2, 20, seed=0):
        a, b = p.prompt.removeprefix("What is ").removesuffix("?").split(" + ")
        assert 10 <= int(a) <= 99 and 0 <= int(b) <= 9
    for p in arithmetic_problems(4, 20, seed=0):
        a, b = p.prompt.removeprefix("What is ").removesuffix("?").split(" x ")
        assert 10 <= int(a) <= 99 and 0 <= int(b) <= 9


def test_level1_small_pool_and_disjoint():
    # Level 1 has 20 x 20 = 400 distinct questions < 2 x 250: a fifth (80) is held out, train gets 256 of the 320 left
    train, heldout = load_problems(DataSpec(level=1, n_heldout=250))
    assert (len(train), len(heldout)) == (256, 80)
    assert not {p.prompt for p in train} & {p.prompt for p in heldout}
    assert {p.meta["split"] for p in train} == {"train"} and {p.meta["split"] for p in heldout} == {"heldout"}


@pytest.mark.parametrize("spec", [dict(level=1), dict(level=3, n_heldout=10), dict(task="gsm8k", n_heldout=30),
                                  dict(task="humaneval")])
def test_heldout_does_not_move_with_n_train(spec):
    held = [[p.id for p in load_problems(DataSpec(**spec, n_train=n))[1]] for n in (5, 40, 300)]
    assert held[0] == held[1] == held[2]


def test_splits_are_deterministic_and_seeded():
    spec = DataSpec(level=3, n_train=50, n_heldout=10, seed=7)
    a, b = load_problems(spec), load_problems(spec)
    assert [p.id for p in a[0]] == [p.id for p in b[0]] and [p.id for p in a[1]] == [p.id for p in b[1]]
    c = load_problems(DataSpec(level=3, n_train=50, n_heldout=10, seed=8))
    assert [p.id for p in c[1]] != [p.id for p in a[1]]
    m1, m2 = split_manifest(*a), split_manifest(*b)
    assert m1["digest"] == m2["digest"] and m1["n_train"] == 50 and m1["n_heldout"] == 10
    assert m1["digest"] != split_manifest(*c)["digest"]


def test_gsm8k_and_math_shipped_copies():
    train, heldout = load_problems(DataSpec(task="gsm8k", n_train=150, n_heldout=50))
    assert (len(train), len(heldout)) == (150, 50)
    assert not {p.id for p in train} & {p.id for p in heldout}
    rows = {p.id: p for p in read_verl_parquet(DATA_DIR / "gsm8k" / "test200.parquet", "gsm8k")}
    first = rows["gsm8k-test-0"]  # GSM8K test row 0: Janet's ducks, 16 - 3 - 4 = 9 eggs x $2 = 18
    assert first.answer == "18" and first.prompt.startswith("Janet")
    assert "####" not in first.prompt  # the question, without verl's instruction
    msgs = build_messages(first, DataSpec(task="gsm8k"))
    assert msgs == [{"role": "user", "content": first.prompt + VERL_GSM8K_SUFFIX}]
    mtrain, _ = load_problems(DataSpec(task="math", n_train=20, n_heldout=5))
    assert all(not p.prompt.endswith("\\boxed{}.") for p in mtrain)


def test_parquet_folder_draws_heldout_from_test_file(tmp_path):
    import shutil

    shutil.copy(DATA_DIR / "gsm8k" / "test200.parquet", tmp_path / "test.parquet")
    shutil.copy(DATA_DIR / "gsm8k" / "test200.parquet", tmp_path / "train.parquet")
    # the same rows on both sides: every held-out question must be dropped from train
    train, heldout = load_problems(DataSpec(task="gsm8k", path=str(tmp_path), n_train=500, n_heldout=30))
    assert len(heldout) == 30 and len(train) == 200 - 30


def test_jsonl_and_errors(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) for i in range(10))
                 + "\n" + json.dumps({"prompt": "Q0 ", "answer": "0"}) + "\n")  # duplicate of q0 after normalising
    train, heldout = load_problems(DataSpec(task="jsonl", path=str(f), n_train=7, n_heldout=2))
    assert len(train) == 7 and len(heldout) == 2
    assert len(dedupe(load_problems(DataSpec(task="jsonl", path=str(f), n_train=100, n_heldout=1,
                                             dedupe=False))[0])) == 9  # 11 lines, 1 held out, 1 duplicate
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x"}\n')
    with pytest.raises(TaskError, match=r"bad.jsonl:1: each line needs keys 'prompt' and 'answer'"):
        load_problems(DataSpec(task="jsonl", path=str(bad)))
    with pytest.raises(TaskError, match="data.path is required"):
        load_problems(DataSpec.model_construct(task="jsonl", path=None))  # the recipe rejects this first (test_cli_ux)
    with pytest.raises(TaskError, match="no such parquet file"):
        load_problems(DataSpec(task="gsm8k", path=str(tmp_path / "nope.parquet")))


def test_humaneval():
    train, heldout = load_problems(DataSpec(task="humaneval", n_train=100, n_heldout=64))
    assert len(train) + len(heldout) == 164
    p = next(q for q in train + heldout if q.id == "HumanEval/0")
    assert p.answer == "HumanEval/0" and p.meta["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in p.meta["test"] and p.prompt.lstrip().startswith("from typing import List")
    user = build_messages(p, DataSpec(task="humaneval"))[-1]["content"]
    assert "```python\n" + p.prompt in user


def test_build_messages_system_and_suffix():
    p = Problem(id="x", prompt="What is 2 + 3?", answer="5", meta={"task": "arithmetic"})
    msgs = build_messages(p, DataSpec(system_prompt="Be brief.", prompt_suffix=" Reply 'Answer: N'."))
    assert msgs == [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is 2 + 3? Reply 'Answer: N'."}]


def test_difficulty_band_filter():
    ps = [Problem(id=f"p{i}", prompt=f"q{i}", answer="1") for i in range(4)]
    rates = {"p0": 0.0, "p1": 0.25, "p2": 0.75, "p3": 1.0}
    assert [p.id for p in filter_by_pass_rate(ps, (0.1, 0.9), rates)] == ["p1", "p2"]
    assert [p.id for p in filter_by_pass_rate(ps, (0.0, 1.0), rates)] == ["p0", "p1", "p2", "p3"]
    assert [p.id for p in filter_by_pass_rate(ps, (0.5, 0.5))] == ["p0", "p1", "p2", "p3"]  # no estimate: kept
    # (p, correct) outcomes -> means: p0: (1 + 0) / 2 = 0.5, p1: 1 / 1 = 1.0; NaN skipped
    assert estimate_pass_rates([("p0", 1), ("p0", 0), ("p1", 1.0), ("p1", float("nan"))]) == {"p0": 0.5, "p1": 1.0}
    # level 1 estimate 0.22 is inside [0.2, 0.3] and outside [0.5, 1]
    assert len(load_problems(DataSpec(level=1, difficulty_band=(0.2, 0.3)))[0]) == 256
    with pytest.raises(TaskError, match="difficulty_band"):
        load_problems(DataSpec(level=1, difficulty_band=(0.5, 1.0)))
    # measured rates override the level estimate; held-out is never filtered
    train, heldout = load_problems(DataSpec(level=1))
    measured = {p.id: (0.0 if i % 2 else 0.5) for i, p in enumerate(train)}
    kept, held2 = load_problems(DataSpec(level=1, difficulty_band=(0.1, 0.9)), pass_rates=measured)
    assert len(kept) == 128 and [p.id for p in held2] == [p.id for p in heldout]


def test_workspace_pass_rates_move_the_band(tmp_path):
    from evotrainer.recipe import Recipe
    from evotrainer.rl_backend.tasks import workspace_pass_rates
    from evotrainer.rollouts import make_record
    from evotrainer.workspace import Workspace

    train, _ = load_problems(DataSpec(level=1))
    a, b = train[0].id, train[1].id
    with Workspace(tmp_path / "run", writer=True) as ws:
        v = ws.lineage.create_root(Recipe())
        rows = [make_record(version_id=v.id, step=1, prompt_id=pid, group_id=f"{pid}-g", sample_idx=i, prompt="q",
                            completion="c", reward=c, correct=c)
                for pid, outcomes in ((a, [1, 1, 1, 1]), (b, [1, 0, 0, 0])) for i, c in enumerate(outcomes)]
        ws.rollouts.add(rows)
        rates = workspace_pass_rates(ws)
        assert rates == {a: 1.0, b: 0.25}  # 4/4 and 1/4
        assert workspace_pass_rates(ws, ["other"]) == {}
        kept, _ = load_problems(DataSpec(level=1, difficulty_band=(0.1, 0.9)), pass_rates=rates)
    ids = {p.id for p in kept}
    assert b in ids and a not in ids and len(kept) == 255  # a (always solved) leaves; unmeasured 0.22 estimates stay
