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
  count, captured output,

and returns a :class:`SandboxResult` saying how it ended and which limit, if any, stopped it.

Backends, picked automatically (override with ``EVOTRAINER_SANDBOX=docker|bwrap|unsafe-local``):

* ``docker``: where a daemon answers (python ``docker`` SDK), images built from ``sandbox_images/``;
  ``network_mode=none``, read-only root, all capabilities dropped, no-new-privileges, uid 65534,
  memory / pids cgroup limits, cpu / fsize ulimits.
* ``bwrap`` (bubblewrap): every namespace unshared (user, pid, net, ipc, uts, cgroup, mount),
  nested user namespaces disabled, all capabilities dropped, uid/gid 65534, new session, root
  remounted read-only. Process count: the kernel ignores ``RLIMIT_NPROC`` for processes whose real
  uid is host root (bwrap as root maps sandbox uid 65534 to host uid 0), so as root the sandbox
  runs in its own pids cgroup (v1 or v2); as a normal user ``RLIMIT_NPROC`` is set inside the new
  user namespace, where the kernel counts it per namespace (checked: a fork loop stops at the
  limit). Other rlimits (CPU, AS, FSIZE, CORE=0) are set by a tiny launcher inside the sandbox.
* ``unsafe-local``: a plain subprocess with rlimits and a cleared environment; *no* isolation of
  the file system or network. Only with ``unsafe_local=True`` or ``EVOTRAINER_SANDBOX=unsafe-local``.

In ``cmd``, ``"python"`` means the sandbox's Python (this venv under bwrap, the image's under
Docker) and ``"{code}"`` is replaced by the path of ``code``.
"""

from __future__ import annotations

import functools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

import evotrainer.sandbox_images as _images_pkg

SANDBOX_ENV = "EVOTRAINER_SANDBOX"  # auto | docker | bwrap | unsafe-local
EVIDENCE_DIR = "/evidence"
WORK_DIR = "/sandbox/work"
CODE_PATH = "/sandbox/main.py"
SANDBOX_UID = 65534  # "nobody"
IMAGES_DIR = Path(_images_pkg.__file__).resolve().parent  # sandbox_images/ (installed as evotrainer.sandbox_images)
IMAGE_PREFIX = "evotrainer-sandbox-"

LimitHit = Literal["timeout", "cpu", "memory", "file_size", "procs", "output"]


class SandboxError(RuntimeError):
    """Bad sandbox input or a sandbox that could not start."""


class SandboxUnavailable(SandboxError):
    """No isolating backend on this machine (and unsafe local mode was not asked for)."""


class SandboxResult(BaseModel):
    """How one sandboxed run ended.

    ``exit_code``: the program's exit status; 128+N when it died of signal N inside the sandbox;
    -9 when the sandbox killed it at a limit (wall clock or output). ``limit_hit``: the limit that
    stopped (or, for ``procs``, refused a fork of) the run; ``memory`` and ``file_size`` are read
    from the program's error (MemoryError / ENOMEM, EFBIG / ENOSPC / SIGXFSZ) since an rlimit makes
    the failing call return an error rather than kill. Units: seconds, MiB.
    """

    exit_code: int
    stdout: str
    stderr: str
    limit_hit: LimitHit | None = None
    backend: str
    wall_s: float
    cpu_s: float | None = Field(None, description="user+system CPU seconds of the whole tree (None: not measured)")
    max_rss_mb: float | None = Field(None, description="largest resident set of one process, MiB")
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the program exited 0 and no limit stopped it."""
        return self.exit_code == 0 and self.limit_hit is None


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
    """A pids cgroup folder we may create children in, and its kind ("v1" | "v2"); None if none."""
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists() and os.access(v1, os.W_OK):
        return v1, "v1"
    v2 = Path("/sys/fs/cgroup")
    try:
        if "pids" in (v2 / "cgroup.controllers").read_text().split() and os.access(v2, os.W_OK):
            return v2, "v2"
    except OSError:
        pass
    return None


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
             f"pids cgroup {cg[1]}" if os.geteuid() == 0 and cg else "RLIMIT_NPROC in a user namespace")
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
        "python": sys.executable,
        "mounts": {"work": WORK_DIR, "code": CODE_PATH, "inputs": f"{EVIDENCE_DIR}/<name> (read-only)"},
        "defaults": {"timeout_s": 30, "cpu_s": None, "memory_mb": 1024, "max_file_mb": 64, "max_procs": 64,
                     "disk_mb": 256, "max_output_kb": 1024},
    }


# --- the one API -------------------------------------------------------------------------------
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_BASE_ENV = {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
             "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TMPDIR": "/tmp"}
# Runs inside the sandbox (after the user namespace exists): forks; the child sets the rlimits
# and execs the command; the parent, made non-dumpable so the program cannot reach its fds, waits
# and writes "cpu_seconds max_rss_kb" of the program's tree to the report fd, then exits with the
# program's status (128+N for signal N).
_LAUNCHER = r"""
import os,resource as r,sys
a=sys.argv;fd=int(a[6])
try:
 import ctypes;ctypes.CDLL(None).prctl(4,0)
except Exception:pass
pid=os.fork()
if pid==0:
 os.close(fd)
 for n,v in zip(('RLIMIT_CPU','RLIMIT_AS','RLIMIT_FSIZE','RLIMIT_NPROC','RLIMIT_CORE'),a[1:6]):
  v=int(v)
  if v>=0:r.setrlimit(getattr(r,n),(v,v+1 if n=='RLIMIT_CPU' else v))
 try:os.execvp(a[7],a[7:])
 except OSError as e:sys.stderr.write(f'sandbox: cannot run {a[7]!r}: {e}\n');os._exit(127)
_,st,ru=os.wait4(pid,0)
try:os.write(fd,f'{ru.ru_utime+ru.ru_stime} {ru.ru_maxrss}'.encode())
except OSError:pass
c=os.waitstatus_to_exitcode(st)
os._exit(c if c>=0 else 128-c)
"""


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
    env: dict[str, str] | None = None,
    image: str = "analyzer",
    unsafe_local: bool = False,
) -> SandboxResult:
    """Run untrusted ``cmd`` (default ``["python", "{code}"]``) in the sandbox; see the module doc.

    Args: ``code`` Python source placed at ``/sandbox/main.py``; ``inputs`` name -> host file or
    folder, mounted read-only at ``/evidence/<name>``; ``workdir`` a host folder bound read-write
    at ``/sandbox/work`` (default: a private tmpfs of ``disk_mb`` MiB, discarded); ``timeout_s``
    wall-clock seconds; ``cpu_s`` CPU seconds per process (default: the wall limit);
    ``memory_mb`` address space per process; ``max_file_mb`` largest file written; ``max_procs``
    processes (and threads) in the sandbox; ``max_output_kb`` per stream, beyond which the run is
    killed; ``env`` extra variables (the rest of the environment is cleared); ``image`` the Docker
    image (analyzer | code-runner | swe-runner; ignored by bwrap).

    Raises :class:`SandboxError` on bad arguments (the message names the field) and
    :class:`SandboxUnavailable` when no isolating backend exists and ``unsafe_local`` is False.
    """
    if cmd is None and code is None:
        raise SandboxError("run_in_sandbox: give cmd (argv list) or code (Python source), or both")
    if cmd is not None and (not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd)):
        raise SandboxError(f"cmd={cmd!r}: must be a non-empty list of strings (argv)")
    for field, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb), ("max_file_mb", max_file_mb),
                         ("max_procs", max_procs), ("disk_mb", disk_mb), ("max_output_kb", max_output_kb)):
        if not value > 0:
            raise SandboxError(f"{field}={value!r}: must be > 0")
    if cpu_s is not None and not cpu_s > 0:
        raise SandboxError(f"cpu_s={cpu_s!r}: must be > 0 or None")
    inputs = {k: Path(v) for k, v in (inputs or {}).items()}
    for name, src in inputs.items():
        if not _NAME_RE.match(name):
            raise SandboxError(f"inputs name {name!r}: use letters, digits, '.', '_', '-' (it becomes "
                               f"{EVIDENCE_DIR}/<name>)")
        if not src.exists():
            raise SandboxError(f"inputs[{name!r}]={src}: no such file or folder")
    if workdir is not None and not Path(workdir).is_dir():
        raise SandboxError(f"workdir={workdir}: not a folder; create it first or pass None for a private tmpfs")
    env_extra = dict(env or {})
    for k, v in env_extra.items():
        if not isinstance(k, str) or not k or "=" in k or not isinstance(v, str):
            raise SandboxError(f"env[{k!r}]: names must be non-empty strings without '=', values strings")
    if image not in ("analyzer", "code-runner", "swe-runner"):
        raise SandboxError(f"image={image!r}: use analyzer, code-runner or swe-runner")

    backend = _choose_backend(unsafe_local)
    cmd = list(cmd) if cmd is not None else ["python", "{code}"]
    limits = _Limits(timeout_s=float(timeout_s), cpu_s=int(cpu_s or max(1, int(timeout_s) + 1)),
                     memory_mb=int(memory_mb), max_file_mb=int(max_file_mb), max_procs=int(max_procs),
                     disk_mb=int(disk_mb), max_output=int(max_output_kb) * 1024)
    with tempfile.TemporaryDirectory(prefix="evotrainer-sandbox-") as tmp:
        code_file = None
        if code is not None:
            code_file = Path(tmp) / "main.py"
            code_file.write_text(code)
            code_file.chmod(0o644)
        if backend == "docker":
            from evotrainer.sandbox_docker import run_docker

            argv = [CODE_PATH if a == "{code}" else a for a in cmd]
            return run_docker(_docker_client(), image, argv, inputs=inputs, workdir=workdir, code_file=code_file,
                              limits=limits, env={**_BASE_ENV, "HOME": WORK_DIR, "EVOTRAINER_EVIDENCE": EVIDENCE_DIR,
                                                  "EVOTRAINER_SANDBOX_BACKEND": "docker", **env_extra})
        if backend == "bwrap":
            argv = [sys.executable if a in ("python", "python3") and i == 0 else a for i, a in enumerate(cmd)]
            argv = [CODE_PATH if a == "{code}" else a for a in argv]
            return _run_bwrap(argv, inputs=inputs, workdir=workdir, code_file=code_file, limits=limits,
                              env_extra=env_extra, tmp=Path(tmp))
        return _run_unsafe_local(cmd, inputs=inputs, workdir=workdir, code_file=code_file, limits=limits,
                                 env_extra=env_extra, tmp=Path(tmp))


class _Limits(BaseModel):
    timeout_s: float
    cpu_s: int
    memory_mb: int
    max_file_mb: int
    max_procs: int
    disk_mb: int
    max_output: int  # bytes per stream


# --- bubblewrap --------------------------------------------------------------------------------
def _bwrap_argv(argv: list[str], *, inputs: dict[str, Path], workdir: Path | None, code_file: Path | None,
                limits: _Limits, env: dict[str, str]) -> list[str]:
    a = [_bwrap_status()[0], "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
         "--new-session", "--cap-drop", "ALL", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
         "--hostname", "sandbox", "--clearenv", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        p = Path(top)
        if p.is_symlink():
            a += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            a += ["--ro-bind", top, top]
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime"):
        a += ["--ro-bind-try", etc, etc]
    for prefix in sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
                         | {sys.prefix}):
        if not prefix.startswith("/usr/") and prefix != "/usr":
            a += ["--ro-bind", prefix, prefix]
    a += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp"]
    if workdir is not None:
        a += ["--bind", str(Path(workdir).resolve()), WORK_DIR]
    else:
        a += ["--size", str(limits.disk_mb << 20), "--tmpfs", WORK_DIR]
    for name, src in sorted(inputs.items()):
        a += ["--ro-bind", str(src.resolve()), f"{EVIDENCE_DIR}/{name}"]
    if code_file is not None:
        a += ["--ro-bind", str(code_file), CODE_PATH]
    for k, v in env.items():
        a += ["--setenv", k, v]
    a += ["--chdir", WORK_DIR, "--remount-ro", "/", "--"]
    nproc = -1 if os.geteuid() == 0 else limits.max_procs  # as root the pids cgroup does it
    rl = [limits.cpu_s, limits.memory_mb << 20, limits.max_file_mb << 20, nproc, 0]
    return a + [sys.executable, "-I", "-S", "-c", _LAUNCHER, *map(str, rl), "{report_fd}", *argv]


def _run_bwrap(argv: list[str], *, inputs, workdir, code_file, limits: _Limits, env_extra, tmp: Path) -> SandboxResult:
    path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    env = {**_BASE_ENV, "HOME": WORK_DIR, "PATH": path, "EVOTRAINER_EVIDENCE": EVIDENCE_DIR,
           "EVOTRAINER_SANDBOX_BACKEND": "bwrap", **env_extra}
    full = _bwrap_argv(argv, inputs=inputs, workdir=workdir, code_file=code_file, limits=limits, env=env)
    cgroup = _make_pids_cgroup(limits.max_procs) if os.geteuid() == 0 else None
    if cgroup is not None:  # enter the cgroup before bwrap forks anything, then become bwrap
        full = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *full]
    try:
        result = _supervise(full, limits, backend="bwrap", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                            cwd=tmp)
        if cgroup is not None and _cgroup_forks_refused(cgroup) and result.limit_hit in (None, "timeout"):
            result.limit_hit = "procs"
        return result
    finally:
        if cgroup is not None:
            _remove_cgroup(cgroup)


def _make_pids_cgroup(max_procs: int) -> Path:
    root, kind = _pids_cgroup_root()
    parent = root / "evotrainer-sandbox"
    if not parent.exists():
        parent.mkdir(exist_ok=True)
        if kind == "v2":
            (root / "cgroup.subtree_control").write_text("+pids")
            (parent / "cgroup.subtree_control").write_text("+pids")
    cg = parent / uuid.uuid4().hex[:12]
    cg.mkdir()
    (cg / "pids.max").write_text(str(max_procs + 2))  # + the sh/bwrap supervisor and bwrap's init
    return cg


def _cgroup_forks_refused(cg: Path) -> bool:
    try:
        for line in (cg / "pids.events").read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "max" and int(v) > 0:
                return True
    except OSError:
        pass
    return False


def _remove_cgroup(cg: Path) -> None:
    """Kill whatever is left in the cgroup (nothing, normally: the pid namespace died) and remove it."""
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
    try:
        cg.rmdir()
    except OSError:
        pass


# --- supervision: wall clock, output caps, resource use ------------------------------------------
def _supervise(argv: list[str], limits: _Limits, *, backend: str, env: dict[str, str], cwd: Path) -> SandboxResult:
    """Start ``argv`` in its own process group, enforce the wall clock and output caps, reap it."""
    report_r, report_w = os.pipe()  # the launcher reports the program's CPU time and peak RSS here
    argv = [str(report_w) if a == "{report_fd}" else a for a in argv]
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=cwd, start_new_session=True, close_fds=True, bufsize=0,
                                pass_fds=(report_w,))
    finally:
        os.close(report_w)
    over = threading.Event()
    bufs: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    truncated = {"stdout": False, "stderr": False}

    def pump(name: str, stream) -> None:
        buf = bufs[name]
        while chunk := stream.read(65536):
            room = limits.max_output - len(buf)
            buf += chunk[:max(room, 0)]
            if len(chunk) > room:
                truncated[name] = True
                over.set()
        stream.close()

    threads = [threading.Thread(target=pump, args=(n, s), daemon=True)
               for n, s in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for t in threads:
        t.start()
    pidfd = os.pidfd_open(proc.pid)
    killed_for: LimitHit | None = None
    try:
        while True:
            left = limits.timeout_s - (time.monotonic() - t0)
            if select.select([pidfd], [], [], max(0.0, min(left, 0.05)))[0]:
                break
            if over.is_set():
                killed_for = "output"
            elif time.monotonic() - t0 >= limits.timeout_s:
                killed_for = "timeout"
            if killed_for:
                _killpg(proc.pid)
                break
        _, status, ru = os.wait4(proc.pid, 0)
    finally:
        os.close(pidfd)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join(timeout=5)
    wall = time.monotonic() - t0
    stdout = bufs["stdout"].decode(errors="replace")
    stderr = bufs["stderr"].decode(errors="replace")
    cpu, rss_kb = _read_report(report_r, ru)
    limit = killed_for or _infer_limit(proc.returncode, stderr, cpu, limits)
    return SandboxResult(exit_code=proc.returncode, stdout=stdout, stderr=stderr, limit_hit=limit,
                         backend=backend, wall_s=round(wall, 4), cpu_s=round(cpu, 4),
                         max_rss_mb=round(rss_kb / 1024, 2), stdout_truncated=truncated["stdout"],
                         stderr_truncated=truncated["stderr"])


def _read_report(fd: int, ru) -> tuple[float, float]:
    """(CPU seconds, peak RSS KiB) from the launcher's report; the supervisor's rusage if none came."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 256).decode(errors="replace").split()
        return float(data[0]), float(data[1])
    except (OSError, ValueError, IndexError):
        return ru.ru_utime + ru.ru_stime, float(ru.ru_maxrss)
    finally:
        os.close(fd)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_FILE_MARKERS = ("File too large", "No space left on device", "Errno 27", "Errno 28")


def _infer_limit(exit_code: int, stderr: str, cpu: float, limits: _Limits) -> LimitHit | None:
    if exit_code == 0:
        return None
    if exit_code in (128 + signal.SIGXCPU, -signal.SIGXCPU) or (exit_code in (137, -9) and cpu >= limits.cpu_s):
        return "cpu"
    if exit_code in (128 + signal.SIGXFSZ, -signal.SIGXFSZ):
        return "file_size"
    tail = stderr[-4000:]
    if any(m in tail for m in _MEMORY_MARKERS):
        return "memory"
    if any(m in tail for m in _FILE_MARKERS):
        return "file_size"
    if "Resource temporarily unavailable" in tail or "BlockingIOError" in tail:
        return "procs"
    return None


# --- unsafe local (explicit opt-in only) ----------------------------------------------------------
def _run_unsafe_local(cmd: list[str], *, inputs, workdir, code_file, limits: _Limits, env_extra,
                      tmp: Path) -> SandboxResult:
    """No isolation: a subprocess with rlimits (no NPROC) and a cleared environment, in a temp dir."""
    evidence = tmp / "evidence"
    evidence.mkdir()
    for name, src in inputs.items():
        (evidence / name).symlink_to(src.resolve())
    work = Path(workdir).resolve() if workdir is not None else tmp / "work"
    work.mkdir(exist_ok=True)
    argv = [sys.executable if a in ("python", "python3") and i == 0 else a for i, a in enumerate(cmd)]
    argv = [str(code_file) if a == "{code}" else a for a in argv]
    env = {**_BASE_ENV, "HOME": str(work), "TMPDIR": str(work), "EVOTRAINER_EVIDENCE": str(evidence),
           "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "EVOTRAINER_SANDBOX_BACKEND": "unsafe-local", **env_extra}
    rl = [limits.cpu_s, limits.memory_mb << 20, limits.max_file_mb << 20, -1, 0]
    full = [sys.executable, "-I", "-S", "-c", _LAUNCHER, *map(str, rl), "{report_fd}", *argv]
    return _supervise(full, limits, backend="unsafe-local", env=env, cwd=work)
