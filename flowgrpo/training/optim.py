"""The optimizer of every update (RL and supervised)."""

from __future__ import annotations

from typing import Any

import torch


def adamw(model: Any, **hyper: Any) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, fused where the device has the kernel: one kernel instead
    of ~10 ops per tensor, 0.07 s vs 0.39 s a step for SmolLM2-135M on 2 CPU cores."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    device_type = trainable[0].device.type if trainable else "cpu"
    fused = device_type in ("cpu", "cuda") and all(p.is_floating_point() for p in trainable)
    return torch.optim.AdamW(trainable, fused=fused, **hyper)


__all__ = ["adamw"]
