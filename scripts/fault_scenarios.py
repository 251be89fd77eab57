"""Seeded-fault scenarios on the real default policy (SmolLM2-135M-Instruct), documented in docs/scenarios.md.

Each scenario seeds one fault into the base recipe of ``examples/default.yaml`` and runs the
autonomous loop (heuristic brain, local backend) on a small budget, then checks what issue 8 asks:

1. ``leaky_reward``: ``format_token`` pays for a token whatever the answer -> reward_hacking is named
   and no branch that still pays the token is kept;
2. ``zero_variance``: data the policy cannot split into better / worse samples (SmolLM2 has no
   arithmetic level it always solves, so the fault is seeded from the hard side, level 3 at ~4% pass)
   -> zero_variance_groups is found and a data / filter intervention is proposed;
3. ``truncation``: ``generate_max_len`` 4 -> truncation is found and a child with a longer budget
   (or overlong shaping) is trained;
4. ``lr_too_high``: ``actor_learning_rate`` 100x the default -> a collapse / blow-up finding and the
   branch is not kept.

Each scenario's ``fault`` is the recipe values that are the fault (a version still having them all carries it) and
``kind`` the fault's name: ``scripts/evolution_numbers.py`` labels versions by them
(``harness.synthesis.fault_examples``) for analyzer synthesis.

Usage: ``python scripts/fault_scenarios.py [NAMES...] --out runs/scenarios`` (resumable: a finished
scenario is read back, an interrupted one continues). Writes ``<out>/scenarios.md`` and
``<out>/scenarios.json``. Cost on 2 CPU cores: about 4 minutes per version, 9 versions in all.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

SCENARIOS: dict[str, dict[str, Any]] = {
    "leaky_reward": {  # "The" occurs in ~20% of the base policy's completions, right or wrong
        "changes": {"reward.format_token.weight": 1.0, "reward.format_token.params": {"token": "The"},
                    "actor_learning_rate": 1.0e-5},
        "budget": {"max_versions": 3, "branches_per_round": 2, "steps_per_version": 12},
        "expect": "reward_hacking named on v0; no kept child still pays format_token",
        "kind": "reward_hacking", "fault": {"reward.format_token.weight": 1.0},
    },
    "zero_variance": {
        "changes": {"data.level": 3},
        "budget": {"max_versions": 2, "branches_per_round": 1, "steps_per_version": 8},
        "expect": "zero_variance_groups found on v0; a data / filter intervention proposed",
        "kind": "zero_variance_groups", "fault": {"data.level": 3},
    },
    "truncation": {
        "changes": {"generate_max_len": 4},
        "budget": {"max_versions": 2, "branches_per_round": 1, "steps_per_version": 8},
        "expect": "truncation found on v0; a child with a longer generate_max_len (or overlong shaping) trained",
        "kind": "truncation", "fault": {"generate_max_len": 4},
    },
    "lr_too_high": {
        "changes": {"actor_learning_rate": 2.0e-4},
        "budget": {"max_versions": 2, "branches_per_round": 1, "steps_per_version": 8},
        "expect": "entropy / template / length collapse or KL / NaN blow-up found on v0; v0's lr never kept",
        "kind": "lr_too_high", "fault": {"actor_learning_rate": 2.0e-4},
    },
}
COLLAPSE = {"entropy_collapse", "template_collapse", "length_collapse", "nan_blowup", "kl_blowup"}
DATA_PATHS = ("dynamic_filtering", "group_filter_top_p", "data.level", "data.difficulty_band")

app = typer.Typer(add_completion=False)


def _kinds(lin: Any, vid: str) -> dict[str, str]:
    d = lin.kv_get(f"loop/diagnose/{vid}") or {}
    out: dict[str, str] = {}
    for f in d.get("findings", []):
        if f["severity"] in ("warn", "blocking") and out.get(f["kind"]) != "blocking":
            out[f["kind"]] = f["severity"]
    return out


def check(name: str, ws: Any) -> dict[str, Any]:
    """What the scenario found, proposed and decided, and whether issue 8's check holds.

    Returns a JSON-able dict: findings of v0 ``{kind: severity}``, each version's intervention, status,
    held-out Avg@k with its 95% bootstrap CI, the proposals of round 1, and ``passed`` with ``why``.
    """
    from evotrainer.agents.report import score_rows

    lin = ws.lineage
    kinds = _kinds(lin, "v0")
    prop = lin.kv_get("loop/r1/propose") or {"candidates": []}
    cands = [(c["path"], c["new"]) for c in prop["candidates"]]
    scores = {r["name"]: r for r in score_rows(ws)}
    versions = []
    for v in lin.versions():
        s = scores.get(v.id, {})
        dec = lin.decisions(v.id)
        versions.append({"id": v.id, "parent": v.parent_id, "status": v.status,
                         "intervention": v.interventions[0].describe() if v.interventions else "base",
                         "avg": s.get("avg"), "ci": s.get("ci"),
                         "decision": dec[-1].rationale[:240] if dec else ""})
    no_rl = scores.get("no-RL (base model)", {})
    recipes = {v.id: v.recipe for v in lin.versions()}
    if name == "leaky_reward":
        paying = [vid for vid, r in recipes.items()
                  if r.reward.get("format_token") is not None and r.reward["format_token"].weight > 0]
        kept_paying = [v["id"] for v in versions if v["id"] in paying and v["status"] == "kept" and v["parent"]]
        passed = "reward_hacking" in kinds and not kept_paying
        why = (f"reward_hacking={kinds.get('reward_hacking')}; kept children still paying the token: "
               f"{kept_paying or 'none'}; base v0 {versions[0]['status']}")
    elif name == "zero_variance":
        props = [p for p, _ in cands if p in DATA_PATHS]
        passed = "zero_variance_groups" in kinds and bool(props)
        why = f"zero_variance_groups={kinds.get('zero_variance_groups')}; data/filter proposals: {props}"
    elif name == "truncation":
        kids = [v for v in lin.versions() if v.parent_id]
        fixed = [v.id for v in kids if v.recipe.generate_max_len > 4
                 or (v.recipe.reward.get("overlong") is not None and v.recipe.reward["overlong"].weight > 0)]
        passed = "truncation" in kinds and bool(fixed)
        why = f"truncation={kinds.get('truncation')}; children with the fix: {fixed}"
    else:
        hit = sorted(COLLAPSE & set(kinds))
        high = [v["id"] for v in versions if recipes[v["id"]].actor_learning_rate >= 2.0e-4 and v["status"] == "kept"]
        passed = bool(hit) and not high
        why = f"collapse findings {hit}; kept versions at lr 2e-4: {high or 'none'}"
    return {"name": name, "expect": SCENARIOS[name]["expect"], "changes": SCENARIOS[name]["changes"],
            "budget": SCENARIOS[name]["budget"], "findings_v0": kinds, "proposals_r1": cands[:8],
            "versions": versions, "no_rl": {"avg": no_rl.get("avg"), "ci": no_rl.get("ci")},
            "passed": passed, "why": why}


def _fmt_ci(avg: Any, ci: Any) -> str:
    if avg is None:
        return "-"
    return f"{avg:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def to_markdown(results: list[dict[str, Any]]) -> str:
    """The scenarios table and per-scenario lineage, as Markdown."""
    lines = ["| scenario | seeded fault | v0 findings (warn / blocking) | check | result |", "|---|---|---|---|---|"]
    for r in results:
        ch = ", ".join(f"`{k}={json.dumps(v)}`" for k, v in r["changes"].items())
        fk = ", ".join(f"{k} ({s})" for k, s in sorted(r["findings_v0"].items()))
        lines.append(f"| {r['name']} | {ch} | {fk} | {r['expect']} | {'PASS' if r['passed'] else 'FAIL'}: {r['why']} |")
    for r in results:
        lines += ["", f"### {r['name']} ({(r.get('wall_s') or 0) / 60:.1f} min)", "",
                  f"no-RL Avg@8: {_fmt_ci(r['no_rl']['avg'], r['no_rl']['ci'])}", "",
                  "| version | parent | intervention | status | held-out Avg@8 [95% CI] | decision |", "|---|---|---|---|---|---|"]
        for v in r["versions"]:
            lines.append(f"| {v['id']} | {v['parent'] or '-'} | {v['intervention']} | {v['status']} | "
                         f"{_fmt_ci(v['avg'], v['ci'])} | {v['decision'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


@app.command()
def main(names: list[str] = typer.Argument(None, help="Scenarios to run (default: all)."),
         out: Path = typer.Option(Path("runs/scenarios"), help="Folder of the scenario runs."),
         config: Path = typer.Option(Path("examples/default.yaml"), help="Run config whose recipe gets the fault.")) -> None:
    """Run the seeded-fault scenarios on the default policy and write scenarios.md / scenarios.json."""
    from evotrainer.agents.cli import LiveView
    from evotrainer.agents.report import write_report
    from evotrainer.agents.runner import run_loop
    from evotrainer.config import load_run_config
    from evotrainer.recipe import set_path
    from evotrainer.workspace import Workspace

    console = Console()
    names = names or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise typer.BadParameter(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    results = []
    for name in names:
        spec = SCENARIOS[name]
        cfg = load_run_config(config)
        recipe = cfg.recipe
        for path, value in spec["changes"].items():
            recipe = set_path(recipe, path, value)
        cfg = cfg.model_copy(update={"recipe": recipe, "brain": "heuristic",
                                     "budget": cfg.budget.model_copy(update={**spec["budget"],
                                                                             "wall_clock_minutes": 60})})
        run_dir = out / name
        console.rule(f"scenario {name}: {spec['changes']}")
        t0 = time.time()
        finished = False
        if (run_dir / "lineage.db").exists():
            with Workspace.open(run_dir) as ws:
                finished = bool(ws.lineage.kv_get("loop/finished"))
        if not finished:
            run_dir.mkdir(parents=True, exist_ok=True)
            if console.is_terminal:
                with Workspace(run_dir) as view_ws, LiveView(view_ws, console) as view:
                    run_loop(cfg, run_dir, "heuristic", "evotrainer", resume=True, on_event=view)
            else:
                def on_event(kind: str, data: dict[str, Any], tag: str = name) -> None:
                    if kind == "log":
                        console.print(f"[{tag}] {data['message']}", highlight=False, soft_wrap=True)
                run_loop(cfg, run_dir, "heuristic", "evotrainer", resume=True, on_event=on_event)
            wall = run_dir / "scenario_wall_s.txt"
            wall.write_text(f"{time.time() - t0 + (float(wall.read_text()) if wall.exists() else 0.0):.1f}\n")
        ws = Workspace.open(run_dir)
        write_report(ws)
        res = check(name, ws)
        wall = run_dir / "scenario_wall_s.txt"
        res["wall_s"] = float(wall.read_text()) if wall.exists() else None
        ws.close()
        results.append(res)
        console.print(f"[bold]{name}[/]: {'PASS' if res['passed'] else 'FAIL'} - {res['why']}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenarios.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "scenarios.md").write_text(to_markdown(results))
    console.print(f"written {out / 'scenarios.md'}")


if __name__ == "__main__":
    app()
