"""Held-out evaluation with the statistics a claim needs: n, a 95% interval, pass@k, per-task outcomes.

An :class:`EvalResult` keeps every task's number of correct samples, so two checkpoints evaluated on
the same tasks can be compared with a paired test (:func:`compare`, exact McNemar) instead of two
independent accuracies whose intervals overlap. Greedy evaluation (``samples=1``) is one episode per
task; sampled evaluation runs ``samples`` episodes per task at the rollout temperature and reports
the unbiased pass@k for k = 1, 2, 4, 8 up to ``samples`` (Chen et al. 2021).

Every episode of an evaluation runs concurrently through the rollout engine, so the backend batches
them (continuous batching in ``hf``): 500 greedy episodes cost a few hundred decode steps of a wide
batch, not 500 sequential episodes.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.algorithms.episodes import accuracy_of
from flowgrpo.algorithms.stats import (
    Z95,
    PairedComparison,
    mean_pass_at_k,
    paired_difference,
    wilson_interval,
)
from flowgrpo.components import Components
from flowgrpo.env import Split
from flowgrpo.rollout.engine import RolloutEngine
from flowgrpo.runs.metrics import rollout_stats
from flowgrpo.types import TrajectoryGroup

PASS_KS = (1, 2, 4, 8)


class EvalResult(BaseModel):
    """One evaluation of one policy on ``n`` tasks of a split (one line of ``RUN/eval.jsonl``)."""

    model_config = ConfigDict(extra="ignore")

    label: str = "eval"
    step: int = 0
    split: str = "test"
    greedy: bool = True
    samples: int = Field(1, description="episodes per task")
    n: int = Field(description="tasks")
    accuracy: float = Field(description="mean over all episodes (pass@1)")
    ci95: tuple[float, float] = Field(
        description="95% interval of accuracy: Wilson for one episode per task, else a normal interval "
        "over per-task means (episodes of one task are not independent)"
    )
    pass_at_k: dict[int, float] = Field(default_factory=dict)
    reward_mean: float = 0.0
    mean_turns: float = 0.0
    valid_tool_call_rate: float | None = None
    terminations: dict[str, int] = Field(default_factory=dict)
    per_task: dict[str, int] = Field(default_factory=dict, description="task id -> correct episodes")
    wall_s: float = 0.0

    def outcomes(self, task_ids: Sequence[str]) -> list[int]:
        """Per-task correct counts in the order of ``task_ids`` (KeyError names a missing task)."""
        missing = [t for t in task_ids if t not in self.per_task]
        if missing:
            raise KeyError(f"{len(missing)} tasks were not evaluated in {self.label!r}, e.g. {missing[0]!r}")
        return [self.per_task[t] for t in task_ids]

    def summary(self) -> str:
        lo, hi = self.ci95
        mode = "greedy" if self.greedy else f"{self.samples} samples/task"
        passes = "  ".join(f"pass@{k} {v:.3f}" for k, v in sorted(self.pass_at_k.items()) if k > 1)
        vt = self.valid_tool_call_rate
        terms = ", ".join(f"{k} {v}" for k, v in sorted(self.terminations.items()))
        return (
            f"{self.label:>9} (step {self.step}, {self.split}, n={self.n}, {mode}): accuracy {self.accuracy:.3f} "
            f"[95% CI {lo:.3f}-{hi:.3f}]"
            + (f"  {passes}" if passes else "")
            + f"  reward {self.reward_mean:.3f}  "
            f"turns {self.mean_turns:.2f}  valid tool calls {'-' if vt is None else f'{vt:.2f}'}  [{terms}]  "
            f"{self.wall_s:.0f} s"
        )


def summarize(
    groups: Sequence[TrajectoryGroup],
    *,
    label: str = "eval",
    step: int = 0,
    split: str = "test",
    greedy: bool = True,
    parser: Any = None,
    wall_s: float = 0.0,
) -> EvalResult:
    """An :class:`EvalResult` from scored groups (one group per task)."""
    samples = max((len(g.trajectories) for g in groups), default=1)
    per_task = {g.task.id: int(sum(accuracy_of(t) >= 1.0 for t in g.trajectories)) for g in groups}
    n = len(groups)
    correct = list(per_task.values())
    total = sum(correct)
    acc = total / max(n * samples, 1)
    if samples == 1:
        ci = wilson_interval(total, n)
    else:
        means = [c / samples for c in correct]
        sd = math.sqrt(sum((m - acc) ** 2 for m in means) / max(n - 1, 1))
        half = Z95 * sd / math.sqrt(max(n, 1))
        ci = (max(0.0, acc - half), min(1.0, acc + half))
    stats = rollout_stats(groups, parser)
    return EvalResult(
        label=label,
        step=step,
        split=split,
        greedy=greedy,
        samples=samples,
        n=n,
        accuracy=acc,
        ci95=ci,
        pass_at_k={k: mean_pass_at_k(samples, correct, k) for k in PASS_KS if k <= samples},
        reward_mean=stats["reward_mean"],
        mean_turns=stats["turns_mean"],
        valid_tool_call_rate=stats.get("valid_tool_call_rate"),
        terminations={k.split("/", 1)[1]: int(v) for k, v in stats.items() if k.startswith("termination/")},
        per_task=per_task,
        wall_s=wall_s,
    )


def evaluate(
    parts: Components,
    split: Split = "test",
    n: int | None = None,
    *,
    samples: int = 1,
    greedy: bool = True,
    label: str = "eval",
    step: int = 0,
    progress: bool = False,
) -> tuple[EvalResult, list[TrajectoryGroup]]:
    """Run ``samples`` episodes of each of the first ``n`` tasks of ``split`` (all when None) with
    ``parts.backend``, score them with ``parts.reward``, summarise.

    Greedy evaluation (temperature 0) with ``samples > 1`` would repeat one episode, so it is refused.
    Returns the result and the scored groups (for saving and failure analysis).
    """
    tasks = parts.tasks(split)
    tasks = tasks[:n] if n else tasks
    backend, reward = parts.backend, parts.reward
    if greedy and samples != 1:
        raise ValueError("greedy evaluation is deterministic: use samples=1, or greedy=False to sample")
    cfg = parts.config.rollout
    if greedy:
        cfg = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"temperature": 0.0})})
    bar = None
    on_episode = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks) * samples, desc=f"eval {label}", unit="episode", leave=False)

        def on_episode(traj: Any) -> None:
            bar.update(1)

    t0 = time.monotonic()
    # Waves of at most one batch of episodes: all episodes of a wave decode together and each keeps
    # its keys/values between turns. One wave of 500 episodes would queue later turns behind first
    # turns until the prefix cache had evicted them, re-prefilling every context (measured: 64
    # episodes 51 s, 200 episodes > 4 min on 2 CPU cores).
    engine = RolloutEngine(backend, parts.tokenizer, cfg, agent=parts.agent)
    per_wave = max(1, (cfg.max_batch_size or backend.max_batch_size) // samples)
    groups: list[TrajectoryGroup] = []
    try:
        for i in range(0, len(tasks), per_wave):
            wave = engine.run_groups(
                parts.env_factory,
                tasks[i : i + per_wave],
                samples,
                policy_version=step,
                on_episode=on_episode,
            )
            reward.score_groups(wave)  # per wave (groups are scored independently): a running accuracy
            groups += wave
            if bar is not None:
                done = [accuracy_of(t) >= 1.0 for g in groups for t in g.trajectories]
                bar.set_postfix(acc=f"{sum(done) / len(done):.3f}")
    finally:
        if bar is not None:
            bar.close()
    result = summarize(
        groups,
        label=label,
        step=step,
        split=split,
        greedy=greedy,
        parser=parts.parser,
        wall_s=time.monotonic() - t0,
    )
    return result, groups


def record_evaluation(
    run_dir: str | os.PathLike, result: EvalResult, groups: Sequence[TrajectoryGroup]
) -> None:
    """Append ``result`` to ``RUN/eval.jsonl`` and write its episodes to ``RUN/eval/LABEL.jsonl``,
    replacing an earlier evaluation's of the same label (for replay, paired comparisons and failure
    analysis)."""
    from flowgrpo.runs.store import TrajectoryWriter, append_line

    run = Path(run_dir)
    episodes = run / "eval" / f"{result.label}.jsonl"
    episodes.unlink(missing_ok=True)
    with TrajectoryWriter(episodes) as w:
        w.write_groups(groups)
    append_line(run / "eval.jsonl", result.model_dump_json())


def compare(a: EvalResult, b: EvalResult, *, n: int | None = None) -> PairedComparison:
    """Paired comparison of two greedy evaluations on the tasks they share (exact McNemar), limited
    to the first ``n`` tasks of ``a`` when given."""
    if a.samples != 1 or b.samples != 1:
        raise ValueError("compare needs one episode per task on both sides (greedy evaluations)")
    shared = [t for t in list(a.per_task)[:n] if t in b.per_task]
    if not shared:
        raise ValueError(f"{a.label!r} and {b.label!r} share no tasks: evaluate both on the same split and n")
    return paired_difference(a.outcomes(shared), b.outcomes(shared))


__all__ = ["PASS_KS", "EvalResult", "compare", "evaluate", "record_evaluation", "summarize"]
