"""Review 16 (issue 22, hardening): hostile inputs under the byte caps that still cost time, memory or output.

* V-R16: ``compare --baseline``: a compare.json under 16 MiB of millions of tiny values (each one wrong: a validation
  error each, 64.9 s / 7.32 GB), runs of millions of problems or outcomes, and 16 MiB strings echoed in the error.
* Z-R16: a .log.gz of a foreign run folder expanding ~1000x to just under MAX_GZIP_BYTES (254 KB -> 255 MiB: 142 s,
  4.4 GB to parse).
* Y-R16: a recipe / run config / skills / findings file under the 256 KiB YAML cap whose error was every pydantic error
  restated (25,000 unknown keys: 25,000 lines, 12 MB, each listing the allowed fields) or a 200 KB key echoed whole.
"""

from __future__ import annotations

import json
import time

import pytest
from test_compare import TINY

from evotrainer.agents import compare as C
from evotrainer.config import RunConfig, load_run_config
from evotrainer.harness.findings import parse_findings
from evotrainer.recipe import RecipeError, load_recipe
from evotrainer.skills_db.cli import load_skill_file
from evotrainer.skills_db.models import SkillError
from evotrainer.terminal import MAX_ERRORS_SHOWN


@pytest.fixture
def cfg():
    return RunConfig.model_validate(TINY)


def _baseline(tmp_path, cfg, runs, **comparable):
    f = tmp_path / "base.json"
    f.write_text(json.dumps({"runs": runs, "comparable": {**C._comparable(cfg), **comparable}}))
    return f


def _refused_within(f, cfg, seconds: float) -> str:
    """The CompareError text of ``load_baseline(f, cfg)`` on a file under the byte cap, asserting it came within
    ``seconds`` (the counts refuse it before any parse)."""
    assert f.stat().st_size < C.BASELINE_MAX_BYTES
    t = time.monotonic()
    with pytest.raises(C.CompareError) as err:
        C.load_baseline(f, cfg)
    assert time.monotonic() - t < seconds
    return str(err.value)


def test_a_baseline_of_millions_of_values_is_refused_before_it_is_parsed(tmp_path, cfg):
    """V-R16: 16 MiB of ``1,`` as runs was parsed into 5.6 million runs and validated into as many errors (64.9 s,
    7.32 GB, on the loaded review machine). The commas are counted first (MAX_BASELINE_VALUES)."""
    f = _baseline(tmp_path, cfg, [1] * (C.MAX_BASELINE_VALUES + 10))
    assert _refused_within(f, cfg, 5) == (f"--baseline {f}: cannot be read as compare.json (more than 2097152 JSON values "
                              "(commas), more than a compare.json EvoTrainer writes in 16 MiB)")


def test_a_baseline_of_millions_of_nested_lists_is_refused_before_it_is_parsed(tmp_path):
    """Review 17 V-R17: 16 MiB of ``[[[[[[[[]]]]]]]]`` groups held 987 k commas (under the cap) and 7.9 M lists:
    4.49 s, 859 MB. Brackets and colons are counted too."""
    f = tmp_path / "compare.json"
    f.write_bytes(b"[" + b",".join([b"[[[[[[[[]]]]]]]]"] * 300_000) + b"]")
    assert _refused_within(f, None, 1) == (f"--baseline {f}: cannot be read as compare.json (more than 2097152 JSON containers "
                              "and keys ('[', '{', ':'), more than a compare.json EvoTrainer writes in 16 MiB)")


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


RECIPE_FIELDS = "name, seed, model, advantage_estimator"  # how the allowed field names of a recipe begin


def test_a_recipe_of_thousands_of_unknown_keys_lists_twenty_and_the_allowed_names_once(tmp_path):
    """Y-R16: every unknown key was a line listing all the recipe's fields (25,000 keys in 239 KB: 12 MB printed).
    At most MAX_ERRORS_SHOWN lines, the allowed names once per section, the rest counted."""
    f = tmp_path / "r.yaml"
    f.write_text("".join(f"z{i}: 1\n" for i in range(3000)))
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    lines = str(err.value).splitlines()
    assert MAX_ERRORS_SHOWN == 20 and len(lines) == 21 and len(str(err.value)) < 2000
    assert lines[0].startswith(f"recipe.z0: unknown field; allowed: {RECIPE_FIELDS}")
    assert lines[1:20] == [f"recipe.z{i}: unknown field; allowed: as above" for i in range(1, 20)]
    assert lines[20] == "... and 2,980 more errors (fix these and validate again to see them)"


def test_a_run_config_list_of_thousands_of_bad_items_shows_twenty(tmp_path):
    """Y-R16: a list field of 60,000 wrong items printed 60,000 lines (5 MB); a run config's budget of 22,000 unknown
    keys 3.9 MB."""
    f = tmp_path / "c.yaml"
    f.write_text("mode: static\nrecipe:\n  model:\n    lora:\n      target_modules: [" + ",".join(["1"] * 5000) + "]\n")
    with pytest.raises(RecipeError) as err:
        load_run_config(f)
    lines = str(err.value).splitlines()
    assert lines[:2] == ["config.recipe.model.lora.target_modules.0=1: not a string (int); write it as plain text",
                         "config.recipe.model.lora.target_modules.1=1: not a string (int); write it as plain text"]
    assert len(lines) == 21 and lines[20] == "... and 4,980 more errors (fix these and validate again to see them)"
    f.write_text("mode: static\nbudget:\n" + "".join(f"  q{i}: 1\n" for i in range(500)))
    with pytest.raises(RecipeError) as err:
        load_run_config(f)
    lines = str(err.value).splitlines()
    assert lines[0].startswith("config.budget.q0: unknown field; allowed: max_versions, steps_per_version")
    assert lines[1] == "config.budget.q1: unknown field; allowed: as above" and len(lines) == 21


def test_a_long_key_or_id_is_echoed_cut(tmp_path):
    """Y-R16: a 200,000-character key came back whole in the error (200 KB), a skill's 200,000-character id twice
    (400 KB)."""
    f = tmp_path / "r.yaml"
    f.write_text("? " + "k" * 200_000 + "\n: 1\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    assert str(err.value).startswith("recipe." + "k" * 64 + "... [199936 more chars]: unknown field; allowed: "
                                     + RECIPE_FIELDS) and len(str(err.value)) < 1000
    s = tmp_path / "s.yaml"
    s.write_text("id: " + "s" * 200_000 + "\nkind: 12\n")
    with pytest.raises(SkillError) as err:
        load_skill_file(s)
    assert str(err.value).startswith(f"{s}: entry 0 ({'s' * 200}... [199800 more chars]): id: ")
    assert len(str(err.value)) < 1000


def test_findings_errors_are_capped_and_their_values_cut():
    """Y-R16: a finding from analyzer code (sandboxed, hostile) was restated error by error with each value whole."""
    with pytest.raises(ValueError) as err:
        parse_findings([{"kind": "x", "severity": "warn", **{f"e{i}": 1 for i in range(1000)}}], "a")
    parts = str(err.value).split("; ")
    assert len(str(err.value)) < 6000 and parts[-1].startswith("... and ") and parts[-1].endswith(
        " more errors (fix these and validate again to see them)")
    with pytest.raises(ValueError) as err:
        parse_findings([{"kind": "x", "severity": "x" * 100_000}], "a")
    assert "findings[0].severity='" + "x" * 199 + "... (100,002 characters)" in str(err.value)
    assert len(str(err.value)) < 2000


def test_a_gzip_bomb_under_the_decompressed_cap_is_refused_by_its_ratio(tmp_path):
    """Z-R16: a 254 KB .log.gz of newlines decompressed to 255 MiB, under MAX_GZIP_BYTES (256 MiB), and its parse took
    142 s / 4.4 GB. Past GZIP_FREE_BYTES a .gz may expand at most MAX_GZIP_RATIO times its size; the read stops
    there. An ordinary log.gz (6.6x) reads as before."""
    import gzip
    import zlib

    from evotrainer.harness import ingest_formats as F
    from evotrainer.harness.ingest import IngestError, ingest

    run = tmp_path / "run"
    run.mkdir()
    bomb = run / "train.log.gz"
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(bomb, "wb") as out:  # 40 MiB of newlines, about 40 KB
        for _ in range(40):
            out.write(co.compress(b"\n" * (1 << 20)))
        out.write(co.flush())
    size = bomb.stat().st_size
    assert size * F.MAX_GZIP_RATIO < 40 << 20 < F.MAX_GZIP_BYTES and F.GZIP_FREE_BYTES == 16 << 20
    t = time.monotonic()
    with pytest.raises(IngestError) as err:
        ingest(run)
    assert time.monotonic() - t < 10
    assert str(err.value) == (f"{bomb}: {size:,} bytes that decompress to more than {F.GZIP_FREE_BYTES:,} (over 100 "
                              "times its size: a gzip bomb, or a log of little but progress bars); gunzip it yourself "
                              "and pass the .log")
    bomb.write_bytes(gzip.compress(b"".join(f"step:{s} - a:{s * 0.5} - b:{s % 7}\n".encode() for s in range(1, 2001))))
    ev = ingest(run)
    steps, values = ev.metrics[next(iter(ev.metrics))]["a"]
    assert list(steps[:2]) == [1, 2] and list(values[:2]) == [0.5, 1.0] and len(steps) == 2000
