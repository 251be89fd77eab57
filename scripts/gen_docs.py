"""Regenerate the README's generated sections from the code (configuration reference, MCP tool catalogue).

Sections sit between ``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->``.
``python scripts/gen_docs.py`` rewrites them; ``--check`` exits 1 when the README is out of date
(tests/test_docs.py runs the check so the README cannot drift from the pydantic models and tools).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _type_name(ann: Any) -> str:
    s = getattr(ann, "__name__", None) if not hasattr(ann, "__args__") else None
    text = (s or str(ann)).replace("typing.", "").replace("NoneType", "None")
    # a strict text field (recipe.Text, Annotated[str, Strict()]) reads as its type; Optional[X] as X | None
    text = re.sub(r"Annotated\[(\w+), Strict\(strict=True\)\]", r"\1", text)
    return re.sub(r"^Optional\[(.*)\]$", r"\1 | None", text)


def _model_rows(model: type[BaseModel], prefix: str, out: list[str]) -> None:
    for name, f in model.model_fields.items():
        ann = f.annotation
        path = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            _model_rows(ann, path + ".", out)
            continue
        default = f.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        elif isinstance(default, dict):
            default = {k: (v.model_dump(mode="json") if isinstance(v, BaseModel) else v) for k, v in default.items()}
        desc = (f.description or "").replace("|", "\\|")
        out.append(f"| `{path}` | `{_type_name(ann)}` | `{default!r}` | {desc} |".replace("\n", " "))


def config_reference() -> str:
    """Markdown tables of every run-config and recipe field with type, default and description."""
    from evotrainer.config import Budget, RunConfig
    from evotrainer.recipe import REWARD_COMPONENTS, RewardComponent

    rows: list[str] = []
    head = "| field | type | default | description |\n|---|---|---|---|"
    run_fields = {k: v for k, v in RunConfig.model_fields.items() if k not in ("budget", "recipe")}
    for name, f in run_fields.items():
        rows.append(f"| `{name}` | `{_type_name(f.annotation)}` | `{f.get_default()!r}` | {f.description} |")
    _model_rows(Budget, "budget.", rows)
    recipe_rows: list[str] = []
    from evotrainer.recipe import Recipe

    _model_rows(Recipe, "recipe.", recipe_rows)
    comp_rows: list[str] = []
    _model_rows(RewardComponent, "recipe.reward.<name>.", comp_rows)
    return "\n".join([
        "Run config (`evotrainer run CONFIG`):", "", head, *rows, "",
        "Recipe (`recipe:` section; field names follow OpenRLHF's GRPO flags):", "", head, *recipe_rows, *comp_rows, "",
        f"Reward component names: {', '.join(f'`{c}`' for c in REWARD_COMPONENTS)}.",
    ])


def mcp_catalogue() -> str:
    """Markdown list of every MCP tool, resource and prompt of `evotrainer serve all`, by server."""
    try:
        from evotrainer.servers.app import build_server
    except ImportError:
        return "(the MCP servers are not built yet)"
    from mcp import Client

    async def collect(name: str, run_dir: str) -> list[str]:
        server = build_server(name, run_dir)
        async with Client(server) as c:
            tools = await c.list_tools()
            lines = [f"- `{t.name}`: {(t.description or '').strip().splitlines()[0]}" for t in tools.tools]
            if name == "training":
                res = await c.list_resources()
                lines += [f"- resource `{r.uri}`: {(r.description or '').strip().splitlines()[0]}" for r in res.resources]
            if name == "all":
                prompts = await c.list_prompts()
                lines = [f"- prompt `{p.name}`: {(p.description or '').strip().splitlines()[0]}" for p in prompts.prompts]
            return lines

    out: list[str] = []
    with tempfile.TemporaryDirectory() as d:
        from evotrainer.workspace import Workspace

        Workspace(d).close()
        for name in ("training", "rollouts", "logs", "analyzers", "skills", "all"):
            lines = asyncio.run(collect(name, d))
            title = "prompts" if name == "all" else f"`{name}` server"
            out += [f"**{title}**", "", *lines, ""]
    return "\n".join(out).rstrip()


SECTIONS = {"config-reference": config_reference, "mcp-catalogue": mcp_catalogue}


def render(text: str) -> str:
    """README text with every generated section replaced by fresh output."""
    for name, fn in SECTIONS.items():
        pat = re.compile(rf"(<!-- BEGIN GENERATED: {name} -->\n)(?:.*?\n)?(<!-- END GENERATED: {name} -->)", re.S)
        if pat.search(text):
            body = fn()
            text = pat.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if the README is out of date")
    args = ap.parse_args()
    old = README.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print("README.md generated sections are out of date: run `python scripts/gen_docs.py`")
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
