"""Rollout-inspection tools over the run's rollout store (LanceDB; DuckDB for filters and aggregates).

Tools: ``sample_rollouts`` (filters: version, split, step range, reward range, finish reason,
zero-variance group, substring), ``get_group``, ``group_stats``, ``search_rollouts`` (full-text,
BM25), ``compare_versions`` (the same prompts side by side). A group is the G samples of one prompt
at one step: key ``(version_id, split, step, group_id)``. All SQL takes bound parameters.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from evotrainer.servers.common import (
    MAX_LIMIT,
    Page,
    ToolContext,
    page_fields,
    require_version,
    state_of,
)
from evotrainer.terminal import clip_text
from evotrainer.workspace import Workspace

Split = Literal["train", "eval"]
SEARCH_WINDOW = 200  # ranked full-text hits fetched per search_rollouts call (pages slice this window)
MaxChars = Annotated[int, Field(description="Cut prompts and completions to this many characters (0 = no cut).",
                                ge=0, le=100000)]


class Rollout(BaseModel):
    """One sampled completion with its reward and group context."""

    rollout_id: str = Field(description="<version>/<split>/<step>/<group>/<sample>")
    version_id: str
    split: str
    step: int
    group_id: str
    sample_idx: int
    prompt_id: str
    prompt: str
    completion: str
    answer: str
    reward: float
    components: dict[str, float] = Field(description="Unweighted reward components.")
    correct: float | None = Field(description="1 / 0 when the answer was checked, null when unknown.")
    advantage: float
    length: int = Field(description="Completion tokens.")
    finish_reason: str = Field(description="eos | length | submit | budget | error")
    kept: bool = Field(description="The group was kept by the group filter.")
    score: float | None = Field(None, description="BM25 score (search_rollouts only).")


class RolloutList(Page):
    """A page of rollouts."""

    rollouts: list[Rollout]


class GroupView(BaseModel):
    """The samples of one prompt at one step, with the group's reward statistics."""

    version_id: str
    split: str
    step: int
    group_id: str
    prompt: str
    answer: str
    reward_mean: float
    reward_std: float = Field(description="Population std of the group's rewards.")
    zero_variance: bool = Field(description="All rewards equal: GRPO advantages are all zero.")
    rollouts: list[Rollout] = Field(description="A page of the group's samples by sample index (``limit`` from "
                                                "``offset``); the statistics are over all of them.")
    total: int = Field(0, description="Samples in the group.")
    offset: int = 0
    next_offset: int | None = Field(None, description="Where the next page starts; None on the last.")


class StepGroupStats(BaseModel):
    """Group statistics of one training step."""

    step: int
    n_groups: int
    n_rollouts: int
    frac_zero_variance: float = Field(description="Fraction of groups whose rewards are all equal.")
    reward_mean: float
    mean_group_std: float = Field(description="Mean over groups of the within-group reward std.")
    correct_mean: float | None
    mean_length: float = Field(description="Tokens.")
    truncation_rate: float = Field(description="Fraction of rollouts with finish_reason 'length'.")


class GroupStats(Page):
    """Per-step group statistics of a version (paginated over steps) and the totals."""

    version_id: str
    split: str
    n_groups: int
    frac_zero_variance: float
    steps: list[StepGroupStats]


class PromptSide(BaseModel):
    """One version's samples on one prompt."""

    n: int
    reward_mean: float
    correct_mean: float | None
    completions: list[str]


class PromptComparison(BaseModel):
    """Two versions on the same prompt."""

    prompt_id: str
    prompt: str
    answer: str
    a: PromptSide
    b: PromptSide


class VersionComparison(Page):
    """Two versions side by side on the prompts both answered, most different first."""

    version_a: str
    version_b: str
    split: str
    n_common_prompts: int
    reward_mean_a: float
    reward_mean_b: float
    prompts: list[PromptComparison]


# --- helpers -------------------------------------------------------------------------------------
def _f(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def to_rollout(r: dict[str, Any], max_chars: int) -> Rollout:
    """A :class:`Rollout` from a store row, texts cut to ``max_chars``."""
    try:
        comps = {k: float(v) for k, v in json.loads(r.get("components") or "{}").items()}
    except (ValueError, TypeError, AttributeError):
        comps = {}
    return Rollout(
        rollout_id=r["rollout_id"], version_id=r["version_id"], split=r["split"], step=int(r["step"]),
        group_id=str(r["group_id"]), sample_idx=int(r["sample_idx"]), prompt_id=str(r["prompt_id"]),
        prompt=clip_text(r["prompt"], max_chars), completion=clip_text(r["completion"], max_chars),
        answer=str(r.get("answer") or ""), reward=float(r["reward"]), components=comps, correct=_f(r.get("correct")),
        advantage=float(r.get("advantage") or 0.0), length=int(r.get("length") or 0),
        finish_reason=str(r.get("finish_reason") or ""), kept=bool(r.get("kept")),
        score=_f(r.get("_score")))


def duck(ws: Workspace, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    """Run DuckDB ``sql`` with bound ``params`` over the run's rollouts (a consistent Lance snapshot)."""
    import duckdb  # heavy third-party engine: loaded on the first query, not at server start

    rollouts = ws.rollouts.to_arrow()
    con = duckdb.connect()
    try:
        con.register("rollouts", rollouts)
        res = con.execute(sql, params or [])
        names = [d[0] for d in res.description]
        return [dict(zip(names, row, strict=True)) for row in res.fetchall()]
    finally:
        con.close()


def _range(lo: float | None, hi: float | None, what: str) -> None:
    if lo is not None and hi is not None and lo > hi:
        raise ToolError(f"{what}_min={lo} > {what}_max={hi}: give min <= max")


def sample_rollouts(
    ctx: ToolContext,
    version_id: Annotated[str | None, Field(description="Only this version (default: all).")] = None,
    split: Annotated[Split | None, Field(description="train (GRPO rollouts) or eval (held-out samples).")] = None,
    step_min: Annotated[int | None, Field(description="First training step (inclusive).", ge=0)] = None,
    step_max: Annotated[int | None, Field(description="Last training step (inclusive).", ge=0)] = None,
    reward_min: Annotated[float | None, Field(description="Lowest total reward (inclusive).")] = None,
    reward_max: Annotated[float | None, Field(description="Highest total reward (inclusive).")] = None,
    finish_reason: Annotated[Literal["eos", "length", "submit", "budget", "error"] | None, Field(
        description="Only rollouts that ended this way ('length' = truncated at generate_max_len).")] = None,
    zero_variance_group: Annotated[bool | None, Field(
        description="true: only groups whose rewards are all equal; false: only groups with variance.")] = None,
    text: Annotated[str | None, Field(description="Case-insensitive substring of prompt or completion.",
                                      max_length=500)] = None,
    seed: Annotated[int | None, Field(description="Random order with this seed (default: by version, step, "
                                                   "group, sample).")] = None,
    offset: Annotated[int, Field(description="Index of the first rollout to return.", ge=0)] = 0,
    limit: Annotated[int, Field(description="Rollouts per page.", ge=1, le=MAX_LIMIT)] = 20,
    max_chars: MaxChars = 2000,
) -> RolloutList:
    """Sample rollouts matching filters (version, split, step and reward ranges, finish reason,
    zero-variance groups, text), paginated."""
    ws = state_of(ctx).workspace()
    if version_id is not None:
        require_version(ws, version_id)
    _range(step_min, step_max, "step")
    _range(reward_min, reward_max, "reward")
    conds, params = [], []
    for col, op, val in (("version_id", "=", version_id), ("split", "=", split), ("step", ">=", step_min),
                         ("step", "<=", step_max), ("reward", ">=", reward_min), ("reward", "<=", reward_max),
                         ("finish_reason", "=", finish_reason)):
        if val is not None:
            conds.append(f"r.{col} {op} ?")
            params.append(val)
    if text:
        conds.append("(contains(lower(r.prompt), lower(?)) OR contains(lower(r.completion), lower(?)))")
        params += [text, text]
    if zero_variance_group is not None:
        conds.append("g.spread " + ("= 0" if zero_variance_group else "> 0"))
    where = ("WHERE " + " AND ".join(conds)) if conds else ""
    order = "hash(r.rollout_id || ?)" if seed is not None else "r.version_id, r.step, r.group_id, r.sample_idx"
    base = ("FROM rollouts r JOIN (SELECT version_id, split, step, group_id, MAX(reward) - MIN(reward) AS spread "
            "FROM rollouts GROUP BY ALL) g USING (version_id, split, step, group_id) " + where)
    total = duck(ws, f"SELECT COUNT(*) AS n {base}", params)[0]["n"]
    rows = duck(ws, f"SELECT r.* {base} ORDER BY {order} LIMIT ? OFFSET ?",
                params + ([str(seed)] if seed is not None else []) + [limit, offset])
    return RolloutList(rollouts=[to_rollout(r, max_chars) for r in rows], **page_fields(total, offset, len(rows)))


def get_group(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="Version id.")],
    step: Annotated[int, Field(description="Training step (eval samples use step 0).", ge=0)],
    group_id: Annotated[str, Field(description="Group id (a rollout id's 4th part).")],
    split: Annotated[Split, Field(description="train or eval.")] = "train",
    max_chars: MaxChars = 2000,
    offset: Annotated[int, Field(description="Index of the first sample returned.", ge=0)] = 0,
    limit: Annotated[int, Field(description="Samples per page.", ge=1, le=MAX_LIMIT)] = 100,
) -> GroupView:
    """The samples of one group (one prompt at one step), a page at a time, with the reward mean and std of the
    whole group. Review 14 Q-R14: a verl dump of one prompt made one group of 200,000 samples, and get_group answered
    all of them (16.7 s, 172 MiB, a 9.9 s stall)."""
    ws = state_of(ctx).workspace()
    require_version(ws, version_id)
    key = [version_id, split, step, group_id]
    cond = "version_id = ? AND split = ? AND step = ? AND group_id = ?"
    agg = duck(ws, f"SELECT COUNT(*) AS n, AVG(reward) AS mean, STDDEV_POP(reward) AS std, MIN(reward) AS lo, "
                   f"MAX(reward) AS hi FROM rollouts WHERE {cond}", key)[0]
    if not agg["n"]:
        raise ToolError(f"no group {group_id!r} at step {step} of {version_id} ({split}); take the key from a "
                        "rollout id <version>/<split>/<step>/<group>/<sample> (sample_rollouts)")
    rows = duck(ws, f"SELECT * FROM rollouts WHERE {cond} ORDER BY sample_idx LIMIT ? OFFSET ?", [*key, limit, offset])
    first = rows[0] if rows else duck(ws, f"SELECT prompt, answer FROM rollouts WHERE {cond} LIMIT 1", key)[0]
    return GroupView(version_id=version_id, split=split, step=step, group_id=group_id,
                     prompt=clip_text(str(first["prompt"]), max_chars), answer=str(first["answer"] or ""),
                     reward_mean=float(agg["mean"]), reward_std=float(agg["std"] or 0.0),
                     zero_variance=agg["hi"] == agg["lo"], rollouts=[to_rollout(r, max_chars) for r in rows],
                     **page_fields(int(agg["n"]), offset, len(rows)))


def group_stats(
    ctx: ToolContext,
    version_id: Annotated[str, Field(description="Version id.")],
    split: Annotated[Split, Field(description="train or eval.")] = "train",
    step_min: Annotated[int | None, Field(description="First step (inclusive).", ge=0)] = None,
    step_max: Annotated[int | None, Field(description="Last step (inclusive).", ge=0)] = None,
    offset: Annotated[int, Field(description="Index of the first step row.", ge=0)] = 0,
    limit: Annotated[int, Field(description="Step rows per page.", ge=1, le=MAX_LIMIT)] = 100,
) -> GroupStats:
    """Per-step group statistics of a version: groups, zero-variance fraction, within-group reward std,
    correctness, length, truncation rate."""
    ws = state_of(ctx).workspace()
    require_version(ws, version_id)
    _range(step_min, step_max, "step")
    conds, params = ["version_id = ?", "split = ?"], [version_id, split]
    if step_min is not None:
        conds.append("step >= ?")
        params.append(step_min)
    if step_max is not None:
        conds.append("step <= ?")
        params.append(step_max)
    groups = (f"SELECT step, group_id, COUNT(*) AS n, AVG(reward) AS rmean, STDDEV_POP(reward) AS rstd, "
              f"MAX(reward) = MIN(reward) AS zv, AVG(correct) FILTER (WHERE NOT isnan(correct)) AS cmean, "
              f"AVG(length) AS len, AVG(CASE WHEN finish_reason = 'length' THEN 1.0 ELSE 0.0 END) AS trunc "
              f"FROM rollouts WHERE {' AND '.join(conds)} GROUP BY step, group_id")
    per_step = duck(ws, f"SELECT step, COUNT(*) AS n_groups, SUM(n) AS n_rollouts, AVG(zv::DOUBLE) AS fzv, "
                        f"SUM(rmean * n) / SUM(n) AS rmean, AVG(rstd) AS gstd, AVG(cmean) AS cmean, "
                        f"SUM(len * n) / SUM(n) AS len, SUM(trunc * n) / SUM(n) AS trunc "
                        f"FROM ({groups}) GROUP BY step ORDER BY step", params)
    n_groups = sum(int(r["n_groups"]) for r in per_step)
    fzv = (sum(r["fzv"] * r["n_groups"] for r in per_step) / n_groups) if n_groups else 0.0
    page = per_step[offset:offset + limit]
    return GroupStats(
        version_id=version_id, split=split, n_groups=n_groups, frac_zero_variance=fzv,
        steps=[StepGroupStats(step=r["step"], n_groups=r["n_groups"], n_rollouts=r["n_rollouts"],
                              frac_zero_variance=r["fzv"], reward_mean=r["rmean"], mean_group_std=r["gstd"],
                              correct_mean=_f(r["cmean"]), mean_length=r["len"], truncation_rate=r["trunc"])
               for r in page],
        **page_fields(len(per_step), offset, len(page)))


def search_rollouts(
    ctx: ToolContext,
    query: Annotated[str, Field(description="Words to find in prompts and completions (full-text, BM25).",
                                min_length=1, max_length=500)],
    version_id: Annotated[str | None, Field(description="Only this version.")] = None,
    split: Annotated[Split | None, Field(description="Only this split.")] = None,
    offset: Annotated[int, Field(description="Index of the first result.", ge=0, le=10_000)] = 0,
    limit: Annotated[int, Field(description="Results, best first.", ge=1, le=MAX_LIMIT)] = 20,
    max_chars: MaxChars = 2000,
) -> RolloutList:
    """Full-text search over rollout prompts and completions, best match first (each row has a score)."""
    ws = state_of(ctx).workspace()
    conds = []
    if version_id is not None:
        require_version(ws, version_id)
        conds.append(f"version_id = '{version_id.replace(chr(39), chr(39) * 2)}'")
    if split is not None:
        conds.append(f"split = '{split}'")
    # one candidate window for every page up to 200 results, ties broken by id: pages are stable
    window = max(SEARCH_WINDOW, offset + limit + 1)
    rows = sorted(ws.rollouts.search(query, where=" AND ".join(conds) or None, limit=window),
                  key=lambda r: (-float(r.get("_score") or 0.0), r["rollout_id"]))
    page = rows[offset:offset + limit]
    # total: the ranked hits fetched (at most the window; more may exist beyond it)
    return RolloutList(rollouts=[to_rollout(r, max_chars) for r in page],
                       **page_fields(len(rows), offset, len(page)))


def compare_versions(
    ctx: ToolContext,
    version_a: Annotated[str, Field(description="First version id, or 'no-rl' (alias 'base') for the root's "
                                                "no-RL base-model evaluation.")],
    version_b: Annotated[str, Field(description="Second version id, or 'no-rl' / 'base'.")],
    split: Annotated[Split, Field(description="eval (held-out samples, the same prompts by design) or train.")]
    = "eval",
    samples_per_side: Annotated[int, Field(description="Completions shown per version and prompt.", ge=0,
                                           le=16)] = 2,
    offset: Annotated[int, Field(description="Index of the first prompt.", ge=0)] = 0,
    limit: Annotated[int, Field(description="Prompts per page.", ge=1, le=MAX_LIMIT)] = 10,
    max_chars: MaxChars = 600,
) -> VersionComparison:
    """Two versions side by side on the prompts both answered (largest reward difference first): reward,
    correctness and sample completions of each. 'no-rl' (or 'base') names the no-RL base-model
    evaluation of the root, kept apart from the root's own held-out samples."""
    ws = state_of(ctx).workspace()
    where_a, args_a = _compare_side(ws, version_a, split)
    where_b, args_b = _compare_side(ws, version_b, split)

    def per(where: str) -> str:
        return ("SELECT prompt_id, ANY_VALUE(prompt) AS prompt, ANY_VALUE(answer) AS answer, COUNT(*) AS n, "
                "AVG(reward) AS rmean, AVG(correct) FILTER (WHERE NOT isnan(correct)) AS cmean, "
                f"LIST(completion ORDER BY step, sample_idx) AS comps FROM rollouts WHERE {where} "
                "GROUP BY prompt_id")

    rows = duck(ws, f"SELECT a.prompt_id, a.prompt, a.answer, a.n AS an, a.rmean AS ar, a.cmean AS ac, "
                    f"a.comps AS acomps, b.n AS bn, b.rmean AS br, b.cmean AS bc, b.comps AS bcomps "
                    f"FROM ({per(where_a)}) a JOIN ({per(where_b)}) b USING (prompt_id) "
                    f"ORDER BY abs(a.rmean - b.rmean) DESC, a.prompt_id",
                [*args_a, *args_b])
    if not rows:
        raise ToolError(f"{version_a} and {version_b} share no prompts in split {split!r}; evaluate both "
                        "(evaluate_version) or compare split='train' rollouts")
    n_a, n_b = sum(r["an"] for r in rows), sum(r["bn"] for r in rows)
    ra = sum(r["ar"] * r["an"] for r in rows) / n_a
    rb = sum(r["br"] * r["bn"] for r in rows) / n_b
    page = rows[offset:offset + limit]

    def side(n: int, rm: float, cm: Any, comps: list[str]) -> PromptSide:
        return PromptSide(n=n, reward_mean=rm, correct_mean=_f(cm),
                          completions=[clip_text(c, max_chars) for c in comps[:samples_per_side]])

    return VersionComparison(
        version_a=version_a, version_b=version_b, split=split, n_common_prompts=len(rows),
        reward_mean_a=ra, reward_mean_b=rb,
        prompts=[PromptComparison(prompt_id=r["prompt_id"], prompt=clip_text(r["prompt"], max_chars),
                                  answer=str(r["answer"] or ""), a=side(r["an"], r["ar"], r["ac"], r["acomps"]),
                                  b=side(r["bn"], r["br"], r["bc"], r["bcomps"])) for r in page],
        **page_fields(len(rows), offset, len(page)))


# The no-RL base-model evaluation is stored as eval rollouts of the root whose group ids are
# ``no_rl-<prompt>`` (rl_backend.local / rl_backend.swe.train: eval group ids are ``<eval_name>-<prompt>``).
NO_RL_NAMES = ("no-rl", "base")
NO_RL_GROUPS = "no_rl-%"


def _compare_side(ws: Workspace, version_id: str, split: str) -> tuple[str, list[Any]]:
    """SQL condition and parameters selecting one side of ``compare_versions``.

    A version's eval side leaves out the no-RL evaluation (stored under the root's id); ``no-rl`` /
    ``base`` selects only it.

    Raises:
        ToolError: unknown version; ``no-rl`` with ``split='train'``, or on a run without a no-RL evaluation.
    """
    if version_id.lower() in NO_RL_NAMES:
        root = ws.lineage.root()
        if split != "eval":
            raise ToolError(f"{version_id!r} is the no-RL base-model evaluation: it has eval rollouts only; "
                            "use split='eval'")
        if root is None or not duck(ws, "SELECT 1 FROM rollouts WHERE version_id = ? AND split = 'eval' AND "
                                        "group_id LIKE ? LIMIT 1", [root.id, NO_RL_GROUPS]):
            raise ToolError(f"{version_id!r}: this run has no no-RL base-model evaluation; run "
                            "evaluate_version(version_id=<root>, eval_name='no_rl') first")
        return "version_id = ? AND split = 'eval' AND group_id LIKE ?", [root.id, NO_RL_GROUPS]
    require_version(ws, version_id)
    if split == "eval":
        return "version_id = ? AND split = 'eval' AND group_id NOT LIKE ?", [version_id, NO_RL_GROUPS]
    return "version_id = ? AND split = ?", [version_id, split]


TOOLS = (sample_rollouts, get_group, group_stats, search_rollouts, compare_versions)
"""The rollout-inspection tools, in catalogue order."""
