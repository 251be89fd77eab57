"""The plain-torch Llama decode step (rl_backend/decode.py) against the HF forward.

- ``LlamaDecodeStep``: next-token logits equal the HF forward's with a ``DynamicCache`` (fp32, atol 1e-5) over
  several steps, with and without left padding, before and after dropping rows, on tiny random Llamas with GQA,
  biases, an untied head, ``llama3`` RoPE and a head dim other than hidden / heads; and on SmolLM2-135M.
- ``unsupported_reason``: LoRA, bf16, dynamic RoPE, hooks and other classes fall back to the HF forward.
- ``generate``: the same tokens with the plain-torch step as with the HF forward (tiny model: tests/test_models.py;
  SmolLM2: 2 prompts x 8 samples, 16 tokens here, 64 tokens for two seeds under ``slow``).
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


def _tiny(seed: int = 0, **cfg_kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, initializer_range=0.3)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**{**cfg, **cfg_kw}))
        for name, p in model.named_parameters():  # biases and norms away from their init (0, 1)
            if "bias" in name or "norm" in name:
                p.data.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _prompts(B: int, P: int, V: int, pad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (B, P), generator=g)
    attn = torch.ones(B, P, dtype=torch.long)
    if pad:  # row 0 full, row 1 two pad tokens, row 3 four
        attn[1, :2] = 0
        attn[3, :4] = 0
    return ids, attn


def _prefill(model, ids, attn):
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, :-1], use_cache=True,
                 logits_to_keep=1).cache


def _compare_steps(model, ids, attn, steps: int = 4, drop_at: int = 2, atol: float = 1e-5) -> None:
    """Feed the same tokens to both steps; rows 1 and 2 are dropped before step ``drop_at``."""
    with torch.no_grad():
        fast = decode.LlamaDecodeStep(model, _prefill(model, ids, attn), attn, max_new_tokens=steps)
        ref = decode.HFDecodeStep(model, _prefill(model, ids, attn), attn)
        cur = ids[:, -1]
        for s in range(steps):
            if s == drop_at:
                idx = torch.tensor([0, 3])
                fast.keep(idx)
                ref.keep(idx)
                cur = cur[idx]
            a, b = fast(cur), ref(cur)  # (n, V)
            torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)
            cur = b.argmax(-1)


@pytest.mark.parametrize("pad", [True, False])
@pytest.mark.parametrize("cfg", [
    {},
    {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False},
    {"head_dim": 32, "num_key_value_heads": 1},
    {"num_key_value_heads": 4, "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64}},
], ids=["gqa", "biases-untied", "head_dim-mqa", "mha-llama3-rope"])
def test_llama_decode_step_logits_equal_the_hf_forward(cfg, pad):
    model = _tiny(**cfg)
    assert decode.unsupported_reason(model) is None
    ids, attn = _prompts(4, 7, model.config.vocab_size, pad)
    _compare_steps(model, ids, attn)


def test_eager_attention_is_supported_and_equal():
    model = _tiny(attn_implementation="eager")
    assert model.config._attn_implementation == "eager" and decode.unsupported_reason(model) is None
    _compare_steps(model, *_prompts(4, 7, model.config.vocab_size, True))


def test_unsupported_models_are_named():
    from peft import LoraConfig, get_peft_model
    from transformers import MistralConfig, MistralForCausalLM

    assert "bfloat16" in decode.unsupported_reason(_tiny().to(torch.bfloat16))
    dyn = _tiny(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    assert "dynamic" in decode.unsupported_reason(dyn)
    hooked = _tiny()
    hooked.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert "hooks" in decode.unsupported_reason(hooked)
    lora = get_peft_model(_tiny(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert "LlamaForCausalLM" in decode.unsupported_reason(lora)
    assert "nn.Linear" in decode.unsupported_reason(lora.base_model.model)  # the LoRA-wrapped Llama inside
    mistral = MistralForCausalLM(MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                               num_attention_heads=4, num_key_value_heads=2))
    assert "only LlamaForCausalLM" in decode.unsupported_reason(mistral)


@pytest.fixture(scope="module")
def smollm2():
    b = models.load_policy(ModelSpec(name_or_path=models.DEFAULT_MODEL), device=torch.device("cpu"))
    prompts = sampling.chat_prompts(b.tokenizer, [[{"role": "user", "content": "What is 3 + 4?"}],
                                                  [{"role": "user", "content": "Name a prime number above 20."}]])
    return b.model.eval(), b.tokenizer, prompts


def _same_rollouts(model, tok, prompts, seed: int, max_new_tokens: int) -> None:
    kw = dict(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    fast = sampling.generate(model, tok, prompts, 8, fast_decode=True, **kw)
    hf = sampling.generate(model, tok, prompts, 8, **kw)
    assert torch.equal(fast.completion_ids, hf.completion_ids) and fast.lengths == hf.lengths
    m = hf.completion_mask.bool()
    torch.testing.assert_close(fast.sampling_logprobs[m], hf.sampling_logprobs[m], atol=1e-4, rtol=0)


def test_smollm2_decode_step_and_rollouts_equal_the_hf_forward(smollm2):
    model, tok, prompts = smollm2
    assert decode.unsupported_reason(model) is None
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert enc.attention_mask[:, 0].tolist().count(0) == 1  # one prompt is left-padded
    ids, attn = enc.input_ids.repeat_interleave(2, 0), enc.attention_mask.repeat_interleave(2, 0)
    _compare_steps(model, ids, attn, steps=3, drop_at=1)  # logits of order 30 (measured: bit-equal here)
    _same_rollouts(model, tok, prompts, seed=0, max_new_tokens=16)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_smollm2_rollouts_of_64_tokens_equal_the_hf_forward(smollm2, seed):
    _same_rollouts(*smollm2, seed=seed, max_new_tokens=64)
