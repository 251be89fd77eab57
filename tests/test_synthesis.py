"""Offline analyzer synthesis: the search finds a known rule, rejects a chance fit, compiles to the sandbox
contract, judges drafts by the same rule, and its kept analyzers are remembered across runs (real MCP servers,
real sandbox, real skills store)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evotrainer import metrics as M
from evotrainer.harness import synthesis as S
from evotrainer.harness.evidence import Evidence


@pytest.fixture(autouse=True)
def _forget_runtime_analyzers():
    """The analyzer registry is per process: remove what a test registered, so other tests' runs do not see it."""
    from evotrainer.harness import analyzers as reg

    before = {a.name for a in reg.list_analyzers(builtin=False)}
    yield
    for a in reg.list_analyzers(builtin=False):
        if a.name not in before:
            reg.unregister_analyzer(a.name)


BAD_START = [0.5, 1.0, 2.0, 4.0, 0.8, 3.0, 1.2, 2.5]
GOOD_START = [5.0, 0.6, 3.0, 1.5, 4.0, 0.7, 2.2, 0.9]


def _entropy(start: float, ratio: float, n: int = 8) -> list[tuple[int, float]]:
    """Entropy at ``start`` for steps 0-1, then ``ratio * start``: last-25% / first-25% medians = ratio."""
    return [(t, start if t < 2 else ratio * start) for t in range(n)]


def _labelled() -> tuple[Evidence, dict[str, bool]]:
    """16 versions: 8 bad whose entropy falls to x0.2 of its start, 8 good falling to x0.7.

    The starts overlap (bad 0.5..4, good 0.6..5), so level, change and quantiles do not separate them:
    e.g. change of bad v3 = 0.8 - 4 = -3.2, of good v8 = 3.5 - 5 = -1.5, of bad v0 = -0.4. Only the ratio
    does (0.2 vs 0.7). Two distractor series are noise (reward/mean uniform, policy/kl a random walk).
    """
    rng = np.random.default_rng(1)
    ev, labels = Evidence(), {}
    rows = [(s, 0.2, True) for s in BAD_START] + [(s, 0.7, False) for s in GOOD_START]
    for i, (start, ratio, bad) in enumerate(rows):
        v = f"v{i}"
        ev.parents[v] = None
        ev.add_series(v, M.POLICY_ENTROPY, _entropy(start, ratio))
        ev.add_series(v, M.REWARD_MEAN, list(enumerate(rng.random(8).tolist())))
        ev.add_series(v, M.POLICY_KL, list(enumerate(np.cumsum(rng.normal(size=8)).tolist())))
        labels[v] = bad
    return ev, labels


def test_feature_statistics_by_hand():
    pts = [(0, 1.0), (1, 2.0), (2, 3.0), (3, 4.0), (4, 10.0), (5, 12.0), (6, 11.0), (7, 13.0)]
    parent = [(0, 4.0), (1, 4.0), (2, 6.0), (3, 6.0)]
    # window 25% of 8 points = 2: last [11, 13] median 12, first [1, 2] median 1.5
    assert S.feature("level", 0.25, None, pts, []) == 12.0
    assert S.feature("change", 0.25, None, pts, []) == 10.5
    assert S.feature("ratio_start", 0.25, None, pts, []) == 8.0
    assert S.feature("quantile", 0.25, 0.9, pts, []) == pytest.approx(12.8)  # 11 + 0.9 * (13 - 11)
    assert S.feature("level", 0.5, None, pts, []) == 11.5  # median of [10, 12, 11, 13]
    # least squares: x mean 3.5, y mean 7, sxx 42, sxy 81 -> 81 / 42
    assert S.feature("slope", 0.25, None, pts, []) == pytest.approx(81 / 42)
    # best split at 4: means 2.5 | 11.5, gain 4*4/8*9^2 = 162 (split 3: 3*5/8*8^2 = 120)
    assert S.feature("change_point", 0.25, None, pts, []) == 9.0
    assert S.feature("ratio_parent", 0.25, None, pts, parent) == 2.0  # 12 / median([6, 6])
    assert S.feature("ratio_parent", 0.25, None, pts, []) is None  # no parent: no statistic
    # each statistic needs its own number of points (MIN_POINTS_BY_STAT): a level is one point's value (a real
    # run's single logged step), a change needs 3 (first and last windows of 2 differ), a change point 4
    assert S.feature("level", 0.25, None, pts[:1], []) == 1.0
    assert S.feature("ratio_parent", 0.25, None, pts[:1], parent) == pytest.approx(1 / 6)  # 1 / median([6, 6])
    assert S.feature("change", 0.25, None, pts[:2], []) is None
    assert S.feature("change", 0.25, None, pts[:3], []) == 1.0  # median [2, 3] - median [1, 2] = 2.5 - 1.5
    assert S.feature("change_point", 0.25, None, pts[:3], []) is None
    assert S.feature("level", 0.25, None, pts, [], min_points=9) is None  # an explicit minimum still applies


def test_synthesiser_finds_the_ratio_rule_and_keeps_it_out_of_sample():
    ev, labels = _labelled()
    res = S.synthesize(S.lineage_examples(ev, labels))
    p = res.program
    assert (p.series, p.stat, p.direction) == (M.POLICY_ENTROPY, "ratio_start", "below"), res.reason
    assert 0.2 < p.threshold < 0.7  # between the two classes' ratios
    assert res.in_sample["j"] == 1.0
    # leave-one-out: each version judged by a search that never saw it; all 16 right
    assert (res.loo["tp"], res.loo["fp"], res.loo["fn"], res.loo["tn"]) == (8, 0, 0, 8)
    # 3 series x 16 (stat, window, q) bases x 15 thresholds x 2 directions
    assert res.n_series == 3 and res.n_candidates == 3 * 16 * 15 * 2
    assert res.p_value <= S.ALPHA and res.kept
    assert (res.n_labels, res.n_bad, res.n_good) == (16, 8, 8)
    assert res.seconds < 5.0


def test_synthesiser_rejects_a_rule_that_only_fits_by_chance():
    ev, labels = _labelled()
    shuffled = dict(zip(labels, np.random.default_rng(5).permutation(list(labels.values())).tolist(), strict=True))
    res = S.synthesize(S.lineage_examples(ev, shuffled))
    assert not res.kept and res.p_value > S.ALPHA, res.reason
    assert "not kept" in res.reason and "16 labels (8 bad, 8 good)" in res.reason


def test_too_few_labels_give_no_verdict_and_say_how_many():
    ev, labels = _labelled()
    few = {"v0": True, "v1": True, "v8": False, "v9": False, "v10": False}
    res = S.synthesize(S.lineage_examples(ev, few))
    assert not res.kept and res.p_value is None
    assert "5 labels (2 bad, 3 good): a verdict needs at least 3 of each" in res.reason


def test_compiled_rule_fires_in_the_sandbox_where_the_search_predicted():
    from evotrainer.harness.analyzers import run_analyzer_code

    ev, labels = _labelled()
    res = S.synthesize(S.lineage_examples(ev, labels))
    findings = run_analyzer_code(S.compile_program(res.program), ev, name=res.program.name)
    assert sorted(v for f in findings for v in f.versions) == sorted(v for v, b in labels.items() if b)
    f = findings[0]
    assert f.kind == "predicted_regression" and f.severity == "info" and f.evidence == [M.POLICY_ENTROPY]
    assert f.data["value"] == pytest.approx(0.2)


def test_a_draft_is_judged_by_the_same_keep_rule():
    labels = {f"v{i}": i < 4 for i in range(8)}
    perfect = {v: b for v, b in labels.items()}
    # J = 1; shuffles of 4 bad among 8 that J = 1 also: 1 of C(8, 4) = 70 -> p about 1/70
    kept = S.judge_fired(perfect, labels)
    assert kept["kept"] and kept["j"] == 1.0 and kept["p_value"] < 0.05
    always = S.judge_fired({v: True for v in labels}, labels)  # tp 4 fp 4: J = 1 - 1 = 0
    assert not always["kept"] and always["j"] == 0.0
    two = S.judge_fired({"v0": True, "v1": False}, {"v0": True, "v1": False})
    assert not two["kept"] and "needs at least 3 of each" in two["reason"]


def test_early_stop_needs_a_trusted_record():
    # Wilson 95% lower bounds: 6/6 -> 1 / (1 + 1.96^2/6) = 0.610; 2/3 -> 0.208
    assert S.wilson_lower(6, 6) == pytest.approx(0.6097, abs=1e-3)
    assert S.wilson_lower(2, 3) == pytest.approx(0.2077, abs=1e-3)
    ev, labels = _labelled()
    prog = S.synthesize(S.lineage_examples(ev, labels)).program.to_dict()
    trusted = {"name": "r", "program": prog, "loo": {"tp": 6, "fp": 0}, "track_record": {}}
    shaky = {"name": "r", "program": prog, "loo": {"tp": 1, "fp": 1}, "track_record": {"math": {"helped": 1}}}
    assert S.early_stop([trusted], ev, "v0")["stop"]  # bad v0 fires; 6/6 -> 0.61 >= 0.5
    d = S.early_stop([shaky], ev, "v0")
    assert not d["stop"] and "not trusted enough" in d["reason"]  # 2/3 -> 0.21
    assert S.early_stop([trusted], ev, "v8")["analyzer"] is None  # good v8 (ratio 0.7) does not fire


def test_case_corpus_labels_by_kind(tmp_path: Path):
    import shutil

    cases = tmp_path / "cases"  # three cases of the corpus, copied so that the corpus can grow
    for name in ("format_reward_hacking", "truncation_all_clipped", "zero_variance_easy_data"):
        shutil.copytree(Path(__file__).parent / "data" / "cases" / name, cases / name)
    ex = S.case_examples(cases, kind="truncation")
    # must: truncation_all_clipped; must_not: format_reward_hacking, zero_variance_easy_data
    assert sorted((e.version, e.bad) for e in ex) == [("format_reward_hacking", False),
                                                      ("truncation_all_clipped", True),
                                                      ("zero_variance_easy_data", False)]
    res = S.synthesize(ex)
    assert not res.kept and "3 labels (1 bad, 2 good)" in res.reason


def test_pooled_corpus_labels_count_a_healthy_case_as_good(tmp_path: Path):
    import shutil

    cases = tmp_path / "cases"
    for name in ("healthy_verl_klcov_step4", "truncation_all_clipped", "zero_variance_easy_data"):
        shutil.copytree(Path(__file__).parent / "data" / "cases" / name, cases / name)
    # no kind: bad when must names any failure, good when it names none (the healthy case); one label per case
    ex = S.case_examples(cases)
    assert sorted((e.version, e.bad) for e in ex) == [("healthy_verl_klcov_step4", False),
                                                      ("truncation_all_clipped", True),
                                                      ("zero_variance_easy_data", True)]


def test_seeded_fault_labels_follow_the_recipe():
    ev = Evidence()
    for vid, parent, max_len in (("v0", None, 4), ("v1", "v0", 8), ("v2", "v0", 4)):
        ev.parents[vid] = parent
        ev.recipes[vid] = {"generate_max_len": max_len, "reward": {"format_token": {"weight": 1.0}}}
    # v0 and its control v2 still generate 4 tokens: the fault is in them; v1 fixed it
    assert [(e.version, e.bad) for e in S.fault_examples(ev, {"generate_max_len": 4})] == [
        ("v0", True), ("v1", False), ("v2", True)]
    # every seeded value must still be there; a run without this fault has good versions only
    assert [e.bad for e in S.fault_examples(ev, {"generate_max_len": 4, "reward.format_token.weight": 0.5})] == [
        False, False, False]
    assert [e.bad for e in S.fault_examples(ev, None)] == [False, False, False]
    with pytest.raises(S.SynthesisError, match="'generate_max_length' is in no version's recipe"):
        S.fault_examples(ev, {"generate_max_length": 4})


# --- in the loop: registered, stored as a skill, inherited by a later run --------------------------------
def _lineage(path: Path, starts: list[tuple[float, float, bool]], task: str = "arithmetic"):
    from evotrainer.intervention import Intervention
    from evotrainer.recipe import Recipe
    from evotrainer.workspace import Workspace

    ws = Workspace(path)
    lin = ws.lineage
    lin.create_root(Recipe(data={"task": task}))
    lin.decide("v0", "keep", "root")
    for step in range(8):
        lin.log_metrics("v0", step, {M.POLICY_ENTROPY: 1.0})
    for i, (start, ratio, bad) in enumerate(starts):
        v = lin.branch("v0", Intervention(path="temperature", old=1.0, new=round(1.01 + 0.01 * i, 2),
                                          category="rollout"))
        for step, x in _entropy(start, ratio):
            lin.log_metrics(v.id, step, {M.POLICY_ENTROPY: x})
        lin.decide(v.id, "prune" if bad else "keep", "test label")
    return ws


def _orch(ws, brain=None):
    from evotrainer.agents.heuristic import HeuristicBrain
    from evotrainer.agents.mcp_client import ToolBox
    from evotrainer.agents.orchestrator import Orchestrator
    from evotrainer.config import RunConfig
    from evotrainer.servers.app import build_server

    tb = ToolBox(build_server("all", str(ws.root)))
    return tb, Orchestrator(RunConfig(), tb, ws, brain or HeuristicBrain())


def test_a_kept_analyzer_is_registered_stored_and_inherited_by_a_later_run(tmp_path):
    from evotrainer.agents.report import render_html
    from evotrainer.skills_db.store import SkillStore

    rows = [(s, 0.2, True) for s in BAD_START] + [(s, 0.7, False) for s in GOOD_START]
    ws = _lineage(tmp_path / "run1", rows)
    tb, orch = _orch(ws)
    with tb:
        out = orch._evolve(1, [f"v{i}" for i in range(1, 17)])
    synth = [e for e in out if e["type"] == "synthesis"][0]
    assert synth["registered"] and synth["program"]["stat"] == "ratio_start", synth["reason"]
    assert synth["sandbox"]["tp"] == 8 and synth["sandbox"]["fp"] == 0  # the sandbox agrees with the search
    name = synth["name"]
    assert name in ws.lineage.kv_get("analyzers/registered")
    skill = SkillStore().get(f"synth:{name}")
    assert skill.kind == "analyzer" and "synthesised" in skill.tags and skill.value["n_labels"] == 16
    assert skill.value["loo"]["precision"] == 1.0 and len(skill.value["evidence"]) == 16
    ws.lineage.kv_set("loop/r1/evolve", out)  # what the loop's stage stores
    html = render_html(ws)
    assert "ratio_start(policy/entropy" in html and "candidate rules tried" in html
    ws.close()

    # run 2, another domain (code), same skills folder: 3 bad and 3 good versions it was never fitted on
    starts2 = [(1.5, 0.2, True), (0.7, 0.15, True), (3.5, 0.25, True), (2.0, 0.8, False), (0.9, 0.7, False),
               (4.5, 0.9, False)]
    ws2 = _lineage(tmp_path / "run2", starts2, task="humaneval")
    tb2, orch2 = _orch(ws2)
    with tb2:
        out2 = orch2._evolve(1, [f"v{i}" for i in range(1, 7)])
        orch2._evolve(1, [f"v{i}" for i in range(1, 7)])  # a resumed stage: no outcome is counted twice
    inherited = [e for e in out2 if e["type"] == "inherited"]
    assert [e["name"] for e in inherited] == [name]
    assert name in ws2.lineage.kv_get("analyzers/registered")  # registered in run 2 too
    uses = [e for e in out2 if e["type"] == "use" and e["name"] == name]
    assert [(e["version"], e["fired"], e["correct"]) for e in uses] == [
        ("v1", True, True), ("v2", True, True), ("v3", True, True),
        ("v4", False, True), ("v5", False, True), ("v6", False, True)]
    rec = SkillStore().get(f"synth:{name}").track_record
    assert rec["code"].tried == 3 and rec["code"].helped == 3 and rec["code"].hurt == 0 and "math" not in rec
    # early stop at half the steps (the entropy drop is at step 2 < 4): 8 leave-one-out right fires plus the
    # in-use ones before the version itself, e.g. 8/8 at v1: Wilson lower bound 8 / (8 + 3.84) = 0.68 >= 0.5 -> stop the three bad
    # versions, saving 4 of their 8 steps each
    stops = [e for e in out2 if e["type"] == "early_stop"]
    assert [(e["version"], e["stop"], e["right"], e["saved_steps"]) for e in stops] == [
        ("v1", True, True, 4), ("v2", True, True, 4), ("v3", True, True, 4)]
    # precision n/n has Wilson lower bound n / (n + 1.96^2): 8/8, 9/9, 10/10
    assert [round(e["precision_lower"], 4) for e in stops] == [round(n / (n + 1.96 ** 2), 4) for n in (8, 9, 10)]
    ws2.lineage.kv_set("loop/r1/evolve", out2)
    html2 = render_html(ws2)
    assert "Inherited from earlier runs" in html2 and "fired 3 times, 3 of them on a version that turned out bad" in html2
    ws2.close()


def test_labels_remembered_by_earlier_runs_make_a_verdict_possible(tmp_path):
    from evotrainer.skills_db.store import SkillStore

    # three runs of 6 labelled versions each (3 bad ratio 0.2, 3 good ratio 0.7), starts overlapping
    runs = [[(0.5, 0.2, True), (2.0, 0.2, True), (4.0, 0.2, True), (5.0, 0.7, False), (0.6, 0.7, False),
             (3.0, 0.7, False)],
            [(1.0, 0.2, True), (0.8, 0.2, True), (3.0, 0.2, True), (1.5, 0.7, False), (4.0, 0.7, False),
             (0.7, 0.7, False)],
            [(1.2, 0.2, True), (2.5, 0.2, True), (0.9, 0.2, True), (2.2, 0.7, False), (0.9, 0.7, False),
             (3.5, 0.7, False)]]
    results = []
    for k, rows in enumerate(runs):
        ws = _lineage(tmp_path / f"run{k}", rows)
        tb, orch = _orch(ws)
        with tb:
            results.append([e for e in orch._evolve(1, [f"v{i}" for i in range(1, 7)]) if e["type"] == "synthesis"][0])
            again = [e for e in orch._evolve(2, []) if e["type"] == "synthesis"][0]
        assert again["sources"] == ({"lineage": 6, "memory": 6 * k} if k else {"lineage": 6})  # its own remembered labels are not pooled twice
        assert ws.lineage.kv_get("loop/analyzers/remembered") == {f"v{i}": "pruned" if i <= 3 else "kept"
                                                                 for i in range(1, 7)}
        ws.close()
    # run 0 alone: 6 labels; a perfect split of 3 + 3 is 1 of C(6, 3) = 20 labelings (and its mirror in the
    # other direction), so about 1 shuffle in 10 fits as well: p ~ 0.1 > 0.05, not kept
    assert results[0]["n_labels"] == 6 and not results[0]["registered"] and results[0]["p_value"] > 0.05
    # run 2 pools its 6 labels with the 12 remembered by runs 0 and 1: 18 labels, kept
    last = results[2]
    assert last["n_labels"] == 18 and last["sources"] == {"lineage": 6, "memory": 12}
    assert last["registered"] and last["program"]["stat"] == "ratio_start", last["reason"]
    assert (last["loo"]["tp"], last["loo"]["fp"]) == (9, 0)
    skill = SkillStore().get(f"synth:{last['name']}")
    assert len(skill.value["evidence"]) == 18 and skill.value["sources"] == {"lineage": 6, "memory": 12}


class _AlwaysFires:
    """A brain whose draft fires on every version (what a free-form draft may do): it must not be kept."""

    name = "stub"

    def write_analyzer(self, tools, version_id, diagnosis, context):
        from evotrainer.agents.decisions import AnalyzerDraft

        code = ("import json, os\nm = json.load(open(os.path.join(os.environ['EVIDENCE_DIR'], 'metrics.json')))\n"
                "print(json.dumps([{'kind': 'everything', 'severity': 'warn', 'versions': [v], "
                "'explanation': 'fires on all'} for v in m]))")
        return AnalyzerDraft(name="everything", kind="everything", description="fires on all", code=code)


@pytest.mark.parametrize(("brain", "kept"), [(None, True), (_AlwaysFires(), False)])
def test_brain_drafts_go_through_the_same_keep_rule(tmp_path, brain, kept):
    from evotrainer.intervention import Intervention
    from evotrainer.recipe import Recipe
    from evotrainer.workspace import Workspace

    # v0 at mean length 20; 4 pruned children ramp 20 -> 30 (late quarter 29.3 vs the parent's 20: +46%, the
    # heuristic length_shift draft fires), 4 kept ones ramp 20 -> 21 (+4.6%, quiet)
    ws = Workspace(tmp_path / "run")
    lin = ws.lineage
    lin.create_root(Recipe())
    lin.decide("v0", "keep", "root")
    for step in range(8):
        lin.log_metrics("v0", step, {M.COMPLETIONS_MEAN_LENGTH: 20.0})
    for i, end in enumerate([30.0] * 4 + [21.0] * 4):
        v = lin.branch("v0", Intervention(path="temperature", old=1.0, new=round(1.01 + 0.01 * i, 2), category="rollout"))
        for step in range(8):
            lin.log_metrics(v.id, step, {M.COMPLETIONS_MEAN_LENGTH: 20.0 + (end - 20.0) * step / 7})
        lin.decide(v.id, "prune" if end > 25 else "keep", "test label")
    lin.kv_set("loop/diagnose/v8", {"version_id": "v8", "findings": [], "unexplained": True, "summary": "s"})
    tb, orch = _orch(ws, brain)
    with tb:
        out = orch._evolve(1, ["v8"])
    d = [e for e in out if e["type"] == "draft"][0]
    # length_shift: tp 4, fp 0 of 8 labels -> J = 1; 1 of C(8, 4) = 70 shuffles fits as well -> p ~ 0.014 (kept).
    # everything: tp 4, fp 4 -> J = 0 (not kept)
    assert d["registered"] is kept and d["backtest"]["n_labels"] == 8, d
    assert d["backtest"]["j"] == (1.0 if kept else 0.0)
    assert (d["name"] in (ws.lineage.kv_get("analyzers/registered") or {})) is kept
    if kept:  # stored in memory with the numbers it was kept on
        from evotrainer.skills_db.store import SkillStore

        skill = SkillStore().get("draft:length_shift")
        assert skill.kind == "analyzer" and skill.value["backtest"]["tp"] == 4 and skill.value["backtest"]["fp"] == 0
    ws.close()
