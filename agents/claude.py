"""The Claude brain: each agent role is a plain tool-use loop over the anthropic Messages API.

For one role call (diagnose, propose, rank, decide, write an analyzer) the brain sends a system
prompt, the task with its context (JSON), the role's MCP tools (name, description, input schema as
the servers list them) and one ``submit_<output>`` tool whose input schema is the pydantic output
model (:mod:`evotrainer.agents.decisions`). Each ``tool_use`` block is executed through MCP
(:class:`~evotrainer.agents.mcp_client.RoleTools`) and answered with a ``tool_result`` (tool errors
as ``is_error``, so the model can fix its call); the loop ends when the model calls the submit tool
with a valid answer, or after ``max_turns`` (a hard cap).

Accounting: input / output tokens and cost (USD, :data:`PRICES` per million tokens) summed over all
calls in :attr:`ClaudeBrain.usage`. Retries: the SDK retries 429 / 5xx / connection errors
(``max_retries``); if a role call still fails (API error, no answer within the cap), the brain
falls back to the heuristic brain for that call and counts it in ``usage["fallbacks"]``, so an
autonomous run never stops on a flaky API.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import BaseModel, ValidationError

from evotrainer.agents.analyzer_templates import CONTRACT
from evotrainer.agents.decisions import AnalyzerDraft, Diagnosis, Proposal, Ranking, Verdict, gate_verdict
from evotrainer.agents.heuristic import HeuristicBrain
from evotrainer.agents.mcp_client import RoleTools, ToolCallError
from evotrainer.errors import EvoTrainerError
from evotrainer.harness.synthesis import KEEP_RULE
from evotrainer.recipe import Recipe

# USD per million tokens (input, output), by model-id prefix (Anthropic price list).
PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-5": (5.0, 25.0), "claude-opus-4-1": (15.0, 75.0), "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4": (3.0, 15.0), "claude-3-7-sonnet": (3.0, 15.0), "claude-haiku-4": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
}
MAX_RESULT_CHARS = 12000  # a tool result longer than this is cut (with a marker) before it is sent

SYSTEM = (
    "You are the {role} of EvoTrainer, an autonomous RL post-training system (GRPO) that evolves both the "
    "policy's training recipe and the diagnostic harness that judges it. You act only through the tools given. "
    "Ground every claim in tool results and quote the numbers. When done, call {submit} exactly once with your "
    "answer; it is validated and stored as the decision record."
)


class BrainError(EvoTrainerError, RuntimeError):
    """A role call produced no valid answer (API error, or no submit within the turn cap)."""


def price_of(model: str) -> tuple[float, float]:
    """(input, output) USD per million tokens for ``model`` (the Sonnet price when unknown)."""
    for prefix, p in sorted(PRICES.items(), key=lambda kv: -len(kv[0])):
        if model.startswith(prefix):
            return p
    return PRICES["claude-sonnet-4"]


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema with ``$defs`` references inlined (simpler for tool input schemas)."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(defs[node["$ref"].split("/")[-1]])
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(x) for x in node]
        return node

    return walk(schema)


class ClaudeBrain:
    """Claude as the brain of every agent role (see the module docstring).

    Args:
        model: Anthropic model id (``RunConfig.claude_model``).
        api_key: defaults to ``ANTHROPIC_API_KEY``.
        base_url: API base URL (defaults to the SDK's; tests point it at a fake server on 127.0.0.1).
        max_turns: hard cap on model calls per role call.
        max_retries: SDK retries per model call.
        max_tokens: output tokens per model call.
    """

    name = "claude"

    def __init__(self, model: str = "claude-sonnet-5-5", api_key: str | None = None, base_url: str | None = None,
                 max_turns: int = 12, max_retries: int = 3, max_tokens: int = 2048, timeout_s: float = 120.0):
        import anthropic  # heavy (seconds): only when a Claude brain is made

        self.model = model
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.client = anthropic.Anthropic(api_key=api_key or os.environ.get("ANTHROPIC_API_KEY"),
                                          base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL") or None,
                                          max_retries=max_retries, timeout=timeout_s)
        self.fallback = HeuristicBrain()
        self.usage: dict[str, Any] = {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "turns": 0,
                                      "calls": 0, "fallbacks": 0, "model": model}

    # --- the tool-use loop ------------------------------------------------------------------------------
    def run_role(self, tools: RoleTools, task: str, output: type[BaseModel], submit: str) -> BaseModel:
        """Run one role call to a validated ``output``.

        Raises:
            BrainError: API failure after retries, or no valid submit within ``max_turns``.
        """
        import anthropic

        specs = [{"name": s["name"], "description": s["description"][:1000], "input_schema": s["input_schema"]}
                 for s in tools.specs()]
        specs.append({"name": submit, "description": f"Submit your final answer ({output.__name__}).",
                      "input_schema": _inline_refs(output.model_json_schema())})
        system = SYSTEM.format(role=tools.role, submit=submit)
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        self.usage["calls"] += 1
        in_p, out_p = price_of(self.model)
        for _ in range(self.max_turns):
            try:
                resp = self.client.messages.create(model=self.model, max_tokens=self.max_tokens, system=system,
                                                   tools=specs, messages=messages)
            except anthropic.APIError as exc:
                raise BrainError(f"Anthropic API error: {exc}") from exc
            self.usage["turns"] += 1
            u = resp.usage
            self.usage["input_tokens"] += u.input_tokens
            self.usage["output_tokens"] += u.output_tokens
            self.usage["cost_usd"] = round(self.usage["cost_usd"] + (u.input_tokens * in_p + u.output_tokens * out_p)
                                           / 1e6, 6)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in resp.content]})
            uses = [b for b in resp.content if b.type == "tool_use"]
            if not uses:
                messages.append({"role": "user", "content": f"Call {submit} with your answer now."})
                continue
            results = []
            answer = None
            for b in uses:
                if b.name == submit:
                    try:
                        answer = output.model_validate(b.input)
                        results.append({"type": "tool_result", "tool_use_id": b.id, "content": "stored"})
                    except ValidationError as exc:
                        results.append({"type": "tool_result", "tool_use_id": b.id, "is_error": True,
                                        "content": f"invalid {output.__name__}: {exc}; fix the fields and resubmit"})
                    continue
                try:
                    out = tools.call(b.name, dict(b.input or {}))
                    text = json.dumps(out, default=str)
                    if len(text) > MAX_RESULT_CHARS:
                        text = text[:MAX_RESULT_CHARS] + f"... [{len(text) - MAX_RESULT_CHARS} more chars cut]"
                    results.append({"type": "tool_result", "tool_use_id": b.id, "content": text})
                except ToolCallError as exc:
                    results.append({"type": "tool_result", "tool_use_id": b.id, "is_error": True,
                                    "content": exc.message[:2000]})
            if answer is not None:
                return answer
            messages.append({"role": "user", "content": results})
        raise BrainError(f"no valid {submit} within {self.max_turns} turns")

    def _with_fallback(self, fn_name: str, tools: RoleTools, task: str, output: type[BaseModel], submit: str,
                       *fallback_args: Any) -> Any:
        try:
            return self.run_role(tools, task, output, submit)
        except BrainError as exc:
            self.usage["fallbacks"] += 1
            self.usage.setdefault("errors", []).append(str(exc)[:300])
            return getattr(self.fallback, fn_name)(tools, *fallback_args)

    # --- roles ------------------------------------------------------------------------------------------
    def diagnose(self, tools: RoleTools, version_id: str, context: dict[str, Any]) -> Diagnosis:
        """Diagnose ``version_id`` with the diagnostician's tools."""
        task = (f"Diagnose version {version_id}. Context (JSON): {json.dumps(_slim(context), default=str)}\n"
                "Run the analyzers on it (run_analyzer), look at metrics and rollouts as needed, and submit a "
                "Diagnosis: the findings (kind, severity, evidence refs, explanation with numbers), a short summary, "
                "and unexplained=true only if the held-out score moved significantly and no finding explains it.")
        return self._with_fallback("diagnose", tools, task, Diagnosis, "submit_diagnosis", version_id, context)

    def propose(self, tools: RoleTools, parent_id: str, recipe: Recipe, diagnosis: Diagnosis, tried: set[str],
                context: dict[str, Any]) -> Proposal:
        """Single-factor intervention candidates for children of ``parent_id``."""
        task = (f"Propose children of version {parent_id}. Its diagnosis: {diagnosis.model_dump_json()}\n"
                f"Its recipe (JSON): {json.dumps(recipe.to_dict())}\nAlready tried on it: {sorted(tried)}\n"
                "Search the skill memory for the findings (search_skills with finding_kinds), then submit a Proposal "
                "with up to 6 candidates, best first. Each candidate changes exactly ONE recipe path (dotted, e.g. "
                "'generate_max_len', 'reward.format_token.weight', 'data.level') to a new valid value, with a "
                "hypothesis citing the finding, the metric expected to move and its direction, the finding kinds it "
                "addresses, and source 'skill:<id>' when it comes from a skill.")
        return self._with_fallback("propose", tools, task, Proposal, "submit_proposal", parent_id, recipe, diagnosis,
                                   tried, context)

    def rank(self, tools: RoleTools, parent_id: str, proposal: Proposal, diagnosis: Diagnosis,
             n_choose: int) -> Ranking:
        """Backtest and rank the candidates; choose ``n_choose``."""
        task = (f"Rank these candidate children of {parent_id} before any training is paid for: "
                f"{json.dumps([c.model_dump() for c in proposal.candidates])}\nDiagnosis: {diagnosis.summary}\n"
                "Use rescore_rollouts for reward changes and replay_filter for group-filter / data changes on the "
                f"parent's stored rollouts. Submit a Ranking with a score per candidate index and chosen = the "
                f"{n_choose} best indices (distinct recipe paths).")
        return self._with_fallback("rank", tools, task, Ranking, "submit_ranking", parent_id, proposal, diagnosis,
                                   n_choose)

    def decide(self, tools: RoleTools, version_id: str, gate: dict[str, Any], diagnosis: Diagnosis) -> Verdict:
        """Keep or prune a trained version from the gate and the findings."""
        task = (f"Decide on version {version_id}. Promotion gate: {json.dumps(gate, default=str)[:4000]}\n"
                f"Diagnosis: {diagnosis.model_dump_json()[:4000]}\nRules: keep only if the gate promotes: an intervention's "
                "dev gain and CI are measured against the round's control arm (baseline_id; the parent's recipe "
                "continued), its CI must be above 0 and no blocking finding may stand (`waived` lists findings every "
                "candidate of the round shares, which do not block); a control (is_control) is kept when the gate "
                "promotes it: no change beat it and training longer did not hurt. Never keep a version with a "
                "reward-hacking finding. Submit a Verdict (action keep or prune) whose rationale quotes both gains "
                "(vs control, vs parent), the CIs and the findings, with evidence refs.")
        v = self._with_fallback("decide", tools, task, Verdict, "submit_verdict", version_id, gate, diagnosis)
        rule = gate_verdict(version_id, gate, diagnosis)
        if v.action == "keep" and rule.action != "keep":
            # The gate is a hard rule (docs/design.md §2, "Gate"): the model may not promote what the gate refuses.
            return rule
        return v

    def write_analyzer(self, tools: RoleTools, version_id: str, diagnosis: Diagnosis,
                       context: dict[str, Any]) -> AnalyzerDraft | None:
        """Write a new analyzer for an unexplained held-out move (the orchestrator backtests the draft in the
        sandbox and keeps it only under ``harness.synthesis.KEEP_RULE``, the offline synthesiser's rule)."""
        task = (f"Version {version_id} moved on held-out and no finding explains it. Diagnosis: "
                f"{diagnosis.model_dump_json()[:3000]}\nWrite a new analyzer that would detect what changed. "
                f"{CONTRACT}\nTry it with run_analyzer_code, then submit an AnalyzerDraft (name, kind, description, "
                f"code). It is backtested on the versions of known outcome and kept only when it discriminates "
                f"({KEEP_RULE}); a rule that fires on every version, or fits the few labels by chance, is dropped.")
        return self._with_fallback("write_analyzer", tools, task, AnalyzerDraft, "submit_analyzer", version_id,
                                   diagnosis, context)


def _slim(ctx: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ctx.items() if k != "recipe"}
