"""Checkpoints that make a resumed run bit-identical to an uninterrupted one, holding what resume
needs and no more.

A checkpoint directory ``step_000042/`` holds::

    model.safetensors   the policy's tensors (:func:`policy_state_dict`: tied aliases stored once)
    optimizer.pt        the optimizer's state dict (AdamW moments: twice the policy's size)
    state.pt            the step, the LR-scheduler state, the RNG states (python, numpy, torch),
                        the reference pointer and whatever the trainer passes in ``extra``

The frozen reference model (the KL anchor) is never copied into a checkpoint: it is either the
initial model, rebuilt exactly from the config's ``model.name``, or the warm-started policy, written
once per run to ``checkpoints/reference/model.safetensors`` (:func:`write_reference`); each
checkpoint holds a :class:`ReferencePointer` to it. For SmolLM2-135M that makes a step's checkpoint
1.6 GB instead of the 2.15 GB of one ``state.pt`` holding model, optimizer and reference.

A checkpoint is written to a temporary directory and renamed into place, then ``latest`` is updated,
so a run killed while saving leaves the previous checkpoint intact. Before writing, the free space is
checked against the tensors' size: a disk that cannot hold the checkpoint stops the run with a
:class:`CheckpointWriteError` that says so, instead of a serializer's error from a truncated file.
A checkpoint that cannot be read (empty, truncated, corrupt) raises :class:`CheckpointError`, one
line naming the file; :func:`resume_candidates` lists the older ones a caller may fall back to.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from flowgrpo.modeling.lora import adapter_state_dict, is_lora, load_adapter_state
from flowgrpo.utils.files import atomic_directory

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
POLICY_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
REFERENCE_FILE = Path("reference") / POLICY_FILE
FORMAT = 2  # 1: one state.pt with model, optimizer (and reference) state dicts inside


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or written; the message is one line naming the file and the
    cause."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint that could not be written, most often for want of disk space. The message names
    the space needed and free, and the checkpoint a resume would start from: the atomic write leaves
    that one intact, so freeing space and resuming loses nothing before it."""


class MissingCheckpointError(FileNotFoundError):
    """No checkpoint where one was named (``--checkpoint``, ``run.resume``); the message says what
    a checkpoint path looks like."""


class ReferencePointer(BaseModel):
    """Where the frozen reference model comes from, so a checkpoint need not copy it.

    ``initial``: the model the run started from, rebuilt from ``model`` (the config's model name).
    ``file``: tensors at ``path`` (relative to the checkpoint root), e.g. the warm-started policy.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["initial", "file"]
    model: str | None = None
    path: str | None = None


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def checkpoint_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step a checkpoint directory holds, read from its name (:func:`checkpoint_dir`)."""
    name = Path(path).name
    if not name.startswith("step_") or not name[5:].isdigit():
        raise ValueError(f"{path}: not a checkpoint directory (expected RUN/checkpoints/step_NNNNNN)")
    return int(name[5:])


# ---------------------------------------------------------------------------------------------
# The policy's tensors


def _aliases(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(kept, alias -> kept name)``: the state dict with every tensor that shares memory with an
    earlier one (tied input/output embeddings) left out, and where each left-out name points."""
    kept: dict[str, torch.Tensor] = {}
    alias: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.numel() and key in seen:
            alias[name] = seen[key]
            continue
        seen[key] = name
        kept[name] = t
    return kept, alias


def policy_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of the policy a checkpoint stores and an export writes: every entry of the
    state dict once (tied weights under their first name), contiguous, on CPU. The one place that
    decides what "the policy's weights" are: a LoRA policy returns its adapters only (the base is
    rebuilt from ``model.name``)."""
    if is_lora(model):
        return {k: v.detach().to("cpu").contiguous() for k, v in adapter_state_dict(model).items()}
    kept, _ = _aliases(model)
    return {k: v.detach().to("cpu").contiguous() for k, v in kept.items()}


def load_policy_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor], *, source: Path) -> None:
    """Copy ``tensors`` (from :func:`policy_state_dict`) into ``model``; names missing from them
    must be tied aliases of names present, anything else is a :class:`CheckpointError`."""
    if is_lora(model) or (tensors and all("lora_" in k for k in tensors)):
        try:
            load_adapter_state(model, tensors)
        except ValueError as e:
            raise CheckpointError(f"{source}: {e}") from None
        return
    _, alias = _aliases(model)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if m not in alias]
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]} "
            "(was it saved from another model.name?)"
        )


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # SafetensorError, OSError: truncated, empty, garbage
        raise CheckpointError(f"{path} is unreadable: {type(e).__name__}: {_first_line(e)}") from e


def _torch_load(path: Path, *, weights_only: bool) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as e:  # EOFError, UnpicklingError, RuntimeError on an empty/truncated file
        raise CheckpointError(f"{path} is unreadable: {type(e).__name__}: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


_HEADROOM = 64 * 2**20  # headers, pickle framing, state.pt: well under this for any model


def _tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (nested dicts, lists, tuples): what writing it needs."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _intact(root: Path) -> str:
    latest = latest_checkpoint(root)
    if latest is None:
        return "there is no earlier checkpoint"
    return f"the latest complete checkpoint, {latest}, is intact"


def _write_error(root: Path, target: Path, needed: int, cause: str) -> CheckpointWriteError:
    free = shutil.disk_usage(root).free
    return CheckpointWriteError(
        f"could not write {target} ({cause}): it needs {needed / 1e9:.2f} GB and {root} has "
        f"{free / 1e9:.2f} GB free; {_intact(root)}. Free space (other runs' checkpoints, a lower "
        "run.keep_last) and continue with --set run.resume=true"
    )


@contextmanager
def _guarded_write(root: Path, target: Path, tensors: Any) -> Iterator[Path]:
    """An :func:`atomic_directory` for ``target`` that first checks ``root``'s disk can hold
    ``tensors``, and turns a failed write into a :class:`CheckpointWriteError`."""
    root.mkdir(parents=True, exist_ok=True)
    needed = _tensor_bytes(tensors) + _HEADROOM
    if shutil.disk_usage(root).free < needed:
        raise _write_error(root, target, needed, "not enough free space")
    try:
        with atomic_directory(target) as tmp:
            yield tmp
    except (OSError, RuntimeError) as e:  # ENOSPC, a quota; torch.save's "unexpected pos"
        if isinstance(e, CheckpointError):
            raise
        raise _write_error(root, target, needed, f"{type(e).__name__}: {_first_line(e)}") from e


# ---------------------------------------------------------------------------------------------
# Writing and reading


def write_reference(root: str | os.PathLike, model: torch.nn.Module) -> ReferencePointer:
    """Write ``model``'s tensors once to ``root/reference/model.safetensors`` (atomically) and return
    the pointer the checkpoints of the run carry."""
    target = Path(root) / REFERENCE_FILE
    tensors = policy_state_dict(model)
    with _guarded_write(Path(root), target.parent, tensors) as tmp:
        _save_tensors(tensors, tmp / POLICY_FILE)
    log.info("wrote the reference model to %s", target)
    return ReferencePointer(kind="file", path=REFERENCE_FILE.as_posix())


def load_reference(root: str | os.PathLike, pointer: ReferencePointer, model: torch.nn.Module) -> None:
    """Load a ``file`` reference into ``model`` (an ``initial`` one is the model as built)."""
    if pointer.kind == "file":
        path = Path(root) / str(pointer.path)
        load_policy_state(model, _load_tensors(path), source=path)


def save_checkpoint(
    root: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer_state: dict[str, Any] | None = None,
    scheduler: Any = None,
    extra: dict[str, Any] | None = None,
    keep_last: int | None = None,
    reference: ReferencePointer | None = None,
) -> Path:
    """Write ``root/step_{step}`` atomically, point ``root/latest`` at it, prune old ones.
    ``optimizer_state``: the optimizer's state dict (``optimizer.state_dict()``, or the whole state
    gathered from FSDP2 shards)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(root, step)
    t0 = time.monotonic()
    log.info("writing checkpoint %s ...", final)
    state = {
        "format": FORMAT,
        "step": step,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
        "reference": reference.model_dump() if reference is not None else None,
        "extra": extra or {},
    }
    policy = policy_state_dict(model)
    with _guarded_write(root, final, (policy, optimizer_state)) as tmp:
        _save_tensors(policy, tmp / POLICY_FILE)
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
        torch.save(state, tmp / STATE_FILE)  # last: its presence marks a complete directory
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name + "\n")
    os.replace(latest_tmp, root / "latest")
    if keep_last:
        for old in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    log.info("saved checkpoint %s (%.0f MB, %.1f s)", final, _dir_size(final) / 1e6, time.monotonic() - t0)
    return final


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file())


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The checkpoint ``latest`` names (or the highest step present), None when there is none."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        p = root / pointer.read_text().strip()
        if (p / STATE_FILE).is_file():
            return p
    found = list_checkpoints(root)
    return found[-1] if found else None


def resume_candidates(root: str | os.PathLike) -> list[Path]:
    """Checkpoints to resume from, best first: the latest, then the older ones, newest first."""
    latest = latest_checkpoint(root)
    older = [p for p in reversed(list_checkpoints(root)) if p != latest]
    return ([latest] if latest is not None else []) + older


@dataclass
class CheckpointData:
    """A checkpoint read into memory (nothing applied yet): a corrupt file fails here, before any
    model or optimizer is touched."""

    path: Path
    state: dict[str, Any]
    policy: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def reference(self) -> ReferencePointer | None:
        ref = self.state.get("reference")
        return ReferencePointer.model_validate(ref) if ref is not None else None


def checkpoint_state_file(path: str | os.PathLike) -> Path:
    """The ``state.pt`` of a checkpoint directory (or the file itself), or a
    :class:`MissingCheckpointError` that says what a checkpoint path looks like: callers check this
    before they load a model, so a mistyped path fails in one line and at once."""
    p = Path(path)
    f = (p.parent if p.name == STATE_FILE else p) / STATE_FILE
    if not f.is_file():
        raise MissingCheckpointError(
            f"no checkpoint at {p} (expected {f}): name a checkpoint directory such as "
            "RUN/checkpoints/step_000010 (flowgrpo.runs.checkpoint.list_checkpoints lists a run's)"
        )
    return f


def read_checkpoint(path: str | os.PathLike, *, with_optimizer: bool = True) -> CheckpointData:
    """Read a checkpoint directory (or its ``state.pt``); a missing directory is a
    :class:`FileNotFoundError`, an unreadable file a :class:`CheckpointError`. Reads the older
    one-file format (model and optimizer inside ``state.pt``) too."""
    f = checkpoint_state_file(path)
    d = f.parent
    state = _torch_load(f, weights_only=False)
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{f} is not a flowgrpo checkpoint (no step recorded)")
    if state.get("format", 1) == 1:
        return CheckpointData(d, state, state["model"], state.get("optimizer") if with_optimizer else None)
    policy = _load_tensors(d / POLICY_FILE)
    opt = None
    if with_optimizer and (d / OPTIMIZER_FILE).exists():
        opt = _torch_load(d / OPTIMIZER_FILE, weights_only=True)
    return CheckpointData(d, state, policy, opt)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint directory (or its ``state.pt``) into the given objects; return the state
    (``step``, ``extra``, ``reference``...)."""
    data = read_checkpoint(path, with_optimizer=optimizer is not None)
    load_policy_state(model, data.policy, source=data.path / POLICY_FILE)
    if optimizer is not None and data.optimizer is not None:
        optimizer.load_state_dict(data.optimizer)
    if scheduler is not None and data.state.get("scheduler") is not None:
        scheduler.load_state_dict(data.state["scheduler"])
    if restore_rng:
        set_rng_state(data.state["rng"])
    return data.state


__all__ = [
    "CheckpointData",
    "CheckpointError",
    "ReferencePointer",
    "checkpoint_dir",
    "checkpoint_state_file",
    "checkpoint_step",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_policy_state",
    "load_reference",
    "policy_state_dict",
    "read_checkpoint",
    "resume_candidates",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "write_reference",
]
