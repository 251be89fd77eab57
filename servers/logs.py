"""Log- and metric-search tools: the run log (``logs/run.jsonl``) and the step metrics of the lineage store.

Tools: ``search_logs`` (substring or regex, version, level, time range), ``list_metrics``,
``get_metric_series`` (downsampled to at most ``max_points`` buckets: mean value with min / max per
bucket, as TensorBoard's and W&B's line charts do), ``metric_summary`` (first / last / min / max /
mean and the least-squares slope per step). Metric names are those of ``evotrainer.metrics``.

Regex search uses RE2 (``google-re2``): matching is linear in the text length whatever the pattern, so a
catastrophic-backtracking pattern such as ``(x+x+)+y`` cannot freeze the server (Python's ``re`` held the
GIL for seconds per line and stalled every session). RE2 has no backreferences or look-around; such a
pattern is a tool error that says so. The scan also has a deadline (:data:`SEARCH_DEADLINE_S`): past it
the call is a tool error that says how to narrow the search.
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from evotrainer.patterns import PatternError, compile_re2
from evotrainer.servers.common import (
    MAX_LIMIT,
    Page,
    ToolContext,
    page_fields,
    require_version,
    state_of,
)
from evotrainer.terminal import clip_text

LEVELS = ("debug", "info", "warning", "error")
SEARCH_DEADLINE_S = 10.0  # wall-clock budget of one search_logs scan (seconds)
_CHECK_EVERY = 256  # records scanned between two deadline checks (every record with regex=true)
MAX_REGEX_PROGRAM = 2_000  # RE2 program instructions of a search_logs pattern (review 3, L-R1, below)
MAX_SCAN_UNITS = 32_000_000
"""Characters x RE2 program instructions that a regex scan reads of one record: the first
``MAX_SCAN_UNITS // programsize`` characters of each message (52,805 for a 606-instruction pattern, 1.2 M for a
26-instruction one). Where RE2's DFA gives up it matches by NFA, at text x program size: ``a[ab]{600}c`` (606
instructions) took 36 s and ``(?:[ab]*a[ab]{200}){3}c`` (611) 43 s on one 4,000,000-character record of random
a/b, about 1.5e-8 s per character-instruction, all inside one record where the scan's deadline is not read. This
bound keeps one record under ~0.5 s; records read only in part are counted in the reply's ``partly_scanned``."""
TimeArg = Annotated[str | None, Field(description="Unix seconds (e.g. '1767225600') or ISO 8601 "
                                                   "(e.g. '2026-01-01T00:00:00Z').")]


class LogRecord(BaseModel):
    """One log record."""

    time: float = Field(description="Unix seconds.")
    iso_time: str = Field(description="UTC, ISO 8601.")
    level: str
    version: str | None
    source: str
    message: str
    extra: dict[str, Any] = Field(default_factory=dict, description="Other fields of the record.")


class LogList(Page):
    """A page of log records, oldest first."""

    records: list[LogRecord]
    partly_scanned: int = Field(0, description="Records whose message was longer than a regex scan reads (the "
                                               "first 32,000,000 / program-size characters, see MAX_SCAN_UNITS): "
                                               "matched on that prefix only. 0 for substring search.")
    unread_bytes: int = Field(0, description="Bytes of the run log that were not searched: its oldest records past "
                                             "256 MiB / 500,000 lines / the parse budget (16 MiB, 2,000,000 values), "
                                             "and the lines skipped (over 1 MiB, or dense); 0 when all was read.")
    dense_lines: int = Field(0, description="Lines skipped unparsed as too dense: over 20,000 JSON values "
                                            "(MAX_LOG_LINE_VALUES; EvoTrainer's own records hold dozens); their bytes "
                                            "are in unread_bytes.")


class MetricVersion(BaseModel):
    """Which metrics a version has and over how many steps."""

    version_id: str
    n_steps: int
    last_step: int
    names: list[str] = Field(description="The version's metric names, sorted, at most 1,000.")
    names_omitted: int = Field(0, description="Names past the first 1,000.")


class MetricList(BaseModel):
    """Metric names logged in the run, per version."""

    names: list[str] = Field(description="All metric names (slash namespaces, e.g. reward/mean), sorted, at most "
                                         "1,000.")
    names_omitted: int = Field(0, description="Names past the first 1,000.")
    versions: list[MetricVersion]


REPLY_NAMES_MAX = 1000
"""Metric names one list carries (review 15 J-R15: 25,000 names of ~4,000 characters were a 156 MiB list_metrics
reply); metric_summary describes as many when no names are given."""


class SeriesPoint(BaseModel):
    """One (possibly downsampled) point of a series."""

    step: int = Field(description="Last step of the bucket.")
    value: float | None = Field(description="Mean over the bucket (null if only NaN / missing values).")
    min: float | None
    max: float | None
    n: int = Field(description="Raw points in the bucket.")


class MetricSeries(BaseModel):
    """A metric of a version over steps."""

    version_id: str
    name: str
    n_raw: int = Field(description="Raw points in the step range.")
    downsampled: bool
    points: list[SeriesPoint]


class MetricStats(BaseModel):
    """Summary of one metric series."""

    name: str
    n: int
    first: float | None
    last: float | None
    min: float | None
    max: float | None
    mean: float | None
    slope_per_step: float | None = Field(description="Least-squares slope (value units per step).")
    last_k_mean: float | None = Field(description="Mean of the last min(10, n) values.")


class MetricSummary(BaseModel):
    """Summary of a version's metrics and its eval summary."""

    version_id: str
    metrics: list[MetricStats]
    eval_summary: dict[str, Any]


def parse_time(value: str | None, field: str) -> float | None:
    """Unix seconds from a unix-seconds or ISO-8601 string (None passes through).

    Raises:
        ToolError: neither form.
    """
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ToolError(f"{field}={value!r}: give unix seconds (1767225600) or ISO 8601 (2026-01-01T00:00:00Z)") \
            from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def compile_regex(query: str) -> Any:
    """A case-insensitive RE2 pattern (linear-time matching, see the module docstring).

    Raises:
        ToolError: ``query`` is not valid RE2 syntax (e.g. a backreference or look-around), or its program is
            over :data:`MAX_REGEX_PROGRAM` instructions.
    """
    try:
        pattern = compile_re2(query, case_sensitive=False)
    except PatternError as why:
        raise ToolError(f"query={query!r} is not a valid regex ({why}); RE2 syntax: no backreferences or "
                        "look-around; fix it or pass regex=false") from None
    # RE2 is linear in the text, but its fallback (NFA) costs text x program size: a 40-character pattern of
    # nested counted repeats, (?:(?:a|b|ab|ba){0,100}){0,10}c, compiles to 6,014 instructions and took 1.06 s per
    # 20,000-character record (review 3, L-R1); log regexes are tens of instructions ('error.*step \d+': 26).
    if pattern.programsize > MAX_REGEX_PROGRAM:
        raise ToolError(f"query={query[:80]!r} compiles to {pattern.programsize} RE2 instructions, over "
                        f"{MAX_REGEX_PROGRAM}: use fewer or smaller counted repeats ({{m,n}}) or a plain substring")
    return pattern


def downsample(series: list[tuple[int, float | None]], max_points: int) -> list[SeriesPoint]:
    """Bucket ``series`` into at most ``max_points`` contiguous buckets (mean, min, max; NaN / None skipped)."""
    n = len(series)
    if n == 0:
        return []
    buckets = min(n, max_points)
    out = []
    for b in range(buckets):
        chunk = series[b * n // buckets:(b + 1) * n // buckets]
        vals = [v for _, v in chunk if v is not None and not math.isnan(v)]
        out.append(SeriesPoint(step=chunk[-1][0], value=sum(vals) / len(vals) if vals else None,
                               min=min(vals) if vals else None, max=max(vals) if vals else None, n=len(chunk)))
    return out


def stats_of(name: str, series: list[tuple[int, float | None]]) -> MetricStats:
    """First / last / min / max / mean and least-squares slope of a series (NaN / None skipped)."""
    pts = [(s, v) for s, v in series if v is not None and not math.isnan(v)]
    if not pts:
        return MetricStats(name=name, n=0, first=None, last=None, min=None, max=None, mean=None,
                           slope_per_step=None, last_k_mean=None)
    vals = [v for _, v in pts]
    slope = None
    if len(pts) >= 2:
        sx = sum(s for s, _ in pts) / len(pts)
        sy = sum(vals) / len(vals)
        sxx = sum((s - sx) ** 2 for s, _ in pts)
        slope = sum((s - sx) * (v - sy) for s, v in pts) / sxx if sxx > 0 else 0.0
    tail = vals[-10:]
    return MetricStats(name=name, n=len(vals), first=vals[0], last=vals[-1], min=min(vals), max=max(vals),
                       mean=sum(vals) / len(vals), slope_per_step=slope, last_k_mean=sum(tail) / len(tail))


def search_logs(
    ctx: ToolContext,
    query: Annotated[str | None, Field(description="Text to find in the message (case-insensitive), or a "
                                                   "RE2 regex with regex=true (no backreferences / look-around).",
                                                   max_length=1000)] = None,
    regex: Annotated[bool, Field(description="Treat query as a regular expression.")] = False,
    version_id: Annotated[str | None, Field(description="Only records of this version.")] = None,
    level: Annotated[Literal["debug", "info", "warning", "error"] | None, Field(
        description="Minimum level (debug < info < warning < error).")] = None,
    since: TimeArg = None,
    until: TimeArg = None,
    offset: Annotated[int, Field(description="Index of the first record.", ge=0)] = 0,
    limit: Annotated[int, Field(description="Records per page.", ge=1, le=MAX_LIMIT)] = 50,
    max_chars: Annotated[int, Field(description="Cut messages to this many characters (0 = no cut).", ge=0)]
    = 2000,
) -> LogList:
    """Search the run log (training, jobs, decisions, errors) by text or regex, version, level and time."""
    ws = state_of(ctx).workspace()
    t0, t1 = parse_time(since, "since"), parse_time(until, "until")
    if t0 is not None and t1 is not None and t0 > t1:
        raise ToolError(f"since={since!r} is after until={until!r}: give since <= until")
    pattern = compile_regex(query) if query and regex else None
    needle = query.lower() if query and not regex else None
    min_level = LEVELS.index(level) if level else 0
    all_records, unread, dense = ws.read_logs_counted()
    deadline = time.monotonic() + SEARCH_DEADLINE_S
    scan = MAX_SCAN_UNITS // max(1, pattern.programsize) if pattern is not None else 0
    out, partly = [], 0
    for i, rec in enumerate(all_records):
        if (pattern is not None or i % _CHECK_EVERY == 0) and time.monotonic() > deadline:
            raise ToolError(f"search_logs stopped after {SEARCH_DEADLINE_S:g} s at record {i} of {len(all_records)}; "
                            "narrow it with version_id, level, since / until, or a simpler query")
        msg = str(rec.get("message", ""))
        lvl = str(rec.get("level", "info")).lower()
        t = rec.get("time")
        if version_id is not None and rec.get("version") != version_id:
            continue
        if (LEVELS.index(lvl) if lvl in LEVELS else len(LEVELS)) < min_level:
            continue
        if not isinstance(t, (int, float)) or (t0 is not None and t < t0) or (t1 is not None and t > t1):
            continue
        if pattern is not None:
            partly += len(msg) > scan
            if not pattern.search(msg[:scan]):
                continue
        if needle is not None and needle not in msg.lower():
            continue
        out.append(rec)
    page = out[offset:offset + limit]
    skip = {"time", "level", "version", "source", "message"}
    records = [LogRecord(time=r["time"], iso_time=datetime.fromtimestamp(r["time"], timezone.utc).isoformat(),
                         level=str(r.get("level", "info")), version=r.get("version"),
                         source=str(r.get("source", "")), message=clip_text(str(r.get("message", "")), max_chars),
                         extra=_extra(r, skip)) for r in page]
    return LogList(records=records, partly_scanned=partly, unread_bytes=unread, dense_lines=dense,
                   **page_fields(len(out), offset, len(page)))


EXTRA_FIELDS_MAX = 50
EXTRA_VALUE_MAX_CHARS = 2000
"""A search_logs record carries at most 50 extra fields, each value at most 2,000 characters of JSON (longer ones as
that JSON cut, saying how much): review 14 C-R14's one record with a 50 MB field was a 300 MiB reply."""


def _extra(rec: dict[str, Any], skip: set[str]) -> dict[str, Any]:
    """The fields of a log record besides ``skip``, bounded (:data:`EXTRA_FIELDS_MAX`, :data:`EXTRA_VALUE_MAX_CHARS`)."""
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if k in skip:
            continue
        if len(out) == EXTRA_FIELDS_MAX:
            out["extra_omitted"] = len(rec) - len(skip & rec.keys()) - EXTRA_FIELDS_MAX
            break
        if isinstance(v, str) or not isinstance(v, (int, float, bool, type(None))):
            text = v if isinstance(v, str) else json.dumps(v, default=str)
            if len(text) > EXTRA_VALUE_MAX_CHARS:
                v = clip_text(text, EXTRA_VALUE_MAX_CHARS)
        out[str(k)[:200]] = v
    return out


def list_metrics(
    ctx: ToolContext,
    version_id: Annotated[str | None, Field(description="Only this version (default: every version).")] = None,
) -> MetricList:
    """Metric names logged in the run and, per version, the metrics and number of steps."""
    ws = state_of(ctx).workspace()
    vids = [require_version(ws, version_id).id] if version_id else [v.id for v in ws.lineage.versions()]
    per, every = [], set()
    for vid in vids:
        allm = ws.lineage.all_metrics(vid)
        if not allm and version_id is None:
            continue
        steps = {s for series in allm.values() for s, _ in series}
        names = sorted(allm)
        every.update(names)
        per.append(MetricVersion(version_id=vid, n_steps=len(steps), last_step=max(steps, default=-1),
                                 names=names[:REPLY_NAMES_MAX], names_omitted=max(0, len(names) - REPLY_NAMES_MAX)))
    names = sorted(every)
    return MetricList(names=names[:REPLY_NAMES_MAX], names_omitted=max(0, len(names) - REPLY_NAMES_MAX), versions=per)


def get_metric_series(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="Version id.")],
    name: Annotated[str, Field(description="Metric name, e.g. 'reward/mean' (list_metrics shows them).")],
    max_points: Annotated[int, Field(description="Most points returned; longer series are bucket-averaged.",
                                     ge=1, le=5000)] = 200,
    step_min: Annotated[int | None, Field(description="First step (inclusive).", ge=0)] = None,
    step_max: Annotated[int | None, Field(description="Last step (inclusive).", ge=0)] = None,
) -> MetricSeries:
    """A metric of a version over training steps, downsampled to at most max_points (mean, min, max per
    bucket)."""
    ws = state_of(ctx).workspace()
    require_version(ws, version_id)
    series = ws.lineage.metric_series(version_id, name)
    if not series:
        names = ws.lineage.metric_names(version_id)
        raise ToolError(f"metric {name!r} not logged for {version_id}; "
                        + (f"it has: {', '.join(names)}" if names else "it has no metrics yet (train it first)"))
    series = [(s, v) for s, v in series if (step_min is None or s >= step_min) and (step_max is None or s <= step_max)]
    return MetricSeries(version_id=version_id, name=name, n_raw=len(series), downsampled=len(series) > max_points,
                        points=downsample(series, max_points))


def metric_summary(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="Version id.")],
    names: Annotated[list[str] | None, Field(description="Metric names (default: all logged).")] = None,
) -> MetricSummary:
    """Per metric of a version: n, first, last, min, max, mean, slope per step and mean of the last 10
    values; plus the version's eval summary."""
    ws = state_of(ctx).workspace()
    v = require_version(ws, version_id)
    allm = ws.lineage.all_metrics(version_id)
    if names:
        missing = [n for n in names if n not in allm]
        if missing:
            raise ToolError(f"metrics not logged for {version_id}: {', '.join(missing)}; it has: "
                            f"{', '.join(sorted(allm)) or 'none (train it first)'}")
    return MetricSummary(version_id=version_id, eval_summary=v.eval_summary,
                         metrics=[stats_of(n, allm[n]) for n in (names or sorted(allm)[:REPLY_NAMES_MAX])])


TOOLS = (search_logs, list_metrics, get_metric_series, metric_summary)
"""The log- and metric-search tools, in catalogue order."""
