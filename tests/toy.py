"""Small training setups the tests share.

The first-token toy: a tiny random model, one-turn episodes, and a reward paid when the first
sampled token is one of a fixed quarter of the vocabulary, learnable from the first token's logits
alone (:func:`make_trainer`, ~0.3 s per RL step on one thread). And the tiny calculator run: the
calculator example on the tiny model with a short warm start (:data:`CALCULATOR`, :data:`SMALL`)."""

from __future__ import annotations

from pathlib import Path

import torch

from flowgrpo.config import load_config
from flowgrpo.env import BaseEnvironment, StepResult
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.training.trainer import Trainer
from flowgrpo.types import Message, ParsedAction, Task

# Bit-exact reruns need batches that timing cannot change: lockstep scheduling (the default,
# continuous batching, admits requests in arrival order).
EXACT = "rollout.scheduling=lockstep"


class PlainParser:
    """Every text is a final answer; no tools."""

    def parse(self, text: str) -> ParsedAction:
        return ParsedAction(message=Message(role="assistant", content=text), answer=text)

    def format_instructions(self, tools) -> str:
        return ""


class FirstTokenEnv(BaseEnvironment):
    """Single turn: say anything. The reward (below) pays when the first sampled token is one of
    a fixed quarter of the vocabulary, so it is learnable from the first token's logits alone."""

    name = "first_token"
    tools: list = []
    parser = PlainParser()
    system_prompt = "Say something."

    async def reset(self, task: Task) -> list[Message]:
        return [Message(role="system", content=self.system_prompt), Message(role="user", content=task.prompt)]

    async def step(self, action: ParsedAction) -> StepResult:
        return StepResult(terminated=True)

    def tasks(self, split: str) -> list[Task]:
        n = 8 if split == "train" else 4
        return [Task(id=f"{split}-{i}", prompt=f"task {i}") for i in range(n)]


def first_token_reward(vocab: int):
    def reward(traj, task) -> float:
        ids = traj.turns[0].action_ids if traj.turns else []
        return 1.0 if ids and ids[0] % 4 == 0 else 0.0

    return reward


def make_trainer(tmp_path, *overrides: str, name: str = "run", model_seed: int = 0) -> Trainer:
    tok = tiny_tokenizer()
    model, tok = tiny_model(tok, seed=model_seed)
    cfg = load_config(
        None,
        [
            f"run.output_dir={tmp_path / name}",
            "run.progress=false",
            "model.autocast=null",
            "rollout.max_turns=1",
            "rollout.max_new_tokens=2",
            "rewards=[{name: first_token}]",
            "train.tasks_per_step=4",
            "train.group_size=6",
            "train.lr=3e-2",
            "train.micro_batch_tokens=256",
            "algorithm.kl_coef=0.01",
            *overrides,
        ],
    )
    reward = CompositeReward(
        [RewardSpec(name="first_token")], fns={"first_token": first_token_reward(len(tok))}
    )
    return Trainer(cfg, model=model, tokenizer=tok, env_factory=FirstTokenEnv, reward=reward)


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


CALCULATOR = Path(__file__).resolve().parents[1] / "examples" / "calculator_agent.yaml"

# The calculator example shrunk to seconds: the tiny model, 2 tasks x 2 episodes, a 4-task warm start.
SMALL = [
    "model.name=tiny",
    "model.device=cpu",
    "model.autocast=null",
    "train.steps=1",
    "train.tasks_per_step=2",
    "train.group_size=2",
    "train.drop_zero_variance_groups=false",  # a random model's groups tie: still run the update
    "train.resample_rounds=0",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=16",
    "sft.enabled=true",
    "sft.tasks=4",
    "sft.epochs=1",
    "run.progress=false",
    "run.eval_every=0",
    "run.save_every=0",
]
