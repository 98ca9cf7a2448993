"""Weight handoff from the trainer to a served policy: a safetensors file plus a version number.

Why a file: the trainer and the server (``flowgrpo serve``) share a disk on one machine or a shared
filesystem across machines, and a file moves 0.5 GB (SmolLM2-135M in fp32) at disk speed without
holding it in an HTTP body; the server reads it with safetensors (no pickle, so a file cannot run
code). vLLM's and SGLang's "update weights from disk" endpoints work the same way.

- :func:`write_weights` (trainer side): the policy's inference weights (a LoRA policy merged:
  :func:`flowgrpo.modeling.lora.inference_state_dict`) written to ``DIR/policy_v{version}.safetensors``
  through a temporary name, so the server never reads a half-written file.
- :func:`load_weights` (server side): copy the file's tensors into the served model in place; a
  file that does not fit the model (another architecture) is refused before anything is copied.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from flowgrpo.modeling.lora import inference_state_dict


class WeightSyncError(ValueError):
    """A weights file that cannot be loaded into the served model; the message says why."""


def weights_path(directory: str | os.PathLike, version: int) -> Path:
    return Path(directory) / f"policy_v{version:06d}.safetensors"


def write_weights(model: Any, directory: str | os.PathLike, version: int) -> Path:
    """Write ``model``'s inference weights for ``version`` atomically; return the file."""
    from safetensors.torch import save_file

    final = weights_path(directory, version)
    final.parent.mkdir(parents=True, exist_ok=True)
    tensors = _untied({k: v.to("cpu").contiguous() for k, v in inference_state_dict(model).items()})
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata={"version": str(version)})
    os.replace(tmp, final)
    return final


def _untied(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop every tensor that shares memory with an earlier one (tied embeddings): safetensors
    refuses shared storage, and the loader restores aliases through the model's own tying."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for k, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out[k] = t
    return out


def load_weights(model: torch.nn.Module, path: str | os.PathLike) -> int:
    """Copy the tensors of ``path`` into ``model`` (in place: views sharing its tensors, such as the
    hf backend's decode view, see them at once); returns the number of tensors loaded. Every name
    must be the model's, and every name of the model must be in the file or tied to one that is."""
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise WeightSyncError(f"no weights file at {p} (the trainer writes it before asking to load it)")
    try:
        tensors = load_file(str(p))
    except Exception as e:  # SafetensorError, OSError: truncated, garbage
        raise WeightSyncError(f"{p} is not a readable safetensors file: {type(e).__name__}: {e}") from e
    state = model.state_dict()
    unexpected = sorted(set(tensors) - set(state))
    loaded_ptrs = {state[k].data_ptr() for k in tensors if k in state}
    missing = sorted(k for k in set(state) - set(tensors) if state[k].data_ptr() not in loaded_ptrs)
    bad_shape = sorted(k for k in tensors if k in state and tensors[k].shape != state[k].shape)
    if unexpected or missing or bad_shape:
        raise WeightSyncError(
            f"{p} does not fit the served model: unexpected {unexpected[:3]}, missing {missing[:3]}, "
            f"wrong shape {bad_shape[:3]} (is the server running the trainer's model.name?)"
        )
    with torch.no_grad():
        for k, t in tensors.items():
            state[k].copy_(t)
    return len(tensors)


__all__ = ["WeightSyncError", "load_weights", "weights_path", "write_weights"]
