"""Review 17: hostile run folders given to ``import`` / ``diagnose`` (Z-R17a gzip folder, Z-R17b parquet)."""

from __future__ import annotations

import gzip
import time
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evotrainer.harness import ingest as I
from evotrainer.harness import ingest_formats as F
from evotrainer.harness.importer import import_run, read_lines
from evotrainer.harness.ingest import IngestError, IngestWarning, ingest, parse_text_log


def _gz_folder(folder: Path, n: int, payload: bytes) -> list[Path]:
    folder.mkdir()
    blob = gzip.compress(payload, 9)
    paths = []
    for i in range(n):
        p = folder / f"r{i:02d}.log.gz"
        p.write_bytes(blob)
        paths.append(p)
    return paths


def test_import_decompressed_budget_default_is_named():
    assert F.MAX_IMPORT_DECOMPRESSED_BYTES == F.MAX_GZIP_BYTES == 256 << 20
    assert F.ReadBudget().max_bytes == F.MAX_IMPORT_DECOMPRESSED_BYTES
    with pytest.raises(ValueError, match="max_bytes=0: give a positive whole number"):
        F.ReadBudget(0)


def test_a_folder_of_small_gz_bombs_costs_one_bomb(tmp_path):
    """Z-R17a: 30 .log.gz of 16 KB, each 16 MiB of newlines: each was under GZIP_FREE_BYTES, read whatever its ratio;
    the folder took over 90 s. The free allowance is one per folder read now: the second file is refused, named."""
    files = _gz_folder(tmp_path / "run", 3, b"step:1 - loss:0.5\n" + b"\n" * ((16 << 20) - 100))
    t = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IngestWarning)
        ev = ingest(tmp_path / "run")
    took = time.perf_counter() - t
    notes = [str(w.message) for w in caught if issubclass(w.category, IngestWarning)]
    assert ev.series("run", "loss/total")[1].tolist() == [0.5]  # the first file is read
    assert [n.split(": ")[0] for n in notes] == [str(files[1]), str(files[2])]
    assert "GZIP_FREE_BYTES" in notes[0] and "MAX_IMPORT_DECOMPRESSED_BYTES" in notes[0]
    assert took < 10, took


def test_read_budget_total_refuses_the_gz_past_it(tmp_path):
    """Within their ratio, .gz files together stop at the budget: the one past it is refused, named with the cap."""
    a, b = _gz_folder(tmp_path / "run", 2, b"x" * 30_000 + b"\n")
    budget = F.ReadBudget(40_000)
    assert len(F.read_gzip_text(a, budget=budget)) == 30_001
    assert len(F.read_gzip_text(a, budget=budget)) == 30_001  # the same file again is not charged twice
    with pytest.raises(F.BudgetSpent, match=r"r01\.log\.gz: not read: .*to 40,000 bytes.*at most 40,000"):
        F.read_gzip_text(b, budget=budget)
    assert budget.used == 40_000


def test_import_of_a_gz_bomb_folder_skips_the_rest_and_notes_it(tmp_path):
    _gz_folder(tmp_path / "run", 4, b"step:1 - loss:0.5\n" + b"\n" * ((16 << 20) - 100))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IngestWarning)
        s = import_run(tmp_path / "run", tmp_path / "out")
    assert s.n_steps == 1 and s.n_log_lines == 1
    assert sum("not read" in n for n in s.notes) == 3


def test_blank_lines_cost_no_python_loop():
    """16 MiB of newlines took 8.7 s through the log readers (a list of 16 M lines, regexes on each)."""
    text = "step:3 - loss:0.25\n" + "\n" * (16 << 20) + "  \n\t\n"
    t = time.perf_counter()
    records, reader = parse_text_log(text)
    assert records == {3: {"loss": 0.25}} and reader.startswith("verl")
    assert parse_text_log("\n" * (16 << 20)) == ({}, "")
    assert time.perf_counter() - t < 3


def test_read_lines_drops_blank_lines_and_stops_at_max_lines(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("a\n\n\n  \nb\r\nc\rd\n" + "\n" * (8 << 20) + "e\n")
    assert read_lines(log) == ["a", "b", "c", "d", "e"]
    assert read_lines(log, max_lines=2) == ["a", "b"]


def test_line_readers_skip_lines_without_their_words():
    """The verl and AReaL readers look only at lines holding their words; what they read is unchanged."""
    text = "noise\n" * 1000 + "\x1b[32mstep:2 - a:1 - b:2\x1b[0m\nTrain step 1/10 done.\n│ x/y │ 0.5 │\n"
    assert parse_text_log(text)[0] == {2: {"a": 1.0, "b": 2.0}}
    assert F.parse_areal_log(text) == {1: {"x/y": 0.5}}
    assert F.parse_table_log("noise\nStep  loss\n\n1  0.5\n") == {1: {"loss": 0.5}}


def test_a_lone_bomb_past_the_ratio_is_refused_as_before(tmp_path):
    (p,) = _gz_folder(tmp_path / "run", 1, b"\n" * (20 << 20))
    with pytest.raises(IngestError, match="over 100 times its size"):
        ingest(p)


def _dict_parquet(path: Path, n: int, width: int) -> None:
    """``n`` rows whose prompt and completion are one dictionary-encoded string of ``width`` characters."""
    one = pa.DictionaryArray.from_arrays(pa.array([0] * n, type=pa.int32()), pa.array(["x" * width]))
    pq.write_table(pa.table({"step": pa.array([0] * n, type=pa.int64()), "prompt": one, "completion": one}), path,
                   compression="zstd")


def test_parquet_decoded_text_is_capped_by_its_ratio(tmp_path):
    """Z-R17b: a 1.2 MB parquet of 5 M rows of one dictionary-encoded 2 KB string decoded 200,000 rows (800 MB of
    text, under the 1 GiB cap): 10.7 s / 2.56 GB. Its text is capped at 100x its size past 64 MiB now."""
    assert (I.MAX_PARQUET_RATIO, I.PARQUET_FREE_BYTES, I.MAX_ROLLOUT_ROWS) == (100, 64 << 20, 200_000)
    run = tmp_path / "run"
    run.mkdir()
    f = run / "completions.parquet"
    _dict_parquet(f, 40_000, 2048)  # 160 MB of text, ~50 KB on disk
    assert f.stat().st_size * I.MAX_PARQUET_RATIO < I.PARQUET_FREE_BYTES
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IngestWarning)
        ev = ingest(run)
    per_row = 2 * 2048 + 8 * 3  # the two strings, and 8 bytes counted for each of the 3 columns
    n = ev.rollouts.num_rows
    assert n == I.PARQUET_FREE_BYTES // per_row == 16_288
    notes = [str(w.message) for w in caught if issubclass(w.category, IngestWarning)]
    assert any(f"read the first {n:,} rollout rows of 40,000" in m and "MAX_PARQUET_RATIO" in m for m in notes), notes
