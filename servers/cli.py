"""CLI commands of evotrainer.servers: ``serve`` and ``mcp-config`` (added to the main app by :func:`register`).

``evotrainer serve [training|rollouts|logs|analyzers|skills|all] [--transport stdio|http] [--run PATH]
[--host H] [--port P] [--allow-public]`` runs an MCP server; ``evotrainer mcp-config [--install]``
prints (or merges into Claude Desktop's ``claude_desktop_config.json``) the ``mcpServers`` entry.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from evotrainer.cli_errors import fail

DEFAULT_RUN = Path("runs/default")
SERVER_CHOICES = ("training", "rollouts", "logs", "analyzers", "skills", "all")


def claude_config_path() -> Path:
    """Where Claude Desktop reads its config on this OS."""
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"
    if sys.platform.startswith("win"):
        return Path(os.environ.get("APPDATA", home / "AppData" / "Roaming")) / "Claude" / "claude_desktop_config.json"
    return Path(os.environ.get("XDG_CONFIG_HOME", home / ".config")) / "Claude" / "claude_desktop_config.json"


def run_folder_warning(name: str, run_dir: Path) -> str | None:
    """A warning line when ``run_dir`` is not a run folder (no ``lineage.db``) for a server that needs one.

    The ``skills`` server reads only the skills memory, so it needs no run folder.
    """
    if name == "skills" or (run_dir / "lineage.db").is_file():
        return None
    what = "does not exist" if not run_dir.exists() else "is not a run folder (no lineage.db)"
    return (f"warning: --run {run_dir} {what}: the run tools will fail until it holds a run; create one with "
            f"`evotrainer init {run_dir}` (or `evotrainer run`), or pass --run DIR of an existing run")


def backup_config(path: Path) -> Path | None:
    """Copy the config file to ``<name>.<UTC time>.bak`` beside it before it is changed; None if absent or empty."""
    import shutil
    import time

    if not path.is_file() or not path.read_text().strip():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    backup = path.with_name(f"{path.name}.{stamp}.bak")
    n = 1
    while backup.exists():  # two installs in one second keep both backups
        backup = path.with_name(f"{path.name}.{stamp}-{n}.bak")
        n += 1
    shutil.copy2(path, backup)
    return backup


def server_entry(name: str, run_dir: Path) -> dict:
    """The ``mcpServers`` entry that starts ``evotrainer serve NAME --run RUN`` with this interpreter (stdio)."""
    env = {"HF_HUB_OFFLINE": "1"}
    if os.environ.get("EVOTRAINER_SKILLS_DIR"):
        env["EVOTRAINER_SKILLS_DIR"] = os.environ["EVOTRAINER_SKILLS_DIR"]
    return {"command": sys.executable,
            "args": ["-m", "evotrainer.cli", "serve", name, "--transport", "stdio", "--run", str(run_dir)],
            "env": env}


def merge_config(path: Path, key: str, entry: dict) -> dict:
    """Merge ``{mcpServers: {key: entry}}`` into the JSON config at ``path`` (other keys kept); write atomically.

    Raises:
        ValueError: the existing file is not a JSON object.
    """
    data: dict = {}
    if path.exists() and path.read_text().strip():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); fix or move it, then rerun --install") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object at the top level")
    servers = data.setdefault("mcpServers", {})
    if not isinstance(servers, dict):
        raise ValueError(f"{path}: 'mcpServers' must be an object")
    servers[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return data


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``mcp-config`` to the main evotrainer app."""

    @app.command()
    def serve(
        name: str = typer.Argument("all", help="Server: training | rollouts | logs | analyzers | skills | all."),
        transport: str = typer.Option("stdio", "--transport", help="stdio (for Claude Desktop and agents) or http "
                                                                   "(streamable HTTP, bearer token)."),
        run_dir: Annotated[Path, typer.Option("--run", help="Run folder the tools act on.")] = DEFAULT_RUN,
        host: str = typer.Option("127.0.0.1", "--host", help="HTTP bind address (loopback unless --allow-public)."),
        port: int = typer.Option(8765, "--port", help="HTTP port."),
        allow_public: bool = typer.Option(False, "--allow-public", help="Allow a non-loopback --host."),
        backend: str = typer.Option("local", "--backend", help="Training backend: local | openrlhf."),
    ) -> None:
        """Run an MCP server over stdio or streamable HTTP."""
        if name not in SERVER_CHOICES:
            fail(f"server {name!r}: choose one of {', '.join(SERVER_CHOICES)}")
        if transport not in ("stdio", "http"):
            fail(f"--transport {transport!r}: choose stdio or http")
        if backend not in ("local", "openrlhf"):
            fail(f"--backend {backend!r}: choose local or openrlhf")
        from evotrainer.servers.app import build_server
        from evotrainer.servers.http import ServeError, serve_http

        warning = run_folder_warning(name, run_dir)
        if warning:  # stderr: stdout is the stdio transport's channel
            sys.stderr.write(warning + "\n")
            sys.stderr.flush()
        server = build_server(name, run_dir, backend=backend)
        if transport == "stdio":
            server.run("stdio")
            return

        def announce(url: str, token: str, generated: bool) -> None:
            # a generated token is printed (the client needs it); one the caller set is not echoed: review 7 found
            # EVOTRAINER_MCP_TOKEN's secret copied into stderr, i.e. into whatever keeps the server's logs
            shown = (f"bearer token (generated; set EVOTRAINER_MCP_TOKEN to choose one): {token}" if generated
                     else f"bearer token: the value of EVOTRAINER_MCP_TOKEN ({len(token)} characters; not printed)")
            sys.stderr.write(f"evotrainer MCP server '{name}' on {url}\n{shown}\n")
            sys.stderr.flush()

        try:
            serve_http(server, host=host, port=port, allow_public=allow_public, announce=announce)
        except ServeError as exc:
            fail(str(exc))

    @app.command("mcp-config")
    def mcp_config(
        run_dir: Annotated[Path, typer.Option("--run", help="Run folder the server acts on.")] = DEFAULT_RUN,
        name: str = typer.Option("all", "--server", help="Which server: training | ... | all."),
        install: bool = typer.Option(False, "--install", help="Merge the entry into Claude Desktop's config."),
        config_path: Annotated[Path | None, typer.Option(
            "--config-path", help="Config file to merge into (default: Claude Desktop's).")] = None,
        key: str = typer.Option("evotrainer", "--key", help="Name of the entry under mcpServers."),
    ) -> None:
        """Print (or --install) the Claude Desktop mcpServers entry for this install."""
        if name not in SERVER_CHOICES:
            fail(f"--server {name!r}: choose one of {', '.join(SERVER_CHOICES)}")
        run_dir = run_dir.expanduser().resolve()
        entry = server_entry(name, run_dir)
        warning = run_folder_warning(name, run_dir)
        if warning:
            sys.stderr.write(warning + "\n")
        if not install:
            sys.stdout.write(json.dumps({"mcpServers": {key: entry}}, indent=2) + "\n")
            return
        path = config_path or claude_config_path()
        backup = backup_config(path)
        try:
            merge_config(path, key, entry)
        except ValueError as exc:
            if backup is not None:  # nothing was changed: a backup of it would only pile up at each retry
                backup.unlink(missing_ok=True)
            fail(str(exc))
        if backup is not None:
            sys.stdout.write(f"backup of the previous config: {backup}\n")
        sys.stdout.write(f"installed mcpServers.{key} into {path}; restart Claude Desktop to load it\n")
