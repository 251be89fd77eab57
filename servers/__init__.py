"""MCP servers: training control, rollouts, logs, analyzers, skills (docs/design.md §3).

Public API (import it from its module; this package imports nothing, so that ``evotrainer --help``, which
loads :mod:`evotrainer.servers.cli`, does not load the MCP SDK):

- :mod:`evotrainer.servers.app`: ``build_server(name, run_dir, backend=...)``, ``SERVER_NAMES``, ``TOOLSETS``,
  ``TOOL_META``, ``run_stdio``, ``describe``;
- :mod:`evotrainer.servers.http`: ``serve_http``, ``http_app`` (streamable HTTP, bearer token), ``ServeError``;
- :mod:`evotrainer.servers.common`: ``ServerState`` (the typed lifespan context), ``make_tool``, ``tool``;
- :mod:`evotrainer.servers.jobs`: ``JobManager`` (background train / evaluate jobs);
- the toolset modules ``training``, ``rollouts``, ``logs``, ``analyzers`` (with ``backtests``), ``skills``:
  their tools as typed functions, listed in each module's ``TOOLS``.
"""
