"""The orchestrator: EvoTrainer's autonomous loop (docs/design.md §2).

    evaluate the base model (no-RL row) → train the base recipe → evaluate → gate
    repeat within the budget (versions, steps per version, wall clock):
      parent = best kept version (the root while none is kept)
      diagnose the parent → retrieve skills → propose single-factor children → backtest and rank
      → branch and train the chosen → evaluate → diagnose → gate → keep / prune
      → record outcomes, failed cases and the search trace in memory
      → revert kept versions whose evidence turned bad → merge kept siblings
      → evolve analyzers when a held-out move is unexplained
    with ``budget.exploit_fraction`` of a token budget kept back: continue the answer alone until the budget is spent

Everything acts through MCP tools (:class:`~evotrainer.agents.mcp_client.ToolBox`): the lineage is read and
written through them (:mod:`.loop`); the lineage store's kv holds the loop's own stage records.

Crash safety: every stage is idempotent. A stage's typed output is stored in kv
(``loop/<key>``) when it completes, and replayed on resume instead of asking the brain again;
side effects are find-or-create (a child with the same intervention, a version already trained,
evaluated or decided is not redone). So ``evotrainer run --resume`` after a SIGKILL at any point
neither loses nor repeats a decision, and ends with the same lineage as an uninterrupted run with
the same seed (the heuristic brain and the backend are deterministic).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evotrainer.agents.backtester import Backtester
from evotrainer.agents.brain import Brain
from evotrainer.agents.decisions import Candidate, Diagnosis, Proposal, Ranking, Verdict, blocking_kinds
from evotrainer.agents.diagnostician import Diagnostician
from evotrainer.agents.evolution import STOPS_KEY, STOPS_SHAPE, evolve_round, record_stop, stop_plan, stopped
from evotrainer.agents.intervener import Intervener
from evotrainer.agents.loop import (
    DECIDED,
    GATE_SHAPE,
    Event,
    LoopBase,
    LoopError,
    eval_record,
    first_not_reverted,
    open_toolbox,
    run_summary,
)
from evotrainer.agents.mcp_client import ToolBox, ToolCallError
from evotrainer.config import RunConfig
from evotrainer.executor import Task, choose_executor, make_executor
from evotrainer.harness.gate import round_decisions
from evotrainer.intervention import change_key
from evotrainer.lineage import CONTROL, NUM, LineageError
from evotrainer.workspace import Workspace

__all__ = ["Orchestrator", "LoopBase", "LoopError", "open_toolbox", "run_summary"]

# The shapes of the orchestrator's resume state in kv (LineageStore.kv_get: another shape, in a run folder from
# elsewhere or a damaged lineage.db, is a LineageError naming the file and the key; review 10 V-R10)
USAGE_SHAPE = {"input_tokens": NUM, "output_tokens": NUM, "cost_usd": NUM, "turns": NUM, "calls": NUM,
               "fallbacks": NUM, "model": str}  # loop/usage: the brain's usage summed over resumes
OUTCOME_SHAPE = {"version_id": str, "change": str, "status": str, "gain": NUM}  # loop/memory/<v>


class Orchestrator(LoopBase):
    """The EvoTrainer mode: harness + agents (see the module docstring).

    Args:
        brain: the brain every agent uses (:class:`~evotrainer.agents.heuristic.HeuristicBrain` or
            :class:`~evotrainer.agents.claude.ClaudeBrain`).
    """

    mode = "evotrainer"

    def __init__(self, config: RunConfig, toolbox: ToolBox, ws: Workspace, brain: Brain,
                 on_event: Event | None = None):
        super().__init__(config, toolbox, ws, on_event)
        self.brain = brain
        self.diagnostician = Diagnostician(brain, toolbox)
        self.intervener = Intervener(brain, toolbox)
        self.backtester = Backtester(brain, toolbox)
        self.author = f"orchestrator/{brain.name}"
        self._executor: Any = None  # evotrainer.executor, made at the first round with executor: ray
        self._executor_kind: str | None = None  # executor: auto resolved (:meth:`executor_kind`)

    # --- the loop ----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run (or resume) the loop to the end of the budget; returns the run summary.

        Raises:
            LineageError: a stored stage record or resume value (kv ``loop/*``) is not of the shape EvoTrainer
                writes (a run folder from elsewhere or a damaged lineage.db); names the file, the key and the fix.
        """
        try:
            return self._run()
        finally:
            if self._executor is not None:
                self._executor.close()
                self._executor = None

    def _run(self) -> dict[str, Any]:
        self.started_at()
        self._usage0 = dict(self.lineage.kv_get("loop/usage", expected=USAGE_SHAPE) or {})
        self.lineage.kv_set("loop/brain", self.brain.name)
        root = self.ensure_root()
        self.stage("no_rl", lambda: self.evaluate(root, "no_rl"))
        self.process_child(root, parent_id=None, round_no=0)
        r = int(self.lineage.kv_get("loop/round", 1, expected=int))
        while True:
            in_progress = self.done(f"r{r}/parent") and not self.done(f"r{r}/done")
            if not in_progress and self.n_versions() >= self.config.budget.max_versions:
                self.log(f"round {r}: stopping: {self.n_versions()} versions, the budget's max_versions")
                break
            if not in_progress and self.out_of_budget(self.explore_cap()):
                self.log(f"round {r}: stopping: the budget is spent ({self.budget_note(self.explore_cap())})")
                break
            if not self.round(r):
                self.log(f"round {r}: no untried intervention left; stopping")
                break
            r += 1
            self.lineage.kv_set("loop/round", r)
            self._save_usage()
            self.save_compute()
        self._save_usage()
        self.save_compute()
        if self.explore_cap() is not None:
            self.exploit(r)
            self.save_compute()
        self.stage("final_test", lambda: self.final_test(self.stage("answer", self.answer, expected=str)))
        self.save_compute()
        self.mark_finished()
        return self.summary()

    def _arms_left(self) -> int | None:
        """Arms the next round may start: the fewer of what the token budget pays for (:meth:`affordable_arms` of
        :meth:`explore_cap`) and what ends before the wall clock (:meth:`arms_in_time`); None when neither says."""
        known = [n for n in (self.affordable_arms(self.explore_cap()), self.arms_in_time()) if n is not None]
        return min(known) if known else None

    def explore_cap(self) -> int | None:
        """Tokens the rounds may spend: ``(1 - budget.exploit_fraction) x budget.max_tokens``; None without a token
        budget or with ``exploit_fraction`` 0 (the rounds spend the whole budget and nothing is exploited)."""
        b = self.config.budget
        if b.max_tokens is None or not b.exploit_fraction:
            return None
        return max(1, int(b.max_tokens * (1.0 - b.exploit_fraction)))

    def exploit(self, r: int) -> str | None:
        """The exploit phase: continue the run's answer so far alone until the token budget is spent.

        The answer so far (:meth:`answer`) gets a control arm (``branch_control``: its recipe continued from its
        checkpoint), trained in segments of ``steps_per_version`` while the budget is not spent (the static mode's
        rule: the last segment may overshoot by less than one), evaluated on dev once and decided as a control-only
        round (:func:`~evotrainer.harness.gate.round_decisions`: kept unless established worse than its parent or
        blocked by a finding of its own). When it is selectable and its dev Avg@k is at least its parent's it becomes
        the frontier, and so the answer; otherwise the answer stays where it was (checkpoint selection on dev).

        Why: the rounds spread a budget over arms of ``steps_per_version`` steps each, so the answer of a run of
        rounds alone is a few segments deep where the static mode's is the whole budget deep (docs/compare.md: 24
        steps against 64-80 at the same tokens, with the root and the first round taking 14.4-15.0k of 18.4k).
        Successive halving and Hyperband (Li et al. 2017, 2020) and PBT's exploit step (Jaderberg et al. 2017) spend
        the larger share of a budget on the configuration that won the cheap comparisons; this is that share.

        Returns the exploit arm's id, or None when nothing was exploited (no budget left, no trained answer, its
        weights damaged, a control of it already trained, or its training failed); the run log says which.
        """
        if self.done("exploit/done"):
            arm = self.lineage.kv_get("loop/exploit/arm", expected=str)
            if arm is not None:
                self._check_exploit_arm(self.lineage.kv_get("loop/exploit/parent", expected=str), arm)
            return arm
        parent = self.stage("exploit/parent", self.answer, expected=str)
        self._check_exploit_parent(parent)
        pv = self.version(parent)
        why = None
        if not self.done("exploit/arm") and self.out_of_budget():
            why = "the token budget is spent"
        elif pv["status"] not in ("kept", "pruned") or "avg@k" not in (pv.get("eval_summary") or {}):
            why = f"{parent} is not a trained and evaluated version"
        elif pv.get("damaged_weights"):
            why = f"{parent}'s weights are damaged"
        elif not self.done("exploit/arm") and any(c.is_control for c in self.children_of(parent)):
            why = f"{parent} has a control arm already"
        if why is not None:
            self.log(f"exploit: nothing continued ({why}); the answer stays {parent}", version=parent)
            self.stage("exploit/done", lambda: True)
            return None
        steps = self.config.budget.steps_per_version
        if self.config.budget.exploit_check_k:
            return self._exploit_checked(r, parent, pv)

        vid = self._exploit_first_arm(parent, "until the token budget is spent")
        ok, total = True, max(self.lineage.last_step(vid) + 1, 0)
        while ok and self.status(vid) not in (*DECIDED, "failed"):
            if total >= steps and self.out_of_budget():
                break
            total += steps
            ok = self.train_to(vid, total)
        if not ok or self.status(vid) == "failed":
            self.fail_version(vid, self.author)
            self.stage("exploit/done", lambda: True)
            return vid
        if not self._evaluate_or_fail(vid):
            self.stage("exploit/done", lambda: True)
            return vid
        self.decide_round(r, vid, [])
        self._exploit_answer(parent, pv, [vid])
        self.stage("exploit/done", lambda: True)
        return vid

    def _exploit_checked(self, r: int, parent: str, pv: dict[str, Any]) -> str | None:
        """The exploit phase with a dev check between segments (``budget.exploit_check_k`` > 0).

        The first arm is the answer's control (its recipe continued, as :meth:`exploit`). After each segment of
        ``steps_per_version`` steps but the last (the budget not yet spent), the arm is scored on dev with
        ``exploit_check_k`` samples per problem (eval ``exploit-<steps>``: the same problems and sample seeds each
        time, so the scores are paired). While a segment raises the best score so far the arm goes on. A segment
        that does not is a plateau at this step size: the arm ends there (evaluated on dev and decided), and the
        exploit goes on from its checkpoint as a child with ``actor_learning_rate`` / 3, one intervention, gated
        against its parent. The run's answer is then the best selectable of the exploited arms and the answer so
        far by dev Avg@k (the earlier answer on ties).

        Why: docs/compare.md §8, seed 2: the exploit arm trained 40 steps at a learning rate that had stopped
        paying (+0.021 dev). Cutting the step size when the held-out metric stalls is ReduceLROnPlateau (PyTorch,
        Keras; factor 0.1-0.5) and the step-decay schedules of supervised training; the factor 1/3 is the loop's
        own logarithmic step (learning rate x3 / x10). The checks cost dev samples, paid from the budget.

        Returns the last exploit arm, or None when nothing was exploited.
        """
        k = self.config.budget.exploit_check_k
        best = (pv.get("eval_summary") or {}).get("avg@k")
        best = float(best) if isinstance(best, (int, float)) else 0.0

        arm = self._exploit_first_arm(parent, f"checked on dev (k={k}) each segment")
        arms, n = [arm], 0
        while (nxt := self.lineage.kv_get(f"loop/exploit/cut{n + 1}", expected=str)) is not None \
                and self.lineage.kv_get(f"loop/exploit/plateau/{arm}", expected=bool):  # replayed arms
            best = max([best, *self._exploit_scores(arm)])
            n, arm = n + 1, nxt
            arms.append(arm)
        while True:
            plateau = self.lineage.kv_get(f"loop/exploit/plateau/{arm}", expected=bool)
            if plateau is None:
                plateau, best = self._exploit_segments(arm, best)
                if plateau is None:  # its training or a check failed: the arm is failed, nothing more to exploit
                    break
                if not self._evaluate_or_fail(arm):
                    break
                ctrl = arm if self.version_of(arm).is_control else None
                self.decide_round(r, ctrl, [] if ctrl else [arm])
                self.lineage.kv_set(f"loop/exploit/plateau/{arm}", plateau)
            else:  # replayed: the best check score of the arm is what the next arm must beat
                best = max([best, *self._exploit_scores(arm)])
            if not plateau or self.out_of_budget():
                break
            n += 1
            cur = self.version_of(arm).recipe.actor_learning_rate
            cand = Candidate(path="actor_learning_rate", new=float(f"{cur / 3:.4g}"), category="optimizer",
                             hypothesis=f"exploit: dev stopped rising at lr {cur:g} ({arm}); a smaller step",
                             addresses=["plateau"], source=self.author)
            arm = self.stage(f"exploit/cut{n}", lambda a=arm, c=cand: self._branch(a, c), expected=str)
            arms.append(arm)
            self.log(f"exploit: {arm} continues {arms[-2]} with actor_learning_rate {cand.new:g}", version=arm)
        self._exploit_answer(parent, pv, arms)
        self.stage("exploit/done", lambda: True)
        return arm

    def _exploit_first_arm(self, parent: str, how: str) -> str:
        """Find-or-create (stage ``exploit/arm``) the exploit's first arm, the control of ``parent``; checked on
        replay (:meth:`_check_exploit_arm`) and logged as continuing the answer so far ``how``."""
        def branch() -> str:
            res = self.tb.call("branch_control", {"parent_id": parent,
                                                  "note": f"exploit: {parent}'s recipe continued {how}"})
            self.emit("lineage", {})
            return str(res["version"]["id"])

        vid = self.stage("exploit/arm", branch, expected=str)
        self._check_exploit_arm(parent, vid)
        self.log(f"exploit: {vid} continues the answer so far, {parent}, {how}", version=vid)
        return vid

    def _exploit_segments(self, arm: str, best: float) -> tuple[bool | None, float]:
        """Train ``arm`` segment by segment (to multiples of ``steps_per_version``) with a dev check after each but
        the last; returns ``(plateau, best)``: True when a check did not raise ``best`` (the arm stops there), False
        when the budget ended the arm, None when its training or a check failed (the arm is failed)."""
        steps, k = self.config.budget.steps_per_version, self.config.budget.exploit_check_k
        total = (max(self.lineage.last_step(arm) + 1, 0) // steps) * steps
        while True:
            if total >= steps and self.out_of_budget():
                return False, best
            total += steps
            if not self.train_to(arm, total):
                self.fail_version(arm, self.author)
                return None, best
            if self.out_of_budget():
                return False, best
            try:
                score = float(self.evaluate(arm, f"exploit-{total}", k=k).get("avg@k") or 0.0)
            except LoopError as exc:
                self.log(str(exc), version=arm)
                self.fail_version(arm, self.author)
                return None, best
            if score <= best:
                self.log(f"exploit: {arm} after {total} steps scores {score:.3f} on dev (k={k}), not above the best "
                         f"{best:.3f}: a plateau at this step size", version=arm)
                return True, best
            best = score

    def _exploit_scores(self, arm: str) -> list[float]:
        """The dev check scores stored for ``arm`` (kv ``loop/eval/<arm>/exploit-<steps>``)."""
        out = []
        for _key, rec in self.lineage.kv_items(f"loop/eval/{arm}/exploit-"):
            if isinstance(rec, dict) and isinstance(rec.get("avg@k"), (int, float)):
                out.append(float(rec["avg@k"]))
        return out

    def _exploit_answer(self, parent: str, pv: dict[str, Any], arms: list[str]) -> None:
        """Make the best selectable exploit arm by dev Avg@k the frontier (so the answer) when it is at least the
        answer so far's; otherwise the answer stays. Logs which."""
        before = (pv.get("eval_summary") or {}).get("avg@k")
        scored = []
        for a in arms:
            v, dev = self.version(a), self.dev_summary(a).get("avg@k")
            if self._selectable(a, v) and isinstance(dev, (int, float)):
                scored.append((float(dev), a))
        if scored and isinstance(before, (int, float)) and max(scored)[0] >= before:
            dev, a = max(scored, key=lambda t: (t[0], -arms.index(t[1])))
            self.lineage.kv_set("loop/frontier", a)
            self.log(f"exploit: {a} ({self.lineage.last_step(a) + 1} steps past {self.lineage.get(a).parent_id}) is the "
                     f"answer: dev Avg@k {dev:.3f} against {before:.3f} ({parent})", version=a)
        else:
            self.log(f"exploit: no exploited arm is the answer ({', '.join(arms)}); {parent} had dev {before}",
                     version=parent)

    def _check_exploit_parent(self, parent: str) -> None:
        """A replayed kv ``loop/exploit/parent`` must name a version of this run (review 15 X-R15: it was checked for
        shape only, and a crafted value made the log state a lineage the run does not have).

        Raises:
            LineageError: no such version; names the file, the key and the fix."""
        if not self._known(parent):
            raise LineageError(f"{self.lineage.path}: kv.value of key 'loop/exploit/parent' names {parent[:200]!r}, "
                               "no version of this run (a crafted or damaged file); not read. "
                               f"{self.lineage.kv_fix('loop/exploit/parent')}")

    def _known(self, vid: str) -> bool:
        try:
            self.lineage.get(vid)
        except LineageError:
            return False
        return True

    def _check_exploit_arm(self, parent: str | None, arm: str) -> None:
        """A replayed kv ``loop/exploit/arm`` must name a control child of ``loop/exploit/parent`` (X-R15: a value
        naming the pruned root, or the control of another version, was logged as the continuation of the answer).

        Raises:
            LineageError: the arm is no version of this run, not a control, or not a child of the parent; names the
                file, the key and the fix."""
        fix = self.lineage.kv_fix("loop/exploit/arm")
        if not self._known(arm):
            why = "no version of this run"
        else:
            v = self.lineage.get(arm)
            why = None if (v.is_control and v.parent_id == parent) else (
                f"{'a control' if v.is_control else 'no control'} arm with parent {v.parent_id!r}, where the exploit "
                f"arm is a control of the exploited version {parent!r}")
        if why is not None:
            raise LineageError(f"{self.lineage.path}: kv.value of key 'loop/exploit/arm' names {arm[:200]!r}, {why} "
                               f"(a crafted or damaged file); not read. {fix}")

    def frontier(self) -> str:
        """The version the next round branches from: the best selectable arm (dev Avg@k) of the latest round that
        had one (kv ``loop/frontier``, set by :meth:`_advance`), the root before that; a reverted frontier falls
        back to its nearest kept (or root) ancestor.

        Raises:
            LineageError: kv ``loop/frontier`` is not text (a crafted or damaged run folder).
        """
        return str(first_not_reverted(self._up_to_root(self.lineage.kv_get("loop/frontier", expected=str)
                                                       or self.root_id())))

    def answer(self) -> str:
        """The run's answer, chosen once after the last decision: of the frontier and its siblings (every arm
        trained from the frontier's parent: the control, the changes, a merge; each the same steps from the same
        checkpoint), the one with the highest dev Avg@k that is eligible; the frontier on ties, and whenever it has
        no parent (the root) or no dev score.

        Eligible: not failed or reverted, evaluated on dev, and either kept or pruned by the round's gate for its
        CI alone: its adjusted gate (kv ``loop/rgate/<id>``) holds no blocking finding of its own (shared and
        inherited ones waived as in :func:`~evotrainer.harness.gate.round_decisions`), is not below a merge
        source, and did not pass the gate (a brain that pruned a version the gate would promote had a reason).

        Why not the frontier itself: the gate decides what the lineage branches from and what the run may claim a
        change did (a paired CI above 0 against the control: attribution, where a false claim costs every later
        round), while the answer is model selection among arms of equal compute, where the higher dev point
        estimate is the better bet (the posterior mean under a flat prior is monotone in the observed score;
        checkpoint selection on a validation set, as every baseline mode does). A change that scored above the
        control on dev without a CI above 0 stays pruned (no gain is claimed for it) and can still be the answer;
        the log says which and why.
        """
        front = self.frontier()
        fv = self.version(front)
        parent = fv["parent_id"]
        best, best_avg = front, (fv.get("eval_summary") or {}).get("avg@k")
        if parent is None or not isinstance(best_avg, (int, float)):
            return front
        for cid in self.version(parent)["children"]:
            if cid == front:
                continue
            c = self.version(cid)
            avg = (c.get("eval_summary") or {}).get("avg@k")
            if self._selectable(str(cid), c) and isinstance(avg, (int, float)) and avg > best_avg:
                best, best_avg = str(cid), float(avg)
        if best != front:
            why = f"the best dev score of the arms trained from {parent}" + self._unclaimed(best)
            self.log(f"the answer is {best} (dev Avg@k {best_avg:.3f}), not the frontier {front} "
                     f"({fv['eval_summary']['avg@k']:.3f}): {why}", version=best)
        return best

    def _selectable(self, vid: str, v: dict[str, Any]) -> bool:
        """Whether version ``vid`` (its ``get_version`` row ``v``) may be chosen by its dev score as the frontier or
        the answer: kept, or pruned by its round's gate for its CI alone (its adjusted gate, kv ``loop/rgate/<id>``,
        holds no blocking finding of its own, is not below a merge source, did not pass the gate) and its weights
        not damaged. Failed and reverted versions are not."""
        if v["status"] == "kept":
            return True
        g = self.lineage.kv_get(f"loop/rgate/{vid}", expected=GATE_SHAPE) or {}
        return (v["status"] == "pruned" and bool(g) and not g.get("promote") and not g.get("blocking")
                and not g.get("below_sources") and not v.get("damaged_weights"))

    def _unclaimed(self, vid: str) -> str:
        """For a pruned version chosen by its dev score: why no gain is claimed for it (its gate's gain and CI);
        empty for a kept one."""
        if self.status(vid) == "kept":
            return ""
        g = self.lineage.kv_get(f"loop/rgate/{vid}", expected=GATE_SHAPE) or {}
        gain, ci = g.get("gain"), g.get("ci")
        nums = (f" {gain:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if isinstance(gain, (int, float))
                and isinstance(ci, (list, tuple)) and len(ci) == 2 else "")
        return (f"; its gain over {g.get('baseline_id') or 'its baseline'}{nums} is not claimed (the CI does not "
                "clear 0), so it stays pruned")

    def _up_to_root(self, vid: str | None) -> Iterator[tuple[str, str, str | None]]:
        """``(id, status, parent_id)`` from ``vid`` up to the root, read through ``get_version``, lazily (the walk
        stops at the first version :func:`first_not_reverted` takes)."""
        while vid is not None:
            v = self.version(vid)
            yield str(v["id"]), str(v["status"]), v["parent_id"]
            vid = v["parent_id"]

    def round(self, r: int) -> bool:
        """One round: diagnose the parent, propose, rank, branch (+ the control arm), train all, gate against the
        control, decide, learn. False: nothing to try."""
        budget = self.config.budget
        parent = self.stage(f"r{r}/parent", self.frontier, expected=str)
        pv = self.version_of(parent)
        diag = self.stage(f"diagnose/{parent}", lambda: self.diagnostician.diagnose(parent, self._ctx(parent)),
                          Diagnosis)
        kids = self.children_of(parent)
        tried = {c.interventions[0].key() for c in kids if len(c.interventions) == 1}
        # `tried` is per parent: the same recipe on another branch is another experiment (a child continues
        # from its parent's checkpoint), e.g. v2 + x after the merge v1 (x) + v2 trains 8 more steps from v2
        proposal = self.stage(f"r{r}/propose", lambda: self.intervener.propose(
            parent, pv.recipe, diag, tried, {"reward_mean": (pv.metrics_summary or {}).get("reward/mean")}), Proposal)
        has_control = any(c.is_control for c in kids)
        # with nothing left to try the loop may still continue the parent's recipe (a control-only round: the
        # lineage keeps accumulating training), at most until as many controls as max_versions were trained
        n_controls = sum(1 for v in self.version_rows() if v["role"] == CONTROL)
        if not proposal.candidates and (has_control or n_controls >= budget.max_versions):
            self.stage(f"r{r}/done", lambda: True)
            return False
        room = max(0, budget.max_versions - self.n_versions())
        n_choose = min(budget.branches_per_round, room, len(proposal.candidates))
        damaged = self.version(parent)["damaged_weights"]
        # never start more arms than the token budget pays for (the control first), and never more than end before
        # the wall clock (less the test evaluations' reserve); a round already ranked (a resume) goes on as it was
        # planned: its arms are versions already, so `room` no longer counts them, and the check stopped a resumed
        # round before it trained the arms it had branched (tests/test_orchestrator_crash.py)
        arms = None if self.done(f"r{r}/rank") else self.stage(f"r{r}/arms", lambda: self._arms_left(), expected=int)
        if arms is not None:
            n_choose = min(n_choose, max(0, arms - (0 if damaged else 1)))
            if n_choose == 0 and (damaged or arms < 1 or has_control):  # (an existing control would train nothing)
                self.log(f"round {r}: the budget pays for no further arm ({self.budget_note(self.explore_cap())}); "
                         "stopping")
                self.stage(f"r{r}/done", lambda: True)
                return False
        ranking = self.stage(f"r{r}/rank", lambda: self.backtester.rank(parent, proposal, diag, n_choose)
                             if n_choose else Ranking(chosen=[], scores=[], rationale="no room for a change: "
                                                      "the control continues alone"), Ranking)
        children = self.stage(f"r{r}/branch", lambda: [self._branch(parent, proposal.candidates[i])
                                                       for i in ranking.chosen], expected=[str])
        if budget.probe_steps and len(proposal.candidates) > len(ranking.chosen) and ranking.chosen:
            children = self.stage(f"r{r}/probe", lambda: self._probe(r, parent, proposal, ranking, children),
                                  expected=[str])
        # one control per parent serves all its children (find-or-create): the parent's recipe continued. A parent
        # pruned for damaged weights (get_version's damaged_weights) has nothing to continue: its children are gated
        # against it.
        if damaged and not children:
            self.stage(f"r{r}/done", lambda: True)
            return False
        control = self.stage(f"r{r}/control", lambda: None if damaged else self._control(parent, r), expected=str)
        arms = [*([control] if control else []), *children]
        self.train_side_by_side(arms)  # executor: ray (a no-op inline)
        for vid in arms:
            self.train_and_evaluate(vid)
        self.decide_round(r, control, children)
        self.stage(f"r{r}/memory", lambda: self._record_round(r, parent, diag, proposal, ranking, children))
        self.stage(f"r{r}/revert", lambda: self._revert_check(r, exclude=arms))
        merged = self.stage(f"r{r}/merge", lambda: self._merge(parent, children), expected=str)
        if merged:
            self.train_and_evaluate(merged)
            self.decide_round(r, control, [merged], merge=True)
        self.stage(f"r{r}/evolve", lambda: self._evolve(r, [*children, *([merged] if merged else [])]))
        self.stage(f"r{r}/frontier", lambda: self._advance(r, [*arms, *([merged] if merged else [])]))
        self.stage(f"r{r}/done", lambda: True)
        return True

    def _probe(self, r: int, parent: str, proposal: Proposal, ranking: Ranking, chosen: list[str]) -> list[str]:
        """Successive halving, one rung (Li et al. 2020, ASHA; Jamieson & Talwalkar 2016): the chosen children and
        as many runners-up (by backtest score) each train ``budget.probe_steps`` steps from the parent and are
        scored on dev with 1 sample per problem (same problems and sample seeds: paired); the best
        ``len(chosen)`` continue, the others are pruned with their probe score. Returns the children that go on."""
        budget = self.config.budget
        scores = {s.index: s.score for s in ranking.scores}
        rest = sorted((i for i in range(len(proposal.candidates)) if i not in ranking.chosen),
                      key=lambda i: (-scores.get(i, 0.0), i))[: len(ranking.chosen)]
        room = max(0, budget.max_versions - self.n_versions())
        pool = chosen + [self._branch(parent, proposal.candidates[i]) for i in rest[:room]]
        probe: dict[str, float] = {}
        for vid in pool:
            if not self.train(vid, min(budget.probe_steps, budget.steps_per_version)):
                self.fail_version(vid, self.author)
                continue
            try:
                probe[vid] = float(self.evaluate(vid, "probe", k=1).get("avg@k") or 0.0)
            except LoopError as exc:
                self.log(str(exc), version=vid)
                self.fail_version(vid, self.author)
        order = sorted(probe, key=lambda v: (-probe[v], pool.index(v)))
        keep, drop = order[: len(chosen)], order[len(chosen):]
        for vid in drop:
            why = (f"prune {vid}: probed out after {budget.probe_steps} steps (dev Avg@1 {probe[vid]:.3f}; the "
                   f"{len(keep)} continuing scored " + ", ".join(f"{v} {probe[v]:.3f}" for v in keep) + ")")
            self.record_decision(Verdict(version_id=vid, action="prune", rationale=why,
                                         evidence=[f"eval:probe:{v}" for v in [vid, *keep]]), self.author)
        for vid in keep:
            self.train_to(vid, budget.steps_per_version)
        self.log(f"round {r}: probe kept {', '.join(keep) or 'none'} of {', '.join(pool)}")
        return keep

    def _control(self, parent: str, r: int) -> str:
        """Find-or-create the control arm of ``parent`` (``branch_control``)."""
        res = self.tb.call("branch_control", {
            "parent_id": parent, "note": f"control of {parent} (round {r}): the parent's recipe continued for "
                                         f"{self.config.budget.steps_per_version} steps"})
        vid = str(res["version"]["id"])
        if res["created"]:
            self.log(f"control arm {vid}: {parent}'s recipe continued from its checkpoint", version=vid)
            self.emit("lineage", {})
        return vid

    def _advance(self, r: int, candidates: list[str]) -> str:
        """Move the frontier to the round's arm with the best dev Avg@k among those :meth:`_selectable` (kept, or
        pruned for their CI alone); on equal scores a kept one, then the earlier; leave it where it was when the
        round has none.

        Why not the best *kept* arm: the gate decides what a change is credited with (a paired CI above 0 against
        the control: attribution), while the frontier is what the next round trains from, a choice among arms of
        equal compute from one checkpoint, where the higher dev point estimate is the better bet (the exploit step
        of PBT, Jaderberg et al. 2017, and the rung promotion of successive halving, Li et al. 2020, rank by the
        validation score without a significance test; :meth:`answer` follows the same rule). What prompted it
        (docs/compare.md §6, a base learning rate 10x the default's): both step cuts scored above the control on
        dev (+0.094 [-0.010, +0.198] and +0.073, each above the parent with a CI above 0), yet the frontier moved
        to the control, the recipe the diagnosis had called too fast. Measured there on one seed, the run's answer
        scored the same on test under either rule (-0.007 [-0.074, +0.058]); on the default's three seeds every
        frontier was already its round's best arm."""
        vs = [self.version_of(v) for v in candidates]
        vs = [v for v in vs if "avg@k" in (v.eval_summary or {}) and self._selectable(v.id, self.version(v.id))]
        cur = self.frontier()
        if vs:
            best = max(vs, key=lambda v: (v.eval_summary["avg@k"], v.status == "kept", -v.created_at))
            self.lineage.kv_set("loop/frontier", best.id)
            self.log(f"round {r}: frontier {cur} -> {best.id} ({best.describe_change()}, dev Avg@k "
                     f"{best.eval_summary['avg@k']:.3f}{self._unclaimed(best.id)})", version=best.id)
            return best.id
        self.log(f"round {r}: nothing kept or selectable; the frontier stays at {cur}")
        return cur

    def executor_kind(self) -> str:
        """``inline`` or ``ray``: the config's ``executor``, ``auto`` resolved once per process by
        :func:`~evotrainer.executor.choose_executor` from the root checkpoint's weight size (logged with why)."""
        if self._executor_kind is None:
            weights = None
            ckpt = (self.version(self.root_id()).get("checkpoint") or "") if self.config.executor == "auto" else ""
            if ckpt and Path(ckpt).is_dir():
                weights = sum(f.stat().st_size for f in Path(ckpt).iterdir()
                              if f.suffix in (".safetensors", ".bin", ".pt") and f.is_file())
            kind, why = choose_executor(self.config.executor, backend=self.config.backend,
                                        max_parallel=self.config.max_parallel, threads=self.config.branch_threads,
                                        weights_bytes=weights)
            if self.config.executor == "auto":
                self.log(why)
            self._executor_kind = kind
        return self._executor_kind

    def _ray(self) -> Any:
        """The Ray executor of this run (started on first use, closed at the end of :meth:`run`)."""
        if self._executor is None:
            self._executor = make_executor("ray", ray_address=self.config.ray_address,
                                           max_parallel=self.config.max_parallel,
                                           threads=self.config.branch_threads, backend=self.config.backend)
        return self._executor

    def _store_eval(self, vid: str, eval_name: str, e: dict[str, Any]) -> None:
        """An executor's evaluation stored as the loop's eval stage (kv ``loop/eval/<v>/<name>``), which
        :meth:`~evotrainer.agents.loop.LoopBase.evaluate` then finds done (the record an inline evaluation makes,
        :func:`~evotrainer.agents.loop.eval_record`: its CPU-seconds included, which the report's dev-eval CPU-s
        column and the run's compute read; they were left out here before)."""
        self.lineage.kv_set(f"loop/eval/{vid}/{eval_name}", eval_record(e, eval_name))

    def _worker_cpu(self, results: list[Any]) -> None:
        """The workers' CPU counts in the run's compute (agents.loop.LoopBase.compute) like this process's own."""
        self.lineage.kv_set("loop/worker_cpu_s", float(self.lineage.kv_get("loop/worker_cpu_s", expected=NUM) or 0.0)
                            + sum(res.cpu_s for res in results))

    def final_test(self, final: str | None) -> dict[str, Any]:
        """:meth:`~evotrainer.agents.loop.LoopBase.final_test`; with Ray's executor the two test evaluations (the
        no-RL row and the answer) run side by side first, as two tasks, and are then read as done (one that failed
        runs again in this process)."""
        if self.executor_kind() == "ray" and final is not None and self.config.recipe.data.n_test:
            root, k = self.root_id(), self.config.test_k or self.config.recipe.eval.k
            todo = [Task(version_id=v, evaluate=True, k=k, eval_name=name)
                    for v, name in ((root, "no_rl_test"), (final, "test")) if not self.done(f"eval/{v}/{name}")]
            if todo:
                self.lineage.kv_set("loop/test_unsealed", True)
                self.log(f"evaluating {root} (no_rl_test) and {final} (test) side by side on Ray")
                results = self._ray().run(self.ws.root, todo)
                self._worker_cpu(results)
                for task, res in zip(todo, results, strict=True):
                    if res.status == "done" and res.eval and res.eval.get("avg_at_k") is not None:
                        self._store_eval(task.version_id, task.eval_name, res.eval)
                    else:
                        self.log(f"{task.version_id} ({task.eval_name}) on Ray: {res.status} ({res.error[:300]}); "
                                 "evaluated again in this process", version=task.version_id)
        return super().final_test(final)

    def train_side_by_side(self, vids: list[str]) -> None:
        """``executor: ray``: train and evaluate (dev) the round's versions side by side, at most ``max_parallel``
        at once, through :mod:`evotrainer.executor` (a Ray task per version running our CLI on that version).

        Their evaluations are stored as the loop's eval stages, so :meth:`train_and_evaluate` then finds each
        trained and evaluated and goes on with the same MCP steps as a sequential run (the decisions do not
        depend on the executor). A branch that failed or whose worker died is left to
        :meth:`train_and_evaluate`, which trains it again through MCP (it resumes from its last checkpoint);
        ``evotrainer run --resume`` after a crash submits the unfinished ones again. Inline: nothing here.

        Raises:
            LineageError: kv ``loop/worker_cpu_s`` is no number (a crafted or damaged run folder).
        """
        if self.executor_kind() != "ray":
            return
        todo = [v for v in vids if self.status(v) not in (*DECIDED, "failed")
                and not self.done(f"eval/{v}/heldout")]
        if not todo:
            return
        executor = self._ray()
        steps = self.config.budget.steps_per_version
        self.log(f"training {', '.join(todo)} side by side on Ray (at most {executor.max_parallel} at once)")

        def progress(vid: str, kind: str, done: int, total: int) -> None:
            self.emit("progress", {"version": vid, "what": kind, "done": done, "total": total})

        results = executor.run(self.ws.root, [Task(version_id=v, steps=steps, evaluate=True) for v in todo],
                               progress=progress)
        self._worker_cpu(results)
        for res in results:  # (the progress calls ended at each branch's last step: its bars are full)
            if res.status == "done" and res.eval and res.eval.get("avg_at_k") is not None:
                self._store_eval(res.version_id, "heldout", res.eval)
            elif res.status != "done":
                self.log(f"{res.version_id} on Ray: {res.status} ({res.error[:300]}); it is trained again "
                         "through MCP", version=res.version_id)
        self.emit("lineage", {})

    def train_and_evaluate(self, vid: str) -> bool:
        """Train and evaluate (dev) one version once; a failure prunes it. False when it failed."""
        status = self.status(vid)
        if status in DECIDED:
            return status != "failed"
        if status == "failed" or not self.train(vid, self.config.budget.steps_per_version):
            self.fail_version(vid, self.author)
            return False
        if (stop := stopped(self, vid)) is not None:
            self._prune_stopped(vid, stop)
            return False
        return self._evaluate_or_fail(vid)

    def _evaluate_or_fail(self, vid: str) -> bool:
        """Evaluate ``vid`` on dev; an evaluation that fails prunes it as failed (logged). False when it failed."""
        try:
            self.evaluate(vid)
        except LoopError as exc:
            self.log(str(exc), version=vid)
            self.fail_version(vid, self.author)
            return False
        return True

    def train_options(self, vid: str, steps: int) -> dict[str, Any]:
        """The mid-training early-stop check of harness evolution (:func:`evotrainer.agents.evolution.stop_plan`)."""
        return stop_plan(self, vid, steps)

    def _prune_stopped(self, vid: str, stop: dict[str, Any]) -> None:
        """Prune a branch a trusted analyzer stopped mid-training, unevaluated; the saving goes to kv
        ``loop/analyzers/stops`` (the budget accounting and the report read it)."""
        entry = record_stop(self, vid, stop)
        why = (f"prune {vid}: stopped early after {stop.get('at_step')} of {stop.get('steps_total')} steps by analyzer "
               f"{stop.get('analyzer')} ({stop.get('reason', '')}); {entry['saved_steps']} steps and about "
               f"{entry['saved_tokens']} train tokens saved, dev evaluation skipped")
        self.record_decision(Verdict(version_id=vid, action="prune", rationale=why,
                                     evidence=[f"analyzer:{stop.get('analyzer')}", f"early_stop/{vid}"]), self.author)

    def decide_round(self, r: int, control: str | None, children: list[str], merge: bool = False) -> None:
        """Gate every candidate of the round against the control, apply the round rule
        (``harness.gate.round_decisions``: beat the control; shared blocking findings waived; the control
        continues when nothing beats it), then let the brain decide each with the adjusted gate.

        Raises:
            LineageError: a stored gate, adjusted gate, diagnosis or verdict of the round (kv ``loop/gate/<v>``,
                ``loop/rgate/<v>``, ``loop/diagnose/<v>``, ``loop/verdict/<v>``) is not of the shape EvoTrainer
                writes (a crafted or damaged run folder).
        """
        cands = ([] if merge or control is None else [control]) + children
        # a version whose training or evaluation failed (pruned, no dev outcomes) is no candidate
        cands = [v for v in cands if "avg@k" in self.dev_summary(v)]
        if control in cands or (merge and control is not None and "avg@k" in self.dev_summary(control)):
            self._sequential_gate(control, [v for v in children if v in cands])
        gates = {v: self.stage(f"gate/{v}", lambda v=v: self.backtester.gate(v), expected=GATE_SHAPE) for v in cands}
        if merge:  # the merge is judged against the same control, with the round's shared findings waived
            waived = set((self.lineage.kv_get(f"loop/rgate/{control}", expected=GATE_SHAPE) or {}).get("waived")
                         or []) if control else set()
            adjusted = {v: round_decisions({v: g}, None)[v] for v, g in gates.items()}
            for g in adjusted.values():
                if waived:
                    g["blocking"] = [b for b in g.get("blocking", []) if b.get("kind") not in waived]
                    g["waived"] = sorted(waived)
                    ci = g.get("ci")
                    g["promote"] = bool(not g["blocking"] and not g.get("below_sources")
                                        and isinstance(ci, (list, tuple)) and ci[0] > 0)
        else:
            parent = self.version(control)["parent_id"] if control else None
            inherited = [b.get("kind") for b in (self.lineage.kv_get(f"loop/gate/{parent}", expected=GATE_SHAPE)
                                                 or {}).get("blocking") or [] if isinstance(b, dict)] if parent else []
            adjusted = round_decisions(gates, control if control in gates else None, inherited)
        for vid, g in adjusted.items():
            g = self.stage(f"rgate/{vid}", lambda g=g: g, expected=GATE_SHAPE)
            ctx = {**self._ctx(vid), "gain": g.get("gain"), "significant": _significant(g),
                   "gain_vs_parent": g.get("gain_vs_parent"), "control": g.get("control_id")}
            diag = self.stage(f"diagnose/{vid}", lambda vid=vid, ctx=ctx: self.diagnostician.diagnose(vid, ctx),
                              Diagnosis)
            waived = set(g.get("waived") or [])
            if waived:  # the round's shared findings do not block this decision (see round_decisions)
                diag = diag.model_copy(update={"findings": [
                    f.model_copy(update={"severity": "warn"}) if f.kind in waived and f.severity == "blocking" else f
                    for f in diag.findings]})
            verdict = self.stage(f"verdict/{vid}", lambda vid=vid, g=g, diag=diag: self.backtester.decide(vid, g, diag),
                                 Verdict)
            self.record_decision(verdict, self.author)
            self._record_gains(vid, g)

    def _sequential_gate(self, control: str, children: list[str]) -> None:
        """The sequential gate (``recipe.eval.max_k`` above ``eval.k``; local backend): where a child's paired
        comparison with its control is undecided on the samples drawn so far, draw ``eval.k`` more per problem for
        both (:meth:`~evotrainer.agents.loop.LoopBase.top_up`), until it is decided or they hold ``max_k``.

        Undecided: the gain over the control is above 0 and the CI's lower bound is not (the gate's own comparison,
        ``Backtester.gate``, unstaged; the staged gate of :meth:`decide_round` then decides on all the samples). A
        gain at or below 0 is not topped up: more samples would have to reverse its sign and clear the CI to keep
        it (a futility stop). The control's extra samples serve every child of the round (drawn once, to the most
        any child needed).

        Why: each dev evaluation is paid from the run's token budget (docs/compare.md: 31% of the loop's tokens at
        Avg@2 on 48 problems, against 5% for the static mode), while most of a round's comparisons are decided on one
        sample per problem (round 1's learning-rate arms by +0.12 to +0.32). Group-sequential designs (Pocock 1977;
        Jennison & Turnbull 2000) stop sampling once the evidence decides; the aim is to "sample what is needed
        for the CI the gate asks for". The cost: an undecided comparison has two looks at the gate's confidence, so
        the chance an inert change is kept is at most twice the one-look rate (Bonferroni: 5% one-sided at the 95%
        CI, against 2.5%).
        """
        spec = self.config.recipe.eval
        if spec.max_k is None or spec.max_k <= spec.k or self.config.backend != "local":
            return
        for vid in children:
            while (have := self._dev_k(vid)) < spec.max_k:
                g = self.backtester.gate(vid)
                gain, ci = g.get("gain"), g.get("ci")
                if not (isinstance(gain, (int, float)) and gain > 0 and isinstance(ci, (list, tuple)) and ci
                        and ci[0] <= 0):
                    break
                target = min(spec.max_k, have + spec.k)
                self.log(f"sequential gate: {vid} against its control {control} {gain:+.3f} [{ci[0]:+.3f}, "
                         f"{ci[1]:+.3f}] on {have} sample(s) per problem: undecided; both drawn to {target}",
                         version=vid)
                for v in (control, vid):
                    if (n := self._dev_k(v)) < target:
                        try:
                            self.top_up(v, n, target - n)
                        except LoopError as exc:  # the gate decides on the samples it has
                            self.log(str(exc), version=v)
                            return

    def _dev_k(self, vid: str) -> int:
        """Samples per problem of ``vid``'s dev evaluation: the ``k`` of its latest stage record (``heldout``, or a
        top-up ``heldout+<n>``: replayed after a crash, so a top-up cut short is drawn again from the same index)."""
        ks = [int(rec["k"]) for key, rec in self.lineage.kv_items(f"loop/eval/{vid}/heldout")
              if isinstance(rec, dict) and isinstance(rec.get("k"), int) and key.rsplit("/", 1)[-1].split("+")[0]
              == "heldout"]
        return max(ks, default=0)

    def _record_gains(self, vid: str, g: dict[str, Any]) -> None:
        """Both gains in the version's eval_summary (``vs_control``, ``vs_parent``) and the waived finding kinds,
        for reports and lineage show (``record_gains``)."""
        args: dict[str, Any] = {}
        if g.get("control_id") and g.get("baseline_id") == g.get("control_id"):
            args["vs_control"] = {"version": g["control_id"], "gain": g.get("gain"), "ci": g.get("ci"),
                                  "p_value": g.get("p_value")}
        if g.get("gain_vs_parent") is not None:
            args["vs_parent"] = {"version": self.version(vid)["parent_id"], "gain": g.get("gain_vs_parent"),
                                 "ci": g.get("ci_vs_parent")}
        if g.get("waived"):
            args["waived"] = list(g["waived"])
        if args:
            self.tb.call("record_gains", {"version_id": vid, **args})

    def process_child(self, vid: str, parent_id: str | None, round_no: int) -> None:
        """Train → evaluate → diagnose → gate → decide one version on its own (the root)."""
        if self.status(vid) in DECIDED:
            return
        if not self.train_and_evaluate(vid):
            return
        gate = self.stage(f"gate/{vid}", lambda: self.backtester.gate(vid), expected=GATE_SHAPE)
        ctx = {**self._ctx(vid), "gain": gate.get("gain"), "significant": _significant(gate)}
        diag = self.stage(f"diagnose/{vid}", lambda: self.diagnostician.diagnose(vid, ctx), Diagnosis)
        verdict = self.stage(f"verdict/{vid}", lambda: self.backtester.decide(vid, gate, diag), Verdict)
        self.record_decision(verdict, self.author)

    # --- helpers -----------------------------------------------------------------------------------------
    def _ctx(self, vid: str) -> dict[str, Any]:
        """The brain's context of ``vid`` (``get_version``): parent, eval and metrics summaries, recipe."""
        v = self.version(vid)
        return {"parent_id": v["parent_id"], "eval_summary": v["eval_summary"], "metrics_summary": v["metrics_summary"],
                "recipe": v["recipe"]}

    def _branch(self, parent: str, cand: Candidate) -> str:
        """Find-or-create the child of ``parent`` with this candidate's intervention (``propose_intervention``)."""
        for cid in self.version(parent)["children"]:
            ivs = self.version(cid)["interventions"]
            if len(ivs) == 1 and change_key(ivs[0]["path"], ivs[0]["new"]) == cand.key():
                return cid
        return self.propose(parent, cand.path, cand.new, cand.source or self.author, cand.hypothesis,
                            note=f"addresses {', '.join(cand.addresses) or 'exploration'}",
                            expected_metric=cand.expected_metric, expected_direction=cand.expected_direction,
                            category=cand.category)

    def _record_round(self, r: int, parent: str, diag: Diagnosis, proposal: Proposal, ranking: Ranking,
                      children: list[str]) -> dict[str, Any]:
        """Skill outcomes, failed cases and the search trace, in memory (skills tools)."""
        outcomes = [self.stage(f"memory/{vid}", lambda vid=vid: self._record_child(parent, vid), expected=OUTCOME_SHAPE)
                    for vid in children]
        trace = {"round": r, "parent": parent, "findings": diag.kinds(),
                 "candidates": [c.key() for c in proposal.candidates], "scores": [s.score for s in ranking.scores],
                 "chosen": [proposal.candidates[i].key() for i in ranking.chosen], "outcomes": outcomes}
        chosen_skills = [proposal.candidates[i].source.split(":", 1)[1] for i in ranking.chosen
                         if proposal.candidates[i].source.startswith("skill:")]
        self._call_opt("add_search_trace", {
            "agent": "intervener", "query": f"round {r} from {parent}: findings {', '.join(diag.kinds()) or 'none'}",
            "results": proposal.skills_used, "chosen": chosen_skills[0] if chosen_skills else None,
            "rationale": (ranking.rationale + " | outcomes: " + "; ".join(
                f"{o['version_id']} {o['change']} {o['status']}" for o in outcomes))[:2000],
            "filters": {"finding_kinds": diag.kinds()}})
        return trace

    def _record_child(self, parent: str, vid: str) -> dict[str, Any]:
        """One child's outcome in memory: the skill's track record, and a failed case when not kept."""
        v = self.version_of(vid)
        iv = v.interventions[0]
        kept = v.status == "kept"
        gate = self.lineage.kv_get(f"loop/gate/{vid}", expected=GATE_SHAPE) or {}
        gain = gate.get("gain")
        skill_id = iv.source.split(":", 1)[1] if iv.source.startswith("skill:") else None
        domain = _domain(v.recipe.data.task)
        if skill_id:
            hurt = not kept and (v.status == "failed" or (isinstance(gain, (int, float)) and gain < 0)
                                 or bool(gate.get("blocking")))
            self._call_opt("record_skill_outcome", {"skill_id": skill_id, "domain": domain,
                                                    "outcome": "helped" if kept else "hurt" if hurt else "neutral"})
        if not kept:
            diag_v = self.stored(f"diagnose/{vid}", Diagnosis)
            self._call_opt("add_failed_case", {
                "version_id": vid, "outcome": f"{v.status} (held-out gain {gain})", "intervention": iv.describe(),
                "findings": sorted({f.kind for f in (diag_v.findings if diag_v else []) if f.severity != "info"}),
                "skill_id": skill_id, "domain": domain, "evidence_summary": self._rationale(vid)[:1000]})
        return {"version_id": vid, "change": iv.describe(), "status": v.status, "gain": gain}

    def _rationale(self, vid: str) -> str:
        ds = self.version(vid)["decisions"]
        return str(ds[-1]["rationale"]) if ds else ""

    def _call_opt(self, tool: str, args: dict[str, Any]) -> Any:
        """Call a memory tool; a missing tool or a tool error is logged, not fatal (memory is best effort)."""
        return self.tb.call_optional(tool, args, self.log, what="memory tool")

    def _revert_check(self, r: int, exclude: list[str]) -> list[str]:
        """Revert kept versions whose gate now fails with a blocking finding (e.g. a new analyzer fired)."""
        reverted = []
        for row in self.version_rows():
            vid = str(row["id"])
            if row["status"] != "kept" or vid in exclude:
                continue
            try:
                gate = self.backtester.gate(vid)
            except ToolCallError:
                continue
            waived = set((self.lineage.kv_get(f"loop/rgate/{vid}", expected=GATE_SHAPE) or {}).get("waived") or [])
            if set(blocking_kinds(gate)) - waived:
                why = (f"revert {vid}: blocking finding(s) {', '.join(blocking_kinds(gate))} now stand "
                       f"against it (round {r}); the frontier moves back to its parent")
                self.record_decision(Verdict(version_id=vid, action="revert", rationale=why,
                                             evidence=[str(e) for e in gate.get("evidence", [])][:20] or ["gate"],
                                             damaged_weights=gate.get("damaged_weights")),
                                     self.author)
                reverted.append(vid)
        return reverted

    def _merge(self, parent: str, children: list[str]) -> str | None:
        """Merged child of the best kept sibling of this round and the best one that changed another recipe path,
        when the budget (versions, tokens, wall clock) allows; None otherwise. Two values of one path (the bracketed
        learning rates x3 and x10, both kept) do not compose: the better one is already the frontier's candidate."""
        kept = [self.version_of(c) for c in children]
        kept = [v for v in kept if v.status == "kept" and len(v.interventions) == 1]
        if (len(kept) < 2 or self.n_versions() >= self.config.budget.max_versions
                or self.out_of_budget(self.explore_cap())):
            return None
        kept.sort(key=lambda v: -(v.eval_summary or {}).get("avg@k", 0.0))
        a = kept[0]
        b = next((v for v in kept[1:] if v.interventions[0].path != a.interventions[0].path), None)
        if b is None:
            return None
        note = f"merge of {a.id} and {b.id}"
        found = self.child_with_note(parent, note)
        if found is not None:
            return found
        res = self.tb.call("decide", {"version_id": a.id, "action": "merge", "merge_with": b.id, "author": self.author,
                                      "rationale": f"{a.id} and {b.id} were both kept with independent single-factor "
                                                   f"changes ({a.interventions[0].describe()}; "
                                                   f"{b.interventions[0].describe()}); try both together",
                                      "evidence": [a.id, b.id]})
        self.emit("lineage", {})
        return res["version"]["id"]

    def _evolve(self, r: int, children: list[str]) -> list[dict[str, Any]]:
        """Harness evolution (:mod:`evotrainer.agents.evolution`): inherit analyzers from memory, score them on
        this round's versions, synthesise a rule from the versions of known outcome, judge the brain's draft for
        an unexplained held-out move; the same keep rule (out of sample, permutation-tested) for all."""
        out = evolve_round(self, r, children)
        for e in out:
            if e.get("registered") and e.get("type") in ("synthesis", "draft"):
                self.log(f"analyzer evolution: registered {e.get('name')}: {e.get('reason')}", version=e.get("version"))
        return out

    def _save_usage(self) -> None:
        """Brain usage (tokens, cost, turns) summed over this process and earlier (resumed) ones, in kv."""
        cur = getattr(self.brain, "usage", {}) or {}
        out = dict(self._usage0)
        for k, v in cur.items():
            out[k] = out.get(k, 0) + v if isinstance(v, (int, float)) and not isinstance(v, bool) else v
        self.lineage.kv_set("loop/usage", out)

    def summary(self) -> dict[str, Any]:
        """Headline numbers of the run: versions, statuses, best kept version, no-RL and best Avg@k.

        Raises:
            LineageError: kv ``loop/usage`` or ``loop/analyzers/stops`` (or a value :func:`run_summary` reads) is
                not of the shape EvoTrainer writes (a crafted or damaged run folder).
        """
        out = run_summary(self.ws, self.mode, self.lineage.kv_get("loop/usage", expected=USAGE_SHAPE))
        stops = self.lineage.kv_get(STOPS_KEY, expected=STOPS_SHAPE) or {}
        out["early_stops"] = {v: {k: e.get(k) for k in ("analyzer", "at_step", "steps_total", "saved_steps",
                                                        "saved_tokens")} for v, e in stops.items()}
        out["compute"] = {**out["compute"], "saved_steps": sum(int(e.get("saved_steps") or 0) for e in stops.values()),
                          "saved_tokens": sum(int(e.get("saved_tokens") or 0) for e in stops.values())}
        return out


def _domain(task: str) -> str:
    return {"humaneval": "code", "swe": "swe"}.get(task, "math")


def _significant(gate: dict[str, Any]) -> bool:
    ci = gate.get("ci")
    return isinstance(ci, (list, tuple)) and len(ci) == 2 and (ci[0] > 0 or ci[1] < 0)


