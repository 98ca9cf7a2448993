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

A failing reward never kills a run. A reward that raises, returns :class:`Missing` (or ``None``),
or returns something that is not a finite number (a string, a 5000-digit integer, NaN) leaves that
episode without a reward: :class:`CompositeReward` sets ``traj.excluded = "reward:<name>: <why>"``,
so the episode leaves its group's baseline and the update (:mod:`flowgrpo.algorithms.advantages`), and the
step's metrics count it (``episodes_excluded``, ``excluded/reward``). A group reward that raises
marks its whole group.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.types import Task, Trajectory, TrajectoryGroup
from flowgrpo.utils.aio import run_sync
from flowgrpo.utils.plugins import build as build_plugin
from flowgrpo.utils.plugins import is_spec, load_object

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Missing:
    """No reward for this episode (a failed judge call, an unreadable verifier reply), and why.
    A reward returns it instead of a number; the episode is then excluded from training."""

    reason: str


Score = float | Missing


@runtime_checkable
class RewardFn(Protocol):
    def __call__(self, traj: Trajectory, task: Task) -> float: ...


@runtime_checkable
class GroupRewardFn(Protocol):
    def __call__(self, group: TrajectoryGroup) -> list[float]: ...


class UnknownRewardError(KeyError):
    """A reward name that is neither registered, declared by an entry point, nor ``module:attr``;
    the message lists the known ones."""

    def __str__(self) -> str:  # KeyError quotes its argument
        return str(self.args[0])


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
    from flowgrpo.chat.parsing import extract_answer

    return extract_answer(final_text(traj), tag=tag)


class Reward:
    """Base class: subclasses implement ``score`` (one trajectory) or, for group rewards,
    ``ascore_group``. ``__call__`` gives the RewardFn / GroupRewardFn protocol."""

    per_group: ClassVar[bool] = False

    def score(self, traj: Trajectory, task: Task) -> float:
        raise NotImplementedError

    async def ascore(self, traj: Trajectory, task: Task) -> float:
        return self.score(traj, task)

    async def ascore_group(self, group: TrajectoryGroup) -> list[Score]:
        """Every trajectory of ``group``; one that raises gets :class:`Missing`, the others their score."""
        out = await asyncio.gather(
            *(self.ascore(t, group.task) for t in group.trajectories), return_exceptions=True
        )
        return [_missing_from(r) if isinstance(r, BaseException) else r for r in out]

    async def ascore_groups(self, groups: Sequence[TrajectoryGroup]) -> list[list[float]]:
        """Several groups at once (a reward may share a resource across them, e.g. a concurrency limit)."""
        return list(await asyncio.gather(*(self.ascore_group(g) for g in groups)))

    def __call__(self, *args: Any) -> Any:
        if self.per_group:
            (group,) = args
            return run_sync(self.ascore_group(group))
        traj, task = args
        return run_sync(self.ascore(traj, task))


ENTRY_POINT_GROUP = "flowgrpo.rewards"
_REWARDS: dict[str, Callable[..., Any]] = {}  # the built-ins are registered in flowgrpo/rewards/__init__.py
_PLACES_MODEL: set[str] = set()  # rewards whose factory takes ``device=`` for a model of its own


def register_reward(name: str, factory: Callable[..., Any], *, places_model: bool = False) -> None:
    """Register a reward factory: it returns a :class:`Reward`, a RewardFn or a GroupRewardFn.

    ``places_model``: the factory loads a model of its own and takes ``device=`` (a setting for
    :func:`flowgrpo.modeling.hardware.resolve_device`); :func:`make_reward` then gives it the policy's device
    unless the spec names one, so a verifier never runs on the CPU beside a policy on a GPU."""
    _REWARDS[name] = factory
    if places_model:
        _PLACES_MODEL.add(name)
    else:
        _PLACES_MODEL.discard(name)


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def list_rewards() -> list[str]:
    """Registered rewards and those of installed packages (entry-point group ``flowgrpo.rewards``)."""
    return sorted(set(_REWARDS) | set(_entry_points()))


def make_reward(name: str, *, default_device: str | None = None, **kwargs: Any) -> Any:
    """The reward registered as ``name``, declared by an entry point, or named ``module:attr`` /
    ``path/to/file.py:attr``: a factory (a Reward class, a function of keyword arguments) is called
    with ``kwargs``; a reward function of ``(traj, task)`` or ``(group)`` is used as it is.
    ``default_device``: the ``device=`` of a reward registered with ``places_model`` whose
    ``kwargs`` name none (the build step passes the policy's)."""
    if name in _REWARDS:
        if name in _PLACES_MODEL and default_device is not None and "device" not in kwargs:
            kwargs = {**kwargs, "device": default_device}
        return _REWARDS[name](**kwargs)
    if is_spec(name):
        return build_plugin(load_object(name), kwargs, what="reward", name=name)
    ep = _entry_points().get(name)
    if ep is None:
        raise UnknownRewardError(
            f"unknown reward {name!r}; known: {', '.join(list_rewards())} (add one with register_reward, "
            f'the entry-point group "{ENTRY_POINT_GROUP}", or name it as module:attr or path/to/file.py:attr)'
        )
    return build_plugin(ep.load(), kwargs, what="reward", name=name)


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


def _missing_from(e: BaseException) -> Missing:
    if not isinstance(e, Exception):  # cancellation, KeyboardInterrupt: not a reward failure
        raise e
    return Missing(f"{type(e).__name__}: {e}"[:300])


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:
        return _missing_from(e)


async def _score_one_reward(fn: Any, groups: Sequence[TrajectoryGroup]) -> list[list[Any]]:
    """Raw values (numbers, :class:`Missing`, or anything a user function returned) per trajectory;
    never raises for a reward's own failure."""
    if isinstance(fn, Reward):
        try:
            return await fn.ascore_groups(groups)
        except Exception:  # one failing group must not cost the others their scores
            out = await asyncio.gather(*(fn.ascore_group(g) for g in groups), return_exceptions=True)
            return [
                [_missing_from(r)] * len(g.trajectories) if isinstance(r, BaseException) else r
                for g, r in zip(groups, out, strict=True)
            ]
    if _is_group_fn(fn):
        out = [_call(fn, g) for g in groups]
        return [
            [r] * len(g.trajectories) if isinstance(r, Missing) else r
            for g, r in zip(groups, out, strict=True)
        ]
    return [[_call(fn, t, g.task) for t in g.trajectories] for g in groups]


def _short_repr(value: Any) -> str:
    """``type value`` cut to 40 characters; a huge integer is described, not printed (``repr`` of
    one over 4300 digits raises)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"int of {value.bit_length()} bits"
    try:
        return f"{type(value).__name__} {repr(value)[:40]}"
    except Exception:
        return type(value).__name__


def as_score(value: Any) -> Score:
    """A reward's return value as a finite float, or :class:`Missing` saying why it is not one."""
    if isinstance(value, Missing):
        return value
    if value is None:
        return Missing("returned None")
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError) as e:
        return Missing(f"not a number ({_short_repr(value)}: {type(e).__name__})")
    if not math.isfinite(x):
        return Missing(f"non-finite value {x}")
    return x


class CompositeReward:
    """A weighted sum of rewards: ``R = sum_k w_k r_k``; the unweighted parts go to
    ``Trajectory.reward_breakdown`` (so replay can re-weight without re-scoring).

    ``specs``: RewardSpec objects (or dicts). ``fns`` maps names to ready reward objects or plain
    functions, for rewards that need live objects (a model for ``diversity="policy"``, a client).
    ``device``: where rewards that load a model of their own put it, unless their spec names a
    ``device`` (the build step passes the policy's; None: their own default, ``auto``).
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec | Mapping[str, Any]],
        *,
        fns: Mapping[str, Any] | None = None,
        device: str | None = None,
    ) -> None:
        self.specs = [s if isinstance(s, RewardSpec) else RewardSpec.model_validate(s) for s in specs]
        if not self.specs:
            raise ValueError("CompositeReward needs at least one RewardSpec")
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"reward names must be unique in a composite, got {names}")
        fns = dict(fns or {})
        self.fns = {
            s.name: fns[s.name] if s.name in fns else make_reward(s.name, default_device=device, **s.kwargs)
            for s in self.specs
        }

    async def ascore_groups(self, groups: Sequence[TrajectoryGroup]) -> None:
        """Score every trajectory; one whose reward failed is excluded (``traj.excluded``), with
        the parts that did score kept in its breakdown and ``traj.reward`` 0."""
        parts = await asyncio.gather(*(_score_one_reward(self.fns[s.name], groups) for s in self.specs))
        failed = 0
        for spec, values in zip(self.specs, parts, strict=True):
            for g, vs in zip(groups, values, strict=True):
                if not isinstance(vs, list) or len(vs) != len(g.trajectories):
                    n = len(vs) if isinstance(vs, list) else type(vs).__name__
                    vs = [Missing(f"gave {n} values for {len(g.trajectories)} trajectories")] * len(
                        g.trajectories
                    )
                for t, v in zip(g.trajectories, vs, strict=True):
                    score = as_score(v)
                    if isinstance(score, Missing):
                        failed += 1
                        if t.excluded is None:
                            t.excluded = f"reward:{spec.name}: {score.reason}"
                        log.warning("reward %r has no value for %s: %s", spec.name, t.id, score.reason)
                        continue
                    t.reward_breakdown[spec.name] = score
        for g in groups:
            for t in g.trajectories:
                if all(s.name in t.reward_breakdown for s in self.specs):
                    t.reward = float(sum(s.weight * t.reward_breakdown[s.name] for s in self.specs))
                else:
                    t.reward = 0.0
        if failed:
            log.warning(
                "%d reward value(s) missing this batch: those episodes are excluded from training", failed
            )

    def score_groups(self, groups: Sequence[TrajectoryGroup]) -> None:
        run_sync(self.ascore_groups(groups))

    def __call__(self, group: TrajectoryGroup) -> list[float]:
        self.score_groups([group])
        return group.rewards
