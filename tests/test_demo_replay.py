"""Demonstration replay during RL (``sft.replay_coef``): which demonstrations each step replays, an
exact gradient across micro-batches, and the trainer's wiring on the tiny model."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from flowgrpo.algorithms.loss import sft_loss
from flowgrpo.config import ConfigError, load_config
from flowgrpo.modeling.logprobs import action_logprobs
from flowgrpo.modeling.models import tiny_model
from flowgrpo.training.batching import micro_batches
from flowgrpo.training.demo_replay import DemoReplay
from flowgrpo.training.trainer import Trainer
from flowgrpo.types import Message, Trajectory, Turn
from tests.toy import CALCULATOR, SMALL


def demo(i: int, n_actions: int) -> Trajectory:
    turn = Turn(
        prompt_ids=[10 + i, 11, 12],
        action_ids=[20 + i + k for k in range(n_actions)],
        action_logprobs=[0.0] * n_actions,
        action=Message(role="assistant", content="x"),
    )
    return Trajectory(id=f"d{i}", turns=[turn], reward=1.0)


def test_each_pass_replays_every_demonstration_once():
    r = DemoReplay([demo(i, 2) for i in range(3)], coef=1.0, per_step=2, seed=0, pack=True)
    picks = [{row.seq_index for row in r.next_rows()} for _ in range(3)]  # 6 picks = 2 passes
    assert all(len(p) == 2 for p in picks)  # distinct within a step, also across a pass boundary
    assert Counter(s for p in picks for s in p) == {0: 2, 1: 2, 2: 2}
    assert r.replayed == 6
    with pytest.raises(ValueError, match="> 0"):
        DemoReplay([demo(0, 2)], coef=0.0, per_step=2, seed=0, pack=True)


def test_the_gradient_is_coef_times_the_mean_nll_in_any_number_of_micro_batches():
    model, _ = tiny_model()
    demos = [demo(0, 2), demo(1, 5), demo(2, 1)]  # 8 action tokens

    def logprobs(mb):
        return action_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask)[0]

    # by hand: one batch, -(sum of the 8 action logprobs) / 8, times the coefficient
    rows = DemoReplay(demos, coef=1.0, per_step=3, seed=0, pack=True).next_rows()
    (whole,) = micro_batches(rows, 10_000)
    lp = logprobs(whole)
    mean_nll = float(-(lp * whole.loss_mask).sum().detach() / whole.loss_mask.sum())
    model.zero_grad()
    (0.3 * sft_loss(lp, whole.loss_mask)).backward()
    expected = [p.grad.clone() for p in model.parameters()]

    assert len(micro_batches(rows, 8)) > 1
    model.zero_grad()
    r = DemoReplay(demos, coef=0.3, per_step=3, seed=0, pack=True)
    m = r.backward(logprobs, token_budget=8, pad_id=0, device=torch.device("cpu"))  # one row per micro-batch
    assert m["replay_tokens"] == 8.0 and m["replay_nll"] == pytest.approx(mean_nll, rel=1e-5)
    for g, e in zip((p.grad for p in model.parameters()), expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-7)


def test_the_trainer_replays_the_warm_starts_demonstrations_in_every_update(tmp_path, one_thread):
    cfg = load_config(
        CALCULATOR,
        [*SMALL, f"run.output_dir={tmp_path / 'run'}", "sft.replay_coef=0.5", "sft.replay_trajectories=3"],
    )
    tr = Trainer(cfg)
    out = tr.train()
    assert out["status"] == "finished" and tr.replay is not None
    assert tr.replay.replayed == 3 * out["optimizer_steps"]
    assert math.isfinite(out["replay_nll"]) and out["replay_nll"] > 0 and out["replay_tokens"] > 0


def test_replay_needs_the_warm_starts_demonstrations():
    with pytest.raises(ConfigError, match=r"sft\.enabled=true"):
        load_config(CALCULATOR, ["sft.enabled=false", "sft.replay_coef=0.1"])
