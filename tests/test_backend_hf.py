"""HF backend tests on a tiny random Llama: the decode loop's tokens and logprobs must equal what a
fresh full forward pass says, under left padding, per-row stopping and dropped rows."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from flowgrpo.modeling.models import tiny_model
from flowgrpo.rollout.backends.base import RolloutBackend, SamplingParams
from flowgrpo.rollout.backends.hf import HFBackend, process_logits

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
    # the third prompt joined when a slot freed: two prefill admissions, never more than 2 rows
    assert model.training and len(res) == 3 and be.stats["admissions"] == 2
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


# ---------------------------------------------------------------------------------------------
# continuous batching and prefix caching


def _check_against_fresh_forward(model, prompt, res, temperature=1.0):
    ref = _full_forward_logprobs(model, prompt, res.token_ids, temperature)
    assert torch.allclose(torch.tensor(res.logprobs), ref, atol=1e-4), (res.logprobs, ref)


def test_next_turn_prefills_only_the_new_suffix(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok)
    cold = HFBackend(model, tok, prefix_cache_mb=0)
    p1 = PROMPTS[0]
    r1 = _gen(be, [p1], temperature=0.0, max_new_tokens=6, stop_token_ids=[-5])[0]
    p2 = p1 + r1.token_ids + [7, 8, 9, 10]  # the observation turn appended to the exact context
    before = dict(be.stats)
    r2 = _gen(be, [p2], temperature=0.0, max_new_tokens=6, stop_token_ids=[-5])[0]
    # the last sampled token was never fed, so it is prefilled with the observation
    assert be.stats["prefill_tokens"] - before["prefill_tokens"] == 1 + 4
    assert be.stats["prefix_hit_tokens"] - before["prefix_hit_tokens"] == len(p1) + 6 - 1
    ref = _gen(cold, [p2], temperature=0.0, max_new_tokens=6, stop_token_ids=[-5])[0]
    assert r2.token_ids == ref.token_ids
    assert torch.allclose(torch.tensor(r2.logprobs), torch.tensor(ref.logprobs), atol=1e-5)
    _check_against_fresh_forward(model, p2, r2)


def test_prefix_hits_mixed_with_cold_prompts_and_holes_in_the_cache(model_tok):
    """A batch mixing a cached long history, a cached short one and a cold prompt: each row's layout
    is [pad][cached][pad][suffix]; sampled logprobs must still equal a fresh forward pass."""
    model, tok = model_tok
    be = HFBackend(model, tok)
    firsts = _gen(be, PROMPTS[:2], temperature=1.0, max_new_tokens=9, seed=3, stop_token_ids=[-5])
    nxt = [
        PROMPTS[0] + firsts[0].token_ids + [11, 12],
        PROMPTS[1] + firsts[1].token_ids + [13, 14, 15, 16, 17, 18],
        [1, 90, 91, 92, 93],
    ]
    before = dict(be.stats)
    res = _gen(be, nxt, temperature=1.0, max_new_tokens=12, seed=4, stop_token_ids=[-5])
    assert be.stats["prefill_tokens"] - before["prefill_tokens"] == 3 + 7 + 5
    for p, r in zip(nxt, res, strict=True):
        _check_against_fresh_forward(model, p, r)


def test_an_opening_shared_by_distinct_prompts_is_prefilled_once(model_tok):
    """Three tasks' prompts open with the same system prompt (>= min_shared_root tokens): it is
    prefilled once, and every row's logprobs still equal a fresh forward pass."""
    model, tok = model_tok
    be = HFBackend(model, tok, min_shared_root=8)
    system = [1, *range(20, 32)]  # 13 shared tokens
    prompts = [[*system, 40, 41, 42], [*system, 50], [*system, 60, 61], [*system, 40, 41, 42]]
    res = _gen(be, prompts, temperature=1.0, max_new_tokens=8, seed=5, stop_token_ids=[-5])
    assert be.stats["prefill_tokens"] == 13 + 3 + 1 + 2  # the opening once, then each distinct rest
    assert be.stats["prefix_hit_tokens"] == 0
    for p, r in zip(prompts, res, strict=True):
        _check_against_fresh_forward(model, p, r)
    short = HFBackend(model, tok, min_shared_root=14)  # the opening is too short to bother
    _gen(short, prompts, temperature=1.0, max_new_tokens=2, seed=5, stop_token_ids=[-5])
    assert short.stats["prefill_tokens"] == 16 + 14 + 15


def test_a_request_joins_a_batch_that_is_already_decoding(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok)
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=[-5])

    async def main():
        first = asyncio.create_task(be.generate([PROMPTS[0]], params))
        while be.stats["decode_steps"] < 4:
            await asyncio.sleep(0.001)
        late = await be.generate([PROMPTS[1]], params)
        return (await first)[0], late[0]

    a, b = asyncio.run(main())
    assert be.stats["admissions"] == 2
    # the two rows shared decode steps: fewer steps than decoding them one after the other
    assert be.stats["decode_steps"] < 48 and be.stats["decoded_slots"] == 48
    solo = HFBackend(model, tok)
    for p, r in ((PROMPTS[0], a), (PROMPTS[1], b)):
        ref = _gen(solo, [p], temperature=0.0, max_new_tokens=24, stop_token_ids=[-5])[0]
        assert r.token_ids == ref.token_ids
        _check_against_fresh_forward(model, p, r)


def test_identical_prompts_are_prefilled_once_and_sample_independently(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok)
    res = _gen(be, [PROMPTS[0]] * 4, temperature=1.0, max_new_tokens=10, seed=5, stop_token_ids=[-5])
    assert be.stats["prefill_tokens"] == len(PROMPTS[0])
    assert len({tuple(r.token_ids) for r in res}) > 1  # each row has its own generator
    for r in res:
        _check_against_fresh_forward(model, PROMPTS[0], r)


def test_a_prompts_samples_do_not_depend_on_its_batch_companions(model_tok):
    be = HFBackend(*model_tok)
    a = _gen(be, [PROMPTS[0], PROMPTS[1]], temperature=1.0, max_new_tokens=10, seed=9, stop_token_ids=[-5])
    b = _gen(be, [PROMPTS[0], PROMPTS[2]], temperature=1.0, max_new_tokens=10, seed=9, stop_token_ids=[-5])
    assert a[0].token_ids == b[0].token_ids
    assert torch.allclose(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs), atol=1e-5)


def test_changed_weights_invalidate_cached_prefixes(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok)
    r1 = _gen(be, [PROMPTS[2]], temperature=0.0, max_new_tokens=5, stop_token_ids=[-5])[0]
    assert len(be.prefix_cache) == 1
    w = model.model.norm.weight
    with torch.no_grad():
        w.mul_(1.5)  # an in-place update, as an optimizer step makes
    try:
        before = be.stats["prefix_hit_tokens"]
        r2 = _gen(be, [PROMPTS[2] + r1.token_ids + [5]], temperature=0.0, max_new_tokens=5)[0]
        assert be.stats["prefix_hit_tokens"] == before
        _check_against_fresh_forward(model, PROMPTS[2] + r1.token_ids + [5], r2)
    finally:
        with torch.no_grad():
            w.div_(1.5)


def test_prefix_cache_is_lru_and_byte_bounded():
    from flowgrpo.rollout.backends.hf import PrefixCache

    def kv(n):  # one layer, 1 head, n tokens, dim 2, fp32: 16 * n bytes for k and v together
        return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]

    c = PrefixCache(max_bytes=16 * 10)
    c.put((1, 2, 3), kv(3))
    c.put((1, 2, 3, 4, 5), kv(5))
    assert c.bytes == 16 * 8 and len(c) == 2
    c.put((7, 8, 9), kv(3))  # over budget: the least recently stored entry goes
    assert len(c) == 2 and c.take([1, 2, 3, 9]) is None
    n, _ = c.take([1, 2, 3, 4, 5, 6])
    assert n == 5 and len(c) == 1  # taken entries leave the cache
    assert c.take([7, 8, 9]) is None  # only proper prefixes: one token must remain to prefill
    c.put((7, 8), kv(2))
    c.put((7, 8), kv(2))  # the same tokens twice (two episodes): one copy, handed out twice
    assert c.bytes == 16 * (3 + 2)
    assert c.take([7, 8, 1])[0] == 2 and c.take([7, 8, 2])[0] == 2 and c.take([7, 8, 3]) is None


def test_a_failing_forward_fails_its_call_and_the_backend_recovers(model_tok):
    model, tok = model_tok
    be = HFBackend(model, tok)
    with pytest.raises(IndexError):
        _gen(be, [[1, 10_000]], temperature=1.0, max_new_tokens=3)  # id outside the vocabulary
    ok = _gen(be, PROMPTS[:1], temperature=1.0, max_new_tokens=3, seed=0)
    assert len(ok[0].token_ids) == 3


def test_inverse_cdf_sampling_follows_the_distribution():
    from flowgrpo.rollout.backends.hf import _sample

    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 0.0, 1.0]])
    logp = probs.log().expand(4000, 2, 4).reshape(8000, 4)  # rows alternate the two distributions
    seeds, counters = torch.arange(8000), torch.zeros(8000, dtype=torch.long)
    tok = _sample(logp, seeds, counters)
    first, second = tok[0::2], tok[1::2]
    assert (second == 3).all() and not (first == 1).any()  # zero-probability tokens never drawn
    freq = torch.bincount(first, minlength=4).float() / 4000
    assert torch.allclose(freq, probs[0], atol=0.03), freq
    # one row's draw depends on its own seed and counter only, not on the rows beside it
    alone = _sample(logp[:1], seeds[5:6], torch.tensor([7]))
    assert alone.tolist() == _sample(logp[:2], seeds[5:7], torch.tensor([7, 0]))[:1].tolist()


def test_uniforms_are_splitmix64():
    """The reference SplitMix64 (Steele et al. 2014; Java's SplittableRandom) in Python integers:
    the n-th output of seed s mixes s + (n + 1) * gamma; the uniform is its top 53 bits."""
    from flowgrpo.rollout.backends.hf import uniforms

    def splitmix(seed: int, n: int) -> float:
        m = 2**64
        z = (seed + (n + 1) * 0x9E3779B97F4A7C15) % m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % m
        return ((z ^ (z >> 31)) >> 11) / 2**53

    seeds = [0, 1, 12345, 2**63 - 1, 987654321987]
    counters = [0, 5, 100, 7, 2**40]
    got = uniforms(torch.tensor(seeds), torch.tensor(counters)).tolist()
    assert got == [splitmix(s, n) for s, n in zip(seeds, counters, strict=True)]
    u = uniforms(torch.arange(20000), torch.zeros(20000, dtype=torch.long))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005


def test_a_decode_step_syncs_with_the_host_once(model_tok, monkeypatch):
    """No per-row or per-token host round trips: a decode step brings one tensor to the host; only
    a prefill (an admission) may add the sync transformers makes to build a 2D attention mask."""
    import threading

    model, tok = model_tok
    be = HFBackend(model, tok, max_batch_size=8)
    syncs = [0]
    for name in (
        "tolist",
        "item",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "cpu",
        "nonzero",
        "numpy",
    ):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _f=original, **k):
            if threading.current_thread().name == "flowgrpo-hf-decode":
                syncs[0] += 1
            return _f(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    res = _gen(be, [*PROMPTS, [1, 2]], temperature=1.0, max_new_tokens=20, seed=0, stop_token_ids=[-5])
    monkeypatch.undo()
    steps, admissions = be.stats["decode_steps"], be.stats["admissions"]
    assert steps == 20 and all(len(r.token_ids) == 20 for r in res)
    assert syncs[0] <= steps + 2 * admissions, (syncs[0], steps, admissions)
