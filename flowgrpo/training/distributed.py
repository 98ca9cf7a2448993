"""Data-parallel training under ``torchrun`` (``torch.distributed``), as verl/TRL users run it.

``torchrun --nproc_per_node N -m flowgrpo train CONFIG`` starts N ranks (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` in the environment). Each rank:

- rolls out a contiguous shard (:func:`shard`) of every rollout round's tasks; the task stream is
  the same global sequence on every rank, so the global batch is a 1-rank run's;
- scores its groups, then all-gathers them (:func:`gather_groups`): every rank holds the whole batch
  in task order, so episode rules, advantages, the curriculum's pass rates, metrics and the
  mini-batch permutation are the 1-rank run's, computed identically on every rank;
- computes the aggregation weights of :func:`flowgrpo.algorithms.loss.aggregation_weights` over the *global*
  mini-batch (``flowgrpo.training.batching.micro_batches(weights_over=...)``; token counts, trajectory counts
  and Dr.GRPO's length come from all ranks' rows) and back-propagates only its own rows, so the
  per-rank gradients *sum* to the 1-rank gradient;
- sums gradients across ranks (:func:`all_reduce_gradients`: DDP's collective, one all-reduce of
  flat buckets per optimizer step) before clipping and the optimizer step, which then run
  identically on every rank; a non-finite loss or gradient on any rank skips the step on all.

Why not ``torch.nn.parallel.DistributedDataParallel`` around the model: DDP arms its gradient hooks
in ``DDP.forward``, and :mod:`flowgrpo.modeling.logprobs` runs the backbone and the chunked LM head
separately (no full-vocabulary logits), so the wrapper's forward is never called; DDP also
all-reduces after *every* backward, while a rank here runs as many micro-batches as its shard needs
(possibly none). Summing the accumulated gradients once is the same collective with the same
result, without those constraints.

Rank 0 alone writes (metrics, trajectories, checkpoints, evaluations, the report); every rank
resumes from the same checkpoint, and :func:`broadcast_parameters` makes the starting weights rank
0's before the first step.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from flowgrpo.types import TrajectoryGroup

# Gradients are summed in buckets of this many elements (400 MB of fp32): the flat copy stays
# bounded for large models, while small models need one collective per optimizer step.
BUCKET_ELEMENTS = 100_000_000


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job (``world_size == 1``: not distributed)."""

    rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one rank that writes the run directory."""
        return self.rank == 0


def context() -> DistContext:
    """The initialised process group's rank and size, or a single process."""
    if dist.is_available() and dist.is_initialized():
        return DistContext(dist.get_rank(), dist.get_world_size())
    return DistContext()


def init_from_env(device: torch.device | str = "cpu") -> DistContext:
    """Join the process group ``torchrun`` describes in the environment (``WORLD_SIZE`` > 1), with
    ``nccl`` for CUDA and ``gloo`` otherwise; a no-op in a plain process or when the group already
    exists. ``device``: this rank's, as :func:`flowgrpo.modeling.hardware.resolve_device` gives it under
    torchrun (``cuda:LOCAL_RANK``: one GPU per rank); it becomes the current CUDA device, which NCCL's
    object collectives (:func:`gather_groups`) and barriers use."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"WORLD_SIZE={world} but {', '.join(missing)} unset: launch with "
                "`torchrun --nproc_per_node N -m flowgrpo train CONFIG`"
            )
        dev = torch.device(device)
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.set_device(dev if dev.index is not None else int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    return context()


def shard(n: int, rank: int, world_size: int) -> range:
    """The contiguous indices of ``n`` items that ``rank`` owns: the first ``n % world_size`` ranks
    take one more, so shard sizes differ by at most one and their concatenation in rank order is
    ``range(n)``."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def gather_groups(groups: list[TrajectoryGroup], ctx: DistContext) -> list[TrajectoryGroup]:
    """Every rank's groups, concatenated in rank order (with :func:`shard`: task order), on every
    rank; the groups themselves when not distributed."""
    if not ctx.enabled:
        return groups
    parts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(parts, groups)
    return [g for part in parts for g in part]


def all_reduce_gradients(params: Sequence[torch.Tensor], finite: bool, ctx: DistContext) -> bool:
    """Sum the ``.grad`` of ``params`` over ranks in place (a missing gradient counts as zeros and
    is created) and return whether every rank's loss and gradient were finite."""
    if not ctx.enabled:
        return finite
    device = params[0].device if params else torch.device("cpu")
    for bucket in _buckets(params):
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(torch.float32)
                for p in bucket
            ]
        )  # (sum of numels,)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in bucket:
            g = flat[offset : offset + p.numel()].view_as(p).to(p.dtype)
            offset += p.numel()
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
    return all_finite(finite, ctx, device=device)


def all_finite(finite: bool, ctx: DistContext, *, device: torch.device | str = "cpu") -> bool:
    """Whether every rank's loss and gradient were finite (each passes its own ``finite``).
    ``device``: the policy's (NCCL reduces CUDA tensors only)."""
    if not ctx.enabled:
        return finite
    flag = torch.tensor([0.0 if finite else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.SUM)
    return bool(flag.item() == 0.0)


def max_over_ranks(value: int, ctx: DistContext, *, device: torch.device | str = "cpu") -> int:
    """The largest of the ranks' ``value`` (e.g. micro-batches to run), on every rank.
    ``device``: the policy's (NCCL reduces CUDA tensors only)."""
    if not ctx.enabled:
        return value
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _buckets(params: Sequence[torch.Tensor]) -> Iterable[list[torch.Tensor]]:
    cur: list[torch.Tensor] = []
    size = 0
    for p in params:
        if cur and size + p.numel() > BUCKET_ELEMENTS:
            yield cur
            cur, size = [], 0
        cur.append(p)
        size += p.numel()
    if cur:
        yield cur


def sum_over_ranks(values: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """Key-wise sums of per-rank scalars (a key missing on a rank counts as 0), in sorted key order
    so every rank adds the same numbers in the same order."""
    if not ctx.enabled:
        return values
    parts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(parts, values)
    keys = sorted({k for part in parts for k in part})
    return {k: sum(float(part.get(k, 0.0)) for part in parts) for k in keys}


def broadcast_parameters(model: torch.nn.Module, ctx: DistContext) -> None:
    """Make every rank's parameters and buffers rank 0's (after a resume or a warm start, before the
    first step), so the ranks start, and by identical updates stay, in step."""
    if not ctx.enabled:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def barrier(ctx: DistContext) -> None:
    """Wait until every rank has arrived (a no-op in a single process)."""
    if ctx.enabled:
        dist.barrier()


def check_supported(config: Any, ctx: DistContext) -> None:
    """Refuse, with what to change, the options whose data-parallel form is not implemented."""
    if not ctx.enabled:
        return
    problems = []
    if config.train.async_staleness:
        problems.append("train.async_staleness > 0 (set train.async_staleness=0)")
    if config.algorithm.entropy_top_q is not None:
        problems.append("algorithm.entropy_top_q (its threshold is over the whole batch; unset it)")
    if config.algorithm.name == "ppo":
        problems.append("algorithm.name=ppo (its critic; use a group estimator such as flow_grpo)")
    if config.train.parallel == "fsdp2" and config.model.lora is not None:
        problems.append(
            "model.lora with train.parallel=fsdp2 (LoRA's few trainable weights fit every rank: use ddp)"
        )
    if config.sft.replay_coef:
        problems.append("sft.replay_coef (every rank would replay the same demonstrations; set it to 0)")
    if config.rollout.backend == "openai" and config.rollout.server.weight_sync_dir:
        problems.append("rollout.server.weight_sync_dir (every rank would push weights to the server)")
    if problems:
        raise ValueError(f"not supported with {ctx.world_size} ranks under torchrun: " + "; ".join(problems))


__all__ = [
    "BUCKET_ELEMENTS",
    "DistContext",
    "all_finite",
    "all_reduce_gradients",
    "barrier",
    "broadcast_parameters",
    "check_supported",
    "context",
    "gather_groups",
    "init_from_env",
    "max_over_ranks",
    "shard",
    "sum_over_ranks",
]
