"""Agents and the autonomous loop: diagnostician, intervener, backtester, orchestrator (docs/design.md §1)."""
