"""Checkpoints that make a resumed run bit-identical to an uninterrupted one.

A checkpoint directory ``step_000042/`` holds ``state.pt`` with the model, optimizer and LR-scheduler
state dicts, the RNG states (python, numpy, torch), the step and the trainer's position in the task
stream (plus anything else the trainer passes in ``extra``). It is written to a temporary directory
and renamed into place, then ``latest`` is updated, so a run killed while saving leaves the previous
checkpoint intact.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowgrpo.files import atomic_directory

log = logging.getLogger(__name__)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (the trainer reseeds from ``(seed, step)`` every step)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def checkpoint_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def save_checkpoint(
    root: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    extra: dict[str, Any] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Write ``root/step_{step}`` atomically, point ``root/latest`` at it, prune old ones."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
        "extra": extra or {},
    }
    final = checkpoint_dir(root, step)
    with atomic_directory(final) as tmp:
        torch.save(state, tmp / "state.pt")
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name + "\n")
    os.replace(latest_tmp, root / "latest")
    if keep_last:
        for old in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    log.info("saved checkpoint %s", final)
    return final


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / "state.pt").is_file())


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The checkpoint ``latest`` names (or the highest step present), None when there is none."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        p = root / pointer.read_text().strip()
        if (p / "state.pt").is_file():
            return p
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint directory (or its ``state.pt``) into the given objects; return the state
    (``step``, ``extra``...)."""
    p = Path(path)
    f = p / "state.pt" if p.is_dir() else p
    if not f.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {p} (expected {f}); list them with flowgrpo.checkpoint.list_checkpoints"
        )
    state = torch.load(f, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state


__all__ = [
    "checkpoint_dir",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "rng_state",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
]
