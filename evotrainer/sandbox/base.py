"""What every sandbox backend shares: paths inside the sandbox, the result and limit types, the error
classes, the base environment and the reading of which limit stopped a run.

The lowest module of :mod:`evotrainer.sandbox`: it imports no backend, so the backends
(:mod:`~evotrainer.sandbox.bwrap`, :mod:`~evotrainer.sandbox.docker`) and the dispatcher
(:mod:`~evotrainer.sandbox.api`) all build on it.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

import evotrainer.sandbox_images as _images_pkg
from evotrainer.errors import EvoTrainerError

SANDBOX_ENV = "EVOTRAINER_SANDBOX"  # auto | docker | bwrap | unsafe-local
EVIDENCE_DIR = "/evidence"
WORK_DIR = "/sandbox/work"
CODE_PATH = "/sandbox/main.py"
SANDBOX_UID = 65534  # "nobody"
IMAGES_DIR = Path(_images_pkg.__file__).resolve().parent  # sandbox_images/ (installed as evotrainer.sandbox_images)
IMAGE_PREFIX = "evotrainer-sandbox-"

LimitHit = Literal["timeout", "cpu", "memory", "file_size", "procs", "output"]

# The environment every sandboxed program starts from (the rest of the host's is cleared).
BASE_ENV = {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TMPDIR": "/tmp"}


class SandboxError(EvoTrainerError, RuntimeError):
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


class RunLimits(BaseModel):
    """The limits of one run, as the backends take them (bytes where noted)."""

    timeout_s: float
    cpu_s: int
    memory_mb: int
    max_file_mb: int
    max_procs: int
    disk_mb: int
    max_output: int  # bytes per stream
    cpus: float = 1.0  # CPU cores for the whole run (cgroup CPU quota)


_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_FILE_MARKERS = ("File too large", "No space left on device", "Errno 27", "Errno 28")


def infer_limit(exit_code: int, stderr: str, cpu: float, limits: RunLimits) -> LimitHit | None:
    """The rlimit behind a non-zero exit: the signal it sends, else the error it makes the program print."""
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
