"""Memory-efficient action logprobs agree with a naive full log-softmax."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.modeling.logprobs import action_logprobs, reference_logprobs
from flowgrpo.modeling.models import tiny_model


@pytest.fixture(scope="module")
def model():
    m, _ = tiny_model(seed=1)
    return m.float()


def batch(vocab):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (3, 12), generator=g)
    attn = torch.ones(3, 12, dtype=torch.long)
    attn[1, 9:] = 0  # right padding
    attn[2, 5:] = 0
    mask = torch.zeros(3, 12)
    mask[0, 4:8] = 1
    mask[0, 10:] = 1
    mask[1, 2:9] = 1
    mask[2, 3:5] = 1
    return ids, attn, mask


def naive(model, ids, attn, mask, temperature=1.0):
    logits = model(input_ids=ids, attention_mask=attn).logits.float() / temperature  # (B, T, V)
    logp = logits.log_softmax(-1)[:, :-1]  # predicts tokens 1..T-1
    tok = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    out = torch.zeros(ids.shape)
    out[:, 1:] = tok
    e = torch.zeros(ids.shape)
    e[:, 1:] = ent
    return out * mask, e * mask


@pytest.mark.parametrize("chunk", [3, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_log_softmax(model, chunk, temperature):
    ids, attn, mask = batch(model.config.vocab_size)
    lp, ent = action_logprobs(
        model, ids, attn, mask, chunk_size=chunk, with_entropy=True, temperature=temperature
    )
    ref_lp, ref_ent = naive(model, ids, attn, mask, temperature)
    assert lp.shape == ids.shape
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert (lp[mask == 0] == 0).all()


def test_gradients_match_naive(model):
    ids, attn, mask = batch(model.config.vocab_size)
    model.zero_grad()
    action_logprobs(model, ids, attn, mask, chunk_size=4)[0].sum().backward()
    g1 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    naive(model, ids, attn, mask)[0].sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(g1[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)
    model.zero_grad()


def test_bf16_autocast_is_close_and_weights_stay_fp32(model):
    ids, attn, mask = batch(model.config.vocab_size)
    lp, _ = action_logprobs(model, ids, attn, mask, autocast_dtype="bfloat16")
    ref, _ = naive(model, ids, attn, mask)
    assert lp.dtype == torch.float32
    assert (lp - ref).abs().max() < 0.1
    assert next(model.parameters()).dtype == torch.float32


def test_reference_logprobs_have_no_graph_and_empty_mask(model):
    ids, attn, mask = batch(model.config.vocab_size)
    r = reference_logprobs(model, ids, attn, mask)
    assert not r.requires_grad
    lp, _ = action_logprobs(model, ids, attn, torch.zeros_like(mask))
    assert (lp == 0).all()
    bad = mask.clone()
    bad[0, 0] = 1
    with pytest.raises(ValueError, match="no context"):
        action_logprobs(model, ids, attn, bad)


def episodes(vocab, g, T, rows):
    """``(ids, attn, mask)`` for ``rows`` of ``(prompt, length)``: each row opens with its prompt,
    continues with random action tokens up to ``length`` and is right padded to ``T``."""
    ids = torch.randint(3, vocab, (len(rows), T), generator=g)
    attn = torch.ones(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T)
    for b, (p, n) in enumerate(rows):
        ids[b, : len(p)] = p
        attn[b, n:] = 0
        mask[b, len(p) : n] = 1
    return ids, attn, mask


def group_batch(vocab):
    """Two GRPO groups: rows 0-2 share a 9-token prompt, rows 3-4 a 6-token one; right padded."""
    g = torch.Generator().manual_seed(3)
    p1 = torch.randint(3, vocab, (9,), generator=g)
    p2 = torch.randint(3, vocab, (6,), generator=g)
    ids, attn, mask = episodes(vocab, g, 17, [(p1, 17), (p1, 13), (p1, 15), (p2, 10), (p2, 16)])
    mask[1, 11] = 0  # an observation inside the episode: not trained on
    return ids, attn, mask


def rooted_batch(vocab):
    """Three prompts opening with the same 18 tokens (a system prompt): two groups and a lone row
    whose prefix is exactly that root (its prompt is root + 1 token); right padded."""
    g = torch.Generator().manual_seed(4)
    root = torch.randint(3, vocab, (18,), generator=g)
    p1 = torch.cat([root, torch.randint(3, vocab, (5,), generator=g)])
    p2 = torch.cat([root, torch.randint(3, vocab, (3,), generator=g)])
    p3 = torch.cat([root, torch.randint(3, vocab, (1,), generator=g)])
    return episodes(vocab, g, 30, [(p1, 30), (p1, 27), (p2, 29), (p2, 25), (p3, 28)])


def assert_matches_naive(model, ids, attn, mask):
    """Logprobs, entropies and every parameter's gradient of ``action_logprobs`` equal the naive
    full log-softmax's; returns the logprobs."""
    model.zero_grad()
    lp, ent = action_logprobs(model, ids, attn, mask, with_entropy=True)
    lp.sum().backward()
    g1 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref_lp, ref_ent = naive(model, ids, attn, mask)
    ref_lp.sum().backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(g1[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)
    model.zero_grad()
    return lp.detach()


def test_shared_prompts_run_once_with_identical_values_and_gradients(model):
    from flowgrpo.modeling.logprobs import _shared_prefixes

    ids, attn, mask = group_batch(model.config.vocab_size)
    plan = _shared_prefixes(ids, mask)
    assert plan is not None and len(plan.prefixes) == 2 and plan.prefix_len.tolist() == [8, 8, 8, 5, 5]
    lp = assert_matches_naive(model, ids, attn, mask)
    off, _ = action_logprobs(model, ids, attn, mask, share_prefix=False)
    torch.testing.assert_close(lp, off.detach(), atol=1e-5, rtol=1e-5)


def test_a_root_shared_by_every_prompt_runs_once_with_identical_values_and_gradients(model):
    from flowgrpo.modeling.logprobs import _shared_prefixes

    ids, attn, mask = rooted_batch(model.config.vocab_size)
    plan = _shared_prefixes(ids, mask)
    assert plan is not None and plan.root_len == 18 and len(plan.prefixes) == 3
    assert_matches_naive(model, ids, attn, mask)


def test_no_shared_pass_when_prompts_differ(model):
    from flowgrpo.modeling.logprobs import _shared_prefixes

    ids, _, mask = batch(model.config.vocab_size)
    assert _shared_prefixes(ids, mask) is None


def test_shared_prefix_rows_are_selected_exactly_with_a_reproducible_gradient():
    """``_select_rows`` copies rows exactly, and the gradient of a row shared by many comes back as
    their sum, bit-identical from one backward pass to the next (indexing's accumulating backward
    adds them in a thread-dependent order on CPU)."""
    from transformers import DynamicCache

    from flowgrpo.modeling.logprobs import _select_rows

    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(3, 2, 40, 16, generator=gen)  # (U, heads, P, D)
    values = torch.randn(3, 2, 40, 16, generator=gen)
    index = torch.tensor([0, 0, 1, 2, 2, 2, 0, 1])  # (B,): rows sharing a prefix
    up = torch.randn(8, 2, 40, 16, generator=gen)  # (B, heads, P, D): a gradient from above

    def grads():
        k, v = keys.clone().requires_grad_(), values.clone().requires_grad_()
        cache = DynamicCache()
        cache.update(k, v, 0)
        _select_rows(cache, index)
        layer = cache.layers[0]
        assert torch.equal(layer.keys, keys[index]) and torch.equal(layer.values, values[index])
        ((layer.keys + layer.values) * up).sum().backward()
        return k.grad, v.grad

    gk, gv = grads()
    expected = torch.zeros_like(keys).index_add_(0, index, up)  # the rows' gradients summed
    assert torch.allclose(gk, expected, atol=1e-6) and torch.allclose(gv, expected, atol=1e-6)
    for _ in range(3):
        k2, v2 = grads()
        assert torch.equal(k2, gk) and torch.equal(v2, gv)
