"""The GRPO update's fast paths (issue 21) give the plain paths' values and gradients.

- Length-trimmed pieces (``LocalBackend(trim_padding=True, pack_completions=False)``, ``local._pieces``):
  each group split by completion length, each piece padded to its own longest row; and packed pieces (the
  default, ``pack_completions=True``): each group's completions in one sequence behind one copy of the
  prompt, block-diagonal causal mask (``sampling.packed_logprobs``). Loss, every metric (update-size probe
  included) and every parameter's gradient equal one padded forward per micro-batch (the plain path),
  with 1 and 2 PPO epochs, 1 and 2 micro-batches, KL off, in the loss, and in the reward.
- ``packed_logprobs`` alone: log-probs, entropy and gradients equal ``sequence_logprobs``'s on the padded
  rows, with holes in the completion attention mask (tokens in context but not attended).
- Old log-probs: epoch 0's own log-probs, detached, give the loss and gradients of an explicit no-grad
  old-log-prob forward (ratio exactly 1); in epoch 1 the ratio moves off 1 (the weights moved).
- ``_split_sorted``: the dynamic programme's cuts, by hand.
- The input embedding's in-place backward (``models.InPlaceGradEmbedding``, the default of full fine-tuning):
  the update's gradients equal torch's ``nn.Embedding``'s (tied weights, two micro-batches); alone, with
  ``padding_idx``, repeated ids and untied weights, over two accumulated backwards.
- The LM head's in-place weight gradient (``models.InPlaceGradLinear``, the default of full fine-tuning): the
  update's gradients, metrics and stepped weights equal torch's ``nn.Linear``'s (tied weights, two
  micro-batches); alone, by hand, over two accumulated backwards (the first makes ``weight.grad``, the second
  adds into it in place), with the input's gradient equal to torch's.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from evotrainer import metrics as M
from evotrainer.recipe import validate_recipe
from evotrainer.rl_backend import grpo
from evotrainer.rl_backend.local import (
    LocalBackend,
    _pieces,
    _split_packed,
    _split_sorted,
    pack_attention_cost,
)
from evotrainer.rl_backend.models import (
    InPlaceGradEmbedding,
    InPlaceGradLinear,
    load_policy,
    use_inplace_embedding_grad,
    use_inplace_head_grad,
)
from evotrainer.rl_backend.sampling import (
    RolloutBatch,
    chat_prompts,
    generate,
    packed_logprobs,
    sequence_logprobs,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

G, T = 4, 10
# lengths cut by hand into the generated rows: short, long, empty, full width, as a real batch has
LENGTHS = [2, 10, 5, 3, 1, 0, 7, 4]


def _recipe(**over):
    return validate_recipe({"model": {"name_or_path": "tiny-random"}, "n_samples_per_prompt": G,
                            "rollout_batch_size": 2, "generate_max_len": T, "init_kl_coef": 0.0,
                            "micro_train_batch_size": 8, "drop_zero_variance_groups": False, **over})


@pytest.fixture(scope="module")
def batch():
    """(state dict of the tiny model, a rollout batch of 2 prompts x 4 samples with the lengths above)."""
    b = load_policy(_recipe().model, kl=False)
    prompts = chat_prompts(b.tokenizer, [[{"role": "user", "content": "What is 1 + 2?"}],
                                         [{"role": "user", "content": "Hi"}]])
    rb = generate(b.model, b.tokenizer, prompts, G, max_new_tokens=T, temperature=1.0, seed=0)
    assert rb.completion_ids.shape == (8, T)
    # right-truncate each row to its length: mask 0 and pad id after it (what an early eos gives)
    mask = (torch.arange(T).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).long()
    ids = torch.where(mask.bool(), rb.completion_ids, torch.full_like(rb.completion_ids, b.tokenizer.pad_token_id))
    rb = RolloutBatch(rb.prompt_ids, rb.prompt_mask, ids, mask, rb.sampling_logprobs * mask, rb.completions,
                      rb.finish_reasons, LENGTHS, rb.prompts, rb.turns)
    return copy.deepcopy(b.model.state_dict()), rb


def _update(state, rb, recipe, trim, pack=True, inplace_embedding_grad=True, inplace_head_grad=True):
    """One ``_update`` from the same weights: (metrics, flat gradient of the last epoch, flat weights after)."""
    torch.manual_seed(0)
    bundle = load_policy(recipe.model, kl=recipe.kl_enabled, offload_reference=False,
                         inplace_embedding_grad=inplace_embedding_grad, inplace_head_grad=inplace_head_grad)
    assert isinstance(bundle.model.get_input_embeddings(), InPlaceGradEmbedding) is inplace_embedding_grad
    assert isinstance(bundle.model.get_output_embeddings(), InPlaceGradLinear) is inplace_head_grad
    bundle.model.load_state_dict(state)
    if bundle.ref_model is not None:
        # a reference that differs from the policy, so the KL terms are not 0
        bundle.ref_model.load_state_dict({k: v * 0.9 for k, v in state.items()})
    bundle.model.train()
    opt = torch.optim.AdamW(bundle.trainable_parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.25], dtype=torch.float64)
    m = LocalBackend(device="cpu", num_threads=1, trim_padding=trim, pack_completions=pack)._update(
        bundle, opt, recipe, rb, rewards)
    grads = torch.cat([p.grad.flatten() for p in bundle.trainable_parameters()])
    weights = torch.cat([p.detach().flatten() for p in bundle.trainable_parameters()])
    return m, grads, weights


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "trimmed"])
@pytest.mark.parametrize("over", [
    {},  # one epoch, no KL, one micro-batch
    {"max_epochs": 2, "micro_train_batch_size": 4, "init_kl_coef": 0.05, "use_kl_loss": True},
    {"init_kl_coef": 0.05, "use_kl_loss": False, "loss_agg_mode": "seq-mean-token-mean"},
    {"max_epochs": 2, "micro_train_batch_size": 4},  # 2 epochs, 2 micro-batches, no KL
    {"init_kl_coef": 0.05, "use_kl_loss": True, "loss_agg_mode": "seq-mean-token-sum"},  # 1 epoch, KL loss
])
def test_trimmed_pieces_equal_the_padded_micro_batches(batch, over, pack):
    state, rb = batch
    recipe = _recipe(**over)
    b = load_policy(recipe.model, kl=False)
    cost = pack_attention_cost(b.model) if pack else None
    trimmed = _pieces(recipe, rb, trim=True, pack_cost=cost)
    # precondition: the fast path really runs narrower forwards than the plain one (packed: real tokens only,
    # the prompt once per piece, each row's last token not fed)
    assert sum(len(p.rows) * p.width for p in trimmed) < rb.size * T
    assert sorted(int(r) for p in trimmed for r in p.rows) == list(range(rb.size))
    assert all(p.packed for p in trimmed) == pack and any(p.packed for p in trimmed) == pack
    if pack:
        assert sum(sum(e - 1 for e in p.extents) for p in trimmed) == sum(max(x, 1) - 1 for x in LENGTHS)
    m_plain, g_plain, w_plain = _update(state, rb, recipe, trim=False)
    m_fast, g_fast, w_fast = _update(state, rb, recipe, trim=True, pack=pack)
    torch.testing.assert_close(m_fast.pop("_advantages"), m_plain.pop("_advantages"))
    assert m_fast.keys() == m_plain.keys()
    for k, v in m_plain.items():
        assert m_fast[k] == pytest.approx(v, rel=1e-4, abs=1e-7), k
    assert m_plain[M.POLICY_UPDATE_KL] > 0 and m_plain[M.LOSS_POLICY] != 0
    if recipe.kl_enabled:
        assert m_plain[M.POLICY_KL] > 0
    torch.testing.assert_close(g_fast, g_plain, atol=1e-5 * float(g_plain.abs().max()), rtol=1e-4)
    # the weights after the step: AdamW's first step is ~lr·g/(|g| + eps) per coordinate, so coordinates whose
    # gradient is rounding noise (|g| ~ 1e-10) may step either way; compare where the gradient is real (with 2
    # epochs, in both epochs: epoch 0's gradient is the 1-epoch update's)
    real = g_plain.abs() > 1e-3 * float(g_plain.abs().max())
    if recipe.max_epochs > 1:
        _, g0, _ = _update(state, rb, _recipe(**{**over, "max_epochs": 1}), trim=False)
        real &= g0.abs() > 1e-3 * float(g0.abs().max())
    assert int(real.sum()) > 1000
    torch.testing.assert_close(w_fast[real], w_plain[real], atol=1e-6, rtol=1e-5)


def test_pieces_plain_path_is_one_forward_per_micro_batch(batch):
    _, rb = batch
    plain = _pieces(_recipe(micro_train_batch_size=4), rb, trim=False)
    assert [(p.chunk, p.rows.tolist(), p.width, p.start, p.group_size) for p in plain] == [
        (0, [0, 1, 2, 3], T, 0, G), (1, [4, 5, 6, 7], T, 0, G)]
    # trimmed: each group's rows sorted by length, widths their run's longest (an empty row counts as 1),
    # the second prompt's shared left padding dropped
    fast = _pieces(_recipe(micro_train_batch_size=4), rb, trim=True)
    assert all(p.chunk == (0 if int(p.rows[0]) < 4 else 1) for p in fast)
    for p in fast:
        assert p.width == max(max(LENGTHS[int(r)] for r in p.rows), 1)
        assert p.group_size == len(p.rows)
    short = int((rb.prompt_mask[4] == 0).sum())
    assert short > 0 and {p.start for p in fast if p.chunk == 1} == {short}


def test_packed_logprobs_equal_the_padded_rows(batch):
    # one group (rows 0-3: lengths 2, 10, 5, 3) with holes in the attention mask of two rows: the packed
    # sequence's log-probs, entropy and gradients are the padded rows' (``sequence_logprobs``) at every scored
    # token, and 0 after a row's extent
    state, rb = batch
    b = load_policy(_recipe().model, kl=False)
    b.model.load_state_dict(state)
    rows = torch.tensor([0, 1, 2, 3])
    attn = rb.completion_mask[rows].clone()
    attn[1, 3] = attn[1, 6] = attn[2, 1] = 0  # in the sequence, not attended to
    ids = rb.completion_ids[rows]
    ext = [int(x) for x in ((attn.bool() | rb.completion_mask[rows].bool()).long() * torch.arange(1, T + 1)).amax(-1)]
    w = torch.randn(len(rows), T)  # a random linear functional of the log-probs: its gradient checks the backward
    out = []
    for packed in (True, False):
        b.model.zero_grad()
        if packed:
            lp, ent = packed_logprobs(b.model, rb.prompt_ids[0][rb.prompt_mask[0].bool()], ids, attn, ext,
                                      temperature=0.7, with_entropy=True)
            lp = torch.nn.functional.pad(lp, (0, T - lp.shape[1]))
            ent = torch.nn.functional.pad(ent, (0, T - ent.shape[1]))
        else:
            lp, ent = sequence_logprobs(b.model, rb.prompt_ids[rows], rb.prompt_mask[rows], ids,
                                        rb.completion_mask[rows], temperature=0.7, with_entropy=True,
                                        completion_attention_mask=attn)
        scored = (torch.arange(T).unsqueeze(0) < torch.tensor(ext).unsqueeze(1)).float()
        (lp * scored * w).sum().backward()
        out.append((lp.detach() * scored, ent * scored, torch.cat([p.grad.flatten() for p in b.trainable_parameters()])))
    (lp_p, ent_p, g_p), (lp_s, ent_s, g_s) = out
    assert ext == [2, 10, 5, 3]
    torch.testing.assert_close(lp_p, lp_s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_p, ent_s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_p, g_s, atol=1e-5 * float(g_s.abs().max()), rtol=1e-4)


def test_split_packed_by_hand():
    # prompt 2, lengths 1, 11, 11 (fed 0, 10, 10), overhead 5, attention cost c per token pair:
    # one run L = 22: 27 + 484c; {1, 11}, {11}: L = 12 twice: 34 + 288c (equal at c = 7/196 = 0.036);
    # {1}, {11, 11}: 34 + 488c and {1}, {11}, {11}: 41 + 292c are never best
    assert _split_packed([1, 11, 11], 2, 0.0, 5) == [3]
    assert _split_packed([1, 11, 11], 2, 0.03, 5) == [3]
    assert _split_packed([1, 11, 11], 2, 1.0, 5) == [2, 3]


def test_split_sorted_by_hand():
    # lengths 1, 2, 10 with overhead 3: {1,2},{10} = 2*2+3 + 10+3 = 20 beats {1,2,10} = 30+3 = 33 and
    # {1},{2},{10} = 1+2+10+9 = 22
    assert _split_sorted([1, 2, 10], 3) == [2, 3]
    # a large overhead keeps one run; no overhead gives one run per distinct length
    assert _split_sorted([1, 2, 10], 100) == [3]
    assert _split_sorted([1, 2, 2, 10], 0) == [1, 3, 4]


def test_detached_first_epoch_logprobs_equal_an_old_logprob_forward(batch):
    # on-policy: before the first optimiser step π_old is the current policy, so epoch 0's own log-probs,
    # detached, equal an explicit no-grad forward's; loss and gradients are those of the plain path
    state, rb = batch
    b = load_policy(_recipe().model, kl=False)
    b.model.load_state_dict(state)
    b.model.train()
    adv = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.25]), G)
    out = []
    for explicit in (False, True):
        b.model.zero_grad()
        lp, _ = sequence_logprobs(b.model, rb.prompt_ids, rb.prompt_mask, rb.completion_ids, rb.completion_mask,
                                  group_size=G)
        if explicit:
            with torch.no_grad():
                old, _ = sequence_logprobs(b.model, rb.prompt_ids, rb.prompt_mask, rb.completion_ids,
                                           rb.completion_mask, group_size=G)
        else:
            old = lp.detach()
        res = grpo.policy_loss(lp, old, adv, rb.completion_mask)
        res.loss.backward()
        out.append((res, torch.cat([p.grad.flatten() for p in b.trainable_parameters()])))
    (fast, g_fast), (plain, g_plain) = out
    m = rb.completion_mask.bool()
    assert torch.all(fast.ratio[m] == 1.0)
    torch.testing.assert_close(plain.ratio[m], torch.ones(int(m.sum())), atol=1e-6, rtol=0)
    assert float(fast.loss.detach()) == pytest.approx(float(plain.loss.detach()), rel=1e-6, abs=1e-9)
    torch.testing.assert_close(g_fast, g_plain, atol=1e-6 * float(g_plain.abs().max()), rtol=1e-5)


def test_later_epochs_use_epoch_zero_logprobs_as_old(batch):
    # 2 PPO epochs: epoch 1 runs after a step, its ratio against epoch 0's log-probs is off 1; 1 epoch: the
    # loss's ratio is exactly 1 and the extremes come from the update-size probe alone (same probe both)
    state, rb = batch
    m1, _, _ = _update(state, rb, _recipe(), trim=True)
    m2, _, _ = _update(state, rb, _recipe(max_epochs=2), trim=True)
    assert m1[M.POLICY_CLIP_RATIO_LOW] == 0 and m1[M.POLICY_CLIP_RATIO_HIGH] == 0
    assert m2[M.POLICY_RATIO_MAX] > 1 > m2[M.POLICY_RATIO_MIN]
    assert m2[M.POLICY_UPDATE_NORM] > m1[M.POLICY_UPDATE_NORM]


def test_steps_with_an_offloaded_reference_equal_a_resident_one():
    """Two GRPO steps with KL on (k3 in the loss): the offloaded reference (CPU default) and a resident one give
    the same metrics and weights, bit for bit, and the step leaves no gradient behind (freed before the next
    step's rollouts, docs/performance.md §11)."""
    from evotrainer.rl_backend.local import make_optimizer
    from evotrainer.rl_backend.tasks import load_problems

    recipe = _recipe(init_kl_coef=0.05, use_kl_loss=True, data={"task": "arithmetic", "level": 1},
                     reward={"format_token": {"weight": 1.0, "params": {"token": "ing"}}})
    train, _ = load_problems(recipe.data)
    runs = []
    for offload in (False, True):
        torch.manual_seed(0)
        bundle = load_policy(recipe.model, kl=True, offload_reference=offload)
        assert (bundle.ref_file is not None) is offload
        bundle.model.train()
        opt = make_optimizer(bundle, 1e-3, 0.0)
        be = LocalBackend(device="cpu", num_threads=1)
        ms = []
        for step in range(2):
            m, _ = be._step(bundle, opt, recipe, train, "v", step)
            assert all(p.grad is None for p in bundle.trainable_parameters())
            ms.append(m)
        runs.append((ms, torch.cat([p.detach().flatten() for p in bundle.trainable_parameters()])))
    (m_res, w_res), (m_off, w_off) = runs
    assert m_res[1][M.POLICY_KL] > 0 and m_res == m_off
    assert torch.equal(w_res, w_off)


@pytest.mark.parametrize("fast", [(True, False), (False, True), (True, True)], ids=["embedding", "head", "both"])
def test_inplace_embedding_and_head_grads_equal_torch_modules_in_the_update(batch, fast):
    """Tied input / output embeddings (the tiny Llama ties them, as SmolLM2), 2 micro-batches: the gradient
    accumulated into the shared weight by the in-place embedding backward and / or the LM head's in-place weight
    gradient equals torch's modules' (up to the order of the float sums: 1e-6 of the largest gradient), so do
    the metrics and the stepped weights."""
    state, rb = batch
    recipe = _recipe(micro_train_batch_size=4)
    m_dense, g_dense, w_dense = _update(state, rb, recipe, trim=True, inplace_embedding_grad=False,
                                        inplace_head_grad=False)
    m_in, g_in, w_in = _update(state, rb, recipe, trim=True, inplace_embedding_grad=fast[0],
                               inplace_head_grad=fast[1])
    m_in.pop("_advantages"), m_dense.pop("_advantages")
    for k, v in m_dense.items():
        assert m_in[k] == pytest.approx(v, rel=1e-5, abs=1e-8), k
    b = load_policy(recipe.model, kl=False)
    assert b.model.get_input_embeddings().weight is b.model.get_output_embeddings().weight  # tied: the case it is for
    n_emb = b.model.get_input_embeddings().weight.numel()
    # the embedding block of the flat gradient moved by the looked-up rows (not only the LM head's part)
    assert float(g_dense[:n_emb].abs().sum()) > 0
    torch.testing.assert_close(g_in, g_dense, atol=1e-6 * float(g_dense.abs().max()), rtol=1e-5)
    real = g_dense.abs() > 1e-3 * float(g_dense.abs().max())  # AdamW's first step: as in the test above
    assert int(real.sum()) > 1000
    torch.testing.assert_close(w_in[real], w_dense[real], atol=1e-6, rtol=1e-5)


def test_inplace_embedding_grad_alone_padding_and_repeats():
    """Untied, with ``padding_idx`` 0 and repeated ids, two backwards accumulated: ``weight.grad`` equals
    ``nn.Embedding``'s, the padding row gets none, the rows never looked up stay 0; without gradient (no_grad)
    the forward is the plain lookup and builds no graph."""
    torch.manual_seed(0)
    plain = torch.nn.Embedding(11, 5, padding_idx=0).double()
    fast = copy.deepcopy(plain)
    fast.__class__ = InPlaceGradEmbedding
    ids = [torch.tensor([[3, 3, 0, 7], [7, 1, 3, 0]]), torch.tensor([[2, 0, 3]])]
    for emb in (plain, fast):
        for i, x in enumerate(ids):
            (emb(x) * torch.arange(1.0, 6.0, dtype=torch.float64) * (i + 1)).sum().backward()
    # by hand: d/dW[r, j] = (j + 1) x (sum over micro-batches i of (i + 1) x count of r in ids[i])
    counts = {3: 2 + 1 + 2, 7: 2, 1: 1, 2: 2}
    want = torch.zeros(11, 5, dtype=torch.float64)
    for r, c in counts.items():
        want[r] = c * torch.arange(1.0, 6.0, dtype=torch.float64)
    torch.testing.assert_close(plain.weight.grad, want)
    torch.testing.assert_close(fast.weight.grad, want)
    with torch.no_grad():
        assert fast(ids[0]).grad_fn is None
        torch.testing.assert_close(fast(ids[0]), plain(ids[0]))


def test_inplace_head_grad_alone_two_accumulated_backwards():
    """``y = x Wᵀ``, loss ``Σ y ⊙ c``: dL/dW = cᵀ x (summed over rows), dL/dx = c W. Two backwards with
    different x and c: the first makes ``weight.grad``, the second adds into that same tensor (no new one);
    both equal the hand values and torch's ``nn.Linear``; without gradient the forward builds no graph."""
    torch.manual_seed(0)
    plain = torch.nn.Linear(5, 7, bias=False).double()
    fast = copy.deepcopy(plain)
    fast.__class__ = InPlaceGradLinear
    xs = [torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)]
    cs = [torch.randn(2, 3, 7, dtype=torch.float64), torch.randn(4, 7, dtype=torch.float64)]
    want_w = sum(c.reshape(-1, 7).t() @ x.reshape(-1, 5) for x, c in zip(xs, cs, strict=True))
    grads_x: dict[str, list[torch.Tensor]] = {"plain": [], "fast": []}
    for name, lin in (("plain", plain), ("fast", fast)):
        first = None
        for x, c in zip(xs, cs, strict=True):
            x = x.clone().requires_grad_(True)
            (lin(x) * c).sum().backward()
            grads_x[name].append(x.grad)
            first = lin.weight.grad if first is None else first
        if name == "fast":
            assert lin.weight.grad is first  # accumulated in place into the first backward's tensor
    torch.testing.assert_close(plain.weight.grad, want_w)
    torch.testing.assert_close(fast.weight.grad, want_w)
    for c, gp, gf in zip(cs, grads_x["plain"], grads_x["fast"], strict=True):
        torch.testing.assert_close(gf, c @ plain.weight.detach())
        torch.testing.assert_close(gf, gp)
    with torch.no_grad():
        assert fast(xs[0]).grad_fn is None
        torch.testing.assert_close(fast(xs[0]), plain(xs[0]))


def test_use_inplace_head_grad_only_for_a_plain_trainable_head_without_bias():
    from transformers import LlamaConfig, LlamaForCausalLM

    def model():
        return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))

    m = model()
    assert use_inplace_head_grad(m) is True and type(m.get_output_embeddings()) is InPlaceGradLinear
    assert m.get_output_embeddings().weight is m.get_input_embeddings().weight  # the class swap keeps the tie
    biased = model()
    biased.set_output_embeddings(torch.nn.Linear(8, 32, bias=True))
    assert use_inplace_head_grad(biased) is False
    frozen = model()
    frozen.get_output_embeddings().weight.requires_grad_(False)
    assert use_inplace_head_grad(frozen) is False
    assert type(frozen.get_output_embeddings()) is torch.nn.Linear


def test_use_inplace_embedding_grad_only_for_a_plain_trainable_embedding():
    from transformers import LlamaConfig, LlamaForCausalLM

    def model(**emb_kw):
        m = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
        if emb_kw:
            m.set_input_embeddings(torch.nn.Embedding(32, 8, **emb_kw))
        return m

    assert use_inplace_embedding_grad(model()) is True
    assert use_inplace_embedding_grad(model(sparse=True)) is False
    assert use_inplace_embedding_grad(model(max_norm=1.0)) is False
    frozen = model()
    frozen.get_input_embeddings().weight.requires_grad_(False)
    assert use_inplace_embedding_grad(frozen) is False
    assert type(frozen.get_input_embeddings()) is torch.nn.Embedding
