"""The real-log cases (tests/data/cases) posted the way another user of the same framework would post them:
the diagnosis's must / must_not outcome does not move when only the presentation does.

Variants (each kept only where the 2026-12-07 sweep of 186 variants found the evidence intact; docs of that sweep in
the commit 3a318a4):
- every text log with Windows line endings (CRLF);
- every number of a verl console line or a console dict printed inside its numpy type, ``np.float64(0.323)``, as
  verl's ``concat_dict_to_str`` (``pprint.pformat``) prints numpy scalars under numpy >= 2 (NEP 51);
- every ``trainer_state.json`` logged every 10 steps (steps x10, ``logging_steps=10``) and as an excerpt that starts
  at step 300 (steps +299).
Variants that remove the evidence (cutting away the failing steps) are not here: their outcome may move.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_cases import CASES
from typer.testing import CliRunner

from evotrainer.cli import app

_VERL_NUMBER = re.compile(r"(?<=:)(-?\d+\.\d+(?:e-?\d+)?|nan)(?= - |\s*$)", re.M)
_DICT_NUMBER = re.compile(r"(?<=: )(-?\d+\.\d+(?:e-?\d+)?|nan)")


def _log(case: Path) -> Path:
    (log,) = [p for p in case.iterdir() if p.name not in ("expected.json", "SOURCE.md")]
    return log


def _raised(folder: Path, out: Path) -> set[str]:
    """The finding kinds ``evotrainer diagnose folder`` raises with severity warn or blocking."""
    res = CliRunner().invoke(app, ["diagnose", str(folder), "--json", "--no-plots", "--no-skills", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return {f["kind"] for f in json.loads(res.stdout)["findings"] if f["severity"] in ("warn", "blocking")}


def _variants(case: Path) -> list[tuple[str, str]]:
    log = _log(case)
    text = log.read_text()
    if log.suffix == ".json":
        state = json.loads(text)
        out = []
        for name, f in (("steps_x10", lambda s: s * 10), ("offset300", lambda s: s + 299)):
            hist = [{**e, "step": f(e["step"])} if "step" in e else e for e in state["log_history"]]
            out.append((name, json.dumps({**state, "log_history": hist}, indent=1)))
        return out
    out = [("crlf", text.replace("\n", "\r\n"))]
    wrapped = _VERL_NUMBER.sub(lambda m: f"np.float64({m.group(1)})", text) if "step:" in text else None
    if wrapped is None and "{'" in text:
        wrapped = _DICT_NUMBER.sub(lambda m: f"np.float64({m.group(1)})", text)
    if wrapped is not None and wrapped != text:
        out.append(("npfloat", wrapped))
    return out


PARAMS = [pytest.param(c, name, body, id=f"{c.name}-{name}") for c in CASES for name, body in _variants(c)]


@pytest.mark.parametrize(("case", "variant", "body"), PARAMS)
def test_a_presentation_variant_keeps_the_outcome(case: Path, variant: str, body: str, tmp_path: Path):
    expected = json.loads((case / "expected.json").read_text())
    folder = tmp_path / case.name
    folder.mkdir()
    (folder / _log(case).name).write_text(body, newline="")
    raised = _raised(folder, tmp_path / "out")
    assert set(expected["must"]) <= raised, f"{variant}: missing {set(expected['must']) - raised}"
    assert not raised & set(expected["must_not"]), f"{variant}: false alarms {raised & set(expected['must_not'])}"


def test_the_variants_cover_every_case_and_format():
    names = {(p.values[0].name, p.values[1]) for p in PARAMS}
    assert {c for c, _ in names} == {c.name for c in CASES}
    assert {v for _, v in names} == {"crlf", "npfloat", "steps_x10", "offset300"}
    # the variant really changes the numbers' presentation: a verl line's value is wrapped in its type
    body = dict((v, b) for c, v, b in (p.values for p in PARAMS) if c.name == "nan_after_kl_overflow")["npfloat"]
    assert "np.float64(" in body and ":nan" not in body.replace("np.float64(nan)", "")
