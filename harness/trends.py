"""Robust statistics of one metric series: levels, early vs late windows, segments, monotone trend, spikes.

Analyzers judge three things, and say which (``Finding.judged``):

* a **level** (:func:`level`): what the last logged steps show, visible from ONE step (a NaN, a clip
  ratio of 1.0, a batch whose rewards are all equal); no trend needed;
* a **change** (:class:`Trend` ``start`` / ``end`` and the change point): the level of the first
  segment of the run against the last one;
* a **trend** (:class:`Trend` Mann-Kendall / Theil-Sen): a monotone drift over the run, which needs
  at least :data:`MIN_POINTS` points ("insufficient evidence" below that).

For a series ``y`` over steps:

* early / late levels: medians of the first and last ``window`` fraction of finite points
  (at least 3 each), robust to single outliers;
* monotone trend: Mann-Kendall (Kendall's tau of ``y`` against time, ``scipy.stats.kendalltau``)
  and the Theil-Sen slope (``scipy.stats.theilslopes``; Sen 1968) on a series downsampled to at
  most ``max_points`` bin means (trends are about the shape, and this keeps 10k-step runs cheap);
* change point: the single split minimising the within-segment squared error (a mean shift;
  binary segmentation's first step, Scott & Knott 1974), computed with cumulative sums;
* segments (:func:`segments`): binary segmentation (Scott & Knott 1974; Killick, Fearnhead & Eckley
  2012 for the penalised form) of the downsampled series into mean-shift segments, each split kept
  only when it lowers the squared error by more than a BIC penalty ``2 sigma^2 log n`` (Yao 1988),
  with the noise ``sigma`` estimated from first differences (1.4826 MAD / sqrt 2, robust to the
  shifts themselves). ``Trend.start`` / ``Trend.end`` are the means of the first and last segment:
  a collapse in the first 3% of a 1000-step run is the first segment's end, not averaged away
  into medians of the first and last 20%;
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
    start: float = float("nan")  # mean of the first segment (see segments())
    end: float = float("nan")  # mean of the last segment
    start_until: int | None = None  # last step of the first segment
    end_from: int | None = None  # first step of the last segment
    n_segments: int = 1

    @property
    def shift_ratio(self) -> float:
        """``end / start`` of the first and last segments (inf when start is 0 and end is not)."""
        if self.start == 0:
            return np.nan if self.end == 0 else np.inf
        return self.end / self.start

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


def noise_sd(y: np.ndarray) -> float:
    """Robust noise scale of ``y``: 1.4826 MAD of its first differences / sqrt(2) (insensitive to level shifts)."""
    if len(y) < 3:
        return 0.0
    d = np.diff(y)
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))


def segments(y: np.ndarray, min_size: int = 3, max_segments: int = 8) -> list[int]:
    """Binary segmentation of ``y`` into mean-shift segments; returns the start index of each segment.

    A segment is split at its best point (:func:`change_point`) while the split lowers the squared
    error by more than the BIC penalty ``2 sigma^2 log n`` (sigma from :func:`noise_sd`; a floor of
    1e-6 of the series' spread keeps a noiseless series from splitting at every step), at most
    ``max_segments`` segments of at least ``min_size`` points. Cost: O(n) per split.

    Returns:
        ``[0, i1, i2, ...]``: sorted start indices (``[0]`` when nothing splits).
    """
    n = len(y)
    if n < 2 * min_size:
        return [0]
    sd = max(noise_sd(y), 1e-6 * (float(np.ptp(y)) or 1.0))
    pen = 2.0 * sd * sd * np.log(n)
    bounds = [(0, n)]
    starts = {0}
    while len(starts) < max_segments:
        best = None
        for a, b in bounds:
            seg = y[a:b]
            i, m1, m2 = change_point(seg, min_size)
            if i is None:
                continue
            gain = float(np.sum((seg - seg.mean()) ** 2) - np.sum((seg[:i] - m1) ** 2) - np.sum((seg[i:] - m2) ** 2))
            if gain > pen and (best is None or gain > best[0]):
                best = (gain, a, b, a + i)
        if best is None:
            break
        _, a, b, cut = best
        bounds.remove((a, b))
        bounds += [(a, cut), (cut, b)]
        starts.add(cut)
    return sorted(starts)


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
    cuts = segments(ys)
    first_end = cuts[1] if len(cuts) > 1 else len(ys)
    return Trend(n=int(len(fv)), first_step=int(fs[0]), last_step=int(fs[-1]), early=early, late=late,
                 tau=tau, p_value=p, slope=slope, change_step=cstep, before=before, after=after,
                 head=float(np.median(fv[:5])), tail=float(np.median(fv[-5:])),
                 start=float(np.mean(ys[:first_end])), end=float(np.mean(ys[cuts[-1]:])),
                 start_until=int(round(xs[first_end - 1])), end_from=int(round(xs[cuts[-1]])), n_segments=len(cuts))


@dataclass
class Level:
    """What the last logged steps of a series show: a judgement that needs no trend (one step is enough).

    ``recent`` is the median of the last ``min(n, max(3, window * n))`` finite points (so one point
    is its own level, and one outlier among many recent points is not); ``last`` is the last finite
    value; ``lo`` / ``hi`` the range over the run.
    """

    n: int
    first_step: int
    last_step: int
    recent: float
    last: float
    lo: float
    hi: float
    n_recent: int
    recent_from: int  # first step of the recent window


def level(steps: np.ndarray, values: np.ndarray, window: float = 0.2) -> Level | None:
    """The recent level of a series (finite values only); None when it has no finite value."""
    ok = np.isfinite(values)
    fs, fv = steps[ok], values[ok]
    if not len(fv):
        return None
    w = min(len(fv), max(3, int(round(window * len(fv)))))
    return Level(n=int(len(fv)), first_step=int(fs[0]), last_step=int(fs[-1]), recent=float(np.median(fv[-w:])),
                 last=float(fv[-1]), lo=float(fv.min()), hi=float(fv.max()), n_recent=int(w),
                 recent_from=int(fs[-w]))


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
