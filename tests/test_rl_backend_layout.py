"""rl_backend's layout: it imports no harness; the modules the harness may import stay free of torch (grpo aside,
whose maths is on tensors); the subpackages state their public API."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys

import pytest

import evotrainer.rl_backend.openrlhf as openrlhf
import evotrainer.rl_backend.swe as swe

LIGHT = ["evotrainer.rl_backend.tasks", "evotrainer.rl_backend.rewards", "evotrainer.rl_backend.code_tasks",
         "evotrainer.rl_backend.math_verify_utils", "evotrainer.rl_backend.base", "evotrainer.rl_backend.swe",
         "evotrainer.rl_backend.openrlhf"]
ALL = LIGHT + ["evotrainer.rl_backend.grpo", "evotrainer.rl_backend.local", "evotrainer.rl_backend.backends",
               "evotrainer.rl_backend.swe.train", "evotrainer.rl_backend.models", "evotrainer.rl_backend.sampling",
               "evotrainer.rl_backend.tb_writer", "evotrainer.rl_backend.trackers"]


def _loaded_after(modules: list[str]) -> list[str]:
    code = f"import importlib, json, sys; [importlib.import_module(m) for m in {modules!r}]; print(json.dumps(list(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_rl_backend_imports_no_harness_servers_or_agents():
    loaded = _loaded_after(ALL)
    above = [m for m in loaded if m.startswith(("evotrainer.harness", "evotrainer.servers", "evotrainer.agents",
                                                 "evotrainer.skills_db"))]
    assert above == []


@pytest.mark.parametrize("module", LIGHT)
def test_the_pure_modules_import_no_torch(module):
    assert "torch" not in _loaded_after([module])


def test_subpackages_state_their_public_api():
    # openrlhf re-exports its API; swe names its modules (it re-exports nothing: the CLI edge stays light)
    assert openrlhf.__doc__ and [n for n in openrlhf.__all__ if not hasattr(openrlhf, n)] == []
    listed = dict(re.findall(r"^- ``(\w+)``: (.*?)(?=^- |\Z)", swe.__doc__, re.M | re.S))
    assert sorted(listed) == sorted(swe.__all__)
    for name, names in listed.items():
        mod = importlib.import_module(f"{swe.__name__}.{name}")
        assert [n for n in re.findall(r"``(\w+)``", names) if not hasattr(mod, n)] == []

