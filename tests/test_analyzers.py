"""Built-in analyzers on hand-built runs: each fires on its failure, stays quiet on healthy and benign runs.

Series are synthetic but shaped like real runs (seeded noise); rollout tables use the store schema.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from evotrainer import metrics as M
from evotrainer.harness.analyzers import (
    AnalyzerError,
    behaviour,
    get_analyzer,
    list_analyzers,
    register_analyzer,
    rules,
    run_analyzers,
    unregister_analyzer,
)
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import KINDS, Finding
from evotrainer.harness.rollout_metrics import frac_zero_std_groups
from evotrainer.rollouts import SCHEMA, make_record
from evotrainer.text_stats import distinct_n, duplicate_frac, repetition_rate

RNG = np.random.default_rng(0)
N = 100
STEPS = np.arange(N)


def noisy(start: float, end: float, sd: float = 0.01, n: int = N) -> np.ndarray:
    return np.linspace(start, end, n) + RNG.normal(0, sd, n)


def healthy(**override: np.ndarray) -> dict[str, np.ndarray]:
    base = {
        M.REWARD_MEAN: noisy(0.2, 0.6), M.CORRECT_MEAN: noisy(0.2, 0.6), M.REWARD_STD: noisy(0.4, 0.35),
        M.REWARD_FRAC_ZERO_STD: noisy(0.2, 0.25, 0.02), M.POLICY_ENTROPY: noisy(0.6, 0.5, 0.02),
        M.POLICY_KL: noisy(0.001, 0.02, 0.001), M.POLICY_GRAD_NORM: noisy(0.3, 0.3, 0.02),
        M.COMPLETIONS_MEAN_LENGTH: noisy(120, 140, 3), M.COMPLETIONS_CLIPPED_RATIO: noisy(0.02, 0.02, 0.005),
        M.LOSS_POLICY: noisy(0.01, 0.01, 0.005),
    }
    base.update(override)
    return base


def ev_of(series: dict[str, np.ndarray], version: str = "v1", **kw) -> Evidence:
    return Evidence(metrics={version: {k: (STEPS[: len(x)].copy(), np.asarray(x, float)) for k, x in series.items()}},
                    **kw)


def failures(findings: list[Finding]) -> dict[str, Finding]:
    return {f.kind: f for f in findings if f.is_failure}


def test_every_builtin_kind_is_registered():
    builtin = {s.name for s in list_analyzers(builtin=True)}
    assert set(KINDS) <= builtin  # plus the SWE-episode analyzers (swe_hacking, swe_behaviour)


def test_healthy_run_raises_nothing():
    assert failures(run_analyzers(ev_of(healthy()))) == {}


def test_benign_zero_loss_raises_nothing():
    # GRPO's surrogate prints 0.0 at the on-policy point; grad norm and reward still move: not a failure.
    ev = ev_of(healthy(**{M.LOSS_POLICY: np.zeros(N), M.LOSS_TOTAL: np.zeros(N)}))
    assert failures(run_analyzers(ev)) == {}


def test_entropy_collapse_with_numbers():
    ent = 0.8 * np.exp(-STEPS / 20) + 0.02 + RNG.normal(0, 0.005, N)
    f = failures(run_analyzers(ev_of(healthy(**{M.POLICY_ENTROPY: ent}))))["entropy_collapse"]
    assert f.severity == "warn" and f.versions == ["v1"] and f.steps == [0, 99]
    # early window = first 20 points: median of 0.8 e^{-t/20} + 0.02 over t=0..19 ~ 0.8 e^{-0.475} + 0.02 = 0.52
    assert f.data["early"] == pytest.approx(0.52, abs=0.03)
    # late window t=80..99: median ~ 0.8 e^{-89.5/20} + 0.02 = 0.029
    assert f.data["late"] == pytest.approx(0.029, abs=0.005) and "fell from" in f.explanation


def test_kl_blowup_level_shift():
    kl = np.where(STEPS < 60, 0.01, 2.0) + RNG.normal(0, 0.002, N)
    f = failures(run_analyzers(ev_of(healthy(**{M.POLICY_KL: kl}))))["kl_blowup"]
    assert f.severity == "warn" and f.data["late"] == pytest.approx(2.0, abs=0.01)
    assert f.data["change_step"] == 60  # the split that minimises the squared error


def test_grad_spikes_warn_on_damage_and_info_when_harmless():
    g = np.full(N, 1.0) + RNG.normal(0, 0.05, N)
    g3 = g.copy()
    g3[[30, 55, 80]] = 20.0
    # Three spikes (20 against a median of 1) in a run whose reward keeps rising 0.2 -> 0.6 and whose
    # entropy and KL do not move: nothing shows harm, so info (healthy runs spike now and then).
    found = [x for x in run_analyzers(ev_of(healthy(**{M.POLICY_GRAD_NORM: g3}))) if x.kind == "grad_spike"]
    assert [(x.severity, x.steps, x.judged) for x in found] == [("info", [30, 55, 80], "change")]
    assert found[0].data["n_spikes"] == 3 and found[0].data["damaged_after"] == {}
    # The same spikes, with the reward falling from ~0.4 to ~0.1 right after the spike at 55: the
    # 5 steps before (50-54) have median ~0.4, the 5 after (56-60) ~0.1: a drop of 0.3 against a run
    # range (p5-p95) of ~0.4 and a noise sd of ~0.01: damage, so warn, and the steps say where.
    r = noisy(0.2, 0.6)
    r[56:] -= 0.3
    f = failures(run_analyzers(ev_of(healthy(**{M.POLICY_GRAD_NORM: g3, M.REWARD_MEAN: r}))))["grad_spike"]
    assert f.severity == "warn" and f.steps == [30, 55, 80] and list(f.data["damaged_after"]) == ["55"]
    assert "after step 55: reward/mean" in f.explanation
    g1 = g.copy()
    g1[50] = 20.0
    found = [x for x in run_analyzers(ev_of(healthy(**{M.POLICY_GRAD_NORM: g1}))) if x.kind == "grad_spike"]
    assert [(x.severity, x.steps) for x in found] == [("info", [50])]


def test_length_collapse_and_blowup():
    f = failures(run_analyzers(ev_of(healthy(**{M.COMPLETIONS_MEAN_LENGTH: noisy(400, 60, 5)}))))
    assert "length_collapse" in f and "length_blowup" not in f
    grow = healthy(**{M.COMPLETIONS_MEAN_LENGTH: noisy(100, 900, 5), M.COMPLETIONS_CLIPPED_RATIO: noisy(0.0, 0.4),
                      M.CORRECT_MEAN: noisy(0.3, 0.3)})
    f = failures(run_analyzers(ev_of(grow)))
    assert f["length_blowup"].severity == "warn" and "clipped ratio" in f["length_blowup"].explanation
    assert f["truncation"].severity == "warn"  # late clipped ratio ~0.36: between 0.2 and 0.5


def test_nan_blowup_persistent_blocking_isolated_warn():
    loss = noisy(0.01, 0.01)
    loss[70:] = np.nan
    f = failures(run_analyzers(ev_of(healthy(**{M.LOSS_POLICY: loss}))))["nan_blowup"]
    assert f.severity == "blocking" and f.steps == [70, 99] and f.data["series"] == {M.LOSS_POLICY: 30}
    g = noisy(0.3, 0.3)
    g[40] = np.inf
    f = failures(run_analyzers(ev_of(healthy(**{M.POLICY_GRAD_NORM: g}))))["nan_blowup"]
    assert f.severity == "warn" and f.steps == [40, 40]


def test_truncation_from_clipped_ratio_and_from_cap():
    f = failures(run_analyzers(ev_of(healthy(**{M.COMPLETIONS_CLIPPED_RATIO: noisy(0.1, 0.9)}))))["truncation"]
    assert f.severity == "blocking"
    # No clipped ratio logged: mean length pinned at the recipe's generate_max_len (64) means all truncated.
    s = healthy(**{M.COMPLETIONS_MEAN_LENGTH: np.full(N, 64.0)})
    del s[M.COMPLETIONS_CLIPPED_RATIO]
    ev = ev_of(s, recipes={"v1": {"generate_max_len": 64}})
    assert failures(run_analyzers(ev))["truncation"].severity == "blocking"


def test_insufficient_evidence_is_info():
    ev = ev_of({M.POLICY_ENTROPY: np.array([0.9, 0.5, 0.2, 0.05, 0.01])})
    found = run_analyzers(ev, names=["entropy_collapse"])
    assert len(found) == 1 and found[0].severity == "info"
    assert found[0].explanation.startswith("insufficient evidence: policy/entropy has 5 finite point(s)")


def test_reward_hacking_component_up_correctness_down():
    s = healthy(**{"reward/format/mean": noisy(0.4, 0.9), M.CORRECT_MEAN: noisy(0.3, 0.1),
                   M.REWARD_MEAN: noisy(0.7, 1.0)})
    f = failures(run_analyzers(ev_of(s)))["reward_hacking"]
    assert f.severity == "blocking" and "reward/format/mean" in f.evidence and M.CORRECT_MEAN in f.evidence


def test_train_eval_divergence_series_and_versus_parent():
    evals = np.full(N, np.nan)
    evals[::10] = 0.40 + RNG.normal(0, 0.005, 10)  # flat held-out score, every 10 steps
    f = failures(run_analyzers(ev_of(healthy(**{M.EVAL_AVG_AT_K: evals}))))
    assert f["train_eval_divergence"].severity == "warn"
    # across versions: child's train reward up by 0.3, its held-out matrix worse than the parent's
    parent = {f"p{i}": [1, 1, 0, 0] for i in range(30)}
    child = {f"p{i}": [1, 0, 0, 0] for i in range(30)}
    ev = Evidence(metrics={"v0": {M.REWARD_MEAN: (STEPS, noisy(0.3, 0.3))}, "v1": {M.REWARD_MEAN: (STEPS, noisy(0.6, 0.6))}},
                  evals={"v0": parent, "v1": child}, parents={"v0": None, "v1": "v0"})
    found = [x for x in run_analyzers(ev, names=["train_eval_divergence"]) if x.data.get("parent") == "v0"]
    assert found and found[0].severity == "blocking"
    assert found[0].data["heldout_gain"] == pytest.approx(-0.25)  # 0.25 - 0.5 on every problem
    # the child's finding alone: the parent is its reference, not a version it covers (it counted against the
    # parent in the gate, `diagnose --best` and the brain's view of the parent: a new user's report)
    assert found[0].versions == ["v1"] and "its parent v0" in found[0].explanation


# --- rollout-based ----------------------------------------------------------------------------------------
def rollouts(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def test_rollout_metric_helpers_by_hand():
    # distinct-2: "a b c" + "a b d" -> bigrams ab, bc, ab, bd: 3 distinct of 4
    assert distinct_n(["a b c", "a b d"], 2) == pytest.approx(0.75)
    # repetition: "x y z w x y z w" has 5 4-grams, 4 distinct -> 1/5; "a" has none -> 0; mean 0.1
    assert repetition_rate(["x y z w x y z w", "a"], 4) == pytest.approx(0.1)
    # "same" answers prompts p1 and p2 -> 2 of 3 completions are cross-prompt duplicates
    assert duplicate_frac(["same", "same ", "other"], ["p1", "p2", "p1"]) == pytest.approx(2 / 3)
    # groups g1 (1,1,1) zero std, g2 (0,1,0) not -> 1/2
    assert frac_zero_std_groups([1, 1, 1, 0, 1, 0], ["g1"] * 3 + ["g2"] * 3) == 0.5


def _run_rows(n_steps: int, completion_of, reward_of, answer_of=lambda p: "", prompt_of=lambda p: f"question {p}",
              turns_of=None) -> pa.Table:
    rows = []
    for step in range(n_steps):
        for p in range(2):  # 2 prompts x 3 samples
            for k in range(3):
                rows.append(make_record(version_id="v1", step=step, prompt_id=f"q{p}", group_id=f"{step}-{p}",
                                        sample_idx=k, prompt=prompt_of(p), completion=completion_of(step, p, k),
                                        reward=reward_of(step, p, k), answer=answer_of(p), length=10,
                                        turns=turns_of(step, p, k) if turns_of else None))
    return rollouts(rows)


def test_zero_variance_groups_from_rollouts():
    # prompt q0 always all-correct (zero std), q1 mixed: frac zero std = 1/2 at every step
    t = _run_rows(10, lambda s, p, k: f"answer {p} {k}", lambda s, p, k: 1.0 if p == 0 else float(k == 0))
    ev = Evidence(rollouts=t)
    steps, x = ev.series("v1", M.REWARD_FRAC_ZERO_STD)
    assert steps.tolist() == list(range(10)) and x.tolist() == [0.5] * 10
    # reward mean per step: (1+1+1 + 1+0+0) / 6 = 4/6
    assert ev.series("v1", M.REWARD_MEAN)[1] == pytest.approx([4 / 6] * 10)
    f = failures(run_analyzers(ev))["zero_variance_groups"]
    assert f.severity == "warn" and f.data["late_frac"] == 0.5


def test_template_collapse_from_rollouts():
    # steps 0-9: every completion distinct; steps 10-19: every completion is the same template
    t = _run_rows(20, lambda s, p, k: f"step {s} prompt {p} sample {k} text" if s < 10 else "The answer is 42.",
                  lambda s, p, k: float(k == 0))
    ev = Evidence(rollouts=t)
    dup = ev.series("v1", M.COMPLETIONS_DUPLICATE_FRAC)[1]
    assert dup[:10].tolist() == [0.0] * 10 and dup[10:].tolist() == [1.0] * 10
    f = failures(run_analyzers(ev))["template_collapse"]
    assert M.COMPLETIONS_DUPLICATE_FRAC in f.evidence


def test_lr_too_high_collapse_in_eight_steps_smollm2_series():
    # SmolLM2 at actor_learning_rate 2e-4 (runs/scenarios lr_too_high, v0): 8 steps, groups filtered
    # from step 4 on. Entropy is measured on every step (steps 5-7 values below are of that shape).
    ent = [1.91, 1.04, 0.113, 0.051, 0.072, 0.05, 0.04, 0.06]
    d2 = [0.84, 0.552, 0.146, 0.177, 0.135, 0.174, 0.202, 0.146]
    zv = [0.25, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 0.75]  # reward/frac_zero_std of the same run
    ev = ev_of({M.POLICY_ENTROPY: np.array(ent), M.COMPLETIONS_DISTINCT_2: np.array(d2),
                M.REWARD_FRAC_ZERO_STD: np.array(zv)})
    f = failures(run_analyzers(ev, names=["entropy_collapse", "template_collapse", "zero_variance_groups"]))
    # entropy: early median(1.91, 1.04, 0.113) = 1.04, late median(0.05, 0.04, 0.06) = 0.05; binary
    # segmentation splits at step 3: first segment (1.91 + 1.04 + 0.113) / 3 = 1.021, last segment
    # (0.051 + 0.072 + 0.05 + 0.04 + 0.06) / 5 = 0.0546 (x0.0535), a change judged on the segments.
    # The zero-std fraction rose with it, 0.25 -> median(1, 1, 0.75) = 1.0: the collapse emptied the
    # groups, so entropy_collapse blocks and zero_variance_groups is its symptom (a warning).
    e = f["entropy_collapse"]
    assert (e.data["early"], e.data["late"]) == pytest.approx((1.04, 0.05))
    assert (e.judged, e.data["from"], e.data["to"]) == ("change", pytest.approx(1.021), pytest.approx(0.0546))
    assert "first segment 1.02 nats/token (steps 0-2), last segment 0.0546 (steps 3-7)" in e.explanation
    assert e.severity == "blocking" and e.data["zero_std_frac_late"] == 1.0 and "25% -> 100%" in e.explanation
    z = f["zero_variance_groups"]
    assert z.severity == "warn" and z.data["symptom_of"] == "entropy_collapse" and "symptom" in z.explanation
    # the same zero-std fraction with healthy entropy: the data is to blame, blocking as before
    ev2 = ev_of({M.POLICY_ENTROPY: np.full(8, 0.6), M.REWARD_FRAC_ZERO_STD: np.array(zv)})
    z2 = failures(run_analyzers(ev2, names=["entropy_collapse", "zero_variance_groups"]))
    assert set(z2) == {"zero_variance_groups"} and z2["zero_variance_groups"].severity == "blocking"
    assert "symptom_of" not in z2["zero_variance_groups"].data
    # distinct-2: Mann-Kendall p = 0.17 (not falling at 0.01), but the mean shifts at step 3 from
    # (0.84 + 0.552 + 0.146) / 3 = 0.5127 to 0.1668 (<= 0.5x): a level shift, so template_collapse
    t = f["template_collapse"]
    assert t.data["distinct_2"]["early"] == pytest.approx(0.552) and t.data["distinct_2"]["late"] == pytest.approx(0.174)
    assert "level shift at step 3: 0.513 -> 0.167" in t.explanation
    # a drop that does not halve the level is not a collapse
    mild = [0.84, 0.8, 0.7, 0.6, 0.62, 0.58, 0.6, 0.61]
    quiet = run_analyzers(ev_of({M.COMPLETIONS_DISTINCT_2: np.array(mild)}), names=["template_collapse"])
    assert failures(quiet) == {}


def test_reward_hacking_leaked_answer_in_prompt():
    answers = {0: "1234", 1: "5678"}
    t = _run_rows(10, lambda s, p, k: answers[p], lambda s, p, k: 1.0, answer_of=lambda p: answers[p],
                  prompt_of=lambda p: f"Compute it. (hint: the result is {answers[p]})")
    f = failures(run_analyzers(Evidence(rollouts=t), names=["reward_hacking"]))["reward_hacking"]
    assert f.severity == "blocking" and f.data == {"leaked_frac": 1.0, "chance_frac": 0.0, "n_prompts": 2}
    # the same answers not in the prompts: nothing
    t2 = _run_rows(10, lambda s, p, k: answers[p], lambda s, p, k: 1.0, answer_of=lambda p: answers[p])
    assert failures(run_analyzers(Evidence(rollouts=t2), names=["reward_hacking"])) == {}


def _arithmetic_rows(template: str) -> pa.Table:
    """One step of the 400 level-1 problems a + b (a, b in 0..19), one sample each, prompts from ``template``."""
    rows = [make_record(version_id="v1", step=0, prompt_id=f"{a}+{b}", group_id=f"{a}+{b}", sample_idx=0,
                        prompt=template.format(a=a, b=b, c=a + b), completion=str(a + b), reward=1.0,
                        answer=str(a + b), length=3) for a in range(20) for b in range(20)]
    return rollouts(rows)


def test_leaked_answer_is_judged_against_chance():
    """'a + 0' holds its answer: of the 345 problems whose answer has >= 2 characters (400 less the 55 with
    a + b <= 9), 20 do (a or b is 0, the other 10..19): 5.8%, over the old 5% warning; another problem's answer
    is in a prompt by chance often enough that the excess is under 5%: no finding (a new user's report on the
    default run). A template that prints the answer leaks it in every prompt: blocking."""
    ev = Evidence(rollouts=_arithmetic_rows("What is {a} + {b}?"))
    assert failures(run_analyzers(ev, names=["reward_hacking"])) == {}
    f = failures(run_analyzers(Evidence(rollouts=_arithmetic_rows("What is {a} + {b}? (It is {c}.)")),
                               names=["reward_hacking"]))["reward_hacking"]
    assert f.severity == "blocking" and f.data["n_prompts"] == 345 and f.data["leaked_frac"] == 1.0
    assert f.data["chance_frac"] < 0.1 and "by chance" in f.explanation
    # inside a decimal is not the answer ("12" is not in "12.5" or "0.12")
    ev = Evidence(rollouts=_arithmetic_rows("What is {a} + {b}? Not {c}.5, not 0.{c}."))
    assert failures(run_analyzers(ev, names=["reward_hacking"])) == {}


def _leaky_rows(pay_right, pay_wrong) -> pa.Table:
    """12 steps x 2 prompts x 3 samples; sample 0 of prompt q0 is right at every step (correctness flat
    at 1/6); the format term pays ``pay_right(share)`` / ``pay_wrong(share)`` with share = step / 11."""
    rows = []
    for step in range(12):
        share = step / 11
        for p in range(2):
            for k in range(3):
                right = p == 0 and k == 0
                fmt_pay = pay_right(share) if right else pay_wrong(share)
                rows.append(make_record(version_id="v1", step=step, prompt_id=f"q{p}", group_id=f"{step}-{p}",
                                        sample_idx=k, prompt=f"question {p}", completion=f"c {step} {p} {k}",
                                        reward=float(right) + fmt_pay, components={"correctness": float(right),
                                                                                 "format": fmt_pay},
                                        correct=float(right), length=10))
    return rollouts(rows)


def _leaky_ev(pay_right, pay_wrong) -> Evidence:
    """Rollouts of :func:`_leaky_rows` plus the per-component step means the trainer logs."""
    t = _leaky_rows(pay_right, pay_wrong)
    steps = np.array(t.column("step").to_pylist())
    comps = [json.loads(c) for c in t.column("components").to_pylist()]
    logged = {f"reward/{n}/mean": (np.arange(12), np.array([np.mean([c[n] for c, s in zip(comps, steps, strict=True) if s == i])
                                                            for i in range(12)])) for n in ("format", "correctness")}
    return Evidence(metrics={"v1": logged}, rollouts=t)


def test_reward_hacking_leaky_term_rises_while_correctness_flat():
    # correctness flat at 1/6; the format term pays every completion share = step/11, right or wrong
    ev = _leaky_ev(lambda share: share, lambda share: share)
    f = failures(run_analyzers(ev, names=["reward_hacking"]))["reward_hacking"]
    assert f.severity == "blocking" and f.evidence == ["reward/format/mean", M.CORRECT_MEAN]
    # late half = steps 6..11: mean share (6 + ... + 11) / (6 * 11) = 51/66 on both sides
    assert f.data["payout"]["format"] == {"wrong": pytest.approx(51 / 66), "right": pytest.approx(51 / 66),
                                          "n_wrong": 30, "n_right": 6}
    # the same series without rollouts (logged metrics only): a warning, not a block
    series = {n: ev.series("v1", n) for n in ("reward/format/mean", "reward/correctness/mean")}
    f2 = failures(run_analyzers(Evidence(metrics={"v1": series}), names=["reward_hacking"]))["reward_hacking"]
    assert f2.severity == "warn"


def test_reward_hacking_leaky_term_farmed_alongside_rising_correctness_is_a_warning():
    # the same leaky payout, but the logged correctness rises 0.1 -> 0.3 (less than the term's 0 -> 1):
    # a warning (the policy farms the term alongside the task), not a block
    ev = _leaky_ev(lambda share: share, lambda share: share)
    ev.metrics["v1"][M.CORRECT_MEAN] = (np.arange(12), np.linspace(0.1, 0.3, 12))
    f = failures(run_analyzers(ev, names=["reward_hacking"]))["reward_hacking"]
    assert f.severity == "warn" and f.data["correctness_flat"] is False and "faster than" in f.explanation
    # correctness rising as fast as the term: nothing
    ev.metrics["v1"][M.CORRECT_MEAN] = (np.arange(12), np.linspace(0.0, 1.0, 12))
    assert "reward_hacking" not in failures(run_analyzers(ev, names=["reward_hacking"]))

def test_reward_hacking_quiet_when_the_rising_term_pays_right_answers():
    # the format mean still rises (1/6 -> 3/8) but wrong answers get 0.25*share vs 1 for right ones:
    # late payout 0.25 * 51/66 = 0.193 < 0.8 x 1.0, the term tracks correctness: not leaky
    ev = _leaky_ev(lambda share: 1.0, lambda share: 0.25 * share)
    t = rules.trend_of(ev, "v1", "reward/format/mean")
    assert t.rising(rules.ALPHA) and t.late >= t.early + behaviour.HACK_RISE  # the series half of the signature holds
    assert "reward_hacking" not in failures(run_analyzers(ev, names=["reward_hacking"]))


def test_reward_hacking_test_file_edits_in_turns():
    def turns(s, p, k):
        path = "tests/test_core.py" if (s, p, k) == (3, 1, 2) else "src/core.py"
        return [{"role": "assistant", "content": "", "tool": "edit", "args": {"path": path}, "ok": True}]

    t = _run_rows(5, lambda s, p, k: "done", lambda s, p, k: 1.0, turns_of=turns)
    f = failures(run_analyzers(Evidence(rollouts=t), names=["reward_hacking"]))["reward_hacking"]
    assert f.evidence == ["rollout:v1/train/3/3-1/2"] and f.data == {"episodes": 1, "rewarded": 1}


# --- registry -----------------------------------------------------------------------------------------------
def test_register_runtime_analyzer_and_errors():
    def reward_floor(ev: Evidence) -> list[Finding]:
        """Reward mean below 0.5 at the last step."""
        out = []
        for v in ev.versions:
            s, x = ev.series(v, M.REWARD_MEAN)
            if len(x) and x[-1] < 0.5:
                out.append(Finding(kind="low_reward", severity="warn", versions=[v], explanation=f"last {x[-1]:.2f}"))
        return out

    try:
        register_analyzer("reward_floor", reward_floor, kinds=["low_reward"])
        ev = ev_of({M.REWARD_MEAN: noisy(0.4, 0.3)})
        found = run_analyzers(ev, names=["reward_floor"])
        assert [(f.kind, f.analyzer) for f in found] == [("low_reward", "reward_floor")]
        assert get_analyzer("reward_floor").description == "Reward mean below 0.5 at the last step."
        with pytest.raises(AnalyzerError, match="registered already"):
            register_analyzer("reward_floor", reward_floor)
        register_analyzer("reward_floor", lambda ev: 1 / 0, replace=True)
        err = run_analyzers(ev, names=["reward_floor"])
        assert err[0].kind == "analyzer_error" and "ZeroDivisionError" in err[0].explanation
    finally:
        unregister_analyzer("reward_floor")
    with pytest.raises(AnalyzerError, match="is a built-in"):
        register_analyzer("entropy_collapse", reward_floor)
    with pytest.raises(AnalyzerError, match="unknown analyzer 'nope'"):
        run_analyzers(ev_of({}), names=["nope"])
    with pytest.raises(AnalyzerError, match="syntax error"):
        register_analyzer("broken", "def (:")


def test_sandboxed_analyzer_code_reads_evidence_files():
    code = """
import json, os
d = os.environ["EVIDENCE_DIR"]
m = json.load(open(os.path.join(d, "metrics.json")))
out = []
for v, series in m.items():
    vals = [x for _, x in series.get("reward/mean", []) if x is not None]
    if vals and vals[-1] < vals[0]:
        out.append({"kind": "reward_decline", "severity": "warn", "versions": [v],
                    "evidence": ["reward/mean"], "explanation": f"reward {vals[0]:.2f} -> {vals[-1]:.2f}"})
print(json.dumps(out))
"""
    try:
        register_analyzer("reward_decline", code, kinds=["reward_decline"], timeout_s=60)
        ev = ev_of({M.REWARD_MEAN: np.linspace(0.8, 0.2, 20)})
        found = run_analyzers(ev, names=["reward_decline"])
        assert [(f.kind, f.versions, f.explanation) for f in found] == [("reward_decline", ["v1"], "reward 0.80 -> 0.20")]
        # code that writes outside its work dir or prints garbage gives an analyzer_error finding, not a crash
        register_analyzer("reward_decline", "print('not json')", replace=True)
        err = run_analyzers(ev, names=["reward_decline"])
        assert err[0].kind == "analyzer_error" and "not JSON" in err[0].explanation
    finally:
        unregister_analyzer("reward_decline")


def test_finding_json_round_trip():
    f = Finding(kind="entropy_collapse", severity="warn", versions=["v1"], steps=[0, 9], evidence=[M.POLICY_ENTROPY],
                explanation="x", analyzer="entropy_collapse", data={"early": 0.5})
    assert Finding.model_validate(json.loads(f.model_dump_json())) == f
    with pytest.raises(ValueError):
        Finding(kind="bad kind!", severity="warn", explanation="x")


def test_vectorised_step_metrics_match_a_plain_loop():
    from evotrainer.harness.rollout_metrics import step_metrics_from_rollouts

    rng = np.random.default_rng(3)
    rows = []
    for step in (2, 5, 7):
        for p in range(4):
            for k in range(int(rng.integers(2, 5))):  # ragged groups
                rows.append(make_record(version_id="v1", step=step, prompt_id=f"q{p}", group_id=f"{step}-{p}",
                                        sample_idx=k, prompt="x", completion=str(rng.choice(["a", "b", "c d"])),
                                        reward=float(rng.integers(0, 2)), length=int(rng.integers(1, 50)),
                                        finish_reason=str(rng.choice(["eos", "length"])), correct=1.0))
    out = step_metrics_from_rollouts(pa.Table.from_pylist(rows, schema=SCHEMA))["v1"]
    for i, step in enumerate((2, 5, 7)):
        rs = [r for r in rows if r["step"] == step]
        rew = [r["reward"] for r in rs]
        lens = [r["length"] for r in rs]
        want = {
            M.REWARD_MEAN: np.mean(rew), M.REWARD_STD: np.std(rew),
            M.REWARD_FRAC_ZERO_STD: frac_zero_std_groups(rew, [r["group_id"] for r in rs]),
            M.COMPLETIONS_MEAN_LENGTH: np.mean(lens), M.COMPLETIONS_MAX_LENGTH: max(lens),
            M.COMPLETIONS_P95_LENGTH: np.quantile(lens, 0.95, method="lower"),
            M.COMPLETIONS_CLIPPED_RATIO: np.mean([r["finish_reason"] == "length" for r in rs]),
            M.COMPLETIONS_DUPLICATE_FRAC: duplicate_frac([r["completion"] for r in rs], [r["prompt_id"] for r in rs]),
            M.CORRECT_MEAN: 1.0, M.REWARD_KEPT_GROUP_FRAC: 1.0,
        }
        for name, value in want.items():
            steps, vals = out[name]
            assert steps[i] == step and vals[i] == pytest.approx(value), name


def test_length_blowup_with_rising_reward_is_info():
    s = healthy(**{M.COMPLETIONS_MEAN_LENGTH: noisy(100, 400, 5), M.CORRECT_MEAN: noisy(0.2, 0.7)})
    found = [f for f in run_analyzers(ev_of(s)) if f.kind == "length_blowup"]
    assert [f.severity for f in found] == ["info"] and "may be useful reasoning" in found[0].explanation


def test_analyzers_survive_ragged_and_non_finite_series():
    """Random subsets of metrics, 0-40 points, NaN / inf / 1e9 values, negative steps: no error, no warning."""
    import warnings

    rng = np.random.default_rng(1)
    names = [*M.ALL_STEP_METRICS, M.EVAL_AVG_AT_K, "reward/format/mean", "reward/correctness/mean"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(60):
            ms = {}
            for n in rng.choice(names, size=rng.integers(0, len(names)), replace=False):
                size = int(rng.integers(0, 40))
                x = [rng.normal(0, 1, size), np.zeros(size), np.full(size, np.nan),
                     rng.exponential(1, size) * 1e9][rng.integers(0, 4)]
                if size and rng.random() < 0.3:
                    x[rng.integers(0, size)] = rng.choice([np.nan, np.inf, -np.inf])
                ms[str(n)] = (np.sort(rng.choice(np.arange(-5, 100), size=size, replace=False)), x)
            ev = Evidence(metrics={"v": ms, "p": {M.REWARD_MEAN: (np.arange(3), np.full(3, np.nan))}},
                          evals={"v": {"a": [1, 0], "b": [1, 1]}, "p": {"a": [0, 0], "b": [0, 1]}},
                          parents={"v": "p", "p": None})
            for f in run_analyzers(ev):
                assert f.explanation and f.severity in ("info", "warn", "blocking")


def test_kl_blowup_at_the_start_that_decays_is_a_reference_that_is_not_the_starting_policy():
    # unsloth_trl_grpo_kl1e4_all_clipped's shape: KL 10,833 -> 1,678 -> 907 -> 1,291 -> 65 at the first logs (TRL + PEFT
    # with the base model as reference), then 0.04; no late level or upward shift, so before only grad_spike spoke
    kl = np.concatenate([[10832.9, 1678.4, 906.6, 1291.3, 65.0, 14.0, 5.0], noisy(0.05, 0.04, 0.002)[7:]])
    f = failures(run_analyzers(ev_of(healthy(**{M.POLICY_KL: kl}))))["kl_blowup"]
    assert f.severity == "warn" and f.judged == "level"
    assert f.data["head"] == pytest.approx(1291.3)  # median of the first 5 points: 10832.9, 1678.4, 906.6, 1291.3, 65
    assert "first 5 logged steps (median)" in f.explanation and "not the policy's starting weights" in f.explanation
    # a start at 0.5 nats/token (under KL_WARN = 1.0) is no blow-up
    kl2 = np.concatenate([[0.5, 0.5, 0.5, 0.5, 0.5], noisy(0.05, 0.04, 0.002)[5:]])
    assert "kl_blowup" not in failures(run_analyzers(ev_of(healthy(**{M.POLICY_KL: kl2}))))


def test_an_entropy_near_zero_is_a_collapse_with_no_trend_to_judge():
    # verl#1224: one logged step at 0.001 nats/token; before, fewer than 8 points was "insufficient evidence" only
    ev = Evidence(metrics={"v1": {M.POLICY_ENTROPY: (np.array([1049]), np.array([0.001]))}})
    f = failures(run_analyzers(ev))["entropy_collapse"]
    assert f.severity == "warn" and f.judged == "level" and f.steps == [1049, 1049] and f.data["recent"] == 0.001
    assert "at or below 0.01" in f.explanation
    # 0.02 on a short log is no collapse (only the insufficient-evidence note); a long flat log at 0.004 is one
    short = Evidence(metrics={"v1": {M.POLICY_ENTROPY: (np.array([1, 2]), np.array([0.02, 0.02]))}})
    assert [(x.kind, x.severity) for x in run_analyzers(short) if x.kind == "entropy_collapse"] == [
        ("entropy_collapse", "info")]
    flat = noisy(0.004, 0.004, 0.0002)
    g = failures(run_analyzers(ev_of(healthy(**{M.POLICY_ENTROPY: flat}))))["entropy_collapse"]
    assert g.judged == "level" and g.data["recent"] == pytest.approx(0.004, abs=0.001)
    # exactly 0 while the group's samples scored apart (reward_std 21.8) is an entropy never computed: open-r1#704
    ph = Evidence(metrics={"v1": {M.POLICY_ENTROPY: (np.array([1]), np.array([0.0])),
                                  M.REWARD_STD: (np.array([1]), np.array([21.810942]))}})
    assert "entropy_collapse" not in failures(run_analyzers(ph))
    same = Evidence(metrics={"v1": {M.POLICY_ENTROPY: (np.array([1]), np.array([0.0])),
                                    M.REWARD_STD: (np.array([1]), np.array([0.0]))}})
    assert failures(run_analyzers(same))["entropy_collapse"].judged == "level"  # no spread: deterministic indeed


def test_a_kl_above_1_at_the_start_of_a_paste_from_mid_run_is_no_start_finding():
    # a new user's probe: verl steps 800-860 with KL 1.3 decaying to 0.3; the log does not start with its run
    steps = np.arange(800, 861)
    kl = np.linspace(1.3, 0.3, len(steps))
    ev = Evidence(metrics={"v1": {M.POLICY_KL: (steps, kl)}})
    assert "kl_blowup" not in failures(run_analyzers(ev))
    ev0 = Evidence(metrics={"v1": {M.POLICY_KL: (steps - 800, kl)}})  # the same numbers from step 0: it is one
    assert failures(run_analyzers(ev0))["kl_blowup"].data["head"] == pytest.approx(1.3 - 2 / 60)  # median of 5
