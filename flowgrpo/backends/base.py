"""The rollout backend protocol: token ids in, token ids + logprobs out.

CONTRACT (other modules rely on these names; extend, do not rename):
- ``SamplingParams``: temperature, top_p, top_k (0 = off), max_new_tokens, stop_token_ids, seed.
- ``GenerationResult``: token_ids (sampled, stop token included when it stopped on one),
  logprobs (one per sampled token, under the distribution actually sampled: after temperature and
  top-p/top-k), finish_reason ("stop" | "length").
- ``RolloutBackend`` protocol: ``async generate(prompts: Sequence[Sequence[int]], params) ->
  list[GenerationResult]`` (one result per prompt, same order); ``max_batch_size`` (int);
  ``sync_weights(model) -> None`` (push trainer weights; a no-op for a backend that shares the
  trainer's model object).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(256, ge=1)
    stop_token_ids: list[int] = Field(default_factory=list)
    seed: int | None = None


class GenerationResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


def prompt_limits(params: SamplingParams, n_prompts: int, max_new_tokens: Sequence[int] | None) -> list[int]:
    """Each prompt's token cap: its own ``max_new_tokens`` entry, never above ``params.max_new_tokens``."""
    if max_new_tokens is None:
        return [params.max_new_tokens] * n_prompts
    if len(max_new_tokens) != n_prompts:
        raise ValueError("max_new_tokens must have one entry per prompt")
    return [min(int(m), params.max_new_tokens) for m in max_new_tokens]


@runtime_checkable
class RolloutBackend(Protocol):
    max_batch_size: int

    async def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[GenerationResult]: ...

    def sync_weights(self, model: Any) -> None: ...
