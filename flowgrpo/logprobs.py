"""Log-probabilities of the sampled action tokens, without full-vocabulary logits.

A causal LM's ``forward`` returns ``(B, T, V)`` logits: with V = 49k (SmolLM2) and a packed episode
of 2k tokens that is 400 MB of fp32 per row, almost all of it for prompt and observation tokens that
are never trained on. Here the backbone runs once to hidden states ``(B, T, H)``; only the positions
that *predict* an action token (position ``t`` predicts token ``t + 1``) are gathered, and the LM head
plus a selective log-softmax (``logit[target] - logsumexp(logits)``) run over those ``N`` positions in
chunks of ``chunk_size``. Peak extra memory is ``chunk_size * V`` instead of ``B * T * V``; the backward
keeps only the chunks' logits.

``temperature`` divides the logits as the sampler did, so the trainer's logprobs and the sampler's
``action_logprobs`` are of the same distribution (top-p / top-k truncation is not modelled).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def split_model(model: Any) -> tuple[Any, Any]:
    """``(backbone, lm_head)`` of a Hugging Face causal LM (a PEFT wrapper is looked through; its
    adapters live inside the modules, so they stay active)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    prefix = getattr(inner, "base_model_prefix", "model")
    backbone = getattr(inner, prefix, None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if backbone is None or head is None:
        raise TypeError(
            f"{type(model).__name__} does not look like a transformers causal LM (no `{prefix}` backbone or "
            "output embeddings); flowgrpo.logprobs needs AutoModelForCausalLM-style models"
        )
    return backbone, head


def autocast_context(dtype: torch.dtype | str | None, device_type: str = "cpu"):
    """``torch.autocast`` for ``dtype`` (``"bfloat16"``/``"bf16"``/...), or a no-op for ``None``."""
    if dtype is None:
        return contextlib.nullcontext()
    if isinstance(dtype, str):
        dtype = {
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
            "float16": torch.float16,
            "fp16": torch.float16,
        }[dtype]
    return torch.autocast(device_type=device_type, dtype=dtype)


def action_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    loss_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | str | None = None,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs, entropy)``, both ``(B, T)`` float32, nonzero only where ``loss_mask`` is 1.

    input_ids, attention_mask, loss_mask: ``(B, T)``, right padded. ``logprobs[b, t]`` is
    ``log p(input_ids[b, t] | input_ids[b, :t])`` (differentiable). ``entropy[b, t]`` is the entropy of
    the predictive distribution at that token, computed without gradient (a metric), when
    ``with_entropy``. ``loss_mask[:, 0]`` must be 0 (the first token has no context).
    """
    B, T = input_ids.shape
    if loss_mask[:, 0].any():
        raise ValueError("loss_mask[:, 0] is set: the first token of a row has no context to score it from")
    backbone, head = split_model(model)
    device_type = input_ids.device.type
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None  # no padding: let attention take its causal fast path
    b_idx, t_idx = torch.nonzero(loss_mask[:, 1:] > 0, as_tuple=True)  # (N,), positions predicting targets
    targets = input_ids[b_idx, t_idx + 1]  # (N,)
    out = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
    ent_out = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device) if with_entropy else None
    if b_idx.numel() == 0:
        return out, ent_out
    with autocast_context(autocast_dtype, device_type):
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        hidden = hidden[b_idx, t_idx]  # (N, H)
        pieces, ents = [], []
        for s in range(0, hidden.shape[0], chunk_size):
            logits = head(hidden[s : s + chunk_size]).float()  # (C, V)
            if temperature != 1.0:
                logits = logits / temperature
            tgt = targets[s : s + chunk_size]
            lse = torch.logsumexp(logits, dim=-1)  # (C,)
            pieces.append(logits.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) - lse)
            if with_entropy:
                with torch.no_grad():
                    p = torch.softmax(logits, dim=-1)
                    ents.append(lse - (p * logits).sum(-1))
    lp = torch.cat(pieces)  # (N,)
    out = out.index_put((b_idx, t_idx + 1), lp)
    if with_entropy:
        ent_out = ent_out.index_put((b_idx, t_idx + 1), torch.cat(ents))
    return out, ent_out


@torch.no_grad()
def reference_logprobs(ref_model: Any, input_ids, attention_mask, loss_mask, **kw) -> torch.Tensor:
    """Logprobs under the frozen reference model (no graph)."""
    return action_logprobs(ref_model, input_ids, attention_mask, loss_mask, **kw)[0]


__all__ = [
    "action_logprobs",
    "autocast_context",
    "reference_logprobs",
    "split_model",
]
