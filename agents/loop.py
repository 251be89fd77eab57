"""Shared machinery of the autonomous loop and the baseline modes: stage records, budget, idempotent
train / evaluate / decide through MCP tools, the run summary (used by :mod:`.orchestrator` and
:mod:`.search`).

The run's lineage is written through MCP tools only (``agents.mcp_client.LOOP_TOOLS``: the root, control
arms, children, training, evaluation, decisions, gains) and read through them (``list_versions``,
``get_version``). The loop's own bookkeeping is its part of the lineage store's kv (``loop/*``: stage
records, budget clocks and token counts, the frontier, the trials' stored samples), written and read
directly: it is the loop's private state, not the run's lineage, which no MCP client needs to write;
so is the compute accounting over the stored step metrics (:meth:`LoopBase.compute`,
:meth:`LoopBase.train_to`) and the end-of-run :func:`run_summary`.

Crash safety rests on :meth:`LoopBase.stage`: a stage's output is stored in the lineage store's kv
(``loop/<key>``) when it completes and replayed on resume; side effects are find-or-create.

Compute: every mode spends the same budget, counted by
:meth:`LoopBase.compute`: training tokens (generated in rollouts: per step ``perf/tokens_per_sec x
perf/step_seconds`` of the stored metrics), dev evaluation tokens (each evaluation's
``gen_tokens``), CPU-seconds and wall time of this process (summed over resumes).
``budget.max_tokens`` caps train + dev-eval tokens; the no-RL dev row and the final test
evaluation (the same for every mode: its final answer and the no-RL row) are reported apart,
outside the budget.

The test split is sealed from the start of a run until :meth:`LoopBase.final_test` opens it after
the last decision (``harness.gate.test_sealed``).
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from evotrainer import metrics as M
from evotrainer.agents.decisions import Verdict
from evotrainer.agents.mcp_client import LOOP_TOOLS, ToolBox, ToolCallError
from evotrainer.config import RunConfig
from evotrainer.errors import EvoTrainerError
from evotrainer.lineage import CONTROL, EVIDENCE_MAX, EVIDENCE_REF_MAX_CHARS, NUM, KvMap, Shape, Version
from evotrainer.recipe import Recipe
from evotrainer.rl_backend.base import is_test_eval
from evotrainer.servers.app import build_server
from evotrainer.terminal import clip_text
from evotrainer.workspace import Workspace

# The shapes of the run-level values the report and the run summary read (LineageStore.kv_get: a value of another
# shape, in a run folder from elsewhere, is a LineageError naming the file, the key and the field; review 10 V-R10)
EVAL_SHAPE = {"avg@k": NUM, "pass@k": NUM}
FINAL_SHAPE = {"version": str, "test": EVAL_SHAPE, "no_rl_test": EVAL_SHAPE}
# ... and of the loop's own resume state (review 10 V-R10: a foreign or damaged lineage.db holding, say,
# loop/eval_tokens = "abc" ended `evotrainer run --resume` with a bare TypeError naming neither the file nor the key)
EVAL_RECORD_SHAPE = {**EVAL_SHAPE, "gen_tokens": NUM}  # loop/eval/<v>/<name>: the evaluate stage's record
PER_EVAL_SHAPE = KvMap(NUM)  # loop/eval_tokens, loop/eval_walls, loop/eval_cpu: {"eval/<v>/<name>": number}
PROCESS_COMPUTE_SHAPE = {"cpu_s": NUM, "wall_s": NUM}  # loop/process_compute: this run's earlier processes' clocks
GATE_SHAPE = {"gain": NUM, "ci": [NUM], "gain_vs_parent": NUM, "ci_vs_parent": [NUM], "p_value": NUM, "score": NUM,
              "blocking": [{"kind": str}], "waived": [str], "below_sources": [str], "evidence": list, "reason": str,
              "baseline_id": str, "control_id": str, "damaged_weights": str}  # loop/gate/<v>, loop/rgate/<v>

NONE = {"__none__": True}  # kv marker of a completed stage whose output is None
DECIDED = ("kept", "pruned", "reverted")
Event = Callable[[str, dict[str, Any]], None]


class LoopError(EvoTrainerError, RuntimeError):
    """The loop cannot continue (a tool it needs is missing, the run folder belongs to another config)."""


class LoopBase:
    """Stage records, idempotent train / evaluate / decide helpers shared by all modes.

    Args:
        config: the run config (budget, recipe, seed).
        toolbox: an open MCP session on the ``all`` server of this run.
        ws: the run's workspace (opened without the writer lock: jobs take it).
        on_event: callback ``(kind, data)`` for the live display (``stage``, ``progress``, ``decision``, ``lineage``).

    Raises:
        LoopError: the server lacks one of the loop's tools (``LOOP_TOOLS``).
    """

    mode = "base"

    def __init__(self, config: RunConfig, toolbox: ToolBox, ws: Workspace, on_event: Event | None = None):
        missing = [n for n in LOOP_TOOLS if not toolbox.has(n)]
        if missing:
            raise LoopError(f"the MCP server lacks the loop's tool(s) {', '.join(missing)}; drive a run through the "
                            "'all' server (evotrainer.servers.app.build_server('all', run_dir))")
        self.config = config
        self.tb = toolbox
        self.ws = ws
        self.lineage = ws.lineage
        self.emit: Event = on_event or (lambda kind, data: None)
        self._root: str | None = None

    def run(self) -> dict[str, Any]:
        """Run (or resume) this mode to the end of its budget; returns the run summary (each mode defines it)."""
        raise NotImplementedError(f"mode {self.mode} does not define run()")

    def summary(self) -> dict[str, Any]:
        """The run summary (:func:`run_summary`) from the lineage and kv alone (no training, no tool call)."""
        return run_summary(self.ws, self.mode)

    # --- stage records -------------------------------------------------------------------------------
    def stage(self, key: str, fn: Callable[[], Any], model: type[BaseModel] | None = None,
              expected: Shape | None = None) -> Any:
        """Run ``fn`` once per run: its output is stored in kv under ``loop/<key>`` and replayed after a crash
        (as a ``model`` instance, or checked against the :data:`~evotrainer.lineage.Shape` ``expected``).

        Raises:
            LineageError: the stored output is no ``model`` or not of the ``expected`` shape (a crafted or damaged
                run folder; :meth:`stored`).
        """
        k = f"loop/{key}"
        stored = self.lineage.kv_get(k)
        if stored == NONE:  # the stage ran and produced nothing (e.g. no merge): do not run it again
            return None
        if stored is not None:
            return self._replay(k, stored, model, expected)
        self.emit("stage", {"key": key})
        out = fn()
        self.lineage.kv_set(k, NONE if out is None else out.model_dump(mode="json") if isinstance(out, BaseModel)
                            else out)
        return out

    def stored(self, key: str, model: type[BaseModel] | None = None, expected: Shape | None = None) -> Any:
        """The stored output of stage ``key`` (kv ``loop/<key>``) as :meth:`stage` replays it; None before the stage
        ran or when it produced nothing.

        Raises:
            LineageError: the stored value is not JSON, no ``model`` or not of the ``expected`` shape (a crafted or
                damaged run folder); names the file, the key and the fix.
        """
        k = f"loop/{key}"
        value = self.lineage.kv_get(k)
        return None if value is None or value == NONE else self._replay(k, value, model, expected)

    def _replay(self, k: str, value: Any, model: type[BaseModel] | None, expected: Shape | None) -> Any:
        if model is not None:
            return self.lineage.kv_model(k, value, model)
        return value if expected is None else self.lineage.kv_typed(k, value, expected)

    def done(self, key: str) -> bool:
        """True when stage ``key`` has completed."""
        return self.lineage.kv_get(f"loop/{key}") is not None

    def log(self, message: str, version: str | None = None, **extra: Any) -> None:
        """A run log record (source = this mode) and a display event."""
        self.ws.log(message, version=version, source=f"agents.{self.mode}", **extra)
        self.emit("log", {"message": message, "version": version})

    # --- budget ----------------------------------------------------------------------------------------
    def started_at(self) -> float:
        """Wall-clock start of the run (kept across resumes). The first call of a process also seals the test
        split until :meth:`final_test` (unless the run has finished) and starts this process's CPU clock.

        Raises:
            LineageError: kv ``loop/started_at`` is no number, or ``loop/process_compute`` no ``{cpu_s, wall_s}``
                of numbers (a crafted or damaged run folder).
        """
        t = self.lineage.kv_get("loop/started_at", expected=NUM)
        if t is None:
            t = time.time()
            self.lineage.kv_set("loop/started_at", t)
        if not hasattr(self, "_proc0"):
            self._proc0 = (time.time(), _cpu_s())
            self._compute0 = dict(self.lineage.kv_get("loop/process_compute", expected=PROCESS_COMPUTE_SHAPE,
                                                      required=("cpu_s", "wall_s")) or {"cpu_s": 0.0, "wall_s": 0.0})
            if not self.lineage.kv_get("loop/finished"):
                self.lineage.kv_set("loop/test_unsealed", False)
        return float(t)

    def out_of_time(self) -> bool:
        """True once the wall-clock budget, less the time the final test evaluation will take
        (:meth:`test_reserve_s`), is spent (no new version is started after that)."""
        return self.time_left_s() < 0

    def time_left_s(self) -> float:
        """Seconds of the wall-clock budget left for new work: ``budget.wall_clock_minutes`` less the time since the
        run started (kept across resumes) and :meth:`test_reserve_s`; negative once spent."""
        return 60.0 * self.config.budget.wall_clock_minutes - (time.time() - self.started_at()) - self.test_reserve_s()

    def test_reserve_s(self) -> float:
        """Seconds to keep for :meth:`final_test`: its two evaluations (final answer, no-RL row), estimated from the
        wall time of this run's dev evaluations so far (0 before the first one, or without a test split).

        Estimate: ``2 x mean dev wall / (P_dev x sqrt(k_dev)) x n_test x sqrt(k_test)``, P_dev the dev problems
        evaluated. An evaluation generates the k samples of a batch of prompts together, and on CPU a decode step of
        more rows costs less than proportionally more (docs/performance.md §7: the small matmuls run at ~40 GFLOP/s
        at 16 rows, ~100 at 1024), so the cost per sample falls with k. Measured on two `make run`s of the default
        (dev 48 problems x k 2, test 100 x 8): idle, dev 30 s -> 125 s a test evaluation estimated, 100-129 s
        measured; loaded, dev 50 s -> 210 s estimated, 96-115 s measured. The per-sample rule it replaces reserved
        2-4x the measured time (838 s against 211 s on the loaded run), which stopped that run after one round.

        Raises:
            LineageError: kv ``loop/eval_walls`` is no object of numbers (a crafted or damaged run folder).
        """
        data, ev = self.config.recipe.data, self.config.recipe.eval
        walls = self.lineage.kv_get("loop/eval_walls", expected=PER_EVAL_SHAPE) or {}
        if not data.n_test or not walls:
            return 0.0
        per_problem = sum(walls.values()) / len(walls) / max(1, min(ev.max_problems or data.n_heldout,
                                                                    data.n_heldout)) / math.sqrt(ev.k)
        return 2 * per_problem * data.n_test * math.sqrt(self.config.test_k or ev.k)

    def arms_in_time(self) -> int | None:
        """How many more arms (``steps_per_version`` steps and one dev evaluation each) end before the wall clock
        (``budget.wall_clock_minutes``, less :meth:`test_reserve_s`); None before a version has trained.

        Estimate: an arm's wall time is the run's wall time so far (summed over resumes, :meth:`compute`) less its
        no-RL evaluation, over the versions trained, so model loads, checkpoints and the harness's work are in it.
        Unlike the token budget's rule (:meth:`affordable_arms`, which may overshoot by less than one arm so that
        every mode spends the same), an arm starts only if it is expected to end in time: ``floor``.

        Raises:
            LineageError: as :meth:`compute`.
        """
        trained = sum(1 for v in self.lineage.versions() if self.lineage.last_step(v.id) >= 0)
        if not trained:
            return None
        walls = self.lineage.kv_get("loop/eval_walls", expected=PER_EVAL_SHAPE) or {}
        no_rl = sum(float(w) for k, w in walls.items() if k.endswith("/no_rl"))
        arm = max(1.0, (self.compute()["wall_s"] - no_rl) / trained)
        return max(0, math.floor(self.time_left_s() / arm))

    def budget_note(self, cap: int | None = None) -> str:
        """What of the budget is spent, for the log line of a stop: the wall clock (minutes spent, minutes kept for
        the test evaluations, the budget) and, with a token budget (``cap`` in its place when given), the tokens."""
        b = self.config.budget
        note = (f"wall clock {(time.time() - self.started_at()) / 60:.1f} min spent + "
                f"{self.test_reserve_s() / 60:.1f} min kept for the test evaluations, of {b.wall_clock_minutes:g}")
        cap = b.max_tokens if cap is None else cap
        if cap is not None:
            c = self.compute()
            note += f"; tokens {c['train_tokens'] + c['eval_tokens']:,} of {cap:,}"
        return note

    def out_of_budget(self, cap: int | None = None) -> bool:
        """True once the wall clock or the token budget (``budget.max_tokens``: train + dev-eval tokens; ``cap``
        in its place when given, e.g. the evotrainer mode's exploration share) is spent."""
        cap = self.config.budget.max_tokens if cap is None else cap
        if self.out_of_time():
            return True
        if cap is None:
            return False
        c = self.compute()
        return c["train_tokens"] + c["eval_tokens"] >= cap

    def affordable_arms(self, cap: int | None = None) -> int | None:
        """How many more arms (``steps_per_version`` steps and one dev evaluation each) the token budget
        (``budget.max_tokens``, or ``cap`` when given) pays for; None without a token budget or before any step
        and dev evaluation gave the per-arm estimate.

        Estimate: ``steps_per_version`` x the run's mean train tokens per trained step + its dev-eval tokens per
        ``heldout`` evaluation (the top-ups of the sequential gate, ``recipe.eval.max_k``, counted with them). An arm may start while the budget is not yet spent (the static mode's rule for its segments),
        so the last arm overshoots by less than one arm: ``ceil((max_tokens - spent) / arm)``, 0 once spent.

        Raises:
            LineageError: as :meth:`compute`.
        """
        cap = self.config.budget.max_tokens if cap is None else cap
        if cap is None:
            return None
        c = self.compute()
        steps = sum(max(self.lineage.last_step(v.id) + 1, 0) for v in self.lineage.versions())
        toks = self.lineage.kv_get("loop/eval_tokens", expected=PER_EVAL_SHAPE) or {}
        devs = _dev_eval_tokens(toks)
        n_evals = sum(1 for key in toks if key.rsplit("/", 1)[-1] == "heldout")  # top-ups count with their eval
        if not steps or not devs or not c["train_tokens"]:
            return None
        arm = self.config.budget.steps_per_version * c["train_tokens"] / steps + sum(devs) / max(1, n_evals)
        left = cap - (c["train_tokens"] + c["eval_tokens"])
        return max(0, math.ceil(left / arm)) if arm > 0 else None

    def compute(self) -> dict[str, Any]:
        """Compute spent so far: ``train_tokens``, ``eval_tokens`` (dev evaluations of trained versions: what the
        budget counts with the train tokens), ``no_rl_tokens`` (the base model's dev row) and ``test_tokens``
        (final test evals) (both the same for every mode, outside the budget), ``cpu_s`` (process user + system
        CPU-seconds, all threads, plus the Ray workers' of ``executor: ray``, kv ``loop/worker_cpu_s``) and
        ``wall_s``, summed over resumes.

        Raises:
            LineageError: kv ``loop/eval_tokens`` is no object of numbers, ``loop/worker_cpu_s`` no number, or
                :meth:`started_at`'s (a crafted or damaged run folder).
        """
        train = sum(train_tokens(self.lineage, v.id) for v in self.lineage.versions())
        toks = self.lineage.kv_get("loop/eval_tokens", expected=PER_EVAL_SHAPE) or {}
        dev = sum(_dev_eval_tokens(toks))
        no_rl = sum(n for k, n in toks.items() if k.endswith("/no_rl"))
        test = sum(n for k, n in toks.items() if _is_test_key(k))
        if not hasattr(self, "_proc0"):
            self.started_at()
        t0, c0 = self._proc0
        workers = float(self.lineage.kv_get("loop/worker_cpu_s", expected=NUM) or 0.0)
        return {"train_tokens": int(train), "eval_tokens": int(dev), "no_rl_tokens": int(no_rl),
                "test_tokens": int(test),
                "cpu_s": round(self._compute0["cpu_s"] + _cpu_s() - c0 + workers, 1),
                "wall_s": round(self._compute0["wall_s"] + time.time() - t0, 1)}

    def mark_finished(self) -> None:
        """Mark the run finished (kv ``loop/finished``, read as a flag) and when (``loop/finished_at``, epoch
        seconds, shown in the report's header); the test split is readable from here on."""
        self.lineage.kv_set("loop/finished_at", time.time())
        self.lineage.kv_set("loop/finished", True)

    def save_compute(self) -> dict[str, Any]:
        """Store :meth:`compute` in kv (``loop/compute``) and this process's clocks for a resume; returns it.

        Raises:
            LineageError: as :meth:`compute`.
        """
        c = self.compute()
        t0, c0 = self._proc0
        # this process's part
        own = round(c["cpu_s"] - float(self.lineage.kv_get("loop/worker_cpu_s", expected=NUM) or 0.0), 1)
        self.lineage.kv_set("loop/process_compute", {"cpu_s": own, "wall_s": c["wall_s"]})
        self._proc0, self._compute0 = (time.time(), _cpu_s()), {"cpu_s": own, "wall_s": c["wall_s"]}
        self.lineage.kv_set("loop/compute", c)
        return c

    def final_test(self, final: str | None) -> dict[str, Any]:
        """After the last decision: open the test seal, score the final answer and the no-RL row on the test split.

        Both use the same problems and sample seeds (``local.evaluate_checkpoint``), so modes pair on test.
        Stored in kv ``loop/final`` (``{version, test, no_rl_test}``); only ``{version}`` when ``data.n_test`` is 0.
        """
        if not self.config.recipe.data.n_test:
            self.lineage.kv_set("loop/final", {"version": final})
            return {"version": final}
        root = self.root_id()
        self.lineage.kv_set("loop/test_unsealed", True)
        k = self.config.test_k or self.config.recipe.eval.k
        out: dict[str, Any] = {"version": final}
        try:
            out["no_rl_test"] = self.evaluate(root, "no_rl_test", k=k)
            if final is not None:
                out["test"] = self.evaluate(final, "test", k=k)
        except (ToolCallError, LoopError) as exc:  # e.g. a backend without the test split: say so, keep the run
            out["error"] = str(getattr(exc, "message", exc))[:500]
            self.log(f"final test evaluation failed: {out['error']}")
        self.lineage.kv_set("loop/final", out)
        return out

    def n_versions(self) -> int:
        """Versions in the lineage that ``budget.max_versions`` counts: every one but the control arms (those are
        paid from the token and wall-clock budget, like every mode's evaluations)."""
        return sum(1 for v in self.version_rows() if v["role"] != CONTROL)

    # --- root ------------------------------------------------------------------------------------------
    def ensure_root(self) -> str:
        """Create the root version from the config's recipe (once, ``create_root``); a resumed run's root must
        have the config's recipe.

        Raises:
            LoopError: the run folder's root recipe differs from the config's.
        """
        try:
            res = self.tb.call("create_root", {"recipe": self.config.recipe.to_dict(),
                                               "note": f"base recipe ({self.mode} mode)"})
        except ToolCallError as exc:
            raise LoopError(f"{self.ws.root}: {exc.message}") from None
        if res["created"]:
            self.lineage.kv_set("loop/config", self.config.model_dump(mode="json"))
            self.emit("lineage", {})
        self._root = str(res["version"]["id"])
        return self._root

    def root_id(self) -> str:
        """The root version's id (:meth:`ensure_root` on the first call)."""
        return self._root or self.ensure_root()

    # --- reads (MCP) -----------------------------------------------------------------------------------
    def version(self, vid: str) -> dict[str, Any]:
        """``get_version`` of one version."""
        return self.tb.call("get_version", {"version_id": vid})

    def version_of(self, vid: str) -> Version:
        """``get_version`` of one version as a typed :class:`~evotrainer.lineage.Version`."""
        return Version.model_validate(self.version(vid))

    def children_of(self, vid: str) -> list[Version]:
        """The children of ``vid`` in creation order (``get_version`` of each)."""
        return [self.version_of(c) for c in self.version(vid)["children"]]

    def version_rows(self) -> list[dict[str, Any]]:
        """Every version's ``list_versions`` row (id, parent, status, role, Avg@k, created_at), in creation order."""
        rows: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = self.tb.call("list_versions", {"offset": offset, "limit": 500})
            rows += page["versions"]
            offset = page.get("next_offset")
        return rows

    def status(self, vid: str) -> str:
        """The version's lineage status (``get_version``)."""
        return str(self.version(vid)["status"])

    def dev_summary(self, vid: str) -> dict[str, Any]:
        """The version's eval summary (``get_version``; ``avg@k`` once evaluated on dev), ``{}`` before."""
        return dict(self.version(vid).get("eval_summary") or {})

    def recipe_of(self, vid: str) -> Recipe:
        """The version's recipe (``get_version``)."""
        return Recipe.model_validate(self.version(vid)["recipe"])

    def child_with_note(self, parent: str, note: str) -> str | None:
        """The child of ``parent`` created with ``note`` (find-or-create of the baselines' trials), or None."""
        for cid in self.version(parent)["children"]:
            if self.version(cid).get("note") == note:
                return cid
        return None

    # --- idempotent actions (MCP) ----------------------------------------------------------------------
    def propose(self, parent: str, path: str, new: Any, source: str, hypothesis: str = "", note: str = "",
                **meta: Any) -> str:
        """``propose_intervention``: a child of ``parent`` with one single-factor change; returns its id."""
        args = {"parent_id": parent, "path": path, "new_value": new, "hypothesis": hypothesis, "source": source,
                "note": note, **{k: v for k, v in meta.items() if v}}
        v = self.tb.call("propose_intervention", args)
        self.emit("lineage", {})
        return str(v["id"])

    def _wait_job(self, job: dict[str, Any], vid: str, what: str) -> dict[str, Any]:
        while job.get("status") == "running":
            self.emit("progress", {"version": vid, "what": what, "done": job.get("steps_done", 0),
                                   "total": job.get("steps_total", 0), "message": job.get("message", "")})
            job = self.tb.call("job_status", {"job_id": job["id"], "wait_s": 2.0})
        self.emit("progress", {"version": vid, "what": what, "done": job.get("steps_done", 0),
                               "total": job.get("steps_total", 0), "finished": True})
        return job

    def train(self, vid: str, steps: int) -> bool:
        """Train ``vid`` for ``steps`` (resumes a partly trained version); False when training failed."""
        v = self.version(vid)
        if v["status"] in ("trained", *DECIDED) or v["status"] == "failed":
            return v["status"] != "failed"
        self.log(f"training {vid} for {steps} steps", version=vid)
        return self._train_job(vid, steps)

    def _train_job(self, vid: str, steps: int) -> bool:
        """``start_training`` up to ``steps`` steps in all and wait for it; False when the job did not finish."""
        job = self.tb.call("start_training", {"version_id": vid, "steps": steps, **self.train_options(vid, steps)})
        job = self._wait_job(job, vid, "train")
        self.emit("lineage", {})
        if job["status"] != "done":
            self.log(f"training of {vid} ended {job['status']}: {job.get('message', '')}", version=vid)
            return False
        return True

    def train_options(self, vid: str, steps: int) -> dict[str, Any]:
        """Extra ``start_training`` arguments for training ``vid`` to ``steps`` (none here; the orchestrator adds
        harness evolution's mid-training ``early_stop`` check, :func:`evotrainer.agents.evolution.stop_plan`)."""
        return {}

    def evaluate(self, vid: str, eval_name: str = "heldout", k: int | None = None) -> dict[str, Any]:
        """Evaluation of ``vid`` (once per eval name; dev unless a test eval name); returns the eval summary.

        Its generated tokens are added to the run's compute (kv ``loop/eval_tokens``, keyed by the stage); a dev
        evaluation's wall seconds and process CPU-seconds (the backend's ``EvalResult.wall_s`` / ``cpu_s``) go to kv
        ``loop/eval_walls`` / ``loop/eval_cpu`` under the same key.

        Raises:
            LoopError: the evaluation job did not finish.
            LineageError: the stored evaluation (kv ``loop/eval/<v>/<name>``) or those kv values are not of the
                shape EvoTrainer writes (a crafted or damaged run folder).
        """
        return self._eval_stage(f"eval/{vid}/{eval_name}", vid, eval_name, {} if k is None else {"k": k})

    def top_up(self, vid: str, first: int, k: int, eval_name: str = "heldout") -> dict[str, Any]:
        """``k`` more samples per problem of ``vid``'s dev evaluation ``eval_name``, numbered from ``first`` (the
        samples it holds): ``evaluate_version`` with ``first_sample`` (the local backend's top-up); once per
        ``(vid, first)`` (stage ``eval/<v>/<name>+<first>``). Returns the record of the evaluation over all its
        samples (``k`` = ``first + k``); the generated tokens are the top-up's, added to the run's dev-eval compute
        like an evaluation's.

        Raises:
            LoopError: the top-up job did not finish.
            LineageError: as :meth:`evaluate`.
        """
        out = self._eval_stage(f"eval/{vid}/{eval_name}+{first}", vid, eval_name, {"k": k, "first_sample": first})
        first_pass = self.lineage.kv_get(f"loop/eval/{vid}/{eval_name}", expected=EVAL_RECORD_SHAPE)
        if first_pass is not None and (first_pass.get("k") or 0) < (out.get("k") or 0):
            # the evaluation's record scores all its samples, as the version's eval_summary does (reports read it);
            # its own compute fields stay the first pass's, counted once (the top-up's are under its own stage)
            merged = {f: out.get(f) for f in ("k", "avg@k", "pass@k", "pass@1", "n_problems")}
            self.lineage.kv_set(f"loop/eval/{vid}/{eval_name}", {**first_pass, **merged})
        return out

    def _eval_stage(self, key: str, vid: str, eval_name: str, extra: dict[str, Any]) -> dict[str, Any]:
        """The stage ``key`` of an ``evaluate_version`` call (``extra``: its k / first_sample arguments) and its
        compute records (:meth:`evaluate`)."""
        what = f"{eval_name}, samples {extra['first_sample']}.." if extra.get("first_sample") else eval_name

        def run() -> dict[str, Any]:
            self.log(f"evaluating {vid} ({what})", version=vid)
            job = self.tb.call("evaluate_version", {"version_id": vid, "eval_name": eval_name, **extra})
            job = self._wait_job(job, vid, f"eval:{eval_name}")
            if job["status"] != "done":
                raise LoopError(f"evaluation of {vid} ({what}) ended {job['status']}: {job.get('message', '')}")
            res = job.get("result") or {}
            if res.get("avg_at_k") is not None:  # an EvalResult (rl_backend.base)
                return eval_record(res, eval_name)
            return res if res.get("avg@k") is not None else self.version(vid)["eval_summary"]

        out = self.stage(key, run, expected=EVAL_RECORD_SHAPE)
        toks = dict(self.lineage.kv_get("loop/eval_tokens", expected=PER_EVAL_SHAPE) or {})
        if key not in toks:
            toks[key] = int((out or {}).get("gen_tokens") or 0)
            self.lineage.kv_set("loop/eval_tokens", toks)
            for field, kv in (("wall_s", "loop/eval_walls"), ("cpu_s", "loop/eval_cpu")):
                if not _is_test_key(key) and isinstance((out or {}).get(field), (int, float)):
                    vals = dict(self.lineage.kv_get(kv, expected=PER_EVAL_SHAPE) or {})
                    vals[key] = float(out[field])
                    self.lineage.kv_set(kv, vals)
        return out

    def train_to(self, vid: str, total_steps: int) -> bool:
        """Train ``vid`` until it has ``total_steps`` steps, continuing a trained (undecided) version; False
        when training failed."""
        v = self.version(vid)
        if v["status"] == "failed":
            return False
        if self.lineage.last_step(vid) + 1 >= total_steps:
            return True
        self.log(f"training {vid} to {total_steps} steps", version=vid)
        return self._train_job(vid, total_steps)

    def record_decision(self, verdict: Verdict, author: str) -> None:
        """Apply a verdict with the ``decide`` tool unless this version was decided already."""
        v = self.version(verdict.version_id)
        if v["status"] in DECIDED and verdict.action in ("keep", "prune"):
            return
        damage = {"damaged_weights": verdict.damaged_weights} if verdict.damaged_weights else {}
        # a brain's evidence is cut to what a decision holds (lineage.EVIDENCE_MAX references of
        # EVIDENCE_REF_MAX_CHARS characters): the store refuses more, and a run must not end on it
        evidence = [clip_text(e, EVIDENCE_REF_MAX_CHARS - 40) for e in verdict.evidence[:EVIDENCE_MAX]]
        self.tb.call("decide", {"version_id": verdict.version_id, "action": verdict.action,
                                "rationale": verdict.rationale, "evidence": evidence, "author": author, **damage})
        rationale = verdict.rationale
        if not rationale.startswith(f"{verdict.action} {verdict.version_id}"):
            rationale = f"{verdict.action} {verdict.version_id}: {rationale}"
        self.log(rationale, version=verdict.version_id)
        self.emit("decision", verdict.model_dump())
        self.emit("lineage", {})

    def fail_version(self, vid: str, author: str) -> None:
        """Prune a version whose training or evaluation failed (rationale says so)."""
        v = self.version(vid)
        if v["status"] in DECIDED:
            return
        job_msgs = [j.get("message", "") for j in v.get("jobs", []) if j.get("status") != "done"]
        why = f"prune {vid}: training/evaluation did not finish ({'; '.join(m for m in job_msgs if m)[:300] or 'failed'})"
        self.record_decision(Verdict(version_id=vid, action="prune", rationale=why, evidence=["jobs"]), author)

    def best_kept(self) -> str | None:
        """Kept version with the highest held-out Avg@k (earliest on ties), None when none is kept
        (:func:`pick_best_kept` over ``list_versions``)."""
        return pick_best_kept((v["id"], v["status"], v["avg_at_k"], v["created_at"]) for v in self.version_rows())


def _cpu_s() -> float:
    """User + system CPU-seconds of this process (all threads: the in-process MCP jobs included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _dev_eval_tokens(toks: dict[str, int]) -> list[int]:
    """The generated tokens of each dev evaluation of trained versions in kv ``loop/eval_tokens`` (what the budget
    counts; the no-RL row and the test evaluations left out)."""
    return [n for k, n in toks.items() if not _is_test_key(k) and not k.endswith("/no_rl")]


def _is_test_key(key: str) -> bool:
    return is_test_eval(key.rsplit("/", 1)[-1])


def train_tokens(lineage: Any, version_id: str) -> int:
    """Tokens generated in ``version_id``'s training rollouts: per step ``perf/tokens_per_sec x perf/step_seconds``
    of its stored metrics, summed (what :meth:`LoopBase.compute` counts for the budget)."""
    tps = dict(lineage.metric_series(version_id, M.PERF_TOKENS_PER_SEC))
    secs = dict(lineage.metric_series(version_id, M.PERF_STEP_SECONDS))
    return int(round(sum(float(tps[s]) * float(secs[s]) for s in tps
                         if s in secs and tps[s] is not None and secs[s] is not None)))


def eval_record(res: dict[str, Any], eval_name: str) -> dict[str, Any]:
    """The evaluate stage's record (kv ``loop/eval/<v>/<name>``, :data:`EVAL_RECORD_SHAPE`) of an ``EvalResult`` as
    JSON (``rl_backend.base.EvalResult``: from the MCP evaluation job, or from an executor's worker): scores, problem
    count, generated tokens, and the evaluation's wall seconds and process CPU-seconds (None where the backend did not
    measure them), which :meth:`LoopBase.evaluate` adds to kv ``loop/eval_walls`` / ``loop/eval_cpu``."""
    return {"k": res.get("k"), "avg@k": res["avg_at_k"], "pass@k": res.get("pass_at_k"), "pass@1": res.get("pass_at_1"),
            "n_problems": res.get("n_problems"), "eval_name": eval_name, "gen_tokens": int(res.get("gen_tokens") or 0),
            "wall_s": res.get("wall_s"), "cpu_s": res.get("cpu_s")}


def version_compute(lineage: Any, version_id: str) -> dict[str, Any]:
    """Compute one version spent, from what the run recorded (test evaluations left out: sealed during the run).

    Keys: ``train_tokens`` (:func:`train_tokens`), ``train_s`` (sum of ``perf/step_seconds``), ``train_cpu_s``
    (sum of ``perf/step_cpu_seconds``: user + system CPU-seconds of the training process over its steps; None
    when no step recorded it, e.g. the OpenRLHF backend; 0.0 for a version that trained no step), and for its dev
    evaluations (``no_rl`` excluded) ``eval_tokens``, ``eval_s``, ``eval_cpu_s`` (kv ``loop/eval_tokens``,
    ``loop/eval_walls``, ``loop/eval_cpu``; ``eval_cpu_s`` None when no evaluation recorded it). The steps'
    seconds exclude loading the model and saving the checkpoint, the same for wall and CPU."""
    def total(metric: str) -> float | None:
        pts = [float(x) for _, x in lineage.metric_series(version_id, metric)
               if x is not None and math.isfinite(float(x))]
        return float(sum(pts)) if pts else None

    steps = lineage.last_step(version_id) + 1
    cpu = total(M.PERF_STEP_CPU_SECONDS)
    ev = eval_compute(lineage, version_id, no_rl=False)
    return {"train_tokens": train_tokens(lineage, version_id), "train_s": total(M.PERF_STEP_SECONDS) or 0.0,
            "train_cpu_s": 0.0 if steps <= 0 and cpu is None else cpu, **ev}


def eval_compute(lineage: Any, version_id: str, no_rl: bool) -> dict[str, Any]:
    """Tokens, wall seconds and CPU-seconds of ``version_id``'s dev evaluations (``no_rl``: its no-RL row only,
    else every other dev evaluation; test evaluations never): ``{eval_tokens, eval_s, eval_cpu_s}`` from kv
    ``loop/eval_tokens`` / ``loop/eval_walls`` / ``loop/eval_cpu`` (``eval_cpu_s`` None when none recorded it)."""
    toks = lineage.kv_get("loop/eval_tokens", expected=PER_EVAL_SHAPE) or {}
    walls = lineage.kv_get("loop/eval_walls", expected=PER_EVAL_SHAPE) or {}
    cpus = lineage.kv_get("loop/eval_cpu", expected=PER_EVAL_SHAPE) or {}
    keys = [k for k in {*toks, *walls, *cpus} if k.rsplit("/", 1)[0] == f"eval/{version_id}"
            and not _is_test_key(k) and (k.rsplit("/", 1)[-1] == "no_rl") == no_rl]
    cpu = [float(cpus[k]) for k in keys if k in cpus]
    return {"eval_tokens": int(sum(toks.get(k, 0) for k in keys)), "eval_s": float(sum(walls.get(k, 0.0) for k in keys)),
            "eval_cpu_s": float(sum(cpu)) if cpu else None}


def pick_best_kept(rows: Iterable[tuple[str, str, float | None, float]]) -> str | None:
    """The one best-kept rule: of ``(id, status, dev Avg@k, created_at)`` rows, the kept one with the highest
    Avg@k (earliest on ties); None when none is kept and scored."""
    kept = [r for r in rows if r[1] == "kept" and r[2] is not None]
    return str(max(kept, key=lambda r: (r[2], -r[3]))[0]) if kept else None


def first_not_reverted(chain: Iterable[tuple[str, str, str | None]]) -> str | None:
    """The one frontier fallback rule: of ``(id, status, parent_id)`` rows from a version up to the root, the
    first not reverted, or the root; None for an empty chain."""
    vid = None
    for vid, status, parent_id in chain:
        if status != "reverted" or parent_id is None:
            return str(vid)
    return None if vid is None else str(vid)


def best_kept(lineage: Any) -> str | None:
    """Kept version with the highest dev Avg@k (earliest on ties), None when none is kept (:func:`pick_best_kept`
    over the lineage store)."""
    return pick_best_kept((v.id, v.status, (v.eval_summary or {}).get("avg@k"), v.created_at)
                          for v in lineage.versions())


def frontier_of(lineage: Any) -> str | None:
    """The orchestrator's frontier: kv ``loop/frontier`` (the best selectable arm of the latest round that had one),
    the root before that; a reverted frontier falls back to its nearest kept (or root) ancestor
    (:func:`first_not_reverted`). None without a root."""
    root = lineage.root()
    if root is None:
        return None
    chain = lineage.path_to_root(lineage.kv_get("loop/frontier", expected=str) or root.id)
    return first_not_reverted((v.id, v.status, v.parent_id) for v in chain) or str(root.id)


def final_version(lineage: Any) -> tuple[str | None, str]:
    """The run's answer and where it comes from: ``(version, "final")`` once the run chose it (kv ``loop/final``,
    written after the last decision), else ``(frontier, "frontier")`` while the orchestrator runs (kv
    ``loop/frontier``), else ``(best kept on dev, "best kept")``; ``(None, "")`` when there is none yet."""
    final = lineage.kv_get("loop/final", expected=FINAL_SHAPE) or {}
    if final.get("version"):
        return str(final["version"]), "final"
    if lineage.kv_get("loop/frontier", expected=str):
        return frontier_of(lineage), "frontier"
    best = best_kept(lineage)
    return (best, "best kept") if best else (None, "")


def run_summary(ws: Workspace, mode: str, usage: dict[str, Any] | None = None, lineage: Any = None) -> dict[str, Any]:
    """Headline numbers of a run from its lineage: per-version status / Avg@k (dev), the run's answer, best kept,
    the no-RL row, compute spent (``compute``: train / eval / test tokens, CPU-seconds, wall time; per version in
    ``compute_by_version``, :func:`version_compute`) and the final answer's test score (``final``:
    ``{version, test, no_rl_test}``, once the run has ended); ``no_rl_compute`` is the no-RL dev row's
    (:func:`eval_compute`).

    ``final_version`` is the run's answer, the version the HTML report's best-version block names
    (:func:`final_version`: kv ``loop/final``, else the frontier, else the best kept), with ``final_source``
    (``final`` | ``frontier`` | ``best kept``) and its dev Avg@k ``final_avg_at_k``. ``best_version`` /
    ``best_avg_at_k`` are the kept version with the highest dev Avg@k (:func:`best_kept`), which can differ from
    it: the frontier follows each round's winner over its control, and the answer may be a control arm (never
    "kept"). ``lineage``: the store to read (None: ``ws.lineage``), e.g. the report's
    :class:`~evotrainer.agents.report.ReportLineage`, which reads the versions once (review 16 E2-R16)."""
    lin = ws.lineage if lineage is None else lineage
    versions = lin.versions()
    no_rl = lin.kv_get("loop/eval/" + (versions[0].id if versions else "v0") + "/no_rl", expected=EVAL_SHAPE) or {}
    best_id = best_kept(lin)
    best = lin.get(best_id) if best_id else None
    final_id, final_source = final_version(lin)
    final = lin.get(final_id) if final_id else None
    return {
        "run_dir": str(ws.root), "mode": mode, "n_versions": sum(1 for v in versions if not v.is_control),
        "n_controls": sum(1 for v in versions if v.is_control),
        "statuses": {v.id: v.status for v in versions},
        "avg_at_k": {v.id: (v.eval_summary or {}).get("avg@k") for v in versions},
        "no_rl_avg_at_k": no_rl.get("avg@k"),
        "final_version": final_id, "final_source": final_source or None,
        "final_avg_at_k": (final.eval_summary or {}).get("avg@k") if final else None,
        "best_version": best.id if best else None,
        "best_avg_at_k": best.eval_summary["avg@k"] if best else None,
        "decisions": lin.count_decisions(), "usage": usage or {},
        "finished": bool(lin.kv_get("loop/finished")),
        "compute": lin.kv_get("loop/compute", expected=dict) or {},
        "compute_by_version": {v.id: version_compute(lin, v.id) for v in versions},
        "no_rl_compute": eval_compute(lin, versions[0].id, no_rl=True) if no_rl else {},
        "final": lin.kv_get("loop/final", expected=FINAL_SHAPE) or {},
    }


def open_toolbox(run_dir: str | Path, backend: str = "local") -> ToolBox:
    """An in-process MCP session on the ``all`` server of ``run_dir``."""
    return ToolBox(build_server("all", str(run_dir)))
