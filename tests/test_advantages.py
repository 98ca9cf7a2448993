"""Advantage estimators against hand-computed numbers (see docs/algorithms.md)."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.algorithms.advantages import (
    ESTIMATORS,
    compute_advantages,
    discounted_returns,
    get_estimator,
    grpo,
    is_zero_variance,
    register_estimator,
    rloo,
)
from flowgrpo.types import Message, Task, Trajectory, TrajectoryGroup, Turn

S3 = math.sqrt(1 / 3)  # unbiased std of {1, 0, 0, 1} and of {1, 1, 0}


def turn(prompt, action, reward=0.0, resets=False):
    return Turn(
        prompt_ids=prompt,
        action_ids=action,
        action_logprobs=[-1.0] * len(action),
        action=Message(role="assistant", content="x"),
        reward=reward,
        resets_context=resets,
    )


def group(*trajs):
    return TrajectoryGroup(task=Task(id="t", prompt="p"), trajectories=list(trajs))


def traj(reward, turns):
    return Trajectory(reward=reward, turns=turns)


def advs(g):
    return [[t.advantage for t in tr.turns] for tr in g.trajectories]


def test_grpo_hand_computed():
    a = grpo(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0, 2.0]]))
    # row 0: mean .5, unbiased std sqrt(1/3); row 1: mean 2, std sqrt(2/3)
    assert a[0].tolist() == pytest.approx([0.5 / S3, -0.5 / S3, -0.5 / S3, 0.5 / S3], rel=1e-5)
    s = math.sqrt(2 / 3)
    assert a[1].tolist() == pytest.approx([-1 / s, 0.0, 1 / s, 0.0], rel=1e-5, abs=1e-7)


def test_grpo_equal_rewards_and_singleton_give_zero_not_nan():
    a = grpo(torch.tensor([[0.7, 0.7, 0.7]]))
    assert torch.equal(a, torch.zeros(1, 3))
    assert torch.equal(grpo(torch.tensor([[3.0]])), torch.zeros(1, 1))
    assert torch.equal(grpo(torch.tensor([[3.0]]), scale_by_std=False), torch.zeros(1, 1))
    assert torch.equal(rloo(torch.tensor([[3.0]])), torch.zeros(1, 1))
    assert torch.equal(rloo(torch.tensor([[2.0, 2.0]])), torch.zeros(1, 2))


def test_dr_grpo_and_rloo_hand_computed():
    r = torch.tensor([[1.0, 2.0, 3.0]])
    assert grpo(r, scale_by_std=False)[0].tolist() == pytest.approx([-1.0, 0.0, 1.0])
    assert rloo(r)[0].tolist() == pytest.approx([1 - 2.5, 0.0, 3 - 1.5])
    with pytest.raises(ValueError, match="num_groups, G"):
        grpo(torch.tensor([1.0, 2.0]))


def test_flow_grpo_broadcasts_trajectory_advantage_to_every_turn():
    g = group(traj(1.0, [turn([1], [2]), turn([3], [4])]), traj(0.0, [turn([1], [5])]))
    out = compute_advantages([g], "flow_grpo")
    assert out[0] is g
    a = 0.5 / math.sqrt(0.5)  # rewards {1, 0}: mean .5, unbiased std sqrt(.5)
    assert advs(g)[0] == pytest.approx([a, a], rel=1e-5)
    assert advs(g)[1] == pytest.approx([-a], rel=1e-5)


def test_flow_grpo_turn_weighted_uses_the_multiset_of_turns():
    g = group(traj(1.0, [turn([1], [2]), turn([3], [4])]), traj(0.0, [turn([1], [5])]))
    compute_advantages([g], "flow_grpo_turn_weighted")
    # per-turn samples {1, 1, 0}: mean 2/3, unbiased std sqrt(1/3)
    assert advs(g)[0] == pytest.approx([(1 / 3) / S3] * 2, rel=1e-5)
    assert advs(g)[1] == pytest.approx([(-2 / 3) / S3], rel=1e-5)


def test_grpo_dr_and_rloo_estimators():
    g = group(
        traj(1.0, [turn([1], [2])]), traj(2.0, [turn([1], [3]), turn([4], [5])]), traj(3.0, [turn([1], [6])])
    )
    compute_advantages([g], "grpo_dr")
    assert advs(g) == [[-1.0], [0.0, 0.0], [1.0]]
    compute_advantages([g], "rloo")
    assert advs(g) == [[-1.5], [0.0, 0.0], [1.5]]


def test_equal_rewards_and_singleton_groups_through_every_estimator():
    for name in ESTIMATORS:
        same = group(traj(1.0, [turn([1], [2])]), traj(1.0, [turn([1], [3]), turn([4], [5])]))
        single = group(traj(0.3, [turn([1], [2]), turn([3], [4])]))
        empty = group()
        compute_advantages([same, single, empty], name)
        # GiGPO's step part still separates equal outcomes reached at different discounts.
        for g in (same, single) if name != "gigpo" else (single,):
            for row in advs(g):
                assert row == [0.0] * len(row), (name, row)


def test_ragged_groups_are_normalised_separately():
    g1 = group(traj(1.0, [turn([1], [2])]), traj(0.0, [turn([1], [3])]))
    g2 = group(traj(5.0, [turn([1], [2])]), traj(6.0, [turn([1], [3])]), traj(7.0, [turn([1], [4])]))
    compute_advantages([g1, g2], "grpo_dr")
    assert advs(g1) == [[0.5], [-0.5]]
    assert advs(g2) == [[-1.0], [0.0], [1.0]]


def test_discounted_returns():
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == pytest.approx([1.5, 1.0, 2.0])
    assert discounted_returns([], 0.9) == []


def test_gigpo_anchor_groups_and_discounted_returns():
    # A and B share both contexts (turn 1 context [1,2,5,7]); C's turn 1 context differs ([1,2,6,7]).
    a = traj(1.0, [turn([1, 2], [5]), turn([7], [8])])
    b = traj(0.0, [turn([1, 2], [5]), turn([7], [9])])
    c = traj(1.0, [turn([1, 2], [6]), turn([7], [8])])
    g = group(a, b, c)
    compute_advantages([g], "gigpo", gamma=0.5, omega=1.0)
    ep = [(1 / 3) / S3, (-2 / 3) / S3, (1 / 3) / S3]  # episode GRPO on {1, 0, 1}
    # turn 0 anchor {A, B, C}: returns {0.5, 0, 0.5} -> same normalised values as the episode
    # turn 1 anchors {A, B}: returns {1, 0} -> +-1/sqrt(2); {C}: singleton -> 0
    h = 1 / math.sqrt(2)
    assert advs(g)[0] == pytest.approx([2 * ep[0], ep[0] + h], rel=1e-5)
    assert advs(g)[1] == pytest.approx([2 * ep[1], ep[1] - h], rel=1e-5)
    assert advs(g)[2] == pytest.approx([2 * ep[2], ep[2]], rel=1e-5)
    # omega scales the step part only
    compute_advantages([g], "gigpo", gamma=0.5, omega=0.0)
    assert advs(g)[0] == pytest.approx([ep[0], ep[0]], rel=1e-5)


def test_gigpo_uses_turn_rewards_in_returns():
    # identical contexts at turn 0; shaping reward on A's first turn makes its return larger
    a = traj(1.0, [turn([1], [5], reward=1.0), turn([7], [8])])
    b = traj(1.0, [turn([1], [5]), turn([7], [8])])
    g = group(a, b)
    compute_advantages([g], "gigpo", gamma=1.0, scale_by_std=False)
    # episode: equal outcomes -> 0; turn 0 anchor returns {2, 1} -> +-0.5; turn 1 anchor {1, 1} -> 0
    assert advs(g) == [[0.5, 0.0], [-0.5, 0.0]]


def test_registry_and_helpful_errors():
    with pytest.raises(ValueError, match="did you mean 'gigpo'"):
        get_estimator("gipgo")

    def const(groups, value=2.0):
        for g in groups:
            for t in g.trajectories:
                for u in t.turns:
                    u.advantage = value

    g = group(traj(1.0, [turn([1], [2])]))
    compute_advantages([g], const, value=3.0)
    assert advs(g) == [[3.0]]
    register_estimator("const_test", const)
    try:
        compute_advantages([g], "const_test")
        assert advs(g) == [[2.0]]
    finally:
        ESTIMATORS.pop("const_test")


def test_is_zero_variance():
    assert is_zero_variance(group(traj(1.0, []), traj(1.0, [])))
    assert not is_zero_variance(group(traj(1.0, []), traj(0.0, [])))


# ------------------------------------------------------------------ equal rewards are exactly 0


@pytest.mark.parametrize("value,n", [(0.1, 8), (1 / 3, 5), (0.7, 3), (1e-7, 6)])
def test_equal_rewards_give_exactly_zero_not_float_residue(value, n):
    r = torch.tensor([[value] * n])
    assert torch.equal(grpo(r), torch.zeros(1, n))
    assert torch.equal(grpo(r, scale_by_std=False), torch.zeros(1, n))
    assert torch.equal(rloo(r), torch.zeros(1, n))
    for name in ESTIMATORS:
        # distinct contexts: no anchor state repeats, so GiGPO's step groups are singletons
        g = group(*[traj(value, [turn([1, i + 2], [9]), turn([3], [4])]) for i in range(n)])
        compute_advantages([g], name)
        assert all(a == 0.0 for row in advs(g) for a in row), (name, advs(g))


def test_gigpo_equal_step_returns_give_exactly_zero():
    # every trajectory shares both contexts: one anchor group per turn, all returns equal 0.1 * gamma^k
    g = group(*[traj(0.1, [turn([1], [2]), turn([3], [4])]) for _ in range(8)])
    compute_advantages([g], "gigpo", gamma=0.9)
    assert advs(g) == [[0.0, 0.0]] * 8


# ------------------------------------------------------------------ excluded episodes


def excluded(reward, turns, why="termination:error"):
    t = traj(reward, turns)
    t.excluded = why
    return t


def flat(g):
    return [a for row in advs(g) for a in row]


def test_excluded_leave_the_baseline_and_get_zero():
    # scored rewards {1, 0, 0}: mean 1/3, unbiased std sqrt(1/3); the excluded 5.0 takes no part
    g = group(
        traj(1.0, [turn([1], [2])]),
        traj(0.0, [turn([1], [3])]),
        excluded(5.0, [turn([1], [4]), turn([5], [6])]),
        traj(0.0, [turn([1], [7])]),
    )
    compute_advantages([g], "flow_grpo")
    hi, lo = (2 / 3) / S3, (-1 / 3) / S3
    assert advs(g)[0] == pytest.approx([hi], rel=1e-5)
    assert advs(g)[1] == pytest.approx([lo], rel=1e-5)
    assert advs(g)[2] == [0.0, 0.0]
    assert advs(g)[3] == pytest.approx([lo], rel=1e-5)
    compute_advantages([g], "grpo_dr")
    assert flat(g) == pytest.approx([2 / 3, -1 / 3, 0.0, 0.0, -1 / 3])
    compute_advantages([g], "rloo")  # leave-one-out over {1, 0, 0}
    assert flat(g) == pytest.approx([1.0, -0.5, 0.0, 0.0, -0.5])


def test_excluded_in_turn_weighted_and_gigpo():
    g = group(
        traj(1.0, [turn([1], [2]), turn([3], [4])]),
        traj(0.0, [turn([1], [5])]),
        excluded(1.0, [turn([1], [2]), turn([3], [4])]),  # same contexts as the first: no anchor mate
    )
    compute_advantages([g], "flow_grpo_turn_weighted")
    # per-turn samples {1, 1, 0} as without the excluded one
    assert advs(g)[0] == pytest.approx([(1 / 3) / S3] * 2, rel=1e-5)
    assert advs(g)[1] == pytest.approx([(-2 / 3) / S3], rel=1e-5)
    assert advs(g)[2] == [0.0, 0.0]
    compute_advantages([g], "gigpo", gamma=1.0, scale_by_std=False)
    # episode {1, 0}: +-0.5; turn-0 anchor {1, 0} (returns 1 and 0): +-0.5; turn 1 of the first is alone
    assert advs(g) == [[1.0, 0.5], [-1.0], [0.0, 0.0]]


def test_group_with_fewer_than_two_scored_contributes_nothing():
    for name in ESTIMATORS:
        g = group(traj(1.0, [turn([1], [2])]), excluded(0.0, [turn([1], [3])]), excluded(0.5, []))
        compute_advantages([g], name)
        assert advs(g) == [[0.0], [0.0], []], name


def test_excluded_zero_even_for_custom_estimators():
    def const(groups):
        for g in groups:
            for t in g.trajectories:
                for u in t.turns:
                    u.advantage = 7.0

    g = group(traj(1.0, [turn([1], [2])]), excluded(0.0, [turn([1], [3])], why="reward:judge down"))
    compute_advantages([g], const)
    assert advs(g) == [[7.0], [0.0]]


def test_is_zero_variance_ignores_excluded():
    assert is_zero_variance(group(traj(1.0, []), traj(1.0, []), excluded(0.0, [])))
    assert not is_zero_variance(group(traj(1.0, []), traj(0.0, []), excluded(0.0, [])))
    assert is_zero_variance(group(excluded(1.0, []), excluded(0.0, [])))


def test_rollout_stats_count_excluded():
    from flowgrpo.runs.metrics import rollout_stats

    g = group(
        traj(1.0, [turn([1], [2])]),
        traj(1.0, [turn([1], [3])]),
        excluded(0.0, [turn([1], [4])]),
        excluded(0.0, [turn([1], [5])], why="reward:verifier unreachable"),
    )
    s = rollout_stats([g])
    assert s["episodes_excluded"] == 2.0
    assert s["excluded/termination"] == 1.0 and s["excluded/reward"] == 1.0
    assert s["zero_variance_groups"] == 1.0  # the scored rewards {1, 1} are equal
