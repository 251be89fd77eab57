"""Metric points read from a run, bounded: every series thinned evenly over the run past a cap.

One rule for every reader of metrics (the foreign-run readers of ``harness/ingest.py`` and
``harness/ingest_formats.py``, :func:`evotrainer.tb_events.parse_tensorboard`, and
:meth:`evotrainer.lineage.LineageStore.all_metrics`): a file or a store holding more points than any real run
is *thinned*, not cut: every n-th step is kept, n doubling each time the cap is reached, so the whole run's
shape (first step to last) stays for the analyzers, which look at trends, and memory is bounded by the caps
instead of by the file's size. Review 11 (D-R11b, D-R11c): 1,000,000 one-metric records (a 25 MB JSONL,
``trainer_state.json`` or MLflow file) took 0.5-0.8 GB, and a ``lineage.db`` of 1,500,000 metric rows 0.6 GB.

The caps are far above real runs: verl's published example logs have 59 to 436 steps of up to 43 metrics each, and
long runs reach tens of thousands of steps of ~100 metrics (40,000 x 100 is :data:`MAX_METRIC_POINTS`); a log of
more than 100,000 logged steps of one file is not a training run we diagnose point by point.
"""

from __future__ import annotations

import warnings
from typing import Any

MAX_METRIC_STEPS = 100_000  # distinct steps kept per metrics file (per series in a run store); past it, thinned
MAX_METRIC_POINTS = 4_000_000  # values kept per metrics file (e.g. 40,000 steps x 100 metrics); past it, thinned
MAX_METRIC_SERIES = 10_000  # metric series of one version read from a run store (verl logs ~100); the first by name
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
    every point is kept (steps in any order, several additions to one step merge). Past either cap, every other
    held step (by rank) is dropped, and from then on a new step is kept only when it is at least ``gap`` steps
    after the last one held (``gap``: the mean spacing of the held steps; it doubles at each further thinning);
    an addition to a held step still merges. So a run of N steps keeps about ``max_steps / 2`` to ``max_steps``
    of them, evenly spread from its first step to its last (the last read is kept when it falls on the grid).
    A step that arrives out of order after thinning began is dropped.

    Attributes:
        read: points offered to :meth:`add` (values, all steps).
        dropped: points not kept (thinned out, or past :data:`MAX_STEP_METRICS` names in one step).
        points: values held now.
        gap: 0 while nothing was thinned, else the step spacing a new step needs (in steps).
    """

    def __init__(self, max_steps: int | None = None, max_points: int | None = None,
                 max_step_metrics: int | None = None) -> None:
        """The caps default to the module's :data:`MAX_METRIC_STEPS`, :data:`MAX_METRIC_POINTS` and
        :data:`MAX_STEP_METRICS` as they are when the records are made (at least 2 steps and 2 values)."""
        super().__init__()
        self.max_steps = max(2, MAX_METRIC_STEPS if max_steps is None else max_steps)
        self.max_points = max(2, MAX_METRIC_POINTS if max_points is None else max_points)
        self.max_step_metrics = max(1, MAX_STEP_METRICS if max_step_metrics is None else max_step_metrics)
        self.read = self.dropped = self.points = self.gap = 0
        self._last: int | None = None

    def add(self, step: int, name: str, value: float) -> None:
        """Keep ``value`` of ``name`` at ``step`` unless the thinning drops it (see the class docstring)."""
        self.read += 1
        rec = self.get(step)
        if rec is None:
            if self.gap and self._last is not None and step < self._last + self.gap:
                self.dropped += 1
                return
            rec = self[step] = {}
            self._last = step if self._last is None else max(self._last, step)
        if name not in rec:
            if len(rec) >= self.max_step_metrics:
                self.dropped += 1
                return
            self.points += 1
        rec[name] = value
        while len(self) > self.max_steps or self.points > self.max_points:
            if not self._thin():
                break

    def add_all(self, step: int, values: dict[str, float]) -> None:
        """:meth:`add` each ``{name: value}`` of one step."""
        for name, value in values.items():
            self.add(step, name, value)

    def _thin(self) -> bool:
        """Drop every other held step (by rank, the first kept); ``False`` when one step is left."""
        steps = sorted(self)
        if len(steps) < 2:
            return False
        for s in steps[1::2]:
            n = len(self.pop(s))
            self.points -= n
            self.dropped += n
        kept = steps[::2]
        self._last = kept[-1]
        mean = (kept[-1] - kept[0]) // (len(kept) - 1) if len(kept) > 1 else 1
        self.gap = max(2 * self.gap, mean, 1)
        return True

    def summary(self) -> str:
        """``"read R metric points, kept K (S steps, about 1 step in G, ...), D dropped"`` (for a warning)."""
        return (f"read {self.read:,} metric points, kept {self.points:,} ({len(self):,} steps, about 1 step in "
                f"{self.gap:,}, from the first to the last), {self.dropped:,} dropped")


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
