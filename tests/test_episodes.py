"""Episode-level rules between scoring and advantages, against hand-computed numbers."""

from __future__ import annotations

import pytest

from flowgrpo.algorithms.advantages import compute_advantages
from flowgrpo.algorithms.episodes import (
    apply_overlong_penalty,
    exclude_terminations,
    is_truncated,
    overlong_penalty,
)
from flowgrpo.types import Message, Task, Termination, Trajectory, TrajectoryGroup, Turn


def turn(n_actions: int) -> Turn:
    return Turn(
        prompt_ids=[1],
        action_ids=[7] * n_actions,
        action_logprobs=[-1.0] * n_actions,
        action=Message(role="assistant", content="x"),
    )


def traj(reward: float, *action_lengths: int, termination=Termination.finished) -> Trajectory:
    return Trajectory(reward=reward, turns=[turn(n) for n in action_lengths], termination=termination)


def group(*trajs: Trajectory) -> TrajectoryGroup:
    return TrajectoryGroup(task=Task(id="t", prompt="p"), trajectories=list(trajs))


def test_overlong_penalty_hand_computed():
    # L_max = 100, L_cache = 20: free up to 80, linear ramp to -1 at 100, -1 beyond
    assert overlong_penalty(80, 100, 20) == 0.0
    assert overlong_penalty(85, 100, 20) == pytest.approx(-0.25)
    assert overlong_penalty(100, 100, 20) == pytest.approx(-1.0)
    assert overlong_penalty(101, 100, 20) == -1.0
    assert overlong_penalty(500, 100, 0) == 0.0  # off


def test_overlong_penalty_counts_every_turn_of_the_trajectory():
    # 3 turns of 30 tokens: 90 action tokens, although no single turn is long
    g = group(traj(1.0, 30, 30, 30), traj(1.0, 50), traj(0.0, 60, 50))
    apply_overlong_penalty([g], max_tokens=100, buffer_len=20, factor=0.5)
    assert [t.reward for t in g.trajectories] == pytest.approx([1.0 - 0.5 * 0.5, 1.0, -0.5])
    assert g.trajectories[0].reward_breakdown["overlong"] == pytest.approx(-0.25)
    assert g.trajectories[1].reward_breakdown["overlong"] == 0.0


def test_exclude_terminations_marks_and_leaves_the_baseline():
    g = group(
        traj(1.0, 3),
        traj(0.0, 3),
        traj(0.0, 3, termination=Termination.error),
        traj(0.0, 3, termination=Termination.context_overflow),
        traj(1.0, 3, termination=Termination.max_turns),
    )
    n = exclude_terminations([g], [Termination.error, Termination.context_overflow])
    assert n == 2
    assert [t.excluded for t in g.trajectories] == [
        None,
        None,
        "termination:error",
        "termination:context_overflow",
        None,
    ]
    compute_advantages([g], "grpo_dr")  # baseline over {1, 0, 1}: mean 2/3
    a = [t.turns[0].advantage for t in g.trajectories]
    assert a == pytest.approx([1 / 3, -2 / 3, 0.0, 0.0, 1 / 3])


def test_exclude_terminations_keeps_an_earlier_reason():
    t = traj(0.0, 1, termination=Termination.error)
    t.excluded = "reward:judge unreachable"
    assert exclude_terminations([group(t)], [Termination.error]) == 0
    assert t.excluded == "reward:judge unreachable"


def test_is_truncated():
    assert is_truncated(traj(0.0, 5, termination=Termination.max_tokens))
    assert is_truncated(traj(0.0, 5, termination=Termination.context_overflow))
    assert not is_truncated(traj(0.0, 5, termination=Termination.max_turns))
    assert is_truncated(traj(0.0, 60, 40), max_tokens=100)  # the whole trajectory's budget
    assert not is_truncated(traj(0.0, 60, 39), max_tokens=100)
