"""The Docker backend of :mod:`evotrainer.sandbox` (used where a Docker daemon answers).

Images are built on first use from ``sandbox_images/<image>/Dockerfile`` and tagged
``evotrainer-sandbox-<image>``. Each run is one container: ``network_mode=none``, read-only root
file system, all capabilities dropped, ``no-new-privileges``, uid/gid 65534, memory (no swap) and
pids cgroup limits and a CPU quota (``nano_cpus``) for the whole container, ``cpu`` / ``fsize`` /
``core`` ulimits, tmpfs ``/tmp`` and (without a host ``workdir``) tmpfs ``/sandbox/work`` with size
and inode caps, ``/dev/shm`` of ``disk_mb``, inputs bound read-only at ``/evidence/<name>``. The wall clock
is enforced by ``container.wait(timeout=...)`` and a kill; the container is always removed.

Tested against a fake Engine API on 127.0.0.1 (tests/test_sandbox.py: the container config sent, the
wall-clock kill, the removal); the development machine has no Docker daemon, so never against a real one.
"""

from __future__ import annotations

import time
from pathlib import Path

from evotrainer.sandbox import (
    CODE_PATH,
    EVIDENCE_DIR,
    IMAGE_PREFIX,
    IMAGES_DIR,
    SANDBOX_UID,
    WORK_DIR,
    SandboxError,
    SandboxResult,
    _infer_limit,
    _Limits,
)


def ensure_image(client, image: str) -> str:
    """Tag of the sandbox image ``image``, building it from ``sandbox_images/<image>`` when missing.

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
        client.images.build(path=str(folder), tag=tag, rm=True, pull=False)
    except docker.errors.BuildError as e:
        raise SandboxError(f"building {tag} from {folder} failed: {e}") from e
    return tag


def run_docker(client, image: str, argv: list[str], *, inputs: dict[str, Path], workdir: Path | None,
               code_file: Path | None, limits: _Limits, env: dict[str, str]) -> SandboxResult:
    """Run ``argv`` in a fresh locked-down container of ``image``; see the module doc."""
    import docker
    import requests

    tag = ensure_image(client, image)
    volumes = {str(src.resolve()): {"bind": f"{EVIDENCE_DIR}/{name}", "mode": "ro"} for name, src in inputs.items()}
    if code_file is not None:
        volumes[str(code_file)] = {"bind": CODE_PATH, "mode": "ro"}
    from evotrainer.sandbox_limits import tmpfs_inodes

    caps = f"size={limits.disk_mb}m,nr_inodes={tmpfs_inodes(limits.disk_mb << 20)}"
    tmpfs = {"/tmp": caps}
    if workdir is not None:
        volumes[str(Path(workdir).resolve())] = {"bind": WORK_DIR, "mode": "rw"}
    else:
        tmpfs[WORK_DIR] = f"{caps},uid={SANDBOX_UID},gid={SANDBOX_UID}"
    ulimits = [docker.types.Ulimit(name="cpu", soft=limits.cpu_s, hard=limits.cpu_s + 1),
               docker.types.Ulimit(name="fsize", soft=limits.max_file_mb << 20, hard=limits.max_file_mb << 20),
               docker.types.Ulimit(name="core", soft=0, hard=0)]
    t0 = time.monotonic()
    container = client.containers.run(
        tag, argv, detach=True, network_mode="none", user=f"{SANDBOX_UID}:{SANDBOX_UID}", cap_drop=["ALL"],
        security_opt=["no-new-privileges"], read_only=True, tmpfs=tmpfs, volumes=volumes,
        mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m", pids_limit=limits.max_procs,
        nano_cpus=int(limits.cpus * 1e9), shm_size=f"{limits.disk_mb}m",
        ulimits=ulimits, environment=env, working_dir=WORK_DIR, stdin_open=False,
        init=True)  # docker's init as pid 1 reaps orphans, so zombies never eat the pids limit
    killed = None
    try:
        try:
            status = container.wait(timeout=limits.timeout_s)["StatusCode"]
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            container.kill()
            killed = "timeout"
            status = -9
        wall = time.monotonic() - t0
        out = container.logs(stdout=True, stderr=False)
        err = container.logs(stdout=False, stderr=True)
        container.reload()
        oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
    finally:
        container.remove(force=True)
    cap = limits.max_output
    stdout, stderr = out[:cap].decode(errors="replace"), err[:cap].decode(errors="replace")
    limit = killed or ("memory" if oom else None) or ("output" if max(len(out), len(err)) > cap else None) \
        or _infer_limit(status, stderr, 0.0, limits)
    return SandboxResult(exit_code=status, stdout=stdout, stderr=stderr, limit_hit=limit, backend="docker",
                         wall_s=round(wall, 4), cpu_s=None, max_rss_mb=None, stdout_truncated=len(out) > cap,
                         stderr_truncated=len(err) > cap)
