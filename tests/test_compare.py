"""`evotrainer compare` (issue 16, "The benchmark"): the modes at equal compute, the test split, paired CIs
pooled over seeds, resumable."""

from __future__ import annotations

import json

import pytest

from evotrainer.agents.compare import NO_RL, compare, equal_budget, finished_runs, run_config
from evotrainer.config import RunConfig
from evotrainer.harness.stats import pooled_paired_bootstrap
from evotrainer.workspace import Workspace


def test_pooled_paired_bootstrap_by_hand():
    # seed 0: p1 a 0/2 -> b 2/2 (d = +1), p2 1 -> 1 (d = 0); p3 only in a: not paired, left out
    # seed 1: p1 a 1/2 -> b 2/2 (d = +0.5)
    g0 = ({"p1": [0, 0], "p2": [1, 1], "p3": [0, 0]}, {"p1": [1, 1], "p2": [1, 1]})
    g1 = ({"p1": [0, 1]}, {"p1": [1, 1]})
    c = pooled_paired_bootstrap([g0, g1], n_resamples=20_000, seed=0)
    # pooled gain (1 + 0 + 0.5) / 3 = 0.5; a scores (0 + 1 + 0.5) / 3 = 0.5, b scores 1
    assert (c.n_pairs, c.n_groups) == (3, 2) and c.gain == pytest.approx(0.5)
    assert (c.score_a, c.score_b) == (pytest.approx(0.5), pytest.approx(1.0))
    # stratified: seed 1's single pair always adds 0.5; seed 0 draws 2 of [1, 0]: sums 0 / 1 / 2 with
    # probabilities 1/4, 1/2, 1/4 -> pooled means 0.5/3, 1.5/3, 2.5/3; the 2.5% / 97.5% quantiles are 1/6 and 5/6
    assert c.ci == (pytest.approx(1 / 6), pytest.approx(5 / 6))
    # one constant difference everywhere: the CI collapses onto it
    same = pooled_paired_bootstrap([({"p1": [0], "p2": [0]}, {"p1": [1], "p2": [1]})] * 3)
    assert same.gain == 1.0 and same.ci == (1.0, 1.0)
    with pytest.raises(ValueError, match="no common problem"):
        pooled_paired_bootstrap([({"p1": [1]}, {"p2": [1]})])


TINY = {
    "brain": "heuristic", "backend": "local", "seed": 0,
    "budget": {"max_versions": 3, "steps_per_version": 2, "wall_clock_minutes": 10, "branches_per_round": 1,
               "max_tokens": 320},
    "recipe": {"name": "tiny", "seed": 0, "model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 2,
               "rollout_batch_size": 2, "micro_train_batch_size": 4, "generate_max_len": 8,
               "actor_learning_rate": 1e-4,
               "data": {"task": "arithmetic", "level": 1, "n_train": 16, "n_heldout": 8, "n_test": 6, "seed": 0},
               "eval": {"k": 2, "max_problems": 8, "temperature": 0.7}},
}
MODES = ["evotrainer", "static", "recipe-search", "greedy", "pbt"]


def test_equal_budget_is_derived_from_the_static_training_budget():
    cfg = RunConfig.model_validate({**TINY, "budget": {**TINY["budget"], "max_tokens": None}})
    # 3 versions x 2 steps x 2 prompts x 2 samples x 8 tokens = 192 generated tokens
    assert equal_budget(cfg).budget.max_tokens == 192
    rc = run_config(cfg, "pbt", 2, __import__("pathlib").Path("/x"))
    assert (rc.mode, rc.seed, rc.recipe.seed, rc.run_dir) == ("pbt", 2, 2, "/x/runs/pbt-s2")
    # the token budget binds, never the machine's load: the wall clock is lifted for every mode (it was the
    # config's 28 minutes, and two loop runs of a loaded comparison stopped after their root)
    static = run_config(cfg, "static", 0, __import__("pathlib").Path("/x"))
    assert rc.budget.wall_clock_minutes == static.budget.wall_clock_minutes == 7 * 24 * 60
    assert cfg.budget.wall_clock_minutes < 7 * 24 * 60


def test_compare_tiny_end_to_end_table_pairs_and_resume(tmp_path):
    cfg = RunConfig.model_validate(TINY)
    out = tmp_path / "cmp"
    table = compare(cfg, MODES, [0, 1], out, parallel=2)
    assert {p.name for p in out.iterdir()} >= {"compare.json", "compare.md", "compare.png", "runs"}
    assert json.loads((out / "compare.json").read_text()) == table
    rows = {r["mode"]: r for r in table["rows"]}
    assert list(rows) == [*MODES, NO_RL] and table["k"] == 2 and table["n_test"] == 6
    for m in MODES:
        r = rows[m]
        assert set(r["per_seed"]) == {"0", "1"} and r["test_avg_at_k"] == pytest.approx(
            (r["per_seed"]["0"] + r["per_seed"]["1"]) / 2)
        assert r["train_tokens"] > 0 and r["eval_tokens"] > 0 and r["cpu_s"] > 0 and r["wall_s"] > 0
    # every two rows paired: C(6, 2) = 15 pairs, each on 2 seeds x 6 test problems = 12 pairs
    assert len(table["pairs"]) == 15 and {(p["n_pairs"], p["n_seeds"]) for p in table["pairs"]} == {(12, 2)}
    # the CI is the pooled paired bootstrap of the runs' stored test outcomes (same problems, same sample seeds)
    pair = next(p for p in table["pairs"] if (p["a"], p["b"]) == ("evotrainer", "static"))
    groups = []
    for s in (0, 1):
        mats = {}
        for m in ("evotrainer", "static"):
            ws = Workspace.open(out / "runs" / f"{m}-s{s}")
            vid = ws.lineage.kv_get("loop/final")["version"]
            mats[m] = ws.lineage.eval_matrix(vid, "test")
            ws.close()
        assert sorted(mats["evotrainer"]) == sorted(mats["static"])  # the same 6 test problems
        groups.append((mats["static"], mats["evotrainer"]))
    c = pooled_paired_bootstrap(groups)
    assert pair["diff"] == pytest.approx(c.gain) and pair["ci"] == pytest.approx(list(c.ci))
    # each evotrainer run kept its own seeded skills memory (no run learns from another seed's outcomes)
    assert all((out / "runs" / f"evotrainer-s{s}" / "skills").is_dir() for s in (0, 1))
    md = (out / "compare.md").read_text()
    assert "| evotrainer | static |" in md and f"| {NO_RL} |" in md
    # resumable: a second call finds every (mode, seed) run finished and trains nothing
    seen = []
    again = compare(cfg, MODES, [0, 1], out, on_progress=lambda name, done, total: seen.append((done, total)))
    assert seen == [(10, 10)] and again["pairs"] == table["pairs"]
    # the table covers every finished run in the folder, whichever modes and seeds this call names
    assert compare(cfg, ["static"], [0], out)["pairs"] == table["pairs"]
    # a mode run on fewer seeds is paired with the others on its seeds only
    import shutil

    shutil.copytree(out, tmp_path / "cmp2", ignore=shutil.ignore_patterns("pbt-s1"))
    part = compare(cfg, ["static"], [0], tmp_path / "cmp2")
    prow = next(r for r in part["rows"] if r["mode"] == "pbt")
    assert prow["per_seed"] == {"0": rows["pbt"]["per_seed"]["0"]} and list(prow["final_versions"]) == ["0"]
    assert {(p["n_pairs"], p["n_seeds"]) for p in part["pairs"] if "pbt" in (p["a"], p["b"])} == {(6, 1)}
    assert [p for p in part["pairs"] if "pbt" not in (p["a"], p["b"])] == [
        p for p in table["pairs"] if "pbt" not in (p["a"], p["b"])]
    # compare.json keeps every run's outcomes: a later comparison that reruns only evotrainer pairs it with the
    # stored runs of the other modes (--baseline) and gets the same table, each borrowed run listed
    assert [(r["mode"], r["seed"]) for r in table["runs"]] == [(m, s) for m in MODES for s in (0, 1)]
    assert all(r["test"] and r["no_rl_test"] and r["compute"] for r in table["runs"])
    shutil.copytree(out / "runs", tmp_path / "cmp3" / "runs", ignore=shutil.ignore_patterns(
        *(f"{m}-s*" for m in MODES if m != "evotrainer")))
    reused = compare(cfg, ["evotrainer"], [0, 1], tmp_path / "cmp3", baseline=out / "compare.json")
    assert reused["pairs"] == table["pairs"] and reused["rows"] == table["rows"]
    assert reused["from_baseline"] == [[m, s] for m in sorted(MODES) if m != "evotrainer" for s in (0, 1)]
    assert "not run again; sound while those modes' code is unchanged): greedy s0, greedy s1, pbt s0" in (
        tmp_path / "cmp3" / "compare.md").read_text()


def test_static_trains_segments_until_the_token_budget_is_spent(tmp_path):
    from evotrainer.agents.runner import run_loop

    # the random model never stops before generate_max_len: a step generates 2 prompts x 2 samples x 8 = 32
    # tokens, a 2-step segment 64. Budget 100: after segment 1, 64 < 100 -> segment 2 -> 128 >= 100: stop at
    # 4 steps. The no-RL dev row (8 problems x 2 x 8 = 128 tokens) is outside the budget; the root's dev
    # evaluation (128) and the final test evaluations (2 x 6 x 2 x 8 = 192) are counted apart.
    cfg = RunConfig.model_validate({**TINY, "mode": "static", "budget": {**TINY["budget"], "max_tokens": 100}})
    s = run_loop(cfg, tmp_path / "static", "heuristic", "static", resume=False)
    ws = Workspace.open(tmp_path / "static")
    try:
        assert ws.lineage.last_step("v0") == 3
    finally:
        ws.close()
    c = s["compute"]
    assert (c["train_tokens"], c["eval_tokens"], c["no_rl_tokens"], c["test_tokens"]) == (128, 128, 128, 192)


def test_pbt_explore_follows_ray_tune_rules():
    import random

    from evotrainer.agents.search import PBT_FACTORS, SEARCH_SPACE, pbt_explore
    from evotrainer.recipe import Recipe, get_path

    base = Recipe(actor_learning_rate=1e-5, temperature=1.0, eps_clip_high=0.3, init_kl_coef=1e-3,
                  generate_max_len=64)
    seen = {"perturbed": 0, "resampled": 0}
    for i in range(200):
        new = pbt_explore(random.Random(i), base)
        assert set(new) == set(SEARCH_SPACE)
        for name, spec in SEARCH_SPACE.items():
            old = get_path(base, name)
            if spec[0] == "mult":  # 64 x 0.8 = 51.2 -> 51, 64 x 1.2 = 76.8 -> 77, or 64 x {1, 2, 4}
                assert new[name] in (51, 77, 64, 128, 256)
                continue
            assert spec[1] <= new[name] <= spec[2]
            perturbed = any(new[name] == pytest.approx(min(max(old * f, spec[1]), spec[2])) for f in PBT_FACTORS)
            seen["perturbed" if perturbed else "resampled"] += 1
    # resample_probability 0.25 over 200 draws x 4 float fields = 800: about 200 resampled (binomial sd ~12)
    assert 140 < seen["resampled"] < 260 and seen["perturbed"] + seen["resampled"] == 800


def test_a_baseline_of_another_config_or_without_runs_is_refused(tmp_path):
    from evotrainer.agents.compare import CompareError, load_baseline

    cfg = RunConfig.model_validate(TINY)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"config": "tiny", "pairs": []}))  # a compare.json from before runs were kept
    with pytest.raises(CompareError) as err:
        load_baseline(old, cfg)
    assert str(err.value) == (f"--baseline {old}: holds no stored runs (a compare.json written before runs were "
                              "kept, or another file); run those modes again instead")
    other = RunConfig.model_validate({**TINY, "recipe": {**TINY["recipe"], "data": {**TINY["recipe"]["data"],
                                                                                    "n_test": 7}}})
    from evotrainer.agents.compare import _comparable

    old.write_text(json.dumps({"runs": [], "comparable": _comparable(other)}))
    with pytest.raises(CompareError, match=r"made on another data \(.*'n_test': 7.*here .*'n_test': 6.*\); its runs "
                                           r"do not pair with these$"):
        load_baseline(old, cfg)
    assert load_baseline(old, other)["runs"] == []
    old.write_text("{not json")
    with pytest.raises(CompareError, match="cannot be read as compare.json"):
        load_baseline(old, cfg)


@pytest.mark.parametrize("runs, where, msg", [
    ([{"mode": "static", "seed": 0, "test": {"p1": [1.0, "a"]}}], "runs[0]['test']['p1'][1]",
     "Input should be a valid number"),
    ([{"mode": "static", "seed": float("inf")}], "runs[0]['seed']", "Input should be a valid integer"),
    ([{"mode": "nope", "seed": 0}], "runs[0]['mode']", "Input should be 'evotrainer', 'static', 'recipe-search', "
                                                       "'greedy' or 'pbt'"),
    ([{"mode": "static"}], "runs[0]['seed']", "Field required"),
    ([[1, 2]], "runs[0]", "Input should be a valid dictionary or instance of _StoredRun"),
    ([{"mode": "static", "seed": 0, "compute": {"cpu_s": float("nan")}}], "runs[0]['compute']['cpu_s']",
     "Input should be a finite number"),
])
def test_a_baseline_whose_runs_are_of_another_shape_is_refused_before_anything_runs(tmp_path, runs, where, msg):
    """Review 13, B-R13: load_baseline checked only that runs was a list, and build_table, which runs after every
    requested run has trained, ended the command in a raw TypeError / KeyError / OverflowError / RecursionError.
    Each stored run is now checked at load, naming the place, the problem and the fix."""
    from evotrainer.agents.compare import CompareError, _comparable, load_baseline

    cfg = RunConfig.model_validate(TINY)
    f = tmp_path / "base.json"
    f.write_text(json.dumps({"runs": runs, "comparable": _comparable(cfg)}))
    with pytest.raises(CompareError) as err:
        load_baseline(f, cfg)
    assert str(err.value).startswith(f"--baseline {f}: {where}: {msg} (1 problem(s) in runs[0]); not a compare.json "
                                     "EvoTrainer wrote: run those modes again instead"), str(err.value)
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CompareError, match=r"cannot be read as compare.json \(JSON nested deeper than Python reads\)"):
        load_baseline(f, cfg)


def test_a_baseline_that_is_no_regular_file_or_too_large_is_refused_at_once(tmp_path, monkeypatch):
    """Review 15 (V-R15): --baseline read its file whole with no check: a FIFO blocked the command forever, /dev/zero
    grew to 13.8 GB before it was killed, a 40 MB file took 822 MB. It is now read as a regular file, without blocking,
    up to BASELINE_MAX_BYTES (16 MiB; lowered here)."""
    import os

    from evotrainer.agents import compare as C

    cfg = RunConfig.model_validate(TINY)
    fifo = tmp_path / "base.fifo"
    os.mkfifo(fifo)
    with pytest.raises(C.CompareError, match=r"cannot be read as compare.json \(.*base.fifo: not a regular file"):
        C.load_baseline(fifo, cfg)
    with pytest.raises(C.CompareError, match="not a regular file"):
        C.load_baseline("/dev/zero", cfg)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"runs": [], "pad": "x" * 3_000_000}))
    monkeypatch.setattr(C, "BASELINE_MAX_BYTES", 2 << 20)
    with pytest.raises(C.CompareError, match="big.json: 2 MiB, larger than the 2 MiB a run file may have; give the "
                                             "compare.json a comparison wrote"):
        C.load_baseline(big, cfg)


def test_finished_runs_take_only_ascii_digit_seeds_of_at_most_nine_digits(tmp_path):
    """Review 20 C2-R20: a finished run folder named ``static-s²`` (``'²'.isdigit()`` is True, ``int('²')`` fails)
    ended ``compare`` with a bare ValueError; such folders (and over-long seeds) are now ignored."""
    for name in ("static-s0", "static-s\u00b2", "static-s\u0663", "static-s1234567890", "static-s123456789"):
        ws = Workspace(tmp_path / "runs" / name)
        ws.lineage.kv_set("loop/finished", True)
        ws.close()
    assert finished_runs(tmp_path) == [("static", 0), ("static", 123456789)]
