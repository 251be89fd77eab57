"""What every built-in rule module shares: the analyzer declaration, the shared thresholds, and the
helpers that turn a metric series into the numbers a rule judges (``harness/trends.py`` statistics).

A rule module (``builtin``, ``behaviour``, ``zero_variance``, ``progress``, ``swe``) declares its
analyzers in its own :class:`AnalyzerTable` named ``ANALYZERS``; ``analyzers/registry.py`` lists the
modules and registers their tables, so importing a rule module registers nothing and no rule module
imports the registry or another rule module.

Helpers (all public; a rule module never reaches another's private names):

* :func:`trend_of` / :func:`level_of`: the :class:`~evotrainer.harness.trends.Trend` /
  :class:`~evotrainer.harness.trends.Level` of one series of one version, or None when it is not logged;
* :func:`insufficient` / :func:`trend_or_note`: the "insufficient evidence" info finding of a
  trend-based rule with too few points;
* :func:`span`, :func:`trend_data`, :func:`level_data`: a finding's ``steps`` and ``data``;
* :func:`drop` and :func:`entropy_collapsed`: how a series fell to a fraction of its start (the rule of
  ``entropy_collapse``, which ``zero_variance_groups`` also reads to name a symptom).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from evotrainer import metrics as M
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding
from evotrainer.harness.trends import MIN_POINTS, Level, Trend, level, trend

AnalyzerFn = Callable[[Evidence], list[Finding]]

ALPHA = 0.01  # Mann-Kendall significance for "rising" / "falling"
CORRECTNESS = (M.CORRECT_MEAN, M.reward_component("correctness"))  # the correctness series, best first
ENTROPY_RATIO = 0.3  # late / early entropy at or below this: collapse
ENTROPY_FLOOR = 0.05  # nats per token: collapsed whatever the start
ZV_WARN, ZV_BLOCK = 0.5, 0.99  # late fraction of zero-variance groups
ZERO_STD_TOL = 5e-4  # a reward spread at or below this is 0 (half the last digit of verl's 3-decimal console values)


@dataclass
class AnalyzerSpec:
    """A registered analyzer."""

    name: str
    fn: AnalyzerFn
    kinds: tuple[str, ...] = ()
    description: str = ""
    builtin: bool = False
    code: str | None = None  # source of a sandboxed analyzer
    options: dict = field(default_factory=dict)


def first_line(doc: str | None) -> str:
    """The first line of a docstring (an analyzer's default description)."""
    return (doc or "").strip().split("\n")[0]


class AnalyzerTable:
    """The built-in analyzers one rule module declares, in declaration order.

    ``ANALYZERS = AnalyzerTable()`` then ``@ANALYZERS.analyzer(name, kinds, description)`` on each rule;
    ``analyzers/registry.py`` registers ``ANALYZERS.specs`` of every module in its built-in list.
    """

    def __init__(self) -> None:
        self.specs: list[AnalyzerSpec] = []

    def analyzer(self, name: str, kinds: tuple[str, ...] = (), description: str = "") -> Callable[[AnalyzerFn], AnalyzerFn]:
        """Decorator: declare ``fn`` as the built-in analyzer ``name`` (kinds default to ``(name,)``)."""

        def deco(fn: AnalyzerFn) -> AnalyzerFn:
            self.specs.append(AnalyzerSpec(name=name, fn=fn, kinds=tuple(kinds or (name,)),
                                           description=description or first_line(fn.__doc__), builtin=True))
            return fn

        return deco


def trend_of(ev: Evidence, v: str, name: str) -> Trend | None:
    """The trend of series ``name`` in version ``v`` (None when not logged or too short for a trend)."""
    steps, values = ev.series(v, name)
    return trend(steps, values) if len(steps) else None


def level_of(ev: Evidence, v: str, name: str) -> Level | None:
    """The recent level of series ``name`` in version ``v`` (None when not logged)."""
    steps, values = ev.series(v, name)
    return level(steps, values) if len(steps) else None


def insufficient(kind: str, v: str, name: str, ev: Evidence) -> Finding | None:
    """An info finding of ``kind`` when series ``name`` has 1 to ``MIN_POINTS - 1`` finite points, else None."""
    steps, values = ev.series(v, name)
    n = int(np.isfinite(values).sum())
    if 0 < n < MIN_POINTS:
        return Finding(kind=kind, severity="info", versions=[v], steps=[int(steps[0]), int(steps[-1])],
                       evidence=[name], data={"n_points": n}, judged="trend",
                       explanation=f"insufficient evidence: {name} has {n} finite point(s) in {v}; "
                                   f"{kind} needs at least {MIN_POINTS} to judge a trend")
    return None


def trend_or_note(ev: Evidence, v: str, kind: str, name: str, out: list[Finding]) -> Trend | None:
    """The trend of series ``name`` in version ``v``, or None; when None and the series has 1 to
    ``MIN_POINTS - 1`` finite points, an "insufficient evidence" info finding of ``kind`` is appended to ``out``."""
    t = trend_of(ev, v, name)
    if t is None and (f := insufficient(kind, v, name, ev)) is not None:
        out.append(f)
    return t


def span(t: Trend | Level) -> list[int]:
    """``[first step, last step]`` of a trend or level (a finding's ``steps``)."""
    return [t.first_step, t.last_step]


def trend_data(t: Trend) -> dict:
    """The numbers of a trend for a finding's ``data``."""
    return {"early": t.early, "late": t.late, "head": t.head, "tail": t.tail, "tau": t.tau, "p_value": t.p_value,
            "slope": t.slope, "change_step": t.change_step, "n_points": t.n, "start": t.start, "end": t.end,
            "start_until": t.start_until, "end_from": t.end_from, "n_segments": t.n_segments}


def level_data(lv: Level) -> dict:
    """The numbers of a level for a finding's ``data``."""
    return {"recent": lv.recent, "last": lv.last, "min": lv.lo, "max": lv.hi, "n_points": lv.n,
            "n_recent": lv.n_recent, "recent_from": lv.recent_from}


def drop(t: Trend, ratio: float, floor: float = 0.0) -> tuple[str, float, float] | None:
    """How a series fell to ``ratio`` of its start (or under ``floor`` from over twice it), or None.

    Returns ``(basis, start, end)``: ``"segments"`` when the last segment of the binary segmentation
    is at or below ``ratio`` of the first (a change, wherever in the run it happened), else
    ``"windows"`` when the median of the last 20% of points is at or below ``ratio`` of the first
    20% with a falling Mann-Kendall trend or a level shift to under half (the single change point).
    """
    def low(a: float, b: float) -> bool:
        return a > 0 and (b <= ratio * a or b <= floor < a / 2)

    if t.n_segments > 1 and low(t.start, t.end):
        return "segments", t.start, t.end
    if low(t.early, t.late) and (t.falling(ALPHA) or (t.change_step is not None and t.after < t.before / 2)):
        return "windows", t.early, t.late
    return None


def entropy_collapsed(t: Trend | None) -> bool:
    """Whether a policy-entropy trend collapsed (the rule of ``entropy_collapse``)."""
    return t is not None and drop(t, ENTROPY_RATIO, ENTROPY_FLOOR) is not None
