"""The sandbox for untrusted code (analyzers written by agents, code written by the policy).

Public API (re-exported here; the how and why are in :mod:`evotrainer.sandbox.api`):

* :func:`run_in_sandbox` runs a command or a Python source string with no network, a cleared
  environment, read-only inputs, a private work dir and limits; it returns a :class:`SandboxResult`.
* :func:`sandbox_info` / :func:`limits_report`: the backend in use, why, and which limits hold here.
* :func:`strip_setid_bits`: the clean-up of a caller's work dir after a run.
* :class:`SandboxError` (bad input, a sandbox that cannot start), :class:`SandboxUnavailable` (no
  isolating backend), :class:`UnsafePathError` (a link or special file where the host reads).
* The paths inside the sandbox (:data:`EVIDENCE_DIR`, :data:`WORK_DIR`, :data:`CODE_PATH`), the
  sandbox uid, the backend switch :data:`SANDBOX_ENV` and the Docker image folder :data:`IMAGES_DIR`.

Modules, lowest first (each imports only those before it): :mod:`~evotrainer.sandbox.base` (types,
constants, errors), :mod:`~evotrainer.sandbox.fs` (host-side file access that follows no link),
:mod:`~evotrainer.sandbox.limits` (cgroups, capped tmpfs, the stale-run sweep), the backends
:mod:`~evotrainer.sandbox.bwrap` and :mod:`~evotrainer.sandbox.docker`, the dispatcher
:mod:`~evotrainer.sandbox.api`; :mod:`~evotrainer.sandbox.cli` is the ``evotrainer sandbox`` command.
"""

from __future__ import annotations

from evotrainer.sandbox.api import limits_report, run_in_sandbox, sandbox_info, strip_setid_bits
from evotrainer.sandbox.base import (
    CODE_PATH,
    EVIDENCE_DIR,
    IMAGE_PREFIX,
    IMAGES_DIR,
    SANDBOX_ENV,
    SANDBOX_UID,
    WORK_DIR,
    LimitHit,
    SandboxError,
    SandboxResult,
    SandboxUnavailable,
)
from evotrainer.sandbox.fs import UnsafePathError

__all__ = [
    "CODE_PATH",
    "EVIDENCE_DIR",
    "IMAGES_DIR",
    "IMAGE_PREFIX",
    "SANDBOX_ENV",
    "SANDBOX_UID",
    "WORK_DIR",
    "LimitHit",
    "SandboxError",
    "SandboxResult",
    "SandboxUnavailable",
    "UnsafePathError",
    "limits_report",
    "run_in_sandbox",
    "sandbox_info",
    "strip_setid_bits",
]
