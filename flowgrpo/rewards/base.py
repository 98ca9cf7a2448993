"""The reward contract and its composition.

- ``RewardFn``: ``(traj, task) -> float``; ``GroupRewardFn``: ``(group) -> list[float]`` (one value
  per trajectory).
- :class:`Reward`: base class of the built-in rewards (``score`` for one trajectory, or
  ``ascore_group`` for a group reward); calling it gives the protocols above.
- ``RewardSpec(name, weight=1.0, kwargs={})`` names one term; ``make_reward(name, **kwargs)`` builds
  a registered reward (``register_reward`` adds more).
- ``CompositeReward(specs).score_groups(groups)`` fills, for every trajectory,
  ``traj.reward_breakdown[name]`` (the unweighted value) and ``traj.reward`` (the weighted sum).
  ``await ascore_groups(groups)`` is the same inside an event loop; rewards that do I/O (the judge,
  code tests) run concurrently.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.aio import run_sync
from flowgrpo.types import Task, Trajectory, TrajectoryGroup


@runtime_checkable
class RewardFn(Protocol):
    def __call__(self, traj: Trajectory, task: Task) -> float: ...


@runtime_checkable
class GroupRewardFn(Protocol):
    def __call__(self, group: TrajectoryGroup) -> list[float]: ...


class RewardSpec(BaseModel):
    """One term of a composite reward: ``weight * make_reward(name, **kwargs)``."""

    model_config = ConfigDict(extra="forbid")
    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = Field(default_factory=dict)


def final_text(traj: Trajectory) -> str:
    """The content of the trajectory's last action ('' for an empty trajectory)."""
    msg = traj.final_message
    return msg.content if msg is not None else ""


def final_answer(traj: Trajectory, tag: str = "answer") -> str | None:
    """The final answer: the last complete answer tag of the last action."""
    from flowgrpo.parsing import extract_answer

    return extract_answer(final_text(traj), tag=tag)


class Reward:
    """Base class: subclasses implement ``score`` (one trajectory) or, for group rewards,
    ``ascore_group``. ``__call__`` gives the RewardFn / GroupRewardFn protocol."""

    per_group: ClassVar[bool] = False

    def score(self, traj: Trajectory, task: Task) -> float:
        raise NotImplementedError

    async def ascore(self, traj: Trajectory, task: Task) -> float:
        return self.score(traj, task)

    async def ascore_group(self, group: TrajectoryGroup) -> list[float]:
        return list(await asyncio.gather(*(self.ascore(t, group.task) for t in group.trajectories)))

    async def ascore_groups(self, groups: Sequence[TrajectoryGroup]) -> list[list[float]]:
        """Several groups at once (a reward may share a resource across them, e.g. a concurrency limit)."""
        return list(await asyncio.gather(*(self.ascore_group(g) for g in groups)))

    def __call__(self, *args: Any) -> Any:
        if self.per_group:
            (group,) = args
            return run_sync(self.ascore_group(group))
        traj, task = args
        return run_sync(self.ascore(traj, task))


_REWARDS: dict[str, Callable[..., Any]] = {}  # the built-ins are registered in flowgrpo/rewards/__init__.py


def register_reward(name: str, factory: Callable[..., Any]) -> None:
    """Register a reward factory: it returns a :class:`Reward`, a RewardFn or a GroupRewardFn."""
    _REWARDS[name] = factory


def list_rewards() -> list[str]:
    return sorted(_REWARDS)


def make_reward(name: str, **kwargs: Any) -> Any:
    if name not in _REWARDS:
        raise KeyError(
            f"unknown reward {name!r}; known: {', '.join(list_rewards())} (add one with register_reward)"
        )
    return _REWARDS[name](**kwargs)


def _is_group_fn(fn: Any) -> bool:
    """A :class:`Reward` says so with ``per_group``; a plain function is a group reward when it
    takes one argument (the group) and a per-trajectory reward when it takes two (traj, task)."""
    if isinstance(fn, Reward):
        return fn.per_group
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return False
    return len(params) == 1


async def _score_one_reward(fn: Any, groups: Sequence[TrajectoryGroup]) -> list[list[float]]:
    if isinstance(fn, Reward):
        return await fn.ascore_groups(groups)
    if _is_group_fn(fn):
        return [list(map(float, fn(g))) for g in groups]
    return [[float(fn(t, g.task)) for t in g.trajectories] for g in groups]


class CompositeReward:
    """A weighted sum of rewards: ``R = sum_k w_k r_k``; the unweighted parts go to
    ``Trajectory.reward_breakdown`` (so replay can re-weight without re-scoring).

    ``specs``: RewardSpec objects (or dicts). ``fns`` maps names to ready reward objects or plain
    functions, for rewards that need live objects (a model for ``diversity="policy"``, a client).
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec | Mapping[str, Any]],
        *,
        fns: Mapping[str, Any] | None = None,
    ) -> None:
        self.specs = [s if isinstance(s, RewardSpec) else RewardSpec.model_validate(s) for s in specs]
        if not self.specs:
            raise ValueError("CompositeReward needs at least one RewardSpec")
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"reward names must be unique in a composite, got {names}")
        fns = dict(fns or {})
        self.fns = {
            s.name: fns[s.name] if s.name in fns else make_reward(s.name, **s.kwargs) for s in self.specs
        }

    async def ascore_groups(self, groups: Sequence[TrajectoryGroup]) -> None:
        parts = await asyncio.gather(*(_score_one_reward(self.fns[s.name], groups) for s in self.specs))
        for spec, values in zip(self.specs, parts, strict=True):
            for g, vs in zip(groups, values, strict=True):
                if len(vs) != len(g.trajectories):
                    raise ValueError(
                        f"reward {spec.name!r} gave {len(vs)} values for {len(g.trajectories)} trajectories"
                    )
                for t, v in zip(g.trajectories, vs, strict=True):
                    if not math.isfinite(v):
                        raise ValueError(f"reward {spec.name!r} gave a non-finite value {v} for {t.id}")
                    t.reward_breakdown[spec.name] = float(v)
        for g in groups:
            for t in g.trajectories:
                t.reward = float(sum(s.weight * t.reward_breakdown[s.name] for s in self.specs))

    def score_groups(self, groups: Sequence[TrajectoryGroup]) -> None:
        run_sync(self.ascore_groups(groups))

    def __call__(self, group: TrajectoryGroup) -> list[float]:
        self.score_groups([group])
        return group.rewards
