"""Whether a process still runs, for records that name one by pid (a job in the lineage, an offload folder)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PID_MAX = 1 << 22  # Linux's largest pid_max (kernel/pid.c PID_MAX_LIMIT on 64-bit)


def pid_alive(pid: Any) -> bool:
    """Whether process ``pid`` still runs. A pid that is not an integer in 1..PID_MAX is none: review 8's foreign
    lineage.db with a running job whose pid was 'abc', 1e21 or 2**63 - 1 ended every command that opened the run
    (and every MCP tool) with a bare TypeError / OverflowError, and pid -1 (kill(-1, 0): every process) kept its
    job running for good. A process of another user (EPERM) runs; a zombie (killed, not reaped) does not."""
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process its parent has not reaped yet (a zombie) answers kill(0) but runs no more
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True
