"""The run's HTML report: one self-contained file in ``RUN/reports/report.html``.

A rendering of stored data (lineage store, its kv stage records, logged metrics, the rollout store), not an
agent: inline CSS, plots as base64 PNG (matplotlib, Agg backend), no scripts and no external links, so it
opens offline. Sections, in order:

- **best version** (``id="best-version"``): the run's answer (:func:`evotrainer.agents.loop.final_version`:
  kv ``loop/final`` once the loop chose it, the orchestrator's frontier while it runs), its dev Avg@k with 95%
  CI, its gains over its parent, its round's control and the no-RL model, its test score (only once the run
  has finished: the test split is sealed during a run and nothing here reads a test outcome before kv
  ``loop/finished``) and its checkpoint folder;
- held-out (dev) scores per version with the no-RL row and the control arms (role column);
- recipe and compute per version (``id="recipe-table"``): the recipe fields that differ from the root (with
  the root's values), role, status, training steps on the lineage-global axis, train / dev-eval tokens, wall
  seconds and process CPU-seconds (``agents.loop.version_compute``); the run's totals below;
- compute and test; sample completions (``id="samples"``) of the best version beside the base model on the
  same dev problems and sample indices (paired sample seeds), from the rollout store's evaluation rollouts;
- the lineage tree with each decision and its rationale;
- training curves (``id="global-steps"``) on the lineage-global step axis (``LineageStore.step_offset``, the
  axis of the TensorBoard output): each version's curve starts at the last point of the version it trains
  from. Correctness and each reward component have panels of their own; the total reward is drawn only
  across versions that share one reward definition (a panel per definition);
- findings, interventions tried, analyzers added, skills used, brain usage.

The per-version CI is a percentile bootstrap over held-out problems of the per-problem mean
correctness (2000 resamples, seed 0; Efron & Tibshirani 1993); the gain CIs shown in the decisions
are the promotion gate's paired bootstrap, as stored when the gate ran; the best version's gain over the
no-RL model is the same paired bootstrap (``harness.stats.compare_versions``) on the dev problems both share.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from evotrainer import metrics as M
from evotrainer.agents.loop import (
    EVAL_SHAPE,
    FINAL_SHAPE,
    best_kept,
    eval_compute,
    final_version,
    version_compute,
)
from evotrainer.harness.plots import MAX_COMPONENTS, PLOT_MAX, plain
from evotrainer.harness.stats import compare_versions
from evotrainer.lineage import DESCRIBE_INTERVENTIONS_MAX, NUM, LineageStore, Version, capped_findings
from evotrainer.points import MAX_METRIC_SERIES, MetricsThinnedWarning
from evotrainer.recipe import diff_recipes
from evotrainer.terminal import neutralise
from evotrainer.workspace import Workspace, folder_inside, replace_file

# the shapes of the run-level values read here besides loop.py's (LineageStore.kv_get; review 10 V-R10)
CONFIG_SHAPE = {"budget": dict, "recipe": {"model": dict, "data": dict}, "report_to": [str]}
USAGE_SHAPE = {"cost_usd": NUM}
DIAGNOSE_SHAPE = {"findings": [{"evidence": list}]}
# "type" picks the section an item lists under (a dict key): a list there ended `report` with a bare TypeError
# (review 20 C1-R20)
EVOLVE_SHAPE = [{"loo": dict, "type": str}]
PROPOSE_SHAPE = {"skills_used": [str]}

PLOTS: list[tuple[str, str]] = [
    (M.POLICY_ENTROPY, "entropy (nats/token)"), (M.COMPLETIONS_MEAN_LENGTH, "completion length (tokens)"),
    (M.REWARD_FRAC_ZERO_STD, "zero-variance group fraction"), (M.POLICY_KL, "KL to reference (nats/token)"),
    (M.COMPLETIONS_CLIPPED_RATIO, "truncated fraction"),
]
"""Curve panels after correctness and the reward panels: (metric, title)."""
REPORT_KV_MAX_CHARS = 16 << 20
"""Characters of run-level (kv) values one report reads in all (16 MiB): a run's own records are KBs a version (its
evaluations, gate, diagnosis) and the loop's a few MB at the most; a value that would cross the budget is left out
and the report says so. Review 16 B2-R16: a crafted store whose versions each held ~4 MiB findings records made the
report 13.7 s, 984 MB and a 198 MiB HTML file."""
REPORT_FINDINGS_MAX = 50
"""Findings the report lists a version (the most severe first; "Left out: N" for the rest): the analyzers raise a
handful; review 16 B2-R16's crafted store held thousands a version."""
REPORT_EVAL_SAMPLES_MAX = 2_000_000
"""Eval samples (one outcome each) the report reads in all, across every version's eval matrices: a real heldout eval
is a few hundred problems x k (500 x 8 = 4,000 a version), so a run of 256 versions reads whole. A matrix that would
cross the budget is left out whole (no CI is drawn from part of one) and the report says so. Review 16's residue: the
report read every matrix whole, several times each."""
REPORT_SERIES_POINTS_MAX = 5_000
"""Points of one metric series of one version the report reads (thinned evenly from the first step to the last past
it, :func:`evotrainer.points.thin_series`): a plot is ~1,000 pixels wide, a real version trains hundreds to a few
thousand steps."""
REPORT_METRIC_POINTS_MAX = 2_000_000
"""Metric points the report reads in all (~200 MB as Python tuples at the most): each version in turn gets an even
share of what is left (its series thinned to fit, at least :data:`REPORT_SERIES_POINTS_MIN` points each, else left
out) and the report says which versions it thinned or left out. Review 16's residue: every series of every version
was read to :data:`~evotrainer.points.MAX_METRIC_STEPS` (100,000) points each."""
REPORT_SERIES_POINTS_MIN = 10  # fewer points a series than this draws no useful curve: the version is left out
FINDING_TEXT_CHARS = 600  # characters of a finding's explanation in the findings table (kind and evidence: 200)
N_SAMPLES = 6  # dev problems in the sample table
SAMPLE_CHARS = 600  # a completion is cut to this many characters in the sample table (prompt: half)
CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:24px;margin-bottom:4px} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0} th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4} .muted{color:#777;font-size:12px} code{background:#f6f6f6;padding:1px 3px}
.kept{color:#1a7f37;font-weight:bold} .pruned{color:#cf222e} .reverted{color:#8250df} .failed{color:#cf222e;font-weight:bold}
.merged{color:#0969da} .trained,.training,.proposed{color:#9a6700}
ul.tree{list-style:none;padding-left:18px;border-left:1px dashed #ccc} ul.tree li{margin:6px 0}
.decision{font-size:12px;color:#444;margin-left:12px} img{max-width:100%} .finding{font-size:12px}
.blocking{color:#cf222e;font-weight:bold} .warn{color:#9a6700} .info{color:#777}
#best-version{border:2px solid #1a7f37;border-radius:6px;padding:4px 16px 8px;background:#f6fbf7;margin-top:16px}
#best-version h2{border:none;margin-top:8px} #best-version th{width:190px}
.verdict{font-size:14px;margin:6px 0} td.num{text-align:right;white-space:nowrap} th.num{white-space:nowrap}
pre.comp{white-space:pre-wrap;word-break:break-word;margin:0;font-size:12px;max-width:460px}
td.ok{background:#eaf7ee} td.bad{background:#fdf0f0} .prompt{font-size:12px;color:#444;max-width:300px}
"""
class ReportLineage:
    """The lineage store as one report reads it (review 16, E2-R16 / B2-R16).

    The versions are read once (:meth:`LineageStore.versions`; a crafted store's versions can take seconds to
    read, and the report read them ~10 times); each run-level (kv) value is read at most once, and all of them
    under :data:`REPORT_KV_MAX_CHARS` characters together, each value's size asked of SQL first
    (:meth:`LineageStore.kv_size`): a value that would cross the budget is not read, reads as unset, and is listed
    in :attr:`left_out` (key -> characters) for the report to say so. The loop's readers
    (:func:`~evotrainer.agents.loop.final_version`, ``version_compute`` ...) take it in place of the store; every
    other read goes to the store unchanged.
    """

    def __init__(self, store: LineageStore, kv_budget: int = REPORT_KV_MAX_CHARS,
                 eval_budget: int = REPORT_EVAL_SAMPLES_MAX, points_budget: int = REPORT_METRIC_POINTS_MAX):
        self.store = store
        self._versions = store.versions()
        self.by_id = {v.id: v for v in self._versions}
        self.kv_budget = kv_budget
        self.kv_chars = 0  # characters of kv values read so far
        self.left_out: dict[str, int] = {}  # kv key (a prefix read ends in '*') -> its characters, not read
        self._kv: dict[str, Any] = {}  # key -> value read (_UNSET: none, or left out)
        self._index: Any = None
        self.eval_budget, self.points_budget = eval_budget, points_budget  # samples, points (the two MAXes)
        self.eval_samples = 0  # eval samples read so far (REPORT_EVAL_SAMPLES_MAX)
        self.evals_left_out: dict[tuple[str, str], int] = {}  # (version, eval name) -> samples, not read
        self._evals: dict[tuple[str, str], dict[str, list[float]]] = {}
        self.metric_points = 0  # metric points read so far (REPORT_METRIC_POINTS_MAX)
        self.metrics_cut: dict[str, tuple[int, int]] = {}  # version -> (points stored, points read): thinned
        self._metrics: dict[str, dict[str, list[tuple[int, float]]]] = {}

    def eval_matrix(self, version_id: str, eval_name: str = "heldout") -> dict[str, list[float]]:
        """:meth:`LineageStore.eval_matrix`, read once, within :data:`REPORT_EVAL_SAMPLES_MAX` samples in all (counted
        in SQL first): a matrix that would cross it reads as empty (no CI) and is listed in :attr:`evals_left_out`.

        Raises:
            LineageError: as :meth:`LineageStore.eval_matrix`.
        """
        key = (version_id, eval_name)
        if key not in self._evals:
            n = self.store.eval_sample_count(version_id, eval_name)
            if self.eval_samples + n > self.eval_budget:
                self.evals_left_out[key] = n
                self._evals[key] = {}
            else:
                self.eval_samples += n
                self._evals[key] = self.store.eval_matrix(version_id, eval_name)
        return self._evals[key]

    def all_metrics(self, version_id: str) -> dict[str, list[tuple[int, float]]]:
        """:meth:`LineageStore.all_metrics`, read once, each series thinned to :data:`REPORT_SERIES_POINTS_MAX` points
        and to the version's share of what is left of :data:`REPORT_METRIC_POINTS_MAX`; a version whose series would
        get fewer than :data:`REPORT_SERIES_POINTS_MIN` points each reads as none. Either is listed in
        :attr:`metrics_cut` (the report says so; the store's own thinning warning is not shown)."""
        if version_id not in self._metrics:
            rows, series = self.store.metric_counts(version_id)
            series = min(series, MAX_METRIC_SERIES)
            unread = max(1, sum(1 for v in self._versions if v.id not in self._metrics))
            share = max(0, self.points_budget - self.metric_points) // unread
            per = min(REPORT_SERIES_POINTS_MAX, share // max(1, series))
            if rows and per < REPORT_SERIES_POINTS_MIN:
                out: dict[str, list[tuple[int, float]]] = {}
            elif rows:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", MetricsThinnedWarning)
                    out = self.store.all_metrics(version_id, max_points=per)
            else:
                out = {}
            kept = sum(len(p) for p in out.values())
            self.metric_points += kept
            if kept < rows:
                self.metrics_cut[version_id] = (rows, kept)
            self._metrics[version_id] = out
        return self._metrics[version_id]

    def __getattr__(self, name: str) -> Any:  # metric series, eval matrices, decisions ...: the store's own reads
        return getattr(self.store, name)

    def versions(self) -> list[Version]:
        """Every version in creation order, as read when this view was made."""
        return list(self._versions)

    def root(self) -> Version | None:
        """The root version, None in an empty run."""
        return next((v for v in self._versions if v.parent_id is None), None)

    def get(self, version_id: str) -> Version:
        """One version (the store's error for an unknown id)."""
        v = self.by_id.get(version_id)
        return v if v is not None else self.store.get(version_id)

    def lineage_index(self) -> Any:
        """The store's :class:`~evotrainer.lineage.LineageIndex`, made once."""
        if self._index is None:
            self._index = self.store.lineage_index()
        return self._index

    def path_to_root(self, version_id: str) -> list[Version]:
        """``[version, parent, ..., root]`` from the versions read."""
        return [self.get(i) for i in self.lineage_index().ancestors(version_id)]

    def diff(self, a: str, b: str) -> list[tuple[str, Any, Any]]:
        """Recipe paths that differ between two versions (:meth:`LineageStore.diff`)."""
        return diff_recipes(self.get(a).recipe, self.get(b).recipe)

    def kv_get(self, key: str, default: Any = None, expected: Any = None, required: tuple[str, ...] = (),
               fix: str | None = None) -> Any:
        """:meth:`LineageStore.kv_get` within the budget: ``default`` for a key unset or left out.

        Raises:
            LineageError: as :meth:`LineageStore.kv_get` (a value not JSON, or not of the ``expected`` shape).
        """
        if key not in self._kv:
            size = self.store.kv_size(key)
            if size is None:
                self._kv[key] = _UNSET
            elif self.kv_chars + size > self.kv_budget:
                self.left_out[key] = size
                self._kv[key] = _UNSET
            else:
                self.kv_chars += size
                self._kv[key] = self.store.kv_get(key, _UNSET, fix=fix)
        value = self._kv[key]
        if value is _UNSET:
            return default
        return value if expected is None else self.store.kv_typed(key, value, expected, required, fix)

    def kv_items(self, prefix: str = "") -> list[tuple[str, Any]]:
        """:meth:`LineageStore.kv_items` within the budget: every value under ``prefix``, or none (listed in
        :attr:`left_out` as ``prefix*``) when they would cross it together."""
        key = prefix + "*"
        if key not in self._kv:
            _, size = self.store.kv_items_size(prefix)
            if self.kv_chars + size > self.kv_budget:
                self.left_out[key] = size
                self._kv[key] = []
            else:
                self.kv_chars += size
                self._kv[key] = self.store.kv_items(prefix)
        return list(self._kv[key])


_UNSET = object()


def _view(ws: Workspace, lin: ReportLineage | None) -> ReportLineage:
    """``lin``, or a new :class:`ReportLineage` of ``ws`` (one per report: pass it down)."""
    return lin if lin is not None else ReportLineage(ws.lineage)


def bootstrap_ci(matrix: dict[str, list[float]], n_boot: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """95% percentile bootstrap CI of Avg@k over problems (per-problem mean correctness); None if empty."""
    if not matrix:
        return None
    per_problem = np.array([np.mean(v) for v in matrix.values()], dtype=float)  # (P,)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per_problem), size=(n_boot, len(per_problem)))  # (n_boot, P)
    means = per_problem[idx].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _e(x: Any) -> str:
    return html.escape(str(x))


def _n(x: Any) -> str:
    """A count from a run's stored records, as HTML: the records of a run folder written elsewhere are
    input like any other, so a value that is not a number is escaped, never pasted in as markup."""
    return str(x) if isinstance(x, int) and not isinstance(x, bool) else _e(x)


def _fmt(x: Any, nd: int = 3) -> str:
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else ("" if x is None else _e(x))


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def role(v: Version) -> str:
    """``root``, ``control`` (a round's control arm: the parent's recipe continued), ``merge`` (several
    interventions at once) or ``branch`` (one intervention)."""
    if v.parent_id is None:
        return "root"
    return "control" if v.is_control else "merge" if len(v.interventions) > 1 else "branch"


def score_rows(ws: Workspace, lin: ReportLineage | None = None) -> list[dict[str, Any]]:
    """Rows of the score table: the no-RL row (role ``baseline``), then each evaluated version, control arms
    included (role, status, Avg@k, 95% CI, pass@k, k, both gains). ``lin``: the report's view of the store
    (:class:`ReportLineage`; None: a new one)."""
    lin = _view(ws, lin)
    versions = lin.versions()
    rows = []
    if versions:
        root = versions[0]
        no_rl = lin.kv_get(f"loop/eval/{root.id}/no_rl", expected=EVAL_SHAPE)
        if no_rl:
            rows.append({"name": "no-RL (base model)", "role": "baseline", "status": "", "avg": no_rl.get("avg@k"),
                         "k": no_rl.get("k"),
                         "pass": no_rl.get("pass@k"), "ci": bootstrap_ci(lin.eval_matrix(root.id, "no_rl"))})
    for v in versions:
        ev = lin.kv_get(f"loop/eval/{v.id}/heldout", expected=EVAL_SHAPE) or (v.eval_summary if v.eval_summary.get("eval_name",
                                                                                               "heldout") == "heldout" else {})
        if not ev or ev.get("avg@k") is None:
            continue
        es = v.eval_summary or {}
        rows.append({"name": v.id, "role": role(v), "status": v.status, "avg": ev.get("avg@k"), "k": ev.get("k"),
                     "pass": ev.get("pass@k"), "ci": bootstrap_ci(lin.eval_matrix(v.id, "heldout")),
                     "change": v.describe_change(), "vs_parent": es.get("vs_parent"), "vs_control": es.get("vs_control")})
    return rows


def gain_text(g: dict[str, Any] | None) -> str:
    """``+0.125 [+0.031, +0.219] (v1)`` from an ``eval_summary`` gain record (``vs_parent`` / ``vs_control``)."""
    if not g or not isinstance(g.get("gain"), (int, float)):
        return ""
    ci = g.get("ci")
    ci_s = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if isinstance(ci, (list, tuple)) and len(ci) == 2 else ""
    return f"{g['gain']:+.3f}{ci_s} ({g.get('version')})"


def _gain_cell(g: dict[str, Any] | None, missing: str = "") -> str:
    return _e(gain_text(g)) if gain_text(g) else f"<span class='muted'>{_e(missing)}</span>"


def _is_real(gain: dict[str, Any] | None) -> bool | None:
    """True when the gain's CI lies above 0, False when it does not, None without a CI."""
    ci = (gain or {}).get("ci")
    return ci[0] > 0 if isinstance(ci, (list, tuple)) and len(ci) == 2 else None


def _paired_gain(lin: ReportLineage, base: tuple[str, str], mine: tuple[str, str], label: str) -> dict[str, Any] | None:
    """Paired bootstrap gain of ``mine`` over ``base`` (each ``(version, eval name)``) on their common problems, as a
    gain record ``{version, gain, ci, n_problems}``; None when fewer than 2 problems are shared."""
    a, b = lin.eval_matrix(*base), lin.eval_matrix(*mine)
    try:
        c = compare_versions(a, b, n_resamples=2000)
    except ValueError:
        return None
    return {"version": label, "gain": c.gain, "ci": list(c.ci), "n_problems": c.n_problems}


def _gate_gains(lin: ReportLineage, v: Version) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(vs_parent, vs_control)`` of a version: its eval_summary's gain records, else its gate record's
    (kv ``loop/rgate/<v>``, ``loop/gate/<v>``)."""
    es = v.eval_summary or {}
    g = lin.kv_get(f"loop/rgate/{v.id}", expected=dict) or lin.kv_get(f"loop/gate/{v.id}", expected=dict) or {}
    vs_parent = es.get("vs_parent")
    if vs_parent is None and v.parent_id and g.get("gain_vs_parent") is not None:
        vs_parent = {"version": v.parent_id, "gain": g["gain_vs_parent"], "ci": g.get("ci_vs_parent")}
    vs_control = es.get("vs_control")
    if vs_control is None and g.get("control_id") and g.get("baseline_id") == g.get("control_id"):
        vs_control = {"version": g["control_id"], "gain": g.get("gain"), "ci": g.get("ci")}
    return vs_parent, vs_control


def checkpoint_of(ws: Workspace, v: Version) -> str | None:
    """The version's checkpoint folder (``RUN/checkpoints/<v>``, as its training recorded it), None without one."""
    if v.checkpoint:
        return v.checkpoint
    d = ws.path("checkpoints", v.id)
    return str(d) if d.is_dir() and any(d.iterdir()) else None


def best_version(ws: Workspace, lin: ReportLineage | None = None) -> dict[str, Any]:
    """The run's answer and what says whether it is real; ``{}`` for a run without one yet.

    Keys: ``version``, ``source`` (``final``: chosen after the last decision; ``frontier``: the orchestrator's
    current frontier; ``best kept``), ``role``, ``status``, ``change``, ``dev`` (its dev eval summary: ``avg@k``,
    ``k``, ``n_problems``), ``dev_ci``, ``vs_parent``, ``vs_control``, ``vs_no_rl`` (gain records: ``version``,
    ``gain``, ``ci``), ``checkpoint``, ``finished``; once the run has finished, ``test`` and ``no_rl_test`` (the
    final answer's test summary and the base model's) and ``test_vs_no_rl``. Before that no test outcome is read.
    ``lin``: the report's view of the store (:class:`ReportLineage`; None: a new one).
    """
    lin = _view(ws, lin)
    vid, source = final_version(lin)
    if vid is None:
        return {}
    v, root = lin.get(vid), lin.root()
    es = v.eval_summary or {}
    dev = lin.kv_get(f"loop/eval/{vid}/heldout", expected=EVAL_SHAPE) or (es if es.get("eval_name", "heldout") == "heldout" else {})
    vs_parent, vs_control = _gate_gains(lin, v)
    finished = bool(lin.kv_get("loop/finished"))
    out: dict[str, Any] = {
        "version": vid, "source": source, "role": role(v), "status": v.status, "change": v.describe_change(),
        "dev": dev, "dev_ci": bootstrap_ci(lin.eval_matrix(vid, "heldout")), "vs_parent": vs_parent,
        "vs_control": vs_control, "checkpoint": checkpoint_of(ws, v), "finished": finished,
        "vs_no_rl": _paired_gain(lin, (root.id, "no_rl"), (vid, "heldout"), "no-RL") if root else None}
    final = (lin.kv_get("loop/final", expected=FINAL_SHAPE) or {}) if finished else {}  # the test split is sealed until the run ends
    if finished and final.get("version") == vid and root is not None:
        out["test"], out["no_rl_test"] = final.get("test") or {}, final.get("no_rl_test") or {}
        out["test_vs_no_rl"] = _paired_gain(lin, (root.id, "no_rl_test"), (vid, "test"), "no-RL")
    return out


_SOURCES = {"final": "the run's final answer, chosen after its last decision",
            "frontier": "the orchestrator's current frontier (the run is not finished: it may still change)",
            "best kept": "the best kept version on dev so far"}


def _best_block(ws: Workspace, lin: ReportLineage) -> str:
    b = best_version(ws, lin)
    if not b:
        return ('<div id="best-version"><h2>Best version</h2><p class="muted">no version has been kept or chosen yet'
                "</p></div>")
    vid, dev, k = b["version"], b["dev"], b["dev"].get("k", "k")
    ci = b["dev_ci"]
    dev_s = (f"<b>{_fmt(dev.get('avg@k'))}</b>" + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "")
             + f" <span class='muted'>95% CI, bootstrap over {_e(dev.get('n_problems') or len(lin.eval_matrix(vid)))}"
               " dev problems</span>") if dev.get("avg@k") is not None else "<span class='muted'>not evaluated</span>"
    control_missing = ("it is the round's control arm: continuing the parent's recipe was the decision"
                       if b["role"] == "control" else "no control arm in its round")
    if b["finished"] and b.get("test"):
        t, n = b["test"], b.get("no_rl_test") or {}
        test_s = (f"<b>{_fmt(t.get('avg@k'))}</b> Avg@{_e(t.get('k'))} on {_e(t.get('n_problems'))} test problems; "
                  f"no-RL {_fmt(n.get('avg@k'))}" + (f"; gain {_e(gain_text(b.get('test_vs_no_rl')))}"
                                                     if b.get("test_vs_no_rl") else ""))
    elif b["finished"]:
        test_s = "<span class='muted'>no test split in this run (data.n_test: 0)</span>"
    else:
        test_s = ("<span class='muted'>sealed: the run is not finished (the test split is scored once, for the "
                  "final answer, when the loop ends)</span>")
    real = [(name, _is_real(b.get(key))) for name, key in (("its control", "vs_control"), ("its parent", "vs_parent"),
                                                           ("the no-RL model", "vs_no_rl"))]
    beats = [n for n, r in real if r]
    fails = [n for n, r in real if r is False]
    verdict = ((f"On dev it beats {_and(beats)} (95% CI of the paired gain above 0)" if beats else
                "On dev no gain of it is established (every 95% CI reaches 0 or below)" if fails else
                "No paired dev comparison is recorded for it")
               + (f"; not established over {_and(fails)}." if beats and fails else "."))
    ckpt = b["checkpoint"]
    rows = [
        ("answer", f"<b>{_e(vid)}</b> ({_e(b['role'])}, <span class='{_e(b['status'])}'>{_e(b['status'])}</span>): "
                   f"<code>{_e(b['change'])}</code><br><span class='muted'>{_e(_SOURCES.get(b['source'], ''))}</span>"),
        (f"dev Avg@{_e(k)}", dev_s),
        ("gain vs parent [95% CI]", _gain_cell(b["vs_parent"], "the root has no parent")),
        ("gain vs control [95% CI]", _gain_cell(b["vs_control"], control_missing)),
        ("gain vs no-RL, dev [95% CI]", _gain_cell(b["vs_no_rl"], "no no-RL evaluation on the same problems")),
        ("test", test_s),
        ("checkpoint", f"<code>{_e(ckpt)}</code>" if ckpt else "<span class='muted'>no checkpoint saved</span>"),
    ]
    return (f'<div id="best-version"><h2>Best version: {_e(vid)}</h2><p class="verdict">{_e(verdict)}</p><table>'
            + "".join(f"<tr><th>{h}</th><td>{c}</td></tr>" for h, c in rows) + "</table></div>")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def recipe_rows(ws: Workspace, lin: ReportLineage | None = None) -> list[dict[str, Any]]:
    """Per version (the no-RL row first): parent, role, status, recipe changes against the root (``[(path,
    root value, value)]``), steps, lineage-global step range and what it spent (:func:`~evotrainer.agents.loop.
    version_compute`): train tokens, dev-eval tokens, train seconds (sum of ``perf/step_seconds``), train CPU-seconds
    (sum of ``perf/step_cpu_seconds``; None where the backend did not measure it), dev-eval seconds and CPU-seconds
    (kv ``loop/eval_walls`` / ``loop/eval_cpu``). Test evaluations are left out. ``lin``: the report's view of the
    store (:class:`ReportLineage`; None: a new one)."""
    lin = _view(ws, lin)
    versions = lin.versions()
    if not versions:
        return []
    root = versions[0]
    rows = []
    if lin.kv_get(f"loop/eval/{root.id}/no_rl"):
        rows.append({"version": "no-RL", "parent": None, "role": "baseline", "status": "", "changes": [],
                     "steps": 0, "global": None, "train_tokens": 0, "train_s": 0.0, "train_cpu_s": 0.0,
                     **eval_compute(lin, root.id, no_rl=True)})
    index = lin.lineage_index()  # every offset from one read of the parent links (review 8 M-R8)
    for v in versions:
        last = index.last_step(v.id)
        off = index.step_offset(v.id)
        rows.append({"version": v.id, "parent": v.parent_id, "role": role(v), "status": v.status,
                     "changes": diff_recipes(root.recipe, v.recipe), "steps": last + 1,
                     "global": (off, off + last) if last >= 0 else None, **version_compute(lin, v.id)})
    return rows


def _secs(x: float | None) -> str:
    return "&ndash;" if x is None else f"{x:.1f}"


def _val(x: Any) -> str:
    return "unset" if x is None else json.dumps(x) if isinstance(x, (list, dict)) else str(x)


def _recipe_table(ws: Workspace, lin: ReportLineage) -> str:
    rows = recipe_rows(ws, lin)
    if not rows:
        return "<p class='muted'>empty lineage</p>"
    changed = sorted({p for r in rows for p, _, _ in r["changes"]})
    root = next(r for r in rows if r["role"] == "root")
    root_vals = {p: a for r in rows for p, a, _ in r["changes"]}
    body = []
    for r in rows:
        if r["role"] == "baseline":
            change = "the base model, no RL (dev evaluation only)"
        elif r is root:
            change = ("root values: " + "; ".join(f"{_e(p)} = {_e(_val(root_vals[p]))}" for p in changed)
                      if changed else "root recipe (no version changes it)")
        else:
            change = "; ".join(f"{_e(p)}: {_e(_val(a))} &rarr; {_e(_val(b))}" for p, a, b in r["changes"]) or "same as root"
        g = r["global"]
        body.append(f"<tr><td>{_e(r['version'])}</td><td>{_e(r['parent'] or '')}</td><td>{_e(r['role'])}</td>"
                    f"<td class='{_e(r['status'])}'>{_e(r['status'])}</td><td><code>{change}</code></td>"
                    f"<td class='num'>{_n(r['steps'])}</td><td class='num'>{f'{_n(g[0])}&ndash;{_n(g[1])}' if g else ''}</td>"
                    f"<td class='num'>{_n(r['train_tokens'])}</td><td class='num'>{_n(r['eval_tokens'])}</td>"
                    f"<td class='num'>{r['train_s']:.1f}</td><td class='num'>{_secs(r['train_cpu_s'])}</td>"
                    f"<td class='num'>{r['eval_s']:.1f}</td><td class='num'>{_secs(r['eval_cpu_s'])}</td></tr>")
    return ('<table id="recipe-table"><tr><th>version</th><th>parent</th><th>role</th><th>status</th>'
            "<th>recipe: differs from the root (root value &rarr; value)</th><th>steps</th><th>global steps</th>"
            "<th>train tokens</th><th>dev-eval tokens</th><th class='num'>train s</th><th class='num'>train CPU-s</th>"
            "<th class='num'>dev-eval s</th><th class='num'>dev-eval CPU-s</th></tr>"
            + "".join(body) + "</table><p class='muted'>train s / CPU-s: the training steps (model loading and the "
            "checkpoint save excluded); CPU-s: user + system CPU-seconds of the process that trained or evaluated "
            "(all its threads; &ndash;: not measured by the backend). Run totals: Compute and test, below</p>")


def _compute_and_test(lin: ReportLineage) -> str:
    """Compute spent (tokens, CPU-seconds, wall) and, once the run has finished, the final answer's test score."""
    c = lin.kv_get("loop/compute", expected=dict) or {}
    finished = bool(lin.kv_get("loop/finished"))
    final = (lin.kv_get("loop/final", expected=FINAL_SHAPE) or {}) if finished else {}  # sealed until the run ends
    parts = []
    if c:
        parts.append(f"<p>compute: {_n(c.get('train_tokens', 0))} train tokens (rollouts), {_n(c.get('eval_tokens', 0))} dev "
                     f"eval tokens (the budget counts both), {_n(c.get('no_rl_tokens', 0))} no-RL dev and "
                     f"{_n(c.get('test_tokens', 0))} test eval tokens; {_fmt(c.get('cpu_s'), 0)} CPU-seconds, "
                     f"{_fmt(c.get('wall_s'), 0)} s wall</p>")
    if final.get("test") or final.get("no_rl_test"):
        t, n = final.get("test") or {}, final.get("no_rl_test") or {}
        parts.append(f"<p>test split (sealed during the run): final answer <b>{_e(final.get('version'))}</b> "
                     f"Avg@{_e(t.get('k'))} {_fmt(t.get('avg@k'))} on {_e(t.get('n_problems'))} problems; no-RL "
                     f"{_fmt(n.get('avg@k'))}</p>")
    elif not finished and lin.versions():
        parts.append("<p class='muted'>test split: sealed while the run is under way</p>")
    return "".join(parts) or "<p class='muted'>no compute or test record (an older run, or still in progress)</p>"


def _eval_rollouts(ws: Workspace, vid: str, eval_name: str) -> dict[tuple[str, int], dict[str, Any]]:
    """The dev evaluation rollouts of one version and eval name: ``{(problem id, sample index): row}`` (the latest
    row where a version was evaluated twice)."""
    cols = ["prompt_id", "sample_idx", "group_id", "prompt", "completion", "answer", "correct", "created_at"]
    q = vid.replace("'", "''")
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for r in ws.rollouts.to_arrow(where=f"split = 'eval' AND version_id = '{q}'", columns=cols).to_pylist():
        key = (str(r["prompt_id"]), int(r["sample_idx"]))
        if str(r["group_id"]).startswith(f"{eval_name}-") and (key not in out or r["created_at"] >= out[key]["created_at"]):
            out[key] = r
    return out


def sample_rows(ws: Workspace, best: str, n: int = N_SAMPLES,
                lin: ReportLineage | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Dev completions of the base model beside ``best``'s on the same problems and sample index (the sample seeds
    are paired), one sample per problem: ``(label of the base side, rows)``; each row has ``problem_id``,
    ``sample_idx``, ``prompt``, ``answer``, ``base`` and ``best`` (rollout rows). The base side is the root's no-RL
    evaluation (the root's own dev evaluation when there is none). Problems where the two differ in correctness
    come first, then by problem id. ``lin``: the report's view of the store (None: the store)."""
    root = (lin or ws.lineage).root()
    if root is None:
        return "", []
    base, label = _eval_rollouts(ws, root.id, "no_rl"), f"{root.id} no-RL (base model)"
    if not base and best != root.id:
        base, label = _eval_rollouts(ws, root.id, "heldout"), f"{root.id} (root, trained)"
    mine = _eval_rollouts(ws, best, "heldout")
    first: dict[str, tuple[str, int]] = {}
    for key in sorted(set(base) & set(mine)):
        first.setdefault(key[0], key)
    keys = sorted(first.values(), key=lambda k: (_ok(base[k]) == _ok(mine[k]), k))[:n]
    return label, [{"problem_id": k[0], "sample_idx": k[1], "prompt": mine[k]["prompt"], "answer": mine[k]["answer"],
                    "base": base[k], "best": mine[k]} for k in keys]


def _ok(r: dict[str, Any]) -> bool | None:
    c = r.get("correct")
    return None if c is None or not _finite(c) else c > 0


def _cut(text: Any, n: int) -> str:
    s = str(text or "")
    return s if len(s) <= n else s[:n] + f" … [{len(s) - n} more characters]"


def _samples(ws: Workspace, lin: ReportLineage) -> str:
    best, _ = final_version(lin)
    if best is None:
        return "<p class='muted'>no best version yet</p>"
    label, rows = sample_rows(ws, best, lin=lin)
    if not rows:
        return "<p class='muted'>no evaluation rollouts of the best version and the base model on common problems</p>"

    def cell(r: dict[str, Any]) -> str:
        ok = _ok(r)
        mark = "" if ok is None else " correct" if ok else " wrong"
        return (f"<td class='{'' if ok is None else 'ok' if ok else 'bad'}'><pre class='comp'>"
                f"{_e(_cut(r['completion'], SAMPLE_CHARS))}</pre><span class='muted'>{mark}</span></td>")

    body = "".join(f"<tr><td><code>{_e(r['problem_id'])}</code> #{_n(r['sample_idx'])}<div class='prompt'>"
                   f"{_e(_cut(r['prompt'], SAMPLE_CHARS // 2))}</div></td><td>{_e(r['answer'])}</td>"
                   f"{cell(r['base'])}{cell(r['best'])}</tr>" for r in rows)
    return (f"<p class='muted'>dev problems, the same sample index on both sides (paired sample seeds); problems "
            f'where the two differ first</p><table id="samples"><tr><th>problem</th><th>answer</th>'
            f"<th>{_e(label)}</th><th>{_e(best)} (best)</th></tr>{body}</table>")


def _score_plot(rows: list[dict[str, Any]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return ""
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(rows) + 2), 3))
    xs = np.arange(len(rows))
    avgs = [r["avg"] or 0.0 for r in rows]
    # A stored Avg@k outside its own CI (a crafted or damaged store) draws no bar end below it: matplotlib refuses a
    # negative error (review 17 follow-up: `report` ended in "'yerr' must not contain negative values").
    lo = [max(0.0, a - r["ci"][0]) if r["ci"] else 0.0 for a, r in zip(avgs, rows, strict=True)]
    hi = [max(0.0, r["ci"][1] - a) if r["ci"] else 0.0 for a, r in zip(avgs, rows, strict=True)]
    colors = ["#888" if r["status"] == "" else {"kept": "#1a7f37", "pruned": "#cf222e"}.get(r["status"], "#0969da")
              for r in rows]
    bars = ax.bar(xs, avgs, yerr=[lo, hi], color=colors, capsize=4,
                  hatch=["//" if r.get("role") == "control" else "" for r in rows])
    ax.bar_label(bars, labels=[_fmt(r["avg"]) for r in rows], fontsize=8, padding=2)  # a 0.000 bar is still read
    ax.set_xticks(xs, [plain(r["name"].split(" ")[0]) for r in rows])
    ax.set_ylabel(f"held-out Avg@{rows[0].get('k') or 'k'}")
    ax.set_ylim(0, max(0.05, max(a + h for a, h in zip(avgs, hi, strict=True)) * 1.15))
    return _png(fig)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def lineage_curves(ws: Workspace, lin: ReportLineage | None = None) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{version: {metric: [(lineage-global step, value)]}}`` of every trained version.

    A version's own steps sit at ``LineageStore.step_offset(v) + step``; its curve is led by the last point of
    the version it trains from (``LineageStore.start_version``: the parent, or the nearest undamaged ancestor),
    so a child's curve starts at its parent's last global step and goes on from there, except where the metric
    means something else for the two (the total reward or a reward component under another definition).
    Non-finite values are left out. ``lin``: the report's view of the store (:class:`ReportLineage`; None: a new one).
    """
    lin = _view(ws, lin)
    index = lin.lineage_index()  # every offset and start from one read of the parent links (review 8 M-R8)
    every = {v.id: v for v in lin.versions()}
    versions = [v for v in every.values() if index.last_step(v.id) >= 0]
    own = {}
    for v in versions:
        off = index.step_offset(v.id)
        own[v.id] = {n: [(off + s, float(x)) for s, x in pts if _finite(x)] for n, pts in lin.all_metrics(v.id).items()}
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for v in versions:
        sid = index.start_id(v.id)
        start = every[sid] if sid is not None else None
        lead = own.get(start.id, {}) if start is not None else {}
        out[v.id] = {n: ((lead.get(n) or [])[-1:] if start is not None and _same_meaning(start, v, n) else []) + pts
                     for n, pts in own[v.id].items() if pts}
    return out


def _same_meaning(a: Version, b: Version, metric: str) -> bool:
    """False where ``metric`` is the total reward or a reward component and the two versions define it differently."""
    if metric == M.REWARD_MEAN:
        return _reward_def(a) == _reward_def(b)
    if _is_component(metric):
        c = metric.split("/")[1]
        return _reward_def(a, c) == _reward_def(b, c)
    return True


def _is_component(metric: str) -> bool:
    return (metric.startswith("reward/") and metric.endswith("/mean") and metric.count("/") == 2
            and metric != M.CORRECT_MEAN)


def _reward_def(v: Version, component: str | None = None) -> str:
    """A version's reward definition (every component's weight and parameters), or one component's parameters."""
    rw = v.recipe.reward
    if component is not None:
        c = rw.get(component)
        return json.dumps(c.params if c is not None else None, sort_keys=True, default=str)
    return json.dumps({k: c.model_dump(mode="json") for k, c in rw.items()}, sort_keys=True, default=str)


def _reward_label(v: Version) -> str:
    return " + ".join(f"{c.weight:g}·{k}" + (f"{c.params}" if c.params else "") for k, c in sorted(v.recipe.reward.items()))


def _groups(versions: list[Version], key: Any) -> list[list[Version]]:
    groups: dict[str, list[Version]] = {}
    for v in versions:
        groups.setdefault(key(v), []).append(v)
    return list(groups.values())


def curve_panels(ws: Workspace, lin: ReportLineage | None = None) -> list[tuple[str, str, list[str]]]:
    """The training-curve panels, ``(title, metric, versions)``: correctness (the verifier: one definition for all),
    the total reward once per reward definition (never overlaid across versions whose rewards differ), each reward
    component once per definition of its parameters (the first :data:`~evotrainer.harness.plots.MAX_COMPONENTS` by
    name), then :data:`PLOTS`; only versions that logged the metric. ``lin``: the report's view of the store
    (:class:`ReportLineage`; None: a new one)."""
    lin = _view(ws, lin)
    index = lin.lineage_index()
    versions = [v for v in lin.versions() if index.last_step(v.id) >= 0]
    names = {v.id: set(lin.metric_names(v.id)) for v in versions}

    def having(metric: str, vs: list[Version]) -> list[str]:
        return [v.id for v in vs if metric in names[v.id]]

    panels = [("correct fraction (verifier)", M.CORRECT_MEAN, having(M.CORRECT_MEAN, versions))]
    groups = _groups(versions, _reward_def)
    panels += [("reward (total)" if len(groups) == 1 else f"reward (total) = {_reward_label(g[0])}", M.REWARD_MEAN,
                having(M.REWARD_MEAN, g)) for g in groups]
    # the first MAX_COMPONENTS by name: one panel each, and a foreign run may name thousands (review 7)
    comps = sorted({n for ns in names.values() for n in ns if _is_component(n)})[:MAX_COMPONENTS]
    for n in comps:
        c = n.split("/")[1]
        gs = _groups([v for v in versions if n in names[v.id]], lambda v, c=c: _reward_def(v, c))
        panels += [(f"reward component {c}" + ("" if len(gs) == 1 else f" {_reward_def(g[0], c)}"), n,
                    [v.id for v in g]) for g in gs]
    panels += [(t, n, having(n, versions)) for n, t in PLOTS]
    return [p for p in panels if p[2]]


def _metric_plots(ws: Workspace, lin: ReportLineage) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # drawable values only: a stored 1e308 and -1e308 on one axis overflowed matplotlib's tick layout (ValueError)
    curves = {v: {n: [p for p in pts if abs(p[1]) <= PLOT_MAX] for n, pts in per.items()}
              for v, per in lineage_curves(ws, lin).items()}
    panels = [(t, n, [v for v in vs if curves.get(v, {}).get(n)]) for t, n, vs in curve_panels(ws, lin)]
    panels = [p for p in panels if p[2]]
    if not panels:
        return "<p class='muted'>no training metrics logged yet</p>"
    versions = lin.by_id
    color = {vid: f"C{i % 10}" for i, vid in enumerate(curves)}  # one colour per version in every panel
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.9 * rows), squeeze=False)
    labels: dict[str, Any] = {}
    for ax, (title, name, vids) in zip(axes.flat, panels, strict=False):
        for vid in vids:
            pts = curves[vid][name]
            r = role(versions[vid])
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", color=color[vid],
                              ls="--" if r == "control" else "-", label=plain(vid))
            labels.setdefault(plain(vid + ("" if r == "branch" else f" ({r})")), line)
        ax.set_title(plain("\n".join(textwrap.wrap(title, 46))), fontsize=9)
        ax.set_xlabel("lineage-global step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.xaxis.get_major_locator().set_params(integer=True)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.legend(list(labels.values()), list(labels), loc="upper center", ncol=min(8, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (2.9 * rows)))
    return _png(fig)


def _global_steps(lin: ReportLineage) -> str:
    index = lin.lineage_index()  # every offset and start from one read of the parent links (review 8 M-R8)
    rows = []
    for vid in index.ids():
        last = index.last_step(vid)
        if last < 0:
            continue
        off, start = index.step_offset(vid), index.start_id(vid)
        frm = (f"{start} (its last step {index.step_offset(start) + index.last_step(start)})" if start is not None
               else "the base model")
        rows.append(f"<tr><td>{_e(vid)}</td><td>{_e(frm)}</td><td class='num'>{off}</td>"
                    f"<td class='num'>{off + last}</td></tr>")
    if not rows:
        return ""
    return ("<p class='muted'>x axis: lineage-global steps (the TensorBoard axis): a version's first step follows the "
            "last step of the version whose weights it trains from, and its curve starts at that version's last point; "
            "dashed lines are control arms. The total reward is drawn only across versions that share one reward "
            "definition.</p><table><tr><th>version</th><th>trains from</th><th>first global step</th>"
            "<th>last global step</th></tr>" + "".join(rows) + "</table>")


def _tree(lin: ReportLineage) -> str:
    versions = lin.by_id
    kids: dict[str | None, list[str]] = {}
    for v in versions.values():
        kids.setdefault(v.parent_id, []).append(v.id)

    def node(vid: str) -> str:
        v = versions[vid]
        ev = lin.kv_get(f"loop/eval/{vid}/heldout", expected=EVAL_SHAPE) or {}
        change = "base recipe" if v.parent_id is None else v.describe_change()
        head = (f"<b>{_e(vid)}</b> <span class='{_e(v.status)}'>{_e(v.status)}</span> <code>{_e(change)}</code>"
                + (f" &middot; Avg@k {_fmt(ev.get('avg@k'))}" if ev.get("avg@k") is not None else ""))
        decs = "".join(f"<div class='decision'>&#9656; <b>{_e(d.action)}</b> by {_e(d.author)}: {_e(d.rationale)}"
                       f" <span class='muted'>[evidence: {_e(', '.join(d.evidence[:6]))}]</span></div>"
                       for d in lin.decisions_brief(vid, last=20, refs=6)[0])  # (cut: review 15 A-R15)
        sub = "".join(node(c) for c in kids.get(vid, []))
        return f"<li>{head}{decs}" + (f"<ul class='tree'>{sub}</ul>" if sub else "") + "</li>"

    roots = kids.get(None, [])
    return "<ul class='tree'>" + "".join(node(r) for r in roots) + "</ul>" if roots else "<p>empty lineage</p>"


def _findings(lin: ReportLineage) -> str:
    """The findings table: at most :data:`REPORT_FINDINGS_MAX` a version, the most severe first, then a "Left out"
    row; a finding's text cut (:data:`FINDING_TEXT_CHARS`)."""
    rows = []
    for v in lin.versions():
        d = lin.kv_get(f"loop/diagnose/{v.id}", expected=DIAGNOSE_SHAPE) or {}
        items = [f for f in (d.get("findings") or v.findings or []) if isinstance(f, dict)]
        shown = capped_findings(items, REPORT_FINDINGS_MAX)
        for f in shown:
            sev = str(f.get("severity", ""))[:40]
            evidence = f.get("evidence") if isinstance(f.get("evidence"), list) else []
            rows.append(f"<tr><td>{_e(v.id)}</td><td>{_e(_cut(f.get('kind'), 200))}</td>"
                        f"<td class='{_e(sev)}'>{_e(sev)}</td>"
                        f"<td class='finding'>{_e(_cut(f.get('explanation', ''), FINDING_TEXT_CHARS))}</td>"
                        f"<td class='muted'>{_e(', '.join(_cut(x, 200) for x in evidence[:4]))}</td></tr>")
        if len(items) > len(shown):
            rows.append(f"<tr><td>{_e(v.id)}</td><td colspan='4' class='muted'>Left out: {len(items) - len(shown):,} "
                        f"more findings of this version (the report lists {REPORT_FINDINGS_MAX} a version, the most "
                        "severe first; MCP get_version or `evotrainer diagnose` has them all)</td></tr>")
    if not rows:
        return "<p class='muted'>no findings recorded</p>"
    return ("<table><tr><th>version</th><th>kind</th><th>severity</th><th>explanation</th><th>evidence</th></tr>"
            + "".join(rows) + "</table>")


def _interventions(lin: ReportLineage) -> str:
    """One row per intervention tried, at most :data:`~evotrainer.lineage.DESCRIBE_INTERVENTIONS_MAX` a version (a
    child has one, a merge two) and a row saying how many more."""
    rows = []
    for v in lin.versions():
        if not v.interventions and not v.is_control:
            continue
        gate = lin.kv_get(f"loop/gate/{v.id}", expected=dict) or {}
        es = v.eval_summary or {}
        vs_parent = es.get("vs_parent") or ({"gain": gate.get("gain"), "ci": gate.get("ci"), "version": v.parent_id}
                                            if gate.get("baseline_id", v.parent_id) == v.parent_id else None)
        vs_p, vs_c = gain_text(vs_parent), gain_text(es.get("vs_control"))
        ivs = v.interventions[:DESCRIBE_INTERVENTIONS_MAX] or [None]
        for iv in ivs:
            change = iv.describe() if iv else v.describe_change()
            rows.append(f"<tr><td>{_e(v.id)}</td><td>{_e(v.parent_id)}</td><td><code>{_e(change)}</code></td>"
                        f"<td>{_e(iv.category if iv else 'control')}</td><td>{_e(iv.hypothesis if iv else v.note)[:300]}"
                        f"</td><td>{_e(iv.source if iv else 'loop')}</td>"
                        f"<td class='{_e(v.status)}'>{_e(v.status)}</td><td>{_e(vs_c)}</td><td>{_e(vs_p)}</td></tr>")
        if len(v.interventions) > DESCRIBE_INTERVENTIONS_MAX:
            rows.append(f"<tr><td>{_e(v.id)}</td><td colspan='8' class='muted'>and "
                        f"{len(v.interventions) - DESCRIBE_INTERVENTIONS_MAX:,} more interventions of this version "
                        "(MCP get_version lists them)</td></tr>")
    if not rows:
        return "<p class='muted'>no interventions tried</p>"
    return ("<table><tr><th>version</th><th>parent</th><th>change</th><th>category</th><th>hypothesis</th>"
            "<th>source</th><th>outcome</th><th>gain vs control [95% CI]</th><th>gain vs parent [95% CI]</th></tr>"
            + "".join(rows) + "</table>")


def _analyzers(lin: ReportLineage) -> str:
    """Harness evolution: rules searched and kept (with their numbers), drafts judged, inherited analyzers
    and how they did on this run's versions, and the branches a trusted analyzer would have stopped early."""
    searched, drafts, inherited, uses, stops, stopped = [], [], [], [], [], []
    for key, items in lin.kv_items("loop/r"):
        if not key.endswith("/evolve"):
            continue
        items = lin.kv_typed(key, items, EVOLVE_SHAPE)
        rnd = key.split("/")[1]
        for a in items or []:
            t = a.get("type", "draft")
            {"synthesis": searched, "draft": drafts, "inherited": inherited, "use": uses,
             "early_stop": stops, "stopped": stopped}.get(t, drafts).append((rnd, a))
    if not any((searched, drafts, inherited, uses, stops, stopped)):
        return "<p class='muted'>no analyzer was added (no unexplained held-out move)</p>"
    parts = []
    if searched:
        tried = sum(n for _, a in searched if isinstance(n := a.get("n_candidates", 0), int))
        kept = [(r, a) for r, a in searched if a.get("registered")]
        parts.append(f"<p>Offline synthesis: {len(searched)} search(es), {tried} candidate rules tried, "
                     f"{len(kept)} kept and registered.</p>")
        rows = []
        for rnd, a in searched:
            loo = a.get("loo") or {}
            p = a.get("p_value")
            rows.append(f"<tr><td>{_e(rnd)}</td><td><code>{_e(a.get('describe') or '-')}</code></td>"
                        f"<td>{_n(a.get('n_labels', 0))} ({_n(a.get('n_bad', 0))} bad / {_n(a.get('n_good', 0))} good)</td>"
                        f"<td>{_n(a.get('n_candidates', 0))}</td><td>{_fmt(loo.get('precision'), 2)}</td>"
                        f"<td>{_fmt(loo.get('recall'), 2)}</td><td>{_fmt(p)}</td>"
                        f"<td>{'yes' if a.get('registered') else 'no'}</td><td>{_e(a.get('reason', ''))}</td></tr>")
        parts.append("<table><tr><th>round</th><th>best rule</th><th>labels</th><th>candidates</th>"
                     "<th>precision (leave-one-out)</th><th>recall (leave-one-out)</th><th>permutation p</th>"
                     "<th>kept</th><th>why</th></tr>" + "".join(rows) + "</table>")
    if drafts:
        parts.append("<table><tr><th>version</th><th>drafted analyzer</th><th>registered</th><th>why</th></tr>" + "".join(
            f"<tr><td>{_e(a.get('version'))}</td><td>{_e(a.get('name') or '-')}</td>"
            f"<td>{'yes' if a.get('registered') else 'no'}</td><td>{_e(a.get('reason', ''))}</td></tr>"
            for _, a in drafts) + "</table>")
    if inherited:
        parts.append("<p>Inherited from earlier runs: " + ", ".join(
            f"<code>{_e(a.get('name'))}</code> ({_e(a.get('reason', ''))})" for _, a in inherited) + "</p>")
    if uses:
        fired = [a for _, a in uses if a.get("fired")]
        right = sum(bool(a.get("correct")) for a in fired)
        parts.append(f"<p>Used on this run's decided versions: {len(uses)} checks, fired {len(fired)} times, "
                     f"{right} of them on a version that turned out bad.</p><table><tr><th>analyzer</th>"
                     "<th>version</th><th>fired</th><th>outcome</th><th>from</th></tr>" + "".join(
                         f"<tr><td>{_e(a.get('name'))}</td><td>{_e(a.get('version'))}</td>"
                         f"<td>{'yes' if a.get('fired') else 'no'}</td><td>{'bad' if a.get('bad') else 'good'}</td>"
                         f"<td>{_e(a.get('origin') or '')}</td></tr>" for _, a in uses) + "</table>")
    if stopped:
        parts.append("<p>Branches stopped mid-training by an analyzer (pruned unevaluated):</p><ul>" + "".join(
            f"<li>{_e(a.get('version'))}: stopped by <code>{_e(a.get('analyzer'))}</code> after {_n(a.get('at_step'))} of "
            f"{_n(a.get('steps_total'))} steps ({_e(a.get('reason', ''))}); saved {_n(a.get('saved_steps', 0))} steps, about "
            f"{_n(a.get('saved_tokens', 0))} train tokens, and the dev evaluation</li>" for _, a in stopped) + "</ul>")
    if stops:
        parts.append("<p>Decisions it would change (early stop at half the training steps):</p><ul>" + "".join(
            f"<li>{_e(a.get('version'))}: {'stop' if a.get('stop') else 'continue'}"
            f" ({_e(a.get('reason', ''))}); saves {_n(a.get('saved_steps', 0))} steps; actual outcome "
            f"{_e(a.get('actual'))}, {'right' if a.get('right') else 'wrong'}</li>" for _, a in stops) + "</ul>")
    return "".join(parts)


def _skills(lin: ReportLineage) -> str:
    used: dict[str, list[str]] = {}
    for key, prop in lin.kv_items("loop/r"):
        if key.endswith("/propose"):
            prop = lin.kv_typed(key, prop, PROPOSE_SHAPE) or {}
            for sid in prop.get("skills_used", []):
                used.setdefault(sid, []).append(f"proposed for {prop.get('parent_id')}")
    for v in lin.versions():
        for iv in v.interventions[:DESCRIBE_INTERVENTIONS_MAX]:  # (E2-R16: a crafted version held 1,000)
            if iv.source.startswith("skill:"):
                used.setdefault(iv.source.split(":", 1)[1], []).append(f"{v.id} ({v.status}): {iv.describe()}")
    if not used:
        return "<p class='muted'>no skill from memory was used</p>"
    return ("<table><tr><th>skill</th><th>use</th></tr>" + "".join(
        f"<tr><td><code>{_e(k)}</code></td><td>{_e('; '.join(v))}</td></tr>" for k, v in sorted(used.items()))
            + "</table>")


def _budget_text(budget: dict[str, Any]) -> str:
    """``max_versions 3, steps_per_version 2, ...`` of the run config's budget (unset limits left out)."""
    return ", ".join(f"{k} {v}" for k, v in budget.items() if v is not None) or "-"


def render_html(ws: Workspace, lin: ReportLineage | None = None) -> str:
    """The report as one HTML string (see the module docstring).

    The store is read through one :class:`ReportLineage` (``lin``; None: a new one): the versions once, the kv values
    under :data:`REPORT_KV_MAX_CHARS` together; what was left out (kv values past the budget, findings past
    :data:`REPORT_FINDINGS_MAX` a version) is said at the top of the report."""
    lin = _view(ws, lin)
    cfg = lin.kv_get("loop/config", expected=CONFIG_SHAPE) or {}
    mode = lin.kv_get("loop/mode", "evotrainer", expected=str)
    usage = lin.kv_get("loop/usage", expected=USAGE_SHAPE) or {}
    rows = score_rows(ws, lin)
    score_tbl = "".join(
        f"<tr><td>{_e(r['name'])}</td><td>{_e(r['role'])}</td><td class='{_e(r['status'])}'>{_e(r['status'])}</td>"
        f"<td>{_fmt(r['avg'])}</td>"
        f"<td>{'[' + _fmt(r['ci'][0]) + ', ' + _fmt(r['ci'][1]) + ']' if r['ci'] else ''}</td>"
        f"<td>{_fmt(r['pass'])}</td><td>{_e(r['k'])}</td><td>{_e(gain_text(r.get('vs_control')))}</td>"
        f"<td>{_e(gain_text(r.get('vs_parent')))}</td></tr>" for r in rows)
    budget = cfg.get("budget", {})
    started = lin.kv_get("loop/started_at", expected=(int, float))
    head = (f"<p class='muted'>run <code>{_e(ws.root)}</code> &middot; mode <b>{_e(mode)}</b> &middot; brain "
            f"<b>{_e(lin.kv_get('loop/brain', '-'))}</b> &middot; model <code>"
            f"{_e(cfg.get('recipe', {}).get('model', {}).get('name_or_path', '?'))}</code> &middot; task "
            f"{_e(cfg.get('recipe', {}).get('data', {}).get('task', '?'))} level "
            f"{_e(cfg.get('recipe', {}).get('data', {}).get('level', '?'))} &middot; budget {_e(_budget_text(budget))}"
            + (f" &middot; report_to {_e(', '.join(cfg['report_to']) or 'none')}" if "report_to" in cfg else "")
            + (f" &middot; started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}" if started else "")
            + f" &middot; {_finished_text(lin)}</p>")
    use = ""
    if usage.get("turns"):
        use = (f"<h2>Brain usage</h2><p>{_e(usage.get('model', ''))}: {_n(usage.get('calls', 0))} role calls, "
               f"{_n(usage.get('turns', 0))} model turns, {_n(usage.get('input_tokens', 0))} input + "
               f"{_n(usage.get('output_tokens', 0))} output tokens, ${usage.get('cost_usd', 0):.4f}; "
               f"{_n(usage.get('fallbacks', 0))} fallbacks to the heuristic brain</p>")
    sections = {"best": _best_block(ws, lin), "recipes": _recipe_table(ws, lin), "compute": _compute_and_test(lin),
                "samples": _samples(ws, lin), "tree": _tree(lin), "steps": _global_steps(lin) + _metric_plots(ws, lin),
                "findings": _findings(lin), "interventions": _interventions(lin), "analyzers": _analyzers(lin),
                "skills": _skills(lin)}
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>EvoTrainer report: {_e(ws.root.name)}</title>
<style>{CSS}</style></head><body>
<h1>EvoTrainer run report</h1>{head}{_left_out(lin)}
{sections["best"]}
<h2 id="scores">Held-out (dev) scores</h2>
<table id="score-table"><tr><th>version</th><th>role</th><th>status</th><th>Avg@k</th><th>95% CI (bootstrap over problems)</th><th>pass@k</th><th>k</th><th>gain vs control [95% CI]</th><th>gain vs parent [95% CI]</th></tr>{score_tbl}</table>
{_score_plot(rows)}
<h2 id="recipes">Recipe and compute per version</h2>{sections["recipes"]}
<h2 id="compute">Compute and test</h2>{sections["compute"]}
<h2 id="sample-completions">Sample completions: best version beside the base model</h2>{sections["samples"]}
<h2 id="lineage">Lineage and decisions</h2>{sections["tree"]}
<h2 id="global-steps">Training curves on the lineage-global step axis</h2>{sections["steps"]}
<h2 id="findings">Findings</h2>{sections["findings"]}
<h2 id="interventions">Interventions tried</h2>{sections["interventions"]}
<h2 id="analyzers">Analyzers added</h2>{sections["analyzers"]}
<h2 id="skills">Skills used</h2>{sections["skills"]}
{use}
<p class="muted">generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} by evotrainer report</p>
</body></html>"""


def _left_out(lin: ReportLineage) -> str:
    """The report's note of the run-level (kv) values it did not read (past :data:`REPORT_KV_MAX_CHARS`), "" when
    it read them all."""
    notes = _data_left_out(lin)
    if not lin.left_out:
        return notes
    keys = sorted(lin.left_out)
    shown = ", ".join(f"<code>{_e(_cut(k, 120))}</code> ({n:,})" for k, n in
                      ((k, lin.left_out[k]) for k in keys[:10]))
    more = f" and {len(keys) - 10:,} more" if len(keys) > 10 else ""
    return (f"<p id='left-out' class='warn'>Left out of this report: {len(keys):,} run-level records of "
            f"{sum(lin.left_out.values()):,} characters in all (characters in brackets), past the "
            f"{REPORT_KV_MAX_CHARS:,} one report reads: {shown}{more}. The sections that use them show less (a crafted "
            "or damaged run folder? EvoTrainer writes a few KB a version)</p>" + notes)


def _data_left_out(lin: ReportLineage) -> str:
    """The report's note of the eval matrices it left out (past :data:`REPORT_EVAL_SAMPLES_MAX`) and the versions
    whose metric series it thinned or left out (:data:`REPORT_METRIC_POINTS_MAX`), "" when it read them whole."""
    out = ""
    if lin.evals_left_out:
        items = sorted(lin.evals_left_out.items())
        shown = ", ".join(f"<code>{_e(_cut(v, 80))}</code> {_e(_cut(name, 80))} ({n:,})" for (v, name), n in items[:10])
        more = f" and {len(items) - 10:,} more" if len(items) > 10 else ""
        out += (f"<p id='evals-left-out' class='warn'>Left out of this report: {len(items):,} eval matrices of "
                f"{sum(lin.evals_left_out.values()):,} samples in all (samples in brackets), past the "
                f"{lin.eval_budget:,} one report reads: {shown}{more}. Their versions show no confidence "
                "interval or paired gain here</p>")
    if lin.metrics_cut:
        items2 = sorted(lin.metrics_cut.items())
        gone = [v for v, (_, kept) in items2 if kept == 0]
        shown = ", ".join(f"<code>{_e(_cut(v, 80))}</code> ({rows:,} -> {kept:,})" for v, (rows, kept) in items2[:10])
        more = f" and {len(items2) - 10:,} more" if len(items2) > 10 else ""
        out += (f"<p id='metrics-left-out' class='warn'>Thinned in this report: the metric series of "
                f"{len(items2):,} version{'' if len(items2) == 1 else 's'} (points stored -> read; {len(gone):,} left out whole), past "
                f"{REPORT_SERIES_POINTS_MAX:,} points a series or the {lin.points_budget:,} one report reads: "
                f"{shown}{more}. Their curves are drawn from fewer points</p>")
    return out


def write_report(ws: Workspace, name: str = "report.html", lin: ReportLineage | None = None) -> Path:
    """Write the report to ``RUN/reports/<name>``; returns its path. ``lin``: the report's view of the store
    (:class:`ReportLineage`; None: a new one)."""
    out = folder_inside(ws.root, "reports") / name  # no link followed: the run folder may come from elsewhere
    replace_file(out, render_html(ws, lin).encode("utf-8"), root=ws.root)
    return out


def _two_lines(point: str, ci: tuple[float, float] | list[float] | None, fmt: str) -> str:
    return point + (f"\n[{ci[0]:{fmt}}, {ci[1]:{fmt}}]" if isinstance(ci, (list, tuple)) and len(ci) == 2 else "")


def _gain_cell_text(g: dict[str, Any] | None) -> str:
    if not g or not isinstance(g.get("gain"), (int, float)):
        return ""
    return _two_lines(f"{g['gain']:+.3f} ({g.get('version')})", g.get("ci"), "+.3f")


def _finished_text(lin: Any) -> str:
    """``finished 2026-12-03 17:30 UTC`` (runs before ``loop/finished_at`` was kept: ``finished``), or
    ``in progress / interrupted``."""
    if not lin.kv_get("loop/finished"):
        return "in progress / interrupted"
    at = lin.kv_get("loop/finished_at")
    ok = isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at) and 0 <= at < 1e11
    return f"finished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(at))}" if ok else "finished"


def answer_line(ws: Workspace, lin: ReportLineage | None = None) -> str:
    """One line for the terminal under :func:`summary_table`: the run's answer (the version the HTML report's
    best-version block and ``run_summary``'s ``final_version`` name), where it comes from, its dev Avg@k with CI,
    once the run has finished its test Avg@k beside the no-RL model's (what ``evotrainer run`` printed at its end),
    the best kept version when that is another one, and its checkpoint; "" for a run without an answer yet.
    ``lin``: the report's view of the store (:class:`ReportLineage`; None: a new one)."""
    lin = _view(ws, lin)
    b = best_version(ws, lin)
    if not b:
        return ""
    dev, ci = b["dev"], b["dev_ci"]
    parts = [f"answer: {b['version']} ({b['source']}, {b['role']})"]
    if dev.get("avg@k") is not None:
        parts.append(f"dev Avg@{dev.get('k', 'k')} {_fmt(dev['avg@k'])}"
                     + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else ""))
    if b.get("test"):  # the run has finished: its test split was scored once, for this answer
        t, n = b["test"], b.get("no_rl_test") or {}
        parts.append(f"test Avg@{t.get('k', 'k')} {_fmt(t.get('avg@k'))} on {t.get('n_problems', '?')} problems"
                     + (f" (no-RL {_fmt(n['avg@k'])})" if n.get("avg@k") is not None else ""))
    kept = best_kept(lin)
    if kept and kept != b["version"]:
        parts.append(f"best kept on dev: {kept}")
    if b["checkpoint"]:
        parts.append(f"checkpoint {b['checkpoint']}")
    return "; ".join(parts)


def summary_table(ws: Workspace, lin: ReportLineage | None = None) -> Any:
    """A rich table for the terminal, readable at 80 columns: per version status, change, Avg@k with its CI and the
    gains over control and parent with theirs (the no-RL row first). A number and its CI are two lines of one
    cell that never wrap; only the change folds. ``lin``: the report's view of the store (None: a new one)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    # store text (names, statuses, change descriptions) as Text, neutralised: never markup, never raw controls
    # (T1-R19: a crafted version id's ESC]0;... ESC[2J reached the terminal; a "[/x]" in one raised MarkupError)
    t = Table(title=Text(f"EvoTrainer run {neutralise(ws.root.name)}"), box=box.SIMPLE_HEAD, show_edge=False,
              padding=(0, 0))
    for c in ("version", "status", "change"):  # text folds over lines at 80 columns, never cut
        t.add_column(c, overflow="fold", ratio=1 if c == "change" else None, min_width=12 if c == "change" else None)
    rows = score_rows(ws, lin)
    t.add_column("Avg@k\n[95% CI]", no_wrap=True, justify="right")  # "[0.250, 0.500]" never splits
    gains = [c for c in ("vs_control", "vs_parent") if any(r.get(c) for r in rows)]  # only where a gain exists
    for c in gains:
        t.add_column(c.replace("_", " ") + "\n[95% CI]", no_wrap=True, justify="right")
    for r in rows:
        name = "no-RL" if r["role"] == "baseline" else r["name"]
        change = "base model, no RL" if r["role"] == "baseline" else r.get("change", "")
        t.add_row(Text(neutralise(str(name))), Text(neutralise(str(r["status"]))), Text(neutralise(str(change))),
                  _two_lines(_fmt(r["avg"]), r["ci"], ".3f"),
                  *(Text(neutralise(_gain_cell_text(r.get(c)))) for c in gains))
    return t
