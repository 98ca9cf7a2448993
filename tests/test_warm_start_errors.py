"""A warm start with no successful demonstration says why, not only "check the oracle"."""

from __future__ import annotations

import pytest

from flowgrpo.training.sft import WarmStartError, successful
from flowgrpo.types import Termination, Trajectory


def demo(i: int, end: Termination, reward: float = 0.0) -> Trajectory:
    return Trajectory(id=str(i), group_id="g", task_id=f"k{i}", env="e", termination=end, reward=reward)


def test_every_demonstration_cut_by_the_token_limit_is_named():
    with pytest.raises(WarmStartError, match=r"3 hit rollout\.max_new_tokens: raise it"):
        successful([demo(i, Termination.max_tokens) for i in range(3)])


def test_errors_are_quoted_and_successes_kept():
    bad = demo(0, Termination.error)
    bad.metadata["error"] = "ToolError: calculator refused"
    with pytest.raises(WarmStartError, match="calculator refused"):
        successful([bad])
    good = demo(1, Termination.finished, reward=1.0)
    assert successful([bad, good]) == [good]
