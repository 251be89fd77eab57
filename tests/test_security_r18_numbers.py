"""Review 18 (I-R18, M-R18): a JSON integer of thousands of digits.

Python refuses to convert an integer string of more than 4,300 digits with "ValueError: Exceeds the limit (4300
digits) for integer string conversion ... use sys.set_int_max_str_digits() to increase the limit". That raw advice
refused a whole metrics file or ``trainer_state.json`` in ``diagnose`` (no line named), answered an MCP message
-32700 with id null even where its id (77) was readable (the client waited for good), and was echoed by
``compare --baseline``. Every reader now parses integers through :func:`evotrainer.jsonl.bounded_int`
(:data:`~evotrainer.jsonl.MAX_JSON_INT_DIGITS`, 64): the error names the line or the field and the digits.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys

import pytest
from mcp_testlib import make_run

from evotrainer.agents.compare import CompareError, _comparable, load_baseline
from evotrainer.config import RunConfig
from evotrainer.harness.ingest import IngestError, ingest
from evotrainer.jsonl import MAX_JSON_INT_DIGITS, NumberTooLong, bounded_int, iter_jsonl
from evotrainer.servers.envelope import check_envelope

BIG = "9" * 5000  # past Python's own 4,300-digit limit
RAW_ADVICE = "set_int_max_str_digits"
TOO_LONG = (f"a number of 5,000 digits, past the {MAX_JSON_INT_DIGITS} a JSON integer may have here (no metric, step, "
            "count or id needs more); write it as a string, or fix the writer that made it")


def _metrics_lines(n: int) -> list[str]:
    return [json.dumps({"step": s, "loss": 1.0 / (s + 1), "reward": s / 10}) for s in range(n)]


def test_bounded_int_accepts_up_to_the_bound_and_counts_the_digits_past_it():
    assert bounded_int("-" + "9" * MAX_JSON_INT_DIGITS) == -int("9" * MAX_JSON_INT_DIGITS)
    with pytest.raises(NumberTooLong) as err:
        bounded_int("-" + "1" * (MAX_JSON_INT_DIGITS + 1))
    assert err.value.digits == MAX_JSON_INT_DIGITS + 1 and "1" * 10 not in str(err.value)


def test_a_jsonl_metrics_line_with_a_5000_digit_number_is_named_by_its_line(tmp_path):
    run = tmp_path / "big1"
    run.mkdir()
    lines = _metrics_lines(50)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    steps, values = ingest(run).metrics["big1"]["loss/total"]  # the file without the number reads
    assert steps.tolist() == list(range(50)) and values[:2].tolist() == [1.0, 0.5]
    (run / "metrics.jsonl").write_text("\n".join(lines[:6] + ['{"step": 6, "loss": ' + BIG + "}"] + lines[7:]) + "\n")
    with pytest.raises(IngestError) as err:
        ingest(run)
    assert str(err.value) == f"{run / 'metrics.jsonl'}:7: {TOO_LONG}"
    assert RAW_ADVICE not in str(err.value)


def test_a_task_file_line_with_a_5000_digit_number_is_named_by_its_line():
    lines = ['{"q": 1}', "", '{"q": ' + BIG + "}"]
    with pytest.raises(KeyError) as err:  # each caller's own error class, the caller's hint appended
        list(iter_jsonl(lines, "tasks.jsonl", KeyError, "; one task object per line"))
    assert err.value.args[0] == f"tasks.jsonl:3: {TOO_LONG}; one task object per line"


def test_a_trainer_state_log_history_with_a_5000_digit_number_names_its_entry_and_line(tmp_path):
    run = tmp_path / "ts1"
    run.mkdir()
    entries = [{"step": s, "loss": 1.0} for s in range(30)]
    text = json.dumps({"best_metric": None, "log_history": entries}, indent=1)
    (run / "trainer_state.json").write_text(text)
    steps, values = ingest(run).metrics["ts1"]["loss/total"]
    assert steps.tolist() == list(range(30)) and set(values.tolist()) == {1.0}
    bad = text.replace('"step": 19,', f'"step": 19, "flos": {BIG},')
    (run / "trainer_state.json").write_text(bad)
    line = bad[:bad.index(BIG)].count("\n") + 1
    with pytest.raises(IngestError) as err:
        ingest(run)
    assert str(err.value) == f"{run / 'trainer_state.json'}:{line}: log_history entry 19: {TOO_LONG}"
    assert line > 1 and RAW_ADVICE not in str(err.value)


def test_a_wandb_history_json_with_a_5000_digit_number_names_its_line(tmp_path):
    f = tmp_path / "history.json"
    f.write_text('[{"_step": 0, "loss": 1.0},\n{"_step": 1, "loss": ' + BIG + "}]")
    with pytest.raises(IngestError) as err:
        ingest(f)
    assert str(err.value) == f"{f}:2: {TOO_LONG}"


@pytest.mark.parametrize("raw, reply", [
    ('{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"list_versions","arguments":{"limit":'
     + BIG + "}}}",
     {"jsonrpc": "2.0", "id": 77, "error": {"code": -32602, "message": "Invalid params: 'params.arguments.limit' is "
      "an integer of 5,000 digits, past the 64 a message may hold (no id, count or limit needs more); send a smaller "
      "number, or a string"}}),
    ('{"jsonrpc":"2.0","id":"r80","method":"ping","params":{"_meta":{"x":[1, -1' + "0" * 4400 + "]}}}",
     {"jsonrpc": "2.0", "id": "r80", "error": {"code": -32602, "message": "Invalid params: 'params._meta.x[1]' is an "
      "integer of 4,401 digits, past the 64 a message may hold (no id, count or limit needs more); send a smaller "
      "number, or a string"}}),
    ('{"jsonrpc":"2.0","id":' + BIG + ',"method":"ping"}',  # the id itself: not echoed, so null
     {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid Request: 'id' is an integer of "
      "5,000 digits, past the 64 a message may hold (no id, count or limit needs more); send a smaller number, or a "
      "string"}}),
    ('{"jsonrpc":"2.0","id":5,"method":"ping","params":{"x":' + BIG + " oops",  # not JSON after it either
     {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error: Expecting ',' delimiter: line "
      "1 column 5056 (char 5055)"}}),
])
def test_an_envelope_with_a_5000_digit_integer_names_the_field_and_keeps_the_id(raw, reply):
    msg, err = check_envelope(raw.encode())
    assert msg is None and err == reply
    assert RAW_ADVICE not in json.dumps(err) and "9" * 70 not in json.dumps(err)
    ok, err = check_envelope(b'{"jsonrpc":"2.0","id":81,"method":"ping","params":{"_meta":{"x":1' + b"0" * 63 + b"}}}")
    assert err is None and ok["params"]["_meta"]["x"] == 10 ** 63


def test_a_5000_digit_integer_over_stdio_is_answered_with_the_request_id(tmp_path):
    run = make_run(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "evotrainer.cli", "serve", "all", "--run", str(run)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(raw: str) -> None:
        proc.stdin.write(raw.encode() + b"\n")
        proc.stdin.flush()

    def recv(timeout: float = 90) -> dict | None:  # deadlines for a loaded machine, not a speed test
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        return json.loads(proc.stdout.readline()) if ready else None

    try:
        send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}))
        assert recv(180)["id"] == 0  # a cold start on a loaded machine
        send('{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        send('{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"list_versions","arguments":{"limit":'
             + BIG + "}}}")
        assert recv() == {"jsonrpc": "2.0", "id": 77, "error": {"code": -32602, "message": "Invalid params: "
                          "'params.arguments.limit' is an integer of 5,000 digits, past the 64 a message may hold (no "
                          "id, count or limit needs more); send a smaller number, or a string"}}
        send('{"jsonrpc":"2.0","id":80,"method":"ping","params":{"_meta":{"x":1' + "0" * 4400 + "}}}")
        assert recv()["id"] == 80
        send('{"jsonrpc":"2.0","id":' + BIG + ',"method":"ping"}')
        assert recv()["error"]["code"] == -32600
        send('{"jsonrpc":"2.0","id":78,"method":"tools/call","params":{"name":"list_versions","arguments":{"limit":2}}}')
        ok = recv()
        assert ok["id"] == 78 and "result" in ok and not ok["result"].get("isError"), ok
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_baseline_with_a_5000_digit_integer_is_refused_naming_the_line(tmp_path):
    cfg = RunConfig.model_validate({
        "brain": "heuristic", "backend": "local", "seed": 0,
        "budget": {"max_versions": 3, "steps_per_version": 2, "wall_clock_minutes": 10, "branches_per_round": 1,
                   "max_tokens": 320},
        "recipe": {"name": "tiny", "seed": 0, "model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 2,
                   "rollout_batch_size": 2, "micro_train_batch_size": 4, "generate_max_len": 8,
                   "data": {"task": "arithmetic", "level": 1, "n_train": 16, "n_heldout": 8, "n_test": 6, "seed": 0},
                   "eval": {"k": 2, "max_problems": 8, "temperature": 0.7}}})
    f = tmp_path / "compare.json"
    f.write_text(json.dumps({"runs": [], "comparable": _comparable(cfg)}, indent=1))
    assert load_baseline(f, cfg)["runs"] == []
    f.write_text(json.dumps({"comparable": _comparable(cfg)}, indent=1)[:-2] + ',\n "runs": [{"seed": ' + BIG
                 + "}]\n}")
    with pytest.raises(CompareError) as err:
        load_baseline(f, cfg)
    line = f.read_text().count("\n")
    assert str(err.value) == f"--baseline {f}: cannot be read as compare.json (line {line}: {TOO_LONG})"
    assert RAW_ADVICE not in str(err.value)


# --- review 19 (I-R19): the text readers (a verl console log, MLflow metrics, console dicts, AReaL, tables) ------
@pytest.mark.parametrize("fmt", ["step:{} - reward:{} - entropy:1.0",  # verl console lines
                                 "step {} {{'loss': 0.5, 'reward': {}}}"])  # console dicts with a step prefix
def test_a_console_log_with_a_5000_digit_step_is_named_by_its_line(tmp_path, fmt):
    run = tmp_path / "big_log"
    run.mkdir()
    lines = [fmt.format(s, s / 10) for s in range(1, 50)]
    (run / "train.log").write_text("\n".join(lines) + "\n")
    steps, values = ingest(run).metrics["big_log"]["reward/mean"]  # the file without the number reads
    assert steps.tolist()[:3] == [1, 2, 3] and values[:2].tolist() == [0.1, 0.2]
    (run / "train.log").write_text("\n".join(lines + [fmt.format(BIG, 0.5)]) + "\n")
    with pytest.raises(IngestError) as err:
        ingest(run)
    assert str(err.value) == f"{run / 'train.log'}:50: {TOO_LONG}"  # was Python's raw 4,300-digit advice
    assert RAW_ADVICE not in str(err.value)


def test_an_mlflow_metrics_line_with_a_5000_digit_step_is_named_by_its_file_and_line(tmp_path):
    run = tmp_path / "mlruns" / "0" / "abc"
    (run / "metrics").mkdir(parents=True)
    lines = [f"1700000000 {s / 10} {s}" for s in range(1, 50)]
    (run / "metrics" / "reward").write_text("\n".join(lines) + "\n")
    assert ingest(run).metrics["abc"]["reward/mean"][0].tolist()[:3] == [1, 2, 3]
    (run / "metrics" / "reward").write_text("\n".join(lines + [f"1700000000 0.5 {BIG}"]) + "\n")
    with pytest.raises(IngestError) as err:
        ingest(run)
    assert f"{run / 'metrics' / 'reward'}:50: step: {TOO_LONG}" in str(err.value)
    assert RAW_ADVICE not in str(err.value)


def test_step_int_bounds_text_and_passes_numbers_through():
    from evotrainer.harness.ingest_formats import step_int
    assert step_int(" 42 ") == 42 and step_int(7.0) == 7 and step_int("9" * MAX_JSON_INT_DIGITS) == int("9" * 64)
    with pytest.raises(NumberTooLong):
        step_int(BIG)
