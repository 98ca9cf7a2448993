"""Seeding every random number generator a run draws from, in one call."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (the trainer reseeds from ``(seed, step)`` every step)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
