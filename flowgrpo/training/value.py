"""PPO's critic: a value model over the policy's token stream, its GAE targets and its update.

Two layouts (``algorithm.ppo.value_model``), as in the PPO figure of the seeds and TRL/verl:

- ``separate`` (the default, as TRL's ``PPOTrainer`` and verl's critic): a copy of the policy's
  backbone (or the backbone of a local HF model, ``value_model_path``) with a scalar head, trained
  by its own optimizer. Twice the parameters; the policy's features are untouched by the value loss.
- ``shared``: a scalar head on the policy's own backbone. The value loss (scaled by ``vf_coef``)
  back-propagates into the policy's backbone; one extra backbone pass per micro-batch.

The value of action token ``t`` is ``V(s_t)``, the state before that token was sampled, read from
the hidden state at position ``t - 1`` (the position that predicts token ``t``, as in
:mod:`flowgrpo.modeling.logprobs`). Values exist at action tokens only; GAE (:func:`flowgrpo.algorithms.ppo.gae`) runs
over the action tokens of each episode, skipping prompt and observation tokens.

The trainer calls :meth:`Critic.prepare` once per rollout batch (values, rewards on tokens, GAE,
whitening; it writes the per-token advantages into the rows), then :meth:`Critic.loss` in every
micro-batch and :meth:`Critic.step` after every optimizer step.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from flowgrpo.algorithms.ppo import explained_variance, gae, masked_whiten, value_loss
from flowgrpo.config import PPOConfig, TrainConfig
from flowgrpo.modeling.logprobs import autocast_context, split_model
from flowgrpo.training.batching import MicroBatch, Row, collate
from flowgrpo.types import Trajectory


class ValueHead(torch.nn.Module):
    """``h -> w . h + b``: one scalar per position. Zero-initialised, so every value starts at 0
    and the first advantages are the discounted rewards themselves."""

    def __init__(self, hidden_size: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1, device=device)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)  # (..., H) -> (...)


class ValueModel(torch.nn.Module):
    """A transformer backbone plus a :class:`ValueHead`; ``forward`` gives ``(B, T)`` values where
    ``values[:, t]`` is ``V`` of the state before token ``t`` (``values[:, 0] = 0``)."""

    def __init__(
        self, backbone: torch.nn.Module, hidden_size: int, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = ValueHead(hidden_size, device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state  # (B, T, H)
        v = self.head(hidden[:, :-1])  # (B, T-1): position t-1 scores the state before token t
        return torch.cat([torch.zeros_like(v[:, :1]), v], dim=1)  # (B, T)


def _hidden_size(model: Any) -> int:
    return int(model.config.hidden_size)


class Critic:
    """The value model, its optimizer and the targets of the current rollout batch.

    Args:
        policy: the policy causal LM (its backbone is shared or copied, per ``cfg.value_model``).
        cfg: the ``algorithm.ppo`` section.
        lr: the critic's learning rate (``cfg.value_lr`` or the policy's).
        autocast: the forward passes' autocast dtype (as the policy's).
    """

    def __init__(self, policy: Any, cfg: PPOConfig, *, lr: float, autocast: str | None = None) -> None:
        self.cfg, self.autocast = cfg, autocast
        # the critic lives on the policy's device: its inputs are the policy's micro-batches
        self.device = device = next(policy.parameters()).device
        backbone, _ = split_model(policy)
        if cfg.value_model == "shared":
            self.model = ValueModel(backbone, _hidden_size(policy), device)
            trainable = list(self.model.head.parameters())  # the backbone is the policy's to step
        else:
            if cfg.value_model_path is not None:
                from pathlib import Path

                from transformers import AutoModel

                from flowgrpo.modeling.models import ModelLoadError

                if not (Path(cfg.value_model_path) / "config.json").is_file():
                    raise ModelLoadError(
                        f"algorithm.ppo.value_model_path={cfg.value_model_path!r} is not a local Hugging Face "
                        "model directory (no config.json): pass one (e.g. flowgrpo export RUN DIR), or "
                        "algorithm.ppo.value_model_path=null to copy the policy's backbone"
                    )
                backbone = AutoModel.from_pretrained(cfg.value_model_path).to(device)  # loaded on the CPU
                hidden = _hidden_size(backbone)
            else:
                backbone, hidden = copy.deepcopy(backbone), _hidden_size(policy)  # on the policy's device
            for p in backbone.parameters():
                p.requires_grad_(True)
            self.model = ValueModel(backbone, hidden, device)
            trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        self.params = trainable
        self.optimizer = torch.optim.AdamW(trainable, lr=lr)
        self._targets: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(row) -> (returns, old values)

    # ------------------------------------------------------------------ values
    def values(self, mb: MicroBatch) -> torch.Tensor:
        """``(B, T)`` values of a micro-batch (differentiable), 0 off the action tokens."""
        with autocast_context(self.autocast, mb.input_ids.device.type):
            v = self.model(mb.input_ids, mb.attention_mask)
        return v.float() * mb.loss_mask

    @torch.no_grad()
    def prepare(
        self, rows: Sequence[Row], trajs: Sequence[Trajectory], *, micro_batch_tokens: int, pad_id: int
    ) -> dict[str, float]:
        """GAE targets for one rollout batch; overwrites ``row.advantages`` with the per-token GAE
        advantages (whitened over the batch when ``cfg.whiten_advantages``) and sets each turn's
        ``Turn.advantage`` to the mean over its tokens (for replay). Rewards: each turn's shaping
        ``Turn.reward`` on its last action token, the outcome ``Trajectory.reward`` on the
        episode's last action token. Returns the batch's value/advantage metrics."""
        cfg = self.cfg
        old: dict[int, torch.Tensor] = {}
        budget_rows: list[list[Row]] = []
        cur: list[Row] = []
        for r in sorted(rows, key=len, reverse=True):  # same token budget as the update
            if cur and max(len(cur[0]), len(r)) * (len(cur) + 1) > micro_batch_tokens:
                budget_rows.append(cur)
                cur = []
            cur.append(r)
        if cur:
            budget_rows.append(cur)
        dev = self.device
        self.model.eval()
        for chunk in budget_rows:
            mb = collate(chunk, pad_id=pad_id, device=dev)
            v = self.values(mb)  # (B, T), on the critic's device
            for i, r in enumerate(chunk):
                old[id(r)] = v[i, : len(r)].clone()
        self.model.train()
        # One flat sequence of action tokens per trajectory, rows in order (a context reset splits
        # an episode into rows; GAE still runs across them). Rewards are placed from the Python
        # lists; values, GAE and whitening run on the device, one scatter per row.
        by_seq: dict[int, list[Row]] = {}
        for r in rows:
            by_seq.setdefault(r.seq_index, []).append(r)
        acts = {id(r): [t for t in range(len(r)) if r.loss_mask[t]] for r in rows}  # action positions
        act_idx = {k: torch.tensor(v, dtype=torch.long, device=dev) for k, v in acts.items()}
        all_adv, all_ret, all_val = [], [], []
        for s, srows in by_seq.items():
            traj = trajs[s]
            turn = [r.turn_index[t] for r in srows for t in acts[id(r)]]  # (N,) as a list
            vals = torch.cat([old[id(r)][act_idx[id(r)]] for r in srows])  # (N,)
            rew = [0.0] * len(turn)  # (N,)
            for i, k in enumerate(turn):
                if i + 1 == len(turn) or turn[i + 1] != k:  # the last action token of turn k
                    rew[i] += float(traj.turns[k].reward)
            rew[-1] += float(traj.reward)
            rew_t = torch.tensor([rew], dtype=torch.float32, device=dev)  # (1, N)
            a, ret = gae(rew_t, vals[None], torch.ones_like(rew_t), gamma=cfg.gamma, lam=cfg.lam)  # (1, N)
            all_adv.append(a[0])
            all_ret.append(ret[0])
            all_val.append(vals)
        adv_flat = torch.cat(all_adv)  # (N_all,), trajectories in by_seq order, rows in order
        ret_all = torch.cat(all_ret)  # (N_all,)
        adv_used = masked_whiten(adv_flat, torch.ones_like(adv_flat)) if cfg.whiten_advantages else adv_flat
        offset = 0
        for r in [r for s in by_seq for r in by_seq[s]]:
            n = len(acts[id(r)])
            adv_r = torch.zeros(len(r), dtype=torch.float32, device=dev)  # (len(r),)
            ret_r = torch.zeros(len(r), dtype=torch.float32, device=dev)
            adv_r[act_idx[id(r)]] = adv_used[offset : offset + n]
            ret_r[act_idx[id(r)]] = ret_all[offset : offset + n]
            self._targets[id(r)] = (ret_r, old[id(r)])  # (returns, old values), on the device
            r.advantages = adv_r.tolist()
            offset += n
        for s, srows in by_seq.items():
            sums: dict[int, list[float]] = {}
            for r in srows:
                for t in acts[id(r)]:
                    sums.setdefault(r.turn_index[t], []).append(r.advantages[t])
            for k, xs in sums.items():
                trajs[s].turns[k].advantage = sum(xs) / len(xs)
        ret_flat, val_flat = torch.cat(all_ret), torch.cat(all_val)
        ones = torch.ones_like(ret_flat)
        return {
            "ppo/value_mean": float(val_flat.mean()),
            "ppo/return_mean": float(ret_flat.mean()),
            "ppo/advantage_mean": float(adv_flat.mean()),
            "ppo/advantage_std": float(adv_flat.std(unbiased=False)),
            "ppo/explained_variance": explained_variance(val_flat, ret_flat, ones),
        }

    # ------------------------------------------------------------------ the update
    def loss(self, mb: MicroBatch, minibatch_action_tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of one micro-batch, weighted as a token mean over the whole
        mini-batch (``minibatch_action_tokens``) so micro-batches accumulate exactly."""
        v = self.values(mb)  # (B, T)
        returns = torch.zeros_like(v)
        old = torch.zeros_like(v)
        for i, r in enumerate(mb.rows):
            ret_r, old_r = self._targets[id(r)]
            returns[i, : len(r)] = ret_r
            old[i, : len(r)] = old_r
        w = mb.loss_mask / max(1.0, minibatch_action_tokens)
        return value_loss(v, old, returns, mb.loss_mask, clip=self.cfg.value_clip, token_weights=w)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self, grad_clip: float | None) -> float:
        """Clip the critic's own gradients and step its optimizer; returns the gradient norm."""
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, grad_clip or float("inf")))
        self.optimizer.step()
        return norm

    def end_batch(self) -> None:
        """Forget the batch's targets (they are keyed by row identity)."""
        self._targets.clear()

    def state_dict(self) -> dict[str, Any]:
        model = self.model.head if self.cfg.value_model == "shared" else self.model
        return {"model": model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        model = self.model.head if self.cfg.value_model == "shared" else self.model
        model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def critic_of(cfg: TrainConfig, policy: Any, autocast: str | None) -> Critic | None:
    """The critic ``algorithm.name`` asks for: one for ``ppo``, none for the group estimators."""
    if cfg.algorithm.name != "ppo":
        return None
    ppo = cfg.algorithm.ppo
    return Critic(policy, ppo, lr=ppo.value_lr or cfg.train.lr, autocast=autocast)


__all__ = ["Critic", "ValueHead", "ValueModel", "critic_of"]
