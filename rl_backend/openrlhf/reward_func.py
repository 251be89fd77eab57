"""The reward function OpenRLHF loads, built from a recipe's reward spec with the local backend's code.

OpenRLHF (0.10 and 0.11, ``--reward.remote_url`` / ``--remote_rm_url`` pointing at a ``.py`` file)
imports the file with ``importlib.util.spec_from_file_location`` and calls
``reward_func(queries, prompts, labels)`` (one sample per call in 0.11.2's
``SingleTurnAgentExecutor``), expecting ``{"rewards": (B,), "scores": (B,), "extra_logs":
{name: (B,)}}`` tensors. The file :func:`evotrainer.rl_backend.openrlhf.job.write_reward_file`
writes holds only a config and one call to :func:`make_reward_func`, so the rewards are
:func:`evotrainer.rl_backend.rewards.compute_rewards`, the same code as the local trainer.

Per sample:

- ``queries[i]`` is the decoded prompt + completion (special tokens kept) and ``prompts[i]`` the
  templated prompt, so the completion is ``queries[i][len(prompts[i]):]`` minus trailing EOS / pad
  tokens (when the decode does not reproduce the prompt exactly, the text after the last
  occurrence of the prompt's longest tail found, of 64 down to 8 characters).
- ``labels[i]`` is the JSON label EvoTrainer wrote into the prompt dataset:
  ``{"id", "answer", "meta"}`` (the :class:`~evotrainer.rl_backend.tasks.Problem`).
- the completion length in tokens comes from the policy's tokenizer (loaded once from
  ``config["tokenizer"]``; whitespace words if it cannot be loaded); the finish reason is ``eos``
  when an EOS token ended the text, else ``length`` when the length reached ``generate_max_len``.

Returned: ``rewards`` = the weighted total (for held-out problems, ``meta["split"] == "heldout"``:
the correctness, so OpenRLHF's ``eval_heldout_pass1`` / ``eval_heldout_pass<k>``, which average
the reward / take its max over the k samples, are Avg@k and pass@k), ``scores`` = correctness (0/1; OpenRLHF's dynamic
filtering reads it), ``extra_logs`` = each component's unweighted value plus ``correct``, which
OpenRLHF logs as ``train/<name>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import re2

from evotrainer.recipe import RewardComponent
from evotrainer.rl_backend.rewards import compute_rewards
from evotrainer.rl_backend.tasks import Problem

# RE2 (linear): with Python's re this search backtracked quadratically on a run of special tokens followed by
# anything else, 0.8 s for 4,000 '</s>' + 'x' (docs/security-probes.md, review 3, T-R1), per sample, in the trainer
_TRAILING_SPECIAL = re2.compile(r"(<\|[^|>]{1,40}\|>|</s>|<eos>|<pad>)+\s*$")


def _load_tokenizer(name: str | None):
    if not name:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except Exception:  # noqa: BLE001 - fall back to word counts, said in the module docstring
        return None


def split_completion(query: str, prompt: str, eos_tokens: tuple[str, ...] = ()) -> tuple[str, bool]:
    """``(completion, ended_by_eos)`` from OpenRLHF's decoded query and templated prompt."""
    if query.startswith(prompt):
        text = query[len(prompt):]
    else:  # the decode did not reproduce the prompt exactly: cut after the longest prompt tail found
        text = query
        for n in (64, 32, 16, 8):
            tail = prompt[-n:]
            if len(prompt) >= n and tail in query:
                text = query[query.rfind(tail) + n:]
                break
    ended = False
    while True:
        stripped = text.rstrip()
        hit = next((t for t in eos_tokens if t and stripped.endswith(t)), None)
        if hit:
            text, ended = stripped[: -len(hit)], True
            continue
        m = _TRAILING_SPECIAL.search(text)
        if m:
            text, ended = text[: m.start()], True
            continue
        return text, ended


def make_reward_func(config: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """Build ``reward_func(queries, prompts, labels, **kwargs)`` for OpenRLHF.

    Args:
        config: ``{"reward": {name: {"weight", "params"}}, "generate_max_len": int,
            "tokenizer": model path or None, "task": str}`` (written by ``write_reward_file``).
    """
    spec = {k: RewardComponent(**v) for k, v in config["reward"].items()}
    max_len = int(config["generate_max_len"])
    state: dict[str, Any] = {}

    def tokenizer():
        if "tok" not in state:
            state["tok"] = _load_tokenizer(config.get("tokenizer"))
        return state["tok"]

    def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
        import torch

        tok = tokenizer()
        eos = tuple(t for t in ((tok.eos_token, tok.pad_token) if tok is not None else ()) if t)
        problems, completions, finish, lengths = [], [], [], []
        for q, p, lab in zip(queries, prompts, labels, strict=True):
            d = json.loads(lab) if isinstance(lab, str) else dict(lab)
            problems.append(Problem(id=str(d.get("id", "")), prompt=d.get("prompt", ""), answer=str(d["answer"]),
                                    meta=d.get("meta") or {"task": config.get("task", "arithmetic")}))
            text, ended = split_completion(q, p, eos)
            n = len(tok(text, add_special_tokens=False)["input_ids"]) if tok is not None else len(text.split())
            completions.append(text)
            lengths.append(n)
            finish.append("eos" if ended or n < max_len else "length")
        out = compute_rewards(spec, problems, completions, finish_reasons=finish, lengths=lengths,
                              generate_max_len=max_len)
        correct = [0.0 if c != c else c for c in out.correct]  # NaN (no verdict) -> 0
        logs = {name: torch.tensor(v, dtype=torch.float32) for name, v in out.components.items()}
        logs["correct"] = torch.tensor(correct, dtype=torch.float32)
        # held-out problems are scored by correctness alone, so OpenRLHF's eval pass1 / pass<k> are Avg@k / pass@k
        total = [c if p.meta.get("split") == "heldout" else t for p, c, t in zip(problems, correct, out.total,
                                                                                  strict=True)]
        return {"rewards": torch.tensor(total, dtype=torch.float32),
                "scores": torch.tensor(correct, dtype=torch.float32), "extra_logs": logs}

    return reward_func
