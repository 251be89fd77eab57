"""The diagnostician agent: reads rollouts, logs and analyzers over MCP and says what is wrong.

Tools (role ``diagnostician``, :data:`~evotrainer.agents.mcp_client.ROLE_TOOLS`): rollouts, logs,
analyzers, skills search. Its brain (Claude or heuristic) returns a typed
:class:`~evotrainer.agents.decisions.Diagnosis`. It also evolves the harness: when a version's
held-out score moved and no finding explains it, it writes a new analyzer, runs it sandboxed
(``run_analyzer_code``), backtests it on versions whose outcome is known (``backtest_analyzer``)
and registers it (``register_analyzer``) only if it discriminates.
"""

from __future__ import annotations

from typing import Any

from evotrainer.agents.brain import Brain
from evotrainer.agents.decisions import AnalyzerDraft, Diagnosis
from evotrainer.agents.mcp_client import RoleTools, ToolBox, ToolCallError


class Diagnostician:
    """Diagnosis and analyzer evolution through the diagnostician's MCP tools.

    Args:
        brain: a brain with ``diagnose`` and ``write_analyzer`` (heuristic or Claude).
        toolbox: the MCP session.
    """

    role = "diagnostician"

    def __init__(self, brain: Brain, toolbox: ToolBox):
        self.brain = brain
        self.tools = RoleTools(toolbox, self.role)

    def diagnose(self, version_id: str, context: dict[str, Any]) -> Diagnosis:
        """Findings on ``version_id``. ``context``: parent_id, gain / significant (held-out vs parent)."""
        d = self.brain.diagnose(self.tools, version_id, context)
        d.version_id = version_id
        return d

    def evolve_analyzer(self, version_id: str, diagnosis: Diagnosis, context: dict[str, Any],
                        labels: dict[str, bool]) -> dict[str, Any]:
        """Write, run (sandboxed), backtest and maybe register a new analyzer.

        Args:
            labels: ``{version_id: True if the version turned out bad (pruned), False if kept}``,
                the known outcomes the analyzer is backtested on.

        Returns:
            ``{name, registered, reason, run, backtest}``: what happened, for the report.
        """
        draft: AnalyzerDraft | None = self.brain.write_analyzer(self.tools, version_id, diagnosis, context)
        if draft is None:
            return {"name": None, "registered": False, "reason": "the brain wrote no analyzer"}
        out: dict[str, Any] = {"name": draft.name, "kind": draft.kind, "registered": False,
                               "description": draft.description}
        try:
            run = self.tools.call("run_analyzer_code", {"code": draft.code, "version_ids": sorted(labels) or [version_id]})
            out["run"] = {k: run.get(k) for k in ("findings", "backend", "exit_code", "stderr") if k in run}
            bt = self.tools.call("backtest_analyzer", {"code": draft.code, "labels": labels})
        except ToolCallError as exc:
            out["reason"] = f"sandboxed run or backtest failed: {exc.message[:300]}"
            return out
        out["backtest"] = bt
        if not bt.get("discriminates"):
            out["reason"] = f"does not discriminate on known outcomes ({_bt_numbers(bt)}); not registered"
            return out
        try:
            self.tools.call("register_analyzer", {"name": draft.name, "code": draft.code,
                                                  "description": draft.description, "kind": draft.kind})
        except ToolCallError as exc:
            out["reason"] = f"register failed: {exc.message[:300]}"
            return out
        out["registered"] = True
        out["reason"] = f"discriminates on known outcomes ({_bt_numbers(bt)}); registered"
        return out


def _bt_numbers(bt: dict[str, Any]) -> str:
    keys = ("tp", "fp", "fn", "tn", "precision", "recall")
    return ", ".join(f"{k}={bt[k]}" for k in keys if k in bt) or "no numbers"
