"""Shared helpers for the benchmarks: child processes with their own peak RSS, medians, the
machine's matmul peak, the malloc environment, and a description of the machine.

Why subprocesses. Peak resident memory is a per-process high-water mark: two sides measured in one
process would share it. Every measurement therefore runs in its own child (``python -m
benchmarks.X --child ...``), and the parent reads that child's ``ru_maxrss`` from ``os.wait4``
(the rusage of exactly that child and its waited-for descendants; kilobytes on Linux).

Why the malloc setting. glibc returns large freed blocks (every activation tensor above the mmap
threshold) to the OS after each step and maps them again in the next; on this machine that cost
TRL 20-25% of its step time. ``GLIBC_TUNABLES`` below raises the mmap and trim thresholds so freed
buffers are reused. Both sides of every comparison get the same environment.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MALLOC_TUNED = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=68719476736"
"""The ``GLIBC_TUNABLES`` value both sides run under unless ``--no-malloc-tuning`` is given."""

REPO_ROOT = Path(__file__).resolve().parent.parent


def child_env(
    *, malloc_tuned: bool = True, threads: int | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a benchmark child: the parent's, plus the malloc tuning and thread counts."""
    env = dict(os.environ)
    if malloc_tuned:
        env["GLIBC_TUNABLES"] = MALLOC_TUNED
    else:
        env.pop("GLIBC_TUNABLES", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
        env["MKL_NUM_THREADS"] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    pp = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + pp if pp else "")
    if extra:
        env.update(extra)
    return env


@dataclass
class ChildResult:
    """What one child measurement returned: its JSON payload, peak RSS and wall time."""

    payload: dict[str, Any]
    peak_rss_bytes: int
    wall_s: float
    returncode: int
    log_tail: str = ""

    @property
    def peak_rss_gb(self) -> float:
        return self.peak_rss_bytes / 1e9


def run_child(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    quiet: bool = True,
) -> ChildResult:
    """Run ``python -m module --child --out FILE *args`` and return its JSON and peak RSS.

    The child must write one JSON object to the path given by ``--out``. Peak RSS comes from
    ``os.wait4`` on that child (``ru_maxrss``, KiB on Linux), so it is this child's own
    high-water mark, not the parent's nor another side's.
    """
    with tempfile.TemporaryDirectory(prefix="flowgrpo-bench-") as tmp:
        out = Path(tmp) / "result.json"
        logf = Path(tmp) / "log.txt"
        cmd = [sys.executable, "-m", module, "--child", "--out", str(out), *args]
        t0 = time.monotonic()
        with open(logf, "w") as lf:
            proc = subprocess.Popen(
                cmd,
                cwd=str(REPO_ROOT),
                env=dict(env) if env is not None else child_env(),
                stdout=lf if quiet else None,
                stderr=subprocess.STDOUT if quiet else None,
            )
            deadline = None if timeout_s is None else t0 + timeout_s
            while True:
                pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    proc.kill()
                    pid, status, rusage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        tail = logf.read_text(errors="replace")[-4000:] if logf.exists() else ""
        payload: dict[str, Any] = {}
        if out.exists():
            payload = json.loads(out.read_text())
        if proc.returncode != 0 or not payload:
            raise RuntimeError(
                f"benchmark child `{' '.join(cmd[2:])}` failed with exit code {proc.returncode}; "
                f"last output:\n{tail}"
            )
        # ru_maxrss survives exec: a child forked from a big parent (pytest with torch loaded) starts
        # at the parent's RSS. VmHWM belongs to the exec'd image, so the child's own report wins.
        peak = payload.pop("_vmhwm_bytes", None) or int(rusage.ru_maxrss) * 1024
        return ChildResult(payload, int(peak), wall, proc.returncode, tail)


def write_child_result(path: str | os.PathLike[str], payload: Mapping[str, Any]) -> None:
    """The child's side of :func:`run_child`: write the JSON payload atomically."""
    p = Path(path)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({**payload, "_vmhwm_bytes": _vmhwm_bytes()}))
    os.replace(tmp, p)


def _vmhwm_bytes() -> int | None:
    """This process's peak resident set (``VmHWM``), which, unlike ``ru_maxrss``, starts afresh at exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def median(xs: Sequence[float]) -> float:
    """The median (NaN for an empty list): robust to the outlier steps of a shared, noisy machine."""
    return statistics.median(xs) if xs else float("nan")


@dataclass
class Timer:
    """Wall-clock laps (``time.perf_counter``)."""

    laps: list[float] = field(default_factory=list)

    def time(self, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self.laps.append(time.perf_counter() - t0)
        return out


def set_threads(n: int | None) -> int:
    """Set torch's intra-op threads (default: the machine's cores); returns the number in use."""
    import torch

    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def matmul_peak(dtype: str = "bfloat16", n: int = 2048, iters: int = 6, device: str = "cpu") -> float:
    """Achieved FLOP/s of an ``n x n x n`` matmul in ``dtype``: the best of ``iters`` after a warm-up.

    This is the practical peak the update step is compared with (``2 n^3`` FLOPs per matmul).
    The best, not the median, because the peak is what the hardware can do when nothing else
    interferes.
    """
    import torch

    dt = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "float16": torch.float16,
    }[dtype]
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        (a @ b).sum()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def sync(device: str | Any) -> None:
    """Wait for queued GPU work (no-op on CPU) so wall-clock timings are real."""
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def machine_info() -> dict[str, Any]:
    """CPU model and its precision flags, cores, torch/transformers versions, GPU name when present."""
    from flowgrpo.modeling.hardware import NUMERIC_CPU_FLAGS, cpu_flags, cpu_model

    flags = cpu_flags()
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "cpu_flags": [f for f in NUMERIC_CPU_FLAGS if f in flags],
    }
    try:
        import torch
        import transformers

        info["torch"] = torch.__version__
        info["transformers"] = transformers.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    info["glibc_tunables"] = os.environ.get("GLIBC_TUNABLES", "")
    return info


def load_policy(model: str, *, dtype: str = "float32", device: str = "cpu", seed: int = 0) -> tuple[Any, Any]:
    """The benchmark policy: ``smollm2-135m`` (the embedded model), ``tiny`` (tests), or
    ``random-0.5b`` (a randomly initialised Qwen2-0.5B-shaped model built from a config, for
    GPU runs; no download). The tokenizer of ``random-0.5b`` is SmolLM2's (its vocabulary
    size is used for the embedding)."""
    import torch

    from flowgrpo.modeling.models import load_model, tiny_model

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    if model == "tiny":
        m, tok = tiny_model(seed=seed)
    elif model == "random-0.5b":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        _, tok = load_model("smollm2-135m")
        cfg = Qwen2Config(
            vocab_size=len(tok),
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        torch.manual_seed(seed)
        m = Qwen2ForCausalLM(cfg)
        m.generation_config.pad_token_id = tok.pad_token_id
    else:
        m, tok = load_model(model)
    m = m.to(dt)
    if device != "cpu":
        m = m.to(device)
    return m, tok


def fmt_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A GitHub-markdown table."""

    def cell(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
        return str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _main(argv: Sequence[str] | None = None) -> int:
    """A minimal child for testing :func:`run_child`: holds ``--alloc-mb`` MB resident, reports it."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--child", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--alloc-mb", type=int, default=0)
    a = p.parse_args(argv)
    block = bytearray(a.alloc_mb * 1024 * 1024)
    for i in range(0, len(block), 4096):  # touch every page so it is resident
        block[i] = 1
    write_child_result(a.out, {"allocated_mb": a.alloc_mb, "pid": os.getpid()})
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
