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
import random
import re
from pathlib import Path

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


# --- second probe round: readers that bypassed the size cap, corrupt event files, special files -----------------
def _sparse(path, size=64 << 20):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_a_huge_sparse_mlflow_metric_file_is_refused_by_its_size(tmp_path, monkeypatch):
    """The MLflow reader read each ``metrics/<key>`` file whole, past the cap every other run file has: a 3 GiB
    sparse ``metrics/loss`` was a MemoryError under a 6 GiB address-space limit. Here the cap is 1 MiB and the
    file 64 MiB; before the fix it was read and failed as 'not an MLflow metric line'."""
    monkeypatch.setenv("EVOTRAINER_INGEST_MAX_MB", "1")
    bad = tmp_path / "mlruns" / "0" / "bad"
    (bad / "tags").mkdir(parents=True)
    (bad / "meta.yaml").write_text("run_id: bad\n")
    big = _sparse(bad / "metrics" / "loss")
    _sparse(bad / "tags" / "mlflow.runName")  # a huge tag file is no name: the run id names the run
    good = tmp_path / "mlruns" / "0" / "good" / "metrics"
    good.mkdir(parents=True)
    (good.parent / "meta.yaml").write_text("run_id: good\n")
    (good / "reward").write_text("".join(f"1700000000000 {i / 10} {i}\n" for i in range(1, 15)))
    with pytest.raises(IngestError, match=rf"nothing readable; {big}: 64 MiB, larger than the 1 MiB a run file "
                                          r"may have; set EVOTRAINER_INGEST_MAX_MB higher"):
        ingest(bad)
    ev = ingest(tmp_path / "mlruns")  # the other run of the store still reads
    assert list(ev.metrics) == ["good"] and len(ev.metrics["good"]["reward/mean"][0]) == 14


def test_import_refuses_a_text_log_past_the_cap_and_cuts_long_lines(tmp_path, monkeypatch):
    """``import`` copies the text logs into the run log with its own reader, which read a file the diagnosis had
    refused by its size: a 64 MiB sparse ``big.log`` (cap 1 MiB) became a 384 MiB ``run.jsonl`` (one line of
    NULs, each escaped to six characters). It is refused now, before the run folder is made, and one line keeps
    at most 4096 characters."""
    monkeypatch.setenv("EVOTRAINER_INGEST_MAX_MB", "1")
    run = tmp_path / "verl"
    run.mkdir()
    (run / "train.log").write_text(GOOD + "x" * 10_000 + "\n")
    big = _sparse(run / "big.log")
    with pytest.raises(RunImportError, match=rf"^{big}: 64 MiB, larger than the 1 MiB a run file may have"):
        import_run(run, tmp_path / "imported")
    assert not (tmp_path / "imported").exists()  # no half-made run: a retry is not 'holds a run already'
    big.unlink()
    out = import_run(run, tmp_path / "imported")
    assert out.n_log_lines == 15
    with Workspace.open(tmp_path / "imported") as ws:
        long = [r["message"] for r in ws.read_logs() if r["message"].startswith("xxx")]
    assert long == ["x" * 4096 + " [... 5904 more characters cut]"]


def test_an_event_file_claiming_a_huge_record_is_refused_without_allocating_it(tmp_path):
    """TensorBoard's reader allocates a record's claimed length before reading it: a 112-byte event file whose
    first header (valid checksum) claims 1 TiB ended the diagnosis with MemoryError. The headers are checked
    against the file's size first; the rest of the folder reads."""
    import struct

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    run = tmp_path / "tb"
    run.mkdir()
    head = struct.pack("<Q", 1 << 40)
    bad = run / "events.out.tfevents.1.host"
    bad.write_bytes(head + struct.pack("<I", masked_crc32c(head)) + b"x" * 100)
    with pytest.raises(IngestError, match=rf"^{bad}: the record at byte 0 claims 1099511627776 bytes but the file "
                                          r"holds 96 more: a corrupt event file"):
        ingest(bad)
    (run / "train.log").write_text(GOOD)
    assert len(ingest(run).metrics["tb"]["reward/mean"][0]) == 14


@pytest.mark.parametrize("kind", ["fifo", "devnull-link"])
def test_a_special_file_given_as_the_log_is_refused_without_blocking(tmp_path, kind):
    """``diagnose run/train.log`` where ``train.log`` is a FIFO blocked forever in ``open``; a link to ``/dev/zero``
    would be read without end (a size check sees 0 bytes). A file that is not a regular file is refused by what
    it is (``/dev/null`` stands in for ``/dev/zero`` here: before the fix it read as an empty log)."""
    import threading

    log = tmp_path / "train.log"
    os.mkfifo(log) if kind == "fifo" else log.symlink_to("/dev/null")
    got: list[BaseException] = []
    t = threading.Thread(target=lambda: got.append(pytest.raises(IngestError, ingest, log).value), daemon=True)
    t.start()
    t.join(60)
    if t.is_alive() and kind == "fifo":  # the reader blocked: release it so the test ends, then fail
        with open(log, "w"):
            pass
        t.join(10)
        pytest.fail("ingest blocked on a FIFO")
    assert len(got) == 1 and str(got[0]) == f"{log}: not a regular file (a FIFO, device or socket); give the log " \
                                            "file itself"


def _plant(db_path, sql: str) -> str:
    import sqlite3

    c = sqlite3.connect(db_path)
    info = list(c.execute("PRAGMA table_info(jobs)"))
    row = {r[1]: ("{}" if r[3] else None) for r in info}
    row.update(id="j1", status="running", pid=999_999_999, kind="train", version_id="v0", created_at=0, updated_at=0)
    c.execute(f"INSERT INTO jobs({','.join(row)}) VALUES ({','.join('?' * len(row))})", list(row.values()))
    c.executescript(sql)
    c.commit()
    c.close()
    return hashlib.sha256(db_path.read_bytes()).hexdigest()


@pytest.mark.parametrize("sql, found", [
    ("CREATE TABLE junk(b BLOB); CREATE TRIGGER boom AFTER UPDATE ON jobs BEGIN INSERT INTO junk WITH RECURSIVE "
     "r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 100) SELECT randomblob(10000) FROM r; END;",
     "trigger 'boom'"),
    ("CREATE VIEW forever AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT x FROM r;",
     "view 'forever'"),
])
def test_a_lineage_db_with_planted_triggers_or_views_is_not_opened(tmp_path, sql, found):
    """Opening a run folder writes to its lineage.db (migrations, marking dead jobs interrupted), so ``diagnose``
    of a downloaded run ran a trigger planted on ``jobs``: a recursive INSERT wrote 200 MB into the file in one
    call (unbounded, it fills the disk). The schema has no trigger or view; a file holding one is refused, named,
    and left byte for byte as it was (here the trigger writes 1 MB)."""
    from mcp_testlib import make_run

    from evotrainer.lineage import LineageError

    run = make_run(tmp_path)
    db = run / "lineage.db"
    before = _plant(db, sql)
    with pytest.raises(LineageError, match=rf"^{db}: holds SQL {found}, which EvoTrainer's lineage schema never "
                                           r"has \(a crafted or foreign file\); not opened"):
        ingest(run)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_read_only_open_of_a_locked_store_checks_its_schema_at_the_first_read(tmp_path):
    """A read-only handle must open while another connection holds the file locked (an MCP server on a live run),
    so the foreign-schema check waits for the first read; a planted view is still refused there."""
    import sqlite3

    from mcp_testlib import make_run

    from evotrainer.lineage import LineageError, LineageStore

    run = make_run(tmp_path)
    db = run / "lineage.db"
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("CREATE VIEW sneaky AS SELECT 1")
    c.execute("PRAGMA locking_mode=EXCLUSIVE")
    c.execute("BEGIN EXCLUSIVE")
    c.execute("UPDATE versions SET note='locked' WHERE id='v1'")
    store = LineageStore(db, readonly=True)  # no 30 s wait, no error while it is locked
    c.execute("COMMIT")
    c.close()
    try:
        with pytest.raises(LineageError, match=r"holds SQL view 'sneaky'"):
            store.versions()
    finally:
        store.close()


def test_a_lineage_db_that_is_not_sqlite_is_named(tmp_path):
    """A ``lineage.db`` of random bytes ended ``diagnose`` with a bare ``DatabaseError: file is not a database``."""
    from evotrainer.lineage import LineageError

    (tmp_path / "lineage.db").write_bytes(os.urandom(4096))
    with pytest.raises(LineageError, match=rf"^{tmp_path}/lineage.db: not a readable lineage database \(file is "
                                           r"not a database\)"):
        ingest(tmp_path)


# --- review 5: links planted in a run folder from elsewhere ----------------------------------------------------
def test_links_planted_in_a_run_folder_are_never_written_through(tmp_path, host):
    """A run folder from elsewhere (a tarball) held ``reports/report.tmp``, ``reports/diagnose/v0.png`` and
    ``logs/run.jsonl`` as links to host files: ``report`` wrote its HTML over the first, ``diagnose`` its PNG over
    the second, a served ``propose_intervention`` appended its log record to the third (and ``search_logs`` read
    it); ``reports`` as a link to a host folder put the report there. Now a link at a file's name is replaced by
    the new file, and a link on the way is refused, named."""
    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.agents.report import write_report
    from evotrainer.cli import app
    from evotrainer.workspace import WorkspaceError

    run = make_run(tmp_path)
    (run / "reports" / "diagnose").mkdir(parents=True)
    (run / "reports" / "report.tmp").symlink_to(host / "secret.txt")
    (run / "reports" / "report.html").symlink_to(host / "secret.txt")
    (run / "reports" / "diagnose" / "v0.png").symlink_to(host / "dir" / "1")
    (run / "logs" / "run.jsonl").unlink()
    (run / "logs" / "run.jsonl").symlink_to(host / "secret.txt")
    r = CliRunner().invoke(app, ["diagnose", str(run), "--no-skills"])
    assert r.exit_code == 0, r.output
    assert (run / "reports" / "diagnose" / "v0.png").read_bytes().startswith(b"\x89PNG")  # a new file, no link
    with Workspace.open(run) as ws:
        assert write_report(ws).read_text().startswith("<!DOCTYPE html>")
        with pytest.raises(WorkspaceError, match=r"logs/run\.jsonl is a link .*: remove .*run\.jsonl and rerun"):
            ws.log("a record a server writes")
        with pytest.raises(WorkspaceError, match=r"logs/run\.jsonl is a link"):
            ws.read_logs()
    os.unlink(run / "reports" / "report.html")
    (run / "reports" / "diagnose" / "v0.png").unlink()
    (run / "reports" / "diagnose").rmdir()
    (run / "reports" / "report.tmp").unlink()
    (run / "reports").rmdir()
    (run / "reports").symlink_to(host / "dir")
    with Workspace.open(run) as ws, pytest.raises(WorkspaceError, match=r": reports is a link .*remove .*/reports and"):
        write_report(ws)
    r = CliRunner().invoke(app, ["diagnose", str(run), "--no-skills"])
    assert isinstance(r.exception, WorkspaceError) and ": reports is a link" in str(r.exception)  # CLI: one line


def test_lock_links_planted_in_a_run_folder_create_no_host_file(tmp_path, host):
    """Review 6: a run folder from elsewhere held ``.writer.lock`` as a dangling link to a host path and ``.locks``
    as a link to a host folder: the first writer's open (``train``, ``eval``, an MCP training job) made the host
    file (empty, root's: ``/etc/nologin`` would lock non-root users out) and ``v0.lock`` in the host folder. Now a
    lock file is opened following no link, and must be a regular file."""
    from mcp_testlib import make_run

    from evotrainer.workspace import WorkspaceError

    run = make_run(tmp_path)
    (run / ".writer.lock").unlink(missing_ok=True)
    (run / ".writer.lock").symlink_to(host / "made_by_the_lock")
    with pytest.raises(WorkspaceError, match=r"\.writer\.lock is a link"):
        Workspace.open(run, writer=True)
    with pytest.raises(WorkspaceError, match=r"\.writer\.lock is a link"):
        Workspace.open(run, writer=True, version="v0")
    assert not (host / "made_by_the_lock").exists()
    (run / ".writer.lock").unlink()
    (run / ".locks").symlink_to(host / "dir")
    with pytest.raises(WorkspaceError, match=r"\.locks is a link"):
        Workspace.open(run, writer=True, version="v0")
    assert not (host / "dir" / "v0.lock").exists()
    with Workspace.open(run, writer=True):  # the run lock is free again after the refusal
        pass
    (run / ".locks").unlink()
    (run / ".writer.lock").unlink()
    os.mkfifo(run / ".writer.lock")
    with pytest.raises(WorkspaceError, match=r"\.writer\.lock: not a regular file"):
        Workspace.open(run, writer=True)


def test_a_huge_sparse_run_log_is_read_by_its_tail_only(tmp_path, monkeypatch):
    """Review 6: a run folder from elsewhere with a 2 GiB sparse ``logs/run.jsonl``: every ``search_logs`` read it
    whole (MemoryError under a 3 GB limit; ~4 GiB each without one, two calls at a time). Now only the last
    ``MAX_LOG_READ_BYTES`` are read (here 1 MiB of a 64 MiB file), the records there kept."""
    import tracemalloc

    from mcp_testlib import make_run

    from evotrainer import workspace

    monkeypatch.setattr(workspace, "MAX_LOG_READ_BYTES", 1 << 20, raising=False)
    run = make_run(tmp_path)
    log = run / "logs" / "run.jsonl"
    with open(log, "wb") as f:
        f.truncate(64 << 20)
        f.seek(64 << 20)
        f.write(b"\n" + json.dumps({"time": 1.0, "level": "info", "message": "the last record"}).encode() + b"\n")
    with Workspace.open(run) as ws:
        tracemalloc.start()
        try:
            records = ws.read_logs()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert [r["message"] for r in records] == ["the last record"]
    assert peak < 8 << 20, peak
    # review 6 residue (M-R6): search_logs says what it did not search: the 64 MiB of the log before its last line
    # (the cut line's newline included), not the 1 MiB read
    with Workspace.open(run) as ws:
        assert ws.read_logs_tail()[1] == (64 << 20) + 1
    from mcp_testlib import SyncClient

    from evotrainer.servers.app import build_server

    c = SyncClient(build_server("logs", run))
    try:
        got = c.ok("search_logs", {"query": "last"})
    finally:
        c.close()
    assert ([r["message"] for r in got["records"]], got["unread_bytes"]) == (["the last record"], (64 << 20) + 1)


def test_a_folder_swapped_for_a_link_after_its_check_gets_no_report(tmp_path, host, monkeypatch):
    """Review 6: a process writing the run folder meanwhile swapped ``reports`` for a link to a host folder, in a
    loop, while ``report`` ran: the report landed in the host folder (1 in ~800 swaps) between ``folder_inside``'s
    check and ``replace_file``'s open of the folder by its path. Now the folder is opened from the run folder
    following no link. Here the swap is made right after the check, every time (report and diagnose's plots)."""
    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer import workspace
    from evotrainer.agents import report
    from evotrainer.cli import app
    from evotrainer.harness import cli as hcli
    from evotrainer.workspace import WorkspaceError

    real = workspace.folder_inside

    def check_then_swap(root, rel):
        out = real(root, rel)
        os.rename(root / "reports", root / "reports.real")
        (root / "reports").symlink_to(host / "dir")
        (root / "reports" / "diagnose").mkdir(exist_ok=True)
        return out

    run = make_run(tmp_path)
    monkeypatch.setattr(report, "folder_inside", check_then_swap)
    with Workspace.open(run) as ws, pytest.raises(WorkspaceError, match=r"reports is a link"):
        report.write_report(ws)
    assert not (host / "dir" / "report.html").exists()
    (run / "reports").unlink()
    os.rename(run / "reports.real", run / "reports")
    monkeypatch.setattr(workspace, "folder_inside", check_then_swap)
    r = CliRunner().invoke(app, ["diagnose", str(run), "--no-skills"])
    assert isinstance(r.exception, WorkspaceError) and "reports/diagnose is a link" in str(r.exception), r.output
    assert list((host / "dir" / "diagnose").iterdir()) == []
    (host / "dir" / "diagnose").rmdir()
    assert hcli  # the diagnose command imports folder_inside from evotrainer.workspace at call time


def test_a_lineage_db_linked_to_another_database_is_not_migrated(tmp_path):
    """Review 6: a run folder from elsewhere with ``lineage.db`` as a link to a host SQLite database (another
    program's): a read-only ``lineage show`` opened it for writing, created the lineage tables in it and switched it
    to WAL. Now a link there is refused, named, and the host database stays as it was."""
    import sqlite3

    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app

    (tmp_path / "host").mkdir()
    other = tmp_path / "host" / "app.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    before = other.read_bytes()
    run = make_run(tmp_path)
    (run / "lineage.db").unlink()
    (run / "lineage.db").symlink_to(other)
    r = CliRunner().invoke(app, ["lineage", "show", str(run)])
    assert r.exit_code != 0 and "lineage.db: a link to" in str(r.exception or r.output), r.output
    assert other.read_bytes() == before
    assert not (tmp_path / "host" / "app.db-wal").exists()


def test_a_dangling_link_in_place_of_a_run_subfolder_is_named(tmp_path):
    """Review 6: a run folder from elsewhere with ``tb`` as a link to a missing host path: every command that
    opened the run (``lineage show``, ``report``, ``serve``) ended with a bare "FileExistsError: [Errno 17] File
    exists". Now a WorkspaceError names it and the fix; nothing is made at the link's target."""
    from mcp_testlib import make_run

    from evotrainer.workspace import WorkspaceError

    run = make_run(tmp_path)
    (run / "tb").rmdir()
    (run / "tb").symlink_to(tmp_path / "nowhere")
    with pytest.raises(WorkspaceError, match=r": tb is not a folder .*remove it and rerun"):
        Workspace.open(run)
    assert not (tmp_path / "nowhere").exists()


def test_a_folder_nested_past_the_recursion_limit_is_read_without_recursing(tmp_path):
    """A foreign folder holding a tree 1,200 levels deep beside its log: ``rglob`` recursed once per level, and
    ``diagnose``, ``import`` and ``watch`` ended with a bare RecursionError. Now the walk is iterative and stops
    MAX_TREE_DEPTH levels down (the deep file is not read); the log is."""
    import subprocess

    from evotrainer.harness.watch import Watcher

    run = tmp_path / "verl"
    deep = run
    run.mkdir()
    try:
        for _ in range(1200):  # one level at a time: Path.mkdir(parents=True) recurses too
            deep = deep / "d"
            deep.mkdir()
        (run / "train.log").write_text(GOOD)
        (deep / "x.log").write_text("step:1 - deep_metric:1\n")
        assert ingest(run).summary()["versions"]["verl"]["last_step"] == 14
        assert import_run(run, tmp_path / "imported").n_steps == 14
        assert Watcher(run).poll().last_step == 14
        assert len(F.tree_entries(run)) == 1 + F.MAX_TREE_DEPTH  # train.log and d, d/d, ... 32 levels
    finally:
        subprocess.run(["rm", "-rf", str(run)], check=True)  # shutil.rmtree (pytest's cleanup) recurses too


def test_the_reward_slope_of_a_very_long_log_takes_bounded_memory():
    """A foreign log of 120,012 steps (6.6 MB of verl lines): the progress analyzers' Theil-Sen slope
    (scipy.stats.theilslopes holds two N x N float64 arrays) asked for 107 GiB, and the MemoryError ended
    ``diagnose``, ``import`` and ``watch`` (30,000 steps would have taken 14 GB of the machine). Past
    SLOPE_MAX_POINTS the slope is taken on bin means, as the trend analyzers do."""
    import tracemalloc

    import numpy as np

    from evotrainer.harness.analyzers.progress import slope_ci

    steps = np.arange(1, 120_013)
    values = 0.5 + 1e-6 * steps + np.random.default_rng(0).normal(0, 0.05, len(steps))
    tracemalloc.start()
    try:
        slope, low, high = slope_ci(steps, values)  # before: MemoryError (numpy asked for 107 GiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 20
    assert low <= 1e-6 <= high and abs(slope - 1e-6) < 2e-7


def test_a_lineage_db_this_user_cannot_write_is_named_with_the_fix(tmp_path, monkeypatch):
    """As a user who may only read a run (probed as a non-root user), ``diagnose`` said "OperationalError: unable to
    open database file" for a lineage.db it could not open (no file named), and "not a readable lineage database
    (attempt to write a readonly database); is this a run folder?" for one it could read but not write (every open
    writes: WAL). Both now name the file, what this user lacks and the fix. Here root meets ``chattr +i``."""
    import shutil
    import sqlite3
    import subprocess

    from mcp_testlib import make_run

    from evotrainer.lineage import LineageError, LineageStore

    run = make_run(tmp_path)
    db = run / "lineage.db"
    for side in ("-wal", "-shm"):
        (run / f"lineage.db{side}").unlink(missing_ok=True)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(run)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here (needs root and a filesystem with file attributes)")
    try:
        with pytest.raises(LineageError, match=r"lineage\.db: this user cannot open it \((unable to open database "
                                               r"file|attempt to write a readonly database)\); it must be able to read "
                                               r"and write .*ls -l .*lineage\.db"):
            ingest(run)
    finally:
        subprocess.run(["chattr", "-i", str(run)], check=True)

    def refused(*args, **kwargs):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(sqlite3, "connect", refused)  # what a user without read permission meets
    with pytest.raises(LineageError, match=r"lineage\.db: this user cannot open it \(unable to open database file\)"):
        LineageStore(db)


def test_a_version_nested_past_the_recursion_limit_is_named(tmp_path):
    """A run folder from elsewhere whose lineage.db holds a version with a recipe nested 100,000 deep: ``report``,
    ``lineage show`` and ``diagnose`` ended with "RecursionError: maximum recursion depth exceeded while decoding a
    JSON object", naming no file or version. Now a LineageError names both."""
    import sqlite3

    from mcp_testlib import make_run

    from evotrainer.lineage import LineageError

    run = make_run(tmp_path)
    c = sqlite3.connect(run / "lineage.db")
    cols = [r[1] for r in c.execute("PRAGMA table_info(versions)")]
    row = dict(zip(cols, c.execute("SELECT * FROM versions WHERE id = 'v0'").fetchone(), strict=True))
    row.update(id="v9", parent_id="v0", recipe='{"a":' * 100_000 + "1" + "}" * 100_000)
    c.execute(f"INSERT INTO versions ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})", list(row.values()))
    c.commit()
    c.close()
    with pytest.raises(LineageError, match=r"lineage\.db: version 'v9' holds JSON nested deeper than Python reads \(a "
                                           r"crafted or damaged file\); not read"):
        ingest(run)


def test_watch_keeps_the_imports_cap_on_copied_log_lines(tmp_path, monkeypatch):
    """``watch SRC --run RUN`` copied every text-log line written after the import into ``logs/run.jsonl``, without
    the import's MAX_LOG_LINES cap (a log that grew by 120,000 lines: 120,015 records, 19 MB). The cap now holds for
    the import and the polls together (here 40), and one record says where the copy stopped."""
    from evotrainer.harness import importer, watch

    monkeypatch.setattr(importer, "MAX_LOG_LINES", 40)
    monkeypatch.setattr(watch, "MAX_LOG_LINES", 40, raising=False)
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.log").write_text("".join(f"step:{i} - critic/score/mean:0.{i} - actor/entropy:0.5\n"
                                           for i in range(1, 13)))
    (src / "notes.log").write_text("".join(f"note {i}\n" for i in range(20)))
    w = watch.Watcher(src, tmp_path / "run")
    w.poll()  # the import: 12 + 20 lines
    with open(src / "notes.log", "a") as f:
        f.write("".join(f"later note {i}\n" for i in range(100)))
    w.poll()
    with Workspace.open(tmp_path / "run") as ws:
        logs = ws.read_logs()
    copied = [r for r in logs if r["source"].startswith("import:") and r["source"] != "import:diagnose"]
    assert len(copied) == 40 and copied[-1]["message"] == "later note 7"  # before: 132
    assert [r["message"] for r in logs if r["source"] == "watch"][-1] == "watch: 40 text-log lines copied; later " \
                                                                          "lines are not"


def test_run_resume_of_a_run_folder_from_elsewhere_writes_no_host_file_through_its_links(tmp_path, host, monkeypatch):
    """Review 7: ``evotrainer run --resume`` on a run folder from elsewhere wrote the run config with ``write_text``
    through ``run.yaml``, a link to a host file (overwritten with the YAML); a link at ``.orchestrator.lock`` ended
    the command with a bare OSError. Now ``run.yaml`` is written beside its name and renamed over it, and the lock
    link is named with the fix. The loop itself is stopped right after the config is written."""
    from evotrainer.agents import runner
    from evotrainer.config import load_run_config

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(runner, "open_toolbox", stop)
    cfg = load_run_config("examples/tiny.yaml")
    run = tmp_path / "run"
    Workspace.init(run, cfg.recipe)
    (run / "run.yaml").symlink_to(host / "secret.txt")
    (run / ".orchestrator.lock").symlink_to(host / "secret.txt")
    with pytest.raises(ValueError, match=r"\.orchestrator\.lock: cannot take the run's lock .*remove it and rerun"):
        runner.run_loop(cfg, run, "heuristic", "evotrainer", resume=True)
    (run / ".orchestrator.lock").unlink()
    with pytest.raises(Stop):
        runner.run_loop(cfg, run, "heuristic", "evotrainer", resume=True)
    assert not (run / "run.yaml").is_symlink() and "run_dir:" in (run / "run.yaml").read_text()
    assert (host / "secret.txt").read_text() == SECRET  # the host fixture checks every host file too


@pytest.mark.parametrize("sub", ["checkpoints", "tb", "evals", "rollouts", "logs", "reports"])
def test_a_writer_refuses_a_run_subfolder_that_is_a_link(tmp_path, host, sub):
    """Review 7 L-R7b (left by the review, fixed after it): a run folder from elsewhere with ``checkpoints``, ``tb``
    and ``evals`` linked to a host folder had ``run --resume`` write v1..v3's weights, tokenizer and TensorBoard
    events into it. A writer (the trainer, an MCP job, import, watch) now refuses any such link, naming it and the
    fix; nothing is written at its target. A reader (lineage show, report, diagnose) still opens the folder."""
    from evotrainer.config import load_run_config
    from evotrainer.workspace import WorkspaceError

    run = tmp_path / "run"
    Workspace.init(run, load_run_config("examples/tiny.yaml").recipe)
    target = host / "dir"
    if (run / sub).exists():
        (run / sub).rmdir()
    (run / sub).symlink_to(target)
    for kw in ({}, {"version": "v0"}):
        with pytest.raises(WorkspaceError) as err:
            Workspace(run, writer=True, **kw)
        assert str(err.value) == (
            f"{run.resolve()}: {sub} is a link ({sub} -> {target}); a process that writes a run follows no link "
            f"inside it (a run folder from elsewhere could point {sub} at any folder of yours). Replace the link with "
            "a folder; to keep a run on another disk, put the whole run folder there and pass its path")
    with Workspace.open(run) as ws:  # reading is not refused
        assert ws.lineage.root().id == "v0"
    assert sorted(p.name for p in target.iterdir()) == ["1"]
    # the whole run folder behind a link (another disk) is the supported way, and writes as usual
    disk = tmp_path / "disk"
    Workspace.init(disk / "run2", load_run_config("examples/tiny.yaml").recipe)
    (tmp_path / "run2").symlink_to(disk / "run2")
    with Workspace(tmp_path / "run2", writer=True) as ws:
        ws.log("written on the other disk")
    assert (disk / "run2" / "logs" / "run.jsonl").read_text().count("written on the other disk") == 1


def test_a_lineage_db_whose_versions_form_a_parent_cycle_is_not_opened(tmp_path):
    """Review 7: a run folder from elsewhere whose ``lineage.db`` has ``v2.parent_id = v3`` and ``v3.parent_id = v2``
    made ``LineageStore.path_to_root("v2")`` (the MCP ``gate_version``) grow a list for good (MemoryError after 45 s
    under a 3 GB limit) and ``report`` spin forever in ``step_offset``. Such a file is refused at open, naming the
    cycle, whatever reads it (read-only too)."""
    import sqlite3
    import time

    from mcp_testlib import make_run

    from evotrainer.lineage import LineageError, LineageStore

    run = make_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    cols = [c[1] for c in db.execute("PRAGMA table_info(versions)")]
    row = dict(zip(cols, db.execute("SELECT * FROM versions WHERE id = 'v1'").fetchone(), strict=True))
    for vid, parent in (("v2", "v3"), ("v3", "v2"), ("v4", "v4")):
        db.execute(f"INSERT INTO versions ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                   [{**row, "id": vid, "parent_id": parent}[c] for c in cols])
    db.commit()
    db.close()
    t0 = time.monotonic()
    for open_it in (lambda: Workspace.open(run), lambda: LineageStore(run / "lineage.db", readonly=True),
                    lambda: ingest(run)):
        with pytest.raises(LineageError, match=r"versions (v2 -> v3 -> v2|v3 -> v2 -> v3|v4 -> v4) are their own "
                                               r"ancestors \(a parent cycle\).*not opened"):
            open_it()
    assert time.monotonic() - t0 < 10


def test_a_lineage_deeper_than_the_cap_is_not_opened_and_never_made(tmp_path):
    """Review 7: a run folder from elsewhere whose ``lineage.db`` chains 5,000 versions (each the previous one's child)
    ended ``lineage show`` and ``lineage show --json`` with RecursionError (the JSON from about 490 deep) and kept
    ``report`` busy past 120 s (quadratic: each version walks to the root). Past MAX_LINEAGE_DEPTH a file is refused at
    open, naming the version; ``branch`` refuses to go deeper, so EvoTrainer never writes one."""
    import sqlite3

    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.intervention import Intervention
    from evotrainer.lineage import MAX_LINEAGE_DEPTH, LineageError
    from evotrainer.recipe import Recipe

    run = tmp_path / "run"
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(Recipe(model={"name_or_path": "tiny-random"}))
        vid, eps = "v0", ws.lineage.get("v0").recipe.eps_clip_high
        for _ in range(MAX_LINEAGE_DEPTH - 1):
            vid = ws.lineage.branch(vid, Intervention(path="eps_clip_high", old=eps, new=eps + 1e-3,
                                                      category="optimizer", hypothesis="h")).id
            eps += 1e-3
        assert len(ws.lineage.path_to_root(vid)) == MAX_LINEAGE_DEPTH
        with pytest.raises(LineageError, match=rf"{vid} is {MAX_LINEAGE_DEPTH} versions deep; .*branch from an earlier"):
            ws.lineage.branch(vid, Intervention(path="eps_clip_high", old=eps, new=eps + 1e-3, category="optimizer",
                                                hypothesis="h"))
        with pytest.raises(LineageError, match=rf"{vid} is {MAX_LINEAGE_DEPTH} versions deep"):
            ws.lineage.branch_control(vid)
    assert CliRunner().invoke(app, ["lineage", "show", str(run), "--json"]).exit_code == 0  # at the cap: fine
    db = sqlite3.connect(run / "lineage.db")  # one version deeper, written by hand
    cols = [c[1] for c in db.execute("PRAGMA table_info(versions)")]
    row = dict(zip(cols, db.execute("SELECT * FROM versions WHERE id = ?", (vid,)).fetchone(), strict=True))
    db.execute(f"INSERT INTO versions ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
               [{**row, "id": "deep", "parent_id": vid}[c] for c in cols])
    db.commit()
    db.close()
    with pytest.raises(LineageError, match=rf"version deep is {MAX_LINEAGE_DEPTH + 1} versions deep, past the "
                                           rf"{MAX_LINEAGE_DEPTH} EvoTrainer makes"):
        Workspace.open(run)
    r = CliRunner().invoke(app, ["lineage", "show", str(run), "--json"])
    assert r.exit_code == 1 and "RecursionError" not in r.output


HUGE_STEP = 10 ** 26
TOO_BIG = r"(metrics\.jsonl|train\.log|trainer_state\.json|metrics): step 1\d{26} does not fit a 64-bit integer"


@pytest.mark.parametrize("rel, body", [
    ("metrics.jsonl", "".join(json.dumps({"step": s, "reward": 0.5}) + "\n" for s in (1, 2, HUGE_STEP))),
    ("train.log", f"step:1 - critic/score/mean:0.1\nstep:{HUGE_STEP} - critic/score/mean:0.2\n"),
    ("trainer_state.json", json.dumps({"log_history": [{"step": 1, "loss": 2.0}, {"step": HUGE_STEP, "loss": 1.0}]})),
    ("mlruns/0/abc/metrics/loss", f"1700000000000 0.5 1\n1700000000001 0.6 {HUGE_STEP}\n"),
])
def test_a_step_past_64_bits_is_named_not_an_overflow(tmp_path, rel, body):
    """Review 7: a step of 10**26 in a JSONL, a verl log, a ``trainer_state.json`` or an MLflow metric file ended
    ``diagnose`` and ``import`` with "OverflowError: Python int too large to convert to C long" (no file named) when
    the series became int64 arrays. Now an IngestError names the file and the step; nothing is imported."""
    src = tmp_path / "foreign"
    (src / rel).parent.mkdir(parents=True)
    (src / rel).write_text(body)
    with pytest.raises(IngestError, match=TOO_BIG):
        ingest(src)
    with pytest.raises(IngestError, match=TOO_BIG):
        import_run(src, tmp_path / "run")
    assert not (tmp_path / "run" / "lineage.db").exists()


def test_metric_rows_of_a_crafted_lineage_db_that_log_metrics_never_writes_are_not_read(tmp_path):
    """Review 7: SQLite keeps any type in any column; a run folder from elsewhere whose ``metrics`` table held a step
    of 1e30 (REAL) and a step ``'abc'`` with the value ``'xyz'`` ended ``diagnose`` with a bare "OverflowError: Python
    int too large to convert to C long" and ``report`` with "ValueError: invalid literal for int()". Rows of types
    ``log_metrics`` never writes are not read; the good ones still are."""
    import sqlite3

    from mcp_testlib import make_run

    from evotrainer.agents.report import write_report

    run = make_run(tmp_path)
    with Workspace.open(run) as ws:
        good = ws.lineage.all_metrics("v0")
        last = ws.lineage.last_step("v0")
    db = sqlite3.connect(run / "lineage.db")
    db.executemany("INSERT INTO metrics (version_id, step, name, value) VALUES ('v0', ?, ?, ?)",
                   [(1e30, "reward/mean", 0.5), ("abc", "reward/mean", "xyz"), (7, "reward/mean", "xyz")])
    db.commit()
    db.close()
    with Workspace.open(run) as ws:
        assert ws.lineage.all_metrics("v0") == good and ws.lineage.last_step("v0") == last
        assert ws.lineage.metric_series("v0", "reward/mean") == good["reward/mean"]
        assert write_report(ws).stat().st_size > 0
    assert ingest(run).series("v0", "reward/mean")[0].tolist() == [s for s, _ in good["reward/mean"]]


def test_diagnose_out_inside_a_run_folder_follows_no_link_there(tmp_path, host):
    """Review 7: ``diagnose RUN --out RUN/reports/mine`` with ``reports`` a link to a host folder made ``mine`` there
    and wrote ``v0.png`` into it (the default folder, ``RUN/reports/diagnose``, already refused the link). An --out
    inside the run folder is now made and written through no link; one outside it is the caller's choice."""
    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app

    run = make_run(tmp_path)
    (run / "reports").rmdir()
    (run / "reports").symlink_to(host / "dir")
    r = CliRunner().invoke(app, ["diagnose", str(run), "--no-skills", "--out", str(run / "reports" / "mine")])
    assert "reports is a link" in str(r.exception), (r.exception, r.output)
    assert sorted(p.name for p in (host / "dir").iterdir()) == ["1"]  # nothing made there
    (run / "reports").unlink()
    r = CliRunner().invoke(app, ["diagnose", str(run), "--no-skills", "--out", str(run / "reports" / "mine")])
    assert r.exit_code == 0 and (run / "reports" / "mine" / "v0.png").is_file(), r.output


def test_a_lineage_db_with_a_gap_in_its_version_ids_can_still_branch(tmp_path):
    """Review 7: a run folder from elsewhere whose versions are ``v0, v2`` (count 2): the next id was ``v2``, and every
    branch (``propose_intervention``, ``run --resume``) failed with a raw "sqlite3.IntegrityError: UNIQUE constraint
    failed: versions.id". The next free id is taken now."""
    import sqlite3

    from mcp_testlib import make_run

    from evotrainer.intervention import Intervention

    run = make_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    db.execute("UPDATE versions SET id = 'v2' WHERE id = 'v1'")
    db.commit()
    db.close()
    with Workspace.open(run, writer=True) as ws:
        eps = ws.lineage.get("v0").recipe.eps_clip_high
        ids = [ws.lineage.branch("v0", Intervention(path="eps_clip_high", old=eps, new=eps + k / 100,
                                                    category="optimizer", hypothesis="h")).id for k in (1, 2)]
        assert ids == ["v3", "v4"] and ws.lineage.branch_control("v0").id == "v5"


def test_two_imports_into_one_new_run_folder_leave_one_run_and_a_clear_error(tmp_path, monkeypatch):
    """Review 7: two ``evotrainer import`` into the same new ``--run`` at once: one imported, the other ended with
    "this run has a root version already; branch from it instead" (no folder named, advice that does not apply to an
    import). The other import is made here while the first reads its source."""
    from evotrainer.harness import importer

    a, b = tmp_path / "a", tmp_path / "b"
    for src in (a, b):
        src.mkdir()
        (src / "train.log").write_text(GOOD)
    run = tmp_path / "run"
    real_ingest = importer.ingest

    def ingest_while_b_imports(path, *args, **kw):
        ev = real_ingest(path, *args, **kw)
        if path == a:
            importer.import_run(b, run)  # the other process, finishing first
        return ev

    monkeypatch.setattr(importer, "ingest", ingest_while_b_imports)
    with pytest.raises(RunImportError, match=rf"^{run} holds a run already \(made by another process while this "
                                             rf"import read {a}\); import into a new folder"):
        importer.import_run(a, run)
    with Workspace.open(run) as ws:
        assert [v.id for v in ws.lineage.versions()] == ["v0"] and str(b) in ws.lineage.get("v0").note


def test_a_stored_recipe_that_does_not_validate_is_named_briefly(tmp_path):
    """Review 7: a run folder from elsewhere whose version v1 stored a recipe with 50,000 reward components ended
    ``lineage show`` and ``report`` with one 2 MB error line (every component repeated), naming neither the file nor
    the version. Now a LineageError names both and shows at most SHOWN_MAX characters of the value."""
    import sqlite3

    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.lineage import LineageError

    run = make_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    recipe = json.loads(db.execute("SELECT recipe FROM versions WHERE id = 'v1'").fetchone()[0])
    # 20,000 components (~0.8 MB): under the 1 MiB column cap (review 12, G-R12), so the recipe is validated
    recipe["reward"] = {f"c{i}": {"weight": 1.0, "params": {}} for i in range(20_000)}
    db.execute("UPDATE versions SET recipe = ? WHERE id = 'v1'", (json.dumps(recipe),))
    db.commit()
    db.close()
    with Workspace.open(run) as ws, pytest.raises(LineageError) as err:
        ws.lineage.versions()
    text = str(err.value)
    assert text.startswith(f"{run / 'lineage.db'}: version 'v1' is not a valid version (recipe.reward={{'c0'")
    assert "items): unknown reward component 'c0'" in text and len(text) < 1200, len(text)
    r = CliRunner().invoke(app, ["lineage", "show", str(run)])
    assert r.exit_code == 1 and len(str(r.exception)) < 1200


def test_a_fifo_in_place_of_the_run_log_is_refused_without_blocking(tmp_path):
    """Review 7: a run folder from elsewhere holding ``logs/run.jsonl`` as a FIFO: reading it (``search_logs``) and
    appending to it (every ``Workspace.log``: ``propose_intervention``, jobs, training) blocked for good in the open;
    in a server each ``search_logs`` kept a tool slot, two of them every slot. Now a WorkspaceError names it at once."""
    import threading

    from mcp_testlib import make_run

    from evotrainer.workspace import WorkspaceError

    run = make_run(tmp_path)
    log = run / "logs" / "run.jsonl"
    log.unlink()
    os.mkfifo(log)
    ws = Workspace.open(run)
    for call in (ws.read_logs, lambda: ws.log("x")):
        out: list = []

        def attempt(call=call, out=out):
            try:
                out.append(call())
            except WorkspaceError as exc:
                out.append(exc)

        t = threading.Thread(target=attempt, daemon=True)
        t.start()
        t.join(5)
        if t.is_alive():  # release the blocked open (the other end of the FIFO), then fail
            fd = os.open(log, os.O_RDWR)
            t.join(5)
            os.close(fd)
            pytest.fail(f"{call}: blocked on the FIFO for 5 s")
        assert isinstance(out[0], WorkspaceError) and "run.jsonl: not a regular file" in str(out[0]), out
    ws.close()


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_fifo_or_link_inside_the_rollout_dataset_is_refused_without_blocking(tmp_path, host, kind):
    """Review 7: a run folder from elsewhere with a FIFO in place of a Lance data file of ``rollouts/``: reading the
    rollouts (``diagnose``, ``report``, ``sample_rollouts``) blocked for good inside Lance (``diagnose`` killed at
    30 s); a link there would be read through. Such a dataset is refused, naming the entry."""
    import threading

    from mcp_testlib import make_run

    from evotrainer.rollouts import RolloutStoreError

    run = make_run(tmp_path)
    victim = sorted((run / "rollouts" / "rollouts.lance" / "data").glob("*.lance"))[0]  # a data fragment
    victim.unlink()
    if kind == "fifo":
        os.mkfifo(victim)
    else:
        victim.symlink_to(host / "secret.txt")
    out: list = []

    def attempt():
        try:
            out.append(ingest(run))
        except Exception as exc:  # a link read through ended in a raw Lance error (a Rust source path in it)
            out.append(exc)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        fd = os.open(victim, os.O_RDWR | os.O_NONBLOCK)  # the FIFO's other end releases the blocked read
        os.close(fd)
        pytest.fail("reading the rollouts blocked on the FIFO for 30 s")
    assert isinstance(out[0], RolloutStoreError) and f"{victim}: not a regular file or folder" in str(out[0]), out


def test_a_folder_in_place_of_a_report_or_plot_is_named(tmp_path):
    """Review 7: a run folder from elsewhere with ``reports/report.html`` (or ``reports/diagnose/v0.png``) a folder ended
    ``report`` (``diagnose``) with "IsADirectoryError: [Errno 21] Is a directory: '.report.html.<pid>.<tid>.tmp' ->
    'report.html'", naming neither the run nor the path. Now a WorkspaceError names the path and the fix; no temporary
    file is left."""
    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.agents.report import write_report
    from evotrainer.cli import app
    from evotrainer.workspace import WorkspaceError

    run = make_run(tmp_path)
    (run / "reports" / "report.html" / "sub").mkdir(parents=True)
    with Workspace.open(run) as ws, pytest.raises(WorkspaceError, match=rf"^{run}/reports/report\.html: a folder "
                                                                        r"where EvoTrainer writes a file"):
        write_report(ws)
    (run / "reports" / "diagnose" / "v0.png").mkdir(parents=True)
    r = CliRunner().invoke(app, ["diagnose", str(run), "--no-skills"])
    assert "reports/diagnose/v0.png: a folder where EvoTrainer writes a file" in str(r.exception), r.output
    assert not [p for p in (run / "reports").rglob(".*.tmp")]


def test_many_running_jobs_of_one_pid_ask_about_that_process_once(tmp_path, monkeypatch):
    """Review 7: a crafted lineage.db (21 MB) holding 300,000 "running" jobs of pid 1 made every writable open take
    9 s (``recover_jobs`` signalled pid 1 and read its /proc entry once per job). Each pid is asked once now."""
    import sqlite3

    from mcp_testlib import make_run

    from evotrainer import lineage

    run = make_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    db.executemany("INSERT INTO jobs (id, version_id, kind, status, pid, created_at, updated_at) "
                   "VALUES (?, 'v0', 'train', 'running', ?, 0, 0)",
                   [(f"j{i}", os.getpid() if i % 2 else 2 ** 22 + 7) for i in range(20_000)])
    db.commit()
    db.close()
    asked: list = []
    real = lineage._pid_alive
    monkeypatch.setattr(lineage, "_pid_alive", lambda pid: asked.append(pid) or real(pid))
    with Workspace.open(run) as ws:
        jobs = ws.lineage.jobs()
    assert sorted(asked) == sorted({os.getpid(), 2 ** 22 + 7}), len(asked)
    status = {j.id: j.status for j in jobs}
    assert status["j1"] == "running" and status["j0"] == "interrupted"  # the live pid's, the gone pid's


@pytest.mark.parametrize("pid", ["'abc'", "1e21", "1.5", "9223372036854775807", "-1", "X'00'"])
def test_a_running_job_with_a_pid_that_is_no_pid_is_recovered_not_a_crash(tmp_path, pid):
    """Review 8 A-R8: a foreign lineage.db with a running job whose pid is text, a float, past 64 bits of a pid or a
    blob ended every command that opened the run (and every MCP tool) with a bare TypeError / OverflowError, and pid
    -1 (kill(-1, 0) reaches every process) kept its job running for good. Such a job's process is not alive: the
    job is recovered as for a dead process."""
    import sqlite3

    from evotrainer.config import load_run_config

    run = tmp_path / "run"
    Workspace.init(run, load_run_config("examples/tiny.yaml").recipe)
    db = sqlite3.connect(run / "lineage.db")
    db.execute("INSERT INTO jobs(id, version_id, kind, status, pid, created_at, updated_at) "
               f"VALUES ('j1', 'v0', 'train', 'running', {pid}, 1, 1)")
    db.commit()
    db.close()
    with Workspace(run) as ws:
        assert ws.lineage.root().id == "v0"
        job = ws.lineage.job("j1")
        assert job.status != "running", job


def _evaluated_run(tmp_path):
    """make_run's run with v0 and v1 trained, evaluated (2 problems x 2 samples) and v1 kept by one decision."""
    from mcp_testlib import make_run

    run = make_run(tmp_path)
    with Workspace(run, writer=True) as ws:
        for vid in ("v0", "v1"):
            ws.lineage.update_version(vid, status="trained", eval_summary={"avg@k": 0.5, "pass@k": 0.5,
                                                                            "n_problems": 2})
            ws.lineage.log_eval_samples(vid, "heldout", [("p1", 0, 1.0, ""), ("p1", 1, 0.0, ""), ("p2", 0, 1.0, ""),
                                                         ("p2", 1, 1.0, "")])
        ws.lineage.decide("v1", "keep", "pass@k 0.5 on 2 problems", evidence=["eval:v1"])
    return run


@pytest.mark.parametrize("value, shown", [("'yes'", "text 'yes'"), ("X'01'", r"blob b'\\x01'")])
def test_an_eval_sample_whose_correct_is_no_number_is_named_not_a_crash(tmp_path, value, shown):
    """Review 8 G-R8: a foreign lineage.db with ``eval_samples.correct = 'yes'`` ended ``report`` with a bare numpy
    "TypeError: the resolved dtypes are not compatible with add.reduce". As a version's bad JSON columns, the row is
    not read: a LineageError names the file, the table and column, the sample and the fix."""
    import sqlite3

    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.lineage import LineageError

    run = _evaluated_run(tmp_path)
    with Workspace.open(run) as ws:
        assert ws.lineage.eval_matrix("v1") == {"p1": [1.0, 0.0], "p2": [1.0, 1.0]}
    assert CliRunner().invoke(app, ["report", str(run)]).exit_code == 0
    db = sqlite3.connect(run / "lineage.db")
    db.execute(f"UPDATE eval_samples SET correct = {value} WHERE version_id = 'v1' AND problem_id = 'p2' "
               "AND sample_idx = 1")
    db.commit()
    db.close()
    with Workspace.open(run) as ws, pytest.raises(LineageError) as err:
        ws.lineage.eval_matrix("v1")
    assert str(err.value) == (
        f"{run / 'lineage.db'}: eval_samples.correct of version 'v1', eval 'heldout', problem 'p2', sample 1 is "
        f"{shown.replace(chr(92) * 2, chr(92))}, where EvoTrainer writes a number (1 correct, 0 not; a crafted or "
        "damaged file); not read. Use a run folder EvoTrainer wrote, or evaluate the version again (`evotrainer "
        "eval v1 --run RUN --name heldout` rewrites these samples)")
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 1 and isinstance(r.exception, LineageError), (r.exception, r.output)
    assert "eval_samples.correct of version 'v1'" in str(r.exception)


@pytest.mark.parametrize("evidence, why", [
    ("'not json'", r"its decisions\.evidence holds not JSON \(Expecting value: line 1 column 1 \(char 0\)\), where "
                   r"EvoTrainer writes a JSON list of text"),
    ("'[[1]]'", r"not a valid decision row \(1 validation error for Decision evidence\.0"),
    ("'{\"a\": 1}'", r"not a valid decision row \(1 validation error for Decision evidence"),
    ("X'00'", r"its decisions\.evidence holds not JSON"),
])
def test_a_decision_whose_evidence_is_no_json_list_is_named_not_a_crash(tmp_path, evidence, why):
    """Review 8 G-R8: a foreign lineage.db with ``decisions.evidence = 'not json'`` ended ``lineage show --json`` and
    ``report`` with a bare JSONDecodeError. As a version's bad JSON columns, a LineageError names the file, the
    decision, the column and the fix (repair the row, or a run folder EvoTrainer wrote); the good decisions of
    other versions still read."""
    import sqlite3

    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.lineage import LineageError

    run = _evaluated_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    db.execute("INSERT INTO decisions (version_id, action, rationale, evidence, author, prev_status, created_at) "
               f"VALUES ('v0', 'keep', 'r', {evidence}, 'u', 'trained', 2)")
    db.commit()
    db.close()
    with Workspace.open(run) as ws:
        assert [(d.id, d.evidence) for d in ws.lineage.decisions("v1")] == [(1, ["eval:v1"])]
        with pytest.raises(LineageError, match=rf"^{run / 'lineage.db'}: decision 2 \(of version 'v0'\): {why}.*"
                                               r"repair the row \(`sqlite3 .*UPDATE decisions SET evidence = '\[\]' "
                                               r"WHERE id = 2"):
            ws.lineage.decisions()
    for args in (["lineage", "show", str(run), "--json"], ["report", str(run)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 1 and isinstance(r.exception, LineageError), (args, r.exception, r.output)
        assert "decision 2 (of version 'v0')" in str(r.exception)



@pytest.mark.parametrize("value", ["'not json'", "X'00'"])
def test_a_run_level_value_that_is_no_json_is_named_not_a_crash(tmp_path, value):
    """G-R8's class in the ``kv`` table: a foreign lineage.db with ``kv.value = 'not json'`` under ``loop/finished``
    ended ``report`` with a bare JSONDecodeError. A LineageError names the file, the column, the key and the fix."""
    import sqlite3

    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.lineage import LineageError

    run = make_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    db.execute(f"INSERT INTO kv VALUES ('loop/finished', {value}), ('loop/eval/v0/heldout', '{{\"avg@k\": 0.5}}')")
    db.commit()
    db.close()
    with Workspace.open(run) as ws:
        assert ws.lineage.kv_get("loop/eval/v0/heldout") == {"avg@k": 0.5}
        with pytest.raises(LineageError, match=rf"^{run / 'lineage.db'}: kv\.value of key 'loop/finished' holds not "
                                               r"JSON \(.*\), where EvoTrainer writes JSON .*`sqlite3 .*DELETE FROM kv "
                                               r"WHERE key = 'loop/finished'"):
            ws.lineage.kv_items("loop/")
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 1 and isinstance(r.exception, LineageError), (r.exception, r.output)
    assert "kv.value of key 'loop/finished'" in str(r.exception)

def _chains_run(root, chains: int, depth: int):
    """A run whose v0 has ``chains`` chains of ``depth`` versions under it (chain c, depth d: ``v{c * depth + d}``),
    written by hand as a crafted lineage.db would be; every version but v0 logged reward/mean at steps 0 and 1."""
    import sqlite3

    from evotrainer.config import load_run_config

    Workspace.init(root, load_run_config("examples/tiny.yaml").recipe)
    db = sqlite3.connect(root / "lineage.db")
    cols = [c[1] for c in db.execute("PRAGMA table_info(versions)")]
    v0 = dict(zip(cols, db.execute("SELECT * FROM versions WHERE id = 'v0'").fetchone(), strict=True))
    rows = []
    for c in range(chains):
        for d in range(1, depth + 1):
            n = c * depth + d
            rows.append({**v0, "id": f"v{n}", "parent_id": "v0" if d == 1 else f"v{n - 1}", "created_at": n,
                         "updated_at": n, "status": "trained"})
    db.executemany(f"INSERT INTO versions ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                   [[r[c] for c in cols] for r in rows])
    db.executemany("INSERT INTO metrics (version_id, step, name, value) VALUES (?, ?, 'reward/mean', ?)",
                   [(r["id"], s, 0.1 * (s + 1)) for r in rows for s in (0, 1)])
    db.commit()
    db.close()
    return root


def test_report_reads_the_parent_links_once_however_deep_the_lineage(tmp_path):
    """Review 8 M-R8: on a crafted lineage.db of chains of 250 versions under v0, ``report`` took 30 s for one chain
    and 189 s for four: each version's step offset and start version walked to the root with queries at every step
    (versions x depth queries). The parent links are now read once (``LineageStore.lineage_index``) and the walks
    done in memory: the queries of the report's lineage computation are the same for 4 chains of 250 as for 1,000
    children of v0, and the depths, ancestors, starts and offsets are the hand-counted ones."""
    import sqlite3

    from evotrainer.agents.report import ReportLineage, _global_steps, lineage_curves, recipe_rows

    deep = _chains_run(tmp_path / "deep", 4, 250)
    flat = _chains_run(tmp_path / "flat", 1000, 1)
    db = sqlite3.connect(deep / "lineage.db")  # v350 (chain 1, depth 100) pruned for damaged weights
    db.execute("INSERT INTO decisions (version_id, action, rationale, evidence, author, prev_status, created_at, "
               "damaged_weights) VALUES ('v350', 'prune', 'NaN loss', '[]', 'u', 'trained', 1, 'nan_blowup')")
    db.commit()
    db.close()

    def queries(ws, fn):
        sql: list[str] = []
        ws.lineage._db.set_trace_callback(sql.append)
        try:
            out = fn()
        finally:
            ws.lineage._db.set_trace_callback(None)
        return len(sql), out

    counts = {}
    for name, run in (("deep", deep), ("flat", flat)):
        with Workspace.open(run) as ws:
            counts[name] = [queries(ws, lambda f=f: f(ws))[0] for f in (lineage_curves, recipe_rows)]
            counts[name].append(queries(ws, lambda: _global_steps(ReportLineage(ws.lineage)))[0])
    assert counts["deep"] == counts["flat"], counts
    with Workspace.open(deep) as ws:
        lin = ws.lineage
        n, index = queries(ws, lin.lineage_index)
        assert n == 1  # the parent links
        n, got = queries(ws, lambda: [(index.depth(v), index.step_offset(v), index.start_id(v)) for v in index.ids()])
        assert n == 2 and len(got) == 1001  # the latest decisions and the last steps, once each
        assert [index.depth(v) for v in ("v0", "v1", "v250", "v251", "v1000")] == [1, 2, 251, 2, 251]
        assert index.ancestors("v250") == [f"v{n}" for n in range(250, 0, -1)] + ["v0"]
        assert index.ancestors("v253") == ["v253", "v252", "v251", "v0"]
        # 2 steps a version from depth 1 on; v351 starts from v349 (its parent v350's weights are damaged)
        assert [index.step_offset(v) for v in ("v0", "v1", "v2", "v250", "v349", "v350", "v351", "v352", "v500")] \
            == [0, 0, 2, 498, 196, 198, 198, 200, 496]
        assert [index.start_id(v) for v in ("v0", "v1", "v351", "v352")] == [None, "v0", "v349", "v351"]
        assert queries(ws, lambda: lin.step_offset("v500")) == (3, 496)
        n, path = queries(ws, lambda: lin.path_to_root("v500"))
        # the parent links, the size check of the version rows' columns (review 12, G-R12) and of their total
        # (review 14, E-R14), the rows
        assert n == 4 and [v.id for v in path] == [f"v{n}" for n in range(500, 250, -1)] + ["v0"]
        assert lin.start_version("v351").id == "v349" and lin.start_version("v1").id == "v0"
        curves = lineage_curves(ws)
        assert curves["v351"]["reward/mean"] == [(197, 0.2), (198, 0.1), (199, 0.2)]
        assert curves["v1"]["reward/mean"] == [(0, 0.1), (1, 0.2)]  # v0 trained no step: no lead point
        assert ("<tr><td>v351</td><td>v349 (its last step 197)</td><td class='num'>198</td><td class='num'>199</td>"
                "</tr>") in _global_steps(ReportLineage(ws.lineage))


def test_a_version_folder_under_tb_or_checkpoints_that_is_a_link_is_refused(tmp_path, host):
    """Review 8 B-R8: review 7's fix refused a link at `tb` or `checkpoints` itself, not one level down: with
    `tb/v0` a link to a host folder, `train` wrote its TensorBoard event file there; with `checkpoints/v0` one, it
    ended with a bare OSError from rmtree. Both folders are now made as real folders of the run, the link named."""
    from evotrainer.config import load_run_config
    from evotrainer.rl_backend.tb_writer import TrainWriter
    from evotrainer.workspace import WorkspaceError

    cfg = load_run_config("examples/tiny.yaml")
    run = tmp_path / "run"
    Workspace.init(run, cfg.recipe)
    (run / "tb" / "v0").symlink_to(host / "dir")
    (run / "checkpoints" / "v0").symlink_to(host / "dir")
    with Workspace(run, writer=True, version="v0") as ws:
        with pytest.raises(WorkspaceError, match=r"tb/v0"):
            TrainWriter(ws, "v0", cfg.recipe)
        with pytest.raises(WorkspaceError, match=r"checkpoints/v0"):
            ws.checkpoint_dir("v0")
    assert sorted(p.name for p in (host / "dir").iterdir()) == ["1"]


@pytest.mark.parametrize("spelling", ["foreign", "alias_path", "alias_out"])
def test_diagnose_out_inside_the_folder_read_follows_no_link_by_any_spelling(tmp_path, host, spelling):
    """Review 8 C-R8: review 7's `--out` check compared the paths as written and covered run folders only:
    `diagnose fo --out fo/plots/mine` (a foreign folder, plots a link), `diagnose alias --out RUN/reports/m`
    (alias -> RUN, reports a link) and `diagnose RUN --out alias/reports/m` all wrote their plot into the host
    folder. Now an --out that lies inside the folder read by any spelling is made through no link there."""
    from typer.testing import CliRunner

    from evotrainer.cli import app

    fo = tmp_path / "fo"
    fo.mkdir()
    (fo / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.1}\n{"step": 2, "reward/mean": 0.2}\n')
    (fo / "plots").symlink_to(host / "dir")
    (tmp_path / "alias").symlink_to(fo)
    read, out = {"foreign": (fo, fo / "plots" / "mine"), "alias_path": (tmp_path / "alias", fo / "plots" / "mine"),
                 "alias_out": (fo, tmp_path / "alias" / "plots" / "mine")}[spelling]
    r = CliRunner().invoke(app, ["diagnose", str(read), "--out", str(out)])
    assert r.exit_code != 0 and "plots" in str(r.exception or r.output), r.output
    assert sorted(p.name for p in (host / "dir").iterdir()) == ["1"]
    # an --out elsewhere is the caller's choice, and a real folder inside is written as before
    r = CliRunner().invoke(app, ["diagnose", str(read), "--out", str(fo / "mine")])
    assert r.exit_code == 0, r.output
    assert [p.suffix for p in (fo / "mine").iterdir()] == [".png"]


def test_an_alias_bomb_value_in_a_recipe_is_shown_briefly_and_fast(tmp_path):
    """Review 8 K-R8: a 700-byte recipe YAML whose eps_clip_high is an alias nesting 10 items 9 levels deep (10^9
    leaves): `recipe validate` built the full repr of the value for its error (killed at 60 s; `init --recipe` a
    MemoryError). The error showed a bounded repr and the item count, within a second; since review 14 (G-R14) config
    files load through the bounded loader too, so the bomb is refused where its aliases cross the bound."""
    import time

    from typer.testing import CliRunner

    from evotrainer.cli import app

    lines = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    f = tmp_path / "bomb.yaml"
    f.write_text("_bomb:\n" + "\n".join("  " + ln for ln in lines) + "\neps_clip_high: *a8\n")
    t0 = time.monotonic()
    r = CliRunner().invoke(app, ["recipe", "validate", str(f)])
    took = time.monotonic() - t0
    assert r.exit_code == 1 and took < 10, (took, r.output)
    text = r.output + str(r.exception or "")
    assert "bomb.yaml: not valid YAML: the aliases up to *a4 expand the document by 1,135,768 characters, past the " \
           "bound of 1,000,000 (an alias bomb?)" in " ".join(text.split()) and len(text) < 2000, text



def test_a_recipe_integer_of_thousands_of_digits_is_refused_naming_file_and_line(tmp_path):
    """Review 20 O3-R20: a recipe whose seed had 5,000 digits ended `recipe validate` with Python's "use
    sys.set_int_max_str_digits()" advice. The loader refuses an integer past MAX_JSON_INT_DIGITS (64) digits, naming
    the file, the line and the fix; 64 digits still load."""
    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.recipe import load_yaml

    f = tmp_path / "big.yaml"
    f.write_text("algo: grpo\nseed: " + "9" * 5000 + "\n")
    r = CliRunner().invoke(app, ["recipe", "validate", str(f)])
    text = " ".join((r.output + str(r.exception or "")).split())
    assert r.exit_code == 1, text
    assert "big.yaml: an integer of 5,000 digits at line 2, past the 64 a YAML integer may have here" in text, text
    assert "set_int_max_str_digits" not in text and len(text) < 1000, text
    assert load_yaml("x: " + "9" * 64) == {"x": int("9" * 64)}
    assert load_yaml("x: -1_000") == {"x": -1000}

# --- review 10: parser limits, rollout-row caps, text that does not encode (P-R10, Q-R10, R-R10, U-R10) ------------
@pytest.mark.parametrize("rel, body, steps", [
    ("train.log", "{'step': 1, 'reward': 0.5}\n{'step': 2, 'reward': " + "-" * 100_000 + "1}\n"
     "{'step': 3, 'reward': " + "-" * 5_000 + "1}\n{'step': 4, 'reward': " + "-" * 990 + "1}\n{'step': 5, 'reward': 0.7}\n",
     [1, 5]),
    ("train.log", "step:1 - critic/score/mean:0.5\nstep:2 - critic/score/mean:0.6\n"
     "Final validation metrics: {'val/score': " + "-" * 5_000 + "1}\n", [1, 2]),
])
def test_a_console_line_the_python_parser_cannot_take_is_skipped_not_the_file(tmp_path, rel, body, steps):
    """Review 10 P-R10: a console dict ``{'step': 2, 'reward': `` + 100,000 ``-`` + ``1}`` made CPython's parser
    raise MemoryError ("error: MemoryError:" from ``diagnose`` and ``import``); 5,000 or 990 ``-`` a RecursionError
    that rejected the whole file. Such a line is skipped, as any line that is no dict; the good lines are read."""
    src = tmp_path / "foreign"
    src.mkdir()
    (src / rel).write_text(body)
    ev = ingest(src)
    assert ev.series("foreign", "reward/mean")[0].tolist() == steps
    out = import_run(src, tmp_path / "run")
    assert out.n_steps == len(steps)


def test_a_wandb_csv_cell_past_the_csv_field_limit_is_named_with_the_file(tmp_path):
    """Review 10 P-R10: a W&B CSV export with one 200,000-character cell ended ``diagnose`` with "error: Error: field
    larger than field limit (131072)", naming no file. The IngestError names the file, the line and the fix."""
    f = tmp_path / "wandb_export.csv"
    f.write_text('Step,run - reward/mean\n1,0.1\n2,"' + "x" * 200_000 + '"\n')
    with pytest.raises(IngestError, match=rf"^{f}:3: not a W&B CSV export \(field larger than field limit .*remove "
                                          r"that column or row"):
        ingest(f)
    (tmp_path / "train.log").write_text(GOOD)  # in a folder, the other files are still read
    assert ingest(tmp_path).series(tmp_path.name, "reward/mean")[0].tolist() == list(range(1, 15))


def _verl_dump(path, n, step=1):
    path.write_text("".join(json.dumps({"input": f"q{i % 7}", "output": "a b", "score": i % 2, "step": step}) + "\n"
                            for i in range(n)))


def test_a_verl_dump_past_the_rollout_row_cap_is_read_in_part_and_said(tmp_path, monkeypatch):
    """Review 10 R-R10: a 48 MB verl dump of 2,000,000 rows ``{"output":"","score":0}`` took 2.15 GB and 33 s
    (one dict a rollout, ~45x the file; under the 1 GiB file cap ~46 GB). At most MAX_ROLLOUT_ROWS rows are read
    per run, from all its dumps together, the first ones, and a warning says so (the cap is lowered here)."""
    from evotrainer.harness import ingest as ingest_mod
    from evotrainer.harness.ingest import IngestWarning

    monkeypatch.setattr(ingest_mod, "MAX_ROLLOUT_ROWS", 1000)
    one = tmp_path / "one"
    one.mkdir()
    _verl_dump(one / "1.jsonl", 5000)
    with open(one / "1.jsonl", "a") as f:
        f.write("{not json\n")  # past the cap: not parsed
    with pytest.warns(IngestWarning, match=r"1\.jsonl: read the first 1,000 rollout rows, the rest are left out "
                                           r"\(a cap of 1,000 rollout rows per run read, MAX_ROLLOUT_ROWS\)"):
        ev = ingest(one)
    assert ev.rollouts.num_rows == 1000 and ev.rollouts.column("sample_idx").to_pylist()[:8] == [0] * 7 + [1]
    two = tmp_path / "two"  # per run read: the second dump gets what the first left
    two.mkdir()
    _verl_dump(two / "1.jsonl", 700, step=1)
    _verl_dump(two / "2.jsonl", 700, step=2)
    with pytest.warns(IngestWarning, match=r"2\.jsonl: read the first 300 rollout rows, the rest are left out \(the "
                                           r"rest of a cap of 1,000"):
        ev = ingest(two)
    assert ev.rollouts.column("step").value_counts().to_pylist() == [{"values": 1, "counts": 700},
                                                                    {"values": 2, "counts": 300}]
    _verl_dump(two / "3.jsonl", 10, step=3)  # nothing is left for a third dump: it is not read, and that is said
    with pytest.warns(IngestWarning) as said:
        assert ingest(two).rollouts.num_rows == 1000
    assert [str(w.message).split(": ", 1)[1][:44] for w in said] == [
        "read the first 300 rollout rows, the rest ar", "not read: 1,000 rollout rows (the cap per ru"]
    # `import` keeps what was left out in its summary and in the run log, as warnings
    with pytest.warns(IngestWarning):
        out = import_run(one, tmp_path / "run")
    assert out.n_rollouts == 1000 and len(out.notes) == 1 and "read the first 1,000 rollout rows" in out.notes[0]
    with Workspace.open(tmp_path / "run") as ws:
        assert [r["message"] for r in ws.read_logs() if r["level"] == "warning" and r["source"] == "import"] == out.notes


def _trl_parquet(path, n, text_chars=1000):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    i = pa.array(np.zeros(n, dtype=np.int32))
    pq.write_table(pa.table({
        "step": pa.array(np.arange(n) // 100, type=pa.int64()),
        "prompt": pa.DictionaryArray.from_arrays(i, pa.array(["p" * 100])),
        "completion": pa.DictionaryArray.from_arrays(i, pa.array(["x" * text_chars])),
        "accuracy_reward": pa.array(np.ones(n)), "advantage": pa.array(np.zeros(n))}), path, compression="zstd")


def test_a_trl_parquet_that_decodes_past_the_caps_is_read_in_part_and_said(tmp_path, monkeypatch):
    """Review 10 Q-R10: a 256 KB ``completions.parquet`` of 2,000,000 rows sharing one dictionary-encoded
    1,000-character completion was read with ``read_table(...).to_pylist()``: 2.7 GB, then MemoryError. It is read a
    batch at a time, to MAX_ROLLOUT_ROWS rows (lowered here) and to the file cap of decoded text; a footer whose
    uncompressed size passes the file cap is refused before any row is read."""
    from evotrainer.harness import ingest as ingest_mod
    from evotrainer.harness.ingest import IngestWarning

    monkeypatch.setattr(ingest_mod, "MAX_ROLLOUT_ROWS", 1000)
    src = tmp_path / "trl"
    src.mkdir()
    _trl_parquet(src / "completions.parquet", 5000)
    with pytest.warns(IngestWarning, match=r"completions\.parquet: read the first 1,000 rollout rows of 5,000, the "
                                           r"rest are left out \(a cap of 1,000 rollout rows per run read"):
        ev = ingest(src)
    rows = ev.rollouts
    assert rows.num_rows == 1000 and rows.column("step").to_pylist()[-1] == 9
    assert rows.column("reward").to_pylist()[0] == 1.0 and len(rows.column("completion")[0].as_py()) == 1000
    # decoded text past the file cap (1 MiB here): 5,000 rows of ~1.1 KB decode to 5.5 MB
    monkeypatch.setattr(ingest_mod, "MAX_ROLLOUT_ROWS", 10_000)
    monkeypatch.setenv("EVOTRAINER_INGEST_MAX_MB", "1")
    with pytest.warns(IngestWarning, match=r"read the first 9\d\d rollout rows of 5,000, the rest are left out: the "
                                           r"next ones decode to more than the 1 MiB of text a run file may have"):
        assert 900 <= ingest(src).rollouts.num_rows < 1000
    # one 2 MiB completion: the footer says 2 MiB uncompressed (the file is a few KB)
    big = tmp_path / "big"
    big.mkdir()
    _trl_parquet(big / "completions.parquet", 10, text_chars=2 << 20)
    assert (big / "completions.parquet").stat().st_size < 64 << 10
    with pytest.raises(IngestError, match=r"completions\.parquet: 2 MiB of data once decompressed, more than the 1 "
                                          r"MiB a run file may have; set EVOTRAINER_INGEST_MAX_MB higher"):
        ingest(big)


@pytest.mark.parametrize("rel, body", [
    ("metrics.jsonl", '{"step": 1, "reward/\\ud800x/mean": 0.1, "reward/mean": 0.1}\n'
                      '{"step": 2, "reward/\\ud800x/mean": 0.2, "reward/mean": 0.3}\n'),
    ("trainer_state.json", '{"log_history": [{"step": 1, "reward/\\udfffx": 0.1, "reward": 0.1}, '
                           '{"step": 2, "reward/\\udfffx": 0.2, "reward": 0.3}]}'),
    ("history.json", '[{"_step": 1, "\\ud800": 1.0, "reward/mean": 0.1}, {"_step": 2, "reward/mean": 0.3}]'),
])
def test_a_metric_name_that_is_no_utf8_is_dropped(tmp_path, rel, body):
    """Review 10 U-R10 (1): a JSONL key ``reward/\\ud800x/mean`` (a lone surrogate) ended ``import`` with a bare
    UnicodeEncodeError naming no file, and left a half-made run. The name is dropped, as a value that is no number."""
    src = tmp_path / "foreign"
    src.mkdir()
    (src / rel).write_text(body)
    out = import_run(src / rel, tmp_path / "run")
    assert (out.n_steps, out.n_metrics) == (2, 1)
    with Workspace.open(tmp_path / "run") as ws:
        assert ws.lineage.metric_names("v0") == ["reward/mean"]


def test_rollout_text_that_is_no_utf8_is_imported_with_a_replacement(tmp_path):
    """Review 10 U-R10 (1), in a verl dump: a lone surrogate in ``input`` / ``output`` ended the reading of the dump
    (the prompt id's UTF-8 encoding); it is a ``?`` now, and the dump imports."""
    src = tmp_path / "foreign"
    src.mkdir()
    (src / "1.jsonl").write_text('{"input": "q\\ud800", "output": "a \\udfff b", "score": 1}\n'
                                 '{"input": "q\\ud800", "output": "c", "score": 0}\n')
    out = import_run(src, tmp_path / "run")
    assert out.n_rollouts == 2
    with Workspace.open(tmp_path / "run") as ws:
        rows = ws.rollouts.to_arrow(columns=["prompt", "completion"]).to_pylist()
    assert sorted((r["prompt"], r["completion"]) for r in rows) == [("q?", "a ? b"), ("q?", "c")]


def test_a_failed_import_leaves_no_run_and_a_retry_works(tmp_path, monkeypatch):
    """Review 10 U-R10 (1): an import that failed half-way left v0 ``proposed`` without metrics, and a retry said
    "holds a run already". The run is built in a hidden sibling and renamed into place at the end, as ``init``
    does; a failure removes the sibling and leaves nothing."""
    from evotrainer.harness import importer

    src = tmp_path / "foreign"
    src.mkdir()
    (src / "train.log").write_text(GOOD)
    run = tmp_path / "run"

    def boom(*a, **kw):
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    with monkeypatch.context() as m:
        m.setattr(importer, "line_level", boom)  # fails after the lineage has v0 and its metrics
        with pytest.raises(UnicodeEncodeError):
            import_run(src, run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign"]  # no run, no hidden build folder
    assert import_run(src, run).n_steps == 14
    with Workspace.open(run) as ws:
        assert ws.lineage.get("v0").status == "trained"
    # an existing empty folder, and one holding other files, are filled as before; the run's own names are not
    # overwritten
    (tmp_path / "empty").mkdir()
    assert import_run(src, tmp_path / "empty").n_steps == 14
    other = tmp_path / "other"
    (other / "logs").mkdir(parents=True)
    (other / "notes.txt").write_text("mine")
    (other / ".writer.lock").write_text("")  # a lock file of its own is kept
    assert import_run(src, other).n_steps == 14 and (other / "notes.txt").read_text() == "mine"
    (tmp_path / "taken" / "logs").mkdir(parents=True)
    (tmp_path / "taken" / "logs" / "x").write_text("mine")
    with pytest.raises(RunImportError, match=r"taken holds logs already; import into a new or empty folder"):
        import_run(src, tmp_path / "taken")
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["logs"]
    assert not [p for p in tmp_path.iterdir() if ".import-" in p.name]
    # a folder that exists in a parent this user may not write: built inside it, then moved out entry by entry
    (tmp_path / "given").mkdir()
    with monkeypatch.context() as m:
        m.setattr(importer.os, "access", lambda p, mode: Path(p) != tmp_path)
        assert import_run(src, tmp_path / "given").n_steps == 14
    assert not [p for p in (tmp_path / "given").iterdir() if ".import-" in p.name]
    with Workspace.open(tmp_path / "given") as ws:
        assert ws.lineage.get("v0").status == "trained"


# --- review 10: L-R10, D-R10, V-R10, U-R10 (2): crafted lineage.db content --------------------------------------
_JOBS_WITH_CHECK = (
    "CREATE TABLE j2 AS SELECT * FROM jobs; DROP TABLE jobs; CREATE TABLE jobs (id TEXT PRIMARY KEY, version_id TEXT "
    "REFERENCES versions(id), kind TEXT NOT NULL, status TEXT NOT NULL CHECK (length(status) >= 0), progress REAL NOT "
    "NULL DEFAULT 0, steps_done INTEGER NOT NULL DEFAULT 0, steps_total INTEGER NOT NULL DEFAULT 0, pid INTEGER, "
    "message TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL, updated_at REAL NOT NULL); "
    "INSERT INTO jobs SELECT * FROM j2; DROP TABLE j2;")


@pytest.mark.parametrize("sql, found", [
    ("ALTER TABLE versions ADD COLUMN g GENERATED ALWAYS AS (length(id) + 1) VIRTUAL;",
     r"a generated column versions\.g, which EvoTrainer's lineage schema never has \(a crafted or foreign file\): it "
     r"is computed each time a row is read; not opened\. Use a run folder EvoTrainer wrote, or drop it \(`sqlite3 "
     r".*lineage\.db 'ALTER TABLE \"versions\" DROP COLUMN \"g\"'`\)$"),
    ("ALTER TABLE kv ADD COLUMN extra TEXT;", r"column kv\.extra, which EvoTrainer's lineage schema never has"),
    (_JOBS_WITH_CHECK, r"a CHECK constraint on table 'jobs' \(\"CHECK \(length\(status\) >= 0\).*\), which EvoTrainer's "
                       r"lineage schema never has \(a crafted or foreign file\); not opened\. Use a run folder "
                       r"EvoTrainer wrote$"),
    ("CREATE INDEX costly ON metrics(length(name) + value);",
     r"index 'costly' on table 'metrics', which EvoTrainer's lineage schema never has .*DROP INDEX \"costly\""),
    ("CREATE TABLE child(k TEXT REFERENCES kv(key));", r"table 'child', which EvoTrainer's lineage schema never has"),
])
def test_a_lineage_db_with_schema_objects_the_store_never_makes_is_not_opened(tmp_path, sql, found):
    """Review 10 L-R10: a VIRTUAL generated column added to ``versions`` of a 57 KB lineage.db from elsewhere is
    computed each time ``SELECT *`` reads a row (an O(n*m) expression made ``lineage show`` take 16 s and ``report``
    207 s for one version; scaled, hours); a CHECK constraint naming ``jobs.status`` did the same to every writable
    open (8 s per running job). Every table, column and index the store never makes is refused at open, named with
    the fix, and the file is left as it was. The generated column here is cheap: the test asserts the refusal, not a
    time."""
    import sqlite3

    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.lineage import LineageError, LineageStore

    run = make_run(tmp_path)
    db = run / "lineage.db"
    c = sqlite3.connect(db)
    c.executescript(sql)
    c.commit()
    c.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for readonly in (False, True):
        with pytest.raises(LineageError, match=rf"^{db}: holds {found}"):
            LineageStore(db, readonly=readonly)
    r = CliRunner().invoke(app, ["lineage", "show", str(run)])
    assert r.exit_code == 1 and isinstance(r.exception, LineageError), (r.exception, r.output)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_lineage_db_from_before_a_migration_still_opens(tmp_path):
    """The L-R10 check accepts the schema after each migration: a store written before ``002_version_role`` (no
    ``versions.role``) opens read-only as it is, and a writable open migrates it."""
    import sqlite3

    from evotrainer.lineage import LineageStore
    from evotrainer.recipe import Recipe

    path = tmp_path / "lineage.db"
    s = LineageStore(path)
    s.create_root(Recipe())
    s.close()
    c = sqlite3.connect(path)
    c.executescript("ALTER TABLE versions DROP COLUMN role; DELETE FROM _migrations WHERE name = '002_version_role';")
    c.commit()
    c.close()
    ro = LineageStore(path, readonly=True)
    assert ro.root().id == "v0" and ro.root().role == ""
    ro.close()
    s = LineageStore(path)
    assert [r[1] for r in s._db.execute("PRAGMA table_info(versions)")][-1] == "role"
    assert s.root().id == "v0"
    s.close()


@pytest.mark.parametrize("table", ["metrics", "kv"])
def test_a_damaged_page_read_after_open_names_the_file(tmp_path, table):
    """Review 10 D-R10: a lineage.db whose ``metrics`` (or ``kv``) root page is overwritten opens (the open reads
    ``versions`` and ``jobs``), and the first read of that table ended ``report`` with a bare "DatabaseError: database
    disk image is malformed" naming no file. It is the LineageError of a damaged file, with the fix."""
    import sqlite3

    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.lineage import LineageError, LineageStore

    run = make_run(tmp_path)
    db = run / "lineage.db"
    with Workspace(run, writer=True) as ws:
        ws.lineage.kv_set("loop/mode", "evotrainer")
    c = sqlite3.connect(db)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = c.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    size = c.execute("PRAGMA page_size").fetchone()[0]
    c.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * size)
        f.write(b"\x0d" + b"\xff" * (size - 1))
    store = LineageStore(db, readonly=True)
    try:
        with pytest.raises(LineageError, match=rf"^{db}: damaged, not a readable lineage database \(database disk "
                                               rf"image is malformed\); not read\. Use an undamaged copy of the run "
                                               rf"folder \(what still reads can be saved with `sqlite3 {db} "
                                               r"\.recover`\)$"):
            store.all_metrics("v0") if table == "metrics" else store.kv_items()
    finally:
        store.close()
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 1 and isinstance(r.exception, LineageError), (r.exception, r.output)
    assert str(r.exception).startswith(f"{db}: damaged")


@pytest.mark.parametrize("key, value, got, want", [
    ("loop/compute", '"x"', "text 'x'", "a JSON object"),
    ("loop/config", "[1]", r"a JSON list \[1\]", "a JSON object"),
    ("loop/final", "7", "a number 7", "a JSON object"),
    ("loop/usage", "true", "true or false True", "a JSON object"),
    ("loop/diagnose/v0", '"x"', "text 'x'", "a JSON object"),
    ("loop/eval/v0/heldout", "[0.5]", r"a JSON list \[0\.5\]", "a JSON object"),
    ("loop/eval/v0/no_rl", '"x"', "text 'x'", "a JSON object"),
    ("loop/gate/v1", '"x"', "text 'x'", "a JSON object"),
    ("loop/started_at", '"yesterday"', "text 'yesterday'", "a number"),
    ("loop/mode", "5", "a number 5", "text"),
    ("loop/r1/evolve", '{"a": 1}', r"a JSON object \{'a': 1\}", "a JSON list"),
    ("loop/r1/propose", '"x"', "text 'x'", "a JSON object"),
    ("loop/final", '{"version": "v1", "test": {"avg@k": "x"}}', "text 'x' at test.avg@k", "a number"),
    ("loop/final", '{"version": ["v1"]}', r"a JSON list \['v1'\] at version", "text"),
    ("loop/eval_tokens", '{"eval/v0/heldout": "x"}', "text 'x' at eval/v0/heldout", "a number"),
    ("loop/config", '{"recipe": {"model": "y"}}', "text 'y' at recipe.model", "a JSON object"),
    ("loop/diagnose/v0", '{"findings": ["x"]}', r"text 'x' at findings\[0\]", "a JSON object"),
    ("loop/usage", '{"turns": 1, "cost_usd": "y"}', "text 'y' at cost_usd", "a number"),
    ("loop/r1/propose", '{"skills_used": [[1]]}', r"a JSON list \[1\] at skills_used\[0\]", "text"),
])
def test_a_run_level_value_of_the_wrong_shape_is_named_not_a_crash(tmp_path, key, value, got, want):
    """Review 10 V-R10: a foreign lineage.db whose kv value the report reads as an object holds a JSON string, list,
    number or bool (or one inside it, where a field is read as an object or a number): ``report`` ended with a bare
    AttributeError / TypeError / ValueError naming neither the file nor the key. A LineageError names the file, the
    key, the field, what it holds, what EvoTrainer writes there and the fix."""
    import sqlite3

    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.lineage import LineageError

    run = make_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?), ('loop/finished', 'true')", (key, value))
    db.commit()
    db.close()
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 1 and isinstance(r.exception, LineageError), (r.exception, r.output)
    assert re.fullmatch(rf"{run / 'lineage.db'}: kv\.value of key '{key}' holds {got}, where EvoTrainer writes {want} "
                        r"\(a crafted or damaged file\); not read\. Use a run folder EvoTrainer wrote, or remove the "
                        rf"value \(`sqlite3 .*lineage\.db \"DELETE FROM kv WHERE key = '{key}'\"`: the run forgets "
                        r"it\)", str(r.exception)), str(r.exception)


@pytest.mark.parametrize("value, bad", [
    ('{"reward/mean": "abc"}', r"'reward/mean': 'abc'"), ("[1]", r"\[1\]"), ('"x"', "'x'"),
    ('{"reward/mean": [1]}', r"'reward/mean': \[1\]"),
])
def test_a_metrics_summary_of_the_wrong_shape_is_named_not_a_crash(tmp_path, value, bad):
    """Review 10 V-R10: ``versions.metrics_summary = '{"reward/mean": "abc"}'`` (or ``[1]``) ended ``lineage show``
    with a bare ValueError / TypeError. As the other JSON columns of a version, a LineageError names the file, the
    version and the column; a summary EvoTrainer writes (numbers, the ``data_split`` digest) still reads."""
    import sqlite3

    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.lineage import LineageError

    run = make_run(tmp_path)
    with Workspace(run, writer=True) as ws:
        ws.lineage.update_version("v0", metrics_summary={"reward/mean": 0.5, "steps": 4, "data_split": "ab12",
                                                         "x": None})
        assert ws.lineage.get("v0").metrics_summary["data_split"] == "ab12"
    db = sqlite3.connect(run / "lineage.db")
    db.execute("UPDATE versions SET metrics_summary = ? WHERE id = 'v1'", (value,))
    db.commit()
    db.close()
    r = CliRunner().invoke(app, ["lineage", "show", str(run)])
    assert r.exit_code == 1 and isinstance(r.exception, LineageError), (r.exception, r.output)
    assert re.fullmatch(rf"{run / 'lineage.db'}: version 'v1': its versions\.metrics_summary holds {bad}, where "
                        r"EvoTrainer writes a JSON object of metric numbers \(a crafted or damaged file\); not read\. "
                        r"Use a run folder EvoTrainer wrote", str(r.exception)), str(r.exception)


def test_a_metric_name_that_is_not_utf8_reads_with_a_replacement_character(tmp_path):
    """Review 10 U-R10 (2): a crafted ``metrics.name`` of invalid UTF-8 ended ``report`` and ``diagnose`` with a bare
    "OperationalError: Could not decode to UTF-8 column 'name'". Such text reads with U+FFFD in place of the bad
    byte, and the report is made."""
    import sqlite3

    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app

    run = make_run(tmp_path)
    db = sqlite3.connect(run / "lineage.db")
    db.execute("INSERT INTO metrics VALUES ('v0', 1, CAST(X'7265776172642FFF' AS TEXT), 0.5)")
    db.commit()
    db.close()
    with Workspace.open(run) as ws:
        assert ws.lineage.metric_names("v0") == ["reward/mean", "reward/\ufffd"]
        assert ws.lineage.all_metrics("v0")["reward/\ufffd"] == [(1, 0.5)]
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 0, (r.exception, r.output)


def test_a_row_id_counter_at_its_maximum_is_named_not_a_failed_rollback(tmp_path):
    """Review 11, A-R11: sqlite_sequence of `decisions` at 2**63-1 in a lineage.db from elsewhere: the INSERT failed
    with SQLITE_FULL, SQLite ended the transaction itself, and tx's ROLLBACK raised 'cannot rollback - no transaction
    is active', hiding the cause (and a real full disk read the same)."""
    import sqlite3

    from evotrainer.lineage import LineageError, LineageStore
    from evotrainer.recipe import Recipe

    Workspace.init(tmp_path / "run", Recipe())
    db = sqlite3.connect(tmp_path / "run" / "lineage.db")
    db.execute("INSERT INTO sqlite_sequence VALUES ('decisions', 9223372036854775807)")
    db.commit()
    db.close()
    store = LineageStore(tmp_path / "run" / "lineage.db")
    try:
        with pytest.raises(LineageError, match="could not write .*full.*sqlite_sequence"):
            store.decide("v0", "prune", "x")
        assert store.get("v0").status != "pruned" and not store._db.in_transaction
    finally:
        store.close()


def test_a_full_disk_at_commit_and_a_held_lock_are_named_by_kv_update(tmp_path):
    """Review 12, F-R12: on a full disk kv_update of a 190 KB value failed at COMMIT (SQLite writes the pages to the
    WAL only then), outside tx's SQLITE_FULL mapping: MCP register_analyzer answered the raw "OperationalError:
    database or disk is full". A COMMIT that fails, and a write lock another process holds past the busy timeout,
    are named now (the file, the cause, the fix), and nothing is written."""
    import sqlite3

    from mcp_testlib import FullOnCommit

    from evotrainer.lineage import LineageError, LineageStore
    from evotrainer.recipe import Recipe

    Workspace.init(tmp_path / "run", Recipe())
    path = tmp_path / "run" / "lineage.db"
    store = LineageStore(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        db, store._db = store._db, FullOnCommit(store._db)
        try:
            with pytest.raises(LineageError) as err:
                store.kv_update("analyzers/registered", lambda s: {**(s or {}), "big_one": {"code": "x" * 190_000}})
        finally:
            store._db = db
        assert str(err.value) == (f"{path}: could not write (database or disk is full): the disk is full, or a table's "
                                  "row id counter (sqlite_sequence) is at its maximum in a lineage.db from elsewhere; "
                                  "nothing was written. Free disk space and retry, or copy the run with `evotrainer "
                                  "import`")
        assert store.kv_get("analyzers/registered") is None and not store._db.in_transaction
        other.execute("BEGIN IMMEDIATE")
        store._db.execute("PRAGMA busy_timeout=0")
        with pytest.raises(LineageError) as err:
            store.kv_set("k", 1)
        assert str(err.value) == (f"{path}: could not write (database is locked): another process held the run's "
                                  "store locked for more than 30 s; nothing was written. Retry when it is done (a "
                                  "long `evotrainer` command or a sqlite3 shell on the file)")
        other.execute("ROLLBACK")
        store.kv_set("k", 1)
        assert store.kv_get("k") == 1
    finally:
        other.close()
        store.close()


# --- review 11: C-R11: typed kv reads of import/source and the search modes' keys ----------------------------------
def _set_kv(run: Path, key: str, value: str) -> None:
    import sqlite3

    db = sqlite3.connect(run / "lineage.db")
    db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, value))
    db.commit()
    db.close()


_IMPORT_FIX = (r"Import the foreign run again into a new run folder \(`evotrainer import SOURCE --run NEW_RUN`\), or "
               r"remove the value \(`sqlite3 .*lineage\.db \"DELETE FROM kv WHERE key = 'import/source'\"`: the run is "
               r"then no longer treated as imported\)")


@pytest.mark.parametrize("value, said", [
    ("[1,2]", r"holds a JSON list \[1, 2\], where EvoTrainer writes a JSON object"),
    ('"x"', "holds text 'x', where EvoTrainer writes a JSON object"),
    ('{"version_id": 5, "path": "a.log"}', "holds a number 5 at version_id, where EvoTrainer writes text"),
    ('{"path": "a.log"}', r"has no field 'version_id' \(or it is null\), where EvoTrainer writes a JSON object with "
                          "'version_id'"),
])
def test_an_import_source_of_the_wrong_shape_is_named_not_a_crash(tmp_path, value, said):
    """Review 11 C-R11: a run folder from elsewhere with kv ``import/source`` = ``[1,2]`` made ``evotrainer diagnose
    RUN`` print "error: AttributeError: 'list' object has no attribute 'get'" (Evidence.from_workspace); ``watch``
    and the local backend's imported-run guard read the same row unchecked. A LineageError names the run's
    lineage.db, the key, the shape EvoTrainer writes and the fix (import again, or delete the row)."""
    from mcp_testlib import make_run
    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.harness.watch import Watcher
    from evotrainer.lineage import LineageError

    run = make_run(tmp_path)
    _set_kv(run, "import/source", value)
    want = (rf"{run / 'lineage.db'}: kv\.value of key 'import/source' {said} \(a crafted or damaged file\); not "
            rf"read\. {_IMPORT_FIX}")
    r = CliRunner().invoke(app, ["diagnose", str(run), "--no-plots"])
    assert r.exit_code == 1 and isinstance(r.exception, LineageError), (r.exception, r.output)
    assert re.fullmatch(want, str(r.exception)), str(r.exception)
    with Workspace.open(run) as ws, pytest.raises(LineageError) as err:
        Watcher._imported_version(ws)
    assert re.fullmatch(want, str(err.value)), str(err.value)


def test_an_import_source_that_evotrainer_wrote_still_reads(tmp_path):
    from evotrainer.harness.evidence import Evidence
    from evotrainer.harness.watch import Watcher
    from evotrainer.lineage import import_source

    src = tmp_path / "verl"
    src.mkdir()
    (src / "train.log").write_text(GOOD)
    s = import_run(src, tmp_path / "run")
    with Workspace.open(tmp_path / "run") as ws:
        assert import_source(ws.lineage)["version_id"] == s.version_id == "v0"
        assert Watcher._imported_version(ws) == "v0"
        assert Evidence.from_workspace(ws).recipes == {}  # the imported version's placeholder recipe is not evidence
    _set_kv(tmp_path / "run", "import/source", "null")  # null reads as missing: not an imported run
    with Workspace.open(tmp_path / "run") as ws:
        assert import_source(ws.lineage) is None
        with pytest.raises(RunImportError, match="kv 'import/source' is gone .* watch into a new folder"):
            Watcher._imported_version(ws)


_SEARCH_CASES = [
    ("recipe-search", "loop/trial/1", '[1]', r"holds a JSON list \[1\], where EvoTrainer writes a JSON object"),
    ("recipe-search", "loop/trial/1", '{"params": {"temperature": "hot"}}',
     "holds text 'hot' at params.temperature, where EvoTrainer writes a number"),
    ("recipe-search", "loop/trial/1", '{"p": 1}',
     r"has no field 'params' \(or it is null\), where EvoTrainer writes a JSON object with 'params'"),
    ("greedy", "loop/best", '["v0"]', r"holds a JSON list \['v0'\], where EvoTrainer writes text"),
    ("greedy", "loop/trial/1", '"v1"', "holds text 'v1', where EvoTrainer writes a JSON object"),
    ("greedy", "loop/trial/1", '{"version": "v1"}',
     r"has no field 'parent' \(or it is null\), where EvoTrainer writes a JSON object with 'version', 'parent'"),
    ("pbt", "loop/members", '{"v0": 1}', r"holds a JSON object \{'v0': 1\}, where EvoTrainer writes a JSON list"),
    ("pbt", "loop/members", '[1]', r"holds a number 1 at \[0\], where EvoTrainer writes text"),
    ("pbt", "loop/generation", '"two"', "holds text 'two', where EvoTrainer writes a number"),
    ("pbt", "loop/gen/1", '[1]', r"holds a JSON list \[1\], where EvoTrainer writes a JSON object"),
    ("pbt", "loop/gen/1", '{"scores": {}}',
     r"has no field 'members' \(or it is null\), where EvoTrainer writes a JSON object with 'members'"),
    ("pbt", "loop/gen/1", '{"members": "v0"}', "holds text 'v0' at members, where EvoTrainer writes a JSON list"),
]


@pytest.mark.parametrize("mode, key, value, said", _SEARCH_CASES)
def test_a_search_mode_value_of_the_wrong_shape_is_named_not_a_crash(tmp_path, monkeypatch, mode, key, value, said):
    """Review 11 C-R11: the search modes (recipe-search, greedy, pbt) read their resume state (``loop/trial/<t>``,
    ``loop/best``, ``loop/members``, ``loop/generation``, ``loop/gen/<g>``) unchecked: a run folder from elsewhere
    with another shape there ended a resume with a bare TypeError / KeyError / AttributeError. A LineageError names
    the run's lineage.db, the key, the shape EvoTrainer writes and the fix. The modes run with their training,
    evaluation and lineage calls stubbed: only their kv reads are real."""
    from evotrainer.agents.search import GreedySearch, PBTRun, RecipeSearch
    from evotrainer.config import load_run_config
    from evotrainer.lineage import LineageError
    from evotrainer.recipe import Recipe

    cls = {"recipe-search": RecipeSearch, "greedy": GreedySearch, "pbt": PBTRun}[mode]
    Workspace.init(tmp_path / "run", Recipe())
    if mode == "pbt" and key != "loop/members":
        _set_kv(tmp_path / "run", "loop/members", '["v0"]')
    _set_kv(tmp_path / "run", key, value)
    with Workspace.open(tmp_path / "run") as ws:
        loop = object.__new__(cls)  # no MCP session: the stubs below stand for the tool calls
        loop.config, loop.ws, loop.lineage, loop.emit = load_run_config("examples/tiny.yaml"), ws, ws.lineage, print
        for name, stub in {"start": lambda: "v0", "start_trained": lambda: "v0", "recipe_of": lambda v: Recipe(),
                           "_trial_version": lambda v, p: 0.5, "segment": lambda v: 0.5, "status": lambda v: "kept",
                           "dev_summary": lambda v: {"avg@k": 0.5}, "version_rows": lambda: [],
                           "out_of_budget": lambda: False}.items():
            monkeypatch.setattr(loop, name, stub, raising=False)
        with pytest.raises(LineageError) as err:
            loop.run()
    assert re.fullmatch(rf"{tmp_path / 'run' / 'lineage.db'}: kv\.value of key '{key}' {said} \(a crafted or damaged "
                        r"file\); not read\. Use a run folder EvoTrainer wrote, or remove the value \(`sqlite3 "
                        rf".*lineage\.db \"DELETE FROM kv WHERE key = '{key}'\"`: the run forgets it\)",
                        str(err.value)), str(err.value)


def test_a_verl_dump_row_keeps_its_first_64_numeric_fields_as_components(tmp_path):
    """Review 11 D-R11: a 27 MB verl dump of 3,000 rows of 1,000 numeric keys each kept every key as a reward
    component (3,000,000 of them: 0.6-1.1 GB). A row keeps its first MAX_ROLLOUT_COMPONENTS (64) numeric fields, and
    a warning says how many rows had more and how many fields were left out."""
    from evotrainer.harness.ingest import MAX_ROLLOUT_COMPONENTS, IngestWarning

    assert MAX_ROLLOUT_COMPONENTS == 64
    src = tmp_path / "vd"
    src.mkdir()
    keys = ",".join(f'"k{j}":{j}' for j in range(100))
    (src / "1.jsonl").write_text("".join('{"output":"a","score":1,' + keys + "}\n" for _ in range(10))
                                 + '{"output":"b","score":0,"k1":1}\n')
    with pytest.warns(IngestWarning, match=r"1\.jsonl: 10 rollout rows have more than 64 numeric fields: the first 64 "
                                           r"of each are kept as its reward components, 360 fields are left out \(a "
                                           r"cap per rollout row, MAX_ROLLOUT_COMPONENTS\)"):
        ev = ingest(src)
    comps = [json.loads(c) for c in ev.rollouts.column("components").to_pylist()]
    assert len(comps) == 11 and comps[0] == {f"k{j}": float(j) for j in range(64)} and comps[10] == {"k1": 1.0}
    assert ev.rollouts.column("reward").to_pylist()[:2] == [1.0, 1.0]


def _tb_scalars(folder, n):
    """A TensorBoard event file of ``n`` scalar events ``train/loss`` (steps 0..n-1, value = the step)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(folder))
    for i in range(n):
        w.add_event(event_pb2.Event(step=i, wall_time=1.0, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="train/loss", simple_value=float(i))])))
    w.close()


@pytest.mark.parametrize("fmt", ["jsonl", "trainer_state", "mlflow", "tensorboard", "verl_log", "wandb_csv"])
def test_a_metrics_file_past_the_step_cap_is_thinned_evenly_and_said(tmp_path, monkeypatch, fmt):
    """Review 11 D-R11b: 1,000,000 one-metric records (a 25 MB JSONL, trainer_state.json or MLflow metrics file)
    took 0.5-0.8 GB, a TensorBoard file of 700,000 scalar events 0.6 GB. Past MAX_METRIC_STEPS steps (lowered here
    to 1,000) a metrics file read keeps every n-th step (n doubling at each thinning) from its first step to its
    last, and a warning says how many points were read, kept and dropped. 5,000 steps: thinned at 1,001 steps to
    every 2nd, at 2,000 to every 4th, at 4,000 to every 8th: steps 0, 8, ..., 4992 (625 points)."""
    from evotrainer import points
    from evotrainer.harness.ingest import IngestWarning

    monkeypatch.setattr(points, "MAX_METRIC_STEPS", 1000)
    src = tmp_path / "run"
    src.mkdir()
    n = 5000
    if fmt == "jsonl":
        (src / "metrics.jsonl").write_text("".join(f'{{"step":{i},"loss":{i}}}\n' for i in range(n)))
    elif fmt == "trainer_state":
        (src / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": i, "loss": i} for i in range(n)]}))
    elif fmt == "mlflow":
        (src / "mlruns" / "1" / "abc" / "metrics").mkdir(parents=True)
        (src / "mlruns" / "1" / "abc" / "metrics" / "loss").write_text("".join(f"1700000000000 {i} {i}\n"
                                                                              for i in range(n)))
    elif fmt == "tensorboard":
        _tb_scalars(src, n)
    elif fmt == "wandb_csv":
        (src / "export.csv").write_text("Step,train/loss\n" + "".join(f"{i},{i}\n" for i in range(n)))
    else:
        (src / "train.log").write_text("".join(f"step:{i} - actor/pg_loss:{i}\n" for i in range(n)))
    with pytest.warns(IngestWarning, match=r": read 5,000 metric points, kept 625 \(625 steps, about 1 step in 8, "
                                           r"from the first to the last\), 4,375 dropped: every series is thinned "
                                           r"evenly over the run past the caps of 1,000 steps and 1,000,000 values "
                                           r"per metrics file read \(MAX_METRIC_STEPS, MAX_METRIC_POINTS\)"):
        ev = ingest(src)
    (version,) = ev.metrics
    (name,) = ev.metrics[version]
    steps, values = ev.series(version, name)
    assert list(steps) == list(range(0, n, 8)) and list(values) == [float(s) for s in range(0, n, 8)]


def test_step_records_thin_by_steps_values_and_names():
    """StepRecords (evotrainer/points.py): nothing dropped within the caps, even thinning past the step cap and past
    the value cap, steps out of order after thinning dropped, and a step's names past MAX_STEP_METRICS dropped."""
    from evotrainer.points import StepRecords, thin_series

    r = StepRecords(max_steps=10, max_points=1000)
    for s in (5, 3, 9, 0, 1, 2, 4, 6, 7, 8):  # within the cap: any order, every point kept
        r.add(s, "a", s)
        r.add(s, "b", -s)
    assert (len(r), r.points, r.dropped, r.gap) == (10, 20, 0, 0)
    r.add(10, "a", 10)  # the 11th step: on a grid of 2 (the half holding more held steps, 0-10), gap 2
    assert (sorted(r), r.points, r.dropped, r.gap) == ([0, 2, 4, 6, 8, 10], 11, 10, 2)
    r.add(11, "a", 11)  # within the gap after 10: dropped
    r.add(3, "a", 3)  # off the grid: dropped
    r.add(10, "b", -10)  # a held step still merges
    r.add(12, "a", 12)
    assert (sorted(r), r[10], r.read, r.points, r.dropped) == ([0, 2, 4, 6, 8, 10, 12], {"a": 10, "b": -10}, 25, 13,
                                                               12)
    v = StepRecords(max_steps=1000, max_points=50)  # 10 values a step: thinned at the 6th step (60 values > 50)
    for s in range(20):
        v.add_all(s, {f"m{j}": float(j) for j in range(10)})
    assert (sorted(v), v.points, v.read, v.dropped) == ([0, 4, 8, 12, 16], 50, 200, 150)
    w = StepRecords(max_step_metrics=3)
    w.add_all(1, {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0})
    w.add(1, "a", 5.0)
    assert (w[1], w.dropped) == ({"a": 5.0, "b": 2.0, "c": 3.0}, 1)
    pts, dropped = thin_series(((i, float(i)) for i in range(10)), 4)
    assert (pts, dropped) == ([(0, 0.0), (4, 4.0), (8, 8.0)], 7)
    assert thin_series(((i, 0.0) for i in range(4)), 4) == ([(i, 0.0) for i in range(4)], 0)


_ORDERS = {"increasing": list(range(1, 3001)), "decreasing": list(range(3000, 0, -1)),
           "shuffled": random.Random(0).sample(range(1, 3001), 3000)}


_KEPT = {"increasing": list(range(1, 3001, 4)), "decreasing": [1, *range(4, 3001, 4)],
         "shuffled": list(range(1, 3001, 4))}


@pytest.mark.parametrize("order", ["increasing", "decreasing", "shuffled"])
def test_thinning_keeps_an_even_spread_in_any_arrival_order(tmp_path, monkeypatch, order):
    """Review 12 D-R12b: a metrics.jsonl of 300,000 lines with decreasing steps (300000..1) kept 50,001 steps, all
    from 200,000 to 300,000 (the steps read after the first thinning were dropped as before the last kept step),
    while the warning said the series was thinned evenly from the first to the last step. Now each bucket of
    ``gap`` consecutive steps keeps its lowest step (gap doubling): steps 1..3,000 past MAX_METRIC_STEPS (lowered
    to 1,000) keep 750 steps 4 apart over the whole range in every order; read backwards the buckets start at the
    first thinning's lowest step (2,000), so the lowest bucket [0, 3] keeps step 1 too (751 steps)."""
    from evotrainer import points
    from evotrainer.harness.ingest import IngestWarning

    kept = _KEPT[order]
    monkeypatch.setattr(points, "MAX_METRIC_STEPS", 1000)
    src = tmp_path / "run"
    src.mkdir()
    (src / "metrics.jsonl").write_text("".join(f'{{"step":{i},"loss":{i}}}\n' for i in _ORDERS[order]))
    with pytest.warns(IngestWarning, match=rf": read 3,000 metric points, kept {len(kept)} \({len(kept)} steps, about "
                                           rf"1 step in 4, from the first to the last\), {3000 - len(kept):,} dropped: "
                                           "every series"):
        ev = ingest(src)
    steps, values = ev.series("run", "loss/total")
    assert list(steps) == kept and list(values) == [float(s) for s in kept]
    r = points.StepRecords(max_steps=1000)
    for s in _ORDERS[order]:
        r.add(s, "loss", s)
    assert (sorted(r), r.gap, r.points, r.dropped) == (kept, 4, len(kept), 3000 - len(kept))


def test_thinning_keeps_later_steps_logged_at_another_offset():
    """Review 12 D-R12b, left after its fix: the grid chosen at the first thinning (``(step - origin) % gap == 0``)
    dropped every later step off it, e.g. a run logged every 4 steps from 0 and, after a resume, every 4 steps from
    401: steps 0..400 kept, the 201 steps 401..1201 all dropped. Now each bucket of 16 steps keeps its lowest:
    0, 16, ..., 384, 400 and then 417, 433, ..., 1201 (76 steps, 16 apart over the whole run)."""
    from evotrainer.points import StepRecords

    r = StepRecords(max_steps=100)
    for s in [*range(0, 401, 4), *range(401, 1202, 4)]:
        r.add(s, "loss", float(s))
    assert sorted(r) == [*range(0, 401, 16), *range(417, 1202, 16)]
    assert (r.gap, r.points, r.dropped, r.read) == (16, 76, 226, 302)


def test_a_metrics_file_of_too_many_series_keeps_the_first_by_arrival_and_says(tmp_path, monkeypatch):
    """Review 12 D-R12: a metrics.jsonl of 400 lines of 10,000 names each, every name distinct (4,000,000 one-point
    series, 54.5 MB) took 60 s and 3.15 GB in ``diagnose``: MAX_METRIC_SERIES bounded only the run store. Now a
    metrics file (or run) keeps the first MAX_METRIC_SERIES names by arrival (lowered here to 5); the points of the
    rest are dropped and counted in the warning."""
    from evotrainer import points
    from evotrainer.harness.ingest import IngestWarning

    monkeypatch.setattr(points, "MAX_METRIC_SERIES", 5)
    src = tmp_path / "run"
    src.mkdir()
    (src / "metrics.jsonl").write_text("".join(f'{{"step":{s},' + ",".join(f'"s{s}_{j}":{j}' for j in range(3)) + "}\n"
                                               for s in range(4)))
    with pytest.warns(IngestWarning, match=r"metrics.jsonl: read 12 metric points, kept 5 \(2 steps, about 1 step in "
                                           r"1, from the first to the last\), 7 dropped; 7 of them of series past the "
                                           r"first 5 names \(MAX_METRIC_SERIES\): every series"):
        ev = ingest(src)
    assert sorted(ev.metrics["run"]) == ["s0_0", "s0_1", "s0_2", "s1_0", "s1_1"]


def test_step_records_memory_is_bounded_by_names_held_once_and_the_series_cap():
    """Review 12 D-R12: 4,000,000 values of 10,000 reused names took 1.11 GB (~250 B a value; a JSON parser makes a
    new string for every key of every line) and 4,000,000 one-point series 3.15 GB. StepRecords holds each name
    once and at most MAX_METRIC_SERIES names: 100,000 values of 1,000 names made anew per step peak below 40 B a
    value (about 80 with a string per point), and 100,000 one-point series past a cap of 1,000 below 1 MB."""
    import tracemalloc

    from evotrainer.points import StepRecords

    tracemalloc.start()
    try:
        r = StepRecords()
        for s in range(100):
            r.add_all(s, {"a" + str(j): 1.0 for j in range(1000)})
        reused = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        del r
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        d = StepRecords(max_series=1000)
        for s in range(100):
            d.add_all(s, {f"s{s}_{j}": 1.0 for j in range(1000)})
        distinct = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert reused < 4_000_000
    assert distinct < 1_000_000
    assert (len(d), d.points, d.read, d.dropped, d.series_dropped) == (1, 1000, 100_000, 99_000, 99_000)


def test_a_run_store_series_past_the_cap_is_thinned_evenly_and_said(tmp_path, monkeypatch):
    """Review 11 D-R11c: a lineage.db (schema untouched) with 1,500,000 ``metrics`` rows took 595 MB in ``diagnose``
    and 655 MB in ``report``. LineageStore.all_metrics (which the evidence builder and the report read) reads the rows
    one at a time and keeps at most MAX_METRIC_STEPS points a series (lowered here to 1,000), every n-th from the
    first step to the last, with a warning; a series within the cap is whole."""
    import sqlite3

    from typer.testing import CliRunner

    from evotrainer import points
    from evotrainer.cli import app
    from evotrainer.points import MetricsThinnedWarning
    from evotrainer.recipe import Recipe

    assert points.MAX_METRIC_STEPS == 100_000
    monkeypatch.setattr(points, "MAX_METRIC_STEPS", 1000)
    run = tmp_path / "run"
    Workspace.init(run, Recipe())
    db = sqlite3.connect(run / "lineage.db")
    db.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", [("v0", i, "train/loss", float(i)) for i in range(5000)]
                   + [("v0", i, "train/reward", 0.5) for i in range(1000)])
    db.commit()
    db.close()
    with Workspace.open(run) as ws:
        with pytest.warns(MetricsThinnedWarning, match=r"lineage\.db: version v0: read 6,000 metric points, kept "
                                                       r"1,625, 4,375 dropped: every series of more than 1,000 "
                                                       r"points is thinned evenly from its first step to its last"):
            got = ws.lineage.all_metrics("v0")
        assert got["train/loss"] == [(s, float(s)) for s in range(0, 5000, 8)]
        assert got["train/reward"] == [(s, 0.5) for s in range(1000)]
        assert len(ws.lineage.all_metrics("v0", max_points=0)["train/loss"]) == 5000  # 0: every point
    monkeypatch.setattr(points, "MAX_METRIC_SERIES", 1)  # past the series cap: the first by name kept, the rest said
    with Workspace.open(run) as ws:
        with pytest.warns(MetricsThinnedWarning, match=r"version v0: read 6,000 metric points, kept 625, 5,375 dropped: "
                                                       r"every series of more than 1,000 points is thinned evenly from "
                                                       r"its first step to its last \(MAX_METRIC_STEPS\); 1 series past "
                                                       r"the first 1 by name are left out \(MAX_METRIC_SERIES\)"):
            assert list(ws.lineage.all_metrics("v0")) == ["train/loss"]
        assert len(ws.lineage.all_metrics("v0", max_points=0)) == 2
    monkeypatch.setattr(points, "MAX_METRIC_SERIES", 10_000)
    r = CliRunner().invoke(app, ["report", str(run)])  # the report reads within its own budgets (agents/report.py:
    assert r.exit_code == 0, (r.exception, r.output)  # 5,000 points a series), so these 6,000 points are read whole
    assert "metrics-left-out" not in (run / "reports" / "report.html").read_text()


def test_a_trainer_state_log_history_is_decoded_an_entry_at_a_time(tmp_path):
    """Review 11 D-R11b: ``json.loads`` of a trainer_state.json of 1,000,000 log_history entries held them all (0.4-0.8
    GB). The log_history list is decoded an entry at a time (iter_log_history); 'log_history' inside another value is
    no key, a file that is no object with that list is decoded whole (the old errors), and a bad entry is named."""
    from evotrainer.harness.ingest import iter_log_history, parse_trainer_state_text

    text = ' {"best": ["log_history", {"log_history": 1}], "log_history" : [ {"step": 1, "loss": 2},\n{"step": 2} ] }'
    items = iter_log_history(text)
    assert items is not None and list(items) == [{"step": 1, "loss": 2}, {"step": 2}]
    assert iter_log_history("[1]") is None and iter_log_history('{"a": 1}') is None
    assert parse_trainer_state_text(text) == {1: {"loss": 2.0}}
    with pytest.raises(IngestError, match="trainer_state.json has no log_history list"):
        parse_trainer_state_text('{"log_history": 5}')
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text('{"log_history": [{"step": 1, "loss": 2} {"step": 2}]}')
    with pytest.raises(IngestError, match=r"trainer_state\.json: unreadable \(JSONDecodeError: Expecting ',' delimiter"):
        ingest(run)


def test_a_run_of_several_metrics_files_is_thinned_together_past_the_cap(tmp_path, monkeypatch):
    """Review 11 D-R11b: the cap is per file read and per run (its files together): two JSONL files of 800 steps each
    (steps 0-799 and 800-1599), each within MAX_METRIC_STEPS (lowered to 1,000), are 1,600 steps together: thinned
    at step 1,000 to every 2nd step, 800 kept, with a warning naming the run."""
    from evotrainer import points
    from evotrainer.harness.ingest import IngestWarning

    monkeypatch.setattr(points, "MAX_METRIC_STEPS", 1000)
    src = tmp_path / "run"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(f'{{"step":{i},"loss":{i}}}\n' for i in range(800)))
    (src / "b.jsonl").write_text("".join(f'{{"step":{i},"loss":{i}}}\n' for i in range(800, 1600)))
    with pytest.warns(IngestWarning, match=r"run \(run run, its 2 files together\): read 1,600 metric points, kept 800 "
                                           r"\(800 steps, about 1 step in 2, from the first to the last\), 800 "
                                           r"dropped") as said:
        ev = ingest(src)
    assert len(said) == 1
    steps, values = ev.series("run", "loss/total")
    assert list(steps) == list(range(0, 1600, 2)) and list(values) == [float(s) for s in range(0, 1600, 2)]


@pytest.mark.parametrize("side", ["-wal", "-shm"])
def test_a_linked_wal_file_is_named_as_a_link(tmp_path, side):
    """Review 6 residue (Q-R6): a run folder from elsewhere whose ``lineage.db-wal`` (or ``-shm``) is a symbolic link
    to a host file: SQLite refuses it and writes nothing, but the error said "this user cannot open it", sending
    the user to permissions. Now it names the link; the host file is untouched."""
    from mcp_testlib import make_run

    from evotrainer.lineage import LineageError, LineageStore

    run = make_run(tmp_path)
    for end in ("-wal", "-shm"):
        (run / f"lineage.db{end}").unlink(missing_ok=True)
    host = tmp_path / "host.txt"
    host.write_text("host data\n")
    (run / f"lineage.db{side}").symlink_to(host)
    with pytest.raises(LineageError) as err:
        LineageStore(run / "lineage.db")
    assert str(err.value) == (f"{run / ('lineage.db' + side)}: a symbolic link, not the file SQLite keeps beside "
                              "lineage.db; not opened (nothing was written through it). Remove the link(s) or use a "
                              "copy of the run folder without them")
    assert host.read_text() == "host data\n"


def test_metric_rows_of_another_sql_type_are_counted_not_skipped_silently(tmp_path):
    """Review 7 residue (M-R7): metric rows of a crafted lineage.db whose step is not an integer or whose value is not
    a number were skipped by LineageStore.all_metrics without a word. They are still skipped (the evidence and the
    report read only numbers), and a MetricsThinnedWarning now counts them and names the file and the version."""
    import sqlite3

    from evotrainer.points import MetricsThinnedWarning
    from evotrainer.recipe import Recipe

    run = tmp_path / "run"
    Workspace.init(run, Recipe())
    db = sqlite3.connect(run / "lineage.db")
    db.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", [
        ("v0", 0, "train/loss", 1.0), ("v0", 1, "train/loss", 0.5), ("v0", "2", "train/loss", 0.25),
        ("v0", 3, "train/loss", "abc"), ("v0", 4, "train/loss", b"\x00"), ("v0", 2.5, "train/bad", 1.0)])
    db.commit()
    db.close()
    with Workspace.open(run) as ws:
        with pytest.warns(MetricsThinnedWarning) as seen:
            got = ws.lineage.all_metrics("v0")
    assert got == {"train/loss": [(0, 1.0), (1, 0.5), (2, 0.25)]}  # the column's integer affinity made "2" an integer
    assert [str(w.message) for w in seen] == [
        f"{run / 'lineage.db'}: version v0: 3 metric row(s) of another SQL type (a step that is not an integer, or a "
        "value that is not a number) skipped; a file EvoTrainer wrote has none: is it a crafted or damaged lineage.db?"]


@pytest.mark.parametrize("name, shown, said", [
    (b"u\xff\xfe", "u\\xff\\xfe", "the run folder's path is not valid UTF-8; the rollout store (LanceDB), the report and "
                                  "MCP clients need one: rename the folder, or copy the run to one with a UTF-8 name"),
    (b"a\nb", "a\\nb", "the run folder's path holds control characters (shown as \\xNN); they would reach terminals, "
                      "logs and MCP clients as they are: rename the folder"),
    (b"x\x1b]0;T\x07[red]y", "x\\x1b]0;T\\x07[red]y",
     "the run folder's path holds control characters (shown as \\xNN); they would reach terminals, logs and MCP "
     "clients as they are: rename the folder"),
])
def test_a_run_folder_path_that_is_not_printable_text_is_refused(tmp_path, name, shown, said):
    """Review 12 (U-R12): a run folder unpacked from elsewhere under a name that is not UTF-8 or carries control
    text: ``report`` and ``diagnose`` ended in "UnicodeEncodeError: ... surrogates not allowed", MCP ``server_info``
    in a bare "Error executing tool", and ``init`` wrote the OSC title sequence to the terminal. Every Workspace
    (init, open) now refuses such a path, naming it neutralised; the CLI prints no raw escape."""
    import os

    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.recipe import Recipe
    from evotrainer.workspace import WorkspaceError

    path = Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + name))
    with pytest.raises(WorkspaceError) as err:
        Workspace.init(path, Recipe())
    assert str(err.value) == f"{tmp_path}/{shown}: {said}"
    assert not path.exists()
    good = tmp_path / "good"
    Workspace.init(good, Recipe())
    os.rename(good, path)  # a run made elsewhere, then found under that name
    with pytest.raises(WorkspaceError, match=re.escape(said)):
        Workspace.open(path)
    r = CliRunner().invoke(app, ["report", str(path)])
    text = f"{r.exception or ''} {r.output}"
    assert r.exit_code != 0 and "\x1b" not in text and said in " ".join(text.split()), text


def test_a_versions_column_past_the_size_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """Review 12 G-R12 (b, c): a version's ``metrics_summary`` crafted to 2,500,000 entries (41 MB) made ``lineage
    show`` take 8.3 s and 796 MB, ``report`` 66 s, MCP ``get_version`` 22.4 s with a 100 MB reply; 400,000 findings
    were a 66 MB reply. A JSON / text column of a version longer than ``COLUMN_MAX_CHARS`` (1 MiB; 2,000 here) is
    refused, by its SQL ``length()``, before the row is fetched: a LineageError names the file, the version, the
    column, its length and the fix, through the store, ``lineage show`` and MCP ``get_version``."""
    import sqlite3

    from mcp_testlib import SyncClient, make_run
    from typer.testing import CliRunner

    from evotrainer import lineage
    from evotrainer.cli import app
    from evotrainer.lineage import LineageError, LineageStore
    from evotrainer.servers.app import build_server

    monkeypatch.setattr(lineage, "COLUMN_MAX_CHARS", 2000)
    run = make_run(tmp_path)
    db_path = run / "lineage.db"
    at_cap = "{" + ", ".join(f'"s{i:03d}": 1' for i in range(110)) + "}"
    at_cap = at_cap[:-1] + " " * (2000 - len(at_cap)) + "}"
    assert len(at_cap) == 2000
    db = sqlite3.connect(db_path)
    db.execute("UPDATE versions SET metrics_summary = ? WHERE id = 'v0'", (at_cap,))
    db.commit()
    store = LineageStore(db_path, readonly=True)  # exactly the cap still reads
    assert len(store.get("v0").metrics_summary) == 110
    db.execute("UPDATE versions SET metrics_summary = ? WHERE id = 'v0'", (at_cap[:-1] + " }",))
    db.execute("UPDATE versions SET findings = ? WHERE id = 'v1'", (json.dumps([{"kind": "x"}] * 250),))
    db.commit()
    said = (f"{db_path}: version 'v0': its versions.metrics_summary holds 2,001 characters, past the 2,000 EvoTrainer "
            "reads (it writes at most 256 metrics_summary entries; a crafted or damaged file); not read. Reset it "
            f"(`sqlite3 {db_path} \"UPDATE versions SET metrics_summary = '{{}}' WHERE id = 'v0'\"`) or use a run "
            "folder EvoTrainer wrote")
    said_v1 = (f"{db_path}: version 'v1': its versions.findings holds 3,750 characters, past the 2,000 EvoTrainer "
               "reads (it writes at most 256 metrics_summary entries; a crafted or damaged file); not read. Reset it "
               f"(`sqlite3 {db_path} \"UPDATE versions SET findings = '[]' WHERE id = 'v1'\"`) or use a run "
               "folder EvoTrainer wrote")
    for read, msg in ((lambda: store.get("v0"), said), (store.versions, said), (store.root, said),
                      (lambda: store.get("v1"), said_v1), (lambda: store.children("v0"), said),
                      (lambda: store.path_to_root("v1"), said)):
        with pytest.raises(LineageError) as e:
            read()
        assert str(e.value) == msg
    r = CliRunner().invoke(app, ["lineage", "show", str(run)])
    assert r.exit_code == 1 and isinstance(r.exception, LineageError) and str(r.exception) == said, r.output
    c = SyncClient(build_server("all", run))
    try:
        assert c.err("get_version", {"version_id": "v1"}) == f"Error executing tool get_version: {said_v1}"
    finally:
        c.close()
    # a recipe has no value to reset it to
    db.execute("UPDATE versions SET metrics_summary = '{}', findings = '[]', recipe = ? WHERE id = 'v1'",
               ('{"name": "' + "r" * 2000 + '"}',))
    db.commit()
    db.close()
    with pytest.raises(LineageError) as e:
        store.get("v1")
    store.close()
    assert str(e.value) == (f"{db_path}: version 'v1': its versions.recipe holds 2,012 characters, past the 2,000 "
                            "EvoTrainer reads (it writes at most 256 metrics_summary entries; a crafted or damaged "
                            "file); not read. Use a run folder EvoTrainer wrote")


def test_an_import_with_more_series_than_the_summary_cap_keeps_the_cap_and_says_so(tmp_path):
    """Review 12 G-R12 (a): ``import`` of a foreign metrics.jsonl with 1,000,000 distinct names gave the version one
    ``metrics_summary`` mean per series (34 MB), read back by every tool. The summary keeps ``SUMMARY_MAX`` (256)
    entries, the headline metrics first, then the first by name; the import says how many it left out, and every
    series stays in the metrics table."""
    from evotrainer.lineage import SUMMARY_MAX

    fo = tmp_path / "fo"
    fo.mkdir()
    names = [f"m{i:03d}" for i in range(300)]
    (fo / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **{n: 1.0 for n in reversed(names)},
                                                          "reward/mean": 0.5}) + "\n" for s in (1, 2)))
    s = import_run(fo, tmp_path / "imported")
    said = ("metrics_summary keeps 256 of the 301 series means (the headline metrics first, then the first by name); "
            "45 left out, their series are all in the metrics table")
    assert SUMMARY_MAX == 256 and s.n_metrics == 301 and said in s.notes
    with Workspace.open(tmp_path / "imported") as ws:
        ms = ws.lineage.get(s.version_id).metrics_summary
        assert list(ms) == ["reward/mean", *names[:255]] and ms["reward/mean"] == 0.5
        assert len(ws.lineage.metric_names(s.version_id)) == 301
        # every writer holds the cap (update_version)
        ws_v = ws.lineage.update_version(s.version_id, metrics_summary={f"z{i}": 1.0 for i in range(400)})
        assert list(ws_v.metrics_summary) == [f"z{i}" for i in sorted(range(400), key=str)][:256]
    logged = (tmp_path / "imported" / "logs" / "run.jsonl").read_text()
    assert said in logged


def test_planted_run_log_lines_that_are_no_record_are_skipped_and_the_lines_read_are_capped(tmp_path, monkeypatch):
    """Review 13 (G-R13): lines appended to ``logs/run.jsonl`` of a run folder from elsewhere: ``0``, ``null``,
    ``[]``, ``"x"`` made every search_logs end in "AttributeError: 'int' object has no attribute 'get'", one line of
    100,000 nested brackets in "RecursionError"; 22 M lines of ``{}`` (69 MB) held 3.37 GB in one call. Lines that
    are no JSON object are skipped now, and only the last MAX_LOG_RECORDS lines are read (the rest counted in
    unread_bytes)."""
    from mcp_testlib import SyncClient, make_run

    from evotrainer import workspace
    from evotrainer.servers.app import build_server

    run = make_run(tmp_path)
    log = run / "logs" / "run.jsonl"
    with open(log, "a") as f:
        f.write("0\nnull\n[]\n\"x\"\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    c = SyncClient(build_server("logs", run))
    try:
        got = c.ok("search_logs")
    finally:
        c.close()
    # make_run's three records; since review 16 (C-R16) the 100,000-bracket line is skipped unparsed as dense
    # (over MAX_LOG_LINE_VALUES), its bytes counted as unread (it was parsed to a RecursionError before)
    assert (got["total"], got["unread_bytes"], got["dense_lines"]) == (3, 200_001, 1)
    assert workspace.MAX_LOG_RECORDS == 500_000
    monkeypatch.setattr(workspace, "MAX_LOG_RECORDS", 10)
    lines = [json.dumps({"time": float(i), "level": "info", "message": f"m{i}"}) for i in range(25)]
    log.write_text("".join(f"{ln}\n" for ln in lines))
    with Workspace.open(run) as ws:
        records, unread = ws.read_logs_tail()
    assert [r["message"] for r in records] == [f"m{i}" for i in range(15, 25)]
    assert unread == sum(len(ln) + 1 for ln in lines[:15])


@pytest.mark.parametrize("chunk", [7, 64, 4 << 20])
def test_the_run_log_tail_is_read_backwards_until_its_lines_are_held(tmp_path, monkeypatch, chunk):
    """Review 13 (G-R13b): 277 MB of ``{}`` lines made one search_logs read the whole 256 MiB window (143.6 s, a
    12.6 GB process) to keep its last 500,000 lines. The tail is now read backwards in blocks until it holds
    MAX_LOG_RECORDS lines (or reaches MAX_LOG_READ_BYTES): the records and unread_bytes are those of a whole read,
    whatever the block size, and at most one block more than the lines kept is read."""
    from mcp_testlib import make_run

    from evotrainer import workspace

    run = make_run(tmp_path)
    log = run / "logs" / "run.jsonl"
    lines = [json.dumps({"time": float(i), "level": "info", "message": f"m{i}" + "x" * (i % 13)}) for i in range(300)]
    log.write_text("".join(f"{ln}\n" for ln in lines))
    monkeypatch.setattr(workspace, "MAX_LOG_RECORDS", 10)
    monkeypatch.setattr(workspace, "_LOG_CHUNK_BYTES", chunk)
    reads: list[int] = []
    real_fdopen = os.fdopen

    class Counted:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def read(self, n):
            reads.append(n)
            return self.f.read(n)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(workspace.os, "fdopen", lambda fd, mode: Counted(real_fdopen(fd, mode)))
    with Workspace.open(run) as ws:
        records, unread = ws.read_logs_tail()
    assert [r["message"][:4].rstrip("x") for r in records] == [f"m{i}" for i in range(290, 300)]
    assert unread == sum(len(ln) + 1 for ln in lines[:290])
    tail = sum(len(ln) + 1 for ln in lines[290:])
    assert sum(reads) <= min(tail + 2 * chunk, log.stat().st_size)
    monkeypatch.setattr(workspace, "MAX_LOG_READ_BYTES", tail - 5)  # the window ends inside the first line kept
    with Workspace.open(run) as ws:
        records, unread = ws.read_logs_tail()
    assert [r["message"][:4].rstrip("x") for r in records] == [f"m{i}" for i in range(291, 300)]
    assert unread == sum(len(ln) + 1 for ln in lines[:291])


def test_a_huge_log_record_is_skipped_and_a_records_extra_fields_are_cut(tmp_path):
    """Review 14 C-R14: one run-log line of 50 MB (a record of 17.5 M empty lists) took 36 s and 1.5 GB to parse, and
    search_logs answered 300 MiB with every extra field in full, stalling the server 30 s. Now a line longer than
    MAX_LOG_LINE_BYTES (1 MiB) is not parsed (its bytes count in unread_bytes), a record carries at most 50 extra
    fields of at most 2,000 characters of JSON each, and Workspace.log writes a record past the cap with its message
    cut and its extra fields named, not stored."""
    import time as _time

    from mcp_testlib import SyncClient, make_run

    from evotrainer.servers.app import build_server
    from evotrainer.workspace import MAX_LOG_LINE_BYTES

    assert MAX_LOG_LINE_BYTES == 1 << 20
    run = make_run(tmp_path)
    log = run / "logs" / "run.jsonl"
    huge = json.dumps({"time": 5.0, "level": "info", "message": "huge", "x": [[]] * 1_000_000})  # 4 MB
    wide = json.dumps({"time": 6.0, "level": "info", "message": "wide", "s": "y" * 300_000, "n": 7,
                       "d": {"k": list(range(1000))}, **{f"f{i:02d}": i for i in range(60)}})
    before = log.stat().st_size
    with log.open("a") as f:
        f.write(huge + "\n" + wide + "\n")
    with Workspace(run, writer=True) as ws:
        ws.log("big " + "z" * 2_000_000, note={"a": "b" * 2_000_000})
        records, unread = ws.read_logs_tail()
    assert unread == len(huge) + 1 and "huge" not in [r.get("message") for r in records]
    last = records[-1]
    assert last["message"] == "big " + "z" * 65_532 + "... [1934468 more chars]" and last["extra_omitted"] == ["note"]
    assert before < log.stat().st_size < before + len(huge) + len(wide) + 100_000
    c = SyncClient(build_server("all", run))
    try:
        t = _time.monotonic()
        res = c.ok("search_logs", {"query": "wide"})
        assert _time.monotonic() - t < 5 and res["unread_bytes"] == len(huge) + 1
        (rec,) = res["records"]
        assert rec["extra"]["s"] == "y" * 2000 + "... [298000 more chars]" and rec["extra"]["n"] == 7
        assert rec["extra"]["d"] == json.dumps({"k": list(range(1000))})[:2000] + "... [2897 more chars]"
        assert len(rec["extra"]) == 51 and rec["extra"]["extra_omitted"] == 13
    finally:
        c.close()


def test_a_console_dict_deeper_than_the_cap_is_skipped_whatever_the_stack():
    """The CI run of 2026-12-04 read ``{'step': 4, 'reward': `` + 990 ``-`` + ``1}`` as step 4 where the suite had
    always skipped it: whether CPython's recursion limit stopped the 990-deep chain depended on the stack depth of the
    call. A dict deeper than MAX_DICT_DEPTH (64) is skipped by rule: 100 ``-`` (which Python reads) as well."""
    from evotrainer.harness.ingest_formats import MAX_DICT_DEPTH, literal_dict

    assert MAX_DICT_DEPTH == 64
    assert literal_dict("{'step': 4, 'reward': " + "-" * 100 + "1}") is None
    assert literal_dict("{'step': 4, 'reward': " + "-" * 60 + "1}") == {"step": 4, "reward": 1.0}
    assert literal_dict("{'step': 4, 'reward': tensor(0.5), 'lr': nan}")["reward"] == 0.5


def test_a_file_swapped_for_a_link_after_the_listing_is_not_read_through(tmp_path, monkeypatch):
    """Review 14 K-R14 (escape): a live writer swapped a foreign folder's train.log between a file and a link to a
    0600 host file ~1,500 times a second while `import` ran; in 1 of 10 imports the link was checked as the file and
    then read through, and the host file's series were stored in the run. The listing now opens each file (no link
    followed at its real path), checks its place on the descriptor and records its inode; a reader opens only that
    inode under that name. Here the swap happens right after the listing, in the product's own ingest."""
    from evotrainer.harness import ingest_formats as F
    from evotrainer.harness.ingest import IngestError

    src = tmp_path / "foreign"
    src.mkdir()
    log = src / "train.log"
    log.write_text("".join(f"step:{i} - critic/score/mean:0.5\n" for i in range(1, 6)))
    (tmp_path / "host").mkdir()
    secret = tmp_path / "host" / "secret.log"
    secret.write_text("".join(f"step:{i} - secret/leak:31337\n" for i in range(1, 6)))
    secret.chmod(0o600)
    listed = F.files_under

    def files_then_swap(folder):
        out = listed(folder)
        if folder == src:
            log.unlink()
            log.symlink_to(secret)  # the race, won: the link is in place when the file is read
        return out

    monkeypatch.setattr(F, "files_under", files_then_swap)
    with pytest.raises(IngestError, match="train.log: not the file listed under that name \\(a link or another file "
                                          "was put in its place while the folder was read\\)"):
        ingest(src)
    # a swap before the listing is the listing's: the link leaves the folder, so the file is not listed at all
    monkeypatch.setattr(F, "files_under", listed)
    assert F.files_under(src) == []
    fd = F.open_listed(secret)  # a file given by name (never listed) is the caller's choice
    os.close(fd)


def test_a_tensorboard_file_swapped_for_a_link_after_the_listing_is_not_read_through(tmp_path, monkeypatch):
    """Review 15 left TensorBoard event files outside K-R14's inode check: the loader opened the path itself, so an
    event file swapped for a link to a host file after the listing was read through (the host file's series stored
    as the run's). The event file is now read through the descriptor of the listed inode (/proc/self/fd/N): the
    swap is refused, naming the file; unswapped, the 4 steps read as written."""
    src, host = tmp_path / "foreign", tmp_path / "host"
    src.mkdir()
    host.mkdir()
    _tb_scalars(src, 4)
    _tb_scalars(host, 9)
    (event,) = src.iterdir()
    (secret,) = host.iterdir()
    secret.chmod(0o600)
    ev = ingest(src)
    ((version, names),) = ev.metrics.items()
    (name,) = names
    steps, values = ev.series(version, name)
    assert list(steps) == [0, 1, 2, 3] and list(values) == [0.0, 1.0, 2.0, 3.0]
    listed = F.files_under

    def files_then_swap(folder):
        out = listed(folder)
        if folder == src:
            event.unlink()
            event.symlink_to(secret)
        return out

    monkeypatch.setattr(F, "files_under", files_then_swap)
    with pytest.raises(IngestError, match=f"{event.name}: not the file listed under that name"):
        ingest(src)


def test_a_log_of_many_long_records_is_parsed_up_to_the_budget_from_the_newest(tmp_path, monkeypatch):
    """Review 15 C-R15: 80 run-log lines each just under the 1 MiB line cap (79 MB) made one search_logs take 10.4 s
    and 2.24 GB. The newest lines are parsed up to MAX_LOG_PARSE_BYTES (16 MiB; 3 lines' worth here), the older count
    as unread; a skipped over-long line costs nothing of the budget."""
    from mcp_testlib import make_run

    from evotrainer import workspace

    run = make_run(tmp_path)
    log = run / "logs" / "run.jsonl"
    lines = [json.dumps({"time": float(i), "level": "info", "message": f"m{i} " + "x" * 1000}) for i in range(10)]
    long = json.dumps({"time": 99.0, "level": "info", "message": "y" * 5000})
    log.write_text("".join(ln + "\n" for ln in lines[:7]) + long + "\n" + "".join(ln + "\n" for ln in lines[7:]))
    monkeypatch.setattr(workspace, "MAX_LOG_PARSE_BYTES", 3 * (len(lines[0]) + 1))
    monkeypatch.setattr(workspace, "MAX_LOG_LINE_BYTES", 2000)
    with Workspace.open(run) as ws:
        records, unread = ws.read_logs_tail()
    assert [r["message"].split()[0] for r in records] == ["m7", "m8", "m9"]
    assert unread == sum(len(ln) + 1 for ln in lines[:7]) + len(long) + 1


@pytest.mark.parametrize("name, shown", [
    ("r\x1b]0;PWNED\x1b\\\x1b[2J[/x]", "r\\x1b]0;PWNED\\x1b\\\\x1b[2J[/x]"),
    ("[bold red]x[/][/x]", "[bold red]x[/][/x]"),
    ("r\u202eevil\x9c", "r\\u202eevil\\x9c"),
])
def test_diagnose_prints_a_crafted_mlflow_run_name_shown_not_obeyed(tmp_path, name, shown):
    """Review 19 (D-R19): an MLflow ``tags/mlflow.runName`` with ESC / ST / U+202E went to the terminal raw from
    ``diagnose``'s text summary, and ``[/x]`` in one ended diagnose with "error: MarkupError", rc 1. Now the name
    is printed neutralised and markup-escaped: exit 0, no control byte, the name as written."""
    from typer.testing import CliRunner

    from evotrainer.cli import app

    for run_id, run_name in (("run0", name), ("run1", "plain")):  # two runs: each is a version named by its tag
        run = tmp_path / "exp" / run_id
        (run / "metrics").mkdir(parents=True)
        (run / "tags").mkdir()
        (run / "metrics" / "reward").write_text("".join(f"{1700000000 + i} {i / 30} {i}\n" for i in range(30)))
        (run / "tags" / "mlflow.runName").write_text(run_name)
    r = CliRunner().invoke(app, ["diagnose", str(tmp_path / "exp"), "--no-plots", "--no-skills"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert not re.search("[\x1b\x9c\u202e]", r.stdout)
    assert f"{shown} (1 metrics to step 29" in r.stdout.replace("\n", ""), r.stdout
