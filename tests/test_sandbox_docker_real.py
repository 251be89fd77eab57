"""The Docker backend against a real daemon: what only Docker has (the daemon's own report of its limits,
its log files on the host disk). The escape and security suites run through Docker as well as bubblewrap
(the ``sandbox_backend`` fixture, tests/sandbox_backends.py, which also finds or starts the daemon and builds
the images on a local debootstrap base); where no daemon can be had these tests skip with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evotrainer.sandbox import api as sandbox
from evotrainer.sandbox import run_in_sandbox
from evotrainer.sandbox.bwrap import BLOCKED_SYSCALLS
from evotrainer.sandbox.docker import daemon_limits

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def docker_env(docker_sandbox_env, monkeypatch):
    for k, v in docker_sandbox_env.items():
        monkeypatch.setenv(k, v)
    sandbox._docker_client.cache_clear()
    yield docker_sandbox_env
    sandbox._docker_client.cache_clear()


def test_sandbox_info_says_docker_ran_and_which_limits_hold(docker_env):
    r = subprocess.run([sys.executable, "-m", "evotrainer.cli", "sandbox", "info", "--json"], cwd=REPO,
                       env={**os.environ, **docker_env}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads(r.stdout)
    assert info["backend"] == "docker" and info["selftest"].endswith("(docker)"), info
    daemon = sandbox._docker_client().info()
    assert info["docker_daemon"].startswith(f"Docker {daemon['ServerVersion']}, cgroup v{daemon['CgroupVersion']}")
    lim = info["limits"]
    # each cgroup limit is reported as the daemon says it supports it
    for key, flag in (("procs_per_run", "PidsLimit"), ("cpu_per_run", "CpuCfsQuota"), ("memory_per_run", "MemoryLimit")):
        assert lim[key].startswith("enforced") == bool(daemon[flag]), (key, lim[key])
    assert lim["seccomp"].startswith(
        f"enforced: Docker's default profile + {len(BLOCKED_SYSCALLS)} syscalls"), lim["seccomp"]
    assert "/proc/pressure" in lim["proc_masking"] and "/proc/key-users" in lim["proc_masking"]
    assert lim["tmpfs_inodes"].startswith("enforced") and "/dev/shm" in lim["tmpfs_inodes"]
    assert lim["address_space"].startswith("NOT enforced")  # Docker sets no RLIMIT_AS: said, not hidden


def test_daemon_that_does_not_answer_claims_no_cgroup_limit():
    class Gone:
        def info(self):
            raise ConnectionError("daemon gone")

    summary, lim = daemon_limits(Gone())
    assert summary == "unknown: ConnectionError: daemon gone"
    for key in ("memory_per_run", "procs_per_run", "cpu_per_run"):
        assert lim[key].startswith("NOT enforced: the daemon did not say"), lim[key]


def test_an_output_flood_never_reaches_the_host_disk(docker_env):
    """With the json-file log driver the daemon wrote 11-16 MB of a flood to its data root before the kill at a
    64 KiB cap (Docker 20.10); output now comes through an attach and the log driver is ``none``."""
    root = Path(sandbox._docker_client().info()["DockerRootDir"]) / "containers"
    if not root.is_dir():
        pytest.skip(f"the daemon's data root {root} is not on this machine")
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            total = 0
            for d in list(root.iterdir()):
                try:
                    total += sum(f.stat().st_size for f in d.iterdir() if f.is_file())
                except OSError:  # the container went away meanwhile
                    pass
            peak[0] = max(peak[0], total)
            time.sleep(0.005)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        r = run_in_sandbox(code="import sys\nwhile True: sys.stdout.write('y' * 65536)", max_output_kb=64,
                           timeout_s=20)
    finally:
        stop.set()
        t.join(5)
    assert r.backend == "docker" and r.limit_hit == "output" and len(r.stdout) == 64 * 1024 and r.stderr == "", r
    # what the daemon keeps per container (config, hosts, resolv.conf) is a few KiB; the flood is not there
    assert peak[0] < 256 * 1024, peak[0]
