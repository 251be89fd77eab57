"""Estimators of k-sample evaluations: unbiased pass@k and Avg@k.

The one home of the formulas: the local trainer's evaluation (``rl_backend/local.py``) and the
harness's statistics over stored outcome matrices (``harness/stats.py``) both call them.

Source: pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", the HumanEval paper, eq. 1), ``1 - C(n-c, k) / C(n, k)`` for ``n`` samples of which
``c`` are correct, computed in the numerically stable product form of their Fig. 3,
``1 - prod_{i=n-c+1}^{n} (1 - k/i)``. Avg@k is the mean correctness of the k samples, averaged over
problems (the expected pass@1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` samples of which ``c`` are correct (Chen et al. 2021, eq. 1).

    Raises:
        ValueError: ``k`` outside ``1..n``, or ``c`` outside ``[0, n]``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"c={c}: the number of correct samples must lie in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: pass@k needs 1 <= k <= n={n} samples per problem")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems, from ``(n, c)`` per problem (NaN for none).

    Raises:
        ValueError: a problem with ``k > n`` samples or ``c`` outside ``[0, n]``.
    """
    return float(np.mean([pass_at_k(int(n), int(c), k) for n, c in counts]))


def avg_at_k(per_problem: Iterable[Sequence[float]]) -> float:
    """Avg@k: mean over problems of the mean correctness of each problem's samples (NaN samples ignored)."""
    return float(np.mean([np.nanmean(np.asarray(row, dtype=np.float64)) for row in per_problem]))
