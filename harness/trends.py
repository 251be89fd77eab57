"""Robust statistics of one metric series: early vs late windows, monotone trend, change point, spikes.

Analyzers judge trends over a run, never one step. For a series ``y`` over steps:

* early / late levels: medians of the first and last ``window`` fraction of finite points
  (at least 3 each), robust to single outliers;
* monotone trend: Mann-Kendall (Kendall's tau of ``y`` against time, ``scipy.stats.kendalltau``)
  and the Theil-Sen slope (``scipy.stats.theilslopes``; Sen 1968) on a series downsampled to at
  most ``max_points`` bin means (trends are about the shape, and this keeps 10k-step runs cheap);
* change point: the single split minimising the within-segment squared error (a mean shift;
  binary segmentation's first step, Scott & Knott 1974), computed with cumulative sums;
* spikes: points more than ``k`` robust standard deviations (1.4826 MAD) above a rolling median.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_POINTS = 8  # fewer finite points than this: "insufficient evidence"


@dataclass
class Trend:
    """Summary of one series (see module docstring). Steps are the run's step numbers."""

    n: int
    first_step: int
    last_step: int
    early: float
    late: float
    tau: float
    p_value: float
    slope: float  # Theil-Sen slope, units of the metric per step
    change_step: int | None
    before: float
    after: float
    head: float = float("nan")  # median of the first 5 finite points (the start of the run)
    tail: float = float("nan")  # median of the last 5

    @property
    def ratio(self) -> float:
        """``late / early`` (inf when early is 0 and late is not; NaN when both are 0)."""
        if self.early == 0:
            return np.nan if self.late == 0 else np.inf
        return self.late / self.early

    def rising(self, alpha: float = 0.01) -> bool:
        """Significant increasing monotone trend (Mann-Kendall p < alpha, tau > 0)."""
        return self.p_value < alpha and self.tau > 0

    def falling(self, alpha: float = 0.01) -> bool:
        """Significant decreasing monotone trend."""
        return self.p_value < alpha and self.tau < 0


def downsample(steps: np.ndarray, values: np.ndarray, max_points: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Bin means of at most ``max_points`` consecutive bins (finite values only), with their mean step."""
    ok = np.isfinite(values)
    steps, values = steps[ok], values[ok]
    n = len(values)
    if n <= max_points:
        return steps.astype(np.float64), values
    edges = np.linspace(0, n, max_points + 1).astype(int)
    counts = np.diff(edges)
    vsum = np.add.reduceat(values, edges[:-1])
    ssum = np.add.reduceat(steps.astype(np.float64), edges[:-1])
    return ssum / counts, vsum / counts


def change_point(y: np.ndarray, min_size: int = 3) -> tuple[int | None, float, float]:
    """Index splitting ``y`` into two segments with the least total squared error.

    Returns:
        ``(index of the first point after the change, mean before, mean after)``, or
        ``(None, mean, mean)`` when ``y`` has fewer than ``2 * min_size`` points.
    """
    n = len(y)
    if n < 2 * min_size:
        m = float(np.mean(y)) if n else np.nan
        return None, m, m
    c1 = np.cumsum(y)
    c2 = np.cumsum(y * y)
    k = np.arange(min_size, n - min_size + 1)  # left segment sizes
    left_sse = c2[k - 1] - c1[k - 1] ** 2 / k
    right_sse = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (n - k)
    best = int(k[np.argmin(left_sse + right_sse)])
    return best, float(np.mean(y[:best])), float(np.mean(y[best:]))


def trend(steps: np.ndarray, values: np.ndarray, window: float = 0.2, max_points: int = 400,
          min_points: int = MIN_POINTS) -> Trend | None:
    """Summarise a series; None when it has fewer than ``min_points`` finite values.

    Args:
        steps: ``(N,)`` step numbers, increasing.
        values: ``(N,)`` metric values (NaN / inf are ignored here; ``nan_blowup`` looks at them).
        window: fraction of points in the early and late windows.
    """
    from scipy import stats

    ok = np.isfinite(values)
    fs, fv = steps[ok], values[ok]
    if len(fv) < min_points:
        return None
    w = max(3, int(round(window * len(fv))))
    early, late = float(np.median(fv[:w])), float(np.median(fv[-w:]))
    xs, ys = downsample(fs, fv, max_points)
    if np.ptp(ys) == 0:
        tau, p, slope = 0.0, 1.0, 0.0
    else:
        res = stats.kendalltau(np.arange(len(ys)), ys)
        tau, p = float(res.statistic), float(res.pvalue)
        slope = float(stats.theilslopes(ys, xs).slope)
    idx, before, after = change_point(ys)
    cstep = None if idx is None else int(round(xs[idx]))
    return Trend(n=int(len(fv)), first_step=int(fs[0]), last_step=int(fs[-1]), early=early, late=late,
                 tau=tau, p_value=p, slope=slope, change_step=cstep, before=before, after=after,
                 head=float(np.median(fv[:5])), tail=float(np.median(fv[-5:])))


def spikes(values: np.ndarray, window: int = 25, k: float = 10.0, min_ratio: float = 3.0) -> np.ndarray:
    """Boolean mask of upward spikes: ``y > median + k * 1.4826 * MAD`` and ``y > min_ratio * median``.

    Median and MAD are over the preceding ``window`` finite points (trailing, so a spike does not
    hide itself). Non-finite points are never spikes (``nan_blowup`` reports them).
    """
    import pandas as pd

    y = pd.Series(values).where(np.isfinite(values))
    med = y.rolling(window, min_periods=5).median().shift(1)
    mad = (y - med).abs().rolling(window, min_periods=5).median().shift(1)
    scale = 1.4826 * mad
    floor = 1e-3 * med.abs() + 1e-12  # a flat history still needs a jump of min_ratio x
    mask = (y > med + k * np.maximum(scale, floor)) & (y > min_ratio * med.abs())
    return mask.fillna(False).to_numpy(dtype=bool)


def fmt(x: float) -> str:
    """Compact number for explanations: 3 significant digits."""
    if x is None or not np.isfinite(x):
        return str(x)
    return f"{x:.3g}"
