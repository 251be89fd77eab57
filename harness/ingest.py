"""Ingest runs we did not train: metrics and samples of other frameworks → :class:`Evidence`.

Readers (each returns ``{foreign name: [(step, value)]}`` or rollout rows; names go through
``evotrainer.aliases`` once, in :func:`series_to_evidence`):

* verl console logs (``.log``, or ``.log.gz``): lines ``step:N - key:value - ...`` (ANSI colour and Ray prefixes such as
  ``(main_task pid=1)`` are ignored; several lines of one step merge; ``Initial validation
  metrics: {...}`` is the held-out score at step 0, ``Final validation metrics`` at the last step);
* console logs without verl's step lines (``.log``, ``.txt``, ``.log.gz``): AReaL stats tables, then
  console dicts (TRL ``GRPOTrainer``, slime ``step N: {...}``, ms-swift records), then pasted tables
  with a ``Step`` column (the HF notebook table), read by
  :mod:`evotrainer.harness.ingest_formats` (its docstring gives each format's step rule);
* TRL ``trainer_state.json`` (``log_history``: one dict per logging step, ``step`` key);
* TensorBoard event files (OpenRLHF, TRL, ours) through :func:`evotrainer.tb_events.parse_tensorboard`;
* JSONL metrics: one JSON object per line with ``step`` (or ``global_step`` / ``_step`` / ``train/step``,
  or ms-swift's ``"global_step/max_steps": "300/1296"``; bare ``NaN`` allowed, as in ms-swift's
  ``logging.jsonl``);
* W&B exports: chart CSV (``Step``, ``<run> - <metric>``: one version per run) or history CSV (``_step``),
  history JSON (a list of records with ``_step``);
* MLflow file store runs: ``mlruns/<exp>/<run>/metrics/<key>`` (one version per run, named by the
  ``mlflow.runName`` tag or the run id);
* rollout dumps: verl ``{step}.jsonl`` (``input``, ``output``, ``score``; groups are the samples
  of one input within a step) and TRL completions parquet (``step``, ``prompt``, ``completion``,
  one column per reward function, ``advantage``): the first :data:`MAX_ROLLOUT_ROWS` rows of a run
  read (all its dumps together; an :class:`IngestWarning` says what was left out), each row's first
  :data:`MAX_ROLLOUT_COMPONENTS` numeric fields its reward components.

Every metrics reader fills a :class:`evotrainer.points.StepRecords`: a file of more than
:data:`evotrainer.points.MAX_METRIC_STEPS` steps (or :data:`evotrainer.points.MAX_METRIC_POINTS` values) keeps every
n-th step from its first to its last, evenly (the run's shape stays for the analyzers, which look at trends), and at
most :data:`evotrainer.points.MAX_METRIC_SERIES` names (the first by arrival), with an :class:`IngestWarning` giving
the points read, kept and dropped.

:func:`ingest` takes a run folder (an EvoTrainer workspace, or any folder holding the files
above) or a single file, and returns one Evidence with one version per run: the version id is
the file or folder name (the folder of a ``trainer_state.json``), and a folder holding several
TensorBoard runs (``<tb_dir>/<run_name>/events.*``) gives one version per run folder; one call reads at most
:data:`MAX_IMPORT_RUNS` runs (W&B export runs, TensorBoard run folders, MLflow runs together; the first ones, with an
:class:`IngestWarning` naming the cap and the runs left out). A file no
reader understands raises :class:`IngestError` naming what was tried and what each format looks
like (:data:`FORMATS`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import stat
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from evotrainer.aliases import map_record
from evotrainer.errors import EvoTrainerError
from evotrainer.harness import ingest_formats as F
from evotrainer.harness.evidence import Evidence
from evotrainer.jsonl import NumberTooLong, bounded_int, iter_jsonl, loads
from evotrainer.points import StepRecords
from evotrainer.rollouts import SCHEMA, make_record
from evotrainer.tb_events import parse_tensorboard
from evotrainer.workspace import Workspace

RawSeries = dict[str, list[tuple[int, float]]]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\[[0-9;]*m")
_ESCAPES = re.compile(r"\x1b\[[0-9;?]{0,32}[A-Za-z]")  # ANSI CSI sequences (colours, cursor moves) with their ESC
_STEP = re.compile(r"(?:^|[\s)])step:(\d+)\s+-\s+(.*)$")
_VALIDATION = re.compile(r"(Initial|Final) validation metrics: (\{.*\})")
_VERL_LINE = re.compile(r"^.*(?:step:|validation metrics: ).*$", re.M)  # the lines _STEP or _VALIDATION may match


class IngestError(EvoTrainerError, ValueError):
    """A path holds nothing we can read, or a file is malformed (the message names the file and line)."""


_WRAPPED = re.compile(r"(?:np\.|numpy\.|torch\.)?(?:float(?:16|32|64)?|int(?:32|64)?|tensor)\(\s*([^,()]+?)\s*(?:,[^()]*)?\)")
"""A number printed inside its type: verl's ``concat_dict_to_str`` writes each value with ``pprint.pformat``, which
under numpy >= 2 prints a numpy scalar as ``np.float64(0.323)`` (numpy NEP 51); a torch scalar prints as
``tensor(0.5, device='cuda:0')``."""


def _num(text: str) -> float | None:
    t = text.strip().rstrip(",")
    if t.endswith(")") and (m := _WRAPPED.fullmatch(t)):
        t = m.group(1)
    low = t.lower()
    if low in ("nan", "-nan"):
        return math.nan
    if low in ("inf", "+inf", "infinity"):
        return math.inf
    if low in ("-inf", "-infinity"):
        return -math.inf
    try:
        return float(t)
    except ValueError:
        return None


def _add(out: StepRecords, step: int, key: str, value: float) -> None:
    out.add(step, key, value)


_VERL_WRAP = re.compile(r"^(?=[^\n]*\bstep:\d{1,15}[ \t]+-[ \t])([^\n]*+)\n(?=[^\n]*:)(?!(?:[^\n]*[ \t)])?step:\d)"
                        r"((?:[ \t]?-[ \t]|[ \t])?[^\s]*+(?:[ \t]-[ \t][^\s]++)++[ \t]*)$", re.M)
VERL_WRAP_PASSES = 64  # continuation lines joined to one step line at most (a step line of ~150 metrics wrapped at 80)


def join_verl_wraps(text: str) -> str:
    """``text`` with each line that continues a verl step line joined back to it: a line of ``key:value`` tokens
    separated by `` - `` (it may start with `` - ``; the break may fall inside a token: ``actor/ppo_kl:0.0`` /
    ``00 - ...``), after a ``step:N - ...`` line (verl#1224's paste: the reader kept the first line's 6 metrics and
    dropped the 40 on its continuation lines, the entropy among them); a line that is a step line itself
    (``step:N`` at its start or after a space or ``)``) is none. Joined with nothing between: a paste's or
    terminal's wrap inserts a break and removes nothing. A line of prose (words apart by single spaces), a fence or
    a lone token is no continuation. One regex pass per continuation line, at most :data:`VERL_WRAP_PASSES`."""
    for _ in range(VERL_WRAP_PASSES):
        text, n = _VERL_WRAP.subn(r"\1\2", text)
        if not n:
            break
    return text


def parse_verl_log(text: str) -> dict[int, dict[str, float]]:
    """Per-step records ``{step: {foreign key: value}}`` of a verl console log (see module docstring); a step line the
    paste wrapped is joined first (:func:`join_verl_wraps`)."""
    out = StepRecords()
    final: dict[str, float] = {}
    text = _ANSI.sub("", text)
    if "step:" in text:
        text = join_verl_wraps(text.replace("\r\n", "\n"))  # (a Windows line end is one break)
    for line in F.candidate_lines(text, _VERL_LINE):  # (an escape never spans a line)
        m = _STEP.search(line)
        if m:
            step = F.step_int(m.group(1))
            for part in m.group(2).split(" - "):
                key, sep, val = part.rpartition(":")
                x = _num(val) if sep else None
                if key and x is not None:
                    _add(out, step, key.strip(), x)
            continue
        v = _VALIDATION.search(line)
        if v:
            # a line CPython's parser cannot take (100,000 '-': MemoryError / RecursionError), or nested past
            # F.MAX_DICT_DEPTH, is skipped
            d = F.literal_dict(v.group(2))
            if not isinstance(d, dict):
                continue
            vals = {str(k): float(x) for k, x in d.items() if isinstance(x, (int, float)) and F.is_text(str(k))}
            if v.group(1) == "Initial":
                for k, x in vals.items():
                    out.setdefault(0, {}).setdefault(k, x)
            else:
                final = vals
    if final and out:
        last = max(out)
        for k, x in final.items():
            out[last].setdefault(k, x)
    return out


_WS = re.compile(r"[ \t\n\r]*")
_JSON = json.JSONDecoder(parse_int=bounded_int)  # integers of at most MAX_JSON_INT_DIGITS digits (review 18)


def _skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character (JSON's whitespace) at or after ``i``."""
    m = _WS.match(text, i)
    return m.end() if m else i


def iter_log_history(text: str) -> Iterator[Any] | None:
    """The entries of a ``trainer_state.json``'s ``log_history`` list, decoded one at a time from its text.

    ``None`` when the text is not a JSON object holding a ``log_history`` list (the caller decodes it whole then
    and names the problem). Review 11 (D-R11b): ``json.loads`` of a 29 MB file of 1,000,000 entries held them all
    at once (0.4-0.8 GB with their records); the other top-level values before it are still decoded (one at a time),
    and the text after the list is not read.

    Raises:
        json.JSONDecodeError: the text is not JSON (an entry or the list around it).
        NumberTooLong: an integer of more than :data:`~evotrainer.jsonl.MAX_JSON_INT_DIGITS` digits (its
            :meth:`~evotrainer.jsonl.NumberTooLong.line_in` the text names the line).
    """
    i = _skip_ws(text, 0)
    if not text.startswith("{", i):
        return None
    i = _skip_ws(text, i + 1)
    while text.startswith('"', i):
        key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        i = _skip_ws(text, i)
        if not text.startswith(":", i):
            return None
        i = _skip_ws(text, i + 1)
        if key == "log_history" and text.startswith("[", i):
            return _list_items(text, i)
        _, i = _JSON.raw_decode(text, i)
        i = _skip_ws(text, i)
        if not text.startswith(",", i):
            return None
        i = _skip_ws(text, i + 1)
    return None


def _list_items(text: str, i: int) -> Iterator[Any]:
    """The items of the JSON list starting at ``text[i]`` (``[``), decoded one at a time."""
    i = _skip_ws(text, i + 1)
    if text.startswith("]", i):
        return
    k = 0
    while True:
        try:
            item, i = _JSON.raw_decode(text, i)
        except NumberTooLong as exc:
            exc.where = f"log_history entry {k}"
            raise
        k += 1
        yield item
        i = _skip_ws(text, i)
        if text.startswith("]", i):
            return
        if not text.startswith(",", i):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
        i = _skip_ws(text, i + 1)


def parse_trainer_state_text(text: str) -> dict[int, dict[str, float]]:
    """:func:`parse_trainer_state` of a ``trainer_state.json``'s text, its ``log_history`` decoded an entry at a time
    (:func:`iter_log_history`; the whole file decoded at once only when it is not an object holding that list).

    Raises:
        IngestError: no ``log_history`` list.
        json.JSONDecodeError: not JSON.
        NumberTooLong: an integer of more than :data:`~evotrainer.jsonl.MAX_JSON_INT_DIGITS` digits.
    """
    hist = iter_log_history(text)
    return parse_trainer_state(loads(text)) if hist is None else _log_history_records(hist)


def parse_trainer_state(data: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Per-step records of a TRL / HF ``trainer_state.json`` (``log_history``).

    Raises:
        IngestError: no ``log_history`` list.
    """
    hist = data.get("log_history") if isinstance(data, dict) else None
    if not isinstance(hist, list):
        raise IngestError("trainer_state.json has no log_history list")
    return _log_history_records(hist)


def _log_history_records(hist: Iterable[Any]) -> StepRecords:
    """The records of ``log_history`` entries (dicts with a ``step``; others skipped)."""
    out = StepRecords()
    for rec in hist:
        if not isinstance(rec, dict) or "step" not in rec:
            continue
        step = F.step_int(rec["step"])
        vals = {k: math.nan if x is None else float(x) for k, x in rec.items()
                if k not in ("step", "epoch", "total_flos") and not isinstance(x, bool) and F.is_text(k)
                and (isinstance(x, (int, float)) or x is None)}
        for k, x in (F.eval_renamed(vals) or vals).items():  # an evaluation's keys all under eval_
            _add(out, step, k, x)
    return out


def _jsonl(lines: Iterable[str], source: str) -> Iterator[tuple[int, Any]]:
    """``(line number from 1, parsed value)`` of each non-blank JSON line (:func:`evotrainer.jsonl.iter_jsonl`).

    Raises:
        IngestError: a line is not JSON (names ``source:line``).
    """
    return iter_jsonl(lines, source, IngestError)


def _held_last(lines: Iterable[str], last: list[tuple[int, str]]) -> Iterator[str]:
    """``lines`` but the last non-blank one, which goes to ``last`` as ``(line number from 1, text)``; blank lines keep
    their places, so the line numbers of errors hold."""
    held: tuple[int, str] | None = None
    blanks = 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            blanks += 1  # yielded once the next non-blank line shows the held one was not the last
            continue
        if held is not None:
            yield held[1]
        yield from itertools.repeat("", blanks)
        blanks = 0
        held = (n, line)
    if held is not None:
        last.append(held)


def parse_jsonl_metrics(lines: Iterable[str], source: str = "") -> dict[int, dict[str, float]]:
    """Per-step records of a JSONL metrics file (one object per line with a step key).

    The last line may be cut off (a paste's excerpt ends mid-record: ms-swift#5890's ``logging.jsonl``, refused whole
    before): its whole ``"key": value`` pairs are read (:func:`~evotrainer.harness.ingest_formats.complete_pairs`), with
    an :class:`IngestWarning` naming the line; a cut record whose whole pairs name no step yet is left out, saying so.
    A byte-order mark before the first line is dropped, and so is a line that is only an elision mark (``...``,
    ``…``, ``[...]``: where a paste left lines out, LLaMA-Factory#856's ``trainer_log.jsonl``), with an
    :class:`IngestWarning` naming the first.

    Raises:
        IngestError: a line is not JSON (the last one: and no whole pairs with a step), or a line has no ``step`` /
            ``global_step`` / ``_step``.
    """
    out = StepRecords()
    last: list[tuple[int, str]] = []
    for i, rec in _records_then_last(_held_last(_no_elisions(_no_bom(lines), source), last), last, source):
        if not isinstance(rec, dict):
            raise IngestError(f"{source}:{i}: a JSON {type(rec).__name__}, not an object; one metrics object per line")
        step = F.record_step(rec)
        if step is None:
            raise IngestError(f"{source}:{i}: no step key; each line needs 'step' (or 'global_step', '_step', "
                              f"'train/step', ms-swift's 'global_step/max_steps': \"300/1296\")")
        for k, x in F.numeric_items(rec).items():
            _add(out, step, k, x)
    return out


def _no_bom(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` with a UTF-8 byte-order mark taken off the first (a file saved by a Windows editor)."""
    it = iter(lines)
    first = next(it, None)
    if first is not None:
        yield first.lstrip("\ufeff")
        yield from it


_ELISION = re.compile(r"\s*(?:\.{3,}|…+|\[\s*(?:\.{3,}|…)\s*\]|\(\s*(?:\.{3,}|…)\s*\))\s*")


def _no_elisions(lines: Iterable[str], source: str) -> Iterator[str]:
    """``lines`` with each line that is only an elision mark (``...``, ``…``, ``[...]``, ``(...)``) made blank (so the
    line numbers of errors hold); an :class:`IngestWarning` names the first and the count."""
    marks: list[int] = []
    for n, line in enumerate(lines, 1):
        if len(line) <= 64 and _ELISION.fullmatch(line):
            marks.append(n)
            yield ""
        else:
            yield line
    if marks:
        _note(f"{source}:{marks[0]}: {len(marks)} line(s) that are only an elision mark ('...') left out: the paste "
              "cut records there")


def _records_then_last(lines: Iterable[str], last: list[tuple[int, str]], source: str) -> Iterator[tuple[int, Any]]:
    """The JSON records of ``lines`` (:func:`_jsonl`), then the held last line's: whole, or the whole pairs of a cut
    one (see :func:`parse_jsonl_metrics`)."""
    yield from _jsonl(lines, source)
    if not last:
        return
    n, line = last[0]
    try:
        yield n, loads(line)
        return
    except NumberTooLong as exc:  # a number past the bound is refused, cut or not (review 19's rule)
        raise IngestError(f"{source}:{n}: {exc}") from None
    except json.JSONDecodeError as exc:
        error = IngestError(f"{source}:{n}: not JSON ({exc.msg})")  # iter_jsonl's words
    body = F.complete_pairs(line.strip())
    try:
        rec = loads(body) if body else None
    except (json.JSONDecodeError, NumberTooLong):
        rec = None
    if not (isinstance(rec, dict) and F.record_step(rec) is not None):
        if not line.lstrip().startswith("{") or n == 1:  # no cut record: garbage, or nothing else to read
            raise error
        _note(f"{source}:{n}: the last line is cut off (not JSON) before its step: left out")
        return
    _note(f"{source}:{n}: the last line is cut off (not JSON): read its {len(rec)} whole pairs")
    yield n, rec


def records_to_series(records: dict[int, dict[str, float]]) -> RawSeries:
    """``{step: {foreign: value}}`` → ``{our name: [(step, value)]}`` through the alias table."""
    series: RawSeries = {}
    for step in sorted(records):
        for name, x in map_record(records[step]).items():
            series.setdefault(name, []).append((step, x))
    return series


# --- rollout dumps ------------------------------------------------------------------------------------
def _rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _text(x: Any) -> str:
    if isinstance(x, str):
        return F.as_text(x)  # a lone surrogate (JSON's "\\ud800") as '?': the stores, and the prompt id, encode UTF-8
    if x is None:
        return ""
    if hasattr(x, "tolist"):
        x = x.tolist()
    return json.dumps(x, default=str)


def _prompt_id(prompt: str) -> str:
    """A prompt's id: ``p`` + 12 hex digits of its SHA-1 (the same in every process, unlike ``hash``)."""
    return "p" + hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:12]


MAX_ROLLOUT_ROWS = 200_000  # rollout rows read per import (all dumps of a folder together), the first ones
MAX_ROLLOUT_COMPONENTS = 64  # numeric fields of one rollout row kept as its reward components, the first ones


class IngestWarning(UserWarning):
    """A foreign run was read in part (a cap was reached); the message names the file and what was left out."""


def _note(msg: str) -> None:
    """Say that part of a foreign run was left out (an :class:`IngestWarning`, each time; ``import`` also logs it).

    Shown as ``evotrainer:0: IngestWarning: <file>: ...`` on stderr (no source line of this module under it), each
    note once a process under the default filter (``watch`` reads the folder again at every poll).
    """
    warnings.warn_explicit(msg, IngestWarning, "evotrainer", 0, module="evotrainer.harness.ingest", registry=_NOTED)


_NOTED: dict[Any, Any] = {}  # the warnings registry of :func:`_note`


# Runs (versions) one ingest reads, from one file or one folder, the first ones (review 18, C-R18b: a 784 KB W&B chart
# export of 1,000 runs x 3 metrics became 1,000 versions, each analyzed and plotted: `diagnose --no-plots` took 146 s
# and 462 MB, with plots it was killed at 300 s). 64: a W&B chart shows 10 runs by default and a sweep's export is
# a few dozen; TensorBoard and MLflow folders of more runs are read a part at a time (point at a sub-folder).
MAX_IMPORT_RUNS = 64


class _RunCap:
    """The versions one :func:`ingest` call admits: the first :data:`MAX_IMPORT_RUNS` by arrival (a version already
    admitted always is); the names left out are kept for one note (:meth:`say`)."""

    def __init__(self, limit: int = MAX_IMPORT_RUNS):
        self.limit = limit
        self.kept: dict[str, None] = {}
        self.left_out: dict[str, None] = {}

    def full(self) -> bool:
        return len(self.kept) >= self.limit

    def admit(self, name: str) -> bool:
        if name in self.kept:
            return True
        if len(self.kept) < self.limit:
            self.kept[name] = None
            return True
        self.left_out[name] = None
        return False

    def leave_out(self, name: str) -> None:
        """Count ``name`` as left out (a reader did not read it; nothing if it was admitted)."""
        if name not in self.kept:
            self.left_out[name] = None

    def say(self, path: Path) -> None:
        if self.left_out:
            names = list(self.left_out)
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            _note(f"{path}: {len(names):,} runs left out ({shown}): the first {self.limit} runs are read (the cap "
                  f"per file or folder read, MAX_IMPORT_RUNS); to read the others, export or point at fewer runs")


def _rows_cut(path: Path, cap: int, total: int | None = None) -> None:
    of = f" of {total:,}" if total is not None else ""
    whole = "a cap" if cap >= MAX_ROLLOUT_ROWS else "the rest of a cap"
    _note(f"{path}: read the first {cap:,} rollout rows{of}, the rest are left out ({whole} of "
          f"{MAX_ROLLOUT_ROWS:,} rollout rows per run read, MAX_ROLLOUT_ROWS)")


def _components(pairs: Iterable[tuple[str, Any]], cut: dict[str, int]) -> dict[str, float]:
    """A rollout row's reward components ``{name: value}``: its first :data:`MAX_ROLLOUT_COMPONENTS` numeric fields.

    ``pairs`` are the row's numeric fields (the caller filtered them); ``cut["rows"]`` counts the rows that had more
    and ``cut["fields"]`` the fields left out (for :func:`_components_cut`). Review 11 (D-R11): a 27 MB verl dump of
    3,000 rows of 1,000 numeric keys each kept 3,000,000 components, 0.6-1.1 GB; real rows have a score and a few
    reward functions' values.
    """
    out: dict[str, float] = {}
    left = 0
    for k, x in pairs:
        if len(out) < MAX_ROLLOUT_COMPONENTS:
            out[k] = float(x)
        else:
            left += 1
    if left:
        cut["rows"] = cut.get("rows", 0) + 1
        cut["fields"] = cut.get("fields", 0) + left
    return out


def _components_cut(path: Path, cut: dict[str, int]) -> None:
    """Note the rollout rows whose numeric fields past :data:`MAX_ROLLOUT_COMPONENTS` were left out (if any)."""
    if cut.get("fields"):
        _note(f"{path}: {cut['rows']:,} rollout rows have more than {MAX_ROLLOUT_COMPONENTS} numeric fields: the "
              f"first {MAX_ROLLOUT_COMPONENTS} of each are kept as its reward components, {cut['fields']:,} fields "
              "are left out (a cap per rollout row, MAX_ROLLOUT_COMPONENTS)")


def _thinned(path: Path | str, records: Any) -> None:
    """Note a file whose metric points were thinned (a :class:`evotrainer.points.StepRecords` that dropped some)."""
    if isinstance(records, StepRecords) and records.dropped:
        _note(f"{path}: {records.summary()}: every series is thinned evenly over the run past the caps of "
              f"{records.max_steps:,} steps and {records.max_points:,} values per metrics file read "
              "(MAX_METRIC_STEPS, MAX_METRIC_POINTS)")


def _rows_left(path: Path, max_rows: int | None) -> int:
    """The rollout rows a reader may still read (``max_rows``, default :data:`MAX_ROLLOUT_ROWS`); a note when none."""
    cap = MAX_ROLLOUT_ROWS if max_rows is None else max_rows
    if cap <= 0:
        _note(f"{path}: not read: {MAX_ROLLOUT_ROWS:,} rollout rows (the cap per run read, MAX_ROLLOUT_ROWS) "
              "came from the files before it")
    return cap


def _lines(text: str) -> Iterator[str]:
    """The ``\\n``-separated lines of ``text``, one at a time (a list of 40 M short lines is gigabytes)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        yield text[start:end]
        start = end + 1


def read_verl_dump(path: Path, version: str, max_rows: int | None = None) -> list[dict[str, Any]]:
    """Rollout rows of a verl generations dump ``{step}.jsonl`` (``input``, ``output``, ``score``).

    At most ``max_rows`` (default :data:`MAX_ROLLOUT_ROWS`), the first ones, with an :class:`IngestWarning` when
    rows were left out: review 10 (R-R10) read a 48 MB dump of 2,000,000 rows ``{"output":"","score":0}`` as
    2.15 GB of row dicts in 33 s (~45x the file; the 1 GiB file cap allowed ~46 GB).

    Raises:
        IngestError: a line is not JSON, or not an object (names the file and line).
    """
    cap = _rows_left(path, max_rows)
    rows: list[dict[str, Any]] = []
    if cap <= 0:
        return rows
    stem_step = int(path.stem) if path.stem.isdigit() else 0
    seen: dict[tuple[int, str], int] = {}
    more: list[bool] = []
    cut: dict[str, int] = {}
    for i, rec in _jsonl(_head(_lines(read_run_text(path)), cap, more), str(path)):
        if not isinstance(rec, dict):
            raise IngestError(f"{path}:{i}: a JSON {type(rec).__name__}, not an object; a verl dump has one "
                              "rollout object per line")
        step = F.step_int(rec.get("step", stem_step))
        prompt = _text(rec.get("input", ""))
        pid = _prompt_id(prompt)
        k = seen.get((step, pid), 0)
        seen[(step, pid)] = k + 1
        extras = _components(((key, x) for key, x in rec.items()
                              if key not in ("input", "output", "score", "step", "gts") and isinstance(x, (int, float))),
                             cut)
        score = float(rec.get("score", 0.0) or 0.0)
        rows.append(make_record(version_id=version, step=step, prompt_id=pid, group_id=pid, sample_idx=k,
                                prompt=prompt, completion=_text(rec.get("output", "")), reward=score,
                                components=extras or None, answer=_text(rec.get("gts", "")),
                                length=len(_text(rec.get("output", "")).split())))
    if more:
        _rows_cut(path, cap)
    _components_cut(path, cut)
    return rows


def _head(lines: Iterable[str], n: int, more: list[bool]) -> Iterator[str]:
    """The lines up to the ``n``-th non-blank one (the lines after it are not parsed: a bad one there does not refuse
    the file); ``more`` gets ``True`` when a non-blank line follows."""
    for line in lines:
        if line.strip():
            if n <= 0:
                more.append(True)
                return
            n -= 1
        yield line


_PARQUET_BATCH_ROWS = 1024  # rows of a completions parquet decoded at a time
# The text a completions parquet decodes to is at most MAX_PARQUET_RATIO times the file's size, past
# PARQUET_FREE_BYTES (and never past max_file_bytes()). Review 17 (Z-R17b): a 1.2 MB zstd file of 5 M rows sharing
# one dictionary-encoded 2 KB string decoded its first 200,000 rows (MAX_ROLLOUT_ROWS) to 800 MB of text, under the
# 1 GiB cap: 10.7 s / 2.56 GB. Real completions compress ~3-5x (zstd on text), a group's repeated prompt ~8x more:
# far under 100x; PARQUET_FREE_BYTES of rows decode in ~1 s.
MAX_PARQUET_RATIO = 100
PARQUET_FREE_BYTES = 64 << 20
_TRL_COLUMNS = ("step", "prompt", "completion", "advantage", "mode")  # read with the numeric (reward) columns


def read_trl_completions(path: Path, version: str, max_rows: int | None = None) -> list[dict[str, Any]]:
    """Rollout rows of a TRL completions parquet (``step``, ``prompt``, ``completion``, rewards, ``advantage``).

    Its first rows, a batch at a time, up to ``max_rows`` (default :data:`MAX_ROLLOUT_ROWS`) and to
    :func:`max_file_bytes` of decoded text, and to :data:`MAX_PARQUET_RATIO` times the file's size past
    :data:`PARQUET_FREE_BYTES` (review 17, Z-R17b), with an :class:`IngestWarning` when rows were left out; the footer's
    uncompressed size is checked against the same cap first. Review 10 (Q-R10) read a 256 KB file of 2,000,000
    rows sharing one dictionary-encoded 1,000-character completion with ``read_table(...).to_pylist()``: 2.7 GB,
    then MemoryError (~10,000x the file). Text columns are read dictionary-encoded (one long dictionary value
    repeated is counted once per row before any row is decoded), and only the columns used are read.

    Raises:
        IngestError: not a parquet file, or more uncompressed data than :func:`max_file_bytes` (names the file).
    """
    cap = _rows_left(path, max_rows)
    if cap <= 0:
        return []
    pf, columns = _open_parquet(path)
    md, limit = pf.metadata, max_file_bytes()
    raw = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
    if raw > limit:  # one long string repeated compresses to almost nothing
        raise IngestError(f"{path}: {raw >> 20} MiB of data once decompressed, more than the {limit >> 20} MiB a "
                          f"run file may have; {_SIZE_HINT}")
    by_ratio = max(PARQUET_FREE_BYTES, MAX_PARQUET_RATIO * path.stat().st_size)
    why = (f"the {limit >> 20} MiB of text a run file may have ({_SIZE_HINT})" if limit <= by_ratio else
           f"{by_ratio:,} bytes of text, {MAX_PARQUET_RATIO} times its size (MAX_PARQUET_RATIO, past "
           f"PARQUET_FREE_BYTES: one string repeated by a dictionary, or a crafted file)")
    limit = min(limit, by_ratio)
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[int, str], int] = {}
    fixed = {"step", "prompt", "completion", "advantage", "mode", "image"}
    cut: dict[str, int] = {}
    many: dict[str, int] = {}
    n_read = 0
    for rec in _parquet_records(pf, columns, min(cap, md.num_rows), limit, cut):
        n_read += 1
        if rec.get("mode", "train") not in ("train", None):
            continue
        step = F.step_int(rec.get("step", 0))
        prompt = _text(rec.get("prompt"))
        pid = _prompt_id(prompt)
        k = seen.get((step, pid), 0)
        seen[(step, pid)] = k + 1
        comps = _components(((c, x) for c, x in rec.items() if c not in fixed and isinstance(x, (int, float))
                             and not isinstance(x, bool) and x == x), many)
        rows.append(make_record(version_id=version, step=step, prompt_id=pid, group_id=pid, sample_idx=k,
                                prompt=prompt, completion=_text(rec.get("completion")),
                                reward=float(sum(comps.values())), components=comps,
                                advantage=float(rec.get("advantage") or 0.0),
                                length=len(_text(rec.get("completion")).split())))
    if cut:
        _note(f"{path}: read the first {n_read:,} rollout rows of {md.num_rows:,}, the rest are left out: the next "
              f"ones decode to more than {why}")
    elif md.num_rows > n_read:
        _rows_cut(path, n_read, md.num_rows)
    _components_cut(path, many)
    return rows


def _open_parquet(path: Path) -> tuple[Any, list[str]]:
    """The parquet file (its text columns read dictionary-encoded) and the columns a completions reader uses.

    Raises:
        IngestError: not a readable parquet file (names it).
    """
    import pyarrow.parquet as pq

    try:
        src = os.fdopen(F.open_listed(path), "rb")  # (the listed file; pyarrow reads it by its descriptor)
        schema = pq.read_schema(src)
        texts = [f.name for f in schema if _is_text_type(f.type) or pa.types.is_dictionary(f.type)]
        pf = pq.ParquetFile(src, read_dictionary=texts)
    except (pa.ArrowException, OSError) as exc:
        raise IngestError(f"{path}: not a readable parquet file ({str(exc)[:200]})") from None
    columns = [f.name for f in schema if f.name in _TRL_COLUMNS or pa.types.is_integer(f.type)
               or pa.types.is_floating(f.type)]
    return pf, list(dict.fromkeys(columns))


def _is_text_type(t: Any) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t))


def _row_bytes(batch: Any) -> Any:
    """The decoded size of each row of a record batch (text lengths; 8 bytes a number), as a numpy array."""
    import numpy as np
    import pyarrow.compute as pc

    size = np.full(batch.num_rows, 8 * batch.num_columns, dtype=np.int64)
    for col in batch.columns:
        if pa.types.is_dictionary(col.type) and _is_text_type(col.type.value_type) and len(col.dictionary):
            lens = pc.binary_length(col.dictionary).fill_null(0).to_numpy(zero_copy_only=False)
            size += lens[col.indices.fill_null(0).to_numpy(zero_copy_only=False)]
        elif _is_text_type(col.type):
            size += pc.binary_length(col).fill_null(0).to_numpy(zero_copy_only=False)
        elif not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):  # a nested prompt (decoded)
            size += col.nbytes // max(1, batch.num_rows)
    return size


def _parquet_records(pf: Any, columns: list[str], n: int, max_bytes: int, cut: dict[str, int]
                     ) -> Iterator[dict[str, Any]]:
    """The first rows of a parquet file as dicts: at most ``n``, and no more than ``max_bytes`` of decoded text
    (then ``cut["bytes"]`` is set), :data:`_PARQUET_BATCH_ROWS` decoded at a time."""
    import numpy as np

    used = 0
    if n <= 0:
        return
    for batch in pf.iter_batches(batch_size=min(n, _PARQUET_BATCH_ROWS), columns=columns):
        if batch.num_rows > n:
            batch = batch.slice(0, n)
        total = np.cumsum(_row_bytes(batch)) + used
        fit = int(np.searchsorted(total, max_bytes, side="right"))
        if fit < batch.num_rows:
            cut["bytes"] = 1
            batch = batch.slice(0, fit)
        yield from batch.to_pylist()
        if "bytes" in cut:
            return
        used = int(total[-1]) if len(total) else used
        n -= batch.num_rows
        if n <= 0:
            return


# --- dispatch ------------------------------------------------------------------------------------------
def _is_verl_dump(path: Path) -> bool:
    with os.fdopen(F.open_listed(path), "rb") as f:  # a regular file within the size cap (_read_file checked it)
        first = f.readline(1 << 20).decode(errors="replace")
    try:
        rec = loads(first)
    except (json.JSONDecodeError, NumberTooLong):  # not a dump's line: the JSONL metrics reader names the problem
        return False
    return isinstance(rec, dict) and "output" in rec and ("input" in rec or "score" in rec)


FORMATS = (
    "verl console log: lines 'step:12 - actor/entropy:0.41 - critic/score/mean:0.5 - ...'",
    "console dicts (TRL GRPOTrainer, slime): one dict per step, \"{'loss': 0.0, 'reward': 0.5, 'epoch': 0.01}\" "
    "or 'step 3: {...}' / 'rollout 3: {...}'",
    "AReaL StatsLogger: 'Train step 3/100 done.' then a table of '│ ppo_actor/task_reward/avg │ 5.0000e-01 │'",
    "OpenRLHF console: tqdm bars with numbers, 'Episode [1/1]:  10%|█| 5/50 [01:00<09:00, 12.0s/it, "
    "policy_loss=0.0123, kl=0.00102, reward=0.5, ...]' (or the 'Train epoch' bars' 'pg=..., rm=..., glen=...')",
    "mlx-lm: 'Iter 20: Train loss 0.000, Total rewards mean 0.000, ..., KL 0.000, Learning Rate 1.000e-05, ...'",
    "DeepSpeed-Chat step 3: 'epoch: 0|step: 3183|ppo_ep: 1|act_loss: 30.9|cri_loss: 30.5|unsuper_loss: 0.0' then "
    "'average reward score: -7.8'",
    "NeMo-RL: '===== Step 5/29687 =====' banners and '📊 Training Results:' blocks of '  • Loss: 0.0502' bullets",
    "W&B's console summary at a run's end: 'wandb: Run summary:' then 'wandb: <key> <value>' lines (one step)",
    "JSONL metrics (ms-swift logging.jsonl, LLaMA-Factory trainer_log.jsonl, W&B history): one object a line with "
    "'step', 'global_step', '_step', 'current_steps' or 'global_step/max_steps': \"300/1296\"",
    "W&B CSV export: a 'Step' or '_step' column, then '<run> - <metric>' or '<metric>' columns",
    "a pasted table whose first column is 'Step' (the HF notebook's 'Step | Training Loss | reward | ...')",
    "a script's own lines of 'key=value' pairs, two or more a line: 'step 10 | loss=0.12 reward=0.5±0.1 kl=0.001'",
    "TRL trainer_state.json (log_history), W&B history JSON (a list of records with '_step')",
    "TensorBoard events.out.tfevents.*; MLflow run folder mlruns/<exp>/<run>/metrics/<key> "
    "(lines '<timestamp> <value> <step>')",
)


def unreadable(path: Path, tried: str) -> IngestError:
    """The error for a file no reader understands: what was tried and what each format looks like."""
    return IngestError(f"{path}: no training metrics found (tried: {tried}). Readable formats:\n  - "
                       + "\n  - ".join(FORMATS))


TEXT_READER_SURE = 20
"""Steps a console reader must find for the readers after it not to be tried: a run logs its metrics at every step,
while a config printed at a log's start (DeepSpeed's ``[config.py:1000:print] ... {'enabled': False, ...}`` lines,
NeMo-RL's ``Final config:`` dump) gives a few records to a reader tried earlier, which then hid the log's own format."""


def parse_text_log(text: str) -> tuple[dict[int, dict[str, float]], str]:
    """Records of a console log and the reader that found them: verl lines, AReaL tables, console dicts, tqdm bars with
    numbers (OpenRLHF), mlx-lm 'Iter N' lines, DeepSpeed-Chat step lines, NeMo-RL result blocks, W&B's run summary, 'Step | ...' tables, 'key=value' lines.

    The first reader that finds :data:`TEXT_READER_SURE` steps or more wins; else the framework reader that finds
    the most (the earlier on ties); the generic readers (:data:`_GENERIC_READERS`) only when no framework reader found
    a record; ``({}, "")`` when none finds any. The line readers get the text without
    its blank lines (which they skip; squeezed once here: review 17, Z-R17a), the dict reader the text as it is
    (a dict wrapped over lines by a paste spans at most so many of them).
    """
    text = _ESCAPES.sub("", text)  # terminal colours (wandb's, rich's highlighted numbers) in every reader's way
    squeezed = F.squeeze_blank_lines(text)
    best: tuple[dict[int, dict[str, float]], str] = ({}, "")
    for name, reader, given in (("verl 'step:N - k:v' lines", parse_verl_log, squeezed),
                                ("AReaL tables", F.parse_areal_log, squeezed),
                                ("console dicts", F.parse_dict_log, text),
                                ("tqdm bars with numbers (OpenRLHF)", F.parse_tqdm_postfix_log, text),
                                ("mlx-lm 'Iter N: ...' lines", F.parse_mlx_log, squeezed),
                                ("DeepSpeed-Chat 'epoch: E|step: N|...' lines", F.parse_dschat_log, squeezed),
                                ("NeMo-RL 'Training Results:' blocks", F.parse_nemo_rl_log, text),
                                ("W&B's 'Run summary:'", F.parse_wandb_summary, squeezed),
                                ("'Step | ...' tables", F.parse_table_log, squeezed),
                                ("'key=value' lines", F.parse_kv_log, squeezed)):
        if best[0] and (len(best[0]) >= TEXT_READER_SURE or name in _GENERIC_READERS):
            break
        records = reader(given)
        if len(records) > len(best[0]):
            best = (records, name)
    return best


_GENERIC_READERS = ("W&B's 'Run summary:'", "'Step | ...' tables", "'key=value' lines")
"""Readers of shapes many logs share: tried only when no reader of a framework's own format found a record."""


Runs = dict[str | None, dict[int, dict[str, float]]]


MAX_FILE_ENV = "EVOTRAINER_INGEST_MAX_MB"
MAX_FILE_BYTES = 1 << 30  # one run file read into memory (a log, a JSON, a dump); $EVOTRAINER_INGEST_MAX_MB overrides


def max_file_bytes() -> int:
    """The largest run file :func:`ingest` reads: ``$EVOTRAINER_INGEST_MAX_MB`` MiB, else :data:`MAX_FILE_BYTES`.

    Raises:
        IngestError: the variable is set to something other than a positive whole number.
    """
    raw = os.environ.get(MAX_FILE_ENV, "").strip()
    if not raw:
        return MAX_FILE_BYTES
    if not raw.isdigit() or int(raw) < 1:
        raise IngestError(f"{MAX_FILE_ENV}={raw!r}: give a positive whole number of MiB")
    return int(raw) << 20


def _check_size(path: Path) -> None:
    """Refuse a run file larger than :func:`max_file_bytes` before any byte is read.

    Readers load a file whole; a foreign run folder is hostile input, and a sparse file in it (``truncate -s
    3G train.log``, or a tar's sparse member) takes no disk but made the reader allocate its full size: a
    MemoryError that ended the whole diagnosis, or gigabytes of memory taken from the machine.
    """
    st, cap = path.stat(), max_file_bytes()
    if not stat.S_ISREG(st.st_mode):  # a FIFO given as the file blocked the reader forever; /dev/zero never ends
        raise IngestError(f"{path}: not a regular file (a FIFO, device or socket); give the log file itself")
    if st.st_size > cap:
        raise IngestError(f"{path}: {st.st_size >> 20} MiB, larger than the {cap >> 20} MiB a run file may have; "
                          f"{_SIZE_HINT}")


_SIZE_HINT = f"set {MAX_FILE_ENV} higher to read it, or remove it from the folder"


def read_run_text(path: Path) -> str:
    """The text of a run file (undecodable bytes replaced), read within :func:`max_file_bytes`.

    Every reader of a foreign run folder goes through here or :func:`_check_size` (the import's and watch's
    copies of the text logs, MLflow metric files and tags, JSON and JSONL): one that read a file whole on its
    own took gigabytes for a sparse file the diagnosis had refused.

    Raises:
        IngestError: not a regular file, or larger than the cap (names the file and the fix).
    """
    try:
        return F.read_capped(path, max_file_bytes(), _SIZE_HINT).decode(errors="replace")
    except ValueError as exc:
        raise IngestError(str(exc)) from None


def _read_file(path: Path, version: str, max_rows: int | None = None, budget: F.ReadBudget | None = None,
               left_out: list[str] | None = None) -> tuple[Runs, list[dict[str, Any]]]:
    """Records (per run; ``None`` is the file's own version) and rollout rows of one file, by name and content
    (at most ``max_rows`` rollout rows, default :data:`MAX_ROLLOUT_ROWS`; a .gz within ``budget``, the folder
    read's :class:`~evotrainer.harness.ingest_formats.ReadBudget`, when given; the first :data:`MAX_IMPORT_RUNS`
    runs of a W&B export, the names of the others appended to ``left_out`` when given).

    Raises:
        IngestError: the file is malformed; the message names it (JSON nested past the recursion limit, a step
            that is not an integer, ... included: a readers' own ``ValueError`` is named here).
    """
    try:
        _check_size(path)
        runs, rows = _read_file_as_is(path, version, max_rows, budget, left_out)
        for recs in runs.values():
            _thinned(path, recs)
        _check_steps(path, [s for recs in runs.values() for s in recs] + [r.get("step", 0) for r in rows])
        return runs, rows
    except IngestError:
        raise
    except RecursionError:
        raise IngestError(f"{path}: nested too deeply to read (JSON deeper than Python's recursion limit); "
                          "is it really a training log?") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise IngestError(f"{path}: unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None


_STEP_RANGE = (-(1 << 63), (1 << 63) - 1)  # steps are int64 in the evidence arrays and the stores


def _check_steps(path: Path, steps: list[Any]) -> None:
    """Refuse a step outside a 64-bit integer (review 7: ``step: 1e30`` in a JSONL, a verl log or a
    ``trainer_state.json`` ended ``diagnose`` and ``import`` with a bare "OverflowError: Python int too large to
    convert to C long", no file named, when the series became arrays).

    Raises:
        IngestError: names the file and the step.
    """
    lo, hi = _STEP_RANGE
    bad = next((x for x in steps if isinstance(x, int) and not lo <= x <= hi), None)
    if bad is not None:
        shown = str(bad) if len(str(bad)) <= 40 else f"{str(bad)[:20]}...({len(str(bad))} digits)"
        raise IngestError(f"{path}: step {shown} does not fit a 64-bit integer; is it really a training log?")


def _read_file_as_is(path: Path, version: str, max_rows: int | None, budget: F.ReadBudget | None = None,
                     left_out: list[str] | None = None) -> tuple[Runs, list[dict[str, Any]]]:
    name = path.name
    if name == "trainer_state.json":
        text = read_run_text(path)
        try:
            return {None: parse_trainer_state_text(text)}, []
        except NumberTooLong as exc:  # review 18 (I-R18): was Python's own "Exceeds the limit (4300 digits)"
            raise IngestError(exc.located(str(path), text)) from None
    if name.startswith("events.out.tfevents"):
        try:
            return {None: parse_tensorboard(path, opener=F.open_listed)}, []
        except ValueError as exc:  # a corrupt record length (names the file)
            raise IngestError(str(exc)) from None
    if path.suffix == ".jsonl":
        if _is_verl_dump(path):
            return {}, read_verl_dump(path, version, max_rows)
        return {None: parse_jsonl_metrics(_lines(read_run_text(path)), str(path))}, []
    if path.suffix == ".parquet" and "completions" in name:
        return {}, read_trl_completions(path, version, max_rows)
    if path.suffix == ".csv":
        try:
            runs = F.parse_wandb_csv(read_run_text(path), str(path), MAX_IMPORT_RUNS, left_out)
        except ValueError as exc:
            raise IngestError(str(exc)) from None
        if not runs:
            raise unreadable(path, "W&B CSV export (no numeric cells)")
        return dict(runs), []
    if path.suffix == ".json":
        text = read_run_text(path)
        try:
            data = loads(text)
        except json.JSONDecodeError as exc:
            raise IngestError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
        except NumberTooLong as exc:
            raise IngestError(exc.located(str(path), text)) from None
        if isinstance(data, dict) and "log_history" in data:
            return {None: parse_trainer_state(data)}, []
        records = F.parse_wandb_history(data) if isinstance(data, (list, dict)) else {}
        if not records:
            raise unreadable(path, "trainer_state.json log_history, W&B history records")
        return {None: records}, []
    if path.suffix == ".gz":
        try:
            text = F.read_gzip_text(path, budget=budget)
        except F.BudgetSpent as exc:  # said, not only listed with the errors (which are shown when nothing reads)
            _note(str(exc))
            raise IngestError(str(exc)) from None
        except ValueError as exc:
            raise IngestError(str(exc)) from None
    else:
        text = read_run_text(path)
    try:
        records, _ = parse_text_log(text)
    except NumberTooLong as exc:  # review 19 (I-R19): was Python's own "Exceeds the limit (4300 digits)", no line
        raise IngestError(exc.located(str(path), text)) from None
    if not records:
        raise unreadable(path, "verl 'step:N - key:value' lines, AReaL 'Train step' tables, console dicts, "
                               "tqdm bars with numbers (OpenRLHF), mlx-lm 'Iter N: ...' lines, DeepSpeed-Chat "
                               "'epoch: E|step: N|...' lines, NeMo-RL 'Training Results:' blocks, W&B's 'Run summary:', "
                               "'Step | ...' tables, 'key=value' lines")
    return {None: records}, []


_SKIP_DIRS = {"checkpoints", "rollouts", ".git", "__pycache__", "reports", "plots"}


def _run_files(folder: Path) -> list[Path]:
    files = []
    for p in F.files_under(folder):  # regular files only, no link that leaves the folder
        if any(part in _SKIP_DIRS for part in p.relative_to(folder).parts[:-1]):
            continue
        n = p.name
        if (n == "trainer_state.json" or n.startswith("events.out.tfevents") or p.suffix in (".log", ".jsonl", ".csv", ".txt")
                or n.endswith(".log.gz") or (p.suffix == ".parquet" and "completions" in n)):
            files.append(p)
    # HF checkpoints each hold a trainer_state.json: keep the most complete (the latest) one.
    states = [p for p in files if p.name == "trainer_state.json"]
    if len(states) > 1:
        best = max(states, key=_history_length)
        files = [p for p in files if p.name != "trainer_state.json" or p == best]
    return files


def _history_length(path: Path) -> int:
    """Entries of a ``trainer_state.json``'s ``log_history``; -1 for one too large or unreadable (it still goes to
    :func:`_read_file`, which names the problem when it is the only one)."""
    try:
        text = read_run_text(path)
        hist = iter_log_history(text)
        if hist is not None:
            return sum(1 for _ in hist)
        data = loads(text)
        return len(data.get("log_history", [])) if isinstance(data, dict) else -1
    except (IngestError, OSError, ValueError, TypeError, RecursionError):
        return -1


def series_to_evidence(series: dict[str, RawSeries], rollouts: list[dict[str, Any]], source: str) -> Evidence:
    """Build an Evidence from ``{version: {our name: [(step, value)]}}`` and rollout rows."""
    ev = Evidence(metrics=series, source=source)
    for v in series:
        ev.parents.setdefault(v, None)
    if rollouts:
        ev.rollouts = _rows_to_table(rollouts)
        for v in ev.rollouts.column("version_id").unique().to_pylist():
            ev.parents.setdefault(v, None)
    return ev


def ingest(path: str | Path, version: str | None = None, budget: F.ReadBudget | None = None) -> Evidence:
    """Evidence of a run folder or file (see module docstring).

    Args:
        path: an EvoTrainer run folder (has ``lineage.db``), a foreign run folder, or one file.
        version: version id for a foreign run (default: the folder or file stem).
        budget: the decompressed bytes its .gz files may take together (default: a fresh
            :class:`~evotrainer.harness.ingest_formats.ReadBudget` of
            :data:`~evotrainer.harness.ingest_formats.MAX_IMPORT_DECOMPRESSED_BYTES`); a .gz past it is skipped
            with an :class:`IngestWarning` naming it and the cap. ``import`` passes one it also reads the logs with.

    At most :data:`MAX_IMPORT_RUNS` versions (the first runs read; an :class:`IngestWarning` names the cap and the
    count left out).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IngestError: nothing readable there.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    if p.is_dir() and (p / "lineage.db").exists():
        ws = Workspace.open(p)
        try:
            return Evidence.from_workspace(ws)
        finally:
            ws.close()
    if version:
        vid = version
    elif p.is_dir():
        vid = p.name
    elif p.name == "trainer_state.json":
        vid = p.parent.name or "run"
    else:
        vid = p.name.split(".log")[0] if ".log" in p.name else p.stem
    budget = F.ReadBudget() if budget is None else budget
    vid = F.as_text(vid)  # a name's undecodable bytes (lone surrogates) do not go on into the stores
    mlflow = _mlflow_dirs(p)
    files = [f for f in _run_files(p) if not any(d in f.parents for d in mlflow)] if p.is_dir() else [p]
    if not files and not mlflow:
        raise IngestError(f"{p}: no run files (verl .log, console .log / .txt, trainer_state.json, "
                          f"events.out.tfevents.*, .jsonl, W&B .csv, MLflow metrics/ folder, completions parquet)")
    series: dict[str, RawSeries] = {}
    rows: list[dict[str, Any]] = []
    errors = []
    cap = _RunCap()
    for d in mlflow:
        run = vid if len(mlflow) == 1 and not files else F.mlflow_run_name(d)
        if not cap.admit(run):
            continue
        try:
            recs = F.parse_mlflow_metrics(d, max_file_bytes(), _SIZE_HINT)
            _check_steps(d, list(recs))
            _thinned(d, recs)
            series[run] = records_to_series(recs)
        except IngestError:
            raise
        except ValueError as exc:
            errors.append(str(exc))
    split = _split_runs(p, files, vid)
    for run, run_files in split.items():
        if run != vid and not cap.admit(run):  # a TensorBoard run folder past the cap: its files are not read
            continue
        merged: dict[str, StepRecords] = {}  # the run's files together: thinned past the same caps
        first_file: dict[str, Path] = {}  # the file each merged version's first records came from
        for f in run_files:
            left_out: list[str] = []  # the runs of a W&B export past MAX_IMPORT_RUNS
            try:
                runs, rws = _read_file(f, run, MAX_ROLLOUT_ROWS - len(rows), budget, left_out)  # caps per run read
            except IngestError as exc:
                if len(files) == 1 and not mlflow:
                    raise
                errors.append(str(exc))
                continue
            for name, recs in runs.items():  # a W&B chart export may hold several runs
                key = run if name is None or len(runs) == 1 else name
                if not cap.admit(key):
                    continue
                into = merged[key] if key in merged else merged.setdefault(key, StepRecords())
                first_file.setdefault(key, f)
                if first_file[key] != f:
                    _say_clash(p, key, first_file[key], f, into, recs)
                for step, rec in recs.items():
                    into.add_all(step, rec)
            if rws and cap.admit(run):
                rows += rws
            for name in left_out:
                cap.leave_out(name)
        for key, recs in merged.items():
            if len(run_files) > 1:
                _thinned(f"{p} (run {key}, its {len(run_files)} files together)", recs)
            if recs:
                series[key] = records_to_series(recs)
    if not series and not rows:
        raise IngestError(f"{p}: nothing readable; " + "; ".join(errors[:3]))
    cap.say(p)
    return series_to_evidence(series, rows, str(p))


CLASH_MIN_STEPS = 3
"""Steps at which two files of one folder must log one metric with different values before :func:`ingest` says they
look like separate runs (one or two such steps are what a resumed run re-logging its last steps gives)."""


def _say_clash(root: Path, version: str, first: Path, other: Path, held: dict[int, dict[str, float]],
               recs: dict[int, dict[str, float]]) -> None:
    """An :class:`IngestWarning` when ``other``'s records disagree with those already read for ``version`` (from
    ``first`` on) at :data:`CLASH_MIN_STEPS` or more steps of one metric: a folder of separate runs (e.g. several
    verl console logs side by side) is read as one version, where a later file's values replace an earlier one's
    at the same step, so trends and findings mix the runs (a new user's report: ``diagnose`` of a folder of three
    verl logs found a train / held-out divergence that none of them has alone)."""
    clash: dict[str, list[int]] = {}
    for step, rec in recs.items():
        old = held.get(step)
        if not old:
            continue
        for k, x in rec.items():
            y = old.get(k)
            if y is not None and x == x and y == y and x != y:
                clash.setdefault(k, []).append(step)
    worst = max(clash.items(), key=lambda kv: len(kv[1]), default=None)
    if worst is None or len(worst[1]) < CLASH_MIN_STEPS:
        return
    name, steps = worst
    _note(f"{root}: {F.as_text(other.name)} logs {F.as_text(name)} at {len(steps)} steps ({min(steps)}..{max(steps)}) "
          f"that the files read before it (from {F.as_text(first.name)} on) logged with other values: they look like "
          f"separate runs, read here as one version {F.as_text(version)} (the later file's values kept where steps "
          "meet), so its trends and findings mix them; diagnose each file on its own, or put each run in a folder of "
          "its own and diagnose that")


def _mlflow_dirs(p: Path) -> list[Path]:
    """MLflow file store ``metrics/`` folders at or under ``p`` (one per run)."""
    if not p.is_dir():
        return []
    cands = [p] if p.name == "metrics" else []
    root = p.resolve()
    cands += [d for d in sorted(F.tree_entries(p)) if d.name == "metrics" and d.is_dir()
              and d.resolve().is_relative_to(root)]
    found: list[Path] = []
    for d in cands:
        if not any(f in d.parents for f in found) and F.is_mlflow_metrics_dir(d):
            found.append(d)
    return found


def _split_runs(root: Path, files: list[Path], vid: str) -> dict[str, list[Path]]:
    """One version per TensorBoard run folder when a folder holds several (``<tb_dir>/<run_name>/``).

    Other files, and a single TensorBoard run, belong to the version ``vid``.
    """
    tb_dirs = sorted({f.parent for f in files if f.name.startswith("events.out.tfevents")})
    if len(tb_dirs) < 2 or not root.is_dir():
        return {vid: files}
    runs: dict[str, list[Path]] = {}
    for f in files:
        key = vid
        if f.name.startswith("events.out.tfevents"):
            rel = f.parent.relative_to(root).as_posix()
            key = F.as_text(rel.replace("/", "-")) if rel != "." else vid
        runs.setdefault(key, []).append(f)
    return runs
