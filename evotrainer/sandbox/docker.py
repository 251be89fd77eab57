"""The Docker backend of :mod:`evotrainer.sandbox` (used where a Docker daemon answers).

Images are built on first use from ``sandbox_images/<image>/Dockerfile`` and tagged
``evotrainer-sandbox-<image>``. Each run is one container: ``network_mode=none``, read-only root
file system, all capabilities dropped, ``no-new-privileges``, Docker's seccomp profile with the bwrap
backend's filter stacked on it (:data:`_SECCOMP_LAUNCHER`), Docker's masked / read-only ``/proc`` paths
plus ``/proc/key-users`` and ``/proc/pressure`` (:data:`MASKED_PATHS`, :data:`READONLY_PATHS`), uid/gid
65534 (a caller's work dir is handed to 65534 for the run as root, then back; a non-root caller's
container runs as its uid), memory (no swap) and pids cgroup limits and a CPU quota (``nano_cpus``) for
the whole container, ``cpu`` / ``fsize`` / ``core`` / ``sigpending`` ulimits, tmpfs ``/tmp``, ``/dev/shm`` and (without
a host ``workdir``) ``/sandbox/work`` with size and inode caps, inputs bound read-only at
``/evidence/<name>``. The wall clock is enforced by ``container.wait`` polls and a kill; stdout and
stderr are read through an attach made before the start (log driver ``none``: nothing reaches the
host disk) and the container is killed once either passes ``max_output_kb``; the container is
always removed.

Tested against a fake Engine API on 127.0.0.1 (tests/test_sandbox.py: the container config sent, the
wall-clock kill, the removal) and against a real daemon (Docker 20.10, cgroup v1, images on a local
debootstrap base: the escape and security suites run through both backends, tests/sandbox_backends.py).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from evotrainer.sandbox.base import (
    CODE_PATH,
    EVIDENCE_DIR,
    IMAGE_PREFIX,
    IMAGES_DIR,
    SANDBOX_UID,
    WORK_DIR,
    RunLimits,
    SandboxError,
    SandboxResult,
    infer_limit,
)
from evotrainer.sandbox.bwrap import BLOCKED_SYSCALLS, SIGPENDING_MAX, seccomp_filter
from evotrainer.sandbox.fs import Owners, lend_tree, return_tree
from evotrainer.sandbox.limits import owner_alive, owner_tag, tmpfs_inodes

OWNER_LABEL = "org.evotrainer.sandbox.owner"  # <pid>.<start time> of the process that started the container
BASE_ENV = "EVOTRAINER_SANDBOX_BASE"  # build argument BASE of the Dockerfiles (default python:3.11-slim)
PIP_ENV = "EVOTRAINER_SANDBOX_PIP"  # build argument PIP_REQUIREMENTS: 0 = the base brings its packages
BUILD_NETWORK_ENV = "EVOTRAINER_SANDBOX_BUILD_NETWORK"  # network of the build steps (e.g. host); runs: always none

# /proc and /sys paths the container sees as an empty file (MaskedPaths) or read-only (ReadonlyPaths). Sending
# either replaces the daemon's own list, so these are Docker 20.10's defaults (moby oci.DefaultSpec) plus what
# the bwrap backend also hides: /proc/key-users (kernel key quota of host uids) and /proc/pressure, which
# Docker 20.10 left writable to the container user (PSI trigger files, checked on a real daemon). Review 11 (S-R11):
# also the host state the bwrap backend empties (pressure stall figures, interrupt and disk counters, the kernel
# command line, the boot id; review 12, S-R12: the softirq counts); /proc/stat, /proc/loadavg and /proc/vmstat stay
# readable (psutil, os.getloadavg).
MASKED_PATHS = ("/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/key-users", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                "/proc/pressure/cpu", "/proc/pressure/io", "/proc/pressure/memory", "/proc/pressure/irq",
                "/proc/interrupts", "/proc/softirqs", "/proc/diskstats", "/proc/cmdline",
                "/proc/sys/kernel/random/boot_id")
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger", "/proc/pressure")

# Runs first in the container (as ``python3 -I -S -c``): loads the bwrap backend's seccomp filter
# (:func:`~evotrainer.sandbox.bwrap.seccomp_filter`, hex in argv[1]) with prctl(PR_SET_SECCOMP=22,
# SECCOMP_MODE_FILTER=2) on top of Docker's default profile (filters stack; no-new-privileges makes it
# allowed unprivileged), then execs the command. Docker 20.10's default profile allows io_uring_setup
# (checked on a real daemon); this one refuses it with the rest of BLOCKED_SYSCALLS. A filter that cannot
# be loaded ends the run (exit 126) instead of running the code unfiltered.
_SECCOMP_LAUNCHER = r"""
import ctypes,os,sys
p=bytes.fromhex(sys.argv[1]);b=ctypes.create_string_buffer(p,len(p))
class F(ctypes.Structure):_fields_=[('n',ctypes.c_ushort),('f',ctypes.c_void_p)]
f=F(len(p)//8,ctypes.addressof(b));l=ctypes.CDLL(None,use_errno=True)
if l.prctl(22,2,ctypes.byref(f),0,0)!=0:sys.stderr.write(f'sandbox: seccomp filter refused (errno {ctypes.get_errno()})\n');os._exit(126)
try:os.execvp(sys.argv[2],sys.argv[2:])
except OSError as e:sys.stderr.write(f'sandbox: cannot run {sys.argv[2]!r}: {e}\n');os._exit(127)
"""
OOM_EVENT_WAIT_S = 2.0  # how long a SIGKILLed container's OOMKilled flag is awaited (the daemon's OOM event can trail its exit)


def ensure_image(client, image: str) -> str:
    """Tag of the sandbox image ``image``, building it from ``sandbox_images/<image>`` when missing.

    ``$EVOTRAINER_SANDBOX_BASE`` names the base image (build argument ``BASE``): a local image such as
    one made with ``debootstrap`` + ``docker import`` builds with no registry.
    ``$EVOTRAINER_SANDBOX_PIP=0`` skips the images' ``pip install`` (a base that brings its packages:
    no registry at all). ``$EVOTRAINER_SANDBOX_BUILD_NETWORK`` (e.g. ``host``) is the network of the build steps (pip,
    apt) on a daemon started without its default bridge; containers that run code always get none.

    Raises :class:`SandboxError` when the folder or the build fails.
    """
    import docker

    tag = f"{IMAGE_PREFIX}{image}:latest"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    folder = IMAGES_DIR / image
    if not (folder / "Dockerfile").exists():
        raise SandboxError(f"image={image!r}: no Dockerfile at {folder}")
    try:
        args = {k: v for k, v in (("BASE", os.environ.get(BASE_ENV, "").strip()),
                                  ("PIP_REQUIREMENTS", os.environ.get(PIP_ENV, "").strip())) if v}
        client.images.build(path=str(folder), tag=tag, rm=True, pull=False, buildargs=args or None,
                            network_mode=os.environ.get(BUILD_NETWORK_ENV) or None)
    except docker.errors.BuildError as e:
        raise SandboxError(f"building {tag} from {folder} failed: {e}") from e
    return tag


def run_docker(client, image: str, argv: list[str], *, inputs: dict[str, Path], workdir: Path | None,
               code_file: Path | None, limits: RunLimits, env: dict[str, str]) -> SandboxResult:
    """Run ``argv`` in a fresh locked-down container of ``image``; see the module doc."""
    import docker
    import requests

    tag = ensure_image(client, image)
    _sweep_stale_containers(client, owner_alive)
    volumes = {str(src.resolve()): {"bind": f"{EVIDENCE_DIR}/{name}", "mode": "ro"} for name, src in inputs.items()}
    if code_file is not None:
        volumes[str(code_file)] = {"bind": CODE_PATH, "mode": "ro"}
    caps = f"size={limits.disk_mb}m,nr_inodes={tmpfs_inodes(limits.disk_mb << 20)}"
    # /dev/shm as our own tmpfs: Docker's (shm_size) has a size cap but no inode cap (40,000 files went into a
    # 64 MiB one on Docker 20.10); a mount of ours at /dev/shm replaces the daemon's
    tmpfs = {"/tmp": caps, "/dev/shm": f"{caps},mode=1777",
             "/sys": "ro,size=4k,nr_inodes=16"}  # hide the host's sysfs (Docker mounts it ro)
    user, owner = f"{SANDBOX_UID}:{SANDBOX_UID}", None
    if workdir is not None:
        volumes[str(Path(workdir).resolve())] = {"bind": WORK_DIR, "mode": "rw"}
    else:
        tmpfs[WORK_DIR] = f"{caps},uid={SANDBOX_UID},gid={SANDBOX_UID}"
    ulimits = [docker.types.Ulimit(name="cpu", soft=limits.cpu_s, hard=limits.cpu_s + 1),
               docker.types.Ulimit(name="fsize", soft=limits.max_file_mb << 20, hard=limits.max_file_mb << 20),
               docker.types.Ulimit(name="core", soft=0, hard=0),
               # queued signals count against the container user's host uid (bwrap.SIGPENDING_MAX, review 7)
               docker.types.Ulimit(name="sigpending", soft=SIGPENDING_MAX, hard=SIGPENDING_MAX)]
    # /dev/null over /etc/resolv.conf: with network none Docker 20.10 still copies the host's resolver into the
    # container (its nameserver addresses were readable); a mount of ours there replaces the daemon's file
    binds = [f"{src}:{v['bind']}:{v['mode']}" for src, v in volumes.items()] + ["/dev/null:/etc/resolv.conf:ro"]
    program = seccomp_filter()
    command = argv if program is None else ["python3", "-I", "-S", "-c", _SECCOMP_LAUNCHER, program.hex(), *argv]
    host_config = client.api.create_host_config(
        network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True, tmpfs=tmpfs,
        binds=binds, mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m",
        pids_limit=limits.max_procs, nano_cpus=int(limits.cpus * 1e9),
        ulimits=ulimits, log_config={"Type": "none", "Config": {}},  # output only through the attach below
        init=True)  # docker's init as pid 1 reaps orphans, so zombies never eat the pids limit
    host_config["MaskedPaths"], host_config["ReadonlyPaths"] = list(MASKED_PATHS), list(READONLY_PATHS)
    killed, forks_refused, status = None, False, None
    cap = limits.max_output
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    truncated = {"stdout": False, "stderr": False}
    over = threading.Event()

    def pump(stream) -> None:  # read the output while it runs: a flood is stopped at the cap
        try:
            for frames in stream:
                for name, chunk in zip(("stdout", "stderr"), frames, strict=True):
                    if not chunk or truncated[name]:
                        continue  # past the cap: still drained (the shim reports the exit only once its
                        # output is read, so a reader that stops makes the kill hang), never kept
                    room = cap - len(bufs[name])
                    bufs[name] += chunk[:max(room, 0)]
                    if len(chunk) > room:
                        truncated[name] = True
                        over.set()
        except Exception:  # the container went away or the stream was closed: what was read is kept
            pass

    container, stream = None, None
    try:  # from the lend on: whatever fails, the container is removed and the work dir given back
        if workdir is not None:
            owner, user = _lend_work_dir(Path(workdir), user)
        t0 = time.monotonic()
        created = client.api.create_container(
            tag, command, detach=True, user=user, environment=env, working_dir=WORK_DIR, stdin_open=False,
            volumes=[v["bind"] for v in volumes.values()] + ["/etc/resolv.conf"], host_config=host_config,
            labels={OWNER_LABEL: owner_tag()})  # a run killed with SIGKILL: the next run removes its container
        container = client.containers.get(created["Id"])
        # Attached before the start, so nothing is missed; with the "none" log driver nothing the container
        # prints reaches the host disk (json-file: an output flood had 11-16 MB on disk before the kill at a
        # 64 KiB cap, Docker 20.10; a size-capped json-file made the follower lose its place at rotation).
        stream = client.api.attach(container.id, stdout=True, stderr=True, stream=True, logs=False, demux=True)
        threads = [threading.Thread(target=pump, args=(stream,), daemon=True)]
        container.start()  # inside the try: a container that fails to start is removed too
        for t in threads:
            t.start()
        while status is None:
            left = limits.timeout_s - (time.monotonic() - t0)
            if over.is_set() or left <= 0:
                forks_refused = _forks_refused(container.id)  # while the container's cgroup still exists
                killed = "output" if over.is_set() else "timeout"
                try:
                    container.kill()
                    status = -9
                except docker.errors.APIError as exc:
                    # it exited between the check and the kill: 409 "is not running" (a program that printed
                    # past the cap and ended at once; the clean-clone CI of dbf4919 lost the result to it)
                    if exc.status_code != 409:
                        raise
                    status = container.wait(timeout=30)["StatusCode"]
                    killed = "output" if over.is_set() else None  # a timeout that lost the race ended by itself
                break
            try:
                status = container.wait(timeout=max(0.05, min(left, 0.5)))["StatusCode"]
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                continue
        wall = time.monotonic() - t0
        for t in threads:
            t.join(timeout=5)
        oom = _oom_killed(container, status, killed)
    finally:
        try:
            if stream is not None:
                stream.close()
            if container is not None:
                container.remove(force=True)
        finally:  # a removal that fails (daemon gone) still gives the work dir back to its owners
            if owner is not None and workdir is not None:  # owner is set only for a lent workdir
                _return_work_dir(Path(workdir), owner)
    stdout, stderr = bytes(bufs["stdout"]).decode(errors="replace"), bytes(bufs["stderr"]).decode(errors="replace")
    limit = ("procs" if forks_refused else killed) or ("memory" if oom else None) \
        or ("output" if any(truncated.values()) else None) or infer_limit(status, stderr, 0.0, limits)
    return SandboxResult(exit_code=status, stdout=stdout, stderr=stderr, limit_hit=limit, backend="docker",
                         wall_s=round(wall, 4), cpu_s=None, max_rss_mb=None, stdout_truncated=truncated["stdout"],
                         stderr_truncated=truncated["stderr"])


def daemon_limits(client) -> tuple[str, dict[str, str]]:
    """What the daemon behind ``client`` enforces for a run: ``(daemon summary, {limit: "enforced: how" |
    "NOT enforced: why"})`` for ``memory_per_run``, ``procs_per_run``, ``cpu_per_run``, read from its
    ``/info`` (``MemoryLimit``, ``SwapLimit``, ``PidsLimit``, ``CpuCfsQuota``, ``SecurityOptions``);
    plus ``tmpfs_size``, ``tmpfs_inodes``, ``dev_cap``, ``seccomp``, ``proc_masking`` (this backend's
    own mounts and launcher). A daemon that cannot be asked gives ``("unknown: <error>", ...)`` with
    the cgroup limits reported as not known.
    """
    try:
        info = client.info()
    except Exception as e:  # a daemon gone since the choice: say so instead of claiming limits
        info, summary = {}, f"unknown: {type(e).__name__}: {e}"[:200]
    else:
        summary = (f"Docker {info.get('ServerVersion', '?')}, cgroup v{info.get('CgroupVersion', '?')} "
                   f"({info.get('CgroupDriver', '?')}), storage {info.get('Driver', '?')}")

    def held(flag: str, how: str, why: str) -> str:
        if flag not in info:
            return f"NOT enforced: the daemon did not say whether it supports {flag} ({summary})"
        return f"enforced: {how}" if info[flag] else f"NOT enforced: {why}"

    memory = held("MemoryLimit", "container memory cgroup (mem_limit = memswap_limit = memory_mb)",
                  "the daemon has no memory cgroup; memory_mb bounds nothing (Docker sets no RLIMIT_AS)")
    if memory.startswith("enforced") and not info.get("SwapLimit", False):
        memory = ("enforced, without swap limit: container memory cgroup (mem_limit = memory_mb), but the kernel "
                  "has no swap accounting, so a run may swap beyond memory_mb")
    seccomp = any("seccomp" in str(o) for o in info.get("SecurityOptions") or [])
    return summary, {
        "memory_per_run": memory,
        "procs_per_run": held("PidsLimit", "container pids cgroup (pids_limit = max_procs)",
                              "the daemon has no pids cgroup; a fork bomb is bounded by nothing here"),
        "cpu_per_run": held("CpuCfsQuota", "container CPU quota (nano_cpus = cpus)",
                            "the daemon has no CFS quota; cpu_s bounds each process's CPU seconds only"),
        "tmpfs_size": "enforced: tmpfs size= disk_mb on /tmp, /dev/shm and the private work dir",
        "tmpfs_inodes": "enforced: tmpfs nr_inodes= (one per 16 KiB of size cap) on /tmp, /dev/shm and the "
                        "private work dir",
        "dev_cap": "enforced: Docker's /dev tmpfs is root-owned 0755 (uid 65534 cannot create files there); "
                   "/dev/shm is the capped tmpfs above",
        "seccomp": (f"enforced: Docker's default profile + {len(BLOCKED_SYSCALLS)} syscalls refused by a stacked "
                    "filter (keyrings, bpf, perf, io_uring, ...)" if seccomp and seccomp_filter() else
                    "NOT enforced: " + ("the daemon runs without seccomp" if not seccomp else
                                        "no stacked filter for this architecture; Docker's default profile only")),
        "proc_masking": f"enforced: masked {', '.join(MASKED_PATHS)}; read-only {', '.join(READONLY_PATHS)}",
    }


def _oom_killed(container, status: int | None, killed: str | None) -> bool:
    """True when the container's memory cgroup OOM-killed a process (the daemon's ``State.OOMKilled``).

    The daemon sets the flag on containerd's OOM event, which on a loaded machine can arrive after the
    exit the wait returned (seen on Docker 20.10: exit 137, flag still false, true a moment later). So a
    container that died of SIGKILL (137) that the sandbox did not send is re-read for up to
    :data:`OOM_EVENT_WAIT_S` seconds; any other exit is read once.
    """
    deadline = time.monotonic() + (OOM_EVENT_WAIT_S if status == 137 and killed is None else 0.0)
    while True:
        container.reload()
        if container.attrs.get("State", {}).get("OOMKilled"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _forks_refused(container_id: str) -> bool:
    """True when the container's pids cgroup refused a fork (``pids.events`` max > 0). Read from the
    host's cgroup file system where this process sees it (cgroupfs or systemd driver, v1 or v2);
    False where it cannot be read (a remote daemon)."""
    root = Path("/sys/fs/cgroup")
    for rel in (f"pids/docker/{container_id}", f"docker/{container_id}", f"system.slice/docker-{container_id}.scope",
                f"pids/system.slice/docker-{container_id}.scope"):
        try:
            for line in (root / rel / "pids.events").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "max" and int(v) > 0:
                    return True
        except (OSError, ValueError):
            continue
    return False


def _lend_work_dir(workdir: Path, user: str) -> tuple[Owners | None, str]:
    """Make a caller's work dir writable by the container user: ``(owners to give back, user)``.

    As root the tree is lent to uid/gid 65534 for the run (so what the container writes is owned by an
    unprivileged uid, not root) with :func:`~evotrainer.sandbox.fs.lend_tree` (a file hard-linked to a
    path outside keeps its owner) and each entry given back its own owner afterwards; a non-root
    caller's container runs as the caller's own uid instead. Raises :class:`SandboxError` when the
    tree cannot be lent.
    """
    if os.geteuid() != 0:
        return None, f"{os.getuid()}:{os.getgid()}"
    try:
        owners = lend_tree(workdir, SANDBOX_UID, SANDBOX_UID)  # gives back what it lent before raising
    except OSError as e:
        raise SandboxError(f"workdir={workdir}: cannot hand it to uid {SANDBOX_UID} for the container ({e})") from e
    return owners, user


def _return_work_dir(workdir: Path, owners: Owners) -> None:
    try:
        return_tree(workdir, owners)
    except OSError as e:
        raise SandboxError(f"could not clean the work dir {workdir}: giving its entries back to their owners "
                           f"failed ({e}); remove it as root") from e


def _sweep_stale_containers(client, owner_alive) -> int:
    """Remove sandbox containers whose owner process is gone (killed with SIGKILL mid-run)."""
    n = 0
    try:
        for c in client.containers.list(all=True, filters={"label": OWNER_LABEL}):
            if not owner_alive(c.labels.get(OWNER_LABEL, "") + "-"):
                c.remove(force=True)
                n += 1
    except Exception:  # a daemon that cannot list: the run itself still goes ahead
        pass
    return n
