"""Prefix-merged rows and micro-batches give the same loss and gradients as one row per turn."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.algorithms.loss import policy_loss
from flowgrpo.modeling.logprobs import action_logprobs
from flowgrpo.modeling.models import tiny_model
from flowgrpo.training.batching import build_rows, micro_batches
from flowgrpo.types import Message, Trajectory, Turn


def turn(prompt, action, adv, resets=False):
    return Turn(
        prompt_ids=prompt,
        action_ids=action,
        action_logprobs=[-0.5 - 0.1 * i for i in range(len(action))],
        action=Message(role="assistant", content="x"),
        advantage=adv,
        resets_context=resets,
    )


def trajectories():
    a = Trajectory(id="A", turns=[turn([10, 11, 12], [20, 21], 1.0), turn([13, 14], [22, 23, 24], 1.0)])
    b = Trajectory(
        id="B",
        turns=[
            turn([10, 11], [25], -0.5),
            turn([30, 31, 32], [26, 27], -0.5, resets=True),
            turn([33], [28], -0.5),
        ],
    )
    return [a, b]


def test_packed_rows_layout():
    rows = build_rows(trajectories())
    assert len(rows) == 3
    a, b1, b2 = rows
    assert a.input_ids == [10, 11, 12, 20, 21, 13, 14, 22, 23, 24]
    assert a.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert a.turn_index == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert a.advantages == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert a.old_logprobs == pytest.approx([0, 0, 0, -0.5, -0.6, 0, 0, -0.5, -0.6, -0.7])
    assert (a.seq_index, b1.seq_index, b2.seq_index) == (0, 1, 1)
    assert b1.input_ids == [10, 11, 25]  # the reset starts a new row
    assert b2.input_ids == [30, 31, 32, 26, 27, 33, 28]
    assert b2.turn_index == [1, 1, 1, 1, 1, 2, 2]


def test_unpacked_rows_reencode_the_context():
    rows = build_rows(trajectories(), pack=False)
    assert [len(r) for r in rows] == [5, 10, 3, 5, 7]
    assert rows[1].input_ids == [10, 11, 12, 20, 21, 13, 14, 22, 23, 24]
    assert rows[1].loss_mask == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert rows[4].input_ids == [30, 31, 32, 26, 27, 33, 28] and rows[4].turn_index == [2] * 7


def test_missing_advantage_is_a_clear_error():
    t = trajectories()
    t[0].turns[1].advantage = None
    with pytest.raises(ValueError, match="compute_advantages"):
        build_rows(t)
    assert len(build_rows(t, require_advantages=False)) == 3


def test_micro_batches_respect_the_token_budget():
    rows = build_rows(trajectories(), pack=False)
    mbs = micro_batches(rows, token_budget=12)
    assert sorted(len(r) for mb in mbs for r in mb.rows) == sorted(len(r) for r in rows)
    for mb in mbs:
        assert mb.input_ids.numel() <= 12 or len(mb.rows) == 1
        assert mb.attention_mask.sum() == sum(len(r) for r in mb.rows)
    total = sum(float((mb.token_weights * mb.loss_mask).sum()) for mb in mbs)
    assert total == pytest.approx(1.0)  # token_mean weights sum to one over the mini-batch
    with pytest.raises(ValueError, match="token_budget"):
        micro_batches(rows, 0)


def loss_and_grads(model, rows, budget, agg):
    model.zero_grad()
    total = 0.0
    for mb in micro_batches(rows, budget, agg=agg):
        lp, _ = action_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, chunk_size=5)
        loss, _ = policy_loss(
            lp,
            mb.old_logprobs,
            mb.advantages,
            mb.loss_mask,
            token_weights=mb.token_weights,
        )
        loss.backward()
        total += loss.item()
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "turn_mean"])
def test_packed_equals_one_row_per_turn(agg):
    model, _ = tiny_model(seed=2)
    trajs = trajectories()
    ref_loss, ref_grads = loss_and_grads(model, build_rows(trajs, pack=False), 10_000, agg)
    for budget in (10_000, 10):  # one micro-batch, and one row per micro-batch
        loss, grads = loss_and_grads(model, build_rows(trajs), budget, agg)
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
        for n, g in grads.items():
            torch.testing.assert_close(g, ref_grads[n], atol=1e-6, rtol=1e-4, msg=n)
    assert ref_loss != 0.0
