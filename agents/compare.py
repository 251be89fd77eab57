"""``evotrainer compare``: the modes at equal compute, scored on the sealed test split.

For each (mode, seed) it runs (or resumes) one run in ``OUT/runs/<mode>-s<seed>`` from the same config:
``config.seed = seed`` (the loop's choices) and ``recipe.seed = base recipe seed + seed`` (sampling and
training), the same data (problems) for every run. Every mode gets the same budget: a token budget
``budget.max_tokens`` (train + dev-eval generated tokens; derived when the config has none,
:func:`equal_budget`) and the wall clock, with ``max_versions`` lifted so the token budget binds. A finished run (kv ``loop/finished``) is skipped, an unfinished one resumed, so
re-running the command continues where it stopped. ``parallel > 1`` runs that many runs as separate
processes. Each run has its own skills memory (``RUN/skills``, seeded like a fresh install), so no run
learns from another seed's outcomes.

It then writes ``OUT/compare.json``, ``OUT/compare.md`` and ``OUT/compare.png``: per mode the test Avg@k
of its final version (mean over seeds, per seed), the compute spent (train / eval tokens, CPU-seconds,
wall), the no-RL row, and the paired bootstrap CI of the difference between every two modes on the same
test problems and sample seeds, pooled over seeds (:func:`evotrainer.harness.stats.pooled_paired_bootstrap`:
within one seed, every mode's final answer is evaluated on the same test problems with the same sample
seeds, so the outcomes pair problem by problem).

``compare.json`` also keeps every run's outcomes (``runs``: final version, test and no-RL test outcome matrices,
compute), so a later comparison can pair new runs with them instead of running those modes again
(``baseline``): a (mode, seed) with no finished run in ``out`` is taken from the baseline file when the file was made
on the same config name, data split, test k and token budget. That is sound only while the baseline mode's code
is unchanged; the table lists what came from the baseline (``from_baseline``) and the markdown says so.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from evotrainer.agents.loop import FINAL_SHAPE
from evotrainer.agents.modes import MODES
from evotrainer.agents.runner import run_loop
from evotrainer.config import RunConfig
from evotrainer.errors import EvoTrainerError
from evotrainer.harness.ingest_formats import read_capped
from evotrainer.harness.stats import avg_at_k, pooled_paired_bootstrap
from evotrainer.json_counts import comma_count, container_count
from evotrainer.jsonl import NumberTooLong, loads
from evotrainer.skills_db.store import SKILLS_DIR_ENV
from evotrainer.terminal import clip_text
from evotrainer.workspace import Workspace

NO_RL = "no-RL"
MODES_LITERAL = tuple(MODES)


class CompareError(EvoTrainerError, ValueError):
    """The comparison cannot run (unknown mode, no test split, bad seeds); the message says the fix."""


def equal_budget(config: Any) -> Any:
    """``config`` with a token budget every mode spends: its ``budget.max_tokens``, or when None the static
    mode's training tokens at most (``max_versions x steps_per_version x rollout_batch_size x
    n_samples_per_prompt x generate_max_len``; searching modes spend part of it on dev evaluations)."""
    b, r = config.budget, config.recipe
    if b.max_tokens is not None:
        return config
    cap = b.max_versions * b.steps_per_version * r.rollout_batch_size * r.n_samples_per_prompt * r.generate_max_len
    return config.model_copy(update={"budget": b.model_copy(update={"max_tokens": int(cap)})})


VERSION_HEADROOM = 4
"""compare lifts ``budget.max_versions`` by this factor so that the token budget, not the version count, is what
stops every mode (a searching version costs its training plus a dev evaluation, about twice a static segment)."""


COMPARE_WALL_CLOCK_MINUTES = 7 * 24 * 60.0
"""compare's wall clock (a week): the token budget is what every mode spends equally. A wall clock would make a
mode's result depend on how loaded the machine is (three runs side by side on two busy cores: two of them stopped
after their root version, at 28 minutes, with most of their tokens unspent)."""


def run_config(config: Any, mode: str, seed: int, out: Path) -> Any:
    """The config of one (mode, seed) run of the comparison: the equal token budget, ``max_versions`` lifted by
    :data:`VERSION_HEADROOM` (the static mode's step count stays the token budget's), the wall clock lifted to
    :data:`COMPARE_WALL_CLOCK_MINUTES`, the seeds moved."""
    cfg = equal_budget(config)
    recipe = config.recipe.model_copy(update={"seed": config.recipe.seed + seed})
    budget = cfg.budget.model_copy(update={"max_versions": cfg.budget.max_versions * VERSION_HEADROOM})
    if mode == "static":  # static trains segments until the token budget is spent: its version count is moot
        budget = cfg.budget
    budget = budget.model_copy(update={"wall_clock_minutes": COMPARE_WALL_CLOCK_MINUTES})
    return cfg.model_copy(update={"mode": mode, "seed": seed, "recipe": recipe, "budget": budget,
                                  "run_dir": str(out / "runs" / f"{mode}-s{seed}")})


def _finished(run_dir: Path) -> bool:
    if not (run_dir / "lineage.db").exists():
        return False
    ws = Workspace.open(run_dir)
    try:
        return bool(ws.lineage.kv_get("loop/finished"))
    finally:
        ws.close()


def _run_one(config_json: dict[str, Any], brain: str) -> dict[str, Any]:
    """Run (or resume) one run; in a worker process for ``parallel > 1``."""
    cfg = RunConfig.model_validate(config_json)
    rd = Path(cfg.run_dir)
    # each run starts from its own, freshly seeded skills memory: the seeds stay independent and reproducible,
    # and runs in parallel processes never write one LanceDB store at once
    before = os.environ.get(SKILLS_DIR_ENV)
    os.environ[SKILLS_DIR_ENV] = str(rd / "skills")
    try:
        return run_loop(cfg, rd, brain, cfg.mode, resume=(rd / "lineage.db").exists())
    finally:
        if before is None:
            os.environ.pop(SKILLS_DIR_ENV, None)
        else:
            os.environ[SKILLS_DIR_ENV] = before


def compare(config: Any, modes: list[str], seeds: list[int], out: str | Path, parallel: int = 1,
            brain: str = "heuristic", on_progress: Callable[[str, int, int], None] | None = None,
            baseline: str | Path | None = None) -> dict[str, Any]:
    """Run the comparison (resumable) and write its table and plot; returns the table (``compare.json``).

    Args:
        config: the run config (:class:`~evotrainer.config.RunConfig`); its recipe needs a test split.
        modes: run modes (:data:`evotrainer.agents.modes.MODES`).
        seeds: seeds, e.g. ``[0, 1, 2]``.
        out: output folder (runs under ``out/runs``).
        parallel: runs at a time, as separate processes (1: in this process). With more than one, a config's
            ``executor: auto`` becomes ``inline``: the runs already share the CPUs, and each loop's Ray branches would
            multiply the processes (and the memory) by ``max_parallel``.
        brain: the evotrainer mode's brain.
        on_progress: ``(run_name, done, total)`` after each run (the CLI's progress bar).
        baseline: a ``compare.json`` of an earlier comparison whose stored runs fill the (mode, seed) pairs this
            one has not run (:func:`load_baseline`); its modes join the table.

    Raises:
        CompareError: unknown mode, no seed, ``recipe.data.n_test`` is 0, or a baseline that cannot be read or was
            made on another config, data split, test k or budget.
    """
    base = load_baseline(baseline, config) if baseline is not None else None
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise CompareError(f"--modes {','.join(modes)}: unknown {', '.join(bad) or 'none given'}; allowed: "
                           f"{', '.join(MODES)}")
    if not seeds:
        raise CompareError("--seeds: give at least one seed, e.g. 0,1,2")
    if not config.recipe.data.n_test:
        raise CompareError("recipe.data.n_test is 0: compare scores each mode's final version on the test split; "
                           "set data.n_test (e.g. 100)")
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    if parallel > 1 and getattr(config, "executor", None) == "auto":
        config = config.model_copy(update={"executor": "inline"})
    jobs = [(m, s) for s in seeds for m in modes]
    todo = [(m, s) for m, s in jobs if not _finished(Path(run_config(config, m, s, out).run_dir))]
    done = len(jobs) - len(todo)
    if on_progress:
        on_progress("skipped finished runs", done, len(jobs))
    if parallel > 1 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=parallel, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(_run_one, run_config(config, m, s, out).model_dump(mode="json"), brain): (m, s)
                    for m, s in todo}
            for f in as_completed(futs):
                f.result()
                done += 1
                if on_progress:
                    m, s = futs[f]
                    on_progress(f"{m}-s{s}", done, len(jobs))
    else:
        for m, s in todo:
            _run_one(run_config(config, m, s, out).model_dump(mode="json"), brain)
            done += 1
            if on_progress:
                on_progress(f"{m}-s{s}", done, len(jobs))
    # the table covers every finished run in the folder, not only this invocation's: e.g. greedy and pbt run
    # on seed 0 alone next to three seeds of the others (a second `compare --modes greedy,pbt --seeds 0`)
    found = finished_runs(out)
    base_modes = {r["mode"] for r in base["runs"]} if base else set()
    modes = [m for m in MODES if m in modes or m in {fm for fm, _ in found} or m in base_modes]
    seeds = sorted(set(seeds) | {s for _, s in found})
    table = build_table(config, modes, seeds, out, baseline=base)
    if base is not None:
        table["baseline"] = str(baseline)
    write_outputs(table, out)
    return table


def _comparable(config: Any) -> dict[str, Any]:
    """What two comparisons must share for their runs to pair: config name, data split, test k, token budget."""
    return {"config": config.recipe.name, "data": config.recipe.data.model_dump(mode="json"),
            "test_k": config.test_k, "max_tokens": equal_budget(config).budget.max_tokens}


BASELINE_MAX_BYTES = 16 << 20
"""Bytes of a ``--baseline`` compare.json read (three seeds of five modes store well under 1 MB)."""

MAX_BASELINE_VALUES = 1 << 21
"""JSON values a ``--baseline`` file may hold, counted as its commas before it is parsed. compare.json is written with
``indent=2``, eight bytes or more a value, so a 16 MiB file EvoTrainer wrote holds at most about 2 million; review 16
(V-R16): 16 MiB of ``1,`` parsed into 5.6 million runs whose 5.6 million validation errors took 64.9 s and 7.32 GB."""

MAX_BASELINE_RUNS = 1000
"""Stored runs a ``--baseline`` may hold: five modes x 200 seeds (a comparison stores modes x seeds, 15 for three)."""

MAX_BASELINE_K = 1024
"""Outcomes stored per test problem: the largest ``test_k`` / ``eval.k`` a config accepts (one per sample)."""

MAX_BASELINE_COMPUTE_KEYS = 64
"""Counters in a stored run's ``compute`` (EvoTrainer writes six: tokens, CPU-seconds, wall)."""

MAX_ECHO_CHARS = 200
"""Characters of a value from the baseline file echoed in an error (a 16 MiB key or config name was printed whole)."""


def _echo(value: Any) -> str:
    """``repr(value)`` for an error message, cut to :data:`MAX_ECHO_CHARS` (the cut says how much)."""
    return clip_text(repr(value), MAX_ECHO_CHARS)


def _not_ours(path: str | Path, where: str, what: str) -> CompareError:
    return CompareError(f"--baseline {path}: {where}: {what}; not a compare.json EvoTrainer wrote: run those modes "
                        "again instead")


def _check_counts(path: str | Path, runs: list[Any], n_test: int) -> None:
    """Refuse stored runs past the caps by their lengths alone, before any is validated (a validation error is
    built for every bad value: millions of them took gigabytes). Shapes are left to :class:`_StoredRun`.

    Raises:
        CompareError: more than :data:`MAX_BASELINE_RUNS` runs, a test / no-RL outcome matrix of more problems than
            ``n_test`` (the config's test split, which the baseline's must equal), a problem of more than
            :data:`MAX_BASELINE_K` outcomes, or more than :data:`MAX_BASELINE_COMPUTE_KEYS` compute counters.
    """
    if len(runs) > MAX_BASELINE_RUNS:
        raise _not_ours(path, "runs", f"{len(runs)} stored runs, more than the {MAX_BASELINE_RUNS} (modes x seeds) "
                                      "a comparison stores")
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            continue
        for key in ("test", "no_rl_test"):
            matrix = run.get(key)
            if not isinstance(matrix, dict):
                continue
            if len(matrix) > n_test:
                raise _not_ours(path, f"runs[{i}][{key!r}]", f"{len(matrix)} problems, more than the {n_test} of "
                                                             "recipe.data.n_test")
            for pid, outcomes in matrix.items():
                if isinstance(outcomes, list) and len(outcomes) > MAX_BASELINE_K:
                    raise _not_ours(path, f"runs[{i}][{key!r}][{_echo(pid)}]", f"{len(outcomes)} outcomes, more "
                                    f"than the {MAX_BASELINE_K} samples (test k) a problem can have")
        compute = run.get("compute")
        if isinstance(compute, dict) and len(compute) > MAX_BASELINE_COMPUTE_KEYS:
            raise _not_ours(path, f"runs[{i}]['compute']", f"{len(compute)} counters, more than "
                                                           f"{MAX_BASELINE_COMPUTE_KEYS}")


def load_baseline(path: str | Path, config: Any) -> dict[str, Any]:
    """The ``compare.json`` at ``path``, checked to pair with ``config``'s runs.

    The file is read up to :data:`BASELINE_MAX_BYTES` and :data:`MAX_BASELINE_VALUES` JSON values (counted before
    parsing); its runs are counted against :func:`_check_counts`'s caps, then validated one by one (the first bad run
    is reported; values echoed are cut to :data:`MAX_ECHO_CHARS`).

    Raises:
        CompareError: the file cannot be read as a comparison with stored runs (one written before the runs were
            kept has none), it is past a cap (the field and the cap named), or it was made on another config name,
            data split, test k or budget (each named).
    """
    try:  # a regular file of at most BASELINE_MAX_BYTES, opened without blocking (review 15: a FIFO blocked forever,
        # /dev/zero grew to 13.8 GB, a 40 MB file took 822 MB)
        data = read_capped(Path(path), BASELINE_MAX_BYTES, "give the compare.json a comparison wrote")
        if comma_count(data) >= MAX_BASELINE_VALUES:  # counted before parsing builds the objects (V-R16)
            raise ValueError(f"more than {MAX_BASELINE_VALUES} JSON values (commas), more than a compare.json "
                             "EvoTrainer writes in 16 MiB")
        if container_count(data) >= MAX_BASELINE_VALUES:  # review 17 V-R17: nested
            # empty lists carry no comma (16 MiB of [[[[[[[[]]]]]]]] made 7.9 M lists: 4.49 s, 859 MB)
            raise ValueError(f"more than {MAX_BASELINE_VALUES} JSON containers and keys ('[', '{{', ':'), more than "
                             "a compare.json EvoTrainer writes in 16 MiB")
        base = loads(data)
    except NumberTooLong as exc:  # review 18 (M-R18): echoed Python's "Exceeds the limit (4300 digits)" advice
        raise CompareError(f"--baseline {path}: cannot be read as compare.json (line "
                           f"{exc.line_in(data.decode(errors='replace'))}: {exc})") from None
    except (OSError, ValueError, RecursionError) as exc:
        why = "JSON nested deeper than Python reads" if isinstance(exc, RecursionError) else clip_text(
            str(exc), MAX_ECHO_CHARS)
        raise CompareError(f"--baseline {path}: cannot be read as compare.json ({why})") from None
    if not isinstance(base, dict) or not isinstance(base.get("runs"), list) or not isinstance(base.get("comparable"),
                                                                                              dict):
        raise CompareError(f"--baseline {path}: holds no stored runs (a compare.json written before runs were kept, "
                           "or another file); run those modes again instead")
    want, got = _comparable(config), base["comparable"]
    differ = [k for k in want if want[k] != got.get(k)]
    if differ:
        raise CompareError(f"--baseline {path}: made on another " + ", ".join(
            f"{k} ({_echo(got.get(k))}, here {want[k]!r})" for k in differ) + "; its runs do not pair with these")
    # every stored run is checked here, before any run trains: build_table reads them after the runs (review 13,
    # B-R13: a run of another shape ended the command at its end in a raw TypeError / KeyError / OverflowError);
    # counted first, then validated one run at a time, so one bad run gives a bounded number of errors (V-R16)
    _check_counts(path, base["runs"], int(config.recipe.data.n_test))
    runs = []
    for i, raw in enumerate(base["runs"]):
        try:
            runs.append(_STORED_RUN.validate_python(raw))
        except ValidationError as exc:
            err = exc.errors(include_url=False, include_input=False, include_context=False)[0]
            where = f"runs[{i}]" + "".join(f"[{_echo(p)}]" if isinstance(p, str) else f"[{p}]" for p in err["loc"])
            raise _not_ours(path, where, f"{clip_text(err['msg'], MAX_ECHO_CHARS)} ({exc.error_count()} problem(s) "
                                         f"in runs[{i}])") from None
    return {**base, "runs": [r.model_dump() for r in runs]}


_Outcomes = Annotated[list[Annotated[float, Field(allow_inf_nan=False)]], Field(fail_fast=True)]


class _StoredRun(BaseModel):
    """One run of a ``compare.json``'s ``runs`` (what :func:`build_table` reads back)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    mode: Literal[MODES_LITERAL]  # type: ignore[valid-type]
    seed: int = Field(ge=0, le=2**31)
    version: str | None = None
    test: dict[str, _Outcomes] = Field(default_factory=dict)
    no_rl_test: dict[str, _Outcomes] = Field(default_factory=dict)
    compute: dict[str, Annotated[float, Field(allow_inf_nan=False)]] = Field(default_factory=dict)
    k: int | None = None


_STORED_RUN = TypeAdapter(_StoredRun)

# a run folder's seed: ASCII digits only (str.isdigit() also takes '²', which int() refuses: review 20 C2-R20),
# at most 9 of them (a seed EvoTrainer writes is small; a longer run of digits is no folder it made)
_SEED_RE = re.compile(r"[0-9]{1,9}")


def finished_runs(out: str | Path) -> list[tuple[str, int]]:
    """``(mode, seed)`` of every finished run under ``out/runs`` (folders ``<mode>-s<seed>``, kv
    ``loop/finished``), sorted."""
    found = []
    for d in sorted((Path(out) / "runs").glob("*-s*")):
        mode, _, seed = d.name.rpartition("-s")
        if mode in MODES and _SEED_RE.fullmatch(seed) and _finished(d):
            found.append((mode, int(seed)))
    return sorted(found)


def _run_outcomes(run_dir: Path) -> dict[str, Any]:
    """A finished run's final version, its test and no-RL test outcome matrices and its compute."""
    ws = Workspace.open(run_dir)
    try:
        final = ws.lineage.kv_get("loop/final", expected=FINAL_SHAPE) or {}
        vid, root = final.get("version"), ws.lineage.root()
        return {"version": vid, "test": ws.lineage.eval_matrix(vid, "test") if vid else {},
                "no_rl_test": ws.lineage.eval_matrix(root.id, "no_rl_test") if root else {},
                "compute": ws.lineage.kv_get("loop/compute", expected=dict) or {}, "k": (final.get("test") or {}).get("k")}
    finally:
        ws.close()


def build_table(config: Any, modes: list[str], seeds: list[int], out: Path, n_resamples: int = 10_000,
                baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    """The comparison table from the finished runs (see the module docstring for what it holds); a (mode, seed)
    with no finished run is taken from ``baseline`` (a checked ``compare.json``, :func:`load_baseline`) when it has
    it, else left out of its row and of the pairs that need it (a mode run on fewer seeds is paired with the others
    on its seeds only)."""
    done = set(finished_runs(out))
    empty: dict[str, Any] = {"version": None, "test": {}, "no_rl_test": {}, "compute": {}, "k": None}
    stored = {(r["mode"], int(r["seed"])): r for r in (baseline or {}).get("runs", [])}
    from_base = sorted(k for k in stored if k not in done and k[0] in modes and k[1] in seeds)
    runs = {(m, s): _run_outcomes(Path(run_config(config, m, s, out).run_dir)) if (m, s) in done
            else {k: stored[(m, s)].get(k, empty[k]) for k in empty} if (m, s) in from_base else empty
            for m in modes for s in seeds}
    done |= set(from_base)
    outcomes: dict[str, dict[int, dict[str, list[float]]]] = {m: {s: runs[(m, s)]["test"] for s in seeds}
                                                              for m in modes}
    # the no-RL row: the base model on the same test problems with the same sample seeds (same per seed)
    outcomes[NO_RL] = {s: next((runs[(m, s)]["no_rl_test"] for m in modes if runs[(m, s)]["no_rl_test"]), {})
                       for s in seeds}
    rows = []
    for m in [*modes, NO_RL]:
        per_seed = {s: avg_at_k(outcomes[m][s]) for s in seeds if outcomes[m][s]}
        comp = [runs[(m, s)]["compute"] for s in seeds if (m, s) in done]

        def mean(key: str, comp: list[dict[str, Any]] = comp) -> float | None:
            return float(np.mean([c.get(key, 0) for c in comp])) if comp else None

        rows.append({"mode": m, "test_avg_at_k": float(np.mean(list(per_seed.values()))) if per_seed else None,
                     "per_seed": {str(s): v for s, v in per_seed.items()},
                     "final_versions": {str(s): runs[(m, s)]["version"] for s in seeds if (m, s) in done},
                     "train_tokens": mean("train_tokens"), "eval_tokens": mean("eval_tokens"),
                     "test_tokens": mean("test_tokens"), "cpu_s": mean("cpu_s"), "wall_s": mean("wall_s")})
    pairs = []
    names = [*modes, NO_RL]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            groups = [(outcomes[b][s], outcomes[a][s]) for s in seeds if outcomes[a][s] and outcomes[b][s]]
            if not groups:
                continue
            c = pooled_paired_bootstrap(groups, n_resamples=n_resamples)
            pairs.append({"a": a, "b": b, "diff": c.gain, "ci": list(c.ci), "n_pairs": c.n_pairs,
                          "n_seeds": c.n_groups, "a_score": c.score_b, "b_score": c.score_a})
    k = next((r["k"] for r in runs.values() if r.get("k")), None)
    return {"config": config.recipe.name, "modes": modes, "seeds": seeds, "k": k,
            "n_test": config.recipe.data.n_test, "max_tokens": equal_budget(config).budget.max_tokens,
            "comparable": _comparable(config), "from_baseline": [list(key) for key in from_base],
            "rows": rows, "pairs": pairs,
            "runs": [{"mode": m, "seed": s, **runs[(m, s)]} for m in modes for s in seeds if (m, s) in done],
            "points": [{"mode": m, "seed": s, "test_avg_at_k": avg_at_k(runs[(m, s)]["test"]) if runs[(m, s)]["test"]
                        else None, "tokens": (runs[(m, s)]["compute"].get("train_tokens", 0)
                                              + runs[(m, s)]["compute"].get("eval_tokens", 0))}
                       for m in modes for s in seeds if (m, s) in done]}


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(table: dict[str, Any]) -> str:
    """The table as markdown: one row per mode (test Avg@k, per seed, compute), then the paired differences."""
    k = table.get("k") or "k"
    lines = [f"# compare: {table['config']}, seeds {', '.join(map(str, table['seeds']))}", "",
             f"Test Avg@{k} of each mode's final version on {table['n_test']} test problems (sealed during the "
             f"runs); budget {table['max_tokens']} generated tokens (train + dev eval) per run.", "",
             f"| mode | test Avg@{k} | per seed | train tokens | eval tokens | CPU-s | wall-s |",
             "|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        per = ", ".join(f"s{s}: {v:.3f}" for s, v in r["per_seed"].items())
        lines.append(f"| {r['mode']} | {_fmt(r['test_avg_at_k'])} | {per} | {_fmt(r['train_tokens'], '.0f')} | "
                     f"{_fmt(r['eval_tokens'], '.0f')} | {_fmt(r['cpu_s'], '.0f')} | {_fmt(r['wall_s'], '.0f')} |")
    if table.get("from_baseline"):
        lines += ["", f"Taken from the baseline {table.get('baseline', 'file')} (not run again; sound while those "
                      "modes' code is unchanged): " + ", ".join(f"{m} s{s}" for m, s in table["from_baseline"]) + "."]
    lines += ["", "Paired differences (a minus b) on the same test problems and sample seeds, pooled over seeds, "
                  "95% stratified bootstrap CI:", "", "| a | b | a - b | 95% CI | pairs |", "|---|---|---|---|---|"]
    for p in table["pairs"]:
        lines.append(f"| {p['a']} | {p['b']} | {p['diff']:+.3f} | [{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}] | "
                     f"{p['n_pairs']} |")
    return "\n".join(lines) + "\n"


def plot(table: dict[str, Any], path: Path) -> Path:
    """Test Avg@k against compute spent (train + dev-eval tokens), one point per run, the no-RL row as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in table["modes"]:
        pts = [p for p in table["points"] if p["mode"] == m and p["test_avg_at_k"] is not None]
        ax.scatter([p["tokens"] for p in pts], [p["test_avg_at_k"] for p in pts], label=m)
    no_rl = next((r["test_avg_at_k"] for r in table["rows"] if r["mode"] == NO_RL), None)
    if no_rl is not None:
        ax.axhline(no_rl, color="grey", linestyle="--", label=NO_RL)
    ax.set_xlabel("compute spent (generated tokens: train + dev eval)")
    ax.set_ylabel(f"test Avg@{table.get('k') or 'k'}")
    ax.set_title(f"{table['config']}: test score vs compute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(table: dict[str, Any], out: Path) -> dict[str, Path]:
    """``compare.json``, ``compare.md`` and ``compare.png`` in ``out``."""
    paths = {"json": out / "compare.json", "md": out / "compare.md", "png": out / "compare.png"}
    paths["json"].write_text(json.dumps(table, indent=2) + "\n")
    paths["md"].write_text(markdown(table))
    plot(table, paths["png"])
    return paths
