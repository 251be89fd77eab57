"""Fast paths (issue 21) give the same answers as the plain paths they replace.

- The numpy MiniLM query embedder equals sentence-transformers' ``encode`` (the plain path) within
  1e-5 per component and 1e-5 in cosine, on short, long (> 256 tokens: truncated), non-ASCII and
  padded-batch inputs; the torch MiniLM (sources, and queries where torch is loaded) within 1e-6.
- Hybrid search with the numpy and the torch query vectors returns the same top-3 ids as with the
  sentence-transformers query vectors, for 5 finding-style queries.
- A search from a fresh interpreter imports neither torch nor sentence-transformers; embedding sources does not
  import sentence-transformers.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from evotrainer.skills_db import embeddings as E
from evotrainer.skills_db.store import SkillStore

TEXTS = [
    "truncation",
    "a",
    "policy/entropy fell from 0.85 to 0.04 nats per token between steps 20 and 60",
    "Überlänge: café naïve, 数学 推理 and emoji-free punctuation ... (nested [brackets])",
    # ~500 word pieces: sentence-transformers truncates at max_seq_length = 256 tokens
    " ".join(["KL to the reference grew to 41 nats per token at step 70;"] * 40),
]

QUERIES = [
    "truncation",
    "most completions stop at generate_max_len with finish_reason=length",
    "all samples in a group get the same reward so advantages are zero",
    "policy entropy collapsed, the model became deterministic",
    "KL to the reference model exploded",
]


@pytest.fixture(scope="module")
def st_model():
    """The plain path, sentence-transformers itself (a test dependency; the product does not import it)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(E.model_dir()), device="cpu")


def st_encode(model, texts):
    return model.encode(list(texts), batch_size=64, convert_to_numpy=True, normalize_embeddings=True,
                        show_progress_bar=False)


@pytest.fixture(scope="module")
def st_vectors(st_model):
    """Plain path: sentence-transformers encode, one text at a time and as one padded batch."""
    one = np.stack([st_encode(st_model, [t])[0] for t in TEXTS])
    return one, st_encode(st_model, TEXTS)


def test_torch_minilm_equals_sentence_transformers(st_vectors):
    """``embed`` (TorchMiniLM: the same BertModel, masked mean, L2 norm, without sentence-transformers) gives its
    vectors within 1e-6 (measured 3.0e-8 as one batch and 9.7e-8 one text at a time, on these texts and the 61
    seed texts)."""
    one, batch = st_vectors
    np.testing.assert_allclose(batch, one, atol=1e-5)  # the plain path is itself batch-invariant to 1e-5
    for ours in (E.embed(TEXTS), np.stack([E.embed([t])[0] for t in TEXTS])):
        assert ours.shape == (5, 384) and ours.dtype == np.float32
        np.testing.assert_allclose(ours, batch, atol=1e-6)
    assert np.allclose(np.linalg.norm(E.embed(TEXTS), axis=1), 1.0, atol=1e-6)
    assert E.embed([]).shape == (0, 384)


def test_numpy_minilm_equals_sentence_transformers(st_vectors):
    one, batch = st_vectors
    fast_one = np.stack([E.numpy_model().encode([t])[0] for t in TEXTS])
    fast_batch = E.numpy_model().encode(TEXTS)  # padded batch, sorted by length inside
    for fast in (fast_one, fast_batch):
        assert fast.shape == (5, 384) and fast.dtype == np.float32
        np.testing.assert_allclose(fast, one, atol=1e-5)
        cos = (fast * one).sum(1)  # both unit vectors: cosine = dot product
        assert np.all(cos > 1 - 1e-5), cos
    # Truncation is what makes the long text equal: without it the numpy path would see ~500 tokens.
    assert len(E.numpy_model().tok.encode(TEXTS[4]).ids) == 256


def test_erf_matches_math_erf():
    import math

    x = np.linspace(-6, 6, 2001)
    ref = np.array([math.erf(v) for v in x])
    assert np.max(np.abs(E._erf(x) - ref)) <= 1.5e-7  # Abramowitz & Stegun 7.1.26 bound


def test_hybrid_top3_unchanged(tmp_path, monkeypatch, st_model):
    store = SkillStore(tmp_path / "skills")

    def top3(embed_query):
        E.QUERY_CACHE.clear()
        monkeypatch.setattr(E, "embed_query", embed_query)
        return [[h.skill.id for h in store.search(q, limit=3)] for q in QUERIES]

    fast = top3(lambda text: E.numpy_model().encode([text])[0])  # a shell search (no torch)
    in_loop = top3(lambda text: E.load_model().encode([text])[0])  # a process with torch (the loop)
    # The implementation before issue 21: the query vector from sentence-transformers.
    plain = top3(lambda text: st_encode(st_model, [text])[0])
    E.QUERY_CACHE.clear()
    assert fast == plain and in_loop == plain
    # the query names a finding kind: the top hit addresses it (overlong_shaping since issue 17's seed texts;
    # analyzer.truncation before), sanity that results are real
    assert "truncation" in store.get(fast[0][0]).addresses or fast[0][0] == "analyzer.truncation"
    assert all(len(ids) == 3 for ids in fast)


def test_search_imports_no_torch(tmp_path):
    SkillStore(tmp_path / "skills").count()  # created (and seeds embedded) here, not in the child
    code = ("import sys; from evotrainer.skills_db.store import SkillStore; "
            f"hits = SkillStore({str(tmp_path / 'skills')!r}).search('truncation', limit=3); "
            "print('truncation' in hits[0].skill.addresses or hits[0].skill.id == 'analyzer.truncation', "
            "'torch' in sys.modules, 'sentence_transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "False", "False"], out.stderr


def test_embedding_sources_imports_no_sentence_transformers():
    """Sources are embedded by TorchMiniLM: sentence-transformers' import (~260 MB of RSS) stays out of the loop;
    a query in a process with torch reuses that model (no NumpyMiniLM beside it)."""
    code = ("import sys, torch; from evotrainer.skills_db import embeddings as E; "
            "v = E.embed(['entropy collapse', 'truncation']); q = E.embed_query('truncation'); "
            "print(v.shape, abs(float(q @ v[1]) - 1) < 1e-6, 'sentence_transformers' in sys.modules, "
            "E.numpy_model.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["(2,", "384)", "True", "False", "0"], out.stderr[-2000:]


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_cli_edge_imports_stay_light(flag):
    """`--version` / `--help` load no recipe / intervention / lineage / workspace modules and no heavy
    third-party package (known errors are matched only against modules already loaded)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "evotrainer.cli", flag], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    heavy = {"evotrainer.recipe", "evotrainer.intervention", "evotrainer.lineage", "evotrainer.workspace",
             "torch", "transformers", "lancedb", "pyarrow", "numpy", "pandas"}
    assert not heavy & loaded, sorted(heavy & loaded)
    assert "typer" in loaded  # the check sees real imports


def test_known_errors_only_from_loaded_modules(monkeypatch):
    from evotrainer import cli

    monkeypatch.delitem(sys.modules, "evotrainer.harness.importer", raising=False)
    import evotrainer.recipe as recipe

    errs = cli._known_errors()
    assert recipe.RecipeError in errs and FileNotFoundError in errs
    assert not any(e.__name__ == "RunImportError" for e in errs)


RELEASE_CHILD = """
import psutil, torch
from evotrainer.rl_backend.models import release_memory
p = psutil.Process()
mib = lambda: p.memory_info().rss / 2**20
base = mib()
xs, pins = [], []
for i in range(6000):
    xs.append(torch.ones(2**14))  # 64 KiB each (below glibc's 128 KiB mmap threshold): from the heap
    if i % 100 == 0:
        pins.append(torch.ones(8))  # small live chunks between them: the heap top cannot shrink
del xs
freed = mib()
print(release_memory(), round(freed - base), round(mib() - base))
"""


def test_release_memory_returns_the_freed_heap():
    """6000 x 64 KiB = 375 MiB freed: glibc keeps it mapped until malloc_trim (the ~1.7 GB kept after each
    SmolLM2 version); release_memory gives it back."""
    out = subprocess.run([sys.executable, "-c", RELEASE_CHILD], capture_output=True, text=True, timeout=120, check=True)
    ran, kept, after = out.stdout.split()
    if ran != "True":
        pytest.skip("no glibc malloc_trim on this platform")
    assert int(kept) > 250, out.stdout  # precondition: the allocator kept most of the 375 MiB
    assert int(after) < 60, out.stdout  # returned: what is left is torch's own first-use state


def test_rss_does_not_grow_across_versions(tmp_path):
    """4 chained versions of the tiny model (train 2 steps + evaluate each) in one process.

    Bound: the tiny model has 3.2 M params = 12.8 MB fp32; one version's leaked training state (weights,
    gradients, 2 AdamW moments) is 4 x 12.8 = 51 MB, so growth from the 2nd to the 4th version under
    40 MiB rules out even one leaked version (measured: ~7-15 MiB of allocator noise). No model or
    optimizer object may survive a version.
    """
    import gc
    import warnings

    import psutil
    import torch

    from evotrainer.intervention import Intervention
    from evotrainer.recipe import validate_recipe
    from evotrainer.rl_backend.local import LocalBackend
    from evotrainer.workspace import Workspace

    def live() -> tuple[int, int]:
        gc.collect()
        objs = gc.get_objects()
        with warnings.catch_warnings():  # isinstance on torch's deprecated module aliases warns
            warnings.simplefilter("ignore")
            return (sum(isinstance(o, torch.nn.Module) and hasattr(o, "generate") for o in objs),
                    sum(isinstance(o, torch.optim.Optimizer) for o in objs))

    ws = Workspace(tmp_path / "run", writer=True)
    be = LocalBackend(checkpoint_every=100, num_threads=1)
    v = ws.lineage.create_root(validate_recipe({
        "model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": 4, "rollout_batch_size": 2,
        "generate_max_len": 8, "init_kl_coef": 0.01, "micro_train_batch_size": 8, "eval": {"k": 2, "max_problems": 2}}))
    rss, temps = [], [1.0, 0.95, 0.9, 0.85]
    for i, t in enumerate(temps):
        be.train(ws, v.id, 2)
        be.evaluate(ws, v.id)
        assert live() == (0, 0), f"model/optimizer objects alive after {v.id}"
        rss.append(psutil.Process().memory_info().rss / 2**20)
        if i + 1 < len(temps):
            v = ws.lineage.branch(v.id, Intervention(path="temperature", old=t, new=temps[i + 1], category="rollout"))
    ws.close()
    assert rss[3] - rss[1] < 40, rss


def test_fast_forward_equals_the_reference_within_float32_rounding():
    """The pre-transposed, q/k/v-fused forward (``NumpyMiniLM._forward``) gives the vectors of the plain
    transcription (``forward_reference``): single queries of many lengths and a padded batch. Bit-identical on the
    machine it was written on; on an AMD EPYC with OpenBLAS the plain and transposed GEMM kernels round differently
    (up to 7.3e-8 per component of a unit vector, CI of 2026-12-03), so within 1e-6 (about 8 float32 ulps at 1.0)."""
    from safetensors.numpy import load_file

    model = E.numpy_model()
    words = "entropy collapsed while the KL to the reference grew at step 412 of the math run".split()
    texts = [" ".join(words[:n]) for n in range(1, len(words) + 1)] + TEXTS + ["x", "ü" * 300]
    fast_single = [model.encode([t]) for t in texts]
    fast_batch = model.encode(texts)
    model.use_reference = True
    try:
        ref_single = [model.encode([t]) for t in texts]
        ref_batch = model.encode(texts)
    finally:
        model.use_reference = False
    for a, b in zip(fast_single, ref_single, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    np.testing.assert_allclose(fast_batch, ref_batch, rtol=0, atol=1e-6)
    checkpoint = load_file(str(E.model_dir() / "model.safetensors"))  # the reference runs the checkpoint's matrices
    assert all(np.array_equal(checkpoint[k], model._reference_w[k]) for k in checkpoint)
