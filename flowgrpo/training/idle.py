"""Saying so when RL steps train nothing.

A step whose groups all had equal rewards (or were all dropped) makes no optimizer step: the run
spends its time sampling and the policy never moves. That is silent in the metrics unless someone
reads ``optimizer_steps``; :class:`IdleWatch` warns in the console every ``every`` such steps and
once more at the end of ``train()``, with the likely causes read off the step's own metrics
(constant rewards, all-zero or all-one rewards, the group size, episodes cut by the token limit).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger(__name__)


def likely_causes(m: Mapping[str, float], group_size: int) -> list[str]:
    """The reasons a step with metrics ``m`` (:func:`flowgrpo.runs.metrics.rollout_stats` plus the
    update's) had no learning signal, most specific first."""
    causes = []
    episodes = m.get("episodes", 0.0)
    if episodes and m.get("episodes_excluded", 0.0) >= episodes:
        causes.append("every episode was excluded (see excluded/* in metrics.jsonl)")
    mean = m.get("reward_mean")
    if m.get("reward_std", 1.0) == 0.0 and mean is not None:
        which = "0: no episode succeeds" if mean == 0.0 else f"{mean:g}: every episode scores the same"
        causes.append(f"the reward is constant ({which}); check the reward and the task difficulty")
    cut = m.get("termination/max_tokens", 0.0)
    if episodes and cut / episodes >= 0.5:
        causes.append(
            f"{cut:.0f} of {episodes:.0f} episodes hit rollout.max_new_tokens before answering: raise it"
        )
    if group_size <= 4:
        causes.append(
            f"train.group_size={group_size} is small: equal rewards in a group are likely; raise it"
        )
    if not causes:
        across = ", though they differ across groups" if m.get("reward_std", 0.0) > 0.0 else ""
        causes.append(
            f"each group's rewards were equal within it{across} (zero_variance_groups in "
            "metrics.jsonl): the tasks are too easy or too hard for this policy at this train.group_size"
        )
    return causes


class IdleWatch:
    """Counts RL steps with no optimizer step; warns every ``every`` of them and in :meth:`summary`."""

    def __init__(self, group_size: int, every: int = 5) -> None:
        self.group_size = group_size
        self.every = every
        self.idle: list[int] = []
        self.steps = 0
        self._last: Mapping[str, float] = {}

    def observe(self, step: int, m: Mapping[str, float]) -> None:
        self.steps += 1
        if m.get("optimizer_steps", 0.0):
            return
        self.idle.append(step)
        self._last = m
        if len(self.idle) % self.every == 0:
            log.warning(self.message(running=True))

    def message(self, *, running: bool = False) -> str:
        when = "so far" if running else "in this run"
        causes = "; ".join(likely_causes(self._last, self.group_size))
        return (
            f"{len(self.idle)} of {self.steps} RL steps {when} trained nothing (0 optimizer steps). "
            f"Likely: {causes}"
        )

    def summary(self) -> str | None:
        """The end-of-run warning, or None when every step trained."""
        if not self.idle:
            return None
        text = self.message()
        log.warning(text)
        return text


__all__ = ["IdleWatch", "likely_causes"]
