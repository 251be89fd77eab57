"""The one home of pass@k and Avg@k (evotrainer/estimators.py), used by the trainer and harness.stats."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evotrainer.estimators import avg_at_k, mean_pass_at_k, pass_at_k
from evotrainer.harness import stats


def test_pass_at_k_rejects_counts_outside_the_samples():
    with pytest.raises(ValueError, match="c=5"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k=0"):
        pass_at_k(4, 1, 0)


def test_mean_pass_at_k_and_avg_at_k_by_hand():
    # (n=4, c=1) at k=2: 0.5; (n=4, c=0): 0 -> mean 0.25
    assert mean_pass_at_k([(4, 1), (4, 0)], 2) == pytest.approx(0.25)
    # row means 0.5 and 0.25 (the NaN sample of the second row is ignored: 1/4... of 3 real samples = 1/3)
    assert avg_at_k([[1, 0, 1, 0], [0, 0, 1, 0]]) == pytest.approx(0.375)
    assert avg_at_k([[1, 0, 1, 0], [0, 1, 0, math.nan]]) == pytest.approx((0.5 + 1 / 3) / 2)


def test_harness_stats_matrix_functions_are_the_core_estimators():
    rng = np.random.default_rng(0)
    m = {f"p{i}": rng.integers(0, 2, size=6).tolist() for i in range(9)}
    for k in (1, 3, 6):
        want = np.mean([pass_at_k(6, int(sum(v)), k) for v in m.values()])
        assert stats.pass_at_k(m, k) == want
    assert stats.avg_at_k(m) == avg_at_k(list(m.values()))
