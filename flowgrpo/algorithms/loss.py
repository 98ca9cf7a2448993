"""The policy loss: token-level clipped surrogate + KL to a frozen reference, and its aggregation.

Pure torch functions (formulas and references in ``docs/algorithms.md``):

- :func:`kl_penalty` -- per-token KL estimators k1 / k2 / k3 (Schulman 2020, "Approximating KL
  divergence"), with ``d = logprobs - ref_logprobs``: ``k1 = d``, ``k2 = d^2 / 2``,
  ``k3 = exp(-d) + d - 1`` (GRPO's choice, Shao et al. 2024), clamped for stability.
- :func:`policy_loss` -- PPO's clipped surrogate per token with asymmetric clipping (DAPO's
  clip-higher, Yu et al. 2025), optional dual clip (Ye et al. 2020) for negative advantages, optional
  truncated importance-sampling correction between the sampler's and the trainer's logprobs
  (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"), and
  one place that owns aggregation (:func:`aggregation_weights`).
- ``loss="gspo"`` -- GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one
  length-normalised importance ratio per sequence (here: per turn), clipped per sequence
  (:func:`gspo_surrogate`).
- ``loss="cispo"`` -- CISPO (MiniMax 2025, "MiniMax-M1"): a clipped, stop-gradient importance
  weight on a REINFORCE term, so no token's gradient is ever cut (:func:`cispo_surrogate`).

Aggregation is expressed as per-token weights ``w`` with ``loss = sum(w * l)``: that makes a loss
split over micro-batches exact (compute ``w`` once over the whole mini-batch, pass the slice as
``token_weights`` to each micro-batch, sum the micro-batch losses).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "turn_mean"]
AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "turn_mean")
PolicyLossKind = Literal["ppo_clip", "gspo", "cispo"]


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: KLEstimator = "k3",
    *,
    clamp: float | None = 10.0,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi; same shape as ``logprobs``.

    ``d = logprobs - ref_logprobs``; ``k1 = d`` (unbiased, high variance, can be negative),
    ``k2 = d^2 / 2`` (biased, low variance), ``k3 = exp(-d) + d - 1`` (unbiased, >= 0).
    ``clamp`` bounds ``d`` before ``exp`` and the result to ``[-clamp, clamp]`` so one token with a
    vanishing reference probability cannot blow up the loss (verl clamps k3 the same way).
    """
    d = logprobs - ref_logprobs
    if clamp is not None:
        d = d.clamp(-2 * clamp, 2 * clamp)
    if estimator == "k1":
        kl = d
    elif estimator == "k2":
        kl = 0.5 * d * d
    elif estimator == "k3":
        kl = torch.exp(-d) + d - 1.0
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1', 'k2' or 'k3'")
    if clamp is not None:
        kl = kl.clamp(-clamp, clamp)
    return kl


def _segment_ids(keys: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense ids 0..n-1 for the distinct rows of ``keys`` ``(N, k)``."""
    uniq, inv = torch.unique(keys, dim=0, return_inverse=True)
    return inv, uniq.shape[0]


def aggregation_weights(
    mask: torch.Tensor,
    agg: Aggregation = "token_mean",
    *,
    seq_index: torch.Tensor | None = None,
    turn_index: torch.Tensor | None = None,
    norm_len: int | None = None,
) -> torch.Tensor:
    """Per-token weights ``w`` ``(B, T)`` such that the aggregated loss is ``sum(w * l)``.

    mask ``(B, T)``: 1 on trained tokens. seq_index ``(B,)``: the trajectory of each row (default:
    each row its own). turn_index ``(B, T)``: each token's turn inside its trajectory (default: a
    row is one turn). Trajectories or turns without any masked token take no part in the means.

    - ``token_mean``: ``1 / sum(mask)``.
    - ``seq_mean_token_mean``: ``1 / (S * n_s)``, ``n_s`` the masked tokens of trajectory s, S the
      number of trajectories.
    - ``seq_mean_token_sum_norm``: ``1 / (S * norm_len)`` (Dr.GRPO; ``norm_len`` defaults to T, use
      the generation budget to make it a constant).
    - ``turn_mean``: ``1 / (S * K_s * n_{s,k})``, ``K_s`` the turns of trajectory s and ``n_{s,k}``
      the masked tokens of its turn k (Flow-GRPO: 1/G sum_i 1/T_i sum_t 1/|a_t| sum_j).
    """
    m = mask.to(torch.float32)  # (B, T)
    B, T = m.shape
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {agg!r}; use one of {list(AGGREGATIONS)}")
    if agg == "token_mean":
        return m / m.sum().clamp_min(1.0)
    on = m > 0
    if seq_index is None:
        seq_index = torch.arange(B, device=m.device)
    seq = seq_index.to(m.device).view(B, 1).expand(B, T)  # (B, T)
    seq_ids, n_seq = _segment_ids(seq[on].view(-1, 1))  # (N,), over masked tokens only
    w = torch.zeros_like(m)
    if n_seq == 0:
        return w
    if agg == "seq_mean_token_sum_norm":
        w[on] = 1.0 / (n_seq * float(norm_len if norm_len is not None else T))
        return w
    if agg == "seq_mean_token_mean":
        counts = torch.bincount(seq_ids, minlength=n_seq).to(m.dtype)  # (S,)
        w[on] = 1.0 / (n_seq * counts[seq_ids])
        return w
    # turn_mean
    if turn_index is None:
        turn = torch.arange(B, device=m.device).view(B, 1).expand(B, T)  # each row one turn
    else:
        turn = turn_index.to(m.device)
    keys = torch.stack([seq[on], turn[on]], dim=-1)  # (N, 2)
    turn_ids, n_turn = _segment_ids(keys)
    tok_per_turn = torch.bincount(turn_ids, minlength=n_turn).to(m.dtype)  # (K,)
    # The trajectory of each turn, then the number of turns per trajectory.
    turn_seq = torch.zeros(n_turn, dtype=torch.long, device=m.device)
    turn_seq[turn_ids] = seq_ids
    turns_per_seq = torch.bincount(turn_seq, minlength=n_seq).to(m.dtype)  # (S,)
    w[on] = 1.0 / (n_seq * turns_per_seq[seq_ids] * tok_per_turn[turn_ids])
    return w


def sampler_ratio_stats(
    trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far the sampler's logprobs are from the trainer's: ``mean``, ``min`` and ``max`` of
    ``rho = exp(trainer_logprobs - sampler_logprobs)`` over the action tokens, with ``tokens``.

    ``trainer_logprobs``, ``sampler_logprobs``, ``mask``: ``(B, T)``. Taken before the first
    optimizer step of a batch, both are the same policy, so ``rho`` is 1 up to numerics: ~1e-5 off
    when sampler and trainer run fp32 (flowgrpo's ``hf`` backend), up to ~20% under bf16 (Yao et
    al. 2025, "Your efficient RL framework secretly brings you off-policy RL training", measure
    the same gap in vLLM vs FSDP; :func:`truncated_is_weights` corrects for it). An empty mask
    gives ``tokens = 0`` and no statistics.
    """
    on = mask > 0  # (B, T)
    rho = torch.exp((trainer_logprobs.detach() - sampler_logprobs.detach()).double())  # (B, T)
    n = on.sum()
    stats = torch.stack(
        [
            torch.where(on, rho, 0.0).sum() / n.clamp(min=1),
            torch.where(on, rho, torch.inf).min(),
            torch.where(on, rho, -torch.inf).max(),
            n.double(),
        ]
    ).tolist()  # one device-to-host transfer: masked reductions, no boolean indexing
    if stats[3] == 0:
        return {"tokens": 0.0}
    return dict(zip(("mean", "min", "max", "tokens"), stats, strict=True))


def truncated_is_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float = 2.0,
    mode: Literal["token", "sequence_mask"] = "token",
    seq_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Importance weights correcting for sampler/trainer mismatch (no gradient), ``(B, T)``.

    ``rho = exp(old_logprobs - sampler_logprobs)`` where ``old_logprobs`` are the trainer's
    recomputation of the sampled tokens and ``sampler_logprobs`` the rollout engine's. ``token``:
    truncated IS, ``min(rho, cap)`` per token. ``sequence_mask``: weight 1, but every token of a
    trajectory whose geometric-mean ratio ``exp(mean(log rho))`` lies outside ``[1/cap, cap]`` gets 0.
    """
    log_rho = (old_logprobs - sampler_logprobs).detach() * mask
    if mode == "token":
        return torch.exp(log_rho.clamp(max=float(torch.log(torch.tensor(cap)))))
    if mode != "sequence_mask":
        raise ValueError(f"unknown truncated-IS mode {mode!r}; use 'token' or 'sequence_mask'")
    B, T = mask.shape
    if seq_index is None:
        seq_index = torch.arange(B, device=mask.device)
    seq_ids, n_seq = _segment_ids(seq_index.view(-1, 1))  # (B,)
    m = mask.to(log_rho.dtype)
    sums = torch.zeros(n_seq, dtype=log_rho.dtype, device=mask.device).index_add_(0, seq_ids, log_rho.sum(1))
    cnts = torch.zeros(n_seq, dtype=log_rho.dtype, device=mask.device).index_add_(0, seq_ids, m.sum(1))
    mean_log = sums / cnts.clamp_min(1.0)  # (S,)
    bound = float(torch.log(torch.tensor(cap)))
    keep = (mean_log.abs() <= bound).to(log_rho.dtype)[seq_ids]  # (B,)
    return keep.view(B, 1).expand(B, T).clone()


@dataclass
class Surrogate:
    """The policy-gradient part of a loss, per token (all ``(B, T)``): ``pg`` the loss term,
    ``ratio`` the importance ratio it used (for metrics), ``clipped_low`` / ``clipped_high`` where
    the clip bound was hit (the gradient cut for ``ppo_clip`` and ``gspo``, the weight capped for
    ``cispo``)."""

    pg: torch.Tensor
    ratio: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor


def _turn_keys(mask: torch.Tensor, seq_index: torch.Tensor | None, turn_index: torch.Tensor | None):
    """Dense ids ``(B, T)`` of each token's (trajectory, turn) and how many there are; a row is one
    turn when ``turn_index`` is None and one trajectory when ``seq_index`` is None."""
    B, T = mask.shape
    seq = (seq_index if seq_index is not None else torch.arange(B, device=mask.device)).to(mask.device)
    seq = seq.view(B, 1).expand(B, T)
    turn = (
        turn_index.to(mask.device)
        if turn_index is not None
        else torch.arange(B, device=mask.device).view(B, 1).expand(B, T)
    )
    ids, n = _segment_ids(torch.stack([seq.reshape(-1), turn.reshape(-1)], dim=-1))
    return ids.view(B, T), n


def ppo_clip_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    seq_index: torch.Tensor | None = None,
    turn_index: torch.Tensor | None = None,
) -> Surrogate:
    """PPO's token-level clipped surrogate (Schulman et al. 2017):
    ``l = -min(r*A, clip(r, 1-clip_low, 1+clip_high)*A)``, ``r = exp(logprobs - old_logprobs)``."""
    log_ratio = (logprobs - old_logprobs) * mask  # (B, T); 0 off-mask keeps exp finite
    ratio = torch.exp(log_ratio.clamp(max=20.0))  # (B, T)
    pg = -torch.minimum(ratio * advantages, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages)
    with torch.no_grad():
        low = (ratio < 1.0 - clip_low) & (advantages < 0)
        high = (ratio > 1.0 + clip_high) & (advantages > 0)
    return Surrogate(pg, ratio, low, high)


def gspo_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    seq_index: torch.Tensor | None = None,
    turn_index: torch.Tensor | None = None,
) -> Surrogate:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071), in its token form (GSPO-token, eq. 13).

    The sequence ratio of a response ``y`` is ``s = exp(mean_{t in y} (logprobs - old_logprobs))``
    over its action tokens only; every token of ``y`` carries
    ``s_t = sg(s) * exp(logprobs_t - sg(logprobs_t))`` (value ``s``, gradient ``s * grad log p_t``)
    and ``l_t = -min(s_t*A_t, clip(s_t, 1-clip_low, 1+clip_high)*A_t)``, so the whole response is
    kept or clipped together. A response is one turn (a row is one turn when ``turn_index`` is
    None): in the Flow-GRPO view each turn is a single-turn update, and a turn never spans two
    rows or micro-batches, so the ratio is exact under gradient accumulation. GSPO's objective
    averages over responses: pair it with ``agg="turn_mean"`` (or ``seq_mean_token_mean`` for
    single-turn episodes). The paper clips at ``3e-4`` / ``4e-4``.
    """
    ids, n = _turn_keys(mask, seq_index, turn_index)  # (B, T)
    m = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs) * m  # (B, T)
    sums = torch.zeros(n, dtype=logprobs.dtype, device=logprobs.device).index_add_(
        0, ids.reshape(-1), log_ratio.detach().reshape(-1)
    )
    cnts = torch.zeros(n, dtype=logprobs.dtype, device=logprobs.device).index_add_(
        0, ids.reshape(-1), m.reshape(-1)
    )
    seq_log = (sums / cnts.clamp_min(1.0))[ids] * m  # (B, T): each token's response mean log-ratio
    token_log = seq_log + (logprobs - logprobs.detach()) * m
    ratio = torch.exp(token_log.clamp(max=20.0))  # (B, T), value s of its response
    pg = -torch.minimum(ratio * advantages, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages)
    with torch.no_grad():
        low = (ratio < 1.0 - clip_low) & (advantages < 0)
        high = (ratio > 1.0 + clip_high) & (advantages > 0)
    return Surrogate(pg, ratio.detach(), low, high)


def cispo_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    seq_index: torch.Tensor | None = None,
    turn_index: torch.Tensor | None = None,
) -> Surrogate:
    """CISPO (MiniMax 2025, "MiniMax-M1", arXiv:2506.13585, eq. 4):
    ``l = -sg(clip(r, 1-clip_low, 1+clip_high)) * A * logprobs``.

    The importance weight is clipped and detached instead of the update: every token keeps a
    REINFORCE gradient ``-w * A * grad log p`` (PPO's clip zeroes the gradient of tokens whose ratio
    left the trust region, often the rare "fork" tokens). The loss value is ``-w*A*logprobs``, not a
    ratio; only its gradient is meaningful.
    """
    log_ratio = (logprobs - old_logprobs).detach() * mask  # (B, T)
    ratio = torch.exp(log_ratio.clamp(max=20.0))  # (B, T)
    w = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = -w * advantages * logprobs
    return Surrogate(pg, ratio, ratio < 1.0 - clip_low, ratio > 1.0 + clip_high)


SURROGATES: dict[str, Callable[..., Surrogate]] = {
    "ppo_clip": ppo_clip_surrogate,
    "gspo": gspo_surrogate,
    "cispo": cispo_surrogate,
}


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    agg: Aggregation = "token_mean",
    seq_index: torch.Tensor | None = None,
    turn_index: torch.Tensor | None = None,
    norm_len: int | None = None,
    token_weights: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    loss: PolicyLossKind = "ppo_clip",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    pg_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-surrogate policy loss with KL, aggregated per ``agg``; returns ``(loss, metrics)``.

    logprobs, old_logprobs, mask ``(B, T)``; advantages ``(B, T)`` or ``(B,)``. Per token
    ``r = exp(logprobs - old_logprobs)``,
    ``l = -min(r*A, clip(r, 1-clip_low, 1+clip_high)*A) + kl_coef * KL(logprobs, ref_logprobs)``.
    ``dual_clip = c > 1`` bounds the surrogate of negative-advantage tokens at ``-c*A`` (an
    exploding ratio on a bad token cannot dominate). ``is_weights`` ``(B, T)`` (see
    :func:`truncated_is_weights`) multiply the policy-gradient term. ``token_weights`` ``(B, T)``
    override ``agg`` (precomputed over a whole mini-batch with :func:`aggregation_weights` when the
    batch is split into micro-batches). ``loss`` picks the policy-gradient term from
    :data:`SURROGATES` (``ppo_clip`` above; ``gspo``: :func:`gspo_surrogate`; ``cispo``:
    :func:`cispo_surrogate`); ``dual_clip`` applies to ``ppo_clip`` only. ``entropy`` ``(B, T)``
    (differentiable) with ``entropy_coef > 0`` adds the bonus ``-entropy_coef * H`` per token.
    ``pg_mask`` ``(B, T)`` keeps the policy-gradient term only where it is 1 (e.g. the
    highest-entropy tokens, :func:`entropy_top_q_threshold`); the KL and entropy terms and the
    aggregation weights still cover every action token, so micro-batch sums stay exact.

    Metrics (floats, over masked tokens): ``pg_loss``, ``kl``, ``clip_frac`` (either side),
    ``clip_frac_low`` / ``clip_frac_high`` (ratio clipped with the gradient cut), ``dual_clip_frac``,
    ``ratio_mean`` / ``ratio_min`` / ``ratio_max``, ``is_weight_mean``, ``tokens``.
    """
    mask = mask.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages.view(-1, 1).expand_as(logprobs)
    advantages = advantages.to(logprobs.dtype)
    if loss not in SURROGATES:
        raise ValueError(f"unknown policy loss {loss!r}; use one of {sorted(SURROGATES)}")
    surrogate = SURROGATES[loss](
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        seq_index=seq_index,
        turn_index=turn_index,
    )
    pg, ratio = surrogate.pg, surrogate.ratio  # (B, T)
    dual_hit = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip is not None:
        if loss != "ppo_clip":
            raise ValueError(f"dual_clip applies to loss='ppo_clip' only, not {loss!r}; set it to None")
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (typically 3), got {dual_clip}")
        bound = -dual_clip * advantages  # positive where A < 0
        neg = advantages < 0
        dual_hit = neg & (pg > bound)
        pg = torch.where(neg, torch.minimum(pg, bound), pg)
    if is_weights is not None:
        pg = pg * is_weights.detach()
    if pg_mask is not None:
        pg = pg * pg_mask.detach().to(pg.dtype)
    per_token = pg
    if entropy is not None and entropy_coef != 0.0:
        per_token = per_token - entropy_coef * entropy
    kl = None
    if ref_logprobs is not None and kl_coef != 0.0:
        kl = kl_penalty(logprobs, ref_logprobs.detach(), kl_estimator)  # (B, T)
        per_token = per_token + kl_coef * kl

    if token_weights is None:
        token_weights = aggregation_weights(
            mask, agg, seq_index=seq_index, turn_index=turn_index, norm_len=norm_len
        )
    total = (per_token * token_weights.to(per_token.dtype) * mask).sum()

    with torch.no_grad():
        on = mask > 0
        n = int(on.sum())
        metrics: dict[str, float] = {"tokens": float(n)}
        if n:
            r = ratio[on]
            low, high = surrogate.clipped_low[on], surrogate.clipped_high[on]
            metrics.update(
                pg_loss=float(pg[on].mean()),
                clip_frac_low=float(low.float().mean()),
                clip_frac_high=float(high.float().mean()),
                clip_frac=float((low | high).float().mean()),
                dual_clip_frac=float(dual_hit[on].float().mean()),
                ratio_mean=float(r.mean()),
                ratio_min=float(r.min()),
                ratio_max=float(r.max()),
            )
            if kl is not None:
                metrics["kl"] = float(kl[on].mean())
            elif ref_logprobs is not None:
                metrics["kl"] = float(kl_penalty(logprobs, ref_logprobs, kl_estimator)[on].mean())
            if is_weights is not None:
                metrics["is_weight_mean"] = float(is_weights[on].mean())
            if pg_mask is not None:
                metrics["pg_token_frac"] = float(pg_mask[on].float().mean())
    return total, metrics


def entropy_top_q_threshold(entropy: torch.Tensor, top_q: float) -> float:
    """The entropy at or above which a token is among the ``top_q`` fraction of highest-entropy
    tokens: the ``1 - top_q`` quantile of ``entropy`` ``(N,)`` (the action tokens of a batch).

    Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
    Reinforcement Learning for LLM Reasoning" (arXiv:2506.01939): a policy gradient on only the top
    20% highest-entropy ("forking") tokens matches or beats the full gradient.
    """
    if not 0.0 < top_q <= 1.0:
        raise ValueError(f"top_q must be in (0, 1], got {top_q}")
    if entropy.numel() == 0:
        return float("inf")
    return float(torch.quantile(entropy.detach().double().flatten(), 1.0 - top_q))


def sft_loss(
    logprobs: torch.Tensor, mask: torch.Tensor, token_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Cross-entropy on the masked (action) tokens: ``-sum(w * logprobs)``, ``w`` defaulting to a
    token mean. Used by the supervised warm start on demonstrations."""
    mask = mask.to(logprobs.dtype)
    if token_weights is None:
        token_weights = mask / mask.sum().clamp_min(1.0)
    return -(logprobs * token_weights.to(logprobs.dtype) * mask).sum()


__all__ = [
    "AGGREGATIONS",
    "SURROGATES",
    "Aggregation",
    "KLEstimator",
    "PolicyLossKind",
    "Surrogate",
    "aggregation_weights",
    "cispo_surrogate",
    "entropy_top_q_threshold",
    "gspo_surrogate",
    "kl_penalty",
    "policy_loss",
    "ppo_clip_surrogate",
    "sampler_ratio_stats",
    "sft_loss",
    "truncated_is_weights",
]
