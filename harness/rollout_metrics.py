"""Per-step metrics computed from rollouts, for runs that did not log them (and for the trainer).

The text statistics of one batch (distinct-n, n-gram repetition, duplicates across prompts) are
:mod:`evotrainer.text_stats`, shared with the local trainer (whitespace-separated words, no
tokenizer); :func:`frac_zero_std_groups` is one step's fraction of zero-std groups.
:func:`step_metrics_from_rollouts` computes the per-step series of a whole rollout table at once
(vectorised with Arrow dictionary encoding and pandas group-bys), under ``evotrainer/metrics.py``
names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evotrainer import metrics as M
from evotrainer.text_stats import distinct_n, repetition_rate


def frac_zero_std_groups(rewards: Sequence[float], group_ids: Sequence[Any], atol: float = 1e-9) -> float:
    """Fraction of groups whose rewards are all equal (max - min <= atol): no group-relative signal.

    Raises:
        ValueError: lengths differ.
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"rewards ({len(rewards)}) and group_ids ({len(group_ids)}) must have the same length")
    if not len(rewards):
        return float("nan")
    groups: dict[Any, list[float]] = {}
    for r, g in zip(rewards, group_ids, strict=True):
        groups.setdefault(g, []).append(float(r))
    return float(np.mean([max(v) - min(v) <= atol for v in groups.values()]))


def _codes(col: pa.ChunkedArray) -> np.ndarray:
    """Integer id per distinct value (Arrow dictionary encoding: a hash table in C++)."""
    enc = pc.dictionary_encode(col).combine_chunks()
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _segments(sorted_key: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in a sorted key."""
    return np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])


def step_metrics_from_rollouts(table: pa.Table, skip: dict[str, dict[str, Any]] | None = None,
                               split: str = "train", text_steps: int = 200, text_samples: int = 32
                               ) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per-step metrics of every version in a rollout table (store schema), ``{version: {metric: (steps, values)}}``.

    Computed for all steps: reward mean / std (population) / min / max, fraction of zero-std groups,
    kept-group fraction, correct mean, fractions of groups solved by none / all of their rollouts, completion mean / p95 / max length, clipped ratio
    (finish_reason ``length``), duplicate fraction (completions equal, after whitespace trim, to a
    completion of another prompt of the same step). One sort by (version, step, group) and
    segment reductions (``np.add.reduceat``), so 1M rows take well under a second.

    The word-level text metrics (distinct-2, 4-gram repetition) are costly in Python, so they are
    computed only for versions that did not log them (``skip``), on at most ``text_steps`` evenly
    spaced steps and the first ``text_samples`` completions of each.

    Args:
        table: rollouts with at least version_id, step, group_id, reward; other columns optional.
        skip: the logged metrics ``{version: {metric: ...}}``; text metrics logged there are not recomputed.
        split: which split to use (``train``).
    """
    if table.num_rows == 0:
        return {}
    if "split" in table.column_names:
        mask = pc.equal(table.column("split"), split)
        if not pc.all(mask).as_py():  # filtering copies every column: only when needed
            table = table.filter(mask)
        if table.num_rows == 0:
            return {}
    names = table.column_names
    venc = pc.dictionary_encode(table.column("version_id")).combine_chunks()
    vnames = venc.dictionary.to_pylist()
    vcode = venc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    step = table.column("step").to_numpy().astype(np.int64)
    gcode = _codes(table.column("group_id"))
    smin = int(step.min())
    nsteps = int(step.max()) - smin + 1
    k1 = vcode * nsteps + (step - smin)  # (version, step) key
    ng = int(gcode.max()) + 1
    order = np.argsort(k1 * ng + gcode, kind="stable")  # sort by (version, step, group)
    k1s = k1[order]
    r = table.column("reward").to_numpy().astype(np.float64)[order]
    st = _segments(k1s)  # step segments
    cnt = np.diff(np.r_[st, len(k1s)]).astype(np.float64)
    key_out = k1s[st]
    out_v, out_step = key_out // nsteps, key_out % nsteps + smin

    def mean_of(x: np.ndarray) -> np.ndarray:
        ok = np.isfinite(x)
        num = np.add.reduceat(np.where(ok, x, 0.0), st)
        den = np.add.reduceat(ok.astype(np.float64), st)
        with np.errstate(invalid="ignore", divide="ignore"):
            return num / den

    agg: dict[str, np.ndarray] = {}
    mu = np.add.reduceat(r, st) / cnt
    agg[M.REWARD_MEAN] = mu
    agg[M.REWARD_STD] = np.sqrt(np.maximum(np.add.reduceat(r * r, st) / cnt - mu * mu, 0.0))
    gk = (k1 * ng + gcode)[order]
    gst = _segments(gk)  # group segments (nested in step segments)
    zero = (np.maximum.reduceat(r, gst) - np.minimum.reduceat(r, gst)) <= 1e-9
    gstep = np.searchsorted(st, gst, side="right") - 1  # step segment of each group
    ngroups = np.bincount(gstep, minlength=len(st)).astype(np.float64)
    agg[M.REWARD_FRAC_ZERO_STD] = np.bincount(gstep, weights=zero, minlength=len(st)) / ngroups
    agg[M.REWARD_MIN] = np.minimum.reduceat(r, st)
    agg[M.REWARD_MAX] = np.maximum.reduceat(r, st)
    if "kept" in names:
        kept = table.column("kept").to_numpy(zero_copy_only=False).astype(np.float64)[order]
        agg[M.REWARD_KEPT_GROUP_FRAC] = np.bincount(gstep, weights=np.maximum.reduceat(kept, gst),
                                                    minlength=len(st)) / ngroups
    if "length" in names:
        ln = table.column("length").to_numpy().astype(np.float64)[order]
        agg[M.COMPLETIONS_MEAN_LENGTH] = np.add.reduceat(ln, st) / cnt
        agg[M.COMPLETIONS_MAX_LENGTH] = np.maximum.reduceat(ln, st)
        lo = np.argsort(k1s * (int(ln.max()) + 1) + ln.astype(np.int64))  # lengths sorted within each step
        pos = st + np.floor(0.95 * (cnt - 1)).astype(np.int64)  # nearest-rank p95 (numpy "lower")
        agg[M.COMPLETIONS_P95_LENGTH] = ln[lo][pos]
    if "finish_reason" in names:
        clip = pc.equal(table.column("finish_reason"), "length").to_numpy(zero_copy_only=False)
        agg[M.COMPLETIONS_CLIPPED_RATIO] = np.add.reduceat(clip.astype(np.float64)[order], st) / cnt
    if "correct" in names:
        cor = table.column("correct").to_numpy().astype(np.float64)[order]
        if np.isfinite(cor).any():
            agg[M.CORRECT_MEAN] = mean_of(cor)
            solved = np.where(np.isfinite(cor), cor, 0.0) > 0.5
            g_any = np.maximum.reduceat(solved.astype(np.float64), gst)  # a group with >= 1 correct rollout
            g_all = np.minimum.reduceat(solved.astype(np.float64), gst)  # a group whose rollouts are all correct
            agg[M.REWARD_FRAC_SOLVE_NONE] = np.bincount(gstep, weights=1.0 - g_any, minlength=len(st)) / ngroups
            agg[M.REWARD_FRAC_SOLVE_ALL] = np.bincount(gstep, weights=g_all, minlength=len(st)) / ngroups
    logged_dup = skip and all(M.COMPLETIONS_DUPLICATE_FRAC in (skip.get(v) or {}) for v in vnames)
    if "completion" in names and "prompt_id" in names and not logged_dup:
        c = _codes(pc.utf8_trim_whitespace(table.column("completion")))[order]
        p = _codes(table.column("prompt_id"))[order]
        nc, npr = int(c.max()) + 1, int(p.max()) + 1
        k3 = k1s * nc + c  # (step, completion) key; fits int64 for any realistic run
        if float(k3.max()) * npr < 2**62:
            o2 = np.argsort(k3 * npr + p)  # by (step, completion, prompt)
        else:
            o2 = np.lexsort((p, k3))
        seg = _segments(k3[o2])
        ends = np.r_[seg[1:], len(o2)] - 1
        ps = p[o2]
        multi = ps[seg] != ps[ends]  # sorted by prompt within the segment: >1 distinct prompt
        dup_sorted = np.repeat(multi, np.diff(np.r_[seg, len(o2)]))
        dup = np.empty(len(o2), dtype=np.float64)
        dup[o2] = dup_sorted
        agg[M.COMPLETIONS_DUPLICATE_FRAC] = np.add.reduceat(dup, st) / cnt

    out: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for code in np.unique(out_v):
        m = out_v == code
        vs = out_step[m]
        out[vnames[code]] = {name: (vs, vals[m]) for name, vals in agg.items() if np.isfinite(vals[m]).any()}
    if "completion" in names:
        _text_metrics(table, vcode, step, vnames, out, skip or {}, text_steps, text_samples)
    return out


def _text_metrics(table: pa.Table, vcode: np.ndarray, step: np.ndarray, vnames: list[str], out: dict, skip: dict,
                  text_steps: int, text_samples: int) -> None:
    """Distinct-2 and repetition on a sample of steps for versions that did not log them."""
    for code, vname in enumerate(vnames):
        logged = skip.get(vname, {})
        if M.COMPLETIONS_DISTINCT_2 in logged and M.COMPLETIONS_REPETITION in logged:
            continue
        rows = np.flatnonzero(vcode == code)
        if not len(rows):
            continue
        steps_all = step[rows]
        uniq = np.unique(steps_all)
        chosen = uniq[np.linspace(0, len(uniq) - 1, min(text_steps, len(uniq))).astype(int)]
        sel = rows[np.isin(steps_all, chosen)]
        sub = table.take(pa.array(sel)).select(["step", "completion"]).to_pydict()
        per_step: dict[int, list[str]] = {}
        for s, c in zip(sub["step"], sub["completion"], strict=True):
            lst = per_step.setdefault(int(s), [])
            if len(lst) < text_samples:
                lst.append(c)
        st = np.array(sorted(per_step), dtype=np.int64)
        d2 = np.array([distinct_n(per_step[s], 2) for s in st])
        rep = np.array([repetition_rate(per_step[s], 4) for s in st])
        out.setdefault(vname, {})[M.COMPLETIONS_DISTINCT_2] = (st, d2)
        out[vname][M.COMPLETIONS_REPETITION] = (st, rep)
