"""The decode fast paths (flowgrpo.rollout.backends.decoding): a growing KV cache that must hold exactly what
``DynamicLayer``'s concatenation holds, and a skinny-matmul view of the model that must compute what
the model computes, over the very same tensors; and a bf16 inference copy that follows the fp32
weights when refreshed."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from torch import nn
from transformers.cache_utils import DynamicLayer

from flowgrpo.modeling.kvcache import cache_kwargs
from flowgrpo.modeling.models import tiny_model
from flowgrpo.rollout.backends.base import SamplingParams
from flowgrpo.rollout.backends.decoding import (
    GrowingCache,
    GrowingLayer,
    SkinnyLinear,
    decode_view,
    refresh_view,
)
from flowgrpo.rollout.backends.hf import HFBackend


def _kv(b: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, n, 4, generator=g), torch.randn(b, 2, n, 4, generator=g)


def test_growing_layer_holds_what_concatenation_holds(monkeypatch):
    monkeypatch.setattr(GrowingLayer, "grow", 3)  # cross the spare capacity several times
    ours, ref = GrowingLayer(), DynamicLayer()
    for step, n in enumerate([5, 1, 1, 1, 1, 2, 1, 4, 1]):
        k, v = _kv(2, n, step)
        got, want = ours.update(k, v), ref.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert ours.get_seq_length() == ref.get_seq_length()
    assert ours._k.shape[2] > ours.get_seq_length()  # spare columns exist: appends are in place


def test_growing_layer_adopts_assigned_tensors_in_any_order():
    """The backend re-pads, trims and selects rows by assigning ``keys`` then ``values``; each must
    slice its own live part (a shared length would trim values twice)."""
    layer, ref = GrowingLayer(), DynamicLayer()
    k, v = _kv(3, 6, 0)
    layer.update(k, v)
    ref.update(k, v)
    for lay in (layer, ref):
        lay.keys = lay.keys[:, :, 2:]
        lay.values = lay.values[:, :, 2:]
        lay.batch_select_indices(torch.tensor([2, 0]))
    k2, v2 = _kv(2, 1, 1)
    got, want = layer.update(k2, v2), ref.update(k2, v2)
    assert got[0].shape == (2, 2, 5, 4)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_growing_cache_in_a_model_equals_the_dynamic_cache():
    model, _ = tiny_model(hidden_size=64, seed=3)
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 12]])
    with torch.no_grad():
        full = model(ids).logits[:, -1]
        cache = GrowingCache()
        model(ids[:, :3], use_cache=True, **cache_kwargs(cache))
        model(ids[:, 3:4], use_cache=True, **cache_kwargs(cache))
        last = model(ids[:, 4:], use_cache=True, **cache_kwargs(cache)).logits[:, -1]
    assert torch.allclose(last, full, atol=1e-5)


def test_skinny_linear_equals_linear_and_keeps_autograd():
    torch.manual_seed(0)
    lin = nn.Linear(6, 5)
    skinny = nn.Linear(6, 5)
    skinny.load_state_dict(lin.state_dict())
    skinny.__class__ = SkinnyLinear
    x = torch.randn(2, 3, 6)
    with torch.no_grad():
        assert torch.allclose(skinny(x), lin(x), atol=1e-6)
        assert skinny(x).is_contiguous()
    x.requires_grad_(True)
    skinny(x).sum().backward()  # grad enabled: the F.linear path, gradients as usual
    assert skinny.weight.grad is not None and x.grad is not None


def test_decode_view_shares_tensors_and_leaves_the_model_alone():
    model, _ = tiny_model(hidden_size=64, seed=4)
    model.train()
    view = decode_view(model)
    assert not view.training and model.training
    assert all(type(m) is not SkinnyLinear for m in model.modules())
    assert any(type(m) is SkinnyLinear for m in view.modules())
    assert {id(p) for p in view.parameters()} == {id(p) for p in model.parameters()}
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # an optimizer-like in-place update is seen by the view
        model.eval()
        assert torch.allclose(view(ids).logits, model(ids).logits, atol=1e-5)


@pytest.mark.parametrize("replace", [False, True])
def test_backend_follows_in_place_updates_and_replaced_parameters(replace):
    model, tok = tiny_model(hidden_size=64, seed=5)
    be = HFBackend(model, tok, prefix_cache_mb=0)
    params = SamplingParams(temperature=0.0, max_new_tokens=4, stop_token_ids=[-1])
    asyncio.run(be.generate([[1, 5, 6]], params))
    g = torch.Generator().manual_seed(9)
    new = torch.randn(model.lm_head.weight.shape, generator=g)
    with torch.no_grad():
        if replace:
            model.lm_head.weight = nn.Parameter(new)
        else:
            model.lm_head.weight.copy_(new)
    res = asyncio.run(be.generate([[1, 5, 6]], params))[0]
    with torch.no_grad():
        ref = model.generate(torch.tensor([[1, 5, 6]]), max_new_tokens=4, do_sample=False)[0, 3:]
    assert res.token_ids == ref.tolist()


def test_an_inference_copy_is_cast_once_keeps_ties_and_follows_refresh():
    model, _ = tiny_model(hidden_size=64, seed=4)  # tied embeddings
    view = decode_view(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in view.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the master weights are untouched
    assert view.lm_head.weight is view.model.embed_tokens.weight  # tied in the copy as in the model
    assert {id(b) for b in view.buffers()} == {id(b) for b in model.buffers()}  # rotary etc. shared
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        model.eval()
        assert torch.allclose(view(ids).logits.float(), model(ids).logits, atol=0.1)
        model.lm_head.weight.mul_(2.0)  # an optimizer step: the copy does not see it ...
        assert not torch.allclose(view(ids).logits.float(), model(ids).logits, atol=0.1)
        refresh_view(view, model)  # ... until refreshed
        assert torch.equal(view.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))
        assert torch.allclose(view(ids).logits.float(), model(ids).logits, atol=0.2)


def test_backend_samples_from_a_bf16_copy_refreshed_after_updates():
    model, tok = tiny_model(hidden_size=64, seed=5)
    be = HFBackend(model, tok, prefix_cache_mb=0, inference_dtype="bfloat16")
    params = SamplingParams(temperature=0.0, max_new_tokens=4, stop_token_ids=[-1])
    asyncio.run(be.generate([[1, 5, 6]], params))
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g))
    res = asyncio.run(be.generate([[1, 5, 6]], params))[0]
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        ref = bf16.generate(torch.tensor([[1, 5, 6]]), max_new_tokens=4, do_sample=False)[0, 3:]
    assert res.token_ids == ref.tolist()
    assert next(model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="not both"):
        HFBackend(model, tok, inference_dtype="bfloat16", autocast_dtype="bfloat16")
