"""The backtester agent: judges interventions before training is paid for, and gates versions.

Tools (roles ``backtester`` and ``decider``): re-score stored rollouts with a changed reward
(``rescore_rollouts``), replay a changed group filter on stored groups (``replay_filter``), analyzer
backtests, and the promotion gate (``gate_version``). Returns a
:class:`~evotrainer.agents.decisions.Ranking` of the proposal and, after training, a
:class:`~evotrainer.agents.decisions.Verdict` per version.
"""

from __future__ import annotations

from typing import Any

from evotrainer.agents.brain import Brain
from evotrainer.agents.decisions import Diagnosis, Proposal, Ranking, Verdict
from evotrainer.agents.mcp_client import RoleTools, ToolBox


class Backtester:
    """Ranks candidates and gates trained versions through MCP tools."""

    role = "backtester"

    def __init__(self, brain: Brain, toolbox: ToolBox):
        self.brain = brain
        self.tools = RoleTools(toolbox, self.role)
        self.decider_tools = RoleTools(toolbox, "decider")

    def rank(self, parent_id: str, proposal: Proposal, diagnosis: Diagnosis, n_choose: int) -> Ranking:
        """Scores for every candidate and the ``n_choose`` to train: distinct changes (a recipe path with a
        value), so two magnitudes of one field (a learning rate bracketed x3 and x10) may share a round."""
        r = self.brain.rank(self.tools, parent_id, proposal, diagnosis, n_choose)
        n = len(proposal.candidates)
        chosen: list[int] = []
        changes: set[tuple[str, str]] = set()
        for i in r.chosen:
            if not 0 <= i < n or i in chosen:
                continue
            c = proposal.candidates[i]
            change = (c.path, repr(c.new))
            if change not in changes:
                chosen.append(i)
                changes.add(change)
        r.chosen = chosen[:n_choose]
        return r

    def gate(self, version_id: str) -> dict[str, Any]:
        """The promotion gate's verdict on ``version_id`` (``gate_version``): promote, gain, ci, p_value,
        blocking findings, reason. The root is judged on its findings only (it is the baseline).

        Raises:
            ToolCallError: the gate tool failed.
        """
        return self.decider_tools.call("gate_version", {"version_id": version_id})

    def decide(self, version_id: str, gate: dict[str, Any], diagnosis: Diagnosis) -> Verdict:
        """Keep / prune verdict on a trained, evaluated version."""
        v = self.brain.decide(self.decider_tools, version_id, gate, diagnosis)
        v.version_id = version_id
        if v.action in ("prune", "revert"):  # the gate's typed damage flag, whichever brain decided
            v.damaged_weights = gate.get("damaged_weights")
        return v
