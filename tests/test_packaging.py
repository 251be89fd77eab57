"""Packaging: a plain (non-editable) `pip install .` gives one `evotrainer` namespace and the console script.

A throwaway venv borrows the dependencies of the running interpreter through a path file (so the test
does not download torch again) and installs THIS project non-editable with --no-deps; imports are then
checked from a folder outside the repository, so the source tree cannot shadow the installed copy.
"""

from __future__ import annotations

import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_plain_pip_install_gives_one_namespace_and_console_script(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    # Dependencies from the running venv, as a plain path entry (no nested .pth processing, so the
    # editable finder of the dev install is NOT inherited).
    Path(site, "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    build = tmp_path / "src"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(build)], check=True)
    # Uncommitted work must be tested too: copy the working tree's tracked files over the clone.
    files = subprocess.check_output(["git", "ls-files"], cwd=ROOT, text=True).split()
    for f in files:
        src = ROOT / f
        if src.is_file():
            dst = build / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(build)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    code = (
        "import evotrainer, evotrainer.agents, evotrainer.servers, evotrainer.rl_backend, "
        "evotrainer.skills_db, evotrainer.harness; import pathlib; "
        "print(pathlib.Path(evotrainer.__file__).parent); print(pathlib.Path(evotrainer.agents.__file__).parent)"
    )
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    pkg_dir, agents_dir = out.stdout.split()
    assert pkg_dir == str(Path(site) / "evotrainer")
    assert agents_dir == str(Path(site) / "evotrainer" / "agents")
    help_out = subprocess.run([str(env_dir / "bin" / "evotrainer"), "--help"], capture_output=True, text=True,
                              cwd=tmp_path)
    assert help_out.returncode == 0, help_out.stderr[-2000:]
    for cmd in ("init", "lineage", "recipe"):
        assert cmd in help_out.stdout
