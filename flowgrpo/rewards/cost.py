"""``turn_cost``: a price on every turn of an episode that succeeds.

Outcome reward alone cannot tell a two-search answer from a one-search answer when both are right:
in a group where every episode is correct the rewards are equal and the group teaches nothing, so
an agent that learned to always search twice (``multihop``'s 1-hop questions, docs/learning.md
section 7.3) is never taught to stop. ``turn_cost`` scores a correct episode ``-T`` (``T`` turns)
and a wrong one 0: with a small weight (``{name: turn_cost, weight: 0.05}``) the shorter of two
correct episodes gets the larger group-normalised advantage, while correctness (weight 1) still
dominates. Wrong episodes pay nothing, so failures never learn to give up earlier: a group whose
episodes all fail keeps equal rewards, as without the cost. ``only_correct=False`` prices every
episode's turns (a plain length penalty, e.g. for a budget on tool calls).
"""

from __future__ import annotations

from typing import Any

from flowgrpo.rewards.answers import AccuracyReward
from flowgrpo.rewards.base import Reward
from flowgrpo.types import Task, Trajectory
from flowgrpo.utils.aio import run_sync


class TurnCostReward(Reward):
    """``-len(traj.turns)`` for a correct episode (``accuracy`` >= ``threshold``), else 0; with
    ``only_correct=False``, ``-len(traj.turns)`` always. ``accuracy_kwargs`` configure the
    :class:`~flowgrpo.rewards.answers.AccuracyReward` that decides "correct" (e.g. ``answer_type``)."""

    def __init__(
        self,
        *,
        only_correct: bool = True,
        threshold: float = 1.0,
        accuracy_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold is the accuracy that counts as correct, in (0, 1]; got {threshold}")
        self.only_correct, self.threshold = only_correct, threshold
        self.accuracy = AccuracyReward(**(accuracy_kwargs or {}))

    async def ascore(self, traj: Trajectory, task: Task) -> float:
        if self.only_correct and await self.accuracy.ascore(traj, task) < self.threshold:
            return 0.0
        return -float(len(traj.turns))

    def score(self, traj: Trajectory, task: Task) -> float:
        return run_sync(self.ascore(traj, task))
