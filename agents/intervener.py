"""The intervener agent: turns findings and retrieved skills into single-factor interventions.

Tools (role ``intervener``): skills search / get, version reads. Its brain returns a
:class:`~evotrainer.agents.decisions.Proposal`; this agent then validates each candidate against the
parent's recipe (it must apply as one single-factor :class:`~evotrainer.intervention.Intervention`)
and drops changes already tried on this parent, so both brains obey the same rules. A candidate must
also apply to the run's domain (:func:`task_mismatch`): a reward term that exists only for SWE
episodes is never proposed on a math task (``test_file_edit`` on arithmetic raised RewardError at the
first step of a child).
"""

from __future__ import annotations

from typing import Any

from evotrainer.agents.brain import Brain
from evotrainer.agents.decisions import Diagnosis, Proposal
from evotrainer.agents.mcp_client import RoleTools, ToolBox
from evotrainer.recipe import Recipe, RecipeError, current_value

# Recipe paths (a path or a prefix of one) that act only on some task families (``data.task``):
# reward components that read per-sample episode outcomes only the SWE runner fills
# (``rl_backend/rewards.py``: ``extras``; elsewhere they raise RewardError), the code task's unit tests,
# the tool-use limits of agentic episodes, and the arithmetic generator's difficulty level (inert elsewhere).
TASK_ONLY: dict[str, tuple[str, ...]] = {
    "reward.swe_tests": ("swe",),
    "reward.test_file_edit": ("swe",),
    "reward.tool_budget": ("swe",),
    "reward.submit_without_test": ("swe",),
    "reward.code_tests": ("humaneval",),
    "tool_use": ("swe",),
    "data.level": ("arithmetic",),
}


def task_mismatch(path: str, task: str) -> str | None:
    """Why ``path`` does not apply to a run of task family ``task`` (None when it applies).

    >>> task_mismatch("reward.test_file_edit.weight", "arithmetic")
    "reward.test_file_edit applies to data.task swe only, not 'arithmetic'"
    """
    for prefix, tasks in TASK_ONLY.items():
        if (path == prefix or path.startswith(prefix + ".")) and task not in tasks:
            return f"{prefix} applies to data.task {' / '.join(tasks)} only, not {task!r}"
    return None


class Intervener:
    """Proposes children of a parent version through the intervener's MCP tools."""

    role = "intervener"

    def __init__(self, brain: Brain, toolbox: ToolBox):
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
            if task_mismatch(c.path, recipe.data.task):
                continue
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
