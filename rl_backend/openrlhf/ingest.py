"""Ingest an OpenRLHF run into the workspace: TensorBoard scalars, logged samples, the checkpoint.

OpenRLHF's ``TensorboardLogger`` writes ``<tensorboard_dir>/<run_name>/events.out.tfevents.*``
with ``train/<key>`` per step (``policy_loss``, ``kl``, ``reward``, ``entropy_loss``, ...),
``eval/eval_<dataset>_pass<n>`` and the text ``train/generated_samples``. The scalars go through
the alias table (:func:`evotrainer.tb_events.parse_tensorboard` and
:func:`evotrainer.aliases.map_record`); before that, the tags our reward function adds
(``train/<component>`` for each reward component, ``train/correct``) and OpenRLHF's ``train/score``
(our correctness, see :mod:`evotrainer.rl_backend.openrlhf.reward_func`) are renamed to
``reward/<component>/mean`` and ``reward/correct/mean``. The result lands in
``ws.lineage.log_metrics`` so analyzers and MCP tools read an OpenRLHF version like a local one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evotrainer import metrics as M
from evotrainer.aliases import map_record
from evotrainer.rollouts import make_record
from evotrainer.tb_events import parse_tensorboard

_SAMPLE = re.compile(r"^Sample:(?:\\n|\n)(?P<text>.*)(?:\\n|\n)(?:\\n|\n)Reward: (?P<reward>[-0-9.eE+naif]+)\s*$", re.S)


def own_tags(reward_names: Iterable[str]) -> dict[str, str]:
    """TensorBoard tags our reward file produces → metric names (``train/format`` → ``reward/format/mean``)."""
    tags = {f"train/{n}": M.reward_component(n) for n in reward_names}
    tags.update({"train/correct": M.CORRECT_MEAN, "train/score": M.CORRECT_MEAN})
    return tags


def event_dir(tb_dir: str | Path) -> Path:
    """The folder holding the event files: ``tb_dir`` itself, or its ``<run_name>`` subfolder (the newest if several).

    Raises:
        FileNotFoundError: no event file under ``tb_dir``.
    """
    p = Path(tb_dir)
    files = sorted(p.rglob("events.out.tfevents*"), key=lambda f: f.stat().st_mtime) if p.exists() else []
    if not files:
        raise FileNotFoundError(f"{p}: no TensorBoard event file (events.out.tfevents.*) here yet")
    return p if any(f.parent == p for f in files) else files[-1].parent


def read_metrics(tb_dir: str | Path, reward_names: Iterable[str] = ()) -> dict[int, dict[str, float]]:
    """``{step: {metric name: value}}`` of an OpenRLHF TensorBoard folder (names from ``evotrainer.metrics``
    where the alias table knows them; unknown tags keep their TensorBoard name).

    Raises:
        FileNotFoundError: no event file under ``tb_dir``.
    """
    p = event_dir(tb_dir)
    ours = own_tags(reward_names)
    out: dict[int, dict[str, float]] = {}
    for step, rec in parse_tensorboard(p).items():
        own = {ours[k]: v for k, v in rec.items() if k in ours}
        rest = map_record({k: v for k, v in rec.items() if k not in ours})
        out[step] = {**rest, **own}
    return out


def read_samples(tb_dir: str | Path) -> list[dict[str, Any]]:
    """The ``train/generated_samples`` texts: ``[{step, text, reward}]`` (one sample per logged step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(event_dir(tb_dir)), size_guidance={"tensors": 0})
    ea.Reload()
    out = []
    for tag in ea.Tags().get("tensors", []):
        if not tag.startswith("train/generated_samples"):
            continue
        for e in ea.Tensors(tag):
            raw = b"".join(e.tensor_proto.string_val).decode("utf-8", errors="replace")
            m = _SAMPLE.match(raw)
            text, reward = (m["text"], float(m["reward"])) if m else (raw, float("nan"))
            out.append({"step": int(e.step), "text": text.replace("\\n", "\n"), "reward": reward})
    return sorted(out, key=lambda r: r["step"])


def ingest_run(ws, version_id: str, tb_dir: str | Path, reward_names: Iterable[str] = (),
               checkpoint: str | Path | None = None, since_step: int = 0) -> int:
    """Store an OpenRLHF run's metrics (steps > ``since_step``), samples and checkpoint in a workspace version.

    Samples become rollouts (split ``train``, one group of one sample per step, prompt and
    completion together in ``completion`` since OpenRLHF logs them as one text).

    Returns:
        The last step stored (``since_step`` when nothing new).

    Raises:
        FileNotFoundError: no event file under ``tb_dir``.
    """
    records = read_metrics(tb_dir, reward_names)
    last = since_step
    for step in sorted(records):
        if step > since_step:
            ws.lineage.log_metrics(version_id, step, records[step])
            last = step
    rows = [make_record(version_id=version_id, step=s["step"], prompt_id=f"openrlhf-{s['step']}",
                        group_id=f"{s['step']}-0", sample_idx=0, prompt="", completion=s["text"],
                        reward=s["reward"], split="train")
            for s in read_samples(tb_dir) if s["step"] > since_step]
    if rows:
        ws.rollouts.add(rows)
    if checkpoint is not None and Path(checkpoint).exists():
        ws.lineage.update_version(version_id, checkpoint=str(checkpoint))
    return last


def summarize(ws, version_id: str) -> dict[str, float]:
    """Last value of each stored metric of a version (the ``metrics_summary``)."""
    return {name: series[-1][1] for name, series in ws.lineage.all_metrics(version_id).items() if series}
