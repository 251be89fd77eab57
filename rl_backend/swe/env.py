"""The SWE episode environment: a task repository, five tools, tool-call parsing and the limits.

The policy sees a system prompt listing the tools and a user message with the problem statement.
Each reply may hold one or more tool calls in the Hermes / Qwen format (the one chat templates with
tool support emit)::

    <tool_call>{"name": "view", "arguments": {"path": "pkg/mod.py", "start": 1, "end": 40}}</tool_call>

A bare JSON object with ``name`` / ``arguments`` (or a fenced ```json block) is accepted too. A
reply with no parsable call, an unknown tool or bad arguments gets an error observation that says
what to fix (never an exception): it counts as an invalid call and against the tool budget.

Tools (arguments in braces): ``search {pattern, path?}`` regex (RE2) grep over the repo, the first
:data:`SEARCH_MAX_HITS` matches shown and the rest counted, one call stopping after :data:`SEARCH_MAX_LINES`
lines or :data:`SEARCH_CALL_UNITS` characters x pattern size with a note naming where; ``view {path,
start?, end?}`` numbered lines (at most :data:`VIEW_MAX_LINES`); ``edit {path, old, new}`` exact
string replacement (``old`` must occur exactly once); ``run_tests {tests?}`` pytest on a chosen
subset (node ids or files; default: the test files of the hidden tests) in the sandbox; ``submit {}``
ends the episode.

Limits from the recipe's ``tool_use`` section (:class:`evotrainer.recipe.ToolUseSpec`):
``max_turns`` policy replies; ``tool_budget`` tool calls in all (the call that would exceed it is
not run and ends the episode with ``budget_exceeded``); ``per_call_timeout_s`` for a test run;
``per_episode_timeout_s`` wall clock from :meth:`SweEnv.reset` (policy time included).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import re2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evotrainer.errors import EvoTrainerError
from evotrainer.patterns import PatternError, compile_re2
from evotrainer.recipe import ToolUseSpec
from evotrainer.rl_backend.swe.tasks import (
    TASKSET_DIR,
    SweTask,
    is_test_file,
    materialize,
    run_pytest,
    test_file_digests,
)
from evotrainer.sandbox import fs as sfs
from evotrainer.terminal import has_controls

TOOLS: tuple[str, ...] = ("search", "view", "edit", "run_tests", "submit")
VIEW_MAX_LINES = 80
SEARCH_MAX_HITS = 40
SEARCH_MAX_BYTES = 1 << 20  # files larger than 1 MiB are not searched (data, not source)
# RE2 matches by NFA where its DFA gives up, at text x program size, on the host, where the call's timeout is not read
# (review 7: `(?:(?:a|b|ab|ba){0,100}){0,10}c`, 6,014 instructions, took 4.2 s on one 100,000-character line the policy
# can build with edits; a 1 MiB line ~40 s per call). As search_logs does (review 3, L-R1): patterns over
# SEARCH_MAX_PROGRAM instructions are refused, and each line is read to SEARCH_SCAN_UNITS // program size characters.
SEARCH_MAX_PROGRAM = 2_000
SEARCH_SCAN_UNITS = 32_000_000
# One call, all files together (review 18, W-R18: `a` over 4 files of 1 MiB of `a\n` collected 2,097,157 matches to
# show 40: 10.9-27.8 s and 225 MB on the host; a 64 MiB snapshot ~450 s). Matches past the shown ones are counted,
# not kept, and the call stops after SEARCH_MAX_LINES lines (a file counts one at least) or SEARCH_CALL_UNITS
# characters x program size, saying where. Measured on a loaded 2-core host, lines searched as bytes: 100,000 lines
# 0.15-0.22 s (all matching: 0.35 s for the whole call); at worst ~0.6 ns per unit (an 853-instruction pattern on
# 37,514-character lines, as str), so 500M units ~0.3 s. 100,000 lines is about twice W-R7's 53,000-line repository;
# a path narrows a search past it.
SEARCH_MAX_LINES = 100_000
SEARCH_CALL_UNITS = 500_000_000
OBS_MAX_CHARS = 2500
TOOL_ERROR_MAX_CHARS = 300  # of an unexpected exception's text in an observation: the type and a path fit

log = logging.getLogger(__name__)

SYSTEM_PROMPT = """You fix bugs in a Python repository by calling tools. Reply with one or more tool calls, each as
<tool_call>{"name": TOOL, "arguments": {...}}</tool_call>
Tools:
- search {"pattern": regex, "path": folder or file (optional)}: matching lines as path:line: text
- view {"path": file, "start": first line, "end": last line}: numbered lines (at most 80)
- edit {"path": file, "old": exact text, "new": replacement}: replace the one occurrence of old
- run_tests {"tests": ["file.py::test_name", ...] (optional)}: run tests with pytest
- submit {}: finish; hidden tests then grade the repository
Fix the library code, not the tests. Run the failing tests before you submit."""


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchArgs(_Args):
    pattern: str = Field(..., min_length=1)
    path: str = "."


class ViewArgs(_Args):
    path: str
    start: int = Field(1, ge=1)
    end: int | None = Field(None, ge=1)


class EditArgs(_Args):
    path: str
    old: str = Field(..., min_length=1)
    new: str


class RunTestsArgs(_Args):
    tests: list[str] | str | None = None


class SubmitArgs(_Args):
    pass


ARGS: dict[str, type[_Args]] = {"search": SearchArgs, "view": ViewArgs, "edit": EditArgs,
                                 "run_tests": RunTestsArgs, "submit": SubmitArgs}


def _no_pycache(rel: str, _st: os.stat_result) -> bool:
    return rel.rsplit("/", 1)[-1] == "__pycache__"


def repo_digest(repo: Path) -> str:
    """sha256 over the relative paths and contents of every file of a repo (``__pycache__`` skipped).

    Walks without following links (:func:`evotrainer.sandbox.fs.walk`): a link counts by its target
    string, a FIFO or socket by its kind, so a planted one changes the digest without being opened.
    Files are read in :data:`evotrainer.sandbox.fs.READ_CHUNK_BYTES` chunks (memory stays at one chunk).
    """
    h = hashlib.sha256()
    for fd, name, rel, st in sfs.walk(repo, prune=_no_pycache):
        if stat.S_ISDIR(st.st_mode):
            continue
        h.update(rel.encode(errors="surrogateescape") + b"\0")
        if stat.S_ISREG(st.st_mode):  # in chunks: a file the sandboxed run left can be GBs
            for chunk in sfs.read_chunks(fd, name):
                h.update(chunk)
        else:
            h.update(b"link:" + os.fsencode(os.readlink(name, dir_fd=fd)) if stat.S_ISLNK(st.st_mode) else
                     f"special:{stat.S_IFMT(st.st_mode)}".encode())
        h.update(b"\0")
    return h.hexdigest()


class ToolError(EvoTrainerError, ValueError):
    """A tool call that cannot run as given (bad path, ambiguous edit); shown to the policy as an error."""


@dataclass
class ToolCall:
    """A parsed call: tool ``name`` and validated ``args``; ``error`` set (and ``args`` None) when invalid."""

    name: str | None
    args: _Args | None
    raw: str
    error: str | None = None


_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE_RE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


MAX_JSON_MISSES = 256  # ``{`` that start no JSON object, per reply, before the scan gives up


def _json_objects(text: str) -> list[tuple[str, Any]]:
    """Every top-level JSON object in ``text`` (scanning each ``{``), with its raw text.

    At most :data:`MAX_JSON_MISSES` ``{`` may fail to start an object: each failed attempt costs up to the length
    of the text (the decoder's error locates the line), so a reply of 100,000 ``{`` took 3 s (quadratic) before
    this bound; JSON nested past the recursion limit is a miss, not an exception.
    """
    dec, out, i, misses = json.JSONDecoder(), [], 0, 0
    while (i := text.find("{", i)) != -1 and misses < MAX_JSON_MISSES:
        try:
            obj, end = dec.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError):
            i += 1
            misses += 1
            continue
        out.append((text[i:end], obj))
        i = end
    return out


def _to_call(raw: str, obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        return ToolCall(None, None, raw, "a tool call must be a JSON object {\"name\": ..., \"arguments\": {...}}")
    name = obj.get("name", obj.get("tool"))
    args = obj.get("arguments", obj.get("args", obj.get("parameters", {})))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return ToolCall(name, None, raw, f"arguments of {name!r} are not valid JSON")
    if name not in ARGS:
        return ToolCall(name if isinstance(name, str) else None, None, raw,
                        f"unknown tool {name!r}; use one of: {', '.join(TOOLS)}")
    if not isinstance(args, dict):
        return ToolCall(name, None, raw, f"arguments of {name!r} must be a JSON object")
    try:
        return ToolCall(name, ARGS[name].model_validate(args), raw)
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
        return ToolCall(name, None, raw, f"bad arguments for {name}: {errs}")


def parse_tool_calls(text: str) -> list[ToolCall]:
    """All tool calls in a policy reply, in order; invalid ones carry an ``error`` (never raises).

    Looks for ``<tool_call>...</tool_call>`` blocks first (a missing closing tag at the end of the
    reply is tolerated), then fenced ```json blocks, then bare JSON objects. A reply with none of
    these gives one invalid call whose error shows the expected format.
    """
    blocks = _CALL_RE.findall(text)
    if blocks:
        calls = []
        for b in blocks:
            objs = _json_objects(b)
            calls.append(_to_call(objs[0][0], objs[0][1]) if objs else
                         ToolCall(None, None, b, "the <tool_call> block holds no JSON object"))
        return calls
    objs = [(raw, json.loads(raw)) for raw in _FENCE_RE.findall(text) if _safe_json(raw)] or _json_objects(text)
    objs = [(r, o) for r, o in objs if isinstance(o, dict) and ("name" in o or "tool" in o)]
    if objs:
        return [_to_call(r, o) for r, o in objs]
    return [ToolCall(None, None, text[:200], 'no tool call found; reply with <tool_call>{"name": "search", '
                                             '"arguments": {"pattern": "def foo"}}</tool_call>')]


def _safe_json(raw: str) -> bool:
    try:
        json.loads(raw)
        return True
    except (json.JSONDecodeError, RecursionError):
        return False


def _clip(text: str, limit: int = OBS_MAX_CHARS) -> str:
    return text if len(text) <= limit else text[: limit // 2] + "\n...[truncated]...\n" + text[-limit // 2:]


@dataclass
class EpisodeStats:
    """Counters of one episode (the harness's tool-use metrics are means of these over episodes)."""

    turns: int = 0
    calls: int = 0
    calls_by_tool: dict[str, int] = field(default_factory=lambda: {t: 0 for t in TOOLS})
    invalid_calls: int = 0
    test_runs: int = 0
    edits: int = 0
    files_touched: set[str] = field(default_factory=set)
    test_file_edit_calls: int = 0
    searches: list[str] = field(default_factory=list)
    submitted: bool = False
    submit_without_test: bool = False
    budget_exceeded: bool = False
    stop_reason: str = ""  # submit | max_turns | tool_budget | timeout

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["files_touched"] = sorted(self.files_touched)
        return d


class SweEnv:
    """One episode on one task: :meth:`reset` builds the repo, :meth:`step` runs a policy reply's calls.

    Args:
        task: the task.
        workdir: a folder for this episode (the repo is built in ``workdir/repo``).
        limits: the recipe's ``tool_use`` section.
        taskset_root / repos_root: where snapshots (generated) or clones (SWE-bench) live.
    """

    def __init__(self, task: SweTask, workdir: str | Path, limits: ToolUseSpec | None = None,
                 taskset_root: str | Path = TASKSET_DIR, repos_root: str | Path | None = None):
        self.task, self.limits = task, limits or ToolUseSpec()
        self.workdir = Path(workdir)
        self.repo = self.workdir / "repo"
        self.taskset_root, self.repos_root = taskset_root, repos_root
        self.stats = EpisodeStats()
        self.done = False
        self.t0 = 0.0
        self.test_digests: dict[str, str] = {}
        self.test_originals: dict[str, bytes] = {}
        self.tests_edited: set[str] = set()
        self.base_digest = ""

    # --- lifecycle --------------------------------------------------------------------------------
    def reset(self) -> list[dict[str, str]]:
        """Build the task repo and return the opening messages ``[system, user]``."""
        sfs.remove_tree(self.repo)  # the last episode's sandbox may have left links or a 1,100-deep tree
        materialize(self.task, self.repo, self.taskset_root, self.repos_root)
        self.test_digests = test_file_digests(self.repo, self.task.test_patterns)
        with self._repo_fd() as fd:
            self.test_originals = {p: sfs.read_file(fd, p) for p in self.test_digests}
        self.base_digest = repo_digest(self.repo)
        self.stats, self.done, self.t0 = EpisodeStats(), False, time.monotonic()
        self.tests_edited = set()
        user = (f"Repository: {self.task.repo} (files under ./). Problem:\n\n{self.task.problem_statement}")
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def elapsed(self) -> float:
        """Seconds since :meth:`reset`."""
        return time.monotonic() - self.t0

    def step(self, reply: str) -> str:
        """Run the tool calls of one policy reply; returns the observation text (one block per call).

        Ends the episode (``self.done``) on submit, when the tool budget would be exceeded, at
        ``max_turns`` replies, or past ``per_episode_timeout_s``. A tool call that fails (a :class:`ToolError`,
        or any other ``Exception`` from a tool, which is logged) gives an ``[error] ...`` block: the episode
        goes on.

        Raises:
            RuntimeError: the episode is already done.
        """
        if self.done:
            raise RuntimeError("episode is done; call reset() for a new one")
        st, lim = self.stats, self.limits
        st.turns += 1
        parts = []
        for call in parse_tool_calls(reply):
            if self.elapsed() > lim.per_episode_timeout_s:
                st.stop_reason, self.done = "timeout", True
                parts.append(f"[episode time limit {lim.per_episode_timeout_s:g} s reached]")
                break
            if st.calls >= lim.tool_budget:
                st.budget_exceeded, st.stop_reason, self.done = True, "tool_budget", True
                parts.append(f"[tool budget of {lim.tool_budget} calls exhausted; episode over]")
                break
            st.calls += 1
            if call.error:
                st.invalid_calls += 1
                parts.append(f"[error] {call.error}")
                continue
            if call.name is None:  # parse_tool_calls names every call it gives without an error
                raise RuntimeError(f"tool call without a name or an error: {call.raw[:200]!r}")
            st.calls_by_tool[call.name] += 1
            try:
                out = getattr(self, f"_tool_{call.name}")(call.args)
            except ToolError as exc:
                st.invalid_calls += 1
                out = f"[error] {exc}"
            except Exception as exc:  # a tool's bug or an input no check foresaw must not end the training run
                log.warning("SWE tool %s failed on task %s; the episode goes on", call.name, self.task.instance_id,
                            exc_info=True)
                out = (f"[error] {call.name} failed ({type(exc).__name__}: {str(exc)[:TOOL_ERROR_MAX_CHARS]}); "
                       "check the arguments and try another call")
            parts.append(f"[{call.name}] {out}" if not out.startswith("[error]") else out)
            if self.done:
                break
        if not self.done and self.elapsed() > lim.per_episode_timeout_s:
            st.stop_reason, self.done = "timeout", True
            parts.append(f"[episode time limit {lim.per_episode_timeout_s:g} s reached]")
        if not self.done and st.turns >= lim.max_turns:
            st.stop_reason, self.done = "max_turns", True
            parts.append(f"[turn limit of {lim.max_turns} reached; episode over]")
        return _clip("\n\n".join(parts))

    # --- tools ----------------------------------------------------------------------------------------
    # The repo holds what sandboxed code (pytest on the policy's code) left: every access goes through
    # evotrainer.sandbox.fs relative to an fd of the repo folder, following no link on any component,
    # reading regular files only (a FIFO cannot block, a link to a host file is never opened).
    @contextmanager
    def _repo_fd(self) -> Iterator[int]:
        fd = os.open(self.repo, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def _relpath(self, path: str) -> str:
        """``path`` as a normalised repo-relative path (``""`` = the root); ToolError if absolute, up, or holding a
        control character (NUL, newline, ESC...: no repo file has one, and NUL made ``os`` raise ``ValueError``)."""
        if has_controls(path):
            raise ToolError(f"path {path[:200]!r} holds a control character; give a plain path relative to the "
                            "repository root, such as pkg/mod.py")
        raw = path.strip() or "."
        if raw.startswith(("/", "~")):
            raise ToolError(f"path {path!r} is absolute; use a path relative to the repository root ./")
        try:
            return "/".join(sfs.split_relative(raw))
        except ValueError:
            raise ToolError(f"path {path!r} is outside the repository; use a path relative to ./") from None

    def _entry(self, fd: int, path: str) -> tuple[str, os.stat_result]:
        """(relpath, lstat) of an existing regular file or folder of the repo; ToolError for links, FIFOs..."""
        rel = self._relpath(path)
        try:
            st = sfs.lstat_beneath(fd, rel)
        except sfs.UnsafePathError:
            raise ToolError(f"path {path!r} goes through a symbolic link; the tools do not follow links "
                            "(one could point outside the repository)") from None
        except (FileNotFoundError, NotADirectoryError):
            raise ToolError(f"no such file or folder {path!r}; use search to find files") from None
        except OSError as exc:  # a name over 255 bytes (ENAMETOOLONG), a folder it cannot enter...
            raise ToolError(f"cannot open {path[:200]!r}: {exc.strerror}; use search to find files") from None
        if stat.S_ISLNK(st.st_mode):
            raise ToolError(f"{path!r} is a symbolic link; the tools do not follow links (it could point outside "
                            "the repository)")
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise ToolError(f"{path!r} is not a regular file or folder; the tools read regular files only")
        return rel, st

    def _read(self, fd: int, rel: str, path: str) -> str:
        try:
            return sfs.read_file(fd, rel).decode(errors="replace")
        except OSError as exc:
            raise ToolError(f"cannot read {path!r}: {exc.strerror}") from None

    def _tool_search(self, a: SearchArgs) -> str:
        # RE2: matching is linear in the line length whatever the pattern (Python's re took 4.7 s on one
        # 26-character line for "(x+x+)+y", doubling per character, with no way to stop it mid-call).
        try:
            rx, note = compile_re2(a.pattern), ""
        except PatternError:
            rx, note = compile_re2(re2.escape(a.pattern)), (" (not a regex RE2 accepts, e.g. a backreference: "
                                                                  "searched as plain text)")
        if rx.programsize > SEARCH_MAX_PROGRAM:
            raise ToolError(f"pattern {a.pattern[:80]!r} compiles to {rx.programsize} RE2 instructions, over "
                            f"{SEARCH_MAX_PROGRAM}: use fewer or smaller counted repeats ({{m,n}}) or plain text")
        size = max(1, rx.programsize)
        scan = SEARCH_SCAN_UNITS // size  # characters of each line read
        self.stats.searches.append(a.pattern)
        hits: list[str] = []  # the first SEARCH_MAX_HITS, as shown
        count = lines_read = units = 0
        cut = ""
        with self._repo_fd() as fd:
            base, st = self._entry(fd, a.path)
            if stat.S_ISREG(st.st_mode):
                files: Iterable[tuple[int, str, str]] = [(fd, base, base)]
                dfd = None
            else:
                dfd = sfs.open_beneath(fd, base, os.O_RDONLY | os.O_DIRECTORY)
                files = ((pfd, name, f"{base}/{rel}" if base else rel) for pfd, name, rel, est in
                         sfs.walk(dfd, prune=_no_pycache, onerror=lambda *_: None)
                         if stat.S_ISREG(est.st_mode) and not name.endswith(".pyc") and est.st_size <= SEARCH_MAX_BYTES)
            try:
                for pfd, name, rel in files:
                    if lines_read >= SEARCH_MAX_LINES or units >= SEARCH_CALL_UNITS:
                        cut = f"{rel} and the files after it"
                        break
                    lines_read += 1  # the file itself, even empty
                    try:
                        lines = sfs.read_file(pfd, name, SEARCH_MAX_BYTES).decode().splitlines()
                    except (UnicodeDecodeError, OSError):
                        continue
                    for n, line in enumerate(lines, 1):
                        cost = min(len(line), scan) * size
                        if lines_read >= SEARCH_MAX_LINES or units + cost > SEARCH_CALL_UNITS:
                            cut = f"{rel} from line {n} on" + (", and the files after it" if dfd is not None else "")
                            break
                        lines_read += 1
                        units += cost
                        if rx.search(line[:scan].encode()):  # bytes: the wrapper's offset decoding skipped, 2-3x
                            count += 1
                            if len(hits) < SEARCH_MAX_HITS:
                                hits.append(f"{rel}:{n}: {line.strip()[:160]}")
                    if cut:
                        break
            finally:
                if dfd is not None:
                    os.close(dfd)
        if cut:
            cut = (f"\n(search stopped at its budget of {SEARCH_MAX_LINES:,} lines or {SEARCH_CALL_UNITS:,} characters x "
                   f"pattern size; not searched: {cut}; "
                   f"{'give a path to search one folder or file' if dfd is not None else 'view reads the rest'})")
        if not count:
            return f"no match for {a.pattern!r}{note}" + (" in the part searched" + cut if cut else "")
        more = f"\n({count - SEARCH_MAX_HITS} more matches not shown)" if count > SEARCH_MAX_HITS else ""
        return f"{count} matches{note}{' in the part searched' if cut else ''}:\n" + "\n".join(hits) + more + cut

    def _tool_view(self, a: ViewArgs) -> str:
        with self._repo_fd() as fd:
            rel, st = self._entry(fd, a.path)
            if stat.S_ISDIR(st.st_mode):
                dfd = sfs.open_beneath(fd, rel, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    items = []
                    for name in sorted(os.listdir(dfd)):
                        if name == "__pycache__":
                            continue
                        mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
                        suffix = "/" if stat.S_ISDIR(mode) else " (link, not followed)" if stat.S_ISLNK(mode) else ""
                        items.append((f"{rel}/{name}" if rel else name) + suffix)
                finally:
                    os.close(dfd)
                return f"{rel or '.'} is a folder:\n" + "\n".join(items)
            lines = self._read(fd, rel, a.path).splitlines()
        end = min(len(lines), a.end or a.start + VIEW_MAX_LINES - 1, a.start + VIEW_MAX_LINES - 1)
        if a.start > len(lines):
            raise ToolError(f"start={a.start} is past the end of {a.path} ({len(lines)} lines)")
        if a.end is not None and a.end < a.start:
            raise ToolError(f"end={a.end} is before start={a.start}; give 1 <= start <= end")
        body = "\n".join(f"{n:5d} {lines[n - 1]}" for n in range(a.start, end + 1))
        return f"{rel} lines {a.start}-{end} of {len(lines)}:\n{body}"

    def _tool_edit(self, a: EditArgs) -> str:
        with self._repo_fd() as fd:
            rel, st = self._entry(fd, a.path)
            if not stat.S_ISREG(st.st_mode):
                raise ToolError(f"{a.path!r} is not a file")
            text = self._read(fd, rel, a.path)
            n = text.count(a.old)
            if n != 1:
                raise ToolError(f"old text occurs {n} times in {a.path}; " + (
                    "view the file and copy the exact text (spaces and indentation count)" if n == 0
                    else "include more surrounding lines so it is unique"))
            try:
                sfs.write_file(fd, rel, text.replace(a.old, a.new, 1).encode())
            except OSError as exc:
                raise ToolError(f"cannot write {a.path!r}: {exc.strerror}") from None
        self.stats.edits += 1
        self.stats.files_touched.add(rel)
        if is_test_file(rel, self.task.test_patterns):
            self.stats.test_file_edit_calls += 1
        return f"edited {rel} (replaced {a.old.count(chr(10)) + 1} line(s) with {a.new.count(chr(10)) + 1})"

    def _tool_run_tests(self, a: RunTestsArgs) -> str:
        targets = [a.tests] if isinstance(a.tests, str) else list(a.tests or self.task.test_files)
        with self._repo_fd() as fd:
            for t in targets:
                if has_controls(t):
                    raise ToolError(f"test {t[:200]!r} holds a control character; give test files or node ids "
                                    "(file.py::test_name) as plain text")
                if t.startswith("-"):
                    raise ToolError(f"test {t!r}: give test files or node ids (file.py::test_name), not options")
                self._entry(fd, t.split("::")[0])
        budget = min(self.limits.per_call_timeout_s, max(1.0, self.limits.per_episode_timeout_s - self.elapsed()))
        res = run_pytest(self.repo, targets, timeout_s=budget)
        self.stats.test_runs += 1
        counts: dict[str, int] = {}
        for o in res.outcomes.values():
            counts[o] = counts.get(o, 0) + 1
        summary = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items())) or "no test ran"
        if res.timed_out:
            summary += f"; stopped at the {budget:.0f} s time limit"
        if res.collection_error:
            summary += "; collection error"
        failed = [n for n, o in res.outcomes.items() if o in ("FAILED", "ERROR")]
        if not failed and not res.collection_error:
            return summary
        detail = res.output
        m = re.search(r"^=+ (FAILURES|ERRORS) =+$", detail, re.M)
        detail = detail[m.start():] if m else detail
        return f"{summary}\n{_clip(detail, 1800)}"

    def _tool_submit(self, a: SubmitArgs) -> str:
        self.stats.submitted = True
        self.stats.submit_without_test = self.stats.test_runs == 0
        self.stats.stop_reason, self.done = "submit", True
        return "submitted; the hidden tests will grade the repository"



    # --- grading ------------------------------------------------------------------------------------
    def _changed_tests(self) -> list[str]:
        """Test files changed, added (planted) or deleted since :meth:`reset`; links and FIFOs count."""
        now = test_file_digests(self.repo, self.task.test_patterns)
        return sorted(p for p in set(now) | set(self.test_digests) if now.get(p) != self.test_digests.get(p))

    def _grading_copy(self) -> Path:
        """A fresh copy of the repo with the original test files: built by the host, never through the repo.

        Non-test files are copied without following links (links stay links, FIFOs and devices are
        left out); no test file of the repo is copied; the originals from :meth:`reset` are written
        into the copy, replacing whatever entry (a link, a file) sits on their folder path there.
        """
        copy = self.workdir / f"grade-{uuid.uuid4().hex[:12]}"
        pats = self.task.test_patterns
        sfs.copy_tree(self.repo, copy, skip=lambda rel, st: _no_pycache(rel, st) or (
            not stat.S_ISDIR(st.st_mode) and is_test_file(rel, pats)))
        cfd = os.open(copy, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for rel, data in sorted(self.test_originals.items()):
                parts = rel.split("/")
                for i in range(1, len(parts)):  # make each folder on the way a real folder of the copy
                    sub = "/".join(parts[:i])
                    try:
                        st = sfs.lstat_beneath(cfd, sub)
                        if not stat.S_ISDIR(st.st_mode):
                            pfd = sfs.open_beneath(cfd, "/".join(parts[:i - 1]), os.O_RDONLY | os.O_DIRECTORY)
                            try:
                                os.unlink(parts[i - 1], dir_fd=pfd)
                            finally:
                                os.close(pfd)
                    except FileNotFoundError:
                        pass
                    sfs.makedirs_beneath(cfd, sub)
                sfs.write_file(cfd, rel, data, create=True)
        finally:
            os.close(cfd)
        return copy

    def grade(self, mode: str = "all", skip_unchanged: bool = False) -> SweOutcome:
        """Run the hidden tests on the final repo state (in the sandbox) and score the episode.

        Test files are compared with their state at :meth:`reset` (changed, added or deleted files
        matching the task's test patterns; a link or FIFO in their place counts as changed); then a
        fresh copy of the repo is made with the original test files (:meth:`_grading_copy`: nothing
        is written into the repo, whose links the sandbox may have planted), ``test_patch`` is
        applied there for SWE-bench tasks (as SWE-bench does), and the test files holding
        FAIL_TO_PASS / PASS_TO_PASS run on the copy, which is removed afterwards. A hidden test missing from the output, a collection
        error, or any test-file edit counts as failure, never as a pass; so does a ``test_patch``
        that does not apply (no test runs; ``test_patch_error`` says why: :func:`apply_test_patch`).

        Args:
            mode: ``all`` (1 only when every hidden test passes) or ``fraction`` (the fraction of
                FAIL_TO_PASS that pass, when every PASS_TO_PASS passes; else 0).
            skip_unchanged: when no file of the repo changed since :meth:`reset`, return the task's
                base verdict without running tests (every FAIL_TO_PASS fails there by construction:
                the generator / SWE-bench measured it); ``ran_tests`` is then False. Saves a test run
                per idle episode in training.

        Raises:
            ValueError: unknown ``mode``.
        """
        if mode not in ("all", "fraction"):
            raise ValueError(f"reward.swe_tests.params.mode={mode!r}: allowed: all, fraction")
        if skip_unchanged and not self.task.test_patch and repo_digest(self.repo) == self.base_digest:
            n_f, n_p = len(self.task.FAIL_TO_PASS), len(self.task.PASS_TO_PASS)
            return SweOutcome(resolved=False, swe_tests=0.0, f2p_passed=0, f2p_total=n_f, p2p_passed=n_p,
                              p2p_total=n_p, missing_tests=0, collection_error=False, timed_out=False,
                              test_files_edited=[], ran_tests=False)
        self.tests_edited |= set(self._changed_tests())
        edited = sorted(self.tests_edited)
        copy = self._grading_copy()
        try:
            patch_error = apply_test_patch(copy, self.task.test_patch, self.task.instance_id)
            if patch_error:  # the hidden tests are not in the copy: no verdict can be read from it
                n_f, n_p = len(self.task.FAIL_TO_PASS), len(self.task.PASS_TO_PASS)
                return SweOutcome(resolved=False, swe_tests=0.0, f2p_passed=0, f2p_total=n_f, p2p_passed=0,
                                  p2p_total=n_p, missing_tests=n_f + n_p, collection_error=False, timed_out=False,
                                  test_files_edited=edited, ran_tests=False, test_patch_error=patch_error)
            res = run_pytest(copy, self.task.test_files, timeout_s=max(60.0, self.limits.per_call_timeout_s * 3))
        finally:
            sfs.remove_tree(copy)  # the repo itself is untouched: grading twice gives the same verdict
        f2p = [t for t in self.task.FAIL_TO_PASS if res.outcomes.get(t) == "PASSED"]
        p2p = [t for t in self.task.PASS_TO_PASS if res.outcomes.get(t) == "PASSED"]
        missing = [t for t in self.task.FAIL_TO_PASS + self.task.PASS_TO_PASS if t not in res.outcomes]
        valid = not edited and not res.collection_error and not res.timed_out
        resolved = valid and len(f2p) == len(self.task.FAIL_TO_PASS) and len(p2p) == len(self.task.PASS_TO_PASS)
        if mode == "all":
            score = 1.0 if resolved else 0.0
        else:
            ok = valid and len(p2p) == len(self.task.PASS_TO_PASS)
            score = len(f2p) / len(self.task.FAIL_TO_PASS) if ok else 0.0
        return SweOutcome(resolved=resolved, swe_tests=score, f2p_passed=len(f2p), f2p_total=len(self.task.FAIL_TO_PASS),
                          p2p_passed=len(p2p), p2p_total=len(self.task.PASS_TO_PASS), missing_tests=len(missing),
                          collection_error=res.collection_error, timed_out=res.timed_out, test_files_edited=edited,
                          backend=res.backend, grade_seconds=round(res.wall_s, 3))


def git_env(top: Path) -> dict[str, str]:
    """The environment for a host-side git command on the folder ``top``: git sees no repository but ``top``'s own.

    Without it, a grading copy inside another checkout (a run folder in a git repo), the caller's ``GIT_*``
    variables (a hook's ``GIT_DIR``) and the caller's ~/.gitconfig or the system's (``apply.whitespace=error``)
    decided how the test patch applied, or whether it applied at all.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CEILING_DIRECTORIES=str(top.parent), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
               GIT_ATTR_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0")
    return env


def apply_test_patch(copy: Path, patch: str, task_id: str) -> str:
    """Apply a SWE-bench task's ``test_patch`` to the grading copy; ``""`` when it applied (or there is none),
    else why not (git's own words, for :attr:`SweOutcome.test_patch_error`).

    Its exit status was not looked at: a patch that did not apply left the repo's original tests to grade the
    episode (an existing test the patch strengthens passes unfixed code), and nothing said so. git runs isolated
    from any repository and configuration around the copy (:func:`git_env`).
    """
    if not patch:
        return ""
    try:
        cp = subprocess.run(["git", "apply", "--verbose", "-"], input=patch.encode(), cwd=copy, env=git_env(copy),
                            capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{task_id}: git apply of the test patch did not run ({exc})"
    if cp.returncode:
        why = cp.stderr.decode(errors="replace").strip()[-500:]
        return f"{task_id}: the test patch does not apply to the final repo (git apply exit {cp.returncode}): {why}"
    return ""


@dataclass
class SweOutcome:
    """Hidden-test verdict of one episode (see :meth:`SweEnv.grade`)."""

    resolved: bool
    swe_tests: float
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    missing_tests: int
    collection_error: bool
    timed_out: bool
    test_files_edited: list[str]
    backend: str = ""
    grade_seconds: float = 0.0
    ran_tests: bool = True
    test_patch_error: str = ""  # why the SWE-bench test patch did not apply (the episode then scores 0)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
