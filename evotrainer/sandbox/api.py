"""The sandbox for untrusted code: analyzers written by agents, code written by the policy.

One API, :func:`run_in_sandbox`, runs a command (or a Python source string) with

* no network (a fresh network namespace: only a downed loopback),
* an environment cleared of everything but a fixed allow-list and the caller's ``env`` (no API
  keys or tokens leak in, not even through ``/proc/1/environ``),
* inputs mounted read-only at ``/evidence/<name>``, a private writable work dir at
  ``/sandbox/work`` (a size-capped tmpfs, or the caller's ``workdir`` bound read-write), the code at
  ``/sandbox/main.py``, and a read-only view of the system and of this Python (interpreter prefix
  and venv, so analyzers can import numpy / pyarrow / duckdb),
* limits: wall clock (the whole tree is killed), CPU seconds, address space, file size, process
  count, captured output; per run (one cgroup: memory, pids, CPU quota) where the host allows it,
  every tmpfs (``/tmp``, ``/dev/shm``, ``/dev``, the private work dir) capped in size and, as root,
  in inodes (:mod:`evotrainer.sandbox.limits`; ``sandbox_info()["limits"]`` says which hold here),

and returns a :class:`SandboxResult` saying how it ended and which limit, if any, stopped it.

Backends, picked automatically (override with ``EVOTRAINER_SANDBOX=docker|bwrap|unsafe-local``):

* ``docker``: where a daemon answers (python ``docker`` SDK), images built from ``sandbox_images/``;
  ``network_mode=none``, read-only root, all capabilities dropped, no-new-privileges, uid 65534,
  memory / pids cgroup limits, cpu / fsize ulimits.
* ``bwrap`` (bubblewrap): every namespace unshared (user, pid, net, ipc, uts, cgroup, mount),
  nested user namespaces disabled, all capabilities dropped, uid/gid 65534, new session, root
  remounted read-only, ``/proc/sys`` read-only, a seccomp filter refusing keyring / bpf / perf /
  io_uring / module syscalls (as host root the sandbox uid maps to host uid 0, which sysctl and
  keyring ownership checks treat as root whatever the capabilities). Process count: the kernel ignores
  ``RLIMIT_NPROC`` for processes whose real uid is host root (bwrap as root maps sandbox uid 65534 to
  host uid 0), so as root the sandbox runs in its own cgroup (v1 or v2: pids, memory, cpu); as a
  normal user ``RLIMIT_NPROC`` is set inside the new user namespace, where the kernel counts it per
  namespace (checked: a fork loop stops at the limit). Other rlimits (CPU, AS, FSIZE, CORE=0) are
  set by a tiny launcher inside the sandbox.

Host code reads what a run left in a caller's work dir only through :mod:`evotrainer.sandbox.fs`
(no link followed, regular files only), and the work dir is cleaned after every run (setuid,
setgid and world-write bits; fails closed).
* ``unsafe-local``: a plain subprocess with rlimits and a cleared environment; *no* isolation of
  the file system or network. Only with ``unsafe_local=True`` or ``EVOTRAINER_SANDBOX=unsafe-local``.

The bwrap and unsafe-local backends live in :mod:`evotrainer.sandbox.bwrap`, Docker in
:mod:`evotrainer.sandbox.docker`. In ``cmd``, ``"python"`` means the sandbox's Python (this venv under bwrap, the image's under
Docker) and ``"{code}"`` is replaced by the path of ``code``.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import evotrainer.sandbox.limits as lim
from evotrainer.sandbox.base import (
    BASE_ENV,
    CODE_PATH,
    EVIDENCE_DIR,
    SANDBOX_ENV,
    SANDBOX_UID,
    WORK_DIR,
    RunLimits,
    SandboxError,
    SandboxResult,
    SandboxUnavailable,
)
from evotrainer.sandbox.bwrap import (
    BLOCKED_SYSCALLS,
    WRITABLE,
    landlock_abi,
    run_bwrap,
    run_unsafe_local,
    seccomp_filter,
)
from evotrainer.sandbox.docker import daemon_limits, run_docker
from evotrainer.sandbox.fs import clean_work_dir, shared_hard_links


# --- backend discovery -------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _docker_client():
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        return client
    except Exception:  # no SDK, no socket, daemon down: Docker is simply not available
        return None


def _pids_cgroup_root() -> tuple[Path, str] | None:
    """The folder run cgroups with the pids controller go in, and its kind ("v1" | "v2"); None if none."""
    where = lim.cgroup_plan()["pids"]
    return None if isinstance(where, str) else where


@functools.lru_cache(maxsize=1)
def _bwrap_status() -> tuple[str | None, str]:
    """(path to a working bwrap or None, reason)."""
    path = shutil.which("bwrap")
    if path is None:
        return None, "bwrap not installed (apt-get install -y bubblewrap, or `make sandbox-deps`)"
    probe = [path, "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
             "--ro-bind", "/", "/", "--", "/bin/true"]
    try:
        r = subprocess.run(probe, env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"bwrap failed to start: {e}"
    if r.returncode != 0:
        return None, f"bwrap cannot create namespaces here: {r.stderr.decode(errors='replace').strip()}"
    if os.geteuid() == 0 and _pids_cgroup_root() is None:
        return None, ("running as root without a writable pids cgroup: the kernel ignores RLIMIT_NPROC for "
                      "root, so a fork bomb could not be contained; run as a normal user or mount cgroups")
    return path, "ok"


def _choose_backend(unsafe_local: bool) -> str:
    want = os.environ.get(SANDBOX_ENV, "auto").strip().lower() or "auto"
    if want not in ("auto", "docker", "bwrap", "unsafe-local"):
        raise SandboxError(f"{SANDBOX_ENV}={want!r}: use auto, docker, bwrap or unsafe-local")
    if want == "unsafe-local" or (unsafe_local and want == "auto" and not _isolating_available()):
        return "unsafe-local"
    if want in ("auto", "docker") and _docker_client() is not None:
        return "docker"
    if want == "docker":
        raise SandboxUnavailable(f"{SANDBOX_ENV}=docker but no Docker daemon answers")
    bwrap, reason = _bwrap_status()
    if bwrap is not None:
        return "bwrap"
    if unsafe_local:
        return "unsafe-local"
    raise SandboxUnavailable(f"no sandbox backend: no Docker daemon, and {reason}. Refusing to run untrusted "
                             f"code; pass unsafe_local=True or set {SANDBOX_ENV}=unsafe-local to run it unisolated")


def _isolating_available() -> bool:
    return _docker_client() is not None or _bwrap_status()[0] is not None


def sandbox_info() -> dict:
    """The backend :func:`run_in_sandbox` would use now, why, and its limits and mounts.

    Raises nothing: an unavailable sandbox is reported as ``{"backend": None, "reason": ...}``.
    """
    bwrap, bwrap_reason = _bwrap_status()
    try:
        backend, reason = _choose_backend(unsafe_local=False), "ok"
    except SandboxError as e:
        backend, reason = None, str(e)
    cg = _pids_cgroup_root()
    procs = ("docker pids cgroup" if backend == "docker" else
             f"pids cgroup {cg[1]}" if cg else "RLIMIT_NPROC in a user namespace")
    return {
        "backend": backend,
        "reason": reason,
        "docker": _docker_client() is not None,
        "bwrap": bwrap,
        "bwrap_status": bwrap_reason,
        "uid": SANDBOX_UID,
        "host_euid": os.geteuid(),
        "network": "none",
        "process_limit": procs,
        "limits": limits_report(backend),
        "docker_daemon": daemon_limits(_docker_client())[0] if backend == "docker" else None,
        "seccomp": _seccomp_summary(backend),
        "python": sys.executable,
        "mounts": {"work": WORK_DIR, "code": CODE_PATH, "inputs": f"{EVIDENCE_DIR}/<name> (read-only)"},
        "defaults": {k: p.default for k, p in inspect.signature(run_in_sandbox).parameters.items()
                     if k in ("timeout_s", "cpu_s", "memory_mb", "max_file_mb", "max_procs", "disk_mb",
                              "max_output_kb", "cpus")},
    }


def limits_report(backend: str | None) -> dict[str, str]:
    """Which limits hold on this host with ``backend``: ``{limit: "enforced: how" | "NOT enforced: why"}``.

    Keys: ``memory_per_run``, ``procs_per_run``, ``cpu_per_run`` (one cgroup for the whole run),
    ``tmpfs_size``, ``tmpfs_inodes`` (``/tmp``, ``/dev/shm``, the private work dir), ``dev_cap``,
    ``wall_clock``, ``cpu_seconds``, ``address_space``, ``file_size``, ``output``, ``workdir_disk``; with bwrap also
    ``write_paths`` (Landlock); with
    Docker also ``seccomp`` and ``proc_masking`` (:func:`evotrainer.sandbox.docker.daemon_limits`).
    """
    per_process = {"wall_clock": "enforced: the supervisor kills the whole tree at timeout_s",
                   "cpu_seconds": "enforced: RLIMIT_CPU per process (cpu_s)",
                   "address_space": "enforced: RLIMIT_AS per process (memory_mb)" if backend != "docker" else
                   "NOT enforced: Docker sets no RLIMIT_AS; the container's memory cgroup bounds the run",
                   "file_size": "enforced: RLIMIT_FSIZE per process (max_file_mb)",
                   "output": "enforced: stdout/stderr capped at max_output_kb each",
                   "workdir_disk": "NOT enforced: a caller's workdir is bound from the host disk: max_file_mb caps "
                                   "each file, nothing caps the total (the private tmpfs work dir is capped)"}
    if backend == "docker":  # asked of the daemon (cgroup support), plus this backend's own mounts and filter
        return daemon_limits(_docker_client())[1] | per_process
    if backend != "bwrap":
        na = f"NOT enforced: backend {backend or 'none'} has no isolation"
        return {k: na for k in ("memory_per_run", "procs_per_run", "cpu_per_run", "tmpfs_size", "tmpfs_inodes",
                                "dev_cap")} | per_process
    plan = lim.cgroup_plan()
    files = {"memory": {"v1": "memory.limit_in_bytes + memory.memsw.limit_in_bytes", "v2": "memory.max"},
             "pids": {"v1": "pids.max", "v2": "pids.max"}, "cpu": {"v1": "cpu.cfs_quota_us", "v2": "cpu.max"}}
    out = {}
    for ctrl, key in (("memory", "memory_per_run"), ("pids", "procs_per_run"), ("cpu", "cpu_per_run")):
        where = plan[ctrl]
        if isinstance(where, str):
            out[key] = (f"NOT enforced: {where}; " + {
                "memory": "memory_mb bounds each process (RLIMIT_AS), not the run",
                "pids": "RLIMIT_NPROC in the user namespace counts the run's processes instead",
                "cpu": "cpu_s bounds each process's CPU seconds, not the run's share"}[ctrl])
        else:
            out[key] = f"enforced: cgroup {where[1]} {files[ctrl][where[1]]} under {where[0]}"
    out["tmpfs_size"] = "enforced: size= disk_mb on /tmp, /dev/shm and the private work dir"
    if lim.host_tmpfs_available():
        out["tmpfs_inodes"] = (f"enforced: nr_inodes= one per {lim.INODE_RATIO} bytes of size cap (mke2fs inode_ratio), "
                               "tmpfs mounted by the host in a private mount namespace")
        dev = f"enforced: /dev is a {lim.DEV_SIZE >> 10} KiB / {lim.DEV_INODES}-inode tmpfs, remounted read-only"
    else:
        out["tmpfs_inodes"] = ("NOT enforced: bubblewrap has no inode option and mounting a capped tmpfs needs root "
                               "and unshare(1); each tmpfs allows the kernel default (half of RAM in pages)")
        dev = f"enforced: /dev is a {lim.DEV_SIZE >> 10} KiB tmpfs (no inode cap), remounted read-only"
    out["dev_cap"] = dev
    abi = landlock_abi()
    out["write_paths"] = (f"enforced: Landlock ABI {abi}: files are created, removed or opened for writing only under "
                          f"{', '.join(WRITABLE)} (a FIFO in an input cannot be written)" if abi else
                          "NOT enforced: this kernel has no Landlock (5.13+); read-only binds stop writes to files, "
                          "not to a FIFO a host process makes in an input folder while the run lasts")
    return out | per_process


def _seccomp_summary(backend: str | None) -> str | None:
    if backend == "docker":
        return ("docker default profile + " if seccomp_filter() else "docker default profile") + (
            f"{len(BLOCKED_SYSCALLS)} syscalls refused by a stacked filter" if seccomp_filter() else "")
    if backend == "bwrap":
        return f"{len(BLOCKED_SYSCALLS)} syscalls refused (keyrings, bpf, perf, io_uring, ...)" if seccomp_filter() else None
    return None


# --- the one API -------------------------------------------------------------------------------
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


# The largest value of any limit (in its own unit): review 7's timeout_s=inf ended `sandbox run` with a bare
# OverflowError, and timeout_s=1e308 or memory_mb=99999999999999 made the launcher's setrlimit overflow inside the
# sandbox (exit 1, "OverflowError" in stderr, reported as the program's own failure). 2**40 MiB << 20 fits an rlimit.
LIMIT_MAX = 1 << 40
# The kernel refuses an execve whose environment holds a "NAME=value" string this long (MAX_ARG_STRLEN, 32 pages):
# review 7's 200,000-byte env value came back as the program's own exit 1 with bwrap's "Argument list too long".
ENV_ENTRY_MAX = 32 * 4096


def run_in_sandbox(
    cmd: list[str] | None = None,
    *,
    code: str | None = None,
    inputs: dict[str, Path] | None = None,
    workdir: Path | None = None,
    timeout_s: float = 30,
    cpu_s: float | None = None,
    memory_mb: int = 1024,
    max_file_mb: int = 64,
    max_procs: int = 64,
    disk_mb: int = 256,
    max_output_kb: int = 1024,
    cpus: float = 1.0,
    env: dict[str, str] | None = None,
    image: str = "analyzer",
    unsafe_local: bool = False,
) -> SandboxResult:
    """Run untrusted ``cmd`` (default ``["python", "{code}"]``) in the sandbox; see the module doc.

    Args: ``code`` Python source placed at ``/sandbox/main.py``; ``inputs`` name -> host file or
    folder, mounted read-only at ``/evidence/<name>``; ``workdir`` a host folder bound read-write
    at ``/sandbox/work`` (default: a private tmpfs of ``disk_mb`` MiB, discarded); ``timeout_s``
    wall-clock seconds; ``cpu_s`` CPU seconds per process (default: the wall limit);
    ``memory_mb`` memory of the whole run (its cgroup, where the host allows one) and address space
    per process; ``max_file_mb`` largest file written; ``max_procs`` processes (and threads) in the
    sandbox; ``disk_mb`` size of each tmpfs (``/tmp``, ``/dev/shm``, the private work dir; inode cap
    one per 16 KiB where the host can mount it); ``max_output_kb`` per stream, beyond which the run
    is killed; ``cpus`` CPU cores the whole run may use (cgroup CPU quota, Docker ``nano_cpus``);
    ``sandbox_info()["limits"]`` says which of these hold on this host; ``env`` extra variables (the rest of the environment is cleared); ``image`` the Docker
    image (analyzer | code-runner | swe-runner; ignored by bwrap).

    A caller's ``workdir`` is cleaned after the run: setuid/setgid/world-write bits cleared below it,
    its own mode reset to the one it had before (see :func:`strip_setid_bits`); a work dir that
    cannot be cleaned raises :class:`SandboxError` (the result is withheld). Keep it unreadable to
    other host users while the run lasts, and read it back only through
    :mod:`evotrainer.sandbox.fs` (the sandbox may have planted links, FIFOs, deep trees in it).

    Raises :class:`SandboxError` on bad arguments (the message names the field) and
    :class:`SandboxUnavailable` when no isolating backend exists and ``unsafe_local`` is False.
    """
    if cmd is None and code is None:
        raise SandboxError("run_in_sandbox: give cmd (argv list) or code (Python source), or both")
    if cmd is not None and (not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd)):
        raise SandboxError(f"cmd={cmd!r}: must be a non-empty list of strings (argv)")
    for field, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb), ("max_file_mb", max_file_mb),
                         ("max_procs", max_procs), ("disk_mb", disk_mb), ("max_output_kb", max_output_kb),
                         ("cpus", cpus)):
        if not 0 < value <= LIMIT_MAX:
            raise SandboxError(f"{field}={value!r}: must be > 0 and at most {LIMIT_MAX:,}")
    if cpu_s is not None and not 0 < cpu_s <= LIMIT_MAX:
        raise SandboxError(f"cpu_s={cpu_s!r}: must be > 0 and at most {LIMIT_MAX:,}, or None")
    inputs = {k: Path(v) for k, v in (inputs or {}).items()}
    for name, src in inputs.items():
        if not _NAME_RE.match(name):
            raise SandboxError(f"inputs name {name!r}: use letters, digits, '.', '_', '-' (it becomes "
                               f"{EVIDENCE_DIR}/<name>)")
        if not src.exists():
            raise SandboxError(f"inputs[{name!r}]={src}: no such file or folder")
    if workdir is not None and not Path(workdir).is_dir():
        raise SandboxError(f"workdir={workdir}: not a folder; create it first or pass None for a private tmpfs")
    for what, src in [*((f"inputs[{k!r}]", v) for k, v in inputs.items()),
                      *([("workdir", Path(workdir))] if workdir is not None else [])]:
        _refuse_special_files(what, src.resolve())  # (what the backends bind: the link's target)
    env_extra = dict(env or {})
    for k, v in env_extra.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k or not isinstance(v, str) or "\0" in v:
            raise SandboxError(f"env[{k!r}]: names must be non-empty strings without '=' or NUL, values strings "
                               "without NUL")
        if len(k.encode()) + len(v.encode()) + 1 >= ENV_ENTRY_MAX:  # review 7: exit 1, "Argument list too long"
            raise SandboxError(f"env[{k!r}]: {len(v.encode()):,} bytes; one variable is at most "
                               f"{ENV_ENTRY_MAX - 2 - len(k.encode()):,} bytes (the kernel's limit per string, "
                               "MAX_ARG_STRLEN): pass large data as an input file instead")
    if image not in ("analyzer", "code-runner", "swe-runner"):
        raise SandboxError(f"image={image!r}: use analyzer, code-runner or swe-runner")

    backend = _choose_backend(unsafe_local)
    if workdir is not None and backend == "bwrap":
        _refuse_shared_hard_links(Path(workdir))
    cmd = list(cmd) if cmd is not None else ["python", "{code}"]
    limits = RunLimits(timeout_s=float(timeout_s), cpu_s=int(cpu_s or max(1, int(timeout_s) + 1)),
                     memory_mb=int(memory_mb), max_file_mb=int(max_file_mb), max_procs=int(max_procs),
                     disk_mb=int(disk_mb), max_output=int(max_output_kb) * 1024, cpus=float(cpus))
    root_mode = stat.S_IMODE(os.stat(workdir).st_mode) if workdir is not None else None
    try:
        return _dispatch(backend, cmd, code, inputs, workdir, limits, env_extra, image)
    finally:  # fails closed: a work dir that cannot be cleaned raises instead of returning the result
        if workdir is not None:
            strip_setid_bits(Path(workdir), root_mode)


SPECIAL_WALK_MAX = 200_000
"""Entries of one input or work dir that :func:`_refuse_special_files` looks at; a larger folder is refused."""


def _refuse_special_files(what: str, src: Path) -> None:
    """Refuse an input or work dir that is, or holds, a socket, a FIFO or a device (walked without following links).

    Review 14 (S-R14): a read-only bind stops writes to files, not ``connect()`` to a unix socket on it nor ``write()``
    into a FIFO: through an ``--input`` folder holding a host service's socket the sandboxed program drove that
    service (``docker.sock`` would be root on the host), and it wrote 27 bytes into a FIFO a host process read.

    Raises:
        SandboxError: names the path, what it is, and the fix; also for a folder of more than
            :data:`SPECIAL_WALK_MAX` entries.
    """
    kinds = {stat.S_IFSOCK: "a unix socket", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
             stat.S_IFBLK: "a block device"}
    fix = "pass a folder of plain files and folders (copy the files the program needs into one)"
    todo, seen = [src], 0
    while todo:
        path = todo.pop()
        try:
            st = os.lstat(path)
        except OSError:
            continue
        kind = kinds.get(stat.S_IFMT(st.st_mode))
        if kind:
            raise SandboxError(f"{what}={src}: {path} is {kind}, which a sandboxed program could use to reach a host "
                               f"process through the read-only bind; {fix}")
        if not stat.S_ISDIR(st.st_mode):
            continue
        try:
            with os.scandir(path) as it:
                for entry in it:
                    seen += 1
                    if seen > SPECIAL_WALK_MAX:
                        raise SandboxError(f"{what}={src}: more than {SPECIAL_WALK_MAX:,} entries to check for "
                                           f"sockets, FIFOs and devices; {fix}, a smaller one")
                    if entry.is_dir(follow_symlinks=False) or not entry.is_file(follow_symlinks=False):
                        todo.append(Path(entry.path))
        except OSError:
            continue


def _refuse_shared_hard_links(workdir: Path) -> None:
    """Refuse a bwrap run on a work dir holding a file hard-linked to a name outside it that the run could write.

    bwrap maps the sandbox uid and gid to the caller's (host root's 0 when run as root): the program owns
    the caller's files, so through a hard link it could write, or chmod and then write, a file outside the
    work dir. Docker lends the tree to another uid and keeps such files out of the loan
    (:func:`evotrainer.sandbox.fs.lend_tree`); bwrap cannot, so the run does not start. A shared file of
    another owner that is neither group-writable for the caller's group nor world-writable is read-only to
    the run and allowed.
    """
    uid, gid = os.geteuid(), os.getegid()
    try:
        shared = [rel for rel, st in shared_hard_links(workdir)
                  if st.st_uid == uid or (st.st_gid == gid and st.st_mode & stat.S_IWGRP) or st.st_mode & stat.S_IWOTH]
    except OSError as e:
        raise SandboxError(f"workdir={workdir}: cannot check it for hard links before the run ({e})") from e
    if shared:
        names = ", ".join(repr(rel[:200]) for rel in shared[:3]) + (f" and {len(shared) - 3} more" if len(shared) > 3
                                                                     else "")
        raise SandboxError(f"workdir={workdir}: {names} {'is a hard link' if len(shared) == 1 else 'are hard links'} "
                           "to a file outside the work dir that the bwrap sandbox could write (it runs as the "
                           "file's owner). Replace each with a copy (cp --remove-destination SRC DEST, or copy the "
                           "tree without -l), or pass workdir=None for a private tmpfs")


def _dispatch(backend: str, cmd: list[str], code: str | None, inputs: dict[str, Path], workdir: Path | None,
              limits: RunLimits, env_extra: dict[str, str], image: str) -> SandboxResult:
    lim.sweep_stale()  # what runs killed with SIGKILL left (temp folders, cgroups), keyed by owner pid + start time
    with lim.run_tmpdir() as tmp:
        code_file = None
        if code is not None:
            code_file = Path(tmp) / "main.py"
            code_file.write_text(code)
            code_file.chmod(0o644)
        if backend == "docker":
            argv = [CODE_PATH if a == "{code}" else a for a in cmd]
            return run_docker(_docker_client(), image, argv, inputs=inputs, workdir=workdir, code_file=code_file,
                              limits=limits, env={**BASE_ENV, "HOME": WORK_DIR, "EVOTRAINER_EVIDENCE": EVIDENCE_DIR,
                                                  "EVOTRAINER_SANDBOX_BACKEND": "docker", **env_extra})
        if backend == "bwrap":
            argv = [sys.executable if a in ("python", "python3") and i == 0 else a for i, a in enumerate(cmd)]
            argv = [CODE_PATH if a == "{code}" else a for a in argv]
            bwrap, reason = _bwrap_status()
            if bwrap is None:  # _choose_backend picks bwrap only when it works
                raise SandboxUnavailable(f"bwrap: {reason}")
            return run_bwrap(bwrap, argv, inputs=inputs, workdir=workdir, code_file=code_file, limits=limits,
                             env_extra=env_extra, tmp=Path(tmp))
        return run_unsafe_local(cmd, inputs=inputs, workdir=workdir, code_file=code_file, limits=limits,
                                env_extra=env_extra, tmp=Path(tmp))


def strip_setid_bits(root: Path, root_mode: int | None = None) -> int:
    """Clear setuid/setgid/world-write bits under ``root`` (links never followed); returns the count.

    A sandbox run as host root writes files owned by host uid 0 into a caller's work dir, and an owner
    may ``chmod u+s`` without any capability: left alone, a setuid-root shell would land on the host.
    Iterative and fd-based (any depth, any path length); raises :class:`SandboxError` when an entry
    cannot be fixed. See :func:`evotrainer.sandbox.fs.clean_work_dir`.
    """
    return clean_work_dir(root, root_mode)
