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
from collections.abc import Sequence
from typing import Any

import torch

from flowgrpo.modeling.kvcache import cache_kwargs


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
            "output embeddings); flowgrpo.modeling.logprobs needs AutoModelForCausalLM-style models"
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
    share_prefix: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs, entropy)``, both ``(B, T)`` float32, nonzero only where ``loss_mask`` is 1.

    ``share_prefix``: rows whose prompts (the tokens before their first action) are identical -- the
    G episodes of a GRPO group -- run that prompt through the model once (see
    :func:`_shared_prefixes`); the result and its gradient are the same as the full pass.

    input_ids, attention_mask, loss_mask: ``(B, T)``, right padded. ``logprobs[b, t]`` is
    ``log p(input_ids[b, t] | input_ids[b, :t])`` (differentiable). ``entropy[b, t]`` is the entropy of
    the predictive distribution at that token, when ``with_entropy``: without gradient (a metric)
    unless ``entropy_grad`` (an entropy bonus in the loss). ``loss_mask[:, 0]`` must be 0 (the first token has no context).
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
        plan = _shared_prefixes(input_ids, loss_mask) if share_prefix else None
        if plan is None:
            hidden = backbone(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state  # (B, T, H)
            hidden = hidden[b_idx, t_idx]  # (N, H)
        else:
            hidden = _hidden_with_shared_prefixes(backbone, input_ids, attention_mask, plan)  # (B, S, H)
            hidden = hidden[b_idx, t_idx - plan.prefix_len[b_idx]]  # (N, H)
        pieces, ents = [], []
        for s in range(0, hidden.shape[0], chunk_size):
            logits = head(hidden[s : s + chunk_size]).float()  # (C, V)
            if temperature != 1.0:
                logits = logits / temperature
            tgt = targets[s : s + chunk_size]
            lse = torch.logsumexp(logits, dim=-1)  # (C,)
            pieces.append(logits.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) - lse)
            if with_entropy:
                with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                    p = torch.softmax(logits, dim=-1)
                    ents.append(lse - (p * logits).sum(-1))
    lp = torch.cat(pieces)  # (N,)
    out = out.index_put((b_idx, t_idx + 1), lp)
    if with_entropy:
        ent_out = ent_out.index_put((b_idx, t_idx + 1), torch.cat(ents))
    return out, ent_out


class _PrefixPlan:
    """Rows grouped by a shared prompt: ``group[b]`` indexes ``prefixes``; ``prefix_len[b]`` (B,) is how
    many leading tokens of row ``b`` the shared pass covers; the first ``root_len`` tokens are common
    to every prefix (0: no root pass)."""

    def __init__(
        self, prefixes: list[tuple[int, ...]], group: list[int], prefix_len: torch.Tensor, root_len: int = 0
    ) -> None:
        self.prefixes, self.group, self.prefix_len, self.root_len = prefixes, group, prefix_len, root_len


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all of ``seqs`` share."""
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for i in range(n):
        if any(s[i] != first[i] for s in seqs[1:]):
            return i
    return n


def _shared_prefixes(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, min_saving: float = 0.1, min_root: int = 16
):
    """Plan a shared-prefix pass, or None when it would save less than ``min_saving`` of the tokens.

    A row's prefix is its prompt minus the prompt's last token (that token's hidden state predicts
    the first action token, so it stays in the row's own pass). Rows with identical prefixes share
    one prefix pass; a row whose prefix is unique still gets its own (the cost is the same). When
    the distinct prefixes begin with the same ``>= min_root`` tokens -- every group of an agentic
    batch starts with the same system prompt and tool descriptions -- those run once for all of
    them (the root pass).
    """
    B, T = input_ids.shape
    first = loss_mask.float().argmax(-1).tolist()  # index of each row's first action token
    keys = [tuple(input_ids[b, : max(0, first[b] - 1)].tolist()) for b in range(B)]
    distinct: dict[tuple[int, ...], int] = {}
    group = [distinct.setdefault(k, len(distinct)) for k in keys]
    if min(len(k) for k in distinct) == 0:
        return None
    prefixes = list(distinct)
    root = common_prefix_len(prefixes) if len(prefixes) > 1 else 0
    root = root if root >= min_root else 0
    run = root + sum(len(k) - root for k in prefixes)  # prefix tokens the shared passes compute
    saved = sum(len(k) for k in keys) - run
    if (len(distinct) == B and root == 0) or saved < min_saving * B * T:
        return None
    lens = torch.tensor([len(k) for k in keys], device=input_ids.device)
    return _PrefixPlan(prefixes, group, lens, root)


def _select_rows(cache, index: torch.Tensor) -> None:
    """Keep rows ``index`` ``(B,)`` of every cache layer, as ``DynamicCache.batch_select_indices``
    does, but as a one-hot matmul: indexing with repeated rows back-propagates through an
    accumulating ``index_put`` whose CPU kernel adds the rows' gradients in a thread-dependent order,
    so two identical backward passes differed in the last bits (and whole runs parted from there).
    A matmul's sums have a fixed order, and its forward is exact (each output row is one input row
    times 1)."""
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        n = layer.keys.shape[0]
        onehot = torch.nn.functional.one_hot(index, n).to(layer.keys.dtype)  # (B, n)
        layer.keys = torch.einsum("bn,n...->b...", onehot, layer.keys)  # (B, heads, P, D)
        layer.values = torch.einsum("bn,n...->b...", onehot, layer.values)


def _hidden_with_shared_prefixes(backbone, input_ids, attention_mask, plan: _PrefixPlan) -> torch.Tensor:
    """Hidden states of every row's tokens after its prefix, ``(B, S)`` aligned at the prefix end.

    Pass 0 (when ``plan.root_len``) runs the tokens common to every prefix once and expands its
    keys/values to one row per distinct prefix. Pass 1 runs each distinct prefix (after the root)
    once, left-padded to P, keeping its keys/values (with their graph). The cache rows are expanded
    to one per row (:func:`_select_rows`: gradients of rows sharing a prefix add up, as they would in
    B separate passes, in a fixed order). Pass 2 runs every row's remaining tokens, right-padded to S, with explicit
    positions, attending to its prefix through the cache.
    """
    from transformers import DynamicCache

    dev = input_ids.device
    B, T = input_ids.shape
    R = plan.root_len
    U = len(plan.prefixes)
    P = max(len(p) for p in plan.prefixes)  # prefix columns: R root + (P - R) left-padded rest
    cache = DynamicCache()
    if R:
        root = torch.tensor([plan.prefixes[0][:R]], dtype=torch.long, device=dev)  # (1, R)
        backbone(input_ids=root, use_cache=True, **cache_kwargs(cache))
        _select_rows(cache, torch.zeros(U, dtype=torch.long, device=dev))  # (U, heads, R, D)
    pre_ids = torch.zeros((U, P - R), dtype=torch.long, device=dev)
    pre_mask = torch.zeros((U, P), dtype=torch.long, device=dev)
    pre_mask[:, :R] = 1
    pre_pos = torch.zeros((U, P - R), dtype=torch.long, device=dev)
    for u, p in enumerate(plan.prefixes):
        n = len(p) - R
        pre_ids[u, P - R - n :] = torch.tensor(p[R:], dtype=torch.long, device=dev)
        pre_mask[u, P - n :] = 1
        pre_pos[u, P - R - n :] = torch.arange(R, len(p), device=dev)
    backbone(
        input_ids=pre_ids,
        attention_mask=pre_mask,
        position_ids=pre_pos,
        use_cache=True,
        **cache_kwargs(cache),
    )
    _select_rows(cache, torch.tensor(plan.group, device=dev))  # (B, heads, P, D) per layer

    lens = attention_mask.sum(-1) if attention_mask is not None else torch.full((B,), T, device=dev)  # (B,)
    rest = lens - plan.prefix_len  # (B,) tokens after the prefix
    S = int(rest.max())
    ids = torch.zeros((B, S), dtype=torch.long, device=dev)
    mask = torch.zeros((B, P + S), dtype=torch.long, device=dev)
    mask[:, :R] = 1
    pos = torch.zeros((B, S), dtype=torch.long, device=dev)
    for b in range(B):
        n, r = int(plan.prefix_len[b]), int(rest[b])
        ids[b, :r] = input_ids[b, n : n + r]
        mask[b, P - (n - R) : P + r] = 1
        pos[b, :r] = torch.arange(n, n + r, device=dev)
    return backbone(
        input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **cache_kwargs(cache)
    ).last_hidden_state  # (B, S, H)


@torch.no_grad()
def reference_logprobs(ref_model: Any, input_ids, attention_mask, loss_mask, **kw) -> torch.Tensor:
    """Logprobs under the frozen reference model (no graph)."""
    return action_logprobs(ref_model, input_ids, attention_mask, loss_mask, **kw)[0]


__all__ = [
    "action_logprobs",
    "autocast_context",
    "common_prefix_len",
    "reference_logprobs",
    "split_model",
]
