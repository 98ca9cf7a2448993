"""Demonstration replay during RL: every optimizer step also lowers the warm start's cross-entropy on a
few of its demonstrations (``sft.replay_coef``).

Why: Flow-GRPO learns only from groups whose rewards differ. Tasks the warm start already solves
give all-equal groups, which carry no gradient, so nothing holds the policy to what it does right
there while the groups with a signal pull it elsewhere. On the search agent the 2-hop questions
("in which country was X born?") teach "search twice and answer the last result", and the policy
applies it to the solved 1-hop questions as well ("where was X born?" answered with a country): a
2-hop gain of +34 to +52 points cost the 1-hop city questions everything they had
(docs/learning.md 10.5, 12). The KL term is a weak anchor at the tokens that matter. InstructGPT
(Ouyang et al. 2022, "PPO-ptx") mixes a supervised term into every RL update for the same
regression; here the supervised data are the warm start's own oracle demonstrations, regenerated
(the oracle is deterministic) so a resumed run replays the same ones.

Measured (docs/learning.md 12, seed 2 of the search agent, one run per arm): replay at 1.0 and 0.1
kept every 1-hop question that RL without it had lost, but the 2-hop questions fell instead (all
191: -13.1, -24.6 and -9.9 points) at the config's lr 3e-5. With 12 steps at lr 1e-5 (cosine decay,
KL 0.05; docs/learning.md 14) the replayed NLL stays at the warm start's level and the 1-hop questions
hold at 1.0 (85-95 of 97), but the mix gains only +5.8 and +6.3 points (p = 0.071, 0.13; replay 1.0,
0.3). On the calculator agent, replay 0.3 x 16 cleared p < 0.01 over the warm start in every seed
on both numeric paths at 3 steps, and at 15 steps held curves that the recipe without it let decay
(docs/learning.md 32-38, 46-47); the calculator and search configs turn it on. It stays off in
:class:`~flowgrpo.config.SFTSection` itself: it needs a warm start to replay.

The added loss is ``replay_coef * NLL``: the mean cross-entropy over the replayed demonstrations'
action tokens, the warm start's :func:`~flowgrpo.algorithms.loss.sft_loss`, beside the policy
loss's own per-token weights (so it is exact across micro-batches, as the policy loss is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from flowgrpo.algorithms.loss import sft_loss
from flowgrpo.components import Components
from flowgrpo.training.batching import MicroBatch, Row, build_rows, micro_batches
from flowgrpo.training.sft import warm_start_demonstrations
from flowgrpo.types import Trajectory

LogprobFn = Callable[[MicroBatch], torch.Tensor]
"""The trained policy's logprobs of a micro-batch's tokens, with the graph: ``(B, T)``."""


class DemoReplay:
    """A cycle through ``demos`` in a seeded order, ``per_step`` trajectories per optimizer step."""

    def __init__(
        self, demos: Sequence[Trajectory], *, coef: float, per_step: int, seed: int, pack: bool
    ) -> None:
        if coef <= 0:
            raise ValueError(f"replay coefficient must be > 0, got {coef}")
        rows = build_rows(demos, pack=pack, require_advantages=False)
        self.by_seq: dict[int, list[Row]] = {}
        for r in rows:
            self.by_seq.setdefault(r.seq_index, []).append(r)
        if not self.by_seq:
            raise ValueError("sft.replay_coef: the demonstrations have no action tokens to replay")
        self.coef = float(coef)
        self.per_step = int(per_step)
        self._gen = torch.Generator().manual_seed(seed)
        self._order: list[int] = []
        self.replayed = 0  # trajectories replayed so far (a resumed run starts a fresh cycle)

    def next_rows(self) -> list[Row]:
        """The rows of the next ``per_step`` demonstrations; a new shuffled pass starts when one ends."""
        seqs = list(self.by_seq)
        picked: list[int] = []
        while len(picked) < min(self.per_step, len(seqs)):
            if not self._order:
                self._order = [seqs[i] for i in torch.randperm(len(seqs), generator=self._gen).tolist()]
            s = self._order.pop(0)
            if s not in picked:
                picked.append(s)
        self.replayed += len(picked)
        return [r for s in picked for r in self.by_seq[s]]

    def backward(
        self,
        logprobs: LogprobFn,
        *,
        token_budget: int,
        pad_id: int,
        device: torch.device,
        scale: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    ) -> dict[str, float]:
        """Accumulate the gradient of ``coef * NLL`` of the next demonstrations (``scale``: the loss
        scaler of the update, for fp16). Returns ``replay_nll`` (the unweighted mean NLL per action
        token) and ``replay_tokens``."""
        rows = self.next_rows()
        nll, tokens = 0.0, 0.0
        for mb in micro_batches(rows, token_budget, pad_id=pad_id, device=device):
            lp = logprobs(mb)  # (B, T)
            loss = sft_loss(lp, mb.loss_mask, mb.token_weights)  # this micro-batch's share of the mean
            scale(self.coef * loss).backward()
            nll += float(loss.detach())
            tokens += float(mb.loss_mask.sum())
        return {"replay_nll": nll, "replay_tokens": tokens}


def build_replay(parts: Components) -> DemoReplay:
    """The demonstrations of the config's warm start, ready to replay."""
    s, cfg = parts.config.sft, parts.config
    return DemoReplay(
        warm_start_demonstrations(parts),
        coef=s.replay_coef,
        per_step=s.replay_trajectories,
        seed=cfg.train.seed,
        pack=cfg.train.pack_rows,
    )


__all__ = ["DemoReplay", "build_replay"]
