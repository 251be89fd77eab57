"""Reading TensorBoard event files: the scalar summaries of a run, per step.

One reader for every caller: the ingest of foreign runs (``harness/ingest.py``: OpenRLHF, TRL, our
own ``tb/<version>`` folders) and the OpenRLHF backend following its job
(``rl_backend/openrlhf/ingest.py``). Names stay as TensorBoard wrote them; mapping them to
:mod:`evotrainer.metrics` names is the alias table's job (:mod:`evotrainer.aliases`).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

MAX_PARTIAL_RECORD = 16 << 20  # a last record claiming more than the file holds, and more than this, is corrupt


def check_record_lengths(path: str | Path) -> None:
    """Refuse an event file whose record headers claim more bytes than the file holds.

    TensorBoard's reader allocates a record's claimed length before reading it: a 112-byte file whose first
    header (with a valid checksum) claims 1 TiB ended a diagnosis with MemoryError. The headers are walked
    with seeks (12 bytes each, no payload read). A short last record within :data:`MAX_PARTIAL_RECORD` is
    a file still being written and passes.

    Raises:
        ValueError: a record claims more than the rest of the file and more than the partial-record bound
            (names the file, the offset and both sizes).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        at = 0
        while at + 12 <= size:
            f.seek(at)
            (length,) = struct.unpack("<Q", f.read(8))
            left = size - at - 16
            if length > left:
                if length > MAX_PARTIAL_RECORD:
                    raise ValueError(f"{path}: the record at byte {at} claims {length} bytes but the file holds "
                                     f"{max(left, 0)} more: a corrupt event file; remove it from the folder")
                return
            at += length + 16


def _event_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.startswith("events.out.tfevents") and p.is_file())
    return [path]


def parse_tensorboard(path: str | Path) -> dict[int, dict[str, float]]:
    """Per-step records ``{step: {tag: value}}`` of the scalar summaries in a TensorBoard event file or folder.

    TF1 scalar summaries and TF2-style scalar tensors (one value) both count; other tensors are skipped.

    Raises:
        ValueError: an event file claims a record larger than itself (:func:`check_record_lengths`).
    """
    for f in _event_files(Path(path)):
        check_record_lengths(f)
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
