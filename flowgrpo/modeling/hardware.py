"""What the hardware is and what it is good at, so configs can say ``device: auto``,
``autocast: auto`` and ``rollout_dtype: auto``.

:func:`resolve_device` is the one place a device setting becomes a ``torch.device``: the build step,
the rewards that load models of their own, ``serve`` and torchrun all call it, so ``auto`` means the
same thing everywhere (CUDA when this torch has a GPU, else the CPU; under torchrun, the rank's GPU).

Two places could use a low precision. ``auto`` picks it only where it was measured to beat fp32
(never where it is merely supported) and where RL still learned with it:

- **Sampling** (``model.rollout_dtype``): the rollout samples from an inference copy of the policy
  in bf16, cast from the fp32 master weights after each optimizer step (as verl and vLLM-style
  engines keep a bf16 copy for generation). Autocast is the wrong tool there: it casts every fp32
  weight at every op of every decode step, and a decode step of a 135M model is bound by per-op
  overhead, not arithmetic (on an H100, demo 8.1 min under autocast against 2.4 in fp32).
- **The update** (``model.autocast``): fp32 master weights (pure-bf16 weights barely move at RL
  learning rates). bf16 autocast of its passes is faster where bf16 is native, but there the RL
  phase gained nothing (:func:`resolve_autocast`), so ``auto`` keeps the update in fp32 everywhere.

Measured on a 2-core AMD EPYC with avx512_bf16 (no AMX), torch 2.13 CPU, SmolLM2-135M
(``python benchmarks/rollout.py --precision``, docs/benchmarks.md): a decode step at batch 16 took
~100 ms in fp32, ~80 ms under bf16 autocast, ~57 ms from a bf16 copy (fp16 copy: ~150 ms, no native
fp16 arithmetic); an update of 8 x 256 tokens 8.2-9.6 s in fp32 and 3.2-3.4 s under bf16 autocast.
On an AVX2-only CPU bf16 matmuls are emulated (0.6 GFLOP/s against 68-190 in fp32), so ``auto``
samples in fp32 there too.

On CUDA ``auto`` is fp32 on both sides: bf16 autocast on an H100 was slower than fp32 end to end,
and a bf16 sampling copy buys no speed there and costs RL accuracy. A decode step of a 135M model
is launch-bound on a GPU (~3.4 ms of GPU work in ~23 ms of host time per step, H200): with cuDNN
attention off (:func:`avoid_cudnn_attention`) the bf16 copy decoded at 42.4 ms per step against
43.8 in fp32 on an H100 (SmolLM2-135M, 64 rows x 64 tokens, torch 2.11+cu130), 29.1 against 29.8
on an H200. Over the demo's six GPU pairs of arms (3 seeds, the 3-step config on an H200 and the
15-step cosine + KL 0.05 recipe on an H100; docs/learning.md sections 11 and 17) the fp32 arm ended
above the bf16-sampling arm of the same seed in five, pooled +4.9 points on the same 500 tasks
(p = 1.3e-16, n = 3000), and the one GPU arm that rose and decayed in a long run sampled from the
bf16 copy (seed 1: 0.575 at step 5, 0.43 at step 15). A model large enough for its decode to be
bound by the GPU may gain speed from ``rollout_dtype: bfloat16`` (or ``float16``); that has not
been measured here.

Any precision below fp32 on either side makes the sampler's logprobs differ from the trainer's
(ratios of 0.85-1.20 on an on-policy update were seen under bf16); :func:`sampler_matches_trainer`
says when, and ``algorithm.tis: auto`` then corrects with truncated importance sampling.
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
_FP16_CPU_FLAGS = frozenset({"avx512_fp16", "amx_fp16"})

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


NUMERIC_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16")
"""The CPU flags that decide which precisions run natively: what a figure's machine line names."""


def _cpuinfo_field(*keys: str) -> str | None:
    """The first /proc/cpuinfo value under one of ``keys`` (None where there is none, or no file)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags from /proc/cpuinfo (empty where that file does not exist)."""
    return frozenset((_cpuinfo_field("flags", "Features") or "").split())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's machine type where it has none)."""
    import platform

    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def device_kind(device: str | None = None) -> str:
    """``"cpu"`` or ``"cuda"`` for a device setting (``cuda:1`` -> ``cuda``; None -> ``cpu``)."""
    return str(device or "cpu").split(":")[0]


def fast_bf16(device: str | None = None) -> bool:
    """True when bf16 matmuls run natively on ``device`` (``cpu``, ``cuda``, ``cuda:0``, ...)."""
    kind = device_kind(device)
    if kind == "cuda":
        import torch

        return bool(cuda_available() and torch.cuda.is_bf16_supported())
    if kind == "cpu":
        return any(f in cpu_flags() for f in _BF16_CPU_FLAGS)
    return False


def resolve_autocast(setting: str | None, device: str | None = None) -> str | None:
    """The autocast dtype of the update's forward/backward passes.

    ``"auto"`` -> ``None`` (plain fp32) on every machine. bf16 autocast makes the update 2.5x faster
    on a CPU with native bf16, but there the RL phase stopped adding anything: on the same seed and
    machine (2-core avx512_bf16 EPYC, seed 0, docs/learning.md section 8), bf16 sampling + fp32 update
    gained +6.2 points over its warm start (p = 0.022; +8.4 and +12.4 in seeds 1 and 2), fp32
    throughout +7.0 (p = 0.0087), and bf16 sampling + bf16 update +0.0 (p = 1) over a warm start that
    bf16 had made 7.6 points stronger. On an AVX2 CPU bf16 is emulated, and on CUDA autocast was
    slower end to end. ``bfloat16`` stays available, with a warning where it is slow.
    """
    if setting == "auto":
        log.debug("autocast auto on %s: off (fp32 update)", device or "cpu")
        return None
    if setting == "bfloat16" and not fast_bf16(device):
        log.warning(
            "autocast bfloat16 on %s without native bf16 (no avx512_bf16/amx on this CPU): matmuls are "
            "emulated and much slower than fp32; use model.autocast=auto or null",
            device or "cpu",
        )
    if setting == "float16" and device_kind(device) == "cpu" and not _FP16_CPU_FLAGS & cpu_flags():
        log.warning(
            "autocast float16 on a CPU without native fp16 (no avx512_fp16/amx_fp16): an update is ~20x "
            "slower than fp32 (56 s against 2.6-3.3 s for 2 x 256 tokens of SmolLM2-135M on an avx512_bf16 "
            "EPYC, benchmarks/rollout.py --precision); train fp16 on a GPU, or keep model.autocast=null"
        )
    return setting


def resolve_rollout_dtype(
    setting: str, device: str | None = None, weights_dtype: str = "float32"
) -> str | None:
    """The dtype of the inference copy the rollout samples from, or ``None`` to sample from the
    trained weights themselves.

    ``"auto"`` -> ``"bfloat16"`` on a CPU with native bf16 (avx512_bf16/AMX: a decode step measured
    1.75x faster than fp32), else ``None``: on a CPU without it bf16 is emulated, and on a GPU the
    copy decoded no faster than fp32 and its RL arms ended lower (module docstring).
    A setting equal to ``weights_dtype`` needs no copy (``None``).
    """
    if setting == "auto":
        chosen = "bfloat16" if device_kind(device) == "cpu" and fast_bf16(device) else None
        log.debug("rollout_dtype auto on %s: %s", device or "cpu", chosen or "the fp32 weights")
    else:
        chosen = setting
        if setting == "bfloat16" and not fast_bf16(device):
            log.warning(
                "rollout_dtype bfloat16 on %s without native bf16: decoding is emulated and much slower "
                "than fp32; use model.rollout_dtype=auto or float32",
                device or "cpu",
            )
    return None if chosen in (None, weights_dtype) else chosen


def avoid_cudnn_attention(device: str | torch.device | None) -> bool:
    """Turn off PyTorch's cuDNN backend of ``scaled_dot_product_attention`` for this process when
    ``device`` is a GPU; returns whether it was on.

    Why: cuDNN builds an execution plan per attention shape (hundreds of ms for a new one, as vLLM
    and sglang found when trying it), and a decode step has a new key length every step, so each step
    pays that build. PyTorch prefers cuDNN for bf16/fp16 on Hopper, which made sampling from a bf16
    copy 3x slower than fp32 on an H200 (93 against 29 ms per decode step; module docstring). The
    remaining backends (flash, memory-efficient, math) serve every shape the policy uses. It is a
    process-wide flag (PyTorch has no per-module one), so the update's attention avoids cuDNN too,
    where its token-budget micro-batches also change shape from one to the next."""
    import torch

    if torch.device(device or "cpu").type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    log.info("cuDNN attention off for this process: it re-plans at every new decode length")
    return True


def sampler_matches_trainer(rollout_dtype: str | None, autocast: str | None) -> bool:
    """Whether sampler and trainer compute in fp32 alike (their logprobs then agree to ~1e-5; any
    bf16/fp16 on either side rounds them apart, by up to ~20% in probability per token)."""
    return rollout_dtype is None and autocast is None
