"""What the analyzer and backtest tools share: the run's evidence, its runtime analyzers, the finding model.

:mod:`evotrainer.servers.analyzers` and :mod:`evotrainer.servers.backtests` both import this module (and not
each other's internals): :func:`evidence_of` builds the harness ``Evidence`` of checked versions,
:func:`sync_registry` registers in this process the runtime analyzers a run stores under :data:`KV_KEY`,
and :class:`FindingInfo` is the result model of a harness ``Finding``.
"""

from __future__ import annotations

import threading
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from evotrainer.harness import analyzers as reg
from evotrainer.harness.evidence import Evidence
from evotrainer.harness.findings import Finding
from evotrainer.servers.common import MAX_TEXT_CHARS, require_version
from evotrainer.workspace import Workspace

KV_KEY = "analyzers/registered"  # {name: {code, kinds, description, timeout_s, memory_mb}}
REGISTRY_LOCK = threading.RLock()
"""Held while this process's analyzer registry is checked and changed (:func:`sync_registry`, MCP
``register_analyzer``): two tool calls syncing at once both found a stored analyzer unregistered and the second
registration was refused as "registered already" (review 12, K-R12)."""
STORED_TIMEOUT_MAX = 600.0  # s: the bounds of MCP register_analyzer's arguments (servers/analyzers.py)
STORED_MEMORY_MB = (64, 16384)
STORED_NAME_MAX = 64  # characters of an analyzer name (register_analyzer's name argument; its description: MAX_TEXT_CHARS)
STORED_KINDS_MAX = 32  # finding kinds one analyzer reports (each a name of at most STORED_NAME_MAX characters)


class FindingInfo(BaseModel):
    """One finding: a failure kind seen in some versions over some steps (harness/findings.py)."""

    kind: str
    severity: str = Field(description="info | warn | blocking")
    versions: list[str]
    steps: list[int]
    evidence: list[str] = Field(description="Metric names and rollout:<id> references.")
    explanation: str
    analyzer: str
    data: dict[str, Any] = Field(default_factory=dict)
    judged: str | None = Field(None, description="level (one step shows it) | change (start vs end, around a "
                                                 "spike, vs the parent) | trend (a drift over many steps)")
    damages_weights: bool = Field(False, description="The finding means its versions' weights are damaged.")


def finding_info(f: Finding) -> FindingInfo:
    """A :class:`FindingInfo` from a harness ``Finding``."""
    return FindingInfo(**f.model_dump(mode="json"))


def evidence_of(ws: Workspace, version_ids: list[str] | None) -> Evidence:
    """``Evidence.from_workspace`` for the given versions (each checked first)."""
    if version_ids is not None:
        if not version_ids:
            raise ToolError("version_ids is empty; pass at least one version id, or omit it for all versions")
        for v in version_ids:
            require_version(ws, v)
    return Evidence.from_workspace(ws, version_ids)


def _check_stored(ws: Workspace, name: str, spec: Any) -> None:
    """A stored analyzer must fit what MCP ``register_analyzer`` accepts (review 11, E-R11: a run folder from
    elsewhere stored ``timeout_s: 1e9`` and ``memory_mb: 1e7``, and a plain ``run_analyzer`` ran it with them,
    holding a sandbox slot past every deadline). Raises ToolError naming the file, the analyzer and the fix."""
    why, again = None, "register it again with register_analyzer"
    if not (isinstance(name, str) and 0 < len(name) <= STORED_NAME_MAX and name.replace("_", "").isalnum()):
        # the registry refused it with "use a snake_case name" naming neither the file nor the key (review 12, C-R12)
        why = f"has a name that is not snake_case (letters, digits and '_', 1 to {STORED_NAME_MAX} characters)"
        again = "register it again under a snake_case name such as 'reward_spike' with register_analyzer"
    elif not isinstance(spec, dict) or not isinstance(spec.get("code"), str):
        why = "is not an object with its code"
    else:
        t, m, kinds = spec.get("timeout_s", 60.0), spec.get("memory_mb", 1024), spec.get("kinds", [])
        d = spec.get("description", "")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= STORED_TIMEOUT_MAX:
            why = f"has timeout_s={t!r}, outside (0, {STORED_TIMEOUT_MAX:g}] s"
        elif isinstance(m, bool) or not isinstance(m, int) or not STORED_MEMORY_MB[0] <= m <= STORED_MEMORY_MB[1]:
            why = f"has memory_mb={m!r}, outside [{STORED_MEMORY_MB[0]}, {STORED_MEMORY_MB[1]}] MiB"
        elif not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            why = "has kinds that are not a list of names"
        elif len(kinds) > STORED_KINDS_MAX or any(len(k) > STORED_NAME_MAX for k in kinds):
            why = f"has {len(kinds):,} kinds, or one longer than {STORED_NAME_MAX} characters"
        elif not isinstance(d, str):  # list_analyzers answered pydantic's raw "validation error for AnalyzerInfo"
            why = f"has a description that is {_json_kind(d)}, not text"  # on every call (review 12, C-R12)
        elif len(d) > MAX_TEXT_CHARS:
            why = f"has a description of {len(d):,} characters, over {MAX_TEXT_CHARS:,}"
    if why:
        raise ToolError(f"{ws.root}/lineage.db: stored analyzer {str(name)[:80]!r} {why[:200]} (what register_analyzer "
                        f"accepts); {again}, or remove it from kv {KV_KEY!r}")


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words, for an error message: "a JSON object", "a number 12", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"a number {value!r}"[:60]
    return "a JSON object" if isinstance(value, dict) else "a JSON list" if isinstance(value, list) else "not text"


def sync_registry(ws: Workspace) -> list[str]:
    """Register, in this process, the runtime analyzers stored in the run (idempotent).

    Returns the analyzers in scope for this run: the built-ins and the run's own runtime analyzers. The process
    registry may hold runtime analyzers of other runs (several runs served by one process); they are not in scope.
    """
    stored = ws.lineage.kv_get(KV_KEY, {}) or {}
    if not isinstance(stored, dict):
        raise ToolError(f"{ws.root}/lineage.db: kv {KV_KEY!r} holds {type(stored).__name__}, not an object of "
                        f"analyzers; remove it (DELETE FROM kv WHERE key = '{KV_KEY}') and register them again")
    with REGISTRY_LOCK:
        known = {s.name for s in reg.list_analyzers()}
        for name, spec in stored.items():
            _check_stored(ws, name, spec)
            if name not in known:
                reg.register_analyzer(name, spec["code"], kinds=tuple(spec.get("kinds", ())),
                                      description=spec.get("description", ""),
                                      timeout_s=spec.get("timeout_s", 60.0), memory_mb=spec.get("memory_mb", 1024))
    return [s.name for s in reg.list_analyzers(builtin=True)] + sorted(stored)
