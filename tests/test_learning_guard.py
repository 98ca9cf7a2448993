"""A guard on the learning path itself: RL from scratch on a task whose optimum is known.

A tiny random model plays a two-turn episode in which every action is one sampled token. Turn 1's
token is sent to a tool (the observation echoes it back), turn 2's ends the episode. The outcome
reward is the mean of two indicators -- turn 1's token id is 0 mod 4, turn 2's is 0 or 1 mod 4 --
so chance is 0.375 and the optimum 1.0. Only the outcome is rewarded (Flow-GRPO gives it to every
turn), so reaching >= 0.9 from scratch, with no warm start, needs the right advantage sign, the
loss on the action tokens of both turns (not on the prompt or observation tokens next to them) and
an aggregation that keeps every row. The ``test_guard_fails_*`` tests break the sign and the mask
on purpose and check that the guard catches it.

That task saturates: once every sample is right, every group has equal rewards and nothing moves,
so it cannot show what a longer run does. The second guard
(``test_a_long_noisy_run_keeps_what_it_learned``) keeps the gradient alive after the task is
learned: the reward becomes a coin whose bias is the outcome (p = 0.15 + 0.7 * quality), so groups
never stop varying, and actions run on past the token the reward reads (only odd ids end a turn),
so the noise keeps pushing tokens the reward does not look at. That is the regime a long RL run
lives in (docs/learning.md section 9): the run must end at its optimum after many such steps
instead of drifting off it. At the learning rate it learned with, 5 of 16 seeds drifted off for
good; at half of it none did.
"""

from __future__ import annotations

import random

import pytest

from flowgrpo.config import load_config
from flowgrpo.env import BaseEnvironment, StepResult
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.training.trainer import Trainer
from flowgrpo.types import Message, ParsedAction, Task
from tests.toy import PlainParser

TARGETS = ({0}, {0, 1})  # turn k's token must fall in TARGETS[k] (its id mod 4)


class TwoTurnToolEnv(BaseEnvironment):
    """Turn 1 goes to an echo tool; turn 2 ends the episode."""

    name = "two_turn_tool"
    tools: list = []
    parser = PlainParser()
    system_prompt = "Pick a token, read the tool's answer, pick another."

    def __init__(self) -> None:
        self.turn = 0

    async def reset(self, task: Task) -> list[Message]:
        self.turn = 0
        return [Message(role="system", content=self.system_prompt), Message(role="user", content=task.prompt)]

    async def step(self, action: ParsedAction) -> StepResult:
        self.turn += 1
        if self.turn == 1:
            echo = Message(
                role="tool", name="echo", tool_call_id="call-0", content=f"echo: {action.message.content}"
            )
            return StepResult(observations=[echo])
        return StepResult(terminated=True)

    def tasks(self, split: str) -> list[Task]:
        return [Task(id=f"{split}-{i}", prompt=f"round {i}") for i in range(16)]


def two_turn_reward(traj, task) -> float:
    hits = [
        1.0
        if len(traj.turns) > k and traj.turns[k].action_ids and traj.turns[k].action_ids[0] % 4 in want
        else 0.0
        for k, want in enumerate(TARGETS)
    ]
    return sum(hits) / len(hits)


pytestmark = pytest.mark.usefixtures("one_thread")


class CoinReward:
    """``two_turn_reward`` until ``noisy`` is set, then a coin per episode with bias
    0.15 + 0.7 * two_turn_reward: irreducible reward noise, so groups never stop varying."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.noisy = False

    def __call__(self, traj, task) -> float:
        q = two_turn_reward(traj, task)
        if not self.noisy:
            return q
        return 1.0 if self.rng.random() < 0.15 + 0.7 * q else 0.0


def guard_trainer(
    tmp_path, *overrides: str, coin: CoinReward | None = None, free_tokens: bool = False
) -> Trainer:
    """The guard's trainer. ``coin``: trained on that reward (the noiseless outcome is
    recorded as ``accuracy``, weight 0, for evaluation); ``free_tokens``: only odd
    ids end a turn, so an action runs on past the token the reward reads."""
    tok = tiny_tokenizer()
    model, tok = tiny_model(tok, seed=0)
    # every token ends the turn (each action is one token), or, with free tokens, odd ids only
    stops = list(range(1, len(tok), 2)) if free_tokens else list(range(len(tok)))
    cfg = load_config(
        None,
        [
            f"run.output_dir={tmp_path / 'run'}",
            "run.progress=false",
            "run.save_every=0",
            "run.save_trajectories=false",
            "model.autocast=null",
            "rollout.max_turns=2",
            "rollout.max_new_tokens=4",
            f"rollout.sampling.stop_token_ids={stops}",
            "rewards=[{name: two_turn}]"
            if coin is None
            else "rewards=[{name: noisy}, {name: accuracy, weight: 0}]",
            "algorithm.estimator=flow_grpo",
            "algorithm.kl_coef=0.0",
            "train.tasks_per_step=4",
            "train.group_size=8",
            "train.lr=2e-2",
            "train.micro_batch_tokens=512",
            *overrides,
        ],
    )
    if coin is None:
        reward = CompositeReward([RewardSpec(name="two_turn")], fns={"two_turn": two_turn_reward})
    else:  # trained on the coin; `accuracy` (weight 0) records the noiseless outcome for evaluation
        reward = CompositeReward(
            [RewardSpec(name="noisy"), RewardSpec(name="accuracy", weight=0.0)],
            fns={"noisy": coin, "accuracy": two_turn_reward},
        )
    return Trainer(cfg, model=model, tokenizer=tok, env_factory=TwoTurnToolEnv, reward=reward)


def rewards_of(tr: Trainer, steps: int) -> list[float]:
    return [tr.train_step()["reward_mean"] for _ in range(steps)]


STEPS = 40


def test_rl_from_scratch_reaches_the_optimum(tmp_path):
    tr = guard_trainer(tmp_path)
    start = tr.evaluate("train", greedy=False, samples=4)
    assert start.reward_mean < 0.5, start.summary()  # near chance (0.25)
    curve = rewards_of(tr, STEPS)
    end = tr.evaluate("train", greedy=False, samples=4)
    assert end.reward_mean >= 0.9, (curve, end.summary())
    assert tr.step == STEPS


def test_guard_fails_when_the_advantage_sign_flips(tmp_path):
    """The guard is sharp: flipping every advantage drives the reward below chance."""
    tr = guard_trainer(tmp_path)
    real = tr.parts.estimator

    def flipped(groups):
        real(groups)
        for g in groups:
            for t in g.trajectories:
                for turn in t.turns:
                    turn.advantage = -turn.advantage

    tr.parts.estimator = flipped
    rewards_of(tr, 15)
    end = tr.evaluate("train", greedy=False, samples=4)
    assert end.reward_mean < 0.3, end.summary()


def test_guard_fails_when_the_action_mask_is_off_by_one(tmp_path, monkeypatch):
    """The guard is sharp: a loss on the token after each action (an off-by-one mask) learns nothing."""
    import flowgrpo.training.trainer as trainer_mod

    real = trainer_mod.build_rows

    def shifted(trajs, **kw):
        rows = real(trajs, **kw)
        for r in rows:
            for name in ("loss_mask", "advantages", "old_logprobs"):
                v = getattr(r, name)
                setattr(r, name, [type(v[0])(0), *v[:-1]])
        return rows

    monkeypatch.setattr(trainer_mod, "build_rows", shifted)
    tr = guard_trainer(tmp_path)
    rewards_of(tr, STEPS)
    end = tr.evaluate("train", greedy=False, samples=4)
    assert end.reward_mean < 0.9, end.summary()


def test_a_long_noisy_run_keeps_what_it_learned(tmp_path):
    """Learn the task (noiseless, lr 5e-3, 60-120 steps, until >= 0.9), then 160 steps under
    irreducible reward noise at half that learning rate: the run ends at the optimum, with at most
    one evaluation off it on the way. Over seeds 0-15 every run ended >= 0.91 (two dipped once and
    came back); at a constant 5e-3, 5 of 16 ended <= 0.05, this seed among them (1.0, 0.0, 0.01,
    0.0): pure noise under Adam moves the weights by about the learning rate per step
    (docs/learning.md 9.4)."""
    coin = CoinReward(seed=6)
    # lockstep waves: a row's logprobs never depend on timing, so the run is the same every time
    tr = guard_trainer(
        tmp_path, "train.lr=5e-3", "train.seed=6", "rollout.scheduling=lockstep", coin=coin, free_tokens=True
    )
    rewards_of(tr, 60)
    learned = [tr.evaluate("train", greedy=False, samples=8).accuracy]
    while learned[-1] < 0.9 and len(learned) < 4:  # noiseless until learned (chance: 1/8), <= 120 steps
        rewards_of(tr, 20)
        learned.append(tr.evaluate("train", greedy=False, samples=8).accuracy)
    assert learned[-1] >= 0.9, learned
    # half the lr: the first noisy update still runs at 5e-3, the scheduler's step after it halves it
    tr.scheduler.base_lrs = [lr / 2 for lr in tr.scheduler.base_lrs]
    coin.noisy = True
    curve = []
    for _ in range(4):
        rewards_of(tr, 40)
        curve.append(tr.evaluate("train", greedy=False, samples=8).accuracy)
    assert curve[-1] >= 0.9 and sum(a < 0.9 for a in curve) <= 1, (learned, curve)
