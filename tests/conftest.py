"""Shared fixtures: offline hubs, user directories moved into a temp dir (like simonw/llm's conftest)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from sandbox_backends import docker_sandbox_env, sandbox_backend  # noqa: F401 - fixtures (bwrap / docker)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No terminal size from the caller: the CLI's consoles are made when evotrainer.cli is imported (at collection) and
# fix their width then, from COLUMNS when set, else 160 columns for piped output (terminal.output_console). COLUMNS=80,
# exported in a shell or set by pytest-xdist in its workers, squeezed the tables that tests read and failed two of them.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# The skills memory of the whole session, set before any fixture (module- and session-scoped ones run before the
# function-scoped _isolated_user_dirs below, and subprocesses inherit it): a module fixture that ran the loop wrote
# its learned analyzers into the user's real memory, and a later `make run` on that machine inherited them.
_SESSION_SKILLS = tempfile.mkdtemp(prefix="evotrainer-test-skills-")
os.environ["EVOTRAINER_SKILLS_DIR"] = _SESSION_SKILLS
atexit.register(shutil.rmtree, _SESSION_SKILLS, True)


@pytest.fixture(scope="module", autouse=True)
def _module_temp_dirs_removed(request, tmp_path_factory):
    """The temp dirs a test module made (``tmp_path_factory.mktemp`` in its fixtures: checkpoints, run folders,
    skills stores) are removed when the module ends with no failure; a failed module keeps them to be read.

    ``tmp_path_retention_policy = "failed"`` (pyproject) removes a passing test's own ``tmp_path`` but not the
    ``mktemp`` folders, and the suite's model checkpoints and run folders grew past 5 GB of /tmp in one session:
    the CI machine's disk filled and 230 tests errored at setup ("No space left on device")."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed == failed_before:
        for path in set(base.iterdir()) - before:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Skills memory and caches of one test never touch the user's real folders."""
    monkeypatch.setenv("EVOTRAINER_SKILLS_DIR", str(tmp_path_factory.mktemp("skills")))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    yield



@pytest.fixture(autouse=True)
def _analyzer_registry_restored():
    """Analyzers a test registers at run time (sandboxed code, synthesised rules) are gone after it: the
    registry is process-global, and a leaked ``always_blocking_x`` made later tests' diagnoses block."""
    from evotrainer.harness import analyzers

    before = analyzers.registry_snapshot()
    yield
    analyzers.restore_registry(before)
