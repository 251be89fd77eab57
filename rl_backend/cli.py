"""CLI of evotrainer.rl_backend: ``evotrainer train`` and ``evotrainer eval`` (local backend).

``evotrainer train RECIPE --run DIR --steps N``: creates the run with RECIPE as its base version
``v0`` when DIR is new (or trains ``--version V`` of an existing run), with a rich progress bar
(step, reward, tokens/s, ETA). A crashed or interrupted training resumes when rerun.
``--version V`` of an existing run opens it as a writer of V only, so branches of a round train side
by side in separate processes (the executor's worker entry point, :mod:`evotrainer.executor`);
``--job ID`` registers the command as a ``jobs`` row (pid, progress per step; ``interrupted`` when
the process dies) that the executor follows.

``evotrainer eval TARGET --k 8``: TARGET is a version id of ``--run DIR`` (results stored in the
run), a checkpoint folder, or ``base`` (the recipe's base model); the last two print results only
and take the recipe from ``--recipe`` (default recipe if omitted).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import typer


def _progress_bar(label: str):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    transient=False)


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``eval`` to the main evotrainer app."""

    @app.command("train")
    def train(
        recipe: Path | None = typer.Argument(None, help="Recipe YAML (or run config with a recipe: section); "
                                                        "becomes v0 of a new run."),
        run: Path = typer.Option(Path("runs/train"), "--run", help="Run folder (created when missing)."),
        steps: int = typer.Option(8, "--steps", min=1, help="GRPO steps (total for the version; a partly "
                                                             "trained version resumes)."),
        version: str | None = typer.Option(None, "--version", help="Train this existing version instead of v0."),
        device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda when available)."),
        threads: int | None = typer.Option(None, "--threads", help="CPU threads (default: idle cores)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        backend_name: str = typer.Option("local", "--backend", help="local | openrlhf (OpenRLHF job on Ray)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="openrlhf: print the exact job, submit nothing."),
        job_id: str | None = typer.Option(None, "--job", help="Register as this job id in the run's jobs table "
                                                              "(progress per step; used by the executors)."),
        cluster: Path | None = typer.Option(None, "--cluster", help="openrlhf: hardware / submission settings, a "
                                                                    "YAML or JSON ClusterSpec (default: its defaults)."),
    ) -> None:
        """Train a version with the local GRPO backend: rollouts, metrics, TensorBoard, checkpoint."""
        from evotrainer.cli import console, fail, print_json
        from evotrainer.recipe import load_recipe
        from evotrainer.rl_backend.local import LocalBackend
        from evotrainer.workspace import Workspace

        if backend_name not in ("local", "openrlhf") or (dry_run and backend_name != "openrlhf"):
            fail(f"--backend {backend_name!r}{' --dry-run' if dry_run else ''}: choose local, or openrlhf "
                 "(--dry-run is for openrlhf)")
        if dry_run:
            from evotrainer.rl_backend.openrlhf import dry_run as openrlhf_dry_run

            if recipe is None:
                fail("--dry-run needs a RECIPE file")
            print(openrlhf_dry_run(load_recipe(recipe), run, steps=steps, version_id=version or "v0"))
            return

        existing = version is not None and (Path(run) / "lineage.db").exists()
        # a version of an existing run: lock that version only (other branches train beside it)
        with Workspace(run, writer=True, version=version if existing else None) as ws:
            root = ws.lineage.root()
            if version is None:
                if root is None:
                    if recipe is None:
                        fail(f"{ws.root} has no versions yet; pass a RECIPE file to create v0")
                    root = ws.lineage.create_root(load_recipe(recipe))
                elif recipe is not None and load_recipe(recipe).to_dict() != root.recipe.to_dict():
                    fail(f"{ws.root} already has a base version {root.id} with another recipe; use a new --run "
                         "folder, or --version to train an existing version")
                version = root.id
            if backend_name == "openrlhf":
                from evotrainer.rl_backend.backends import get_backend

                backend = get_backend("openrlhf", cluster=_cluster_spec(cluster) if cluster else None)
            else:
                backend = LocalBackend(device=device, num_threads=threads)
            if as_json:
                with _job(ws, job_id, "train", version, steps) as job_progress:
                    res = backend.train(ws, version, steps, progress=job_progress)
                print_json(res.model_dump())
                return
            with _progress_bar(f"train {version}") as bar, _job(ws, job_id, "train", version, steps) as job_progress:
                task = bar.add_task("train", total=steps, info="loading model")

                def progress(p: dict[str, Any]) -> None:
                    job_progress(p)
                    bar.update(task, completed=p["step"],
                               info=f"reward {p['reward']:.3f}  {p['tokens_per_sec']:.1f} tok/s  "
                                    f"{p['step_seconds']:.1f} s/step")

                res = backend.train(ws, version, steps, progress=progress)
            ms = res.metrics_summary
            console.print(f"trained {version}: {res.steps_done} steps, reward/mean {ms.get('reward/mean', float('nan')):.3f}"
                          f", checkpoint {res.checkpoint}" + (f" (resumed after step {res.resumed_from_step})"
                                                              if res.resumed_from_step is not None else ""))

    @app.command("eval")
    def eval_(
        target: str = typer.Argument(..., help="Version id (with --run), checkpoint folder, or 'base'."),
        run: Path | None = typer.Option(None, "--run", help="Run folder holding the version."),
        k: int | None = typer.Option(None, "--k", min=1, help="Samples per held-out problem (default: recipe eval.k)."),
        recipe: Path | None = typer.Option(None, "--recipe", help="Recipe for a checkpoint folder or 'base' "
                                                                  "(data, model, eval settings)."),
        eval_name: str = typer.Option("heldout", "--name", help="Name the outcomes are stored under."),
        device: str | None = typer.Option(None, "--device", help="cpu or cuda."),
        threads: int | None = typer.Option(None, "--threads", help="CPU threads (default: idle cores)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        job_id: str | None = typer.Option(None, "--job", help="Register as this job id in the run's jobs table "
                                                              "(with --run; used by the executors)."),
    ) -> None:
        """Evaluate on the held-out set: Avg@k, unbiased pass@k, pass@1."""
        from evotrainer.cli import console, fail, print_json
        from evotrainer.recipe import Recipe, load_recipe
        from evotrainer.rl_backend.local import LocalBackend
        from evotrainer.workspace import Workspace

        backend = LocalBackend(device=device, num_threads=threads)
        bar = _progress_bar(f"eval {target}")
        task = bar.add_task("eval", total=None, info="loading model")

        def progress(p: dict[str, Any]) -> None:
            bar.update(task, completed=p["step"], total=p["steps"], info=f"Avg@k so far {p['avg@k']:.3f}")

        if run is not None:
            with Workspace.open(run, writer=True, version=target) as ws:  # writes only this version's records
                with bar if not as_json else nullcontext(), _job(ws, job_id, "eval", target, 0) as job_progress:
                    def both(p: dict[str, Any]) -> None:
                        job_progress(p)
                        if not as_json:
                            progress(p)

                    res = backend.evaluate(ws, target, k=k, eval_name=eval_name, progress=both)
        else:
            if target != "base" and not Path(target).is_dir():
                fail(f"{target}: not a checkpoint folder; pass a folder, 'base', or a version id with --run DIR")
            r = load_recipe(recipe) if recipe else Recipe()
            with bar if not as_json else nullcontext():
                res, _, _ = backend.evaluate_checkpoint(r, None if target == "base" else target, k=k,
                                                        eval_name=eval_name, progress=None if as_json else progress)
        if as_json:
            print_json(res.model_dump())
            return
        console.print(f"{target}: Avg@{res.k}={res.avg_at_k:.3f}  pass@{res.k}={res.pass_at_k:.3f}  "
                      f"pass@1={res.pass_at_1:.3f}  ({res.n_problems} problems, {res.wall_s:.0f} s)")



@contextmanager
def _job(ws: Any, job_id: str | None, kind: str, version_id: str, steps: int) -> Iterator[Any]:
    """Register ``job_id`` (when given) as a running job of this process; yields the progress callback that
    updates its row per step; the row ends ``done``, or ``failed`` with the error (re-raised). A killed
    process leaves it ``running`` with a dead pid, which the lineage store marks ``interrupted``."""
    if job_id is None:
        yield lambda p: None
        return
    ws.lineage.create_job(job_id, version_id, kind, steps_total=steps)

    def progress(p: dict[str, Any]) -> None:
        done, total = int(p.get("step", 0)), int(p.get("steps", steps) or 0)
        ws.lineage.update_job(job_id, steps_done=done, steps_total=total,
                              progress=min(1.0, done / total) if total else 0.0)

    try:
        yield progress
    except BaseException as exc:
        ws.lineage.update_job(job_id, status="failed", message=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    ws.lineage.update_job(job_id, status="done", progress=1.0)


def _cluster_spec(path: Path) -> Any:
    """A :class:`~evotrainer.rl_backend.openrlhf.ClusterSpec` from a YAML / JSON file.

    Raises:
        RecipeError: missing file, bad YAML, or a field fails validation (named).
    """
    from pydantic import ValidationError

    from evotrainer.recipe import RecipeError, _format_error, read_yaml
    from evotrainer.rl_backend.openrlhf import ClusterSpec

    data = read_yaml(path, "file", label=f"--cluster {path}")
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise RecipeError(f"--cluster {path}: {_format_error(err, prefix='cluster', root=ClusterSpec)}") from None
