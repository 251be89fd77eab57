"""Agents and the autonomous loop: diagnostician, intervener, backtester, orchestrator (DESIGN.md §7)."""
