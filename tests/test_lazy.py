"""evotrainer.lazy: a module proxy that imports on first attribute read (serve start-up, docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evotrainer.lazy import lazy_module


def test_first_attribute_imports_the_real_module_and_later_reads_follow_it(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    cs = lazy_module("colorsys")
    assert "not loaded" in repr(cs) and "colorsys" not in sys.modules
    assert cs.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)  # red: hue 0, full saturation and value
    assert cs.load() is sys.modules["colorsys"] and "(loaded)" in repr(cs)
    monkeypatch.setattr(sys.modules["colorsys"], "ONE_THIRD", 0.5)  # a patch on the real module shows through
    assert cs.ONE_THIRD == 0.5
    with pytest.raises(TypeError, match="set it on lazy.load"):
        cs.ONE_THIRD = 1
    with pytest.raises(ValueError, match="absolute module name"):
        lazy_module(".relative")


def test_a_missing_module_fails_at_first_use_with_its_own_error():
    m = lazy_module("no_such_module_xyz")
    with pytest.raises(ModuleNotFoundError, match="no_such_module_xyz"):
        getattr(m, "anything")  # noqa: B009 (the attribute read is the point)


CHECK = ("import sys; from evotrainer.servers.app import build_server; s = build_server('all', None); "
         "print(sorted(m for m in ('torch', 'lancedb', 'transformers', 'sentence_transformers') if m in sys.modules)); "
         "from evotrainer.rl_backend import grpo; import torch; "
         "print(float(grpo.masked_mean(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([1, 1, 0]))))")


def test_building_the_servers_imports_no_torch_nor_lancedb():
    # `evotrainer serve` builds its server before any tool call: none of the heavy packages is loaded; the GRPO
    # maths still work once torch is there (masked mean of 1 and 3 = 2)
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["[]", "2.0"]
