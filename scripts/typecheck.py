"""`make lint`'s type check: mypy on core (evotrainer/*.py, evotrainer/sandbox/) and rl_backend/.

mypy cannot read setuptools' ``package-dir`` mapping (``evotrainer.rl_backend`` is ``rl_backend/``, ...),
so this lays the one import namespace out as a tree of symbolic links in ``build/typecheck/`` (read from
pyproject.toml, rebuilt on every run) and runs mypy there with the ``[tool.mypy]`` settings of
pyproject.toml. Paths in the output are the repository's own (``rl_backend/tasks.py``, not the link).

Usage: python scripts/typecheck.py [extra mypy arguments]   (exit status: mypy's)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"
CACHE = ROOT / "build" / "mypy_cache"
CORE = "evotrainer"
# What is checked: every core module and core subpackage (evotrainer/sandbox/, ...) and these packages.
CHECKED_PACKAGES = ("evotrainer.rl_backend",)


def package_dirs() -> dict[str, Path]:
    """pyproject's ``package-dir``: import name -> folder (``evotrainer.rl_backend`` -> ``rl_backend/``)."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {name: ROOT / folder for name, folder in conf["tool"]["setuptools"]["package-dir"].items()}


def build_tree(dirs: dict[str, Path]) -> None:
    """``build/typecheck/evotrainer/`` holds links to the core's entries and to each mapped folder."""
    shutil.rmtree(TREE, ignore_errors=True)
    core = TREE / CORE
    core.mkdir(parents=True)
    mapped = {name.split(".")[1] for name in dirs if name != CORE}
    for entry in sorted(dirs[CORE].iterdir()):
        if entry.name not in mapped and entry.name != "__pycache__":
            (core / entry.name).symlink_to(entry)
    for name, folder in sorted(dirs.items()):
        if name != CORE:
            (TREE / name.replace(".", "/")).symlink_to(folder, target_is_directory=True)


def targets(dirs: dict[str, Path]) -> list[str]:
    """mypy's ``-m`` / ``-p`` arguments: core modules, core subpackages, CHECKED_PACKAGES."""
    out: list[str] = []
    for entry in sorted(dirs[CORE].iterdir()):
        if entry.suffix == ".py":
            out += ["-m", CORE if entry.stem == "__init__" else f"{CORE}.{entry.stem}"]
        elif (entry / "__init__.py").is_file() and entry.name not in {n.split(".")[1] for n in dirs if n != CORE}:
            out += ["-p", f"{CORE}.{entry.name}"]
    for pkg in CHECKED_PACKAGES:
        out += ["-p", pkg]
    return out


def main(argv: list[str]) -> int:
    dirs = package_dirs()
    build_tree(dirs)
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(CACHE),
           *targets(dirs), *argv]
    r = subprocess.run(cmd, cwd=TREE, capture_output=True, text=True)
    # evotrainer/rl_backend/x.py (the link) -> rl_backend/x.py (the file)
    links = sorted(((name.replace(".", "/") + "/", folder.relative_to(ROOT).as_posix() + "/")
                    for name, folder in dirs.items() if name != CORE), key=lambda p: -len(p[0]))
    pattern = re.compile("^(" + "|".join(re.escape(a) for a, _ in links) + ")", re.M)
    real = dict(links)
    sys.stdout.write(pattern.sub(lambda m: real[m.group(1)], r.stdout))
    sys.stderr.write(r.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
