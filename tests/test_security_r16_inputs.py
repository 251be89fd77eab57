"""Review 16 (issue 22, hardening): hostile inputs under the byte caps that still cost time, memory or output.

* V-R16: ``compare --baseline``: a compare.json under 16 MiB of millions of tiny values (each one wrong: a validation
  error each, 64.9 s / 7.32 GB), runs of millions of problems or outcomes, and 16 MiB strings echoed in the error.
"""

from __future__ import annotations

import json
import time

import pytest
from test_compare import TINY

from evotrainer.agents import compare as C
from evotrainer.config import RunConfig


@pytest.fixture
def cfg():
    return RunConfig.model_validate(TINY)


def _baseline(tmp_path, cfg, runs, **comparable):
    f = tmp_path / "base.json"
    f.write_text(json.dumps({"runs": runs, "comparable": {**C._comparable(cfg), **comparable}}))
    return f


def test_a_baseline_of_millions_of_values_is_refused_before_it_is_parsed(tmp_path, cfg):
    """V-R16: 16 MiB of ``1,`` as runs was parsed into 5.6 million runs and validated into as many errors (64.9 s,
    7.32 GB, on the loaded review machine). The commas are counted first (MAX_BASELINE_VALUES)."""
    f = _baseline(tmp_path, cfg, [1] * (C.MAX_BASELINE_VALUES + 10))
    assert f.stat().st_size < C.BASELINE_MAX_BYTES
    t = time.monotonic()
    with pytest.raises(C.CompareError) as err:
        C.load_baseline(f, cfg)
    assert time.monotonic() - t < 5
    assert str(err.value) == (f"--baseline {f}: cannot be read as compare.json (more than 2097152 JSON values "
                              "(commas), more than a compare.json EvoTrainer writes in 16 MiB)")


@pytest.mark.parametrize("runs, where, what", [
    ([{}] * 1001, "runs", "1001 stored runs, more than the 1000 (modes x seeds) a comparison stores"),
    ([{"mode": "static", "seed": 0, "test": {f"p{i}": [1.0] for i in range(7)}}], "runs[0]['test']",
     "7 problems, more than the 6 of recipe.data.n_test"),
    ([{"mode": "static", "seed": 0, "no_rl_test": {"p": [0.0] * 1025}}], "runs[0]['no_rl_test']['p']",
     "1025 outcomes, more than the 1024 samples (test k) a problem can have"),
    ([{"mode": "static", "seed": 0, "compute": {f"c{i}": 1 for i in range(65)}}], "runs[0]['compute']",
     "65 counters, more than 64"),
])
def test_a_baseline_past_a_count_cap_is_refused_naming_the_field_and_the_cap(tmp_path, cfg, runs, where, what):
    """V-R16: runs, problems, outcomes and compute counters were unbounded (a million problems of one run was
    validated whole, then bootstrapped after the runs trained). Each count is checked before validation."""
    f = _baseline(tmp_path, cfg, runs)
    with pytest.raises(C.CompareError) as err:
        C.load_baseline(f, cfg)
    assert str(err.value) == (f"--baseline {f}: {where}: {what}; not a compare.json EvoTrainer wrote: run those "
                              "modes again instead")


def test_a_bad_baseline_run_gives_one_error_per_outcome_list_and_stops_at_the_first_bad_run(tmp_path, cfg):
    """V-R16: every bad value of every run became a validation error (built whole before the first was shown). An
    outcome list stops at its first bad value (fail_fast) and runs are validated one at a time."""
    runs = [{"mode": "static", "seed": 0, "test": {"p": [1.0] * 2 + ["a"] * 1000}},
            {"mode": "nope", "seed": "x", "test": {"q": ["a"] * 1000}}]
    f = _baseline(tmp_path, cfg, runs)
    with pytest.raises(C.CompareError) as err:
        C.load_baseline(f, cfg)
    assert str(err.value) == (f"--baseline {f}: runs[0]['test']['p'][2]: Input should be a valid number (1 "
                              "problem(s) in runs[0]); not a compare.json EvoTrainer wrote: run those modes again "
                              "instead")


def test_values_from_a_baseline_are_echoed_cut_to_max_echo_chars(tmp_path, cfg):
    """V-R16: a 16 MiB config name or problem id came back whole in the error (a 16.7 MB error line)."""
    f = _baseline(tmp_path, cfg, [], config="x" * 1_000_000)
    with pytest.raises(C.CompareError) as err:
        C.load_baseline(f, cfg)
    msg = str(err.value)
    assert len(msg) < 500 and f"made on another config ('{'x' * 199}... [999802 more chars], here 'tiny')" in msg
    f = _baseline(tmp_path, cfg, [{"mode": "static", "seed": 0, "test": {"k" * 1_000_000: ["a"]}}])
    with pytest.raises(C.CompareError) as err:
        C.load_baseline(f, cfg)
    msg = str(err.value)
    assert len(msg) < 500 and f"runs[0]['test']['{'k' * 199}... [999802 more chars]][0]: Input should be a valid " \
                              "number (1 problem(s) in runs[0])" in msg
