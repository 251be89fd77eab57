"""The Claude brain against a fake Anthropic Messages API on 127.0.0.1, through real MCP servers.

The fake records what the anthropic SDK sends and answers with scripted tool_use blocks; the tools
run on the real ``all`` server of a fresh run (``evotrainer.servers.app.build_server``).
"""

from __future__ import annotations

import pytest
from fake_anthropic import FakeAnthropic, last_tool_results, submit_tool, tool_use, turn

from evotrainer.agents.claude import BrainError, ClaudeBrain, price_of
from evotrainer.agents.decisions import Diagnosis, Proposal
from evotrainer.agents.mcp_client import RoleTools, ToolBox
from evotrainer.recipe import Recipe
from evotrainer.workspace import Workspace


@pytest.fixture()
def toolbox(tmp_path):
    from evotrainer.servers.app import build_server

    with Workspace(tmp_path / "run") as ws:
        ws.lineage.create_root(Recipe(model={"name_or_path": "tiny-random"}))
    with ToolBox(build_server("all", str(tmp_path / "run"))) as tb:
        yield tb


def test_role_loop_sends_tools_runs_them_and_accounts_tokens(toolbox):
    def policy(body):
        if turn(body) == 0:
            return [tool_use("get_version", {"version_id": "v0"})]
        got = last_tool_results(body)[0]["content"]
        return [tool_use("submit_proposal", {"parent_id": got["id"], "candidates": [
            {"path": "generate_max_len", "new": got["recipe"]["generate_max_len"] * 2, "addresses": ["truncation"],
             "hypothesis": "answers are cut at the cap"}]})]

    with FakeAnthropic(policy, usage=(1000, 200)) as fake:
        brain = ClaudeBrain(model="claude-sonnet-4-6", api_key="test-key", base_url=fake.url)
        tools = RoleTools(toolbox, "intervener")
        out = brain.run_role(tools, "propose children of v0", Proposal, "submit_proposal")
    assert isinstance(out, Proposal)
    assert out.parent_id == "v0" and out.candidates[0].path == "generate_max_len"
    assert out.candidates[0].new == 128  # default generate_max_len 64 × 2
    # What the SDK sent: model, the role's tools plus the submit tool, the key in the header.
    first = fake.requests[0]
    assert first["model"] == "claude-sonnet-4-6"
    names = [t["name"] for t in first["tools"]]
    assert "get_version" in names and "search_skills" in names and names[-1] == "submit_proposal"
    assert "start_training" not in names  # the intervener may not train
    h = fake.headers[0]
    assert h.get("x-api-key") == "test-key" or h.get("authorization") == "Bearer test-key"
    # The second request carries the tool result of get_version (the real server's answer).
    res = last_tool_results(fake.requests[1])[0]
    assert not res["is_error"] and res["content"]["status"] == "proposed"
    # 2 turns × (1000 in, 200 out) at Sonnet prices $3 / $15 per M: (2000×3 + 400×15) / 1e6 = 0.012
    assert brain.usage["input_tokens"] == 2000 and brain.usage["output_tokens"] == 400
    assert brain.usage["cost_usd"] == pytest.approx(0.012)
    assert brain.usage["turns"] == 2 and brain.usage["calls"] == 1


def test_tool_errors_go_back_to_the_model_and_invalid_answers_are_refused(toolbox):
    def policy(body):
        t = turn(body)
        if t == 0:
            return [tool_use("get_version", {"version_id": "v9"})]
        if t == 1:
            assert last_tool_results(body)[0]["is_error"]
            return [tool_use("submit_diagnosis", {"summary": "missing version_id"})]
        if t == 2:
            res = last_tool_results(body)[0]
            assert res["is_error"] and "version_id" in res["content"]
            return [tool_use("submit_diagnosis", {"version_id": "v0", "summary": "nothing trained yet"})]
        raise AssertionError("too many turns")

    with FakeAnthropic(policy) as fake:
        brain = ClaudeBrain(api_key="k", base_url=fake.url)
        out = brain.run_role(RoleTools(toolbox, "diagnostician"), "diagnose v0", Diagnosis, "submit_diagnosis")
    assert out.version_id == "v0" and out.findings == []
    err = last_tool_results(fake.requests[1])[0]["content"]
    assert "v9" in err and "v0" in err  # the server's message names the bad id and the known ones


def test_retries_on_overload_then_succeeds(toolbox):
    def policy(body):
        return [tool_use("submit_diagnosis", {"version_id": "v0", "summary": "ok"})]

    with FakeAnthropic(policy, fail_first=2, fail_status=529) as fake:
        brain = ClaudeBrain(api_key="k", base_url=fake.url, max_retries=3)
        out = brain.run_role(RoleTools(toolbox, "diagnostician"), "diagnose v0", Diagnosis, "submit_diagnosis")
    assert out.summary == "ok"
    assert sum(1 for r in fake.requests if r.get("failed")) == 2 and len(fake.requests) == 3


def test_turn_cap_then_heuristic_fallback(toolbox):
    def policy(body):
        return [tool_use("list_versions", {})]  # never submits

    with FakeAnthropic(policy) as fake:
        brain = ClaudeBrain(api_key="k", base_url=fake.url, max_turns=3)
        with pytest.raises(BrainError, match="within 3 turns"):
            brain.run_role(RoleTools(toolbox, "intervener"), "x", Proposal, "submit_proposal")
        assert len(fake.requests) == 3
        # The role method falls back to the heuristic brain and counts it.
        diag = Diagnosis(version_id="v0", findings=[{"kind": "truncation", "severity": "warn",
                                                     "explanation": "62% of completions hit the cap"}])
        gate = {"promote": False, "gain": -0.05, "ci": [-0.12, 0.01], "p_value": 0.2, "blocking": []}
        v = brain.decide(RoleTools(toolbox, "decider"), "v0", gate, diag)
    assert brain.usage["fallbacks"] == 1 and len(fake.requests) == 6
    assert v.action == "prune" and "-0.050" in v.rationale and "[-0.120, +0.010]" in v.rationale


def test_model_cannot_promote_what_the_gate_refuses(toolbox):
    def policy(body):
        return [tool_use("submit_verdict", {"version_id": "v0", "action": "keep", "rationale": "looks great"})]

    with FakeAnthropic(policy) as fake:
        brain = ClaudeBrain(api_key="k", base_url=fake.url)
        diag = Diagnosis(version_id="v0", findings=[{"kind": "reward_hacking", "severity": "blocking",
                                                     "explanation": "format_token reward up, correctness flat"}])
        gate = {"promote": True, "gain": 0.2, "ci": [0.1, 0.3], "blocking": []}
        v = brain.decide(RoleTools(toolbox, "decider"), "v0", gate, diag)
    assert v.action == "prune" and "reward_hacking" in v.rationale


def test_prices():
    assert price_of("claude-sonnet-4-5") == (3.0, 15.0)
    assert price_of("claude-opus-4-5-20251101") == (5.0, 25.0)
    assert price_of("claude-haiku-4-5") == (1.0, 5.0)


def test_full_cycle_diagnose_propose_rank_decide_through_real_servers(toolbox, tmp_path):
    """Claude (scripted by the fake API) drives diagnose -> propose -> rank -> decide on a real run via MCP."""
    from evotrainer.agents.backtester import Backtester
    from evotrainer.agents.diagnostician import Diagnostician
    from evotrainer.agents.intervener import Intervener
    from evotrainer.agents.orchestrator import Orchestrator
    from evotrainer.config import RunConfig

    def policy(body):
        sub, t = submit_tool(body), turn(body)
        if sub == "submit_diagnosis":
            if t == 0:
                return [tool_use("run_analyzer", {"version_ids": ["v0"]})]
            res = last_tool_results(body)[0]["content"]
            return [tool_use("submit_diagnosis", {
                "version_id": "v0", "findings": res["findings"] + [
                    {"kind": "truncation", "severity": "warn", "evidence": ["completions/clipped_ratio"],
                     "explanation": "read from the logs: 70% of completions end at the 64-token cap"}],
                "summary": f"{len(res['analyzers'])} analyzers ran; completions are cut at the cap"})]
        if sub == "submit_proposal":
            if t == 0:
                return [tool_use("search_skills", {"query": "completions truncated at max length",
                                                   "finding_kinds": ["truncation"], "limit": 3})]
            return [tool_use("submit_proposal", {"parent_id": "v0", "candidates": [
                {"path": "generate_max_len", "new": 128, "addresses": ["truncation"], "hypothesis": "cut answers",
                 "expected_metric": "completions/clipped_ratio", "expected_direction": "down"},
                {"path": "generate_max_len", "new": 64, "hypothesis": "a no-op: must be dropped"},
                {"path": "no_such_field", "new": 1, "hypothesis": "invalid: must be dropped"}]})]
        if sub == "submit_ranking":
            if t == 0:  # no rollouts stored yet: the backtest tool answers with an error the model sees
                return [tool_use("replay_filter", {"version_id": "v0", "path": "dynamic_filtering", "value": True})]
            return [tool_use("submit_ranking", {"scores": [{"index": 0, "score": 1.0, "method": "prior"}],
                                                "chosen": [0, 7]})]
        if sub == "submit_verdict":
            if t == 0:
                return [tool_use("gate_version", {"version_id": "v0"})]
            gate = last_tool_results(body)[0]["content"]
            return [tool_use("submit_verdict", {"version_id": "v0", "action": "keep" if gate["promote"] else "prune",
                                                "rationale": f"gate: {gate['reason']}", "evidence": gate["evidence"]})]
        raise AssertionError(sub)

    with FakeAnthropic(policy) as fake:
        brain = ClaudeBrain(api_key="k", base_url=fake.url)
        diag = Diagnostician(brain, toolbox).diagnose("v0", {"parent_id": None})
        assert "truncation" in diag.kinds()
        prop = Intervener(brain, toolbox).propose("v0", Recipe(model={"name_or_path": "tiny-random"}), diag, set(), {})
        assert [c.key() for c in prop.candidates] == ["generate_max_len=128"]  # no-op and bad path dropped
        bt = Backtester(brain, toolbox)
        rank = bt.rank("v0", prop, diag, n_choose=2)
        assert rank.chosen == [0]  # out-of-range index 7 dropped
        gate = bt.gate("v0")
        verdict = bt.decide("v0", gate, diag)
        assert verdict.action == "keep" and "root version" in verdict.rationale
        ws = Workspace.open(tmp_path / "run")
        orch = Orchestrator(RunConfig(), toolbox, ws, brain)
        orch.record_decision(verdict, "orchestrator/claude")
        child = orch._branch("v0", prop.candidates[0])
    # The decision and the child landed in the lineage through the MCP tools.
    d = ws.lineage.decisions("v0")
    assert [x.action for x in d] == ["keep"] and d[0].author == "orchestrator/claude"
    assert ws.lineage.get(child).interventions[0].describe() == "generate_max_len: 64 -> 128"
    assert orch._branch("v0", prop.candidates[0]) == child  # find-or-create: no duplicate child
    # The model saw the backtest tool's error (no stored rollouts) as an is_error tool_result.
    rank_reqs = [r for r in fake.requests if submit_tool(r) == "submit_ranking"]
    assert last_tool_results(rank_reqs[1])[0]["is_error"]
    assert brain.usage["calls"] == 4 and brain.usage["fallbacks"] == 0
    ws.close()
