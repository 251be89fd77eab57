"""CLI: ``evotrainer sandbox info|run`` (the untrusted-code sandbox, :mod:`evotrainer.sandbox`).

The sandbox modules are imported inside the commands so ``evotrainer --help`` stays fast; errors go
through :func:`evotrainer.cli_errors.fail`.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from evotrainer.cli_errors import fail
from evotrainer.terminal import neutralise, output_console

MAX_FILE_BYTES = 16 << 20  # the Python file `sandbox run` reads into memory (review 5: a 3 GiB sparse one was read)

sandbox_app = typer.Typer(help="Run untrusted code in the sandbox (no network, no secrets, limits).",
                          no_args_is_help=True)


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)  # unwinds: the sandbox tree is killed, its cgroup and temp folder removed


@sandbox_app.command("info")
def info(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
         selftest: Annotated[bool, typer.Option("--selftest/--no-selftest",
                                                help="Run `print(6 * 7)` in the sandbox to prove it works.")] = True,
         ) -> None:
    """The backend in use (docker | bwrap), why, its limits and mounts; a self-test run (exit 1 if it fails)."""
    from evotrainer.sandbox import SandboxError, run_in_sandbox, sandbox_info

    data = sandbox_info()
    ok = data["backend"] is not None
    if ok and selftest:
        try:
            res = run_in_sandbox(code="print(6 * 7)", timeout_s=60)
            ok = res.ok and res.stdout.strip() == "42"
            data["selftest"] = (f"ok: print(6 * 7) gave 42 in {res.wall_s:.2f} s ({res.backend})" if ok else
                                f"failed: exit {res.exit_code}, limit {res.limit_hit}, stdout {res.stdout[:80]!r}, "
                                f"stderr {res.stderr[-300:]!r}")
        except SandboxError as exc:
            ok, data["selftest"] = False, f"failed: {exc}"
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        from rich.table import Table

        t = Table("key", "value", title="sandbox")
        for k, v in data.items():
            if k == "limits":  # one row per limit: which hold on this host and which do not
                for name, how in v.items():
                    t.add_row(f"limit {name}", how)
                continue
            t.add_row(k, json.dumps(v) if isinstance(v, dict) else str(v))
        output_console().print(t)
    if not ok:
        raise typer.Exit(1)


@sandbox_app.command("run")
def run(
    file: Annotated[Path, typer.Argument(help="Python file to run (mounted read-only at /sandbox/main.py).")],
    timeout: Annotated[float, typer.Option("--timeout", help="Wall-clock limit, seconds.")] = 30.0,
    memory: Annotated[int, typer.Option("--memory", help="Address-space limit per process, MiB.")] = 1024,
    inputs: Annotated[list[Path] | None, typer.Option(
        "--input", help="File or folder mounted read-only at /evidence/<its name>; repeatable.")] = None,
    unsafe_local: Annotated[bool, typer.Option("--unsafe-local", help="Run unisolated if no sandbox exists.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Run FILE.py in the sandbox; print exit_code, stdout, stderr, limit_hit, backend (and resource use).

    Text mode shows control characters (terminal escapes) as `\\xNN`; `--json` escapes them as JSON does.
    SIGTERM / SIGHUP stop the run and clean up after it.

    Exits with the program's exit code (1 when it died of a signal or a limit stopped it).
    """
    from evotrainer.sandbox import SandboxError, run_in_sandbox
    from evotrainer.sandbox.api import LIMIT_MAX

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    if not file.is_file():
        fail(f"{file}: no such file")
    # the library names its own fields (timeout_s=...); a CLI user typed the flags
    if not 0 < timeout <= LIMIT_MAX:
        fail(f"--timeout {timeout:g}: must be > 0 seconds and at most {LIMIT_MAX:,}, e.g. --timeout 30")
    if not 0 < memory <= LIMIT_MAX:
        fail(f"--memory {memory}: must be > 0 MiB and at most {LIMIT_MAX:,}, e.g. --memory 1024")
    named: dict[str, Path] = {}
    for p in inputs or []:
        if p.name in named:
            fail(f"--input {p}: two inputs named {p.name!r}; rename one")
        named[p.name] = p
    size = file.stat().st_size
    if size > MAX_FILE_BYTES:  # read whole below: a 3 GiB sparse FILE allocated 3 GiB, then more to decode it
        fail(f"{file}: {size >> 20} MiB; a Python file to run is at most {MAX_FILE_BYTES >> 20} MiB: pass data "
             "with --input instead")
    try:
        code = file.read_bytes().decode()
    except UnicodeDecodeError as exc:
        fail(f"{file}: not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8")
    try:
        r = run_in_sandbox(code=code, inputs=named, timeout_s=timeout, memory_mb=memory,
                           unsafe_local=unsafe_local)
    except SandboxError as e:
        fail(str(e))
    if as_json:
        sys.stdout.write(json.dumps(r.model_dump(), indent=2) + "\n")
    else:
        sys.stdout.write(neutralise(r.stdout))
        sys.stderr.write(neutralise(r.stderr))
        typer.echo(f"[sandbox] backend={r.backend} exit_code={r.exit_code} limit_hit={r.limit_hit} "
                   f"wall_s={r.wall_s} cpu_s={r.cpu_s} max_rss_mb={r.max_rss_mb}", err=True)
    if r.exit_code != 0 or r.limit_hit:
        raise typer.Exit(r.exit_code if 0 < r.exit_code < 128 else 1)


def register(app: typer.Typer) -> None:
    """Add the ``sandbox`` command group to the main app."""
    app.add_typer(sandbox_app, name="sandbox")
