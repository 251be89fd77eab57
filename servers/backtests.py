"""Backtest and gate tools of the analyzer server (``harness.backtest``, ``harness.gate``).

Tools: ``rescore_rollouts`` (judge a reward change on stored rollouts), ``replay_filter`` (judge a
group-filter change on stored groups), ``check_inert`` (can a change act at all under the recipe?),
``backtest_analyzer`` (precision / recall of an analyzer on versions of known outcome) and ``gate_version``
(the promotion gate: held-out gain CI above 0 and no blocking finding); :data:`TOOLS` lists them. All of them
judge a change before paying for training.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from evotrainer.harness import analyzers as reg
from evotrainer.harness.backtest import backtest_analyzer as run_backtest
from evotrainer.harness.backtest import inert_change
from evotrainer.harness.backtest import replay_filter as replay
from evotrainer.harness.backtest import rescore_rollouts as rescore
from evotrainer.harness.gate import gate
from evotrainer.recipe import RecipeError, current_value, set_path
from evotrainer.servers.analysis import FindingInfo, evidence_of, finding_info, sync_registry
from evotrainer.servers.common import JsonValue, ToolContext, require_version, state_of
from evotrainer.workspace import Workspace

FILTER_PATHS = ("drop_zero_variance_groups", "dynamic_filtering", "dynamic_filtering_range", "group_filter_top_p")


class RescoreInfo(BaseModel):
    """Stored vs re-scored rewards of a version's rollouts under a changed reward."""

    version_id: str
    path: str
    old_value: JsonValue
    new_value: JsonValue
    n_rollouts: int
    n_groups: int
    old_reward_mean: float
    new_reward_mean: float
    corr_with_correct_old: float | None = Field(description="Pearson correlation of the stored reward with "
                                                            "correctness (null when undefined).")
    corr_with_correct_new: float | None = Field(description="Same for the re-scored reward: a rise means the "
                                                            "reward tracks correctness better.")
    frac_groups_best_changed: float = Field(description="Groups whose best sample changes.")
    frac_advantage_sign_flips: float
    frac_zero_std_old: float = Field(description="Zero-variance groups before (no learning signal).")
    frac_zero_std_new: float
    summary: dict[str, Any] = Field(description="Full harness summary (per version, component means, Kendall tau).")


class FilterSide(BaseModel):
    """Replay of one filter setting over a version's steps."""

    settings: dict[str, Any]
    kept_frac_mean: float | None = Field(description="Mean fraction of groups kept per step.")
    effective_batch_mean: float | None = Field(description="Mean kept samples per step.")
    reward_std_kept_mean: float | None
    per_step_kept_frac: list[float]


class FilterReplayInfo(BaseModel):
    """A group-filter change replayed on stored groups: current settings vs changed."""

    version_id: str
    path: str
    steps: list[int]
    old: FilterSide
    new: FilterSide
    informative_frac_old: float | None = Field(description="Kept (informative) group fraction, current filter.")
    informative_frac_new: float | None = Field(description="Kept (informative) group fraction, changed filter.")


class InertInfo(BaseModel):
    """Whether a single-factor change can act at all under the version's recipe (harness ``inert_change``)."""

    version_id: str
    path: str
    old_value: JsonValue
    new_value: JsonValue
    inert: bool = Field(description="True: the change cannot move training under this recipe; do not train it.")
    check: str = Field(description="structural | clip_bound | coefficient | no_behaviour | none.")
    reason: str = Field(description="Why, with the numbers.")
    data: dict[str, Any]


class AnalyzerBacktestInfo(BaseModel):
    """Confusion counts of an analyzer on versions of known outcome (bad = pruned / reverted / failed)."""

    analyzer: str
    tp: int
    fp: int
    fn: int
    tn: int
    precision: float | None = Field(description="TP / (TP + FP); null when it never fired.")
    recall: float | None = Field(description="TP / (TP + FN); null when no version is bad.")
    fired: dict[str, bool]
    outcomes: dict[str, bool] = Field(description="{version: true if bad}.")
    discriminates: bool = Field(description="Both outcomes present and it fires more often on bad versions than "
                                            "on good ones (recall > false-positive rate).")


class GateInfo(BaseModel):
    """The promotion gate's verdict and what it rests on."""

    version_id: str
    parent_id: str | None
    promote: bool
    gain: float | None = Field(description="Held-out Avg@k gain over the parent (paired problems).")
    ci: list[float] | None = Field(description="Bootstrap CI of the gain at `confidence`.")
    p_value: float | None = Field(description="Two-sided paired permutation p-value.")
    confidence: float
    n_problems: int
    blocking: list[FindingInfo]
    evidence: list[str]
    reason: str
    below_sources: list[str] = Field(default_factory=list,
                                     description="For a merge: source siblings that score higher on held-out.")
    baseline_id: str | None = Field(None, description="What `gain` is measured against: the control arm, else the parent.")
    control_id: str | None = Field(None, description="The round's control arm (the parent's recipe continued).")
    is_control: bool = Field(False, description="The version is a control arm (gated against its parent).")
    gain_vs_parent: float | None = Field(None, description="Dev Avg@k gain over the parent.")
    ci_vs_parent: list[float] | None = Field(None, description="Bootstrap CI of gain_vs_parent.")
    score: float | None = Field(None, description="Dev Avg@k of the version on the paired problems.")
    damaged_weights: str | None = Field(None, description="Kind of a blocking finding on this version that damages its "
                                                          "weights; pass it to `decide` with a prune or revert.")


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def _corr(x: Any, y: Any) -> float | None:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    m = np.isfinite(x) & np.isfinite(y)
    if m.sum() < 2 or np.ptp(x[m]) == 0 or np.ptp(y[m]) == 0:
        return None
    return float(np.corrcoef(x[m], y[m])[0, 1])


def _train_rollouts(ws: Workspace, version_id: str) -> pa.Table:
    vid = version_id.replace("'", "''")
    t = ws.rollouts.to_arrow(where=f"version_id = '{vid}' AND split = 'train'")
    if t.num_rows == 0:
        raise ToolError(f"{version_id} has no stored train rollouts; backtest on a trained version (its parent)")
    return t


def rescore_rollouts(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="Trained version whose stored rollouts to re-score.")],
    path: Annotated[str, Field(description="Reward path to change, e.g. 'reward.format.weight'.")],
    value: Annotated[JsonValue, Field(description="New value (null removes a reward component).")],
) -> RescoreInfo:
    """Re-score a version's stored rollouts under a changed reward (the trainer's own reward code) and
    recompute group advantages: does the new reward track correctness better, and how many groups change?"""
    ws = state_of(ctx).workspace()
    v = require_version(ws, version_id)
    if not path.startswith("reward."):
        raise ToolError(f"path {path!r}: rescore_rollouts judges reward changes (reward.*); use replay_filter for "
                        f"{', '.join(FILTER_PATHS)}")
    changed = set_path(v.recipe, path, value)  # validates the path and the value
    old = current_value(v.recipe, path)
    t = _train_rollouts(ws, version_id)
    res = rescore(t, changed.to_dict()["reward"], generate_max_len=v.recipe.generate_max_len,
                  task=v.recipe.data.task, estimator=v.recipe.advantage_estimator)
    s = res.summary
    correct = t.column("correct").to_numpy()
    return RescoreInfo(
        version_id=version_id, path=path, old_value=old, new_value=value, n_rollouts=s["n_rollouts"],
        n_groups=s["n_groups"], old_reward_mean=s["old_reward_mean"], new_reward_mean=s["new_reward_mean"],
        corr_with_correct_old=_corr(res.old_reward, correct), corr_with_correct_new=_corr(res.new_reward, correct),
        frac_groups_best_changed=s["frac_groups_best_changed"],
        frac_advantage_sign_flips=s["frac_advantage_sign_flips"], frac_zero_std_old=s["frac_zero_std_old"],
        frac_zero_std_new=s["frac_zero_std_new"],
        summary={k: (_num(x) if isinstance(x, float) else x) for k, x in s.items()})


def replay_filter(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="Trained version whose stored groups to replay.")],
    path: Annotated[str, Field(description=f"Filter setting to change: {', '.join(FILTER_PATHS)}.")],
    value: Annotated[JsonValue, Field(description="New value, e.g. true, 0.5 or [0.1, 0.9].")],
) -> FilterReplayInfo:
    """Replay a changed group filter on a version's stored groups, step by step: kept (informative) group
    fraction and effective batch under the current and the changed setting."""
    ws = state_of(ctx).workspace()
    v = require_version(ws, version_id)
    if path not in FILTER_PATHS:
        raise ToolError(f"path {path!r}: replay_filter judges group-filter settings ({', '.join(FILTER_PATHS)}); "
                        "use rescore_rollouts for reward.* paths")
    changed = set_path(v.recipe, path, value)  # validates the value
    t = _train_rollouts(ws, version_id)
    sides = []
    for recipe in (v.recipe, changed):
        r = replay(t, version_id, recipe)
        s = r.summary()
        sides.append(FilterSide(settings={k: recipe.to_dict()[k] for k in FILTER_PATHS},
                                kept_frac_mean=_num(s["kept_frac_mean"]),
                                effective_batch_mean=_num(s["effective_batch_mean"]),
                                reward_std_kept_mean=_num(s["reward_std_kept_mean"]),
                                per_step_kept_frac=[float(x) for x in r.kept_frac]))
    return FilterReplayInfo(version_id=version_id, path=path, steps=[int(x) for x in r.steps], old=sides[0],
                            new=sides[1], informative_frac_old=sides[0].kept_frac_mean,
                            informative_frac_new=sides[1].kept_frac_mean)


def check_inert(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="Trained parent version whose recipe and records to judge on.")],
    path: Annotated[str, Field(description="Recipe path to change, e.g. 'eps_clip_high' or 'reward.repetition.weight'.")],
    value: Annotated[JsonValue, Field(description="New value.")],
) -> InertInfo:
    """Would this change act at all under the parent's recipe? Inert: a clip bound no ratio reaches, a
    coefficient change too small to move the update, a penalty for a behaviour that never occurs in the
    stored rollouts, a setting another one switches off. An inert change trains like its parent: skip it."""
    ws = state_of(ctx).workspace()
    v = require_version(ws, version_id)
    try:
        res = inert_change(v.recipe, path, value, evidence_of(ws, [version_id]), version_id)
    except RecipeError as exc:
        raise ToolError(str(exc)) from None
    return InertInfo(version_id=version_id, path=path, old_value=res.old, new_value=value, inert=res.inert,
                     check=res.check, reason=res.reason,
                     data={k: (_num(x) if isinstance(x, float) else x) for k, x in res.data.items()})


def backtest_analyzer(
    ctx: ToolContext,
    name: Annotated[str | None, Field(description="A registered analyzer (list_analyzers).")] = None,
    code: Annotated[str | None, Field(description="Or analyzer code, run sandboxed (run_analyzer_code "
                                                  "contract).", max_length=200_000)] = None,
    labels: Annotated[dict[str, bool] | None, Field(description="{version_id: true if the version turned out "
                                                                "bad}; default: from decisions (pruned / "
                                                                "reverted / failed bad, kept / merged good).")]
    = None,
    kinds: Annotated[list[str] | None, Field(description="Count only findings of these kinds.")] = None,
    min_severity: Annotated[str, Field(description="Least severity that counts as firing: warn or blocking.")]
    = "warn",
) -> AnalyzerBacktestInfo:
    """Backtest an analyzer (registered or code) on versions of known outcome: does it fire on the bad
    versions and stay quiet on the good ones? Register it only when it discriminates."""
    if (name is None) == (code is None):
        raise ToolError("pass exactly one of name (a registered analyzer) or code (analyzer source)")
    if min_severity not in ("warn", "blocking"):
        raise ToolError(f"min_severity={min_severity!r}: use warn or blocking")
    ws = state_of(ctx).workspace()
    sync_registry(ws)
    if name is not None:
        reg.get_analyzer(name)
    ev = evidence_of(ws, sorted(labels) if labels else None)
    fn = name if name is not None else (lambda e: reg.run_analyzer_code(code, e, name="candidate"))
    bt = run_backtest(fn, ev, outcomes=labels, kinds=tuple(kinds) if kinds else None, min_severity=min_severity)
    n_bad = bt.tp + bt.fn
    n_good = bt.fp + bt.tn
    disc = bool(n_bad and n_good and bt.tp / n_bad > bt.fp / n_good)
    return AnalyzerBacktestInfo(analyzer=name or "candidate", tp=bt.tp, fp=bt.fp, fn=bt.fn, tn=bt.tn,
                                precision=_num(bt.precision), recall=_num(bt.recall), fired=bt.fired,
                                outcomes=dict(bt.outcomes), discriminates=disc)


def gate_version(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="Version to judge against its parent.")],
    eval_name: Annotated[str, Field(description="Held-out evaluation to compare.")] = "heldout",
    confidence: Annotated[float, Field(description="Confidence of the bootstrap CI.", gt=0.5, lt=1)] = 0.95,
    n_resamples: Annotated[int, Field(description="Bootstrap / permutation resamples.", ge=100, le=200_000)]
    = 10_000,
    seed: Annotated[int, Field(description="Seed of the resampling (reproducible).")] = 0,
) -> GateInfo:
    """The promotion gate: keep a version only if its held-out gain over the parent has a CI above 0 and no
    blocking finding stands against it (paired bootstrap + permutation test on the same problems)."""
    ws = state_of(ctx).workspace()
    require_version(ws, version_id)
    scope = sync_registry(ws)
    g = gate(ws, version_id, eval_name=eval_name, confidence=confidence, n_resamples=n_resamples, seed=seed,
             analyzer_names=scope)
    return GateInfo(version_id=g.version_id, parent_id=g.parent_id, promote=g.promote, gain=_num(g.gain),
                    ci=list(g.ci) if g.ci else None, p_value=_num(g.p_value), confidence=g.confidence,
                    n_problems=g.n_problems, blocking=[finding_info(f) for f in g.blocking],
                    evidence=list(g.evidence), reason=g.reason, below_sources=list(g.below_sources),
                    baseline_id=g.baseline_id, control_id=g.control_id, is_control=g.is_control,
                    gain_vs_parent=_num(g.gain_vs_parent), score=_num(g.score),
                    ci_vs_parent=list(g.ci_vs_parent) if g.ci_vs_parent else None,
                    damaged_weights=g.damaged_weights)


TOOLS = (rescore_rollouts, replay_filter, check_inert, backtest_analyzer, gate_version)
"""The backtest and gate tools, in catalogue order (served by the analyzer server)."""
