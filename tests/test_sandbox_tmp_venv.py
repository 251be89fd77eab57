"""Regression: a clone (and its .venv) under /tmp must run sandboxed code.

bwrap mounts a fresh tmpfs on /tmp; the interpreter prefixes were bound before it, so a venv under /tmp
vanished inside the sandbox ("bwrap: execvp /tmp/.../.venv/bin/python: No such file or directory"), seen
by a new user who cloned into /tmp. The test builds a venv under pytest's tmp dir (in /tmp) that borrows
this environment's packages and runs code through the real sandbox from it.
"""

from __future__ import annotations

import subprocess
import sysconfig
import venv

from evotrainer.sandbox import sandbox_info


def test_sandbox_runs_code_from_a_venv_under_tmp(tmp_path):
    assert str(tmp_path).startswith("/tmp/")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    main_site = sysconfig.get_paths()["purelib"]  # processed with its own .pth files (the editable finder)
    (tmp_path / "venv" / site.split(str(env_dir) + "/", 1)[1]).mkdir(parents=True, exist_ok=True)
    with open(f"{site}/_borrow.pth", "w") as f:
        f.write(f"import site; site.addsitedir({main_site!r})\n")
    code = ("from evotrainer.sandbox import run_in_sandbox; import sys; "
            "r = run_in_sandbox(code='print(6 * 7)', timeout_s=60); print(sys.prefix); "
            "print(r.backend, r.exit_code, r.stdout.strip(), repr(r.stderr[:200]))")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    prefix, result = out.stdout.strip().splitlines()[-2:]
    assert prefix == str(env_dir)
    assert result == f"{sandbox_info()['backend']} 0 42 ''"  # backend, exit code, stdout, empty stderr
