"""CLI: ``evotrainer swe tasks|check|episodes`` (the SWE tool-use domain).

- ``swe tasks [--json]``: the shipped generated tasks (or ``--taskset DIR``).
- ``swe check --policy oracle|noop|cheat|loop [--json]``: scripted policies over the tasks in the
  sandbox; prints each policy's mean hidden-test reward, mean total reward (with the behaviour
  penalties of :data:`CHECK_REWARD`), the tool-use metrics and the analyzers' findings.
- ``swe episodes --model NAME``: a model plays a few episodes; trajectories (turns, token counts,
  mask sizes, outcome) are written as JSON lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

CHECK_REWARD = {"swe_tests": {"weight": 1.0}, "test_file_edit": {"weight": 0.5},
                "tool_budget": {"weight": 0.2}, "submit_without_test": {"weight": 0.1}}
"""Reward spec of ``swe check``: hidden tests plus the three behaviour penalties (weights)."""

swe_app = typer.Typer(help="SWE tasks: multi-turn tool-use episodes in sandboxed repositories.",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``swe`` command group to the main app."""
    app.add_typer(swe_app, name="swe")


def _fail(msg: str) -> None:
    from evotrainer.cli import fail
    from evotrainer.terminal import neutralise

    fail(neutralise(msg))  # messages quote task-set fields: a hostile task set's ESC is shown, not obeyed


def _cell(value: Any) -> Any:
    """A table cell for text from a task set: control characters shown as ``\\xNN``, no rich markup read."""
    from rich.text import Text

    from evotrainer.terminal import neutralise

    return Text(neutralise(str(value)))


def _select(taskset: Path | None, tasks: str | None, limit: int | None) -> list[Any]:
    from evotrainer.rl_backend.swe.tasks import TASKSET_DIR, SweTaskError, load_taskset

    try:
        all_tasks = load_taskset(taskset or TASKSET_DIR)
    except SweTaskError as exc:
        _fail(str(exc))
    if tasks:
        want = [t.strip() for t in tasks.split(",") if t.strip()]
        known = {t.instance_id: t for t in all_tasks}
        bad = [w for w in want if w not in known]
        if bad:
            _fail(f"--tasks: unknown task id(s) {bad}; list them with `evotrainer swe tasks`")
        all_tasks = [known[w] for w in want]
    return all_tasks[:limit] if limit else all_tasks


TasksetOpt = Annotated[Path | None, typer.Option("--taskset", help="Task set folder (default: the shipped set).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@swe_app.command("tasks")
def tasks_cmd(taskset: TasksetOpt = None, as_json: JsonOpt = False) -> None:
    """List the SWE tasks: id, project, bugged file and line, mutation, hidden test counts.

    Text from the task set is printed with control characters shown as \\xNN (never obeyed by the
    terminal) and without rich markup; --json escapes them as JSON does.
    """
    from rich.table import Table

    from evotrainer.cli import console, print_json
    from evotrainer.rl_backend.swe.tasks import TASKSET_DIR, load_manifest

    ts = _select(taskset, None, None)
    if as_json:
        print_json({"manifest": {k: v for k, v in load_manifest(taskset or TASKSET_DIR).items() if k != "sources"},
                    "tasks": [{"instance_id": t.instance_id, "repo": t.repo, "file": t.bug.path if t.bug else None,
                               "line": t.meta.get("line"), "operator": t.bug.operator if t.bug else None,
                               "fail_to_pass": len(t.FAIL_TO_PASS), "pass_to_pass": len(t.PASS_TO_PASS)}
                              for t in ts]})
        return
    table = Table("task", "project", "bug at", "mutation", "F2P", "P2P", title=f"{len(ts)} SWE tasks")
    for t in ts:  # every field comes from the task set, which anyone can write: printed through _cell
        where = f"{t.bug.path}:{t.meta.get('line', '?')}" if t.bug else "-"
        table.add_row(*map(_cell, (t.instance_id, t.repo, where, t.bug.operator if t.bug else "-",
                                   len(t.FAIL_TO_PASS), len(t.PASS_TO_PASS))))
    console.print(table)


def check_policy(kind: str, tasks: list[Any], limits: Any, taskset_root: Path, progress: Any = None
                 ) -> dict[str, Any]:
    """Run one scripted policy over ``tasks``; returns rewards, metrics, findings and per-episode rows."""
    import pyarrow as pa

    from evotrainer.harness.analyzers import run_analyzers
    from evotrainer.harness.evidence import Evidence
    from evotrainer.rl_backend.rewards import compute_rewards
    from evotrainer.rl_backend.swe.episode import (
        episode_extras,
        episode_metrics,
        episode_record,
        run_episodes,
    )
    from evotrainer.rl_backend.swe.policies import ScriptedPolicy
    from evotrainer.rl_backend.tasks import Problem
    from evotrainer.rollouts import SCHEMA

    eps = run_episodes(tasks, ScriptedPolicy(kind, tasks, taskset_root), limits=limits, taskset_root=taskset_root,
                       progress=progress, skip_unchanged=False)
    by_id = {t.instance_id: t for t in tasks}
    problems = [Problem(id=e.task_id, prompt=by_id[e.task_id].problem_statement, answer=e.task_id,
                        meta={"task": "swe"}) for e in eps]
    rew = compute_rewards(CHECK_REWARD, problems, [e.transcript() for e in eps],
                          finish_reasons=[e.finish_reason for e in eps], lengths=[e.policy_tokens for e in eps],
                          generate_max_len=1, extras=episode_extras(eps))
    version = f"check-{kind}"
    rows = [episode_record(e, version_id=version, step=0, group_id=str(i), reward=rew.total[i],
                           components={c: v[i] for c, v in rew.components.items()}, split="eval")
            for i, e in enumerate(eps)]
    ev = Evidence(rollouts=pa.Table.from_pylist(rows, schema=SCHEMA), source=f"swe check {kind}")
    findings = run_analyzers(ev, names=["swe_hacking", "swe_behaviour"])
    n = len(eps)
    return {"policy": kind, "episodes": n,
            "mean_swe_tests": sum(e.outcome.swe_tests for e in eps) / n,
            "mean_reward": sum(rew.total) / n,
            "metrics": episode_metrics(eps),
            "findings": [f.model_dump() for f in findings],
            "per_task": [{"task": e.task_id, "swe_tests": e.outcome.swe_tests, "reward": rew.total[i],
                          "finish_reason": e.finish_reason, "stop": e.stats["stop_reason"],
                          "test_files_edited": e.outcome.test_files_edited,
                          "collection_error": e.outcome.collection_error, "seconds": e.seconds}
                         for i, e in enumerate(eps)]}


@swe_app.command("check")
def check_cmd(
    policy: Annotated[list[str] | None, typer.Option("--policy", help="oracle | noop | cheat | loop (repeatable).")] = None,
    tasks: Annotated[str | None, typer.Option("--tasks", help="Comma-separated task ids (default: all).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Use the first N tasks.")] = None,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="tool_use.max_turns.")] = 8,
    tool_budget: Annotated[int, typer.Option("--tool-budget", min=1, help="tool_use.tool_budget.")] = 12,
    taskset: TasksetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run scripted policies over the tasks in the sandbox: mean rewards, tool-use metrics, findings."""
    from rich.progress import Progress
    from rich.table import Table

    from evotrainer.cli import console, err_console, print_json
    from evotrainer.recipe import ToolUseSpec
    from evotrainer.rl_backend.swe.policies import SCRIPTED
    from evotrainer.rl_backend.swe.tasks import TASKSET_DIR

    kinds = policy or list(SCRIPTED)
    bad = [k for k in kinds if k not in SCRIPTED]
    if bad:
        _fail(f"--policy {bad[0]!r}: choose from {', '.join(SCRIPTED)}")
    ts = _select(taskset, tasks, limit)
    limits = ToolUseSpec(max_turns=max_turns, tool_budget=tool_budget)
    results = []
    with Progress(console=err_console, transient=True, disable=as_json) as bar:
        for k in kinds:
            job = bar.add_task(f"{k}", total=len(ts))
            results.append(check_policy(k, ts, limits, taskset or TASKSET_DIR,
                                        progress=lambda d, job=job: bar.update(job, completed=d["episode"])))
    if as_json:
        print_json({"tasks": len(ts), "reward_spec": CHECK_REWARD, "results": results})
        return
    table = Table("policy", "episodes", "hidden-test reward", "total reward", "resolved", "budget exceeded",
                  "findings", title=f"swe check over {len(ts)} tasks")
    from evotrainer import metrics as M

    for r in results:
        kinds_found = ", ".join(sorted({f"{f['kind']} ({f['severity']})" for f in r["findings"]})) or "-"
        table.add_row(r["policy"], str(r["episodes"]), f"{r['mean_swe_tests']:.3f}", f"{r['mean_reward']:.3f}",
                      f"{r['metrics'][M.TOOLS_RESOLVED_FRAC]:.2f}", f"{r['metrics'][M.TOOLS_BUDGET_EXCEEDED_FRAC]:.2f}",
                      kinds_found)
    console.print(table)
    from rich.markup import escape

    from evotrainer.terminal import neutralise

    for r in results:
        for f in r["findings"]:
            console.print(escape(neutralise(f"{r['policy']}: {f['kind']} [{f['severity']}] {f['explanation']}")),
                          highlight=False)


@swe_app.command("episodes")
def episodes_cmd(
    model: Annotated[str, typer.Option("--model", help="Model name or path (recipe.model.name_or_path).")
                     ] = "smollm2-135m-instruct",
    tasks: Annotated[str | None, typer.Option("--tasks", help="Comma-separated task ids.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="First N tasks.")] = 2,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Episodes per task.")] = 1,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="tool_use.max_turns: policy replies per episode.")] = 3,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="Tokens per reply.")] = 96,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="Sampling temperature (0: greedy).")] = 0.7,
    episode_timeout: Annotated[float, typer.Option("--episode-timeout", min=1.0,
                                                   help="tool_use.per_episode_timeout_s (policy time included).")] = 600.0,
    seed: Annotated[int, typer.Option("--seed", help="Torch seed of the sampling.")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="Write trajectories as JSON lines here.")] = None,
    taskset: TasksetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Let a model play SWE episodes; print outcomes, tool-use metrics and policy-token mask sizes."""
    import torch

    from evotrainer.cli import console, print_json
    from evotrainer.recipe import ModelSpec, ToolUseSpec
    from evotrainer.rl_backend.models import load_policy
    from evotrainer.rl_backend.swe.episode import encode_trajectory, episode_metrics, run_episodes
    from evotrainer.rl_backend.swe.policies import ChatModelPolicy
    from evotrainer.rl_backend.swe.tasks import TASKSET_DIR

    torch.manual_seed(seed)
    ts = _select(taskset, tasks, limit)
    bundle = load_policy(ModelSpec(name_or_path=model))
    bundle.model.eval()
    tok = bundle.tokenizer
    pol = ChatModelPolicy(bundle.model, tok, max_new_tokens=max_new_tokens, temperature=temperature)
    eps = run_episodes(ts, pol, limits=ToolUseSpec(max_turns=max_turns, per_episode_timeout_s=episode_timeout),
                       samples_per_task=samples,
                       taskset_root=taskset or TASKSET_DIR,
                       count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]))
    rows: list[dict[str, Any]] = []
    for e in eps:
        enc = encode_trajectory(tok, e.messages, e.policy_token_ids())
        rows.append({"task": e.task_id, "sample": e.sample_idx, "finish_reason": e.finish_reason,
                     "outcome": e.outcome.to_dict(), "stats": e.stats, "extras": e.extras,
                     "sequence_tokens": len(enc.input_ids), "policy_tokens": sum(enc.completion_mask),
                     "prompt_tokens": enc.prompt_len, "mask_mismatches": enc.mismatches, "turns": e.turns})
    if out:
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"episodes": len(eps), "metrics": episode_metrics(eps),
               "mean_swe_tests": sum(e.outcome.swe_tests for e in eps) / len(eps)}
    if as_json:
        print_json({**summary, "episodes_detail": [{k: v for k, v in r.items() if k != "turns"} for r in rows]})
        return
    for r in rows:
        console.print(f"{r['task']}#{r['sample']}: {r['stats']['turns']} turns, {r['stats']['calls']} calls "
                      f"({r['stats']['invalid_calls']} invalid), stop={r['stats']['stop_reason']}, "
                      f"swe_tests={r['outcome']['swe_tests']}, policy tokens {r['policy_tokens']}/{r['sequence_tokens']}",
                      highlight=False)
    console.print(f"mean hidden-test reward {summary['mean_swe_tests']:.3f} over {len(eps)} episodes")
