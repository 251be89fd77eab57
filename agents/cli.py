"""CLI commands of evotrainer.agents: ``evotrainer run CONFIG`` and ``evotrainer report RUN``.

``run`` drives the autonomous loop (or a baseline mode) with rich progress bars and a live lineage
table, then writes the HTML report and prints its path and a summary table. Heavy modules are
imported inside the commands so ``evotrainer --help`` stays fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from evotrainer.agents.modes import BRAINS, MODES
from evotrainer.cli_errors import fail


class LiveView:
    """Rich live display: a progress bar for the running job, the lineage table and the last event."""

    def __init__(self, ws: Any, console: Any):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.ws = ws
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console)
        self.tasks: dict[str, int] = {}
        self.last = ""
        self.live = None

    def render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        return Group(lineage_table(self.ws), self.progress, Text(self.last[:200], style="dim"))

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "progress":
            key = f"{data['version']} {data['what']}"
            total = max(int(data.get("total") or 0), int(data.get("done") or 0), 1)
            if key not in self.tasks:
                self.tasks[key] = self.progress.add_task(key, total=total)
            self.progress.update(self.tasks[key], completed=int(data.get("done") or 0), total=total)
            if data.get("finished"):
                self.progress.update(self.tasks[key], completed=total)
        elif kind in ("log", "stage"):
            self.last = data.get("message") or f"stage {data.get('key')}"
        elif kind == "decision":
            r = data["rationale"]
            self.last = r if r.startswith(data["action"]) else f"{data['action']} {data['version_id']}: {r}"
        if self.live is not None:
            self.live.update(self.render())

    def __enter__(self) -> LiveView:
        from rich.live import Live

        self.live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.update(self.render())
            self.live.__exit__(*exc)
            self.live = None


def lineage_table(ws: Any) -> Any:
    """A rich table of the lineage: id, parent, status, change, reward/mean, held-out Avg@k."""
    from rich.table import Table

    t = Table(title="lineage", expand=False)
    for col in ("version", "parent", "status", "change"):  # text folds at 80 columns, never cut
        t.add_column(col, overflow="fold", ratio=1 if col == "change" else None)
    for col in ("reward", "Avg@k"):  # numbers stay whole
        t.add_column(col, no_wrap=True, justify="right")
    style = {"kept": "green", "pruned": "red", "reverted": "magenta", "failed": "red", "training": "yellow",
             "trained": "cyan", "proposed": "dim", "merged": "blue"}
    for v in ws.lineage.versions():
        rew = (v.metrics_summary or {}).get("reward/mean")
        avg = (v.eval_summary or {}).get("avg@k") if (v.eval_summary or {}).get("eval_name", "heldout") == "heldout" else None
        t.add_row(v.id, v.parent_id or "-", f"[{style.get(v.status, '')}]{v.status}[/]",
                  v.describe_change(),
                  f"{rew:.3f}" if isinstance(rew, (int, float)) else "", f"{avg:.3f}" if isinstance(avg, (int, float)) else "")
    return t




def register(app: typer.Typer) -> None:
    """Add ``run`` and ``report`` to the main evotrainer app."""

    @app.command()
    def run(
        config: Annotated[Path, typer.Argument(help="Run config YAML (see examples/default.yaml).")],
        brain: Annotated[str | None, typer.Option("--brain", help="auto | heuristic | claude (default: the config's).")] = None,
        mode: Annotated[str | None, typer.Option("--mode", help="evotrainer | static | recipe-search | greedy | pbt (default: the config's).")] = None,
        resume: Annotated[bool, typer.Option("--resume", help="Continue the run in the config's run_dir.")] = False,
        run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Override the config's run_dir.")] = None,
        no_live: Annotated[bool, typer.Option("--no-live", help="Plain log lines instead of the live display.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the run summary as JSON at the end.")] = False,
    ) -> None:
        """Run the autonomous loop: train, diagnose, intervene, gate; then write the HTML report."""
        from evotrainer.agents.report import ReportLineage, answer_line, summary_table, write_report
        from evotrainer.agents.runner import run_loop
        from evotrainer.config import load_run_config
        from evotrainer.terminal import output_console
        from evotrainer.workspace import Workspace

        cfg = load_run_config(config)
        brain = brain or cfg.brain
        mode = mode or cfg.mode
        for name, val, allowed in (("--brain", brain, BRAINS),
                                   ("--mode", mode, MODES)):
            if val not in allowed:
                raise typer.BadParameter(f"{val!r}; allowed: {', '.join(allowed)}", param_hint=name)
        if brain == "claude" and not os.environ.get("ANTHROPIC_API_KEY"):
            fail("--brain claude needs ANTHROPIC_API_KEY in the environment (or use --brain heuristic)")
        rd = Path(run_dir or cfg.run_dir)
        if (rd / "lineage.db").exists() and not resume:
            fail(f"{rd} holds a run already; pass --resume to continue it, or choose another run_dir")
        console = output_console(stderr=as_json)
        try:
            if no_live or not console.is_terminal:
                def on_event(kind: str, data: dict[str, Any]) -> None:
                    if kind == "log":
                        console.print(data["message"], highlight=False, soft_wrap=True)
                summary = run_loop(cfg, rd, brain, mode, True, on_event)
            else:  # the view reads the lineage as the loop writes it (resume=True: checked above)
                with Workspace(rd) as view_ws, LiveView(view_ws, console) as view:
                    summary = run_loop(cfg, rd, brain, mode, True, view)
        except ValueError as exc:
            fail(str(exc))
        ws = Workspace.open(rd)
        lin = ReportLineage(ws.lineage)  # one read of the versions for the report and the summary (E2-R16)
        path = write_report(ws, lin=lin)
        summary["report"] = str(path)
        if as_json:
            sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
        else:
            console.print(summary_table(ws, lin))
            if line := answer_line(ws, lin):
                console.print(line, highlight=False)
            c, final = summary.get("compute") or {}, summary.get("final") or {}
            if c:
                console.print(f"compute: {c.get('train_tokens', 0)} train + {c.get('eval_tokens', 0)} dev-eval tokens "
                              f"(budget {cfg.budget.max_tokens or 'versions / steps'}), {c.get('cpu_s', 0):.0f} "
                              f"CPU-s, {c.get('wall_s', 0):.0f} s wall", highlight=False)
            if (final.get("test") or {}).get("avg@k") is not None:
                console.print(f"test (sealed during the run): {final['version']} Avg@{final['test']['k']} "
                              f"{final['test']['avg@k']:.3f}, no-RL {final['no_rl_test']['avg@k']:.3f}",
                              highlight=False)
            console.print(f"report: {path}")
        ws.close()

    @app.command()
    def compare(
        config: Annotated[Path, typer.Argument(help="Run config YAML (its recipe needs data.n_test > 0).")],
        modes: Annotated[str, typer.Option("--modes", help="Comma-separated modes.")] = ",".join(MODES),
        seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated seeds, e.g. 0,1,2.")] = "0",
        out: Annotated[Path, typer.Option("--out", help="Output folder (runs, compare.json / .md / .png).")] = Path(
            "runs/compare"),
        parallel: Annotated[int, typer.Option("--parallel", min=1, help="Runs at a time, as separate processes.")] = 1,
        brain: Annotated[str, typer.Option("--brain", help="Brain of the evotrainer mode.")] = "heuristic",
        resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Skip finished (mode, seed) runs and "
                                             "resume unfinished ones (the default).")] = True,
        baseline: Annotated[Path | None, typer.Option("--baseline", help="compare.json of an earlier comparison on "
                                                      "the same config: its stored runs fill the (mode, seed) pairs "
                                                      "not run here, e.g. static while only evotrainer changed.")]
        = None,
    ) -> None:
        """Run the modes at equal compute over seeds and write a table and a plot of test Avg@k (resumable)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from evotrainer.agents.compare import CompareError
        from evotrainer.agents.compare import compare as run_compare
        from evotrainer.config import load_run_config
        from evotrainer.terminal import output_console

        try:
            seed_list = [int(x) for x in seeds.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter(f"{seeds!r}: comma-separated integers, e.g. 0,1,2", param_hint="--seeds") from None
        mode_list = [m.strip() for m in modes.split(",") if m.strip()]
        if not resume and (out / "runs").exists() and any((out / "runs").iterdir()):
            fail(f"{out}/runs holds runs already; pass --resume to continue them, or choose another --out")
        cfg = load_run_config(config)
        console = output_console()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            task = bar.add_task("compare runs", total=len(mode_list) * max(1, len(seed_list)))

            def on_progress(name: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, description=f"compare runs (last: {name})")

            try:
                table = run_compare(cfg, mode_list, seed_list, out, parallel=parallel, brain=brain,
                                    on_progress=on_progress, baseline=baseline)
            except CompareError as exc:
                fail(str(exc))
        from evotrainer.agents.compare import markdown

        console.print(markdown(table), highlight=False)
        console.print(f"table: {out / 'compare.md'}  json: {out / 'compare.json'}  plot: {out / 'compare.png'}")

    @app.command()
    def report(
        run_dir: Annotated[Path, typer.Argument(help="Run folder.")] = Path("runs/default"),
        as_json: Annotated[bool, typer.Option("--json", help="Print {report, summary} as JSON.")] = False,
    ) -> None:
        """Write the run's self-contained HTML report (RUN/reports/report.html) and print a summary table."""
        from evotrainer.agents.loop import run_summary
        from evotrainer.agents.report import (
            ReportLineage,
            answer_line,
            score_rows,
            summary_table,
            write_report,
        )
        from evotrainer.lineage import VERSION_IDS_LISTED_MAX
        from evotrainer.terminal import neutralise, output_console
        from evotrainer.workspace import Workspace

        ws = Workspace.open(run_dir)
        lin = ReportLineage(ws.lineage)  # one read of the versions for the report and the summary (E2-R16)
        path = write_report(ws, lin=lin)
        if as_json:
            mode = lin.kv_get("loop/mode", "evotrainer", expected=str)
            sys.stdout.write(json.dumps({"report": str(path), "summary": run_summary(ws, mode, lineage=lin)}, indent=2,
                                        default=str) + "\n")
        else:
            console = output_console()
            if score_rows(ws, lin):
                console.print(summary_table(ws, lin))
            else:  # an imported foreign run or a fresh init: a header over no rows said nothing
                vs = lin.versions()
                # store text neutralised and printed as no markup (T1-R19: a crafted version id's ESC]0;...ESC\\
                # ESC[2J reached the terminal raw; a "[/x]" in one ended the command with a MarkupError)
                ids = (", ".join(f"{neutralise(v.id)} ({neutralise(v.status)})" for v in vs[:VERSION_IDS_LISTED_MAX])
                       + (f" and {len(vs) - VERSION_IDS_LISTED_MAX:,} more" if len(vs) > VERSION_IDS_LISTED_MAX else "")) or "none"
                console.print(f"no score table: no version of {neutralise(str(run_dir))} has a dev (held-out) evaluation yet "
                              f"(versions: {ids}); `evotrainer eval VERSION --run {run_dir}` evaluates one that has "
                              "a checkpoint", highlight=False, soft_wrap=True, markup=False)
            if line := answer_line(ws, lin):
                console.print(neutralise(line), highlight=False, markup=False)
            console.print(f"report: {neutralise(str(path))}", markup=False)
        ws.close()
