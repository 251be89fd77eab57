"""The ``evotrainer`` command line (typer + rich).

Core commands live here (``init``, ``lineage show|diff``, ``recipe validate``); each subpackage
adds its own through a ``register(app)`` function in its ``cli`` module (``rl_backend.cli``:
train, eval, swe; ``harness.cli``: diagnose, sandbox; ``skills_db.cli``: skills; ``servers.cli``:
serve, mcp-config; ``agents.cli``: run). Errors print one clear line and exit non-zero; ``--debug``
shows the traceback.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

app = typer.Typer(
    name="evotrainer",
    help="EvoTrainer: autonomous RL post-training that evolves the policy and the harness that judges it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
lineage_app = typer.Typer(help="Inspect a run's version lineage.", no_args_is_help=True)
recipe_app = typer.Typer(help="Work with recipes (training configurations).", no_args_is_help=True)
app.add_typer(lineage_app, name="lineage")
app.add_typer(recipe_app, name="recipe")

console = Console()
err_console = Console(stderr=True)
STATE: dict[str, Any] = {"debug": False}

SUBCOMMAND_MODULES = (
    "evotrainer.rl_backend.cli",
    "evotrainer.rl_backend.swe_cli",
    "evotrainer.sandbox_cli",
    "evotrainer.harness.cli",
    "evotrainer.skills_db.cli",
    "evotrainer.servers.cli",
    "evotrainer.agents.cli",
)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    STATE["debug"] = debug


def fail(message: str, code: int = 1) -> None:
    """Print one clear error line and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def print_json(data: Any) -> None:
    """Print JSON to stdout (no colour, machine-readable)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


# --- core commands --------------------------------------------------------------------------------
@app.command()
def init(
    run_dir: Path = typer.Argument(..., help="Run folder to create."),
    recipe: Path | None = typer.Option(None, "--recipe", help="Base recipe YAML (default recipe if omitted)."),
) -> None:
    """Create a run folder with its base version v0 (atomic: a killed init leaves no half-made run)."""
    from evotrainer.recipe import Recipe, load_recipe
    from evotrainer.workspace import Workspace, WorkspaceError

    r = load_recipe(recipe) if recipe else Recipe()
    try:
        v = Workspace.init(run_dir, r)
    except WorkspaceError as exc:
        fail(str(exc))
    console.print(f"created run {Path(run_dir).expanduser().resolve()} with base version {v.id}")


def _headline(v: Any) -> str:
    ev = v.eval_summary or {}
    parts = []
    if "avg@k" in ev:
        ci = ev.get("ci")
        ci_s = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        parts.append(f"Avg@{ev.get('k', 'k')}={ev['avg@k']:.3f}{ci_s}")
    ms = v.metrics_summary or {}
    if "reward/mean" in ms:
        parts.append(f"reward={ms['reward/mean']:.3f}")
    return "  ".join(parts)


STATUS_STYLE = {"kept": "green", "pruned": "red", "reverted": "magenta", "failed": "red bold",
                "training": "yellow", "trained": "cyan", "proposed": "dim", "merged": "blue"}


@lineage_app.command("show")
def lineage_show(
    run_dir: Path = typer.Argument(Path("runs/default"), help="Run folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the tree as JSON."),
) -> None:
    """Show the version tree with status, intervention and headline scores."""
    from evotrainer.workspace import Workspace

    ws = Workspace.open(run_dir)
    tree = ws.lineage.tree()
    if as_json:
        print_json({"tree": tree, "decisions": [d.model_dump() for d in ws.lineage.decisions()]})
        return
    if not tree:
        console.print("empty lineage")
        return
    versions = {v.id: v for v in ws.lineage.versions()}

    def label(node: dict[str, Any]) -> str:
        v = versions[node["id"]]
        style = STATUS_STYLE.get(v.status, "")
        iv = "; ".join(node["intervention"]) or "base"
        return f"[bold]{v.id}[/] [{style}]{v.status}[/] {iv}  {_headline(v)}"

    def add(t: Tree, node: dict[str, Any]) -> None:
        for c in node["children"]:
            add(t.add(label(c)), c)

    root = Tree(label(tree))
    add(root, tree)
    console.print(root)


@lineage_app.command("diff")
def lineage_diff(
    a: str = typer.Argument(..., help="First version id."),
    b: str = typer.Argument(..., help="Second version id."),
    run_dir: Path = typer.Option(Path("runs/default"), "--run", help="Run folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Recipe paths that differ between two versions."""
    from evotrainer.workspace import Workspace

    ws = Workspace.open(run_dir)
    diff = ws.lineage.diff(a, b)
    if as_json:
        print_json([{"path": p, a: va, b: vb} for p, va, vb in diff])
        return
    t = Table("path", a, b)
    for p, va, vb in diff:
        t.add_row(p, repr(va), repr(vb))
    console.print(t if diff else f"{a} and {b} have the same recipe")


@recipe_app.command("validate")
def recipe_validate(
    file: Path = typer.Argument(..., help="Recipe YAML (or a run config with a recipe: section)."),
    as_json: bool = typer.Option(False, "--json", help="Print the validated recipe as JSON."),
) -> None:
    """Validate a recipe; print the errors (field path, value, fix) or the full recipe."""
    from evotrainer.recipe import load_recipe

    r = load_recipe(file)
    if as_json:
        print_json(r.to_dict())
    else:
        console.print(f"{file}: valid recipe ({len(r.reward)} reward components, task {r.data.task})")


def _register_subcommands() -> None:
    for mod in SUBCOMMAND_MODULES:
        importlib.import_module(mod).register(app)


_register_subcommands()


def main() -> None:
    """Console-script entry point: run the app, turning known errors into one line + exit 1."""
    from evotrainer.intervention import InterventionError
    from evotrainer.lineage import LineageError
    from evotrainer.recipe import RecipeError
    from evotrainer.workspace import WorkspaceError

    known: tuple[type[BaseException], ...] = (RecipeError, InterventionError, LineageError, WorkspaceError,
                                              FileNotFoundError)
    try:
        rc = app(standalone_mode=False)  # click returns a command's exit code instead of exiting
        sys.exit(rc if isinstance(rc, int) else 0)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("aborted")
        sys.exit(130)
    except known as exc:
        if STATE["debug"]:
            console.print_exception()
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(1)
    except Exception as exc:  # click usage errors and anything unexpected
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if STATE["debug"]:
            console.print_exception()
        else:
            err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
                              highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
