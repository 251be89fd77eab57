"""Findings of a run whose values turn non-finite, judged on the steps before the blow-up
(``registry._judge_before_blowup``): the wreck after a NaN is one event, not four failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evotrainer import metrics as M
from evotrainer.harness.analyzers import run_analyzers
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.ingest import ingest

CASE = Path(__file__).parent / "data" / "cases" / "nan_after_kl_overflow"
N = 80
STEPS = np.arange(1, N + 1)


def ev_of(series: dict[str, np.ndarray]) -> Evidence:
    return Evidence(metrics={"v1": {k: (STEPS.copy(), np.asarray(x, float)) for k, x in series.items()}})


def run(series: dict[str, np.ndarray]) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in run_analyzers(ev_of(series)):
        out.setdefault(f.kind, []).append(f)
    return out


def wrecked(n_good: int, **good: np.ndarray) -> dict[str, np.ndarray]:
    """Steps 1..n_good healthy (flat reward 0.3 -> 0.5, entropy 0.5, length 300, clipped 1%), then the wreck of
    corrupt weights: losses, KL and grad norm NaN, entropy 0.05, every completion at the 1,024-token cap, reward 0."""
    rng = np.random.default_rng(0)
    s = {M.LOSS_POLICY: rng.normal(0.01, 0.005, N), M.POLICY_KL: np.linspace(0.002, 0.04, N),
         M.POLICY_GRAD_NORM: rng.normal(0.3, 0.03, N), M.POLICY_ENTROPY: rng.normal(0.5, 0.01, N),
         M.REWARD_MEAN: np.linspace(0.3, 0.5, N) + rng.normal(0, 0.01, N),
         M.COMPLETIONS_MEAN_LENGTH: rng.normal(300, 5, N), M.COMPLETIONS_CLIPPED_RATIO: np.full(N, 0.01)}
    for k, x in good.items():
        s[k] = np.asarray(x, float)
    for k in (M.LOSS_POLICY, M.POLICY_KL, M.POLICY_GRAD_NORM):
        s[k][n_good:] = np.nan
    s[M.POLICY_ENTROPY][n_good:] = 0.05
    s[M.REWARD_MEAN][n_good:] = 0.0
    s[M.COMPLETIONS_MEAN_LENGTH][n_good:] = 1024.0
    s[M.COMPLETIONS_CLIPPED_RATIO][n_good:] = 1.0
    return s


def test_the_wreck_after_a_nan_is_info_on_the_case():
    """The case's log (verl, KL overflow then NaN from step 60): before, truncation (blocking), entropy collapse,
    length blow-up and plateau (warn) stood beside the NaN, each read off steps 60-79 of corrupt weights."""
    found = run_analyzers(ingest(CASE))
    fail = {f.kind: f for f in found if f.is_failure}
    assert set(fail) == {"nan_blowup"} and fail["nan_blowup"].steps == [60, 79]
    demoted = {f.kind: f for f in found if f.data.get("after_blowup") == 60}
    # zero variance too: reward 0 from step 60 in a log with no spread statistic (every reward 0 there)
    assert set(demoted) == {"truncation", "entropy_collapse", "length_blowup", "plateau", "zero_variance_groups"}
    assert all(f.severity == "info" and "a consequence of the blow-up" in f.explanation for f in demoted.values())
    # the numbers stay the whole run's: the clipped ratio went to 1 at the cap
    assert demoted["truncation"].data["after_blowup"] == 60 and "100%" in demoted["truncation"].explanation


def test_a_failure_before_the_blowup_stands_with_its_own_numbers():
    """Truncation from step 1 (clipped ratio 0.6 on steps 1-40, then the wreck at 1.0): it stands, judged on
    steps 1-40 (median 60%, not the wreck's 100%)."""
    f = run(wrecked(40, **{M.COMPLETIONS_CLIPPED_RATIO: np.full(N, 0.6)}))
    assert [x.severity for x in f["nan_blowup"]] == ["blocking"] and f["nan_blowup"][0].data["first_step"] == 41
    t = [x for x in f["truncation"] if x.is_failure]
    assert len(t) == 1 and t[0].severity == "blocking" and t[0].data["before_blowup"] == 41
    assert t[0].steps[-1] == 40 and "60%" in t[0].explanation and "100%" not in t[0].explanation
    assert "Judged on the steps before 41" in t[0].explanation
    # the wreck's own artefacts are info
    assert all(x.severity == "info" for k in ("entropy_collapse", "length_blowup") for x in f.get(k, []))


def test_a_failure_the_wreck_hides_is_added():
    """Completions shrink 300 -> 60 tokens over steps 1-50 (length collapse); the wreck from step 51 sits at the
    1,024 cap, so the whole run's start against its end reads a blow-up and no collapse. Judged before the NaN,
    the collapse is there and is added; the blow-up is the wreck's."""
    n_good = 50
    length = np.full(N, 300.0)
    length[:n_good] = np.linspace(300, 60, n_good)
    f = run(wrecked(n_good, **{M.COMPLETIONS_MEAN_LENGTH: length}))
    lc = [x for x in f["length_collapse"] if x.is_failure]
    assert len(lc) == 1 and lc[0].data["before_blowup"] == 51 and "hide it" in lc[0].explanation
    assert lc[0].steps[-1] <= 50
    assert all(x.severity == "info" for x in f.get("length_blowup", []))


def test_no_rejudging_without_steps_before_or_for_an_isolated_nan():
    """One logged step before the NaN (under BLOWUP_MIN_BEFORE = 2) leaves too little to judge on; one NaN that
    recovered (warn) is no wreck: the other findings stand as the whole run gives them."""
    s = wrecked(1)
    f = run(s)
    assert f["nan_blowup"][0].severity == "blocking"
    assert any(x.severity == "blocking" for x in f["truncation"]) and "after_blowup" not in f["truncation"][0].data
    s = wrecked(80, **{M.COMPLETIONS_CLIPPED_RATIO: np.full(N, 0.6)})
    s[M.LOSS_POLICY][30] = np.nan
    f = run(s)
    assert f["nan_blowup"][0].severity == "warn"
    t = [x for x in f["truncation"] if x.is_failure]
    assert len(t) == 1 and "before_blowup" not in t[0].data and t[0].steps == [1, 80]
