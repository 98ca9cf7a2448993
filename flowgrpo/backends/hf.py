"""The ``hf`` rollout backend: our own batched decode loop over a transformers causal LM.

Why not ``model.generate``: it keeps every row of the batch decoding until the longest row ends
(only ~37% of decoded slots were real tokens in TRL's GRPO at 32 x 128 here), and it returns
logprobs only through a second pass or a scores list. This loop

- left-pads the prompts and prefills once into a ``DynamicCache`` (explicit ``position_ids``
  from the attention mask, so left padding does not shift positions);
- samples every step from the *processed* distribution (temperature, then top-k, then top-p),
  and records the log-probability of the sampled token under exactly that distribution, from the
  same forward pass (no second pass);
- drops finished rows from the batch (``DynamicCache.batch_select_indices`` + index_select of
  the mask and positions), so the cost per step is proportional to the rows still decoding;
- runs in a worker thread (``asyncio.to_thread``) under ``torch.inference_mode`` with
  ``model.eval()``, restoring the training mode afterwards, so tools of other episodes make
  progress while the model computes;
- optionally computes under ``torch.autocast(dtype=bfloat16)`` over fp32 master weights
  (``autocast_dtype="bfloat16"``): training needs fp32 weights (pure-bf16 weights barely move
  under small learning rates), and autocast gives most of bf16's speed.

Temperature 0 means greedy decoding; the recorded logprob is then the log-probability of the
argmax under the *unscaled, unfiltered* distribution ``log_softmax(logits)`` (a temperature-0
distribution is a point mass with logprob 0, which would be useless for importance ratios).

Reproducibility: with ``params.seed`` set, sampling uses a private ``torch.Generator`` seeded
with it, so the same prompts, seed and weights give the same tokens (the batch composition is part
of the input: the same prompt in a different batch draws different random numbers).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from flowgrpo.backends.base import GenerationResult, SamplingParams


def _dtype(name: str | None):
    import torch

    if name is None:
        return None
    table = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if name not in table:
        raise ValueError(f"autocast_dtype must be one of {sorted(table)} or None, got {name!r}")
    return table[name]


def process_logits(logits, temperature: float, top_k: int, top_p: float):
    """Log-probabilities of the distribution we sample from. ``logits``: (B, V) float32.

    Order: temperature, top-k, top-p (the order of vLLM and HF's default processors). Filtered-out
    tokens get ``-inf``. Returns (B, V) log-probabilities (rows sum to 1 in probability).
    """
    import torch

    scores = logits / temperature if temperature != 1.0 else logits
    if top_k and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, idx = torch.sort(scores, dim=-1, descending=True)  # (B, V)
        probs = sorted_scores.softmax(-1)
        cum = probs.cumsum(-1)
        remove = (cum - probs) > top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_scores = sorted_scores.masked_fill(remove, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, idx, sorted_scores)
    return torch.log_softmax(scores, dim=-1)


class HFBackend:
    """A :class:`~flowgrpo.backends.base.RolloutBackend` over a transformers causal LM.

    Shares the trainer's model object, so :meth:`sync_weights` is a no-op. Calls are serialised by
    a lock (one model, one decode loop at a time).

    Args:
        model: a causal LM (fp32 master weights for training).
        tokenizer: its tokenizer (pad id, default stop id = eos).
        max_batch_size: the most prompts decoded together; larger calls are split.
        autocast_dtype: ``"bfloat16"`` / ``"float16"`` to decode under autocast, None for the
            weights' dtype.
        device: where to put inputs (default: the model's device).
    """

    per_prompt_max_new_tokens = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        autocast_dtype: str | None = None,
        device: Any = None,
    ) -> None:
        import torch

        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = int(max_batch_size)
        self.autocast_dtype = _dtype(autocast_dtype)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        eos = tokenizer.eos_token_id
        self.default_stop_ids: list[int] = [int(eos)] if eos is not None else []
        """Stop ids used when ``params.stop_token_ids`` is empty (the tokenizer's eos)."""
        self._lock = threading.Lock()
        self.stats = {"calls": 0, "decode_steps": 0, "decoded_slots": 0, "tokens": 0}

    def sync_weights(self, model: Any) -> None:
        """No-op when ``model`` is ours (shared object); otherwise adopt the new model object."""
        if model is not None and model is not self.model:
            self.model = model

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        """Sample a continuation of every prompt (token ids) in a worker thread.

        ``max_new_tokens`` optionally caps each prompt separately (the engine uses it to stay inside
        the context budget); ``params.max_new_tokens`` is the overall cap.
        """
        return await asyncio.to_thread(self.generate_sync, prompts, params, max_new_tokens=max_new_tokens)

    def generate_sync(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        """Blocking version of :meth:`generate`."""
        import torch

        if not prompts:
            return []
        limits = [params.max_new_tokens] * len(prompts)
        if max_new_tokens is not None:
            if len(max_new_tokens) != len(prompts):
                raise ValueError("max_new_tokens must have one entry per prompt")
            limits = [max(1, min(int(m), params.max_new_tokens)) for m in max_new_tokens]
        for p in prompts:
            if len(p) == 0:
                raise ValueError("empty prompt: every prompt needs at least one token")
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(int(params.seed))
        out: list[GenerationResult] = []
        with self._lock:
            was_training = self.model.training
            self.model.eval()
            try:
                for s in range(0, len(prompts), self.max_batch_size):
                    out += self._decode(
                        prompts[s : s + self.max_batch_size], limits[s : s + self.max_batch_size], params, gen
                    )
            finally:
                if was_training:
                    self.model.train()
        return out

    # ------------------------------------------------------------------------------------
    def _autocast(self):
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _decode(self, prompts, limits, params: SamplingParams, gen) -> list[GenerationResult]:
        import torch
        from transformers import DynamicCache

        B = len(prompts)
        T = max(len(p) for p in prompts)
        dev = self.device
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, T - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, T - len(p) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)  # (B, T)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        stop_ids = sorted(set(params.stop_token_ids)) or self.default_stop_ids
        stop = torch.tensor(stop_ids or [-1], dtype=torch.long, device=dev)
        limit_t = torch.tensor(limits, dtype=torch.long, device=dev)  # (B,)

        toks: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        reasons: list[str] = ["length"] * B
        alive = torch.arange(B, device=dev)  # (b,) original row index of each live row
        steps = 0
        cache = DynamicCache()
        with torch.inference_mode(), self._autocast():
            logits = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1, :]  # (B, V)
            next_pos = pos[:, -1:] + 1  # (b, 1)
            while True:
                logits = logits.float()
                if params.temperature == 0.0:
                    logp = torch.log_softmax(logits, dim=-1)  # (b, V)
                    tok = logp.argmax(-1)  # (b,)
                else:
                    logp = process_logits(logits, params.temperature, params.top_k, params.top_p)
                    tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)  # (b,)
                tok_lp = logp.gather(-1, tok[:, None]).squeeze(-1)  # (b,)
                steps += 1
                self.stats["decoded_slots"] += int(alive.numel())
                tok_l, lp_l, rows = tok.tolist(), tok_lp.tolist(), alive.tolist()
                for r, t, lp in zip(rows, tok_l, lp_l, strict=True):
                    toks[r].append(t)
                    lps[r].append(lp)
                hit_stop = torch.isin(tok, stop)  # (b,)
                hit_len = limit_t[alive] <= steps
                done = hit_stop | hit_len
                if bool(done.any()):
                    for r, s in zip(rows, hit_stop.tolist(), strict=True):
                        if s:
                            reasons[r] = "stop"
                    keep = (~done).nonzero().squeeze(-1)  # (b',)
                    if keep.numel() == 0:
                        break
                    cache.batch_select_indices(keep)
                    alive, tok, mask, next_pos = alive[keep], tok[keep], mask[keep], next_pos[keep]
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)  # (b, T + steps)
                logits = self.model(
                    input_ids=tok[:, None],
                    attention_mask=mask,
                    position_ids=next_pos,
                    past_key_values=cache,
                    use_cache=True,
                ).logits[:, -1, :]  # (b, V)
                next_pos = next_pos + 1
        self.stats["calls"] += 1
        self.stats["decode_steps"] += steps
        self.stats["tokens"] += sum(len(t) for t in toks)
        return [
            GenerationResult(token_ids=t, logprobs=lp, finish_reason=r)
            for t, lp, r in zip(toks, lps, reasons, strict=True)
        ]


__all__ = ["HFBackend", "process_logits"]
