"""CLI commands of evotrainer.harness, added to the main app by :func:`register`.

``evotrainer diagnose PATH [--json] [--out DIR]``: ingest a run folder (EvoTrainer workspace or a
run of verl / TRL / OpenRLHF) or a log file, run every analyzer, print the findings (rich table,
or JSON with ``--json``) and write plots of the key series (of at most
:data:`~evotrainer.harness.plots.MAX_PLOTTED_VERSIONS` versions, the rest said). For each warn / blocking finding it
prints what was judged (level, change or trend), the evidence (each series' values at the
finding's steps) and the interventions that address it from the skills memory (``skills_db``:
a hybrid search of the finding's explanation among the interventions for its kind), so a user
knows what to change. ``evotrainer analyzers list`` shows the registered analyzers.

``evotrainer watch PATH``: follow a growing run and print findings as they appear (the logic is
``harness/watch.py``'s :class:`~evotrainer.harness.watch.Watcher`; its docstring describes the options).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from evotrainer.terminal import neutralise, output_console

if TYPE_CHECKING:
    from evotrainer.harness.findings import Finding

analyzers_app = typer.Typer(help="List the diagnostic analyzers.", no_args_is_help=True)

SEVERITY_STYLE = {"blocking": "bold red", "warn": "yellow", "info": "dim"}


def diagnose(
    path: Annotated[Path, typer.Argument(help="Run folder (EvoTrainer workspace or foreign run) or a log file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print findings and a summary as JSON.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for plots (default: <run>/reports/diagnose "
                                             "for a workspace, ./diagnose/<name> otherwise).")] = None,
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Do not write plots.")] = False,
    analyzer: Annotated[list[str] | None, typer.Option("--analyzer", "-a",
                                                       help="Run only these analyzers (repeatable).")] = None,
    fail_on: Annotated[str, typer.Option("--fail-on", help="Exit 2 when a finding of this severity or worse "
                                         "stands: none | warn | blocking.")] = "none",
    gate_version: Annotated[list[str] | None, typer.Option("--version", help="--fail-on judges only findings that "
                                                           "cover these versions (repeatable).")] = None,
    gate_kept: Annotated[bool, typer.Option("--kept", help="--fail-on judges only kept versions (workspace).")] = False,
    gate_best: Annotated[bool, typer.Option("--best", help="--fail-on judges only the best kept version (highest "
                                            "held-out Avg@k; workspace).")] = False,
    no_skills: Annotated[bool, typer.Option("--no-skills", help="Do not look up interventions in the skills "
                                            "memory.")] = False,
    skills_dir: Annotated[Path | None, typer.Option("--skills-dir", help="Skills memory folder (default: "
                                                    "$EVOTRAINER_SKILLS_DIR or the user data dir).")] = None,
) -> None:
    """Diagnose a training run: ingest, run every analyzer, print findings, plot the key series."""
    from rich.table import Table

    from evotrainer.cli import fail
    from evotrainer.harness.analyzers import run_analyzers
    from evotrainer.harness.findings import SEVERITY_RANK
    from evotrainer.harness.ingest import ingest
    from evotrainer.harness.plots import MAX_PLOTTED_VERSIONS, plot_evidence
    from evotrainer.workspace import folder_inside

    if fail_on not in ("none", "warn", "blocking"):
        raise typer.BadParameter(f"--fail-on {fail_on!r}: use none, warn or blocking")
    narrowing = [flag for flag, on in (("--version", gate_version), ("--kept", gate_kept), ("--best", gate_best)) if on]
    if narrowing and fail_on == "none":  # they narrow the gate only: without one they changed nothing, silently
        fail(f"{' / '.join(narrowing)} only narrow what --fail-on judges (every finding is printed either way): "
             "add --fail-on warn or --fail-on blocking")
    ev = ingest(path)
    gated = _gate_versions(path, list(ev.summary()["versions"]), gate_version, gate_kept, gate_best)
    findings = run_analyzers(ev, names=analyzer or None)
    plots: list[str] = []
    plots_note = ""
    if not no_plots:
        is_ws = path.is_dir() and (path / "lineage.db").exists()
        # an --out inside the folder read (a run folder or any foreign folder) is made, and written, through no link
        # there either (review 7: `--out RUN/reports/mine` with `reports` a link to a host folder put mine/v0.png in
        # the host folder; review 8: the same through another spelling of the folder, or a foreign folder)
        # (a log file's own folder is the caller's: an --out beside a file is used as given, as before)
        rel = _inside(out, path) if out is not None and path.is_dir() else None
        if rel is not None:
            out_dir = path if rel == os.curdir else folder_inside(path.resolve(), rel)
        else:
            out_dir = out or (folder_inside(path, "reports/diagnose") if is_ws  # no link followed in a run folder
                              else Path("diagnose") / (_bare_name(path) or "run"))
        root = path.resolve() if rel is not None else path if is_ws and out is None else None
        plots = [str(p) for p in plot_evidence(ev, findings, out_dir, root=root)]
        if len(ev.versions) > MAX_PLOTTED_VERSIONS:
            plots_note = (f"plots of {MAX_PLOTTED_VERSIONS} of {len(ev.versions)} versions (MAX_PLOTTED_VERSIONS; those "
                          f"with warn / blocking findings first): {len(ev.versions) - MAX_PLOTTED_VERSIONS} not "
                          "plotted; diagnose a folder of fewer runs to plot them")
    evid = [_evidence_of(ev, f) for f in findings]
    agentic = any(n.startswith("tools/") for v in ev.versions for n in ev.metric_names(v))
    fixes, note = ([[] for _ in findings], "") if no_skills else _interventions(findings, skills_dir,
                                                                                 agentic=agentic)
    if as_json:
        rows = [{**f.model_dump(mode="json"), "evidence_values": e, "interventions": x}
                for f, e, x in zip(findings, evid, fixes, strict=True)]
        payload = {"source": str(path), "summary": ev.summary(), "findings": rows, "plots": plots,
                   **({"skills_note": note} if note else {}), **({"plots_note": plots_note} if plots_note else {})}
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    else:
        console = output_console()
        summ = ev.summary()["versions"]
        # names from the run (MLflow runName, folder names) are shown, never obeyed: controls neutralised, markup
        # escaped (D-R19: a runName with ESC / ST / U+202E reached the terminal raw; "[/x]" ended diagnose with a
        # MarkupError)
        console.print(f"[bold]{_name(path)}[/]: {len(summ)} version(s), "
                      + ", ".join(f"{_name(v)} ({s['n_metrics']} metrics to step {s['last_step']}, {s['n_rollouts']} rollouts)"
                                  for v, s in summ.items()))
        if findings:
            t = Table(show_lines=True)
            t.add_column("severity", no_wrap=True)
            t.add_column("kind", no_wrap=True)
            t.add_column("versions", max_width=24)
            t.add_column("steps", no_wrap=True)
            t.add_column("explanation, evidence and what to change", ratio=1)
            for f, e, x in zip(findings, evid, fixes, strict=True):
                steps = f"{f.steps[0]}..{f.steps[-1]}" if f.steps else ""
                t.add_row(f"[{SEVERITY_STYLE[f.severity]}]{f.severity}[/]", _name(f.kind), _name(", ".join(f.versions)),
                          steps,
                          _cell(f, e, x))
            console.print(t)
        else:
            console.print("no findings")
        if note:
            console.print(f"[dim]{_shown(note)}[/]")
        for p in plots:
            console.print(f"plot: {_name(p)}")
        if plots_note:
            console.print(f"[dim]{plots_note}[/]")
    judged = [f for f in findings if gated is None or not f.versions or gated & set(f.versions)]
    hit = [f for f in judged if fail_on != "none" and SEVERITY_RANK[f.severity] >= SEVERITY_RANK[fail_on]]
    if hit:  # exit 2 names what stands behind it, on stderr (stdout stays the report or the JSON)
        sys.stderr.write(f"diagnose --fail-on {fail_on}: exit 2: {len(hit)} finding(s) at {fail_on} or worse: "
                         + "; ".join(_finding_label(f) for f in hit) + "\n")
        raise typer.Exit(2)


def _shown(text: object) -> str:
    """``str(text)`` for rich markup: terminal controls neutralised (:func:`~evotrainer.terminal.neutralise`) and
    markup escaped, so a name a foreign run chose prints as written and is never obeyed."""
    from rich.markup import escape

    return escape(neutralise(str(text)))


def _name(text: object) -> str:
    """:func:`_shown` for a name or a path that stands on one line: a newline or tab in it is shown as ``\\n`` /
    ``\\t`` too."""
    return _shown(str(text).replace("\n", "\\n").replace("\t", "\\t"))


def _finding_label(f: Finding) -> str:
    """``kind (severity, v0, v1, steps 3..9)``: one finding in the line behind ``--fail-on``'s exit 2."""
    where = [*f.versions[:4], *(["..."] if len(f.versions) > 4 else [])]
    if f.steps:
        where.append(f"steps {f.steps[0]}..{f.steps[-1]}" if len(f.steps) > 1 else f"step {f.steps[0]}")
    return neutralise(f"{f.kind} ({', '.join([f.severity, *where])})")


def _gate_versions(path: Path, known: list[str], versions: list[str] | None, kept: bool, best: bool) -> set[str] | None:
    """Versions ``--fail-on`` judges (None: all). A finding counts when it covers one of them or no version.

    Exits 1 (one error line) on an unknown ``--version``, or ``--kept`` / ``--best`` on a run without a
    lineage (2 stays the gate's own code).
    """
    from evotrainer.cli import fail
    from evotrainer.lineage import VERSION_ID_SHOWN_CHARS, known_versions_text

    if not (versions or kept or best):
        return None
    out = set(versions or [])
    unknown = sorted(out - set(known))
    if unknown:
        fail(f"--version {unknown[0][:VERSION_ID_SHOWN_CHARS]}: not in {path}; known versions: "
             f"{known_versions_text(unknown[0], known)}")
    if kept or best:
        if not (path.is_dir() and (path / "lineage.db").exists()):
            fail(f"--kept / --best need an EvoTrainer run folder (lineage.db); {path} has no lineage: use --version")
        from evotrainer.lineage import LineageStore

        store = LineageStore(path / "lineage.db", readonly=True)
        try:
            keeps = [v for v in store.versions() if v.status == "kept"]
        finally:
            store.close()
        scored = [v for v in keeps if "avg@k" in (v.eval_summary or {})]
        if kept:
            out |= {v.id for v in keeps}
        if best and scored:  # the best kept version: highest held-out Avg@k, earliest on ties (agents.loop)
            out.add(max(scored, key=lambda v: (v.eval_summary["avg@k"], -v.created_at)).id)
    return out


@analyzers_app.command("list")
def analyzers_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Registered analyzers with the finding kinds they report."""
    from rich.table import Table

    from evotrainer.harness.analyzers import list_analyzers

    specs = list_analyzers()
    if as_json:
        sys.stdout.write(json.dumps([{"name": s.name, "kinds": list(s.kinds), "builtin": s.builtin,
                                      "description": s.description} for s in specs], indent=2) + "\n")
        return
    t = Table("name", "kinds", "builtin", "description")
    t.columns[0].no_wrap = t.columns[1].no_wrap = True
    for s in specs:
        t.add_row(s.name, ", ".join(s.kinds), "yes" if s.builtin else "no", s.description)
    output_console().print(t)


def watch(
    path: Annotated[Path, typer.Argument(help="A growing log or run folder (any format `diagnose` reads), or an "
                                              "EvoTrainer run folder.")],
    run_dir: Annotated[Path | None, typer.Option("--run", help="Keep this run folder current for `serve --run` "
                                                 "(imported on the first poll; foreign sources only).")] = None,
    fail_on: Annotated[str, typer.Option("--fail-on", help="Exit 2 when a new finding of this severity or worse "
                                         "appears: none | warn | blocking.")] = "none",
    keep_going: Annotated[bool, typer.Option("--keep-going", help="With --fail-on: print an ALERT line on stderr "
                                             "and keep watching instead of exiting.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls.")] = 5.0,
    idle_exit: Annotated[float, typer.Option("--idle-exit", help="Stop (exit 0) when the source has not changed "
                                             "for this many seconds; 0 watches until interrupted.")] = 0.0,
) -> None:
    """Follow a training run: re-run the analyzers as steps arrive and print findings when they appear."""
    escape = _shown  # names from the run: controls neutralised, markup escaped

    from evotrainer.harness.findings import SEVERITY_RANK
    from evotrainer.harness.watch import Watcher

    if fail_on not in ("none", "warn", "blocking"):
        raise typer.BadParameter(f"--fail-on {fail_on!r}: use none, warn or blocking")
    if interval <= 0:
        raise typer.BadParameter(f"--interval {interval}: poll at least every few seconds (a positive number)")
    console = output_console(soft_wrap=True)
    w = Watcher(path, run_dir)
    console.print(f"watching {w.path} every {interval:g} s" + (f", keeping {w.run_dir} current" if w.run_dir else "")
                  + (f", failing on {fail_on}" if fail_on != "none" else ""), highlight=False, markup=False)
    last_change = time.monotonic()
    first = True
    while True:
        r = w.poll()
        if r.changed:
            last_change = time.monotonic()
            if first and w.run_dir is not None and w._imported:
                console.print(f"imported into {w.run_dir}: serve it with evotrainer serve all --run {w.run_dir}",
                              highlight=False, markup=False)
                first = False
        for f in r.new:
            steps = f" steps {f.steps[0]}..{f.steps[-1]}" if f.steps else ""
            console.print(escape(f"[step {r.last_step}] ") + f"[{SEVERITY_STYLE[f.severity]}]{f.severity}[/] "
                          + escape(f"{f.kind} ({', '.join(f.versions)}{steps}): {f.explanation}"), highlight=False)
        hit = [f for f in r.new if fail_on != "none" and SEVERITY_RANK[f.severity] >= SEVERITY_RANK[fail_on]]
        if hit:
            if not keep_going:
                raise typer.Exit(2)
            sys.stderr.write(f"\aALERT: {len(hit)} new {fail_on}+ finding(s) at step {r.last_step}: "
                             + ", ".join(f.kind for f in hit) + "\n")
            sys.stderr.flush()
        if idle_exit > 0 and time.monotonic() - last_change >= idle_exit:
            console.print(f"no change for {idle_exit:g} s; stopping", highlight=False, markup=False)
            return
        time.sleep(interval)


def register(app: typer.Typer) -> None:
    """Add this subpackage's commands to the main evotrainer app."""
    app.command("diagnose")(diagnose)
    app.add_typer(analyzers_app, name="analyzers")
    app.command("watch")(watch)


def _evidence_of(ev, f) -> list[dict]:
    """The values of each series a finding cites, at its steps (``Evidence.excerpt``), per version."""
    out = []
    for v in f.versions[:2]:
        for name in f.evidence:
            if (x := ev.excerpt(v, name, f.steps or None)) is not None:
                out.append(x)
    return out


AGENTIC_TAGS = {"tool_use", "agentic", "swe"}  # seed-skill tags of changes that need tool-use episodes


def _interventions(findings: list, skills_dir: Path | None, k: int = 3,
                   agentic: bool = True) -> tuple[list[list[dict]], str]:
    """Per finding, the ``k`` interventions of the skills memory that address its kind, most relevant first.

    Only warn / blocking findings get them. The query is the finding's ``data["remedy"]`` when the
    analyzer states one (the direction its cause calls for, e.g. zero variance from all-correct
    groups: "... harder problems"), else its explanation; filtered to interventions whose
    ``addresses`` hold the kind; with ``agentic`` False (the run logged no ``tools/*`` metric), skills
    tagged :data:`AGENTIC_TAGS` are left out. Returns ``(lists, note)``; the note says why there are
    none when the memory could not be opened (the diagnosis itself never fails for it).
    """
    out: list[list[dict]] = [[] for _ in findings]
    if not any(f.is_failure for f in findings):
        return out, ""
    try:
        from evotrainer.skills_db.store import SkillStore

        store = SkillStore(skills_dir)
        for i, f in enumerate(findings):
            if not f.is_failure:
                continue
            query = str(f.data.get("remedy") or f.explanation)
            hits = store.search(query, kind="intervention", finding_kinds=[f.kind], limit=k + 3)
            if not agentic:  # tool-use / SWE changes do not apply to a run without tool episodes
                hits = [h for h in hits if not set(h.skill.tags) & AGENTIC_TAGS]
            hits = hits[:k]
            out[i] = [{"id": h.skill.id, "name": h.skill.name, "recipe_path": h.skill.recipe_path,
                       "value": h.skill.value, "source": h.skill.source, "score": round(h.score, 4),
                       "tried": h.record.tried, "helped": h.record.helped} for h in hits]
    except Exception as exc:  # noqa: BLE001  (the memory is advice; the findings stand without it)
        return [[] for _ in findings], f"skills memory unavailable ({type(exc).__name__}: {exc}); --no-skills skips it"
    return out, ""


def _value_text(value) -> str:
    if isinstance(value, dict) and "op" in value:
        op = value["op"]
        arg = value.get("by", value.get("value", ""))
        if op == "mul":
            return f"x{arg}"
        if op == "add":  # (only here is the argument a number: a set's value may be a list, e.g. stop strings)
            return f"{'+' if isinstance(arg, (int, float)) and arg >= 0 else ''}{arg}"
        return f"= {arg}" if op == "set" else str(op)
    return f"= {value}"


def _cell(f, evid: list[dict], fixes: list[dict]) -> str:
    """The explanation cell: explanation, what was judged, the evidence values, the interventions."""
    escape = _shown  # every value here may hold a foreign run's names

    lines = [escape(f.explanation)]
    if f.judged:
        lines.append(f"[dim]judged: {escape(f.judged)}[/]")
    for e in evid[:4]:
        pairs = ", ".join(f"{s}: {'nan' if x is None else f'{x:.4g}'}" for s, x in zip(e["steps"], e["values"],
                                                                                      strict=True))
        lines.append(f"[dim]evidence {escape(e['series'])} ({e['n_points']} points) at step {escape(pairs)}[/]")
    for x in fixes:
        lines.append(f"[green]try[/] {escape(x['name'])}: {escape(x['recipe_path'] or '')} "
                     f"{escape(_value_text(x['value']))} [dim]({escape(x['source'])})[/]")
    return "\n".join(lines)


def _inside(out: Path, folder: Path) -> str | None:
    """``out`` relative to ``folder`` when it lies inside it by any spelling (an ancestor of ``out``'s absolute path
    that resolves to ``folder``, links on the way included), else None: the part below that ancestor is then made
    with :func:`~evotrainer.workspace.folder_inside`, which follows no link."""
    target = os.path.realpath(folder)
    out_abs = Path(os.path.abspath(out))
    for anc in [out_abs, *out_abs.parents]:
        if os.path.realpath(anc) == target:
            return os.path.relpath(out_abs, anc)
    return None


def _bare_name(path: Path) -> str:
    """The file or folder name without its compression and log suffixes: ``a.log.gz`` -> ``a``."""
    name = path.name
    for suffix in (".gz", ".bz2", ".xz", ".zst", ".log", ".jsonl", ".json", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name
