"""Offline analyzer synthesis: a search over a typed space of analyzer programs, kept only out of sample.

A :class:`Program` is one rule "``stat`` of ``series`` over ``window`` is ``above`` / ``below``
``threshold``" (statistics in :data:`STATS`). Every step-metric of ``evotrainer/metrics.py`` a version
has is a candidate series, rollout features included (``Evidence.series`` derives them from stored
rollouts: distinct-2, repetition, clipped ratio, ...). ``eval/*`` is left out (it is the outcome being
predicted), so are ``perf/*`` and ``policy/lr`` (settings and machine speed, not training dynamics).

Search (:func:`synthesize`): for the N labelled examples (a version and whether it turned out bad),
every (series, stat, window) gives an ``(N,)`` feature; every threshold between two sorted values (at
most :data:`MAX_THRESHOLDS`, spread evenly) and both directions is a candidate rule, scored by Youden's
J = TPR - FPR (Youden 1950). The keep rule (:data:`KEEP_RULE`) asks for three things at once:

1. enough labels: at least :data:`MIN_PER_CLASS` bad and good examples;
2. not by chance among many: a permutation test of the best in-sample J (labels shuffled, the search
   rerun, the max over every candidate each time: the max-statistic correction of Westfall & Young
   1993), p = (1 + #{J_perm >= J}) / (1 + P) (Phipson & Smyth 2010) at most :data:`ALPHA`;
3. out of sample: leave-one-out, the whole search rerun without example i and its rule applied to i;
   the held-out predictions' J must reach :data:`MIN_LOO_J` (run only for a rule that passes 2).

Labels are treated as exchangeable; versions of one run share a parent and a model, so pooled labels
(:class:`Example` ``source="memory"``, remembered by earlier runs) are not independent draws, and p is
optimistic to that extent.

A kept rule compiles (:func:`compile_program`) to the sandboxed analyzer contract of
``harness/analyzers/registry.py`` (``run_analyzer_code``: stdlib Python, reads ``$EVIDENCE_DIR/metrics.json``
and ``meta.json``, prints findings JSON). The in-process search and the compiled code share one
feature function (:data:`FEATURE_SRC`, exec'd here and pasted there), so a rule fires in the sandbox
on exactly the versions the search predicted.

:func:`early_stop` is the budget use of a kept analyzer: when it fires on a branch's mid-training
evidence and its out-of-sample plus in-use record is good enough, the branch can stop early.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evotrainer import metrics as M
from evotrainer.errors import EvoTrainerError
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.ingest import ingest

STATS: tuple[str, ...] = ("level", "change", "slope", "change_point", "ratio_start", "ratio_parent", "quantile")
WINDOWS: tuple[float, ...] = (0.25, 0.5)  # fraction of the version's points (at least 2 points)
QUANTILES: tuple[float, ...] = (0.1, 0.9)
MIN_POINTS = 4  # the most points a statistic needs (change_point); see MIN_POINTS_BY_STAT in FEATURE_SRC
MIN_PER_CLASS = 3  # bad and good examples each; below it no verdict is possible
MIN_LOO_J = 0.5  # leave-one-out Youden J: balanced accuracy >= 0.75 on examples the search did not see
ALPHA = 0.05  # permutation p-value of the best score over all candidates
N_PERMUTATIONS = 499
PERMUTATION_CHUNK = 50  # shuffles per batch; stop once p > ALPHA is certain (Besag & Clifford 1991)
MAX_THRESHOLDS = 32  # thresholds per (series, stat, window) when there are more labels
MIN_COVERAGE = 0.5  # a series must be present in at least half the examples to be searched
EXCLUDED_PREFIXES = ("eval/", "perf/")
EXCLUDED = (M.POLICY_LR,)
KEEP_RULE = (f"at least {MIN_PER_CLASS} bad and {MIN_PER_CLASS} good labels; leave-one-out Youden J >= {MIN_LOO_J}; "
             f"permutation p (max over all candidates, labels shuffled) <= {ALPHA}")

# The feature function, stdlib only: exec'd for the search and pasted into compiled analyzers.
FEATURE_SRC = r'''
def _median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

def _quantile(xs, q):
    s = sorted(xs)  # linear interpolation between order statistics (numpy's default method)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])

def _k(n, window):
    return min(n, max(2, int(-(-window * n // 1))))

# points a statistic needs to be defined and not degenerate: a level or quantile of the last window is one
# point's value; change and ratio_start compare the first and last windows (at least 2 points each, so 3 for
# them to differ); a slope needs 3 for a residual; a change point a split with 2 points on each side (4)
MIN_POINTS_BY_STAT = {"level": 1, "quantile": 1, "ratio_parent": 1, "change": 3, "ratio_start": 3, "slope": 3,
                      "change_point": 4}

def feature(stat, window, q, pts, parent_pts, min_points=None):
    """stat of [(step, value)] (finite values, sorted by step); None when undefined (fewer points than
    MIN_POINTS_BY_STAT[stat], or min_points when given)."""
    if stat not in MIN_POINTS_BY_STAT:
        raise ValueError("unknown stat " + repr(stat))
    if min_points is None:
        min_points = MIN_POINTS_BY_STAT[stat]
    if len(pts) < min_points:
        return None
    vals = [v for _, v in pts]
    k = _k(len(vals), window)
    last, first = vals[-k:], vals[:k]
    if stat == "level":
        return _median(last)
    if stat == "change":
        return _median(last) - _median(first)
    if stat == "quantile":
        return _quantile(last, q)
    if stat == "ratio_start":
        ref = _median(first)
        return _median(last) / ref if abs(ref) > 1e-12 else None
    if stat == "ratio_parent":
        if len(parent_pts) < min_points:
            return None
        pv = [v for _, v in parent_pts]
        ref = _median(pv[-_k(len(pv), window):])
        return _median(last) / ref if abs(ref) > 1e-12 else None
    if stat == "slope":  # least squares, value units per step
        xs = [float(s) for s, _ in pts]
        mx, my = sum(xs) / len(xs), sum(vals) / len(vals)
        sxx = sum((x - mx) ** 2 for x in xs)
        return sum((x - mx) * (y - my) for x, y in zip(xs, vals)) / sxx if sxx > 0 else None
    if stat == "change_point":  # signed mean shift at the best single split (binary segmentation, L2 cost)
        n, best, shift = len(vals), -1.0, None
        for i in range(2, n - 1):
            a, b = vals[:i], vals[i:]
            d = sum(b) / len(b) - sum(a) / len(a)
            gain = i * (n - i) / n * d * d
            if gain > best:
                best, shift = gain, d
        return shift
    raise ValueError("unknown stat " + repr(stat))
'''
_NS: dict[str, Any] = {}
exec(compile(FEATURE_SRC, "<synthesis features>", "exec"), _NS)  # noqa: S102 (our own source, shared with the sandbox)
feature = _NS["feature"]


class SynthesisError(EvoTrainerError, ValueError):
    """Bad synthesis input: no labels, unknown statistic, malformed program."""


# A series name or finding kind goes into the compiled analyzer's source (a comment line): a metric name from a
# foreign run (JSONL keys, TensorBoard tags may hold any character) with a newline became code there.
SERIES_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")


def _number(name: str, value: Any) -> float:
    """``value`` as a finite float, or a :class:`SynthesisError` naming the program field ``name``."""
    try:
        x = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an int past a float's range
        x = math.inf
    if not math.isfinite(x):
        big = isinstance(value, int) and not isinstance(value, bool)
        shown = f"an integer of {value.bit_length():,} bits" if big else repr(value)
        shown = shown if len(shown) <= 80 else f"{shown[:80]}... ({len(shown):,} characters)"
        raise SynthesisError(f"{name}={shown}: need a finite number (not a string, NaN or infinity), e.g. 0.5")
    return x


@dataclass(frozen=True)
class Program:
    """One analyzer rule: ``stat(series, window[, q])`` ``direction`` ``threshold`` → a finding of ``kind``."""

    series: str
    stat: str
    window: float
    direction: str  # "above" | "below"
    threshold: float
    q: float | None = None
    kind: str = "predicted_regression"

    def __post_init__(self) -> None:
        if not isinstance(self.series, str) or not SERIES_NAME.fullmatch(self.series):
            raise SynthesisError(f"series={self.series!r}: a metric name of letters, digits and _ . / : - only "
                                 "(it is written into the analyzer's source)")
        if not isinstance(self.kind, str) or not SERIES_NAME.fullmatch(self.kind):
            raise SynthesisError(f"kind={self.kind!r}: a finding kind of letters, digits and _ . / : - only")
        if self.stat not in STATS:
            raise SynthesisError(f"stat={self.stat!r}: use one of {', '.join(STATS)}")
        if self.direction not in ("above", "below"):
            raise SynthesisError(f"direction={self.direction!r}: use 'above' or 'below'")
        # The numbers go into the analyzer's source too (``describe()`` on a comment line, ``PROGRAM`` as a repr): a
        # string ``q`` with a newline became a line of code there (review 10, Y-R10); each is a finite float here.
        window = _number("window", self.window)
        if not 0 < window <= 1:
            raise SynthesisError(f"window={window}: a fraction of the series in (0, 1]")
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "threshold", _number("threshold", self.threshold))
        if self.q is not None:
            q = _number("q", self.q)
            if not 0 <= q <= 1:
                raise SynthesisError(f"q={q}: a quantile in [0, 1] (or null outside stat 'quantile')")
            object.__setattr__(self, "q", q)

    def describe(self) -> str:
        """``ratio_start(policy/entropy, last 25%) below 0.45``."""
        q = f", q={self.q}" if self.stat == "quantile" else ""
        return f"{self.stat}({self.series}, window {self.window:.0%}{q}) {self.direction} {self.threshold:.4g}"

    @property
    def name(self) -> str:
        """Registry name (snake_case, unique per program): ``synth_policy_entropy_ratio_start_below_1a2b3c``."""
        slug = re.sub(r"[^a-z0-9]+", "_", self.series.lower()).strip("_")[:40]
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:6]
        return f"synth_{slug}_{self.stat}_{self.direction}_{digest}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Program:
        """From :meth:`to_dict`.

        Raises:
            SynthesisError: a missing or bad field.
        """
        try:
            return cls(**{k: d[k] for k in ("series", "stat", "window", "direction", "threshold")},
                       q=d.get("q"), kind=d.get("kind", "predicted_regression"))
        except KeyError as exc:
            raise SynthesisError(f"program {dict(d)}: missing field {exc}") from None

    def value(self, ev: Evidence, version: str) -> float | None:
        """The program's statistic on one version, or None."""
        parent = ev.parents.get(version)
        return feature(self.stat, self.window, self.q, points(ev, version, self.series),
                       points(ev, parent, self.series) if parent else [])

    def fires(self, ev: Evidence, version: str) -> bool:
        """Whether the rule fires on ``version`` (a missing statistic never fires)."""
        x = self.value(ev, version)
        return x is not None and (x > self.threshold if self.direction == "above" else x < self.threshold)


def points(ev: Evidence, version: str | None, name: str) -> list[tuple[int, float]]:
    """Finite ``(step, value)`` pairs of one series, sorted by step (what the compiled code reads)."""
    if version is None:
        return []
    steps, values = ev.series(version, name)
    ok = np.isfinite(values)
    return list(zip(steps[ok].tolist(), values[ok].tolist(), strict=True))


@dataclass
class Example:
    """One labelled version: its evidence, whether it turned out bad, where the label comes from."""

    evidence: Evidence | None
    version: str
    bad: bool
    source: str = "lineage"  # lineage | case | fault | synthetic | memory
    features: dict[str, float] | None = None  # precomputed {feature_key: value} (an example remembered by a run)

    def series_names(self) -> list[str]:
        """Series this example has (from its evidence, or the keys of its remembered features)."""
        if self.features is not None:
            return sorted({k.split("|", 1)[0] for k in self.features})
        return self.evidence.metric_names(self.version) if self.evidence is not None else []


def feature_key(base: tuple[str, str, float, float | None]) -> str:
    """``series|stat|window|q`` (q empty unless a quantile), the key of a remembered feature."""
    s, stat, w, q = base
    return f"{s}|{stat}|{w}|{'' if q is None else q}"


def example_features(ex: Example, series: list[str] | None = None) -> dict[str, float]:
    """Every defined base statistic of one example's version, by :func:`feature_key` (what a run remembers)."""
    names = series if series is not None else [n for n in candidate_series([ex])]
    F = feature_matrix([ex], _bases(names))
    return {feature_key(b): float(x) for b, x in zip(_bases(names), F[:, 0], strict=True) if np.isfinite(x)}


def lineage_examples(ev: Evidence, labels: Mapping[str, bool], source: str = "lineage") -> list[Example]:
    """Examples of a run's versions of known outcome (``{version: True if bad}``)."""
    return [Example(ev, v, bool(b), source) for v, b in labels.items() if v in ev.versions]


def _dotted(d: Mapping[str, Any] | None, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, Mapping) or part not in d:
            return None
        d = d[part]
    return d


def fault_examples(ev: Evidence, fault: Mapping[str, Any] | None, source: str = "fault") -> list[Example]:
    """Examples of a run's versions by a seeded fault (``{recipe path: seeded value}``).

    A version is bad when its recipe still has every seeded value (the fault is in it), good when at least one
    path differs (the fault was fixed, e.g. ``generate_max_len`` 4 -> 8). ``fault`` None or empty: the run has
    no seeded fault of this kind, and each of its versions is good (a default run's versions do not truncate at 4
    tokens). A version without a recorded recipe (an imported run) is no example.

    Raises:
        SynthesisError: a path of ``fault`` that no version's recipe has (a typo would label every version good).
    """
    out = []
    for vid in ev.versions:
        recipe = ev.recipes.get(vid)
        if recipe is None:
            continue
        bad = bool(fault) and all(_dotted(recipe, p) == val for p, val in (fault or {}).items())
        out.append(Example(ev, vid, bad, source))
    for p in fault or {}:
        if out and all(_dotted(ev.recipes[e.version], p) is None for e in out):
            raise SynthesisError(f"fault path {p!r} is in no version's recipe; use a dotted recipe path "
                                 "(e.g. 'generate_max_len', 'reward.format_token.weight')")
    return out


def case_examples(cases_dir: str | Path, kind: str | None = None) -> list[Example]:
    """Examples of the real-case corpus (``<case>/expected.json`` with ``must`` / ``must_not``).

    With ``kind``: a case is bad when ``kind`` is in ``must``, good when it is in ``must_not``, else
    unused. Without: the labels of all failure kinds pooled: a case is bad when its ``must`` names any failure,
    good when it names none (a healthy run: its ``must_not`` lists what it does not have). One case is one run
    of one framework, so the pooled labels are one per run.
    """
    out = []
    for case in sorted(p for p in Path(cases_dir).iterdir() if (p / "expected.json").exists()):
        exp = json.loads((case / "expected.json").read_text())
        if kind is None:
            label = bool(exp.get("must"))
        else:
            label = True if kind in exp.get("must", []) else False if kind in exp.get("must_not", []) else None
        if label is None:
            continue
        ev = ingest(case)
        out += [Example(ev, v, label, "case") for v in ev.versions]
    return out


def candidate_series(examples: list[Example]) -> list[str]:
    """Series present in at least :data:`MIN_COVERAGE` of the examples, metrics.py names only, sorted."""
    known = set(M.ALL_STEP_METRICS)
    pattern = re.compile(r"(reward/[^/\s]+/(mean|std)|tools/calls/[^/\s]+_mean)")
    counts: dict[str, int] = {}
    for ex in examples:
        for n in ex.series_names():
            if ((n in known or (pattern.fullmatch(n) and SERIES_NAME.fullmatch(n))) and n not in EXCLUDED
                    and not n.startswith(EXCLUDED_PREFIXES)):
                counts[n] = counts.get(n, 0) + 1
    return sorted(n for n, c in counts.items() if c >= MIN_COVERAGE * len(examples))


def _bases(series: list[str]) -> list[tuple[str, str, float, float | None]]:
    out = []
    for s in series:
        for stat in STATS:
            for w in WINDOWS:
                for q in (QUANTILES if stat == "quantile" else (None,)):
                    out.append((s, stat, w, q))
    return out


def feature_matrix(examples: list[Example], bases: list[tuple]) -> np.ndarray:
    """``(B, N)`` float64: base statistic b on example n (NaN where undefined)."""
    F = np.full((len(bases), len(examples)), np.nan)
    keys = [feature_key(b) for b in bases]
    for j, ex in enumerate(examples):
        if ex.features is not None or ex.evidence is None:
            F[:, j] = [(ex.features or {}).get(k, np.nan) for k in keys]
            continue
        ev, v = ex.evidence, ex.version
        parent = ev.parents.get(v)
        cache: dict[str, tuple[list, list]] = {}
        for i, (s, stat, w, q) in enumerate(bases):
            if s not in cache:
                cache[s] = (points(ev, v, s), points(ev, parent, s) if parent else [])
            x = feature(stat, w, q, *cache[s])
            if x is not None and math.isfinite(x):
                F[i, j] = x
    return F


def _thresholds(F: np.ndarray) -> np.ndarray:
    """``(B, K)`` candidate thresholds: midpoints between sorted finite values, K = min(N - 1, MAX_THRESHOLDS)
    spread evenly over each row's midpoints when there are more (the histogram binning of gradient-boosted
    trees, e.g. LightGBM's ``max_bin``); NaN where a row has fewer than 2 values."""
    S = np.sort(F, axis=1)  # NaN last
    T = 0.5 * (S[:, :-1] + S[:, 1:])  # (B, N-1)
    if T.shape[1] <= MAX_THRESHOLDS:
        return T
    n_mid = np.maximum(np.isfinite(F).sum(1) - 1, 1)  # finite midpoints per row
    idx = np.rint(np.linspace(0.0, 1.0, MAX_THRESHOLDS)[None, :] * (n_mid[:, None] - 1)).astype(np.int64)
    return np.take_along_axis(T, idx, axis=1)


def _search(F: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Best rule for each label vector.

    Args:
        F: ``(B, N)`` features (NaN: undefined, never fires).
        Y: ``(P, N)`` bool label vectors (True = bad).

    Returns:
        ``(best_j (P,), base (P,), threshold (P,), above (P,) bool)``: Youden J of the best rule over
        every base, threshold (midpoints of sorted values) and direction, and that rule.
    """
    T = _thresholds(F)  # (B, K)
    with np.errstate(invalid="ignore"):
        above = (F[:, None, :] > T[:, :, None]).astype(np.float32)  # (B, N-1, N)
        below = (F[:, None, :] < T[:, :, None]).astype(np.float32)
    Yf = Y.astype(np.float32)
    n_bad = Yf.sum(1)  # (P,)
    n_good = Y.shape[1] - n_bad
    best = np.full(len(Y), -np.inf)
    arg = np.zeros((len(Y), 3), dtype=np.int64)
    for d, fired in enumerate((above, below)):
        flat = fired.reshape(-1, F.shape[1])  # (B*(N-1), N)
        tp = flat @ Yf.T  # (B*(N-1), P)
        fp = flat.sum(1, keepdims=True) - tp
        J = tp / np.maximum(n_bad, 1) - fp / np.maximum(n_good, 1)
        i = np.argmax(J, axis=0)
        v = J[i, np.arange(len(Y))]
        better = v > best + 1e-12
        best = np.where(better, v, best)
        arg[better] = np.stack([i // T.shape[1], i % T.shape[1], np.full_like(i, d)], 1)[better]
    thr = T[arg[:, 0], arg[:, 1]]
    return best, arg[:, 0], thr, arg[:, 2] == 0


@dataclass
class SynthesisResult:
    """What the search tried and found, and whether the best rule is kept (see :data:`KEEP_RULE`)."""

    program: Program | None
    kept: bool
    reason: str
    n_labels: int
    n_bad: int
    n_good: int
    n_series: int
    n_candidates: int  # rules scored: bases x thresholds x directions
    in_sample: dict[str, Any] = field(default_factory=dict)  # tp, fp, fn, tn, precision, recall, j
    loo: dict[str, Any] = field(default_factory=dict)  # out-of-sample confusion of the rerun search
    p_value: float | None = None
    n_permutations: int = 0
    fired: dict[str, bool] = field(default_factory=dict)  # in-sample, example key -> fired
    sources: dict[str, int] = field(default_factory=dict)  # labels per source
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (the program as a dict)."""
        d = asdict(self)
        d["program"] = self.program.to_dict() if self.program else None
        d["describe"] = self.program.describe() if self.program else None
        d["name"] = self.program.name if self.program else None
        return d


def confusion(pred: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """tp, fp, fn, tn, precision (NaN → None), recall, Youden J of bool predictions against labels."""
    tp, fp = int((pred & y).sum()), int((pred & ~y).sum())
    fn, tn = int((~pred & y).sum()), int((~pred & ~y).sum())
    prec = tp / (tp + fp) if tp + fp else None
    rec = tp / (tp + fn) if tp + fn else None
    spec = tn / (tn + fp) if tn + fp else None
    j = (rec or 0.0) + (spec or 0.0) - 1 if rec is not None and spec is not None else None
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "precision": prec, "recall": rec, "j": j}


def synthesize(examples: list[Example], kind: str = "predicted_regression", n_permutations: int = N_PERMUTATIONS,
               seed: int = 0, series: list[str] | None = None) -> SynthesisResult:
    """Search the program space on labelled examples; keep the best rule only under :data:`KEEP_RULE`.

    Args:
        examples: labelled versions (bad = True).
        kind: finding kind the compiled analyzer reports.
        n_permutations: label shuffles of the permutation test.
        seed: seed of the shuffles (reproducible).
        series: restrict the search to these series (default :func:`candidate_series`).

    Raises:
        SynthesisError: no examples.
    """
    t0 = time.perf_counter()
    if not examples:
        raise SynthesisError("no labelled examples; pass versions of known outcome (kept / pruned)")
    y = np.array([ex.bad for ex in examples])
    n, n_bad = len(y), int(y.sum())
    names = series if series is not None else candidate_series(examples)
    bases = _bases(names)
    res = SynthesisResult(program=None, kept=False, reason="", n_labels=n, n_bad=n_bad, n_good=n - n_bad,
                          n_series=len(names), n_candidates=2 * len(bases) * min(max(0, n - 1), MAX_THRESHOLDS))
    for ex in examples:
        res.sources[ex.source] = res.sources.get(ex.source, 0) + 1
    if min(n_bad, n - n_bad) == 0:
        res.reason = f"{n} labels ({n_bad} bad, {n - n_bad} good): nothing to discriminate; no rule searched"
        return res
    if not bases or n < 2:
        res.reason = f"{n} label(s), {len(names)} candidate series: nothing to search"
        return res
    F = feature_matrix(examples, bases)
    best, b, thr, up = _search(F, y[None, :])
    if not np.isfinite(thr[0]):
        res.reason = "no series has a defined statistic on two examples"
        return res
    s, stat, w, q = bases[int(b[0])]
    prog = Program(series=s, stat=stat, window=w, direction="above" if up[0] else "below",
                   threshold=float(thr[0]), q=q, kind=kind)
    with np.errstate(invalid="ignore"):
        pred = F[b[0]] > thr[0] if up[0] else F[b[0]] < thr[0]
    res.program, res.in_sample = prog, confusion(pred, y)
    res.fired = {f"{ex.source}:{ex.version}": bool(p) for ex, p in zip(examples, pred, strict=True)}
    if min(n_bad, n - n_bad) < MIN_PER_CLASS:
        res.reason = (f"{n} labels ({n_bad} bad, {n - n_bad} good): a verdict needs at least {MIN_PER_CLASS} "
                      f"of each; best rule {prog.describe()} not kept")
        res.seconds = time.perf_counter() - t0
        return res
    res.p_value, res.n_permutations = _permutation_p(F, y, float(best[0]), n_permutations, seed)
    if res.p_value <= ALPHA:
        loo = np.zeros(n, dtype=bool)
        for i in range(n):  # leave-one-out: the whole search without example i, its rule applied to i
            m = np.arange(n) != i
            _, bi, ti, ui = _search(F[:, m], y[None, m])
            x = F[bi[0], i]
            loo[i] = bool(np.isfinite(x) and np.isfinite(ti[0]) and (x > ti[0] if ui[0] else x < ti[0]))
        res.loo = confusion(loo, y)
    loo_j = res.loo["j"] if res.loo.get("j") is not None else -1.0
    loo_s = (f"leave-one-out J={loo_j:.2f} (tp {res.loo['tp']}, fp {res.loo['fp']}, fn {res.loo['fn']}, "
             f"tn {res.loo['tn']})" if res.loo else "leave-one-out not run (the permutation test failed)")
    nums = (f"in sample J={best[0]:.2f}; permutation p={res.p_value:.3f} ({res.n_permutations} shuffles) over "
            f"{res.n_candidates} candidate rules; {loo_s}; {n} labels ({n_bad} bad, {n - n_bad} good)")
    res.kept = loo_j >= MIN_LOO_J and res.p_value <= ALPHA
    res.reason = (f"kept {prog.describe()}: " if res.kept else f"not kept {prog.describe()}: ") + nums
    res.seconds = time.perf_counter() - t0
    return res


def _permutation_p(F: np.ndarray, y: np.ndarray, observed: float, n_permutations: int,
                   seed: int) -> tuple[float, int]:
    """p-value of the best J over every candidate under shuffled labels, and the shuffles run.

    p = (1 + #{J_perm >= observed}) / (1 + m) (Phipson & Smyth 2010). Shuffles run in chunks; once more
    than ``ALPHA * (1 + n_permutations) - 1`` shuffles reach the observed J, p > ALPHA is certain and the
    test stops early (Besag & Clifford 1991 sequential Monte Carlo p-value), p then from the m run so far.
    """
    rng = np.random.default_rng(seed)
    limit = ALPHA * (1 + n_permutations) - 1
    hits, m = 0, 0
    while m < n_permutations:
        k = min(PERMUTATION_CHUNK, n_permutations - m)
        Yp = np.stack([rng.permutation(y) for _ in range(k)])
        perm_best, *_ = _search(F, Yp)
        hits += int(np.sum(perm_best >= observed - 1e-12))
        m += k
        if hits > limit:
            break
    return float((1 + hits) / (1 + m)), m


def judge_fired(fired: Mapping[str, bool], labels: Mapping[str, bool], n_permutations: int = N_PERMUTATIONS,
                seed: int = 0) -> dict[str, Any]:
    """The keep rule for ONE fixed analyzer (a brain's draft): its firings against known outcomes.

    A draft is not fitted by this search, so there is no leave-one-out to run and one candidate to
    correct for; the permutation test asks how often shuffled labels give a J at least as high.

    Returns:
        ``{kept, reason, tp, fp, fn, tn, precision, recall, j, p_value, n_labels}``.
    """
    keys = [k for k in labels if k in fired]
    y = np.array([bool(labels[k]) for k in keys])
    pred = np.array([bool(fired[k]) for k in keys])
    out = {**confusion(pred, y), "n_labels": len(keys), "p_value": None, "kept": False}
    n_bad = int(y.sum())
    if min(n_bad, len(y) - n_bad) < MIN_PER_CLASS:
        out["reason"] = (f"{len(y)} labels ({n_bad} bad, {len(y) - n_bad} good): a verdict needs at least "
                         f"{MIN_PER_CLASS} of each")
        return out
    rng = np.random.default_rng(seed)
    Yp = np.stack([rng.permutation(y) for _ in range(n_permutations)])
    j_perm = (Yp & pred).sum(1) / n_bad - (~Yp & pred).sum(1) / (len(y) - n_bad)
    out["p_value"] = float((1 + np.sum(j_perm >= out["j"] - 1e-12)) / (1 + n_permutations))
    out["kept"] = out["j"] >= MIN_LOO_J and out["p_value"] <= ALPHA
    out["reason"] = (f"J={out['j']:.2f} (tp {out['tp']}, fp {out['fp']}, fn {out['fn']}, tn {out['tn']}), "
                     f"permutation p={out['p_value']:.3f}, {len(y)} labels")
    return out


def compile_program(prog: Program) -> str:
    """Analyzer source for the sandbox contract (``harness.analyzers.run_analyzer_code``), stdlib only.

    It reads ``metrics.json`` and ``meta.json`` (parents) from ``$EVIDENCE_DIR`` and prints, as its last
    line, one finding of ``prog.kind`` per version the rule fires on, with the statistic's value. Severity
    ``info``: a prediction, not a failure, so it neither blocks the gate nor changes a diagnosis; the loop
    acts on it only through :func:`early_stop`, which also weighs the analyzer's record.
    """
    return f'''# synthesised analyzer: {prog.describe()}
import json, os
{FEATURE_SRC}
PROGRAM = {prog.to_dict()!r}
d = os.environ["EVIDENCE_DIR"]
metrics = json.load(open(os.path.join(d, "metrics.json")))
meta = json.load(open(os.path.join(d, "meta.json")))
parents = meta.get("parents", {{}})
P = PROGRAM

def pts(vid):
    raw = metrics.get(vid, {{}}).get(P["series"], []) if vid else []
    return sorted((int(s), float(v)) for s, v in raw if v is not None)

out = []
for vid in sorted(metrics):
    p = pts(vid)
    x = feature(P["stat"], P["window"], P["q"], p, pts(parents.get(vid)))
    if x is None or not (x > P["threshold"] if P["direction"] == "above" else x < P["threshold"]):
        continue
    out.append({{"kind": P["kind"], "severity": "info", "versions": [vid], "steps": [p[0][0], p[-1][0]],
                "evidence": [P["series"]], "data": {{"value": x, "program": P}},
                "explanation": "%s(%s, window %d%%) = %.4g is %s %.4g: a rule learned from versions of known "
                               "outcome predicts a held-out regression" % (P["stat"], P["series"],
                               round(100 * P["window"]), x, P["direction"], P["threshold"])}})
print(json.dumps(out))
'''


def wilson_lower(successes: int, n: int, z: float = 1.96) -> float:
    """Wilson score interval lower bound of a proportion (Wilson 1927); 0 when n = 0."""
    if n <= 0:
        return 0.0
    p = successes / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - margin) / (1 + z * z / n)


MIN_STOP_PRECISION = 0.5  # Wilson 95% lower bound of precision: the analyzer is more often right than wrong


def early_stop(analyzers: Iterable[Mapping[str, Any]], ev: Evidence, version: str,
               domain: str = "math") -> dict[str, Any]:
    """Decide whether to stop a branch mid-training because a trusted analyzer fires on it.

    Args:
        analyzers: ``{"program": Program dict, "name", "loo": {tp, fp}, "track_record": {domain: {helped,
            hurt}}}`` each (a kept synthesis, as stored in its skill's ``value``).
        ev: the branch's evidence so far (steps logged until now).
        version: the branch.
        domain: the task domain whose track record counts (a record elsewhere is reported, not used).

    Returns:
        ``{stop, version, analyzer, value, precision_lower, reason}``: ``stop`` when a program fires and
        the Wilson 95% lower bound of its precision (out-of-sample fits + in-use fires in ``domain``:
        helped = fired on a version that turned out bad, hurt = fired on one that turned out good) is at
        least :data:`MIN_STOP_PRECISION`.
    """
    best: dict[str, Any] = {"stop": False, "version": version, "analyzer": None, "value": None,
                            "precision_lower": None, "reason": "no trusted analyzer fired"}
    for a in analyzers:
        prog = Program.from_dict(a["program"])
        x = prog.value(ev, version)
        if not prog.fires(ev, version):
            continue
        rec = (a.get("track_record") or {}).get(domain) or {}
        loo = a.get("loo") or {}
        good, bad = int(loo.get("tp", 0)) + int(rec.get("helped", 0)), int(loo.get("fp", 0)) + int(rec.get("hurt", 0))
        lower = wilson_lower(good, good + bad)
        if best["precision_lower"] is None or lower > best["precision_lower"]:
            stop = lower >= MIN_STOP_PRECISION
            best = {"stop": stop, "version": version, "analyzer": a.get("name") or prog.name, "value": x,
                    "precision_lower": lower,
                    "reason": f"{prog.describe()} fires on {version} (value {x:.4g}); precision {good}/{good + bad} "
                              f"(leave-one-out fits + fires in use in {domain}) (Wilson 95% lower bound {lower:.2f}, stop at >= {MIN_STOP_PRECISION})"
                              + ("" if stop else ": not trusted enough to stop")}
    return best


def stop_check(ws: Any, version: str, analyzers: list[Mapping[str, Any]], domain: str, steps_done: int,
               steps_total: int) -> dict[str, Any]:
    """The mid-training early-stop check of a branch (the trainer's ``after_step`` hook at the check step).

    Reads the branch's evidence as logged so far (its first ``steps_done`` steps, rollout features included)
    and its parent's from the run folder ``ws`` (``Evidence.from_workspace``), and applies :func:`early_stop`.

    Returns:
        :func:`early_stop`'s record plus ``at_step`` (= ``steps_done``), ``steps_total`` and ``saved_steps``
        (``steps_total - steps_done`` when it stops, else 0).
    """
    v = ws.lineage.get(version)
    ids = [version] + ([v.parent_id] if v.parent_id else [])
    ev = Evidence.from_workspace(ws, ids)
    rec = early_stop(analyzers, ev, version, domain)
    rec.update(at_step=steps_done, steps_total=steps_total,
               saved_steps=steps_total - steps_done if rec["stop"] else 0)
    return rec
