"""Baseline modes on the same budget as the EvoTrainer loop (issues 8 and 16, the paper's comparison table).

Every mode spends the same compute (``LoopBase.compute``: generated train + dev-eval tokens, capped by
``budget.max_tokens``, and the wall clock), decides with the one shared gate rule
(:func:`evotrainer.harness.gate.verdict_from_gate`; no brain), and at the end scores its final answer
and the no-RL row on the sealed test split (``LoopBase.final_test``).

The baselines write the lineage through MCP tools like the loop: their multi-field children (a recipe-search
trial, a PBT member) with ``propose_recipe``, PBT's continuing members (control children) with
``branch_control``, greedy's single changes with ``propose_intervention``.

- ``static``: the base recipe trained for the whole budget (``max_versions × steps_per_version``
  steps, or segments of ``steps_per_version`` until ``max_tokens`` is spent), evaluated, gated.
  No harness, no agents.
- ``recipe-search``: Optuna TPE (Bergstra et al. 2011; ``optuna.samplers.TPESampler``, seeded) over
  recipe fields (:data:`SEARCH_SPACE`), an AutoResearch-like baseline with no harness: trial 0 is
  the base recipe (the root), each later trial is a child of the root with the sampled fields,
  trained ``steps_per_version`` steps, scored by held-out Avg@k; the promotion gate keeps or prunes
  each trial. ``max_versions`` trials in all.

- ``greedy``: karpathy/autoresearch's keep / discard loop: from the current best, one random single
  change (a field of :data:`SEARCH_SPACE`, uniform on its log or linear range, or another choice),
  trained ``steps_per_version`` steps from the best's checkpoint; kept when its dev Avg@k beats the
  current best's (autoresearch keeps any improvement of the validation metric), discarded otherwise.
  No harness: no analyzers, no diagnosis.
- ``pbt``: Population Based Training (Jaderberg et al. 2017) with Ray Tune's
  ``PopulationBasedTraining`` rules as the reference: a population of :data:`PBT_POPULATION`
  members trains in segments of ``steps_per_version`` steps; after each segment the members are
  ranked by dev Avg@k, each member in the bottom quantile (``quantile_fraction`` 0.25) exploits a
  random member of the top quantile (copies its checkpoint and recipe: a child of its version) and
  explores: each searched field is resampled from its distribution with probability
  ``resample_probability`` 0.25, else multiplied by 0.8 or 1.2 (a choice moves to a neighbour);
  the others continue their own recipe (a control child).

Like the orchestrator, all are resumable: each trial's sampled parameters are stored in kv before
the version is created, and the TPE study is rebuilt on resume by replaying the stored ask / tell
sequence, so the sampler continues exactly where it stopped.
"""

from __future__ import annotations

import math
import random
from typing import Any

from evotrainer.agents.decisions import Verdict, gate_verdict
from evotrainer.agents.loop import EVAL_SHAPE, GATE_SHAPE, LoopBase
from evotrainer.lineage import NUM, KvMap
from evotrainer.recipe import Recipe, apply_value_rule, get_path

# name -> (kind, low, high | choices, log). Paths are recipe paths (OpenRLHF names).
SEARCH_SPACE: dict[str, tuple] = {
    "actor_learning_rate": ("float", 1e-7, 1e-4, True),
    "temperature": ("float", 0.6, 1.3, False),
    "eps_clip_high": ("float", 0.2, 0.4, False),
    "init_kl_coef": ("float", 1e-4, 1e-1, True),
    "generate_max_len": ("mult", (1, 2, 4)),
}


# The shapes of the search modes' run-level values (LineageStore.kv_get): a value of another shape, in a run folder
# from elsewhere, is a LineageError naming the file, the key, the shape and the fix, not a bare TypeError or
# AttributeError on resume (review 11, C-R11). (shape, fields it must have)
TRIAL_SHAPE = ({"params": KvMap(NUM)}, ("params",))  # recipe-search loop/trial/<t>: the sampled parameters
GREEDY_TRIAL_SHAPE = ({"version": str, "parent": str}, ("version", "parent"))  # greedy loop/trial/<t>
GENERATION_SHAPE = ({"members": [str], "scores": KvMap(NUM)}, ("members",))  # pbt loop/gen/<g>
MEMBERS_SHAPE = ([str], ())  # pbt loop/members
BEST_SHAPE = (str, ())  # greedy loop/best
GENERATION_NUMBER_SHAPE = (int, ())  # pbt loop/generation


class _Gated(LoopBase):
    def _kv(self, key: str, shape: tuple[Any, tuple[str, ...]]) -> Any:
        """The run-level value under ``key`` (None when unset), checked against ``shape`` (one of the ``*_SHAPE``
        pairs above).

        Raises:
            LineageError: the stored value has another shape or lacks a field it needs (a crafted or damaged run
                folder); names the run's lineage.db, the key, the shape EvoTrainer writes and the fix.
        """
        return self.lineage.kv_get(key, expected=shape[0], required=shape[1])

    def start(self) -> str:
        """Start (or resume) the run: its start time, the root version and the root's no-RL evaluation; the root id."""
        self.started_at()
        root = self.ensure_root()
        self.stage("no_rl", lambda: self.evaluate(root, "no_rl"))
        return root

    def start_trained(self) -> str:
        """:meth:`start`, then the root's first segment and its gate against the no-RL evaluation; the root id."""
        root = self.start()
        self.segment(root)
        self.gate_and_decide(root, "no_rl")
        return root

    def gate_and_decide(self, vid: str, baseline: str | None) -> None:
        if self.status(vid) in ("kept", "pruned", "reverted"):
            return
        gate = self.stage(f"gate/{vid}", lambda: self.tb.call("gate_version", {"version_id": vid}), expected=GATE_SHAPE)
        verdict = self.stage(f"verdict/{vid}", lambda: gate_verdict(vid, gate), Verdict)
        self.record_decision(verdict, f"{self.mode}")

    def finish(self, final: str | None) -> dict[str, Any]:
        """Score the final answer on test (once), store compute, mark the run finished; returns the summary."""
        self.save_compute()
        self.stage("final_test", lambda: self.final_test(final))
        self.save_compute()
        self.mark_finished()
        return self.summary()

    def best_dev(self, vids: list[str] | None = None) -> str | None:
        """The version with the highest dev Avg@k (earliest on ties) among ``vids`` (default: all evaluated)."""
        ids = vids if vids is not None else [str(r["id"]) for r in self.version_rows()]
        vs = [v for v in map(self.version_of, ids) if "avg@k" in (v.eval_summary or {})]
        return max(vs, key=lambda v: (v.eval_summary["avg@k"], -v.created_at)).id if vs else None

    def segment(self, vid: str) -> float:
        """Train ``vid`` one segment (``steps_per_version``) and evaluate it on dev; its dev Avg@k (0 when failed)."""
        if self.status(vid) not in ("kept", "pruned", "reverted", "failed"):
            if not self.train(vid, self.config.budget.steps_per_version):
                self.fail_version(vid, self.mode)
                return 0.0
            self.evaluate(vid)
        return float(self.dev_summary(vid).get("avg@k") or 0.0)

    def propose_recipe(self, parent: str, changes: dict[str, Any], source: str, hypothesis: str, note: str) -> str:
        """``propose_recipe``: a child of ``parent`` with every field of ``changes`` set (one intervention per
        path); returns its id."""
        v = self.tb.call("propose_recipe", {"parent_id": parent, "changes": [{"path": p, "value": new}
                                                                             for p, new in changes.items()],
                                            "hypothesis": hypothesis, "source": source, "note": note})
        return str(v["id"])

    def continue_member(self, vid: str, note: str) -> str:
        """``branch_control``: the control child of ``vid`` (its recipe continued); returns its id."""
        return str(self.tb.call("branch_control", {"parent_id": vid, "note": note})["version"]["id"])


class StaticRun(_Gated):
    """The static baseline: one version, the base recipe, trained for the whole step budget."""

    mode = "static"

    def run(self) -> dict[str, Any]:
        """Run (or resume) the static baseline; returns the run summary."""
        root = self.start()
        b = self.config.budget
        if b.max_tokens is None:
            ok = self.train(root, b.max_versions * b.steps_per_version)
        else:  # segments of steps_per_version until the token budget is spent (the last may overshoot it)
            ok, total = True, max(self.lineage.last_step(root) + 1, 0)
            while ok and self.status(root) not in ("kept", "pruned", "reverted"):
                if total >= b.steps_per_version and self.out_of_budget():
                    break
                total += b.steps_per_version
                ok = self.train_to(root, total)
        if ok:
            self.evaluate(root)
            self.gate_and_decide(root, "no_rl")
        else:
            self.fail_version(root, self.mode)
        return self.finish(root)


class RecipeSearch(_Gated):
    """Optuna TPE over :data:`SEARCH_SPACE`; see the module docstring."""

    mode = "recipe-search"

    def _params_to_values(self, params: dict[str, Any], base: Recipe) -> dict[str, Any]:
        out = {}
        for name, spec in SEARCH_SPACE.items():
            if name not in params:
                continue
            if spec[0] == "mult":
                out[name] = _scaled(base, name, int(params[name]))
            else:
                out[name] = float(params[name])
        return out

    def _distributions(self) -> dict[str, Any]:
        import optuna

        d = {}
        for name, spec in SEARCH_SPACE.items():
            if spec[0] == "float":
                d[name] = optuna.distributions.FloatDistribution(spec[1], spec[2], log=spec[3])
            else:
                d[name] = optuna.distributions.CategoricalDistribution(list(spec[1]))
        return d

    def run(self) -> dict[str, Any]:
        """Run (or resume) the search; returns the run summary."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        root = self.start()
        base = self.recipe_of(root)
        root_score = self._trial_version(root, None)
        dists = self._distributions()
        study = optuna.create_study(direction="maximize",
                                    sampler=optuna.samplers.TPESampler(seed=self.config.seed, n_startup_trials=3))
        base_params = {n: (float(get_path(base, n)) if s[0] == "float" else 1) for n, s in SEARCH_SPACE.items()}
        base_params = {n: min(max(v, s[1]), s[2]) if s[0] == "float" else v
                       for (n, s), v in zip(SEARCH_SPACE.items(), base_params.values(), strict=True)}
        study.add_trial(optuna.trial.create_trial(params=base_params, distributions=dists, value=root_score))
        t = 1
        while t < self.config.budget.max_versions:
            stored = self._kv(f"loop/trial/{t}", TRIAL_SHAPE)
            if stored is None and self.out_of_budget():
                break
            trial = study.ask(dists)
            if stored is None:
                stored = {"params": trial.params}
                self.lineage.kv_set(f"loop/trial/{t}", stored)
            params = stored["params"]
            vid = self._trial_child(root, base, t, params)
            score = self._trial_version(vid, root)
            if trial.params == params:
                study.tell(trial, score)
            else:  # the replayed sampler drifted (should not happen): keep the stored trial as history
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=score))
            t += 1
        kept = [str(v["id"]) for v in self.version_rows() if v["status"] == "kept"]
        return self.finish(self.best_dev(kept) if kept else root)

    def _trial_child(self, root: str, base: Recipe, t: int, params: dict[str, Any]) -> str:
        """Find-or-create trial ``t``'s version: a child of the root with the sampled fields."""
        note = f"recipe-search trial {t}"
        found = self.child_with_note(root, note)
        if found is not None:
            return found
        changes, hypothesis = _changes(base, self._params_to_values(params, base)), "TPE sample"
        if not changes:  # TPE re-sampled the base: nudge the learning rate so the trial is a real child
            changes = {"actor_learning_rate": _scaled(base, "actor_learning_rate", 1.01)}
            hypothesis = "TPE sample (base re-sampled)"
        # a multi-field child is a recipe-search trial, not an agent intervention: propose_recipe
        vid = self.propose_recipe(root, changes, "recipe-search", hypothesis, note)
        self.emit("lineage", {})
        return vid

    def _trial_version(self, vid: str, parent: str | None) -> float:
        """Train, evaluate and gate one trial; returns its held-out Avg@k (0 when it failed)."""
        if self.status(vid) not in ("kept", "pruned", "reverted"):
            if not self.train(vid, self.config.budget.steps_per_version):
                self.fail_version(vid, self.mode)
                return 0.0
            self.evaluate(vid)
            self.gate_and_decide(vid, None if parent else "no_rl")
        ev = self.lineage.kv_get(f"loop/eval/{vid}/heldout", expected=EVAL_SHAPE) or self.dev_summary(vid)
        return float(ev.get("avg@k") or 0.0)


def _scaled(recipe: Recipe, name: str, factor: float) -> Any:
    """``recipe``'s value at ``name`` times ``factor`` (:func:`evotrainer.recipe.apply_value_rule`: an int field
    stays an int of at least its minimum, a float keeps 12 significant digits)."""
    return apply_value_rule({"op": "mul", "by": factor}, get_path(recipe, name), name)


def _sample_field(rng: random.Random, name: str, base: Recipe) -> Any:
    """A value of one :data:`SEARCH_SPACE` field drawn from its distribution (log-uniform for log floats)."""
    spec = SEARCH_SPACE[name]
    if spec[0] == "mult":
        return _scaled(base, name, int(rng.choice(spec[1])))
    lo, hi, log = spec[1], spec[2], spec[3]
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))) if log else rng.uniform(lo, hi))


def _changes(parent: Recipe, values: dict[str, Any]) -> dict[str, Any]:
    """The ``values`` that change ``parent``'s recipe, by path (unchanged fields left out)."""
    return {path: new for path, new in values.items() if new != get_path(parent, path)}


class GreedySearch(_Gated):
    """karpathy/autoresearch-style keep / discard from the current best (see the module docstring)."""

    mode = "greedy"

    def run(self) -> dict[str, Any]:
        """Run (or resume) the greedy loop; returns the run summary."""
        root = self.start_trained()
        best = self._kv("loop/best", BEST_SHAPE) or root
        t = 1
        while len(self.version_rows()) < self.config.budget.max_versions:
            stored = self._kv(f"loop/trial/{t}", GREEDY_TRIAL_SHAPE)
            if stored is None:
                if self.out_of_budget():
                    break
                rng = random.Random(f"greedy-{self.config.seed}-{t}")
                base = self.recipe_of(best)
                name = rng.choice(sorted(SEARCH_SPACE))
                new = _sample_field(rng, name, base)
                if new == get_path(base, name):  # the draw hit the current value: nudge it so the trial is a change
                    new = apply_value_rule({"op": "mul", "by": 2 if SEARCH_SPACE[name][0] == "mult" else 1.01}, new, name)
                note = f"greedy trial {t}"
                # one changed field: a single-factor child (propose_intervention; find-or-create by its note)
                vid = self.child_with_note(best, note) or self.propose(
                    best, name, new, "greedy", "random single change (greedy keep / discard)", note=note)
                stored = {"version": vid, "parent": best}
                self.lineage.kv_set(f"loop/trial/{t}", stored)
            vid, parent = stored["version"], stored["parent"]
            score = self.segment(vid)
            ref = float(self.dev_summary(parent).get("avg@k") or 0.0)
            if self.status(vid) not in ("kept", "pruned", "reverted"):
                keep = score > ref
                why = (f"{'keep' if keep else 'discard'} {vid}: dev Avg@k {score:.3f} "
                       f"{'>' if keep else '<='} the current best {parent}'s {ref:.3f} (greedy: any improvement)")
                self.record_decision(Verdict(version_id=vid, action="keep" if keep else "prune", rationale=why,
                                             evidence=[f"eval:heldout:{vid}", f"eval:heldout:{parent}"]), self.mode)
            if self.status(vid) == "kept":
                best = vid
                self.lineage.kv_set("loop/best", best)
            t += 1
        return self.finish(best)


PBT_POPULATION = 4
"""Members of the PBT population (Jaderberg et al. 2017 use tens; 4 fits a CPU budget of a few versions)."""
PBT_QUANTILE = 0.25
"""Ray Tune ``PopulationBasedTraining(quantile_fraction=0.25)``: bottom / top quantile exploited / copied."""
PBT_RESAMPLE_P = 0.25
"""Ray Tune ``resample_probability=0.25``: chance a field is redrawn from its distribution instead of perturbed."""
PBT_FACTORS = (0.8, 1.2)
"""Ray Tune ``perturbation_factors=(1.2, 0.8)``: multiplicative perturbation of a continuous field."""


def pbt_explore(rng: random.Random, recipe: Recipe) -> dict[str, Any]:
    """Ray Tune PBT's explore step on the :data:`SEARCH_SPACE` fields of ``recipe``: each field is redrawn with
    probability :data:`PBT_RESAMPLE_P`, else a float is multiplied by 0.8 or 1.2 (clipped to its range) and a
    choice moves to a neighbouring choice. Returns the new values by path."""
    out: dict[str, Any] = {}
    for name, spec in SEARCH_SPACE.items():
        if rng.random() < PBT_RESAMPLE_P:
            out[name] = _sample_field(rng, name, recipe)
            continue
        cur = get_path(recipe, name)
        if spec[0] == "mult":
            out[name] = _scaled(recipe, name, rng.choice(PBT_FACTORS))
        else:
            out[name] = float(apply_value_rule({"op": "mul", "by": rng.choice(PBT_FACTORS), "min": spec[1], "max": spec[2]},
                                               float(cur), name))
    return out


class PBTRun(_Gated):
    """Population Based Training over recipe fields (see the module docstring)."""

    mode = "pbt"

    def run(self) -> dict[str, Any]:
        """Run (or resume) PBT; returns the run summary."""
        root = self.start_trained()
        base = self.recipe_of(root)
        members = self._kv("loop/members", MEMBERS_SHAPE)
        if members is None:  # generation 0: the base recipe and PBT_POPULATION - 1 sampled recipes
            rng = random.Random(f"pbt-{self.config.seed}-init")
            members = [root]
            for i in range(1, min(PBT_POPULATION, self.config.budget.max_versions)):
                vals = {n: _sample_field(rng, n, base) for n in SEARCH_SPACE}
                members.append(self.propose_recipe(root, _changes(base, vals), "pbt", "PBT initial sample",
                                                   f"pbt member {i} generation 0"))
            self.lineage.kv_set("loop/members", members)
            self.emit("lineage", {})
        g = int(self._kv("loop/generation", GENERATION_NUMBER_SHAPE) or 0)
        for vid in members:  # a member the budget cannot pay for is left out of the population
            if self.status(vid) == "proposed" and vid != root and self.out_of_budget():
                continue
            self.segment(vid)
        members = [m for m in members if "avg@k" in self.dev_summary(m)] or [root]
        while True:
            if self._kv(f"loop/gen/{g + 1}", GENERATION_SHAPE) is None:
                if len(self.version_rows()) + len(members) > self.config.budget.max_versions or self.out_of_budget():
                    break
                self.lineage.kv_set(f"loop/gen/{g + 1}", self._next_generation(members, g + 1))
            members = self._kv(f"loop/gen/{g + 1}", GENERATION_SHAPE)["members"]
            for vid in members:
                if self.status(vid) == "proposed" and self.out_of_budget():
                    continue  # the budget ran out within the generation: this member is not trained
                self.segment(vid)
            members = [m for m in members if "avg@k" in self.dev_summary(m)]
            g += 1
            self.lineage.kv_set("loop/generation", g)
            self.lineage.kv_set("loop/members", members)
        members = members or [root]
        for vid in members:
            if self.status(vid) not in ("kept", "pruned", "reverted", "failed"):
                self.record_decision(Verdict(version_id=vid, action="keep", rationale=(
                    f"keep {vid}: a member of the final PBT population (dev Avg@k "
                    f"{self.dev_summary(vid).get('avg@k', 0.0):.3f})"),
                    evidence=[f"eval:heldout:{vid}"]), self.mode)
        return self.finish(self.best_dev(members))

    def _next_generation(self, members: list[str], gen: int) -> dict[str, Any]:
        """Exploit / explore: the bottom quantile copies a random top-quantile member (a perturbed child of its
        version); the rest continue (a control child of their version). Decisions record who was replaced."""
        rng = random.Random(f"pbt-{self.config.seed}-{gen}")
        score = {m: float(self.dev_summary(m).get("avg@k") or 0.0) for m in members}
        order = sorted(members, key=lambda m: (-score[m], m))
        n_q = max(1, int(math.ceil(len(order) * PBT_QUANTILE))) if len(order) >= 2 else 0
        top, bottom = order[:n_q], set(order[len(order) - n_q:]) if n_q else set()
        new = []
        for m in members:
            if m in bottom:
                src = rng.choice(top)
                rec = self.recipe_of(src)
                changes, hypothesis = _changes(rec, pbt_explore(rng, rec)), f"PBT exploit {src} + explore"
                if not changes:
                    changes = {"actor_learning_rate": _scaled(rec, "actor_learning_rate", 1.2)}
                    hypothesis = "PBT explore (perturbation kept the recipe)"
                child = self.propose_recipe(src, changes, "pbt", hypothesis,
                                            f"pbt generation {gen}: exploit {src} for {m}")
                if self.status(m) not in ("kept", "pruned", "reverted", "failed"):
                    self.record_decision(Verdict(version_id=m, action="prune", rationale=(
                        f"prune {m}: bottom quantile of the PBT population (dev Avg@k {score[m]:.3f}); replaced by "
                        f"{child}, a perturbed copy of {src} ({score[src]:.3f})"), evidence=[f"eval:heldout:{m}"]),
                        self.mode)
                new.append(child)
            else:
                if self.status(m) not in ("kept", "pruned", "reverted", "failed"):
                    self.record_decision(Verdict(version_id=m, action="keep", rationale=(
                        f"keep {m}: not in the bottom quantile of the PBT population (dev Avg@k {score[m]:.3f}); "
                        "it continues its recipe"), evidence=[f"eval:heldout:{m}"]), self.mode)
                new.append(self.continue_member(m, f"pbt generation {gen}: {m} continues"))
        self.emit("lineage", {})
        return {"members": new, "scores": score}
