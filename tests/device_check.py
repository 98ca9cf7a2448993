"""A reusable check that every tensor a model receives is on that model's device.

Why: the bug of issue 26 was a CPU index tensor meeting CUDA weights (``micro_batches`` built its
tensors on the CPU and no caller moved them). A forward pre-hook on every module of the models
under test sees each forward's inputs, keyword arguments included (``input_ids=``,
``attention_mask=``, ``position_ids=``), and records any tensor that is on another device than the
module's own parameters. On a CPU-only machine every device is the CPU, so the check passes
trivially there and the ``device=`` spies of ``tests/test_device.py`` cover the CPU; on a GPU
(``make test-gpu``) it is the real test.

    with inputs_on_model_device(tr.model, tr.ref_model) as check:
        tr.train_step()
    assert check.calls > 0  # the hooks saw forwards

A module-wide global hook (positional arguments only: torch passes no keyword arguments to global
hooks) also covers models the test does not name (a verifier, a flow agent's frozen modules).
0-dim CPU tensors are allowed: torch treats them as scalars next to CUDA tensors.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class DeviceLog:
    """What the hooks saw: forward calls checked and the inputs found on another device."""

    calls: int = 0
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check(self, module: torch.nn.Module, device: torch.device, where: str, value: Any) -> None:
        with self.lock:
            self.calls += 1
            for path, t in _tensors(value, where):
                if t.device != device and not (t.dim() == 0 and t.device.type == "cpu"):
                    self.problems.append(
                        f"{type(module).__name__} on {device} got {path} {tuple(t.shape)} on {t.device}"
                    )


def _tensors(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside ``value`` (tensors, tuples, lists, dicts), with where it was found."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensors(v, f"{path}.{k}")


def module_device(module: torch.nn.Module) -> torch.device | None:
    """The device of ``module``'s first parameter or buffer (None: it holds neither)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return None


@contextmanager
def inputs_on_model_device(*models: torch.nn.Module | None, strict: bool = True) -> Iterator[DeviceLog]:
    """Hooks that record every forward input of ``models`` (and of any module, positional inputs
    only) not on the module's device; raises AssertionError at exit listing them when ``strict``."""
    log = DeviceLog()
    handles = []

    def named_hook(device: torch.device):
        def hook(module, args, kwargs):
            log.check(module, device, "args", args)
            log.check(module, device, "kwargs", kwargs)

        return hook

    def global_hook(module, args):
        device = module_device(module)
        if device is not None and device.type != "meta":
            log.check(module, device, "args", args)

    for model in _distinct(models):
        device = module_device(model)
        assert device is not None, f"{type(model).__name__} has no parameters to place"
        for sub in model.modules():
            handles.append(sub.register_forward_pre_hook(named_hook(device), with_kwargs=True))
    handles.append(torch.nn.modules.module.register_module_forward_pre_hook(global_hook))
    try:
        yield log
    finally:
        for h in handles:
            h.remove()
    if strict:
        assert not log.problems, "inputs on another device than their model:\n" + "\n".join(
            sorted(set(log.problems))[:20]
        )


def _distinct(models: Iterable[torch.nn.Module | None]) -> list[torch.nn.Module]:
    out: list[torch.nn.Module] = []
    for m in models:
        if m is not None and all(m is not o for o in out):
            out.append(m)
    return out


def trainer_models(tr: Any) -> list[torch.nn.Module]:
    """The models a :class:`~flowgrpo.training.trainer.Trainer` runs forwards on: the policy, its frozen
    reference, PPO's critic and the async rollout thread's replica (those that exist)."""
    models = [tr.model, tr.ref_model]
    if tr.critic is not None:
        models.append(tr.critic.model)
    if tr.replica is not None:
        models.append(tr.replica.model)
    return _distinct(models)


__all__ = ["DeviceLog", "inputs_on_model_device", "module_device", "trainer_models"]
