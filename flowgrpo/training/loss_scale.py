"""Dynamic loss scaling for float16 autocast.

fp16 keeps 10 mantissa bits (bf16: 7) but only 5 exponent bits: its smallest subnormal is 6e-8.
An RL loss is a token-weighted mean over thousands of action tokens, so the gradient that reaches
each fp16 activation is often smaller than that and rounds to zero. The backward then silently
trains on a fraction of the batch. Mixed-precision training (Micikevicius et al. 2018, "Mixed
Precision Training", arXiv 1710.03740) multiplies the loss by a scale ``S`` before the backward and
divides the fp32 gradients by ``S`` before they are used. When a gradient overflows (inf or NaN),
the optimizer step is skipped and ``S`` halves; after ``growth_interval`` clean steps in a row, it
doubles. Qi et al. 2025 ("Defeating the Training-Inference Mismatch via FP16", arXiv 2510.26788) run
RL this way in fp16.

The trainer already owns what ``torch.amp.GradScaler`` would add on top: the finite check agreed
across ranks, gradient clipping and the skipped-step count. So this class keeps only the scale and
its schedule. It is a no-op (scale 1) unless the update runs under float16 autocast. bf16 has fp32's
exponent range and needs no scaling.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

INIT_SCALE = 2.0**16
"""torch.amp.GradScaler's initial scale: large enough that the smallest gradients survive."""
GROWTH_INTERVAL = 2000
"""Clean steps before the scale doubles again (torch.amp.GradScaler's default)."""


class DynamicLossScale:
    """The loss scale of one optimizer's updates.

    Use: ``scale(loss).backward()`` for each micro-batch; then, once the gradients are summed,
    ``unscale_(params)``; then ``update(found_inf)`` with whether any gradient was non-finite (the
    caller skips that optimizer step).
    """

    def __init__(
        self, enabled: bool, *, init_scale: float = INIT_SCALE, growth_interval: int = GROWTH_INTERVAL
    ) -> None:
        if init_scale <= 0 or growth_interval < 1:
            raise ValueError(
                f"init_scale must be > 0 and growth_interval >= 1, got {init_scale}, {growth_interval}"
            )
        self.enabled = enabled
        self.scale_value = init_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self.clean_steps = 0  # since the last change of the scale
        self.overflows = 0  # optimizer steps skipped for an overflow, over the whole run

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value if self.enabled else loss

    @torch.no_grad()
    def unscale_(self, params: Iterable[torch.Tensor]) -> None:
        """Divide the accumulated gradients by the scale, in place (fp32 master gradients)."""
        if not self.enabled:
            return
        inv = 1.0 / self.scale_value
        for p in params:
            if p.grad is not None:
                p.grad.mul_(inv)

    def update(self, found_inf: bool) -> None:
        """After each optimizer step (taken or skipped): halve on an overflow, double after
        ``growth_interval`` clean steps."""
        if not self.enabled:
            return
        if found_inf:
            self.scale_value /= 2.0
            self.clean_steps = 0
            self.overflows += 1
            return
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale_value *= 2.0
            self.clean_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale_value, "clean_steps": self.clean_steps, "overflows": self.overflows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.enabled:
            self.scale_value = float(state["scale"])
            self.clean_steps = int(state["clean_steps"])
            self.overflows = int(state["overflows"])


def loss_scale_for(autocast: str | None) -> DynamicLossScale:
    """Scaling on for a float16 update, off (scale 1) for fp32 and bf16."""
    return DynamicLossScale(autocast == "float16")


__all__ = ["GROWTH_INTERVAL", "INIT_SCALE", "DynamicLossScale", "loss_scale_for"]
