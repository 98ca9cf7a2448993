"""PPO's critic maths over multi-turn episodes: pure functions of torch tensors.

- :func:`gae` -- Generalised Advantage Estimation (Schulman et al. 2016) over the *action tokens*
  of an episode. Each sampled token is one decision; prompt and observation tokens (tool results,
  user messages) are not decisions, so they are skipped: the bootstrap of the last action token of
  turn k is the value of the first action token of turn k+1, across the tool result in between.
- :func:`value_loss` -- PPO2's clipped value loss (as in OpenAI baselines, verl's
  ``compute_value_loss`` and TRL's ``PPOTrainer``).
- :func:`explained_variance`, :func:`masked_whiten` -- the critic's diagnostics and the batch
  normalisation of advantages.

Formulas and a worked two-turn example: ``docs/algorithms.md`` (section "PPO"). Nothing here
imports the rest of flowgrpo; :mod:`flowgrpo.training.value` feeds these functions from training rows.
"""

from __future__ import annotations

import torch


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns by GAE over the masked (action) tokens of each row.

    rewards, values, mask: ``(B, T)``; a row is one episode (or its action tokens laid end to end).
    Let ``t_1 < t_2 < ... < t_n`` be the positions where ``mask`` is 1. With ``V(t_{n+1}) = 0`` (the
    episode ended) and ``A(t_{n+1}) = 0``::

        delta_i = r(t_i) + gamma * V(t_{i+1}) - V(t_i)
        A(t_i)  = delta_i + gamma * lam * A(t_{i+1})
        R(t_i)  = A(t_i) + V(t_i)                       (the value target)

    Tokens off the mask get ``A = R = 0`` and neither discount nor reward: a reward placed there is
    ignored (put outcome and per-turn rewards on the last action token of their turn). Returns
    ``(advantages, returns)``, both ``(B, T)`` float32, detached.
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(
            f"rewards, values and mask must all be (B, T), got {tuple(rewards.shape)}, "
            f"{tuple(values.shape)}, {tuple(mask.shape)}"
        )
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}")
    rewards = rewards.detach().float()
    values = values.detach().float()
    on = mask > 0  # (B, T)
    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=torch.float32, device=rewards.device)
    next_v = torch.zeros(B, dtype=torch.float32, device=rewards.device)  # V of the next action token
    next_a = torch.zeros(B, dtype=torch.float32, device=rewards.device)  # A of the next action token
    for t in range(T - 1, -1, -1):
        m = on[:, t]  # (B,)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        a = delta + gamma * lam * next_a
        adv[:, t] = torch.where(m, a, torch.zeros_like(a))
        next_v = torch.where(m, values[:, t], next_v)  # observation tokens carry the bootstrap over
        next_a = torch.where(m, a, next_a)
    returns = (adv + values) * on
    return adv, returns


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.2,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO2's clipped value loss; returns ``(loss, metrics)``.

    values (differentiable), old_values (the critic's values when the batch was collected),
    returns (GAE targets), mask: ``(B, T)``. Per token::

        v_clip = old_v + clamp(v - old_v, -clip, clip)
        l      = 0.5 * max((v - R)^2, (v_clip - R)^2)

    so one update cannot move a value far from where the targets were computed; ``clip=None`` is
    the plain squared error ``0.5 * (v - R)^2``. ``loss = sum(token_weights * l)`` with
    ``token_weights`` defaulting to a token mean over the mask (pass weights computed over a whole
    mini-batch to accumulate micro-batches exactly). Metrics: ``vf_loss`` (token mean),
    ``vf_clip_frac`` (tokens where the clipped term is the larger one), ``tokens``.
    """
    m = mask.to(values.dtype)
    err = (values - returns.detach()) ** 2  # (B, T)
    if clip is not None:
        if clip <= 0:
            raise ValueError(f"the value clip must be > 0 (or None for no clipping), got {clip}")
        old = old_values.detach()
        v_clip = old + (values - old).clamp(-clip, clip)
        err_clip = (v_clip - returns.detach()) ** 2
        per_token = 0.5 * torch.maximum(err, err_clip)
        clipped = err_clip > err
    else:
        per_token = 0.5 * err
        clipped = torch.zeros_like(err, dtype=torch.bool)
    if token_weights is None:
        token_weights = m / m.sum().clamp_min(1.0)
    loss = (per_token * token_weights.to(per_token.dtype) * m).sum()
    with torch.no_grad():
        on = m > 0
        n = int(on.sum())
        metrics = {"tokens": float(n)}
        if n:
            metrics.update(
                vf_loss=float(per_token[on].mean()), vf_clip_frac=float(clipped[on].float().mean())
            )
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the masked tokens: 1 is a perfect critic, 0 one no better
    than a constant, below 0 worse than one. NaN when the returns have no variance."""
    on = mask > 0
    r, v = returns[on].double(), values[on].double()
    if r.numel() < 2:
        return float("nan")
    var_r = r.var(unbiased=False)
    if var_r == 0:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / var_r)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """``(x - mean) / std`` over the masked entries (0 elsewhere); ``shift_mean=False`` keeps the
    mean and only rescales (verl's ``masked_whiten`` / TRL's ``whiten``)."""
    on = mask > 0
    vals = x[on]
    if vals.numel() < 2:
        return torch.where(on, x - (vals.mean() if shift_mean and vals.numel() else 0.0), torch.zeros_like(x))
    mean, std = vals.mean(), vals.std(unbiased=False)
    out = (x - mean) / (std + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(on, out, torch.zeros_like(x))


__all__ = ["explained_variance", "gae", "masked_whiten", "value_loss"]
