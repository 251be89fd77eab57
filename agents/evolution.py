"""Harness evolution of one round (the orchestrator's ``_evolve``): synthesise, judge, register, remember.

Every round, over MCP tools and the run's evidence:

1. inherit (first round only): synthesised analyzers kept by earlier runs are retrieved from the skills
   memory (``search_skills`` kind analyzer, tag ``synthesised``), registered in this run
   (``register_analyzer``) and listed in kv ``loop/analyzers/inherited``;
2. use: each synthesised analyzer in scope (inherited or kept here) is applied to the versions decided since
   the last round (children, the control arm, a blocked root; each once, before any search sees its label); where it fires the outcome is scored on its skill's per-domain track record
   (``record_skill_outcome``: helped = fired on a version that turned out bad, hurt = on a good one),
   and :func:`~evotrainer.harness.synthesis.early_stop` on the first half of the version's training
   says whether it would have stopped the branch early (the steps that saves, and whether that
   decision would have been right);
3. synthesise: :func:`~evotrainer.harness.synthesis.synthesize` over the versions of known outcome;
   a rule kept by its rule (leave-one-out + permutation test) is compiled, run in the sandbox on the labelled
   versions (``run_analyzer_code``: it must fire where the search predicted), registered and stored as
   a skill with its numbers and the versions it rests on (``add_skill``);
4. drafts: when a held-out move is unexplained the brain (heuristic template or Claude) drafts an
   analyzer; it is backtested in the sandbox and kept by the same rule
   (:func:`~evotrainer.harness.synthesis.judge_fired`) before it is registered and stored as a skill
   (tag ``drafted``; only synthesised analyzers are inherited and scored by later runs, since only their
   programs can be applied in process).

Each entry of the returned list has a ``type`` (inherited | use | early_stop | stopped | synthesis | draft) and is
what the report's "Analyzers added" section shows.

The mid-training early stop (config ``early_stop``, off by default): :func:`stop_plan` gives ``start_training``
an ``early_stop`` check of the in-scope analyzers whose record is trusted (Wilson 95% lower bound of precision at
least :data:`~evotrainer.harness.synthesis.MIN_STOP_PRECISION`), run by the trainer's ``after_step`` hook after half
the version's steps, on the same evidence the counterfactual of step 2 uses. A branch it stops is pruned
unevaluated (:func:`stopped`, :func:`record_stop`: the analyzer, the step, the steps and tokens saved in kv
:data:`STOPS_KEY`); its outcome is unknown, so it is no label for synthesis or for any analyzer's record.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from evotrainer.agents.brain import Brain
from evotrainer.agents.decisions import Diagnosis
from evotrainer.agents.diagnostician import Diagnostician
from evotrainer.agents.loop import train_tokens
from evotrainer.agents.mcp_client import ToolBox
from evotrainer.config import RunConfig
from evotrainer.harness import synthesis as S
from evotrainer.harness.evidence import Evidence
from evotrainer.lineage import NUM, KvMap, LineageStore
from evotrainer.servers.common import MAX_LIMIT
from evotrainer.skills_db.models import SUMMARY_METRICS_MAX
from evotrainer.workspace import Workspace

TAG = "synthesised"
INHERITED_KEY = "loop/analyzers/inherited"  # [{skill_id, name, program, loo, ...}]
USED_KEY = "loop/analyzers/used"  # /<name>/<version>: outcome recorded on the skill
SCOPE_KEY = "loop/analyzers/synthesised"  # {name: {skill_id, program, loo, origin}} in scope for this run
SCORED_KEY = "loop/analyzers/scored"  # /r<round>: versions whose outcome the in-scope analyzers were scored on
STOPS_KEY = "loop/analyzers/stops"  # {version: stop record + saved_steps, saved_tokens}: branches stopped early
STOPS_SHAPE = KvMap({"saved_steps": NUM, "saved_tokens": NUM})  # what the run summary reads of it (review 10 V-R10)
CHECK_KEY = "early_stop"  # kv early_stop/<version>: the server's mid-training check record (servers.training)


class EvolvingLoop(Protocol):
    """What harness evolution uses of the loop that runs it (:class:`~evotrainer.agents.orchestrator.Orchestrator`)."""

    tb: ToolBox
    config: RunConfig
    ws: Workspace
    lineage: LineageStore
    brain: Brain
    diagnostician: Diagnostician

    def log(self, message: str, version: str | None = None, **extra: Any) -> None:
        """A run log record."""
        ...

    def _ctx(self, vid: str) -> dict[str, Any]:
        """The brain's context of a version (parent, summaries, recipe)."""
        ...


def _domain(task: str) -> str:
    return {"humaneval": "code", "swe": "swe"}.get(task, "math")


def _call(loop: EvolvingLoop, tool: str, args: dict[str, Any]) -> Any:
    return loop.tb.call_optional(tool, args, loop.log, prefix="harness evolution: ")


def _register(loop: EvolvingLoop, name: str, code: str, kind: str, description: str) -> bool:
    res = _call(loop, "register_analyzer", {"name": name, "code": code, "kind": kind, "description": description,
                                            "replace": True})
    return res is not None


def inherit(loop: EvolvingLoop) -> list[dict[str, Any]]:
    """Register the synthesised analyzers of earlier runs (once per run); returns ``inherited`` entries."""
    if loop.lineage.kv_get(INHERITED_KEY) is not None:
        return []
    found = _call(loop, "search_skills", {"query": "synthesised analyzer rule predicts a held-out regression",
                                          "kind": "analyzer", "tags": [TAG], "limit": 20}) or {}
    out, scope = [], dict(loop.lineage.kv_get(SCOPE_KEY, expected=dict) or {})
    for hit in found.get("hits", []):
        skill = _call(loop, "get_skill", {"skill_id": hit["id"]})
        value = (skill or {}).get("value") or {}
        if not skill or not skill.get("code") or "program" not in value:
            continue
        name = S.Program.from_dict(value["program"]).name
        if _register(loop, name, skill["code"], value["program"].get("kind", "predicted_regression"),
                     skill["description"][:200]):
            scope[name] = {"skill_id": skill["id"], "program": value["program"], "loo": value.get("loo", {}),
                           "origin": value.get("run", "earlier run")}
            out.append({"type": "inherited", "name": name, "skill_id": skill["id"], "registered": True,
                        "track_record": skill.get("track_record", {}),
                        "reason": f"kept by {value.get('run', 'an earlier run')} "
                                  f"({value.get('describe', '')}); track record {skill.get('track_record', {})}"})
    loop.lineage.kv_set(INHERITED_KEY, out)
    loop.lineage.kv_set(SCOPE_KEY, scope)
    return out


def _records(loop: EvolvingLoop, scope: dict[str, Any]) -> list[dict[str, Any]]:
    """The in-scope analyzers as :func:`~evotrainer.harness.synthesis.early_stop` reads them, with their skills'
    track records as they stand now (``get_skill``)."""
    out = []
    for name, a in scope.items():
        skill = _call(loop, "get_skill", {"skill_id": a["skill_id"]}) if a.get("skill_id") else None
        out.append({"name": name, "program": a["program"], "loo": a.get("loo", {}),
                    "track_record": (skill or {}).get("track_record", {})})
    return out


def precision_lower(record: dict[str, Any], domain: str) -> float:
    """Wilson 95% lower bound of an analyzer's precision: leave-one-out tp / fp plus fires in use in ``domain``
    (helped / hurt), the number :func:`~evotrainer.harness.synthesis.early_stop` compares with
    :data:`~evotrainer.harness.synthesis.MIN_STOP_PRECISION`."""
    loo, rec = record.get("loo") or {}, (record.get("track_record") or {}).get(domain) or {}
    good = int(loo.get("tp", 0)) + int(rec.get("helped", 0))
    return S.wilson_lower(good, good + int(loo.get("fp", 0)) + int(rec.get("hurt", 0)))


def stop_plan(loop: EvolvingLoop, vid: str, steps: int) -> dict[str, Any]:
    """``start_training``'s ``early_stop`` argument for training ``vid`` to ``steps``, or ``{}``.

    A check is planned when the config's ``early_stop`` is on, the backend is local, ``vid`` is a branch (not the
    root, not a control arm: the control is the round's reference), ``steps`` is the version's full budget
    (``budget.steps_per_version``), the version has trained fewer than ``steps // 2`` steps, and at least one
    in-scope analyzer's record is trusted (:func:`precision_lower` >= ``MIN_STOP_PRECISION``).
    """
    if not loop.config.early_stop or loop.config.backend != "local" or steps != loop.config.budget.steps_per_version:
        return {}
    v = loop.lineage.get(vid)
    at = steps // 2
    if v.parent_id is None or v.is_control or at < 1 or loop.lineage.last_step(vid) + 1 >= at:
        return {}
    domain = _domain(v.recipe.data.task)
    trusted = [a for a in _records(loop, loop.lineage.kv_get(SCOPE_KEY, expected=dict) or {})
               if precision_lower(a, domain) >= S.MIN_STOP_PRECISION]
    if not trusted:
        return {}
    loop.log(f"{vid}: early-stop check after {at} of {steps} steps by {', '.join(a['name'] for a in trusted)}",
             version=vid)
    return {"early_stop": {"at_step": at, "analyzers": trusted, "domain": domain}}


def stopped(loop: EvolvingLoop, vid: str) -> dict[str, Any] | None:
    """The mid-training check record of ``vid`` when it stopped the branch (kv ``early_stop/<vid>``), else None."""
    return _stopped(loop.lineage, vid)


def _stopped(lineage: LineageStore, vid: str) -> dict[str, Any] | None:
    rec = lineage.kv_get(f"{CHECK_KEY}/{vid}", expected=dict)
    return rec if rec and rec.get("stop") else None


def outcome_labels(lineage: LineageStore) -> dict[str, bool]:
    """``{version: True if bad}`` of the versions of known outcome, what synthesis fits and analyzers are scored on.

    Bad: pruned or reverted; good: kept, except the root (the baseline by construction, nothing to compare with;
    a root the gate blocked is bad). A branch an analyzer stopped early was pruned unevaluated: its outcome is
    unknown, so it is no label.
    """
    return {v.id: v.status in BAD for v in lineage.versions()
            if (v.status in BAD or (v.status == "kept" and v.parent_id is not None)) and _stopped(lineage, v.id) is None}


def record_stop(loop: EvolvingLoop, vid: str, rec: dict[str, Any]) -> dict[str, Any]:
    """Store a branch's early stop for the budget accounting and the report (kv :data:`STOPS_KEY`): the analyzer,
    the step, ``saved_steps`` and ``saved_tokens`` (the saved steps at this branch's own generated tokens per step
    so far, :func:`~evotrainer.agents.loop.train_tokens`). Returns the stored entry."""
    done = max(1, int(rec.get("at_step") or loop.lineage.last_step(vid) + 1))
    entry = {**rec, "type": "stopped", "version": vid, "saved_tokens":
             int(round(train_tokens(loop.lineage, vid) / done * int(rec.get("saved_steps") or 0)))}
    stops = dict(loop.lineage.kv_get(STOPS_KEY, expected=STOPS_SHAPE) or {})
    stops[vid] = entry
    loop.lineage.kv_set(STOPS_KEY, stops)
    return entry


def use(loop: EvolvingLoop, ev: Any, children: list[str], labels: dict[str, bool]) -> list[dict[str, Any]]:
    """Score the in-scope synthesised analyzers on newly decided versions; early-stop counterfactuals on the branches
    among them (not the root nor a control arm: :func:`stop_plan` never stops those)."""
    scope = loop.lineage.kv_get(SCOPE_KEY, expected=dict) or {}
    out = []
    for vid in children:
        if vid not in labels:
            continue
        v = loop.lineage.get(vid)
        domain = _domain(v.recipe.data.task)
        # the records as they stood before this version's outcome: the early-stop counterfactual must not see it
        records = _records(loop, scope)
        for name, a in scope.items():
            prog = S.Program.from_dict(a["program"])
            fired = prog.fires(ev, vid)
            entry = {"type": "use", "name": name, "version": vid, "fired": fired, "bad": labels[vid],
                     "correct": fired == labels[vid], "domain": domain, "origin": a.get("origin")}
            if fired and a.get("skill_id") and not loop.lineage.kv_get(f"{USED_KEY}/{name}/{vid}"):
                rec = _call(loop, "record_skill_outcome", {"skill_id": a["skill_id"], "domain": domain,
                                                           "outcome": "helped" if labels[vid] else "hurt"})
                entry["track_record"] = (rec or {}).get("record")
                loop.lineage.kv_set(f"{USED_KEY}/{name}/{vid}", True)  # a resumed stage does not count it twice
            out.append(entry)
        if records and v.parent_id is not None and not v.is_control:  # the hook stops branches only (stop_plan)
            half = _first_half(ev, vid)
            stop = S.early_stop(records, half, vid, domain)
            if stop["analyzer"]:
                steps = loop.lineage.last_step(vid) + 1
                stop.update(type="early_stop", saved_steps=steps - steps // 2 if stop["stop"] else 0,
                            right=(stop["stop"] == labels[vid]), actual=v.status)
                out.append(stop)
    return out


def _first_half(ev: Any, vid: str) -> Any:
    """The version's evidence as it stood half-way through training (steps < half of the last step + 1)."""
    ms = ev.metrics.get(vid, {})
    last = max((int(s[-1]) for s, _ in ms.values() if len(s)), default=-1)
    cut = (last + 1) // 2
    half = Evidence(parents=dict(ev.parents), statuses=dict(ev.statuses))
    for v, series in ev.metrics.items():
        for name, (steps, values) in series.items():
            keep = steps < cut if v == vid else np.ones(len(steps), dtype=bool)
            half.add_series(v, name, (steps[keep], values[keep]))
    for v, series in ev.derived_metrics().items():
        for name, (steps, values) in series.items():
            if name not in half.metrics.get(v, {}):
                keep = steps < cut if v == vid else np.ones(len(steps), dtype=bool)
                half.add_series(v, name, (steps[keep], values[keep]))
    return half


REMEMBERED_KEY = "loop/analyzers/remembered"  # {version: status} written to the memory as labelled features
BAD = ("pruned", "reverted")


def remembered_examples(loop: EvolvingLoop, domain: str) -> list[S.Example]:
    """Labelled versions of earlier runs in ``domain`` (``list_version_summaries``: the newest MAX_LIMIT), as
    feature-only examples."""
    res = _call(loop, "list_version_summaries", {"domain": domain, "limit": MAX_LIMIT}) or {}
    here = str(loop.ws.root)
    out = []
    for vs in res.get("summaries", []):
        if vs.get("run") == here or vs.get("status") not in (*BAD, "kept") or not vs.get("metrics"):
            continue
        if not any("|" in k for k in vs["metrics"]):
            continue  # a summary of headline metrics, not synthesis features
        out.append(S.Example(None, vs["id"], vs["status"] in BAD, "memory",
                             features={k: v for k, v in vs["metrics"].items() if "|" in k}))
    return out


def remember(loop: EvolvingLoop, examples: list[S.Example], domain: str) -> int:
    """Store this run's labelled versions' features for later runs (once per version and status)."""
    done = dict(loop.lineage.kv_get(REMEMBERED_KEY, expected=dict) or {})
    n = 0
    for ex in examples:
        status = loop.lineage.get(ex.version).status
        if done.get(ex.version) == status:
            continue
        feats = S.example_features(ex)
        n_all = len(feats)
        if n_all > SUMMARY_METRICS_MAX:  # the first by name (a summary holds no more); the rest unremembered
            feats = dict(sorted(feats.items())[:SUMMARY_METRICS_MAX])
        if _call(loop, "add_version_summary", {
                "version_id": ex.version, "status": status, "domain": domain, "metrics": feats, "run": str(loop.ws.root),
                "intervention": "; ".join(iv.describe() for iv in loop.lineage.get(ex.version).interventions),
                "summary": f"labelled {'bad' if ex.bad else 'good'} for analyzer synthesis ({len(feats)} features"
                           + (f" of {n_all}, the first by name" if n_all > len(feats) else "") + ")"}):
            done[ex.version] = status
            n += 1
    loop.lineage.kv_set(REMEMBERED_KEY, done)
    return n


def synthesise(loop: EvolvingLoop, r: int, ev: Any, labels: dict[str, bool]) -> dict[str, Any]:
    """Search (this run's labels + those remembered by earlier runs of the domain), judge, and when kept
    sandbox-backtest, register and store one synthesised analyzer; remember this run's labels."""
    domain = _domain(loop.lineage.root().recipe.data.task)
    own = S.lineage_examples(ev, labels)
    res = S.synthesize(own + remembered_examples(loop, domain), seed=r)
    remember(loop, own, domain)
    entry = {"type": "synthesis", **res.to_dict(), "registered": False}
    if not res.kept or res.program is None:
        return entry
    prog = res.program
    code = S.compile_program(prog)
    run = _call(loop, "run_analyzer_code", {"code": code, "version_ids": sorted(labels), "name": prog.name})
    predicted = {k.split(":", 1)[1]: f for k, f in res.fired.items() if k.startswith("lineage:")}
    fired = {v: any(v in f.get("versions", []) for f in (run or {}).get("findings", [])) for v in labels}
    if run is None or fired != predicted:
        entry["reason"] += f"; the sandboxed run disagrees with the search ({fired} vs {predicted}): not registered"
        return entry
    entry["sandbox"] = S.confusion(np.array([fired[v] for v in labels]), np.array(list(labels.values())))
    desc = (f"Synthesised rule {prog.describe()} flags a version whose held-out score will fall. Fit on "
            f"{res.n_labels} versions ({res.n_bad} bad, {res.n_good} good; {res.sources}) of run {loop.ws.root.name}: leave-one-out "
            f"precision {res.loo['precision']}, recall {res.loo['recall']}; permutation p={res.p_value:.3f} over "
            f"{res.n_candidates} candidate rules.")
    if not _register(loop, prog.name, code, prog.kind, desc[:200]):
        return entry
    entry["registered"] = True
    skill = _call(loop, "add_skill", {
        "kind": "analyzer", "skill_id": f"synth:{prog.name}", "name": prog.name, "description": desc,
        "addresses": [prog.kind], "code": code, "tags": [TAG, domain], "source": f"run:{loop.ws.root}",
        "replace": True,
        "value": {"program": prog.to_dict(), "describe": prog.describe(), "loo": res.loo,
                  "in_sample": res.in_sample, "p_value": res.p_value, "n_labels": res.n_labels,
                  "evidence": sorted(labels) + sorted(k.split(":", 1)[1] for k in res.fired if k.startswith("memory:")),
                  "sources": res.sources, "labels": labels, "run": str(loop.ws.root), "domain": domain}})
    entry["skill_id"] = (skill or {}).get("id")
    scope = dict(loop.lineage.kv_get(SCOPE_KEY, expected=dict) or {})
    scope[prog.name] = {"skill_id": entry["skill_id"], "program": prog.to_dict(), "loo": res.loo, "origin": "this run"}
    loop.lineage.kv_set(SCOPE_KEY, scope)
    return entry


def draft(loop: EvolvingLoop, vid: str, labels: dict[str, bool]) -> dict[str, Any]:
    """The brain's analyzer draft for an unexplained move, backtested in the sandbox and kept by the keep rule."""
    n_bad = sum(labels.values())
    if len(set(labels.values())) < 2:
        return {"type": "draft", "version": vid, "registered": False,
                "reason": f"held-out moved without a finding to explain it, but a new analyzer needs kept and pruned "
                          f"versions to backtest on (so far {len(labels) - n_bad} kept, {n_bad} pruned / reverted): "
                          f"none written"}
    diag = Diagnosis.model_validate(loop.lineage.kv_get(f"loop/diagnose/{vid}", expected=dict))
    d = loop.brain.write_analyzer(loop.diagnostician.tools, vid, diag, loop._ctx(vid))
    if d is None:
        return {"type": "draft", "version": vid, "name": None, "registered": False, "reason": "the brain wrote no analyzer"}
    entry = {"type": "draft", "version": vid, "name": d.name, "kind": d.kind, "registered": False}
    bt = _call(loop, "backtest_analyzer", {"code": d.code, "labels": labels})
    if bt is None:
        entry["reason"] = "the sandboxed backtest failed (see the run log)"
        return entry
    verdict = S.judge_fired(bt.get("fired", {}), labels)
    entry["backtest"] = verdict
    if not verdict["kept"]:
        entry["reason"] = f"not kept: {verdict['reason']} (keep rule: {S.KEEP_RULE})"
        return entry
    entry["registered"] = _register(loop, d.name, d.code, d.kind, d.description)
    entry["reason"] = f"kept: {verdict['reason']}" + ("" if entry["registered"] else "; register failed")
    if entry["registered"]:
        domain = _domain(loop.lineage.root().recipe.data.task)
        skill = _call(loop, "add_skill", {
            "kind": "analyzer", "skill_id": f"draft:{d.name}", "name": d.name, "replace": True,
            "description": f"{d.description or d.name}. Drafted by the {loop.brain.name} brain for an unexplained "
                           f"held-out move of {vid}; backtest {verdict['reason']}.",
            "addresses": [d.kind], "code": d.code, "tags": ["drafted", domain], "source": f"run:{loop.ws.root}",
            "value": {"backtest": verdict, "labels": labels, "run": str(loop.ws.root), "domain": domain}})
        entry["skill_id"] = (skill or {}).get("id")
    return entry


def scored_before(lineage: LineageStore, r: int) -> set[str]:
    """The versions the in-scope analyzers were scored on in the rounds before ``r`` (kv
    ``loop/analyzers/scored/r<n>``: a list of version ids each; a key of another form, which EvoTrainer never writes,
    is no round and is passed over).

    Raises:
        LineageError: a round's value is no list of version ids (a crafted or damaged run folder: review 10 V-R10's
            class, ``[1]`` or ``5`` there ended ``run --resume`` with a bare TypeError); names the file, the key and
            the fix.
    """
    out: set[str] = set()
    for key, vs in lineage.kv_items(SCORED_KEY + "/r"):
        n = key[len(SCORED_KEY) + 2:]
        if n.isdecimal() and int(n) < r:
            out.update(lineage.kv_typed(key, vs, [str]) or [])
    return out


def evolve_round(loop: EvolvingLoop, r: int, children: list[str]) -> list[dict[str, Any]]:
    """One round of harness evolution (see the module docstring); the entries for the report."""
    # labels: kept children (good) vs pruned / reverted / failed versions (bad); a kept root is the
    # baseline by construction (nothing to compare with), not evidence, but a root the gate blocked is
    labels = outcome_labels(loop.lineage)
    out = inherit(loop)
    stops = loop.lineage.kv_get(STOPS_KEY, expected=STOPS_SHAPE) or {}
    out += [stops[vid] for vid in children if vid in stops]
    ev = Evidence.from_workspace(loop.ws)
    # every version decided since the last round: the children, and the control arm and a blocked root too
    # (per round, so that a resumed round scores the same versions again; use() counts no outcome twice)
    scored = scored_before(loop.lineage, r)
    fresh = [v for v in labels if v not in scored]
    out += use(loop, ev, fresh, labels)
    loop.lineage.kv_set(f"{SCORED_KEY}/r{r}", fresh)
    if labels:
        out.append(synthesise(loop, r, ev, labels))
    for vid in children:
        diag = loop.lineage.kv_get(f"loop/diagnose/{vid}", expected=dict)
        if diag and diag.get("unexplained"):
            out.append(draft(loop, vid, labels))
    return out
