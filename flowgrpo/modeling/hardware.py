"""What the hardware is good at, so configs can say ``autocast: auto``.

bf16 autocast is only a win where bf16 matmuls run natively: on x86 CPUs with AVX512-BF16 or AMX
(measured ~4x the fp32 matmul peak on an AVX512-BF16 EPYC) and on CUDA GPUs that support bf16. On an
AVX2-only CPU, bf16 matmuls are emulated: measured 0.6 GFLOP/s against 68-190 GFLOP/s in fp32, i.e. a
training step hundreds of times slower. ``auto`` therefore picks bf16 only where it is fast.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

log = logging.getLogger(__name__)

_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


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
    kind = (device or "cpu").split(":")[0]
    if kind == "cuda":
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
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
