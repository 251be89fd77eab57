"""evotrainer.lazy: a module proxy that imports on first attribute read (serve start-up, docs/performance.md)."""

from __future__ import annotations

import os
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


def test_a_deferred_package_init_imports_each_name_from_its_submodule_and_runs_init_only_for_the_rest(
        tmp_path, monkeypatch):
    from evotrainer.lazy import defer_package_init

    pkg = tmp_path / "defpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os\nos.environ['DEFPKG_INIT'] = str(int(os.environ.get('DEFPKG_INIT', '0')) + 1)\n"
        "from defpkg.a import A\nfrom defpkg.b import B as Bee  # renamed\nVALUE = 42\n__all__ = ['A', 'Bee', 'VALUE']\n")
    (pkg / "a.py").write_text("A = 'a'\n")
    (pkg / "b.py").write_text("from defpkg import sub  # a submodule read through the package\nB = 'b'\n")
    (pkg / "sub" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DEFPKG_INIT", raising=False)
    for name in [m for m in sys.modules if m.startswith("defpkg")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        assert defer_package_init("defpkg") is True
        import defpkg

        assert defpkg.A == "a" and defpkg.Bee == "b"  # each from its own submodule
        assert "DEFPKG_INIT" not in os.environ and "defpkg.b" in sys.modules
        import defpkg.sub  # submodules import as usual (the package's __path__ is set)

        assert defpkg.sub.__name__ == "defpkg.sub" and "DEFPKG_INIT" not in os.environ
        assert defpkg.VALUE == 42 and os.environ["DEFPKG_INIT"] == "1"  # a name of __init__ itself: it runs once
        assert defpkg.__all__ == ["A", "Bee", "VALUE"] and os.environ["DEFPKG_INIT"] == "1"
        with pytest.raises(AttributeError, match="module 'defpkg' has no attribute 'nothing'"):
            defpkg.nothing  # noqa: B018
        assert defer_package_init("defpkg") is False  # already imported: nothing changes
        assert defer_package_init("no_such_package_xyz") is False
        assert defer_package_init("defpkg_missing.child") is False  # parent not imported
    finally:
        for name in [m for m in sys.modules if m.startswith("defpkg")]:
            del sys.modules[name]


def test_import_lancedb_leaves_the_rest_namespace_apis_unimported_until_read():
    """LanceDB's REST namespace client (lance-namespace) is what ``import lancedb`` spent most of its time on
    (docs/performance.md §1); its API classes are imported only when read, and are then the real ones."""
    code = ("import sys; from evotrainer.lazy import import_lancedb; import_lancedb(); "
            "print('lance_namespace_urllib3_client.api.table_api' in sys.modules, 'lancedb' in sys.modules); "
            "from lance_namespace_urllib3_client import TableApi, ApiClient; "
            "import lance_namespace_urllib3_client.api.table_api as t, lance_namespace_urllib3_client.api_client as c; "
            "print(TableApi is t.TableApi and ApiClient is c.ApiClient); "
            "import lance_namespace; print(lance_namespace.LanceNamespace.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "True", "True", "LanceNamespace"]


def test_a_process_that_loaded_lancedb_starts_subprocesses_without_its_fork_warning():
    """A subprocess started with a ``preexec_fn`` (the sandbox's limits, Ray's workers) ran LanceDB's after-fork hook,
    whose RuntimeWarning reached the parent's terminal (the hook runs before the child's stderr is redirected): 15
    times over the three runs of an ``evotrainer compare``. The same start after ``import lancedb`` alone still
    warns (so the test can see the warning at all)."""
    start = ("import subprocess, sys; r = subprocess.run(['true'], preexec_fn=lambda: None, capture_output=True); "
             "print(r.returncode)")
    plain = subprocess.run([sys.executable, "-c", "import lancedb; " + start], capture_output=True, text=True,
                           timeout=300, check=True)
    ours = subprocess.run([sys.executable, "-c", "from evotrainer.lazy import import_lancedb; import_lancedb(); "
                           + start], capture_output=True, text=True, timeout=300, check=True)
    assert plain.stdout.split() == ours.stdout.split() == ["0"]
    assert "lancedb fork support is experimental" in plain.stderr
    assert "fork support" not in ours.stderr and ours.stderr == ""
