"""A guard on the learning path itself: RL from scratch on a task whose optimum is known.

A tiny random model plays a two-turn episode in which every action is one sampled token. Turn 1's
token is sent to a tool (the observation echoes it back), turn 2's ends the episode. The outcome
reward is the mean of two indicators -- turn 1's token id is 0 mod 4, turn 2's is 0 or 1 mod 4 --
so chance is 0.375 and the optimum 1.0. Only the outcome is rewarded (Flow-GRPO gives it to every
turn), so reaching >= 0.9 from scratch, with no warm start, needs the right advantage sign, the
loss on the action tokens of both turns (not on the prompt or observation tokens next to them) and
an aggregation that keeps every row. The ``test_guard_fails_*`` tests break the sign and the mask
on purpose and check that the guard catches it.
"""

from __future__ import annotations

import pytest
import torch

from flowgrpo.config import load_config
from flowgrpo.env import BaseEnvironment, StepResult
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.training.trainer import Trainer
from flowgrpo.types import Message, ParsedAction, Task

TARGETS = ({0}, {0, 1})  # turn k's token must fall in TARGETS[k] (its id mod 4)


class EchoParser:
    def parse(self, text: str) -> ParsedAction:
        return ParsedAction(message=Message(role="assistant", content=text), answer=text)

    def format_instructions(self, tools) -> str:
        return ""


class TwoTurnToolEnv(BaseEnvironment):
    """Turn 1 goes to an echo tool; turn 2 ends the episode."""

    name = "two_turn_tool"
    tools: list = []
    parser = EchoParser()
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


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def guard_trainer(tmp_path, *overrides: str) -> Trainer:
    tok = tiny_tokenizer()
    model, tok = tiny_model(tok, seed=0)
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
            # every token ends the turn: each action is exactly one sampled token (a one-token choice)
            f"rollout.sampling.stop_token_ids={list(range(len(tok)))}",
            "rewards=[{name: two_turn}]",
            "algorithm.estimator=flow_grpo",
            "algorithm.kl_coef=0.0",
            "train.tasks_per_step=4",
            "train.group_size=8",
            "train.lr=2e-2",
            "train.micro_batch_tokens=512",
            *overrides,
        ],
    )
    reward = CompositeReward([RewardSpec(name="two_turn")], fns={"two_turn": two_turn_reward})
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
