"""SWE tasks in SWE-bench form: the shipped generated set, a SWE-bench JSONL loader, the test runner.

A task (:class:`SweTask`) is a repository snapshot with a bug, a problem statement, and two lists
of hidden tests: ``FAIL_TO_PASS`` (fail on the task repo, pass once fixed) and ``PASS_TO_PASS``
(pass before and after). Field names follow SWE-bench (Jimenez et al. 2024, ``princeton-nlp/SWE-bench``).

Two sources:

- the shipped set in ``rl_backend/data/swe_tasks/`` (``tasks.jsonl`` + ``manifest.json`` + one
  ``repos/<project>-<version>.tar.gz`` snapshot per project), made offline by
  ``scripts/gen_swe_tasks.py`` from real PyPI sdists with an AST-mutation bug per task. A generated
  task carries ``snapshot`` (the tarball) and ``bug`` (the exact string the mutation replaced), so
  its repo is the clean snapshot with ``bug.old`` replaced by ``bug.new``;
- :func:`load_swebench_jsonl`: SWE-bench-style JSONL (``instance_id``, ``repo``, ``base_commit``,
  ``problem_statement``, ``patch``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS`` as lists or
  JSON strings); the repo is ``git archive <base_commit>`` of a local clone
  ``<repos_root>/<owner>__<name>`` (no network at run time).

Tests run with pytest in the sandbox (:func:`run_pytest`, ``evotrainer.sandbox.run_in_sandbox``);
outcomes come from pytest's ``-rA`` summary, one ``OUTCOME node_id`` line per test.
"""

from __future__ import annotations

import fnmatch
import functools
import gzip
import hashlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from evotrainer.errors import EvoTrainerError
from evotrainer.jsonl import NumberTooLong, iter_jsonl, loads
from evotrainer.sandbox import run_in_sandbox
from evotrainer.sandbox.fs import (
    READ_CHUNK_BYTES,
    UnsafePathError,
    makedirs_beneath,
    open_beneath,
    read_chunks,
    read_file,
    remove_tree,
    split_relative,
    walk,
    write_file,
)
from evotrainer.terminal import has_controls

TASKSET_DIR = Path(__file__).parents[1] / "data" / "swe_tasks"
DEFAULT_TEST_PATTERNS: tuple[str, ...] = ("test_*.py", "*_test.py", "conftest.py", "tests/*", "test/*",
                                          "testing/*", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")
"""Paths (fnmatch on the repo-relative path, and on its file name) that count as test files or test config."""

MAX_TEST_PATTERNS = 64
"""Globs one task's ``test_patterns`` may hold. Review 19 (W2-R19): 40,000 globs (a 949 KB task line) made
:func:`test_file_digests` take 77 s on a 21-file repo, on the host, at every reset and grading. Real task sets use
the ten defaults or a few more; 64 leaves room for a project's odd layout."""

MAX_TEST_PATTERN_CHARS = 200
"""Characters of one ``test_patterns`` glob: a repo-relative path glob is well under 100; 200 leaves room."""

MAX_TEST_IDS = 2_000
"""Test ids one of ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` may hold. The ids go on pytest's command line inside the
sandbox, and the kernel bounds a command line (ARG_MAX, 2 MiB with the usual 8 MiB stack; review 20, O1-R20: 90,000
ids, 3.8 MB, ended ``swe check`` with "Argument list too long", naming no field). SWE-bench's largest lists hold a
few hundred to ~1,500 ids."""

MAX_TEST_ID_CHARS = 500
"""Characters of one test id (``path::Class::test[param]``; each is one argv string, which the kernel caps at
MAX_ARG_STRLEN, 128 KiB); real ids are well under 200, 500 leaves room for long parametrizations."""

MAX_TEST_IDS_CHARS = 512 << 10
"""Characters of all ids of one list together: both lists at the cap (1 MiB) stay under ARG_MAX (2 MiB) with room
for the environment and the rest of the command line."""


class SweTaskError(EvoTrainerError, ValueError):
    """A task file or repo cannot be loaded or built; the message names the task / field and the fix."""


# Caps on a generated task's snapshot tarball. A task set can come from anyone: a tar bomb took 91.5 s and 6.39 GB
# to unpack before these caps (review 16: one 6 GB zero file; here 1 GiB took 13.6 s and 2.08 GB of memory, 100,000
# empty files 12 s). The shipped snapshots hold at most 28 entries, 90 KB, the largest file 26 KB; the caps leave
# room for a whole mid-size project (thousands of source files, tens of MB) and stop a bomb within seconds.
SNAPSHOT_MAX_FILE_BYTES = 16 << 20  # one file of a snapshot (source, not data)
SNAPSHOT_MAX_TOTAL_BYTES = 64 << 20  # all files of a snapshot together
SNAPSHOT_MAX_FILES = 20_000  # entries (files and folders); each costs an inode and a header to read
# The tar stream read while unpacking (headers, padding, PAX records included; gzip's output, so a zero bomb
# stops here however well it compresses) and the size of the .tar.gz file itself (empty gzip members cost
# reading without output). Twice the total cap: headers and padding of SNAPSHOT_MAX_FILES small files fit.
SNAPSHOT_MAX_STREAM_BYTES = 128 << 20
# A tar extended header (pax 'x' / 'g' records, GNU 'L' / 'K' long names) is read whole into memory by tarfile before
# its member is seen: one declaring 100 MiB held ~400 MB for 2.2 s before the first check (review 17). Real ones carry
# a path and a few times (a path is at most PATH_MAX = 4 KiB); 64 KiB is 16 such paths.
SNAPSHOT_MAX_HEADER_BYTES = 64 << 10
# Extended headers before one member: tarfile reads each chained one recursively (3,000 small pax headers were a
# RecursionError, uncaught). A real member has at most four ('g', 'x', 'L', 'K'); 8 leaves room.
SNAPSHOT_MAX_HEADER_CHAIN = 8
# A task set's manifest.json: the generator's record (seed, counts, one source entry per sdist). The shipped one
# is 4 KB; 4 MiB holds thousands of sources and stops a huge or endless file before it is read whole (review 20).
MANIFEST_MAX_BYTES = 4 << 20


def check_relative_path(value: str, field: str) -> str:
    """``value`` when it is a safe path relative to a folder, else ``ValueError`` naming ``field`` and the fix.

    Refused: empty (or only ``.``), absolute, a ``..`` component, a control character (NUL, newline, ESC...)
    or a bidi control (:func:`evotrainer.terminal.has_controls`). Used for ``bug.path``, ``snapshot`` and the
    member names of a snapshot tarball: a hostile task set must not name a file outside its folder.
    """
    if has_controls(value):
        raise ValueError(f"{field}={value[:200]!r} holds a control character; give a plain relative path "
                         "such as 'pkg/mod.py'")
    try:
        parts = split_relative(value)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None
    if not parts:
        raise ValueError(f"{field}={value!r} is empty; give a file path relative to the repository, such as "
                         "'pkg/mod.py'")
    return value


def check_printable(value: str, field: str) -> str:
    """``value`` when it holds no control character (:func:`evotrainer.terminal.has_controls`), else ``ValueError``
    naming ``field``: ids and names are printed to terminals and used in messages."""
    if has_controls(value):
        raise ValueError(f"{field}={value[:200]!r} holds a control character (ESC, newline, NUL...); ids and "
                         "names must be printable text")
    return value


class BugSpec(BaseModel):
    """The injected bug of a generated task: in ``path``, the clean text ``old`` became ``new`` (each unique).

    ``path`` is relative to the repository root (checked by :func:`check_relative_path`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str
    old: str
    new: str
    operator: str = ""

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        return check_relative_path(v, "bug.path")


class SweTask(BaseModel):
    """One SWE task (SWE-bench fields, plus ``snapshot`` / ``bug`` for generated tasks).

    Attributes:
        instance_id: unique id, e.g. ``cachetools-5.5.0__003`` (printable: no control character).
        repo: project name (generated) or ``owner/name`` (SWE-bench); printable.
        problem_statement: the issue text shown to the policy.
        FAIL_TO_PASS / PASS_TO_PASS: pytest node ids of the hidden tests.
        patch: the gold fix as a unified diff (informational for generated tasks).
        test_patch: SWE-bench only: applied to the final repo state before the hidden tests run.
        snapshot: generated only: tarball name under the task set's ``repos/`` (a relative path:
            :func:`check_relative_path`; unpacked within the ``SNAPSHOT_MAX_*`` caps).
        bug: generated only: the injected mutation (:class:`BugSpec`).
        test_patterns: globs of files that count as test files (editing one fails the episode).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    instance_id: str = Field(..., min_length=1)
    repo: str
    base_commit: str = ""
    problem_statement: str = Field(..., min_length=1)
    FAIL_TO_PASS: list[str] = Field(..., min_length=1)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    patch: str = ""
    test_patch: str = ""
    snapshot: str | None = None
    bug: BugSpec | None = None
    test_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_TEST_PATTERNS))
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        if isinstance(v, str):  # SWE-bench stores these lists as JSON strings
            try:
                return json.loads(v)
            except json.JSONDecodeError:
                raise ValueError(f"{v[:60]!r} is not a JSON list of test ids; write e.g. '[\"tests/test_a.py::test_x\"]'"
                                 ) from None
        return v

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS")
    @classmethod
    def _ids_capped(cls, v: list[str]) -> list[str]:
        """At most :data:`MAX_TEST_IDS` ids of :data:`MAX_TEST_ID_CHARS` characters, :data:`MAX_TEST_IDS_CHARS` in
        all: they go on pytest's command line (the message names the field, the cap and the fix)."""
        if len(v) > MAX_TEST_IDS:
            raise ValueError(f"{len(v):,} test ids; at most {MAX_TEST_IDS:,} are allowed (they go on "
                             "pytest's command line): keep the ids that check the fix, or split the task")
        longest = max(map(len, v), default=0)
        if longest > MAX_TEST_ID_CHARS:
            at = next(i for i, t in enumerate(v) if len(t) == longest)
            raise ValueError(f"test id {at} is {longest:,} characters; at most {MAX_TEST_ID_CHARS} are allowed per "
                             "test id (path::test[param]): shorten it")
        total = sum(map(len, v))
        if total > MAX_TEST_IDS_CHARS:
            raise ValueError(f"{total:,} characters of test ids; at most {MAX_TEST_IDS_CHARS:,} are "
                             "allowed in all (they go on pytest's command line): keep fewer ids")
        return v

    @field_validator("test_patterns")
    @classmethod
    def _patterns_capped(cls, v: list[str]) -> list[str]:
        check_test_patterns(v)
        return v

    @field_validator("snapshot")
    @classmethod
    def _snapshot_relative(cls, v: str | None) -> str | None:
        return None if v is None else check_relative_path(v, "snapshot")

    @field_validator("instance_id", "repo")
    @classmethod
    def _printable(cls, v: str, info: ValidationInfo) -> str:
        check_printable(v, info.field_name or "field")
        if info.field_name == "repo" and v.strip() in (".", ".."):
            raise ValueError(f"repo={v!r} names no project; give a project name or owner/name")
        return v

    @property
    def test_files(self) -> list[str]:
        """Test files that hold the hidden tests (the path part of each node id), sorted."""
        return sorted({t.split("::")[0] for t in self.FAIL_TO_PASS + self.PASS_TO_PASS})


def check_test_patterns(patterns: list[str] | tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming ``test_patterns`` when it holds more than :data:`MAX_TEST_PATTERNS` globs, or a
    glob over :data:`MAX_TEST_PATTERN_CHARS` characters (the message says the cap and how to fit)."""
    if len(patterns) > MAX_TEST_PATTERNS:
        raise ValueError(f"test_patterns holds {len(patterns):,} globs; at most {MAX_TEST_PATTERNS} are allowed: "
                         "use wider globs (e.g. 'tests/*', 'test_*.py')")
    for i, p in enumerate(patterns):
        if len(p) > MAX_TEST_PATTERN_CHARS:
            raise ValueError(f"test_patterns[{i}] is {len(p):,} characters; at most {MAX_TEST_PATTERN_CHARS} are "
                             "allowed per glob: shorten it")


@functools.lru_cache(maxsize=64)
def _test_pattern_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """All of ``patterns`` as one compiled regex (``fnmatch.translate`` of each, joined by ``|``)."""
    check_test_patterns(patterns)
    if not patterns:
        return re.compile(r"(?!)")  # matches nothing
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def is_test_file(relpath: str, patterns: list[str] | tuple[str, ...] = DEFAULT_TEST_PATTERNS) -> bool:
    """True when a repo-relative path matches a test-file pattern (on the full path or the file name).

    The patterns are compiled once into one regex (cached per pattern tuple); more than :data:`MAX_TEST_PATTERNS`
    or a glob over :data:`MAX_TEST_PATTERN_CHARS` characters raises ``ValueError``.
    """
    rel = relpath.replace(os.sep, "/").lstrip("./")
    name = rel.rsplit("/", 1)[-1]
    rx = _test_pattern_regex(tuple(patterns))
    return bool(rx.match(rel) or rx.match(name))


# --- loading ----------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise SweTaskError(f"{path}: no such task file")
    return [row for _, row in iter_jsonl(path.read_text().splitlines(), str(path), SweTaskError,
                                         "; one task object per line")]


def _validate(rows: list[dict[str, Any]], where: Path) -> list[SweTask]:
    tasks, seen = [], set()
    for n, row in enumerate(rows, 1):
        try:
            t = SweTask.model_validate(row)
        except ValidationError as err:  # the first error as "field: message", without pydantic's input dump
            detail = err.errors(include_url=False)[0]
            loc = ".".join(str(p)[:80] for p in detail["loc"]) or "task"
            msg = str(detail["msg"]).removeprefix("Value error, ")[:500]
            raise SweTaskError(f"{where}: task {n} ({str(row.get('instance_id', '?'))[:200]!r}): {loc}: {msg}"
                               ) from None
        except Exception as exc:
            first = str(exc).splitlines()
            raise SweTaskError(f"{where}: task {n} ({str(row.get('instance_id', '?'))[:200]!r}): "
                               f"{' '.join(first[:3])}") from None
        if t.instance_id in seen:
            raise SweTaskError(f"{where}: duplicate instance_id {t.instance_id!r}; ids must be unique")
        seen.add(t.instance_id)
        tasks.append(t)
    return tasks


def load_taskset(root: str | Path = TASKSET_DIR) -> list[SweTask]:
    """The generated task set in ``root`` (``tasks.jsonl``; snapshots in ``repos/``).

    Raises:
        SweTaskError: missing or malformed ``tasks.jsonl``, or a snapshot it names is absent.
    """
    root = Path(root)
    tasks = _validate(_read_jsonl(root / "tasks.jsonl"), root / "tasks.jsonl")
    for t in tasks:
        if t.snapshot and not (root / "repos" / t.snapshot).is_file():
            raise SweTaskError(f"{t.instance_id}: snapshot {root / 'repos' / t.snapshot} is missing; "
                               "regenerate with scripts/gen_swe_tasks.py")
    return tasks


def load_manifest(root: str | Path = TASKSET_DIR) -> dict[str, Any]:
    """The generator's record (seed, sources with sdist sha256 and licence, counts) of a task set ({} without one).

    Raises:
        SweTaskError: ``manifest.json`` unreadable, over :data:`MANIFEST_MAX_BYTES`, not JSON, nested too deeply,
            holding an over-long integer, or not an object (names the file and the fix).
    """
    p = Path(root) / "manifest.json"
    if not p.is_file():
        return {}
    fix = "regenerate the task set with scripts/gen_swe_tasks.py, or remove manifest.json"
    try:
        dir_fd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            data = read_file(dir_fd, p.name, MANIFEST_MAX_BYTES + 1)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise SweTaskError(f"{p}: cannot be read ({exc.strerror or exc}); {fix}") from None
    if len(data) > MANIFEST_MAX_BYTES:
        raise SweTaskError(f"{p}: over MANIFEST_MAX_BYTES = {MANIFEST_MAX_BYTES >> 20} MiB; {fix}")
    # Review 20 C3-R20: a JSON list, 200,000 nested brackets or a 5,000-digit integer ended `swe tasks` with a bare
    # AttributeError, RecursionError or Python's int-digits advice that named no file.
    try:
        man = loads(data.decode("utf-8"))
    except NumberTooLong as exc:
        raise SweTaskError(f"{p}: {exc}") from None
    except (RecursionError, ValueError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:200]
        raise SweTaskError(f"{p}: not JSON ({why}); {fix}") from None
    if not isinstance(man, dict):
        raise SweTaskError(f"{p}: holds a JSON {type(man).__name__}, where the generator writes an object "
                           f"(seed, sources, counts); {fix}")
    return man


def load_swebench_jsonl(path: str | Path) -> list[SweTask]:
    """Tasks from SWE-bench-style JSONL (``FAIL_TO_PASS`` / ``PASS_TO_PASS`` as lists or JSON strings).

    Raises:
        SweTaskError: missing file, bad JSON, or a row without the required fields (names the row).
    """
    path = Path(path)
    rows = _read_jsonl(path)
    for n, row in enumerate(rows, 1):
        missing = [k for k in ("instance_id", "repo", "problem_statement", "FAIL_TO_PASS") if k not in row]
        if missing:
            raise SweTaskError(f"{path}:{n}: missing field(s) {missing}; SWE-bench rows need instance_id, repo, "
                               "base_commit, problem_statement, FAIL_TO_PASS, PASS_TO_PASS")
    return _validate(rows, path)


# --- building a task's repository -----------------------------------------------------------------
def write_snapshot(src: Path, tar_path: Path) -> str:
    """Write ``src`` as a reproducible ``.tar.gz`` (sorted names, mtime 0, root owner); returns its sha256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(src.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                info = tarfile.TarInfo(p.relative_to(src).as_posix())
                data = p.read_bytes()
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    raw = gzip.compress(buf.getvalue(), compresslevel=9, mtime=0)
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    tar_path.write_bytes(raw)
    return hashlib.sha256(raw).hexdigest()


class CappedReader:
    """A read-only stream over ``raw`` that raises :class:`SweTaskError` once more than ``cap`` bytes came out."""

    def __init__(self, raw: Any, cap: int, label: str):
        self.raw, self.cap, self.label, self.read_bytes = raw, cap, label, 0

    def read(self, n: int = -1, /) -> bytes:
        room = self.cap + 1 - self.read_bytes  # one byte past the cap tells "over" from "exactly at"
        data = self.raw.read(room if n is None or n < 0 else min(n, room))
        self.read_bytes += len(data)
        if self.read_bytes > self.cap:
            raise SweTaskError(f"{self.label}: the unpacked tar stream is over SNAPSHOT_MAX_STREAM_BYTES = "
                               f"{self.cap >> 20} MiB (file data, headers and padding); {_SNAPSHOT_FIX}")
        return data

    def tell(self) -> int:
        return self.read_bytes

    def write(self, b: bytes, /) -> int:
        raise io.UnsupportedOperation("a snapshot stream is read-only")

    def seek(self, pos: int, /) -> int:
        raise io.UnsupportedOperation("a snapshot stream is read forward only")

    def close(self) -> None:  # the caller closes the file under it
        pass


_SNAPSHOT_FIX = "a snapshot holds the source files of one project (scripts/gen_swe_tasks.py writes them)"
_EXTENDED_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                   tarfile.GNUTYPE_LONGLINK)


_Info = TypeVar("_Info", bound="SnapshotTarInfo")


class SnapshotTarInfo(tarfile.TarInfo):
    """A tar header of a snapshot, refused as it is parsed, before :mod:`tarfile` reads what it announces.

    Refused with :class:`SweTaskError` naming ``label`` (the task and tarball): an extended header (pax ``x`` / ``g``,
    GNU ``L`` / ``K``) declaring more than :data:`SNAPSHOT_MAX_HEADER_BYTES`, more than
    :data:`SNAPSHOT_MAX_HEADER_CHAIN` of them in a row, and a GNU sparse header (``S``: tarfile reads its extension
    blocks one by one into a list; a snapshot has no sparse file). :func:`open_snapshot_stream` makes one subclass per
    stream (``label``; ``chain``: extended headers seen since the last member).
    """

    label = "snapshot"
    chain = 0

    @classmethod
    def frombuf(cls: type[_Info], buf: bytes | bytearray, encoding: str, errors: str) -> _Info:
        obj = super().frombuf(buf, encoding, errors)
        if obj.type == tarfile.GNUTYPE_SPARSE:
            raise SweTaskError(f"{cls.label}: member {obj.name!r} is not a regular file or a folder (tar type "
                               f"{obj.type!r}: a GNU sparse file, refused before its sparse map); {_SNAPSHOT_FIX}")
        if obj.type not in _EXTENDED_TYPES:
            cls.chain = 0
            return obj
        if obj.size > SNAPSHOT_MAX_HEADER_BYTES:
            raise SweTaskError(f"{cls.label}: an extended tar header (type {obj.type.decode('latin-1')!r}) of "
                               f"{obj.size} bytes, over SNAPSHOT_MAX_HEADER_BYTES = {SNAPSHOT_MAX_HEADER_BYTES >> 10}"
                               f" KiB; {_SNAPSHOT_FIX}")
        cls.chain += 1
        if cls.chain > SNAPSHOT_MAX_HEADER_CHAIN:
            raise SweTaskError(f"{cls.label}: more than SNAPSHOT_MAX_HEADER_CHAIN = {SNAPSHOT_MAX_HEADER_CHAIN} "
                               f"extended tar headers in a row; {_SNAPSHOT_FIX}")
        return obj


def open_snapshot_stream(gz: Any, label: str) -> tarfile.TarFile:
    """The snapshot tar stream of the unpacked gzip stream ``gz``, read forward (``r|``) through :class:`CappedReader`
    (:data:`SNAPSHOT_MAX_STREAM_BYTES`) with each header checked by :class:`SnapshotTarInfo`; errors name ``label``.

    Raises:
        SweTaskError: a header or the stream past a cap (also while iterating the members).
        tarfile.TarError: not a tar stream.
    """
    info = type("SnapshotTarInfo", (SnapshotTarInfo,), {"label": label})
    return tarfile.open(fileobj=CappedReader(gz, SNAPSHOT_MAX_STREAM_BYTES, label), mode="r|", tarinfo=info)


def _check_sizes(label: str, name: str, size: int, total: int) -> None:
    """Refuse a member of ``size`` bytes that brings the snapshot's files to ``total`` bytes, past a cap."""
    if size > SNAPSHOT_MAX_FILE_BYTES:
        raise SweTaskError(f"{label}: member {name!r} is over SNAPSHOT_MAX_FILE_BYTES = "
                           f"{SNAPSHOT_MAX_FILE_BYTES >> 20} MiB ({size} bytes or more); {_SNAPSHOT_FIX}")
    if total > SNAPSHOT_MAX_TOTAL_BYTES:
        raise SweTaskError(f"{label}: the files up to {name!r} are over SNAPSHOT_MAX_TOTAL_BYTES = "
                           f"{SNAPSHOT_MAX_TOTAL_BYTES >> 20} MiB ({total} bytes or more); {_SNAPSHOT_FIX}")


def _write_member(tar: tarfile.TarFile, m: tarfile.TarInfo, dest_fd: int, label: str, total: int) -> int:
    """Write the regular file ``m`` beneath ``dest_fd`` (new, ``O_EXCL``, no link followed); returns its bytes.

    The bytes are counted as they arrive, against the caps (``total``: the bytes of the files before it).
    """
    parent = m.name.rsplit("/", 1)[0] if "/" in m.name else ""
    if parent:
        makedirs_beneath(dest_fd, parent)
    fd = open_beneath(dest_fd, m.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755 if m.mode & 0o100 else 0o644)
    written = 0
    try:
        src = tar.extractfile(m)
        while src is not None and (chunk := src.read(READ_CHUNK_BYTES)):
            written += len(chunk)
            _check_sizes(label, m.name, written, total + written)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return written


def _snapshot_members(tar_path: Path, label: str, dest_fd: int | None) -> int:
    """Check every member of a snapshot tarball against the caps; with ``dest_fd``, also write it there.

    From each header, before anything of the member is written: a regular file or a folder (no link, device,
    FIFO, sparse or contiguous file), a safe relative name (:func:`check_relative_path`), at most
    :data:`SNAPSHOT_MAX_FILES` entries, the size at most :data:`SNAPSHOT_MAX_FILE_BYTES` and all sizes together
    at most :data:`SNAPSHOT_MAX_TOTAL_BYTES`. While writing, the bytes that arrive are counted against the same
    caps (a header can lie), and the whole stream is read through :func:`open_snapshot_stream`
    (:data:`SNAPSHOT_MAX_STREAM_BYTES`; extended headers under :data:`SNAPSHOT_MAX_HEADER_BYTES`). Files are created beneath ``dest_fd`` following no link
    (:func:`evotrainer.sandbox.fs.open_beneath`), with ``O_EXCL``: a name given twice is refused. Modes: 0o644,
    or 0o755 when the owner's execute bit is set; owners, times, setuid bits are not restored.
    Returns the number of entries.

    Raises:
        SweTaskError: naming ``label`` (task and tarball), the member and the cap or rule it breaks.
    """
    size = os.stat(tar_path).st_size
    if size > SNAPSHOT_MAX_STREAM_BYTES:
        raise SweTaskError(f"{label}: the tarball is {size} bytes, over SNAPSHOT_MAX_STREAM_BYTES = "
                           f"{SNAPSHOT_MAX_STREAM_BYTES >> 20} MiB; {_SNAPSHOT_FIX}")
    entries = total = 0
    try:
        with open(tar_path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz, \
                open_snapshot_stream(gz, label) as tar:
            for m in tar:
                entries += 1
                if entries > SNAPSHOT_MAX_FILES:
                    raise SweTaskError(f"{label}: more than SNAPSHOT_MAX_FILES = {SNAPSHOT_MAX_FILES} entries "
                                       f"(files and folders); {_SNAPSHOT_FIX}")
                if m.type == tarfile.DIRTYPE and m.name == ".":  # "./": the repository folder itself
                    continue
                try:
                    check_relative_path(m.name, "member name")
                except ValueError as exc:
                    raise SweTaskError(f"{label}: unsafe {exc}; {_SNAPSHOT_FIX}") from None
                if m.type == tarfile.DIRTYPE:
                    if dest_fd is not None:
                        makedirs_beneath(dest_fd, m.name)
                    continue
                if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    raise SweTaskError(f"{label}: member {m.name!r} is not a regular file or a folder (tar type "
                                       f"{m.type!r}: a link, device, FIFO or sparse file); {_SNAPSHOT_FIX}")
                _check_sizes(label, m.name, m.size, total + m.size)
                total += _write_member(tar, m, dest_fd, label, total) if dest_fd is not None else m.size
    except (UnsafePathError, FileExistsError, NotADirectoryError) as exc:
        raise SweTaskError(f"{label}: a member's path runs through a file or is given twice ({exc}); "
                           f"{_SNAPSHOT_FIX}") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise SweTaskError(f"{label}: not a readable .tar.gz ({type(exc).__name__}: {exc}); {_SNAPSHOT_FIX}"
                           ) from None
    return entries


def _extract(tar_path: Path, dest: Path, task_id: str = "") -> None:
    """Unpack a snapshot tarball into the empty folder ``dest`` within the ``SNAPSHOT_MAX_*`` caps.

    Two passes (:func:`_snapshot_members`): the headers alone first, so a tarball past a cap writes nothing;
    then the files, counted again as they are written. On any error ``dest`` is emptied before the error
    propagates (a half-built repo is never left for an episode).

    Raises:
        SweTaskError: an unsafe or oversized tarball, naming the task, the member and the cap.
    """
    label = f"{task_id or '?'}: snapshot {tar_path.name}"
    _snapshot_members(tar_path, label, None)
    fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _snapshot_members(tar_path, label, fd)
    except BaseException:
        for name in os.listdir(fd):
            remove_tree(dest / name)
        raise
    finally:
        os.close(fd)


def apply_bug(repo: Path, bug: BugSpec) -> None:
    """Replace the unique ``bug.old`` by ``bug.new`` in ``repo/bug.path``.

    The file is read and written beneath ``repo`` following no link on any component
    (:func:`evotrainer.sandbox.fs.read_file` / :func:`~evotrainer.sandbox.fs.write_file`): a snapshot entry that
    is a link to a host file is refused, never written through. Text is UTF-8, read with universal newlines
    (as ``Path.read_text`` read it), at most :data:`SNAPSHOT_MAX_FILE_BYTES`.

    Raises:
        SweTaskError: the file is missing, a link or not a regular file, too large, not UTF-8, or ``bug.old``
            does not occur exactly once.
    """
    fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            data = read_file(fd, bug.path, SNAPSHOT_MAX_FILE_BYTES + 1)
        except UnsafePathError as exc:
            raise SweTaskError(f"bug.path={bug.path!r}: {exc.strerror}; the bug must edit a regular file of the "
                               "snapshot (links are not followed)") from None
        except (FileNotFoundError, NotADirectoryError):
            raise SweTaskError(f"bug.path={bug.path!r}: no such file in the snapshot") from None
        except ValueError as exc:
            raise SweTaskError(f"bug.path: {exc}") from None
        if len(data) > SNAPSHOT_MAX_FILE_BYTES:
            raise SweTaskError(f"bug.path={bug.path!r}: over SNAPSHOT_MAX_FILE_BYTES = "
                               f"{SNAPSHOT_MAX_FILE_BYTES >> 20} MiB; the bug must edit a source file")
        try:
            text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError:
            raise SweTaskError(f"bug.path={bug.path!r}: not UTF-8 text; the bug must edit a source file") from None
        if text.count(bug.old) != 1:
            raise SweTaskError(f"bug.old occurs {text.count(bug.old)} times in {bug.path}; it must occur once")
        write_file(fd, bug.path, text.replace(bug.old, bug.new, 1).encode("utf-8"))
    finally:
        os.close(fd)


def materialize(task: SweTask, dest: str | Path, taskset_root: str | Path = TASKSET_DIR,
                repos_root: str | Path | None = None) -> Path:
    """Build the task's repository (with the bug, without the fix) in ``dest`` (created, must be empty).

    Generated tasks: the snapshot tarball with the bug applied. SWE-bench tasks: ``git archive`` of
    ``task.base_commit`` from the local clone ``<repos_root>/<owner>__<name>``.

    Raises:
        SweTaskError: ``dest`` is not empty, the snapshot / clone is missing, or git fails.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise SweTaskError(f"{dest}: not empty; materialize into a fresh folder")
    if task.snapshot:
        _extract(Path(taskset_root) / "repos" / task.snapshot, dest, task.instance_id)
        if task.bug:
            apply_bug(dest, task.bug)
        return dest
    if repos_root is None:
        raise SweTaskError(f"{task.instance_id}: a SWE-bench task needs repos_root, a folder with a local clone "
                           f"named {task.repo.replace('/', '__')}")
    clone = Path(repos_root) / task.repo.replace("/", "__")
    if not clone.exists():
        raise SweTaskError(f"{task.instance_id}: no local clone {clone}; clone {task.repo} there first")
    arch = subprocess.run(["git", "-C", str(clone), "archive", "--format=tar", task.base_commit or "HEAD"],
                          capture_output=True, timeout=300)
    if arch.returncode != 0:
        raise SweTaskError(f"{task.instance_id}: git archive {task.base_commit} failed: "
                           f"{arch.stderr.decode(errors='replace').strip()[:200]}")
    with tarfile.open(fileobj=io.BytesIO(arch.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def test_file_digests(repo: str | Path, patterns: list[str] | tuple[str, ...] = DEFAULT_TEST_PATTERNS
                      ) -> dict[str, str]:
    """``{relpath: sha256}`` of every test file in the repo (see :func:`is_test_file`).

    The repo may hold what sandboxed code left: the walk follows no link (:func:`evotrainer.sandbox.fs.walk`).
    A link or a special file at a test path gets a digest of its kind and target (``link:<target>``,
    ``fifo`` ...), so it never equals a real file's digest and counts as a test-file edit.
    ``patterns`` are capped as :func:`check_test_patterns` says (``ValueError`` past the caps) and compiled once.
    """
    out = {}
    for fd, name, rel, st in walk(repo, prune=lambda r, _st: r.rsplit("/", 1)[-1] == "__pycache__"):
        if stat.S_ISDIR(st.st_mode) or not is_test_file(rel, patterns):
            continue
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            for chunk in read_chunks(fd, name):  # one chunk in memory: sandboxed code may leave a huge test file
                h.update(chunk)
            out[rel] = h.hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = hashlib.sha256(b"link:" + os.fsencode(os.readlink(name, dir_fd=fd))).hexdigest()
        else:
            out[rel] = hashlib.sha256(f"special:{stat.S_IFMT(st.st_mode)}".encode()).hexdigest()
    return out


# --- running tests ----------------------------------------------------------------------------------
OUTCOME_RE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S.*?)(?: - .*)?$")


@dataclass
class PytestResult:
    """Outcome of one pytest run.

    Attributes:
        outcomes: ``{node_id: PASSED | FAILED | ERROR | SKIPPED | XFAIL | XPASS}`` from the results runner's
            report (:func:`structured_results`); empty when the run ended without one.
        exit_code: pytest's exit status (0 ok, 1 failures, 2 interrupted / collection error, 4 usage,
            5 no tests collected); -1 when a limit (time, memory) ended it.
        collection_error: an error while collecting (a module failed to import, a syntax error).
        output: combined stdout + stderr without the runner's report lines (tail kept by callers).
        wall_s: seconds. backend: the sandbox backend that ran it.
    """

    outcomes: dict[str, str]
    exit_code: int
    collection_error: bool
    output: str
    wall_s: float = 0.0
    timed_out: bool = False
    backend: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def parse_pytest_output(text: str) -> tuple[dict[str, str], bool]:
    """``({node_id: outcome}, collection_error)`` from pytest output run with ``-rA``.

    A collection error shows as ``ERROR <file>`` for a module (no ``::``) or an ``ERROR collecting``
    section; such a line sets ``collection_error``.
    """
    outcomes: dict[str, str] = {}
    coll = "ERROR collecting" in text or "errors during collection" in text
    for line in text.splitlines():
        m = OUTCOME_RE.match(line.strip())
        if not m:
            continue
        kind, node = m.group(1), m.group(2).strip()
        if kind == "ERROR" and "::" not in node:
            coll = True
            continue
        if node not in outcomes or kind in ("FAILED", "ERROR"):  # setup ERROR after a PASSED call wins
            outcomes[node] = kind
    return outcomes, coll


def pytest_argv(targets: list[str] | None = None, python: str = sys.executable) -> list[str]:
    """The pytest command line: ``-rA`` summary, short tracebacks, no cache, no colour."""
    return [python, "-m", "pytest", "-rA", "-q", "--tb=short", "-p", "no:cacheprovider",
            "--color=no", *(targets or [])]


# Runs pytest in this interpreter with a results plugin (``python -c _RESULTS_RUNNER <pytest args>``). Before any
# code under test is imported it makes a random token and writes "@@evotrainer-pytest <token> start" on the real
# stdout; at the end of the session it writes "@@evotrainer-pytest <token> <json>" there ({"outcomes": {node id:
# PASSED | FAILED | ERROR | SKIPPED | XFAIL | XPASS}, "collection_error": bool}). The verdict is read from that
# line only (:func:`structured_results`): code under test that prints "PASSED <node id>" lines and exits (forging
# the -rA summary the text parser reads) gets no verdict at all.
RESULTS_MARK = "@@evotrainer-pytest"
_RESULTS_RUNNER = r"""
import json, os, secrets, sys
def _run():
    token, out = secrets.token_hex(16), os.dup(1)
    os.write(out, f"@@evotrainer-pytest {token} start\n".encode())
    res, coll = {}, [False]
    class Results:
        def pytest_collectreport(self, report):
            if report.failed:
                coll[0] = True
        def pytest_runtest_logreport(self, report):
            xfail = hasattr(report, "wasxfail")
            if report.when == "call":
                kind = ("XFAIL" if report.skipped else "XPASS") if xfail else \
                    {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED"}[report.outcome]
            elif report.failed:
                kind = "ERROR"
            elif report.skipped:
                kind = "XFAIL" if xfail else "SKIPPED"
            else:
                return
            if res.get(report.nodeid) not in ("FAILED", "ERROR"):
                res[report.nodeid] = kind
        def pytest_sessionfinish(self, session, exitstatus):
            body = json.dumps({"outcomes": res, "collection_error": coll[0]})
            os.write(out, f"\n@@evotrainer-pytest {token} {body}\n".encode())
    import pytest
    return pytest.main(sys.argv[1:], plugins=[Results()])
raise SystemExit(_run())
"""


def runner_argv(targets: list[str] | None = None, python: str = sys.executable) -> list[str]:
    """:func:`pytest_argv` run through the results runner (``python -c _RESULTS_RUNNER <pytest args>``)."""
    return [python, "-c", _RESULTS_RUNNER, *pytest_argv(targets, python)[3:]]


def structured_results(stdout: str) -> tuple[dict[str, str], bool] | None:
    """``(outcomes, collection_error)`` from the results runner's report on ``stdout``; None when there is none.

    The token is the one of the first mark line (written before the tests' code ran); only a report line with that
    token counts, and the last one wins.
    """
    token, found = None, None
    for line in stdout.splitlines():
        if not line.startswith(RESULTS_MARK + " "):
            continue
        parts = line.split(" ", 2)
        if len(parts) != 3:
            continue
        if token is None:
            if parts[2] != "start":
                return None  # something else wrote first: not our runner's stream
            token = parts[1]
        elif parts[1] == token:
            try:
                data = json.loads(parts[2])
                found = ({str(k): str(v) for k, v in data["outcomes"].items()}, bool(data["collection_error"]))
            # RecursionError: the code under test can read the token in its own process (the plugin's closure) and
            # write a report nested past the recursion limit; it raised out of run_tests and grade (review 5)
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                continue
    return found


# Runs in the sandbox: copy $EVOTRAINER_EVIDENCE/repo (read-only) into the work dir (links kept as
# links), then become `python <runner args>` there.
_COPY_THEN_EXEC = ("import os,shutil,sys;shutil.copytree(os.path.join(os.environ['EVOTRAINER_EVIDENCE'],'repo'),'.',"
                   "symlinks=True,dirs_exist_ok=True);os.execv(sys.executable,[sys.executable,*sys.argv[1:]])")


def run_pytest(repo: str | Path, targets: list[str] | None = None, timeout_s: float = 60.0,
               memory_mb: int = 2048, sandbox: bool = True, disk_mb: int = 1024) -> PytestResult:
    """Run pytest on ``targets`` (files or node ids; all tests when None) in ``repo``.

    With ``sandbox=True`` (episodes: the repo holds policy-written code) the run goes through
    ``evotrainer.sandbox.run_in_sandbox``: the repo is mounted read-only and copied inside the
    sandbox onto its private work-dir tmpfs of ``disk_mb`` MiB (counted in ``memory_mb``), so
    nothing the tests write reaches the host repo; test side effects do not persist between runs. ``sandbox=False``
    runs a plain subprocess and is for trusted code only (the generator running a PyPI project's
    own suite). Outcomes come from the results runner's report (:func:`structured_results`); a run that ends
    without one (killed, ``os._exit`` in the code under test, a limit) has no outcomes, so every hidden test
    counts as missing. :func:`parse_pytest_output` reads the text summary for display only.

    Raises:
        evotrainer.sandbox.SandboxUnavailable: no isolating backend (its message says how to get one).
    """
    if sandbox:
        # The repo goes in read-only and is copied inside the sandbox onto its private tmpfs: whatever
        # the tests write (links to host files, FIFOs, deep trees, gigabytes) never lands on the host.
        argv = runner_argv(targets, python="python")
        res = run_in_sandbox(["python", "-c", _COPY_THEN_EXEC, *argv[1:]], inputs={"repo": Path(repo)},
                             timeout_s=timeout_s, memory_mb=memory_mb, disk_mb=disk_mb, image="swe-runner",
                             env={"PYTHONDONTWRITEBYTECODE": "1"})
        stdout = res.stdout or ""
        text = stdout + (res.stderr or "")
        limit, code, wall, backend = bool(res.limit_hit), int(res.exit_code), float(res.wall_s or 0.0), str(res.backend)
    else:
        t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        try:
            cp = subprocess.run(runner_argv(targets), cwd=repo, capture_output=True, text=True, timeout=timeout_s,
                                env=env)
            stdout, text, code, limit = cp.stdout, cp.stdout + cp.stderr, cp.returncode, False
        except subprocess.TimeoutExpired as exc:
            stdout = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
                else (exc.stdout or "")
            text, code, limit = stdout, -1, True
        wall, backend = time.monotonic() - t0, "subprocess"
    found = structured_results(stdout)
    text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(RESULTS_MARK))
    outcomes, coll = found if found is not None else ({}, False)
    if found is None and not limit:
        coll = "ERROR collecting" in text or "errors during collection" in text
    if code in (2, 3, 4) and not outcomes:
        coll = True
    return PytestResult(outcomes=outcomes, exit_code=-1 if limit else code, collection_error=coll, output=text,
                        wall_s=wall, timed_out=limit, backend=backend)
