"""Per-run limits of the bubblewrap backend: one cgroup per run, capped tmpfs, stale-run sweep.

* **cgroup per run** (memory, pids, cpu) where the host lets this process create cgroups (root, or a
  delegated subtree): cgroup v2 (``memory.max`` + ``memory.swap.max=0``, ``pids.max``, ``cpu.max``)
  or, on a v1 / hybrid host, one folder per v1 hierarchy (``memory.limit_in_bytes`` +
  ``memory.memsw.limit_in_bytes``, ``pids.max``, ``cpu.cfs_quota_us``). Run cgroups sit under the
  caller's own cgroup in each hierarchy (``<own>/evotrainer-sandbox/<run>``), so a limit the
  operator put on the caller still holds for the sandbox. The limits then hold for the whole run:
  three processes of 150 MiB each cannot all live under ``memory_mb=256``.
* **tmpfs caps**: ``size`` and ``nr_inodes`` mount options. bubblewrap's ``--size`` sets the size
  only (it has no inode option), so as root the tmpfs are mounted by a tiny shell in a private
  mount namespace (``unshare --mount --propagation private``) that then execs bwrap, which binds
  them; the mounts die with the namespace. One inode per 16 KiB of size cap, mke2fs's default
  ``inode_ratio`` (``/etc/mke2fs.conf``), at least 256.
* **stale-run sweep**: temp folders and cgroups are named ``<pid>.<start time>-<random>`` for the
  process that made them; at the start of every run the ones whose owner is gone (SIGKILL, a crash)
  are removed (leftover processes of a stale cgroup killed first).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

from evotrainer.sandbox.base import SandboxError
from evotrainer.sandbox.fs import remove_tree

CGROUP_DIR = "evotrainer-sandbox"
TMP_PREFIX = "evotrainer-sandbox-"
INODE_RATIO = 16384  # bytes per inode: mke2fs.conf's default inode_ratio
MIN_INODES = 256
DEV_SIZE = 1 << 20  # /dev holds ~12 nodes and links; it is remounted read-only after they are made
DEV_INODES = 256
CPU_PERIOD_US = 100_000  # the kernel's default CFS period
_NAME_RE = re.compile(r"^(\d+)\.(\d+)-")


def tmpfs_inodes(size_bytes: int) -> int:
    """The inode cap of a tmpfs of ``size_bytes``: one per :data:`INODE_RATIO` bytes, at least 256."""
    return max(MIN_INODES, size_bytes // INODE_RATIO)


# --- owners: pid + start time, so a reused pid does not keep a stale folder alive ----------------
def _start_time(pid: int) -> str | None:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat_line.rsplit(")", 1)[1].split()[19]  # field 22, starttime in clock ticks since boot


@functools.lru_cache(maxsize=4)
def _owner_tag_of(pid: int) -> str:
    return f"{pid}.{_start_time(pid) or 0}"


def owner_tag() -> str:
    """``<pid>.<start time>`` of this process: the prefix of the temp folders and cgroups it makes."""
    return _owner_tag_of(os.getpid())


def owner_alive(name: str) -> bool:
    """False when ``name`` starts ``<pid>.<start time>-`` of a process that no longer exists."""
    return _owner_alive(name)


def _owner_alive(name: str) -> bool:
    m = _NAME_RE.match(name)
    if m is None:
        return True  # not ours (another naming): never touched
    return _start_time(int(m.group(1))) == m.group(2)


def run_tmpdir() -> tempfile.TemporaryDirectory:
    """A private temp folder for one run, named for its owner (see :func:`sweep_stale`)."""
    return owned_tmpdir(TMP_PREFIX)


# --- cgroups ---------------------------------------------------------------------------------------
def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, fstype, mount root, super options) of every cgroup / cgroup2 mount."""
    out = []
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            f, r = left.split(), right.split()
            if r and r[0] in ("cgroup", "cgroup2"):
                out.append((f[4], r[0], f[3], r[2] if len(r) > 2 else ""))
    except OSError:
        pass
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and ``"unified"`` for v2."""
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _id, ctrls, path = line.split(":", 2)
            for c in (ctrls.split(",") if ctrls else ["unified"]):
                out[c] = path
    except OSError:
        pass
    return out


def _under(mount: str, root: str, path: str) -> Path:
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return Path(mount + rel.rstrip("/"))


@functools.lru_cache(maxsize=1)
def cgroup_plan() -> dict[str, tuple[Path, str] | str]:
    """Per controller (memory, pids, cpu): ``(folder holding the run cgroups, "v1" | "v2")``, or a
    string saying why it is not available. Cached: it probes by creating the parent folders."""
    own, mounts = _own_paths(), _mounts()
    plan: dict[str, tuple[Path, str] | str] = {}
    for ctrl in ("memory", "pids", "cpu"):
        plan[ctrl] = _plan_v2(ctrl, own, mounts) or _plan_v1(ctrl, own, mounts) or \
            f"no writable cgroup with the {ctrl} controller (needs root or a delegated cgroup)"
    return plan


def _plan_v2(ctrl: str, own: dict[str, str], mounts) -> tuple[Path, str] | None:
    for mp, fs, root, _opts in mounts:
        if fs != "cgroup2" or "unified" not in own:
            continue
        here = _under(mp, root, own["unified"])
        try:
            if ctrl not in (here / "cgroup.controllers").read_text().split() or not os.access(here, os.W_OK):
                continue
            parent = here / CGROUP_DIR
            parent.mkdir(exist_ok=True)
            if ctrl not in (parent / "cgroup.controllers").read_text().split():
                (here / "cgroup.subtree_control").write_text(f"+{ctrl}")  # EBUSY where `here` holds processes
            (parent / "cgroup.subtree_control").write_text(f"+{ctrl}")
            return parent, "v2"
        except OSError:
            continue
    return None


def _plan_v1(ctrl: str, own: dict[str, str], mounts) -> tuple[Path, str] | None:
    for mp, fs, root, opts in mounts:
        if fs != "cgroup" or ctrl not in opts.split(",") or ctrl not in own:
            continue
        here = _under(mp, root, own[ctrl])
        if not os.access(here, os.W_OK):
            continue
        try:
            parent = here / CGROUP_DIR
            parent.mkdir(exist_ok=True)
            return parent, "v1"
        except OSError:
            continue
    return None


class RunCgroup:
    """The cgroup(s) of one run: made with its limits, entered by the run's first process, removed after."""

    def __init__(self, memory_bytes: int, max_procs: int, cpus: float):
        self.dirs: dict[str, tuple[Path, str]] = {}
        name = f"{owner_tag()}-{uuid.uuid4().hex[:10]}"
        try:
            for ctrl, where in cgroup_plan().items():
                if isinstance(where, str):
                    continue
                parent, kind = where
                d = parent / name
                d.mkdir(exist_ok=True)  # v2: one folder for all controllers
                self.dirs[ctrl] = (d, kind)
                self._limit(ctrl, d, kind, memory_bytes, max_procs, cpus)
        except OSError as e:
            self.remove()
            raise SandboxError(f"cannot set up the run's cgroup ({e}); run as a normal user, or free the "
                               f"cgroup hierarchy") from e

    @staticmethod
    def _limit(ctrl: str, d: Path, kind: str, memory_bytes: int, max_procs: int, cpus: float) -> None:
        if ctrl == "pids":
            (d / "pids.max").write_text(str(max_procs))
        elif ctrl == "cpu":
            quota = max(1000, int(cpus * CPU_PERIOD_US))
            if kind == "v2":
                (d / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            else:
                (d / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (d / "cpu.cfs_quota_us").write_text(str(quota))
        elif kind == "v2":
            (d / "memory.max").write_text(str(memory_bytes))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
        else:
            (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (d / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no swapping past the limit
                (d / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the run's first process writes its pid to (one per hierarchy)."""
        return sorted({str(d / "cgroup.procs") for d, _ in self.dirs.values()})

    def _counter(self, ctrl: str, v1_file: str, v2_file: str, key: str) -> int:
        if ctrl not in self.dirs:
            return 0
        d, kind = self.dirs[ctrl]
        try:
            for line in (d / (v2_file if kind == "v2" else v1_file)).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def oom_kills(self) -> int:
        """Processes the kernel killed at the run's memory limit."""
        return self._counter("memory", "memory.oom_control", "memory.events", "oom_kill")

    def forks_refused(self) -> int:
        """Forks refused at the run's pids limit."""
        return self._counter("pids", "pids.events", "pids.events", "max")

    def remove(self) -> None:
        for d in {d for d, _ in self.dirs.values()}:
            _remove_cgroup(d)
        self.dirs = {}


def _remove_cgroup(cg: Path) -> None:
    """Kill whatever is left in ``cg`` (nothing, normally: the pid namespace died) and remove it."""
    for _ in range(100):
        try:
            pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    for _ in range(50):  # the last exit can lag the empty cgroup.procs by a few ms
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                return
            time.sleep(0.02)


# --- the stale-run sweep -------------------------------------------------------------------------------
def owned_tmpdir(prefix: str) -> tempfile.TemporaryDirectory:
    """A temp folder ``<prefix><pid>.<start time>-XXXX`` named for this process, which
    :func:`sweep_stale_folders` ``(prefix)`` removes once the process is gone (a SIGTERM or SIGKILL skips the
    ``TemporaryDirectory`` clean-up)."""
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{owner_tag()}-")


def sweep_stale_folders(prefix: str) -> int:
    """Remove the temp folders ``<prefix><pid>.<start time>-*`` whose owner process is gone (not following links);
    other names are never touched. Returns the count."""
    n = 0
    try:
        for p in Path(tempfile.gettempdir()).iterdir():
            if p.name.startswith(prefix) and not _owner_alive(p.name[len(prefix):]):
                try:
                    remove_tree(p)
                    n += 1
                except OSError:
                    pass
    except OSError:
        pass
    return n


def sweep_stale() -> int:
    """Remove temp folders and cgroups left by sandbox runs whose owner process is gone; returns the count."""
    n = sweep_stale_folders(TMP_PREFIX)
    for where in cgroup_plan().values():
        if isinstance(where, str):
            continue
        try:
            stale = [d for d in where[0].iterdir() if d.is_dir() and not _owner_alive(d.name)]
        except OSError:
            continue
        for d in stale:
            _remove_cgroup(d)
            n += 1
    return n


# --- tmpfs mounted by the host (root) with inode caps --------------------------------------------------
def host_tmpfs_available() -> bool:
    """True where tmpfs with ``nr_inodes`` can be mounted for a run: root and ``unshare`` present."""
    return os.geteuid() == 0 and _unshare() is not None


@functools.lru_cache(maxsize=1)
def _unshare() -> str | None:
    return shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")


# The run's first process: enter the cgroups, mount the capped tmpfs (private mount namespace), exec bwrap.
_PRELUDE = r'''
set -e
while [ "$1" != "--mounts" ]; do echo $$ > "$1"; shift; done; shift
while [ "$1" != "--" ]; do mount -t tmpfs -o "$1" tmpfs "$2"; shift 2; done; shift
exec "$@"
'''


def prelude_argv(procs_files: list[str], mounts: list[tuple[str, str]], argv: list[str]) -> list[str]:
    """``argv`` run after entering ``procs_files`` and mounting ``mounts`` ``[(options, folder)]``.

    Without mounts no mount namespace is needed (a plain ``sh``); without either, ``argv`` itself.
    """
    if not procs_files and not mounts:
        return argv
    flat = [x for opts, folder in mounts for x in (opts, folder)]
    sh = ["/bin/sh", "-c", _PRELUDE, "sandbox-prelude", *procs_files, "--mounts", *flat, "--", *argv]
    if not mounts:
        return sh
    unshare = _unshare()
    if unshare is None:  # callers mount only where host_tmpfs_available() found it
        raise SandboxError("tmpfs mounts for a run need `unshare` (util-linux) in /usr/bin, /bin, /usr/sbin or /sbin")
    return [unshare, "--mount", "--propagation", "private", "--", *sh]
