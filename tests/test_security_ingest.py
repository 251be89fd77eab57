"""Security suite, foreign runs (``evotrainer import`` / ``diagnose``): the red team's second probe set (issue 22;
docs/security-probes.md). A foreign run folder is hostile input (a downloaded tarball).

Each probe failed on the code before its fix:

- a link ``zz.log -> <a 0600 host file>`` in a verl folder: ``import`` copied the file's lines into the run's
  ``logs/run.jsonl`` (readable by any MCP client through ``search_logs``) and its ``step:N - k:v`` lines
  became metrics of v0;
- a 4 MiB ``.log.gz`` of zeros decompressed to 4 GiB in memory (``gzip.decompress``: MemoryError under a 3 GiB
  address-space limit, the machine's memory without one);
- a ``trainer_state.json`` nested 200,000 deep, or with ``"step": "NaN"``, ended with a bare ``RecursionError`` /
  ``ValueError`` that named no file.

Every probe asserts the host file it aims at is unchanged (content and mode).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os

import pytest

from evotrainer.harness import ingest_formats as F
from evotrainer.harness.importer import RunImportError, import_run
from evotrainer.harness.ingest import IngestError, ingest
from evotrainer.workspace import Workspace

GOOD = "".join(f"step:{i} - critic/score/mean:{i / 10} - actor/entropy:{1 - i / 20}\n" for i in range(1, 15))
SECRET = "step:1 - secret_metric:4242.5\nAKIA-SECRET-LINE error\n"


@pytest.fixture
def host(tmp_path):
    """A 0600 host file and a host folder that the foreign run's links aim at; unchanged afterwards."""
    h = tmp_path / "host"
    (h / "dir").mkdir(parents=True)
    (h / "secret.txt").write_text(SECRET)
    (h / "secret.txt").chmod(0o600)
    (h / "dir" / "1").write_text("1700000000000 99.5 1\n")  # an MLflow metric line
    before = {p: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode) for p in h.rglob("*") if p.is_file()}
    yield h
    assert {p: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode)
            for p in h.rglob("*") if p.is_file()} == before


def test_links_out_of_a_foreign_folder_are_not_read(tmp_path, host):
    run = tmp_path / "verl"
    run.mkdir()
    (run / "train.log").write_text(GOOD)
    (run / "zz.log").symlink_to(host / "secret.txt")
    (run / "inside.log").symlink_to(run / "train.log")  # a link that stays inside is fine
    (run / "metrics").symlink_to(host / "dir")  # would read as an MLflow run folder
    out = import_run(run, tmp_path / "imported")
    blob = b"".join(p.read_bytes() for p in (tmp_path / "imported").rglob("*") if p.is_file())
    assert b"AKIA-SECRET-LINE" not in blob and b"4242.5" not in blob
    assert (out.n_steps, out.n_log_lines) == (14, 28)  # train.log twice (itself and the inside link), nothing else
    with Workspace.open(tmp_path / "imported") as ws:
        assert sorted(ws.lineage.metric_names(out.version_id)) == ["policy/entropy", "reward/mean"]
    ev = ingest(run)
    assert sorted(ev.metrics["verl"]) == ["policy/entropy", "reward/mean"]
    assert [p.name for p in F.files_under(run)] == ["inside.log", "train.log"]


def test_gzip_bomb_is_refused_without_decompressing_it(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "MAX_GZIP_BYTES", 1 << 20, raising=False)
    bomb = tmp_path / "run" / "big.log.gz"
    bomb.parent.mkdir()
    with gzip.open(bomb, "wb") as g:
        g.write(b"step:1 - a:1\n" + b"\0" * (3 << 20))
    with pytest.raises(IngestError, match=r"big.log.gz: decompresses to more than 1 MiB \(a gzip bomb, or a very "
                                          r"large log\); gunzip it yourself"):
        ingest(bomb)
    (bomb.parent / "train.log").write_text(GOOD)
    ev = ingest(bomb.parent)  # the rest of the folder still reads
    assert len(ev.metrics[bomb.parent.name]["reward/mean"][0]) == 14
    with pytest.raises(RunImportError, match="big.log.gz: decompresses to more than 1 MiB"):
        import_run(bomb.parent, tmp_path / "imported")
    with gzip.open(bomb, "wb") as g:
        g.write(GOOD.encode())
    assert len(ingest(bomb).metrics["big"]["reward/mean"][0]) == 14


@pytest.mark.parametrize("body, why", [
    ('{"log_history": ' + "[" * 200_000 + "]" * 200_000 + "}", "nested too deeply to read"),
    (json.dumps({"log_history": [{"step": "NaN", "loss": 2}]}), r"unreadable \(ValueError: invalid literal for int"),
])
def test_malformed_trainer_state_names_the_file(tmp_path, body, why):
    f = tmp_path / "hf" / "trainer_state.json"
    f.parent.mkdir()
    f.write_text(body)
    with pytest.raises(IngestError, match=f"^{f}: {why}"):
        ingest(f.parent)
    assert os.listdir(f.parent) == ["trainer_state.json"]


@pytest.mark.parametrize("name", ["big.log", "trainer_state.json", "metrics.jsonl"])
def test_a_huge_sparse_file_is_refused_before_it_is_read(tmp_path, monkeypatch, name):
    """A sparse file takes no disk (``truncate -s 3G train.log``): ``diagnose`` read it whole, a MemoryError under
    a 2.5 GiB address-space limit that ended the diagnosis of the whole folder, gigabytes of the machine's
    memory without one. A run file past the cap is refused by its size, named, and the rest of the folder reads.
    Here the cap is 1 MiB and the file 64 MiB (so the code before the fix reads it harmlessly and fails)."""
    monkeypatch.setenv("EVOTRAINER_INGEST_MAX_MB", "1")
    run = tmp_path / "run"
    run.mkdir()
    big = run / name
    with open(big, "wb") as f:
        f.truncate(64 << 20)
    with pytest.raises(IngestError, match=rf"^{big}: 64 MiB, larger than the 1 MiB a run file may have; set "
                                          r"EVOTRAINER_INGEST_MAX_MB higher"):
        ingest(big)
    (run / "train.log").write_text(GOOD)
    ev = ingest(run)
    assert len(ev.metrics["run"]["reward/mean"][0]) == 14
    monkeypatch.setenv("EVOTRAINER_INGEST_MAX_MB", "lots")
    with pytest.raises(IngestError, match=r"EVOTRAINER_INGEST_MAX_MB='lots': give a positive whole number"):
        ingest(run / "train.log")
