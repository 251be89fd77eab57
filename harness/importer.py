"""Import a foreign training run (any format ``diagnose`` reads) into an EvoTrainer run folder.

``import_run(PATH, RUN)`` reads PATH with :func:`evotrainer.harness.ingest.ingest` (verl console
log, TRL / HF ``trainer_state.json``, TensorBoard events, JSONL metrics, verl rollout dumps, TRL
completion parquets) and writes a workspace whose root version ``v0`` holds the run:

- its metric series under our metric names (``reward/mean``, ``policy/entropy``, ...), one row
  per step in the lineage store (where the source logs none, those computed from its rollouts:
  ``harness.rollout_metrics``); ``metrics_summary`` is the mean of each metric over the steps
  (as the local trainer writes it); status ``trained``;
- its rollouts, where the source has them, in the rollout store (version id rewritten to ``v0``);
- the analyzers' findings stored on the version (``get_version`` and ``diagnose`` show them) and
  one run-log record per finding;
- the lines of text logs (``.log``, ``.log.gz``) as run-log records (``source`` = the file name,
  ``level`` error / warning / info from the line's words), so ``search_logs`` searches them.

The root's recipe is the default recipe (the foreign run's own configuration is not read); its
note and ``kv["import/source"]`` name the source. ``evotrainer serve --run RUN`` then answers
``get_metric_series``, ``search_logs``, ``sample_rollouts`` and ``run_analyzer`` on it.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evotrainer.errors import EvoTrainerError
from evotrainer.harness.analyzers import run_analyzers
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.ingest import IngestError, IngestWarning, ingest, read_run_text
from evotrainer.harness.ingest_formats import (
    BudgetSpent,
    ReadBudget,
    as_text,
    files_under,
    iter_lines,
    read_gzip_text,
    squeeze_blank_lines,
)
from evotrainer.lineage import IMPORT_SOURCE_KEY, SUMMARY_MAX, capped_summary
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace

MAX_LOG_LINES = 50_000  # text-log lines kept as run-log records (the head of a longer log)
MAX_LOG_LINE_CHARS = 4096  # characters of one text-log line kept in its run-log record (the rest is cut, and said)
_ERROR = re.compile(r"\b(error|exception|traceback|fatal|nan)\b", re.I)
_WARN = re.compile(r"\bwarn(ing)?\b", re.I)


class RunImportError(EvoTrainerError, ValueError):
    """The source cannot be imported (several runs, or the run folder holds a lineage); says the fix."""


@dataclass
class ImportSummary:
    """What :func:`import_run` wrote."""

    run_dir: str
    source: str
    version_id: str
    n_steps: int
    n_metrics: int
    n_rollouts: int
    n_log_lines: int
    findings: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the reading left out (caps reached), also in the run log


def text_logs(path: Path) -> list[Path]:
    """The text logs at ``path`` (``.log``, ``.txt``, ``.log.gz``; the file itself, or every one under the folder
    that :func:`~evotrainer.harness.ingest_formats.files_under` keeps: no link out of the folder, no FIFO)."""
    files = [path] if path.is_file() else files_under(path)
    return [f for f in files if f.is_file() and (f.suffix in (".log", ".txt") or f.name.endswith(".log.gz"))]


def read_lines(path: Path, budget: ReadBudget | None = None, max_lines: int | None = None) -> list[str]:
    """The non-blank lines of a text log (gunzipped for ``.gz``, within ``budget`` when given; undecodable bytes
    replaced), each cut to :data:`MAX_LOG_LINE_CHARS`; the first ``max_lines`` of them when given (default: all).

    Blank lines are dropped in one pass of C code before the text is split (review 17, Z-R17a: 16 MiB of newlines
    was a list of 16 M empty lines; 1 GiB of them, under the file cap, 8 GB of list).

    Read within the ingest's size cap (:func:`~evotrainer.harness.ingest.read_run_text`): the diagnosis skips a
    file past it and reads the rest of the folder, and this copy of the text logs read such a file whole (a
    64 MiB sparse log became a 384 MiB ``run.jsonl``: one line of NULs, each escaped to six characters).

    Raises:
        BudgetSpent: a .gz past what ``budget`` has left (names it and the cap).
        RunImportError: the file is larger than the cap, decompresses past its cap, or is not a regular file.
    """
    try:
        text = read_gzip_text(path, budget=budget) if path.suffix == ".gz" else read_run_text(path)
    except BudgetSpent:
        raise
    except (IngestError, ValueError) as exc:
        raise RunImportError(str(exc)) from None
    out: list[str] = []
    for chunk in iter_lines(squeeze_blank_lines(text)):
        for line in chunk.splitlines():  # (``\r`` and the other breaks str.splitlines knows split too)
            if line.strip():
                if max_lines is not None and len(out) >= max_lines:
                    return out
                out.append(clip_line(line))
    return out


def clip_line(line: str) -> str:
    """``line``, or its first :data:`MAX_LOG_LINE_CHARS` characters and a note of how many were cut."""
    if len(line) <= MAX_LOG_LINE_CHARS:
        return line
    return f"{line[:MAX_LOG_LINE_CHARS]} [... {len(line) - MAX_LOG_LINE_CHARS} more characters cut]"


def line_level(line: str) -> str:
    """The run-log level of a text-log line from its words: ``error``, ``warning`` or ``info``."""
    return "error" if _ERROR.search(line) else "warning" if _WARN.search(line) else "info"


def finding_level(severity: str) -> str:
    """The run-log level of a finding of ``severity``: blocking -> error, warn -> warning, info -> info."""
    return "error" if severity == "blocking" else "warning" if severity == "warn" else "info"


def metric_rows(ev: Evidence, version: str, from_step: int | None = None
                ) -> tuple[dict[int, dict[str, float]], dict[str, float]]:
    """``({step: {metric: value}}, {metric: mean of its finite values})`` of one version of the evidence
    (logged series, else those computed from its rollouts); with ``from_step`` only the steps from there on."""
    by_step: dict[int, dict[str, float]] = {}
    means: dict[str, float] = {}
    for name in ev.metric_names(version):
        steps, values = ev.series(version, name)
        finite = values[np.isfinite(values)]
        if len(finite):
            means[name] = float(finite.mean())
        for s, x in zip(steps.tolist(), values.tolist(), strict=True):
            if from_step is None or s >= from_step:
                by_step.setdefault(int(s), {})[name] = float(x)
    return by_step, means


def summary_note(n_series: int, left_out: int) -> str:
    """What an import or watch says when a version's ``metrics_summary`` keeps :data:`SUMMARY_MAX` of its means."""
    return (f"metrics_summary keeps {SUMMARY_MAX} of the {n_series:,} series means (the headline metrics first, then "
            f"the first by name); {left_out:,} left out, their series are all in the metrics table")


def rekeyed_rollouts(rows: list[dict[str, Any]], version_id: str) -> list[dict[str, Any]]:
    """Rollout rows of a foreign run moved to ``version_id`` (version id and rollout id rewritten, in place)."""
    for r in rows:
        r["version_id"] = version_id
        r["rollout_id"] = f"{version_id}/{r['split']}/{r['step']}/{r['group_id']}/{r['sample_idx']}"
    return rows


def import_run(path: str | Path, run_dir: str | Path) -> ImportSummary:
    """Import the run at ``path`` into a new run folder ``run_dir`` (created; must hold no lineage).

    Atomic, as ``init`` is: the run is built in a hidden sibling ``.<name>.import-<pid>`` and renamed into place
    at the end (moved entry by entry, ``lineage.db`` last, into a folder that exists and holds other files), so a
    failed import leaves no run behind: review 10 (U-R10) ended an import half-way (a metric name the store could
    not encode) and left v0 ``proposed`` without metrics, which a rerun refused ("holds a run already").

    What the reading left out (a cap reached: :class:`~evotrainer.harness.ingest.IngestWarning`) is warned
    about as ever, and also kept as run-log records and in :attr:`ImportSummary.notes`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        evotrainer.harness.ingest.IngestError: nothing readable at ``path``.
        RunImportError: ``path`` holds several runs, is an EvoTrainer run already, or ``run_dir`` has a lineage
            (or files of its own where the run's go).
    """
    src = Path(path).expanduser()
    if src.is_dir() and (src / "lineage.db").exists():
        raise RunImportError(f"{src} is an EvoTrainer run folder already; serve it directly with --run {src}")
    run = Path(run_dir).expanduser()
    if (run / "lineage.db").exists():
        raise RunImportError(f"{run} holds a run already; import into a new folder")
    budget = ReadBudget()  # the .gz files' decompressed bytes, the metrics' read and the run log's copy together
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IngestWarning)
        ev = ingest(src, budget=budget)
    notes = [str(w.message) for w in caught if issubclass(w.category, IngestWarning)]
    for w in caught:  # said as they would have been without the recording
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    names = ev.versions
    if len(names) != 1:
        raise RunImportError(f"{src} holds {len(names)} runs ({', '.join(names)}); import each into its own run "
                           "folder (point PATH at one run's folder or file)")
    foreign = names[0]
    findings = run_analyzers(ev)
    logs, n_kept = [], 0  # read before the run folder is made: a log refused here leaves no half-made run
    for f in text_logs(src):
        if n_kept >= MAX_LOG_LINES:  # no line of it would be kept: not read
            break
        try:
            lines = read_lines(f, budget, MAX_LOG_LINES - n_kept)
        except BudgetSpent as exc:  # skipped, as the metrics' read skipped it (said once)
            if not any(n.startswith(f"{f}: not read") for n in notes):
                notes.append(str(exc))
                warnings.warn(str(exc), IngestWarning, stacklevel=2)
            continue
        logs.append((f, lines))
        n_kept += len(lines)
    final = run.resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_build_dir(final)
    try:
        summary = _write_run(tmp, ev, foreign, src, findings, logs, notes)
        _place(tmp, final, src)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary.run_dir = str(final)
    return summary


_BUILD = ".{name}.import-"  # the hidden sibling an import builds its run in, with its pid


def _fresh_build_dir(final: Path) -> Path:
    """An empty build folder beside ``final`` for this process; those of dead imports of the same name are removed
    (a real folder only: a link there is left alone). Inside ``final`` (``.import-<pid>``) when ``final`` is a
    folder that exists in a parent this user may not write (:func:`_place` then moves the entries out)."""
    prefix = _BUILD.format(name=final.name)
    if final.is_dir() and not os.access(final.parent, os.W_OK | os.X_OK):
        tmp = final / f".import-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return tmp
    for name in os.listdir(final.parent):
        pid = name[len(prefix):]
        if not name.startswith(prefix) or not pid.isdigit():
            continue
        p = final.parent / name
        if p.is_dir() and not p.is_symlink() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(p, ignore_errors=True)
    tmp = final.parent / f"{prefix}{os.getpid()}"
    tmp.mkdir()
    return tmp


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _write_run(root: Path, ev: Evidence, foreign: str, src: Path, findings: list[Any],
               logs: list[tuple[Path, list[str]]], notes: list[str]) -> ImportSummary:
    """Write the imported run into the (new, empty) folder ``root``."""
    shown = as_text(str(src))  # a path's undecodable bytes are lone surrogates, which the store cannot encode
    with Workspace(root, writer=True) as ws:
        v = ws.lineage.create_root(Recipe(name=f"imported: {foreign}"), note=f"imported from {shown}")
        by_step, means = metric_rows(ev, foreign)  # logged series, else those computed from the rollouts
        n_series = len(means)
        means, left_out = capped_summary(means)
        if left_out:
            notes = [*notes, summary_note(n_series, left_out)]
        for step in sorted(by_step):
            ws.lineage.log_metrics(v.id, step, by_step[step])
        n_rollouts = 0
        if ev.rollouts is not None and ev.rollouts.num_rows:
            rows = rekeyed_rollouts(ev.rollouts.to_pylist(), v.id)
            ws.rollouts.add(rows)
            n_rollouts = len(rows)
        fs = [{**f.model_dump(mode="json"), "versions": [v.id]} for f in findings]
        ws.lineage.update_version(v.id, status="trained", metrics_summary=means, findings=fs)
        n_lines = 0
        for f, lines in logs:
            for line in lines:
                ws.log(line, level=line_level(line), version=v.id, source=f"import:{f.name}")
                n_lines += 1
        for f in fs:
            ws.log(f"finding {f['kind']} [{f['severity']}]: {f['explanation']}", level=finding_level(f["severity"]),
                   version=v.id, source="import:diagnose")
        for note in notes:
            ws.log(note, level="warning", version=v.id, source="import")
        ws.log(f"imported {shown}: {len(by_step)} steps, {n_series} metrics, {n_rollouts} rollouts, "
               f"{len(fs)} findings", version=v.id, source="import")
        ws.lineage.kv_set(IMPORT_SOURCE_KEY, {"path": shown, "foreign_version": foreign, "version_id": v.id})
        return ImportSummary(run_dir=str(ws.root), source=str(src), version_id=v.id, n_steps=len(by_step),
                             n_metrics=n_series, n_rollouts=n_rollouts, n_log_lines=n_lines, findings=fs,
                             notes=notes)


def _place(tmp: Path, final: Path, src: Path) -> None:
    """Move the built run ``tmp`` to ``final``: one rename when ``final`` is absent or an empty folder, else entry
    by entry (``lineage.db`` last) into a folder without those entries.

    Raises:
        RunImportError: ``final`` holds a run (made by another process meanwhile: review 7), or entries of the
            run's own names, or is no folder.
    """
    try:
        if tmp.parent != final:  # else built inside it: moved entry by entry
            os.rename(tmp, final)
            return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise RunImportError(f"{final}: cannot make the run folder there ({exc.strerror}); import into a new "
                                 "folder") from None
    if (final / "lineage.db").exists():  # another import (or init) made the run meanwhile
        raise RunImportError(f"{final} holds a run already (made by another process while this import read "
                             f"{src}); import into a new folder")
    entries = sorted(os.listdir(tmp), key=lambda n: n == "lineage.db")  # lineage.db last: then it is a run
    entries = [n for n in entries if not (n in _LOCK_FILES and (final / n).is_file() and not (final / n).is_symlink())]
    taken = [n for n in entries if os.path.lexists(final / n)
             and not ((tmp / n).is_dir() and _empty_folder(final / n))]
    if taken:
        raise RunImportError(f"{final} holds {', '.join(taken)} already; import into a new or empty folder")
    for name in entries:
        os.replace(tmp / name, final / name)  # onto nothing, or onto an empty folder
    shutil.rmtree(tmp)  # empty, or our lock file where the folder had its own


_LOCK_FILES = (".writer.lock",)  # an empty lock file of the folder's own is kept (locks are on the open file)


def _empty_folder(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and not any(p.iterdir())
