"""GRPO training backends (local torch trainer; OpenRLHF on Ray), tasks, rewards (DESIGN.md §3)."""
