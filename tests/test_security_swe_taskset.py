"""Security suite, SWE task sets: a task set made by someone else is hostile in every field (review 16).

Each probe failed on the code before its fix (numbers measured there, on a loaded 2-core machine):

- W-R16 (escape): ``bug.path`` ``../outside.py`` or an absolute path made ``apply_bug`` rewrite a host file outside
  the extracted repo; a link in the repo was written through;
- W2-R16 (tar bomb): the snapshot was unpacked with no cap: one 1 GiB zero file took 13.6 s, 1 GiB of disk and
  2.08 GB of memory (``apply_bug`` read it whole); 100,000 empty files 12 s (the review's 6 GB file: 91.5 s,
  6.39 GB); ``repo_digest`` read each file whole;
- W3-R16 (crash): a tool-call path holding ``\\x00`` raised ``ValueError`` out of ``SweEnv.step`` (the episode and
  the training run died), as did a 300-byte path component (``OSError`` ENAMETOOLONG);
- T-R16 (terminal injection): ``evotrainer swe tasks`` printed task-set fields raw: ESC sequences reached the
  terminal, and ``[/x]`` in a field was read as rich markup.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from evotrainer.recipe import ToolUseSpec
from evotrainer.rl_backend.swe.env import SweEnv, repo_digest
from evotrainer.rl_backend.swe.tasks import (
    DEFAULT_TEST_PATTERNS,
    MANIFEST_MAX_BYTES,
    MAX_TEST_ID_CHARS,
    MAX_TEST_IDS,
    MAX_TEST_IDS_CHARS,
    MAX_TEST_PATTERN_CHARS,
    MAX_TEST_PATTERNS,
    SNAPSHOT_MAX_FILE_BYTES,
    SNAPSHOT_MAX_FILES,
    SNAPSHOT_MAX_HEADER_BYTES,
    SNAPSHOT_MAX_HEADER_CHAIN,
    SNAPSHOT_MAX_STREAM_BYTES,
    SNAPSHOT_MAX_TOTAL_BYTES,
    BugSpec,
    SweTask,
    SweTaskError,
    apply_bug,
    is_test_file,
    load_manifest,
    load_taskset,
    materialize,
)
from evotrainer.rl_backend.swe.tasks import (
    test_file_digests as digests_of_test_files,
)
from evotrainer.sandbox import fs as sfs
from evotrainer.sandbox.base import SANDBOX_ENV

CLEAN = b"A = 1\n"
TEST = b"from m import A\n\n\ndef test_a():\n    assert A == 1\n"
TASK = {"instance_id": "evil__000", "repo": "evil", "problem_statement": "fix it", "FAIL_TO_PASS": ["test_m.py::test_a"],
        "snapshot": "evil.tar.gz", "bug": {"path": "m.py", "old": "A = 1", "new": "A = 2", "operator": "const"}}


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, 0o644, link
    return info, data


def tar_gz(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return gzip.compress(buf.getvalue(), compresslevel=1)


def task_set(root: Path, members: list | None = None, raw: bytes | None = None, **fields) -> Path:
    """A task set in ``root``: one task (``TASK`` updated with ``fields``) and its snapshot tarball."""
    (root / "repos").mkdir(parents=True)
    (root / "tasks.jsonl").write_text(json.dumps({**TASK, **fields}) + "\n")
    if raw is None:
        raw = tar_gz(members if members is not None else [member("m.py", CLEAN), member("test_m.py", TEST)])
    (root / "repos" / "evil.tar.gz").write_bytes(raw)
    return root


def build(root: Path, dest: Path) -> Path:
    return materialize(load_taskset(root)[0], dest, root)


# --- W-R16: no path of a task set leaves its folder -------------------------------------------------------------
@pytest.mark.parametrize("path, why", [
    ("../outside.py", "goes up with '..'"),
    ("pkg/../../outside.py", "goes up with '..'"),
    ("ABSOLUTE", "is absolute"),
    ("/etc/x", "is absolute"),
    ("", "is empty"),
    ("./.", "is empty"),
    ("m\x00.py", "holds a control character"),
    ("m\n.py", "holds a control character"),
])
def test_a_bug_path_outside_the_repo_is_refused_at_load(tmp_path, path, why):
    victim = tmp_path / "outside.py"
    victim.write_bytes(CLEAN)
    path = str(victim) if path == "ABSOLUTE" else path
    root = task_set(tmp_path / "ts", bug={"path": path, "old": "A = 1", "new": "PWNED = 1"})
    with pytest.raises(SweTaskError) as err:
        build(root, tmp_path / "repo")
    assert "bug.path" in str(err.value) and why in str(err.value)
    assert victim.read_bytes() == CLEAN  # the old code wrote "PWNED = 1" here
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("snapshot, why", [("../evil.tar.gz", "goes up with '..'"), ("/tmp/evil.tar.gz", "is absolute"),
                                           ("repos\x1b[2J.tar.gz", "holds a control character")])
def test_a_snapshot_name_outside_the_task_set_is_refused(tmp_path, snapshot, why):
    with pytest.raises(SweTaskError) as err:
        load_taskset(task_set(tmp_path / "ts", snapshot=snapshot))
    assert "snapshot" in str(err.value) and why in str(err.value)


def test_a_link_in_the_snapshot_is_refused_and_the_host_file_untouched(tmp_path):
    host = tmp_path / "host_file"
    host.write_bytes(CLEAN)
    root = task_set(tmp_path / "ts", members=[member("pkg", kind=tarfile.DIRTYPE),
                                              member("pkg/mod.py", kind=tarfile.SYMTYPE, link=str(host))],
                    bug={"path": "pkg/mod.py", "old": "A = 1", "new": "PWNED = 1"})
    with pytest.raises(SweTaskError, match=r"member 'pkg/mod.py' is not a regular file or a folder \(tar type b'2'"):
        build(root, tmp_path / "repo")
    assert host.read_bytes() == CLEAN
    assert os.listdir(tmp_path / "repo") == []


@pytest.mark.parametrize("link_at", ["pkg/mod.py", "pkg"])
def test_apply_bug_follows_no_link_in_the_repo(tmp_path, link_at):
    """A link planted in the repo (a file link, or a folder link on the way) is never written through."""
    hostdir = tmp_path / "host"
    hostdir.mkdir()
    (hostdir / "mod.py").write_bytes(CLEAN)
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True) if link_at != "pkg" else repo.mkdir()
    (repo / link_at).symlink_to(hostdir / "mod.py" if link_at.endswith(".py") else hostdir)
    with pytest.raises(SweTaskError, match=r"bug.path='pkg/mod.py': .*links are not followed"):
        apply_bug(repo, BugSpec(path="pkg/mod.py", old="A = 1", new="PWNED = 1"))
    assert (hostdir / "mod.py").read_bytes() == CLEAN  # the old code wrote "PWNED = 1" through the link


def test_apply_bug_still_edits_a_plain_file(tmp_path):
    root = task_set(tmp_path / "ts", members=[member("./", kind=tarfile.DIRTYPE), member("pkg", kind=tarfile.DIRTYPE),
                                              member("pkg/m.py", b"X = 0\r\nA = 1\r\n")],
                    bug={"path": "./pkg/m.py", "old": "X = 0\nA = 1", "new": "X = 0\nA = 2"})
    repo = build(root, tmp_path / "repo")
    assert (repo / "pkg" / "m.py").read_bytes() == b"X = 0\nA = 2\n"  # universal newlines, as read_text() read it


# --- W2-R16: snapshot caps ----------------------------------------------------------------------------------------
def assert_nothing_written(repo: Path, t0: float, limit_s: float = 10.0) -> None:
    assert os.listdir(repo) == []
    assert time.monotonic() - t0 < limit_s


def test_a_file_past_the_file_cap_is_refused_before_a_byte_is_written(tmp_path):
    big = SNAPSHOT_MAX_FILE_BYTES + 1
    root = task_set(tmp_path / "ts", members=[member("m.py", CLEAN), member("data.bin", bytes(big))])
    t0 = time.monotonic()
    with pytest.raises(SweTaskError) as err:
        build(root, tmp_path / "repo")
    assert str(err.value).startswith(f"evil__000: snapshot evil.tar.gz: member 'data.bin' is over "
                                     f"SNAPSHOT_MAX_FILE_BYTES = 16 MiB ({big} bytes or more)")
    assert_nothing_written(tmp_path / "repo", t0)  # not even m.py: the headers are checked in a first pass


def test_a_header_claiming_a_huge_file_is_refused_from_the_header(tmp_path):
    """One header says 6 GB (the review's bomb), followed by nothing: refused at the header, in well under a second."""
    info = tarfile.TarInfo("bomb.py")
    info.size = 6 << 30
    raw = gzip.compress(info.tobuf(tarfile.PAX_FORMAT))
    root = task_set(tmp_path / "ts", raw=raw)
    t0 = time.monotonic()
    with pytest.raises(SweTaskError, match=r"member 'bomb.py' is over SNAPSHOT_MAX_FILE_BYTES = 16 MiB \(6442450944 "):
        build(root, tmp_path / "repo")
    assert_nothing_written(tmp_path / "repo", t0, 2.0)


def test_files_past_the_total_cap_are_refused(tmp_path):
    each = SNAPSHOT_MAX_FILE_BYTES - 1
    n = SNAPSHOT_MAX_TOTAL_BYTES // each + 1
    root = task_set(tmp_path / "ts", members=[member(f"d{i}.bin", bytes(each)) for i in range(n)])
    t0 = time.monotonic()
    with pytest.raises(SweTaskError) as err:
        build(root, tmp_path / "repo")
    assert f"the files up to 'd{n - 1}.bin' are over SNAPSHOT_MAX_TOTAL_BYTES = 64 MiB ({n * each} bytes" in str(err.value)
    assert_nothing_written(tmp_path / "repo", t0)


def test_too_many_entries_are_refused(tmp_path):
    members = [member(f"d{i // 1000}/f{i}.py") for i in range(SNAPSHOT_MAX_FILES + 1)]
    root = task_set(tmp_path / "ts", members=members)
    t0 = time.monotonic()
    with pytest.raises(SweTaskError, match=r"more than SNAPSHOT_MAX_FILES = 20000 entries \(files and folders\)"):
        build(root, tmp_path / "repo")
    assert_nothing_written(tmp_path / "repo", t0)  # the old code made 100,000 files in 12 s


def pax_header(size: int) -> bytes:
    """A pax ``x`` header of ``size`` bytes (one ``comment`` record) with its record, padded to whole blocks."""
    head = f"{size} comment=".encode()
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, size
    return info.tobuf(tarfile.USTAR_FORMAT) + head + b"x" * (size - len(head) - 1) + b"\n" + bytes(-size % 512)


def test_a_tar_stream_past_the_stream_cap_is_refused(tmp_path):
    """130 MiB of PAX header records, each at SNAPSHOT_MAX_HEADER_BYTES, before 2,000 empty files: the tar stream
    itself is capped, however well it compresses."""
    one = pax_header(SNAPSHOT_MAX_HEADER_BYTES) + member("f.py")[0].tobuf(tarfile.USTAR_FORMAT)
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    out = [comp.compress(one) for _ in range((SNAPSHOT_MAX_STREAM_BYTES + (2 << 20)) // len(one))]
    raw = b"".join([*out, comp.flush()])
    root = task_set(tmp_path / "ts", raw=raw)
    t0 = time.monotonic()
    with pytest.raises(SweTaskError, match=r"the unpacked tar stream is over SNAPSHOT_MAX_STREAM_BYTES = 128 MiB"):
        build(root, tmp_path / "repo")
    assert_nothing_written(tmp_path / "repo", t0)


def big_extended_header(kind: bytes, size: int) -> bytes:
    """A .tar.gz whose first header is an extended one of ``kind`` declaring ``size`` bytes (all there: 'x' * size),
    then a file m.py."""
    info = tarfile.TarInfo("././@PaxHeader" if kind in (tarfile.XHDTYPE, tarfile.XGLTYPE) else "././@LongLink")
    info.type, info.size = kind, size
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    out = [comp.compress(info.tobuf(tarfile.USTAR_FORMAT))]
    head = f"{size} comment=".encode() if kind in (tarfile.XHDTYPE, tarfile.XGLTYPE) else b""
    out.append(comp.compress(head))
    left = size - len(head)
    while left > 0:
        out.append(comp.compress(b"x" * min(left, 1 << 20)))
        left -= 1 << 20
    out.append(comp.compress(member("m.py", CLEAN)[0].tobuf(tarfile.USTAR_FORMAT) + CLEAN.ljust(512, b"\0")))
    return b"".join([*out, comp.flush()])


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME,
                                  tarfile.GNUTYPE_LONGLINK])
def test_an_extended_header_past_the_header_cap_is_refused_unread(tmp_path, kind):
    """Review 17: tarfile read an extended header whole before its member was seen; one pax header of 100 MiB held
    ~400 MB for 2.2 s and then unpacked (a GNU long name of 100 MiB too). Refused from its 512-byte block now."""
    root = task_set(tmp_path / "ts", raw=big_extended_header(kind, 100 << 20))
    t0 = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(SweTaskError) as err:
            build(root, tmp_path / "repo")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == (f"evil__000: snapshot evil.tar.gz: an extended tar header (type {kind.decode()!r}) of "
                              "104857600 bytes, over SNAPSHOT_MAX_HEADER_BYTES = 64 KiB; a snapshot holds the source "
                              "files of one project (scripts/gen_swe_tasks.py writes them)")
    assert peak < 8 << 20, peak  # not the 100 MiB header
    assert_nothing_written(tmp_path / "repo", t0, 2.0)


def test_a_header_at_the_cap_still_unpacks_and_a_long_chain_is_refused(tmp_path):
    """A pax header of exactly SNAPSHOT_MAX_HEADER_BYTES is read; more than SNAPSHOT_MAX_HEADER_CHAIN extended headers
    in a row (tarfile reads each chained one recursively: 3,000 were an uncaught RecursionError) are refused."""
    m_info, m_data = member("m.py", CLEAN)
    body = m_info.tobuf(tarfile.USTAR_FORMAT) + m_data.ljust(512, b"\0")
    ok = task_set(tmp_path / "ok", raw=gzip.compress(pax_header(SNAPSHOT_MAX_HEADER_BYTES) + body + bytes(1024)))
    assert (build(ok, tmp_path / "repo_ok") / "m.py").read_bytes() == b"A = 2\n"  # the bug applied
    for n, refused in ((SNAPSHOT_MAX_HEADER_CHAIN, False), (3_000, True)):
        root = task_set(tmp_path / f"chain{n}", raw=gzip.compress(pax_header(12) * n + body + bytes(1024)))
        (tmp_path / f"repo{n}").mkdir()
        if not refused:
            assert (build(root, tmp_path / f"repo{n}") / "m.py").read_bytes() == b"A = 2\n"  # the bug applied
            continue
        with pytest.raises(SweTaskError, match=r"more than SNAPSHOT_MAX_HEADER_CHAIN = 8 extended tar headers in a row"):
            build(root, tmp_path / f"repo{n}")


def test_a_gnu_sparse_header_is_refused_before_its_extension_blocks(tmp_path):
    """A GNU sparse header ('S') announcing 120 MiB of extension blocks: tarfile read them all into a list (7.5 s,
    430 MB) and then failed with an uncaught IndexError; refused from its first block now."""
    info = tarfile.TarInfo("s.py")
    info.type = tarfile.GNUTYPE_SPARSE
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    block[482] = 1  # isextended: more sparse blocks follow
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block[:512])
    ext = bytearray(512)
    ext[504] = 1
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    out = [comp.compress(bytes(block))] + [comp.compress(bytes(ext)) for _ in range(120 << 11)]
    root = task_set(tmp_path / "ts", raw=b"".join([*out, comp.flush()]))
    t0 = time.monotonic()
    with pytest.raises(SweTaskError, match=r"evil.tar.gz: member 's.py' is not a regular file or a folder \(tar type b'S': "
                                           r"a GNU sparse file, refused before its sparse map\)"):
        build(root, tmp_path / "repo")
    assert_nothing_written(tmp_path / "repo", t0, 2.0)


def test_a_tarball_file_past_the_stream_cap_is_refused_unread(tmp_path):
    root = task_set(tmp_path / "ts")
    with open(root / "repos" / "evil.tar.gz", "ab") as f:
        f.truncate(SNAPSHOT_MAX_STREAM_BYTES + 1)  # sparse: no disk used
    with pytest.raises(SweTaskError, match=rf"the tarball is {SNAPSHOT_MAX_STREAM_BYTES + 1} bytes, over "
                                           r"SNAPSHOT_MAX_STREAM_BYTES = 128 MiB"):
        build(root, tmp_path / "repo")


@pytest.mark.parametrize("kind", [tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE,
                                  tarfile.GNUTYPE_SPARSE])
def test_only_regular_files_and_folders_are_unpacked(tmp_path, kind):
    root = task_set(tmp_path / "ts", members=[member("m.py", CLEAN), member("x", kind=kind, link="m.py")])
    with pytest.raises(SweTaskError, match=rf"member 'x' is not a regular file or a folder \(tar type {kind!r}"):
        build(root, tmp_path / "repo")
    assert os.listdir(tmp_path / "repo") == []


@pytest.mark.parametrize("name, why", [("../x.py", "goes up with '..'"), ("/x.py", "is absolute"),
                                       ("a\x1b[2J.py", "holds a control character")])
def test_unsafe_member_names_are_refused(tmp_path, name, why):
    root = task_set(tmp_path / "ts", members=[member(name, CLEAN)])
    with pytest.raises(SweTaskError, match=rf"unsafe member name.*{why}"):
        build(root, tmp_path / "repo")
    assert not (tmp_path / "x.py").exists() and not Path("/x.py").exists()


def test_a_name_given_twice_empties_the_half_built_repo(tmp_path):
    """Caught while writing (second pass): what the first members wrote is removed before the error."""
    root = task_set(tmp_path / "ts", members=[member("m.py", CLEAN), member("test_m.py", TEST), member("m.py", b"B")])
    with pytest.raises(SweTaskError, match="a member's path runs through a file or is given twice"):
        build(root, tmp_path / "repo")
    assert os.listdir(tmp_path / "repo") == []


def test_a_truncated_tarball_is_refused(tmp_path):
    raw = tar_gz([member("m.py", CLEAN), member("big.py", bytes(100_000))])
    root = task_set(tmp_path / "ts", raw=raw[: len(raw) // 2])
    with pytest.raises(SweTaskError, match=r"evil__000: snapshot evil.tar.gz: not a readable .tar.gz"):
        build(root, tmp_path / "repo")
    assert os.listdir(tmp_path / "repo") == []


def test_read_chunks_bounds_each_chunk_and_follows_no_link(tmp_path):
    (tmp_path / "f").write_bytes(b"abcdefghij")
    (tmp_path / "l").symlink_to(tmp_path / "f")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert list(sfs.read_chunks(fd, "f", chunk_bytes=4)) == [b"abcd", b"efgh", b"ij"]
        assert list(sfs.read_chunks(fd, "f", max_bytes=6, chunk_bytes=4)) == [b"abcd", b"ef"]
        with pytest.raises(sfs.UnsafePathError):
            list(sfs.read_chunks(fd, "l"))
        with pytest.raises(ValueError, match="chunk_bytes=0"):
            list(sfs.read_chunks(fd, "f", chunk_bytes=0))
    finally:
        os.close(fd)


def test_repo_digest_reads_in_bounded_chunks(tmp_path):
    """The digest is unchanged (rel, NUL, content, NUL per file); a 48 MiB file no longer sits in memory whole."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_bytes(CLEAN)
    with open(repo / "big.bin", "wb") as f:
        f.truncate(48 << 20)
    want = hashlib.sha256(b"a.py\0" + CLEAN + b"\0" + b"big.bin\0" + bytes(48 << 20) + b"\0").hexdigest()
    tracemalloc.start()
    try:
        got = repo_digest(repo)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == want
    assert peak < 8 << 20, peak  # the old code's peak held the whole 48 MiB file (twice)


# --- W3-R16: a tool call never raises out of step() ---------------------------------------------------------------
def call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


@pytest.fixture
def env(tmp_path):
    task = next(t for t in load_taskset() if t.repo == "cachetools")
    e = SweEnv(task, tmp_path, ToolUseSpec(max_turns=20, tool_budget=40))
    e.reset()
    return e


@pytest.mark.parametrize("name, args, want", [
    ("view", {"path": "src\x00x"}, "[error] path 'src\\x00x' holds a control character"),
    ("view", {"path": "a\nb"}, "[error] path 'a\\nb' holds a control character"),
    ("search", {"pattern": "x", "path": "\x00"}, "[error] path '\\x00' holds a control character"),
    ("edit", {"path": "a\x00", "old": "x", "new": "y"}, "[error] path 'a\\x00' holds a control character"),
    ("run_tests", {"tests": ["t\x00.py"]}, "[error] test 't\\x00.py' holds a control character"),
    ("view", {"path": "a" * 300}, "[error] cannot open 'aaaa"),
])
def test_a_bad_path_is_an_error_observation(env, name, args, want):
    out = env.step(call(name, **args))  # the old code raised ValueError (NUL) or OSError (ENAMETOOLONG)
    assert out.startswith(want), out
    assert not env.done and env.stats.invalid_calls == 1
    assert env.step(call("view", path="cachetools/keys.py", start=1, end=1)).startswith(
        "[view] cachetools/keys.py lines 1-1")


def test_an_unexpected_tool_exception_is_an_error_observation(env, monkeypatch, caplog):
    """Any exception from a tool (here the sandbox misconfigured: SandboxError) leaves the episode going."""
    monkeypatch.setenv(SANDBOX_ENV, "bogus")
    out = env.step(call("run_tests"))
    assert out.startswith("[error] run_tests failed (SandboxError: EVOTRAINER_SANDBOX='bogus': use auto, docker"), out
    assert not env.done and env.stats.calls == 1
    assert "SWE tool run_tests failed on task cachetools-5.5.0__" in caplog.text
    assert env.step(call("submit")) == "[submit] submitted; the hidden tests will grade the repository"


# --- T-R16: swe tasks shows, never obeys, terminal controls -------------------------------------------------------
def swe_tasks(root: Path):
    from typer.testing import CliRunner

    from evotrainer.cli import app

    return CliRunner().invoke(app, ["swe", "tasks", "--taskset", str(root)])


def test_swe_tasks_prints_no_escape_byte(tmp_path):
    root = task_set(tmp_path / "ts", problem_statement="fix \x1b[2J\x1b]52;c;cHduZWQ=\x07 it",
                    bug={"path": "m.py", "old": "A = 1", "new": "A = 2", "operator": "op\x1b[2J[/bold]"},
                    meta={"line": "\x1b]0;title\x07"})
    r = swe_tasks(root)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output
    assert "op\\x1b[2J[/bold]" in r.output  # shown, and not read as rich markup (the old code: MarkupError)
    assert "m.py:\\x1b]0;title\\x07" in r.output


@pytest.mark.parametrize("field", ["instance_id", "repo"])
def test_a_non_printable_id_is_refused_at_load(tmp_path, field):
    r = swe_tasks(task_set(tmp_path / "ts", **{field: "evil\x1b[2J"}))
    assert r.exit_code == 1
    assert "\x1b" not in r.output
    assert f"{field}='evil\\x1b[2J' holds a control character (ESC, newline, NUL...); ids and names must be " \
           "printable text" in r.output


def test_the_shipped_set_still_loads_and_unpacks(tmp_path):
    t = load_taskset()[0]
    repo = materialize(t, tmp_path / "r")
    assert t.bug.new in (repo / t.bug.path).read_text()
    assert not any(stat.S_ISLNK(os.lstat(p).st_mode) for p in repo.rglob("*"))


# --- the scripted policies' snapshot reader keeps the same caps ---------------------------------------------------
def test_snapshot_file_reads_within_the_snapshot_caps(tmp_path):
    from evotrainer.rl_backend.swe.policies import snapshot_file

    big = SNAPSHOT_MAX_FILE_BYTES + 1
    root = task_set(tmp_path / "ts", members=[member("m.py", CLEAN), member("data.bin", bytes(big)),
                                              member("lnk.py", kind=tarfile.SYMTYPE, link="/etc/passwd")])
    task = load_taskset(root)[0]
    assert snapshot_file(task, "m.py", root) == "A = 1\n"
    assert snapshot_file(task, "./m.py", root) == "A = 1\n"
    with pytest.raises(SweTaskError, match="data.bin is over SNAPSHOT_MAX_FILE_BYTES = 16 MiB"):
        snapshot_file(task, "data.bin", root)  # was read whole (16 MiB + 1 into memory, then decoded)
    with pytest.raises(ValueError, match="lnk.py is not in snapshot evil.tar.gz"):
        snapshot_file(task, "lnk.py", root)  # a link is no file of the snapshot
    with pytest.raises(ValueError, match="nope.py is not in snapshot"):
        snapshot_file(task, "nope.py", root)
    (root / "repos" / "evil.tar.gz").write_bytes(big_extended_header(tarfile.XHDTYPE, 100 << 20))
    t0 = time.monotonic()
    with pytest.raises(SweTaskError, match=r"evil.tar.gz: an extended tar header \(type 'x'\) of 104857600 bytes, "
                                           r"over SNAPSHOT_MAX_HEADER_BYTES = 64 KiB"):
        snapshot_file(task, "m.py", root)  # review 17: read the 100 MiB header, then returned m.py
    assert time.monotonic() - t0 < 2.0


# --- W2-R19: test_patterns capped and compiled once ---------------------------------------------------
def _task_fields(**extra) -> dict:
    return {"instance_id": "a", "repo": "r", "problem_statement": "p", "FAIL_TO_PASS": ["tests/test_a.py::t"], **extra}


def test_too_many_test_patterns_are_refused_naming_the_field_and_cap():
    pats = [f"*x{i}*y*z*test*.py" for i in range(40_000)]
    with pytest.raises(ValueError) as e:
        SweTask.model_validate(_task_fields(test_patterns=pats))
    assert "test_patterns" in str(e.value) and "40,000" in str(e.value) and str(MAX_TEST_PATTERNS) in str(e.value)
    ok = SweTask.model_validate(_task_fields(test_patterns=pats[:MAX_TEST_PATTERNS]))
    assert len(ok.test_patterns) == MAX_TEST_PATTERNS


def test_test_id_lists_past_the_argv_caps_are_refused_naming_the_field(tmp_path):
    """Review 20 O1-R20: a task of 90,000 FAIL_TO_PASS ids (3.8 MB) ended `swe check` with "bwrap sandbox failed to
    start (/usr/bin/unshare): [Errno 7] Argument list too long", naming no field: the ids go on pytest's argv. Each
    list holds at most MAX_TEST_IDS ids of MAX_TEST_ID_CHARS characters, MAX_TEST_IDS_CHARS in all."""
    ids = [f"tests/test_a.py::test_{i:06d}" for i in range(90_000)]
    (tmp_path / "tasks.jsonl").write_text(json.dumps(_task_fields(FAIL_TO_PASS=ids, instance_id="big")) + "\n")
    with pytest.raises(SweTaskError) as e:
        load_taskset(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'tasks.jsonl'}: task 1 ('big'): FAIL_TO_PASS: 90,000 test ids; at most "
                            f"{MAX_TEST_IDS:,} are allowed (they go on pytest's command line): keep the ids that "
                            "check the fix, or split the task")
    with pytest.raises(ValueError, match=rf"(?s)PASS_TO_PASS.*test id 1 is 501 characters; at most {MAX_TEST_ID_CHARS}"):
        SweTask.model_validate(_task_fields(PASS_TO_PASS=["tests/test_a.py::t", "t" * (MAX_TEST_ID_CHARS + 1)]))
    near = ["t" * MAX_TEST_ID_CHARS] * (MAX_TEST_IDS_CHARS // MAX_TEST_ID_CHARS + 1)
    with pytest.raises(ValueError, match=rf"(?s)PASS_TO_PASS.*{len(near) * MAX_TEST_ID_CHARS:,} characters of test ids"):
        SweTask.model_validate(_task_fields(PASS_TO_PASS=near))
    ok = SweTask.model_validate(_task_fields(FAIL_TO_PASS=ids[:MAX_TEST_IDS], PASS_TO_PASS=near[:-1]))
    assert len(ok.FAIL_TO_PASS) == MAX_TEST_IDS and len(ok.PASS_TO_PASS) == len(near) - 1

def test_an_overlong_test_pattern_is_refused():
    with pytest.raises(ValueError, match=r"test_patterns\[1\] is 201 characters; at most 200"):
        SweTask.model_validate(_task_fields(test_patterns=["tests/*", "a" * (MAX_TEST_PATTERN_CHARS + 1)]))


def test_test_file_digests_refuses_an_uncapped_pattern_list_and_is_fast_at_the_cap(tmp_path):
    for i in range(20):
        (tmp_path / f"mod{i}.py").write_text("x=1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test(): pass\n")
    with pytest.raises(ValueError, match="test_patterns holds 40,000 globs"):
        digests_of_test_files(tmp_path, [f"*x{i}*y*z*test*.py" for i in range(40_000)])
    pats = [f"*x{i}*y*z*test*.py" for i in range(MAX_TEST_PATTERNS - 1)] + ["tests/*"]
    t0 = time.monotonic()
    out = digests_of_test_files(tmp_path, pats)
    assert time.monotonic() - t0 < 2.0
    assert out == {"tests/test_a.py": hashlib.sha256(b"def test(): pass\n").hexdigest()}


def test_combined_pattern_regex_matches_as_fnmatch_does():
    import fnmatch

    pats = list(DEFAULT_TEST_PATTERNS) + ["docs/*.rst", "[ab]?.cfg"]
    paths = ["tests/x.py", "pkg/test_y.py", "pkg/y_test.py", "conftest.py", "src/a.py", "docs/i.rst",
             "docs/sub/i.rst", "a1.cfg", "c1.cfg", "setup.cfg", "pkg/mod.py", "testing/z.txt"]
    for p in paths:
        name = p.rsplit("/", 1)[-1]
        want = any(fnmatch.fnmatch(p, g) or fnmatch.fnmatch(name, g) for g in pats)
        assert is_test_file(p, pats) is want, p
    assert is_test_file("tests/x.py", []) is False


@pytest.mark.parametrize("text, says", [
    ("[1, 2]", "holds a JSON list, where the generator writes an object"),
    ("[" * 200_000 + "]" * 200_000, "not JSON (nested too deeply)"),
    ('{"seed": ' + "9" * 5000 + "}", "a number of 5,000 digits"),
    ('{"seed": ', "not JSON (Expecting value"),
])
def test_a_hostile_manifest_is_refused_naming_the_file(tmp_path, text, says):
    """Review 20 C3-R20: a manifest.json that is a list, 200,000 brackets deep or holds a 5,000-digit integer ended
    ``swe tasks`` with a bare AttributeError / RecursionError / Python's int-digits advice naming no file."""
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(SweTaskError) as e:
        load_manifest(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'manifest.json'}: ") and says in str(e.value)


def test_a_manifest_over_the_cap_is_refused_unread_and_a_good_one_is_read(tmp_path):
    (tmp_path / "manifest.json").write_text('{"seed": 3, "n_tasks": 2}')
    assert load_manifest(tmp_path) == {"seed": 3, "n_tasks": 2}
    assert load_manifest(tmp_path / "none") == {}
    with open(tmp_path / "manifest.json", "r+b") as f:
        f.truncate(MANIFEST_MAX_BYTES + 1)  # sparse: no disk, but a whole read would allocate it
    with pytest.raises(SweTaskError, match=r"manifest\.json: over MANIFEST_MAX_BYTES = 4 MiB"):
        load_manifest(tmp_path)
