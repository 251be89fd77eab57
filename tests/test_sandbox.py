"""The sandbox API: results, mounts, limits, backend choice, Dockerfiles and the CLI."""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evotrainer.sandbox import (
    IMAGES_DIR,
    SandboxError,
    SandboxUnavailable,
    run_in_sandbox,
    sandbox_info,
)
from evotrainer.sandbox import api as sandbox
from evotrainer.sandbox.bwrap import seccomp_filter

IMAGES = IMAGES_DIR


@pytest.fixture
def backend(sandbox_backend) -> str:
    """The backend this test runs through: once bwrap, once a real Docker daemon (tests/sandbox_backends.py)."""
    info = sandbox_info()
    assert info["backend"] == sandbox_backend, info
    return sandbox_backend


def run(code: str, **kw):
    return run_in_sandbox(code=textwrap.dedent(code), **kw)


def test_runs_code_and_reports_the_result(backend):
    r = run("""
        import os, sys
        print(6 * 7)
        print("to stderr", file=sys.stderr)
        print(os.getcwd(), os.environ["HOME"], os.environ["EVOTRAINER_SANDBOX_BACKEND"])
        sys.exit(3)
    """)
    assert r.exit_code == 3 and r.limit_hit is None and not r.ok
    assert r.stdout.splitlines() == ["42", f"/sandbox/work /sandbox/work {backend}"]
    assert r.stderr == "to stderr\n" and r.backend == backend
    # bwrap measures the child's CPU time (Python start-up alone is > 0); docker reports none
    assert r.wall_s > 0 and (r.cpu_s is None if backend == "docker" else r.cpu_s > 0), r


def test_cmd_python_alias_code_placeholder_and_env(backend):
    r = run_in_sandbox(["python", "{code}", "a", "b"], code="import sys, os; print(sys.argv[1:], os.environ['K'])",
                       env={"K": "v"})
    assert r.ok and r.stdout == "['a', 'b'] v\n"
    r = run_in_sandbox(["sh", "-c", "echo $((2 + 3))"])
    assert r.ok and r.stdout == "5\n"


def test_inputs_read_only_at_evidence_and_analyzer_libraries(tmp_path, backend):
    if backend == "docker" and os.environ.get("EVOTRAINER_SANDBOX_PIP") == "0":
        pytest.skip("the analyzer image was built on a local base without pip installs (EVOTRAINER_SANDBOX_PIP=0): "
                    "it has only the base's packages, not pyarrow / duckdb")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"step": [1, 2, 3], "reward": [0.5, 0.25, 1.0]}), tmp_path / "m.parquet")
    r = run("""
        import duckdb, numpy as np, pyarrow.parquet as pq
        t = pq.read_table("/evidence/metrics/m.parquet")
        print(float(np.mean(t.column("reward").to_numpy())))
        print(duckdb.sql("select sum(step) from '/evidence/metrics/m.parquet'").fetchall()[0][0])
    """, inputs={"metrics": tmp_path})
    assert r.ok, r
    assert r.stdout.splitlines() == ["0.5833333333333334", "6"]  # (0.5 + 0.25 + 1.0) / 3; 1 + 2 + 3


def test_workdir_is_private_unless_the_caller_binds_one(tmp_path, backend):
    r = run("open('out.txt', 'w').write('kept'); print(sorted(__import__('os').listdir('.')))", workdir=tmp_path)
    assert r.ok and (tmp_path / "out.txt").read_text() == "kept"
    r = run("import os; print(os.listdir('.')); open('x', 'w').write('gone')")
    assert r.ok and r.stdout == "[]\n"  # a fresh tmpfs each time, discarded afterwards


@pytest.mark.parametrize(("code", "kw", "limit"), [
    ("import time; time.sleep(60)", {"timeout_s": 1}, "timeout"),
    ("while True: pass", {"cpu_s": 1, "timeout_s": 30}, "cpu"),
    ("x = bytearray(4 << 30)", {"memory_mb": 256}, "memory"),
    ("open('f', 'wb').write(b'x' * (3 << 20))", {"max_file_mb": 1}, "file_size"),
    ("print('z' * 100_000)", {"max_output_kb": 4}, "output"),
])
def test_each_limit_is_reported(code, kw, limit, backend):
    r = run(code, **kw)
    assert r.limit_hit == limit and not r.ok, r


def test_a_run_stopped_at_its_timeout_reports_the_cpu_it_used(backend):
    # the kill takes the launcher that measures the program: cpu_s was bwrap's own 0.01 s for a busy loop
    r = run("""
        import time
        t = time.process_time()
        while time.process_time() - t < 0.5:
            pass
        print("burnt", flush=True)
        time.sleep(60)
    """, timeout_s=6)
    assert r.limit_hit == "timeout" and r.stdout == "burnt\n", r
    if backend == "docker":
        assert r.cpu_s is None  # docker reports none (test_runs_code_and_reports_the_result)
    else:
        assert 0.5 <= r.cpu_s < 6, r  # the 0.5 s burnt, plus start-up; never more than the wall clock
        assert 0 < r.max_rss_mb < 200, r  # the program's peak (bwrap's rusage gave bwrap's own)


def test_bad_arguments_name_the_field(tmp_path):
    with pytest.raises(SandboxError, match="give cmd"):
        run_in_sandbox()
    with pytest.raises(SandboxError, match="cmd='python x.py'"):
        run_in_sandbox("python x.py")  # type: ignore[arg-type]
    with pytest.raises(SandboxError, match="timeout_s=0"):
        run_in_sandbox(code="pass", timeout_s=0)
    with pytest.raises(SandboxError, match=r"inputs name '\.\./x'"):
        run_in_sandbox(code="pass", inputs={"../x": tmp_path})
    with pytest.raises(SandboxError, match="no such file"):
        run_in_sandbox(code="pass", inputs={"x": tmp_path / "missing"})
    with pytest.raises(SandboxError, match="image='gpu'"):
        run_in_sandbox(code="pass", image="gpu")


def test_refuses_without_a_backend_unless_unsafe_local_is_asked(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "_docker_client", lambda: None)
    monkeypatch.setattr(sandbox, "_bwrap_status", lambda: (None, "bwrap not installed"))
    monkeypatch.delenv(sandbox.SANDBOX_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match="Refusing to run untrusted code.*unsafe_local=True"):
        run_in_sandbox(code="print(1)")
    assert sandbox_info()["backend"] is None
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-secret")
    (tmp_path / "in.txt").write_text("evidence")
    r = run_in_sandbox(code="import os; print(open(os.environ['EVOTRAINER_EVIDENCE'] + '/in.txt').read(), "
                            "'ANTHROPIC_API_KEY' in os.environ)", inputs={"in.txt": tmp_path / "in.txt"},
                       unsafe_local=True)
    assert r.backend == "unsafe-local" and r.stdout == "evidence False\n", r
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "unsafe-local")
    assert run_in_sandbox(code="print(2)").backend == "unsafe-local"
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "chroot")
    with pytest.raises(SandboxError, match="EVOTRAINER_SANDBOX='chroot': use auto, docker, bwrap or unsafe-local"):
        run_in_sandbox(code="pass")


def test_sandbox_info_reports_backend_and_limits(backend):
    info = sandbox_info()
    assert info["backend"] == backend and info["network"] == "none" and info["uid"] == 65534
    assert info["defaults"]["memory_mb"] == 1024 and info["mounts"]["work"] == "/sandbox/work"


# --- Dockerfiles -------------------------------------------------------------------------------------
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
                "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "MAINTAINER"}


def parse_dockerfile(path: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) pairs: comments dropped, backslash continuations joined."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{path}: dangling line continuation"
    return out


@pytest.mark.parametrize("image", ["analyzer", "code-runner", "swe-runner"])
def test_dockerfile_parses(image):
    folder = IMAGES / image
    steps = parse_dockerfile(folder / "Dockerfile")
    first = [w for w, _ in steps if w != "ARG"][0]
    assert first == "FROM", f"{image}: the first instruction is {first}"
    assert {w for w, _ in steps} <= INSTRUCTIONS
    assert ("USER", "65534:65534") in steps  # never root inside
    for word, args in steps:
        if word == "COPY":
            for src in args.split()[:-1]:
                assert (folder / src).exists(), f"{image}: COPY source {src} missing"
        if word in ("CMD", "ENTRYPOINT") and args.startswith("["):
            json.loads(args)
    assert re.search(rf"`docker build -t evotrainer-sandbox-{image} sandbox_images/{image}`",
                     (IMAGES / "README.md").read_text())


@pytest.mark.parametrize("image", ["analyzer", "code-runner", "swe-runner"])
def test_dockerfile_builds_on_the_local_base(image, docker_sandbox_env, monkeypatch):
    """ensure_image rebuilds a removed image from its Dockerfile on the local debootstrap base (no registry)."""
    for k, v in docker_sandbox_env.items():
        monkeypatch.setenv(k, v)
    sandbox._docker_client.cache_clear()
    client = sandbox._docker_client()
    from evotrainer.sandbox.docker import ensure_image

    tag = f"evotrainer-sandbox-{image}:latest"
    client.images.remove(tag, force=True)
    try:
        assert ensure_image(client, image) == tag
        out = client.containers.run(tag, ["python", "-c", "import os; print(os.getuid(), os.getcwd())"],
                                    network_mode="none", remove=True)
        assert out == b"65534 /sandbox/work\n"  # the image's USER and WORKDIR
    finally:
        sandbox._docker_client.cache_clear()


# --- CLI ---------------------------------------------------------------------------------------------
def test_cli_info_and_run(tmp_path, backend):
    from evotrainer.cli import app

    cli = CliRunner()
    res = cli.invoke(app, ["sandbox", "info", "--json"])
    info = json.loads(res.stdout)
    assert res.exit_code == 0 and info["backend"] == backend
    assert info["selftest"].startswith("ok: print(6 * 7) gave 42 in ") and info["selftest"].endswith(f" s ({backend})")
    (tmp_path / "data.txt").write_text("3 4")
    script = tmp_path / "job.py"
    script.write_text("a, b = open('/evidence/data.txt').read().split(); print(int(a) * int(b))")
    res = cli.invoke(app, ["sandbox", "run", str(script), "--input", str(tmp_path / "data.txt"), "--json"])
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and out["stdout"] == "12\n" and out["exit_code"] == 0  # 3 * 4
    assert out["limit_hit"] is None and out["backend"] == backend
    script.write_text("import time; time.sleep(30)")
    res = cli.invoke(app, ["sandbox", "run", str(script), "--timeout", "1", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["limit_hit"] == "timeout"
    res = cli.invoke(app, ["sandbox", "run", str(tmp_path / "nope.py")])
    assert res.exit_code == 1 and "nope.py: no such file" in res.output
    # a bad flag is named as the user typed it (it said "timeout_s=-1.0: must be > 0")
    res = cli.invoke(app, ["sandbox", "run", str(script), "--timeout", "-1"])
    assert res.exit_code == 1 and res.stderr.strip() == ("error: --timeout -1: must be > 0 seconds and at most "
                                                         "1,099,511,627,776, e.g. --timeout 30")
    res = cli.invoke(app, ["sandbox", "run", str(script), "--memory", "0"])
    assert res.exit_code == 1 and res.stderr.strip() == ("error: --memory 0: must be > 0 MiB and at most "
                                                         "1,099,511,627,776, e.g. --memory 1024")


# --- Docker backend against a fake Engine API on 127.0.0.1 (no daemon here) -------------------------
class FakeDocker:
    """A minimal Docker Engine API: records the container config, 'runs' it as ``exit_code`` + output."""

    def __init__(self, stdout: bytes = b"", stderr: bytes = b"", exit_code: int = 0, wait_s: float = 0.0,
                 oom_from_inspect: int | None = None, fails: str | None = None):
        """``oom_from_inspect``: the n-th container inspect (1-based) and later ones say ``OOMKilled: true``
        (a real daemon sets the flag on an OOM event that can trail the exit). ``fails``: ``"create"`` or
        ``"delete"``, that call answers 500; ``"kill"``: the kill answers 409, the container is not running."""
        import http.server
        import threading

        self.requests: list[tuple[str, str, dict]] = []
        self.inspects = 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body=None, raw: bytes | None = None):
                data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
                self.send_response(code)
                self.send_header("Content-Type", "application/json" if raw is None else "application/vnd.docker.raw-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}") if n else {}
                path = re.sub(r"^/v[\d.]+", "", self.path)
                fake.requests.append((method, path, body))
                inspect = {"Id": "c1", "Config": {"Tty": False}, "State": {"OOMKilled": False, "ExitCode": exit_code},
                           "HostConfig": {"LogConfig": {"Type": "json-file"}}}
                if path == "/_ping":
                    return self._send(200, raw=b"OK")
                if path.startswith("/images/"):
                    return self._send(200, {"Id": "sha256:fake"})
                if path.startswith("/containers/create"):
                    if fails == "create":
                        return self._send(500, {"message": "fake docker: create failed"})
                    return self._send(201, {"Id": "c1", "Warnings": []})
                if path.endswith("/kill") and fails == "kill":  # the container exited before the kill reached it
                    return self._send(409, {"message": "Cannot kill container: c1: Container c1 is not running"})
                if path.endswith("/start") or path.endswith("/kill"):
                    return self._send(204)
                if path.endswith("/wait"):
                    import time as _t

                    _t.sleep(wait_s)
                    return self._send(200, {"StatusCode": exit_code})
                if "/attach" in path:  # both streams multiplexed (1 = stdout, 2 = stderr), then EOF
                    frames = b"".join(bytes([k, 0, 0, 0]) + len(w).to_bytes(4, "big") + w
                                      for k, w in ((1, stdout), (2, stderr)) if w)
                    self.close_connection = True  # like a hijacked stream: headers, then (later) the frames
                    self.send_response(200)
                    self.send_header("Content-Type", "application/vnd.docker.raw-stream")
                    self.end_headers()
                    self.wfile.flush()
                    import time as _t

                    _t.sleep(0.1)  # the client reads frames from the raw socket: none may sit in its header buffer
                    self.wfile.write(frames)
                    return None
                if "/logs" in path:
                    want = stdout if "stdout=1" in path else stderr
                    frame = (bytes([1 if "stdout=1" in path else 2, 0, 0, 0]) + len(want).to_bytes(4, "big") + want
                             if want else b"")
                    return self._send(200, raw=frame)
                if path.endswith("/json"):
                    fake.inspects += 1
                    inspect["State"]["OOMKilled"] = oom_from_inspect is not None and fake.inspects >= oom_from_inspect
                    return self._send(200, inspect)
                if method == "DELETE":
                    return self._send(500, {"message": "fake docker: delete failed"}) if fails == "delete" else self._send(204)
                return self._send(404, {"message": f"fake docker: no route {method} {path}"})

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_DELETE(self):
                self._route("DELETE")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"tcp://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _fake_client(monkeypatch, fake: FakeDocker):
    import docker

    client = docker.DockerClient(base_url=fake.url, version="1.43", timeout=10)
    monkeypatch.setattr(sandbox, "_docker_client", lambda: client)
    monkeypatch.delenv(sandbox.SANDBOX_ENV, raising=False)
    return client


def test_docker_backend_sends_a_locked_down_container(monkeypatch, tmp_path):
    fake = FakeDocker(stdout=b"42\n", stderr=b"warn\n", exit_code=0)
    try:
        _fake_client(monkeypatch, fake)
        (tmp_path / "m.csv").write_text("x")
        r = run_in_sandbox(code="print(42)", inputs={"m.csv": tmp_path / "m.csv"}, memory_mb=512, max_procs=32,
                           max_file_mb=8, cpu_s=5, env={"K": "v"}, image="analyzer")
    finally:
        fake.close()
    assert r.backend == "docker" and r.exit_code == 0 and r.stdout == "42\n" and r.stderr == "warn\n"
    assert r.limit_hit is None and r.cpu_s is None
    (create,) = [b for m, p, b in fake.requests if p.startswith("/containers/create")]
    hc = create["HostConfig"]
    assert create["Image"] == "evotrainer-sandbox-analyzer:latest" and create["User"] == "65534:65534"
    # the command runs under the seccomp launcher (bwrap's filter stacked on Docker's profile)
    assert create["Cmd"][:4] == ["python3", "-I", "-S", "-c"] and create["Cmd"][5] == seccomp_filter().hex()
    assert create["Cmd"][6:] == ["python", "/sandbox/main.py"] and create["WorkingDir"] == "/sandbox/work"
    # Docker's masked / read-only /proc lists, plus /proc/key-users and /proc/pressure
    assert {"/proc/keys", "/proc/key-users", "/proc/kcore", "/proc/timer_list"} <= set(hc["MaskedPaths"])
    assert {"/proc/sys", "/proc/sysrq-trigger", "/proc/pressure"} <= set(hc["ReadonlyPaths"])
    assert "K=v" in create["Env"] and not any(e.startswith("ANTHROPIC") for e in create["Env"])
    assert hc["NetworkMode"] == "none" and hc["CapDrop"] == ["ALL"] and hc["ReadonlyRootfs"] is True
    assert hc["LogConfig"] == {"Type": "none", "Config": {}}  # output read through the attach, never on disk
    assert any("/containers/c1/attach?" in p for _, p, _ in fake.requests)
    assert hc["SecurityOpt"] == ["no-new-privileges"] and hc["PidsLimit"] == 32 and hc["Init"] is True
    assert hc["Memory"] == 512 << 20 and hc["MemorySwap"] == 512 << 20  # no swap beyond the limit
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]} == {
        "cpu": (5, 6), "fsize": (8 << 20, 8 << 20), "core": (0, 0), "sigpending": (1024, 1024)}
    assert f"{tmp_path / 'm.csv'}:/evidence/m.csv:ro" in hc["Binds"]
    assert any(b.endswith(":/sandbox/main.py:ro") for b in hc["Binds"])
    assert "/dev/null:/etc/resolv.conf:ro" in hc["Binds"]  # not the host's resolver, which Docker copies in
    assert set(hc["Tmpfs"]) == {"/tmp", "/dev/shm", "/sandbox/work", "/sys"}
    # disk_mb=256 by default: 256 MiB / 16 KiB per inode = 16,384 inodes on each tmpfs
    assert hc["Tmpfs"]["/tmp"] == "size=256m,nr_inodes=16384"
    assert hc["Tmpfs"]["/dev/shm"] == "size=256m,nr_inodes=16384,mode=1777"  # not Docker's shm: no inode cap there
    assert hc["NanoCpus"] == 1_000_000_000  # cpus=1.0 for the whole container
    assert ("DELETE", "/containers/c1?v=False&link=False&force=True") in [(m, p) for m, p, _ in fake.requests]


def test_docker_oom_flag_that_trails_the_exit_is_still_read(monkeypatch):
    """Docker 20.10 on a loaded machine: the memory bomb exited 137 with OOMKilled false, true a moment later
    (test_08[docker] saw limit_hit None). The backend re-reads a SIGKILLed container's state for a while."""
    # get, the two log followers (tty check) and the first reload inspect the container: all four say no OOM
    fake = FakeDocker(exit_code=137, oom_from_inspect=6)
    try:
        _fake_client(monkeypatch, fake)
        r = run_in_sandbox(code="x = bytearray(1 << 40)", memory_mb=256)
    finally:
        fake.close()
    assert r.exit_code == 137 and r.limit_hit == "memory", r
    fake = FakeDocker(exit_code=3, oom_from_inspect=6)  # not a SIGKILL: read once, no wait, no memory verdict
    try:
        _fake_client(monkeypatch, fake)
        r = run_in_sandbox(code="raise SystemExit(3)")
    finally:
        fake.close()
    assert r.exit_code == 3 and r.limit_hit is None and fake.inspects <= 5, (r, fake.inspects)


@pytest.mark.parametrize("fails", ["create", "delete"])
def test_docker_work_dir_comes_back_to_its_owners_when_the_daemon_fails(monkeypatch, tmp_path, fails):
    """A root caller's work dir is lent to uid 65534 for the run; a container creation or removal that raised
    skipped the give-back, leaving the tree 65534's (writable by any host process of that uid)."""
    if os.geteuid() != 0:
        pytest.skip("only a root caller's work dir is lent to the sandbox uid")
    import docker

    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    os.chown(work / "sub", 1000, 1000)
    fake = FakeDocker(exit_code=0, fails=fails)
    try:
        _fake_client(monkeypatch, fake)
        with pytest.raises(docker.errors.APIError, match=f"{fails} failed"):
            run_in_sandbox(code="pass", workdir=work)
    finally:
        fake.close()
    assert (work.stat().st_uid, (work / "sub").stat().st_uid, (work / "sub").stat().st_gid) == (0, 1000, 1000)


def test_docker_backend_kills_at_the_wall_clock(monkeypatch):
    fake = FakeDocker(exit_code=0, wait_s=8.0)  # a backend that waited for the container's own exit: >= 8 s
    try:
        _fake_client(monkeypatch, fake)
        r = run_in_sandbox(code="import time; time.sleep(60)", timeout_s=1)
    finally:
        fake.close()
    assert r.limit_hit == "timeout" and r.exit_code == -9 and 0.9 < r.wall_s < 6
    assert any(p.endswith("/kill") for _, p, _ in fake.requests)
    assert any(m == "DELETE" for m, _, _ in fake.requests)  # removed even after a kill


def test_docker_backend_keeps_the_result_of_a_program_that_exited_before_its_kill(monkeypatch):
    """A program that printed past the output cap and ended at once: the kill got 409 "is not running" from the
    daemon, and run_in_sandbox raised docker's APIError instead of returning (the clean-clone CI of dbf4919,
    test_each_limit_is_reported[docker-...-output], on a real daemon). Now the exit status is read instead."""
    fake = FakeDocker(stdout=b"z" * 100_000, exit_code=0, wait_s=1.0, fails="kill")
    try:
        _fake_client(monkeypatch, fake)
        r = run_in_sandbox(code="print('z' * 100_000)", max_output_kb=4, timeout_s=20)
    finally:
        fake.close()
    assert any(p.endswith("/kill") for _, p, _ in fake.requests)
    assert (r.limit_hit, r.exit_code, r.stdout_truncated, len(r.stdout)) == ("output", 0, True, 4096)
    assert any(m == "DELETE" for m, _, _ in fake.requests)


# --- the package: one direction, no hidden imports ------------------------------------------------------------
SANDBOX_ORDER = ("base", "fs", "limits", "bwrap", "docker", "api", "__init__")  # each may import only those before


def test_sandbox_modules_import_only_lower_ones_at_module_level():
    import ast
    import sys

    pkg = Path(sandbox.__file__).parent
    for name in SANDBOX_ORDER:
        tree = ast.parse((pkg / f"{name}.py").read_text())
        allowed = set(SANDBOX_ORDER[:SANDBOX_ORDER.index(name)])
        top_level = set(tree.body)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            subs = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for mod in mods:
                ours = mod.startswith("evotrainer")
                if node not in top_level:  # inside a function: only third-party (docker, requests) stays lazy
                    assert not ours and mod.split(".")[0] not in sys.stdlib_module_names, (name, mod)
                if mod == "evotrainer.sandbox" or mod.startswith("evotrainer.sandbox."):
                    used = [mod.split(".")[2]] if mod.count(".") >= 2 else subs
                    assert set(used) <= allowed, f"sandbox/{name}.py imports {used}; allowed: {sorted(allowed)}"
