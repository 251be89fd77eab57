"""Plots of the key series of a diagnosis (matplotlib, Agg backend; PNG files).

One figure per version: a grid of the key metrics (reward and correctness with the batch's reward
min / max, held-out score, entropy, KL, grad norm, completion length, clipped ratio, zero-variance
groups with the solve-none / solve-all fractions, reward components) with the step spans of warn /
blocking findings shaded, and their single steps (spikes, one-step levels) marked by lines.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np

from evotrainer import metrics as M
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding
from evotrainer.workspace import replace_file

PANELS: list[tuple[str, tuple[str, ...]]] = [
    ("reward", (M.REWARD_MEAN, M.CORRECT_MEAN, M.reward_component("correctness"), M.REWARD_MIN, M.REWARD_MAX)),
    ("held-out", (M.EVAL_AVG_AT_K, M.EVAL_PASS_AT_1)),
    ("entropy (nats/token)", (M.POLICY_ENTROPY,)),
    ("KL (nats/token)", (M.POLICY_KL,)),
    ("grad norm", (M.POLICY_GRAD_NORM,)),
    ("completion length (tokens)", (M.COMPLETIONS_MEAN_LENGTH, M.COMPLETIONS_P95_LENGTH)),
    ("clipped ratio", (M.COMPLETIONS_CLIPPED_RATIO,)),
    ("zero-variance groups", (M.REWARD_FRAC_ZERO_STD, M.REWARD_FRAC_SOLVE_NONE, M.REWARD_FRAC_SOLVE_ALL)),
    ("duplicates / distinct-2", (M.COMPLETIONS_DUPLICATE_FRAC, M.COMPLETIONS_DISTINCT_2)),
]
_COLORS = {"warn": "#f0a030", "blocking": "#d03030"}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "version"


PLOT_MAX = 1e100  # larger magnitudes are drawn as marks on the axis, like NaN / inf
# Reward components drawn (the first, by name): a foreign log names as many as it likes, and review 7's 300 KB
# JSONL with 2,500 `reward/c<i>/mean` keys took `diagnose` 24 s (5,000 keys: 79 s, growing faster than the count:
# one legend entry each) and `report` of its import past 300 s and 3.7 GB (one panel each), a 6 MB one hours.
MAX_COMPONENTS = 12


def plain(text: str) -> str:
    """``text`` for a matplotlib label or title, shown as written: each ``$`` escaped.

    matplotlib reads the text between two ``$`` as mathtext: a foreign run's metric ``reward/$\\frac{$/mean`` or a
    folder named ``run$\\sqrt{$`` (review 5) ended ``diagnose`` with ParseSyntaxException after the analyzers had
    run, and one nested 400 deep with RecursionError.
    """
    return text.replace("$", r"\$")


def plottable(x: np.ndarray) -> np.ndarray:
    """Which values can be drawn: finite and within ±:data:`PLOT_MAX`.

    A foreign log's ``1e308`` and ``-1e308`` (finite, so kept as evidence) on one axis made its range overflow
    to inf in matplotlib's tick layout: ``ValueError: arange: cannot compute length`` ended ``diagnose`` after
    the analyzers had run, before any finding was printed.
    """
    with np.errstate(invalid="ignore"):
        return np.isfinite(x) & (np.abs(x) <= PLOT_MAX)


def plot_version(ev: Evidence, version: str, findings: list[Finding], out_dir: str | Path,
                 root: Path | None = None) -> Path | None:
    """Write ``<out_dir>/<version>.png``; None when the version has none of the key series. ``root``: the run
    folder ``out_dir`` lies in, reached following no link (:func:`evotrainer.workspace.replace_file`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = [n for n in ev.metric_names(version)
             if n.startswith("reward/") and n.endswith("/mean") and n.count("/") == 2 and n != M.CORRECT_MEAN]
    panels = [(t, tuple(n for n in names if ev.has(version, n))) for t, names in PANELS]
    if comps:
        shown = f" (first {MAX_COMPONENTS} of {len(comps)})" if len(comps) > MAX_COMPONENTS else ""
        panels.append((f"reward components{shown}", tuple(comps[:MAX_COMPONENTS])))
    panels = [(t, names) for t, names in panels if names]
    if not panels:
        return None
    cols = 3
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3 * rows), squeeze=False)
    mine = [f for f in findings if version in f.versions and f.is_failure and f.steps]
    for ax, (title, names) in zip(axes.flat, panels, strict=False):
        for n in names:
            s, x = ev.series(version, n)
            bad = ~plottable(x)
            ax.plot(s, np.where(bad, np.nan, x), lw=1, marker="." if len(s) < 60 else None, label=plain(n))
            if bad.any():
                ax.scatter(s[bad], np.zeros(bad.sum()), marker="x", color="red", s=12,
                           label=f"{plain(n)} non-finite or beyond ±{PLOT_MAX:g}")
        for f in mine:
            if len(f.steps) > 2 or min(f.steps) == max(f.steps):  # points (spike steps, a one-step level)
                for st in f.steps[:50]:
                    ax.axvline(st, color=_COLORS[f.severity], alpha=0.3, lw=0.8)
            else:
                ax.axvspan(min(f.steps), max(f.steps), color=_COLORS[f.severity], alpha=0.08)
        ax.set_title(plain(title), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    kinds = ", ".join(sorted({f.kind for f in mine})) or "no failure findings"
    fig.suptitle(plain(f"{version}: {kinds}"), fontsize=10)
    fig.tight_layout()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{_safe(version)}.png"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    replace_file(path, buf.getvalue(), root=root)  # a link planted at the name is replaced, never written through
    return path


# Versions one diagnosis plots (review 18, C-R18b: a W&B export of 1,000 runs had `diagnose` write a PNG per run, about
# 0.5 s each on a loaded machine, and it was killed at 300 s after 584). 16: a sweep's runs side by side in a folder
# one looks through; more are read better as the findings table, which names every version.
MAX_PLOTTED_VERSIONS = 16


def versions_to_plot(ev: Evidence, findings: list[Finding], max_versions: int = MAX_PLOTTED_VERSIONS) -> list[str]:
    """The versions :func:`plot_evidence` draws: at most ``max_versions`` (default :data:`MAX_PLOTTED_VERSIONS`),
    those a warn / blocking finding names first, then the others, each group in the evidence's order; returned in the
    evidence's order.

    Raises:
        ValueError: ``max_versions`` below 1 (names it and the fix).
    """
    if max_versions < 1:
        raise ValueError(f"max_versions={max_versions}: give a positive whole number of versions to plot")
    flagged = {v for f in findings if f.is_failure for v in f.versions}
    ranked = [v for v in ev.versions if v in flagged] + [v for v in ev.versions if v not in flagged]
    chosen = set(ranked[:max_versions])
    return [v for v in ev.versions if v in chosen]


def plot_evidence(ev: Evidence, findings: list[Finding], out_dir: str | Path, root: Path | None = None,
                  max_versions: int = MAX_PLOTTED_VERSIONS) -> list[Path]:
    """One PNG per version with metric series, for the versions of :func:`versions_to_plot` (at most
    ``max_versions``, default :data:`MAX_PLOTTED_VERSIONS`); returns the files written (``root``: see
    :func:`plot_version`).

    Raises:
        ValueError: ``max_versions`` below 1.
    """
    return [p for v in versions_to_plot(ev, findings, max_versions)
            if (p := plot_version(ev, v, findings, out_dir, root=root)) is not None]
