"""The diagnostic harness: metrics, analyzers, ingest, statistics, backtests, gate, sandbox (DESIGN.md §4)."""
