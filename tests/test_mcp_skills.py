"""Skill-memory server: search (hybrid / fts), get, add, outcomes, failed cases, search traces (no run needed)."""

from __future__ import annotations

import pytest
from mcp_testlib import SyncClient

from evotrainer.servers.app import build_server


@pytest.fixture(scope="module")
def client():
    # the store opens on the first call, in the temp EVOTRAINER_SKILLS_DIR of conftest, and is shared
    # by the module's tests (one embedding-model load)
    c = SyncClient(build_server("skills", None))
    yield c
    c.close()


def test_search_get_and_filters(client):
    res = client.ok("search_skills", {"query": "policy entropy collapses, the model stops exploring",
                                      "kind": "intervention", "finding_kinds": ["entropy_collapse"], "limit": 3})
    assert res["hits"] and all(h["kind"] == "intervention" and "entropy_collapse" in h["addresses"]
                               for h in res["hits"])
    top = client.ok("get_skill", {"skill_id": res["hits"][0]["id"]})
    assert top["recipe_path"] and top["record"] == {"tried": 0, "helped": 0, "hurt": 0}
    fts = client.ok("search_skills", {"query": "Clip-Higher", "mode": "fts", "limit": 5})
    assert fts["mode"] == "fts" and any("eps_clip_high" == h["recipe_path"] for h in fts["hits"])
    assert "no skill 'nope'" in client.err("get_skill", {"skill_id": "nope"})
    assert "query" in client.err("search_skills", {"query": ""})
    assert "mode" in client.err("search_skills", {"query": "x", "mode": "semantic"})


def test_add_skill_and_record_outcomes(client):
    s = client.ok("add_skill", {"skill_id": "test.cooler_sampling", "kind": "intervention", "name": "Cooler sampling",
                                "description": "Lower the rollout temperature when completions are incoherent.",
                                "addresses": ["template_collapse"], "recipe_path": "temperature",
                                "value": {"op": "mul", "by": 0.8, "min": 0.3}, "tags": ["math"]})
    assert s["id"] == "test.cooler_sampling" and s["value"] == {"op": "mul", "by": 0.8, "min": 0.3}
    assert "exist already" in client.err("add_skill", {"skill_id": "test.cooler_sampling", "kind": "procedure",
                                                       "name": "x", "description": "y"})
    assert "recipe_path" in client.err("add_skill", {"kind": "intervention", "name": "x", "description": "y"})
    # a recipe_path that is no field is refused on add, with the closest field
    assert "recipe.top_pp: no such field path; did you mean 'top_p'?" in client.err(
        "add_skill", {"skill_id": "test.typo", "kind": "intervention", "name": "x", "description": "y",
                      "recipe_path": "top_pp", "value": 0.9})
    for outcome in ("helped", "hurt", "neutral"):
        r = client.ok("record_skill_outcome", {"skill_id": "test.cooler_sampling", "outcome": outcome,
                                               "domain": "math"})
    # three trials: helped 1, hurt 1, neutral counts as tried only
    assert r["record"] == {"tried": 3, "helped": 1, "hurt": 1}
    assert client.ok("get_skill", {"skill_id": "test.cooler_sampling"})["track_record"]["math"]["tried"] == 3
    assert "outcome" in client.err("record_skill_outcome", {"skill_id": "test.cooler_sampling", "outcome": "great"})
    hits = client.ok("search_skills", {"query": "incoherent completions temperature", "tags": ["math"]})["hits"]
    assert hits[0]["id"] == "test.cooler_sampling" and hits[0]["record"]["tried"] == 3


def test_record_outcome_caps_domain_length_and_count(client):
    """N1-R19: 800 outcomes with new 2,000-character domains grew the store to 637 MB (every outcome rewrites the
    row holding all domains); a domain is at most DOMAIN_MAX_CHARS characters, a skill keeps MAX_TRACK_DOMAINS."""
    from evotrainer.skills_db.models import DOMAIN_MAX_CHARS, MAX_TRACK_DOMAINS

    client.ok("add_skill", {"skill_id": "test.domains", "kind": "procedure", "name": "d", "description": "domains"})
    err = client.err("record_skill_outcome", {"skill_id": "test.domains", "outcome": "helped",
                                              "domain": "d" * 2000})
    assert "domain: 2,000 characters" in err and f"at most {DOMAIN_MAX_CHARS} characters" in err
    # a name of exactly the cap is fine
    r = client.ok("record_skill_outcome", {"skill_id": "test.domains", "outcome": "helped",
                                           "domain": "e" * DOMAIN_MAX_CHARS})
    assert r["domain"] == "e" * DOMAIN_MAX_CHARS and r["record"] == {"tried": 1, "helped": 1, "hurt": 0}
    for i in range(MAX_TRACK_DOMAINS - 1):
        client.ok("record_skill_outcome", {"skill_id": "test.domains", "outcome": "neutral", "domain": f"dom{i}"})
    err = client.err("record_skill_outcome", {"skill_id": "test.domains", "outcome": "hurt", "domain": "one_more"})
    assert f"already has {MAX_TRACK_DOMAINS} domains" in err and "nothing was recorded" in err
    # a domain it already has still counts
    r = client.ok("record_skill_outcome", {"skill_id": "test.domains", "outcome": "hurt", "domain": "dom0"})
    assert r["record"] == {"tried": 2, "helped": 0, "hurt": 1}
    got = client.ok("get_skill", {"skill_id": "test.domains"})
    assert len(got["track_record"]) == MAX_TRACK_DOMAINS and "one_more" not in got["track_record"]
    assert got["record"] == {"tried": MAX_TRACK_DOMAINS + 1, "helped": 1, "hurt": 1}


def test_failed_cases_and_traces(client):
    case = client.ok("add_failed_case", {"version_id": "v3", "outcome": "pruned: held-out -0.04",
                                         "intervention": "eps_clip_high: 0.28 -> 0.5", "findings": ["kl_blowup"]})
    assert case["id"].startswith("case-")
    trace = client.ok("add_search_trace", {"agent": "intervener", "query": "kl blowup", "results": ["kl_coef_up"],
                                           "chosen": "kl_coef_up", "rationale": "best record"})
    assert trace["id"].startswith("trace-")
    assert "outcome" in client.err("add_failed_case", {"version_id": "v3"})


def test_a_non_finite_value_is_refused_and_an_unreadable_row_ends_no_search():
    """Review 10, K-R10: MCP `add_skill` with `by: -1e999` (valid JSON, read as -inf) was stored as `by: null`; a
    NaN skill's row made `search_skills` (when a hit) and `get_skill` end with a raw pydantic error dumping the row."""
    import warnings

    from evotrainer.skills_db.store import SKILLS, SkillStore, _to_row

    store = SkillStore()  # this test's EVOTRAINER_SKILLS_DIR (conftest), where the server below opens its store
    row = _to_row(store.get("lr_down"), SKILLS) | {"id": "test.planted_nan", "value": "null"}
    store._table(SKILLS).add([{**row, "vector": [0.0] * 383 + [1.0]}])
    client = SyncClient(build_server("skills", None))
    try:
        err = client.err("add_skill", {"skill_id": "test.inf_by", "kind": "intervention", "name": "x",
                                       "description": "y", "recipe_path": "actor_learning_rate",
                                       "value": {"op": "mul", "by": float("-inf")}})
        # the tool's JSON argument arrives as `by: null` (it was stored so): refused as a rule without its operand
        assert "value rule op='mul' needs 'by', e.g. {op: mul, by: 2}" in err, err
        assert "no skill 'test.inf_by'" in client.err("get_skill", {"skill_id": "test.inf_by"})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            hits = client.ok("search_skills", {"query": row["text"], "mode": "fts", "limit": 50})["hits"]
            assert hits and "test.planted_nan" not in [h["id"] for h in hits]
            assert client.ok("get_skill", {"skill_id": "lr_down"})["id"] == "lr_down"
            err = client.err("get_skill", {"skill_id": "test.planted_nan"})
    finally:
        client.close()
    assert "skills row 'test.planted_nan' is stored but does not validate" in err and "input_value" not in err, err
    assert "skills restore" in err


def test_add_skill_names_a_bad_argument_in_one_line_without_a_dump():
    """Review 10 (K-R10's residue): a skill the model refuses came back from MCP `add_skill` as pydantic's "1
    validation error for Skill ... input_value={...}" dump of every argument; now one line naming the field."""
    client = SyncClient(build_server("skills", None))
    try:
        err = client.err("add_skill", {"skill_id": "test.no_value", "kind": "intervention", "name": "x",
                                       "description": "y" * 2000, "recipe_path": "actor_learning_rate"})
    finally:
        client.close()
    assert err.endswith("add_skill: skill test.no_value: an intervention needs value (a literal or {op: ...} rule); "
                        "fix that argument and call again"), err
    assert "input_value" not in err and "y" * 100 not in err, err


def test_version_summaries_are_capped_on_write_and_a_listing_is_bounded():
    """Review 14 F-R14: 150 add_version_summary of ~950 KB each (47 findings of 19,900 characters) made
    list_version_summaries a 273 MiB reply (3.6 s, a 3.0 s stall; its limit went to 10,000) and even limit=10 read the
    178 MB table whole. Now a summary holds at most 64 finding kinds of 64 characters and 1,024 metrics (256 until 2026-12-06), the limit stops
    at MAX_LIMIT (500), a reply ends once it holds 1 MiB of JSON (omitted: the rest), and only the chosen rows are
    read whole."""
    import json

    from evotrainer.servers.skills import REPLY_SUMMARIES_MAX_CHARS

    c = SyncClient(build_server("skills", None))
    try:
        assert "findings: 65 kinds (the longest 3 characters); a summary holds at most 64 finding kinds" in c.err(
            "add_version_summary", {"version_id": "v1", "status": "kept", "findings": [f"f{i:02d}" for i in range(65)]})
        assert "findings: 1 kinds (the longest 65 characters)" in c.err(
            "add_version_summary", {"version_id": "v1", "status": "kept", "findings": ["f" * 65]})
        assert "metrics: 1,025 entries; a summary holds at most 1024 metrics" in c.err(
            "add_version_summary", {"version_id": "v1", "status": "kept",
                                    "metrics": {f"m{i}": 1.0 for i in range(1025)}})
        for i in range(30):
            c.ok("add_version_summary", {"version_id": f"v{i:02d}", "status": "kept", "domain": "hostile",
                                         "summary": f"{i:02d}" + "s" * 19_000, "intervention": "i" * 19_000,
                                         "findings": ["truncation"], "run": "hostile"})
        assert "less than or equal to 500" in c.err("list_version_summaries", {"limit": 501})
        res = c.ok("list_version_summaries", {"domain": "hostile", "limit": 500})
        n = len(res["summaries"])
        assert 20 < n < 30 and res["omitted"] == 30 - n
        assert len(json.dumps(res["summaries"])) <= REPLY_SUMMARIES_MAX_CHARS
        assert [s["summary"][:2] for s in res["summaries"]] == [f"{i:02d}" for i in range(29, 29 - n, -1)]  # newest
        few = c.ok("list_version_summaries", {"domain": "hostile", "limit": 3})
        assert [s["version_id"] for s in few["summaries"]] == ["v29", "v28", "v27"] and few["omitted"] == 0
    finally:
        c.close()


def test_skill_tags_are_capped_on_write_and_search_hits_are_cut():
    """Review 14 N-R14: 110 add_skill of 460 tags of 1,992 characters each (~940 KB a skill) made every
    search_skills(limit=100) a 152-177 MiB reply (a 1.7 s stall). A skill now has at most 32 tags (and finding kinds)
    of at most 64 characters; a hit's description is cut to 4,000 characters and a reply ends at 1 MiB."""
    c = SyncClient(build_server("skills", None))
    try:
        err = c.err("add_skill", {"kind": "procedure", "name": "t", "description": "d",
                                  "tags": [f"t{i}" for i in range(33)]})
        assert "tags: 33 entries (the longest 3 characters); a skill has at most 32 of at most 64 characters" in err
        assert "the longest 65 characters" in c.err("add_skill", {"kind": "procedure", "name": "t", "description": "d",
                                                                  "tags": ["t" * 65]})
        for i in range(3):
            c.ok("add_skill", {"kind": "procedure", "name": f"quokka {i}", "description": "quokka " + "q" * 19_000,
                               "tags": [f"tag{j}" for j in range(32)]})
        res = c.ok("search_skills", {"query": "quokka", "mode": "fts", "limit": 100})
        q = [h for h in res["hits"] if h["name"].startswith("quokka")]
        assert len(q) == 3 and all(h["description"].endswith("... [15007 more chars]") for h in q)
        assert res["omitted"] == 0 and len(q[0]["tags"]) == 32
    finally:
        c.close()


def test_a_skills_file_past_the_domain_caps_is_refused_on_add(tmp_path):
    """Review 20 O2-R20: a skills file with 2,500 track_record domains was accepted by `skills add` (review 19 capped
    domains only in record_outcome), and 300 outcomes grew the store to 81 MB. The Skill model now caps the domains
    (MAX_TRACK_DOMAINS) and their names (DOMAIN_MAX_CHARS) on every write path; the caps themselves still load."""
    from evotrainer.skills_db.cli import load_skill_file
    from evotrainer.skills_db.models import DOMAIN_MAX_CHARS, MAX_TRACK_DOMAINS, SkillError

    def write(domains):
        lines = ["skills:", "- id: bigtrack", "  kind: procedure", "  name: p", "  description: a procedure",
                 "  track_record:"]
        lines += [f"    {d}: {{tried: 1, helped: 1}}" for d in domains]
        f = tmp_path / "sk.yaml"
        f.write_text("\n".join(lines) + "\n")
        return f

    with pytest.raises(SkillError) as err:
        load_skill_file(write([f"d{i:04d}" for i in range(2500)]))
    assert str(err.value) == (f"{tmp_path / 'sk.yaml'}: entry 0 (bigtrack): track_record: 2,500 domains (the longest "
                              f"name 5 characters); a skill keeps at most {MAX_TRACK_DOMAINS} domains of at most "
                              f"{DOMAIN_MAX_CHARS} characters each, short names such as 'math', 'code' or 'swe'")
    with pytest.raises(SkillError, match=r"track_record: 1 domains \(the longest name 1,000 characters\)"):
        load_skill_file(write(["d" * 1000]))  # (a YAML key is at most 1,024 characters)
    ok = load_skill_file(write([f"x{i:0{DOMAIN_MAX_CHARS - 1}d}" for i in range(MAX_TRACK_DOMAINS)]))
    assert len(ok[0].track_record) == MAX_TRACK_DOMAINS and ok[0].totals().tried == MAX_TRACK_DOMAINS
