"""Per-step metrics computed from rollouts, for runs that did not log them (and for the trainer).

Batch helpers (one step's completions in, one number out) the local trainer may call directly:
:func:`distinct_n`, :func:`repetition_rate`, :func:`duplicate_frac`, :func:`frac_zero_std_groups`.
:func:`step_metrics_from_rollouts` computes the per-step series of a whole rollout table at once
(vectorised with Arrow dictionary encoding and pandas group-bys), under ``evotrainer/metrics.py``
names.

Tokens for the text metrics are whitespace-separated words (no tokenizer needed; a departure
from model-token n-grams that keeps the metric comparable across models).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evotrainer import metrics as M


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Distinct-n: distinct n-grams / all n-grams over the batch (Li et al. 2016); NaN with no n-gram.

    1.0 means no n-gram repeats anywhere in the batch; near 0 means the batch says the same thing.
    """
    total, seen = 0, set()
    for t in texts:
        grams = _ngrams(t.split(), n)
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else float("nan")


def repetition_rate(texts: Sequence[str], n: int = 4) -> float:
    """Mean over completions of the fraction of n-grams that repeat an earlier n-gram of the same completion.

    Completions with fewer than n words count as 0 (no repetition possible). NaN for an empty batch.
    """
    if not texts:
        return float("nan")
    rates = []
    for t in texts:
        grams = _ngrams(t.split(), n)
        rates.append(1.0 - len(set(grams)) / len(grams) if grams else 0.0)
    return float(np.mean(rates))


def duplicate_frac(completions: Sequence[str], prompt_ids: Sequence[Any]) -> float:
    """Fraction of completions identical (after whitespace strip) to a completion of another prompt in the batch.

    High values mean outputs no longer depend on the input (template collapse).
    """
    if not completions:
        return float("nan")
    prompts_of: dict[str, set] = {}
    keys = [c.strip() for c in completions]
    for k, p in zip(keys, prompt_ids, strict=True):
        prompts_of.setdefault(k, set()).add(p)
    return float(np.mean([len(prompts_of[k]) > 1 for k in keys]))


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


def step_metrics_from_rollouts(table: pa.Table, skip: dict[str, dict[str, Any]] | None = None,
                               split: str = "train", text_steps: int = 200, text_samples: int = 64
                               ) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per-step metrics of every version in a rollout table (store schema), ``{version: {metric: (steps, values)}}``.

    Computed for all steps: reward mean / std, fraction of zero-std groups, kept-group fraction,
    correct mean, completion mean / p95 / max length, clipped ratio (finish_reason ``length``),
    duplicate fraction. The word-level text metrics (distinct-2, 4-gram repetition) are costly in
    Python, so they are computed only for versions that did not log them (``skip``), on at most
    ``text_steps`` evenly spaced steps and ``text_samples`` completions per step (seeded order:
    the first ones by group and sample index).

    Args:
        table: rollouts with at least version_id, step, group_id, reward; other columns optional.
        skip: the logged metrics ``{version: {metric: ...}}``; text metrics logged there are not recomputed.
        split: which split to use (``train``).
    """
    import pandas as pd

    if table.num_rows == 0:
        return {}
    if "split" in table.column_names:
        table = table.filter(pc.equal(table.column("split"), split))
        if table.num_rows == 0:
            return {}
    names = table.column_names
    vcodes = _codes(table.column("version_id"))
    vnames = pc.dictionary_encode(table.column("version_id")).combine_chunks().dictionary.to_pylist()
    df = pd.DataFrame({
        "v": vcodes,
        "step": table.column("step").to_numpy().astype(np.int64),
        "g": _codes(table.column("group_id")),
        "r": table.column("reward").to_numpy().astype(np.float64),
    })
    if "length" in names:
        df["len"] = table.column("length").to_numpy().astype(np.float64)
    if "finish_reason" in names:
        df["clip"] = pc.equal(table.column("finish_reason"), "length").to_numpy(zero_copy_only=False).astype(np.float64)
    if "correct" in names:
        df["cor"] = table.column("correct").to_numpy().astype(np.float64)
    if "kept" in names:
        df["kept"] = table.column("kept").to_numpy(zero_copy_only=False).astype(np.float64)
    if "completion" in names and "prompt_id" in names:
        df["c"] = _codes(pc.utf8_trim_whitespace(table.column("completion")))
        df["p"] = _codes(table.column("prompt_id"))

    out: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    by = df.groupby(["v", "step"], sort=True)
    agg: dict[str, pd.Series] = {M.REWARD_MEAN: by["r"].mean(), M.REWARD_STD: by["r"].std(ddof=0)}
    grp = df.groupby(["v", "step", "g"], sort=False)["r"].agg(["max", "min"])
    zero = ((grp["max"] - grp["min"]) <= 1e-9).groupby(level=[0, 1]).mean()
    agg[M.REWARD_FRAC_ZERO_STD] = zero
    if "len" in df:
        agg[M.COMPLETIONS_MEAN_LENGTH] = by["len"].mean()
        agg[M.COMPLETIONS_P95_LENGTH] = by["len"].quantile(0.95)
        agg[M.COMPLETIONS_MAX_LENGTH] = by["len"].max()
    if "clip" in df:
        agg[M.COMPLETIONS_CLIPPED_RATIO] = by["clip"].mean()
    if "cor" in df and df["cor"].notna().any():
        agg[M.CORRECT_MEAN] = by["cor"].mean()
    if "kept" in df:
        agg[M.REWARD_KEPT_GROUP_FRAC] = df.groupby(["v", "step", "g"], sort=False)["kept"].max().groupby(level=[0, 1]).mean()
    if "c" in df:
        nprompts = df[["v", "step", "c", "p"]].drop_duplicates().groupby(["v", "step", "c"], sort=False).size()
        dup = df.join(nprompts.rename("np"), on=["v", "step", "c"])["np"] > 1
        agg[M.COMPLETIONS_DUPLICATE_FRAC] = dup.groupby([df["v"], df["step"]]).mean()
    for name, s in agg.items():
        s = s.dropna()
        vi = s.index.get_level_values(0).to_numpy()
        st = s.index.get_level_values(1).to_numpy().astype(np.int64)
        vals = s.to_numpy(dtype=np.float64)
        for code in np.unique(vi):
            m = vi == code
            out.setdefault(vnames[code], {})[name] = (st[m], vals[m])

    if "completion" in names:
        _text_metrics(table, df, vnames, out, skip or {}, text_steps, text_samples)
    return out


def _text_metrics(table: pa.Table, df: Any, vnames: list[str], out: dict, skip: dict, text_steps: int,
                  text_samples: int) -> None:
    """Distinct-2 and repetition on a sample of steps for versions that did not log them."""
    for code, vname in enumerate(vnames):
        logged = skip.get(vname, {})
        if M.COMPLETIONS_DISTINCT_2 in logged and M.COMPLETIONS_REPETITION in logged:
            continue
        rows = np.flatnonzero(df["v"].to_numpy() == code)
        if not len(rows):
            continue
        steps_all = df["step"].to_numpy()[rows]
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
