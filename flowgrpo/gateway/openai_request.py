"""What ``flowgrpo serve`` does with an OpenAI request's parameters: each one is implemented or the
request is refused with a 400 naming it. A client must never get a 200 that silently ignored what it
asked for (a ``stream: true`` answered as one JSON body, a ``presence_penalty`` with no effect).

A parameter set to its neutral value (``stream: false``, ``presence_penalty: 0``, ``logit_bias: {}``,
``null``) asks for nothing and is accepted; ``user`` and ``model`` are metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

Endpoint = Literal["completions", "chat"]

_COMMON = frozenset(
    {
        "model",
        "user",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "n",
        "stop",
        "stop_token_ids",
        "skip_special_tokens",  # vLLM's: whether decoded text keeps special tokens (default true)
        "return_token_ids",  # vLLM's: every choice carries token_ids anyway
    }
)
IMPLEMENTED: dict[Endpoint, frozenset[str]] = {
    "completions": _COMMON | {"prompt", "logprobs", "return_tokens_as_token_ids"},
    "chat": _COMMON
    | {
        "messages",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "tools",  # rendered by the chat layer; tool_calls parsed by the environments' parser
        "tool_choice",  # "auto" or "none" (a forced call is refused by the server)
        "parallel_tool_calls",  # the calls the model writes are returned as written
        "metadata",  # task_id / episode_id / group_id of a recorded episode; otherwise metadata
    },
}
# Values that ask for nothing: the parameter may be present with them.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "stream": (False,),
    "echo": (False,),
    "best_of": (1,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logit_bias": ({},),
    "parallel_tool_calls": (False,),
    "tools": ([],),
    "suffix": ("",),
}


def unsupported_params(body: dict[str, Any], endpoint: Endpoint) -> list[str]:
    """Names of the parameters in ``body`` that ask for something this server does not do."""
    bad = []
    for key, value in body.items():
        if key in IMPLEMENTED[endpoint] or value is None:
            continue
        if key in NEUTRAL and any(value == v and type(value) is type(v) for v in NEUTRAL[key]):
            continue
        bad.append(key)
    return sorted(bad)


def unsupported_message(names: Sequence[str], endpoint: Endpoint) -> str:
    """The 400's message: what was refused and what is implemented."""
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    listed = ", ".join(repr(n) for n in names)
    return (
        f"unsupported parameter{'s' if len(names) > 1 else ''} {listed} for {path}: flowgrpo serve does not "
        f"implement {'them' if len(names) > 1 else 'it'}; remove {'them' if len(names) > 1 else 'it'} "
        f"(implemented: {', '.join(sorted(IMPLEMENTED[endpoint]))})"
    )


def stop_strings(body: dict[str, Any]) -> list[str]:
    """The request's ``stop`` as a list (OpenAI takes a string or up to 4 strings)."""
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise ValueError("'stop' must be a non-empty string or a list of up to 4 non-empty strings")
    return stop


def cut_at_stop(token_ids: Sequence[int], decode: Any, stops: Sequence[str]) -> tuple[int, str] | None:
    """Where a completion ends at its first stop string: ``(k, text)`` with ``k`` the number of
    tokens whose decoded text first contains a stop string and ``text`` the decoded text before it
    (the stop string itself is not returned, as in the OpenAI API); None when no stop string occurs.

    Generation is not cut short: the text is truncated after decoding, so a stop string spanning
    several tokens is found wherever the token boundaries fall.
    """
    if not stops:
        return None
    full = decode(list(token_ids))
    first = min((i for i in (full.find(s) for s in stops) if i >= 0), default=-1)
    if first < 0:
        return None
    for k in range(1, len(token_ids) + 1):  # the shortest token prefix whose text reaches the stop
        text = decode(list(token_ids[:k]))
        hit = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        if hit >= 0:
            return k, text[:hit]
    return len(token_ids), full[:first]


__all__ = [
    "IMPLEMENTED",
    "NEUTRAL",
    "cut_at_stop",
    "stop_strings",
    "unsupported_message",
    "unsupported_params",
]
