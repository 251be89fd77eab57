"""Baseline modes on the same budget as the EvoTrainer loop (issue 8, the paper's comparison table).

- ``static``: the base recipe trained for the whole budget (``max_versions × steps_per_version``
  steps), evaluated, gated against the no-RL row. No harness, no agents.
- ``recipe-search``: Optuna TPE (Bergstra et al. 2011; ``optuna.samplers.TPESampler``, seeded) over
  recipe fields (:data:`SEARCH_SPACE`), an AutoResearch-like baseline with no harness: trial 0 is
  the base recipe (the root), each later trial is a child of the root with the sampled fields,
  trained ``steps_per_version`` steps, scored by held-out Avg@k; the promotion gate keeps or prunes
  each trial. ``max_versions`` trials in all.

Like the orchestrator, both are resumable: each trial's sampled parameters are stored in kv before
the version is created, and the TPE study is rebuilt on resume by replaying the stored ask / tell
sequence, so the sampler continues exactly where it stopped.
"""

from __future__ import annotations

from typing import Any

from evotrainer.agents.decisions import Verdict
from evotrainer.agents.loop import LoopBase, run_summary

from evotrainer.intervention import Intervention, category_of
from evotrainer.recipe import get_path

# name -> (kind, low, high | choices, log). Paths are recipe paths (OpenRLHF names).
SEARCH_SPACE: dict[str, tuple] = {
    "actor_learning_rate": ("float", 1e-7, 1e-4, True),
    "temperature": ("float", 0.6, 1.3, False),
    "eps_clip_high": ("float", 0.2, 0.4, False),
    "init_kl_coef": ("float", 1e-4, 1e-1, True),
    "generate_max_len": ("mult", (1, 2, 4)),
}


def _gate_verdict(vid: str, gate: dict[str, Any]) -> Verdict:
    """The gate's verdict as a decision (the heuristic brain's rule: keep only what the gate promotes)."""
    from evotrainer.agents.decisions import Diagnosis
    from evotrainer.agents.heuristic import HeuristicBrain

    return HeuristicBrain().decide(None, vid, gate, Diagnosis(version_id=vid))


class _Gated(LoopBase):
    def gate_and_decide(self, vid: str, baseline: str | None) -> None:
        if self.lineage.get(vid).status in ("kept", "pruned", "reverted"):
            return
        gate = self.stage(f"gate/{vid}", lambda: self.tb.call("gate_version", {"version_id": vid}))
        verdict = self.stage(f"verdict/{vid}", lambda: _gate_verdict(vid, gate), Verdict)
        self.record_decision(verdict, f"{self.mode}")

    def summary(self) -> dict[str, Any]:
        return run_summary(self.ws, self.mode)


class StaticRun(_Gated):
    """The static baseline: one version, the base recipe, trained for the whole step budget."""

    mode = "static"

    def run(self) -> dict[str, Any]:
        """Run (or resume) the static baseline; returns the run summary."""
        self.started_at()
        root = self.ensure_root()
        self.stage("no_rl", lambda: self.evaluate(root, "no_rl"))
        steps = self.config.budget.max_versions * self.config.budget.steps_per_version
        if self.train(root, steps):
            self.evaluate(root)
            self.gate_and_decide(root, "no_rl")
        else:
            self.fail_version(root, self.mode)
        self.lineage.kv_set("loop/finished", True)
        return self.summary()


class RecipeSearch(_Gated):
    """Optuna TPE over :data:`SEARCH_SPACE`; see the module docstring."""

    mode = "recipe-search"

    def _params_to_values(self, params: dict[str, Any], base: Any) -> dict[str, Any]:
        out = {}
        for name, spec in SEARCH_SPACE.items():
            if name not in params:
                continue
            if spec[0] == "mult":
                out[name] = int(get_path(base, name)) * int(params[name])
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
        self.started_at()
        root = self.ensure_root()
        base = self.lineage.get(root).recipe
        self.stage("no_rl", lambda: self.evaluate(root, "no_rl"))
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
            stored = self.lineage.kv_get(f"loop/trial/{t}")
            trial = study.ask(dists)
            if stored is None:
                if self.out_of_time():
                    break
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
        self.lineage.kv_set("loop/finished", True)
        return self.summary()

    def _trial_child(self, root: str, base: Any, t: int, params: dict[str, Any]) -> str:
        """Find-or-create trial ``t``'s version: a child of the root with the sampled fields."""
        note = f"recipe-search trial {t}"
        for c in self.lineage.children(root):
            if c.note == note:
                return c.id
        values = self._params_to_values(params, base)
        ivs = []
        for path, new in values.items():
            old = get_path(base, path)
            if new == old:
                continue
            ivs.append(Intervention(path=path, old=old, new=new, category=category_of(path),
                                    hypothesis="TPE sample", source="recipe-search"))
        if not ivs:  # TPE re-sampled the base: nudge the learning rate so the trial is a real child
            lr = get_path(base, "actor_learning_rate")
            ivs = [Intervention(path="actor_learning_rate", old=lr, new=lr * 1.01, category="optimizer",
                                hypothesis="TPE sample (base re-sampled)", source="recipe-search")]
        # A multi-field child is a recipe-search trial, not an agent intervention; the core lineage
        # store creates it (the MCP propose tool is single-factor by design).
        v = self.lineage.branch(root, ivs, note=note)
        self.emit("lineage", {})
        return v.id

    def _trial_version(self, vid: str, parent: str | None) -> float:
        """Train, evaluate and gate one trial; returns its held-out Avg@k (0 when it failed)."""
        v = self.lineage.get(vid)
        if v.status not in ("kept", "pruned", "reverted"):
            if not self.train(vid, self.config.budget.steps_per_version):
                self.fail_version(vid, self.mode)
                return 0.0
            self.evaluate(vid)
            self.gate_and_decide(vid, None if parent else "no_rl")
        ev = self.lineage.kv_get(f"loop/eval/{vid}/heldout") or self.lineage.get(vid).eval_summary or {}
        return float(ev.get("avg@k") or 0.0)
