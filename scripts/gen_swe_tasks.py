"""Generate the shipped SWE task set from real PyPI projects by AST mutation (offline once downloaded).

For each source project (small, pure Python, permissive licence, tests in its sdist):

1. ``pip download --no-deps --no-binary :all: <name>==<version>`` into a temp dir (network is needed
   here only; the shipped set is self-contained), record the sdist's sha256;
2. copy the package, its tests and its licence into a clean snapshot with a bare ``pytest.ini``,
   run the whole suite (must pass) and store the snapshot as ``repos/<name>-<version>.tar.gz``;
3. enumerate single-line mutation sites in the chosen source files (comparison swap, arithmetic
   swap, and/or swap, dropped ``not``, integer +1, True/False flip), shuffle them with the seed, and
   try each: keep a mutant only if the suite still collects, 1..``max_f2p`` tests fail and every
   other test passes;
4. write the task: ``FAIL_TO_PASS`` = the failing tests, ``PASS_TO_PASS`` = the other tests of the
   same test files, the problem statement from the first failing test's output, the bug as an exact
   string replacement (``bug.old`` -> ``bug.new``) and the gold fix as a unified diff.

Usage: ``python scripts/gen_swe_tasks.py [--out rl_backend/data/swe_tasks] [--seed 0] [--per-project 9]``.
The run records everything it did in ``manifest.json`` (seed, sources, sha256s, attempts, rejections).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from evotrainer.rl_backend.swe.tasks import (
    TASKSET_DIR,
    BugSpec,
    SweTask,
    run_pytest,
    write_snapshot,
)

SOURCES: list[dict] = [
    {"name": "inflection", "version": "0.5.1", "license": "MIT",
     "copy": {"inflection": "inflection", "test_inflection.py": "test_inflection.py", "LICENSE": "LICENSE"},
     "mutate": ["inflection/__init__.py"]},
    {"name": "cachetools", "version": "5.5.0", "license": "MIT",
     "copy": {"src/cachetools": "cachetools", "tests": "tests", "LICENSE": "LICENSE"},
     "mutate": ["cachetools/__init__.py", "cachetools/keys.py", "cachetools/func.py"]},
    {"name": "jmespath", "version": "1.0.1", "license": "MIT",
     "copy": {"jmespath": "jmespath", "tests": "tests", "LICENSE.txt": "LICENSE.txt"},
     "mutate": ["jmespath/lexer.py", "jmespath/parser.py", "jmespath/functions.py", "jmespath/visitor.py"]},
    {"name": "semver", "version": "3.0.2", "license": "BSD-3-Clause",
     "copy": {"src/semver": "semver", "tests": "tests", "LICENSE.txt": "LICENSE.txt"},
     "mutate": ["semver/version.py"]},
]

SWAP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv}


def _mutants(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """(operator name, mutated copy) for one AST node; empty when the node is not a mutation site."""
    import copy

    out = []
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in SWAP_CMP:
        m = copy.deepcopy(node)
        m.ops = [SWAP_CMP[type(node.ops[0])]()]
        out.append(("compare_swap", m))
    elif isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
        m = copy.deepcopy(node)
        m.op = SWAP_BIN[type(node.op)]()
        out.append(("arith_swap", m))
    elif isinstance(node, ast.BoolOp):
        m = copy.deepcopy(node)
        m.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(("boolop_swap", m))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("drop_not", copy.deepcopy(node.operand)))
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        out.append(("bool_flip", ast.Constant(not node.value)))
    elif isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value < 1000:
        out.append(("int_plus_one", ast.Constant(node.value + 1)))
    return out


def mutation_sites(source: str) -> list[tuple[int, str, str]]:
    """All single-line mutants of a module: ``(line index, operator, mutated file text)``."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    doc_nodes = {id(n.body[0].value) for n in ast.walk(tree)
                 if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                 and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if id(node) in doc_nodes or not hasattr(node, "lineno") or node.lineno != getattr(node, "end_lineno", -1):
            continue
        for op, m in _mutants(node):
            i = node.lineno - 1
            raw = lines[i].encode()
            new_line = (raw[:node.col_offset] + ast.unparse(m).encode() + raw[node.end_col_offset:]).decode()
            if new_line == lines[i]:
                continue
            text = "".join(lines[:i] + [new_line] + lines[i + 1:])
            try:
                compile(text, "<mutant>", "exec")
            except SyntaxError:
                continue
            out.append((i, op, text))
    return out


def unique_snippets(clean: str, mutated: str, i: int) -> tuple[str, str]:
    """Smallest line window around line ``i`` whose clean text is unique in ``clean`` and mutated text in ``mutated``."""
    a, b = clean.splitlines(keepends=True), mutated.splitlines(keepends=True)
    lo, hi = i, i + 1
    while True:
        old, new = "".join(a[lo:hi]), "".join(b[lo:hi])
        if clean.count(old) == 1 and mutated.count(new) == 1:
            return old, new
        if lo == 0 and hi >= len(a):
            raise ValueError("no unique window")
        lo, hi = max(0, lo - 1), min(len(a), hi + 1)


def failure_section(output: str, node_id: str) -> str:
    """The ``--tb=short`` section of the first failure in pytest output (header and traceback)."""
    m = re.search(r"^=+ FAILURES =+$(.*?)(?=^=+ .* =+$)", output, re.S | re.M)
    body = m.group(1) if m else output
    parts = re.split(r"^(_{3,} .* _{3,})$", body, flags=re.M)
    sections = [(parts[k], parts[k + 1]) for k in range(1, len(parts) - 1, 2)]
    if not sections:
        return body.strip()[-2000:]
    head, text = sections[0]
    lines = text.strip("\n").splitlines()
    if len(lines) > 30:
        lines = lines[:12] + ["    ..."] + lines[-17:]
    return head.strip("_ ").strip() + "\n" + "\n".join(lines)


def problem_statement(project: str, f2p: list[str], output: str) -> str:
    """An issue text written from the failing tests and the first failure's traceback."""
    shown = "\n".join(f"- {t}" for t in f2p[:8]) + ("\n- ..." if len(f2p) > 8 else "")
    return (f"Bug report for {project}: after a recent change, these tests fail:\n{shown}\n\n"
            f"Output of `pytest {f2p[0]}`:\n```\n{failure_section(output, f2p[0])}\n```\n"
            "Find and fix the bug in the library code so that the failing tests pass again and all other "
            "tests keep passing. Do not modify the tests.")


def download(name: str, version: str, tmp: Path) -> tuple[Path, Path]:
    """The sdist of ``name==version`` from PyPI (``pip download``), extracted: ``(sdist file, project folder)``."""
    dl = tmp / "dl"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
           f"{name}=={version}", "-d", str(dl)]
    subprocess.run(cmd, check=True, timeout=300)
    sdist = next(p for p in dl.iterdir() if p.name.lower().startswith(name.lower().replace("_", "-"))
                 or p.name.lower().startswith(name.lower()))
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "src", filter="data")
    return sdist, next((tmp / "src").iterdir())


def build_project(src: dict, tmp: Path, out: Path, rng: random.Random, per_project: int, max_f2p: int,
                  max_attempts: int) -> tuple[list[SweTask], dict]:
    """Download one project, snapshot it, and mutate it into at most ``per_project`` tasks."""
    name, version = src["name"], src["version"]
    sdist, proj = download(name, version, tmp)
    snap = tmp / "snapshot"
    snap.mkdir()
    for a, b in src["copy"].items():
        (shutil.copytree if (proj / a).is_dir() else shutil.copy2)(proj / a, snap / b)
    (snap / "pytest.ini").write_text("[pytest]\n")
    base = run_pytest(snap, sandbox=False, timeout_s=300)
    passing = {t for t, o in base.outcomes.items() if o == "PASSED"}
    if base.collection_error or not passing:
        raise SystemExit(f"{name}: baseline suite does not run cleanly:\n{base.output[-2000:]}")
    snap_name = f"{name}-{version}.tar.gz"
    snap_sha = write_snapshot(snap, out / "repos" / snap_name)
    timeout = max(30.0, 4 * base.wall_s)

    sites = [(path, i, op, text) for path in src["mutate"]
             for i, op, text in mutation_sites((snap / path).read_text())]
    rng.shuffle(sites)
    tasks, rejected, tried, seen_lines = [], {}, 0, set()
    for path, i, op, text in sites:
        if len(tasks) >= per_project or tried >= max_attempts:
            break
        if (path, i) in seen_lines:
            continue
        tried += 1
        f = snap / path
        clean = f.read_text()
        f.write_text(text)
        try:
            res = run_pytest(snap, sandbox=False, timeout_s=timeout)
        finally:
            f.write_text(clean)
        failed = sorted(t for t in passing if res.outcomes.get(t) != "PASSED")
        reason = ("timeout" if res.timed_out else "collection_error" if res.collection_error
                  else "survived" if not failed else f"over_{max_f2p}_failures" if len(failed) > max_f2p else "")
        if reason:
            rejected[reason] = rejected.get(reason, 0) + 1
            continue
        seen_lines.add((path, i))
        files = {t.split("::")[0] for t in failed}
        p2p = sorted(t for t in passing if t.split("::")[0] in files and t not in failed)
        old, new = unique_snippets(clean, text, i)
        patch = "".join(difflib.unified_diff(text.splitlines(keepends=True), clean.splitlines(keepends=True),
                                             f"a/{path}", f"b/{path}"))
        tasks.append(SweTask(
            instance_id=f"{name}-{version}__{len(tasks):03d}", repo=name, base_commit=snap_sha[:12],
            problem_statement=problem_statement(name, failed, res.output), FAIL_TO_PASS=failed,
            PASS_TO_PASS=p2p, patch=patch, snapshot=snap_name,
            bug=BugSpec(path=path, old=old, new=new, operator=op),
            meta={"project": name, "version": version, "line": i + 1, "license": src["license"]}))
    record = {"name": name, "version": version, "license": src["license"], "sdist": sdist.name,
              "sdist_sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
              "download": f"pip download --no-deps --no-binary :all: {name}=={version}",
              "copied": src["copy"], "mutated_files": src["mutate"], "snapshot": snap_name,
              "snapshot_sha256": snap_sha, "baseline_tests": len(passing), "baseline_seconds": round(base.wall_s, 2),
              "mutation_sites": len(sites), "attempts": tried, "kept": len(tasks), "rejected": rejected}
    return tasks, record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=TASKSET_DIR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-project", type=int, default=9)
    ap.add_argument("--max-f2p", type=int, default=6, help="Reject mutants failing more tests than this.")
    ap.add_argument("--max-attempts", type=int, default=40, help="Mutants tried per project at most.")
    ap.add_argument("--only", default=None, help="Comma-separated project names (default: all).")
    args = ap.parse_args()
    t0 = time.time()
    out: Path = args.out
    if (out / "repos").exists():
        shutil.rmtree(out / "repos")
    all_tasks, records = [], []
    for src in SOURCES:
        if args.only and src["name"] not in args.only.split(","):
            continue
        rng = random.Random(f"{args.seed}-{src['name']}")
        with tempfile.TemporaryDirectory() as d:
            tasks, rec = build_project(src, Path(d), out, rng, args.per_project, args.max_f2p, args.max_attempts)
        print(f"{src['name']}: kept {rec['kept']} of {rec['attempts']} mutants tried ({rec['rejected']})", flush=True)
        all_tasks += tasks
        records.append(rec)
    (out / "tasks.jsonl").write_text("".join(t.model_dump_json(exclude_defaults=False) + "\n" for t in all_tasks))
    manifest = {"generator": "scripts/gen_swe_tasks.py", "seed": args.seed, "per_project": args.per_project,
                "max_f2p": args.max_f2p, "max_attempts": args.max_attempts, "n_tasks": len(all_tasks),
                "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "python": sys.version.split()[0], "pytest": __import__("pytest").__version__,
                "seconds": round(time.time() - t0, 1), "sources": records}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {len(all_tasks)} tasks to {out} in {manifest['seconds']} s")


if __name__ == "__main__":
    main()
