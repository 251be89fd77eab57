"""The Brain protocol: what the agents of the loop ask of a brain (docs/design.md §2, "Proposal").

The loop's agents (:mod:`.diagnostician`, :mod:`.intervener`, :mod:`.backtester`) and the harness
evolution (:mod:`.evolution`) call a brain with the MCP tools of their role
(:class:`~evotrainer.agents.mcp_client.RoleTools`) and get the typed outputs of
:mod:`evotrainer.agents.decisions` back. :class:`~evotrainer.agents.heuristic.HeuristicBrain` and
:class:`~evotrainer.agents.claude.ClaudeBrain` both conform; any object with these members can drive the loop.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from evotrainer.agents.decisions import AnalyzerDraft, Diagnosis, Proposal, Ranking, Verdict
from evotrainer.agents.mcp_client import RoleTools
from evotrainer.recipe import Recipe


@runtime_checkable
class Brain(Protocol):
    """A brain of every agent role: diagnose, propose, rank, decide, write an analyzer.

    Attributes:
        name: short name, e.g. ``heuristic`` (the loop's decisions are authored ``orchestrator/<name>``).
        usage: tokens, cost and turns spent so far (summed into kv ``loop/usage``; zeros for offline brains).
    """

    name: str
    usage: dict[str, Any]

    def diagnose(self, tools: RoleTools, version_id: str, context: dict[str, Any]) -> Diagnosis:
        """Findings on ``version_id``; ``context``: parent_id, gain / significant (dev vs parent), summaries."""
        ...

    def propose(self, tools: RoleTools, parent_id: str, recipe: Recipe, diagnosis: Diagnosis, tried: set[str],
                context: dict[str, Any]) -> Proposal:
        """Single-factor candidates for children of ``parent_id`` (``tried``: change keys already tried on it)."""
        ...

    def rank(self, tools: RoleTools, parent_id: str, proposal: Proposal, diagnosis: Diagnosis,
             n_choose: int) -> Ranking:
        """A score per candidate (backtests, track record) and the ``n_choose`` to train."""
        ...

    def decide(self, tools: RoleTools | None, version_id: str, gate: dict[str, Any], diagnosis: Diagnosis) -> Verdict:
        """Keep / prune a trained, evaluated version; never keeps what the gate rule refuses
        (:func:`~evotrainer.agents.decisions.gate_verdict`)."""
        ...

    def write_analyzer(self, tools: RoleTools, version_id: str, diagnosis: Diagnosis,
                       context: dict[str, Any]) -> AnalyzerDraft | None:
        """A new analyzer for an unexplained dev move (None: none written)."""
        ...
