"""The OpenAI ``logprobs`` / ``top_logprobs`` fields of a chat completion, computed for a local model.

``flowgrpo serve`` answers ``{"logprobs": true, "top_logprobs": k}`` with, for every generated
token, its log-probability and the ``k`` most likely tokens at that position (OpenAI's
``choices[i].logprobs.content`` format). Values are of the model's raw next-token distribution
(temperature 1, no top-p/top-k truncation), as OpenAI and vLLM report them. The verifier reward
(:mod:`flowgrpo.rewards.verifier`) reads P(Yes) and P(No) from the first position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from flowgrpo.modeling.logprobs import split_model


@torch.no_grad()
def top_logprobs_content(
    model: Any, tokenizer: Any, prompt_ids: Sequence[int], token_ids: Sequence[int], k: int
) -> list[dict[str, Any]]:
    """``[{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"} x k]}]``, one
    entry per generated token; one forward pass over prompt + generation, the LM head only at the
    generated positions."""
    if not token_ids:
        return []
    backbone, head = split_model(model)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(token_ids)], device=device)  # (1, P + N)
    hidden = backbone(input_ids=ids, use_cache=False).last_hidden_state[0]  # (P + N, H)
    start = len(prompt_ids) - 1  # the position that predicts the first generated token
    logp = torch.log_softmax(head(hidden[start : start + len(token_ids)]).float(), dim=-1)  # (N, V)
    top_v, top_i = logp.topk(min(k, logp.shape[-1]), dim=-1)  # (N, k)

    def entry(tid: int, lp: float) -> dict[str, Any]:
        text = tokenizer.decode([tid])
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8", "replace"))}

    out = []
    for n, tid in enumerate(token_ids):
        e = entry(int(tid), float(logp[n, tid]))
        e["top_logprobs"] = [entry(int(i), float(v)) for v, i in zip(top_v[n], top_i[n], strict=True)]
        out.append(e)
    return out


__all__ = ["top_logprobs_content"]
