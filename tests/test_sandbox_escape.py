"""Escape suite: untrusted code tries to break out of the sandbox; every attempt is contained and
the host is checked unchanged afterwards (files, processes, listeners, secrets).

Runs through each real backend that can run here: bubblewrap (`make sandbox-deps`) and Docker (a
real daemon, started by tests/sandbox_backends.py where dockerd is installed; images on a local
debootstrap base). A backend that cannot run here skips with the reason.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from evotrainer.sandbox import run_in_sandbox

REPO = Path(__file__).resolve().parent.parent


# every test here runs once per backend that can run on this machine (tests/sandbox_backends.py)
pytestmark = pytest.mark.usefixtures("sandbox_backend")


def run(code: str, **kw):
    return run_in_sandbox(code=textwrap.dedent(code), **kw)


def stray_processes(marker: str) -> list[int]:
    """Host pids whose environment carries ``marker`` (the sandboxed processes of one test)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "environ").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def strays_after(marker: str, within_s: float = 10.0) -> list[int]:
    """:func:`stray_processes` once they are gone or ``within_s`` has passed: the kernel tears a killed pid
    namespace down asynchronously (a fixed 0.2 s wait was a race on a loaded machine)."""
    end = time.monotonic() + within_s
    while (found := stray_processes(marker)) and time.monotonic() < end:
        time.sleep(0.05)
    return found


def test_01_cannot_connect_to_a_host_loopback_listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    accepted = []
    done = threading.Event()

    def accept():
        while not done.is_set():
            try:
                accepted.append(srv.accept())
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    r = run(f"""
        import socket
        for host in ("127.0.0.1", "localhost", "::1"):
            try:
                socket.create_connection((host, {port}), timeout=2); print("CONNECTED", host)
            except OSError as e:
                print("refused", host, type(e).__name__)
    """)
    done.set()
    t.join(2)
    srv.close()
    assert "CONNECTED" not in r.stdout and r.stdout.count("refused") == 3, r
    assert accepted == []  # host: the listener never saw a connection


def test_02_no_dns_and_no_outbound_network():
    r = run("""
        import os, socket
        for what, fn in [("dns", lambda: socket.getaddrinfo("example.com", 80)),
                         ("tcp", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2)),
                         ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)))]:
            try:
                fn(); print("REACHED", what)
            except OSError as e:
                print("blocked", what)
        print("ifaces", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]))
        print("netns", os.readlink("/proc/self/ns/net"))
    """)
    assert "REACHED" not in r.stdout and r.stdout.count("blocked") == 3, r
    assert "ifaces ['lo']" in r.stdout
    # host: the sandbox lived in another network namespace than ours
    assert f"netns {os.readlink('/proc/self/ns/net')}" not in r.stdout


def test_03_cannot_write_outside_the_work_dir(tmp_path):
    tag = uuid.uuid4().hex
    targets = [Path("/tmp") / f"escape-{tag}", Path.home() / f"escape-{tag}", REPO / f"escape-{tag}",
               tmp_path / f"escape-{tag}", Path("/") / f"escape-{tag}"]
    r = run(f"""
        for p in {[str(t) for t in targets]!r}:
            try:
                open(p, "w").write("pwned")
                print("wrote", p)
            except OSError as e:
                print("denied", p, e.errno)
        open("inside.txt", "w").write("fine")  # the private work dir is writable
        print("workdir ok")
    """)
    assert "workdir ok" in r.stdout
    for t in targets:
        assert not t.exists(), f"{t} was created on the host"  # host unchanged
    # /tmp inside is a private tmpfs (a write under it may succeed there, never on the host: checked above);
    # every target outside /tmp is denied. (A clone under /tmp puts REPO and tmp_path in the private tmpfs.)
    outside_tmp = [t for t in targets if not str(t).startswith("/tmp/")]
    denied = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("denied")}
    assert {str(t) for t in outside_tmp} <= denied, r


def test_04_cannot_read_a_secret_file_outside_the_inputs(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-4242")
    (tmp_path / "public.txt").write_text("public")
    r = run(f"""
        import os
        for p in [{str(secret)!r}, "/proc/1/root{secret}", "/evidence/public.txt/../secret.txt"]:
            try:
                print("READ", open(p).read())
            except OSError as e:
                print("denied", type(e).__name__)
        print(os.listdir("/evidence"))
    """, inputs={"public.txt": tmp_path / "public.txt"})
    assert "TOP-SECRET" not in r.stdout + r.stderr and r.stdout.count("denied") == 3, r
    assert "['public.txt']" in r.stdout
    assert secret.read_text() == "TOP-SECRET-4242"  # host unchanged


def test_05_planted_env_secrets_are_not_visible(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_test_secret")
    r = run("""
        import os, glob
        print(sorted(os.environ))
        blob = ""
        for p in glob.glob("/proc/*/environ"):
            try:
                blob += open(p, "rb").read().decode(errors="replace")
            except OSError:  # the launcher is non-dumpable: its environ is closed to us
                pass
        print("proc-environ", "sk-test-secret" in blob, "hf_test_secret" in blob)
    """)
    assert r.exit_code == 0, r
    assert "sk-test-secret" not in r.stdout and "ANTHROPIC_API_KEY" not in r.stdout and "HF_TOKEN" not in r.stdout
    assert "proc-environ False False" in r.stdout
    assert os.environ["ANTHROPIC_API_KEY"] == "sk-test-secret"  # host: ours untouched


def test_06_cannot_remount_root_writable_and_has_no_capabilities():
    r = run("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        MS_REMOUNT, MS_BIND = 32, 4096
        print("remount", libc.mount(None, b"/", None, MS_REMOUNT, None), ctypes.get_errno())
        print("remount-usr", libc.mount(None, b"/usr", None, MS_REMOUNT | MS_BIND, None), ctypes.get_errno())
        try:
            open("/evil", "w"); print("WROTE /")
        except OSError as e:
            print("ro", e.errno)
        st = dict(l.split(":\\t") for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)
        print("caps", st["CapEff"], st["CapPrm"], st["CapBnd"], "nnp", st["NoNewPrivs"])
    """)
    assert "remount -1 1" in r.stdout and "remount-usr -1 1" in r.stdout, r  # EPERM
    assert "ro 30" in r.stdout  # EROFS
    assert "caps 0000000000000000 0000000000000000 0000000000000000 nnp 1" in r.stdout
    assert not Path("/evil").exists()  # host unchanged


def test_07_fork_bomb_is_contained():
    marker = uuid.uuid4().hex
    r = run("""
        import os, time
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.05)
    """, timeout_s=3, max_procs=16, env={"ESCAPE_MARKER": marker})
    assert r.limit_hit == "procs", r
    assert r.wall_s < 15  # 3 s limit; generous for a loaded machine
    assert strays_after(marker) == []  # host: every forked process is gone (a host-wide process count was noise
    # under pytest -n 2: the other worker starts servers and sandboxes of its own)


def test_08_memory_bomb_is_contained():
    r = run("""
        chunks = []
        while True:
            chunks.append(bytearray(64 << 20))
    """, memory_mb=512, timeout_s=20)
    assert r.limit_hit == "memory" and r.exit_code != 0, r
    # bwrap: RLIMIT_AS makes the allocation fail (MemoryError); Docker has no RLIMIT_AS, its memory
    # cgroup OOM-kills the program (exit 137) instead
    assert "MemoryError" in r.stderr if r.backend == "bwrap" else r.exit_code == 137, r
    # bwrap measures the peak resident set (docker reports none): the 512 MiB cap held
    assert r.max_rss_mb is None if r.backend == "docker" else r.max_rss_mb < 600, r
    assert r.wall_s < 15


def test_09_fill_the_disk_with_one_file_hits_the_file_size_limit():
    free_before = shutil.disk_usage("/tmp").free
    r = run("""
        with open("big.bin", "wb") as f:
            for _ in range(100):
                f.write(b"x" * (4 << 20))
    """, max_file_mb=8)
    assert r.limit_hit == "file_size" and r.exit_code != 0, r
    assert "File too large" in r.stderr
    assert shutil.disk_usage("/tmp").free > free_before - (64 << 20)  # host: no 400 MB landed on disk


def test_10_fill_the_disk_with_many_files_hits_the_disk_cap():
    free_before = shutil.disk_usage("/tmp").free
    r = run("""
        i = 0
        while True:
            with open(f"f{i}.bin", "wb") as f:
                f.write(b"x" * (4 << 20))
            i += 1
    """, max_file_mb=8, disk_mb=32, timeout_s=20)
    assert r.limit_hit == "file_size" and "No space left on device" in r.stderr, r
    assert shutil.disk_usage("/tmp").free > free_before - (64 << 20)
    for where in ("/tmp", "/dev/shm"):  # the other writable places are capped too (RAM-backed tmpfs)
        r = run(f"""
            for i in range(1000):
                open(f"{where}/f{{i}}", "wb").write(b"x" * (4 << 20))
        """, max_file_mb=8, disk_mb=32, timeout_s=20)
        assert r.limit_hit == "file_size" and "No space left on device" in r.stderr, (where, r)


def test_11_sleep_forever_is_killed_with_its_whole_tree():
    marker = uuid.uuid4().hex
    r = run("""
        import os, subprocess, time
        subprocess.Popen(["sleep", "1000"])
        if os.fork() == 0:          # a daemon: new session, parent exits
            os.setsid()
            if os.fork() == 0:
                time.sleep(1000)
            os._exit(0)
        print("started", flush=True)
        time.sleep(1000)
    """, timeout_s=2, env={"ESCAPE_MARKER": marker})
    assert r.limit_hit == "timeout" and "started" in r.stdout, r
    assert 1.9 < r.wall_s < 15
    assert strays_after(marker) == []  # host: no sleeper, no daemon survived


def test_12_cannot_kill_the_parent():
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        r = run(f"""
            import os, signal
            # host pids first; then the sandbox's own parents (killing those may end this run early)
            for pid in ({os.getpid()}, {bystander.pid}, os.getppid(), 1):
                try:
                    os.kill(pid, signal.SIGKILL); print("sent", pid, flush=True)
                except OSError as e:
                    print("failed", pid, type(e).__name__, flush=True)
        """)
        assert f"failed {os.getpid()} ProcessLookupError" in r.stdout, r  # our pid does not exist in there
        assert f"failed {bystander.pid} ProcessLookupError" in r.stdout
        assert bystander.poll() is None  # host: the parent (us) and its child are alive
    finally:
        bystander.kill()
        bystander.wait()


def test_13_cannot_signal_other_host_processes():
    victim = subprocess.Popen(["sleep", "60"])
    try:
        r = run(f"""
            import os, signal
            try:
                os.kill({victim.pid}, signal.SIGKILL); print("sent")
            except ProcessLookupError:
                print("no such process")
            try:
                os.kill(-1, signal.SIGTERM)  # everything we may signal: only our own namespace
            except OSError:
                pass
            import time
            time.sleep(0.5)  # SIGTERM reached bwrap's launcher too, whose death ended the namespace (flaky before)
            print("alive")
        """)
        # the host pid does not exist in the sandbox's pid namespace, and kill(-1) spares the caller and the
        # sandbox's own launcher
        assert r.stdout == "no such process\nalive\n", r
        time.sleep(0.2)
        assert victim.poll() is None  # host: the victim still runs
    finally:
        victim.kill()
        victim.wait()


def test_14_cannot_ptrace_a_host_process():
    victim = subprocess.Popen(["sleep", "60"])
    try:
        r = run(f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
            for req in (PTRACE_ATTACH, PTRACE_SEIZE):
                print("ptrace", libc.ptrace(req, {victim.pid}, None, None), ctypes.get_errno())
        """)
        assert r.stdout.count("ptrace -1") == 2, r
        status = Path(f"/proc/{victim.pid}/status").read_text()
        assert "TracerPid:\t0" in status  # host: nobody traces the victim
    finally:
        victim.kill()
        victim.wait()


def test_15_cannot_write_the_read_only_inputs(tmp_path):
    data = tmp_path / "evidence"
    data.mkdir()
    (data / "metrics.csv").write_text("step,reward\n1,0.5\n")
    digest = hashlib.sha256((data / "metrics.csv").read_bytes()).hexdigest()
    r = run("""
        import os
        base = "/evidence/data"
        attempts = [lambda: open(base + "/metrics.csv", "a").write("2,9.9\\n"),
                    lambda: open(base + "/new.txt", "w").write("x"),
                    lambda: os.unlink(base + "/metrics.csv"),
                    lambda: os.rename(base + "/metrics.csv", base + "/m2.csv"),
                    lambda: os.chmod(base + "/metrics.csv", 0o777)]
        for a in attempts:
            try:
                a(); print("CHANGED")
            except OSError as e:
                print("denied", e.errno)
        print(open(base + "/metrics.csv").read())
    """, inputs={"data": data})
    assert "CHANGED" not in r.stdout and r.stdout.count("denied") == 5 and "1,0.5" in r.stdout, r
    assert sorted(p.name for p in data.iterdir()) == ["metrics.csv"]  # host unchanged
    assert hashlib.sha256((data / "metrics.csv").read_bytes()).hexdigest() == digest


def test_16_setuid_escalation_fails():
    setuid_bins = [p for p in ("/usr/bin/su", "/usr/bin/mount", "/usr/bin/passwd", "/usr/bin/newgrp")
                   if Path(p).exists() and Path(p).stat().st_mode & 0o4000]
    r = run(f"""
        import os, subprocess
        for fn in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setresuid(0, 0, 0)):
            try:
                fn(); print("BECAME ROOT")
            except OSError as e:  # EINVAL: uid 0 is not even mapped in the sandbox's user namespace
                print("denied", e.errno)
        for b in {setuid_bins!r}:  # setuid bits are ignored (nosuid mounts, no_new_privs)
            p = subprocess.run([b, "-c", "id -u"] if b.endswith("su") else [b], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=5)
            print("bin", b, p.returncode, p.stdout.strip())
        p = subprocess.run(["/usr/bin/mount", "-t", "tmpfs", "none", "/tmp"], capture_output=True, text=True)
        print("mount rc", p.returncode)
        print("ids", os.getuid(), os.geteuid(), os.getgid())
    """)
    assert "BECAME ROOT" not in r.stdout and r.stdout.count("denied") == 3, r
    assert "ids 65534 65534 65534" in r.stdout
    assert "mount rc 0" not in r.stdout and "bin /usr/bin/su 0" not in r.stdout
    assert setuid_bins  # host: the setuid binaries exist (so the attempt was real) and are unchanged
    assert all(Path(b).stat().st_mode & 0o4000 for b in setuid_bins)


def test_17_host_processes_are_invisible_in_proc():
    r = run(f"""
        import os
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        print("pids", pids)
        print("host-pid-visible", os.path.exists("/proc/{os.getpid()}/environ") and
              "PYTEST" in open("/proc/{os.getpid()}/environ", errors="replace").read())
        print("init", open("/proc/1/cmdline", "rb").read().split(b"\\0")[0].decode())
    """)
    assert "host-pid-visible False" in r.stdout, r
    pids = eval(r.stdout.split("pids ", 1)[1].splitlines()[0])
    assert len(pids) < 10  # bwrap's init, the launcher, the program: not the host's hundreds
    host_pids = [p for p in os.listdir("/proc") if p.isdigit()]
    assert len(host_pids) > len(pids)


def test_18_no_nested_user_namespace_to_regain_capabilities():
    r = run("""
        import ctypes, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
        for flag in (CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET):
            print("unshare", libc.unshare(flag), ctypes.get_errno())
        p = subprocess.run(["unshare", "-U", "-r", "id"], capture_output=True, text=True)
        print("unshare-cli", p.returncode, p.stdout.strip())
    """)
    assert r.stdout.count("unshare -1") == 3, r
    assert "uid=0" not in r.stdout


def test_19_no_inherited_file_descriptors(tmp_path):
    secret = tmp_path / "fd-secret"
    secret.write_text("FD-SECRET-77")
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        r = run("""
            import os
            print("fds", sorted(int(f) for f in os.listdir("/proc/self/fd")))
            for n in range(3, 64):
                try:
                    print("LEAK", os.pread(n, 64, 0))
                except OSError:
                    pass
        """)
    finally:
        os.close(fd)
    assert "FD-SECRET" not in r.stdout and "LEAK" not in r.stdout, r
    fds = eval(r.stdout.split("fds ", 1)[1].splitlines()[0])
    assert fds[:3] == [0, 1, 2] and len(fds) <= 4  # 0-2 plus the listdir handle


def test_20_cpu_burner_and_output_flood_are_stopped():
    r = run("while True: pass", cpu_s=1, timeout_s=30)
    assert r.limit_hit == "cpu" and r.wall_s < 15, r
    if r.backend == "bwrap":  # Docker reports no CPU time
        assert r.cpu_s is not None and 0.8 < r.cpu_s < 2.5, r
    r = run("while True: print('y' * 1000)", max_output_kb=64, timeout_s=10)
    assert r.limit_hit == "output" and r.stdout_truncated and len(r.stdout) == 64 * 1024, r


def test_21_no_host_devices_or_sysfs():
    r = run("""
        import os
        print("dev", sorted(os.listdir("/dev")))
        print("sys", os.path.exists("/sys/class"), os.path.exists("/dev/vda"), os.path.exists("/dev/mem"))
        try:
            open("/dev/kmsg").read(1); print("KMSG")
        except OSError:
            print("no kmsg")
    """)
    assert "sys False False False" in r.stdout and "no kmsg" in r.stdout, r
    devs = eval(r.stdout.split("dev ", 1)[1].splitlines()[0])
    assert set(devs) <= {"console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm",
                         "stderr", "stdin", "stdout", "tty", "urandom", "zero"}


def test_22_fork_limit_also_holds_for_a_non_root_caller(sandbox_backend):
    """The other path: as a normal user there is no cgroup; RLIMIT_NPROC inside the user namespace holds."""
    import sys
    import sysconfig

    if sandbox_backend != "bwrap":
        pytest.skip("bwrap's non-root path (RLIMIT_NPROC in a user namespace); a Docker container's pids "
                    "cgroup is the same for any caller")
    if os.geteuid() != 0:
        pytest.skip("already running as a normal user: every other test here exercises this path")
    system_py = Path("/usr/bin/python3")
    if not shutil.which("setpriv") or not system_py.exists():
        pytest.skip("needs setpriv and /usr/bin/python3 to act as uid 65534 (this venv's Python lives under /root)")
    ver = subprocess.run([system_py, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    if ver.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(f"/usr/bin/python3 is {ver.stdout.strip()}, not {sys.version_info[:2]}: cannot load this venv")
    import stat

    import evotrainer
    pkg = Path(evotrainer.__file__).resolve().parent
    closed = [d for d in (pkg, *pkg.parents) if not d.stat().st_mode & stat.S_IXOTH]
    if closed:  # e.g. a checkout inside `mktemp -d` (mode 0700): uid 65534 cannot import this package at all
        pytest.skip(f"uid 65534 cannot reach this checkout: {closed[0]} is not world-searchable")
    marker = uuid.uuid4().hex
    script = textwrap.dedent(f"""
        import site
        site.addsitedir({sysconfig.get_paths()["purelib"]!r})
        from evotrainer.sandbox import run_in_sandbox, sandbox_info
        print(sandbox_info()["process_limit"])
        r = run_in_sandbox(code='''
        import os, time
        n = 0
        for i in range(200):
            try:
                if os.fork() == 0:
                    time.sleep(30); os._exit(0)
                n += 1
            except OSError:
                break
        print("forked", n, os.getuid())
        ''', max_procs=16, timeout_s=20, env={{"ESCAPE_MARKER": "{marker}"}})
        print(r.stdout, r.backend)
    """)
    p = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", str(system_py), "-c",
                        script], capture_output=True, text=True, timeout=120, cwd="/tmp",
                       env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split()
    assert "RLIMIT_NPROC in a user namespace" in p.stdout and "bwrap" in lines
    forked = int(lines[lines.index("forked") + 1])
    # 16 processes: bwrap's init, the launcher and the program take 3, so at most 13 children
    assert 0 < forked <= 13 and "65534" in lines, p.stdout
    assert strays_after(marker) == []  # the 30 s sleepers died with the sandbox


def test_23_no_setuid_file_is_left_in_a_bound_work_dir(tmp_path):
    """As host root, files the sandbox writes into a caller's work dir are root-owned on the host and
    the owner may chmod u+s without capabilities: the sandbox must strip those bits afterwards."""
    r = run_in_sandbox(["sh", "-c", "cp /bin/sh ./rootsh && chmod 6755 ./rootsh && mkdir -p d && "
                        "cp /bin/sh d/sh2 && chmod 4755 d/sh2 && ls -l rootsh d/sh2"], workdir=tmp_path)
    assert r.ok and r.stdout.count("-rws") == 2, r  # inside, the bits were set
    for f in (tmp_path / "rootsh", tmp_path / "d" / "sh2"):
        assert f.stat().st_mode & 0o6000 == 0, oct(f.stat().st_mode)  # host: no setuid / setgid file left
        assert f.stat().st_mode & 0o777 == 0o755


def test_24_kernel_tunables_are_read_only():
    """As host root the sandbox uid is host uid 0, which sysctl checks treat as root: /proc/sys must be read-only.
    Only open(O_WRONLY) is tried, so a regression cannot change the host. (Docker 20.10 left /proc/pressure/*
    writable to the container user: the Docker backend now sends it in ReadonlyPaths.)"""
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    r = run("""
        import os, stat
        null = os.stat("/dev/null").st_rdev
        for p in ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/hostname",
                  "/proc/sysrq-trigger", "/proc/pressure/cpu"]:
            st = os.stat(p) if os.path.exists(p) else None
            if st and stat.S_ISCHR(st.st_mode) and st.st_rdev == null:  # Docker's MaskedPaths (S-R11): writes go nowhere
                print("denied", p, "masked")
                continue
            try:
                os.close(os.open(p, os.O_WRONLY)); print("WRITABLE", p)
            except OSError as e:
                print("denied", p, e.errno)
    """)
    assert "WRITABLE" not in r.stdout and r.stdout.count("denied") == 5, r
    assert "masked" not in r.stdout or (r.backend == "docker" and r.stdout.count("masked") == 1), r
    # EROFS under bwrap (the sandbox uid is host uid 0 there, so only the read-only mount stops it); under Docker
    # uid 65534 is host uid 65534 and the file's mode refuses first (EACCES), the mount is read-only too
    assert "denied /proc/sys/kernel/core_pattern 30" in r.stdout or (
        r.backend == "docker" and "denied /proc/sys/kernel/core_pattern 13" in r.stdout), r
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before  # host unchanged


def test_25_keyrings_bpf_perf_and_io_uring_are_refused():
    """Root's kernel keys are owner-readable by host uid 0; seccomp refuses the key syscalls and friends.
    (Docker 20.10's default profile allows io_uring_setup: the Docker backend stacks bwrap's filter on it.)"""
    keys_before = Path("/proc/keys").read_text() if Path("/proc/keys").exists() else ""
    r = run("""
        import ctypes, platform
        libc = ctypes.CDLL(None, use_errno=True)
        nr = {"x86_64": dict(add_key=248, request_key=249, keyctl=250, bpf=321, perf_event_open=298,
                             userfaultfd=323, io_uring_setup=425),
              "aarch64": dict(add_key=217, request_key=218, keyctl=219, bpf=280, perf_event_open=241,
                              userfaultfd=282, io_uring_setup=425)}[platform.machine()]
        for name, n in nr.items():
            print(name, libc.syscall(n, 0, 0, 0, 0, 0), ctypes.get_errno())
        try:  # masked with /dev/null on a nodev mount where the host has it: unreadable
            keys = open("/proc/keys").read()
        except OSError:
            keys = ""
        print("keys-visible", len([l for l in keys.splitlines() if l.strip()]))
        print("seccomp", open("/proc/self/status").read().split("Seccomp:")[1].split()[0])
    """)
    assert r.exit_code == 0, r
    for name in ("add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup"):
        assert f"{name} -1 1\n" in r.stdout, (name, r.stdout)  # EPERM from the filter
    assert "seccomp 2" in r.stdout  # filter mode
    # host unchanged: no key was added, other than the session keyrings that any process starting a session (another
    # test's container, a login) makes and drops meanwhile (/proc/keys is host-wide)
    keys_after = Path("/proc/keys").read_text() if Path("/proc/keys").exists() else ""
    added = [ln for ln in set(keys_after.splitlines()) - set(keys_before.splitlines())
             if not (len(ln.split()) > 8 and ln.split()[7] == "keyring"
                     and ln.split()[8].startswith(("_ses", "_uid_ses.", "_uid.")))]
    assert added == [], added


def test_26_the_host_resolver_is_not_visible():
    """With network none Docker 20.10 still copied the host's /etc/resolv.conf (its nameservers) into the
    container; bwrap binds no /etc/resolv.conf at all."""
    conf = Path("/etc/resolv.conf")
    host = [ln for ln in conf.read_text().splitlines() if ln.split()[:1] == ["nameserver"]] if conf.is_file() else []
    r = run("""
        import os
        for p in ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf", "/run/resolvconf/resolv.conf"):
            try:
                print(p, repr(open(p).read()))
            except OSError as e:
                print(p, "absent", e.errno)
    """)
    assert r.exit_code == 0 and r.stdout.count("/resolv.conf") == 3, r
    assert not [ln for ln in host if ln in r.stdout], (host, r.stdout)


def test_27_vsock_is_refused_and_ordinary_sockets_still_open():
    """AF_VSOCK has no network namespace: before the fix a bwrap-sandboxed program listened on the host VM's
    vsock port CID_ANY:40123 (the host's own bind of it then failed with EADDRINUSE; review 3, S-R1). The seccomp
    filter refuses socket(AF_VSOCK) (as Docker's default profile does); AF_INET still opens (AF_UNIX is refused since
    review 14, S-R14: see the test below)."""
    port = 40000 + os.getpid() % 20000
    r = run(f"""
        import errno, socket
        for fam, kind in ((40, socket.SOCK_STREAM), (40, socket.SOCK_DGRAM)):
            try:
                s = socket.socket(fam, kind)
                s.bind((0xFFFFFFFF, {port}))
                s.listen(1)
                print("vsock LISTENING")
            except OSError as e:
                print("vsock", errno.errorcode.get(e.errno, e.errno))
        for fam in (socket.AF_INET,):
            socket.socket(fam, socket.SOCK_STREAM).close()
            print("ok", fam)
    """)
    assert r.exit_code == 0, r
    assert r.stdout.count("vsock EPERM\n") == 2, r.stdout
    assert f"ok {int(socket.AF_INET)}\n" in r.stdout, r.stdout
    if hasattr(socket, "AF_VSOCK"):  # host unchanged: the port is still free here
        try:
            with socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as s:
                s.bind((0xFFFFFFFF, port))
        except OSError as e:
            assert e.errno != 98, "the sandbox left a vsock listener on the host's port"


def test_28_no_global_proc_file_opens_for_writing():
    """Review 9 (E-R9): as host root the bwrap sandbox uid is host uid 0, and a fresh /proc left /proc/irq/*
    (37 files: the sandbox changed ``default_smp_affinity`` of the host) and /proc/bus/pci/* open for writing.
    Every regular file under /proc outside the per-process entries (``<pid>``, ``self``, ``thread-self``; ``net``
    is the sandbox's own namespace) is tried with open(O_WRONLY) only, so a regression cannot change the host."""
    affinity = Path("/proc/irq/default_smp_affinity")
    before = affinity.read_text() if affinity.exists() else None
    r = run("""
        import os
        tried, writable = 0, []
        for root, dirs, files in os.walk("/proc"):
            if root == "/proc":
                dirs[:] = [d for d in dirs if not d.isdigit() and d not in ("self", "thread-self", "net")]
            for f in files:
                p = os.path.join(root, f)
                if not os.path.isfile(p) or os.path.islink(p):
                    continue
                tried += 1
                try:
                    os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY))
                    writable.append(p)
                except OSError:
                    pass
        print("tried", tried)
        print("writable", len(writable), *writable[:40])
    """, timeout_s=120)
    assert r.exit_code == 0, r
    tried = int(r.stdout.split("tried ")[1].split()[0])
    assert tried > 200, r.stdout  # the sweep saw /proc/sys at least (thousands of files on a usual kernel)
    assert "writable 0" in r.stdout, r.stdout
    if before is not None:
        assert affinity.read_text() == before  # host unchanged


def test_29_no_root_only_global_proc_file_reads_host_state():
    """As host root the bwrap sandbox uid is host uid 0, so root-only (0400) /proc files were readable though no
    unprivileged host user can read them: /proc/kpagecount, kpageflags, kpagecgroup (the host's physical page
    layout), vmallocinfo (physical addresses of kernel mappings), slabinfo, pagetypeinfo. Every regular file under
    /proc outside the per-process entries and /proc/sys (read-only sysctls: configuration, the sandbox's own network
    namespace) whose mode gives group and others no read must read nothing (masked with /dev/null) or refuse."""
    r = run("""
        import os, stat
        tried, read = 0, []
        for root, dirs, files in os.walk("/proc"):
            if root == "/proc":
                dirs[:] = [d for d in dirs if not d.isdigit() and d not in ("self", "thread-self", "net", "sys")]
            for f in files:
                p = os.path.join(root, f)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) and not stat.S_ISCHR(st.st_mode):
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_mode & 0o044:
                    continue  # world- or group-readable: what any host user sees
                tried += 1
                try:
                    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
                except OSError:
                    continue
                try:
                    n = len(os.read(fd, 4096))
                except OSError:
                    n = 0
                os.close(fd)
                if n:
                    read.append(f"{p}:{n}")
        print("tried", tried)
        print("read", len(read), *read)
    """, timeout_s=120)
    assert r.exit_code == 0, r
    assert int(r.stdout.split("tried ")[1].split()[0]) >= 1, r.stdout  # kcore and kmsg at least are root-only
    assert "read 0" in r.stdout, r.stdout


HOST_STATE_PROC = ("/proc/pressure/cpu", "/proc/pressure/io", "/proc/pressure/memory", "/proc/interrupts",
                   "/proc/softirqs", "/proc/diskstats", "/proc/cmdline", "/proc/sys/kernel/random/boot_id")


def test_29b_host_state_in_proc_reads_empty():
    """Review 11 (S-R11): sandboxed code read the host's pressure stall figures (/proc/pressure/*), interrupt and
    disk I/O counters (review 12, S-R12: and the softirq counts, the same signal), the host kernel's command line
    and its boot id (a stable host identifier). Under bwrap each
    reads as an empty read-only file now, the boot id as a fixed one; under Docker each is masked with /dev/null
    (reads empty, a write goes nowhere). /proc/loadavg, /proc/stat and /proc/vmstat still read (os.getloadavg and
    psutil need them)."""
    from evotrainer.sandbox.bwrap import MASKED_BOOT_ID

    present = [p for p in HOST_STATE_PROC if Path(p).is_file()]
    assert Path("/proc/sys/kernel/random/boot_id").read_text() != MASKED_BOOT_ID
    r = run(f"""
        import os
        for p in {present!r}:
            print(p, repr(open(p).read()))
            try:
                os.close(os.open(p, os.O_WRONLY)); print("WRITABLE", p, os.stat(p).st_rdev == os.stat("/dev/null").st_rdev)
            except OSError as e:
                print("denied", p, e.errno)
        print("loadavg", len(os.getloadavg()), open("/proc/loadavg").read().count(" ") >= 4)
        print("stat", open("/proc/stat").read().startswith("cpu "), "vmstat", "nr_free_pages" in open("/proc/vmstat").read())
    """)
    assert r.exit_code == 0, r
    boot_id = MASKED_BOOT_ID if r.backend == "bwrap" else ""
    expected = [f"{p} {(boot_id if p.endswith('boot_id') else '')!r}" for p in present]
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("/proc/")] == expected, r.stdout
    if r.backend == "bwrap":  # a read-only bind of a 0444 file: its mode refuses first (EACCES; no capabilities)
        assert [ln for ln in r.stdout.splitlines() if ln.startswith(("denied", "WRITABLE"))] == [
            f"denied {p} 13" for p in present], r.stdout
    else:  # Docker's MaskedPaths: /dev/null itself, so a write reaches nothing of the host
        assert r.stdout.count("WRITABLE") == len(present) and r.stdout.count(" True\n") >= len(present), r.stdout
        assert "False" not in r.stdout, r.stdout
    assert "loadavg 3 True\nstat True vmstat True\n" in r.stdout, r.stdout


def test_an_input_or_work_dir_holding_a_socket_or_fifo_is_refused_and_unix_sockets_are_not_opened(tmp_path):
    """Review 14 S-R14: through `--input` a folder holding a host service's unix socket and a FIFO a host process read,
    the sandboxed program connected to the service (sent and read a reply: with docker.sock, root on the host) and
    wrote 27 bytes into the FIFO; a read-only bind stops neither. An input or work dir that is or holds a socket, a
    FIFO or a device is now refused before the run, naming the path, and socket(AF_UNIX) is refused inside
    (a socket made in a caller's folder while the run lasts); the host listener and FIFO get nothing."""
    import select

    from evotrainer.sandbox.base import SandboxError

    grant = tmp_path / "grant"
    (grant / "sub").mkdir(parents=True)
    (grant / "ok.txt").write_text("x")
    sock_path = grant / "sub" / "service.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(1)
    listener.setblocking(False)
    try:
        with pytest.raises(SandboxError, match=f"inputs\\['g'\\]={grant}: {sock_path} is a unix socket, which a "
                                               "sandboxed program could use to reach a host process"):
            run_in_sandbox(code="print(1)", inputs={"g": grant})
        with pytest.raises(SandboxError, match=f"workdir={grant}: {sock_path} is a unix socket"):
            run_in_sandbox(code="print(1)", workdir=grant)
        (tmp_path / "link").symlink_to(grant)  # a link to the folder is the folder
        with pytest.raises(SandboxError, match="is a unix socket"):
            run_in_sandbox(code="print(1)", inputs={"g": tmp_path / "link"})
        sock_path.unlink()
        fifo = grant / "control.fifo"
        os.mkfifo(fifo)
        with pytest.raises(SandboxError, match=f"{fifo} is a FIFO"):
            run_in_sandbox(code="print(1)", inputs={"g": grant})
        fifo.unlink()
        r = run_in_sandbox(code=textwrap.dedent("""
            import errno, socket
            try:
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                print("unix OPENED")
            except OSError as e:
                print("unix", errno.errorcode.get(e.errno, e.errno))
            a, b = socket.socketpair()
            a.sendall(b"hi")
            print("pair", b.recv(2).decode())
            for kind in (socket.SOCK_DGRAM, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                         socket.SOCK_RAW, socket.SOCK_SEQPACKET):  # review 16 S-R16: a raw pair is a datagram pair
                try:  # review 15 S-R15: a datagram pair may sendto() any pathname datagram socket it sees
                    socket.socketpair(socket.AF_UNIX, kind)
                    print("dgram pair OPENED")
                except OSError as e:
                    print("dgram pair", errno.errorcode.get(e.errno, e.errno))
            print(open("/evidence/g/ok.txt").read())
        """), inputs={"g": grant})
        assert r.exit_code == 0 and r.stdout == "unix EPERM\npair hi\n" + "dgram pair EPERM\n" * 4 + "x\n", r
        assert select.select([listener], [], [], 0)[0] == []  # nobody connected
    finally:
        listener.close()


def test_a_fifo_made_in_an_input_folder_while_the_run_lasts_cannot_be_written(tmp_path, sandbox_backend):
    """Review 15 S-R15 (second half): the walk before the run cannot see a FIFO that a host process makes in a granted
    input folder while the run lasts, and a read-only bind does not stop open(O_WRONLY) of a FIFO: the host reader
    got the program's 21 bytes. Under bwrap the launcher now restricts writes with Landlock to the work dir, /tmp,
    /dev/shm, /dev's nodes and /proc: the open is EACCES (13) and the reader gets nothing, while those stay
    writable (a file in the work dir and /tmp, a FIFO made in /tmp, /dev/null)."""
    from evotrainer.sandbox.bwrap import landlock_abi

    if sandbox_backend != "bwrap" or landlock_abi() < 1:
        pytest.skip("Landlock is the bwrap backend's, on kernels that have it (sandbox info: write_paths)")
    grant = tmp_path / "grant"
    grant.mkdir()
    (grant / "a.txt").write_text("hi")
    fifo, got = grant / "late.fifo", []

    def host_service():
        time.sleep(1.0)
        os.mkfifo(fifo)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        end = time.time() + 5
        while time.time() < end and not got:
            try:
                b = os.read(fd, 100)
            except BlockingIOError:
                b = b""
            if b:
                got.append(b)
            time.sleep(0.05)
        os.close(fd)

    t = threading.Thread(target=host_service)
    t.start()
    r = run("""
        import os, time
        p = "/evidence/g/late.fifo"
        for _ in range(200):
            if os.path.exists(p):
                break
            time.sleep(0.05)
        time.sleep(0.3)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"fifo from the sandbox")
            print("WROTE")
        except OSError as e:
            print("fifo", e.errno)
        open("/sandbox/work/x", "w").write("ok")
        open("/tmp/y", "w").write("ok")
        os.mkfifo("/tmp/own.fifo")
        open("/dev/null", "w").write("x")
        print("writable ok")
    """, inputs={"g": grant}, timeout_s=30)
    t.join()
    assert r.exit_code == 0 and r.stdout == "fifo 13\nwritable ok\n", r
    assert got == []
