"""TensorBoard output of the local trainer: one run folder per version, ``ws.root/tb/<version>``.

What each version's folder holds (read back in tests/test_tensorboard.py with tensorboard's
``EventAccumulator``):

- **scalars** of every training step under our metric names (``reward/mean``, ``policy/kl``, ...),
  at the **lineage-global step** (``LineageStore.step_offset``): a child's first step follows the
  last step of the version whose weights it trains from, so curves of a lineage line up on one
  axis (CleanRL logs against its global step the same way);
- **held-out scalars** ``eval/avg@k``, ``eval/pass@k``, ``eval/pass@1`` (other eval sets:
  ``eval/<name>/avg@k``, ...) at the global step of the version's last trained step;
- **hparams**: the recipe's flat fields (``evotrainer.recipe.flatten``: ``reward.correctness.weight``,
  ``data.level``, ...) with the eval and reward scalars as the hparams plugin's metrics, so the HPARAMS
  tab compares versions (torch's ``summary.hparams``, written into the version's own folder rather
  than the timestamped sub-run ``SummaryWriter.add_hparams`` creates);
- **text samples** ``samples`` at each step: the first :data:`N_TEXT_SAMPLES` rollouts of the step
  (prompt, completion, reward, correct) as a markdown table.
"""

from __future__ import annotations

import math
from typing import Any

from evotrainer.recipe import flatten

N_TEXT_SAMPLES = 3  # completions per step shown in the TEXT tab
TEXT_MAX_CHARS = 400  # a prompt / completion is cut to this many characters in the table
HPARAM_METRICS = ("eval/avg@k", "eval/pass@k", "reward/mean")


def hparams_of(recipe: Any) -> dict[str, bool | int | float | str]:
    """The recipe's flat fields as hparams values (lists, dicts and None become their text)."""
    out: dict[str, bool | int | float | str] = {}
    for k, v in sorted(flatten(recipe.to_dict()).items()):
        out[k] = v if isinstance(v, (bool, int, float, str)) else str(v)
    return out


def _writer(ws: Any, version_id: str) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(ws.tb_dir(version_id)))  # a real folder of the run, no link followed


class TrainWriter:
    """Writes one version's training steps: hparams once, then scalars and text samples per step."""

    def __init__(self, ws: Any, version_id: str, recipe: Any):
        from torch.utils.tensorboard.summary import hparams

        self.offset = ws.lineage.step_offset(version_id)
        self.tb = _writer(ws, version_id)
        exp, ssi, sei = hparams(hparams_of(recipe), {m: math.nan for m in HPARAM_METRICS})
        fw = self.tb._get_file_writer()
        for s in (exp, ssi, sei):
            fw.add_summary(s)

    def step(self, step: int, metrics: dict[str, Any], records: list[dict[str, Any]]) -> None:
        """Scalars (finite values only) and the text samples of version-local ``step``."""
        g = self.offset + step
        for k, val in metrics.items():
            if val is not None and math.isfinite(val):
                self.tb.add_scalar(k, val, g)
        if records:
            self.tb.add_text("samples", samples_markdown(records[:N_TEXT_SAMPLES]), g)

    def close(self) -> None:
        self.tb.close()


def _cell(text: Any) -> str:
    s = str(text)[:TEXT_MAX_CHARS]
    return s.replace("|", "\\|").replace("\r", " ").replace("\n", "<br>")


def samples_markdown(records: list[dict[str, Any]]) -> str:
    """A markdown table of rollouts: prompt, completion, reward, correct (one row each)."""
    lines = ["| prompt | completion | reward | correct |", "|---|---|---|---|"]
    for r in records:
        lines.append(f"| {_cell(r.get('prompt', ''))} | {_cell(r.get('completion', ''))} | "
                     f"{float(r.get('reward', math.nan)):.3f} | {r.get('correct')} |")
    return "\n".join(lines)


def write_eval(ws: Any, version_id: str, summary: dict[str, Any], eval_name: str = "heldout") -> int:
    """Held-out scalars of one evaluation; returns the global step they are written at.

    ``summary`` is ``EvalResult.summary()`` (keys ``avg@k``, ``pass@k``, ``pass@1``). The step is
    the global step of the version's last trained step (its offset for an untrained version).
    """
    lin = ws.lineage
    g = lin.step_offset(version_id) + max(0, lin.last_step(version_id))
    prefix = "eval" if eval_name == "heldout" else f"eval/{eval_name}"
    tb = _writer(ws, version_id)
    try:
        for key in ("avg@k", "pass@k", "pass@1"):
            val = summary.get(key)
            if val is not None and math.isfinite(val):
                tb.add_scalar(f"{prefix}/{key}", float(val), g)
    finally:
        tb.close()
    return g
