"""Helpers of the MCP server tests: a hand-sized run folder and a synchronous in-process client.

The run (``make_run``) has two versions and values small enough to check by hand:

- ``v0`` (root) and ``v1`` (child: ``eps_clip_high`` 0.28 -> 0.3);
- train rollouts of v0, 2 prompts x 2 samples per step:
  step 0: g0 (p1, answer 2) rewards [1, 0]; g1 (p2, answer 4) rewards [0, 0] (both truncated, 'length');
  step 1: g0 rewards [1, 1]; g1 rewards [1, 0];
- eval rollouts (step 0) on the same prompts: v0 p1 [1, 0], p2 [0, 0]; v1 p1 [1, 1], p2 [1, 0];
- metric ``reward/mean`` of v0 at steps 0..3: 0.25, 0.5, 0.5, 0.75;
- three log records: v0 info, v0 warning, v1 error.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio


def make_run(root: Path) -> Path:
    """Create the hand-sized run described in the module docstring; returns its folder."""
    from evotrainer.intervention import Intervention
    from evotrainer.recipe import Recipe
    from evotrainer.rollouts import make_record
    from evotrainer.workspace import Workspace

    run = root / "run"
    with Workspace(run, writer=True) as ws:
        ws.lineage.create_root(Recipe(model={"name_or_path": "tiny-random"}))
        ws.lineage.branch("v0", Intervention(path="eps_clip_high", old=0.28, new=0.3, category="optimizer",
                                             hypothesis="Clip-Higher keeps exploration"))
        recs = []
        train = {0: {"g0": ("p1", "What is 1+1?", "2", [("2", 1.0), ("3", 0.0)]),
                     "g1": ("p2", "What is 2+2?", "4", [("5", 0.0), ("6", 0.0)])},
                 1: {"g0": ("p1", "What is 1+1?", "2", [("2", 1.0), ("2", 1.0)]),
                     "g1": ("p2", "What is 2+2?", "4", [("4", 1.0), ("5", 0.0)])}}
        for step, groups in train.items():
            for gid, (pid, prompt, ans, samples) in groups.items():
                for i, (comp, r) in enumerate(samples):
                    recs.append(make_record(version_id="v0", step=step, prompt_id=pid, group_id=gid, sample_idx=i,
                                            prompt=prompt, completion=comp, reward=r, answer=ans, correct=r,
                                            components={"correctness": r}, length=3 + i,
                                            finish_reason="length" if (step, gid) == (0, "g1") else "eos"))
        evals = {"v0": {"p1": [("2", 1.0), ("3", 0.0)], "p2": [("5", 0.0), ("5", 0.0)]},
                 "v1": {"p1": [("2", 1.0), ("2", 1.0)], "p2": [("4", 1.0), ("5", 0.0)]}}
        prompts = {"p1": ("What is 1+1?", "2"), "p2": ("What is 2+2?", "4")}
        for vid, per in evals.items():
            for pid, samples in per.items():
                for i, (comp, r) in enumerate(samples):
                    recs.append(make_record(version_id=vid, step=0, prompt_id=pid, group_id=pid, sample_idx=i,
                                            prompt=prompts[pid][0], completion=comp, reward=r, answer=prompts[pid][1],
                                            correct=r, split="eval"))
        ws.rollouts.add(recs)
        for step, value in enumerate([0.25, 0.5, 0.5, 0.75]):
            ws.lineage.log_metrics("v0", step, {"reward/mean": value})
        ws.log("training started", version="v0", source="train")
        ws.log("reward spike at step 3", level="warning", version="v0", source="train")
        ws.log("NaN loss at step 2", level="error", version="v1", source="train")
    return run


class SyncClient:
    """Blocking facade over an in-process ``mcp.Client`` session (one event loop in a helper thread)."""

    def __init__(self, server: Any, **client_kwargs: Any):
        import threading

        from anyio.from_thread import start_blocking_portal
        from mcp import Client

        self.server = server
        self._cm = start_blocking_portal()
        self.portal = self._cm.__enter__()
        ready = threading.Event()
        self._stop: Any = None
        self.error: BaseException | None = None

        async def hold() -> None:  # one task owns the session's context (anyio cancel scopes are per task)
            self._stop = anyio.Event()
            try:
                async with Client(server, **client_kwargs) as c:
                    self.client = c
                    ready.set()
                    await self._stop.wait()
            except BaseException as exc:
                self.error = exc
                ready.set()
                raise

        self._task = self.portal.start_task_soon(hold)
        ready.wait(120)
        if self.error is not None:
            raise self.error

    def call(self, name: str, args: dict[str, Any] | None = None, progress: Any = None) -> Any:
        """The raw ``CallToolResult``."""
        return self.portal.call(lambda: self.client.call_tool(name, args or {}, progress_callback=progress))

    def ok(self, name: str, args: dict[str, Any] | None = None, progress: Any = None) -> dict[str, Any]:
        """The structured result of a call that must succeed."""
        r = self.call(name, args, progress)
        assert not r.is_error, f"{name}({args}) failed: {r.content[0].text if r.content else r}"
        return r.structured_content

    def err(self, name: str, args: dict[str, Any] | None = None) -> str:
        """The error text of a call that must fail as a tool error (isError)."""
        r = self.call(name, args)
        assert r.is_error, f"{name}({args}) should have failed, got {r.structured_content}"
        return r.content[0].text

    def tools(self) -> list[Any]:
        return self.portal.call(self.client.list_tools).tools

    def read(self, uri: str) -> Any:
        res = self.portal.call(lambda: self.client.read_resource(uri))
        return json.loads(res.contents[0].text)

    def prompt(self, name: str, args: dict[str, str]) -> str:
        res = self.portal.call(lambda: self.client.get_prompt(name, args))
        return res.messages[0].content.text

    def close(self) -> None:
        self.portal.call(self._stop.set)
        self._task.result(60)
        self._cm.__exit__(None, None, None)


def run_async(fn: Any) -> Any:
    """``anyio.run`` shorthand."""
    return anyio.run(fn)


def result_mutants(value: Any, bad_values: tuple[Any, ...], nested_rows: bool = False) -> list[Any]:
    """``value`` and broken or edge copies of it, for output-schema checks: each top-level field set to each of
    ``bad_values``, each field dropped, one unknown field added; with ``nested_rows`` also each field of a
    list-of-dicts field's first row set to None."""
    out = [value]
    if isinstance(value, dict):
        for k in value:
            for bad in bad_values:
                v = copy.deepcopy(value)
                v[k] = bad
                out.append(v)
            v = copy.deepcopy(value)
            del v[k]
            out.append(v)
            if nested_rows and isinstance(value[k], list) and value[k] and isinstance(value[k][0], dict):
                for kk in value[k][0]:
                    v = copy.deepcopy(value)
                    v[k][0][kk] = None
                    out.append(v)
        out.append({**value, "unknown_field": 1})
    return out


class FullOnCommit:
    """A lineage connection whose COMMIT fails as on a full disk: SQLite writes a transaction's pages to the WAL only
    at COMMIT, so a 190 KB kv value on a 600 KiB tmpfs with 64 KiB free failed there (review 12, F-R12: 'database or
    disk is full'). Everything else goes to the wrapped connection ``db``."""

    def __init__(self, db: Any):
        self.db = db

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)
