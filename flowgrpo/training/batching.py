"""Trajectories -> training rows -> token-budgeted micro-batches.

Prefix merging: the turns of an episode continue each other's context (turn k's context is every
earlier ``prompt_ids + action_ids`` followed by its own ``prompt_ids``), so the whole episode is one
row ``concat(prompt_ids_k + action_ids_k for k)`` and one causal forward pass scores every action
with exactly the context it was sampled from. A turn with ``resets_context`` starts a new row (its
``prompt_ids`` are its whole context). The loss mask is 1 on action tokens only; each token carries
its turn's advantage, the sampler's logprob (``old_logprobs``), its trajectory (``seq_index``) and
its turn number (``turn_index``), which is all :func:`flowgrpo.algorithms.loss.policy_loss` needs to aggregate
per token, per trajectory or per turn. ``pack=False`` gives one row per turn (the same loss, more
compute: the context is re-encoded for every turn; useful as a reference and in tests).

Micro-batches hold at most ``token_budget`` padded tokens (``B * T_max``); rows are sorted by length
so rows of similar length share a micro-batch, padded on the right with an attention mask. The
aggregation weights are computed once over all rows of the mini-batch, so the sum of the
micro-batch losses is exactly the mini-batch loss (gradient accumulation without approximation).

Every tensor is created on the ``device`` the caller names (the policy's: ``Components.device``),
from padded Python lists in one host-to-device copy per field; nothing is built on the CPU and
moved later, and no model input crosses devices.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from flowgrpo.algorithms.loss import Aggregation, aggregation_weights
from flowgrpo.types import Trajectory

log = logging.getLogger(__name__)


@dataclass
class Row:
    """One training sequence (a packed episode, or the part of one after a context reset)."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 on action tokens
    advantages: list[float]  # per token (the token's turn's advantage; 0 off the mask)
    old_logprobs: list[float]  # the sampler's logprob of each action token; 0 off the mask
    turn_index: list[int]  # the turn each token belongs to, within its trajectory
    seq_index: int  # the trajectory (dense index within the batch of rows)
    traj_id: str = ""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_action_tokens(self) -> int:
        return sum(self.loss_mask)


def trajectory_rows(
    traj: Trajectory, seq_index: int, *, pack: bool = True, require_advantages: bool = True
) -> list[Row]:
    """The rows of one trajectory: one per context segment when ``pack`` else one per turn."""
    rows: list[Row] = []
    cur: Row | None = None
    for k, turn in enumerate(traj.turns):
        if turn.advantage is None and require_advantages:
            raise ValueError(
                f"trajectory {traj.id} turn {k} has no advantage: call flowgrpo.algorithms.advantages."
                "compute_advantages(groups, ...) before building training rows"
            )
        adv = float(turn.advantage or 0.0)
        if not pack or cur is None or turn.resets_context:
            cur = Row([], [], [], [], [], seq_index, traj.id)
            rows.append(cur)
        # Unpacked rows re-encode the whole context; packed rows only add what is new.
        ctx = traj.context_ids(k) if not pack else turn.prompt_ids
        n = len(ctx)
        cur.input_ids += ctx
        cur.loss_mask += [0] * n
        cur.advantages += [0.0] * n
        cur.old_logprobs += [0.0] * n
        cur.turn_index += [k] * n
        if not cur.input_ids and turn.action_ids:
            raise ValueError(
                f"trajectory {traj.id} turn {k} has an action but no context: the first token of a row "
                "cannot be scored; every row must start with prompt tokens"
            )
        a = len(turn.action_ids)
        cur.input_ids += turn.action_ids
        cur.loss_mask += [1] * a
        cur.advantages += [adv] * a
        cur.old_logprobs += list(turn.action_logprobs)
        cur.turn_index += [k] * a
    return [r for r in rows if r.num_action_tokens > 0]


def build_rows(
    trajectories: Iterable[Trajectory], *, pack: bool = True, require_advantages: bool = True
) -> list[Row]:
    """Rows for a list of trajectories; ``seq_index`` is the trajectory's position in the list."""
    rows: list[Row] = []
    for i, t in enumerate(trajectories):
        rows += trajectory_rows(t, i, pack=pack, require_advantages=require_advantages)
    return rows


@dataclass
class MicroBatch:
    """Right-padded tensors for a few rows. Shapes: ``(B, T)`` unless noted."""

    input_ids: torch.Tensor  # long
    attention_mask: torch.Tensor  # long, 1 on real tokens
    loss_mask: torch.Tensor  # float, 1 on action tokens
    advantages: torch.Tensor  # float
    old_logprobs: torch.Tensor  # float (the sampler's)
    turn_index: torch.Tensor  # long
    seq_index: torch.Tensor  # (B,) long
    token_weights: torch.Tensor  # float: aggregation weights over the whole mini-batch
    rows: list[Row]

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens."""
        return int(self.attention_mask.sum())

    @property
    def num_action_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device: torch.device | str) -> MicroBatch:
        """A copy on ``device`` (for tests and tools; the trainer builds micro-batches in place)."""
        f = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return MicroBatch(**f)


def _pad(
    rows: Sequence[Row],
    field: str,
    fill,
    dtype: torch.dtype,
    T: int,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``(len(rows), T)``: each row's ``field`` right-padded with ``fill``, created on ``device``."""
    return torch.tensor(
        [(v := getattr(r, field)) + [fill] * (T - len(v)) for r in rows], dtype=dtype, device=device
    )


def collate(
    rows: Sequence[Row],
    *,
    pad_id: int = 0,
    token_weights: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> MicroBatch:
    """Right-pad ``rows`` into one :class:`MicroBatch` on ``device`` (default the CPU); the
    weights default to a token mean."""
    T = max(len(r) for r in rows)
    mask = _pad(rows, "loss_mask", 0, torch.float32, T, device)  # (B, T)
    attn = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows], dtype=torch.long, device=device)
    if token_weights is None:
        token_weights = mask / mask.sum().clamp_min(1.0)  # (B, T)
    return MicroBatch(
        input_ids=_pad(rows, "input_ids", pad_id, torch.long, T, device),
        attention_mask=attn,
        loss_mask=mask,
        advantages=_pad(rows, "advantages", 0.0, torch.float32, T, device),
        old_logprobs=_pad(rows, "old_logprobs", 0.0, torch.float32, T, device),
        turn_index=_pad(rows, "turn_index", 0, torch.long, T, device),
        seq_index=torch.tensor([r.seq_index for r in rows], dtype=torch.long, device=device),  # (B,)
        token_weights=token_weights,
        rows=list(rows),
    )


def micro_batches(
    rows: Sequence[Row],
    token_budget: int,
    *,
    agg: Aggregation = "token_mean",
    norm_len: int | None = None,
    pad_id: int = 0,
    weights_over: Sequence[Row] | None = None,
    device: torch.device | str | None = None,
) -> list[MicroBatch]:
    """Split the rows of one mini-batch into micro-batches of at most ``token_budget`` padded tokens.

    The aggregation weights (``agg``, see :func:`flowgrpo.algorithms.loss.aggregation_weights`) are computed
    over *all* rows, so ``sum(policy_loss(mb, token_weights=mb.token_weights))`` over the returned
    micro-batches equals the loss of the whole mini-batch. A row longer than the budget gets a
    micro-batch of its own (with a warning).

    ``weights_over``: the whole mini-batch when ``rows`` are only part of it (a data-parallel rank's
    rows, :mod:`flowgrpo.training.distributed`): the weights are normalised over ``weights_over`` (which must
    contain every row of ``rows``, by identity), so the ranks' losses sum to the whole batch's.

    ``device``: where every tensor is created (the model's; default the CPU).
    """
    if not rows:
        return []
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    basis = list(weights_over) if weights_over is not None else list(rows)
    # Weights over the whole mini-batch: one padded int tensor (cheap: no activations).
    T = max(len(r) for r in basis)
    mask = _pad(basis, "loss_mask", 0, torch.float32, T, device)  # (N, T)
    w_all = aggregation_weights(
        mask,
        agg,
        seq_index=torch.tensor([r.seq_index for r in basis], dtype=torch.long, device=device),  # (N,)
        turn_index=_pad(basis, "turn_index", 0, torch.long, T, device),
        norm_len=norm_len,
    )  # (N, T)
    if weights_over is not None:
        at = {id(r): i for i, r in enumerate(basis)}
        w_all = w_all[
            torch.tensor([at[id(r)] for r in rows], dtype=torch.long, device=w_all.device)
        ]  # (len(rows), T)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    groups: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        n = len(rows[i])
        if n > token_budget:
            log.warning(
                "a row of %d tokens exceeds micro_batch_tokens=%d: it gets its own micro-batch",
                n,
                token_budget,
            )
        new_max = max(cur_max, n)
        if cur and new_max * (len(cur) + 1) > token_budget:
            groups.append(cur)
            cur, new_max = [], n
        cur.append(i)
        cur_max = new_max
    if cur:
        groups.append(cur)
    out = []
    for g in groups:
        sel = [rows[i] for i in g]
        Tg = max(len(r) for r in sel)
        idx = torch.tensor(g, dtype=torch.long, device=w_all.device)  # (B,)
        out.append(collate(sel, pad_id=pad_id, token_weights=w_all[idx, :Tg].clone(), device=device))
    return out


__all__ = ["MicroBatch", "Row", "build_rows", "collate", "micro_batches", "trajectory_rows"]
