"""Fast paths for the decode loop of the ``hf`` backend. The first two compute the same numbers as
the plain path (up to float summation order) and hold no copy of the weights; the third is a
low-precision inference copy.

A decode step of a small model on a CPU feeds a handful of rows (one token each) through every
weight matrix. Profiled on SmolLM2-135M, 8 rows, 2 AVX2 cores (``benchmarks/rollout.py``): 76% of a
step is ``aten::mm`` and 7% is ``aten::cat``.

- **Skinny matmuls** (:class:`SkinnyLinear`, :func:`decode_view`). ``F.linear`` computes ``x @ W.T``
  for ``x`` (M, K) and ``W`` (N, K); with M = 8 MKL's kernel for that layout reaches ~28 GFLOP/s
  here (the 49k-row LM head: 16 ms), while the same product written ``(W @ x.T).T`` reaches ~57
  (8 ms). The difference is the BLAS layout, not the arithmetic: the transposed form streams ``W``
  row-major, as a matrix-vector product wants. :func:`decode_view` returns a second module tree over
  the *same* parameter tensors (no copy; optimizer steps are visible at once) in which every
  ``nn.Linear`` uses that form for at most ``max_rows`` rows without autograd; larger inputs and
  anything with gradients take ``F.linear`` as before.
- **A growing KV cache** (:class:`GrowingCache`). transformers' ``DynamicLayer`` appends a step's
  keys and values with ``torch.cat``, copying the whole cache of every layer every step
  (2 x 30 copies of ``(B, H, W, D)`` for SmolLM2). :class:`GrowingLayer` keeps spare columns
  after the live ones, so an append is an in-place write and a copy happens once per ``grow`` steps.
  The live part is exposed as ``keys`` / ``values`` views, and assigning either (the backend's
  re-padding, merging and row selection do) adopts the assigned tensor as the new buffer, so code
  written for ``DynamicLayer`` works unchanged.
- **An inference copy** (``decode_view(model, torch.bfloat16)``, :func:`refresh_view`): the
  weights cast once to bf16 after each optimizer step, so decode forwards run natively in bf16
  while training keeps fp32 master weights (verl and vLLM-style engines do the same). Measured at
  batch 16 on a 2-core avx512_bf16 EPYC: ~57 ms per decode step against ~100 ms in fp32 and ~80 ms
  under bf16 autocast, which casts every fp32 weight at every op (:mod:`flowgrpo.modeling.hardware`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer


class SkinnyLinear(nn.Linear):
    """``nn.Linear`` computing ``(W @ x.T).T`` for inputs of at most ``max_rows`` rows under no_grad
    (the layout this CPU's BLAS is fast at for skinny products); ``F.linear`` otherwise."""

    max_rows = 128

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        if rows == 0 or rows > self.max_rows or torch.is_grad_enabled() or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        out = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t()  # (rows, N), transposed strides
        if self.bias is not None:
            out = out + self.bias
        return out.contiguous().view(*x.shape[:-1], self.weight.shape[0])


def decode_view(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A module tree like ``model`` in eval mode, with each ``nn.Linear`` a :class:`SkinnyLinear`.

    ``dtype=None``: the view shares every parameter and buffer with ``model``. Modules are copied
    (a few hundred small Python objects), tensors are not: updating ``model``'s weights in place
    updates the view. Rebuild it when ``model`` is replaced by another object.

    ``dtype=torch.bfloat16`` (or another): an *inference copy*. Every floating parameter is cast
    once to ``dtype`` (tied parameters stay tied, buffers such as rotary frequencies stay shared),
    so a forward runs natively in ``dtype`` with no per-op casts of fp32 weights, as autocast would
    do. The copy does not follow ``model``: call :func:`refresh_view` after the weights change.
    """
    memo: dict[int, Any] = {id(t): t for t in model.buffers()}
    for p in model.parameters():
        if dtype is None or not p.is_floating_point():
            memo[id(p)] = p
        elif id(p) not in memo:
            memo[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=False)
    view = copy.deepcopy(model, memo)
    for m in view.modules():
        if type(m) is nn.Linear:
            m.__class__ = SkinnyLinear
    return view.eval()


@torch.inference_mode()  # the backend builds its copy under inference mode: inference tensors
def refresh_view(view: nn.Module, model: nn.Module) -> None:
    """Copy ``model``'s current weights into the inference copy ``view`` (a :func:`decode_view` with
    a ``dtype``), casting in place: one pass over the parameters (~15 ms for SmolLM2-135M on 2 CPU
    cores), once per optimizer step. Both trees list their parameters in the same order (the view
    is a deep copy; tied parameters are listed once in both)."""
    for c, p in zip(view.parameters(), model.parameters(), strict=True):
        if c is not p:
            c.copy_(p)


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values live in buffers with ``grow`` spare columns: appending a
    step writes in place instead of concatenating the whole cache."""

    grow = 64

    def __init__(self, **kwargs: Any) -> None:
        self._k: torch.Tensor | None = None  # (B, H, capacity, D)
        self._v: torch.Tensor | None = None
        self._nk = self._nv = 0  # live columns of each (equal after every update)
        super().__init__(**kwargs)

    @property
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]
        return None if self._k is None else self._k[:, :, : self._nk]

    @keys.setter
    def keys(self, t: torch.Tensor | None) -> None:
        self._k = t if t is not None and t.dim() == 4 else None
        self._nk = 0 if self._k is None else self._k.shape[2]

    @property
    def values(self) -> torch.Tensor | None:  # type: ignore[override]
        return None if self._v is None else self._v[:, :, : self._nv]

    @values.setter
    def values(self, t: torch.Tensor | None) -> None:
        self._v = t if t is not None and t.dim() == 4 else None
        self._nv = 0 if self._v is None else self._v.shape[2]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new, n = key_states.shape[2], self._nk
        if self._k is None or self._v is None:
            self._k, self._v = self._alloc(key_states, new), self._alloc(value_states, new)
        elif n + new > min(self._k.shape[2], self._v.shape[2]):
            k, v = self._alloc(key_states, n + new), self._alloc(value_states, n + new)
            k[:, :, :n] = self._k[:, :, :n]
            v[:, :, :n] = self._v[:, :, :n]
            self._k, self._v = k, v
        self._k[:, :, n : n + new] = key_states
        self._v[:, :, n : n + new] = value_states
        self._nk = self._nv = n + new
        return self.keys, self.values

    def _alloc(self, like: torch.Tensor, columns: int) -> torch.Tensor:
        B, H, _, D = like.shape
        return torch.empty((B, H, columns + self.grow, D), dtype=like.dtype, device=like.device)

    def get_seq_length(self) -> int:
        return self._nk


class GrowingCache(DynamicCache):
    """A config-less ``DynamicCache`` made of :class:`GrowingLayer` s."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowingLayer


__all__ = ["GrowingCache", "GrowingLayer", "SkinnyLinear", "decode_view", "refresh_view"]
