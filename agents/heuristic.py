"""The offline heuristic brain: deterministic rules over the MCP tools (no API key needed).

Same typed outputs as the Claude brain (:mod:`evotrainer.agents.decisions`):

- diagnose: run the built-in analyzers on the version (``run_analyzer``), keep their findings;
  "unexplained" when the held-out gain over the parent is significant and no warn/blocking finding
  stands;
- propose: for each finding kind (blocking first), the skills that address it: first those the skills
  memory returns (``search_skills`` with ``finding_kinds``, best track record first), then the rest of the
  seed library's skills for that kind (``skills_db/seed_skills.yaml``, in file order: the fixes have
  one home, the seed skills); the seed procedure :data:`ZERO_SUSPECT_REWARD` zeroes the weight of the
  reward term a finding's evidence names. Each becomes one single-factor candidate on the parent's recipe
  (values by :func:`evotrainer.recipe.apply_value_rule`); already-tried changes are skipped. With no
  failure standing, the seed skills :data:`EXPLORE_SKILLS` explore;
- rank: prior (finding severity matched + skill track record) plus backtests: re-score stored
  rollouts for reward changes (``rescore_rollouts``), replay the group filter for filter changes
  (``replay_filter``);
- decide: the gate rule (:func:`evotrainer.agents.decisions.gate_verdict`): keep only when the gate
  promotes (the held-out gain's CI above 0) and no blocking finding stands; prune otherwise.

Ties break on candidate order, so equal inputs give equal outputs (the crash test relies on it).
"""

from __future__ import annotations

import json
import math
from typing import Any

from evotrainer.agents.analyzer_templates import LENGTH_SHIFT
from evotrainer.agents.decisions import (
    AnalyzerDraft,
    Candidate,
    Diagnosis,
    FindingRef,
    Proposal,
    Ranking,
    Score,
    Verdict,
    gate_verdict,
)
from evotrainer.agents.intervener import task_mismatch
from evotrainer.agents.mcp_client import RoleTools, ToolCallError
from evotrainer.harness.findings import DAMAGES_WEIGHTS
from evotrainer.recipe import Recipe, RecipeError, apply_value_rule, current_value
from evotrainer.skills_db.seed import seed_skills

# Info findings that still call for a change (not a failure of the version): saturated training data.
ACTIONABLE_INFO = frozenset({"headroom"})
ZERO_SUSPECT_REWARD = "procedure.zero_suspect_reward"
"""Seed procedure: stop paying the reward term a finding's evidence names (its weight to 0); the finding kinds
it addresses get one candidate per suspect component (:func:`_suspect_components`)."""
EXPLORE_SKILLS: tuple[str, ...] = ("lr_up_x3", "group_size_for_signal", "temperature_down", "clip_higher_default")
"""Seed skills tried when no failure finding stands (the recipe works; look for more gain)."""
SEVERITY_WEIGHT = {"blocking": 2.0, "warn": 1.0, "info": 0.0}
INERT_SCORE = -100.0  # score of a candidate the inert-change backtest rejects (never chosen)
TARGET_BONUS = 0.5  # rank bonus of a reward-weight change whose component the finding's evidence names
# A collapse whose metric fell to this fraction of its early level or less (entropy x0.05 in 8 steps at
# a 100x learning rate) is a blow-up of the step size: learning-rate cuts rank first, the largest cut first.
FAST_COLLAPSE_RATIO = 0.1
FAST_COLLAPSE_KINDS = DAMAGES_WEIGHTS  # the kinds whose findings mark a version's weights as damaged


def findings_from(result: Any) -> list[FindingRef]:
    """Findings out of an analyzer tool result (``{"findings": [...]}`` or a list)."""
    items = result.get("findings", []) if isinstance(result, dict) else (result or [])
    out = []
    for f in items:
        try:
            out.append(FindingRef.model_validate(f))
        except Exception:  # noqa: BLE001 (a malformed finding is dropped, not fatal)
            continue
    return out


def seed_library() -> list[dict[str, Any]]:
    """The seed skills (``skills_db/seed_skills.yaml``) as the skill dicts the skills tools return."""
    return [s.model_dump(mode="json") for s in seed_skills()]


def _value_of(skill: dict[str, Any], current: Any) -> Any:
    """The skill's value rule applied to ``current`` (:func:`evotrainer.recipe.apply_value_rule`); None when
    the rule does not fit the current value (e.g. a number rule on an absent reward component)."""
    try:
        return apply_value_rule(skill.get("value"), current, skill.get("recipe_path"))
    except RecipeError:
        return None


def _toward_variance(current: Any, new: Any, reward_mean: float | None) -> bool:
    """Whether a ``data.level`` change moves the data toward groups that disagree.

    A binary reward has the most variance at a 0.5 solve rate: when the parent's train reward mean is
    at least 0.5 the data is too easy (a harder level helps), below it too hard (an easier one helps).
    Unknown reward mean or non-integer levels: True (nothing to judge by).
    """
    if reward_mean is None or not isinstance(current, int) or not isinstance(new, int) or new == current:
        return True
    return (new > current) == (reward_mean >= 0.5)


class HeuristicBrain:
    """Deterministic rules over the role tools; see the module docstring."""

    name = "heuristic"

    def __init__(self) -> None:
        self.usage = {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "turns": 0}

    # --- diagnostician --------------------------------------------------------------------------------
    def diagnose(self, tools: RoleTools, version_id: str, context: dict[str, Any]) -> Diagnosis:
        """Run the built-in analyzers on ``version_id`` (and its parent, for paired analyzers)."""
        ids = [version_id] + ([context["parent_id"]] if context.get("parent_id") else [])
        findings = findings_from(tools.call("run_analyzer", {"version_ids": ids}))
        findings = [f for f in findings if not f.versions or version_id in f.versions]
        failures = [f for f in findings if f.severity != "info"]
        gain = context.get("gain")
        significant = bool(context.get("significant"))
        unexplained = significant and not failures
        if failures:
            top = failures[0]
            summary = f"{len(failures)} failure finding(s) on {version_id}: " + ", ".join(
                sorted({f.kind for f in failures})) + f". First: {top.explanation[:300]}"
        else:
            summary = f"no failure finding on {version_id}"
        if gain is not None:
            summary += f"; held-out gain over parent {gain:+.3f}"
        return Diagnosis(version_id=version_id, findings=findings, summary=summary, unexplained=unexplained)

    # --- intervener -------------------------------------------------------------------------------------
    def propose(self, tools: RoleTools, parent_id: str, recipe: Recipe, diagnosis: Diagnosis,
                tried: set[str], context: dict[str, Any]) -> Proposal:
        """Candidates for the parent's findings: the skills memory's first, then the seed library's."""
        kinds = diagnosis.kinds() if diagnosis.findings else []
        failures = [k for k in kinds if any(f.kind == k and (f.severity != "info" or k in ACTIONABLE_INFO)
                                            for f in diagnosis.findings)]
        out: list[Candidate] = []
        seen = set(tried)
        skills_used: list[str] = []
        library = seed_library()

        def add(c: Candidate) -> bool:
            if task_mismatch(c.path, recipe.data.task):
                return False  # e.g. an SWE-only reward term on a math task (it would raise RewardError)
            try:
                current = current_value(recipe, c.path)
            except RecipeError:
                return False
            if c.new is None or c.key() in seen:
                return False
            try:
                c.to_intervention(current).apply(recipe)  # validates; a no-op change raises
            except Exception:  # noqa: BLE001 (an inapplicable candidate is skipped)
                return False
            seen.add(c.key())
            out.append(c)
            return True

        def add_skill(sk: dict[str, Any], kind: str, hypothesis: str = "") -> bool:
            path = sk.get("recipe_path")
            if not path:
                return False
            try:
                current = current_value(recipe, path)
            except RecipeError:
                return False
            new = _value_of(sk, current)
            if path == "data.level" and not _toward_variance(current, new, context.get("reward_mean")):
                return False  # e.g. "harder data" when the policy already fails most prompts
            return add(Candidate(path=path, new=new, addresses=[kind] if kind else [], source=f"skill:{sk.get('id')}",
                                 hypothesis=hypothesis or sk.get("description", "")[:300] or sk.get("name", "")))

        for kind in failures:
            for sk in self._skills_for(tools, kind, diagnosis):
                if add_skill(sk, kind):
                    skills_used.append(str(sk.get("id")))
            for sk in library:
                if kind not in sk.get("addresses", []):
                    continue
                if sk["id"] == ZERO_SUSPECT_REWARD:
                    for name in _suspect_components(recipe, diagnosis):
                        add(Candidate(path=f"reward.{name}.weight", new=0.0, addresses=[kind], source=f"skill:{sk['id']}",
                                      hypothesis=f"{sk['description'][:300]} ({name})"))
                elif sk["kind"] == "intervention":
                    add_skill(sk, kind)
            for c in _lr_to_target(recipe, diagnosis, kind):
                add(c)
        if not failures:
            by_id = {sk["id"]: sk for sk in library}
            for sid in EXPLORE_SKILLS:
                if sid in by_id:
                    add_skill(by_id[sid], "", f"no failure stands; exploring: {by_id[sid]['name']}")
        return Proposal(parent_id=parent_id, candidates=out, skills_used=skills_used,
                        rationale=f"findings {failures or 'none'} on {parent_id}; {len(out)} untried single-factor changes")

    def _skills_for(self, tools: RoleTools, kind: str, diagnosis: Diagnosis) -> list[dict[str, Any]]:
        if not tools.has("search_skills"):
            return []
        text = " ".join(f.explanation for f in diagnosis.findings if f.kind == kind)[:400] or kind
        try:
            res = tools.call("search_skills", {"query": f"{kind}: {text}", "finding_kinds": [kind],
                                               "kind": "intervention", "limit": 5})
        except ToolCallError:
            return []
        hits = [h for h in res.get("hits", []) if isinstance(h, dict)]
        # track record first (helped - hurt), then relevance order: a skill that worked before is tried first
        return sorted(hits, key=lambda h: -((h.get("record") or {}).get("helped", 0)
                                            - (h.get("record") or {}).get("hurt", 0)))

    # --- backtester ---------------------------------------------------------------------------------------
    def rank(self, tools: RoleTools, parent_id: str, proposal: Proposal, diagnosis: Diagnosis,
             n_choose: int) -> Ranking:
        """Score each candidate: finding match + skill track record + backtest signal; choose the top ``n_choose``."""
        sev = {}
        for f in diagnosis.findings:
            sev[f.kind] = max(sev.get(f.kind, 0.0), SEVERITY_WEIGHT[f.severity])
        scores: list[Score] = []
        step_bonus: dict[int, float] = {}  # candidate index -> progress bonus (a step-size change a finding asks for)
        for i, c in enumerate(proposal.candidates):
            prior = max([sev.get(k, 0.0) for k in c.addresses] or [0.0]) - 0.01 * i
            method, detail, bt = "prior", "", 0.0
            if _targets_evidence(c, diagnosis):
                prior += TARGET_BONUS  # the finding's own evidence names the reward term this candidate changes
                detail = "targets the evidence; "
            if (lr_bonus := _step_size_bonus(c, proposal.candidates, diagnosis)) > 0:
                prior += lr_bonus
                detail += "a fast collapse: the step size; "
            if (pb := _progress_bonus(c, proposal.candidates, diagnosis)) > 0:
                step_bonus[i] = pb
                prior += pb
                detail += "the update size: the learning rate; "
            if _harder_for_headroom(c, diagnosis):
                prior += TARGET_BONUS
                detail += "saturated data: harder problems; "
            if (why := self._inert(tools, parent_id, c)) is not None:
                scores.append(Score(index=i, score=INERT_SCORE, method="inert", detail=f"inert: {why}"))
                continue
            if c.path.startswith("reward.") and tools.has("rescore_rollouts"):
                bt, more = self._rescore(tools, parent_id, c)
                detail, method = detail + more, "rescore"
            elif c.category == "data" or c.path in ("dynamic_filtering", "group_filter_top_p",
                                                     "drop_zero_variance_groups", "dynamic_filtering_range"):
                if tools.has("replay_filter"):
                    bt, more = self._replay(tools, parent_id, c)
                    detail, method = detail + more, "replay"
            scores.append(Score(index=i, score=round(prior + bt, 6), method=method, detail=detail))
        order = sorted(scores, key=lambda s: (-s.score, s.index))
        # Greedy by score, distinct recipe paths, and one branch per finding kind before a second one for
        # the same kind (several standing findings each get a fix tried).
        chosen: list[int] = []
        paths: set[str] = set()
        covered: set[str] = set()
        for diverse in (True, False):
            for s in order:
                c = proposal.candidates[s.index]
                if s.method == "inert":
                    continue  # cannot act under the parent's recipe: never trained
                if len(chosen) >= n_choose or s.index in chosen or c.path in paths:
                    continue
                if diverse and c.addresses and set(c.addresses) <= covered:
                    continue
                chosen.append(s.index)
                paths.add(c.path)
                covered |= set(c.addresses)
        lrs = {i: float(c.new) for i, c in enumerate(proposal.candidates)
               if c.path == "actor_learning_rate" and isinstance(c.new, (int, float)) and c.new > 0}
        bracket = _bracket_step_size(order, chosen, step_bonus, n_choose, lrs)
        return Ranking(scores=scores, chosen=bracket or chosen,
                       rationale="ranked by finding severity, skill record and backtests: "
                       + ", ".join(f"#{s.index} {proposal.candidates[s.index].path}={s.score:.2f}" for s in order[:5])
                       + ("; the learning rate bracketed on a log scale: "
                          + " and ".join(f"#{i}" for i in bracket if i in step_bonus) if bracket else ""))

    def _inert(self, tools: RoleTools, parent_id: str, c: Candidate) -> str | None:
        """The reason ``c`` cannot act under the parent's recipe (``check_inert``), or None."""
        if not tools.has("check_inert"):
            return None
        try:
            res = tools.call("check_inert", {"version_id": parent_id, "path": c.path, "value": c.new})
        except ToolCallError:
            return None
        return str(res.get("reason") or "inert") if res.get("inert") else None

    def _rescore(self, tools: RoleTools, parent_id: str, c: Candidate) -> tuple[float, str]:
        try:
            res = tools.call("rescore_rollouts", {"version_id": parent_id, "path": c.path, "value": c.new})
        except ToolCallError as exc:
            return 0.0, f"rescore failed: {exc.message[:120]}"
        corr_new = res.get("corr_with_correct_new", res.get("correlation_new"))
        corr_old = res.get("corr_with_correct_old", res.get("correlation_old"))
        if isinstance(corr_new, (int, float)) and isinstance(corr_old, (int, float)):
            return float(corr_new) - float(corr_old), f"reward/correctness correlation {corr_old:.2f} -> {corr_new:.2f}"
        return 0.0, json.dumps(res)[:160]

    def _replay(self, tools: RoleTools, parent_id: str, c: Candidate) -> tuple[float, str]:
        try:
            res = tools.call("replay_filter", {"version_id": parent_id, "path": c.path, "value": c.new})
        except ToolCallError as exc:
            return 0.0, f"replay failed: {exc.message[:120]}"
        kept_old, kept_new = res.get("informative_frac_old"), res.get("informative_frac_new")
        if isinstance(kept_old, (int, float)) and isinstance(kept_new, (int, float)):
            return float(kept_new) - float(kept_old), f"informative groups {kept_old:.2f} -> {kept_new:.2f}"
        return 0.0, json.dumps(res)[:160]

    # --- decider ----------------------------------------------------------------------------------------
    def decide(self, tools: RoleTools | None, version_id: str, gate: dict[str, Any], diagnosis: Diagnosis) -> Verdict:
        """The gate rule (:func:`~evotrainer.agents.decisions.gate_verdict`): keep when the gate promotes (CI of
        the held-out gain above 0) and no blocking finding stands; else prune."""
        return gate_verdict(version_id, gate, diagnosis)

    # --- harness evolution ------------------------------------------------------------------------------
    def write_analyzer(self, tools: RoleTools, version_id: str, diagnosis: Diagnosis,
                       context: dict[str, Any]) -> AnalyzerDraft | None:
        """A length-shift analyzer: flags a version whose mean completion length moved > 30% from its parent."""
        return AnalyzerDraft(name="length_shift", kind="length_shift",
                             description="mean completion length moved more than 30% from the parent version",
                             code=LENGTH_SHIFT)


def _targets_evidence(c: Candidate, diagnosis: Diagnosis) -> bool:
    """True when ``c`` changes ``reward.<name>.weight`` (not correctness, the task's own signal) and a
    finding it addresses cites ``reward/<name>/...`` in its evidence."""
    parts = c.path.split(".")
    if len(parts) != 3 or parts[0] != "reward" or parts[2] != "weight" or parts[1] == "correctness":
        return False
    prefix = f"reward/{parts[1]}/"
    return any(f.kind in c.addresses and any(str(e).startswith(prefix) for e in f.evidence)
               for f in diagnosis.findings)


def _fast_collapse(f: FindingRef) -> bool:
    """A blocking / warn collapse finding whose metric fell to FAST_COLLAPSE_RATIO of its early level or
    less (entropy_collapse), or any NaN / KL blow-up."""
    if f.kind not in FAST_COLLAPSE_KINDS or f.severity == "info":
        return False
    if f.kind != "entropy_collapse":
        return True
    early, late = f.data.get("early"), f.data.get("late")
    return isinstance(early, (int, float)) and isinstance(late, (int, float)) and early > 0 \
        and late <= FAST_COLLAPSE_RATIO * early


def _step_size_bonus(c: Candidate, candidates: list[Candidate], diagnosis: Diagnosis) -> float:
    """Rank bonus of a learning-rate cut when a fast collapse stands (:func:`_fast_collapse`): TARGET_BONUS
    for the smallest proposed learning rate, half of it for the other cuts, 0 for anything else."""
    if c.path != "actor_learning_rate" or not isinstance(c.new, (int, float)):
        return 0.0
    if not any(_fast_collapse(f) and f.kind in c.addresses for f in diagnosis.findings):
        return 0.0
    lrs = [x.new for x in candidates if x.path == "actor_learning_rate" and isinstance(x.new, (int, float))]
    return TARGET_BONUS if c.new <= min(lrs) else TARGET_BONUS / 2


def _harder_for_headroom(c: Candidate, diagnosis: Diagnosis) -> bool:
    """True for a ``data.level`` above the level a ``headroom`` finding (train pass rate >= 0.9) names: on saturated
    data, filtering the all-correct groups (dynamic sampling) refills from the same saturated pool, while harder
    problems make the groups informative again."""
    if c.path != "data.level" or not isinstance(c.new, int):
        return False
    levels = [f.data.get("data_level") for f in diagnosis.findings if f.kind == "headroom"]
    return any(isinstance(lv, int) and c.new > lv for lv in levels)


PROGRESS_DIRECTION = {"update_too_small": 1.0, "plateau": 1.0, "update_too_large": -1.0}
# While the update's size is wrong no other change can show its effect within the budget (the SmolLM2
# default v0 moved KL 3.6e-4 per step at lr 2e-6: its truncation could not be trained away either), so the
# learning-rate change that fixes it ranks above a blocking finding's fixes: bonus = the blocking - warn gap
# plus TARGET_BONUS.
STEP_FIRST_BONUS = SEVERITY_WEIGHT["blocking"] - SEVERITY_WEIGHT["warn"] + TARGET_BONUS


def _bracket_step_size(order: list[Score], chosen: list[int], step_bonus: dict[int, float],
                       n_choose: int, lrs: dict[int, float]) -> list[int] | None:
    """When the top choice is a learning-rate step a progress finding asks for, the round's second branch is the
    other proposed magnitude in the same direction (x3 and x10, or /3 and /10; of three or more, the one nearest
    the top choice in log scale, ``lrs`` giving each candidate's learning rate: x10 beside a x42 from
    :func:`_lr_to_target`) instead of a weaker fix for another finding; None when that does not apply (fewer than
    two branches, no second magnitude, top is no step).

    Why: the finding's ``lr_factor_to_target`` (√(KL_target / update KL), KL ∝ lr²) is a small-step estimate
    of the step that reaches PPO's trust-region target, not of the step that learns fastest, and both are
    uncertain by about an order of magnitude; a learning rate is searched on a log scale (Bergstra & Bengio
    2012), so one round brackets it. Measured (docs/compare.md, SmolLM2 level-1 arithmetic, lr 2e-6,
    factors 4.2 and 5.7): x10 gained dev Avg@4 +0.34 over the control, x3 +0.13; the length fix that took the
    second branch lost to the control in all three seeds.
    """
    if n_choose < 2 or not chosen or chosen[0] not in step_bonus:
        return None
    picked = [i for i in chosen if i in step_bonus]
    if len(picked) > 1:
        return None
    # every index with a step bonus is a positive learning-rate candidate (_progress_bonus), so in ``lrs``
    others = [s.index for s in order if s.index in step_bonus and s.index not in chosen and s.method != "inert"]
    if not others:
        return None
    other = min(others, key=lambda i: abs(math.log10(lrs[i] / lrs[chosen[0]])))  # ties: rank order (min is stable)
    out = list(chosen)
    if len(out) < n_choose:
        out.append(other)
    else:
        out[-1] = other  # the lowest-ranked pick gives way (the top choice is the step itself)
    return out


def _progress_bonus(c: Candidate, candidates: list[Candidate], diagnosis: Diagnosis) -> float:
    """Rank bonus of a learning-rate change that a progress finding asks for (harness/analyzers/progress.py).

    ``update_too_small`` / ``plateau`` want a larger step, ``update_too_large`` a smaller one. Among the
    proposed learning rates in that direction (multipliers of the finding's ``data["lr"]``), the one
    nearest in log scale to the finding's ``lr_factor_to_target`` (√(KL_target / update KL): the multiplier
    that would bring the update to PPO's target, KL ∝ lr²; one step at most x100 or /100, the range of
    :func:`_lr_to_target`) gets
    STEP_FIRST_BONUS (TARGET_BONUS for a plateau, which is about progress, not step size), the others in
    that direction half of it; 0 for anything else.
    """
    if c.path != "actor_learning_rate" or not isinstance(c.new, (int, float)):
        return 0.0
    best = 0.0
    for f in diagnosis.findings:
        sign, lr = PROGRESS_DIRECTION.get(f.kind), f.data.get("lr")
        if sign is None or f.severity == "info" or not isinstance(lr, (int, float)) or lr <= 0:
            continue

        def log_mult(x: Candidate, lr: float = lr, sign: float = sign) -> float | None:
            """log10 of the learning-rate multiplier of ``x`` when it moves in the finding's direction."""
            ok = x.path == "actor_learning_rate" and isinstance(x.new, (int, float)) and x.new > 0
            m = math.log10(x.new / lr) if ok else None
            return m if m is not None and m * sign > 0 else None

        mine = log_mult(c)
        if mine is None:
            continue
        full = TARGET_BONUS if f.kind == "plateau" else STEP_FIRST_BONUS
        factor = f.data.get("lr_factor_to_target")
        if not isinstance(factor, (int, float)) or not factor > 0:
            best = max(best, full / 2)
            continue
        want = math.log10(min(LR_TO_TARGET_MAX, max(1 / LR_TO_TARGET_MAX, factor)))
        dists = [abs(m - want) for x in candidates if (m := log_mult(x)) is not None]
        best = max(best, full if abs(mine - want) <= min(dists) + 1e-12 else full / 2)
    return best


LR_TO_TARGET_MIN = 10.0
"""A progress finding's ``lr_factor_to_target`` beyond x10 (or under /10) gets its own candidate: the seed skills'
steps (x3, x10, /3, /10) cover the range up to there."""
LR_TO_TARGET_MAX = 100.0
"""The largest learning-rate step of one candidate (x100 or /100): KL ∝ lr² holds for small steps only, and two
orders of magnitude already span what the round's bracket can tell apart."""
LR_MAX = 1e-3  # the seed skills' learning-rate cap (lr_up_x3, lr_up_x10: ``max: 0.001``)


def _lr_to_target(recipe: Recipe, diagnosis: Diagnosis, kind: str) -> list[Candidate]:
    """A learning-rate candidate at the finding's own ``lr_factor_to_target`` when it lies beyond the seed skills' x10
    (``update_too_small``) or /10 (``update_too_large``), at most x100 / 100, two significant digits, capped at
    :data:`LR_MAX`; [] otherwise (a factor within x10, an infinite or missing one, an info finding).

    Why: √(KL_TARGET / update KL) is the multiplier that brings the update to PPO's target (KL ∝ lr² for small
    steps; harness/analyzers/progress.py). A base learning rate 10x under the default's (2e-7 on SmolLM2) moved
    the update KL two orders under the target, and the loop's largest step, x10, still left it 4x short: the round
    after it paid only for its control (docs/compare.md §10-§11), while a blind proposal of x45 learnt most.
    """
    if kind not in ("update_too_small", "update_too_large"):
        return []
    lr = recipe.actor_learning_rate
    out: list[Candidate] = []
    for f in diagnosis.findings:
        factor = f.data.get("lr_factor_to_target")
        if f.kind != kind or f.severity == "info" or not isinstance(factor, (int, float)) \
                or not math.isfinite(factor) or factor <= 0 or lr <= 0:
            continue
        if kind == "update_too_small" and factor > LR_TO_TARGET_MIN:
            mult = min(factor, LR_TO_TARGET_MAX)
        elif kind == "update_too_large" and factor < 1 / LR_TO_TARGET_MIN:
            mult = max(factor, 1 / LR_TO_TARGET_MAX)
        else:
            continue
        new = min(float(f"{lr * mult:.2g}"), LR_MAX)
        if new == lr:
            continue
        out.append(Candidate(
            path="actor_learning_rate", new=new, category="optimizer", addresses=[kind],
            source=f"finding:{kind}",
            hypothesis=f"{f.explanation[:200]} The learning rate x{mult:.3g} (√(KL target / update KL), "
                       f"beyond the seed skills' x10 and /10) brings the update to PPO's KL target."))
    return out


def _suspect_components(recipe: Recipe, diagnosis: Diagnosis) -> list[str]:
    """Reward components other than correctness with a non-zero weight, those named in evidence first."""
    named = " ".join(" ".join(f.evidence) + " " + f.explanation for f in diagnosis.findings)
    comps = [n for n, c in recipe.reward.items() if n != "correctness" and c.weight != 0]
    return sorted(comps, key=lambda n: (n not in named, n))
