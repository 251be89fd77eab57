"""The ``evotrainer`` command line (typer + rich).

Core commands live here (``init``, ``import``, ``lineage show|diff``, ``recipe validate``); each subpackage
adds its own through a ``register(app)`` function in its ``cli`` module (``rl_backend.cli``:
train, eval; ``rl_backend.swe.cli``: swe; ``sandbox.cli``: sandbox; ``harness.cli``: diagnose, analyzers,
watch; ``skills_db.cli``: skills; ``servers.cli``: serve, mcp-config; ``agents.cli``: run, compare, report).

Errors: every command fails through :func:`evotrainer.cli_errors.fail` and every known error
(:class:`evotrainer.errors.EvoTrainerError`) that reaches :func:`main` prints one clear line and exits
non-zero; the global ``--debug`` flag (or ``EVOTRAINER_DEBUG=1``) shows the traceback
(:mod:`evotrainer.cli_errors`).
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
from rich.text import Text
from rich.tree import Tree

from evotrainer import cli_errors
from evotrainer.cli_errors import fail
from evotrainer.terminal import neutralise, output_console

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

console = output_console()
err_console = Console(stderr=True, soft_wrap=True)  # progress and notes on stderr (errors: cli_errors.fail)

SUBCOMMAND_MODULES = (
    "evotrainer.rl_backend.cli",
    "evotrainer.rl_backend.swe.cli",
    "evotrainer.sandbox.cli",
    "evotrainer.harness.cli",
    "evotrainer.skills_db.cli",
    "evotrainer.servers.cli",
    "evotrainer.agents.cli",
)


def _print_version(value: bool) -> None:
    if value:
        from evotrainer import __version__

        sys.stdout.write(f"evotrainer {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors (also: EVOTRAINER_DEBUG=1)."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the installed version and exit."),
) -> None:
    cli_errors.set_debug(debug)


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
    console.print(f"created run {Path(run_dir).expanduser().resolve()} with base version {v.id}", markup=False,
                  highlight=False)


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


LINEAGE_SHOW_MAX_CHARS = 64_000
"""Characters ``lineage show`` prints of its tree (a run of a few dozen versions is a few KB; the rest is said to be
cut, with the commands that list it all). Review 16 E2-R16: a crafted store of 280 versions of 1,000 interventions
each printed 34.7 MB in 37 s."""
STATUS_STYLE = {"kept": "green", "pruned": "red", "reverted": "magenta", "failed": "red bold",
                "training": "yellow", "trained": "cyan", "proposed": "dim", "merged": "blue"}


MAX_JSON_SHOW_CHARS = 16 << 20
"""Characters ``lineage show --json`` prints in all (16 MiB). A real run's version is some 2-20 KB of JSON here (a
``metrics_summary`` of at most :data:`~evotrainer.lineage.SUMMARY_MAX` entries, an ``eval_summary`` of a few evals),
so a run of :data:`~evotrainer.lineage.MAX_LINEAGE_DEPTH` (256) versions and its last 1,000 decisions print whole
(measured: 256 versions deep, 256-entry summaries, 1,000 decisions: 6.5 MB, was 47 MB at indent=2). Past it the tree is cut (the
versions after the budget, in the order ``lineage show`` lists them, are left out), then the oldest decisions; the
JSON says so (``truncated``, ``cut``). Review 17 E2-R17: 30 versions of two 1 MB summaries printed 428 MB."""
JSON_SHOW_FIELD_MAX_CHARS = 64_000
"""Characters of JSON one version's ``eval_summary`` / ``metrics_summary`` / ``intervention`` prints in ``lineage show
--json`` (a real summary is at most ~20 KB: 256 metric means). A longer one keeps its first entries that fit (an entry
too long on its own is left out) and the cut is listed in ``cut``."""
JSON_SHOW_CUTS_LISTED_MAX = 100
"""Entries of ``cut`` listed (``cuts_omitted`` counts the rest): one per cut field, so a crafted run of thousands of
versions would list thousands."""
JSON_SHOW_KEYS_NAMED_MAX = 10
"""Names of left-out summary entries a ``cut`` entry gives (each cut to 80 characters)."""
_NODE_FIELDS = ("intervention", "eval_summary", "metrics_summary")
"""The fields of a tree node that can be large: each prints on one line (compact) and within
:data:`JSON_SHOW_FIELD_MAX_CHARS`. Printed with ``indent=2`` as before, a version ``d`` deep spent ``2 * (2d + 3)``
spaces on every entry of a list in its summary: E2-R17's 62 MB store printed 428 MB (760 MB for a chain of 30)."""


def _fit_field(value: Any, cap: int) -> tuple[Any, dict[str, Any] | None]:
    """``(value kept, what was cut or None)``: ``value`` when its JSON fits ``cap`` characters, else its first entries
    (a dict's items, a list's items) that fit, an entry too long on its own left out; any other value that does not
    fit is cut to text of ``cap`` characters saying how much more there was."""
    text = json.dumps(value, default=str)
    if len(text) <= cap:
        return value, None
    room, left_out = cap, []
    if isinstance(value, dict):
        kept: Any = {}
        for k, x in value.items():
            n = len(json.dumps(k)) + len(json.dumps(x, default=str)) + 4
            if n <= room:
                kept[k], room = x, room - n
            else:
                left_out.append(str(k))
    elif isinstance(value, list):
        kept = []
        for i, x in enumerate(value):
            n = len(json.dumps(x, default=str)) + 2
            if n > room:
                left_out = [f"[{i}:]"]
                break
            kept.append(x)
            room -= n
    else:
        kept = text[:cap] + f"... [{len(text) - cap:,} more chars]"
    note: dict[str, Any] = {"chars": len(text), "kept_chars": len(json.dumps(kept, default=str)),
                            "left_out": len(left_out) if isinstance(value, dict) else len(value) - len(kept)
                            if isinstance(value, list) else 0}
    if left_out:
        note["left_out_keys"] = [k[:80] for k in left_out[:JSON_SHOW_KEYS_NAMED_MAX]]
    return kept, note


def _node_text(node: dict[str, Any], level: int, out: list[str]) -> None:
    """``node`` (a :meth:`~evotrainer.lineage.LineageStore.tree` node) as JSON indented as ``json.dumps(indent=2)``
    indents it ``level`` spaces in, its :data:`_NODE_FIELDS` compact on one line each, appended to ``out``.
    Recursion: one frame a level (at most :data:`~evotrainer.lineage.MAX_LINEAGE_DEPTH`)."""
    pad = " " * (level + 2)
    items = []
    for k, v in node.items():
        if k == "children":
            continue
        items.append(f"{pad}{json.dumps(k)}: {json.dumps(v, default=str)}")
    out.append("{\n" + ",\n".join(items))
    kids = node.get("children") or []
    if not kids:
        out.append(f",\n{pad}\"children\": []\n{' ' * level}}}")
        return
    out.append(f",\n{pad}\"children\": [\n")
    for i, c in enumerate(kids):
        out.append(" " * (level + 4))
        _node_text(c, level + 4, out)
        out.append(",\n" if i < len(kids) - 1 else "\n")
    out.append(f"{pad}]\n{' ' * level}}}")


def _node_cost(node: dict[str, Any], depth: int) -> int:
    """Characters ``node`` (without its children) takes in :func:`_node_text` at tree depth ``depth``, or a few more
    (each field's line indented at most ``4 * depth + 6`` spaces, its separators counted generously)."""
    return sum(len(json.dumps(k)) + len(json.dumps(v, default=str)) + 4 * depth + 12
               for k, v in node.items() if k != "children") + 4 * depth + 40


def show_json_text(tree: dict[str, Any], decisions: list[dict[str, Any]], decisions_omitted: int,
                   budget: int = MAX_JSON_SHOW_CHARS, field_cap: int = JSON_SHOW_FIELD_MAX_CHARS) -> str:
    """``lineage show --json``'s text: ``{"tree", "decisions", "decisions_omitted", "truncated", "cut"}`` as JSON of
    at most about ``budget`` characters (:data:`MAX_JSON_SHOW_CHARS`; the small ``cut`` list is on top). Each node's
    large fields are cut to ``field_cap`` characters (:func:`_fit_field`); then the nodes past the budget, in
    pre-order, are left out with their subtrees (``cut``: ``{"field": "tree", "versions_left_out": n}``); then the
    oldest decisions (counted in ``decisions_omitted``). ``truncated`` is true when anything was cut; ``cut`` lists
    what (at most :data:`JSON_SHOW_CUTS_LISTED_MAX` entries, ``cuts_omitted`` the rest). ``tree``/``decisions`` are
    changed in place."""
    cuts: list[dict[str, Any]] = []
    room = budget - 200
    order: list[tuple[dict[str, Any], dict[str, Any] | None, int]] = []  # (node, parent, depth), pre-order
    stack: list[tuple[dict[str, Any], dict[str, Any] | None, int]] = [(tree, None, 0)] if tree else []
    while stack:
        node, parent, depth = stack.pop()
        order.append((node, parent, depth))
        stack.extend((c, node, depth + 1) for c in reversed(node.get("children") or []))
    kept_nodes, left = 0, 0
    for node, parent, depth in order:
        if left or (parent is not None and parent.get("_dropped")):
            node["_dropped"] = True
            left += 1
            continue
        for f in _NODE_FIELDS:
            if f in node:
                node[f], note = _fit_field(node[f], field_cap)
                if note:
                    cuts.append({"version": str(node.get("id"))[:80], "field": f, **note})
        cost = _node_cost(node, depth)
        if cost > room and kept_nodes:
            node["_dropped"] = True
            left += 1
            continue
        room -= cost
        kept_nodes += 1
    if left:
        for node, _, _ in order:
            if node.get("children"):
                node["children"] = [c for c in node["children"] if not c.get("_dropped")]
        cuts.append({"field": "tree", "versions_left_out": left})
    texts = [json.dumps(d, default=str) for d in decisions]
    first = 0
    while first < len(texts) and sum(len(t) + 6 for t in texts[first:]) > max(room, 0):
        first += max(1, (len(texts) - first) // 8)  # the oldest first, in eighths: a few sums, not one per decision
    first = min(first, len(texts))
    if first:
        cuts.append({"field": "decisions", "left_out": first})
        decisions_omitted += first
    out = ['{\n  "tree": ']
    if tree:
        _node_text(tree, 2, out)
    else:
        out.append("{}")
    kept = texts[first:]
    out.append(',\n  "decisions": ' + ("[\n    " + ",\n    ".join(kept) + "\n  ]" if kept else "[]"))
    listed = cuts[:JSON_SHOW_CUTS_LISTED_MAX]
    out.append(f',\n  "decisions_omitted": {int(decisions_omitted)},\n  "truncated": {json.dumps(bool(cuts))}'
               f',\n  "cut": ' + ("[\n    " + ",\n    ".join(json.dumps(c) for c in listed) + "\n  ]" if listed
                                  else "[]"))
    if len(cuts) > len(listed):
        out.append(f',\n  "cuts_omitted": {len(cuts) - len(listed)}')
    out.append("\n}\n")
    return "".join(out)


@lineage_app.command("show")
def lineage_show(
    run_dir: Path = typer.Argument(Path("runs/default"), help="Run folder."),
    run_opt: Path | None = typer.Option(None, "--run", help="Run folder (the same as the argument, as in "
                                                             "`lineage diff --run`)."),
    as_json: bool = typer.Option(False, "--json", help="Print the tree as JSON."),
) -> None:
    """Show the version tree with status, intervention and headline scores."""
    from evotrainer.workspace import Workspace

    ws = Workspace.open(run_opt or run_dir)
    all_versions = ws.lineage.versions()  # read once (E2-R16: a crafted store's versions take seconds to read)
    tree = ws.lineage.tree(all_versions)
    if as_json:
        # the run's last 1,000 decisions, each cut as an MCP reply cuts it (review 15 A-R15: 4,000 decisions of ~1 MB
        # printed 318 MiB); decisions_omitted counts the earlier ones
        decisions, total = ws.lineage.decisions_brief(None, last=1000)
        sys.stdout.write(show_json_text(tree, [d.model_dump() for d in decisions], total - len(decisions)))
        return
    if not tree:
        console.print("empty lineage")
        return
    versions = {v.id: v for v in all_versions}
    room = [LINEAGE_SHOW_MAX_CHARS]  # characters of labels still to print (the tree's guides are a few more a line)

    def label(node: dict[str, Any]) -> Text:  # Text, never markup: values come from any MCP client
        v = versions[node["id"]]
        style = STATUS_STYLE.get(v.status, "")
        iv = v.describe_change()  # the report's words: a control arm reads "continue (control)", not "base"
        # every part neutralised (T1-R19: a crafted lineage.db's version id ESC]0;..ESC\\ ESC[2J set the title and
        # cleared a terminal): ids, statuses and summaries come from the store, which any MCP client or file writes
        text = Text.assemble((neutralise(v.id), "bold"), " ", (neutralise(v.status), style),
                             f" {neutralise(iv)}  {neutralise(_headline(v))}")
        room[0] -= len(text.plain) + 8
        return text

    def add(t: Tree, node: dict[str, Any]) -> None:
        for c in node["children"]:
            if room[0] <= 0:
                return
            add(t.add(label(c)), c)

    root = Tree(label(tree))
    add(root, tree)
    with console.capture() as captured:
        console.print(root)
    text = captured.get()
    if len(text) > LINEAGE_SHOW_MAX_CHARS or room[0] <= 0:
        text = text[:text.rfind("\n", 0, LINEAGE_SHOW_MAX_CHARS) + 1]  # whole lines
        text += (f"... output cut at {LINEAGE_SHOW_MAX_CHARS:,} characters (the lineage has {len(versions):,} "
                 "versions); `evotrainer lineage show --json` or the MCP tool list_versions lists them all\n")
    sys.stdout.write(text)


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
    # plain text, never markup: a stored recipe value such as "[/x]" is no rich tag (review 19, T1-R19's kin)
    t = Table()
    for header in ("path", a, b):
        t.add_column(Text(neutralise(header)))
    for p, va, vb in diff:
        t.add_row(Text(neutralise(p)), Text(neutralise(repr(va))), Text(neutralise(repr(vb))))
    console.print(t if diff else Text(f"{neutralise(a)} and {neutralise(b)} have the same recipe"))


@recipe_app.command("validate")
def recipe_validate(
    file: Path = typer.Argument(..., help="Recipe YAML, or a run config (budget, mode, ... and a recipe: section)."),
    as_json: bool = typer.Option(False, "--json", help="Print the validated recipe (or run config) as JSON."),
) -> None:
    """Validate a recipe or a whole run config; print the errors (field path, value, rule, fix).

    A run config is checked in every section (`budget.*`, `mode`, `recipe.*`).
    A recipe's `data.path` must name an existing file or folder (relative to the current directory).
    """
    from evotrainer.config import is_run_config, load_run_config
    from evotrainer.recipe import RecipeError, load_recipe, read_yaml

    try:
        raw = read_yaml(file, "recipe file") if file.is_file() else None
    except RecipeError:
        raw = None  # the loaders below report the YAML error with the file name
    cfg = load_run_config(file) if is_run_config(raw) else None
    r = cfg.recipe if cfg is not None else load_recipe(file)
    prefix = "config.recipe" if cfg is not None else "recipe"
    if r.data.path and not Path(r.data.path).exists():
        raise RecipeError(f"{prefix}.data.path={r.data.path!r}: no such file or folder (from {Path.cwd()}); "
                          "fix the path or run from the folder it is relative to")
    if as_json:
        print_json(cfg.model_dump(mode="json") if cfg is not None else r.to_dict())
        return
    what = f"{len(r.reward)} reward components, task {r.data.task}"
    if cfg is not None:
        b = cfg.budget
        console.print(f"{file}: valid run config (mode {cfg.mode}, {b.max_versions} versions x "
                      f"{b.steps_per_version} steps; recipe: {what})", highlight=False, soft_wrap=True)
    else:
        console.print(f"{file}: valid recipe ({what})", highlight=False, soft_wrap=True)


@app.command("import")
def import_cmd(
    path: Path = typer.Argument(..., help="A foreign run: verl log, trainer_state.json, TensorBoard events, "
                                          "JSONL metrics, rollout dumps, or a folder of them."),
    run_dir: Path = typer.Option(..., "--run", help="New run folder to create."),
    as_json: bool = typer.Option(False, "--json", help="Print what was imported as JSON."),
) -> None:
    """Import a foreign run (any format `diagnose` reads) as version v0 of a new run folder, for `serve --run`."""
    import dataclasses

    from evotrainer.harness.importer import RunImportError, import_run
    from evotrainer.harness.ingest import IngestError

    try:
        s = import_run(path, run_dir)
    except (IngestError, RunImportError) as exc:
        fail(str(exc))
    if as_json:
        print_json(dataclasses.asdict(s))
        return
    kinds = ", ".join(f"{f['kind']} [{f['severity']}]" for f in s.findings) or "none"
    console.print(f"imported {s.source} into {s.run_dir} as {s.version_id}: {s.n_steps} steps, {s.n_metrics} "
                  f"metrics, {s.n_rollouts} rollouts, {s.n_log_lines} log lines; findings: {kinds}",
                  highlight=False, soft_wrap=True, markup=False)
    for note in s.notes:  # what the import left out (caps reached), also in the run log
        err_console.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
    console.print(f"serve it: evotrainer serve all --run {s.run_dir}", highlight=False, soft_wrap=True, markup=False)


def _register_subcommands() -> None:
    for mod in SUBCOMMAND_MODULES:
        importlib.import_module(mod).register(app)


_register_subcommands()


def _known_errors() -> tuple[type[BaseException], ...]:
    """The error classes printed as one line, of the modules loaded now (:func:`cli_errors.known_errors`)."""
    return cli_errors.known_errors()


def main() -> None:
    """Console-script entry point: run the app through the one exit path (:func:`cli_errors.run`)."""
    sys.exit(cli_errors.run(app))


if __name__ == "__main__":
    main()
