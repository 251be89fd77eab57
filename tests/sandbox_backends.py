"""The sandbox backends the tests run through: bubblewrap and a real Docker daemon.

``sandbox_backend`` (function scope, params ``bwrap`` and ``docker``) points :func:`run_in_sandbox` at one
backend for one test (``$EVOTRAINER_SANDBOX`` and, for Docker, ``$DOCKER_HOST`` and the base image); the Docker
half skips, saying why, where no daemon can run here, and a missing bubblewrap is a failure. ``docker_sandbox_env`` (session scope) finds or
starts the daemon and the images once per session:

* a daemon that answers at ``$DOCKER_HOST``, the default socket or :data:`PRIVATE_SOCK` is used as it is;
* else, as root with ``dockerd`` installed (``apt-get install -y docker.io``), a private one is started
  (its own socket, exec root and pidfile under ``/run/evotrainer-docker``; data root
  :data:`DATA_ROOT`, kept between sessions so its images are a cache; ``--iptables=false
  --ip6tables=false --ip-masq=false --bridge=none``: the host's network is left alone, sandbox
  containers run with ``--network none`` anyway) and stopped at the end of the session (one left by a
  session killed with SIGKILL answers at :data:`PRIVATE_SOCK` next time and is used, not stopped);
* the images: ``$EVOTRAINER_SANDBOX_BASE`` when set, else ``scripts/docker_base.sh`` makes the local
  base ``evotrainer-base:bookworm`` (debootstrap + ``docker import``, no registry; about 75 s plus
  the mirror download once, then cached in the data root) and builds the sandbox images on it.

Where docker.io, root or debootstrap is missing, the Docker half of each test skips with the reason.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PRIVATE_DIR = Path("/run/evotrainer-docker")
PRIVATE_SOCK = f"unix://{PRIVATE_DIR}/docker.sock"
DATA_ROOT = Path(os.environ.get("EVOTRAINER_TEST_DOCKER_ROOT", "/var/lib/evotrainer-docker"))
BASE_IMAGE = "evotrainer-base:bookworm"
SANDBOX_BACKENDS = ("bwrap", "docker")
_LOCKS = Path(tempfile.gettempdir()) / "evotrainer-test-docker"  # docker_sandbox_env's locks, shared by xdist workers


def _client(host: str):
    try:
        import docker

        c = docker.DockerClient(base_url=host, timeout=10)
        c.ping()
        return c
    except Exception:
        return None


def _answering_host() -> str | None:
    for host in dict.fromkeys(h for h in (os.environ.get("DOCKER_HOST"), "unix:///var/run/docker.sock",
                                          PRIVATE_SOCK) if h):
        if _client(host) is not None:
            return host
    return None


def _start_private_dockerd() -> subprocess.Popen:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        pytest.skip("Docker backend: no daemon answers and dockerd is not installed (apt-get install -y docker.io)")
    if os.geteuid() != 0:
        pytest.skip("Docker backend: no daemon answers and starting dockerd needs root")
    PRIVATE_DIR.mkdir(parents=True, exist_ok=True)
    log = open(PRIVATE_DIR / "dockerd.log", "wb")  # noqa: SIM115 - the daemon's, closed when it stops
    proc = subprocess.Popen([dockerd, "-H", PRIVATE_SOCK, "--data-root", str(DATA_ROOT), "--exec-root",
                             str(PRIVATE_DIR / "exec"), "--pidfile", str(PRIVATE_DIR / "docker.pid"),
                             "--iptables=false", "--ip6tables=false", "--ip-masq=false", "--bridge=none"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while _client(PRIVATE_SOCK) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            tail = (PRIVATE_DIR / "dockerd.log").read_text(errors="replace")[-400:]
            pytest.skip(f"Docker backend: dockerd did not start: {tail}")
        time.sleep(0.3)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    exec_root = str(PRIVATE_DIR / "exec")
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):  # e.g. its netns/default
        point = line.split()[4]
        if point.startswith(exec_root):
            subprocess.run(["umount", "-l", point], check=False)


@pytest.fixture(scope="session")
def docker_sandbox_env():
    """Environment that sends :func:`run_in_sandbox` to a real Docker daemon with the images built; skips
    (the reason in the message) where none can be had. See the module doc.

    Under pytest-xdist each worker process has its own session: a lock lets one worker at a time find or start
    the daemon and build the images, and each worker holds a shared lock while it may use the daemon, so the
    worker that started it stops it only when no other worker's session uses it."""
    try:
        import docker  # noqa: F401 - the backend's SDK
    except ImportError:
        pytest.skip("Docker backend: the python docker SDK is not installed")
    _LOCKS.mkdir(exist_ok=True)
    users = open(_LOCKS / "users.lock", "a")  # noqa: SIM115 - held for the session, closed in _release
    proc = None
    try:
        with open(_LOCKS / "start.lock", "a") as start:
            fcntl.flock(start, fcntl.LOCK_EX)
            # a user before looking: a daemon that answers now is not stopped while this session may use it
            fcntl.flock(users, fcntl.LOCK_SH)
            host = _answering_host()
            if host is None:
                proc, host = _start_private_dockerd(), PRIVATE_SOCK
            env = _images_env(host)
    except BaseException:
        _release(users, proc)
        raise
    try:
        yield env
    finally:
        _release(users, proc)


def _release(users, proc: subprocess.Popen | None) -> None:
    """This session is done with the daemon; the one that started it waits until no other session uses it."""
    fcntl.flock(users, fcntl.LOCK_UN)
    if proc is not None:
        fcntl.flock(users, fcntl.LOCK_EX)
        _stop(proc)
    users.close()


def _images_env(host: str) -> dict[str, str]:
    base = os.environ.get("EVOTRAINER_SANDBOX_BASE", "").strip()
    env = {"DOCKER_HOST": host, "EVOTRAINER_SANDBOX": "docker"}
    if base:
        if _client(host).images.list(name=base) == []:
            pytest.skip(f"Docker backend: EVOTRAINER_SANDBOX_BASE={base} is not an image of the daemon at {host}")
        env["EVOTRAINER_SANDBOX_BASE"] = base
        if os.environ.get("EVOTRAINER_SANDBOX_PIP"):
            env["EVOTRAINER_SANDBOX_PIP"] = os.environ["EVOTRAINER_SANDBOX_PIP"]
        return env
    if not shutil.which("docker"):
        pytest.skip("Docker backend: the docker client is missing (apt-get install -y docker.io)")
    if not shutil.which("debootstrap") and _client(host).images.list(name=BASE_IMAGE) == []:
        pytest.skip(f"Docker backend: no base image {BASE_IMAGE} and no debootstrap to make one "
                    "(apt-get install -y debootstrap; or set EVOTRAINER_SANDBOX_BASE)")
    r = subprocess.run(["sh", str(REPO / "scripts" / "docker_base.sh")], env={**os.environ, "DOCKER_HOST": host},
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.skip(f"Docker backend: scripts/docker_base.sh failed: {(r.stdout + r.stderr)[-600:]}")
    return env | {"EVOTRAINER_SANDBOX_BASE": BASE_IMAGE, "EVOTRAINER_SANDBOX_PIP": "0"}


@pytest.fixture(params=SANDBOX_BACKENDS)
def sandbox_backend(request, monkeypatch) -> str:
    """Run this test through one backend (``bwrap`` or ``docker``). Docker skips, with the reason, where no daemon can
    run; a missing bubblewrap fails the test (the suites are the isolation proof on Linux)."""
    from evotrainer.sandbox import api

    if request.param == "docker":
        for k, v in request.getfixturevalue("docker_sandbox_env").items():
            monkeypatch.setenv(k, v)
    else:
        path, reason = api._bwrap_status()
        if path is None:  # the isolating backend of a Linux host: without it these tests are no proof (a failure)
            pytest.fail(f"bubblewrap backend: {reason}; run `make sandbox-deps`")
        monkeypatch.setenv("EVOTRAINER_SANDBOX", "bwrap")
    api._docker_client.cache_clear()  # the client follows $DOCKER_HOST
    yield request.param
    api._docker_client.cache_clear()
