"""Which training tasks a step draws: a uniform stream, a stream balanced over a metadata field,
or a curriculum that favours tasks the policy sometimes solves, and environment difficulty
scheduled by step.

A group whose G episodes all pass or all fail has equal rewards and gives no gradient under group
baselines (GRPO; DAPO's dynamic sampling drops such groups). The expected learning signal of a
task with pass rate ``p`` is largest at ``p = 1/2``: the variance of a Bernoulli outcome,
``p (1 - p)``, is the "learnability" Foster & Foerster (2025, *Learning to Reason at the Frontier of
Learnability*) sample by. :class:`PassRateSampler` keeps each task's recent pass rate and draws
tasks with weight ``max(p (1 - p), floor)``, unseen tasks at the maximum ``1/4``, so tasks with
``0 < p < 1`` are favoured and solved or hopeless ones still come back now and then.

A stratified stream (``curriculum.stratify_by``) gives every value of a task metadata field (e.g.
``hops``: 1- and 2-hop questions) an equal share of each step. With a handful of tasks per step a
uniform draw is often lopsided (6 tasks from a 50/50 mix hold 5 or 6 of one kind with probability
14/64 = 0.22), and one Adam step on such a batch moves the policy toward what that kind needs and
away from what the other needs: a seesaw between steps (docs/learning.md section 9.7).
``curriculum.stratify_weights`` sets other shares (``{1: 2, 2: 1}``: two 1-hop questions for every
2-hop one).

A paired stream (``curriculum.pair_by``) follows each task drawn with another training task that
has the same value of a metadata field, in the same step. ``multihop``'s ``first_hop`` pairs "In
which city was X born?" with "In which country was X born?": both start with the same search and
the same result, and differ in the next decision (answer the city, or search its country). Drawn
apart, a step holding only one of them pushes that shared decision one way for both, and the next
step pushes it back (docs/learning.md 10.5); drawn together, the part of the two groups' gradients
that does not depend on the question's wording pulls both ways at once, and what is left is the
part that reads the wording. Measured on the search agent (docs/learning.md 15): the pairs' pushes
do cancel, but other tasks that share the decision (other 2-hop chains) can still move it.

A difficulty schedule (``curriculum.difficulty``) rebuilds the environment with other keyword
arguments from a given step on (e.g. ``arithmetic``'s ``difficulty: 2`` after step 50); the task
list is the new environment's, the sampler's position and pass rates restart with it.

Every sampler's state (:meth:`state_dict`) goes into the trainer's checkpoints under ``stream``;
a resumed run draws exactly the tasks an uninterrupted one draws.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flowgrpo.algorithms.episodes import accuracy_of
from flowgrpo.types import Task, TrajectoryGroup

UNSEEN_WEIGHT = 0.25  # p (1 - p) at p = 1/2: a task never tried is treated as the most learnable


class DifficultyStage(BaseModel):
    """From ``from_step`` on (the step about to be trained, 0-based), the environment is built with
    ``env.kwargs`` updated by ``env_kwargs``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    from_step: int = Field(..., ge=0)
    env_kwargs: dict[str, Any] = Field(..., min_length=1)


class CurriculumConfig(BaseModel):
    """Task sampling (docs/algorithms.md, "Curriculum")."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    sampler: Literal["uniform", "pass_rate"] = Field(
        "uniform",
        description="uniform: every task once per reshuffled epoch; pass_rate: weight max(p(1-p), floor) "
        "by each task's recent pass rate p (unseen tasks 1/4)",
    )
    window: int = Field(8, ge=1, description="pass_rate: the most recent episodes per task that count")
    floor: float = Field(
        0.01, gt=0.0, le=UNSEEN_WEIGHT, description="pass_rate: the weight of a task with p = 0 or p = 1"
    )
    stratify_by: str | None = Field(
        None,
        description="uniform: a task metadata field (e.g. hops) whose values take turns in every step's "
        "draw, each value from its own reshuffled stream, so each step holds them in equal shares",
    )
    stratify_weights: dict[str, int] | None = Field(
        None,
        description="with stratify_by: each value's share of every step as a whole number, e.g. "
        "{1: 2, 2: 1} draws values 1, 2, 1, 1, 2, 1, ... (null: equal shares); every value of the "
        "field needs a weight",
    )
    pair_by: str | None = Field(
        None,
        description="a task metadata field (e.g. multihop's first_hop): each task drawn is followed in "
        "the same step by one other training task with the same value, picked at random, when there is "
        "one; tasks_per_step counts both",
    )
    difficulty: list[DifficultyStage] = Field(
        default_factory=list,
        description="stages [{from_step: N, env_kwargs: {...}}]: the environment's kwargs from step N on",
    )

    @field_validator("stratify_weights", mode="before")
    @classmethod
    def _weights_by_text(cls, v: Any) -> Any:
        """Metadata values are matched as text, so YAML's ``{1: 2}`` names the value ``"1"``."""
        return {str(k): w for k, w in v.items()} if isinstance(v, dict) else v

    @field_validator("stratify_weights")
    @classmethod
    def _weights_positive(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        if v is not None and (not v or min(v.values()) < 1):
            raise ValueError(
                f"curriculum.stratify_weights must give every value a whole number >= 1, got {v}: leave "
                "a kind out of training by filtering the environment's tasks, not with a weight of 0"
            )
        return v

    @model_validator(mode="after")
    def _stages_ordered(self) -> CurriculumConfig:
        steps = [s.from_step for s in self.difficulty]
        if steps != sorted(set(steps)):
            raise ValueError(
                f"curriculum.difficulty stages must have strictly increasing from_step, got {steps}: "
                "order them by step and give each step once"
            )
        if self.stratify_by is not None and self.sampler != "uniform":
            raise ValueError(
                f"curriculum.stratify_by balances the uniform stream; with curriculum.sampler={self.sampler} "
                "drop stratify_by, or set curriculum.sampler=uniform"
            )
        if self.stratify_weights is not None and self.stratify_by is None:
            raise ValueError(
                "curriculum.stratify_weights weighs the values of curriculum.stratify_by, which is not set: "
                "set stratify_by (e.g. curriculum.stratify_by=hops) or drop stratify_weights"
            )
        return self

    def stage_at(self, step: int) -> int:
        """Index of the stage in force at ``step`` (-1: before the first one, the plain ``env``)."""
        k = -1
        for i, s in enumerate(self.difficulty):
            if s.from_step <= step:
                k = i
        return k


class TaskSampler(Protocol):
    """Draws the tasks of each step; its state resumes exactly."""

    def next(self, n: int) -> list[Task]: ...
    def observe(self, groups: Sequence[TrajectoryGroup]) -> None: ...
    def set_tasks(self, tasks: Sequence[Task], stage: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, s: dict[str, Any]) -> None: ...


def _check(tasks: Sequence[Task]) -> list[Task]:
    if not tasks:
        raise ValueError("the environment returned no training tasks (env.tasks('train') is empty)")
    return list(tasks)


class TaskStream:
    """An endless stream over ``tasks``: shuffled with ``(seed, epoch)`` each pass; its state is
    ``(epoch, position, stage)`` so a resumed run draws the same tasks."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        self.tasks = _check(tasks)
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self.stage = -1
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            if self.pos >= len(self._order):
                self.epoch += 1
                self.pos = 0
                self._order = self._shuffle()
            out.append(self.tasks[self._order[self.pos]])
            self.pos += 1
        return out

    def observe(self, groups: Sequence[TrajectoryGroup]) -> None:
        """The uniform stream ignores outcomes."""

    def set_tasks(self, tasks: Sequence[Task], stage: int) -> None:
        """The task list of difficulty ``stage``; a new stage starts at epoch 0, position 0."""
        self.tasks = _check(tasks)
        if stage != self.stage:
            self.epoch, self.pos, self.stage = 0, 0, stage
        self._order = self._shuffle()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos, "stage": self.stage}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        if "epoch" not in s:
            raise ValueError(
                "the checkpoint's task stream is not a plain uniform one (curriculum.sampler=pass_rate, "
                "curriculum.stratify_by or curriculum.pair_by was set); resume it with the same "
                "curriculum.sampler, stratify_by and pair_by"
            )
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])
        self.stage = int(s.get("stage", -1))  # checkpoints from before difficulty schedules
        self._order = self._shuffle()


def stratum_of(value: Any) -> str:
    """A metadata value as the text that names its stratum: ``2`` -> ``"2"``, a list such as
    multihop's relation chain ``["born_city", "country"]`` -> ``"born_city > country"`` (the name
    ``curriculum.stratify_weights`` and ``benchmarks.by_task`` use for it)."""
    return " > ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def by_field(tasks: Sequence[Task], key: str, option: str) -> dict[str, list[Task]]:
    """``tasks`` grouped by the :func:`stratum_of` their ``metadata[key]``, in list order; every
    task must carry the field (the error names ``curriculum.<option>`` and the first that does not)."""
    groups: dict[str, list[Task]] = {}
    for t in _check(tasks):
        if key not in t.metadata:
            raise ValueError(
                f"curriculum.{option}={key!r}: training task {t.id!r} has no metadata field "
                f"{key!r} (it has {sorted(t.metadata)}); name a field every training task carries"
            )
        groups.setdefault(stratum_of(t.metadata[key]), []).append(t)
    return groups


def weighted_cycle(weights: Sequence[int]) -> list[int]:
    """One cycle of smooth weighted round-robin over indices ``0..V-1``: index ``i`` appears
    ``weights[i]`` times in ``sum(weights)`` draws, spread out rather than bunched, so a step shorter
    than the cycle still holds each value near its share. Equal weights give ``0, 1, ..., V-1``;
    ``(2, 1)`` gives ``0, 1, 0``. At each draw every index gains its weight, the largest total is
    drawn (ties to the lower index) and pays back the sum of the weights."""
    total = sum(weights)
    credit = [0] * len(weights)
    cycle = []
    for _ in range(total):
        credit = [c + w for c, w in zip(credit, weights, strict=True)]
        i = max(range(len(weights)), key=lambda j: (credit[j], -j))
        credit[i] -= total
        cycle.append(i)
    return cycle


class StratifiedStream:
    """An endless stream whose draws cycle through the values of ``task.metadata[key]``, each value
    from its own :class:`TaskStream` over its tasks (values sorted as text). With equal shares the
    k-th task drawn since the stage began comes from value ``k mod V``, so a step of ``n`` tasks holds
    every value ``floor(n / V)`` or ``ceil(n / V)`` times, whatever the mix of the task list; a value
    with fewer tasks comes round again sooner. ``weights`` (value -> whole number) gives value ``v``
    ``weights[v]`` of every ``sum(weights)`` draws instead (:func:`weighted_cycle`). Its state (draw
    count, stage, the cycle, one stream state per value) resumes exactly."""

    def __init__(
        self, tasks: Sequence[Task], seed: int, key: str, weights: dict[str, int] | None = None
    ) -> None:
        self.seed, self.key, self.weights = seed, key, weights
        self.drawn = 0
        self.stage = -1
        self._split(tasks)

    def _split(self, tasks: Sequence[Task]) -> None:
        strata = by_field(tasks, self.key, "stratify_by")
        self.values = sorted(strata)
        self.streams = [
            TaskStream(strata[v], self.seed * 1_000_003 + 7919 * i) for i, v in enumerate(self.values)
        ]
        if self.weights is not None and sorted(self.weights) != self.values:
            raise ValueError(
                f"curriculum.stratify_weights names the values {sorted(self.weights)}, but the training "
                f"tasks' {self.key!r} takes the values {self.values}: give each of those one weight"
            )
        shares = self.weights or dict.fromkeys(self.values, 1)
        self.cycle = weighted_cycle([shares[v] for v in self.values])

    def next(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            out += self.streams[self.cycle[self.drawn % len(self.cycle)]].next(1)
            self.drawn += 1
        return out

    def observe(self, groups: Sequence[TrajectoryGroup]) -> None:
        """The stratified stream ignores outcomes."""

    def set_tasks(self, tasks: Sequence[Task], stage: int) -> None:
        """The task list of difficulty ``stage``; a new stage starts every value's stream afresh."""
        kept = [s.state_dict() for s in self.streams] if stage == self.stage else None
        self._split(tasks)
        if kept is None or len(kept) != len(self.streams):
            self.stage, self.drawn = stage, 0
            return
        for stream, state in zip(self.streams, kept, strict=True):
            stream.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        return {
            "drawn": self.drawn,
            "stage": self.stage,
            "cycle": list(self.cycle),
            "strata": [s.state_dict() for s in self.streams],
        }

    def load_state_dict(self, s: dict[str, Any]) -> None:
        if "strata" not in s or len(s["strata"]) != len(self.streams):
            raise ValueError(
                f"the checkpoint's task stream is not stratified by {self.key!r} over {len(self.streams)} "
                "values; resume it with the same curriculum.sampler, curriculum.stratify_by and curriculum.pair_by"
            )
        cycle = [int(i) for i in s.get("cycle", range(len(self.streams)))]  # saved before weights: equal
        if cycle != self.cycle:
            raise ValueError(
                f"the checkpoint's task stream drew the values of {self.key!r} in the cycle {cycle}, this "
                f"config in {self.cycle}; resume it with the same curriculum.stratify_weights"
            )
        self.drawn, self.stage = int(s["drawn"]), int(s["stage"])
        for stream, state in zip(self.streams, s["strata"], strict=True):
            stream.load_state_dict(state)


class PairedStream:
    """Follows each task that ``base`` draws with a partner: another training task with the same
    value of ``task.metadata[key]`` (:func:`stratum_of`), not already in the step, picked by a
    generator seeded with ``(seed, number of anchors drawn)``. A task whose value no other task
    shares comes alone; a task ``base`` draws that is already in the step as a partner is passed
    over for the next one. ``next(n)`` returns exactly ``n`` tasks: a partner that would be the
    ``n+1``-th is left out. Its state (the base's state and the count) resumes exactly."""

    def __init__(self, base: TaskSampler, tasks: Sequence[Task], seed: int, key: str) -> None:
        self.base, self.seed, self.key = base, seed, key
        self.anchors = 0
        self._group(tasks)

    def _group(self, tasks: Sequence[Task]) -> None:
        self.tasks = _check(tasks)
        self.partners = by_field(self.tasks, self.key, "pair_by")

    def next(self, n: int) -> list[Task]:
        out: list[Task] = []
        while len(out) < n:
            taken = {t.id for t in out}
            for _ in range(len(self.tasks)):  # skip a task that came in the step as a partner
                (task,) = self.base.next(1)
                if task.id not in taken:
                    break
            rng = random.Random(self.seed * 1_000_003 + 104_729 * self.anchors)
            self.anchors += 1
            out.append(task)
            taken.add(task.id)
            free = [t for t in self.partners[stratum_of(task.metadata[self.key])] if t.id not in taken]
            if free and len(out) < n:
                out.append(rng.choice(free))
        return out

    def observe(self, groups: Sequence[TrajectoryGroup]) -> None:
        self.base.observe(groups)

    def set_tasks(self, tasks: Sequence[Task], stage: int) -> None:
        self.base.set_tasks(tasks, stage)
        self._group(tasks)

    def state_dict(self) -> dict[str, Any]:
        return {"paired": self.anchors, "base": self.base.state_dict()}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        if "paired" not in s:
            raise ValueError(
                f"the checkpoint's task stream is not paired by {self.key!r}; resume it with the same "
                "curriculum.pair_by"
            )
        self.anchors = int(s["paired"])
        self.base.load_state_dict(s["base"])


def pass_rate_weight(p: float | None, floor: float) -> float:
    """The sampling weight of a task with recent pass rate ``p`` (None: never tried)."""
    if p is None:
        return UNSEEN_WEIGHT
    return max(p * (1.0 - p), floor)


class PassRateSampler:
    """Draws ``n`` distinct tasks per call (all of them, then more, when ``n`` exceeds the list) with
    probability proportional to :func:`pass_rate_weight` of their recent pass rate.

    The pass rate of a task is the mean :func:`~flowgrpo.runs.metrics.accuracy_of` over its last
    ``window`` non-excluded episodes (:meth:`observe`). Weighted sampling without replacement uses
    Efraimidis & Spirakis's keys ``u^(1/w)`` (2006), with ``u`` from a generator seeded by
    ``(seed, draw number)``: the draws depend only on the state, never on the global RNG.
    """

    def __init__(self, tasks: Sequence[Task], seed: int, *, window: int = 8, floor: float = 0.01) -> None:
        self.tasks = _check(tasks)
        self.seed, self.window, self.floor = seed, window, floor
        self.draws = 0
        self.stage = -1
        self.history: dict[str, list[float]] = {}

    def pass_rate(self, task_id: str) -> float | None:
        h = self.history.get(task_id)
        return sum(h) / len(h) if h else None

    def weights(self) -> list[float]:
        return [pass_rate_weight(self.pass_rate(t.id), self.floor) for t in self.tasks]

    def next(self, n: int) -> list[Task]:
        rng = random.Random(self.seed * 1_000_003 + self.draws)
        self.draws += 1
        keys = [math.log(1.0 - rng.random()) / w for w in self.weights()]  # log(u) / w, u in (0, 1]
        ranked = sorted(range(len(self.tasks)), key=lambda i: keys[i], reverse=True)
        return [self.tasks[ranked[k % len(ranked)]] for k in range(n)]

    def observe(self, groups: Sequence[TrajectoryGroup]) -> None:
        for g in groups:
            for t in g.trajectories:
                if t.excluded is None:
                    h = self.history.setdefault(t.task_id or g.task.id, [])
                    h.append(accuracy_of(t))
                    del h[: -self.window]

    def set_tasks(self, tasks: Sequence[Task], stage: int) -> None:
        """The task list of difficulty ``stage``; a new stage forgets the pass rates (task ids of
        another difficulty name other problems)."""
        self.tasks = _check(tasks)
        if stage != self.stage:
            self.stage, self.history = stage, {}

    def state_dict(self) -> dict[str, Any]:
        return {"draws": self.draws, "stage": self.stage, "history": copy.deepcopy(self.history)}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        if "draws" not in s:
            raise ValueError(
                "the checkpoint's task stream is a uniform, stratified or paired one (curriculum.sampler="
                "uniform or curriculum.pair_by); resume it with the same curriculum.sampler, stratify_by and "
                "pair_by"
            )
        self.draws, self.stage = int(s["draws"]), int(s["stage"])
        self.history = {str(k): [float(x) for x in v] for k, v in s["history"].items()}


def make_sampler(cfg: CurriculumConfig, tasks: Sequence[Task], seed: int) -> TaskSampler:
    """The sampler ``curriculum.sampler`` names over ``tasks``, paired by ``curriculum.pair_by``."""
    base: TaskSampler
    if cfg.sampler == "pass_rate":
        base = PassRateSampler(tasks, seed, window=cfg.window, floor=cfg.floor)
    elif cfg.stratify_by is not None:
        base = StratifiedStream(tasks, seed, cfg.stratify_by, cfg.stratify_weights)
    else:
        base = TaskStream(tasks, seed)
    return base if cfg.pair_by is None else PairedStream(base, tasks, seed, cfg.pair_by)


__all__ = [
    "CurriculumConfig",
    "DifficultyStage",
    "PairedStream",
    "PassRateSampler",
    "StratifiedStream",
    "TaskSampler",
    "TaskStream",
    "make_sampler",
    "pass_rate_weight",
    "weighted_cycle",
]
