"""The rollout decode loop: plain sampling that drops finished rows, and a plain-torch Llama decode step.

:func:`decode_dropping_finished` samples one token per active row per step and drops a row from the batch when it
samples an end-of-turn token. The forward of a step is one of two :class:`DecodeStep` objects:

- :class:`LlamaDecodeStep`: one decode step of a Llama-family decoder written in plain torch over the HF module's
  own weights (no copies but one fused QKV weight per layer, made once per decode), a preallocated KV cache per
  layer filled from the HF prefill cache, and ``scaled_dot_product_attention`` called as HF's ``sdpa`` attention
  calls it for one query token. It skips what the HF forward spends per token besides the matmuls: module calls,
  mask creation, ``DynamicCache`` concatenation (a copy of the whole cache per layer and token) and the RMSNorm /
  RoPE written as many small ops. On SmolLM2-135M (fp32, 1 thread, 16 rows) that is ~10% of a decode whose time is
  in the matmuls (~70%) and the sampler's exponential draw (~13%) either way, so ``sampling.generate`` uses it only
  with ``fast_decode=True`` (docs/performance.md §7). Supported (:func:`unsupported_reason` says why not, and the caller falls back):
  ``LlamaForCausalLM`` (``model_type == "llama"``) in float32, attention ``sdpa`` or ``eager``, SiLU MLP, plain
  ``nn.Linear`` projections (no LoRA / quantised layers), any head dimension, GQA, attention and MLP biases, tied
  or untied LM head, RoPE whose inverse frequencies are fixed (``default``, ``linear``, ``llama3``, ``yarn``: the
  module's ``inv_freq`` and ``attention_scaling`` as HF's forward reads them; ``dynamic`` and ``longrope`` fall
  back), no sliding window, no forward hooks, a ``DynamicCache`` of full-attention layers.
- :class:`HFDecodeStep`: the HF model's forward with a ``DynamicCache`` (any model).

Where :class:`LlamaDecodeStep` departs from HF's Llama forward (float rounding only: logits within 1e-5 of HF's in
tests/test_decode.py, bit-equal on SmolLM2-135M with torch 2.13 on CPU): q, k and v come from one matmul with the concatenated weight, RMSNorm is
``torch.nn.functional.rms_norm`` (HF: pow, mean, rsqrt, two muls), ``rotate_half(x) * sin`` is computed as the
halves of ``x`` swapped times ``sin`` with its first half negated (the same products).

Shapes: ``B`` = rows at the start of the decode, ``n`` = rows still active, ``P`` = prompt tokens (left-padded),
``T`` = KV-cache slots (``P - 1 + max_new_tokens``), ``C`` = hidden size, ``H`` / ``H_kv`` = query / key-value
heads, ``G = H / H_kv``, ``D`` = head dim, ``V`` = vocabulary.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from evotrainer.rl_backend.grpo import selective_log_softmax
from evotrainer.rl_backend.models import InPlaceGradLinear


@functools.cache
def cache_field() -> str:
    """The name of the KV cache in a transformers model's forward arguments and outputs: ``cache`` in the
    releases that renamed it (5.25 here), ``past_key_values`` before (5.17, on a GPU machine with an older image: there a
    ``cache=`` argument was not the cache and ``out.cache`` raised ``AttributeError``)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def kv(cache: Any) -> dict[str, Any]:
    """``cache`` as the forward / ``generate`` keyword argument of the installed transformers (:func:`cache_field`)."""
    return {cache_field(): cache}


def kv_of(out: Any) -> Any:
    """The KV cache of a forward's output (``out.cache`` or ``out.past_key_values``, :func:`cache_field`)."""
    return getattr(out, cache_field())


class DecodeStep(Protocol):
    """One decode step's forward on the active rows, and the dropping of finished rows."""

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` (n,) the active rows' last tokens -> next-token logits (n, V) float32."""

    def keep(self, idx: torch.Tensor) -> None:
        """Keep only rows ``idx`` (n',) of the active rows, in that order."""


class HFDecodeStep:
    """The HF model's forward on one token per row with a ``DynamicCache`` (position ids and mask kept here)."""

    def __init__(self, model: Any, cache: Any, attn: torch.Tensor) -> None:
        """``cache`` holds the prompts' first P - 1 positions; ``attn`` (B, P) the prompts' attention mask."""
        self.model, self.cache, self.mask = model, cache, attn
        self.pos = (attn.sum(-1, keepdim=True) - 1).clamp(min=0)  # (B, 1) position of each row's last prompt token

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=self.pos,
                         use_cache=True, **kv(self.cache))
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        self.pos = self.pos + 1
        return out.logits[:, -1].float()  # (n, V)

    def keep(self, idx: torch.Tensor) -> None:
        self.cache.batch_select_indices(idx)
        self.mask, self.pos = self.mask[idx], self.pos[idx]


_STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def unsupported_reason(model: Any) -> str | None:
    """None when :class:`LlamaDecodeStep` can decode ``model``, else why not (see the module docstring)."""
    cfg = getattr(model, "config", None)
    if type(model).__name__ != "LlamaForCausalLM" or getattr(cfg, "model_type", None) != "llama":
        return f"{type(model).__name__}: only LlamaForCausalLM"
    inner = model.model
    attn_impl = getattr(cfg, "_attn_implementation", None)
    if attn_impl not in ("sdpa", "eager"):
        return f"attention {attn_impl!r}: only sdpa, eager"
    act = getattr(cfg, "hidden_act", None)
    if act != "silu":
        return f"hidden_act {act!r}: only silu"
    if getattr(cfg, "sliding_window", None) or any(t != "full_attention" for t in getattr(cfg, "layer_types", None)
                                                  or ()):
        return "sliding-window attention"
    rope = getattr(inner, "rotary_emb", None)
    if getattr(rope, "rope_type", None) not in _STATIC_ROPE:
        return f"rope_type {getattr(rope, 'rope_type', None)!r}: only {', '.join(_STATIC_ROPE)}"
    if model.lm_head.weight.dtype != torch.float32:
        return f"dtype {model.lm_head.weight.dtype}: only float32"
    linear = [model.lm_head] + [m for layer in inner.layers for m in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
        layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
    # InPlaceGradLinear: the training LM head, a plain Linear without gradient (models.py)
    if any(type(m) not in (torch.nn.Linear, InPlaceGradLinear) for m in linear):
        return "a projection is not a plain nn.Linear (LoRA or quantised layer)"
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        return "forward hooks registered"
    return None


class _Layer:
    """One decoder layer's weights: the HF module's tensors, and q, k, v concatenated (made once)."""

    def __init__(self, layer: Any) -> None:
        a, m = layer.self_attn, layer.mlp
        self.wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])  # ((H + 2 H_kv) D, C)
        self.bqkv = None if a.q_proj.bias is None else torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
        self.wo, self.bo = a.o_proj.weight, a.o_proj.bias
        self.wg, self.bg = m.gate_proj.weight, m.gate_proj.bias
        self.wu, self.bu = m.up_proj.weight, m.up_proj.bias
        self.wd, self.bd = m.down_proj.weight, m.down_proj.bias
        self.ln1, self.eps1 = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.ln2, self.eps2 = layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon


class LlamaDecodeStep:
    """One-token decode step of a Llama-family model in plain torch (supported models: :func:`unsupported_reason`).

    The KV cache is one preallocated tensor for keys and one for values, (layers, B, H_kv, T, D); slots 0..P-2 are
    copied from the HF prefill cache, decode step t writes slot P - 1 + t for every row (positions differ per row:
    left padding), and a query attends to the slots its row's valid mask (B, T) marks (the prompt's attention mask,
    then every decoded slot). Dropping rows moves the kept rows' used slots up in place, all layers per copy.
    """

    def __init__(self, model: Any, cache: Any, attn: torch.Tensor, max_new_tokens: int) -> None:
        """``cache``: the HF ``DynamicCache`` of the prompts' first P - 1 positions, (B, H_kv, P - 1, D) per layer;
        ``attn`` (B, P) the prompts' attention mask (left padding)."""
        cfg, inner = model.config, model.model
        a0 = inner.layers[0].self_attn
        self.H, self.D = cfg.num_attention_heads, a0.head_dim
        self.Hkv = cfg.num_key_value_heads
        self.scale = a0.scaling
        self.layers = [_Layer(layer) for layer in inner.layers[: cfg.num_hidden_layers]]
        self.embed, self.head, self.head_bias = inner.embed_tokens.weight, model.lm_head.weight, model.lm_head.bias
        self.norm, self.norm_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.inv_freq = inner.rotary_emb.inv_freq.float()  # (D/2,)
        self.rope_scaling = float(inner.rotary_emb.attention_scaling)
        B, P = attn.shape
        T = P - 1 + max_new_tokens
        dev, dt = self.embed.device, self.embed.dtype
        self.k = torch.empty(len(self.layers), B, self.Hkv, T, self.D, dtype=dt, device=dev)
        self.v = torch.empty_like(self.k)
        for i, cl in enumerate(cache.layers[: len(self.layers)]):
            self.k[i, :, :, : P - 1] = cl.keys  # (B, H_kv, P - 1, D)
            self.v[i, :, :, : P - 1] = cl.values
        self.valid = torch.ones(B, T, dtype=torch.bool, device=dev)  # (B, T) slots a row attends to
        self.valid[:, :P] = attn.bool()
        self.t = P - 1  # the slot the next step writes
        self.pos = (attn.sum(-1) - 1).clamp(min=0)  # (B,) position of each row's next token
        self._rows(B)

    def _rows(self, n: int) -> None:
        """Per-layer views of the first n rows of the cache, and whether any active row has padding."""
        self.n = n
        self.kv = [(self.k[i, :n], self.v[i, :n]) for i in range(len(self.layers))]
        self.padded = not bool(self.valid[:n].all())

    def keep(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx`` (n',), in place: increasing ``idx`` moves row ``idx[i]`` to row i for each i in turn (a
        source row is never overwritten before it is read), only the slots 0..t-1 that hold data, all layers at once."""
        rows, L = idx.tolist(), self.t
        if all(a < b for a, b in zip(rows, rows[1:], strict=False)):
            for i, j in enumerate(rows):
                if i != j:
                    self.k[:, i, :, :L] = self.k[:, j, :, :L]
                    self.v[:, i, :, :L] = self.v[:, j, :, :L]
        else:
            self.k[:, : len(rows), :, :L] = self.k[:, idx, :, :L]
            self.v[:, : len(rows), :, :L] = self.v[:, idx, :, :L]
        n = len(rows)
        self.valid[:n] = self.valid[idx]
        self.pos = self.pos[idx]
        self._rows(n)

    def _rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (n, 1, D) of the active rows' positions, as ``LlamaRotaryEmbedding.forward``; sin's first half
        negated so that ``rotate_half(x) * sin == x[..., halves swapped] * sin_signed``."""
        freqs = self.pos.float()[:, None] * self.inv_freq  # (n, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (n, D)
        cos, sin = emb.cos() * self.rope_scaling, emb.sin() * self.rope_scaling
        half = self.D // 2
        sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        return cos[:, None], sin[:, None]

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        n, H, Hkv, D, t = self.n, self.H, self.Hkv, self.D, self.t
        L = t + 1  # slots attended this step
        cos, sin = self._rope()
        mask = self.valid[:n, None, None, :L] if self.padded else None  # (n, 1, 1, L) bool, True = attend
        x = F.embedding(tokens, self.embed)  # (n, C)
        C = x.shape[-1]
        for w, (kc, vc) in zip(self.layers, self.kv, strict=True):
            h = F.rms_norm(x, (C,), w.ln1, w.eps1)
            qkv = F.linear(h, w.wqkv, w.bqkv).view(n, H + 2 * Hkv, D)  # (n, H + 2 H_kv, D)
            qk = qkv[:, : H + Hkv]
            qk = qk * cos + qk.view(n, H + Hkv, 2, D // 2).flip(2).view(n, H + Hkv, D) * sin  # RoPE on q and k
            kc[:, :, t] = qk[:, H:]  # (n, H_kv, D)
            vc[:, :, t] = qkv[:, H + Hkv:]
            if mask is None:  # HF's sdpa: no mask -> enable_gqa with (n, H, 1, D) queries
                o = F.scaled_dot_product_attention(qk[:, :H, None], kc[:, :, :L], vc[:, :, :L], scale=self.scale,
                                                   enable_gqa=True)  # (n, H, 1, D)
            else:  # HF's sdpa with a mask and one query token: the G query heads of a kv head as G queries
                o = F.scaled_dot_product_attention(qk[:, :H].view(n, Hkv, H // Hkv, D), kc[:, :, :L], vc[:, :, :L],
                                                   attn_mask=mask, scale=self.scale)  # (n, H_kv, G, D)
            x = x + F.linear(o.reshape(n, H * D), w.wo, w.bo)
            h = F.rms_norm(x, (C,), w.ln2, w.eps2)
            x = x + F.linear(F.silu(F.linear(h, w.wg, w.bg)) * F.linear(h, w.wu, w.bu), w.wd, w.bd)
        self.t += 1
        self.pos = self.pos + 1
        return F.linear(F.rms_norm(x, (C,), self.norm, self.norm_eps), self.head, self.head_bias)  # (n, V)


def decode_dropping_finished(step: DecodeStep, last_tokens: torch.Tensor, max_new_tokens: int, temperature: float,
                             eos_ids: set[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to ``max_new_tokens`` tokens per row, running ``step`` only on rows not finished yet.

    ``last_tokens`` (B,) are the prompts' last tokens (``step`` holds the cache of the positions before them). Each
    step: forward the active rows' last token, ``probs = softmax(logits_fp32 / temperature)`` and
    ``torch.multinomial`` over a (B, V) tensor in which finished rows hold a one-hot row: the draw consumes the RNG
    by shape only (one exponential per entry, row-major), so every active row gets the token HF ``generate`` gives
    it for the same seed (checked: tests/test_models.py, tests/test_decode.py). A row that samples an end-of-turn
    token keeps it and leaves the batch (``step.keep``).

    Returns:
        ``(completion ids (B, T) right-padded with pad_id, log-probs (B, T) of the sampled tokens under the
        temperature-scaled distribution, 0 after a row's end)``, T = the number of steps run.
    """
    B = last_tokens.shape[0]
    dev = last_tokens.device
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=dev)
    active = torch.arange(B, device=dev)
    cur = last_tokens
    toks, lps = [], []
    for _ in range(max_new_tokens):
        logits = step(cur)  # (n, V) float32
        scores = logits / temperature if temperature != 1.0 else logits
        probs = torch.softmax(scores, dim=-1)
        full = torch.zeros(B, probs.shape[-1], dtype=probs.dtype, device=dev)
        full[:, 0] = 1.0
        full[active] = probs
        nxt = torch.multinomial(full, num_samples=1).squeeze(1)[active]  # (n,)
        step_tok = torch.full((B,), pad_id, dtype=torch.long, device=dev)
        step_tok[active] = nxt
        step_lp = torch.zeros(B, dtype=torch.float32, device=dev)
        step_lp[active] = selective_log_softmax(scores.unsqueeze(1), nxt.view(-1, 1)).squeeze(1)
        toks.append(step_tok)
        lps.append(step_lp)
        keep = ~torch.isin(nxt, eos)
        if not bool(keep.any()):
            break
        if not bool(keep.all()):
            idx = keep.nonzero().squeeze(1)
            step.keep(idx)
            active, nxt = active[idx], nxt[idx]
        cur = nxt
    comp = torch.stack(toks, dim=1) if toks else torch.zeros(B, 0, dtype=torch.long)
    return comp.cpu(), (torch.stack(lps, dim=1) if lps else torch.zeros(B, 0)).cpu()
