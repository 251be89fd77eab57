"""Cached read-only tools (``servers.common.cached_read``: get_version, list_analyzers) answer repeated calls from
the cache on the event loop, and see every write: through the server, through a second handle in this process, by
another process, to the analyzer registry; nothing is cached while a job it reports is running.

The lineage's state token (``LineageStore.state_token``) changes on every commit, by this handle (counted) or any
other connection (SQLite's ``data_version``), and is None without waiting when another thread holds the handle.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time

import anyio.to_thread
from mcp_testlib import SyncClient, make_run

from evotrainer.harness import analyzers as reg
from evotrainer.intervention import Intervention
from evotrainer.lineage import LineageStore
from evotrainer.servers.analysis import KV_KEY
from evotrainer.servers.app import build_server
from evotrainer.servers.common import MISS, ServerState
from evotrainer.workspace import Workspace


def _served(tmp_path):
    run = make_run(tmp_path)
    server = build_server("all", run)
    return run, server, SyncClient(server)


def test_state_token_moves_on_every_commit_and_only_then(tmp_path):
    run = make_run(tmp_path)
    a, b = LineageStore(run / "lineage.db"), LineageStore(run / "lineage.db")
    try:
        t0 = a.state_token()
        assert a.state_token() == t0 and a.state_token(blocking=False) == t0  # no write: stable
        a.update_version("v1", note="own commit")
        t1 = a.state_token()
        assert t1 != t0  # this handle's own commit
        b.update_version("v1", note="other connection")
        t2 = a.state_token()
        assert t2 != t1 and t2[2] == t1[2]  # another connection: data_version moved, own commits did not
        held, release = threading.Event(), threading.Event()

        def hold():
            with a._token_lock:
                held.set()
                release.wait(10)

        th = threading.Thread(target=hold)
        th.start()
        held.wait(10)
        t = time.perf_counter()
        assert a.state_token(blocking=False) is None  # the event loop does not wait for another thread
        assert time.perf_counter() - t < 2.0  # before: the 10 s hold
        release.set()
        th.join()
        assert a.state_token(blocking=False) == t2
    finally:
        a.close()
        b.close()


def test_a_reopened_store_never_repeats_a_token(tmp_path):
    # a closed store's object id can be reused by the next one; its cached entries must not match the new one's
    run = make_run(tmp_path)
    seen = set()
    for _ in range(20):
        s = LineageStore(run / "lineage.db")
        t = s.state_token()
        s.close()
        del s
        assert t not in seen
        seen.add(t)


def test_closing_the_server_state_forgets_cached_results(tmp_path):
    state = ServerState(make_run(tmp_path))
    first = state.workspace().lineage
    key = ("get_version", (first.state_token(), "v1"))
    state.results.put(key, "cached")
    state.close()
    assert state.results.get(key) is MISS  # nothing survives a close
    assert first.state_token() is None  # a closed store has no token (and opens no connection for one)
    assert state.workspace().lineage.state_token()[0] != key[1][0][0]  # a new store, a new serial
    state.close()


def test_state_token_does_not_wait_for_another_connections_lock(tmp_path):
    run = make_run(tmp_path)
    other = sqlite3.connect(run / "lineage.db", isolation_level=None)
    other.execute("PRAGMA locking_mode=EXCLUSIVE")  # readers must wait for it (SQLITE_BUSY)
    other.execute("BEGIN EXCLUSIVE")
    other.execute("UPDATE versions SET note='locked' WHERE id='v1'")
    store = LineageStore(run / "lineage.db", readonly=True)
    try:
        t = time.perf_counter()
        assert store.state_token(blocking=False) is None  # the event loop's lookup: no 30 s busy wait
        assert time.perf_counter() - t < 5.0  # before: SQLite's 30 s busy wait
        other.execute("COMMIT")
        other.close()
        assert store.state_token(blocking=False) is not None and store.state_token() is not None
        assert store._db.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000  # the store's own reads still wait
    finally:
        store.close()


def test_repeated_reads_are_answered_from_the_cache_without_a_thread(tmp_path, monkeypatch):
    run, server, c = _served(tmp_path)
    gets: list[str] = []
    orig_get = LineageStore.get
    monkeypatch.setattr(LineageStore, "get", lambda self, vid: gets.append(vid) or orig_get(self, vid))
    hops: list[int] = []
    orig_hop = anyio.to_thread.run_sync

    async def counting_hop(*a, **k):
        hops.append(1)
        return await orig_hop(*a, **k)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counting_hop)
    try:
        first = c.ok("get_version", {"version_id": "v1"})
        c.ok("list_analyzers")
        n_gets, n_hops = len(gets), len(hops)
        assert n_gets >= 1 and n_hops >= 2  # the first calls read the run in a worker thread
        for _ in range(5):
            assert c.ok("get_version", {"version_id": "v1"}) == first
            c.ok("list_analyzers")
        assert len(gets) == n_gets and len(hops) == n_hops  # 10 calls: no lineage read, no thread
        assert c.ok("get_version", {"version_id": "v0"})["id"] == "v0"  # another argument: its own entry
        assert len(gets) > n_gets
    finally:
        c.close()


def test_writes_through_the_server_are_seen(tmp_path):
    run, server, c = _served(tmp_path)
    try:
        assert c.ok("get_version", {"version_id": "v1"})["status"] != "pruned"
        c.ok("decide", {"version_id": "v1", "action": "prune", "rationale": "no gain (test)"})
        after = c.ok("get_version", {"version_id": "v1"})
        assert after["status"] == "pruned" and [d["action"] for d in after["decisions"]] == ["prune"]
        child = c.ok("propose_intervention", {"parent_id": "v1", "path": "temperature", "new_value": 0.7})
        assert c.ok("get_version", {"version_id": "v1"})["children"] == [child["id"]]
    finally:
        c.close()


def test_a_second_handle_in_this_process_writes_and_the_next_call_sees_it(tmp_path):
    run, server, c = _served(tmp_path)
    try:
        assert c.ok("get_version", {"version_id": "v1"})["note"] == ""
        c.ok("get_version", {"version_id": "v1"})  # cached now
        with Workspace.open(run, writer=True) as ws:
            ws.lineage.update_version("v1", note="written by a second Workspace")
        assert c.ok("get_version", {"version_id": "v1"})["note"] == "written by a second Workspace"
    finally:
        c.close()


WRITER = """
import sys
from evotrainer.workspace import Workspace
from evotrainer.intervention import Intervention
with Workspace.open(sys.argv[1], writer=True) as ws:
    ws.lineage.update_version("v1", note="written by another process")
    ws.lineage.branch("v1", Intervention(path="temperature", old=1.0, new=0.9, category="rollout"))
    ws.lineage.kv_set(sys.argv[2], {"other_proc_analyzer": {
        "code": "print('[]')", "kinds": ["x"], "description": "stored by another process"}})
"""


def test_another_process_writes_and_the_next_calls_see_it(tmp_path):
    run, server, c = _served(tmp_path)
    snap = reg.registry_snapshot()
    try:
        before = c.ok("get_version", {"version_id": "v1"})
        names = [a["name"] for a in c.ok("list_analyzers")["analyzers"]]
        assert c.ok("get_version", {"version_id": "v1"}) == before and "other_proc_analyzer" not in names
        subprocess.run([sys.executable, "-c", WRITER, str(run), KV_KEY], check=True, timeout=120)
        after = c.ok("get_version", {"version_id": "v1"})
        assert after["note"] == "written by another process" and after["children"] == ["v2"]
        listed = {a["name"]: a for a in c.ok("list_analyzers")["analyzers"]}
        assert listed["other_proc_analyzer"]["description"] == "stored by another process"
        assert listed["other_proc_analyzer"]["sandboxed"] is True
    finally:
        c.close()
        reg.restore_registry(snap)


def test_registry_changes_in_this_process_are_seen(tmp_path):
    run, server, c = _served(tmp_path)
    snap = reg.registry_snapshot()
    try:
        g0 = reg.registry_generation()
        c.ok("register_analyzer", {"name": "mine", "code": "print('[]')", "kinds": ["k"], "description": "one"})
        assert reg.registry_generation() != g0
        listed = {a["name"]: a for a in c.ok("list_analyzers")["analyzers"]}
        assert listed["mine"]["description"] == "one"
        c.ok("list_analyzers")
        # the process registry changes without a write to the run: the spec the listing shows changes with it
        reg.register_analyzer("mine", "print('[]')", kinds=["k"], description="two", replace=True)
        listed = {a["name"]: a for a in c.ok("list_analyzers")["analyzers"]}
        assert listed["mine"]["description"] == "two"
        g1 = reg.registry_generation()
        reg.restore_registry(snap)
        assert reg.registry_generation() != g1
    finally:
        c.close()
        reg.restore_registry(snap)


def test_a_running_job_is_never_served_from_the_cache(tmp_path):
    run, server, c = _served(tmp_path)
    try:
        with Workspace.open(run, writer=True) as ws:
            ws.lineage.create_job("train-v1-test", "v1", "train", steps_total=4)  # running, this (live) pid
        a = c.ok("get_version", {"version_id": "v1"})
        time.sleep(0.02)
        b = c.ok("get_version", {"version_id": "v1"})
        assert a["jobs"][0]["status"] == b["jobs"][0]["status"] == "running"
        assert b["jobs"][0]["elapsed_s"] > a["jobs"][0]["elapsed_s"]  # computed anew: its clock moves
        with Workspace.open(run, writer=True) as ws:
            ws.lineage.update_job("train-v1-test", status="done", progress=1.0)
        done = c.ok("get_version", {"version_id": "v1"})
        assert done["jobs"][0]["status"] == "done"
        time.sleep(0.02)
        assert c.ok("get_version", {"version_id": "v1"}) == done  # finished: cached, and the same
    finally:
        c.close()


def test_errors_are_not_cached(tmp_path):
    run, server, c = _served(tmp_path)
    try:
        assert "not found" in c.err("get_version", {"version_id": "v9"})
        with Workspace.open(run, writer=True) as ws:
            for i in range(8):
                last = ws.lineage.branch("v1", Intervention(path="temperature", old=1.0, new=0.5 + i / 100,
                                                            category="rollout"))
        assert last.id == "v9"
        assert c.ok("get_version", {"version_id": "v9"})["id"] == "v9"
    finally:
        c.close()
