"""Deprecated path of :mod:`flowgrpo.training.trainer`, kept so ``from flowgrpo.trainer import Trainer``
goes on working; import from :mod:`flowgrpo.training.trainer` instead."""

from __future__ import annotations

import warnings

from flowgrpo.training.trainer import Trainer, train, train_from_args

warnings.warn(
    "flowgrpo.trainer moved to flowgrpo.training.trainer; import Trainer from there",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["Trainer", "train", "train_from_args"]
