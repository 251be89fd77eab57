"""SWE tasks: the shipped set, the SWE-bench JSONL loader (with a local git clone), pytest parsing, the generator's mutations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer.rl_backend.swe.policies import snapshot_file
from evotrainer.rl_backend.swe.tasks import (
    TASKSET_DIR,
    SweTaskError,
    is_test_file,
    load_manifest,
    load_swebench_jsonl,
    load_taskset,
    materialize,
    parse_pytest_output,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import gen_swe_tasks as gen  # noqa: E402


def test_shipped_set_is_complete_and_recorded():
    tasks = load_taskset()
    assert len(tasks) >= 30
    assert len({t.instance_id for t in tasks}) == len(tasks)
    man = load_manifest()
    assert man["seed"] == 0 and man["n_tasks"] == len(tasks)
    names = {s["name"] for s in man["sources"]}
    assert names == {"inflection", "cachetools", "jmespath", "semver"}
    for s in man["sources"]:
        assert s["license"] in ("MIT", "BSD-3-Clause") and len(s["sdist_sha256"]) == 64
        assert (TASKSET_DIR / "repos" / s["snapshot"]).is_file()
    size = sum(p.stat().st_size for p in TASKSET_DIR.rglob("*") if p.is_file())
    assert size < 3_000_000, size  # "a few MB at most"
    for t in tasks:
        assert t.FAIL_TO_PASS and t.bug is not None and t.snapshot
        assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        clean = snapshot_file(t, t.bug.path)
        assert clean.count(t.bug.old) == 1  # the oracle's reverse edit is unambiguous
        assert t.problem_statement.count(t.FAIL_TO_PASS[0]) >= 1


def test_materialize_applies_the_bug_and_keeps_licences(tmp_path):
    t = load_taskset()[0]
    repo = materialize(t, tmp_path / "r")
    text = (repo / t.bug.path).read_text()
    assert t.bug.new in text and text.count(t.bug.new) == 1
    assert (repo / "LICENSE").is_file()
    with pytest.raises(SweTaskError, match="not empty"):
        materialize(t, repo)


def test_is_test_file():
    assert is_test_file("tests/test_lru.py") and is_test_file("test_inflection.py")
    assert is_test_file("pkg/conftest.py") and is_test_file("tests/helpers.py") and is_test_file("pytest.ini")
    assert not is_test_file("cachetools/__init__.py") and not is_test_file("semver/version.py")


def test_parse_pytest_output():
    out = """..F
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::TestK::test_two[x-1]
FAILED tests/test_a.py::test_three - AssertionError: assert 1 == 2
ERROR tests/test_b.py::test_four - fixture 'nope' not found
1 failed, 2 passed, 1 error in 0.1s"""
    outcomes, coll = parse_pytest_output(out)
    assert outcomes == {"tests/test_a.py::test_one": "PASSED", "tests/test_a.py::TestK::test_two[x-1]": "PASSED",
                        "tests/test_a.py::test_three": "FAILED", "tests/test_b.py::test_four": "ERROR"}
    assert coll is False
    _, coll = parse_pytest_output("ERROR tests/test_c.py - SyntaxError: invalid syntax\n1 error in 0.1s")
    assert coll is True  # a module-level ERROR is a collection error


def test_swebench_loader_reads_json_string_lists_and_names_missing_fields(tmp_path):
    row = {"instance_id": "o__n-1", "repo": "o/n", "base_commit": "abc", "problem_statement": "it breaks",
           "FAIL_TO_PASS": '["tests/test_x.py::test_a"]', "PASS_TO_PASS": "[]", "patch": "", "test_patch": ""}
    p = tmp_path / "swe.jsonl"
    p.write_text(json.dumps(row) + "\n")
    (t,) = load_swebench_jsonl(p)
    assert t.FAIL_TO_PASS == ["tests/test_x.py::test_a"] and t.PASS_TO_PASS == [] and t.snapshot is None
    p.write_text(json.dumps({k: v for k, v in row.items() if k != "FAIL_TO_PASS"}) + "\n")
    with pytest.raises(SweTaskError, match=r"swe.jsonl:1: missing field\(s\) \['FAIL_TO_PASS'\]"):
        load_swebench_jsonl(p)
    p.write_text("{not json\n")
    with pytest.raises(SweTaskError, match="swe.jsonl:1: not JSON"):
        load_swebench_jsonl(p)


def make_git_task(tmp_path: Path) -> tuple:
    """A SWE-bench-style task on a tiny local git repo: two bugs, a hidden test added by test_patch."""
    clone = tmp_path / "repos" / "acme__calc"
    (clone / "tests").mkdir(parents=True)
    (clone / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a + b\n")
    (clone / "tests" / "test_calc.py").write_text(
        "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == 6\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n")
    (clone / "pytest.ini").write_text("[pytest]\n")
    git = ["git", "-C", str(clone), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "base"], check=True)
    base = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    test_patch = ("--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -12,2 +12,6 @@\n def test_zero():\n"
                  "     assert add(0, 0) == 0\n+\n+\n+def test_hidden():\n+    assert add(1, 1) == 2\n")
    row = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base, "problem_statement": "add and mul",
           "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add", "tests/test_calc.py::test_mul",
                                       "tests/test_calc.py::test_hidden"]),
           "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_zero"]), "test_patch": test_patch}
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps(row) + "\n")
    return load_swebench_jsonl(p)[0], tmp_path / "repos"


def test_swebench_task_materializes_from_a_local_clone(tmp_path):
    task, repos = make_git_task(tmp_path)
    repo = materialize(task, tmp_path / "work", repos_root=repos)
    assert "return a - b" in (repo / "calc.py").read_text()
    assert not (repo / ".git").exists()
    with pytest.raises(SweTaskError, match="needs repos_root"):
        materialize(task, tmp_path / "w2")


def test_generator_mutations_and_unique_snippets():
    src = "def f(a, b):\n    if a < b and not a:\n        return a + 1\n    return True\n"
    sites = gen.mutation_sites(src)
    ops = sorted(op for _, op, _ in sites)
    # Compare a<b, BoolOp and, UnaryOp not, BinOp a+1, int 1, bool True
    assert ops == ["arith_swap", "bool_flip", "boolop_swap", "compare_swap", "drop_not", "int_plus_one"]
    text = dict((op, t) for _, op, t in sites)
    assert "if a <= b and not a:" in text["compare_swap"]
    assert "return a - 1" in text["arith_swap"] and "return False" in text["bool_flip"]
    clean = "x = 1\ny = 2\nx = 1\nz = 3\n"
    mutated = "x = 1\ny = 2\nx = 2\nz = 3\n"
    old, new = gen.unique_snippets(clean, mutated, 2)
    # line 2 alone ("x = 1") is not unique in clean; the window grows to lines 1..3
    assert (old, new) == ("y = 2\nx = 1\nz = 3\n", "y = 2\nx = 2\nz = 3\n")


def test_load_swe_problems_splits_by_project():
    from evotrainer.recipe import DataSpec
    from evotrainer.rl_backend.tasks import load_swe_problems

    train, held = load_swe_problems(DataSpec(task="swe", n_train=100, n_heldout=25, seed=0))
    # 4 projects, held-out share 25/125 -> round(0.8) = 1 project (9 tasks) held out, 27 train tasks
    assert (len(train), len(held)) == (27, 9)
    assert len({p.meta["repo"] for p in held}) == 1
    assert not {p.meta["repo"] for p in held} & {p.meta["repo"] for p in train}
    assert held[0].meta["task"] == "swe" and held[0].answer == held[0].id
    again, _ = load_swe_problems(DataSpec(task="swe", n_train=100, n_heldout=25, seed=0))
    assert [p.id for p in again] == [p.id for p in train]
