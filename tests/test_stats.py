"""Avg@k, unbiased pass@k and paired statistics, checked by hand and against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from evotrainer import estimators
from evotrainer.harness.stats import (
    avg_at_k,
    compare_versions,
    paired_bootstrap_ci,
    paired_permutation_test,
    pass_at_k,
)


def test_avg_at_k_by_hand():
    # problem a: 2/4 correct, problem b: 1/4 -> (0.5 + 0.25) / 2 = 0.375
    assert avg_at_k({"a": [1, 0, 1, 0], "b": [0, 0, 0, 1]}) == pytest.approx(0.375)


def test_pass_at_k_unbiased_by_hand():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert estimators.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9
    assert estimators.pass_at_k(5, 2, 3) == pytest.approx(0.9)
    # n - c < k: every draw of k contains a correct sample
    assert estimators.pass_at_k(4, 3, 2) == 1.0
    assert estimators.pass_at_k(4, 0, 4) == 0.0
    # matrix: problem a (c=1 of 4) -> 0.5 at k=2, problem b (c=0) -> 0: mean 0.25
    assert pass_at_k({"a": [1, 0, 0, 0], "b": [0, 0, 0, 0]}, 2) == pytest.approx(0.25)
    # pass@1 equals Avg@k
    m = {"a": [1, 0, 1, 1], "b": [0, 1, 0, 0]}
    assert pass_at_k(m, 1) == pytest.approx(avg_at_k(m))


def test_pass_at_k_matches_comb_formula():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                want = 1.0 - (math.comb(n - c, k) / math.comb(n, k))
                assert estimators.pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_errors_name_the_rule():
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k({"a": [1, 0]}, 5)
    with pytest.raises(ValueError, match="empty"):
        avg_at_k({})


def test_paired_bootstrap_matches_scipy():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, 60)
    b = np.clip(a + rng.normal(0.05, 0.1, 60), 0, 1)
    gain, lo, hi = paired_bootstrap_ci(a, b, n_resamples=20_000, seed=3)
    ref = sps.bootstrap((a, b), lambda x, y, axis: np.mean(y - x, axis=axis), paired=True, n_resamples=20_000,
                        method="percentile", confidence_level=0.95, rng=np.random.default_rng(7))
    assert gain == pytest.approx(np.mean(b - a))
    # Different RNG streams: the percentile bounds agree to Monte-Carlo error (~0.002 here).
    assert lo == pytest.approx(ref.confidence_interval.low, abs=0.004)
    assert hi == pytest.approx(ref.confidence_interval.high, abs=0.004)
    # seeded: the same seed gives the same interval
    assert paired_bootstrap_ci(a, b, n_resamples=20_000, seed=3) == (gain, lo, hi)


def test_paired_permutation_exact_matches_scipy():
    # 10 pairs: 2^10 = 1024 <= n_resamples, so both enumerate all sign flips exactly.
    a = np.array([0.1, 0.5, 0.3, 0.2, 0.6, 0.4, 0.0, 0.7, 0.2, 0.3])
    b = np.array([0.3, 0.6, 0.3, 0.5, 0.6, 0.7, 0.1, 0.9, 0.1, 0.6])
    p = paired_permutation_test(a, b, n_resamples=10_000)
    ref = sps.permutation_test((a, b), lambda x, y, axis: np.mean(y - x, axis=axis), permutation_type="samples",
                               n_resamples=10_000, alternative="two-sided")
    assert p == pytest.approx(ref.pvalue, abs=1e-12)


def test_paired_permutation_monte_carlo_close_to_scipy():
    rng = np.random.default_rng(5)
    a = rng.uniform(0, 1, 40)
    b = a + rng.normal(0.03, 0.15, 40)
    p = paired_permutation_test(a, b, n_resamples=20_000, seed=1)
    ref = sps.permutation_test((a, b), lambda x, y, axis: np.mean(y - x, axis=axis), permutation_type="samples",
                               n_resamples=20_000, alternative="two-sided", rng=np.random.default_rng(2))
    assert p == pytest.approx(ref.pvalue, abs=0.015)


def test_compare_versions_on_common_problems():
    a = {"p1": [0, 0, 0, 0], "p2": [1, 0, 0, 0], "p3": [1, 1, 0, 0], "only_a": [1, 1, 1, 1]}
    b = {"p1": [1, 1, 0, 0], "p2": [1, 1, 1, 0], "p3": [1, 1, 1, 1], "only_b": [0, 0, 0, 0]}
    c = compare_versions(a, b, n_resamples=2000)
    # common p1..p3: a = (0 + .25 + .5)/3 = .25, b = (.5 + .75 + 1)/3 = .75, gain .5 (every pair +.5)
    assert c.n_problems == 3
    assert (c.score_a, c.score_b, c.gain) == pytest.approx((0.25, 0.75, 0.5))
    assert c.ci == pytest.approx((0.5, 0.5))  # every difference is 0.5: no spread
    # exact test over 2^3 = 8 flips: only all-plus and all-minus reach |mean| 0.5 -> p = 2 * 1/8
    assert c.p_value == pytest.approx(0.25)
    with pytest.raises(ValueError, match="no common problem"):
        compare_versions({"x": [1]}, {"y": [0]})


def test_resampling_memory_is_bounded_and_the_numbers_are_those_of_one_draw():
    # Review 3 (docs/security-probes.md, G-R3): gate_version(n_resamples=200_000) drew the whole (R, P) matrix at
    # once: 1.56 GB at 500 problems (an MCP client picks R up to 200,000; two calls at once doubled it). Drawn in
    # blocks of at most 2^21 cells now; numpy's Generator consumes its stream row-major, so the numbers are those
    # of the single draw, worked out here the old way.
    import tracemalloc

    from harness.stats import paired_bootstrap_ci, paired_permutation_test

    rng = np.random.default_rng(7)
    a, b = rng.random(100), rng.random(100)
    d = b - a
    old_means = d[np.random.default_rng(3).integers(0, 100, size=(50_000, 100))].mean(axis=1)
    alpha = (1 - 0.95) / 2
    lo, hi = np.quantile(old_means, [alpha, 1 - alpha])
    assert paired_bootstrap_ci(a, b, n_resamples=50_000, seed=3) == (float(d.mean()), float(lo), float(hi))
    null = (np.random.default_rng(3).choice((1.0, -1.0), size=(50_000, 100)) * d).mean(axis=1)
    gamma = abs(np.finfo(float).eps * 100 * d.mean())
    p = min(1.0, 2 * min((np.sum(null >= d.mean() - gamma) + 1) / 50_001, (np.sum(null <= d.mean() + gamma) + 1) / 50_001))
    assert paired_permutation_test(a, b, n_resamples=50_000, seed=3) == float(p)
    del old_means, null
    tracemalloc.start()
    try:
        paired_bootstrap_ci(a, b, n_resamples=200_000, seed=0)
        paired_permutation_test(a, b, n_resamples=200_000, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak {peak / 2**20:.0f} MiB (one draw: 2 x 153 MiB)"
