"""Text statistics of completions: n-gram repetition, distinct-n, duplicates across prompts.

Pure functions over decoded texts (no tokenizer, no I/O), the one home of each statistic: the
local trainer logs them per step (``completions/*`` names of :mod:`evotrainer.metrics`), the
``repetition`` reward component scores each completion with :func:`repeated_ngram_rate`, and the
harness recomputes them from stored rollouts for runs that did not log them.

Tokens are whitespace-separated words, so the statistics need no tokenizer and stay comparable
across models (a departure from model-token n-grams).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The word n-grams of ``words`` in order (empty when fewer than ``n`` words)."""
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def repeated_ngram_rate(text: str, n: int = 4) -> float:
    """Fraction of word n-grams that repeat an earlier n-gram: ``(count - distinct) / count`` (0 if none)."""
    grams = ngrams(text.split(), n)
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def repetition_rate(texts: Sequence[str], n: int = 4) -> float:
    """Mean over completions of :func:`repeated_ngram_rate` (repeats within the same completion).

    Completions with fewer than n words count as 0 (no repetition possible). NaN for an empty batch.
    """
    if not texts:
        return float("nan")
    return float(np.mean([repeated_ngram_rate(t, n) for t in texts]))


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Distinct-n: distinct n-grams / all n-grams over the batch (Li et al. 2016); NaN with no n-gram.

    1.0 means no n-gram repeats anywhere in the batch; near 0 means the batch says the same thing.
    """
    total, seen = 0, set()
    for t in texts:
        grams = ngrams(t.split(), n)
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else float("nan")


def duplicate_frac(completions: Sequence[str], prompt_ids: Sequence[Any]) -> float:
    """Fraction of completions identical (after whitespace strip) to a completion of another prompt in the batch.

    High values mean outputs no longer depend on the input (template collapse).
    """
    if not completions:
        return float("nan")
    prompts_of: dict[str, set] = {}
    keys = [c.strip() for c in completions]
    for k, p in zip(keys, prompt_ids, strict=True):
        prompts_of.setdefault(k, set()).add(p)
    return float(np.mean([len(prompts_of[k]) > 1 for k in keys]))
