"""PPO: multi-turn GAE and the clipped value loss against hand computations; the critic's targets;
a tiny-model PPO run whose value loss falls."""

from __future__ import annotations

import pytest
import torch

from flowgrpo.algorithms.ppo import explained_variance, gae, masked_whiten, value_loss
from flowgrpo.config import PPOConfig, load_config
from flowgrpo.env import BaseEnvironment, StepResult
from flowgrpo.modeling.models import tiny_model
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.runs.rundir import RunDir
from flowgrpo.training.batching import build_rows
from flowgrpo.training.trainer import Trainer
from flowgrpo.training.value import Critic
from flowgrpo.types import Message, ParsedAction, Task, Trajectory, Turn
from tests.toy import PlainParser

# A two-turn episode packed in one row: [p p a a o o a] (prompt, 2 action tokens of turn 1, the
# tool result, 1 action token of turn 2). Values at action tokens 0.5, 0.6 | 0.8; turn 1's shaping
# reward 0.1 on its last action token, the outcome 1.0 on the episode's last action token.
MASK = torch.tensor([[0, 0, 1, 1, 0, 0, 1]], dtype=torch.float32)
VALUES = torch.tensor([[0.0, 0.0, 0.5, 0.6, 0.0, 0.0, 0.8]])
REWARDS = torch.tensor([[0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 1.0]])


@pytest.mark.parametrize(
    ("gamma", "lam", "adv"),
    [
        # gamma = 0: A = r - V, no look-ahead at all.
        (0.0, 0.0, [-0.5, -0.5, 0.2]),
        (0.0, 0.9, [-0.5, -0.5, 0.2]),
        (0.0, 1.0, [-0.5, -0.5, 0.2]),
        # lam = 0: A = delta = r + gamma V(next action token) - V. The bootstrap of the last token of
        # turn 1 is V = 0.8 of turn 2's first action token, across the tool result:
        # pos 6: 1 - 0.8 = 0.2; pos 3: 0.1 + 0.9*0.8 - 0.6 = 0.22; pos 2: 0.9*0.6 - 0.5 = 0.04.
        (0.9, 0.0, [0.04, 0.22, 0.2]),
        # pos 3: 0.22 + 0.81*0.2 = 0.382; pos 2: 0.04 + 0.81*0.382 = 0.34942.
        (0.9, 0.9, [0.34942, 0.382, 0.2]),
        # lam = 1: Monte-Carlo return minus V. pos 2: 0.9*0.1 + 0.81*1 - 0.5 = 0.4; pos 3: 0.1 + 0.9 - 0.6.
        (0.9, 1.0, [0.4, 0.4, 0.2]),
        (1.0, 0.0, [0.1, 0.3, 0.2]),
        (1.0, 0.9, [0.1 + 0.9 * (0.3 + 0.9 * 0.2), 0.3 + 0.9 * 0.2, 0.2]),
        # gamma = lam = 1: sum of later rewards minus V: 1.1 - 0.5, 1.1 - 0.6, 1 - 0.8.
        (1.0, 1.0, [0.6, 0.5, 0.2]),
    ],
)
def test_gae_two_turns_against_hand_computation(gamma, lam, adv):
    a, ret = gae(REWARDS, VALUES, MASK, gamma=gamma, lam=lam)
    on = MASK[0] > 0
    assert torch.allclose(a[0, on], torch.tensor(adv), atol=1e-6)
    assert torch.allclose(ret[0, on], torch.tensor(adv) + VALUES[0, on], atol=1e-6)
    assert torch.all(a[0, ~on] == 0) and torch.all(ret[0, ~on] == 0)


def test_gae_three_turns_and_observation_tokens_are_skipped():
    # Three turns of one action token each, observation tokens between them; rewards 0, 0.5, 1.
    mask = torch.tensor([[0, 1, 0, 0, 1, 0, 1]], dtype=torch.float32)
    values = torch.tensor([[9.0, 0.2, 9.0, 9.0, 0.4, 9.0, 0.7]])  # values off the mask are ignored
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 1.0]])
    a, _ = gae(rewards, values, mask, gamma=0.9, lam=0.9)
    d3 = 1.0 - 0.7  # 0.3
    d2 = 0.5 + 0.9 * 0.7 - 0.4  # 0.73
    d1 = 0.0 + 0.9 * 0.4 - 0.2  # 0.16
    a3 = d3
    a2 = d2 + 0.81 * a3  # 0.973
    a1 = d1 + 0.81 * a2  # 0.94813
    assert torch.allclose(a[0, [1, 4, 6]], torch.tensor([a1, a2, a3]), atol=1e-6)
    # The same decisions without the observation tokens in between give the same advantages.
    a_dense, _ = gae(rewards[:, [1, 4, 6]], values[:, [1, 4, 6]], torch.ones(1, 3), gamma=0.9, lam=0.9)
    assert torch.allclose(a[0, [1, 4, 6]], a_dense[0], atol=1e-6)


def test_gae_batches_rows_of_different_lengths_independently():
    two = torch.cat([MASK, torch.tensor([[0, 1, 1, 0, 0, 0, 0]], dtype=torch.float32)])
    vals = torch.cat([VALUES, torch.tensor([[0.0, 0.3, 0.1, 0, 0, 0, 0]])])
    rews = torch.cat([REWARDS, torch.tensor([[0.0, 0.0, 2.0, 0, 0, 0, 0]])])
    a, _ = gae(rews, vals, two, gamma=1.0, lam=1.0)
    assert torch.allclose(a[0, [2, 3, 6]], torch.tensor([0.6, 0.5, 0.2]), atol=1e-6)
    assert torch.allclose(a[1, [1, 2]], torch.tensor([2.0 - 0.3, 2.0 - 0.1]), atol=1e-6)
    with pytest.raises(ValueError, match="gamma and lam"):
        gae(REWARDS, VALUES, MASK, gamma=1.5, lam=0.9)


def test_value_loss_clipping_by_hand():
    mask = torch.ones(1, 3)
    returns = torch.tensor([[1.0, 1.0, 0.0]])
    old = torch.tensor([[0.5, 0.5, 0.0]])
    v = torch.tensor([[0.6, 0.9, 1.0]], requires_grad=True)
    loss, m = value_loss(v, old, returns, mask, clip=0.2)
    # token 1: inside the clip range: 0.5 * 0.4^2 = 0.08
    # token 2: v moved 0.4 > 0.2: v_clip = 0.7, 0.5 * max(0.1^2, 0.3^2) = 0.045 (the clipped term)
    # token 3: v_clip = 0.2; 0.5 * max(1^2, 0.2^2) = 0.5
    assert loss.item() == pytest.approx((0.08 + 0.045 + 0.5) / 3, abs=1e-6)
    assert m["vf_clip_frac"] == pytest.approx(1 / 3) and m["vf_loss"] == pytest.approx(loss.item())
    loss.backward()
    # d/dv of the token mean: (v - R)/3 where unclipped, 0 where the clipped term wins.
    assert torch.allclose(v.grad, torch.tensor([[-0.4 / 3, 0.0, 1.0 / 3]]), atol=1e-6)
    plain, m2 = value_loss(v, old, returns, mask, clip=None)
    assert plain.item() == pytest.approx(0.5 * (0.16 + 0.01 + 1.0) / 3, abs=1e-6) and m2["vf_clip_frac"] == 0


def test_explained_variance_and_whitening():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0])
    ones = torch.ones(4)
    assert explained_variance(r, r, ones) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 2.5), r, ones) == pytest.approx(0.0)
    # residuals (1, -1, 1, -1) have variance 1; the returns' is 1.25: 1 - 1/1.25 = 0.2
    assert explained_variance(r - torch.tensor([1.0, -1.0, 1.0, -1.0]), r, ones) == pytest.approx(0.2)
    w = masked_whiten(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0]))
    assert torch.allclose(w, torch.tensor([-1.0, 1.0, 0.0]), atol=1e-6)


def _episode(tok_reward: float, outcome: float) -> Trajectory:
    t1 = Turn(
        prompt_ids=[5, 6],
        action_ids=[7, 8],
        action_logprobs=[-1.0, -1.0],
        action=Message(role="assistant", content="a"),
        reward=tok_reward,
    )
    t2 = Turn(prompt_ids=[9, 10], action_ids=[11], action_logprobs=[-1.0], action=Message(role="assistant"))
    return Trajectory(turns=[t1, t2], reward=outcome)


def test_critic_places_rewards_and_runs_gae_across_the_tool_result():
    model, _ = tiny_model(seed=0)
    cfg = PPOConfig(gamma=0.9, lam=1.0, whiten_advantages=False)
    critic = Critic(model, cfg, lr=1e-3)
    trajs = [_episode(0.1, 1.0), _episode(0.0, 0.0)]
    for t in trajs:
        for turn in t.turns:
            turn.advantage = 0.0
    rows = build_rows(trajs)
    m = critic.prepare(rows, trajs, micro_batch_tokens=64, pad_id=0)
    # The head starts at zero: values are 0, so with lam = 1 the advantages are the discounted
    # rewards-to-go. Episode 1, action tokens (7, 8 | 11): 0.9*0.1 + 0.81*1, 0.1 + 0.9*1, 1.
    assert rows[0].loss_mask == [0, 0, 1, 1, 0, 0, 1]
    on = [2, 3, 6]
    assert [rows[0].advantages[i] for i in on] == pytest.approx([0.9 * 0.1 + 0.81, 1.0, 1.0])
    assert all(rows[1].advantages[i] == 0 for i in on)
    assert trajs[0].turns[1].advantage == pytest.approx(1.0)
    assert trajs[0].turns[0].advantage == pytest.approx((0.9 * 0.1 + 0.81 + 1.0) / 2)
    assert m["ppo/value_mean"] == 0.0 and m["ppo/return_mean"] == pytest.approx((0.9 * 0.1 + 0.81 + 2) / 6)


def test_ppo_config_errors_say_how_to_fix():
    with pytest.raises(ValueError, match="value_model=separate"):
        load_config(
            None,
            ["algorithm.name=ppo", "algorithm.ppo.value_model=shared", "algorithm.ppo.value_model_path=/x"],
        )
    with pytest.raises(ValueError, match=r"algorithm\.name"):
        load_config(None, ["algorithm.name=pp0"])


class _PromptRewardEnv(BaseEnvironment):
    """One turn; the reward (below) pays on half of the tasks whatever the policy says, so a critic
    that reads the prompt can predict the return exactly."""

    name = "prompt_reward"
    tools: list = []
    parser = PlainParser()

    async def reset(self, task: Task) -> list[Message]:
        return [Message(role="user", content=task.prompt)]

    async def step(self, action: ParsedAction) -> StepResult:
        return StepResult(terminated=True)

    def tasks(self, split: str) -> list[Task]:
        return [Task(id=f"{split}-{i}", prompt=f"task {i}") for i in range(8)]


def _task_reward(traj, task) -> float:
    return 1.0 if int(task.id.rsplit("-", 1)[1]) % 2 == 0 else 0.0


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_tiny_ppo_run_value_loss_falls(tmp_path, layout, one_thread):
    model, tok = tiny_model(seed=0)
    cfg = load_config(
        None,
        [
            f"run.output_dir={tmp_path / layout}",
            "run.progress=false",
            "run.save_every=0",
            "model.autocast=null",
            "model.rollout_dtype=float32",  # the same run on every CPU: a bf16 copy samples differently per kernel
            "rollout.max_turns=1",
            "rollout.max_new_tokens=3",
            "rewards=[{name: first_token}]",
            "train.steps=20",  # the shared head's loss still swings 0.04-0.12 at steps 6-10; by 18-20 it is <= 0.02
            "train.tasks_per_step=4",
            "train.group_size=4",
            "train.lr=1e-3",
            "train.micro_batch_tokens=256",
            "algorithm.name=ppo",
            f"algorithm.ppo.value_model={layout}",
            "train.epochs_per_batch=4",
            "rollout.scheduling=static",
            "algorithm.ppo.value_lr=1e-2",
            "algorithm.ppo.vf_coef=1.0",
        ],
    )
    reward = CompositeReward([RewardSpec(name="first_token")], fns={"first_token": _task_reward})
    tr = Trainer(cfg, model=model, tokenizer=tok, env_factory=_PromptRewardEnv, reward=reward)
    tr.train()
    rows = [m.values for m in RunDir(tmp_path / layout).metrics() if "ppo/vf_loss" in m.values]
    assert len(rows) == 20
    first = sum(r["ppo/vf_loss"] for r in rows[:3]) / 3
    last = sum(r["ppo/vf_loss"] for r in rows[-3:]) / 3
    assert last < 0.5 * first, (first, last)
    assert max(r["ppo/explained_variance"] for r in rows[-3:]) > 0.2  # it reads the prompt
    assert any(r["ppo/vf_clip_frac"] > 0 for r in rows)  # epochs > 1 move values past the clip
    assert all(
        k in rows[-1] for k in ("ppo/explained_variance", "ppo/advantage_mean", "ppo/value_mean", "kl")
    )
    # The critic is checkpointed with the policy and restored on resume.
    assert tr.save().exists()
    again = Trainer(
        cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume": True})}),
        model=tiny_model(seed=1)[0],
        tokenizer=tok,
        env_factory=_PromptRewardEnv,
        reward=reward,
    )
    for a_, b_ in zip(tr.critic.model.head.parameters(), again.critic.model.head.parameters(), strict=True):
        assert torch.equal(a_, b_)
