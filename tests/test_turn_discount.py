"""algorithm.turn_discount: per-turn rewards discounted toward the outcome join the trajectory's
score in flow_grpo, grpo_dr and gigpo; hand-computed values."""

from __future__ import annotations

import math

import pytest

from flowgrpo.algorithms.advantages import compute_advantages, discounted_score, is_zero_variance
from flowgrpo.components import estimator_of
from flowgrpo.config import ConfigError, load_config
from flowgrpo.types import Message, Task, Trajectory, TrajectoryGroup, Turn


def turn(prompt, action, reward=0.0):
    return Turn(
        prompt_ids=prompt,
        action_ids=action,
        action_logprobs=[0.0] * len(action),
        action=Message(role="assistant", content="x"),
        reward=reward,
    )


def traj(outcome, turn_rewards, first_prompt):
    turns = [turn([first_prompt] if k == 0 else [50 + k], [9], r) for k, r in enumerate(turn_rewards)]
    return Trajectory(reward=outcome, turns=turns)


def three():
    """Outcomes [1, 0, 1]; per-turn rewards [1, 0, 2], [1], [0, 0]; no two first prompts alike, so
    GiGPO's anchor groups are singletons (step advantage 0)."""
    return TrajectoryGroup(
        task=Task(id="t", prompt="p"),
        trajectories=[traj(1.0, [1.0, 0.0, 2.0], 1), traj(0.0, [1.0], 2), traj(1.0, [0.0, 0.0], 3)],
    )


def advs(g):
    return [[t.advantage for t in tr.turns] for tr in g.trajectories]


def test_discounted_score_hand_computed():
    a = three().trajectories[0]  # R = 1, r = [1, 0, 2], T = 3
    assert discounted_score(a) == 1.0  # default: the outcome alone
    assert discounted_score(a, 0.5) == 1 + 0.25 * 1 + 0.5 * 0 + 1 * 2  # 3.25
    assert discounted_score(a, 1.0) == 4.0  # the plain sum
    assert discounted_score(a, 0.0) == 3.0  # outcome + last turn's reward
    assert discounted_score(Trajectory(reward=0.7), 0.5) == 0.7  # no turns


def test_flow_grpo_and_grpo_dr_with_turn_discount():
    # scores at 0.5: [3.25, 0 + 1, 1 + 0] = [3.25, 1, 1]; mean 1.75
    g = three()
    compute_advantages([g], "grpo_dr", turn_discount=0.5)
    assert advs(g) == [[1.5] * 3, [-0.75], [-0.75] * 2]
    # std (Bessel) = sqrt((1.5^2 + 0.75^2 + 0.75^2) / 2) = sqrt(1.6875): A = [2, -1, -1] / sqrt(3)
    compute_advantages([g], "flow_grpo", turn_discount=0.5)
    s = math.sqrt(3)
    a = pytest.approx(2 / s, abs=1e-5)
    b = pytest.approx(-1 / s, abs=1e-5)
    assert advs(g) == [[a] * 3, [b], [b] * 2]
    # today's default ignores the per-turn rewards: outcomes [1, 0, 1] -> [1, -2, 1] / sqrt(3)
    compute_advantages([g], "flow_grpo")
    assert [a[0] for a in advs(g)] == pytest.approx([1 / s, -2 / s, 1 / s], abs=1e-5)


def test_gigpo_episode_part_uses_the_discounted_score():
    g = three()
    compute_advantages([g], "gigpo", turn_discount=0.5, scale_by_std=False)
    assert advs(g) == [[1.5] * 3, [-0.75], [-0.75] * 2]  # singleton anchors: A^S = 0
    compute_advantages([g], "gigpo", scale_by_std=False)  # outcomes [1, 0, 1], mean 2/3
    assert [a[0] for a in advs(g)] == pytest.approx([1 / 3, -2 / 3, 1 / 3])


def test_equal_outcomes_with_different_turn_rewards_carry_signal():
    g = TrajectoryGroup(
        task=Task(id="t", prompt="p"), trajectories=[traj(1.0, [0.5], 1), traj(1.0, [0.0], 2)]
    )
    assert is_zero_variance(g) and not is_zero_variance(g, turn_discount=0.9)
    compute_advantages([g], "grpo_dr", turn_discount=0.9)  # scores [1.5, 1.0]
    assert advs(g) == [[0.25], [-0.25]]


def test_config_validates_turn_discount():
    cfg = load_config(None, ["algorithm.turn_discount=0.5"])
    assert cfg.algorithm.turn_discount == 0.5
    assert load_config(None, []).algorithm.turn_discount is None  # default unchanged
    g = three()
    estimator_of(cfg)([g])  # flow_grpo with turn_discount bound
    assert advs(g)[0][0] == pytest.approx(2 / math.sqrt(3), abs=1e-5)
    with pytest.raises(ConfigError, match="less than or equal to 1"):
        load_config(None, ["algorithm.turn_discount=1.5"])
    with pytest.raises(ConfigError, match=r"supported by the estimators .* not 'rloo'"):
        load_config(None, ["algorithm.turn_discount=0.5", "algorithm.estimator=rloo"])
    with pytest.raises(ConfigError, match=r"PPO discounts per-turn rewards in its GAE"):
        load_config(None, ["algorithm.turn_discount=0.5", "algorithm.name=ppo"])
    with pytest.raises(
        ConfigError, match=r"both as algorithm\.turn_discount and in algorithm\.estimator_kwargs"
    ):
        load_config(None, ["algorithm.turn_discount=0.5", "algorithm.estimator_kwargs={turn_discount: 0.9}"])


def test_trainer_keeps_equal_outcome_groups_whose_scores_differ(tmp_path):
    from tests.toy import make_trainer

    g = TrajectoryGroup(
        task=Task(id="t", prompt="p"), trajectories=[traj(1.0, [0.5], 1), traj(1.0, [0.0], 2)]
    )
    assert make_trainer(tmp_path, name="plain")._drop(g)
    assert not make_trainer(tmp_path, "algorithm.turn_discount=0.9", name="discounted")._drop(g)
