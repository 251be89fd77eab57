"""Backtests: judge a change without training (DESIGN.md §4).

* :func:`rescore_rollouts`: score stored rollouts again under a changed reward spec (with
  ``evotrainer.rl_backend.rewards.compute_rewards``, the trainer's own reward code) and recompute
  group advantages (``rl_backend.grpo.group_advantages``): how would rewards, advantages and the
  ranking of samples within each group have changed?
* :func:`replay_filter`: replay a group filter (zero-variance drop, dynamic sampling range, top-p by
  reward std; the trainer's pure filter functions in ``rl_backend.grpo``) on stored groups: kept
  fraction, effective batch and reward std per step, next to the kept fraction the trainer logged.
* :func:`backtest_analyzer`: run an analyzer on versions whose outcome is known and score it
  (precision / recall: does it fire on the bad versions only?).

The harness imports ``rl_backend`` here (a sibling package) so that backtests and training
share one implementation of rewards, advantages and filters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding

from evotrainer import metrics as M


def _groups(table: pa.Table) -> list[tuple[str, int, str, np.ndarray]]:
    """``[(version, step, group_id, row indices ordered by sample_idx)]`` in (version, step, group) order."""
    import pandas as pd

    df = pd.DataFrame({"v": table.column("version_id").to_numpy(zero_copy_only=False),
                       "s": table.column("step").to_numpy(),
                       "g": table.column("group_id").to_numpy(zero_copy_only=False),
                       "i": table.column("sample_idx").to_numpy() if "sample_idx" in table.column_names
                       else np.zeros(table.num_rows, dtype=np.int64)})
    df["row"] = np.arange(len(df))
    df = df.sort_values(["v", "s", "g", "i"], kind="stable")
    return [(v, int(s), g, sub["row"].to_numpy()) for (v, s, g), sub in df.groupby(["v", "s", "g"], sort=False)]


def _advantages(rewards: np.ndarray, groups: list[np.ndarray], estimator: str) -> np.ndarray:
    """Per-row group advantages with ``rl_backend.grpo.group_advantages``, batched by group size."""
    import torch
    from evotrainer.rl_backend.grpo import group_advantages

    out = np.zeros(len(rewards))
    by_size: dict[int, list[np.ndarray]] = {}
    for rows in groups:
        by_size.setdefault(len(rows), []).append(rows)
    for size, members in by_size.items():
        idx = np.concatenate(members)  # groups contiguous, G = size each
        if size < 2:
            continue
        adv = group_advantages(torch.tensor(rewards[idx], dtype=torch.float64), size, estimator=estimator)
        out[idx] = adv.numpy()
    return out


@dataclass
class RescoreResult:
    """Stored vs re-scored rewards of B rollouts (arrays ``(B,)`` in table row order) and their summary."""

    rollout_ids: list[str]
    old_reward: np.ndarray
    new_reward: np.ndarray
    old_advantage: np.ndarray
    new_advantage: np.ndarray
    new_components: dict[str, np.ndarray]
    summary: dict[str, Any] = field(default_factory=dict)


def rescore_rollouts(rollouts: pa.Table, reward_spec: Mapping[str, Any], *, generate_max_len: int,
                     task: str = "arithmetic", estimator: str = "group_norm",
                     extras: Mapping[str, Any] | None = None) -> RescoreResult:
    """Re-score stored rollouts under ``reward_spec`` and recompute group advantages.

    Args:
        rollouts: rows in the rollout-store schema (one or more versions / steps).
        reward_spec: ``{component: {"weight", "params"}}`` (a recipe's ``reward``).
        generate_max_len: the length cap the rollouts were sampled with (tokens; overlong shaping).
        task: task family of the problems (``recipe.data.task``), for correctness and format.
        estimator: advantage estimator (``recipe.advantage_estimator``).
        extras: per-sample episode outcomes for behaviour components (SWE), ``{name: (B,)}``.

    Returns:
        :class:`RescoreResult`. ``summary`` holds mean rewards (old / new, per version), the
        fraction of groups whose best sample changes, the fraction of samples whose advantage
        flips sign, the mean within-group Kendall tau between old and new rewards, and the
        fraction of zero-variance groups before / after.

    Raises:
        ValueError: an empty table.
        RewardError: a component cannot be computed (e.g. missing extras).
    """
    from evotrainer.rl_backend.rewards import compute_rewards
    from evotrainer.rl_backend.tasks import Problem
    from scipy.stats import kendalltau

    if rollouts is None or rollouts.num_rows == 0:
        raise ValueError("no rollouts to re-score; pass a table with at least one row")
    d = rollouts.select([c for c in ("rollout_id", "version_id", "prompt_id", "prompt", "answer", "completion",
                                     "finish_reason", "length", "reward", "advantage")
                         if c in rollouts.column_names]).to_pydict()
    problems = [Problem(id=str(p), prompt=q or "", answer=str(a or ""), meta={"task": task})
                for p, q, a in zip(d["prompt_id"], d["prompt"], d["answer"], strict=True)]
    out = compute_rewards(reward_spec, problems, d["completion"], finish_reasons=d["finish_reason"],
                          lengths=d["length"], generate_max_len=generate_max_len, extras=extras)
    old = np.asarray(d["reward"], dtype=np.float64)
    new = np.asarray(out.total, dtype=np.float64)
    groups = _groups(rollouts)
    rows = [g[3] for g in groups]
    old_adv = np.asarray(d.get("advantage") or _advantages(old, rows, estimator), dtype=np.float64)
    new_adv = _advantages(new, rows, estimator)
    best_changed, taus, zero_old, zero_new = 0, [], 0, 0
    for r in rows:
        zero_old += np.ptp(old[r]) <= 1e-9
        zero_new += np.ptp(new[r]) <= 1e-9
        if len(r) >= 2:
            best_changed += int(np.argmax(old[r]) != np.argmax(new[r]))
            if np.ptp(old[r]) > 0 and np.ptp(new[r]) > 0:
                taus.append(kendalltau(old[r], new[r]).statistic)
    versions = d["version_id"]
    per_version = {}
    for v in dict.fromkeys(versions):
        m = np.array([x == v for x in versions])
        per_version[v] = {"old_reward": float(old[m].mean()), "new_reward": float(new[m].mean()), "n": int(m.sum())}
    summary = {
        "n_rollouts": len(old), "n_groups": len(rows),
        "old_reward_mean": float(old.mean()), "new_reward_mean": float(new.mean()),
        "reward_change": float(new.mean() - old.mean()),
        "per_version": per_version,
        "component_means": {k: float(np.mean(vals)) for k, vals in out.components.items()},
        "correct_mean": float(np.nanmean(out.correct)) if not all(math.isnan(c) for c in out.correct) else None,
        "frac_groups_best_changed": best_changed / max(1, sum(len(r) >= 2 for r in rows)),
        "frac_advantage_sign_flips": float(np.mean(np.sign(old_adv) != np.sign(new_adv))),
        "mean_group_kendall_tau": float(np.mean(taus)) if taus else None,
        "frac_zero_std_old": float(zero_old / len(rows)), "frac_zero_std_new": float(zero_new / len(rows)),
    }
    return RescoreResult(rollout_ids=list(d.get("rollout_id") or []), old_reward=old, new_reward=new,
                         old_advantage=old_adv, new_advantage=new_adv,
                         new_components={k: np.asarray(v) for k, v in out.components.items()}, summary=summary)


def filter_keep(rewards: np.ndarray, group_size: int, *, drop_zero_variance_groups: bool = True,
                dynamic_filtering: bool = False, dynamic_filtering_range: tuple[float, float] = (0.0, 1.0),
                group_filter_top_p: float = 1.0) -> np.ndarray:
    """``(N,)`` bool keep mask of N groups of G rewards ``(N*G,)``, with the trainer's filter functions.

    Order as the local trainer (``rl_backend/local.py``): drop zero-variance groups, then the
    dynamic-sampling range, then keep the top-p by reward std *among the groups still kept*
    (``rl_backend.grpo``: ``zero_variance_groups``, ``dynamic_filter_keep``, ``top_p_std_keep``).
    """
    import torch
    from evotrainer.rl_backend import grpo

    r = torch.tensor(np.asarray(rewards, dtype=np.float64))
    n_groups = len(rewards) // group_size
    keep = torch.ones(n_groups, dtype=torch.bool)
    if drop_zero_variance_groups:
        keep &= ~grpo.zero_variance_groups(r, group_size)
    if dynamic_filtering:
        keep &= grpo.dynamic_filter_keep(r, group_size, *dynamic_filtering_range)
    if group_filter_top_p < 1.0 and keep.any():
        kept_idx = keep.nonzero().squeeze(-1)
        sub = r.reshape(n_groups, group_size)[kept_idx].reshape(-1)
        top = grpo.top_p_std_keep(sub, group_size, group_filter_top_p)
        keep[kept_idx[~top]] = False
    return keep.numpy()


@dataclass
class FilterReplay:
    """Per-step replay of a group filter: ``steps`` and arrays ``(S,)`` of kept fraction etc."""

    version: str
    steps: np.ndarray
    n_groups: np.ndarray
    kept_frac: np.ndarray
    effective_batch: np.ndarray  # kept samples
    reward_std_all: np.ndarray
    reward_std_kept: np.ndarray
    logged_kept_frac: np.ndarray | None = None  # what the trainer logged at the same steps (NaN where absent)

    def summary(self) -> dict[str, Any]:
        """Means over steps, and the largest gap to the logged kept fraction."""
        out = {"version": self.version, "n_steps": int(len(self.steps)),
               "kept_frac_mean": float(np.mean(self.kept_frac)) if len(self.steps) else None,
               "effective_batch_mean": float(np.mean(self.effective_batch)) if len(self.steps) else None,
               "reward_std_all_mean": float(np.nanmean(self.reward_std_all)) if len(self.steps) else None,
               "reward_std_kept_mean": float(np.nanmean(self.reward_std_kept))
               if len(self.steps) and np.isfinite(self.reward_std_kept).any() else None}
        if self.logged_kept_frac is not None and np.isfinite(self.logged_kept_frac).any():
            gap = np.abs(self.kept_frac - self.logged_kept_frac)
            out["max_abs_diff_vs_logged"] = float(np.nanmax(gap))
        return out


def replay_filter(rollouts: pa.Table, version: str, recipe: Mapping[str, Any] | Any | None = None,
                  evidence: Evidence | None = None, **settings: Any) -> FilterReplay:
    """Replay a group filter on one version's stored groups, step by step.

    Args:
        rollouts: rows in the store schema (all samples of each group, kept or not).
        version: the version whose groups to replay.
        recipe: a Recipe or recipe dict giving the filter settings (``drop_zero_variance_groups``,
            ``dynamic_filtering``, ``dynamic_filtering_range``, ``group_filter_top_p``).
        evidence: if given, the logged ``reward/kept_group_frac`` of the version is set alongside.
        settings: overrides of the recipe's filter settings (the changed filter to judge).

    Raises:
        ValueError: the version has no stored train rollouts, or groups of a step differ in size.
    """
    rd = recipe.to_dict() if hasattr(recipe, "to_dict") else dict(recipe or {})
    keys = ("drop_zero_variance_groups", "dynamic_filtering", "dynamic_filtering_range", "group_filter_top_p")
    cfg = {k: rd[k] for k in keys if k in rd}
    cfg.update(settings)
    if "dynamic_filtering_range" in cfg:
        cfg["dynamic_filtering_range"] = tuple(cfg["dynamic_filtering_range"])
    import pyarrow.compute as pc

    t = rollouts.filter(pc.equal(rollouts.column("version_id"), version))
    if "split" in t.column_names:
        t = t.filter(pc.equal(t.column("split"), "train"))
    if t.num_rows == 0:
        raise ValueError(f"version {version!r} has no stored train rollouts to replay a filter on")
    reward = t.column("reward").to_numpy()
    by_step: dict[int, list[np.ndarray]] = {}
    for _, step, _, rows in _groups(t):
        by_step.setdefault(step, []).append(rows)
    steps = np.array(sorted(by_step), dtype=np.int64)
    n_groups, kept_frac, eff, std_all, std_kept = [], [], [], [], []
    for s in steps:
        groups = by_step[int(s)]
        sizes = {len(g) for g in groups}
        if len(sizes) != 1:
            raise ValueError(f"step {s}: groups of different sizes {sorted(sizes)}; store every sample of each group")
        G = sizes.pop()
        r = np.concatenate([reward[g] for g in groups])
        keep = filter_keep(r, G, **cfg) if G >= 2 else np.ones(len(groups), dtype=bool)
        n_groups.append(len(groups))
        kept_frac.append(float(keep.mean()))
        eff.append(int(keep.sum()) * G)
        std_all.append(float(r.std()))
        kept_r = r.reshape(len(groups), G)[keep].ravel()
        std_kept.append(float(kept_r.std()) if len(kept_r) else math.nan)
    logged = None
    if evidence is not None and evidence.has(version, M.REWARD_KEPT_GROUP_FRAC):
        ls, lv = evidence.metrics.get(version, {}).get(M.REWARD_KEPT_GROUP_FRAC, (np.zeros(0), np.zeros(0)))
        lookup = dict(zip(ls.tolist(), lv.tolist(), strict=True))
        logged = np.array([lookup.get(int(s), math.nan) for s in steps])
    return FilterReplay(version=version, steps=steps, n_groups=np.array(n_groups), kept_frac=np.array(kept_frac),
                        effective_batch=np.array(eff), reward_std_all=np.array(std_all),
                        reward_std_kept=np.array(std_kept), logged_kept_frac=logged)


BAD_STATUSES = ("pruned", "reverted", "failed")
GOOD_STATUSES = ("kept", "merged")


@dataclass
class AnalyzerBacktest:
    """Confusion counts and precision / recall of an analyzer over versions of known outcome."""

    analyzer: str
    tp: int
    fp: int
    fn: int
    tn: int
    fired: dict[str, bool]
    outcomes: dict[str, bool]

    @property
    def precision(self) -> float:
        """TP / (TP + FP); NaN when it never fired."""
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else math.nan

    @property
    def recall(self) -> float:
        """TP / (TP + FN); NaN when no version is bad."""
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else math.nan

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary."""
        return {"analyzer": self.analyzer, "tp": self.tp, "fp": self.fp, "fn": self.fn, "tn": self.tn,
                "precision": self.precision, "recall": self.recall, "fired": self.fired, "outcomes": self.outcomes}


def backtest_analyzer(analyzer: str | Callable[[Evidence], list[Finding]], evidence: Evidence,
                      outcomes: Mapping[str, bool] | None = None, kinds: tuple[str, ...] | None = None,
                      min_severity: str = "warn") -> AnalyzerBacktest:
    """Run an analyzer on versions of known outcome and count hits.

    Args:
        analyzer: a registered analyzer name or a callable.
        evidence: the versions' evidence.
        outcomes: ``{version: True if bad}``; default from lineage statuses (pruned / reverted /
            failed are bad, kept / merged good; other versions are skipped).
        kinds: count only findings of these kinds (default: any kind).
        min_severity: ``warn`` (default) or ``blocking``: the least severity that counts as firing.

    Raises:
        ValueError: no version of known outcome.
    """
    from evotrainer.harness.analyzers import get_analyzer
    from evotrainer.harness.findings import SEVERITY_RANK

    if isinstance(analyzer, str):
        name, fn = analyzer, get_analyzer(analyzer).fn
    else:
        name, fn = getattr(analyzer, "__name__", "analyzer"), analyzer
    if outcomes is None:
        outcomes = {v: s in BAD_STATUSES for v, s in evidence.statuses.items() if s in BAD_STATUSES + GOOD_STATUSES}
    if not outcomes:
        raise ValueError("no version of known outcome; pass outcomes={version: is_bad} or decide some versions first")
    findings = fn(evidence)
    rank = SEVERITY_RANK[min_severity]
    fired = {v: any(v in f.versions and SEVERITY_RANK[f.severity] >= rank and (kinds is None or f.kind in kinds)
                    for f in findings) for v in outcomes}
    tp = sum(fired[v] and bad for v, bad in outcomes.items())
    fp = sum(fired[v] and not bad for v, bad in outcomes.items())
    fn_ = sum(not fired[v] and bad for v, bad in outcomes.items())
    tn = sum(not fired[v] and not bad for v, bad in outcomes.items())
    return AnalyzerBacktest(analyzer=name, tp=tp, fp=fp, fn=fn_, tn=tn, fired=fired, outcomes=dict(outcomes))


def components_of(rollouts: pa.Table) -> dict[str, np.ndarray]:
    """Stored per-component rewards ``{name: (B,)}`` from the ``components`` JSON column (NaN where absent)."""
    rows = [json.loads(c or "{}") for c in rollouts.column("components").to_pylist()]
    names = sorted({k for r in rows for k in r})
    return {n: np.array([r.get(n, math.nan) for r in rows], dtype=np.float64) for n in names}
