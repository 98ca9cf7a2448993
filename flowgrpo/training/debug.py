"""Debug modes that separate sampling problems from optimisation problems.

``flowgrpo train CONFIG --rollout-only`` (:func:`rollout_only`) samples one step's groups with the
current policy, scores them, gives them advantages and saves them, without any update: a run whose
reward never moves can be checked for the sampling side (does the policy ever earn reward, are the
groups all equal, do episodes end by error?) before any gradient is blamed.

``flowgrpo train --update-only RUN --step N`` (:func:`update_only`) replays the trajectories saved
at step N into one update (:meth:`flowgrpo.training.trainer.Trainer.update`, the trainer's own) from the
policy that sampled them (the checkpoint of step N-1, or the initial model for step 1) and prints
the loss terms beside the values the run recorded at that step. With the same weights, optimizer
state and seed the replay reproduces the recorded update, so a difference points at the update
code, and overrides (``--set algorithm.clip_high=0.4``) try other optimisation settings on exactly
the same samples.

Neither mode touches the run's records: rollout-only writes one trajectory file (refusing to
overwrite one), update-only writes nothing into RUN at all.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowgrpo.config import TrainConfig
from flowgrpo.env import Environment
from flowgrpo.runs.checkpoint import load_policy_state, load_reference, read_checkpoint
from flowgrpo.runs.metrics import rollout_stats
from flowgrpo.runs.rundir import RunDir, RunError, ranges
from flowgrpo.types import Task, Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)

# the loss terms printed first, in this order; the rest of the update's metrics follow by name
MAIN_TERMS = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "ratio_mean", "grad_norm", "train_tokens")


@dataclass
class RolloutReport:
    """What :func:`rollout_only` sampled: the step it stands for, where it was saved, its stats."""

    step: int
    path: Path
    stats: dict[str, float]
    groups_trainable: int
    groups_sampled: int

    def summary(self) -> str:
        s = self.stats
        lines = [
            f"rollout of step {self.step} (no update) saved to {self.path}",
            f"  episodes {s['episodes']:.0f}  reward_mean {s['reward_mean']:.4f}  "
            f"accuracy {s['accuracy']:.4f}  episodes_excluded {s.get('episodes_excluded', 0.0):.0f}",
            f"  groups with a learning signal (rewards not all equal): {self.groups_trainable} of "
            f"{self.groups_sampled}",
        ]
        lines += [f"  {k} {v:.4g}" for k, v in sorted(s.items()) if k.startswith("termination/")]
        return "\n".join(lines)


@dataclass
class UpdateReport:
    """What :func:`update_only` replayed: the loss terms of the update, and the ones recorded."""

    step: int
    checkpoint: str
    trajectories: int
    trained: int
    terms: dict[str, float]
    recorded: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [
            f"update of step {self.step} replayed from {self.checkpoint}: {self.trained} of "
            f"{self.trajectories} saved trajectories trained on",
            f"  {'term':<24}{'replayed':>14}{'recorded':>14}",
        ]
        if not self.trained:
            lines.append(
                "  nothing to train: every group's rewards were equal, or its episodes excluded or "
                "masked (a sampling problem: see the rollout's stats with flowgrpo replay RUN --step N)"
            )
        names = [k for k in MAIN_TERMS if k in self.terms]
        names += sorted(k for k in self.terms if k not in MAIN_TERMS)
        for k in names:
            rec = f"{self.recorded[k]:>14.6g}" if k in self.recorded else f"{'-':>14}"
            lines.append(f"  {k:<24}{self.terms[k]:>14.6g}{rec}")
        return "\n".join(lines)


def rollout_only(trainer: Any) -> RolloutReport:
    """One step's rollout (groups, rewards, episode rules, advantages) saved to
    ``RUN/trajectories/step_N.jsonl`` (N = the trainer's step + 1, the step it would train) with no
    update. A configured warm start runs first and is checkpointed at step 0, so
    :func:`update_only` can start from the policy that sampled."""
    from flowgrpo.runs.store import TrajectoryWriter

    step = trainer.step + 1
    path = trainer.out / "trajectories" / f"step_{step:06d}.jsonl"
    if path.exists():
        raise RunError(
            f"{path} already exists: rollout-only never overwrites a run's trajectories; set "
            "run.output_dir to a fresh directory (or run.resume=true to roll out the step after the latest checkpoint)"
        )
    if trainer.cfg.sft.enabled and trainer.step == 0 and not trainer.counters["sft_done"]:
        trainer.warm_start()
        trainer.save()
    batch = trainer.collect(trainer.step)
    with TrajectoryWriter(path) as w:
        w.write_groups(batch.groups)
    return RolloutReport(
        step=step,
        path=path,
        stats=rollout_stats(batch.groups, trainer.parts.parser),
        groups_trainable=len(batch.train_groups),
        groups_sampled=len(batch.groups),
    )


def groups_of(trajs: Sequence[Trajectory]) -> list[TrajectoryGroup]:
    """Saved trajectories regrouped by ``group_id`` in their saved order (the task itself is not
    stored with them; its id is)."""
    by_id: dict[str, TrajectoryGroup] = {}
    for t in trajs:
        g = by_id.get(t.group_id)
        if g is None:
            g = by_id[t.group_id] = TrajectoryGroup(group_id=t.group_id, task=Task(id=t.task_id, prompt=""))
        g.trajectories.append(t)
    return list(by_id.values())


def update_only(
    run: str | Path | RunDir,
    step: int,
    overrides: Sequence[str] = (),
    *,
    model: Any = None,
    tokenizer: Any = None,
    env_factory: Callable[[], Environment] | None = None,
    reward: Any = None,
) -> UpdateReport:
    """Replay the trajectories saved at ``step`` into one update from the policy that sampled them.

    The policy, optimizer and scheduler come from the checkpoint of ``step - 1`` (for step 1 without
    one, the initial model the config builds); the trainer's step is set to ``step - 1`` so the
    mini-batch order is the one the run used. Groups whose rewards are all equal are dropped as in
    training; the saved advantages are used as they are. ``overrides`` change the config (e.g.
    ``algorithm.clip_high=0.4``); ``model``... are ready-made parts, as for
    :class:`~flowgrpo.training.trainer.Trainer`. Nothing is written into the run directory.
    """
    from flowgrpo.training.trainer import Trainer

    rd = run if isinstance(run, RunDir) else RunDir(run)
    if step < 1:
        raise RunError(f"--step {step}: steps start at 1 (saved steps: {ranges(rd.steps())})")
    trajs = rd.trajectories(step)  # RunError listing the saved steps when absent
    cfg: TrainConfig = rd.config(overrides)
    source = _sampling_checkpoint(rd, step, cfg)
    with tempfile.TemporaryDirectory(prefix="flowgrpo-update-only-") as tmp:
        cfg.run.output_dir = tmp  # the trainer's config.yaml and metrics go here, not into RUN
        cfg.run.resume = False
        cfg.run.log_to = ["jsonl"]
        cfg.run.progress = False
        tr = Trainer(cfg, model=model, tokenizer=tokenizer, env_factory=env_factory, reward=reward)
        if source is not None:
            data = read_checkpoint(source)
            load_policy_state(tr.model, data.policy, source=data.path)
            if data.optimizer is not None:
                tr.optimizer.load_state_dict(data.optimizer)
            if data.state.get("scheduler") is not None:
                tr.scheduler.load_state_dict(data.state["scheduler"])
            if tr.ref_model is not None and tr.ref_model is not tr.model and data.reference is not None:
                load_reference(rd.checkpoint_root, data.reference, tr.ref_model)
        tr.step = step - 1
        groups = groups_of(trajs)
        kept = [
            t for g in groups if not tr._drop(g) for t in g.trajectories if t.turns and t.excluded is None
        ]
        terms = tr.update(kept)
        trained = sum(tr._trainable(t) for t in kept)
    recorded = {}
    for rec in rd.metrics():
        if rec.step == step:
            recorded.update({k: v for k, v in rec.values.items() if k in terms})
    return UpdateReport(
        step=step,
        checkpoint=str(source) if source is not None else f"the initial model ({cfg.model.name})",
        trajectories=len(trajs),
        trained=trained,
        terms=terms,
        recorded=recorded,
    )


def _sampling_checkpoint(rd: RunDir, step: int, cfg: TrainConfig) -> Path | None:
    """The checkpoint of the policy that sampled ``step`` (saved at ``step - 1``); None means the
    initial model (step 1 of a run without a warm start)."""
    refs = {r.step: r.path for r in rd.checkpoints()}
    if step - 1 in refs:
        return refs[step - 1]
    if step == 1 and not cfg.sft.enabled:
        return None
    starts = {s + 1 for s in refs} | (set() if cfg.sft.enabled else {1})
    replayable = sorted(starts & set(rd.steps()))
    raise RunError(
        f"no checkpoint of step {step - 1} in {rd.checkpoint_root}: the trajectories of step {step} were "
        f"sampled by the policy after step {step - 1}, and replaying them from other weights would not "
        f"show the update the run made; steps that can be replayed: {ranges(replayable)} "
        "(run.save_every=1 keeps every step replayable)"
    )


__all__ = ["RolloutReport", "UpdateReport", "groups_of", "rollout_only", "update_only"]
