"""Harness-evolution numbers of finished runs (issue 23): what the loop proposed, kept and fired, and a replay.

For run folders given in the order they ran (sharing one skills folder), prints and writes JSON:

1. **in the loop** (each run's kv ``loop/r*/evolve``): searches, the best rule each proposed, whether it was
   kept (registered), the labels it rested on; uses of in-scope analyzers on later versions (fired, right);
   early-stop counterfactuals (would stop, right, steps saved);
2. **leave-one-run-out replay**: for each run, the search of ``harness.synthesis.synthesize`` over the labelled
   versions of all *other* runs, and its best rule (kept or not) applied to this run's labelled versions,
   which it was not fitted on: precision / recall out of sample, for the labels the loop uses
   (``agents.evolution.outcome_labels``);
3. **fault-kind replay**: for each seeded-fault kind of ``scripts/fault_scenarios.py``, the versions of every run
   labelled by the fault (``harness.synthesis.fault_examples``: bad while the recipe still has the seeded values,
   good once a child changed one; every version of a run without a seeded fault, e.g. the default run, is good;
   a run seeded with another fault is left out, since one fault may bring another with it) plus the real-case corpus's cases of that kind
   (``case_examples``); leave one group out (a run folder, or one corpus case), fit on the rest, apply the best
   rule to the held-out group: how often a *kept* rule fires right on versions it was not fitted on.

With ``--register``, each fault kind's rule kept on all its labels is compiled, checked in the sandbox on the
runs' evidence (it must fire where the search predicted) and stored as a synthesised analyzer skill in the skills
folder (``$EVOTRAINER_SKILLS_DIR``), so that later runs inherit and score it (``agents.evolution.inherit``).

Usage: ``python scripts/evolution_numbers.py RUN [RUN ...] --cases tests/data/cases --out numbers.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import typer

from evotrainer.agents.evolution import TAG, outcome_labels
from evotrainer.harness import synthesis as S
from evotrainer.harness.analyzers import run_analyzer_code
from evotrainer.harness.evidence import Evidence
from evotrainer.skills_db.models import Skill
from evotrainer.skills_db.store import SkillStore
from evotrainer.workspace import Workspace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_scenarios import SCENARIOS  # noqa: E402 (a sibling script, not a package)

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


def _fit_apply(train: list[S.Example], test: list[S.Example], n_permutations: int, kind: str) -> dict[str, Any]:
    res = S.synthesize(train, kind=f"predicted_{kind}", n_permutations=n_permutations)
    row: dict[str, Any] = {"train_labels": res.n_labels, "train_bad": res.n_bad, "kept": res.kept,
                           "rule": res.program.describe() if res.program else None, "p_value": res.p_value,
                           "loo": res.loo, "reason": res.reason}
    if res.program is not None:
        pred = np.array([res.program.fires(ex.evidence, ex.version) for ex in test])
        y = np.array([ex.bad for ex in test])
        row["held_out"] = {**S.confusion(pred, y), "versions": {f"{ex.source}:{ex.version}": [bool(p), bool(b)]
                                                                for ex, p, b in zip(test, pred, y, strict=True)}}
    return row


def register(loaded: list[tuple[str, Evidence, dict[str, bool]]], replay_out: dict[str, Any]) -> list[str]:
    """Store each kind's rule kept on all its labels as a synthesised analyzer skill (sandbox-checked first)."""
    done = []
    store = SkillStore()
    for kind, d in replay_out.items():
        full = d.get("all_labels") or {}
        if not full.get("kept"):
            continue
        prog = S.Program.from_dict(full["program"])
        code = S.compile_program(prog)
        for name, ev, _ in loaded:  # the compiled code must fire where the in-process rule does
            fired = {f.versions[0] for f in run_analyzer_code(code, ev, name=prog.name)}
            expect = {v for v in ev.versions if prog.fires(ev, v)}
            if fired != expect:
                raise SystemExit(f"{prog.name}: the sandbox fires on {sorted(fired)} of {name}, the search on "
                                 f"{sorted(expect)}; not registered")
        desc = (f"Synthesised rule {prog.describe()} flags a version carrying the {kind} fault. Fit on "
                f"{full['n_labels']} labelled versions ({full['n_bad']} bad, {full['n_good']} good; {full['sources']}): "
                f"leave-one-out precision {full['loo'].get('precision')}, recall {full['loo'].get('recall')}; "
                f"permutation p={full['p_value']:.3f} over {full['n_candidates']} candidate rules.")
        store.add(Skill(id=f"synth:{prog.name}", kind="analyzer", name=prog.name, description=desc,
                        addresses=[prog.kind], code=code, tags=[TAG, "math", "fault"],
                        source="scripts/evolution_numbers.py (seeded-fault labels + real-case corpus)",
                        value={"program": prog.to_dict(), "describe": prog.describe(), "loo": full["loo"],
                               "in_sample": full["in_sample"], "p_value": full["p_value"],
                               "n_labels": full["n_labels"], "evidence": sorted(full["fired"]),
                               "sources": full["sources"], "run": "fault replay", "domain": "math", "fault": kind}),
                  replace=True)
        done.append(prog.name)
        print(f"registered synth:{prog.name} ({kind}): {prog.describe()}")
    return done


def fault_replay(loaded: list[tuple[str, Evidence, dict[str, bool]]], cases: Path | None,
                 n_permutations: int) -> dict[str, Any]:
    """Per fault kind: leave-one-group-out over the runs (and each corpus case) labelled by the seeded fault."""
    out: dict[str, Any] = {}
    for spec in {sc["kind"]: sc for sc in SCENARIOS.values()}.values():
        kind = spec["kind"]
        groups: dict[str, list[S.Example]] = {}
        for name, ev, _ in loaded:
            sc = SCENARIOS.get(name.split("#", 1)[0])
            if sc is not None and sc["kind"] != kind:
                continue  # another seeded fault may bring this one with it (4-token completions all score 0:
                #           zero-variance groups), so its versions are no negatives for this kind
            groups[name] = S.fault_examples(ev, sc["fault"] if sc else None, f"fault:{name}")
        if cases is not None:
            for ex in S.case_examples(cases, kind):
                groups[f"case:{ex.evidence.source.rsplit('/', 1)[-1] if ex.evidence else ex.version}"] = [ex]
        all_ex = [e for g in groups.values() for e in g]
        rows = []
        for g, test in groups.items():
            train = [e for h, exs in groups.items() if h != g for e in exs]
            if test and any(e.bad for e in train) and not all(e.bad for e in train):
                rows.append({"held_out_group": g, **_fit_apply(train, test, n_permutations, kind)})
        kept = [r for r in rows if r["kept"] and r.get("held_out")]
        tot = {k: sum(r["held_out"][k] for r in kept) for k in ("tp", "fp", "fn", "tn")}
        full = S.synthesize(all_ex, kind=f"predicted_{kind}", n_permutations=n_permutations) if all_ex else None
        out[kind] = {"n_labels": len(all_ex), "n_bad": sum(e.bad for e in all_ex), "groups": len(groups),
                     "folds": rows, "kept_folds": len(kept), "held_out_of_kept": tot,
                     "all_labels": full.to_dict() if full else None}
    return out


@app.command()
def main(runs: list[Path] = typer.Argument(..., help="Run folders, in the order they ran."),
         out: Path = typer.Option(Path("evolution_numbers.json"), help="JSON output."),
         cases: Path = typer.Option(None, help="Real-case corpus folder (tests/data/cases) for the fault replay."),
         n_permutations: int = typer.Option(S.N_PERMUTATIONS, help="Shuffles of the permutation test."),
         register_kept: bool = typer.Option(False, "--register", help="Store the kept fault rules as skills.")) -> None:
    """Print and write the in-loop numbers and the leave-one-run-out replay."""
    result: dict[str, Any] = {"runs": {}, "replay": []}
    loaded = []
    for r in runs:
        with Workspace.open(r) as ws:
            ev = Evidence.from_workspace(ws)
            labels = outcome_labels(ws.lineage)
            key = r.name if r.name not in result["runs"] else f"{r.name}#{len(result['runs'])}"  # a scenario run again
            result["runs"][key] = {"labels": labels, **in_loop(ws)}
        loaded.append((key, ev, labels))
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
    result["fault_replay"] = fault_replay(loaded, cases, n_permutations)
    for kind, d in result["fault_replay"].items():
        h = d["held_out_of_kept"]
        print(f"fault {kind}: {d['n_labels']} labels ({d['n_bad']} bad) in {d['groups']} groups; all labels: "
              f"{(d['all_labels'] or {}).get('reason')}")
        print(f"   leave-one-group-out: {len(d['folds'])} folds, kept in {d['kept_folds']}; kept rules on the held-out "
              f"group: tp {h['tp']} fp {h['fp']} fn {h['fn']} tn {h['tn']}")
        for r in d["folds"]:
            ho = r.get("held_out") or {}
            print(f"     {r['held_out_group']}: kept={r['kept']} {r['rule']} -> tp {ho.get('tp')} fp {ho.get('fp')} "
                  f"fn {ho.get('fn')} tn {ho.get('tn')}")
    result["skills"] = {}
    for sk in SkillStore().list(kind="analyzer"):
        if TAG in sk.tags:
            rec = {d: r.model_dump() for d, r in sk.track_record.items()}
            result["skills"][sk.id] = {"describe": (sk.value or {}).get("describe"), "loo": (sk.value or {}).get("loo"),
                                       "track_record": rec}
            print(f"skill {sk.id}: {(sk.value or {}).get('describe')}; leave-one-out {(sk.value or {}).get('loo')}; "
                  f"track record {rec}")
    if register_kept:
        result["registered"] = register(loaded, result["fault_replay"])
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"written {out}")


if __name__ == "__main__":
    app()
