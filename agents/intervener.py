"""The intervener agent: turns findings and retrieved skills into single-factor interventions.

Tools (role ``intervener``): skills search / get, version reads. Its brain returns a
:class:`~evotrainer.agents.decisions.Proposal`; this agent then validates each candidate against the
parent's recipe (it must apply as one single-factor :class:`~evotrainer.intervention.Intervention`)
and drops changes already tried on this parent, so both brains obey the same rules.
"""

from __future__ import annotations

from typing import Any

from evotrainer.agents.decisions import Diagnosis, Proposal
from evotrainer.agents.mcp_client import RoleTools, ToolBox

from evotrainer.recipe import Recipe, RecipeError, current_value


class Intervener:
    """Proposes children of a parent version through the intervener's MCP tools."""

    role = "intervener"

    def __init__(self, brain: Any, toolbox: ToolBox):
        self.brain = brain
        self.tools = RoleTools(toolbox, self.role)

    def propose(self, parent_id: str, recipe: Recipe, diagnosis: Diagnosis, tried: set[str],
                context: dict[str, Any]) -> Proposal:
        """Validated, untried single-factor candidates for children of ``parent_id``.

        Args:
            recipe: the parent's recipe. tried: candidate keys (``path=json(new)``) already tried on it.
        """
        p = self.brain.propose(self.tools, parent_id, recipe, diagnosis, tried, context)
        valid, seen = [], set(tried)
        for c in p.candidates:
            try:
                old = current_value(recipe, c.path)
            except RecipeError:
                continue
            if c.key() in seen:
                continue
            try:
                c.to_intervention(old).apply(recipe)
            except Exception:  # noqa: BLE001 (invalid candidates are dropped)
                continue
            seen.add(c.key())
            valid.append(c)
        return Proposal(parent_id=parent_id, candidates=valid, skills_used=p.skills_used, rationale=p.rationale)
