"""Metric points read from a run, bounded: every series thinned evenly over the run past a cap.

One rule for every reader of metrics (the foreign-run readers of ``harness/ingest.py`` and
``harness/ingest_formats.py``, :func:`evotrainer.tb_events.parse_tensorboard`, and
:meth:`evotrainer.lineage.LineageStore.all_metrics`): a file or a store holding more points than any real run
is *thinned*, not cut: the lowest step of each bucket of consecutive steps is kept, the buckets' width doubling
each time the cap is reached
(whatever order the steps arrive in), so the whole run's
shape (first step to last) stays for the analyzers, which look at trends, and memory is bounded by the caps
instead of by the file's size. Review 11 (D-R11b, D-R11c): 1,000,000 one-metric records (a 25 MB JSONL,
``trainer_state.json`` or MLflow file) took 0.5-0.8 GB, and a ``lineage.db`` of 1,500,000 metric rows 0.6 GB.
Review 12 (D-R12): at the caps, 4,000,000 values of 10,000 names (a 40 MB JSONL) took 1.11 GB and 4,000,000
one-point series (55 MB) 3.15 GB: a metrics file now keeps at most :data:`MAX_METRIC_SERIES` names, each held once,
and :data:`MAX_METRIC_POINTS` is 1,000,000 (290 MB and 200 MB in ``diagnose`` for those files).

The caps are far above real runs: verl's published example logs have 59 to 436 steps of up to 43 metrics each, and
long runs reach tens of thousands of steps of ~100 metrics (10,000 x 100 is :data:`MAX_METRIC_POINTS`; a longer
run is thinned evenly to 5,000-10,000 steps); a log of more than 100,000 logged steps of one file is not a training
run we diagnose point by point.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

MAX_METRIC_STEPS = 100_000  # distinct steps kept per metrics file (per series in a run store); past it, thinned
MAX_METRIC_POINTS = 1_000_000  # values kept per metrics file (e.g. 10,000 steps x 100 metrics); past it, thinned
MAX_METRIC_SERIES = 10_000  # metric series of a metrics file or run (by arrival) or of a run-store version (by name)
MAX_STEP_METRICS = 10_000  # metric names of one step (verl logs ~100-200); a step's further new names are dropped


class MetricsThinnedWarning(UserWarning):
    """A run store's metric series were thinned on reading, or rows of another SQL type skipped
    (:meth:`evotrainer.lineage.LineageStore.all_metrics`)."""


_NOTED: dict[Any, Any] = {}  # the warnings registry of :func:`note_thinned`


def note_thinned(msg: str) -> None:
    """Warn that metric points were thinned (a :class:`MetricsThinnedWarning`; once a process per message under
    the default filter), shown as ``evotrainer:0: MetricsThinnedWarning: <file>: ...`` on stderr."""
    warnings.warn_explicit(msg, MetricsThinnedWarning, "evotrainer", 0, module="evotrainer.points", registry=_NOTED)


class StepRecords(dict[int, dict[str, float]]):
    """Per-step records ``{step: {name: value}}`` that thin themselves evenly past the caps.

    Add points with :meth:`add`. While at most ``max_steps`` distinct steps and ``max_points`` values are held,
    every point is kept (steps in any order, several additions to one step merge). Past either cap the steps are
    put in buckets of ``gap`` consecutive steps (bucket ``(step - origin) // gap``, ``origin`` the lowest step held
    at the first thinning, the first ``gap`` twice the greatest common spacing of the steps held then, doubling at
    each later thinning), and each bucket keeps one step: the lowest offered to it. A later step is kept when its
    bucket is empty or it is below the bucket's step (which it replaces); an addition to a held step still merges.
    Once every step has arrived, the steps kept are the lowest of each bucket whatever the order they came in:
    review 12 (D-R12b) saw steps read in decreasing order keep only the last third of the run, and a fixed grid
    (``(step - origin) % gap == 0``, the fix of the session after it) still dropped every later step off that grid
    (a resumed run logging at another offset: steps 0, 4, 8, ... and then 1, 5, 9, ...). A run of N steps keeps
    about ``max_steps / 2`` to ``max_steps`` of them, evenly spread from its first step to its last.

    At most ``max_series`` distinct names are kept (the first by arrival, :data:`MAX_METRIC_SERIES`); the points
    of further names are dropped and counted in ``series_dropped`` (review 12, D-R12: 4,000,000 one-point
    series took 3.15 GB). Names are held once (one string per name, not one per point read).

    Attributes:
        read: points offered to :meth:`add` (values, all steps).
        dropped: points not kept (thinned out, past :data:`MAX_STEP_METRICS` names in one step, or of a name
            past ``max_series``).
        series_dropped: of ``dropped``, the points of names past ``max_series``.
        points: values held now.
        gap: 0 while nothing was thinned, else the width of a bucket (in steps): about one step in ``gap`` is kept.
    """

    def __init__(self, max_steps: int | None = None, max_points: int | None = None,
                 max_step_metrics: int | None = None, max_series: int | None = None) -> None:
        """The caps default to the module's :data:`MAX_METRIC_STEPS`, :data:`MAX_METRIC_POINTS`,
        :data:`MAX_STEP_METRICS` and :data:`MAX_METRIC_SERIES` as they are when the records are made (at least
        2 steps and 2 values)."""
        super().__init__()
        self.max_steps = max(2, MAX_METRIC_STEPS if max_steps is None else max_steps)
        self.max_points = max(2, MAX_METRIC_POINTS if max_points is None else max_points)
        self.max_step_metrics = max(1, MAX_STEP_METRICS if max_step_metrics is None else max_step_metrics)
        self.max_series = max(1, MAX_METRIC_SERIES if max_series is None else max_series)
        self.read = self.dropped = self.points = self.gap = self.series_dropped = 0
        self._origin = 0
        self._buckets: dict[int, int] = {}  # bucket -> the step it keeps, once thinned
        self._names: dict[str, str] = {}  # every name kept, held once

    def add(self, step: int, name: str, value: float) -> None:
        """Keep ``value`` of ``name`` at ``step`` unless the thinning drops it (see the class docstring)."""
        self.read += 1
        known = self._names.get(name)
        if known is None and len(self._names) >= self.max_series:
            self.dropped += 1
            self.series_dropped += 1
            return
        rec = self.get(step)
        if rec is None:
            if self.gap:
                b = (step - self._origin) // self.gap
                held = self._buckets.get(b)
                if held is not None and held < step:
                    self.dropped += 1
                    return
                if held is not None:  # a lower step of the bucket replaces the one held
                    self._drop(held)
                self._buckets[b] = step
            rec = self[step] = {}
        if known is None:
            known = self._names[name] = name
        if known not in rec:
            if len(rec) >= self.max_step_metrics:
                self.dropped += 1
                return
            self.points += 1
        rec[known] = value
        while len(self) > self.max_steps or self.points > self.max_points:
            if not self._thin():
                break

    def add_all(self, step: int, values: dict[str, float]) -> None:
        """:meth:`add` each ``{name: value}`` of one step."""
        for name, value in values.items():
            self.add(step, name, value)

    def _drop(self, step: int) -> None:
        """Forget held ``step`` and its values (counted in ``dropped``)."""
        n = len(self.pop(step))
        self.points -= n
        self.dropped += n

    def _thin(self) -> bool:
        """Double the bucket width, keeping the lowest step of each bucket; ``False`` when one step is left."""
        steps = sorted(self)
        if len(steps) < 2:
            return False
        if not self.gap:  # the first thinning: buckets of the held steps' common spacing, from the lowest step
            g = 0
            for s in steps:
                g = math.gcd(g, s - steps[0])
            self._origin, self.gap = steps[0], g
        self.gap *= 2
        self._buckets = {}
        for s in steps:  # ascending: the first step met in a bucket is its lowest
            b = (s - self._origin) // self.gap
            if b in self._buckets:
                self._drop(s)
            else:
                self._buckets[b] = s
        return True

    def summary(self) -> str:
        """``"read R metric points, kept K (S steps, about 1 step in G, ...), D dropped"`` (for a warning)."""
        more = (f"; {self.series_dropped:,} of them of series past the first {self.max_series:,} names "
                "(MAX_METRIC_SERIES)" if self.series_dropped else "")
        return (f"read {self.read:,} metric points, kept {self.points:,} ({len(self):,} steps, about 1 step in "
                f"{self.gap or 1:,}, from the first to the last), {self.dropped:,} dropped{more}")


def thin_series(rows: Any, max_points: int | None = None) -> tuple[list[tuple[int, float]], int]:
    """``([(step, value)], points dropped)`` of one series read in step order, thinned evenly past ``max_points``.

    ``rows`` yields ``(step, value)`` by step. Past ``max_points`` points (default :data:`MAX_METRIC_STEPS`), every other kept point is dropped and
    from then on only every ``stride``-th point read is kept (``stride`` doubling each time): at most
    ``max_points`` points, evenly spread over the whole series, and the memory of no more than that.
    """
    cap = max(2, MAX_METRIC_STEPS if max_points is None else max_points)
    out: list[tuple[int, float]] = []
    stride, n, dropped = 1, 0, 0
    for pt in rows:
        if n % stride == 0:
            out.append(pt)
            if len(out) > cap:
                dropped += len(out) - len(out[::2])
                out = out[::2]
                stride *= 2
        else:
            dropped += 1
        n += 1
    return out, dropped
