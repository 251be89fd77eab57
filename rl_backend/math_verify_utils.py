"""Answer extraction and checking for math tasks: a numeric fast path, then HF ``math-verify``.

:func:`extract_answer` takes, in priority order, the last ``\\boxed{...}`` (nested braces
allowed; verl / MATH convention), the number after the last ``####`` (GSM8K convention), the text
after the last ``answer is`` / ``Answer:``, else the last number in the completion.
:func:`is_correct` compares numerically when both sides are plain numbers (commas, ``$`` and a
trailing period ignored; relative tolerance 1e-6), which covers arithmetic and GSM8K without
sympy; otherwise it calls ``math_verify.parse`` / ``math_verify.verify`` (Hugging Face
Math-Verify), whose results are cached. math-verify's timeouts use ``signal.alarm``, which only
works in the main thread; in other threads they are disabled.
"""

from __future__ import annotations

import functools
import logging
import re
import threading


class _NoTimeoutNotice(logging.Filter):
    """Drop math-verify's per-call notice that timeouts are off (we turn them off on purpose outside the main thread)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoTimeoutNotice())

_NUM = r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+"
_NUM_RE = re.compile(_NUM)
_ANSWER_IS = re.compile(r"(?:answer is|answer:)\s*([^\n]+)", re.IGNORECASE)
_HASH = re.compile(r"####\s*\$?\s*(" + _NUM + ")")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def extract_answer(text: str) -> tuple[str | None, str]:
    """The final answer of a completion and how it was found.

    Returns:
        ``(answer, kind)`` with kind ``boxed`` | ``hash`` | ``answer_is`` | ``last_number`` | ``none``.
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    hashes = _HASH.findall(text)
    if hashes:
        return hashes[-1], "hash"
    m = list(_ANSWER_IS.finditer(text))
    if m:
        return m[-1].group(1).strip().rstrip(". "), "answer_is"
    nums = _NUM_RE.findall(text)
    if nums:
        return nums[-1], "last_number"
    return None, "none"


def as_number(s: str | None) -> float | None:
    """``s`` as a float when it is a plain number (``$``, commas, spaces, trailing ``.`` ignored), else None."""
    if s is None:
        return None
    t = s.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")
    if t.startswith("\\$"):
        t = t[2:]
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", t):
        return None
    return float(t)


def _numbers_equal(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a))


@functools.lru_cache(maxsize=65536)
def _verify(gold: str, pred: str, main_thread: bool) -> bool:
    from math_verify import parse, verify

    timeout = 5 if main_thread else None
    g = parse(gold if ("$" in gold or "\\boxed" in gold) else f"${gold}$", parsing_timeout=timeout)
    if not g:
        g = parse(gold, parsing_timeout=timeout)
    p = parse(pred, parsing_timeout=timeout)
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=timeout))


def is_correct(completion: str, gold: str) -> bool:
    """Whether the completion's final answer equals the ground truth ``gold``.

    Numbers compare with relative tolerance 1e-6; anything else goes through math-verify
    (LaTeX / expression equivalence). A completion with no extractable answer is wrong.
    """
    pred, kind = extract_answer(completion)
    if pred is None:
        return False
    g, p = as_number(gold), as_number(pred)
    if p is None and kind == "answer_is" and g is not None:
        nums = _NUM_RE.findall(pred)
        p = as_number(nums[0]) if nums else None
    if g is not None and p is not None:
        return _numbers_equal(g, p)
    if kind == "boxed":
        target = f"\\boxed{{{pred}}}"
    elif kind == "answer_is":
        target = pred if "$" in pred else f"${pred}$"
    else:  # last number with a symbolic gold: let math-verify extract from the whole text
        target = completion
    return _verify(gold.strip(), target, threading.current_thread() is threading.main_thread())
