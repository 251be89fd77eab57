"""LanceDB memory: skills, failed cases, search traces, version summaries (DESIGN.md §5)."""
