"""`evotrainer watch` (harness/watch.py) on a verl log that grows line by line.

The source is the head of a shipped verl log (tests/data/verl_logs, Qwen2.5-0.5B, ``step:N - key:value``
lines for steps 0, 1, ...); its step-20 line gets ``actor/pg_loss:nan`` (our ``loss/policy``). The
nan_blowup analyzer calls a non-finite value on the last step blocking (it persists to the end), so
the watcher must raise it in the poll right after that line is appended, and not before.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import anyio
import pytest
from mcp import Client

from evotrainer import metrics as M
from evotrainer.harness.importer import RunImportError
from evotrainer.harness.watch import Watcher
from evotrainer.recipe import Recipe
from evotrainer.servers.app import build_server
from evotrainer.workspace import Workspace

VERL = Path(__file__).parent / "data" / "verl_logs" / "Qwen2.5-0.5B-bsz256_2-prompt512-resp256-0.538.log.gz"
NAN_STEP = 20


def _lines(n_steps: int = NAN_STEP + 1) -> list[str]:
    """The log's first line (no step) and the lines of steps 0..n_steps-1; step NAN_STEP's pg_loss is nan."""
    lines = gzip.decompress(VERL.read_bytes()).decode().splitlines()[: n_steps + 1]
    for i, line in enumerate(lines):
        if f"step:{NAN_STEP} " in line:
            lines[i] = re.sub(r"actor/pg_loss:[-0-9.]+", "actor/pg_loss:nan", line)
    assert sum("pg_loss:nan" in x for x in lines) == (n_steps > NAN_STEP)
    return lines


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_nan_step_is_raised_within_one_poll(tmp_path):
    log, run = tmp_path / "train.log", tmp_path / "run"
    log.write_text("")
    w = Watcher(log, run)
    assert not w.poll().new  # empty: nothing to read yet, not an error
    raised_at = None
    for line in _lines():
        _append(log, line + "\n")
        r = w.poll()
        assert r.changed
        nan = [f for f in r.new if f.kind == "nan_blowup"]
        if nan:
            raised_at = r.last_step
            assert nan[0].severity == "blocking" and nan[0].steps == [NAN_STEP, NAN_STEP]
        assert not [f for f in r.new if f.severity == "blocking" and f.kind != "nan_blowup"]
    assert raised_at == NAN_STEP  # the poll after the step-20 line, not one later, not before
    assert not w.poll().changed  # nothing appended: nothing re-read
    with Workspace(run) as ws:  # the imported run is current
        assert ws.lineage.last_step("v0") == NAN_STEP
        v0 = ws.lineage.get("v0")
        assert "nan_blowup" in {f["kind"] for f in v0.findings}
        assert [r["message"] for r in ws.read_logs() if r.get("source") == "watch"][-1].startswith(
            "finding nan_blowup [blocking]")


def test_half_written_line_is_completed_in_the_run(tmp_path):
    log, run = tmp_path / "train.log", tmp_path / "run"
    lines = _lines(6)  # header + steps 0..5
    log.write_text("\n".join(lines[:-1]) + "\n")
    w = Watcher(log, run)
    w.poll()
    last = lines[-1]
    cut = last.index(" - actor/pg_loss")  # step 5 read with only the keys before actor/pg_loss
    _append(log, last[:cut])
    w.poll()
    _append(log, last[cut:] + "\n")
    w.poll()
    pg = float(re.search(r"actor/pg_loss:([-0-9.]+)", last).group(1))
    with Workspace(run) as ws:
        assert ws.lineage.last_step("v0") == 5
        assert dict(ws.lineage.metric_series("v0", M.LOSS_POLICY))[5] == pytest.approx(pg)


def test_append_reaches_a_subscribed_mcp_client(tmp_path):
    from mcp_types import ResourceUpdatedNotification

    from evotrainer.servers import protocol

    log, run = tmp_path / "train.log", tmp_path / "run"
    lines = _lines()
    log.write_text("\n".join(lines[:NAN_STEP + 1]) + "\n")  # header + steps 0..19
    w = Watcher(log, run)
    w.poll()
    server = build_server("all", run)
    updates: list[str] = []

    async def on_message(msg):
        if isinstance(msg, ResourceUpdatedNotification):
            updates.append(str(msg.params.uri))

    async def main():
        async with Client(server, mode="legacy", message_handler=on_message) as c:
            await c.subscribe_resource("lineage://version/v0")
            before = (await c.call_tool("get_version", {"version_id": "v0"})).structured_content
            _append(log, lines[NAN_STEP + 1] + "\n")  # the NaN step
            await anyio.to_thread.run_sync(w.poll)
            with anyio.fail_after(protocol.POLL_S * 15):  # a poll every POLL_S; 15 of them for a loaded machine
                while not updates:
                    await anyio.sleep(0.1)
            after = (await c.call_tool("get_version", {"version_id": "v0"})).structured_content
            return before, after

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before, after = anyio.run(main)
    assert updates == ["lineage://version/v0"]
    kinds = lambda v: {f["kind"] for f in v["findings"]}  # noqa: E731
    assert "nan_blowup" not in kinds(before) and "nan_blowup" in kinds(after)


def test_watch_cli_exits_2_on_the_blocking_step(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    lines = _lines()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "400"}
    p = subprocess.Popen([sys.executable, "-m", "evotrainer.cli", "watch", str(log), "--fail-on", "blocking",
                          "--interval", "0.2", "--idle-exit", "60"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)

    def writer():
        for line in lines:
            if p.poll() is not None:
                return
            _append(log, line + "\n")
            time.sleep(0.3)

    t = threading.Thread(target=writer)
    t.start()
    out, err = p.communicate(timeout=120)
    t.join()
    assert p.returncode == 2, err
    hit = [x for x in out.splitlines() if "nan_blowup" in x]
    assert len(hit) == 1 and hit[0].startswith(f"[step {NAN_STEP}] blocking nan_blowup (train steps 20..20)"), out


def test_watch_refuses_a_workspace_with_run_and_a_bad_interval(tmp_path):
    with Workspace(tmp_path / "ws", writer=True) as ws:
        ws.lineage.create_root(Recipe())
    with pytest.raises(RunImportError, match="is an EvoTrainer run folder: watch it without --run"):
        Watcher(tmp_path / "ws", tmp_path / "other")
    with pytest.raises(FileNotFoundError, match="no such file or folder to watch"):
        Watcher(tmp_path / "missing.log")
    r = subprocess.run([sys.executable, "-m", "evotrainer.cli", "watch", str(tmp_path / "ws"), "--interval", "0"],
                       capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "--interval 0.0: poll at least every few seconds" in r.stderr
