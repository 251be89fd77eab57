"""GRPO training backends (local torch trainer; OpenRLHF on Ray), tasks, rewards (docs/design.md §1)."""
