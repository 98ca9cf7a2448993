"""HF backend tests on a tiny random Llama: the decode loop's tokens and logprobs must equal what a
fresh full forward pass says, under left padding, per-row stopping and dropped rows."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from flowgrpo.backends.base import RolloutBackend, SamplingParams
from flowgrpo.backends.hf import HFBackend, process_logits
from flowgrpo.models import tiny_model

PROMPTS = [[1, 40, 41, 42, 43, 44, 45], [1, 50, 51], [1, 60, 61, 62, 63]]  # different lengths: left padding


@pytest.fixture(scope="module")
def model_tok():
    model, tok = tiny_model(hidden_size=64, seed=1)
    # untie and randomise the output layer: with tied random embeddings the model just repeats the
    # last token, and greedy paths would be trivial
    g = torch.Generator().manual_seed(5)
    w = torch.randn(model.lm_head.weight.shape, generator=g) * 0.5
    model.lm_head.weight = torch.nn.Parameter(w)
    model.config.tie_word_embeddings = False
    return model, tok


def _gen(be, prompts, **kw):
    return asyncio.run(be.generate(prompts, SamplingParams(**kw)))


def _full_forward_logprobs(model, prompt, out_ids, temperature):
    ids = torch.tensor([list(prompt) + list(out_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # (n, V)
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(out_ids)[:, None])[:, 0]


def test_is_a_rollout_backend(model_tok):
    assert isinstance(HFBackend(*model_tok), RolloutBackend)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_fresh_forward_pass(model_tok, temperature):
    model, tok = model_tok
    be = HFBackend(model, tok)
    res = _gen(be, PROMPTS, temperature=temperature, max_new_tokens=16, seed=0, stop_token_ids=[-5])
    for p, r in zip(PROMPTS, res, strict=True):
        assert len(r.token_ids) == len(r.logprobs) == 16 and r.finish_reason == "length"
        ref = _full_forward_logprobs(model, p, r.token_ids, temperature)
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-4), (r.logprobs, ref)


def test_top_k_logprobs_are_of_the_renormalised_distribution(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok)
    res = _gen(be, PROMPTS[:1], temperature=0.9, top_k=5, max_new_tokens=6, seed=2, stop_token_ids=[-5])[0]
    ids = torch.tensor([PROMPTS[0] + res.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPTS[0]) - 1 : -1].float() / 0.9  # (6, V)
    for j, t in enumerate(res.token_ids):
        top = torch.topk(logits[j], 5).values
        assert logits[j, t] >= top[-1]  # sampled inside the top 5
        expected = logits[j, t] - torch.logsumexp(top, 0)
        assert math.isclose(res.logprobs[j], float(expected), abs_tol=1e-4)


def test_process_logits_top_p_by_hand():
    # probabilities 0.5, 0.3, 0.2 -> top_p=0.7 keeps the first two: renormalised 0.625, 0.375
    logits = torch.log(torch.tensor([[0.3, 0.5, 0.2]]))
    lp = process_logits(logits, 1.0, 0, 0.7)
    assert torch.allclose(lp.exp(), torch.tensor([[0.375, 0.625, 0.0]]), atol=1e-6)


def test_seed_reproducibility(model_tok):
    be = HFBackend(*model_tok)
    a = _gen(be, PROMPTS, temperature=1.0, max_new_tokens=10, seed=7)
    b = _gen(be, PROMPTS, temperature=1.0, max_new_tokens=10, seed=7)
    c = _gen(be, PROMPTS, temperature=1.0, max_new_tokens=10, seed=8)
    assert a == b
    assert a != c


def test_greedy_equals_model_generate_and_uses_unscaled_logprobs(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok)
    res = _gen(be, PROMPTS, temperature=0.0, max_new_tokens=12, stop_token_ids=[-5])
    width = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in PROMPTS])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in PROMPTS])[:, None]).long()
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=12,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=tok.pad_token_id,
    )
    for i, (p, r) in enumerate(zip(PROMPTS, res, strict=True)):
        assert r.token_ids == ref[i, width:].tolist()
        assert len(set(r.token_ids)) > 1  # a non-trivial path
        full = _full_forward_logprobs(model, p, r.token_ids, 1.0)
        assert torch.allclose(torch.tensor(r.logprobs), full, atol=1e-4)


def test_per_sequence_stopping_drops_finished_rows(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok)
    free = _gen(be, PROMPTS, temperature=0.0, max_new_tokens=12, stop_token_ids=[-5])
    stop = free[0].token_ids[2]  # row 0 will stop at its 3rd token
    be.stats.update(decoded_slots=0, decode_steps=0)
    res = _gen(be, PROMPTS, temperature=0.0, max_new_tokens=12, stop_token_ids=[stop])
    for f, r in zip(free, res, strict=True):
        if stop in f.token_ids:
            cut = f.token_ids.index(stop) + 1
            assert r.token_ids == f.token_ids[:cut] and r.finish_reason == "stop"
        else:
            assert r.token_ids == f.token_ids and r.finish_reason == "length"
    assert res[0].token_ids[-1] == stop and len(res[0].token_ids) <= 3
    # finished rows left the batch: fewer slots decoded than rows x steps
    assert be.stats["decoded_slots"] == sum(len(r.token_ids) for r in res) < 3 * 12


def test_per_prompt_token_limits(model_tok):
    be = HFBackend(*model_tok)
    res = asyncio.run(
        be.generate(
            PROMPTS,
            SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=[-5]),
            max_new_tokens=[2, 8, 20],
        )
    )
    assert [len(r.token_ids) for r in res] == [2, 8, 8]


def test_restores_training_mode_and_splits_large_calls(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok, max_batch_size=2)
    model.train()
    res = _gen(be, PROMPTS, temperature=1.0, max_new_tokens=3, seed=1)
    assert model.training and len(res) == 3 and be.stats["calls"] >= 2
    model.eval()


def test_bf16_autocast_over_fp32_weights(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok, autocast_dtype="bfloat16")
    res = _gen(be, PROMPTS, temperature=1.0, max_new_tokens=8, seed=0, stop_token_ids=[-5])
    assert next(model.parameters()).dtype == torch.float32
    for p, r in zip(PROMPTS, res, strict=True):
        ref = _full_forward_logprobs(model, p, r.token_ids, 1.0)  # fp32 reference
        assert all(math.isfinite(x) for x in r.logprobs)
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=0.15)
    with pytest.raises(ValueError, match="autocast_dtype"):
        HFBackend(model, tok, autocast_dtype="int8")
