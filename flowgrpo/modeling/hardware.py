"""What the hardware is, so configs can say ``device: auto`` and ``autocast: auto``.

:func:`resolve_device` is the one place a device setting becomes a ``torch.device``: the build step,
the rewards that load models of their own, ``serve`` and torchrun all call it, so ``auto`` means the
same thing everywhere (CUDA when this torch has a GPU, else the CPU; under torchrun, the rank's GPU).

bf16 autocast is only a win where bf16 matmuls run natively: on x86 CPUs with AVX512-BF16 or AMX
(measured ~4x the fp32 matmul peak on an AVX512-BF16 EPYC) and on CUDA GPUs that support bf16. On an
AVX2-only CPU, bf16 matmuls are emulated: measured 0.6 GFLOP/s against 68-190 GFLOP/s in fp32, i.e. a
training step hundreds of times slower. ``auto`` therefore picks bf16 only where it is fast.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from flowgrpo.utils.errors import ConfigError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")

DEVICE_SETTINGS = ("auto", "cpu", "cuda", "cuda:N")
"""What ``model.device`` (and a model-loading reward's ``device``) accepts."""
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?")

NO_CUDA_HINT = (
    "install a CUDA build of torch (a fresh venv: `rm -rf .venv && TORCH_SPEC=<a CUDA torch wheel or "
    "spec> make env`, see scripts/bootstrap.sh) or set model.device=cpu (or auto)"
)


def check_device_setting(setting: str) -> str:
    """``setting`` when it is one of :data:`DEVICE_SETTINGS` (syntax only: whether this machine has
    the device is :func:`resolve_device`'s question); a ValueError naming the closest one otherwise."""
    if _DEVICE_RE.fullmatch(setting):
        return setting
    import difflib

    low = setting.strip().lower()
    close = (
        ["cuda"] if low.startswith("gpu") else difflib.get_close_matches(low, ["auto", "cpu", "cuda"], n=1)
    )
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"unknown device {setting!r}; {hint}use one of {', '.join(DEVICE_SETTINGS)}")


def cuda_available() -> bool:
    """Whether this torch was built with CUDA and sees a GPU (the one check ``auto`` makes; the
    default test suite patches it to False so it stays on the CPU on a GPU machine too)."""
    import torch

    return bool(torch.cuda.is_available())


def _local_rank() -> int | None:
    """``LOCAL_RANK`` of a torchrun job of several processes, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return int(os.environ.get("LOCAL_RANK", "0"))
    return None


def resolve_device(setting: str | None = "auto") -> torch.device:
    """The ``torch.device`` a setting names on this machine.

    ``auto`` (or None): ``cuda`` when :func:`cuda_available`, else ``cpu``. ``cpu`` and ``cuda:N``
    are honoured. Under torchrun (``WORLD_SIZE`` > 1) ``auto`` and ``cuda`` mean the rank's own GPU,
    ``cuda:LOCAL_RANK`` (one GPU per rank, as NCCL needs). Asking for CUDA where there is none, or
    for a GPU index this machine lacks, is a :class:`~flowgrpo.utils.errors.ConfigError` (one line: the
    CLI exits 2) that says how to get one.
    """
    import torch

    name = "auto" if setting is None else str(setting)
    try:
        check_device_setting(name)
    except ValueError as e:
        raise ConfigError(f"model.device: {e}") from None
    rank = _local_rank()
    if name == "auto":
        if not cuda_available():
            return torch.device("cpu")
        name = "cuda"
    if name == "cpu":
        return torch.device("cpu")
    if not cuda_available():
        if torch.version.cuda is None:
            raise ConfigError(
                f"model.device={name}: this torch ({torch.__version__}) has no CUDA; {NO_CUDA_HINT}"
            )
        raise ConfigError(
            f"model.device={name}: this torch ({torch.__version__}, CUDA {torch.version.cuda}) sees no GPU "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}; check nvidia-smi and "
            "the driver) or set model.device=cpu (or auto)"
        )
    if name == "cuda":
        if rank is None:
            return torch.device("cuda")  # the current GPU (cuda:0 unless CUDA_VISIBLE_DEVICES says otherwise)
        index = rank
    elif rank is not None:
        raise ConfigError(
            f"model.device={name} under torchrun: every rank uses its own GPU, cuda:LOCAL_RANK; "
            "set model.device=cuda (or auto)"
        )
    else:
        index = int(name.split(":", 1)[1])
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(
            f"model.device: cuda:{index} does not exist: this machine sees {count} GPU(s) "
            f"(cuda:0 .. cuda:{count - 1}); pick one of them, or model.device=auto"
            + (
                " (under torchrun: at most one rank per GPU, --nproc_per_node <= GPUs)"
                if rank is not None
                else ""
            )
        )
    return torch.device("cuda", index)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags from /proc/cpuinfo (empty where that file does not exist)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def fast_bf16(device: str | None = None) -> bool:
    """True when bf16 matmuls run natively on ``device`` (``cpu``, ``cuda``, ``cuda:0``, ...)."""
    kind = str(device or "cpu").split(":")[0]
    if kind == "cuda":
        import torch

        return bool(cuda_available() and torch.cuda.is_bf16_supported())
    if kind == "cpu":
        return any(f in cpu_flags() for f in _BF16_CPU_FLAGS)
    return False


def resolve_autocast(setting: str | None, device: str | None = None) -> str | None:
    """``"auto"`` -> ``"bfloat16"`` where bf16 is fast on ``device``, else ``None`` (plain fp32);
    any other setting is returned unchanged, with a warning when bf16 is asked for where it is slow."""
    if setting == "auto":
        chosen = "bfloat16" if fast_bf16(device) else None
        log.info("autocast auto on %s: %s", device or "cpu", chosen or "off (no native bf16: fp32 is faster)")
        return chosen
    if setting == "bfloat16" and not fast_bf16(device):
        log.warning(
            "autocast bfloat16 on %s without native bf16 (no avx512_bf16/amx on this CPU): matmuls are "
            "emulated and much slower than fp32; use model.autocast=auto or null",
            device or "cpu",
        )
    return setting
