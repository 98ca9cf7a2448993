"""Advantage estimators: outcome rewards of G episodes per task -> one advantage per turn.

Pure functions over torch tensors and the data model; formulas and references are in
``docs/algorithms.md``. Estimators are plain functions held in a registry (:data:`ESTIMATORS`):
the trainer passes a name or a function to :func:`compute_advantages` and never branches on the
estimator itself.

- :func:`grpo` -- GRPO (Shao et al. 2024, DeepSeekMath): ``A_i = (R_i - mean(R)) / (std(R) + eps)``
  over the G rewards of one task; ``scale_by_std=False`` is Dr.GRPO (Liu et al. 2025).
- :func:`rloo` -- RLOO (Ahmadian et al. 2024): ``A_i = R_i - mean_{j != i} R_j``.
- ``"flow_grpo"`` -- Flow-GRPO (Li et al. 2025, AgentFlow): the trajectory's group-normalised
  outcome advantage broadcast to every turn of the trajectory.
- ``"flow_grpo_turn_weighted"`` -- the AgentFlow code's variant: every turn is a sample carrying its
  trajectory's reward, and the mean/std are taken over that multiset of turns (long trajectories
  weigh more in the baseline).
- ``"grpo_dr"`` -- Flow-GRPO without std scaling (Dr.GRPO).
- ``"rloo"`` -- RLOO's leave-one-out advantage broadcast to every turn.
- ``"gigpo"`` -- GiGPO (Feng et al. 2025): episode advantage + ``omega`` * step advantage, the step
  advantage normalising discounted per-turn returns within *anchor-state groups* (turns of the same
  task group whose contexts are identical).

``flow_grpo``, ``grpo_dr`` and ``gigpo`` take ``turn_discount``: per-turn rewards discounted toward
the outcome join the score each trajectory is compared on (:func:`discounted_score`).

Groups may hold different numbers of trajectories (an episode can fail); every estimator works per
group. A group whose rewards are all equal gets advantage exactly 0 (never NaN, never float residue
of the mean divided by a tiny std), as does a singleton.

Excluded episodes (``Trajectory.excluded`` set, e.g. ``"termination:error"``) take no part: every
estimator computes its group statistics over the group's other episodes (:func:`scored`), the
excluded ones get advantage 0 on every turn, and a group left with fewer than 2 scored episodes
contributes nothing (all 0).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:  # the estimators read rewards and turns of these objects; no runtime dependency
    from flowgrpo.types import Trajectory, TrajectoryGroup


def grpo(rewards: torch.Tensor, *, scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages ``(R - mean) / (std + eps)`` per row.

    rewards: ``(num_groups, G)``. std is unbiased (Bessel's correction, as ``torch.std``); a group of
    equal rewards, or a group of one (G = 1, std undefined), gets exactly 0. Returns
    ``(num_groups, G)``. ``scale_by_std=False`` gives Dr.GRPO's ``R - mean``.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (num_groups, G), got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    r = rewards.double()  # float64 statistics: less residue on nearly equal rewards
    centered = r - r.mean(dim=1, keepdim=True)  # (N, G)
    if scale_by_std:
        std = r.std(dim=1, keepdim=True, unbiased=True)  # (N, 1)
        centered = centered / (std + eps)
    return _zero_equal_rows(rewards, centered.to(torch.float32))


def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantages ``R_i - (sum(R) - R_i) / (G - 1)``; 0 for a group of one.

    rewards: ``(num_groups, G)`` -> ``(num_groups, G)``. Equals ``G/(G-1) * (R_i - mean(R))``.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (num_groups, G), got shape {tuple(rewards.shape)}")
    g = rewards.shape[1]
    if g < 2:
        return torch.zeros_like(rewards)
    r = rewards.double()
    others = (r.sum(dim=1, keepdim=True) - r) / (g - 1)  # (N, G)
    return _zero_equal_rows(rewards, (r - others).to(torch.float32))


def _zero_equal_rows(rewards: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """``adv`` with rows whose rewards are all equal set to exactly 0.

    The mean of G equal floats need not equal them (``mean([0.1] * 8) != 0.1`` in float32), and the
    residue divided by a std of the same tiny size gives advantages of any size; a group of equal
    rewards carries no signal by definition, so it is decided on the rewards themselves.
    """
    equal = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)  # (N, 1)
    return torch.where(equal, torch.zeros_like(adv), adv)


# --------------------------------------------------------------------------------------------
# Estimators over trajectory groups.


class Estimator(Protocol):
    """Fills ``Turn.advantage`` for every turn of every trajectory in ``groups`` (in place)."""

    def __call__(self, groups: Sequence[TrajectoryGroup], **kwargs) -> None: ...


def scored(group: TrajectoryGroup) -> list[Trajectory]:
    """The trajectories of ``group`` that take part in its statistics, after giving every turn of
    the others advantage 0.

    Excluded trajectories (``Trajectory.excluded`` set) are left out of the baseline; when fewer
    than 2 remain the group has no baseline and contributes nothing, so every turn gets 0 and the
    result is empty. Custom estimators call this first to share the rule.
    """
    kept = [t for t in group.trajectories if t.excluded is None]
    if len(kept) < 2:
        kept = []
    for t in group.trajectories:
        if not any(t is k for k in kept):
            for turn in t.turns:
                turn.advantage = 0.0
    return kept


def discounted_score(traj: Trajectory, turn_discount: float | None = None) -> float:
    """The score a trajectory is compared on inside its group.

    ``turn_discount=None`` (the default): the outcome ``R = Trajectory.reward`` alone, per-turn
    rewards ignored (Flow-GRPO's outcome-only credit). With ``gamma = turn_discount`` in [0, 1] the
    per-turn rewards ``r_t = Turn.reward`` are discounted toward the outcome, by their distance in
    turns from the end of the episode::

        S = R + sum_{t=0}^{T-1} gamma^(T-1-t) * r_t

    which is the discounted return of the per-turn rewards read backward from the terminal step
    (Sutton & Barto 2018, eq. 3.8, with the outcome on the last turn as in :func:`turn_rewards`): the
    last turn's reward counts fully, each earlier one ``gamma`` times less; ``gamma = 1`` is the plain
    sum, ``gamma = 0`` the outcome plus the last turn's reward.
    """
    if turn_discount is None:
        return float(traj.reward)
    n = len(traj.turns)
    return float(traj.reward) + sum(
        turn_discount ** (n - 1 - t) * turn.reward for t, turn in enumerate(traj.turns)
    )


def _rewards(trajs: Sequence[Trajectory], turn_discount: float | None = None) -> torch.Tensor:
    return torch.tensor([[discounted_score(t, turn_discount) for t in trajs]], dtype=torch.float32)  # (1, G)


def _broadcast(trajs: Sequence[Trajectory], adv: torch.Tensor) -> None:
    for traj, a in zip(trajs, adv.tolist(), strict=True):
        for turn in traj.turns:
            turn.advantage = float(a)


def flow_grpo(
    groups: Sequence[TrajectoryGroup],
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    turn_discount: float | None = None,
) -> None:
    """Flow-GRPO (trajectory-weighted): each trajectory's group-normalised outcome advantage is
    given to every one of its turns, so a multi-turn credit-assignment problem becomes a set of
    single-turn updates (Li et al. 2025, eq. for ``A^i_t``). ``turn_discount`` adds the per-turn
    rewards, discounted toward the outcome, to the score that is normalised
    (:func:`discounted_score`)."""
    for g in groups:
        if trajs := scored(g):
            r = _rewards(trajs, turn_discount)
            _broadcast(trajs, grpo(r, scale_by_std=scale_by_std, eps=eps)[0])


def grpo_dr(
    groups: Sequence[TrajectoryGroup], *, eps: float = 1e-6, turn_discount: float | None = None
) -> None:
    """Flow-GRPO with Dr.GRPO's unscaled advantage ``R - mean`` (Liu et al. 2025)."""
    flow_grpo(groups, scale_by_std=False, eps=eps, turn_discount=turn_discount)


def flow_grpo_turn_weighted(
    groups: Sequence[TrajectoryGroup], *, scale_by_std: bool = True, eps: float = 1e-6
) -> None:
    """Flow-GRPO as the AgentFlow code computes it: each turn is one sample carrying its
    trajectory's outcome reward, and mean / unbiased std are over the multiset of turns of the
    group (a trajectory of T turns counts T times). Trajectories without turns take no part."""
    for g in groups:
        trajs = [t for t in scored(g) if t.turns]
        if not trajs:
            continue
        per_turn = torch.tensor(
            [t.reward for t in trajs for _ in t.turns], dtype=torch.float64
        )  # (sum_i T_i,)
        if per_turn.numel() < 2 or bool(per_turn.max() == per_turn.min()):
            scale = float("inf")  # a single sample, or equal rewards: advantage exactly 0
        elif scale_by_std:
            scale = float(per_turn.std(unbiased=True)) + eps
        else:
            scale = 1.0
        mean = float(per_turn.mean())
        for t in trajs:
            a = float((t.reward - mean) / scale)
            for turn in t.turns:
                turn.advantage = a


def rloo_estimator(groups: Sequence[TrajectoryGroup]) -> None:
    """RLOO's leave-one-out advantage broadcast to every turn (Ahmadian et al. 2024)."""
    for g in groups:
        if trajs := scored(g):
            _broadcast(trajs, rloo(_rewards(trajs))[0])


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = sum_{k >= t} gamma^(k - t) r_k`` for a list of per-turn rewards."""
    out = [0.0] * len(rewards)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = rewards[k] + gamma * running
        out[k] = running
    return out


def turn_rewards(traj: Trajectory) -> list[float]:
    """Per-turn rewards for step-level credit: each turn's shaping ``Turn.reward``, plus the
    outcome ``Trajectory.reward`` on the last turn (GiGPO's sparse terminal reward)."""
    r = [t.reward for t in traj.turns]
    if r:
        r[-1] += traj.reward
    return r


def context_key(traj: Trajectory, turn_index: int) -> Hashable:
    """The default anchor state of a turn: the exact token context the policy saw before it."""
    return tuple(traj.context_ids(turn_index))


def gigpo(
    groups: Sequence[TrajectoryGroup],
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    state_key: Callable[[Trajectory, int], Hashable] = context_key,
    turn_discount: float | None = None,
) -> None:
    """GiGPO (Feng et al. 2025): ``A = A^E(tau_i) + omega * A^S(s, a)``.

    The episode advantage ``A^E`` is GRPO over the group's outcome rewards. Turns of the group
    that share an anchor state (``state_key``; by default an identical token context) form a
    step-level group; each turn's discounted return ``G_t`` (over :func:`turn_rewards`) is normalised
    within its anchor group to give ``A^S``. An anchor group of one, or of equal returns, gives
    ``A^S = 0``, so GiGPO reduces to episode-level GRPO when no states repeat. Excluded
    trajectories join neither the episode group nor any anchor group. ``turn_discount`` makes the
    episode group compare :func:`discounted_score` instead of the outcome alone (the step returns
    already include per-turn rewards, discounted forward by ``gamma``).
    """
    for g in groups:
        trajs = scored(g)
        if not trajs:
            continue
        episode = grpo(_rewards(trajs, turn_discount), scale_by_std=scale_by_std, eps=eps)[0].tolist()
        returns = [discounted_returns(turn_rewards(t), gamma) for t in trajs]
        anchors: dict[Hashable, list[tuple[int, int]]] = {}
        for i, t in enumerate(trajs):
            for k in range(len(t.turns)):
                anchors.setdefault(state_key(t, k), []).append((i, k))
        step_adv = [[0.0] * len(t.turns) for t in trajs]
        for members in anchors.values():
            r = torch.tensor([[returns[i][k] for i, k in members]], dtype=torch.float32)  # (1, n)
            a = grpo(r, scale_by_std=scale_by_std, eps=eps)[0].tolist()
            for (i, k), v in zip(members, a, strict=True):
                step_adv[i][k] = v
        for i, t in enumerate(trajs):
            for k, turn in enumerate(t.turns):
                turn.advantage = float(episode[i] + omega * step_adv[i][k])


ESTIMATORS: dict[str, Estimator] = {
    "flow_grpo": flow_grpo,
    "flow_grpo_turn_weighted": flow_grpo_turn_weighted,
    "grpo_dr": grpo_dr,
    "rloo": rloo_estimator,
    "gigpo": gigpo,
}


def register_estimator(name: str, fn: Estimator) -> None:
    """Add an estimator under ``name`` (usable as ``algorithm.estimator`` in a config)."""
    ESTIMATORS[name] = fn


def get_estimator(estimator: str | Estimator) -> Estimator:
    """Resolve a registry name (or pass a function through); the error lists the valid names."""
    if callable(estimator):
        return estimator
    try:
        return ESTIMATORS[estimator]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(str(estimator), ESTIMATORS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown advantage estimator {estimator!r}{hint}; choose one of {sorted(ESTIMATORS)} "
            "or register one with flowgrpo.algorithms.advantages.register_estimator"
        ) from None


def compute_advantages(
    groups: list[TrajectoryGroup], estimator: str | Estimator = "flow_grpo", **kw
) -> list[TrajectoryGroup]:
    """Fill ``Turn.advantage`` for every turn of every trajectory (in place) and return ``groups``.

    ``estimator`` is a name from :data:`ESTIMATORS` or a function with the :class:`Estimator`
    signature; ``kw`` go to it (e.g. ``scale_by_std``, ``gamma``). Excluded trajectories end with
    advantage 0 whatever the estimator did.
    """
    get_estimator(estimator)(groups, **kw)
    for g in groups:
        for t in g.trajectories:
            if t.excluded is not None:
                for turn in t.turns:
                    turn.advantage = 0.0
    return groups


def is_zero_variance(group: TrajectoryGroup, tol: float = 0.0, *, turn_discount: float | None = None) -> bool:
    """True when every scored (non-excluded) trajectory of the group has the same score (the
    outcome reward, or :func:`discounted_score` under ``turn_discount``): no learning signal under
    group-relative estimators; DAPO's dynamic sampling drops such groups. A group with no scored
    trajectory counts as zero-variance."""
    r = [discounted_score(t, turn_discount) for t in group.trajectories if t.excluded is None]
    return len(r) == 0 or (max(r) - min(r)) <= tol


__all__ = [
    "ESTIMATORS",
    "Estimator",
    "compute_advantages",
    "context_key",
    "discounted_returns",
    "discounted_score",
    "flow_grpo",
    "flow_grpo_turn_weighted",
    "get_estimator",
    "gigpo",
    "grpo",
    "grpo_dr",
    "is_zero_variance",
    "register_estimator",
    "rloo",
    "rloo_estimator",
    "scored",
    "turn_rewards",
]
