"""Backtests: judge a change without training (docs/design.md §2, step 7).

* :func:`rescore_rollouts`: score stored rollouts again under a changed reward spec (with
  ``evotrainer.rl_backend.rewards.compute_rewards``, the trainer's own reward code) and recompute
  group advantages (``rl_backend.grpo.group_advantages``): how would rewards, advantages and the
  ranking of samples within each group have changed?
* :func:`replay_filter`: replay a group filter (zero-variance drop, dynamic sampling range, top-p by
  reward std; the trainer's pure filter functions in ``rl_backend.grpo``) on stored groups: kept
  fraction, effective batch and reward std per step, next to the kept fraction the trainer logged.
* :func:`backtest_analyzer`: run an analyzer on versions whose outcome is known and score it
  (precision / recall: does it fire on the bad versions only?).
* :func:`inert_change`: would a single-factor change act at all under the parent's recipe? A clip
  bound no ratio reaches, a coefficient change too small to move the update, a penalty for a
  behaviour that never occurs in the stored rollouts, a setting another one switches off. Such a
  change trains (nearly) bit-identically to its parent's recipe and costs a branch for nothing.

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

from evotrainer import metrics as M
from evotrainer.harness.analyzers import get_analyzer
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import SEVERITY_RANK, Finding
from evotrainer.recipe import current_value, set_path
from evotrainer.rl_backend import grpo
from evotrainer.rl_backend.rewards import RewardError, compute_rewards
from evotrainer.rl_backend.tasks import Problem, TaskError, load_splits


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

    out = np.zeros(len(rewards))
    by_size: dict[int, list[np.ndarray]] = {}
    for rows in groups:
        by_size.setdefault(len(rows), []).append(rows)
    for size, members in by_size.items():
        idx = np.concatenate(members)  # groups contiguous, G = size each
        if size < 2:
            continue
        adv = grpo.group_advantages(torch.tensor(rewards[idx], dtype=torch.float64), size, estimator=estimator)
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
    """``(N,)`` bool keep mask of N groups of G rewards ``(N*G,)``: the trainer's own group filter,
    ``rl_backend.grpo.group_filter_keep`` (zero-variance drop, dynamic-sampling range, top-p by reward std
    among the groups still kept)."""
    import torch

    r = torch.tensor(np.asarray(rewards, dtype=np.float64))
    return grpo.group_filter_keep(r, group_size, drop_zero_variance_groups=drop_zero_variance_groups,
                                  dynamic_filtering=dynamic_filtering, dynamic_filtering_range=dynamic_filtering_range,
                                  group_filter_top_p=group_filter_top_p).numpy()


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


# --- inert changes ------------------------------------------------------------------------------------
CLIP_PATHS = ("eps_clip_high", "eps_clip_low")
COEF_INERT = 0.01  # relative change of the per-token update below this: inert. A GRPO batch's gradient has
# a relative standard error of at least 1/sqrt(B) (0.03 for B = 1024 samples, 0.2 for the default's 24), so a
# 1% change of the update's direction is below the noise of any batch size in use.
ADV_TOL = 1e-9  # advantages equal within this: the reward change does not reach the policy gradient
ADV_REL_TOL = 1e-6  # ... or within this share of the largest advantage: a reward scaled by c under group_norm moves
# each advantage by A·eps·(1 - 1/c)/σ with OpenRLHF's eps = 1e-9 (2.5e-9 on the default run's rollouts, weight 1 -> 2);
# a relative change of 1e-6 is below float32's resolution of the update itself (1.2e-7 per operation, summed)


@dataclass
class InertCheck:
    """Verdict of :func:`inert_change`: ``inert`` with the ``check`` that decided it, the reason and its numbers."""

    path: str
    old: Any
    new: Any
    inert: bool
    check: str  # structural | clip_bound | coefficient | no_behaviour | none
    reason: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"path": self.path, "old": self.old, "new": self.new, "inert": self.inert, "check": self.check,
                "reason": self.reason, "data": self.data}


def _series_stat(ev: Evidence | None, v: str | None, name: str, how: str) -> float | None:
    if ev is None or v is None:
        return None
    x = ev.series(v, name)[1]
    x = x[np.isfinite(x)]
    if not len(x):
        return None
    return float({"max": np.max, "min": np.min, "median": np.median}[how](x))


def inert_change(recipe: Any, path: str, new: Any, evidence: Evidence | None = None,
                 version: str | None = None) -> InertCheck:
    """Would setting ``path`` to ``new`` on ``recipe`` (the parent's) change training at all?

    Checks, in order (the first that applies decides; each reason carries its numbers):

    * **structural** (exact): ``kl_estimator`` / ``use_kl_loss`` with ``init_kl_coef = 0`` (KL off);
      ``dynamic_filtering_range`` / ``max_refill_rounds`` with ``dynamic_filtering`` off;
      ``eps_clip_high`` / ``eps_clip_low`` with ``max_epochs = 1``: both backends take one optimiser step
      per epoch over the whole rollout batch and the epoch's ``old_logprobs`` are the policy's own
      (``rl_backend/local.py``), so the ratio is exactly 1 and no bound can bind.
    * **clip_bound** (``max_epochs > 1``): the parent's ratios over its PPO epochs (``policy/ratio/max`` /
      ``min``, every step) never reached the nearer of the old and new bound: no token is clipped by either.
    * **coefficient**: the change's share of the per-token update, ``rel``, is below :data:`COEF_INERT`:
      ``init_kl_coef`` with the KL as a loss: ``|Δβ|·g_KL / σ_A`` where ``g_KL`` is the KL term's gradient
      per token w.r.t. the log-prob (1 for k1; ``|log r| ≈ √(2·KL)`` for k2 / k3, Schulman 2020) at the
      parent's largest logged ``policy/kl`` and ``σ_A`` the median ``policy/advantage/std`` (the policy
      term's gradient per token is ``A·ρ``); with the KL in the reward: ``|Δβ|·KL·L / σ_r`` (L: mean
      completion length, σ_r: median ``reward/std``); ``l2``: ``lr·|Δwd| / (||dθ||/||θ||)`` (decoupled weight
      decay against the median ``policy/update_rel_norm``).
    * **no_behaviour** (``generate_max_len`` raised): no completion of the parent's last 4 steps reached the old
      limit and no reward term reads it (:func:`_inert_longer_budget`).
    * **no_behaviour** (``reward.<name>.*``): the parent's stored train rollouts re-scored under the change
      (:func:`rescore_rollouts`) give the same group advantages (within :data:`ADV_TOL` plus :data:`ADV_REL_TOL`
      of the largest) and the same group-filter decisions: the component is constant within every group (e.g. a
      repetition penalty where nothing repeats), or the change only scales the reward under a std-normalised
      advantage (the weight of the only component), so the policy gradient does not change.
    * **structural** (``data.n_train`` raised): the task has no more problems to give, so the training split is
      the same list (:func:`_inert_more_train`; the level-1 arithmetic pool holds 400 problems, 148 held out, so
      256 and 512 both train on the same 252).

    Args:
        recipe: the parent's :class:`~evotrainer.recipe.Recipe`.
        path, new: the change (a dotted recipe path and its new value).
        evidence: the parent's evidence (metrics; rollouts for reward changes); version: its id.

    Returns:
        :class:`InertCheck`; ``inert=False`` with check ``none`` when no rule applies or evidence is missing
        (the reason says which).

    Raises:
        RecipeError: ``new`` is not a valid value for ``path``.
    """
    changed = set_path(recipe, path, new)  # validates the path and the value
    old = current_value(recipe, path)
    r = recipe

    def verdict(inert: bool, check: str, reason: str, **data: Any) -> InertCheck:
        return InertCheck(path=path, old=old, new=new, inert=inert, check=check, reason=reason, data=data)

    if path in ("kl_estimator", "use_kl_loss") and r.init_kl_coef == 0:
        return verdict(True, "structural", f"{path} {old} -> {new} while init_kl_coef = 0: the KL is off")
    if path in ("dynamic_filtering_range", "max_refill_rounds") and not r.dynamic_filtering:
        return verdict(True, "structural", f"{path} {old} -> {new} while dynamic_filtering is off")
    if path in CLIP_PATHS:
        if r.max_epochs == 1:
            return verdict(True, "structural",
                           f"{path} {old} -> {new} with max_epochs = 1: the loss's ratio is exactly 1 (one optimiser "
                           f"step per batch, old_logprobs are the epoch's own), so no clip bound binds")
        bound = min(float(old), float(new))
        name, how = (M.POLICY_RATIO_MAX, "max") if path == "eps_clip_high" else (M.POLICY_RATIO_MIN, "min")
        seen = _series_stat(evidence, version, name, how)
        if seen is None:
            return verdict(False, "none", f"no {name} logged for {version}: cannot tell whether a ratio reaches the bound")
        reach = seen - 1 if path == "eps_clip_high" else 1 - seen
        if reach < bound:
            side = f"1 + {fmt_num(bound)}" if path == "eps_clip_high" else f"1 - {fmt_num(bound)}"
            return verdict(True, "clip_bound", f"{path} {old} -> {new}: the parent's {how} ratio over its PPO epochs "
                           f"was {fmt_num(seen)}, never reaching {side}; no token is clipped by either bound",
                           ratio_seen=seen, bound=bound)
        return verdict(False, "none", f"{name} {fmt_num(seen)} reaches the bound {fmt_num(bound)}", ratio_seen=seen)
    if path == "init_kl_coef":
        return _inert_kl_coef(r, old, new, evidence, version, verdict)
    if path == "l2":
        lr, rel = r.actor_learning_rate, _series_stat(evidence, version, M.POLICY_UPDATE_REL_NORM, "median")
        if not rel:
            return verdict(False, "none", f"no {M.POLICY_UPDATE_REL_NORM} logged for {version}")
        share = lr * abs(float(new) - float(old)) / rel
        return verdict(share < COEF_INERT, "coefficient" if share < COEF_INERT else "none",
                       f"l2 {old} -> {new}: weight decay moves θ by lr·|Δwd| = {fmt_num(lr * abs(float(new) - float(old)))} "
                       f"of ||θ|| per step against an update of {fmt_num(rel)} (share {fmt_num(share)}; inert below "
                       f"{COEF_INERT})", share=share, update_rel_norm=rel)
    if path == "generate_max_len" and new is not None and old is not None and int(new) > int(old):
        return _inert_longer_budget(r, int(old), int(new), evidence, version, verdict)
    if path.startswith("reward."):
        return _inert_reward(r, changed, path, old, new, evidence, version, verdict)
    if path == "data.n_train" and new is not None and old is not None and int(new) > int(old):
        return _inert_more_train(r, changed, int(old), int(new), verdict)
    return verdict(False, "none", f"no inert-change rule for {path}")


def _inert_more_train(r: Any, changed: Any, old: int, new: int, verdict: Callable) -> InertCheck:
    """``data.n_train`` raised where the task has no more distinct problems: both recipes' training splits are the
    same problems in the same order (:func:`~evotrainer.rl_backend.tasks.load_splits`, deterministic per data
    spec; dev and test never move with ``n_train``), so the child samples the same prompts as its control.
    Repository tasks (``swe``) are not judged (their split loads the projects)."""
    if r.data.task == "swe":
        return verdict(False, "none", "data.n_train of a repository task: not judged")
    try:
        before, after = load_splits(r.data).train, load_splits(changed.data).train
    except TaskError as exc:
        return verdict(False, "none", f"cannot load the splits: {exc}"[:300])
    if [p.id for p in before] == [p.id for p in after]:
        return verdict(True, "structural", f"data.n_train {old} -> {new}: the {r.data.task} task has no more "
                       f"problems to give (after the dev and test splits): both train on the same {len(before)}",
                       n_train_effective=len(before))
    return verdict(False, "none", f"data.n_train {old} -> {new}: {len(before)} -> {len(after)} training problems",
                   n_train_effective=len(after))


LENGTH_READERS = ("overlong", "length_penalty")  # reward terms whose value depends on generate_max_len


def _inert_longer_budget(r: Any, old: int, new: int, ev: Evidence | None, v: str | None,
                         verdict: Callable) -> InertCheck:
    """``generate_max_len`` raised while no completion of the parent's last steps reached the old limit:
    sampling stops at EOS first, so the same seeds draw the same tokens and the child trains exactly as its
    control would (the default run's v7, 16 -> 32 at a clipped ratio of 0, tied its control on every dev
    sample). Not inert when a reward term reads the limit (overlong shaping, length penalty)."""
    readers = [c for c in LENGTH_READERS if (spec := r.reward.get(c)) is not None and spec.weight]
    if readers:
        return verdict(False, "none", f"generate_max_len {old} -> {new}: {', '.join(readers)} reads the limit")
    if ev is None or v is None:
        return verdict(False, "none", f"no evidence of {v}: cannot tell whether completions reach the limit")
    # the last 4 logged steps: where the child starts from
    c, m = ev.series(v, M.COMPLETIONS_CLIPPED_RATIO)[1][-4:], ev.series(v, M.COMPLETIONS_MAX_LENGTH)[1][-4:]
    if not len(c) or not np.isfinite(c).all() or not len(m) or not np.isfinite(m).all():
        return verdict(False, "none", f"no {M.COMPLETIONS_CLIPPED_RATIO} / {M.COMPLETIONS_MAX_LENGTH} of {v}'s last steps")
    if float(c.max()) == 0.0 and float(m.max()) < old:
        return verdict(True, "no_behaviour", f"generate_max_len {old} -> {new}: no completion of {v}'s last {len(c)} "
                       f"steps reached {old} tokens (clipped ratio 0, longest {fmt_num(float(m.max()))}): the longer "
                       f"budget changes no sample", clipped_max=float(c.max()), longest=float(m.max()))
    return verdict(False, "none", f"completions reach the limit (clipped ratio up to {fmt_num(float(c.max()))})",
                   clipped_max=float(c.max()))


def fmt_num(x: float) -> str:
    """3 significant digits."""
    return f"{x:.3g}"


def _inert_kl_coef(r: Any, old: Any, new: Any, ev: Evidence | None, v: str | None, verdict: Callable) -> InertCheck:
    d_beta = abs(float(new) - float(old))
    kl = _series_stat(ev, v, M.POLICY_KL, "max")
    if kl is None:
        return verdict(False, "none", f"no {M.POLICY_KL} logged for {v}: cannot size the KL term")
    if r.use_kl_loss:
        g_kl = 1.0 if r.kl_estimator == "k1" else math.sqrt(2 * max(kl, 0.0))
        sigma = _series_stat(ev, v, M.POLICY_ADVANTAGE_STD, "median")
        if not sigma:
            return verdict(False, "none", f"no {M.POLICY_ADVANTAGE_STD} logged for {v}")
        share = d_beta * g_kl / sigma
        how = (f"the KL loss's gradient per token changes by |Δβ|·g = {fmt_num(d_beta)} x {fmt_num(g_kl)} "
               f"(g = {'1 for k1' if r.kl_estimator == 'k1' else '√(2·KL), KL ' + fmt_num(kl)}) against the policy "
               f"term's advantage std {fmt_num(sigma)}")
        data = {"d_beta": d_beta, "kl_max": kl, "g_kl": g_kl, "advantage_std": sigma}
    else:
        length = _series_stat(ev, v, M.COMPLETIONS_MEAN_LENGTH, "median")
        sigma = _series_stat(ev, v, M.REWARD_STD, "median")
        if not length or not sigma:
            return verdict(False, "none", f"no {M.COMPLETIONS_MEAN_LENGTH} / {M.REWARD_STD} logged for {v}")
        share = d_beta * kl * length / sigma
        how = (f"the KL in the reward shifts each sample by |Δβ|·KL·L = {fmt_num(d_beta)} x {fmt_num(kl)} x "
               f"{fmt_num(length)} tokens against a reward std of {fmt_num(sigma)}")
        data = {"d_beta": d_beta, "kl_max": kl, "mean_length": length, "reward_std": sigma}
    inert = share < COEF_INERT
    return verdict(inert, "coefficient" if inert else "none",
                   f"init_kl_coef {old} -> {new}: {how}: share {fmt_num(share)} of the update "
                   f"({'inert' if inert else 'acts'}; inert below {COEF_INERT})", share=share, **data)


def _inert_reward(r: Any, changed: Any, path: str, old: Any, new: Any, ev: Evidence | None, v: str | None,
                  verdict: Callable) -> InertCheck:
    t = ev.rollouts_of(v, "train") if ev is not None and v is not None else None
    if t is None or not t.num_rows:
        return verdict(False, "none", f"no stored train rollouts of {v} to re-score")
    try:
        res = rescore_rollouts(t, changed.to_dict()["reward"], generate_max_len=r.generate_max_len,
                               task=r.data.task, estimator=r.advantage_estimator)
    except RewardError as exc:
        return verdict(False, "none", f"cannot re-score under the change: {exc}")
    groups = _groups(t)
    rows = [g[3] for g in groups]
    old_adv = _advantages(res.old_reward, rows, r.advantage_estimator)  # both sides recomputed the same way
    d_adv = float(np.max(np.abs(res.new_advantage - old_adv))) if len(rows) else 0.0
    settings = {"drop_zero_variance_groups": r.drop_zero_variance_groups, "dynamic_filtering": r.dynamic_filtering,
                "dynamic_filtering_range": tuple(r.dynamic_filtering_range),
                "group_filter_top_p": r.group_filter_top_p}
    by_step: dict[tuple[str, int], list[np.ndarray]] = {}
    for ver, step, _, g in groups:
        by_step.setdefault((ver, step), []).append(g)
    same_keep = True
    for gs in by_step.values():  # the filter judges a step's groups together (top-p ranks them)
        sizes = {len(g) for g in gs}
        if len(sizes) != 1 or sizes.pop() < 2:
            continue
        idx = np.concatenate(gs)
        same_keep &= bool(np.array_equal(filter_keep(res.old_reward[idx], len(gs[0]), **settings),
                                         filter_keep(res.new_reward[idx], len(gs[0]), **settings)))
    name = path.split(".")[1]
    comp = res.new_components.get(name)
    vals = f"{name} takes values {sorted({round(float(x), 6) for x in comp})[:5]} on {len(comp)} rollouts" \
        if comp is not None and len(comp) else f"{name} is removed"
    scale = float(np.max(np.abs(old_adv))) if len(rows) else 0.0
    inert = d_adv <= ADV_TOL + ADV_REL_TOL * scale and same_keep
    return verdict(inert, "no_behaviour" if inert else "none",
                   f"{path} {old} -> {new}: on {res.summary['n_rollouts']} stored rollouts of {v} ({len(rows)} groups) "
                   f"{vals}; max |Δadvantage| = {fmt_num(d_adv)}, group filter {'unchanged' if same_keep else 'changed'}"
                   + ((": the advantages are the same (the behaviour it prices never varies within a group, or the "
                       "change only rescales a std-normalised reward), so is the gradient") if inert else ""),
                   max_abs_advantage_change=d_adv, same_filter=same_keep, n_rollouts=res.summary["n_rollouts"])
