"""Policy loss, KL estimators and aggregation modes against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.loss import aggregation_weights, kl_penalty, policy_loss, sft_loss, truncated_is_weights


def lp(ratios):
    return torch.log(torch.tensor([ratios], dtype=torch.float32))


def test_clipped_surrogate_hand_computed():
    # ratios r = exp(logprobs - old) with old = 0
    logprobs = lp([1.5, 0.5, 1.0, 1.1])
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 2.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, m = policy_loss(logprobs, old, adv, mask)
    # per token: -min(1.5, 1.2) = -1.2 ; -min(-.5, -.8) = .8 ; -2 ; 1.1
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 2.0 + 1.1) / 4, rel=1e-6)
    assert m["clip_frac_high"] == 0.25 and m["clip_frac_low"] == 0.25 and m["clip_frac"] == 0.5
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.0 + 1.1) / 4)
    # clip-higher: an asymmetric upper bound
    loss, _ = policy_loss(logprobs, old, adv, mask, clip_high=0.28)
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 2.0 + 1.1) / 4, rel=1e-6)


def test_gradient_is_cut_where_clipped():
    logprobs = lp([1.5, 0.5, 1.0]).requires_grad_(True)
    loss, _ = policy_loss(logprobs, torch.zeros(1, 3), torch.tensor([[1.0, -1.0, 2.0]]), torch.ones(1, 3))
    loss.backward()
    # d/dlogp of -r*A/3 = -r*A/3 on the unclipped token only
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, 0.0, -2.0 / 3])


def test_dual_clip_bounds_negative_advantages():
    logprobs = lp([5.0, 5.0])
    adv = torch.tensor([[-1.0, 1.0]])
    loss, m = policy_loss(logprobs, torch.zeros(1, 2), adv, torch.ones(1, 2), dual_clip=3.0)
    # token 0: -min(-5, -1.2) = 5 -> bounded at 3 ; token 1: -min(5, 1.2) = -1.2
    assert loss.item() == pytest.approx((3.0 - 1.2) / 2)
    assert m["dual_clip_frac"] == 0.5
    loss, _ = policy_loss(logprobs, torch.zeros(1, 2), adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx((5.0 - 1.2) / 2)
    with pytest.raises(ValueError, match="> 1"):
        policy_loss(logprobs, torch.zeros(1, 2), adv, torch.ones(1, 2), dual_clip=0.5)


def test_kl_estimators_hand_computed():
    p, q = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    d = math.log(2)
    assert kl_penalty(p, q, "k1").item() == pytest.approx(d)
    assert kl_penalty(p, q, "k2").item() == pytest.approx(d * d / 2)
    assert kl_penalty(p, q, "k3").item() == pytest.approx(0.5 + d - 1)
    # clamping: a reference probability of ~0 cannot explode the loss
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-1e4]), "k2").item() == 10.0
    assert kl_penalty(torch.tensor([-1e4]), torch.tensor([0.0]), "k3").item() == 10.0
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(p, q, "k4")


def test_kl_term_in_the_loss():
    logprobs = torch.full((1, 2), math.log(0.5))
    ref = torch.full((1, 2), math.log(0.25))
    loss, m = policy_loss(
        logprobs, logprobs, torch.zeros(1, 2), torch.ones(1, 2), ref_logprobs=ref, kl_coef=0.1
    )
    k3 = 0.5 + math.log(2) - 1
    assert loss.item() == pytest.approx(0.1 * k3, rel=1e-6)
    assert m["kl"] == pytest.approx(k3, rel=1e-6)
    # kl_coef = 0: the KL is only reported
    loss, m = policy_loss(logprobs, logprobs, torch.zeros(1, 2), torch.ones(1, 2), ref_logprobs=ref)
    assert loss.item() == 0.0 and m["kl"] == pytest.approx(k3, rel=1e-6)


# Two rows, per-token loss l = -A at ratio 1: row 0 = [1, 2, 3, pad], row 1 = [4, pad, pad, pad].
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
L = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0]])


def agg_loss(agg, **kw):
    z = torch.zeros(2, 4)
    return policy_loss(z, z, -L, MASK, agg=agg, **kw)[0].item()


def test_aggregation_modes_hand_computed():
    assert agg_loss("token_mean") == pytest.approx(10 / 4)
    assert agg_loss("seq_mean_token_mean") == pytest.approx((2 + 4) / 2)
    assert agg_loss("seq_mean_token_mean", seq_index=torch.tensor([0, 0])) == pytest.approx(10 / 4)
    assert agg_loss("seq_mean_token_sum_norm") == pytest.approx(10 / (2 * 4))
    assert agg_loss("seq_mean_token_sum_norm", norm_len=10) == pytest.approx(10 / 20)
    assert agg_loss("seq_mean_token_sum_norm", seq_index=torch.tensor([3, 3])) == pytest.approx(10 / 4)
    # turn_mean, default: each row is one turn of its own trajectory -> (2 + 4) / 2
    assert agg_loss("turn_mean") == pytest.approx(3.0)
    turns = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]])
    # trajectory 0: turns {1, 2} -> 1.5, {3} -> 3 => 2.25 ; trajectory 1: 4
    assert agg_loss("turn_mean", turn_index=turns) == pytest.approx((2.25 + 4) / 2)
    # one trajectory over both rows, row 1 is its turn 2: (1.5 + 3 + 4) / 3
    turns2 = torch.tensor([[0, 0, 1, 1], [2, 2, 2, 2]])
    assert agg_loss("turn_mean", seq_index=torch.tensor([0, 0]), turn_index=turns2) == pytest.approx(8.5 / 3)
    with pytest.raises(ValueError, match="token_mean"):
        agg_loss("sum")


def test_empty_mask_gives_zero_loss_not_nan():
    z = torch.zeros(2, 3)
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "turn_mean"):
        loss, m = policy_loss(z, z, torch.ones(2, 3), torch.zeros(2, 3), agg=agg)
        assert loss.item() == 0.0 and m["tokens"] == 0.0


def test_token_weights_make_micro_batches_exact():
    torch.manual_seed(0)
    logprobs = torch.randn(4, 5) * 0.1 - 1
    old = logprobs + torch.randn(4, 5) * 0.2
    adv = torch.randn(4)
    mask = (torch.rand(4, 5) > 0.3).float()
    seq = torch.tensor([0, 0, 1, 2])
    turns = torch.tensor([[0] * 5, [1] * 5, [0] * 5, [0] * 5])
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "turn_mean"):
        full, _ = policy_loss(logprobs, old, adv, mask, agg=agg, seq_index=seq, turn_index=turns)
        w = aggregation_weights(mask, agg, seq_index=seq, turn_index=turns)
        parts = sum(
            policy_loss(logprobs[s], old[s], adv[s], mask[s], token_weights=w[s])[0]
            for s in (slice(0, 1), slice(1, 3), slice(3, 4))
        )
        assert parts.item() == pytest.approx(full.item(), rel=1e-6)


def test_advantages_per_row_broadcast():
    z = torch.zeros(2, 3)
    a, _ = policy_loss(z, z, torch.tensor([1.0, -2.0]), torch.ones(2, 3))
    b, _ = policy_loss(z, z, torch.tensor([[1.0] * 3, [-2.0] * 3]), torch.ones(2, 3))
    assert a.item() == b.item() == pytest.approx(0.5)


def test_truncated_importance_sampling():
    old = torch.zeros(2, 2)
    sampler = torch.tensor([[math.log(0.25), 0.0], [math.log(0.8), math.log(0.9)]])
    mask = torch.ones(2, 2)
    w = truncated_is_weights(old, sampler, mask, cap=2.0)
    assert w.flatten().tolist() == pytest.approx([2.0, 1.0, 1.25, 1 / 0.9])
    # sequence mask: row 0 has geometric-mean ratio exp(log 4 / 2) = 2 -> kept at cap 2, masked at 1.5
    assert truncated_is_weights(old, sampler, mask, cap=2.0, mode="sequence_mask").tolist() == [
        [1, 1],
        [1, 1],
    ]
    w = truncated_is_weights(old, sampler, mask, cap=1.5, mode="sequence_mask")
    assert w.tolist() == [[0, 0], [1, 1]]
    # the weights multiply the policy-gradient term
    loss, m = policy_loss(old, old, torch.ones(2, 2), mask, is_weights=torch.tensor([[2.0, 1.0], [0.0, 0.0]]))
    assert loss.item() == pytest.approx(-3 / 4) and m["is_weight_mean"] == pytest.approx(0.75)


def test_sft_loss_is_token_mean_negative_logprob():
    logprobs = torch.tensor([[-1.0, -2.0, -5.0]])
    assert sft_loss(logprobs, torch.tensor([[1.0, 1.0, 0.0]])).item() == pytest.approx(1.5)
