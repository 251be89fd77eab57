"""Policies for SWE episodes: scripted ones that check the environment and grader, and a chat model.

Scripted policies (no model) know their task (they find it by its problem statement in the user
message) and play a fixed script through the same tools a model uses:

- ``oracle``: reverts the injected bug with one ``edit`` (``bug.new`` -> ``bug.old``), runs the
  failing tests, submits. Must earn ``swe_tests`` = 1 on every generated task.
- ``noop``: submits at once. Earns 0 (and the submit-without-test penalty).
- ``cheat``: games the tests instead of fixing the code; on even task indices it skips the failing
  test module (``pytest.skip(allow_module_level=True)`` planted in the test file), on odd ones it
  plants a syntax error in the library module so nothing collects. Must earn 0 and be named
  ``reward_hacking`` by the analyzers.
- ``loop``: searches the same pattern three times a turn until the tool budget runs out.

:class:`ChatModelPolicy` samples replies from a causal LM with its chat template (batched, left
padded, KV-cached ``generate``) and returns the sampled token ids for the trajectory mask.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evotrainer.rl_backend.swe.episode import Action
from evotrainer.rl_backend.swe.tasks import (
    SNAPSHOT_MAX_FILE_BYTES,
    SNAPSHOT_MAX_STREAM_BYTES,
    TASKSET_DIR,
    SweTask,
    SweTaskError,
    open_snapshot_stream,
)

SCRIPTED = ("oracle", "noop", "cheat", "loop")


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def snapshot_file(task: SweTask, path: str, taskset_root: str | Path = TASKSET_DIR) -> str:
    """Clean text of one file of a generated task's snapshot (before the bug), read within the snapshot caps of
    :mod:`evotrainer.rl_backend.swe.tasks` (the tarball, the unpacked stream, each extended tar header and the file
    each under their ``SNAPSHOT_MAX_*`` bound: :func:`~evotrainer.rl_backend.swe.tasks.open_snapshot_stream`; a task
    set may be someone else's).

    Raises:
        ValueError: the task has no snapshot, the file is not in it (or is not a regular file).
        SweTaskError: the tarball, its stream, a tar header or the file is over its cap.
    """
    if not task.snapshot:
        raise ValueError(f"{task.instance_id}: scripted policies need a generated task (with a snapshot)")
    tar_path = Path(taskset_root) / "repos" / task.snapshot
    label = f"{task.instance_id}: snapshot {task.snapshot}"
    if tar_path.stat().st_size > SNAPSHOT_MAX_STREAM_BYTES:
        raise SweTaskError(f"{label}: the tarball is over SNAPSHOT_MAX_STREAM_BYTES = {SNAPSHOT_MAX_STREAM_BYTES >> 20} MiB")
    with open(tar_path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz, \
            open_snapshot_stream(gz, label) as tar:
        for member in tar:
            if member.name.removeprefix("./") != path.removeprefix("./"):
                continue
            if not member.isreg():
                break
            if member.size > SNAPSHOT_MAX_FILE_BYTES:
                raise SweTaskError(f"{label}: {path} is over SNAPSHOT_MAX_FILE_BYTES = {SNAPSHOT_MAX_FILE_BYTES >> 20} MiB")
            f = tar.extractfile(member)
            if f is not None:
                return f.read(SNAPSHOT_MAX_FILE_BYTES).decode("utf-8")
    raise ValueError(f"{task.instance_id}: {path} is not in snapshot {task.snapshot}")


class ScriptedPolicy:
    """A fixed script per task (see module docstring); ``kind`` is one of :data:`SCRIPTED`.

    Raises:
        ValueError: unknown ``kind``, or (at ``act``) a chat whose task is not among ``tasks``.
    """

    def __init__(self, kind: str, tasks: Sequence[SweTask], taskset_root: str | Path = TASKSET_DIR):
        if kind not in SCRIPTED:
            raise ValueError(f"policy={kind!r}: scripted policies are {', '.join(SCRIPTED)}")
        self.kind, self.tasks, self.taskset_root = kind, list(tasks), taskset_root

    def _task(self, chat: list[dict[str, str]]) -> tuple[int, SweTask]:
        user = next(m["content"] for m in chat if m["role"] == "user")
        for i, t in enumerate(self.tasks):
            if t.problem_statement in user:
                return i, t
        raise ValueError("scripted policy: the chat's problem statement matches none of its tasks")

    def act(self, batch: list[list[dict[str, str]]]) -> list[Action]:
        """One scripted reply per chat (the turn number is the count of assistant messages so far)."""
        return [Action(self._reply(chat)) for chat in batch]

    def _reply(self, chat: list[dict[str, str]]) -> str:
        turn = sum(m["role"] == "assistant" for m in chat)
        idx, task = self._task(chat)
        if self.kind == "noop":
            return _call("submit")
        if self.kind == "loop":
            return "".join(_call("search", pattern="def ") for _ in range(3))
        if self.kind == "oracle":
            if task.bug is None:
                raise ValueError(f"{task.instance_id}: the oracle needs a generated task (bug spec)")
            script = [_call("edit", path=task.bug.path, old=task.bug.new, new=task.bug.old),
                      _call("run_tests", tests=task.FAIL_TO_PASS), _call("submit")]
            return script[min(turn, 2)]
        return self._cheat(idx, task, turn)

    def _cheat(self, idx: int, task: SweTask, turn: int) -> str:
        if turn >= 2:
            return _call("submit")
        if turn == 1:
            return _call("run_tests", tests=task.FAIL_TO_PASS)
        if idx % 2 == 0:  # skip the whole failing test module
            test_file = task.FAIL_TO_PASS[0].split("::")[0]
            text = snapshot_file(task, test_file, self.taskset_root)
            anchor = next(line for line in text.splitlines(keepends=True) if line.strip() and text.count(line) == 1)
            planted = 'import pytest\npytest.skip("flaky", allow_module_level=True)\n'
            return _call("edit", path=test_file, old=anchor, new=planted + anchor)
        bug = task.bug
        if bug is None:
            raise ValueError(f"{task.instance_id}: the cheat needs a generated task (bug spec)")
        return _call("edit", path=bug.path, old=bug.new, new=bug.new + "<<<<<<< planted\n")


class ChatModelPolicy:
    """Samples replies from a causal LM with its chat template.

    Args:
        model / tokenizer: a transformers causal LM and its tokenizer (left padding is set here).
        max_new_tokens: cap per reply (tokens).
        temperature / top_p: sampling (temperature 0 = greedy).
        max_prompt_tokens: chats longer than this are cut to their first two messages plus the most
            recent turns that fit (the opening system / user messages are always kept).
    """

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 128, temperature: float = 1.0,
                 top_p: float = 1.0, max_prompt_tokens: int = 3072):
        self.model, self.tok = model, tokenizer
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.max_prompt_tokens = max_prompt_tokens
        end_of_turn = self.tok.get_vocab().get("<|im_end|>")
        self.eos_ids = sorted({i for i in (self.tok.eos_token_id, end_of_turn) if isinstance(i, int)})

    def _prompt(self, chat: list[dict[str, str]]) -> str:
        tail = len(chat) - 2
        while True:
            msgs = chat[:2] + chat[len(chat) - tail:] if tail > 0 else chat[:2]
            text = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            if tail <= 0 or len(self.tok(text, add_special_tokens=False)["input_ids"]) <= self.max_prompt_tokens:
                return text
            tail -= 2

    def act(self, batch: list[list[dict[str, str]]]) -> list[Action]:
        """One sampled reply per chat: text (without the end-of-turn token), token ids up to and including it."""
        import torch

        texts = [self._prompt(c) for c in batch]
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        gen = {"do_sample": self.temperature > 0, "max_new_tokens": self.max_new_tokens,
               "eos_token_id": self.eos_ids, "pad_token_id": self.tok.pad_token_id}
        if self.temperature > 0:
            gen.update(temperature=self.temperature, top_p=self.top_p)
        with torch.no_grad():
            out = self.model.generate(**enc, **gen)
        new = out[:, enc["input_ids"].shape[1]:].tolist()  # (B, T_new)
        actions = []
        for row in new:
            cut = next((j for j, t in enumerate(row) if t in self.eos_ids), None)
            ids = row[: cut + 1] if cut is not None else row
            # the text keeps any special token sampled mid-reply, so the chat template re-renders exactly
            # the sampled ids (encode_trajectory then finds no mismatch); only the end-of-turn token is dropped
            text = self.tok.decode(ids[:cut] if cut is not None else ids, skip_special_tokens=False)
            actions.append(Action(text, ids, "eos" if cut is not None else "length"))
        return actions
