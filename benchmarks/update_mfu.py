"""Model FLOPs utilisation (MFU) of the update step: achieved FLOP/s of forward + backward on packed
rows, against this machine's bf16 matmul peak measured in the same run.

What is timed: :func:`flowgrpo.modeling.logprobs.action_logprobs` (or, for comparison, full-vocabulary logits)
+ :func:`flowgrpo.algorithms.loss.policy_loss` + ``backward()`` on rows shaped like packed multi-turn episodes
(a 150-token system+question prompt, then 40-token actions each followed by a 20-token observation,
repeated to the row length; about 2/3 of the tokens after the prompt are action tokens). The AdamW
step is timed separately (it is memory-bound, not matmul work) and reported next to it.

FLOPs are counted analytically, per row of ``T`` tokens with ``n`` scored (action) positions::

    dense   = 6 * P_lin * T                 # every nn.Linear of the backbone (q, k, v, o, gate,
                                            # up, down); fwd 2 FLOPs per weight per token, bwd 4
    attn    = 6 * L * d_attn * T * (T + 1)  # QK^T and AV, causal (half of the T x T square):
                                            # fwd 2 * 2 * d_attn * T(T+1)/2 per layer, bwd 2x fwd
    lm_head = 6 * d * V * n                 # only the n positions whose logits we compute
                                            # (n = T with full-vocabulary logits)

``d_attn = num_heads * head_dim`` (grouped KV heads do not reduce the score FLOPs). PaLM's MFU
(Chowdhery et al. 2022, appendix B) counts the attention square in full (``12 * L * d * T^2``);
we count the causal half that is actually computed, which gives the lower (conservative) figure.
Embedding lookups, norms, rotary and activation functions are not counted (they are not matmuls);
they are exactly what compilation can fuse away. MFU = counted FLOPs / seconds / measured peak.

The peak is the best ``2048^3`` matmul rate of the compute dtype in this process (same threads,
same moment): bf16 for ``bf16``/``amp`` runs, fp32 for ``fp32`` runs.

Configurations (each one a row of the printed table; ``--configs`` picks a subset):
``fp32``: fp32 weights (compared with the fp32 peak; the default on CPUs without avx512_bf16/AMX,
where bf16 matmuls take a slow fallback path), ``amp``: fp32 master weights + bf16 autocast,
``bf16``: bf16 weights,
``T=...``: row length at a fixed number of tokens per step, ``full-logits``: the model's own
forward with full-vocabulary logits + log-softmax + gather (what TRL does), ``compile``: each
decoder layer ``torch.compile``-d (compile time reported separately), ``threads=1``.

    python -m benchmarks.update_mfu              # ~4 min on 2 cores
    python -m benchmarks.update_mfu --quick      # ~1 min
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import fmt_table, load_policy, machine_info, matmul_peak, median, set_threads, sync

PROMPT, ACTION, OBS = 150, 40, 20


@dataclass
class ModelShape:
    """What the FLOP count needs from a model config."""

    layers: int
    hidden: int
    attn_dim: int  # num_heads * head_dim
    vocab: int
    linear_params: int  # weights of every nn.Linear in the backbone

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        import torch

        from flowgrpo.modeling.logprobs import split_model

        c = model.config
        backbone, _ = split_model(model)
        lin = sum(m.weight.numel() for m in backbone.modules() if isinstance(m, torch.nn.Linear))
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.num_hidden_layers, c.hidden_size, c.num_attention_heads * head_dim, c.vocab_size, lin)


def train_flops(shape: ModelShape, T: int, scored: int, *, causal: bool = True) -> float:
    """FLOPs of forward + backward of one row of ``T`` tokens with ``scored`` LM-head positions
    (the formula in the module docstring; ``causal=False`` gives PaLM's full-square count)."""
    dense = 6.0 * shape.linear_params * T
    attn = (
        6.0 * shape.layers * shape.attn_dim * T * (T + 1)
        if causal
        else 12.0 * shape.layers * shape.attn_dim * T * T
    )
    head = 6.0 * shape.hidden * shape.vocab * scored
    return dense + attn + head


def action_mask_row(T: int) -> list[int]:
    """Loss mask of a synthetic packed episode of ``T`` tokens: prompt, then (action, observation)*."""
    m = [0] * max(
        1, min(PROMPT, T - ACTION)
    )  # a short row keeps room for one action (else it trains nothing)
    while len(m) < T:
        m += [1] * ACTION + [0] * OBS
    m = m[:T]
    m[0] = 0
    return m


def make_batch(T: int, rows: int, vocab: int, device: str, seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, T), generator=g)  # (B, T)
    mask = torch.tensor([action_mask_row(T)] * rows, dtype=torch.float32)  # (B, T)
    old = -torch.rand(rows, T, generator=g) * mask  # (B, T) plausible sampler logprobs
    adv = torch.randn(rows, 1, generator=g).expand(rows, T).contiguous()  # (B, T)
    return {k: v.to(device) for k, v in {"ids": ids, "mask": mask, "old": old, "adv": adv}.items()}


def full_logits_logprobs(model: Any, ids: Any, autocast_dtype: str | None) -> Any:
    """Logprobs of every next token from the model's own full-vocabulary logits (the usual way)."""
    import torch

    from flowgrpo.modeling.logprobs import autocast_context

    with autocast_context(autocast_dtype, ids.device.type):
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()  # (B, T-1, V)
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    return torch.nn.functional.pad(lp, (1, 0))  # (B, T): position t scores token t


@dataclass
class MFUResult:
    config: str
    weights: str
    T: int
    rows: int
    threads: int
    fwd_bwd_s: float
    optimizer_s: float
    tflops: float  # counted training FLOPs per fwd+bwd
    achieved_gflops: float
    mfu: float  # vs the matmul peak of the compute dtype (fp32 weights: fp32 peak; bf16/amp: bf16 peak)
    mfu_palm: float  # the same with PaLM's full-square attention count
    compile_s: float = 0.0


def measure(
    name: str,
    *,
    model_name: str,
    weights: str,
    T: int,
    tokens: int,
    full_logits: bool = False,
    compile: bool = False,
    threads: int | None = None,
    reps: int = 3,
    device: str = "cpu",
    peak: float | dict[str, float],
) -> MFUResult:
    """Time ``reps`` forward+backward passes (after one warm-up) of one configuration."""
    import torch

    from flowgrpo.algorithms.loss import policy_loss
    from flowgrpo.modeling.logprobs import action_logprobs

    prev_threads = torch.get_num_threads()
    n_threads = set_threads(threads) if threads else prev_threads
    model, _ = load_policy(model_name, dtype="bfloat16" if weights == "bf16" else "float32", device=device)
    peak = peak if isinstance(peak, float) else peak["fp32" if weights == "fp32" else "bf16"]
    model.train()
    autocast = "bfloat16" if weights == "amp" else None
    shape = ModelShape.of(model)
    rows = max(1, tokens // T)
    batch = make_batch(T, rows, shape.vocab, device)
    compile_s = 0.0
    if compile:
        for layer in model.model.layers:
            layer.compile(dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)

    def fwd_bwd() -> None:
        if full_logits:
            lp = full_logits_logprobs(model, batch["ids"], autocast)
        else:
            lp, _ = action_logprobs(model, batch["ids"], None, batch["mask"], autocast_dtype=autocast)
        loss, _ = policy_loss(lp, batch["old"], batch["adv"], batch["mask"])
        loss.backward()
        sync(device)

    t0 = time.perf_counter()
    fwd_bwd()  # warm-up (and compilation)
    if compile:
        compile_s = time.perf_counter() - t0
    times, opt_times = [], []
    for _ in range(reps):
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        fwd_bwd()
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        opt.step()
        sync(device)
        opt_times.append(time.perf_counter() - t0)
    scored = int(batch["mask"][0, 1:].sum())
    n_scored = T if full_logits else scored
    flops = rows * train_flops(shape, T, n_scored)
    flops_palm = rows * train_flops(shape, T, n_scored, causal=False)
    s = median(times)
    if threads:
        set_threads(prev_threads)
    return MFUResult(
        name,
        weights,
        T,
        rows,
        n_threads,
        s,
        median(opt_times),
        flops / 1e12,
        flops / s / 1e9,
        flops / s / peak,
        flops_palm / s / peak,
        compile_s,
    )


CONFIGS: dict[str, dict[str, Any]] = {
    "fp32-T512": {"weights": "fp32", "T": 512},
    "fp32-T512-full-logits": {"weights": "fp32", "T": 512, "full_logits": True},
    "fp32-T128": {"weights": "fp32", "T": 128},
    "fp32-T2048": {"weights": "fp32", "T": 2048},
    "fp32-T512-compile": {"weights": "fp32", "T": 512, "compile": True},
    "fp32-T512-threads1": {"weights": "fp32", "T": 512, "threads": 1},
    "amp-T512": {"weights": "amp", "T": 512},
    "amp-T512-full-logits": {"weights": "amp", "T": 512, "full_logits": True},
    "bf16-T512": {"weights": "bf16", "T": 512},
    "amp-T128": {"weights": "amp", "T": 128},
    "amp-T2048": {"weights": "amp", "T": 2048},
    "bf16-T2048": {"weights": "bf16", "T": 2048},
    "bf16-T512-compile": {"weights": "bf16", "T": 512, "compile": True},
    "amp-T512-compile": {"weights": "amp", "T": 512, "compile": True},
    "bf16-T512-threads1": {"weights": "bf16", "T": 512, "threads": 1},
}
QUICK = ["amp-T512", "bf16-T512", "bf16-T2048"]
QUICK_FP32 = ["fp32-T512", "fp32-T512-full-logits", "fp32-T2048"]


def default_configs(fast_bf16: bool) -> list[str]:
    """bf16/amp configurations where bf16 matmuls are fast, fp32 ones elsewhere (AVX2-only CPUs)."""
    return [n for n, c in CONFIGS.items() if (c["weights"] != "fp32") == fast_bf16]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m | random-0.5b (GPU) | tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=2048, help="tokens per fwd+bwd (rows = tokens // T)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--configs", default=None, help=f"comma-separated subset of {','.join(CONFIGS)}")
    p.add_argument("--quick", action="store_true", help=f"only {','.join(QUICK)}, 2 reps")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    import torch

    set_threads(a.threads)
    from flowgrpo.modeling.hardware import fast_bf16

    native_bf16 = fast_bf16(a.device)
    if a.configs:
        names = a.configs.split(",")
    elif a.quick:
        names = QUICK if native_bf16 else QUICK_FP32
    else:
        names = default_configs(native_bf16)
    reps = 2 if a.quick else a.reps
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown configs {unknown}; choose from {list(CONFIGS)}")
    info = machine_info()
    # A slow bf16 fallback (AVX2-only CPU) would take minutes at 2048^3: measure it smaller there.
    peak_bf16 = matmul_peak(
        "bfloat16", n=2048 if native_bf16 else 256, iters=6 if native_bf16 else 1, device=a.device
    )
    peak_fp32 = matmul_peak("float32", device=a.device)
    print(
        f"machine: {info.get('cpu') or info.get('gpu')}, {torch.get_num_threads()} threads; matmul peak "
        f"bf16 {peak_bf16 / 1e9:.1f} GFLOP/s, fp32 {peak_fp32 / 1e9:.0f} GFLOP/s (fast bf16: {native_bf16})",
        flush=True,
    )
    results = []
    for n in names:
        with contextlib.suppress(KeyboardInterrupt):
            r = measure(
                n,
                model_name=a.model,
                tokens=a.tokens,
                reps=reps,
                device=a.device,
                peak={"bf16": peak_bf16, "fp32": peak_fp32},
                **CONFIGS[n],
            )
            results.append(r)
            print(
                f"  {n:22s} fwd+bwd {r.fwd_bwd_s:6.2f} s  {r.achieved_gflops:6.0f} GFLOP/s  MFU {r.mfu:5.1%}"
                + (f"  (compile {r.compile_s:.0f} s)" if r.compile_s else ""),
                flush=True,
            )
    print()
    print(
        fmt_table(
            [
                [
                    r.config,
                    r.T,
                    r.rows,
                    r.threads,
                    r.fwd_bwd_s,
                    r.optimizer_s,
                    r.tflops,
                    r.achieved_gflops,
                    f"{r.mfu:.1%}",
                    f"{r.mfu_palm:.1%}",
                    f"{r.compile_s:.0f}" if r.compile_s else "",
                ]
                for r in results
            ],
            [
                "config",
                "T",
                "rows",
                "threads",
                "fwd+bwd s",
                "AdamW s",
                "TFLOP",
                "GFLOP/s",
                "MFU (own dtype peak)",
                "MFU PaLM-count",
                "compile s",
            ],
        )
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "machine": info,
                    "peak_bf16": peak_bf16,
                    "peak_fp32": peak_fp32,
                    "results": [asdict(r) for r in results],
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
