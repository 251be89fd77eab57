"""MCP servers: training control, rollouts, logs, analyzers, skills (DESIGN.md §6)."""
