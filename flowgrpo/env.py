"""Environments: multi-turn text episodes over tools.

CONTRACT (other modules rely on these names; extend, do not rename):
- ``Task`` (re-exported from flowgrpo.types): id, prompt, answer, metadata.
- ``StepResult``: observations (list[Message]), reward (per-turn shaping, default 0),
  terminated (the episode reached its end, e.g. a final answer), truncated (cut short by the env),
  info (dict).
- ``Environment`` protocol: ``name``; ``tools`` (Sequence[Tool]); ``parser`` (an ActionParser,
  which fixes the answer format); ``system_prompt`` (str, without tool descriptions: the chat layer
  renders those); ``async reset(task) -> list[Message]`` (the opening messages: system + user);
  ``async step(action: ParsedAction) -> StepResult``; ``tasks(split: "train" | "test") -> list[Task]``.
  One instance runs one episode at a time; the rollout makes one instance per concurrent episode.
- ``register(name, factory)``, ``make(name, **kw) -> Environment``, ``list_envs() -> list[str]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.tool import Tool
from flowgrpo.types import Message, ParsedAction, Task

Split = Literal["train", "test"]


class StepResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    observations: list[Message] = Field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    name: str
    tools: Sequence[Tool]
    parser: Any  # flowgrpo.parsing.ActionParser
    system_prompt: str

    async def reset(self, task: Task) -> list[Message]: ...

    async def step(self, action: ParsedAction) -> StepResult: ...

    def tasks(self, split: Split) -> list[Task]: ...


_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str, factory: Callable[..., Environment]) -> None:
    _REGISTRY[name] = factory


def make(name: str, **kwargs: Any) -> Environment:
    if name not in _REGISTRY:
        raise KeyError(f"unknown environment {name!r}; registered: {', '.join(list_envs()) or '(none)'}")
    return _REGISTRY[name](**kwargs)


def list_envs() -> list[str]:
    return sorted(_REGISTRY)


__all__ = ["Environment", "Split", "StepResult", "Task", "list_envs", "make", "register"]
