"""Dockerfiles of the sandbox images (analyzer, code-runner, swe-runner)."""
