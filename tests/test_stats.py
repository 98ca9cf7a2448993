"""Evaluation statistics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from flowgrpo.algorithms.stats import (
    mcnemar_exact,
    mean_pass_at_k,
    paired_difference,
    pass_at_k,
    wilson_interval,
)
from flowgrpo.runs.evaluation import compare, summarize
from flowgrpo.types import Message, Task, Trajectory, TrajectoryGroup, Turn


def test_wilson_interval_hand_values():
    # 5/10: centre (0.5 + z^2/20) / (1 + z^2/10) = 0.5, half-width 1.96 * sqrt(0.025 + z^2/400) / 1.384 = 0.2634
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    # 0/100: (0, 2 * (z^2/200) / (1 + z^2/100)) = (0, 0.0370)
    lo, hi = wilson_interval(0, 100)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.0370, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(8, 2, 2) == pytest.approx(1 - 15 / 28)  # 1 - C(6,2)/C(8,2)
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 7, 2) == 1.0  # fewer than k wrong samples: some draw of k always hits
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(8, 1, 8) == 1.0
    assert mean_pass_at_k(4, [0, 4], 1) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least k samples"):
        pass_at_k(4, 1, 8)


def test_mcnemar_exact_hand_values():
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024)
    assert mcnemar_exact(2, 8) == pytest.approx(2 * (1 + 10 + 45) / 1024)
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(0, 0) == 1.0


def test_paired_difference_counts_and_interval():
    # 20 tasks: 8 both right, 1 only A, 6 only B, 5 neither
    a = [1] * 8 + [1] * 1 + [0] * 6 + [0] * 5
    b = [1] * 8 + [0] * 1 + [1] * 6 + [0] * 5
    c = paired_difference(a, b)
    assert (c.n, c.both, c.only_a, c.only_b) == (20, 8, 1, 6) and c.counts == "8,1,6,5"
    assert c.accuracy_a == pytest.approx(9 / 20) and c.accuracy_b == pytest.approx(14 / 20)
    assert c.difference == pytest.approx(0.25)
    assert c.ci95[0] < 0.25 < c.ci95[1] and c.ci95[0] >= -1 and c.ci95[1] <= 1
    assert c.p_value == pytest.approx(mcnemar_exact(1, 6))
    swapped = paired_difference(b, a)  # the interval mirrors
    assert swapped.ci95[0] == pytest.approx(-c.ci95[1]) and swapped.ci95[1] == pytest.approx(-c.ci95[0])
    same = paired_difference(a, a)
    assert same.difference == 0.0 and same.p_value == 1.0 and same.ci95[0] <= 0 <= same.ci95[1]
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference([1], [1, 0])


def _group(task_id: str, correct: list[int]) -> TrajectoryGroup:
    trajs = []
    for ok in correct:
        turn = Turn(
            prompt_ids=[1],
            action_ids=[2],
            action_logprobs=[0.0],
            action=Message(role="assistant", content="x"),
        )
        trajs.append(
            Trajectory(
                task_id=task_id, turns=[turn], reward=float(ok), reward_breakdown={"accuracy": float(ok)}
            )
        )
    return TrajectoryGroup(task=Task(id=task_id, prompt="p"), trajectories=trajs)


def test_summarize_sampled_and_greedy():
    sampled = summarize([_group("t0", [1, 0, 0, 0]), _group("t1", [1, 1, 1, 1])], greedy=False)
    assert sampled.samples == 4 and sampled.n == 2 and sampled.accuracy == pytest.approx(5 / 8)
    assert sampled.pass_at_k == pytest.approx({1: 5 / 8, 2: (0.5 + 1) / 2, 4: 1.0})
    assert sampled.per_task == {"t0": 1, "t1": 4}
    greedy_a = summarize([_group(f"t{i}", [int(i < 3)]) for i in range(10)], label="a")
    greedy_b = summarize([_group(f"t{i}", [int(i < 7)]) for i in range(10)], label="b")
    assert greedy_a.ci95 == pytest.approx(wilson_interval(3, 10))
    cmp = compare(greedy_a, greedy_b)
    assert (cmp.only_a, cmp.only_b) == (0, 4) and cmp.p_value == pytest.approx(2 / 16)
    assert math.isclose(cmp.difference, 0.4)
    with pytest.raises(ValueError, match="one episode per task"):
        compare(sampled, greedy_a)
