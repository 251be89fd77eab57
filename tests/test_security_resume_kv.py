"""Review 10 V-R10, the loop's side: the resume state ``evotrainer run --resume`` reads from kv ``loop/*``.

A run folder from elsewhere (or a damaged lineage.db) holding, say, ``loop/eval_tokens = "abc"`` or
``loop/worker_cpu_s = [1]`` ended ``run --resume`` with a bare TypeError / AttributeError / ValueError (or a pydantic
ValidationError for a stage record) that named neither the file nor the key. Each read now checks the shape
EvoTrainer writes there; another shape is a LineageError naming the file, the key and the fix.

The run folder is a root of the config's recipe, kept, with its no-RL row stored: a resume then reads the budget
clocks, the round and the round's first stage records before any training or evaluation.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path

import pytest

from evotrainer.agents.decisions import Diagnosis, FindingRef, Proposal
from evotrainer.agents.evolution import evolve_round
from evotrainer.agents.heuristic import HeuristicBrain
from evotrainer.agents.loop import open_toolbox
from evotrainer.agents.orchestrator import Orchestrator
from evotrainer.agents.runner import run_loop
from evotrainer.config import RunConfig, load_run_config
from evotrainer.intervention import Intervention
from evotrainer.lineage import LineageError
from evotrainer.workspace import Workspace

DIAGNOSIS = Diagnosis(version_id="v0", findings=[FindingRef(kind="truncation", severity="blocking")],
                      summary="v0 is cut at the length cap").model_dump(mode="json")
PROPOSAL = Proposal(parent_id="v0", candidates=[], rationale="nothing left to try").model_dump(mode="json")


def _config() -> RunConfig:
    cfg = load_run_config("examples/tiny.yaml")
    return cfg.model_copy(update={
        "budget": cfg.budget.model_copy(update=dict(max_versions=3, steps_per_version=2, branches_per_round=1,
                                                    wall_clock_minutes=600, max_tokens=10**9)),
        "recipe": cfg.recipe.model_copy(update={"data": cfg.recipe.data.model_copy(update={"n_test": 4})})})


def _run_folder(tmp_path: Path, cfg: RunConfig, kv: dict[str, str], branch: bool = False) -> Path:
    """A run of ``cfg``'s recipe whose root is kept and evaluated (no-RL row stored), with the raw kv values ``kv``
    (JSON text) written into its lineage.db as a file from elsewhere would hold them; ``branch``: with a child ``v1``
    of the root (untrained)."""
    run = tmp_path / "run"
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(cfg.recipe)
        ws.lineage.decide("v0", "keep", "the root, kept", ["test"])
        if branch:
            ws.lineage.branch("v0", Intervention(path="actor_learning_rate", old=1.0e-4, new=3.0e-4,
                                                 category="optimizer", hypothesis="a faster start"))
        ws.lineage.kv_set("loop/started_at", time.time())
        ws.lineage.kv_set("loop/mode", "evotrainer")
        ws.lineage.kv_set("loop/no_rl", {"avg@k": 0.25, "pass@k": 0.5, "gen_tokens": 64})
    db = sqlite3.connect(run / "lineage.db")
    db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", list(kv.items()))
    db.commit()
    db.close()
    return run


@pytest.mark.parametrize("key, value, planted, got, want", [
    ("loop/started_at", '"abc"', {}, "text 'abc'", "a number"),
    ("loop/process_compute", '{"cpu_s": "1", "wall_s": 0.0}', {}, "text '1' at cpu_s", "a number"),
    ("loop/process_compute", "3", {}, "a number 3", "a JSON object"),
    ("loop/eval_walls", "[1]", {}, r"a JSON list \[1\]", "a JSON object"),
    ("loop/eval_tokens", '"abc"', {}, "text 'abc'", "a JSON object"),
    ("loop/eval_tokens", '{"eval/v0/no_rl": "64"}', {}, "text '64' at eval/v0/no_rl", "a number"),
    ("loop/worker_cpu_s", "[1]", {}, r"a JSON list \[1\]", "a number"),
    ("loop/round", '"abc"', {}, "text 'abc'", "a number"),
    ("loop/mode", '["evotrainer"]', {}, r"a JSON list \['evotrainer'\]", "text"),
    ("loop/usage", '"abc"', {}, "text 'abc'", "a JSON object"),
    ("loop/r1/parent", "5", {}, "a number 5", "text"),
    ("loop/r1/arms", '"2"', {"loop/r1/parent": '"v0"', "loop/diagnose/v0": json.dumps(DIAGNOSIS),
                             "loop/r1/propose": json.dumps(PROPOSAL)}, "text '2'", "a number"),
])
def test_resume_state_of_the_wrong_shape_is_named_not_a_crash(tmp_path, key, value, planted, got, want):
    """``evotrainer run --resume`` (:func:`run_loop`) of a run folder whose loop state under ``key`` has another shape
    than EvoTrainer writes: a LineageError naming the run's lineage.db, the key, what it holds and the fix, before
    anything is trained; the old code ended in a bare TypeError / AttributeError / ValueError (``loop/mode``: a
    ValueError naming neither; ``loop/r1/parent``: a tool call with the number as a version id)."""
    cfg = _config()
    run = _run_folder(tmp_path, cfg, {key: value, **planted})
    with pytest.raises(LineageError) as err:
        run_loop(cfg, run, "heuristic", "evotrainer", resume=True)
    assert re.fullmatch(rf"{re.escape(str(run / 'lineage.db'))}: kv\.value of key '{key}' holds {got}, where "
                        rf"EvoTrainer writes {want} \(a crafted or damaged file\); not read\. Use a run folder "
                        r"EvoTrainer wrote, or remove the value \(`sqlite3 .*lineage\.db \"DELETE FROM kv WHERE key = "
                        rf"'{key}'\"`: the run forgets it\)", str(err.value)), str(err.value)
    with Workspace.open(run) as ws:  # nothing was trained or decided on the way
        assert [(v.id, v.status) for v in ws.lineage.versions()] == [("v0", "kept")]


@pytest.mark.parametrize("key, value, planted, model, at", [
    ("loop/diagnose/v0", '{"version_id": "v0", "findings": "abc"}', {"loop/r1/parent": '"v0"'}, "Diagnosis",
     "findings"),
    ("loop/diagnose/v0", '{"version_id": "v0", "findings": [{"kind": "truncation", "severity": 3}]}',
     {"loop/r1/parent": '"v0"'}, "Diagnosis", "findings.0.severity"),
    ("loop/r1/propose", '{"parent_id": "v0", "candidates": "abc"}',
     {"loop/r1/parent": '"v0"', "loop/diagnose/v0": json.dumps(DIAGNOSIS)}, "Proposal", "candidates"),
])
def test_a_stage_record_that_is_no_model_is_named_not_a_crash(tmp_path, key, value, planted, model, at):
    """A typed stage record replayed on resume (``loop/diagnose/<v>``, ``loop/r<n>/propose``) that does not validate
    as its pydantic model: the old code ended ``run --resume`` with a bare pydantic ValidationError naming neither
    the file nor the key; a LineageError names both, the field and the fix."""
    cfg = _config()
    run = _run_folder(tmp_path, cfg, {key: value, **planted})
    with pytest.raises(LineageError) as err:
        run_loop(cfg, run, "heuristic", "evotrainer", resume=True)
    assert re.fullmatch(rf"{re.escape(str(run / 'lineage.db'))}: kv\.value of key '{key}' holds a JSON object .* that "
                        rf"is no {model} at {re.escape(at)} \(.*\), where EvoTrainer writes a {model} \(a crafted or "
                        r"damaged file\); not read\. Use a run folder EvoTrainer wrote, or remove the value "
                        rf"\(`sqlite3 .*lineage\.db \"DELETE FROM kv WHERE key = '{key}'\"`: the run forgets it\)",
                        str(err.value)), str(err.value)


@pytest.mark.parametrize("key, value, call, got, want", [
    ("loop/rgate/v0", '{"waived": [[1]]}', lambda loop: loop.decide_round(1, "v0", [], merge=True),
     r"a JSON list \[1\] at waived\[0\]", "text"),
    ("loop/gate/v0", '"abc"', lambda loop: loop.decide_round(1, "v1", []), "text 'abc'", "a JSON object"),
    ("loop/analyzers/stops", '{"v1": "abc"}', lambda loop: loop.summary(), "text 'abc' at v1", "a JSON object"),
    ("loop/analyzers/scored/r1", "5", lambda loop: evolve_round(loop, 2, []), "a number 5", "a JSON list"),
])
def test_gate_records_and_stops_of_the_wrong_shape_are_named_not_a_crash(tmp_path, key, value, call, got, want):
    """The orchestrator's reads of a round's stored gates (``loop/rgate/<control>``'s waived kinds for a merge,
    ``loop/gate/<parent>``'s blocking findings), of the early stops the run summary counts and of the versions
    harness evolution scored in earlier rounds, called on a loop over the run folder: the old code ended in a bare
    TypeError (an unhashable list, an int not iterable) or AttributeError; a LineageError names the file, the key and
    the field."""
    cfg = _config()
    # a resumed run inherited its analyzers from memory in round 1 already (kv loop/analyzers/inherited)
    run = _run_folder(tmp_path, cfg, {"loop/analyzers/inherited": "[]", key: value}, branch=True)
    with Workspace(run) as ws, open_toolbox(run) as tb:
        loop = Orchestrator(cfg, tb, ws, HeuristicBrain())
        with pytest.raises(LineageError) as err:
            call(loop)
    assert re.match(rf"{re.escape(str(run / 'lineage.db'))}: kv\.value of key '{key}' holds {got}, where EvoTrainer "
                    rf"writes {want} \(a crafted or damaged file\); not read\.", str(err.value)), str(err.value)


def test_resume_state_evotrainer_writes_still_reads(tmp_path):
    """The same reads of values of the shapes EvoTrainer writes: the compute, the test reserve, the stored diagnosis
    and the round's parent read as before (numbers summed, the model rebuilt)."""
    cfg = _config()
    run = _run_folder(tmp_path, cfg, {
        "loop/process_compute": '{"cpu_s": 2.5, "wall_s": 10.0}', "loop/worker_cpu_s": "1.5",
        "loop/eval_tokens": '{"eval/v0/no_rl": 64, "eval/v1/heldout": 100, "eval/v1/test": 7}',
        "loop/eval_walls": '{"eval/v1/heldout": 4.0}', "loop/diagnose/v0": json.dumps(DIAGNOSIS),
        "loop/r1/parent": '"v0"'})
    with Workspace(run) as ws, open_toolbox(run) as tb:
        loop = Orchestrator(cfg, tb, ws, HeuristicBrain())
        c = loop.compute()
        assert (c["eval_tokens"], c["no_rl_tokens"], c["test_tokens"]) == (100, 64, 7)
        assert c["cpu_s"] >= 4.0 and c["wall_s"] >= 10.0
        data, ev = cfg.recipe.data, cfg.recipe.eval
        assert loop.test_reserve_s() == pytest.approx(2 * 4.0 / (min(ev.max_problems, data.n_heldout) * ev.k ** 0.5)
                                                      * data.n_test * (cfg.test_k or ev.k) ** 0.5)
        assert loop.stored("diagnose/v0", Diagnosis) == Diagnosis.model_validate(DIAGNOSIS)
        assert loop.stage("r1/parent", lambda: "not run", expected=str) == "v0"
        assert loop.stored("r2/parent", expected=str) is None
