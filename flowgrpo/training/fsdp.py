"""FSDP2 for the trained policy under ``torchrun`` (``train.parallel: fsdp2``).

Data parallelism (:mod:`flowgrpo.training.distributed`) keeps the whole model, its gradients and AdamW's two
moments on every rank: 16 bytes per fp32 parameter. With ``fsdp2`` the *trained* copy is sharded
with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``, one unit per decoder layer plus a
root unit): each rank holds ``1/N`` of the parameters, gradients and moments, and gathers a
layer's weights only while that layer runs. Rollout, evaluation, the reference and the warm start
keep using the run's full model, which every rank refreshes from the shards after each update
(verl's hybrid engine keeps a separate inference copy the same way). Per fp32 parameter and rank:
4 bytes for the full copy plus ``16 / N`` for the shards (parameter, gradient, two moments), instead
of 16; plus, transiently, the gathered weights of the layer that runs.

Two things make the trained copy a module of its own (:class:`LogprobModule`):

- FSDP2 gathers a unit's parameters in that unit's ``forward`` hooks, and
  :func:`flowgrpo.modeling.logprobs.action_logprobs` runs the backbone and the chunked LM head outside the
  Hugging Face model's ``forward``. Wrapping the computation in a module's ``forward`` puts both
  inside the root unit, which also owns the embedding and the tied LM head (FSDP2 wants a tied
  parameter in one unit).
- every rank must run the same collectives in the same order, so a rank with fewer micro-batches
  than another runs empty ones (:meth:`ShardedPolicy.idle_pass`).

The gradient a rank computes is its share of the 1-rank gradient (the aggregation weights are over
the global mini-batch), so the shards must hold the *sum* over ranks. FSDP2's reduce-scatter
averages; a divide factor of 1 needs ``PREMUL_SUM``, which gloo lacks, so the loss is scaled by the
world size instead (:attr:`ShardedPolicy.loss_scale`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from flowgrpo.modeling.logprobs import action_logprobs, split_model

PREFIX = "lm."  # the wrapped model's name inside LogprobModule


class LogprobModule(nn.Module):
    """``forward(input_ids, attention_mask, loss_mask, **kw) -> (logprobs, entropy)``: the policy's
    :func:`~flowgrpo.modeling.logprobs.action_logprobs` as a module (one backbone pass per row:
    ``share_prefix`` off, so every layer runs once per forward)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.lm = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, **kw: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return action_logprobs(self.lm, input_ids, attention_mask, loss_mask, share_prefix=False, **kw)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The repeated blocks of a transformers causal LM (``model.model.layers``): one FSDP unit each."""
    backbone, _ = split_model(model)
    layers = getattr(backbone, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"train.parallel=fsdp2 shards one unit per decoder layer, but {type(backbone).__name__} has no "
            "`layers` ModuleList; use train.parallel=ddp for this model"
        )
    return layers


class ShardedPolicy:
    """The trained copy of ``model``, sharded over the process group with FSDP2.

    Args:
        model: the run's full policy (copied; the copy is sharded, ``model`` is left whole).
        world_size: ranks in the process group.
        device: this rank's device (the policy's): the mesh is of its type, so a CPU run on a GPU
            machine shards over gloo on the CPU and a CUDA run over NCCL on ``cuda:LOCAL_RANK``.
    """

    def __init__(self, model: nn.Module, world_size: int, device: torch.device | str = "cpu") -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self.device = torch.device(device)
        mesh = init_device_mesh(self.device.type, (world_size,))
        self.module = LogprobModule(copy.deepcopy(model))
        for layer in decoder_layers(self.module.lm):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.module, mesh=mesh)
        self.loss_scale = float(world_size)

    def parameters(self) -> list[torch.Tensor]:
        """The local shards (DTensors) of the trainable parameters: what the optimizer steps."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, **kw: Any
    ):
        return self.module(input_ids, attention_mask, loss_mask, **kw)

    def idle_pass(self, pad_id: int) -> None:
        """A forward and backward that contributes nothing (zero loss on two pad tokens): run by a
        rank that has no micro-batch left while others do, so every rank gathers and reduces the
        same units the same number of times."""
        ids = torch.full((1, 2), pad_id, dtype=torch.long, device=self.device)  # (1, 2)
        lp, _ = self.logprobs(ids, torch.ones_like(ids), torch.tensor([[0.0, 1.0]], device=self.device))
        (lp.sum() * 0.0).backward()

    def load_from(self, model: nn.Module) -> None:
        """Shard ``model``'s weights into the trained copy (every rank holds the same full weights,
        so each takes its shard locally)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        full = {PREFIX + k: v for k, v in model.state_dict().items()}
        set_model_state_dict(self.module, full, options=StateDictOptions(full_state_dict=True))

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Gather the trained weights (an all-gather on every rank) into the full ``model``."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True))
        model.load_state_dict({k[len(PREFIX) :]: v for k, v in full.items()})

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The whole optimizer state, keyed by parameter name (a collective: every rank calls it)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            self.module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Shard a whole optimizer state written by :meth:`optimizer_state` (any number of ranks)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            self.module, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True)
        )


__all__ = ["LogprobModule", "ShardedPolicy", "decoder_layers"]
