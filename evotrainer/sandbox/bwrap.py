"""The bubblewrap and unsafe-local backends of :mod:`evotrainer.sandbox` and the supervisor they share.

bwrap: every namespace unshared, nested user namespaces disabled, all capabilities dropped, uid/gid
65534, new session, a read-only root with the system, this Python and the inputs bound read-only,
size-capped tmpfs for ``/tmp``, ``/dev/shm`` and the work dir, a hand-made ``/dev`` (the usual nodes
on a 1 MiB tmpfs, remounted read-only: bwrap's ``--dev`` tmpfs takes no size). Where the host allows
it the run sits in its own cgroup (memory, pids, cpu; the kernel ignores ``RLIMIT_NPROC`` for host
uid 0) and, as root, its tmpfs carry inode caps (:mod:`evotrainer.sandbox.limits`); otherwise
``RLIMIT_NPROC`` is set inside the new user namespace, where it is counted per namespace. A launcher inside the sandbox sets
the other rlimits and reports the program's CPU time and peak RSS on a private pipe.

The supervisor (:func:`supervise`) starts the sandbox in its own process group, caps stdout and
stderr, enforces the wall clock by killing the group (bwrap's ``--die-with-parent`` and the pid
namespace take the whole tree down) and reaps it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import evotrainer.sandbox.limits as _lim
from evotrainer.sandbox.base import (
    BASE_ENV,
    CODE_PATH,
    EVIDENCE_DIR,
    SANDBOX_UID,
    WORK_DIR,
    LimitHit,
    RunLimits,
    SandboxError,
    SandboxResult,
    infer_limit,
)

# Runs inside the sandbox (after the user namespace exists): forks; the child sets the rlimits
# and execs the command; the parent, made non-dumpable so the program cannot reach its fds, waits
# and writes "cpu_seconds max_rss_kb" of the program's tree to the report fd, then exits with the
# program's status (128+N for signal N). The parent ignores the catchable signals the program can send it:
# kill(-1, SIGTERM) reaches every process of the namespace but pid 1 and the caller, and the launcher's death
# tore the namespace down while the program was still running (its output cut, its CPU report lost; a
# flaky test_13 under load). The host ends a run with SIGKILL only.
# Before the exec the child restricts its writes with Landlock (kernel >= 5.13) to :data:`WRITABLE` (argv[8]; '-' for
# none: the unsafe-local backend): see :data:`WRITABLE` for why. Rights handled (<linux/landlock.h>): WRITE_FILE (2),
# REMOVE_DIR/FILE, MAKE_CHAR/DIR/REG/SOCK/FIFO/BLOCK/SYM (0x1ff0), REFER (0x2000, ABI 2), TRUNCATE (0x4000, ABI 3);
# under /dev only WRITE_FILE (/dev/null, /dev/zero). A kernel with Landlock that refuses a step ends the run (126)
# before the program starts; a kernel without it runs the program as before (``sandbox info`` says which).
_LAUNCHER = r"""
import os,resource as r,signal as g,sys
a=sys.argv;fd=int(a[7])
try:
 import ctypes;ctypes.CDLL(None).prctl(4,0)
except Exception:pass
S=(g.SIGTERM,g.SIGINT,g.SIGHUP,g.SIGQUIT,g.SIGUSR1,g.SIGUSR2)
for n in S:g.signal(n,g.SIG_IGN)
pid=os.fork()
if pid==0:
 for n in S:g.signal(n,g.SIG_DFL)
 os.close(fd)
 for n,v in zip(('RLIMIT_CPU','RLIMIT_AS','RLIMIT_FSIZE','RLIMIT_NPROC','RLIMIT_CORE','RLIMIT_SIGPENDING'),a[1:7]):
  v=int(v)
  if v>=0:r.setrlimit(getattr(r,n),(v,v+1 if n=='RLIMIT_CPU' else v))
 if a[8]!='-':
  import ctypes as C,struct
  L=C.CDLL(None,use_errno=True);sc=L.syscall;sc.restype=C.c_long
  v=sc(444,None,0,1)
  if v>=1:
   h=0x1ff2|(0x2000 if v>=2 else 0)|(0x4000 if v>=3 else 0)
   rs=sc(444,struct.pack('=Q',h),8,0);ok=rs>=0
   for q in a[8].split(','):
    m=h if q!='/dev' else 2
    try:d=os.open(q,os.O_PATH|os.O_CLOEXEC)
    except OSError:continue
    ok=ok and sc(445,rs,1,struct.pack('=Qi',m,d),0)==0;os.close(d)
   ok=ok and L.prctl(38,1,0,0,0)==0 and sc(446,rs,0)==0
   if not ok:sys.stderr.write(f'sandbox: cannot restrict writes (landlock): {os.strerror(C.get_errno())}\n');os._exit(126)
 try:os.execvp(a[9],a[9:])
 except OSError as e:sys.stderr.write(f'sandbox: cannot run {a[9]!r}: {e}\n');os._exit(127)
_,st,ru=os.wait4(pid,0)
try:os.write(fd,f'{ru.ru_utime+ru.ru_stime} {ru.ru_maxrss}'.encode())
except OSError:pass
c=os.waitstatus_to_exitcode(st)
os._exit(c if c>=0 else 128-c)
"""


# Where a sandboxed program may create, remove or open for writing, enforced by Landlock in the launcher. Review 15
# (S-R15): a read-only bind stops writes to regular files, not an open(O_WRONLY) of a FIFO (the kernel's EROFS check
# covers regular files, folders and links only): a FIFO that a host process made in a granted --input folder while
# the run lasted (after api._refuse_special_files had walked it) carried the program's bytes to the host reader. With
# Landlock any FIFO outside these trees (the inputs, the system binds) cannot be opened for writing (EACCES).
WRITABLE = (WORK_DIR, "/tmp", "/dev/shm", "/dev", "/proc")


def landlock_abi() -> int:
    """The Landlock ABI version of this kernel (``landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)``),
    0 where the kernel has none (before 5.13, or not in the ``lsm=`` list) or the call is refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return max(0, int(libc.syscall(444, None, 0, 1)))
    except (OSError, AttributeError):
        return 0


# Queued signals (sigqueue, POSIX timers) are counted per user up the user-namespace chain, like inotify below, and
# checked against RLIMIT_SIGPENDING (about 96,000 here) at each level: review 7's sandboxed program queued 96,360
# realtime signals to itself, and every sigqueue / timer_create of the caller's user on the host failed with EAGAIN
# while the run lasted. The launcher caps the run's queue at this many.
SIGPENDING_MAX = 1024


# --- seccomp: syscalls no sandboxed program needs ------------------------------------------------
# As host root, bwrap maps the sandbox uid to host uid 0: file-style ownership checks that ignore
# namespaces then see the owner. Kernel keyrings are one (root's keys are "user"-readable by
# kuid 0), so the key syscalls are refused, with the rest of Docker's default-profile blocklist that
# matters here (eBPF, perf, userfaultfd, io_uring, modules, kexec, swap, reboot, acct, quotas,
# file handles). The filter is a classic-BPF program assembled here (struct sock_filter).
# inotify too (review 7): an inotify instance is counted per user up the user-namespace chain, so the sandbox's
# count is also its host user's, capped at fs.inotify.max_user_instances (128) for that user in all: a sandboxed
# program holding 128 instances made every host process of the caller's user (root: systemd, `tail -f`, file
# watchers) fail inotify_init with EMFILE for as long as the run lasted; it also lets a program watch host file
# activity on the read-only binds (review 3, S-R14).
BLOCKED_SYSCALLS = (
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct",
    "swapon", "swapoff", "reboot", "quotactl", "fanotify_init", "name_to_handle_at", "open_by_handle_at",
    "inotify_init", "inotify_init1")
_SYSCALLS = {  # numbers from <asm/unistd_64.h> (x86_64) and <asm-generic/unistd.h> (aarch64: no inotify_init, so
    # inotify_init1's 26 stands for both)
    "x86_64": (0xC000003E, dict(zip(BLOCKED_SYSCALLS, (248, 249, 250, 321, 298, 323, 425, 426, 427, 246, 320, 175,
                                                       313, 176, 163, 167, 168, 169, 179, 300, 303, 304, 253, 294),
                                    strict=True))),
    "aarch64": (0xC00000B7, dict(zip(BLOCKED_SYSCALLS, (217, 218, 219, 280, 241, 282, 425, 426, 427, 104, 294, 105,
                                                        273, 106, 89, 224, 225, 142, 60, 262, 264, 265, 26, 26),
                                     strict=True))),
}
# socket(2) of these families is refused too. AF_VSOCK (40) has no network namespace: under bwrap's
# --unshare-net a sandboxed program could still listen on, or connect to, the host VM's vsock ports (review 3:
# its listener on CID_ANY:40123 made the host's own bind of that port fail with EADDRINUSE). Docker's default
# profile refuses the same family (its socket rule: args[0] != 40). AF_UNIX (1): a pathname socket is outside the
# network namespace too, and a read-only bind stops writes to files, not connect() to a socket on it: review 14
# (S-R14) connected through an --input folder to a host service's socket and read its reply (with docker.sock that is
# root on the host). Inputs and work dirs holding sockets are refused before the run (api._refuse_special_files);
# this closes the rest (a socket made in a caller's folder while the run lasts). socketpair(2) stays allowed (pipes
# of multiprocessing, asyncio's self-pipe).
BLOCKED_SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_VSOCK": 40}
_SOCKET_NR = {"x86_64": 41, "aarch64": 198}
_SOCKETPAIR_NR = {"x86_64": 53, "aarch64": 199}


def seccomp_filter() -> bytes | None:
    """The BPF program bwrap loads with ``--seccomp``: EPERM for :data:`BLOCKED_SYSCALLS`, for x32 calls and for
    ``socket()`` of :data:`BLOCKED_SOCKET_FAMILIES`, kill on a foreign architecture (e.g. i386 ``int 0x80``),
    allow the rest. None on architectures without a table here.

    ``seccomp_data`` (``<linux/seccomp.h>``): ``nr`` at offset 0, ``arch`` at 4, ``args[0]`` at 16 (its low 32 bits
    first: both tables are little-endian)."""
    arch = _SYSCALLS.get(platform.machine())
    if arch is None:
        return None
    audit_arch, numbers = arch
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, errno_eperm, kill = 0x7FFF0000, 0x00050000 | 1, 0x80000000
    nrs = sorted(set(numbers.values()))
    families = sorted(BLOCKED_SOCKET_FAMILIES.values())
    # (code, jump-if-true label, jump-if-false label, k); labels: "next", "allow", "eperm", "kill"
    prog: list[tuple[int, str, str, int]] = [(ld_abs, "", "", 4),                  # A = seccomp_data.arch
                                             (jeq, "next", "kill", audit_arch),
                                             (ld_abs, "", "", 0)]                  # A = seccomp_data.nr
    if audit_arch == 0xC000003E:
        prog.append((jge, "eperm", "next", 0x40000000))  # x32 ABI calls -> EPERM
    prog += [(jeq, "eperm", "next", nr) for nr in nrs]
    machine = platform.machine()
    prog += [(jeq, "pair", "next", _SOCKETPAIR_NR[machine]),
             (jeq, "next", "allow", _SOCKET_NR[machine]),
             (ld_abs, "", "", 16)]                                                # A = low half of args[0]
    prog += [(jeq, "eperm", "next", fam) for fam in families[:-1]] + [(jeq, "eperm", "allow", families[-1])]
    # socketpair(AF_UNIX, SOCK_DGRAM | flags): its datagram sockets may sendto() / re-connect() any pathname socket
    # (review 15, S-R15: a host datagram service received the sandbox's messages); stream pairs stay (multiprocessing,
    # asyncio's self-pipe: connected, so connect / sendto elsewhere is EISCONN)
    labels = {"pair": len(prog)}
    prog += [(ld_abs, "", "", 16), (jeq, "next", "allow", 1),                   # A = domain; AF_UNIX?
             (ld_abs, "", "", 24), (0x54, "", "", 0xF),                         # A = type & 0xF (flags off)
             (jeq, "allow", "eperm", 1)]                      # only SOCK_STREAM (review 16 S-R16: SOCK_RAW too)
    at = {**labels, "allow": len(prog), "eperm": len(prog) + 1, "kill": len(prog) + 2}
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        rel = [0 if lab in ("", "next") else at[lab] - i - 1 for lab in (jt, jf)]
        out.append(struct.pack("=HBBI", code, rel[0], rel[1], k))
    out += [struct.pack("=HBBI", ret, 0, 0, v) for v in (allow, errno_eperm, kill)]
    return b"".join(out)


# --- bubblewrap --------------------------------------------------------------------------------
def _tmpfs(dest: str, size: int, host: dict[str, Path] | None) -> list[str]:
    """bwrap arguments for a tmpfs at ``dest``: the host-mounted one (size + inode caps) or ``--size``."""
    if host is not None and dest in host:
        return ["--bind", str(host[dest]), dest]
    return ["--size", str(size), "--tmpfs", dest]


_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
# Docker's masked /proc files, and the root-only (0400) global files a host-root sandbox uid could read: physical
# page flags, counts and cgroups (kpage*: the host's physical memory layout, a Rowhammer aid), vmallocinfo
# (physical addresses of kernel mappings), slabinfo and pagetypeinfo (kernel allocator state, a heap-grooming
# aid), and a VM's program_cpu. An unprivileged host user can read none of them.
_MASKED_PROC = ("/proc/keys", "/proc/key-users", "/proc/timer_list", "/proc/sched_debug", "/proc/kcore",
                "/proc/kpagecount", "/proc/kpageflags", "/proc/kpagecgroup", "/proc/vmallocinfo", "/proc/slabinfo",
                "/proc/pagetypeinfo", "/proc/program_cpu")
# Review 11 (S-R11): host state any host user can read, but that tells the sandbox about the host and not about
# itself: pressure stall figures of the whole host (/proc/pressure/*: a side channel on other tenants' load), the
# interrupt counts of each CPU and device (/proc/interrupts), every block device's I/O counters (/proc/diskstats),
# the host kernel's command line (/proc/cmdline) and the boot id (a stable identifier of the host). Each reads as
# an empty read-only file (the boot id as :data:`MASKED_BOOT_ID`, a fixed id) where the host has it. Left readable
# on purpose: /proc/stat, /proc/loadavg and /proc/vmstat (psutil's cpu_times / cpu_count / boot_time,
# os.getloadavg and the like read them; sandboxed analyzers use those), and the host-wide memory and uptime
# figures of their kind (/proc/zoneinfo, /proc/buddyinfo, /proc/uptime, /proc/sys/fs/*-nr). Review 12 (S-R12):
# /proc/softirqs too, the per-CPU NET_RX / BLOCK / TIMER counts of the host (the signal of the interrupts and
# disk counters above, +34 and +76 a second while the host worked).
_EMPTIED_PROC = ("/proc/interrupts", "/proc/softirqs", "/proc/diskstats", "/proc/cmdline")
_PRESSURE_DIR = "/proc/pressure"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
MASKED_BOOT_ID = "00000000-0000-4000-8000-000000000000\n"  # the format of a boot id, the same on every host and boot
# Global (not per-process) /proc entries a host-root sandbox uid could write: Docker 20.10's ReadonlyPaths
# (moby oci.DefaultSpec: bus, fs, irq, sys, sysrq-trigger) and its masked trees (acpi, asound, scsi), plus
# /proc/pressure (PSI triggers) and /proc/driver (rtc). Each is bound read-only where the kernel has it.
_READONLY_PROC = ("/proc/sys", "/proc/sysrq-trigger", "/proc/pressure", "/proc/bus", "/proc/fs", "/proc/irq",
                  "/proc/acpi", "/proc/asound", "/proc/scsi", "/proc/driver")


def _bwrap_argv(bwrap: str, argv: list[str], *, inputs: dict[str, Path], workdir: Path | None, code_file: Path | None,
                limits: RunLimits, env: dict[str, str], host_tmpfs: dict[str, Path] | None = None,
                proc_masks: dict[str, Path] | None = None) -> list[str]:
    a = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
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
    # A fresh /proc, but its global writable files read-only: as host root the sandbox uid is host uid 0,
    # which sysctl permission checks (test_perm) treat as root whatever the namespace or capabilities.
    # Review 9 (E-R9): /proc/irq (smp_affinity of host interrupts) and /proc/bus/pci (device config space) were
    # writable too; every global /proc tree that Docker makes read-only or masks is bound read-only here.
    a += ["--proc", "/proc"]
    for tree in _READONLY_PROC:
        a += ["--ro-bind-try", tree, tree]
    # Docker's masked /proc files, read as host root's (keyring names, timers of host tasks): /dev/null over them
    for masked in _MASKED_PROC:
        if os.path.exists(masked):  # the sandbox's /proc is of the same kernel; bwrap cannot create a missing one
            a += ["--ro-bind", "/dev/null", masked]
    # Host state readable by anyone (S-R11): an empty file, or a fixed boot id, read-only over each (/dev/null would
    # refuse the open on bwrap's nodev bind: a program reading them gets an empty text instead of an error)
    if proc_masks is not None:
        pressure = sorted(str(p) for p in Path(_PRESSURE_DIR).glob("*")) if os.path.isdir(_PRESSURE_DIR) else []
        for path in (*_EMPTIED_PROC, *pressure):
            if os.path.isfile(path):
                a += ["--ro-bind", str(proc_masks["empty"]), path]
        if os.path.isfile(BOOT_ID_PATH):
            a += ["--ro-bind", str(proc_masks["boot_id"]), BOOT_ID_PATH]
    # /dev made by hand on a capped tmpfs (bwrap's --dev takes no --size): the usual nodes bound from
    # the host, the std links, a capped /dev/shm; /dev itself is remounted read-only below. No devpts.
    disk = limits.disk_mb << 20
    a += _tmpfs("/dev", _lim.DEV_SIZE, host_tmpfs)
    for node in _DEV_NODES:
        a += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        a += ["--symlink", target, f"/dev/{name}"]
    a += _tmpfs("/dev/shm", disk, host_tmpfs) + _tmpfs("/tmp", disk, host_tmpfs)
    # The interpreter prefixes AFTER the /tmp tmpfs: a venv under /tmp (a clone in /tmp) must stay visible.
    for prefix in sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
                         | {sys.prefix}):
        if not prefix.startswith("/usr/") and prefix != "/usr":
            a += ["--ro-bind", prefix, prefix]
    if workdir is not None:
        a += ["--bind", str(Path(workdir).resolve()), WORK_DIR]
    else:
        a += _tmpfs(WORK_DIR, disk, host_tmpfs)
    for name, src in sorted(inputs.items()):
        a += ["--ro-bind", str(src.resolve()), f"{EVIDENCE_DIR}/{name}"]
    if code_file is not None:
        a += ["--ro-bind", str(code_file), CODE_PATH]
    for k, v in env.items():
        a += ["--setenv", k, v]
    if seccomp_filter() is not None:
        a += ["--seccomp", "{seccomp_fd}"]
    a += ["--chdir", WORK_DIR, "--remount-ro", "/dev", "--remount-ro", "/", "--"]
    nproc = -1 if os.geteuid() == 0 else limits.max_procs  # as root the pids cgroup does it
    rl = [limits.cpu_s, limits.memory_mb << 20, limits.max_file_mb << 20, nproc, 0, SIGPENDING_MAX]
    return a + [sys.executable, "-I", "-S", "-c", _LAUNCHER, *map(str, rl), "{report_fd}", ",".join(WRITABLE), *argv]


def _proc_mask_files(tmp: Path) -> dict[str, Path]:
    """The read-only files bound over host-state /proc files (S-R11), made in the run's private ``tmp``: ``empty``
    (no bytes) and ``boot_id`` (:data:`MASKED_BOOT_ID`)."""
    files = {"empty": tmp / "proc-empty", "boot_id": tmp / "proc-boot-id"}
    files["empty"].write_bytes(b"")
    files["boot_id"].write_text(MASKED_BOOT_ID)
    for f in files.values():
        f.chmod(0o444)
    return files


def run_bwrap(bwrap: str, argv: list[str], *, inputs: dict[str, Path], workdir: Path | None, code_file: Path | None,
              limits: RunLimits, env_extra: dict[str, str], tmp: Path) -> SandboxResult:
    """Run ``argv`` (already translated: ``python`` -> this interpreter) under bubblewrap.

    ``bwrap`` is the path of a working bwrap (the dispatcher's probe, :func:`evotrainer.sandbox.api.sandbox_info`).
    ``tmp`` is the caller's private temp folder (the supervisor's cwd). Where the host allows it the
    run gets its own cgroup (memory, pids = ``max_procs`` + 2 for the prelude/bwrap and bwrap's init,
    cpu), removed afterwards, and (as root) tmpfs with inode caps; see :mod:`evotrainer.sandbox.limits`.
    """
    path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    env = {**BASE_ENV, "HOME": WORK_DIR, "PATH": path, "EVOTRAINER_EVIDENCE": EVIDENCE_DIR,
           "EVOTRAINER_SANDBOX_BACKEND": "bwrap", **env_extra}
    disk = limits.disk_mb << 20
    host_tmpfs, mounts = None, []
    if _lim.host_tmpfs_available():
        specs = {"/dev": (_lim.DEV_SIZE, _lim.DEV_INODES, "0755"), "/dev/shm": (disk, _lim.tmpfs_inodes(disk), "1777"),
                 "/tmp": (disk, _lim.tmpfs_inodes(disk), "1777")}
        if workdir is None:
            specs[WORK_DIR] = (disk, _lim.tmpfs_inodes(disk), "0755")
        host_tmpfs = {}
        for i, (dest, (size, inodes, mode)) in enumerate(specs.items()):
            folder = tmp / f"mnt{i}"
            folder.mkdir()
            host_tmpfs[dest] = folder
            mounts.append((f"size={size},nr_inodes={inodes},mode={mode},nosuid,nodev", str(folder)))
    full = _bwrap_argv(bwrap, argv, inputs=inputs, workdir=workdir, code_file=code_file, limits=limits, env=env,
                       host_tmpfs=host_tmpfs, proc_masks=_proc_mask_files(tmp))
    cgroup = _lim.RunCgroup(limits.memory_mb << 20, limits.max_procs + 2, limits.cpus)
    try:
        # bwrap reads its options from a file descriptor (--args): its command line, which the sandbox reads as
        # /proc/1/cmdline, is then "bwrap --args N -- <launcher>", without the host paths of the temp folder, the
        # work dir and the inputs that its binds name (the command itself must stay on the command line)
        cut = full.index("--")
        launch = _lim.prelude_argv(cgroup.procs_files(), mounts, [full[0], "--args", "{args_fd}", *full[cut:]])
        result = supervise(launch, limits, backend="bwrap", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                           cwd=tmp, fd_args=full[1:cut])
        if result.limit_hit in (None, "timeout", "procs"):
            if cgroup.oom_kills():
                result.limit_hit = "memory"
            elif cgroup.forks_refused():
                result.limit_hit = "procs"
        return result
    finally:
        cgroup.remove()


# --- supervision: wall clock, output caps, resource use ------------------------------------------
def supervise(argv: list[str], limits: RunLimits, *, backend: str, env: dict[str, str], cwd: Path,
              fd_args: list[str] | None = None) -> SandboxResult:
    """Start ``argv`` in its own process group, enforce the wall clock and output caps, reap it.

    Placeholders in ``argv`` and ``fd_args``: ``{report_fd}`` (the launcher's report pipe), ``{seccomp_fd}`` (a
    pipe holding :func:`seccomp_filter`'s program, for bwrap's ``--seccomp``) and ``{args_fd}`` (a memfd holding
    ``fd_args`` NUL-separated, for bwrap's ``--args``: arguments that stay out of every command line).
    """
    report_r, report_w = os.pipe()  # the launcher reports the program's CPU time and peak RSS here
    fds = {"{report_fd}": report_w}
    to_close = [report_w]
    if "{seccomp_fd}" in argv or "{seccomp_fd}" in (fd_args or []):
        program = seccomp_filter()
        if program is None:  # _bwrap_argv asks for --seccomp only where a filter exists
            raise SandboxError(f"argv asks for a seccomp filter, but there is none for {platform.machine()}")
        sec_r, sec_w = os.pipe()
        os.write(sec_w, program)  # a few hundred bytes: fits the pipe buffer
        os.close(sec_w)
        fds["{seccomp_fd}"] = sec_r
        to_close.append(sec_r)
    if fd_args is not None:
        mfd = os.memfd_create("sandbox-args", 0)  # inheritable: bwrap reads it after the prelude's exec
        data = b"".join(os.fsencode(str(fds[a]) if a in fds else a) + b"\0" for a in fd_args)
        view = memoryview(data)
        while view:
            view = view[os.write(mfd, view):]
        os.lseek(mfd, 0, os.SEEK_SET)
        fds["{args_fd}"] = mfd
        to_close.append(mfd)
    argv = [str(fds[a]) if a in fds else a for a in argv]
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=cwd, start_new_session=True, close_fds=True, bufsize=0,
                                pass_fds=tuple(fds.values()))
    except OSError as e:
        os.close(report_r)
        raise SandboxError(f"{backend} sandbox failed to start ({argv[0]}): {e}") from e
    finally:
        for fd in to_close:
            os.close(fd)
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
    usage_at_kill: tuple[float, float] | None = None
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
                usage_at_kill = _tree_usage(proc.pid)  # the kill takes the launcher too: it reports nothing
                _killpg(proc.pid)
                break
        _, status, ru = os.wait4(proc.pid, 0)
    except BaseException:  # SIGTERM (as SystemExit), Ctrl-C, an error: never leave the tree running
        _killpg(proc.pid)
        try:
            os.wait4(proc.pid, 0)
        except ChildProcessError:
            pass
        raise
    finally:
        os.close(pidfd)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join(timeout=5)
    wall = time.monotonic() - t0
    stdout = bufs["stdout"].decode(errors="replace")
    stderr = bufs["stderr"].decode(errors="replace")
    cpu, rss_kb = _read_report(report_r, ru, usage_at_kill)
    limit = killed_for or ("output" if any(truncated.values()) else None) \
        or infer_limit(proc.returncode, stderr, cpu, limits)
    return SandboxResult(exit_code=proc.returncode, stdout=stdout, stderr=stderr, limit_hit=limit,
                         backend=backend, wall_s=round(wall, 4), cpu_s=round(cpu, 4),
                         max_rss_mb=round(rss_kb / 1024, 2), stdout_truncated=truncated["stdout"],
                         stderr_truncated=truncated["stderr"])


def _read_report(fd: int, ru, usage_at_kill: tuple[float, float] | None = None) -> tuple[float, float]:
    """(CPU seconds, peak RSS KiB) from the launcher's report; when none came (the supervisor killed the tree,
    launcher included), the tree's usage read just before the kill (:func:`_tree_usage`), else the
    supervisor's rusage of bwrap (which leaves out the unreaped program: 0.01 s for a 3 s busy loop)."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 256).decode(errors="replace").split()
        return float(data[0]), float(data[1])
    except (OSError, ValueError, IndexError):
        if usage_at_kill is not None:
            return usage_at_kill
        return ru.ru_utime + ru.ru_stime, float(ru.ru_maxrss)
    finally:
        os.close(fd)


def _tree_usage(root: int) -> tuple[float, float] | None:
    """(CPU seconds, peak RSS KiB) of ``root`` and its live descendants, from ``/proc``: per process
    ``utime + stime + cutime + cstime`` (fields 14-17 of ``/proc/PID/stat``, clock ticks / ``SC_CLK_TCK``;
    the ``c`` fields hold reaped children, which are no longer live, so nothing counts twice) and the
    largest ``VmHWM`` of ``/proc/PID/status`` (proc(5)). None when ``/proc`` cannot be read."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (ppid, cpu seconds)
    rss: dict[int, float] = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": the comm may hold spaces
            stats[pid] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / tick)
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    for pid in tree:
        try:
            with open(f"/proc/{pid}/status") as f:
                rss[pid] = next((float(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0.0)
        except (OSError, ValueError, IndexError):
            continue
    if root not in stats:
        return None
    return sum(stats[p][1] for p in tree if p in stats), max(rss.values(), default=0.0)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --- unsafe local (explicit opt-in only) ----------------------------------------------------------
def run_unsafe_local(cmd: list[str], *, inputs, workdir, code_file, limits: RunLimits, env_extra,
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
    env = {**BASE_ENV, "HOME": str(work), "TMPDIR": str(work), "EVOTRAINER_EVIDENCE": str(evidence),
           "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "EVOTRAINER_SANDBOX_BACKEND": "unsafe-local", **env_extra}
    rl = [limits.cpu_s, limits.memory_mb << 20, limits.max_file_mb << 20, -1, 0, -1]
    full = [sys.executable, "-I", "-S", "-c", _LAUNCHER, *map(str, rl), "{report_fd}", "-", *argv]
    return supervise(full, limits, backend="unsafe-local", env=env, cwd=work)
