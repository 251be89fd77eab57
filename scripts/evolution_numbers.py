"""Harness-evolution numbers of finished runs (issue 23): what the loop proposed, kept and fired, and a replay.

For run folders given in the order they ran (sharing one skills folder), prints and writes JSON:

1. **in the loop** (each run's kv ``loop/r*/evolve``): searches, the best rule each proposed, whether it was
   kept (registered), the labels it rested on; uses of in-scope analyzers on later versions (fired, right);
   early-stop counterfactuals (would stop, right, steps saved);
2. **leave-one-run-out replay**: for each run, the search of ``harness.synthesis.synthesize`` over the labelled
   versions of all *other* runs, and its best rule (kept or not) applied to this run's labelled versions,
   which it was not fitted on: precision / recall out of sample, for the labels the loop uses
   (``agents.evolution.outcome_labels``).

Usage: ``python scripts/evolution_numbers.py RUN [RUN ...] --out numbers.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import typer

from evotrainer.agents.evolution import outcome_labels
from evotrainer.harness import synthesis as S
from evotrainer.harness.evidence import Evidence
from evotrainer.workspace import Workspace

app = typer.Typer(add_completion=False)


def in_loop(ws: Workspace) -> dict[str, Any]:
    """What the run's harness evolution recorded (the report's Analyzers added, as numbers)."""
    out: dict[str, Any] = {"searches": [], "uses": [], "early_stop": [], "stopped": []}
    for key, items in ws.lineage.kv_items("loop/r"):
        if not key.endswith("/evolve"):
            continue
        for e in items or []:
            t = e.get("type")
            if t == "synthesis":
                out["searches"].append({"round": key.split("/")[1], "rule": e.get("describe"), "kept": e.get("kept"),
                                        "registered": e.get("registered"), "n_labels": e.get("n_labels"),
                                        "n_bad": e.get("n_bad"), "n_good": e.get("n_good"),
                                        "p_value": e.get("p_value"), "loo": e.get("loo"), "sources": e.get("sources"),
                                        "reason": e.get("reason")})
            elif t == "use":
                out["uses"].append({k: e.get(k) for k in ("name", "version", "fired", "bad", "correct", "origin")})
            elif t == "early_stop":
                out["early_stop"].append({k: e.get(k) for k in ("analyzer", "version", "stop", "right", "saved_steps",
                                                                "precision_lower")})
            elif t == "stopped":
                out["stopped"].append({k: e.get(k) for k in ("analyzer", "version", "at_step", "saved_steps")})
    return out


def replay(runs: list[tuple[str, Evidence, dict[str, bool]]], n_permutations: int) -> list[dict[str, Any]]:
    """Leave-one-run-out: fit on the other runs' labels, apply the best rule to this run's."""
    rows = []
    for i, (name, ev, labels) in enumerate(runs):
        train = [ex for j, (_, evj, lj) in enumerate(runs) if j != i for ex in S.lineage_examples(evj, lj)]
        test = S.lineage_examples(ev, labels)
        if not train or not test:
            rows.append({"run": name, "skipped": "no labels"})
            continue
        res = S.synthesize(train, n_permutations=n_permutations)
        row: dict[str, Any] = {"run": name, "train_labels": res.n_labels, "train_bad": res.n_bad,
                               "kept": res.kept, "rule": res.program.describe() if res.program else None,
                               "p_value": res.p_value, "loo": res.loo, "reason": res.reason}
        if res.program is not None:
            pred = np.array([res.program.fires(ex.evidence, ex.version) for ex in test])
            y = np.array([ex.bad for ex in test])
            row["held_out"] = {**S.confusion(pred, y), "versions": {ex.version: [bool(p), bool(b)]
                                                                    for ex, p, b in zip(test, pred, y, strict=True)}}
        rows.append(row)
    return rows


@app.command()
def main(runs: list[Path] = typer.Argument(..., help="Run folders, in the order they ran."),
         out: Path = typer.Option(Path("evolution_numbers.json"), help="JSON output."),
         n_permutations: int = typer.Option(S.N_PERMUTATIONS, help="Shuffles of the permutation test.")) -> None:
    """Print and write the in-loop numbers and the leave-one-run-out replay."""
    result: dict[str, Any] = {"runs": {}, "replay": []}
    loaded = []
    for r in runs:
        with Workspace.open(r) as ws:
            ev = Evidence.from_workspace(ws)
            labels = outcome_labels(ws.lineage)
            result["runs"][r.name] = {"labels": labels, **in_loop(ws)}
        loaded.append((r.name, ev, labels))
    result["replay"] = replay(loaded, n_permutations)
    for name, d in result["runs"].items():
        n_bad = sum(d["labels"].values())
        print(f"{name}: {len(d['labels'])} labels ({n_bad} bad); searches {len(d['searches'])}, proposed "
              f"{sum(1 for s in d['searches'] if s['rule'])}, kept {sum(1 for s in d['searches'] if s['registered'])}; "
              f"uses {len(d['uses'])}, fired {sum(1 for u in d['uses'] if u['fired'])}, fired right "
              f"{sum(1 for u in d['uses'] if u['fired'] and u['bad'])}; early stops "
              f"{sum(1 for e in d['early_stop'] if e['stop'])} (right {sum(1 for e in d['early_stop'] if e['stop'] and e['right'])})")
        for s in d["searches"]:
            print(f"   {s['round']}: {s['reason']}")
    for row in result["replay"]:
        h = row.get("held_out") or {}
        print(f"replay {row['run']}: fit on {row.get('train_labels')} labels ({row.get('train_bad')} bad), "
              f"kept={row.get('kept')} rule={row.get('rule')} p={row.get('p_value')}; on this run: tp {h.get('tp')} "
              f"fp {h.get('fp')} fn {h.get('fn')} tn {h.get('tn')} precision {h.get('precision')} recall {h.get('recall')}")
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"written {out}")


if __name__ == "__main__":
    app()
