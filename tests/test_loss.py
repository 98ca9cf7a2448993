"""Policy loss, KL estimators and aggregation modes against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.algorithms.loss import (
    aggregation_weights,
    kl_penalty,
    policy_loss,
    sampler_ratio_stats,
    sft_loss,
    truncated_is_weights,
)


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


def test_sampler_ratio_stats_hand_computed():
    # trainer/sampler ratios 1.2, 0.8 | 1.0, (masked 5.0): mean (1.2 + 0.8 + 1.0) / 3 = 1.0
    trainer = lp([1.2, 0.8, 1.0, 5.0]).view(2, 2)
    sampler = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    s = sampler_ratio_stats(trainer, sampler, mask)
    assert s == pytest.approx({"mean": 1.0, "min": 0.8, "max": 1.2, "tokens": 3.0})
    assert sampler_ratio_stats(trainer, trainer, mask) == pytest.approx(
        {"mean": 1, "min": 1, "max": 1, "tokens": 3}
    )
    assert sampler_ratio_stats(trainer, sampler, torch.zeros(2, 2)) == {"tokens": 0.0}


def test_on_policy_tis_weights_the_policy_gradient_by_the_truncated_ratio():
    """One optimizer step per batch: the old policy is the trainer's own (detached) logprobs, so the
    PPO ratio is 1 and never clips; TIS (Yao et al. 2025) weights each token by min(rho, cap) with
    rho = trainer / sampler. Per token the gradient of -w * r * A is -w * A * d logprob."""
    logprobs = torch.log(torch.tensor([[0.5, 0.2, 0.3]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.25, 0.4, 0.3]]))  # rho = 2, 0.5, 1 -> at cap 1.5: 1.5, 0.5, 1
    mask = torch.ones(1, 3)
    w = truncated_is_weights(logprobs.detach(), sampler, mask, cap=1.5)
    assert w.flatten().tolist() == pytest.approx([1.5, 0.5, 1.0])
    adv = torch.tensor([[1.0, 1.0, -2.0]])
    loss, m = policy_loss(logprobs, logprobs.detach(), adv, mask, is_weights=w)
    assert m["ratio_mean"] == 1.0 and m["clip_frac"] == 0.0
    loss.backward()
    assert logprobs.grad.flatten().tolist() == pytest.approx([-1.5 / 3, -0.5 / 3, 2.0 / 3])  # -w*A/3


def test_sft_loss_is_token_mean_negative_logprob():
    logprobs = torch.tensor([[-1.0, -2.0, -5.0]])
    assert sft_loss(logprobs, torch.tensor([[1.0, 1.0, 0.0]])).item() == pytest.approx(1.5)


# ------------------------------------------------------------------ GSPO and CISPO


def two_turn_row():
    """One packed row [prompt, a1, a2, obs, a3]: turn 0 = (a1, a2) with A = 1, turn 1 = (a3) with
    A = -1. Log-ratios (logprobs - old) on the actions: 0.2, 0.0 | -0.4; the observation token's
    logprob is garbage (5.0) and must not count."""
    logprobs = torch.tensor([[0.0, -1.0, -2.0, 5.0, -0.5]])
    old = logprobs - torch.tensor([[0.0, 0.2, 0.0, 0.0, -0.4]])
    adv = torch.tensor([[0.0, 1.0, 1.0, 0.0, -1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]])
    turn = torch.tensor([[0, 0, 0, 1, 1]])
    return logprobs, old, adv, mask, turn


def test_gspo_one_ratio_per_turn_over_action_tokens_only():
    logprobs, old, adv, mask, turn = two_turn_row()
    logprobs.requires_grad_(True)
    loss, m = policy_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.2, turn_index=turn, loss="gspo")
    s0, s1 = math.exp(0.1), math.exp(-0.4)  # turn 0: mean(0.2, 0.0); turn 1: -0.4
    # turn 0 inside [0.8, 1.2]: -s0 per token; turn 1: -min(-s1, -0.8) = 0.8 (clipped, no gradient)
    assert loss.item() == pytest.approx((-2 * s0 + 0.8) / 3, rel=1e-6)
    assert m["ratio_max"] == pytest.approx(s0) and m["ratio_min"] == pytest.approx(s1)
    assert m["clip_frac_low"] == pytest.approx(1 / 3)
    loss.backward()
    # every token of turn 0 gets the sequence ratio's gradient s0 * A / 3
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -s0 / 3, -s0 / 3, 0.0, 0.0], rel=1e-6)


def test_gspo_clips_the_whole_turn_together():
    logprobs, old, adv, mask, turn = two_turn_row()
    logprobs.requires_grad_(True)
    loss, _ = policy_loss(
        logprobs, old, adv, mask, clip_low=0.2, clip_high=0.05, turn_index=turn, loss="gspo"
    )
    assert loss.item() == pytest.approx((-2 * 1.05 + 0.8) / 3, rel=1e-6)  # s0 = 1.105 > 1.05
    loss.backward()
    assert logprobs.grad.abs().sum().item() == 0.0
    # the token-level clip cuts only a1 (ratio 1.22), a2 (ratio 1) keeps its gradient
    lp2 = logprobs.detach().clone().requires_grad_(True)
    loss, _ = policy_loss(lp2, old, adv, mask, clip_low=0.2, clip_high=0.05, turn_index=turn)
    loss.backward()
    assert lp2.grad[0].tolist() == pytest.approx([0.0, 0.0, -1 / 3, 0.0, 0.0])


def test_gspo_without_turn_index_is_one_ratio_per_row():
    logprobs = torch.tensor([[0.0, 0.3, 0.1], [0.0, 0.0, -0.2]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, 1.0])
    loss, _ = policy_loss(logprobs, torch.zeros(2, 3), adv, mask, clip_high=1.0, loss="gspo")
    assert loss.item() == pytest.approx(-(2 * math.exp(0.2) + 2 * math.exp(-0.1)) / 4, rel=1e-6)


def test_cispo_clipped_detached_weight_on_reinforce():
    logprobs, old, adv, mask, turn = two_turn_row()
    logprobs.requires_grad_(True)
    loss, m = policy_loss(
        logprobs, old, adv, mask, clip_low=0.2, clip_high=0.2, turn_index=turn, loss="cispo"
    )
    # weights clip(r): a1 exp(.2)=1.221 -> 1.2, a2 1, a3 exp(-.4)=.670 -> .8 ; l = -w * A * logprob
    assert loss.item() == pytest.approx((1.2 * 1.0 + 2.0 - 0.8 * 0.5) / 3, rel=1e-6)
    assert m["clip_frac_high"] == pytest.approx(1 / 3) and m["clip_frac_low"] == pytest.approx(1 / 3)
    loss.backward()
    # no token loses its gradient: -w * A / 3
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -1.2 / 3, -1 / 3, 0.0, 0.8 / 3], rel=1e-6)


@pytest.mark.parametrize("kind", ["gspo", "cispo"])
def test_sequence_losses_stay_exact_across_micro_batches(kind):
    torch.manual_seed(0)
    logprobs = -torch.rand(3, 6)
    old = logprobs + 0.1 * torch.randn(3, 6)
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.tensor([[0, 1, 1, 0, 1, 1], [0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]], dtype=torch.float32)
    turn = torch.tensor(
        [[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0], [1, 1, 2, 2, 3, 3]]
    )  # a turn never spans rows
    seq = torch.tensor([0, 1, 1])
    w = aggregation_weights(mask, "turn_mean", seq_index=seq, turn_index=turn)
    full, _ = policy_loss(
        logprobs, old, adv, mask, token_weights=w, seq_index=seq, turn_index=turn, loss=kind
    )
    parts = sum(
        policy_loss(
            logprobs[i : i + 1],
            old[i : i + 1],
            adv[i : i + 1],
            mask[i : i + 1],
            token_weights=w[i : i + 1],
            seq_index=seq[i : i + 1],
            turn_index=turn[i : i + 1],
            loss=kind,
        )[0]
        for i in range(3)
    )
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)


def test_unknown_loss_and_dual_clip_outside_ppo_clip_are_errors():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="unknown policy loss 'gpso'"):
        policy_loss(x, x, x, torch.ones(1, 2), loss="gpso")
    with pytest.raises(ValueError, match="dual_clip applies to loss='ppo_clip' only"):
        policy_loss(x, x, x, torch.ones(1, 2), loss="gspo", dual_clip=3.0)


# ------------------------------------------------------------------ entropy control


def test_entropy_bonus_hand_computed():
    logprobs = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    ent = torch.tensor([[2.0, 1.0, 9.0]], requires_grad=True)
    loss, _ = policy_loss(logprobs, logprobs, adv, mask, entropy=ent, entropy_coef=0.1)
    # pg per token -1 (ratio 1, A 1); bonus -0.1 * H on the two action tokens; token mean
    assert loss.item() == pytest.approx((-1 - 0.2 - 1 - 0.1) / 2)
    loss.backward()
    assert ent.grad[0].tolist() == pytest.approx([-0.05, -0.05, 0.0])


def test_pg_mask_keeps_the_gradient_of_chosen_tokens_only():
    logprobs = torch.zeros(1, 4, requires_grad=True)
    adv = torch.ones(1, 4)
    keep = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    loss, m = policy_loss(logprobs, logprobs.detach(), adv, torch.ones(1, 4), pg_mask=keep)
    assert loss.item() == pytest.approx(-2 / 4)  # the denominator still counts every action token
    assert m["pg_token_frac"] == 0.5
    loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([-0.25, 0.0, 0.0, -0.25])


def test_entropy_top_q_threshold():
    from flowgrpo.algorithms.loss import entropy_top_q_threshold

    h = torch.arange(10, dtype=torch.float32)  # 0..9
    t = entropy_top_q_threshold(h, 0.2)  # 0.8 quantile with linear interpolation: 7.2
    assert t == pytest.approx(7.2)
    assert int((h >= t).sum()) == 2
    assert entropy_top_q_threshold(h, 1.0) == 0.0
    with pytest.raises(ValueError, match="top_q must be in"):
        entropy_top_q_threshold(h, 0.0)
