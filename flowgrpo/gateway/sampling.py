"""From a request's body to what the backend samples, and back: the sampling settings it asks for,
its stop strings (applied to each result), the logprobs a chat request asks for, and the ``usage``
of the answer. A parameter that cannot be honoured is refused with a 400 that names it."""

from __future__ import annotations

from typing import Any

from flowgrpo.gateway.errors import BadRequest
from flowgrpo.gateway.openai_request import (
    Endpoint,
    cut_at_stop,
    stop_strings,
    unsupported_message,
    unsupported_params,
)
from flowgrpo.rollout.backends.base import GenerationResult, SamplingParams


def accepted_stops(body: dict[str, Any], endpoint: Endpoint) -> list[str]:
    """Refuse (400) a request that asks for something not implemented; return its stop strings."""
    names = unsupported_params(body, endpoint)
    if names:
        raise BadRequest(unsupported_message(names, endpoint), param=names[0])
    try:
        return stop_strings(body)
    except ValueError as e:
        raise BadRequest(str(e), param="stop") from e


def stopped(r: GenerationResult, decode: Any, stops: list[str]) -> tuple[GenerationResult, str]:
    """The result cut at its first stop string (finish reason ``stop``) and its text."""
    cut = cut_at_stop(r.token_ids, decode, stops)
    if cut is None:
        return r, decode(r.token_ids)
    k, text = cut
    update = {"token_ids": r.token_ids[:k], "logprobs": r.logprobs[:k], "finish_reason": "stop"}
    return r.model_copy(update=update), text


def sampling_params(body: dict[str, Any], default_stop: list[int]) -> SamplingParams:
    """The request's sampling settings (OpenAI names; vLLM's ``top_k`` and ``stop_token_ids``)."""
    try:
        n = int(body.get("n", 1))
        if not 1 <= n <= 64:
            raise ValueError("'n' must be from 1 to 64")
        return SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=max(0, int(body.get("top_k", 0) or 0)),
            max_new_tokens=int(body.get("max_tokens") or body.get("max_completion_tokens") or 16),
            stop_token_ids=list(body.get("stop_token_ids") or default_stop),
            seed=body.get("seed"),
        )
    except (ValueError, TypeError) as e:
        raise BadRequest(f"bad sampling parameters: {e}") from e


def chat_logprobs_k(body: dict[str, Any]) -> int | None:
    """``top_logprobs`` when the request asks for logprobs (None when it does not)."""
    k = body.get("top_logprobs")
    if k is not None and not body.get("logprobs"):
        raise BadRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    if not body.get("logprobs"):
        return None
    k = k or 0
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 20:
        raise BadRequest("'top_logprobs' must be an integer from 0 to 20", param="top_logprobs")
    return k


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


__all__ = ["accepted_stops", "chat_logprobs_k", "sampling_params", "stopped", "usage"]
