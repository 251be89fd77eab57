"""Review 17 holes in the MCP servers: a prompt argument of any size was copied into the prompt text (M-R17 residue)."""

from __future__ import annotations

import time

import pytest
from mcp.shared.exceptions import MCPError
from mcp_testlib import SyncClient, make_run

from evotrainer.servers.app import build_server
from evotrainer.servers.protocol import MAX_PROMPT_ARGUMENT_CHARS


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("r17"))


def test_every_prompt_argument_past_the_limit_is_refused_naming_it_and_the_limit(run):
    """A 3 MB argument of either prompt (version_id, findings) came back inside a 3 MB prompt; it is a -32602 error
    of under 300 characters now, for every argument of every prompt the server lists, and an argument at the limit
    still renders."""
    c = SyncClient(build_server("all", run))
    try:
        prompts = c.portal.call(c.client.list_prompts).prompts
        assert sorted(p.name for p in prompts) == ["diagnose_run", "propose_next_intervention"]
        seen = []
        for p in prompts:
            for arg in p.arguments or []:
                args = {"version_id": "v0", arg.name: "x" * 3_000_000}
                t = time.perf_counter()
                with pytest.raises(MCPError) as e:
                    c.portal.call(lambda: c.client.get_prompt(p.name, args))  # noqa: B023 (called at once)
                took = time.perf_counter() - t
                assert e.value.error.code == -32602
                assert e.value.error.message == (
                    f"prompt {p.name!r}: argument {arg.name} is 3,000,000 characters, over the limit of 64,000; "
                    "shorten it (findings: their kinds, steps and evidence refs, not whole rollouts)")
                assert took < 2.0, took
                seen.append((p.name, arg.name))
        assert sorted(seen) == [("diagnose_run", "version_id"), ("propose_next_intervention", "findings"),
                                ("propose_next_intervention", "version_id")]
        text = c.prompt("propose_next_intervention", {"version_id": "v0", "findings": "f" * MAX_PROMPT_ARGUMENT_CHARS})
        assert "f" * MAX_PROMPT_ARGUMENT_CHARS in text and len(text) < 2 * MAX_PROMPT_ARGUMENT_CHARS
    finally:
        c.close()
