"""Trained policies out of flowgrpo, as plain Hugging Face models.

:func:`export_checkpoint` turns a run's checkpoint into a ``save_pretrained`` directory (safetensors
weights, config, tokenizer with its chat template) that ``AutoModelForCausalLM.from_pretrained``
loads without flowgrpo, and that gives the same logprobs as the policy did in training; a LoRA
policy is exported merged (``W + (alpha / r) B A``). The run's config travels beside it as
``flowgrpo.yaml`` (model name pointing at the export) so ``flowgrpo eval`` can use the directory.

:func:`load_served_policy` is what ``flowgrpo serve --model`` and ``flowgrpo eval`` accept: a run
directory (its latest checkpoint, or ``step``), an exported directory, or any model name that
:func:`flowgrpo.modeling.models.load_model` takes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from flowgrpo.components import load_policy
from flowgrpo.config import TrainConfig, dump_config
from flowgrpo.modeling.lora import apply_lora, is_lora, merged_model
from flowgrpo.runs.checkpoint import load_checkpoint
from flowgrpo.runs.rundir import RunDir, RunError
from flowgrpo.utils.files import atomic_directory

log = logging.getLogger(__name__)

EXPORT_CONFIG = "flowgrpo.yaml"


def is_run_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a training run's directory (a ``config.yaml`` and ``checkpoints/``)."""
    p = Path(path)
    return (p / "config.yaml").is_file() and (p / "checkpoints").is_dir()


def checkpoint_policy(
    run: str | os.PathLike, step: int | None = None, *, device: str | None = None
) -> tuple[Any, Any, TrainConfig, int]:
    """``(model, tokenizer, config, step)``: the run's policy as built from its config, with the
    weights of its checkpoint at ``step`` (default: the latest), on ``device`` (a
    :func:`flowgrpo.modeling.hardware.resolve_device` setting; default the run's ``model.device``: a run
    trained with ``cuda`` opens on a CPU-only machine with ``device="cpu"`` or ``"auto"``)."""
    rd = RunDir(run)
    cfg = rd.config()
    if device is not None:
        from flowgrpo.modeling.hardware import resolve_device

        resolve_device(device)  # a bad or missing device fails here, as a one-line ConfigError
        cfg.model.device = device
    path = rd.checkpoint(step) if step is not None else rd.latest_checkpoint()
    if path is None:
        raise RunError(f"{rd.checkpoint_root} holds no checkpoint; train the run first (flowgrpo train)")
    model, tok = load_policy(cfg)
    if cfg.model.lora is not None:
        model = apply_lora(model, cfg.model.lora)
    state = load_checkpoint(path, model=model, restore_rng=False)
    if is_lora(model):
        model = merged_model(model)
    model.eval()
    return model, tok, cfg, int(state["step"])


def export_checkpoint(
    run: str | os.PathLike, out: str | os.PathLike, *, step: int | None = None, device: str | None = "auto"
) -> Path:
    """Write the run's checkpoint (latest, or ``step``) to ``out`` as a Hugging Face model directory
    (written beside and renamed into place, so ``out`` is never half-written). ``device``: where the
    policy is rebuilt and merged (``auto`` by default, so a GPU-trained run exports anywhere; None:
    the run's ``model.device``); the files are the same either way."""
    model, tok, cfg, at = checkpoint_policy(run, step, device=device)
    out = Path(out)
    log.info("exporting %s step %d to %s", run, at, out)
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)  # tokenizer files and the chat template
        exported = cfg.model_copy(deep=True)
        exported.model.name = str(out.resolve())
        exported.model.lora = None  # merged
        dump_config(exported, tmp / EXPORT_CONFIG)
        (tmp / "SOURCE").write_text(f"{Path(run).resolve()}\nstep {at}\n")
    return out


def exported_config(path: str | os.PathLike, overrides: list[str] | None = None) -> TrainConfig:
    """The config an exported directory carries (``flowgrpo.yaml``) with its model name pointing at
    it; a plain HF directory gets the defaults, with ``model.name`` set to it."""
    from flowgrpo.config import load_config

    p = Path(path)
    cfg_file = p / EXPORT_CONFIG
    return load_config(
        cfg_file if cfg_file.is_file() else None,
        [*(overrides or []), f"model.name={p.resolve()}"],
    )


def load_served_policy(
    name_or_path: str, *, step: int | None = None, device: str = "auto"
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a run directory, an exported directory, ``tiny`` or a model name,
    on ``device`` (a :func:`flowgrpo.modeling.hardware.resolve_device` setting)."""
    from flowgrpo.modeling import models
    from flowgrpo.modeling.hardware import resolve_device

    if is_run_dir(name_or_path):
        model, tok, _, at = checkpoint_policy(name_or_path, step, device=device)
        log.info("serving %s at step %d", name_or_path, at)
        return model, tok
    if name_or_path == "tiny":
        return models.tiny_model(device=resolve_device(device))
    return models.load_model(name_or_path, device=resolve_device(device))


__all__ = [
    "EXPORT_CONFIG",
    "checkpoint_policy",
    "export_checkpoint",
    "exported_config",
    "is_run_dir",
    "load_served_policy",
]
