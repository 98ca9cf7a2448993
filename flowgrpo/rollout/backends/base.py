"""The rollout backend protocol: token ids in, token ids + logprobs out.

- ``SamplingParams``: temperature, top_p, top_k (0 = off), max_new_tokens, stop_token_ids, seed.
- ``GenerationResult``: token_ids (sampled, stop token included when it stopped on one),
  logprobs (one per sampled token, under the distribution actually sampled: after temperature and
  top-p/top-k), finish_reason ("stop" | "length").
- :class:`RolloutBackend`: everything the rollout engine, evaluation and the trainer use of a
  backend. :class:`BackendBase` gives the optional capabilities their defaults, so a new backend
  writes ``generate`` and states what it can do.
- The backend choice of a config (``rollout.backend: hf | openai | vllm``) and the settings of the
  non-default ones (:class:`ServerConfig`, :class:`VLLMConfig`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

BackendName = Literal["hf", "openai", "vllm"]


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
    policy_version: int | None = None
    """The version of the weights that sampled it, when the backend knows (a served policy reports
    it with every completion); None: the trainer's current policy."""


def prompt_limits(params: SamplingParams, n_prompts: int, max_new_tokens: Sequence[int] | None) -> list[int]:
    """Each prompt's token cap: its own ``max_new_tokens`` entry, never above ``params.max_new_tokens``."""
    if max_new_tokens is None:
        return [params.max_new_tokens] * n_prompts
    if len(max_new_tokens) != n_prompts:
        raise ValueError("max_new_tokens must have one entry per prompt")
    return [min(int(m), params.max_new_tokens) for m in max_new_tokens]


@runtime_checkable
class RolloutBackend(Protocol):
    """What callers use of a backend.

    - ``max_batch_size``: the most prompts the engine sends in one ``generate`` call.
    - ``continuous_batching``: concurrent ``generate`` calls join one running batch, so the engine
      may send each episode's turn the moment it is ready (else it collects a batch first).
    - ``generate``: one result per prompt, same order; ``max_new_tokens`` caps prompts one by one
      (the engine uses it to stay inside each episode's context budget), never above
      ``params.max_new_tokens``.
    - ``sync_weights(model, version=)``: the trainer calls it after every update so that the next
      rollout samples from the new policy (a no-op for a backend that shares the trainer's model
      object); ``version`` numbers that policy (the trainer's step count), and a backend that reports
      versions returns it as ``GenerationResult.policy_version`` for what the new weights sample.
    - ``clear_prefix_cache()``: the episodes of a rollout are over; free what was kept for them.
    """

    max_batch_size: int
    continuous_batching: bool

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationResult]: ...

    def sync_weights(self, model: Any, *, version: int | None = None) -> None: ...

    def clear_prefix_cache(self) -> None: ...


class BackendBase:
    """Defaults for the optional parts of :class:`RolloutBackend`: batches collected by the engine,
    no weights to sync, nothing cached between calls."""

    max_batch_size: int = 64
    continuous_batching: bool = False

    def sync_weights(self, model: Any, *, version: int | None = None) -> None:
        """Nothing to push: this backend samples from the trainer's model object itself."""

    def clear_prefix_cache(self) -> None:
        """Nothing is kept between calls."""


class ServerConfig(BaseModel):
    """An OpenAI-compatible server for ``rollout.backend: openai`` (``flowgrpo serve``, vLLM's
    ``vllm serve``); rollouts need token ids and logprobs back, which both return."""

    model_config = ConfigDict(extra="forbid")
    base_url: str | None = Field(None, description="e.g. http://127.0.0.1:8000/v1")
    model: str | None = Field(
        None, description="the name the server knows the policy by (default: model.name)"
    )
    api_key_env: str | None = Field(None, description="environment variable holding the API key")
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0)
    max_concurrency: int = Field(32, ge=1)
    weight_sync_dir: str | None = Field(
        None,
        description="push the trainer's weights to the server after every update through this directory "
        "(both must read it; flowgrpo serve's /v1/load_weights); null: the server keeps its own weights",
    )


class VLLMConfig(BaseModel):
    """The in-process vLLM engine of ``rollout.backend: vllm`` (GPU); weights are pushed into it
    after every update."""

    model_config = ConfigDict(extra="forbid")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    enforce_eager: bool = False
    max_model_len: int | None = Field(None, ge=16)
