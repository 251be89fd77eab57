"""Batch runner for HumanEval-style programs; runs INSIDE the sandbox (bwrap or the code-runner image).

Input: ``$EVOTRAINER_EVIDENCE/batch.json`` = ``{"timeout_s": float, "programs": [str, ...]}``, each
program a complete Python file (prompt + completion + tests + ``check(entry_point)``).
Output: one JSON line on stdout, ``{"nonce": ..., "results": [{"status", "error", "wall_s"}, ...]}``
with status ``passed`` | ``failed`` | ``timeout``.

Each program runs in its own process group with the per-program timeout; it passes only if it runs
to the end (a wrapper writes ``PASS`` to a private pipe after ``exec`` returns) *and* exits 0, so an
early ``sys.exit(0)`` / ``os._exit(0)`` is a failure. The nonce (from ``EVOTRAINER_RUNNER_NONCE``,
removed from the environment, and this process made non-dumpable first) lets the host tell this
runner's line from one a program forges onto the sandbox's stdout. The runner is a guard against
accidental or naive shortcuts, not against a program that deliberately attacks the runner; the
sandbox around it is what contains such a program. Standard library only.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

WRAPPER = r"""
import os, sys
fd = int(sys.argv[2])
src = open(sys.argv[1]).read()
try:
    exec(compile(src, "program.py", "exec"), {"__name__": "__main__"})
except BaseException as e:
    sys.stderr.write(f"{type(e).__name__}: {e}"[:400])
    sys.stderr.flush()
    os._exit(1)
os.write(fd, b"PASS")
os._exit(0)
"""


def run_one(program: str, timeout_s: float, work: str) -> dict:
    fd, path = tempfile.mkstemp(suffix=".py", dir=work)
    with os.fdopen(fd, "w") as f:
        f.write(program)
    r, w = os.pipe()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-I", "-c", WRAPPER, path, str(w)], pass_fds=(w,),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, cwd=work,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work, "LANG": "C.UTF-8",
                                 "PYTHONDONTWRITEBYTECODE": "1"})
    os.close(w)
    status, err = "failed", ""
    try:
        _, err_b = proc.communicate(timeout=timeout_s)
        err = err_b.decode(errors="replace")[-400:]
    except subprocess.TimeoutExpired:
        status = "timeout"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the program and anything it left behind in its group
        except ProcessLookupError:
            pass
        proc.wait()
    os.set_blocking(r, False)
    try:
        marker = os.read(r, 16)
    except OSError:
        marker = b""
    os.close(r)
    os.unlink(path)
    if status != "timeout" and proc.returncode == 0 and marker == b"PASS":
        status = "passed"
    return {"status": status, "error": err, "wall_s": round(time.monotonic() - t0, 4)}


def main() -> None:
    try:
        ctypes.CDLL(None).prctl(4, 0)  # PR_SET_DUMPABLE=0: programs cannot read our memory, env or fds
    except Exception:
        pass
    nonce = os.environ.pop("EVOTRAINER_RUNNER_NONCE", "")
    evidence = os.environ.get("EVOTRAINER_EVIDENCE", "/evidence")
    with open(os.path.join(evidence, "batch.json")) as f:
        batch = json.load(f)
    work = tempfile.mkdtemp(dir=os.getcwd())
    results = [run_one(p, float(batch["timeout_s"]), work) for p in batch["programs"]]
    sys.stdout.write(json.dumps({"nonce": nonce, "results": results}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
