"""Reading TensorBoard event files: the scalar summaries of a run, per step.

One reader for every caller: the ingest of foreign runs (``harness/ingest.py``: OpenRLHF, TRL, our
own ``tb/<version>`` folders) and the OpenRLHF backend following its job
(``rl_backend/openrlhf/ingest.py``). Names stay as TensorBoard wrote them; mapping them to
:mod:`evotrainer.metrics` names is the alias table's job (:mod:`evotrainer.aliases`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def parse_tensorboard(path: str | Path) -> dict[int, dict[str, float]]:
    """Per-step records ``{step: {tag: value}}`` of the scalar summaries in a TensorBoard event file or folder.

    TF1 scalar summaries and TF2-style scalar tensors (one value) both count; other tensors are skipped.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # heavy: lazy

    ea = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    out: dict[int, dict[str, float]] = {}
    tags = ea.Tags()
    for tag in tags.get("scalars", []):
        for e in ea.Scalars(tag):
            out.setdefault(int(e.step), {})[tag] = float(e.value)
    for tag in tags.get("tensors", []):  # TF2-style scalar summaries
        for e in ea.Tensors(tag):
            arr = np.frombuffer(e.tensor_proto.tensor_content, dtype=np.float32) if e.tensor_proto.tensor_content \
                else np.array(e.tensor_proto.float_val, dtype=np.float32)
            if arr.size == 1:
                out.setdefault(int(e.step), {})[tag] = float(arr[0])
    return out
