"""Episode-level rules applied between scoring and advantages (formulas in ``docs/algorithms.md``).

- :func:`exclude_terminations` -- termination-aware groups: episodes that ended a given way (an
  environment or tool error, a context overflow...) are marked ``Trajectory.excluded`` and leave
  the update and their group's baseline.
- :func:`overlong_penalty` / :func:`apply_overlong_penalty` -- DAPO's soft overlong punishment
  (Yu et al. 2025, arXiv:2503.14476, eq. 13) over the action tokens of the whole trajectory.
- :func:`is_truncated` -- which episodes DAPO's overlong filtering (``mask_truncated``) keeps out of
  the loss.
- :func:`accuracy_of` -- whether an episode counts as correct, for metrics and the curriculum.

Pure functions of the data model; the trainer passes the configured values in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from flowgrpo.types import Termination, Trajectory, TrajectoryGroup

TRUNCATING: frozenset[Termination] = frozenset({Termination.max_tokens, Termination.context_overflow})
"""Terminations that cut an episode for length (the last action or the next prompt did not fit)."""


def accuracy_of(traj: Trajectory) -> float:
    """The ``accuracy`` reward when scored, else 1.0 for a positive outcome reward."""
    if "accuracy" in traj.reward_breakdown:
        return float(traj.reward_breakdown["accuracy"])
    return 1.0 if traj.reward > 0 else 0.0


def exclude_terminations(groups: Sequence[TrajectoryGroup], terminations: Iterable[Termination]) -> int:
    """Mark every not-yet-excluded episode whose termination is in ``terminations`` as excluded
    (``"termination:<name>"``); returns how many were marked."""
    which = frozenset(terminations)
    n = 0
    for g in groups:
        for t in g.trajectories:
            if t.excluded is None and t.termination in which:
                t.excluded = f"termination:{t.termination.value}"
                n += 1
    return n


def overlong_penalty(length: int, max_tokens: int, buffer_len: int) -> float:
    """DAPO's soft overlong punishment of a response of ``length`` tokens, in ``[-1, 0]``::

    0                                       length <= max_tokens - buffer_len
    (max_tokens - buffer_len - length) / buffer_len   inside the buffer
    -1                                      length > max_tokens
    """
    if buffer_len <= 0:
        return 0.0
    start = max_tokens - buffer_len
    if length <= start:
        return 0.0
    if length > max_tokens:
        return -1.0
    return (start - length) / buffer_len


def apply_overlong_penalty(
    groups: Sequence[TrajectoryGroup], *, max_tokens: int, buffer_len: int, factor: float = 1.0
) -> None:
    """Add ``factor * overlong_penalty(num_action_tokens, ...)`` to each episode's outcome reward
    (the whole trajectory's action tokens, not only its last turn) and record it as
    ``reward_breakdown["overlong"]``."""
    for g in groups:
        for t in g.trajectories:
            p = factor * overlong_penalty(t.num_action_tokens, max_tokens, buffer_len)
            t.reward_breakdown["overlong"] = p
            t.reward += p


def is_truncated(traj: Trajectory, max_tokens: int | None = None) -> bool:
    """Whether the episode was cut for length: it ended with ``max_tokens`` or ``context_overflow``,
    or its action tokens reached the trajectory budget ``max_tokens``."""
    if traj.termination in TRUNCATING:
        return True
    return max_tokens is not None and traj.num_action_tokens >= max_tokens


__all__ = ["TRUNCATING", "apply_overlong_penalty", "exclude_terminations", "is_truncated", "overlong_penalty"]
