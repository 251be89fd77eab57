"""Rollout generation and the training forward pass (log-probs, entropy) for the local backend.

Sampling: transformers ``generate`` with KV cache, prompts left-padded and batched, ``n`` samples
per prompt (``num_return_sequences``: the samples of a prompt are contiguous, one group per
prompt). Per-token log-probs of the sampling policy come from the logits ``generate`` returns
(temperature-scaled, as the distribution actually sampled from; top-p truncation is not folded in,
as OpenRLHF and TRL). Finish reason: ``eos`` when the end-of-turn token was produced, ``length``
when the ``max_new_tokens`` cap was hit. vLLM is not wired in this version (CPU only here).

Shapes: ``B`` = prompts × samples per prompt, ``P`` = prompt tokens (left-padded), ``T`` =
completion tokens (right-padded), ``V`` = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from evotrainer.rl_backend.decode import (
    HFDecodeStep,
    LlamaDecodeStep,
    decode_dropping_finished,
    kv,
    kv_of,
    unsupported_reason,
)
from evotrainer.rl_backend.grpo import entropy_from_logits, selective_log_softmax


@dataclass
class RolloutBatch:
    """A batch of sampled completions, groups contiguous.

    Attributes:
        prompt_ids: (B, P) left-padded prompt token ids.
        prompt_mask: (B, P) 1 on real prompt tokens.
        completion_ids: (B, T) sampled tokens, right-padded with the pad id after the first eos.
        completion_mask: (B, T) 1 on trainable tokens (generated tokens up to and including eos).
            Multi-turn callers set observation / tool-output tokens to 0.
        sampling_logprobs: (B, T) log-probs of the sampled tokens under the sampling policy, nats
            (0 where the mask is 0).
        completions: (B,) decoded completion texts (special tokens removed).
        finish_reasons: (B,) ``eos`` | ``length`` (multi-turn: ``submit`` | ``budget`` | ``error``).
        lengths: (B,) completion tokens (the mask's row sums), tokens.
        prompts: (B,) the prompt text of each row (chat template applied).
        turns: (B,) per-episode turn lists for multi-turn rollouts (empty lists otherwise).
        completion_attention_mask: (B, T) 1 on every real completion token, observations included
            (None: same as ``completion_mask``); the forward pass attends to these.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    completions: list[str]
    finish_reasons: list[str]
    lengths: list[int]
    prompts: list[str]
    turns: list[list[dict[str, Any]]] = field(default_factory=list)
    completion_attention_mask: torch.Tensor | None = None

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, T) completion tokens the model attends to."""
        return self.completion_mask if self.completion_attention_mask is None else self.completion_attention_mask

    @property
    def size(self) -> int:
        """B, the number of samples."""
        return int(self.completion_ids.shape[0])

    def select(self, rows: list[int]) -> RolloutBatch:
        """The sub-batch of the given rows (kept groups), same order."""
        idx = torch.tensor(rows, dtype=torch.long)
        return RolloutBatch(
            self.prompt_ids[idx], self.prompt_mask[idx], self.completion_ids[idx], self.completion_mask[idx],
            self.sampling_logprobs[idx], [self.completions[i] for i in rows],
            [self.finish_reasons[i] for i in rows], [self.lengths[i] for i in rows],
            [self.prompts[i] for i in rows], [self.turns[i] for i in rows] if self.turns else [],
            None if self.completion_attention_mask is None else self.completion_attention_mask[idx])


def chat_prompts(tokenizer: Any, messages: list[list[dict[str, str]]]) -> list[str]:
    """Apply the tokenizer's chat template (with the generation prompt) to each message list."""
    return [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]


def _first_eos_mask(ids: torch.Tensor, eos_ids: set[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) mask up to and including the first eos, and (B,) bool whether an eos was produced."""
    is_eos = torch.zeros_like(ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= ids == e
    has_eos = is_eos.any(-1)
    T = ids.shape[1]
    first = torch.where(has_eos, is_eos.float().argmax(-1), torch.full_like(has_eos, T, dtype=torch.long))
    pos = torch.arange(T).unsqueeze(0)  # (1, T)
    mask = (pos <= first.unsqueeze(-1)) & (pos < T)
    return mask.long(), has_eos


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """End-of-turn ids: the tokenizer's eos plus the model's generation-config eos ids."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list | tuple):
        ids.update(gen_eos)
    return {i for i in ids if i is not None}


@torch.no_grad()
def generate(model: Any, tokenizer: Any, prompts: list[str], n: int, *, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, prompt_max_len: int = 512,
             seed: int | None = None, device: torch.device | None = None, share_prefill: bool = True,
             drop_finished: bool = True, fast_decode: bool = False) -> RolloutBatch:
    """Sample ``n`` completions for each prompt in one batched ``generate`` call (KV cache).

    Args:
        prompts: (P,) prompt texts (chat template already applied).
        n: samples per prompt (B = P × n, groups contiguous).
        max_new_tokens: cap on completion tokens (the recipe's ``generate_max_len``).
        temperature: 0 means greedy (all n samples identical); otherwise sampling at this temperature.
        top_p: nucleus sampling (1 disables). top-k is disabled (no hidden top_k=50 default).
        prompt_max_len: longer prompts keep their last ``prompt_max_len`` tokens.
        seed: seeds torch's RNG for this call (reproducible rollouts).
        share_prefill: run each prompt's prefill once and copy its KV cache to the n samples
            (``DynamicCache.batch_repeat_interleave``) instead of n prefills.
        drop_finished: with ``share_prefill``, plain sampling (temperature > 0, ``top_p = 1``, no other logits
            processor in the model's generation config), decode with :func:`decode.decode_dropping_finished`:
            rows that produced an end-of-turn token leave the batch, so no forward runs on them (HF ``generate``
            decodes every row until the last one stops). Same tokens as ``generate`` for the same seed.
        fast_decode: with ``drop_finished``, run each decode step as :class:`decode.LlamaDecodeStep` (plain torch
            over the model's weights, preallocated KV cache) where the model is supported
            (:func:`decode.unsupported_reason`), else through the HF forward. Same tokens, log-probs within 1e-4.
            Off by default: 1.1x on SmolLM2's decode here, whose time is in the matmuls either way
            (docs/performance.md §7).

    Returns:
        :class:`RolloutBatch` with B = len(prompts) × n rows.
    """
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, truncation=True, max_length=prompt_max_len,
                    add_special_tokens=False)
    input_ids = enc.input_ids.to(device)
    attn = enc.attention_mask.to(device)
    if seed is not None:
        torch.manual_seed(seed)
    greedy = temperature <= 0
    kwargs: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens, do_sample=not greedy, num_return_sequences=n,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=sorted(eos_token_ids(model, tokenizer)),
        return_dict_in_generate=True, output_logits=True, top_k=None if greedy else 0,
    )
    if not greedy:
        kwargs.update(temperature=temperature, top_p=top_p)
    else:
        kwargs.update(temperature=None, top_p=None)
    P = input_ids.shape[1]
    if n > 1 and P > 1 and share_prefill:
        # Prefill each prompt once (all but its last token), copy the KV cache n times, then decode:
        # generate(num_return_sequences=n) would run the prompt's forward n times.
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        pre = model(input_ids=input_ids[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, :-1],
                    use_cache=True, logits_to_keep=1)
        cache = kv_of(pre)
        cache.batch_repeat_interleave(n)
        input_ids, attn = input_ids.repeat_interleave(n, 0), attn.repeat_interleave(n, 0)
        if _plain_sampling(model, greedy, top_p) and drop_finished:
            step = (LlamaDecodeStep(model, cache, attn, max_new_tokens)
                    if fast_decode and unsupported_reason(model) is None else HFDecodeStep(model, cache, attn))
            comp, step_lps = decode_dropping_finished(step, input_ids[:, -1], max_new_tokens, float(temperature),
                                                      eos_token_ids(model, tokenizer), tokenizer.pad_token_id)
        else:
            out = model.generate(input_ids=input_ids, attention_mask=attn, **kv(cache),
                                 **{**kwargs, "num_return_sequences": 1})
            comp, step_lps = out.sequences[:, P:].cpu(), None
        input_ids, attn = input_ids[::n], attn[::n]
    else:
        out = model.generate(input_ids=input_ids, attention_mask=attn, **kwargs)
        comp, step_lps = out.sequences[:, P:].cpu(), None  # (B, T)
    eos = eos_token_ids(model, tokenizer)
    mask, has_eos = _first_eos_mask(comp, eos)
    # log-probs of the sampled tokens under the temperature-scaled sampling distribution
    scale = 1.0 if greedy else float(temperature)
    if step_lps is not None:
        logprobs = step_lps * mask
    else:
        lps = []
        for t, logits in enumerate(out.logits):  # T tensors of (B, V)
            lps.append(selective_log_softmax((logits.float() / scale).unsqueeze(1),
                                             comp[:, t:t + 1].to(logits.device)))
        logprobs = torch.cat(lps, dim=1).cpu() * mask if lps else torch.zeros(comp.shape)
    comp = torch.where(mask.bool(), comp, torch.full_like(comp, tokenizer.pad_token_id))
    lengths = mask.sum(-1).tolist()
    texts = tokenizer.batch_decode([row[:L] for row, L in zip(comp.tolist(), lengths, strict=True)],
                                   skip_special_tokens=True)
    if was_training:
        model.train()
    return RolloutBatch(
        prompt_ids=input_ids.cpu().repeat_interleave(n, dim=0), prompt_mask=attn.cpu().repeat_interleave(n, dim=0),
        completion_ids=comp, completion_mask=mask, sampling_logprobs=logprobs, completions=texts,
        finish_reasons=["eos" if h else "length" for h in has_eos.tolist()], lengths=[int(x) for x in lengths],
        prompts=[p for p in prompts for _ in range(n)], turns=[[] for _ in range(len(prompts) * n)])


# Generation-config fields whose non-default value adds a logits processor or a stopping rule to HF ``generate``;
# any of them set sends sampling back to ``generate`` (the custom decode loop implements plain sampling only).
_PROCESSOR_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
    "min_length": (None, 0), "min_new_tokens": (None, 0), "bad_words_ids": (None,), "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "sequence_bias": (None,), "min_p": (None,), "typical_p": (None, 1.0), "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0), "exponential_decay_length_penalty": (None,), "renormalize_logits": (None, False),
    "stop_strings": (None,), "max_time": (None,), "watermarking_config": (None,),
}


def _plain_sampling(model: Any, greedy: bool, top_p: float) -> bool:
    """True when HF ``generate`` would sample from ``softmax(logits / temperature)`` with no other processor."""
    if greedy or top_p < 1.0:
        return False
    gc = getattr(model, "generation_config", None)
    return all(getattr(gc, k, None) in ok for k, ok in _PROCESSOR_DEFAULTS.items())


def sequence_logprobs(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion_ids: torch.Tensor, completion_mask: torch.Tensor, temperature: float = 1.0,
                      with_entropy: bool = False, completion_attention_mask: torch.Tensor | None = None,
                      group_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the completion tokens under ``model``, one batched forward.

    The sequence is ``[prompt (left-padded) | completion (right-padded)]``; position ids follow the
    attention mask (as ``generate``), and only the last ``T + 1`` positions go through the LM head
    (``logits_to_keep``) so prompt tokens cost no vocabulary projection. Logits are divided by the
    sampling temperature, so the log-probs are those of the sampling distribution (OpenRLHF, TRL).

    Args:
        prompt_ids, prompt_mask: (B, P). completion_ids, completion_mask: (B, T).
        completion_attention_mask: (B, T) tokens attended to (default ``completion_mask``); set it
            when observation tokens are masked out of the loss but are part of the context.
        group_size: G; when every G consecutive rows share one prompt (a GRPO group), the prompt
            runs through the model once per group with gradient, its KV cache is copied to the G
            rows (``repeat_interleave``, differentiable) and only completion tokens run per row.
            Same values and gradients as the plain path (tests check both), ~G-fold fewer prompt
            tokens.
        with_entropy: also return the per-token entropy (B, T), nats, computed without gradient.

    Returns:
        ``(logprobs (B, T) float32, differentiable; entropy (B, T) or None)``.
    """
    device = next(model.parameters()).device
    comp_attn = completion_mask if completion_attention_mask is None else completion_attention_mask
    attn = torch.cat([prompt_mask, comp_attn], dim=1).to(device)  # (B, P+T)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    B, P = prompt_ids.shape
    T = completion_ids.shape[1]
    G = group_size or 1
    shared = G > 1 and B % G == 0 and P > 0 and bool(
        (prompt_ids.view(B // G, G, P) == prompt_ids[::G].unsqueeze(1)).all())
    if shared:
        up_mask = prompt_mask[::G].to(device)  # (B/G, P)
        out_p = model(input_ids=prompt_ids[::G].to(device), attention_mask=up_mask, position_ids=pos[::G, :P],
                      use_cache=True, logits_to_keep=1)
        cache = kv_of(out_p)
        cache.batch_repeat_interleave(G)  # (B/G, ...) → (B, ...), differentiable
        out_c = model(input_ids=completion_ids.to(device), attention_mask=attn, position_ids=pos[:, P:], use_cache=True,
                      **kv(cache))
        logits = torch.cat([out_p.logits.repeat_interleave(G, 0), out_c.logits[:, :-1]], dim=1)  # (B, T, V)
    else:
        ids = torch.cat([prompt_ids, completion_ids], dim=1).to(device)  # (B, P+T)
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=T + 1, use_cache=False)
        logits = out.logits[:, :-1, :]  # (B, T, V): position P-1+t predicts completion token t
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logprobs = selective_log_softmax(logits, completion_ids.to(device))
    ent = None
    if with_entropy:
        with torch.no_grad():
            ent = entropy_from_logits(logits.detach())
    return logprobs, ent


def packed_logprobs(model: Any, prompt_ids: torch.Tensor, completion_ids: torch.Tensor,
                    completion_attention_mask: torch.Tensor, extents: list[int], temperature: float = 1.0,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of ``k`` completions of one prompt from one forward of one packed sequence.

    The sequence is ``[prompt | c_1[:e_1-1] | ... | c_k[:e_k-1]]`` (length ``L = p + Σ(e_r - 1)``, real
    tokens only: no padding, the prompt once) with a block-diagonal causal mask: a prompt token attends to
    the prompt tokens before it, a token of ``c_r`` to the whole prompt and to the attended tokens of ``c_r``
    before it. Position ids restart after the prompt for every completion (``p + cumsum(attention) - 1``,
    the position :func:`sequence_logprobs` gives the same token). Completion token 0 of every row is
    predicted by the prompt's last position, token ``t >= 1`` of ``c_r`` by ``c_r``'s token ``t - 1``, so a
    row's last token is scored but not fed. Each token sees the keys, positions and values it sees in the
    padded batch ``[prompt | c_r]``, so log-probs equal :func:`sequence_logprobs`'s up to float summation
    order, and the gradient into the prompt is the sum over the rows (as with ``group_size``). Only the
    ``L - p + 1`` positions that predict a completion token go through the LM head.

    Attention cost is ``O(L²)`` (a dense masked SDPA), against ``Σ_r e_r (p + e_r)`` for the padded rows: the
    caller keeps ``L`` moderate (``local._pieces``).

    Args:
        prompt_ids: (p,) the prompt's real tokens (left padding removed), p >= 1.
        completion_ids: (k, T) completions, right-padded.
        completion_attention_mask: (k, T) 1 on completion tokens attended to.
        extents: (k,) tokens scored per row, ``1 <= e_r <= T`` (``e_r - 1`` are fed).
        temperature: logits are divided by it (the sampling distribution's log-probs).
        with_entropy: also return the per-token entropy, nats, without gradient.

    Returns:
        ``(logprobs (k, W) float32, differentiable, 0 at t >= e_r; entropy (k, W) or None)``, W = max(extents).
    """
    device = next(model.parameters()).device
    k, W, p = completion_ids.shape[0], max(extents), int(prompt_ids.shape[0])
    feed = [e - 1 for e in extents]
    seg_ids = [prompt_ids.to(device)] + [completion_ids[r, : feed[r]].to(device) for r in range(k)]
    ids = torch.cat(seg_ids).unsqueeze(0)  # (1, L)
    L = int(ids.shape[1])
    comp_attn = completion_attention_mask.to(device).long()
    seg = torch.cat([torch.zeros(p, dtype=torch.long, device=device)]
                    + [torch.full((feed[r],), r + 1, dtype=torch.long, device=device) for r in range(k)])  # (L,)
    key_ok = torch.cat([torch.ones(p, dtype=torch.bool, device=device)]
                       + [comp_attn[r, : feed[r]].bool() for r in range(k)])  # (L,)
    pos = torch.cat([torch.arange(p, device=device)]
                    + [(p + comp_attn[r, : feed[r]].cumsum(0) - 1).clamp(min=0) for r in range(k)]).unsqueeze(0)
    idx = torch.arange(L, device=device)
    allowed = ((idx.unsqueeze(1) >= idx.unsqueeze(0)) & key_ok.unsqueeze(0)
               & ((seg.unsqueeze(0) == 0) | (seg.unsqueeze(0) == seg.unsqueeze(1))))  # (L query, L key)
    if getattr(model.config, "_attn_implementation", "sdpa") == "sdpa":
        mask = allowed[None, None]  # (1, 1, L, L) bool, True = attend
    else:  # eager: additive float mask
        dt = next(model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dt, device=device).masked_fill(~allowed, torch.finfo(dt).min)[None, None]
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=L - p + 1, use_cache=False)
    z = out.logits[0].float()  # (K = L - p + 1, V): kept position j is sequence position p - 1 + j
    if temperature > 0 and temperature != 1.0:
        z = z / temperature
    # kept index predicting (row r, token t): 0 for t = 0 (the prompt's last token), else 1 + Σ_{r'<r} feed + t - 1
    starts = [1 + sum(feed[:r]) for r in range(k)]
    pidx = torch.tensor([0 if t == 0 else starts[r] + t - 1 for r in range(k) for t in range(extents[r])],
                        dtype=torch.long, device=device)
    flat = torch.tensor([r * W + t for r in range(k) for t in range(extents[r])], dtype=torch.long, device=device)
    target = completion_ids.to(device).reshape(-1)[torch.tensor([r * completion_ids.shape[1] + t for r in range(k)
                                                                 for t in range(extents[r])], device=device)]
    lp_flat = z[pidx, target] - torch.logsumexp(z, dim=-1)[pidx]
    logprobs = torch.zeros(k * W, dtype=lp_flat.dtype, device=device).index_put((flat,), lp_flat).view(k, W)
    ent = None
    if with_entropy:
        with torch.no_grad():
            ent = torch.zeros(k * W, device=device).index_put((flat,), entropy_from_logits(z.detach())[pidx]).view(k, W)
    return logprobs, ent


def _pad_to(x: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
    pad = width - x.shape[1]
    if pad <= 0:
        return x
    fill = torch.full((x.shape[0], pad), value, dtype=x.dtype)
    return torch.cat([fill, x], 1) if left else torch.cat([x, fill], 1)


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Stack rollout batches row-wise (prompts re-padded on the left, completions on the right)."""
    if len(batches) == 1:
        return batches[0]
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = max(b.completion_ids.shape[1] for b in batches)
    cat = torch.cat
    has_attn = any(b.completion_attention_mask is not None for b in batches)
    return RolloutBatch(
        prompt_ids=cat([_pad_to(b.prompt_ids, P, pad_id, True) for b in batches]),
        prompt_mask=cat([_pad_to(b.prompt_mask, P, 0, True) for b in batches]),
        completion_ids=cat([_pad_to(b.completion_ids, T, pad_id, False) for b in batches]),
        completion_mask=cat([_pad_to(b.completion_mask, T, 0, False) for b in batches]),
        sampling_logprobs=cat([_pad_to(b.sampling_logprobs, T, 0, False) for b in batches]),
        completions=[c for b in batches for c in b.completions],
        finish_reasons=[f for b in batches for f in b.finish_reasons],
        lengths=[n for b in batches for n in b.lengths], prompts=[p for b in batches for p in b.prompts],
        turns=[t for b in batches for t in (b.turns or [[] for _ in range(b.size)])],
        completion_attention_mask=cat([_pad_to(b.attention_mask, T, 0, False) for b in batches]) if has_attn else None,
    )
