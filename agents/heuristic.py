"""The offline heuristic brain: deterministic rules over the MCP tools (no API key needed).

Same typed outputs as the Claude brain (:mod:`evotrainer.agents.decisions`):

- diagnose: run the built-in analyzers on the version (``run_analyzer``), keep their findings;
  "unexplained" when the held-out gain over the parent is significant and no warn/blocking finding
  stands;
- propose: for each finding kind (blocking first), the skills that address it (``search_skills``
  with ``finding_kinds``), then the built-in fix table :data:`FIXES`; each becomes one
  single-factor candidate on the parent's recipe; already-tried changes are skipped;
- rank: prior (finding severity matched + skill track record) plus backtests: re-score stored
  rollouts for reward changes (``rescore_rollouts``), replay the group filter for filter changes
  (``replay_filter``);
- decide: the promotion gate (``gate_version``): keep only when the held-out gain's CI is above 0
  and no blocking finding stands; prune otherwise.

Ties break on candidate order, so equal inputs give equal outputs (the crash test relies on it).
"""

from __future__ import annotations

import json
import math
from typing import Any

from evotrainer.agents.decisions import (
    AnalyzerDraft,
    Candidate,
    Diagnosis,
    FindingRef,
    Proposal,
    Ranking,
    Score,
    Verdict,
)
from evotrainer.agents.intervener import task_mismatch
from evotrainer.agents.mcp_client import RoleTools, ToolCallError
from evotrainer.harness.findings import DAMAGES_WEIGHTS

from evotrainer.recipe import Recipe, RecipeError, get_path

# Built-in fixes per finding kind: (path, rule, hypothesis, expected metric, direction). Rules:
# ("mul", x), ("add", x), ("set", v), ("weight0",) = zero the weight of the suspect reward component.
FIXES: dict[str, list[tuple[str, tuple, str, str, str]]] = {
    "truncation": [
        ("generate_max_len", ("mul", 2), "completions hit the length cap; a longer budget lets answers finish",
         "completions/clipped_ratio", "down"),
        ("reward.overlong.weight", ("set", 1.0), "DAPO overlong shaping teaches the policy to stop before the cap",
         "completions/clipped_ratio", "down"),
    ],
    "zero_variance_groups": [
        ("dynamic_filtering", ("set", True), "DAPO dynamic sampling refills the batch with informative groups",
         "reward/frac_zero_std", "down"),
        ("data.level", ("difficulty",), "move the data to the difficulty where groups disagree",
         "reward/frac_zero_std", "down"),
        ("n_samples_per_prompt", ("mul", 2), "larger groups are less often all-equal", "reward/frac_zero_std", "down"),
    ],
    "entropy_collapse": [
        ("actor_learning_rate", ("mul", 0.1), "a smaller step keeps the policy from collapsing",
         "policy/entropy", "up"),
        ("eps_clip_high", ("set", 0.28), "Clip-Higher (DAPO) keeps low-probability tokens explorable",
         "policy/entropy", "up"),
        ("temperature", ("add", 0.2), "hotter sampling keeps exploration alive", "policy/entropy", "up"),
    ],
    "template_collapse": [
        ("temperature", ("add", 0.2), "hotter sampling breaks the shared template", "completions/distinct_2", "up"),
        ("actor_learning_rate", ("mul", 0.3), "slower updates keep diversity", "completions/distinct_2", "up"),
    ],
    "length_collapse": [
        ("temperature", ("add", 0.2), "exploration of longer reasoning", "completions/mean_length", "up"),
        ("actor_learning_rate", ("mul", 0.3), "slower updates keep the length distribution", "completions/mean_length", "up"),
    ],
    "length_blowup": [
        ("reward.overlong.weight", ("set", 1.0), "overlong shaping penalises run-on answers",
         "completions/mean_length", "down"),
        ("reward.length_penalty.weight", ("set", 0.5), "a per-token penalty beyond the target length",
         "completions/mean_length", "down"),
    ],
    "nan_blowup": [
        ("actor_learning_rate", ("mul", 0.1), "the update diverged; a 10x smaller step", "loss/total", "down"),
        ("max_norm", ("set", 0.5), "tighter gradient clipping", "policy/grad_norm", "down"),
    ],
    "kl_blowup": [
        ("actor_learning_rate", ("mul", 0.3), "the policy drifts too fast from the reference", "policy/kl", "down"),
        ("init_kl_coef", ("mul", 10), "a stronger KL anchor", "policy/kl", "down"),
    ],
    "grad_spike": [
        ("max_norm", ("set", 0.5), "tighter gradient clipping absorbs spikes", "policy/grad_norm", "down"),
        ("actor_learning_rate", ("mul", 0.3), "smaller steps", "policy/grad_norm", "down"),
    ],
    "reward_hacking": [
        ("reward.*.weight", ("weight0",), "the reward pays for something other than correctness; stop paying it",
         "eval/avg@k", "up"),
    ],
    "train_eval_divergence": [
        ("reward.*.weight", ("weight0",), "train reward rises without held-out gains: a component is misaligned",
         "eval/avg@k", "up"),
        ("actor_learning_rate", ("mul", 0.3), "overfitting the training prompts; smaller steps", "eval/avg@k", "up"),
    ],
    # progress findings (harness/analyzers/progress.py): the learning rate's scale is logarithmic, so its
    # steps are multiplicative (x3 / x10 up, /3 / /10 down); rank() puts the one nearest the finding's
    # lr_factor_to_target first.
    "update_too_small": [
        ("actor_learning_rate", ("mul", 10.0), "the update's KL is far below PPO's target: a 10x larger step",
         "policy/update_kl", "up"),
        ("actor_learning_rate", ("mul", 3.0), "the update's KL is below PPO's target: a 3x larger step",
         "policy/update_kl", "up"),
        ("n_samples_per_prompt", ("mul", 2), "larger groups: more of them carry signal", "reward/frac_zero_std",
         "down"),
    ],
    "update_too_large": [
        ("actor_learning_rate", ("mul", 0.1), "the update's KL is far above PPO's target: a 10x smaller step",
         "policy/update_kl", "down"),
        ("actor_learning_rate", ("mul", 0.3333333333), "the update's KL is above PPO's target: a 3x smaller step",
         "policy/update_kl", "down"),
        ("rollout_batch_size", ("mul", 2), "more groups per step average the update", "policy/update_kl", "down"),
    ],
    "plateau": [
        ("actor_learning_rate", ("mul", 3.0), "learning stalled with headroom left: a 3x larger step",
         "eval/avg@k", "up"),
        ("temperature", ("add", 0.2), "hotter sampling explores answers the policy has stopped trying",
         "reward/frac_zero_std", "down"),
        ("n_samples_per_prompt", ("mul", 2), "larger groups find the rare correct answers", "eval/avg@k", "up"),
    ],
}
# Info findings that still call for a change (not a failure of the version): saturated training data.
ACTIONABLE_INFO = frozenset({"headroom"})
FIXES["headroom"] = [("data.level", ("difficulty",), "the training data is saturated: harder problems carry signal",
                      "reward/frac_zero_std", "down")]
# Exploration when no failure finding stands (the recipe works; look for more gain).
EXPLORE: list[tuple[str, tuple, str, str, str]] = [
    ("actor_learning_rate", ("mul", 3.0), "no failure stands; a larger step may learn faster", "eval/avg@k", "up"),
    ("n_samples_per_prompt", ("mul", 2), "larger groups give lower-variance advantages", "eval/avg@k", "up"),
    ("temperature", ("add", -0.2), "cooler sampling concentrates on likely-correct answers", "eval/avg@k", "up"),
    ("eps_clip_high", ("set", 0.28), "Clip-Higher (DAPO)", "eval/avg@k", "up"),
]
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


def _resolve(rule: tuple, current: Any, recipe: Recipe, path: str) -> Any:
    """New value for ``path`` from a rule and the current value (None: the rule does not apply)."""
    op = rule[0]
    if op == "set":
        return rule[1]
    if op in ("mul", "add"):
        if not isinstance(current, (int, float)) or isinstance(current, bool):
            return None
        new = current * rule[1] if op == "mul" else current + rule[1]
        if isinstance(current, int) and not isinstance(rule[1], float):
            new = int(new)
        return float(f"{new:.12g}") if isinstance(new, float) else new  # 12 significant digits (lr 6.67e-7 too)
    if op == "difficulty":
        return None  # resolved by the caller, which knows the reward level
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


def resolve_skill_value(value: Any, current: Any) -> Any:
    """A skill's value applied to ``current`` (the rules of skills_db's ``resolve_value``, read over MCP).

    A literal is itself; ``{"op": "set", "value": V}`` → V; ``{"op": "mul"|"add", "by": x}`` → current × / + x
    (clamped by ``min`` / ``max``; an int stays an int); ``{"op": "toggle"}`` → not current. None when the
    rule does not fit the current value (e.g. a number rule on an absent reward component).
    """
    if not (isinstance(value, dict) and "op" in value):
        return value
    op = value["op"]
    if op == "set":
        return value.get("value")
    if op == "toggle":
        return (not current) if isinstance(current, bool) else None
    if op not in ("mul", "add") or isinstance(current, bool) or not isinstance(current, (int, float)):
        return None
    by = value.get("by", 1)
    out = current * by if op == "mul" else current + by
    if "min" in value:
        out = max(out, value["min"])
    if "max" in value:
        out = min(out, value["max"])
    return int(round(out)) if isinstance(current, int) else float(f"{out:.12g}")


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
        """Candidates for the parent's findings: matching skills first, then the built-in fixes."""
        kinds = diagnosis.kinds() if diagnosis.findings else []
        failures = [k for k in kinds if any(f.kind == k and (f.severity != "info" or k in ACTIONABLE_INFO)
                                            for f in diagnosis.findings)]
        out: list[Candidate] = []
        seen = set(tried)
        skills_used: list[str] = []

        def add(c: Candidate) -> None:
            if task_mismatch(c.path, recipe.data.task):
                return  # e.g. an SWE-only reward term on a math task (it would raise RewardError)
            try:
                current = get_path(recipe, c.path)
            except RecipeError:
                current = None
                if not c.path.startswith("reward."):
                    return
            if c.new is None or json.dumps(c.new) == json.dumps(current) or c.key() in seen:
                return
            try:
                c.to_intervention(current).apply(recipe)
            except Exception:  # noqa: BLE001 (an inapplicable candidate is skipped)
                return
            seen.add(c.key())
            out.append(c)

        for kind in failures:
            for sk in self._skills_for(tools, kind, diagnosis):
                path, value = sk.get("recipe_path"), sk.get("value")
                if not path:
                    continue
                try:
                    current = get_path(recipe, path)
                except RecipeError:
                    current = None
                new = resolve_skill_value(value, current)
                if path == "data.level" and not _toward_variance(current, new, context.get("reward_mean")):
                    continue  # e.g. "harder data" when the policy already fails most prompts
                before = len(out)
                add(Candidate(path=path, new=new, hypothesis=sk.get("description", "")[:300] or sk.get("name", ""),
                              addresses=[kind], source=f"skill:{sk.get('id')}",
                              expected_metric=sk.get("expected_metric") or "eval/avg@k",
                              expected_direction=sk.get("expected_direction") or "up"))
                if len(out) > before:
                    skills_used.append(str(sk.get("id")))
            for path, rule, hyp, metric, direction in FIXES.get(kind, []):
                for c in self._expand(path, rule, hyp, metric, direction, recipe, kind, diagnosis, context):
                    add(c)
        if not failures:
            for path, rule, hyp, metric, direction in EXPLORE:
                for c in self._expand(path, rule, hyp, metric, direction, recipe, "", diagnosis, context):
                    add(c)
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

    def _expand(self, path: str, rule: tuple, hyp: str, metric: str, direction: str, recipe: Recipe,
                kind: str, diagnosis: Diagnosis, context: dict[str, Any]) -> list[Candidate]:
        src = "heuristic"
        if rule[0] == "weight0":
            suspects = _suspect_components(recipe, diagnosis)
            return [Candidate(path=f"reward.{name}.weight", new=0.0, hypothesis=f"{hyp} ({name})", addresses=[kind],
                              expected_metric=metric, expected_direction=direction, source=src) for name in suspects]
        try:
            current = get_path(recipe, path)
        except RecipeError:
            current = None
        if rule[0] == "difficulty":
            reward_mean = context.get("reward_mean")
            if reward_mean is None or not isinstance(current, int):
                return []
            new = current + 1 if reward_mean >= 0.5 else max(1, current - 1)
        else:
            new = _resolve(rule, current, recipe, path)
        if new is None:
            return []
        return [Candidate(path=path, new=new, hypothesis=hyp, addresses=[kind] if kind else [],
                          expected_metric=metric, expected_direction=direction, source=src)]

    # --- backtester ---------------------------------------------------------------------------------------
    def rank(self, tools: RoleTools, parent_id: str, proposal: Proposal, diagnosis: Diagnosis,
             n_choose: int) -> Ranking:
        """Score each candidate: finding match + skill track record + backtest signal; choose the top ``n_choose``."""
        sev = {}
        for f in diagnosis.findings:
            sev[f.kind] = max(sev.get(f.kind, 0.0), SEVERITY_WEIGHT[f.severity])
        scores: list[Score] = []
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
        return Ranking(scores=scores, chosen=chosen,
                       rationale="ranked by finding severity, skill record and backtests: "
                       + ", ".join(f"#{s.index} {proposal.candidates[s.index].path}={s.score:.2f}" for s in order[:5]))

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
        """Keep when the gate promotes (CI of the held-out gain above 0, no blocking finding); else prune."""
        blocking = sorted(set(blocking_kinds(gate)) | {f.kind for f in diagnosis.blocking()})
        promote = bool(gate.get("promote")) and not blocking
        gain, ci, p = gate.get("gain"), gate.get("ci"), gate.get("p_value")
        nums = _gate_numbers(gain, ci, p)
        reason = f" Gate: {gate['reason']}" if gate.get("reason") else ""
        if promote and gate.get("parent_id") is None and gain is None:
            why = f"keep {version_id}: the root (baseline) version, no blocking finding.{reason}"
        elif promote:
            why = f"keep {version_id}: held-out gain {nums}; no blocking finding.{reason}"
        elif blocking:
            why = f"prune {version_id}: blocking finding(s) {', '.join(blocking)} stand ({nums}).{reason}"
        elif gate.get("below_sources"):
            why = f"prune {version_id}: the merge scores below a source it composes ({nums} over the parent).{reason}"
        else:
            why = f"prune {version_id}: held-out gain not established ({nums}).{reason}"
        evidence = [str(e) for e in gate.get("evidence", [])][:20] or ["eval:heldout"]
        return Verdict(version_id=version_id, action="keep" if promote else "prune", rationale=why, evidence=evidence)

    # --- harness evolution ------------------------------------------------------------------------------
    def write_analyzer(self, tools: RoleTools, version_id: str, diagnosis: Diagnosis,
                       context: dict[str, Any]) -> AnalyzerDraft | None:
        """A length-shift analyzer: flags a version whose mean completion length moved > 30% from its parent."""
        from evotrainer.agents.analyzer_templates import LENGTH_SHIFT

        return AnalyzerDraft(name="length_shift", kind="length_shift",
                             description="mean completion length moved more than 30% from the parent version",
                             code=LENGTH_SHIFT)


def blocking_kinds(gate: dict[str, Any]) -> list[str]:
    """Finding kinds of the gate's blocking findings (dicts from ``gate_version``, or plain kinds)."""
    return [b.get("kind", "?") if isinstance(b, dict) else str(b) for b in gate.get("blocking", []) or []]


def _gate_numbers(gain: Any, ci: Any, p: Any) -> str:
    parts = []
    if isinstance(gain, (int, float)):
        parts.append(f"{gain:+.3f}")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci):
        parts.append(f"95% CI [{ci[0]:+.3f}, {ci[1]:+.3f}]")
    if isinstance(p, (int, float)):
        parts.append(f"p={p:.3f}")
    return ", ".join(parts) or "no paired held-out comparison"


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


def _progress_bonus(c: Candidate, candidates: list[Candidate], diagnosis: Diagnosis) -> float:
    """Rank bonus of a learning-rate change that a progress finding asks for (harness/analyzers/progress.py).

    ``update_too_small`` / ``plateau`` want a larger step, ``update_too_large`` a smaller one. Among the
    proposed learning rates in that direction (multipliers of the finding's ``data["lr"]``), the one
    nearest in log scale to the finding's ``lr_factor_to_target`` (√(KL_target / update KL): the multiplier
    that would bring the update to PPO's target, KL ∝ lr²; one step at most x10 or /10) gets
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
        want = math.log10(min(10.0, max(0.1, factor)))
        dists = [abs(m - want) for x in candidates if (m := log_mult(x)) is not None]
        best = max(best, full if abs(mine - want) <= min(dists) + 1e-12 else full / 2)
    return best


def _suspect_components(recipe: Recipe, diagnosis: Diagnosis) -> list[str]:
    """Reward components other than correctness with a non-zero weight, those named in evidence first."""
    named = " ".join(" ".join(f.evidence) + " " + f.explanation for f in diagnosis.findings)
    comps = [n for n, c in recipe.reward.items() if n != "correctness" and c.weight != 0]
    return sorted(comps, key=lambda n: (n not in named, n))
