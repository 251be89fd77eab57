"""Security suite, bad input from sandboxed code or callers gets the product's own error (issue 22's second
probe set; docs/security-probes.md). Before the fix: an analyzer printing ``[`` x 100,000 made
``run_analyzer_code`` raise a bare ``RecursionError`` (callers catch ``AnalyzerError``); an ``env`` value with a
NUL byte made ``run_in_sandbox`` raise ``ValueError: embedded null byte`` from ``subprocess`` instead of a
``SandboxError`` naming the field. Both leave the host as it was (the sandbox's private tmpfs is discarded).
"""

from __future__ import annotations

import json

import pytest
from mcp_testlib import make_run

from evotrainer.harness.analyzers import AnalyzerError, run_analyzer_code
from evotrainer.harness.evidence import Evidence
from evotrainer.sandbox import SandboxError, run_in_sandbox
from evotrainer.workspace import Workspace


def test_deeply_nested_analyzer_output_is_an_analyzer_error(tmp_path):
    with Workspace.open(make_run(tmp_path)) as ws:
        ev = Evidence.from_workspace(ws)
    with pytest.raises(AnalyzerError, match=r"^analyzer 'deep': last stdout line is JSON nested too deeply to read"):
        run_analyzer_code("print('[' * 100000 + ']' * 100000)", ev, name="deep", timeout_s=60)


@pytest.mark.parametrize("env", [{"A": "x\x00y"}, {"A\x00B": "x"}])
def test_nul_in_env_is_a_sandbox_error_naming_the_field(env):
    with pytest.raises(SandboxError, match=r"^env\[.*\]: names must be non-empty strings without '=' or NUL"):
        run_in_sandbox(code="print(1)", env=env)


def test_a_foreign_metric_name_cannot_become_analyzer_code():
    from evotrainer.harness.synthesis import Example, Program, SynthesisError, candidate_series

    evil = "reward/x\nimport os; os.system('touch PWNED')\n#/mean"
    ev = Evidence(metrics={f"v{i}": {evil: [(s, 0.1 * s) for s in range(10)],
                                     "reward/correctness/mean": [(s, 0.1 * s) for s in range(10)]} for i in range(4)})
    examples = [Example(ev, f"v{i}", i % 2 == 0, "case") for i in range(4)]
    assert candidate_series(examples) == ["reward/correctness/mean"]
    with pytest.raises(SynthesisError, match=r'^series="reward/x\\nimport os.*: a metric name of letters'):
        Program(series=evil, stat="slope", window=1.0, direction="above", threshold=0.0)


_QUANTILE = {"series": "reward/mean", "stat": "quantile", "window": 0.5, "direction": "above", "threshold": 0.1}


@pytest.mark.parametrize(("field", "value", "match"), [
    ("q", '0.5\nimport os; print("INJECTED", os.getuid())  #', r"^q='0\.5\\nimport os.*: need a finite number"),
    ("q", "0.5", r"^q='0\.5': need a finite number"),
    ("q", float("nan"), r"^q=nan: need a finite number"),
    ("q", 1.5, r"^q=1\.5: a quantile in \[0, 1\]"),
    ("threshold", "x", r"^threshold='x': need a finite number"),
    ("threshold", float("inf"), r"^threshold=inf: need a finite number"),
    ("threshold", 10 ** 400, r"^threshold=an integer of 1,329 bits: need a finite number"),
    ("window", "0.5", r"^window='0\.5': need a finite number"),
])
def test_a_program_number_cannot_become_analyzer_code(field, value, match):
    """Review 10, Y-R10: ``q`` (a ``loop/analyzers/synthesised`` kv row of a run from elsewhere, an MCP
    ``start_training.early_stop`` program) went unchecked into ``describe()``, a comment line of the compiled
    analyzer: a newline in it made line 2 ``import os; print("INJECTED", ...)``; ``threshold: "x"`` was a bare
    ``ValueError: Unknown format code 'g'``."""
    from evotrainer.harness.synthesis import Program, SynthesisError, compile_program

    with pytest.raises(SynthesisError, match=match):
        compile_program(Program.from_dict({**_QUANTILE, field: value}))


def test_a_valid_program_compiles_as_before():
    """The source of a valid program is what it was before the check (passes before and after the fix)."""
    from evotrainer.harness.synthesis import Program, compile_program

    prog = Program.from_dict({**_QUANTILE, "q": 0.25})
    src = compile_program(prog)
    assert src.splitlines()[0] == "# synthesised analyzer: quantile(reward/mean, window 50%, q=0.25) above 0.1"
    assert src.splitlines()[1] == "import json, os"
    assert "PROGRAM = {'series': 'reward/mean', 'stat': 'quantile', 'window': 0.5, 'direction': 'above', " \
           "'threshold': 0.1, 'q': 0.25, 'kind': 'predicted_regression'}" in src
    compile(src, "synth", "exec")


def test_host_keyring_names_and_timers_are_masked():
    """As host root the sandbox uid is host uid 0: before the fix /proc/keys listed root's keyrings (463 bytes
    here: ``_uid.0``, ``_uid_ses.0``, ...); keyctl was refused by seccomp, the listing was not."""
    code = ("import os\nfor p in ('/proc/keys', '/proc/key-users', '/proc/timer_list'):\n"
            "    try:\n        print(p, len(open(p).read()))\n    except OSError as e:\n        print(p, 'refused')\n")
    r = run_in_sandbox(code=code, timeout_s=30)
    assert r.exit_code == 0, r.stderr
    shown = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert all(v in ("refused", "0") for v in shown.values()), shown


def test_extreme_finite_metric_values_still_plot_in_diagnose_and_the_report(tmp_path):
    """A foreign log's ``kl: 1e308`` and ``loss: -1e308`` are finite, so kept as evidence; on one plot axis their
    range overflowed to inf in matplotlib's tick layout (``ValueError: arange: cannot compute length``), which
    ended ``diagnose`` before any finding was printed and ``evotrainer report`` of the imported run. Values beyond
    ±1e100 are drawn as marks now, like NaN; the findings still see them."""
    from evotrainer.agents.report import write_report
    from evotrainer.harness.analyzers import run_analyzers
    from evotrainer.harness.importer import import_run
    from evotrainer.harness.ingest import ingest
    from evotrainer.harness.plots import plot_evidence

    src = tmp_path / "foreign"
    src.mkdir()
    (src / "metrics.jsonl").write_text("".join(
        f'{{"step": {i}, "reward": {i / 40}, "kl": {"1e308" if i % 2 else "-1e308"}, "entropy": {1 - i / 40}}}\n'
        for i in range(1, 40)))
    ev = ingest(src)
    findings = run_analyzers(ev)
    assert [p.name for p in plot_evidence(ev, findings, tmp_path / "plots")] == ["foreign.png"]
    import_run(src, tmp_path / "run")
    with Workspace.open(tmp_path / "run") as ws:
        assert write_report(ws).stat().st_size > 0


@pytest.mark.parametrize("name", ["reward/$\\frac{$/mean", "rewards/$" + "x^{" * 400 + "1" + "}" * 400 + "$/mean"])
def test_dollar_signs_in_metric_and_folder_names_are_drawn_as_text(tmp_path, name):
    """matplotlib reads text between two ``$`` as mathtext: a foreign JSONL's reward component
    ``reward/$\\frac{$/mean`` (or a folder ``run$\\sqrt{$``) ended ``diagnose`` with ParseSyntaxException after the
    analyzers had run, one nested 400 deep with RecursionError, and the report of the imported run the same way.
    Every ``$`` is escaped now (plots.plain); the names are drawn as written."""
    from evotrainer.agents.report import write_report
    from evotrainer.harness.analyzers import run_analyzers
    from evotrainer.harness.importer import import_run
    from evotrainer.harness.ingest import ingest
    from evotrainer.harness.plots import plot_evidence

    src = tmp_path / "run$\\sqrt{$"
    src.mkdir()
    (src / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "reward": i / 40, name: i / 80, "entropy": 1 - i / 40}) + "\n" for i in range(1, 20)))
    ev = ingest(src)
    assert [p.name for p in plot_evidence(ev, run_analyzers(ev), tmp_path / "plots")] == ["run_sqrt_.png"]
    import_run(src, tmp_path / "run")
    with Workspace.open(tmp_path / "run") as ws:
        assert write_report(ws).stat().st_size > 0


def test_thousands_of_reward_components_draw_a_bounded_number_of_curves(tmp_path, monkeypatch):
    """Review 7: a 300 KB foreign JSONL naming 2,500 reward components (``reward/c<i>/mean``) took ``diagnose`` 24 s
    (5,000: 79 s, faster than linear: a curve and a legend entry each) and ``report`` of its import past 300 s and
    3.7 GB (a panel each); a 6 MB one would take hours. Only the first MAX_COMPONENTS are drawn now."""
    import matplotlib.axes

    from evotrainer.agents.report import curve_panels, write_report
    from evotrainer.harness.importer import import_run
    from evotrainer.harness.ingest import ingest
    from evotrainer.harness.plots import MAX_COMPONENTS, plot_evidence

    src = tmp_path / "wide"
    src.mkdir()
    (src / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, f"reward/c{i}/mean": 0.5, "reward": 0.1}) + "\n" for i in range(2000)))
    curves = []
    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **k: curves.append(1) or real_plot(ax, *a, **k))
    assert len(plot_evidence(ingest(src), [], tmp_path / "plots")) == 1
    assert len(curves) <= MAX_COMPONENTS + 20, len(curves)  # the key panels' few series and 12 components
    import_run(src, tmp_path / "run")
    with Workspace.open(tmp_path / "run") as ws:
        comps = [n for _, n, _ in curve_panels(ws) if n.startswith("reward/c")]
        assert comps == sorted(f"reward/c{i}/mean" for i in range(2000))[:MAX_COMPONENTS]
        curves.clear()
        assert write_report(ws).stat().st_size > 0
        assert len(curves) <= MAX_COMPONENTS + 20, len(curves)


def test_sandbox_run_names_a_file_it_cannot_run_without_reading_it_whole(tmp_path):
    """``evotrainer sandbox run`` of a file that is not UTF-8 said "error: UnicodeDecodeError: 'utf-8' codec can't
    decode byte 0xff in position 12" (no file named), and read a 3 GiB sparse file whole (MemoryError under a
    2.5 GB address-space cap; 3 GiB and more allocated without one). Both are refused now, naming the file."""
    from typer.testing import CliRunner

    from evotrainer.cli import app

    bad = tmp_path / "bad.py"
    bad.write_bytes(b'print("hi")\n\xff\xfe\n')
    r = CliRunner().invoke(app, ["sandbox", "run", str(bad)])
    assert r.exit_code == 1 and f"error: {bad}: not UTF-8 text (byte 12: invalid start byte); save it as UTF-8" in (
        r.stderr)
    big = tmp_path / "sparse.py"
    with open(big, "wb") as f:
        f.truncate(3 << 30)
    r = CliRunner().invoke(app, ["sandbox", "run", str(big)])
    assert r.exit_code == 1 and f"error: {big}: 3072 MiB; a Python file to run is at most 16 MiB" in r.stderr


def test_limits_past_what_an_rlimit_holds_are_refused_naming_the_field(tmp_path):
    """Review 7: ``sandbox run --timeout inf`` ended with a bare "OverflowError: cannot convert float infinity to
    integer"; ``--timeout 1e308`` and ``--memory 99999999999999`` made the launcher's setrlimit overflow inside the
    sandbox, reported as the program's own exit 1. Each limit is now at most LIMIT_MAX, named (flag or field)."""
    from typer.testing import CliRunner

    from evotrainer.cli import app
    from evotrainer.sandbox.api import LIMIT_MAX

    prog = tmp_path / "p.py"
    prog.write_text("print('ran')\n")
    for flag, value, unit in (("--timeout", "inf", "seconds"), ("--timeout", "1e308", "seconds"),
                              ("--memory", "99999999999999", "MiB")):
        r = CliRunner().invoke(app, ["sandbox", "run", str(prog), flag, value])
        assert r.exit_code == 1 and f"must be > 0 {unit} and at most {LIMIT_MAX:,}" in r.stderr, (flag, r.output)
        assert "ran" not in r.stdout
    for field, value in (("timeout_s", float("inf")), ("memory_mb", 10 ** 14), ("cpu_s", 1e300)):
        with pytest.raises(SandboxError, match=rf"^{field}=.*: must be > 0 and at most"):
            run_in_sandbox(code="print('ran')", **{field: value})


def test_an_env_value_past_the_kernels_string_limit_is_a_sandbox_error_naming_it():
    """Review 7: ``env={"X": 200,000 bytes}`` came back as the program's own exit 1 with bwrap's "execvp ...: Argument
    list too long" (the kernel's MAX_ARG_STRLEN). It is refused before the run now, naming the variable; the largest
    value that fits still runs."""
    from evotrainer.sandbox.api import ENV_ENTRY_MAX

    most = ENV_ENTRY_MAX - 3  # "X=" + value + NUL fills the limit exactly
    r = run_in_sandbox(code="import os; print(len(os.environ['X']))", env={"X": "a" * most}, timeout_s=30)
    assert r.exit_code == 0 and r.stdout.strip() == str(most), (r.stdout, r.stderr[-300:])
    with pytest.raises(SandboxError, match=rf"^env\['X'\]: {most + 1:,} bytes; one variable is at most {most:,} bytes"):
        run_in_sandbox(code="pass", env={"X": "a" * (most + 1)})
