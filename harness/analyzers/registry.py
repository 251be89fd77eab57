"""Analyzer registry: one protocol (evidence in, findings out) for built-in and runtime analyzers.

An analyzer is a callable ``fn(evidence: Evidence) -> list[Finding]``. The built-ins are declared in
the rule modules of :data:`BUILTIN_MODULES` (each an ``ANALYZERS`` table, ``rules.AnalyzerTable``) and
registered here, once, when this module is imported: an explicit list, so importing a rule module
has no side effect and the imports point one way (registry -> rule modules -> ``rules``). Agents and
users register more at run time with :func:`register_analyzer`, either as a Python callable or as
analyzer CODE, which runs in the sandbox (``evotrainer.sandbox.run_in_sandbox``) against the
evidence written as files (:meth:`Evidence.to_dir`) and mounted read-only; the code prints
findings JSON (``[{"kind", "severity", "versions", "steps", "evidence", "explanation"}]``) to
stdout. See :func:`run_analyzer_code` for the code contract.

``run_analyzers(evidence, names=None)`` runs all (or the named) analyzers. A failing runtime
analyzer yields an ``info`` finding of kind ``analyzer_error`` instead of stopping the others;
a failing built-in raises (it is a bug).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import evotrainer.harness.analyzers.behaviour as behaviour_rules
import evotrainer.harness.analyzers.builtin as builtin_rules
import evotrainer.harness.analyzers.progress as progress_rules
import evotrainer.harness.analyzers.swe as swe_rules
import evotrainer.harness.analyzers.zero_variance as zero_variance_rules
from evotrainer.errors import EvoTrainerError
from evotrainer.harness.analyzers.rules import AnalyzerFn, AnalyzerSpec, first_line
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding, parse_findings, sort_findings
from evotrainer.sandbox import run_in_sandbox
from evotrainer.sandbox.limits import owned_tmpdir, sweep_stale_folders

EVIDENCE_PREFIX = "evidence-"  # temp folders of the evidence copies that run_analyzer_code mounts

BUILTIN_MODULES: tuple[ModuleType, ...] = (builtin_rules, behaviour_rules, zero_variance_rules, progress_rules,
                                           swe_rules)
"""The rule modules whose ``ANALYZERS`` tables are the built-in analyzers, in registration order."""


class AnalyzerError(EvoTrainerError, ValueError):
    """Unknown analyzer, bad registration, or analyzer code that failed / printed invalid findings."""


_REGISTRY: dict[str, AnalyzerSpec] = {spec.name: spec for mod in BUILTIN_MODULES for spec in mod.ANALYZERS.specs}
_CHANGES = [0]  # registry changes so far (register, unregister, restore): registry_generation()


def registry_generation() -> int:
    """A number that changes whenever this process's registry changes (for caches of what was listed)."""
    return _CHANGES[0]


def register_analyzer(name: str, fn_or_code: AnalyzerFn | str, kinds: tuple[str, ...] | list[str] = (),
                      description: str = "", replace: bool = False, timeout_s: float = 60.0,
                      memory_mb: int = 1024) -> AnalyzerSpec:
    """Register a runtime analyzer: a Python callable, or analyzer code run in the sandbox.

    Args:
        name: unique snake_case name.
        fn_or_code: ``fn(evidence) -> list[Finding]``, or Python source (see :func:`run_analyzer_code`).
        kinds: finding kinds it may report (documentation and backtest filters).
        description: one line for listings.
        replace: overwrite an existing runtime analyzer of the same name.
        timeout_s, memory_mb: sandbox limits for code analyzers.

    Raises:
        AnalyzerError: bad name, a built-in of that name, or a duplicate without ``replace``.
    """
    if not name or not name.replace("_", "").isalnum():
        raise AnalyzerError(f"analyzer name {name!r}: use a snake_case name such as 'reward_spike'")
    old = _REGISTRY.get(name)
    if old is not None and old.builtin:
        raise AnalyzerError(f"analyzer {name!r} is a built-in; pick another name")
    if old is not None and not replace:
        raise AnalyzerError(f"analyzer {name!r} is registered already; pass replace=True to overwrite it")
    if isinstance(fn_or_code, str):
        code = fn_or_code
        try:
            compile(code, f"<analyzer {name}>", "exec")
        except SyntaxError as exc:
            raise AnalyzerError(f"analyzer {name!r}: syntax error line {exc.lineno}: {exc.msg}") from None

        def fn(ev: Evidence) -> list[Finding]:
            return run_analyzer_code(code, ev, name=name, timeout_s=timeout_s, memory_mb=memory_mb)

        spec = AnalyzerSpec(name=name, fn=fn, kinds=tuple(kinds), description=description, code=code,
                            options={"timeout_s": timeout_s, "memory_mb": memory_mb})
    elif callable(fn_or_code):
        spec = AnalyzerSpec(name=name, fn=fn_or_code, kinds=tuple(kinds),
                            description=description or first_line(fn_or_code.__doc__))
    else:
        raise AnalyzerError(f"analyzer {name!r}: pass a callable or Python source, got {type(fn_or_code).__name__}")
    _REGISTRY[name] = spec
    _CHANGES[0] += 1
    return spec


def unregister_analyzer(name: str) -> None:
    """Remove a runtime analyzer.

    Raises:
        AnalyzerError: unknown name, or a built-in.
    """
    spec = get_analyzer(name)
    if spec.builtin:
        raise AnalyzerError(f"analyzer {name!r} is a built-in and cannot be removed")
    del _REGISTRY[name]
    _CHANGES[0] += 1


def put_back_analyzer(name: str, spec: AnalyzerSpec | None) -> None:
    """Put one runtime analyzer back as it was before a registration: ``spec`` (what :func:`registry_snapshot` held
    under ``name``), or none when ``name`` was not registered. For a registration whose store write failed (review
    12, F-R12: MCP ``register_analyzer`` on a full disk kept the analyzer in the process, runnable but not stored)."""
    if spec is None:
        _REGISTRY.pop(name, None)
    else:
        _REGISTRY[name] = spec
    _CHANGES[0] += 1


def get_analyzer(name: str) -> AnalyzerSpec:
    """One registered analyzer.

    Raises:
        AnalyzerError: unknown name (the message lists the registered ones).
    """
    if name not in _REGISTRY:
        raise AnalyzerError(f"unknown analyzer {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def list_analyzers(builtin: bool | None = None) -> list[AnalyzerSpec]:
    """Registered analyzers (built-ins first, then runtime ones), optionally only one sort."""
    specs = [s for s in _REGISTRY.values() if builtin is None or s.builtin == builtin]
    return sorted(specs, key=lambda s: (not s.builtin, s.name))


def registry_snapshot() -> dict[str, AnalyzerSpec]:
    """A copy of the registry (name -> spec), for :func:`restore_registry` (tests, scoped registrations)."""
    return dict(_REGISTRY)


def restore_registry(snapshot: dict[str, AnalyzerSpec]) -> None:
    """Put the registry back to a :func:`registry_snapshot` (runtime analyzers registered since are gone)."""
    _REGISTRY.clear()
    _REGISTRY.update(snapshot)
    _CHANGES[0] += 1


def run_analyzers(evidence: Evidence, names: list[str] | None = None) -> list[Finding]:
    """Run all (or the named) analyzers on the evidence; findings sorted most severe first.

    Raises:
        AnalyzerError: an unknown name.
    """
    specs = [get_analyzer(n) for n in names] if names else list_analyzers()
    out = _run_specs(specs, evidence)
    return sort_findings(_judge_before_blowup(evidence, out, specs))


BLOWUP_MIN_BEFORE = 2
"""Logged steps a version needs before its first non-finite step for its other findings to be judged again on those
steps alone (:func:`_judge_before_blowup`); with fewer, its findings stand as the whole run gave them."""


def _judge_before_blowup(ev: Evidence, found: list[Finding], specs: list[AnalyzerSpec]) -> list[Finding]:
    """Findings of a version whose values turn non-finite and stay so (a blocking ``nan_blowup`` from step ``s``)
    judged again on its steps before ``s``: after a blow-up the logged losses, entropy, lengths and rewards are
    those of corrupt weights, and the analyzers reading them would name as separate failures (entropy collapse,
    length blow-up, truncation, plateau) what is one event (a new user's report on the ``nan_after_kl_overflow``
    case: four such findings beside the NaN). For each such version, with at least :data:`BLOWUP_MIN_BEFORE` logged
    steps before ``s``, the analyzers (but ``nan_blowup``) run on :meth:`Evidence.before` ``s``; then every
    warn / blocking finding of that version alone that reaches step ``s``

    * is replaced by the finding of the same kind on the steps before ``s``, where there is one (its numbers are the
      run's own, not the wreck's; it says so), else
    * stays, as ``info``, saying it is not seen before ``s``: a consequence of the blow-up, not a separate cause;

    and a warn / blocking finding the steps before ``s`` raise that the whole run did not (a KL rise that the NaN
    steps hide from a start-against-end comparison) is added, saying so. Findings of other versions, of several
    versions, without steps, or ending before ``s`` are unchanged. The rows logged at step ``s`` itself go with the
    wreck, although a trainer logs that step's rollouts from the weights before its update: a cause seen only at
    ``s`` shows as a consequence, with its numbers."""
    cuts: dict[str, int] = {}
    for f in found:
        first = f.data.get("first_step") if f.kind == "nan_blowup" and f.severity == "blocking" else None
        if isinstance(first, int) and len(f.versions) == 1:
            v = f.versions[0]
            logged = {int(x) for s, _ in ev.metrics.get(v, {}).values() for x in s[s < first]}
            if len(logged) >= BLOWUP_MIN_BEFORE:
                cuts[v] = min(first, cuts.get(v, first))
    if not cuts:
        return found
    before = _run_specs([s for s in specs if s.name != "nan_blowup"], ev.before(cuts))

    def own(f: Finding) -> str | None:
        return f.versions[0] if len(f.versions) == 1 and f.versions[0] in cuts and f.kind != "nan_blowup" else None

    again = {(f.kind, own(f)): f for f in before if own(f) and f.is_failure}
    out: list[Finding] = []
    for f in found:
        v = own(f)
        if v is None or not f.is_failure or not f.steps or max(f.steps) < cuts[v]:
            out.append(f)
            continue
        cut = cuts[v]
        prior = again.get((f.kind, v))
        if prior is not None:
            out.append(prior.model_copy(update={
                "data": {**prior.data, "before_blowup": cut},
                "explanation": f"{prior.explanation} (Judged on the steps before {cut}, where the values turn "
                               f"non-finite: nan_blowup.)"}))
        else:
            out.append(f.model_copy(update={
                "severity": "info", "data": {**f.data, "after_blowup": cut},
                "explanation": f"{f.explanation} Not seen on the steps before {cut}, where the values turn non-finite "
                               f"(nan_blowup): a consequence of the blow-up, not a separate cause."}))
    shown = {(f.kind, own(f)) for f in found if own(f)}
    for key, f in again.items():
        if key not in shown:
            out.append(f.model_copy(update={
                "data": {**f.data, "before_blowup": cuts[key[1]]},
                "explanation": f"{f.explanation} (Seen on the steps before {cuts[key[1]]}, where the values turn "
                               f"non-finite: nan_blowup; the whole run's steps hide it.)"}))
    return out


def _run_specs(specs: list[AnalyzerSpec], evidence: Evidence) -> list[Finding]:
    """Each spec's findings on ``evidence`` (a runtime analyzer's failure as an ``analyzer_error`` info finding)."""
    out: list[Finding] = []
    for spec in specs:
        if spec.builtin:
            found = spec.fn(evidence)
        else:
            try:
                found = spec.fn(evidence)
            except Exception as exc:  # a runtime analyzer must not stop the diagnosis
                found = [Finding(kind="analyzer_error", severity="info", analyzer=spec.name,
                                 explanation=f"analyzer {spec.name} failed: {type(exc).__name__}: {exc}")]
        for f in found:
            if not f.analyzer:
                f.analyzer = spec.name
        out.extend(found)
    return out


def run_analyzer_code(code: str, evidence: Evidence, name: str = "sandboxed", timeout_s: float = 60.0,
                      memory_mb: int = 1024) -> list[Finding]:
    """Run analyzer source in the sandbox against the evidence; return the findings it prints.

    Code contract: the evidence folder (:meth:`Evidence.to_dir` files: ``metrics.json``,
    ``metrics.parquet``, ``rollouts.parquet`` when there are rollouts, ``evals.json``,
    ``meta.json``) is mounted read-only at ``/evidence/<file>``; the folder is also in the
    environment variable ``EVIDENCE_DIR``. The code may import numpy, pandas, pyarrow and duckdb.
    It prints a JSON list of findings (or ``{"findings": [...]}``) as the
    last line of stdout; ``analyzer`` is filled in with ``name``.

    Raises:
        AnalyzerError: the code exited non-zero, hit a sandbox limit, or printed no valid findings
            JSON (the message quotes the end of stderr / stdout).
    """
    # named for this process: a copy of the run's data that a server killed with SIGTERM left behind is removed by
    # the next run here (review 10, W-R10: /tmp/evidence-XXXX piled up)
    sweep_stale_folders(EVIDENCE_PREFIX)
    with owned_tmpdir(EVIDENCE_PREFIX) as tmp:
        evidence_dir = evidence.to_dir(Path(tmp) / "evidence")
        res = _call_sandbox(code, evidence_dir, timeout_s, memory_mb)
    if res.exit_code != 0 or getattr(res, "limit_hit", None):
        tail = (res.stderr or res.stdout or "")[-600:].strip()
        limit = f" (limit hit: {res.limit_hit})" if getattr(res, "limit_hit", None) else ""
        raise AnalyzerError(f"analyzer {name!r} exited {res.exit_code}{limit}: {tail}")
    lines = [ln for ln in (res.stdout or "").strip().splitlines() if ln.strip()]
    if not lines:
        raise AnalyzerError(f"analyzer {name!r} printed nothing; print a JSON list of findings as the last line")
    try:
        payload = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise AnalyzerError(f"analyzer {name!r}: last stdout line is not JSON: {lines[-1][:200]!r}") from None
    except RecursionError:  # sandboxed code printed JSON nested past Python's recursion limit
        raise AnalyzerError(f"analyzer {name!r}: last stdout line is JSON nested too deeply to read; print a flat "
                            "list of findings") from None
    try:
        return parse_findings(payload, analyzer=name)
    except ValueError as exc:
        raise AnalyzerError(f"analyzer {name!r}: {exc}") from None


def _call_sandbox(code: str, evidence_dir: Path, timeout_s: float, memory_mb: int):
    """Run ``code`` with each evidence file mounted read-only at ``/evidence/<file>``."""
    inputs = {p.name: p for p in sorted(evidence_dir.iterdir())}
    return run_in_sandbox(code=code, inputs=inputs, env={"EVIDENCE_DIR": "/evidence"}, timeout_s=timeout_s,
                          memory_mb=memory_mb)
