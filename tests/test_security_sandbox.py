"""Security suite: sandboxed code plants links, special files, long paths and deep trees
for host-side code to trip on, and tries to exceed the per-run limits. Every probe asserts the host
is unchanged afterwards (content, mode and owner of the files it could aim at; no new files).

Links are planted the way sandboxed code would: one probe plants them from inside the sandbox
(library code imported by ``run_tests``); the others write the same links straight into the
repository, which is equivalent (the sandbox can write any link target string into its work dir,
and as host root its files are host root's) and saves a sandbox start per probe.

Runs through bubblewrap and through a real Docker daemon (tests/sandbox_backends.py); a backend that
cannot run here skips with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_swe_tasks import make_git_task

from evotrainer.recipe import ToolUseSpec
from evotrainer.rl_backend.swe.env import SweEnv
from evotrainer.sandbox import SandboxError, run_in_sandbox, sandbox_info

REPO = Path(__file__).resolve().parent.parent
SECRET = "TOPSECRET-7f3a"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"


# every test here runs once per backend that can run on this machine (tests/sandbox_backends.py)
pytestmark = pytest.mark.usefixtures("sandbox_backend")


def call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def snapshot(root: Path) -> dict[str, tuple]:
    """(kind, sha256 or link target, mode, uid, gid) of everything under ``root`` (links not followed)."""
    out = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        body = (os.readlink(p) if stat.S_ISLNK(st.st_mode) else
                hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else "")
        out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), body, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return out


@pytest.fixture
def host(tmp_path):
    """A host folder the sandbox must never reach: a 0600 secret, a folder, a file a grader could overwrite."""
    h = tmp_path / "host"
    (h / "dir").mkdir(parents=True)
    (h / "secret.txt").write_text(f"{SECRET} root-only line\n")
    (h / "secret.txt").chmod(0o600)
    (h / "dir" / "keep.txt").write_text(f"{SECRET} in a folder\n")
    (h / "victim.py").write_text("def add(a, b):\n    return a - b\n# host file, must stay as is\n")
    return h


@pytest.fixture
def swe(tmp_path, host):
    task, repos = make_git_task(tmp_path)
    env = SweEnv(task, tmp_path / "ep", ToolUseSpec(max_turns=50, tool_budget=50), repos_root=repos)
    env.reset()
    before = snapshot(host)
    yield env
    assert snapshot(host) == before, "a host file changed or a new one appeared"


# --- 1. links and special files through every SWE tool and grade --------------------------------
def test_links_planted_by_tests_never_land_and_search_does_not_follow_planted_ones(swe, host):
    # the policy's library code plants links when pytest imports it inside the sandbox: the run works on a
    # copy made inside the sandbox, so they never reach the repo (before: they landed there)
    plant = (f"import os\nfor src, dst in (({str(host / 'secret.txt')!r}, 'LEAK.txt'), ({str(host / 'dir')!r}, "
             f"'leakdir')):\n    os.path.lexists(dst) or os.symlink(src, dst)\n")
    swe.step(call("edit", path="calc.py", old="def add", new=plant + "def add"))
    obs = swe.step(call("run_tests", tests=["tests/test_calc.py::test_zero"]))
    assert "1 passed" in obs, obs  # the planting code ran (test_zero imports calc)
    assert not os.path.lexists(swe.repo / "LEAK.txt") and not os.path.lexists(swe.repo / "leakdir")
    # links in the repo however they got there (an older run, a snapshot): search never follows them
    (swe.repo / "LEAK.txt").symlink_to(host / "secret.txt")
    (swe.repo / "leakdir").symlink_to(host / "dir")
    for path in (".", "LEAK.txt", "leakdir"):
        obs = swe.step(call("search", pattern="TOPSECRET", path=path))
        assert SECRET not in obs, obs


def test_view_refuses_links_fifos_and_devices(swe, host):
    (swe.repo / "LEAK.txt").symlink_to(host / "secret.txt")
    (swe.repo / "leakdir").symlink_to(host / "dir")
    (swe.repo / "sub").mkdir()
    (swe.repo / "sub" / "up").symlink_to(host)
    os.mkfifo(swe.repo / "pipe.py")
    (swe.repo / "zero.py").symlink_to("/dev/zero")
    for path in ("LEAK.txt", "leakdir", "sub/up/secret.txt", "sub/up/dir", "pipe.py", "zero.py"):
        obs = _within(5, swe.step, call("view", path=path))
        assert obs.startswith("[error]") and SECRET not in obs and "keep.txt" not in obs, (path, obs)
    obs = _within(5, swe.step, call("search", pattern="x", path="."))  # the FIFO must not block the walk
    assert SECRET not in obs


def test_edit_does_not_write_through_a_file_or_folder_link(swe, host):
    (swe.repo / "calc.py").unlink()
    (swe.repo / "calc.py").symlink_to(host / "victim.py")
    (swe.repo / "pkg").symlink_to(host)
    obs = swe.step(call("edit", path="calc.py", old="return a - b", new="return a + b")
                   + call("edit", path="pkg/victim.py", old="return a - b", new="return a + b"))
    assert obs.count("[error]") == 2, obs
    assert swe.stats.edits == 0


def test_run_tests_refuses_targets_behind_links(swe, host):
    (swe.repo / "tlink").symlink_to(host / "dir")
    obs = swe.step(call("run_tests", tests=["tlink/keep.txt"]))
    assert obs.startswith("[error]") and swe.stats.test_runs == 0, obs


def test_grade_does_not_overwrite_through_a_test_file_link(swe, host):
    (swe.repo / "calc.py").write_text(FIXED)
    test = swe.repo / "tests" / "test_calc.py"
    test.unlink()
    test.symlink_to(host / "victim.py")
    out = swe.grade("all")
    # the right code, but a test file replaced: counted as a test edit, so 0, and the hidden tests
    # still ran from the originals (3 FAIL_TO_PASS pass, test_hidden included from test_patch)
    assert out.test_files_edited == ["tests/test_calc.py"] and out.swe_tests == 0.0 and out.f2p_passed == 3


def test_grade_creates_nothing_through_a_tests_folder_link(swe, host):
    (swe.repo / "calc.py").write_text(FIXED)
    import shutil

    shutil.rmtree(swe.repo / "tests")
    (swe.repo / "tests").symlink_to(host / "dir")
    out = swe.grade("all")
    assert out.f2p_passed == 3 and not out.resolved  # graded on the restored originals, the edit counts


def test_grade_with_a_fifo_for_a_test_file_does_not_hang(swe, host):
    (swe.repo / "calc.py").write_text(FIXED)
    test = swe.repo / "tests" / "test_calc.py"
    test.unlink()
    os.mkfifo(test)
    out = _within(60, swe.grade, "all")
    assert out.test_files_edited == ["tests/test_calc.py"] and out.f2p_passed == 3


def _within(seconds: float, fn, *args):
    box: list = []
    t = threading.Thread(target=lambda: box.append(fn(*args)), daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"{fn.__name__} did not return within {seconds} s (blocked on a FIFO?)"
    return box[0]


# --- 2. the work-dir cleanup: long paths, deep trees, modes, fail closed -------------------------
def _setid_files(root: Path) -> list[str]:
    """Setuid/setgid regular files under ``root``: an fd-based iterative walk (no PATH_MAX, no recursion)."""
    found, stack = [], [(os.open(root, os.O_RDONLY | os.O_DIRECTORY), "")]
    while stack:
        fd, rel = stack.pop()
        try:
            for e in os.scandir(fd):
                st = os.stat(e.name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append((os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd),
                                  f"{rel}/{e.name}"[:200]))
                elif stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    found.append(f"{rel}/{e.name}")
        finally:
            os.close(fd)
    return found


@pytest.fixture
def deep_work(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    yield work
    # pytest's own cleanup (shutil.rmtree) recurses and fails at 1,100 levels; GNU rm does not
    subprocess.run(["rm", "-rf", str(work)], check=True)


MAKE_TREE = """
import os, shutil
for _ in range({depth}):
    os.mkdir({name!r}); os.chdir({name!r})
shutil.copy("/usr/bin/id", "sid"); os.chmod("sid", 0o4755)
print("PLANTED", len(os.getcwd()))
"""


@pytest.mark.parametrize("depth,name", [(25, "d" * 200), (1100, "d")], ids=["path_max", "1100_deep"])
def test_setuid_file_past_path_max_or_deep_is_stripped(deep_work, depth, name):
    work = deep_work
    r = run_in_sandbox(code=MAKE_TREE.format(depth=depth, name=name), workdir=work, timeout_s=60)
    assert "PLANTED" in r.stdout, r.stderr[-500:]
    # 25 x 201 chars = 5,025 > PATH_MAX 4,096; 1,100 levels > Python's recursion limit of 1,000
    assert int(r.stdout.split()[-1]) > (4096 if depth == 25 else 2200)
    assert _setid_files(work) == []


def test_work_dir_modes_the_sandbox_set_are_reset(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o750)
    r = run_in_sandbox(code="import os\nos.mkdir('sub')\nos.chmod('sub', 0o2777)\nopen('f', 'w').close()\n"
                            "os.chmod('f', 0o6777)\nos.chmod('.', 0o777)\n", workdir=work)
    assert r.ok, r.stderr
    assert stat.S_IMODE(work.stat().st_mode) == 0o750  # as before the run
    assert stat.S_IMODE((work / "sub").stat().st_mode) == 0o775  # 2777 less setgid and o+w
    assert stat.S_IMODE((work / "f").stat().st_mode) == 0o775  # 6777 less setuid, setgid and o+w


def test_a_work_dir_that_cannot_be_cleaned_is_an_error(tmp_path):
    if subprocess.run(["chattr", "--help"], capture_output=True).returncode not in (0, 1):
        pytest.skip("chattr not installed (e2fsprogs)")
    work = tmp_path / "work"
    work.mkdir()
    sid = work / "sid"
    sid.write_bytes(Path("/usr/bin/id").read_bytes())
    sid.chmod(0o4755)
    # immutable (chattr +i): not even root can clear the setuid bit, so the cleanup must fail closed
    if subprocess.run(["chattr", "+i", str(sid)], capture_output=True).returncode != 0:
        pytest.skip(f"chattr +i not supported on the file system of {tmp_path}")
    try:
        with pytest.raises(SandboxError, match=r"could not clean the work dir .*sid"):
            run_in_sandbox(code="print('done')", workdir=work)
    finally:
        subprocess.run(["chattr", "-i", str(sid)], check=True)


def test_a_hard_link_to_an_outside_file_is_not_written_and_every_owner_comes_back(tmp_path):
    """Docker as root lent the whole work dir to uid 65534 by chown and gave it all back to root: a uid-1000 file
    outside the work dir, hard-linked into it (cp -al, git clone --local, a uv cache), was appended to by the
    sandbox and came back root's, and so did a uid-1000 file of the tree."""
    if os.geteuid() != 0:
        pytest.skip("only a root caller's work dir is lent to the sandbox uid")
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")
    work = tmp_path / "work"
    work.mkdir()
    os.link(outside, work / "link.txt")
    (work / "mine.txt").write_text("of uid 1000\n")
    for p in (outside, work / "mine.txt"):
        os.chown(p, 1000, 1000)
        p.chmod(0o644)
    r = run_in_sandbox(code="""
        import os
        try:
            open("link.txt", "a").write("POISONED\\n"); print("WROTE")
        except OSError as e:
            print("denied", e.errno)
        os.rename("mine.txt", "renamed.txt")
        open("made.txt", "w").write("new")
        print("done")
    """.replace("\n        ", "\n"), workdir=work)
    assert "denied 13" in r.stdout and "done" in r.stdout, r
    assert outside.read_text() == "original\n"  # host: the outside file unchanged, its owner too
    assert (outside.stat().st_uid, outside.stat().st_gid, stat.S_IMODE(outside.stat().st_mode)) == (1000, 1000, 0o644)
    st = (work / "renamed.txt").stat()  # a renamed entry keeps its owner
    assert (st.st_uid, st.st_gid) == (1000, 1000)
    st = (work / "made.txt").stat()  # a new one is the work dir's owner's
    assert (st.st_uid, st.st_gid) == (os.stat(work).st_uid, os.stat(work).st_gid) == (0, 0)


def test_a_hard_link_to_a_file_of_the_caller_outside_the_work_dir_is_never_written(tmp_path):
    """bwrap maps the sandbox uid to the caller's: through a hard link in the work dir to a caller-owned file
    outside it (cp -al, git clone --local, a uv cache), the sandbox appended to that file and chmod-ed it 0755.
    bwrap now refuses the run, naming the entry; Docker runs it with the file kept out of the loan (denied)."""
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")
    outside.chmod(0o644)
    work = tmp_path / "work"
    work.mkdir()
    os.link(outside, work / "link.txt")
    (work / "own.txt").write_text("a file of the work dir only\n")
    code = """
        import os
        try:
            open("link.txt", "a").write("POISONED\\n"); print("WROTE")
        except OSError as e:
            print("denied", e.errno)
        try:
            os.chmod("link.txt", 0o4777); print("CHMOD")
        except OSError as e:
            print("chmod denied", e.errno)
    """.replace("\n        ", "\n")
    backend = sandbox_info()["backend"]
    if backend == "bwrap":
        with pytest.raises(SandboxError) as err:
            run_in_sandbox(code=code, workdir=work)
        assert "'link.txt' is a hard link to a file outside the work dir" in str(err.value)
        assert "own.txt" not in str(err.value)
    else:
        r = run_in_sandbox(code=code, workdir=work)
        assert "WROTE" not in r.stdout and "CHMOD" not in r.stdout, r
    assert outside.read_text() == "original\n"
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644


# --- 3. limits per run ---------------------------------------------------------------------------
def test_dev_is_a_capped_tmpfs():
    r = run_in_sandbox(code="""
        import os
        n = 0
        try:
            for i in range(12):
                with open(f"/dev/fill{i}", "wb") as f:
                    for _ in range(8):
                        f.write(b"x" * (1 << 20)); n += 1
        except OSError as e:
            print("STOPPED", e.errno)
        print("MIB", n)
    """.replace("\n        ", "\n"), disk_mb=32, max_file_mb=64)
    mib = int(r.stdout.split()[-1])
    # 12 x 8 MiB = 96 MiB tried: bwrap's /dev is read-only (EROFS, 30) on a 1 MiB tmpfs; Docker's is
    # its own 64 MiB tmpfs (size=65536k), root-owned (EACCES, 13 for uid 65534) or full (ENOSPC, 28)
    cap = 1 if r.backend == "bwrap" else 64
    assert any(f"STOPPED {e}" in r.stdout for e in (13, 28, 30)) and mib <= cap, r.stdout + r.stderr


def test_no_command_line_in_the_sandbox_names_a_host_path(tmp_path):
    # bwrap's own argv held every bind's host source (the temp folder, the work dir, the inputs): pid 1 inside
    # is bwrap's reaper, so /proc/1/cmdline showed them; its options now come through --args from a memfd
    work = tmp_path / "HOSTWORK-9c1e"
    work.mkdir()
    (tmp_path / "evidence.txt").write_text("x")
    r = run_in_sandbox(code="""
        import os
        seen = []
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    seen.append(open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace"))
                except OSError:
                    pass
        print(len(seen), "|".join(seen))
    """.replace("\n        ", "\n"), workdir=work, inputs={"e.txt": tmp_path / "evidence.txt"})
    assert r.exit_code == 0 and int(r.stdout.split()[0]) >= 2, r.stdout + r.stderr  # pid 1 and the program at least
    for secret in (str(tmp_path), "HOSTWORK-9c1e", "evotrainer-sandbox-"):
        assert secret not in r.stdout, (secret, r.stdout)


def test_memory_limit_holds_for_the_whole_run_not_per_process():
    # 3 processes x 150 MiB touched = 450 MiB against memory_mb=256 for the run
    r = run_in_sandbox(code="""
        import os, time
        kids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                data = b"\\x01" * (150 << 20)
                time.sleep(3); print("DONE", flush=True); os._exit(0)
            kids.append(pid)
        for k in kids:
            os.waitpid(k, 0)
    """.replace("\n        ", "\n"), memory_mb=256, timeout_s=30)
    # the three 3 s holds overlap, so a child that prints DONE held its 150 MiB beside the others;
    # under the per-run limit at most one of them can (2 x 150 MiB > 256 MiB)
    assert r.stdout.count("DONE") <= 1 and r.limit_hit == "memory", (r.stdout, r.limit_hit, r.stderr[-300:])


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
def test_inode_flood_stops_at_the_tmpfs_inode_cap(where):
    # /dev/shm: Docker's own (shm_size) has no inode cap (40,000 files fitted in a 64 MiB one on Docker 20.10)
    r = run_in_sandbox(code="""
        import os
        n = 0
        try:
            for i in range(30000):
                open(f"WHERE/f{i}", "w").close(); n += 1
        except OSError as e:
            print("STOPPED", e.errno)
        print("FILES", n)
    """.replace("\n        ", "\n").replace("WHERE", where), disk_mb=256, timeout_s=60)
    n = int(r.stdout.split()[-1])
    # one inode per 16 KiB of size cap (mke2fs's default inode_ratio): 256 MiB / 16 KiB = 16,384 inodes
    assert "STOPPED 28" in r.stdout and n < 16384, r.stdout + r.stderr


def test_inotify_instances_of_the_host_user_are_not_taken_by_the_sandbox(tmp_path):
    # review 7: inotify instances are counted per user up the user-namespace chain, 128 in all per host user; a
    # sandboxed program that held 128 made the caller's own inotify_init1 fail with EMFILE while the run lasted
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(work, 0o777)
    result: dict = {}
    code = """
        import ctypes, os, time
        libc = ctypes.CDLL(None, use_errno=True)
        n, err = 0, 0
        for _ in range(200):
            if libc.inotify_init1(0) < 0:
                err = ctypes.get_errno(); break
            n += 1
        print("HELD", n, "ERRNO", err, flush=True)
        open("taken", "w").close()
        time.sleep(4)
    """.replace("\n        ", "\n")
    t = threading.Thread(target=lambda: result.update(r=run_in_sandbox(code=code, workdir=work, timeout_s=30)))
    t.start()
    deadline = time.monotonic() + 25
    while not (work / "taken").exists() and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    fd = libc.inotify_init1(0)  # the host user's, while the sandbox holds what it could take
    errno = ctypes.get_errno()
    if fd >= 0:
        os.close(fd)
    t.join()
    r = result["r"]
    assert (work / "taken").exists(), (r.stdout, r.stderr[-300:])
    assert fd >= 0, f"host inotify_init1 failed with errno {errno} while the sandbox ran: {r.stdout}"
    assert "HELD 0 ERRNO 1" in r.stdout, r.stdout  # refused (EPERM) inside


def test_queued_signals_of_the_host_user_are_not_taken_by_the_sandbox():
    # review 7: queued signals are counted per user up the user-namespace chain against RLIMIT_SIGPENDING; a
    # sandboxed program that queued ~96,000 realtime signals to itself made every sigqueue / timer_create of the
    # caller's user on the host fail with EAGAIN while the run lasted. The run's queue is capped.
    from evotrainer.sandbox.bwrap import SIGPENDING_MAX

    r = run_in_sandbox(code="""
        import ctypes, os, signal
        libc = ctypes.CDLL(None, use_errno=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
        n = 0
        while n < 200000 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)) == 0:
            n += 1
        print("QUEUED", n, "ERRNO", ctypes.get_errno(), flush=True)
    """.replace("\n        ", "\n"), timeout_s=60)
    assert r.stdout.split()[:2] == ["QUEUED", str(SIGPENDING_MAX)] and "ERRNO 11" in r.stdout, (r.stdout, r.stderr[-300:])


def test_info_says_which_limits_hold():
    lim = sandbox_info()["limits"]
    assert {"memory_per_run", "procs_per_run", "cpu_per_run", "tmpfs_size", "tmpfs_inodes", "dev_cap"} <= set(lim)
    for k, v in lim.items():
        assert v.startswith(("enforced:", "NOT enforced:")), (k, v)


# --- 4. signals, stale folders, terminal escapes ---------------------------------------------------
def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "evotrainer.cli", "sandbox", *args]


def _owned(pid: int) -> list[str]:
    """Sandbox temp folders and cgroups (any hierarchy, 6 levels down) named for owner ``pid``."""
    out = [str(p) for p in Path("/tmp").glob(f"evotrainer-sandbox-{pid}.*")]
    for top, dirs, _ in os.walk("/sys/fs/cgroup"):
        if top.count("/") > 9:
            dirs[:] = []
        if os.path.basename(top) == "evotrainer-sandbox":
            out += [os.path.join(top, d) for d in dirs if d.startswith(f"{pid}.")]
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_sandbox_run_leaves_no_folder_or_cgroup(tmp_path, sig):
    prog = tmp_path / "sleep.py"
    prog.write_text("import time\ntime.sleep(60)\n")
    p = subprocess.Popen(_cli("run", str(prog), "--timeout", "60"), cwd=REPO, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not [x for x in Path("/tmp").glob(f"evotrainer-sandbox-{p.pid}.*")] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(Path("/tmp").glob(f"evotrainer-sandbox-{p.pid}.*")), "the run never started"
    time.sleep(1.0)
    p.send_signal(sig)
    p.wait(30)
    if sig == signal.SIGKILL:  # nothing runs on SIGKILL: the next run sweeps what a dead owner left
        run_in_sandbox(code="pass")
    else:
        assert p.returncode != 0
    assert _owned(p.pid) == []
    if sandbox_info()["backend"] == "docker":  # and no container of the killed run is left running
        from evotrainer.sandbox import api as sandbox
        from evotrainer.sandbox.docker import OWNER_LABEL

        left = [c.labels[OWNER_LABEL] for c in sandbox._docker_client().containers.list(
            all=True, filters={"label": OWNER_LABEL})]
        assert not [t for t in left if t.startswith(f"{p.pid}.")], left


def test_text_mode_neutralises_terminal_escape_sequences(tmp_path):
    prog = tmp_path / "esc.py"
    prog.write_text(r"""import sys
sys.stdout.write("a\x1b]52;c;SGVsbG8=\x07b\x1b]0;owned\x07c\x1b[2J\x9b1m\r\x00tab\there\n")
sys.stderr.write("e\x1b[31mred\n")
""")
    r = subprocess.run(_cli("run", str(prog)), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for ch in ("\x1b", "\x07", "\x9b", "\r", "\x00"):
        assert ch not in r.stdout and ch not in r.stderr, repr(ch)
    assert r.stdout == "a\\x1b]52;c;SGVsbG8=\\x07b\\x1b]0;owned\\x07c\\x1b[2J\\x9b1m\\x0d\\x00tab\there\n"
    assert r.stderr.startswith("e\\x1b[31mred\n")


# --- 5. the safe-path helper itself ------------------------------------------------------------------
@pytest.mark.parametrize("kernel", ["openat2", "nofollow_walk"])
def test_safe_open_refuses_links_fifos_and_dotdot_with_and_without_openat2(tmp_path, host, monkeypatch, kernel):
    import evotrainer.sandbox.fs as sfs

    if kernel == "nofollow_walk":
        monkeypatch.setattr(sfs, "_openat2_works", [False])
    (tmp_path / "r" / "a" / "b").mkdir(parents=True)
    (tmp_path / "r" / "a" / "b" / "f").write_text("hi")
    (tmp_path / "r" / "a" / "l").symlink_to(host / "secret.txt")
    (tmp_path / "r" / "a" / "dl").symlink_to(host)
    os.mkfifo(tmp_path / "r" / "a" / "p")
    fd = os.open(tmp_path / "r", os.O_RDONLY | os.O_DIRECTORY)
    try:
        if kernel == "openat2":
            got = sfs._openat2(fd, "a/b/f", os.O_RDONLY, 0)
            assert got is not None, "this kernel (>= 5.6) should have openat2"
            os.close(got)
        assert sfs.read_file(fd, "a/b/f") == b"hi"
        for rel in ("a/l", "a/dl/secret.txt", "a/dl", "a/p"):
            with pytest.raises(sfs.UnsafePathError):
                sfs.read_file(fd, rel)
        with pytest.raises(ValueError, match="goes up"):
            sfs.read_file(fd, "a/../../host/secret.txt")
        with pytest.raises(sfs.UnsafePathError):
            sfs.write_file(fd, "a/dl/victim.py", b"x")
    finally:
        os.close(fd)


def test_copy_and_remove_a_tree_deeper_than_the_recursion_limit(tmp_path):
    import evotrainer.sandbox.fs as sfs

    src = tmp_path / "src"
    src.mkdir()
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    sfs.write_file(fd, "leaf.py", b"x = 1\n", create=True)
    os.close(fd)
    try:
        assert sfs.copy_tree(src, tmp_path / "copy") == 1  # one file at depth 1,100
        rels = [rel for _, _, rel, _ in sfs.walk(tmp_path / "copy")]
        assert len(rels) == 1101 and rels[-1] == "/".join(["d"] * 1100 + ["leaf.py"])  # 2,207 chars
        sfs.remove_tree(tmp_path / "copy")
        sfs.remove_tree(src)
        assert not (tmp_path / "copy").exists() and not src.exists()
    finally:
        subprocess.run(["rm", "-rf", str(src), str(tmp_path / "copy")], check=True)
