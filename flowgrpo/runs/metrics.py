"""Metrics: rollout statistics of a batch of groups, and a JSONL (+ optional TensorBoard) logger.

``RUN/metrics.jsonl`` is read back with :meth:`flowgrpo.runs.rundir.RunDir.metrics`."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowgrpo.algorithms.episodes import accuracy_of
from flowgrpo.runs.store import append_line
from flowgrpo.types import Trajectory, TrajectoryGroup


def valid_tool_call_rate(trajs: Sequence[Trajectory], parser: Any = None) -> float | None:
    """Among turns that tried to call a tool, the fraction whose calls all parsed.

    With a ``parser`` the raw action text is re-parsed (``ParsedAction.errors`` empty and at least one
    call); without one, turns with well-formed ``tool_calls`` count as valid and turns whose text has
    a ``<tool_call`` tag but no parsed call as invalid. None when no turn tried.
    """
    tried = ok = 0
    for t in trajs:
        for turn in t.turns:
            text = turn.action.content
            if parser is not None:
                try:
                    parsed = parser.parse(text)
                    calls, errors = parsed.message.tool_calls, parsed.errors
                except Exception:
                    calls, errors = [], ["unparseable"]
                attempted = bool(calls) or any("tool" in e.lower() for e in errors)
                valid = bool(calls) and not errors
            else:
                attempted = bool(turn.action.tool_calls) or "<tool_call" in text
                valid = bool(turn.action.tool_calls)
            tried += attempted
            ok += attempted and valid
    return ok / tried if tried else None


def rollout_stats(groups: Sequence[TrajectoryGroup], parser: Any = None) -> dict[str, float]:
    """Reward, accuracy, turns, tokens, termination counts and reward parts over all trajectories;
    ``episodes_excluded`` counts episodes left out of training (``Trajectory.excluded``) and
    ``excluded/<source>`` splits them by the part of the reason before ``:``."""
    trajs = [t for g in groups for t in g.trajectories]
    n = max(len(trajs), 1)
    out: dict[str, float] = {
        "episodes": float(len(trajs)),
        "reward_mean": sum(t.reward for t in trajs) / n,
        "reward_std": _std([t.reward for t in trajs]),
        "accuracy": sum(accuracy_of(t) for t in trajs) / n,
        "turns_mean": sum(len(t.turns) for t in trajs) / n,
        "action_tokens": float(sum(t.num_action_tokens for t in trajs)),
        "tokens": float(sum(t.num_tokens for t in trajs)),
        "zero_variance_groups": float(sum(1 for g in groups if g.trajectories and _zero_variance(g))),
        "episodes_excluded": float(sum(t.excluded is not None for t in trajs)),
    }
    # Per source of exclusion: "termination:error" counts under excluded/termination.
    for k, v in Counter(t.excluded.split(":", 1)[0] for t in trajs if t.excluded is not None).items():
        out[f"excluded/{k}"] = float(v)
    rate = valid_tool_call_rate(trajs, parser)
    if rate is not None:
        out["valid_tool_call_rate"] = rate
    for k, v in Counter(t.termination.value for t in trajs).items():
        out[f"termination/{k}"] = float(v)
    names = {k for t in trajs for k in t.reward_breakdown}
    for k in sorted(names):
        out[f"reward/{k}"] = sum(t.reward_breakdown.get(k, 0.0) for t in trajs) / n
    return out


def _zero_variance(group: TrajectoryGroup) -> bool:
    """Equal rewards among the scored (non-excluded) episodes: no group-relative signal."""
    return len({t.reward for t in group.trajectories if t.excluded is None}) <= 1


def _std(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


class MetricsLogger:
    """Appends one JSON object per step to ``path`` (always: the run's record) and mirrors the
    finite scalars to the trackers of ``log_to`` (``tensorboard``, ``wandb``; see
    :mod:`flowgrpo.runs.tracking`, each imported only when named)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        log_to: Sequence[str] = ("jsonl",),
        config: dict[str, Any] | None = None,
    ) -> None:
        from flowgrpo.runs.tracking import make_sinks

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._sinks = make_sinks(tuple(log_to), self.path.parent, config)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        from flowgrpo.runs.tracking import scalars_of

        rec = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        append_line(self.path, json.dumps(rec))
        if self._sinks:
            scalars = scalars_of(metrics)
            for sink in self._sinks:
                sink.log(step, scalars)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


__all__ = ["MetricsLogger", "accuracy_of", "rollout_stats", "valid_tool_call_rate"]
