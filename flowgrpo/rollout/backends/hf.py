"""The ``hf`` rollout backend: our own continuous-batching decode loop over a transformers causal LM.

Why not ``model.generate``: it keeps every row of the batch decoding until the longest row ends
(only ~37% of decoded slots were real tokens in TRL's GRPO at 32 x 128 here), it cannot take new
prompts while it runs, it re-reads every prompt from scratch, and it returns logprobs only through
a second pass or a scores list. This backend instead runs one decode loop in a worker thread that

- **batches continuously** (the scheduling of Orca, Yu et al. 2022, and vLLM): every ``generate``
  call, from any number of concurrent episodes, queues its prompts; the loop admits queued prompts
  into the running batch between decode steps (up to ``max_batch_size`` rows) and drops a row the
  step it finishes. A row that stops early frees its slot for the next episode's turn at once,
  instead of idling until the longest row of its batch ends;
- **reuses the KV cache across turns** (prefix caching, as vLLM's automatic prefix caching): when
  a row finishes, the keys and values of the tokens it fed are kept, keyed by those tokens, in a
  byte-bounded LRU (:class:`PrefixCache`). The next turn of a multi-turn episode starts with exactly
  those tokens, so only the new suffix (the last sampled token, the observation and the next
  generation prompt) is prefilled, not the whole conversation again. Identical prompts admitted
  together (the G episodes of a GRPO group) are prefilled once, and so is the opening that distinct
  prompts admitted together share (the system prompt and tool descriptions of every task of a
  step, ``min_shared_root`` tokens or more). Cached states are dropped as soon
  as the weights change (an optimizer step bumps every parameter's version counter);
- lays each row out left-padded as ``[pad][cached prefix][pad][new suffix]`` with explicit
  ``position_ids`` and an attention mask over the holes, so rows of any history share one
  cache (a ``DynamicCache`` that appends in place, :mod:`flowgrpo.rollout.backends.decoding`); columns no
  live row uses are trimmed;
- samples every step from the *processed* distribution (temperature, then top-k, then top-p),
  and records the log-probability of the sampled token under exactly that distribution, from the
  same forward pass (no second pass);
- runs under ``torch.inference_mode`` through an eval-mode view of the model that shares its
  tensors (:func:`~flowgrpo.rollout.backends.decoding.decode_view`: the trainer's module keeps its training
  mode, and small-row matmuls take the layout this CPU's BLAS is fast at), off the event loop, so
  tools of other episodes make progress while the model computes;
- samples, with ``inference_dtype="bfloat16"``, from a bf16 inference copy of the policy, cast
  from the fp32 master weights whenever they change (once per optimizer step), as verl and
  vLLM-style engines do: training needs fp32 weights (pure-bf16 weights barely move under small
  learning rates), and a native bf16 forward has no per-op casts. ``autocast_dtype`` instead
  decodes the fp32 weights under ``torch.autocast``, which casts every weight at every op of every
  step: on a 2-core avx512_bf16 CPU ~80 ms per decode step at batch 16 against ~57 ms from the copy
  and ~100 ms in fp32 (:mod:`flowgrpo.modeling.hardware`);
- keeps the host out of a decode step: the whole batch is sampled at once (one inverse-CDF draw
  over ``(b, V)``, with every row's uniform from a counter-based generator on the device), and the
  step brings one small tensor to the host (each row's token, its logprob, and the two numbers the
  bookkeeping of finished rows needs), so a GPU is never waited on more than once per step.

Temperature 0 means greedy decoding; the recorded logprob is then the log-probability of the
argmax under the *unscaled, unfiltered* distribution ``log_softmax(logits)`` (a temperature-0
distribution is a point mass with logprob 0, which would be useless for importance ratios).

Reproducibility: every prompt samples from its own random stream (SplitMix64, Steele et al. 2014,
keyed by the prompt's seed and the position of the token), seeded from ``(params.seed, index of the
prompt in the call)`` when ``params.seed`` is set, else drawn from torch's global generator when the
call is queued. A prompt's tokens do not depend on which other prompts share its batch (up to float
rounding, which batch shapes can change). One call made
while no other call runs is fully deterministic. Concurrent calls are admitted in arrival order,
which depends on timing; the rollout engine's ``scheduling="lockstep"`` issues one call at a time,
in an order that timing cannot change, where bit-exact reruns matter.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

from flowgrpo.modeling.hardware import avoid_cudnn_attention
from flowgrpo.modeling.kvcache import cache_kwargs
from flowgrpo.modeling.logprobs import common_prefix_len
from flowgrpo.rollout.backends.base import BackendBase, GenerationResult, SamplingParams, prompt_limits
from flowgrpo.rollout.backends.decoding import GrowingCache, decode_view, refresh_view
from flowgrpo.utils import interrupt

_WORKERS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


@atexit.register
def _join_workers() -> None:
    """Let decode threads finish before the interpreter tears torch down: a daemon thread still
    inside a torch op at exit aborts the process ("terminate called without an active exception").
    A worker ends by itself once its queue is empty, which it is when every caller got its result."""
    for t in list(_WORKERS):
        t.join(timeout=10)


def _dtype(name: str | None, what: str):
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
        raise ValueError(f"{what} must be one of {sorted(table)} or None, got {name!r}")
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


KV = list[tuple[Any, Any]]
"""Per layer ``(keys, values)``; for one sequence each is (H, n, D), for a batch (B, H, W, D)."""


class PrefixCache:
    """Keys and values of finished sequences, keyed by the tokens they encode; LRU, byte-bounded.

    :meth:`take` finds the longest stored sequence that is a proper prefix of a new prompt and
    hands it out once per time it was stored (the request that continues it stores a longer one
    when it finishes). Identical sequences -- episodes of a group that happened to feed the same
    tokens -- share one copy, counted.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self._entries: OrderedDict[tuple[int, ...], list] = OrderedDict()  # tokens -> [kv, bytes, count]

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: tuple[int, ...], kv: KV) -> None:
        entry = self._entries.get(tokens)
        if entry is not None:
            entry[2] += 1
            self._entries.move_to_end(tokens)
            return
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if not tokens or size > self.max_bytes:
            return
        self._entries[tokens] = [kv, size, 1]
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, s, _) = self._entries.popitem(last=False)
            self.bytes -= s

    def take(self, prompt: Sequence[int]) -> tuple[int, KV] | None:
        """``(n, kv)`` for the longest stored ``prompt[:n]`` with ``n < len(prompt)``; else None."""
        best: tuple[int, ...] | None = None
        for toks in self._entries:
            n = len(toks)
            if n < len(prompt) and (best is None or n > len(best)) and tuple(prompt[:n]) == toks:
                best = toks
        if best is None:
            return None
        entry = self._entries[best]
        entry[2] -= 1
        if entry[2] == 0:
            del self._entries[best]
            self.bytes -= entry[1]
        return len(best), entry[0]

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


class _Request:
    """One prompt in flight: its settings, the seed of its random stream, and what it has sampled."""

    __slots__ = ("done", "key", "limit", "lps", "params", "prompt", "reason", "seed", "stop", "toks")

    def __init__(self, prompt, limit, params, stop, seed, done) -> None:
        self.prompt: list[int] = prompt
        self.limit: int = limit
        self.params: SamplingParams = params
        self.stop: frozenset[int] = stop
        self.key = (params.temperature, params.top_k, params.top_p)
        self.seed: int = seed  # in [0, 2**63)
        self.done: Callable[[GenerationResult | BaseException], None] = done
        self.toks: list[int] = []
        self.lps: list[float] = []
        self.reason = "length"

    def result(self) -> GenerationResult:
        return GenerationResult(token_ids=self.toks, logprobs=self.lps, finish_reason=self.reason)


class _Batch:
    """The running decode batch: rows, their shared left-padded KV cache, and next-token logits."""

    def __init__(self, rows, cache, mask, next_pos, seeds, logits) -> None:
        self.rows: list[_Request] = rows
        self.cache = cache
        self.mask = mask  # (b, W) 1 where the cache column holds a real token of that row
        self.next_pos = next_pos  # (b, 1) position id of each row's next token
        self.seeds = seeds  # (b,) int64 seed of each row's random stream
        self.logits = logits  # (b, V) logits of each row's next token


def _layers(cache) -> list:
    """The cache's layers. We always build a :class:`~flowgrpo.rollout.backends.decoding.GrowingCache`, so
    every layer holds (b, heads, W, D) keys/values that can be re-padded and merged."""
    return list(cache.layers)


class HFBackend(BackendBase):
    """A :class:`~flowgrpo.rollout.backends.base.RolloutBackend` over a transformers causal LM.

    Shares the trainer's model object, so :meth:`sync_weights` is a no-op (cached prefixes are
    invalidated automatically when the weights change in place).

    Args:
        model: a causal LM (fp32 master weights for training).
        tokenizer: its tokenizer (pad id, default stop id = eos).
        max_batch_size: the most rows decoded together; further prompts wait for a free slot.
        autocast_dtype: ``"bfloat16"`` / ``"float16"`` to decode the model's own weights under
            autocast; None for the weights' dtype.
        inference_dtype: ``"bfloat16"`` / ``"float16"`` to decode from an inference copy of the
            weights in that dtype, refreshed when the model's weights change; None to decode the
            model's own weights. Excludes ``autocast_dtype``.
        device: where to put inputs (default: the model's device).
        prefix_cache_mb: memory for keys/values kept across turns (0 turns prefix caching off).
        admit_wait_ms: when idle, how long to wait for more requests of a burst before prefilling.
        min_shared_root: distinct prompts admitted together that open with at least this many
            common tokens (a system prompt, tool descriptions) prefill that opening once.
    """

    continuous_batching = True
    """Concurrent ``generate`` calls share one running batch: the engine may submit each episode's
    turn as soon as it is ready instead of collecting a batch first."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        autocast_dtype: str | None = None,
        inference_dtype: str | None = None,
        device: Any = None,
        prefix_cache_mb: float = 1024,
        admit_wait_ms: float = 5.0,
        min_shared_root: int = 16,
    ) -> None:
        import torch

        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = int(max_batch_size)
        self.autocast_dtype = _dtype(autocast_dtype, "autocast_dtype")
        self.inference_dtype = _dtype(inference_dtype, "inference_dtype")
        if self.autocast_dtype is not None and self.inference_dtype is not None:
            raise ValueError(
                "an inference copy computes natively in its dtype: pass inference_dtype (sample from a "
                "low-precision copy) or autocast_dtype (sample the model's weights under autocast), not both"
            )
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        avoid_cudnn_attention(self.device)  # it re-plans at every decode length (3x slower bf16 decode)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        eos = tokenizer.eos_token_id
        self.default_stop_ids: list[int] = [int(eos)] if eos is not None else []
        """Stop ids used when ``params.stop_token_ids`` is empty (the tokenizer's eos)."""
        self.admit_wait_ms = float(admit_wait_ms)
        self.min_shared_root = int(min_shared_root)
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None
        self._weights_version: int | None = None
        self._view: Any = None
        self._view_of: Any = None
        self._view_version: int | None = None  # the weights version an inference copy holds
        self._queue: deque[_Request] = deque()
        self._cv = threading.Condition()
        self._worker: threading.Thread | None = None
        self.stats = {
            "calls": 0,
            "admissions": 0,  # prefill forwards (a batch of newly admitted prompts each)
            "decode_steps": 0,
            "decoded_slots": 0,  # rows x steps actually computed
            "tokens": 0,
            "prefill_tokens": 0,  # prompt tokens run through the model
            "prefix_hit_tokens": 0,  # prompt tokens whose keys/values came from the prefix cache
        }

    def sync_weights(self, model: Any, *, version: int | None = None) -> None:
        """Adopt ``model`` if it is a different object; cached prefixes are dropped either way, and an
        inference copy is refreshed before the next prompt is admitted. (Version counters alone do
        not see every update: a fused AdamW step writes the weights without bumping them.)"""
        with self._cv:
            if model is not None and model is not self.model:
                self.model = model
            if self.prefix_cache is not None:
                self.prefix_cache.clear()
            self._view_version = None

    def clear_prefix_cache(self) -> None:
        """Free the keys/values kept across turns (the engine calls this when a rollout ends)."""
        if self.prefix_cache is not None:
            with self._cv:
                self.prefix_cache.clear()

    # ------------------------------------------------------------------ public API
    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        """Sample a continuation of every prompt (token ids); the decoding runs in the worker thread.

        ``max_new_tokens`` optionally caps each prompt separately (the engine uses it to stay inside
        the context budget); ``params.max_new_tokens`` is the overall cap.
        """
        if not prompts:
            return []
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in prompts]

        def resolver(fut: asyncio.Future) -> Callable[[Any], None]:
            def done(res: Any) -> None:
                loop.call_soon_threadsafe(_settle, fut, res)

            return done

        self._enqueue(prompts, params, max_new_tokens, [resolver(f) for f in futures])
        return list(await asyncio.gather(*futures))

    def generate_sync(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        """Blocking version of :meth:`generate`."""
        if not prompts:
            return []
        results: list[Any] = [None] * len(prompts)
        left = [len(prompts)]
        finished = threading.Event()

        def slot(i: int) -> Callable[[Any], None]:
            def done(res: Any) -> None:
                results[i] = res
                left[0] -= 1
                if left[0] == 0:
                    finished.set()

            return done

        self._enqueue(prompts, params, max_new_tokens, [slot(i) for i in range(len(prompts))])
        finished.wait()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

    # ------------------------------------------------------------------ queue and worker
    def _enqueue(self, prompts, params: SamplingParams, max_new_tokens, callbacks) -> None:
        import torch

        limits = [max(1, m) for m in prompt_limits(params, len(prompts), max_new_tokens)]
        for p in prompts:
            if len(p) == 0:
                raise ValueError("empty prompt: every prompt needs at least one token")
        stop = frozenset(int(t) for t in params.stop_token_ids) or frozenset(self.default_stop_ids)
        if params.seed is not None:
            seeds = [(int(params.seed) * 0x9E3779B1 + i) % (2**63) for i in range(len(prompts))]
        else:
            seeds = torch.randint(0, 2**63 - 1, (len(prompts),)).tolist()
        reqs = [
            _Request([int(t) for t in p], lim, params, stop, seed, cb)
            for p, lim, seed, cb in zip(prompts, limits, seeds, callbacks, strict=True)
        ]
        with self._cv:
            self.stats["calls"] += 1
            self._queue.extend(reqs)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="flowgrpo-hf-decode", daemon=True)
                _WORKERS.add(self._worker)
                self._worker.start()
            self._cv.notify_all()

    def _take(self, batch: _Batch | None) -> list[_Request]:
        """Queued requests that may join ``batch`` now (same sampling settings, free slots)."""
        with self._cv:
            room = self.max_batch_size - (len(batch.rows) if batch is not None else 0)
            key = batch.rows[0].key if batch is not None else (self._queue[0].key if self._queue else None)
            taken: list[_Request] = []
            kept: deque[_Request] = deque()
            while self._queue:
                r = self._queue.popleft()
                (taken if len(taken) < room and r.key == key else kept).append(r)
            self._queue = kept
            return taken

    def _gather_burst(self) -> None:
        """Starting from idle, wait while requests keep arriving (each within ``admit_wait_ms`` of
        the last, for at most 10 windows), so a burst -- every episode's first turn -- is prefilled
        as one batch instead of one prompt and then the rest."""
        import time

        wait = self.admit_wait_ms / 1000
        with self._cv:
            deadline = time.monotonic() + 10 * wait
            n = len(self._queue)
            while 0 < n < self.max_batch_size and time.monotonic() < deadline:
                self._cv.wait(wait)
                if len(self._queue) == n:
                    break
                n = len(self._queue)

    def _work(self) -> None:
        import torch

        batch: _Batch | None = None
        try:
            with torch.inference_mode():
                while True:
                    if batch is None:
                        self._gather_burst()
                    new = self._take(batch)
                    if batch is None and not new:
                        with self._cv:
                            if not self._queue:
                                self._worker = None
                                return
                        continue
                    try:
                        interrupt.check()  # a signal stops generation within one forward pass
                        if new:
                            batch = self._admit(batch, new)
                        batch = self._step(batch)
                    except Exception as e:  # fail the unfinished rows of this batch; the loop goes on
                        failed = {id(r): r for r in (batch.rows if batch is not None else []) + new}
                        for r in failed.values():
                            r.done(e)
                        batch = None
        finally:
            with self._cv:
                if self._worker is threading.current_thread():
                    self._worker = None

    # ------------------------------------------------------------------ model work
    def _decoder(self) -> Any:
        """The module tree decode forwards run through: :func:`~flowgrpo.rollout.backends.decoding.decode_view`
        of the model (eval mode, skinny-matmul linears; the same tensors, or an inference copy in
        ``inference_dtype``). :meth:`_check_weights` drops it when the model object or any of its
        parameter objects is replaced, and refreshes a copy when the weights change in place."""
        if self._view is None:
            self._view = decode_view(self.model, self.inference_dtype)
            self._view_version = self._weights_version
        return self._view

    def _forward(self, **inputs):
        """One decode-view forward, under autocast when configured; returns the last position's
        logits (b, V)."""
        import torch

        model = self._decoder()
        if self.autocast_dtype is None:
            out = model(use_cache=True, **inputs)
        else:
            with torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype):
                out = model(use_cache=True, **inputs)
        return out.logits[:, -1, :]

    def _check_weights(self) -> None:
        params = list(self.model.parameters())
        identity = (id(self.model), *(id(p) for p in params))
        if identity != self._view_of:
            self._view, self._view_of = None, identity
        version = sum(p._version for p in params)
        if version != self._weights_version:
            if self.prefix_cache is not None:
                with self._cv:
                    self.prefix_cache.clear()
            self._weights_version = version
        with self._cv:  # sync_weights sets None: an update that fused AdamW hid from the counters
            stale, self._view_version = self._view_version != version, version
        if self._view is not None and self.inference_dtype is not None and stale:
            refresh_view(self._view, self.model)  # once per optimizer step

    def _admit(self, batch: _Batch | None, new: list[_Request]) -> _Batch:
        """Prefill ``new`` (the uncached suffix of each distinct prompt) and merge it into ``batch``."""
        import torch

        self._check_weights()
        dev = self.device
        distinct: dict[tuple[int, ...], int] = {}
        row_of = [distinct.setdefault(tuple(r.prompt), len(distinct)) for r in new]
        prompts = list(distinct)
        hits: list[tuple[int, KV] | None] = [None] * len(prompts)
        if self.prefix_cache is not None:
            with self._cv:
                hits = [self.prefix_cache.take(p) for p in prompts]
        root = 0
        if len(prompts) > 1 and not any(hits):
            root = min(common_prefix_len(prompts), min(map(len, prompts)) - 1)
            if root >= self.min_shared_root:  # prefill the opening all prompts share once
                hits = [(root, self._prefill(prompts[0][:root]))] * len(prompts)
            else:
                root = 0
        cached = [h[0] if h else 0 for h in hits]
        U, C = len(prompts), max(cached)
        S = max(len(p) - c for p, c in zip(prompts, cached, strict=True))
        # Left-padded uncached suffixes, their mask (cached columns + suffix) and positions, built as
        # Python lists and created on the model's device in one copy each.
        ids_l, mask_l, pos_l = [], [], []
        for p, c in zip(prompts, cached, strict=True):
            s = len(p) - c
            ids_l.append([self.pad_id] * (S - s) + list(p[c:]))
            mask_l.append([0] * (C - c) + [1] * c + [0] * (S - s) + [1] * s)
            pos_l.append([0] * (S - s) + list(range(c, c + s)))
        ids = torch.tensor(ids_l, dtype=torch.long, device=dev)  # (U, S)
        mask = torch.tensor(mask_l, dtype=torch.long, device=dev)  # (U, C + S)
        pos = torch.tensor(pos_l, dtype=torch.long, device=dev)  # (U, S)
        cache = GrowingCache()
        if C > 0:
            first = next(h[1] for h in hits if h)
            for layer, (k0, v0) in enumerate(first):
                H, D = k0.shape[0], k0.shape[-1]
                k = torch.zeros((U, H, C, D), dtype=k0.dtype, device=dev)  # (U, H, C, D)
                v = torch.zeros((U, H, C, v0.shape[-1]), dtype=v0.dtype, device=dev)
                for u, h in enumerate(hits):
                    if h:
                        k[u, :, C - h[0] :] = h[1][layer][0]
                        v[u, :, C - h[0] :] = h[1][layer][1]
                cache.update(k, v, layer)
        logits = self._forward(
            input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, **cache_kwargs(cache)
        )  # (U, V)
        self.stats["admissions"] += 1
        self.stats["prefill_tokens"] += root + sum(len(p) - c for p, c in zip(prompts, cached, strict=True))
        self.stats["prefix_hit_tokens"] += 0 if root else sum(cached[u] for u in row_of)
        if len(new) > U:  # expand the distinct prompts back to one row per request
            sel = torch.tensor(row_of, device=dev)
            cache.batch_select_indices(sel)
            mask, logits = mask[sel], logits[sel]
        next_pos = torch.tensor([[len(r.prompt)] for r in new], device=dev)  # (n, 1)
        seeds = torch.tensor([r.seed for r in new], dtype=torch.long, device=dev)  # (n,)
        fresh = _Batch(new, cache, mask, next_pos, seeds, logits)
        return fresh if batch is None else _merge(batch, fresh)

    def _prefill(self, tokens: Sequence[int]) -> KV:
        """Keys and values of one token sequence, per layer (H, n, D)."""
        import torch

        cache = GrowingCache()
        ids = torch.tensor([list(tokens)], device=self.device)  # (1, n)
        self._forward(input_ids=ids, logits_to_keep=1, **cache_kwargs(cache))
        return [(layer.keys[0], layer.values[0]) for layer in _layers(cache)]

    def _step(self, batch: _Batch) -> _Batch | None:
        """Sample one token for every row, retire finished rows, and run the next decode forward.

        One device-to-host transfer: a (4, b) float64 tensor of each row's token, its logprob, its
        number of real cache columns and its first real column (ids and counts are exact in
        float64). Everything else stays on the device or was already known to the host."""
        import torch

        logits = batch.logits.float()  # (b, V)
        rows = batch.rows
        p = rows[0].params
        if p.temperature == 0.0:
            logp = torch.log_softmax(logits, dim=-1)  # (b, V)
            tok = logp.argmax(-1)  # (b,)
        else:
            logp = process_logits(logits, p.temperature, p.top_k, p.top_p)  # (b, V)
            tok = _sample(logp, batch.seeds, batch.next_pos.squeeze(-1))  # (b,)
        tok_lp = logp.gather(-1, tok[:, None]).squeeze(-1)  # (b,)
        host = torch.stack(
            [tok.double(), tok_lp.double(), batch.mask.sum(-1).double(), batch.mask.argmax(-1).double()]
        ).tolist()  # (4, b): the step's only host sync
        self.stats["decode_steps"] += 1
        self.stats["decoded_slots"] += len(rows)
        keep: list[int] = []
        finished: list[int] = []
        for i, (r, t, lp) in enumerate(zip(rows, host[0], host[1], strict=True)):
            t = int(t)
            r.toks.append(t)
            r.lps.append(lp)
            if t in r.stop:
                r.reason = "stop"
                finished.append(i)
            elif len(r.toks) >= r.limit:
                finished.append(i)
            else:
                keep.append(i)
        for i in finished:
            self._retire(batch, i, int(host[2][i]))
        if not keep:
            return None
        if finished:
            sel = torch.tensor(keep, device=batch.mask.device)
            batch.cache.batch_select_indices(sel)
            batch.rows = [rows[i] for i in keep]
            batch.mask, batch.next_pos, batch.seeds, tok = (
                batch.mask[sel],
                batch.next_pos[sel],
                batch.seeds[sel],
                tok[sel],
            )
            _trim(batch, int(min(host[3][i] for i in keep)))
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(keep), 1))], dim=-1)  # (b, W + 1)
        batch.logits = self._forward(
            input_ids=tok[:, None],
            attention_mask=self._step_mask(batch.mask),
            position_ids=batch.next_pos,
            **cache_kwargs(batch.cache),
        )  # (b, V)
        batch.next_pos = batch.next_pos + 1
        return batch

    def _step_mask(self, mask):
        """The attention mask of a decode forward, from the (b, W) 0/1 column mask.

        With SDPA attention, the prepared 4D boolean mask (b, 1, 1, W) that transformers would build
        itself (for one query token, causality is only the padding): transformers passes a 4D mask
        through untouched, where from a 2D mask it first asks whether any column is padding, a host
        sync every step. Other attention implementations (eager adds the mask to the scores) get the
        2D mask."""
        if self._decoder().config._attn_implementation != "sdpa":
            return mask
        return mask[:, None, None, :].bool()  # (b, 1, 1, W)

    def _retire(self, batch: _Batch, i: int, n_cols: int) -> None:
        """Hand row ``i`` its result and keep its keys/values (the tokens it fed) for its next turn.
        ``n_cols``: how many of the row's cache columns hold real tokens (from the step's host copy)."""
        import torch

        r = batch.rows[i]
        self.stats["tokens"] += len(r.toks)
        if self.prefix_cache is not None:
            fed = tuple(r.prompt + r.toks[:-1])
            if n_cols == len(fed):
                # the row's real cache columns, in order, without a host sync (a stable sort puts
                # the mask's ones first; their count is known)
                cols = torch.argsort(batch.mask[i], descending=True, stable=True)[:n_cols]  # (n,)
                kv = [
                    (layer.keys[i].index_select(1, cols), layer.values[i].index_select(1, cols))
                    for layer in _layers(batch.cache)
                ]  # per layer (H, n, D)
                with self._cv:
                    self.prefix_cache.put(fed, kv)
        r.done(r.result())


_GAMMA = 0x9E3779B97F4A7C15 - 2**64  # SplitMix64's constants as signed int64 (torch has no uint64 maths)
_MIX1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX2 = 0x94D049BB133111EB - 2**64


def _shr(x, n: int):
    """Logical right shift of int64 ``x`` (torch's ``>>`` is arithmetic on signed integers)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def uniforms(seeds, counters):
    """One uniform in [0, 1) per row, float64 ``(b,)``: the ``counters[b]``-th output of the
    SplitMix64 stream seeded with ``seeds[b]`` (Steele, Lea and Flood 2014, "Fast splittable
    pseudorandom number generators"; Java's ``SplittableRandom``). ``seeds``, ``counters``: int64
    ``(b,)`` on any device.

    Counter-based, so the whole batch draws in a few elementwise ops on the device, with no
    per-row generator objects, launches or host syncs, and each row's draws depend only on its own
    seed and counter (never on its batch companions). int64 multiplication wraps modulo 2**64 as
    the unsigned arithmetic of the reference does.
    """
    z = seeds + (counters + 1) * _GAMMA
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 11).double() * 2.0**-53  # the top 53 bits


def _sample(logp, seeds, counters):
    """One token per row from ``exp(logp)`` (b, V) by inverse CDF: the row's uniform
    (:func:`uniforms` of its seed and counter, both ``(b,)`` int64) located in the row's cumulative
    distribution.

    Exact sampling like ``torch.multinomial``, at a fraction of its cost here: 0.5 ms against
    16 ms for 16 rows x 49k tokens, where a whole decode step of SmolLM2-135M takes ~85 ms.
    ``right=True`` never lands on a token of probability 0 (its CDF segment is empty).
    """
    import torch

    cdf = logp.exp().cumsum(-1)  # (b, V)
    # below 1 after rounding to the CDF's dtype, so u * total stays below the last CDF value
    u = (
        uniforms(seeds, counters).to(cdf.dtype).clamp_(max=1.0 - torch.finfo(cdf.dtype).eps)[:, None]
    )  # (b, 1)
    tok = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # (b, 1)
    return tok.clamp_(max=cdf.shape[-1] - 1).squeeze(-1)


def _settle(fut: asyncio.Future, res: Any) -> None:
    if fut.done():
        return
    if isinstance(res, BaseException):
        fut.set_exception(res)
    else:
        fut.set_result(res)


def _left_pad(x, width: int, dim: int):
    import torch.nn.functional as F

    extra = width - x.shape[dim]
    if extra == 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [extra, 0]
    return F.pad(x, pad)


def _merge(a: _Batch, b: _Batch) -> _Batch:
    """One batch from two: both left-padded to the wider cache, rows of ``a`` first."""
    import torch

    W = max(a.mask.shape[1], b.mask.shape[1])
    for la, lb in zip(_layers(a.cache), _layers(b.cache), strict=True):
        la.keys = torch.cat([_left_pad(la.keys, W, 2), _left_pad(lb.keys, W, 2)], dim=0)  # (b+n, H, W, D)
        la.values = torch.cat([_left_pad(la.values, W, 2), _left_pad(lb.values, W, 2)], dim=0)
    a.mask = torch.cat([_left_pad(a.mask, W, 1), _left_pad(b.mask, W, 1)], dim=0)  # (b+n, W)
    a.next_pos = torch.cat([a.next_pos, b.next_pos], dim=0)
    a.seeds = torch.cat([a.seeds, b.seeds], dim=0)
    a.logits = torch.cat([a.logits, b.logits], dim=0)
    a.rows = a.rows + b.rows
    return a


def _trim(batch: _Batch, start: int) -> None:
    """Drop the ``start`` leading cache columns, which no remaining row uses (left by retired long
    rows; the caller knows ``start`` from the step's host copy of each row's first real column)."""
    if start == 0:
        return
    batch.mask = batch.mask[:, start:]
    for layer in _layers(batch.cache):
        layer.keys = layer.keys[:, :, start:]
        layer.values = layer.values[:, :, start:]


__all__ = ["HFBackend", "PrefixCache", "process_logits", "uniforms"]
