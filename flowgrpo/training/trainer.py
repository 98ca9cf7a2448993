"""The Flow-GRPO training loop, readable top to bottom.

One RL step (:meth:`Trainer.train_step`)::

    tasks    = the next ``tasks_per_step`` tasks of a seeded, reshuffled-per-epoch stream
    groups   = ``group_size`` multi-turn episodes per task           (flowgrpo.rollout.engine, shares our model)
    rewards  = CompositeReward fills traj.reward + breakdown          (flowgrpo.rewards)
    advs     = parts.estimator(groups)                               (flowgrpo.algorithms.advantages)
    drop groups whose rewards are all equal (no signal; DAPO's dynamic sampling, without resampling)
    rows     = one packed row per episode (prefix merging)           (flowgrpo.training.batching)
    for epoch, mini-batch:                                           (PPO-style reuse of the batch)
        for micro-batch (token budget):
            logprobs of action tokens (chunked LM head, bf16 autocast)   (flowgrpo.modeling.logprobs)
            loss = clipped surrogate + KL to the frozen reference        (flowgrpo.algorithms.loss)
            backward (gradients accumulate; aggregation weights make the sum exact)
        clip grad norm, optimizer step (a NaN/inf loss or gradient skips it, counted;
        fp16 autocast scales the loss and adapts the scale)          (flowgrpo.training.loss_scale)
    LR schedule step, metrics (JSONL, TensorBoard), trajectories (JSONL), checkpoint

The parts come from :func:`flowgrpo.components.build` (policy, backend, environment, tasks, reward,
estimator); the algorithms live in their modules as pure functions; the supervised warm start is
:mod:`flowgrpo.training.sft` and evaluation :mod:`flowgrpo.runs.evaluation`. This file only runs the loop.

What it leaves out, and why: no value model (group baselines replace it, as in GRPO); no
resampling of zero-variance groups (it makes the step's cost unpredictable on CPU). The sampler's
logprobs are the "old" policy when sampler and trainer both run fp32 (the ``hf`` backend shares
this model, so they agree to ~1e-5); otherwise (a bf16 inference copy or autocast, another engine,
async staleness) ``algorithm.tis`` takes the trainer's own logprobs as the old policy and weights
each token by the truncated sampler/trainer ratio. Every step reports that ratio before its first
optimizer step (``sampler_ratio_mean/min/max``, 1 when the two agree). Under ``torchrun`` the same step runs data-parallel: each rank rolls out a
shard of the tasks and trains its own rows of the gathered batch (:mod:`flowgrpo.training.distributed`).

Reproducibility: every step reseeds python/numpy/torch from ``(seed, step)`` before sampling, and a
checkpoint holds model, optimizer, scheduler, RNG states, the step and the task-stream position, so
a run resumed from step k ends with the same parameters as one run straight through.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import signal
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from flowgrpo.algorithms.advantages import is_zero_variance
from flowgrpo.algorithms.curriculum import TaskSampler, TaskStream, make_sampler
from flowgrpo.algorithms.episodes import apply_overlong_penalty, exclude_terminations, is_truncated
from flowgrpo.algorithms.loss import (
    entropy_top_q_threshold,
    policy_loss,
    sampler_ratio_stats,
    truncated_is_weights,
)
from flowgrpo.components import Components, GroupScorer, build, env_factory_of
from flowgrpo.config import TrainConfig, dump_config
from flowgrpo.env import Environment, Split
from flowgrpo.gateway.agents import GatewayRollout
from flowgrpo.gateway.agents import summarize as summarize_gateway
from flowgrpo.modeling.hardware import resolve_device
from flowgrpo.modeling.logprobs import action_logprobs
from flowgrpo.modeling.lora import is_lora, reference_mode
from flowgrpo.rollout.engine import RolloutEngine
from flowgrpo.runs.checkpoint import (
    REFERENCE_FILE,
    ReferencePointer,
    load_policy_state,
    load_reference,
    save_checkpoint,
    set_rng_state,
    write_reference,
)
from flowgrpo.runs.evaluation import EvalResult, evaluate, record_evaluation
from flowgrpo.runs.metrics import MetricsLogger, rollout_stats
from flowgrpo.runs.records import rewind_records
from flowgrpo.training import distributed
from flowgrpo.training.async_rollout import AsyncRollout, RolloutBatch, rollout_replica, staleness_stats
from flowgrpo.training.batching import MicroBatch, Row, build_rows, micro_batches
from flowgrpo.training.demo_replay import DemoReplay, build_replay
from flowgrpo.training.fsdp import ShardedPolicy
from flowgrpo.training.idle import IdleWatch
from flowgrpo.training.loss_scale import loss_scale_for
from flowgrpo.training.optim import adamw
from flowgrpo.training.resume import choose_checkpoint
from flowgrpo.training.value import critic_of
from flowgrpo.types import Trajectory, TrajectoryGroup
from flowgrpo.utils import interrupt
from flowgrpo.utils.memory import release_free_heap
from flowgrpo.utils.seeding import seed_everything

log = logging.getLogger(__name__)

SAMPLER_RATIO_TOLERANCE = 1e-3
"""How far from 1 the sampler/trainer ratio of an on-policy update may be when both run fp32 (the
``hf`` backend over the trained weights): measured 0.99997-1.00001 on SmolLM2-135M (docs/benchmarks.md).
Beyond it, with ``algorithm.tis`` off, the trainer warns: the loss would read rounding as policy
change (a truncated distribution, ``top_p < 1`` or ``top_k``, also moves it: the trainer scores the
full distribution)."""


def lr_lambda(schedule: str, total: int, warmup: int, min_ratio: float) -> Callable[[int], float]:
    """Multiplier of the base LR at scheduler step ``s``: linear warmup, then constant / linear /
    cosine decay to ``min_ratio``.

    Not ``transformers.get_scheduler``: its warmup starts at 0 (the first update is wasted at
    LR 0; ours is ``(s + 1) / warmup``), its linear schedule has no floor (``min_ratio``) and its
    cosine keeps oscillating past ``total``; the numbers would change for every run with warmup
    (measured: max difference 0.33 of the base LR at warmup 3)."""

    def f(s: int) -> float:
        if warmup and s < warmup:
            return (s + 1) / warmup
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (s - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return min_ratio + (1 - min_ratio) * (1 - frac)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac))

    return f


def frozen_reference(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of ``model``: eval mode, no gradients (the KL anchor). A LoRA policy is its own
    reference: :func:`flowgrpo.modeling.lora.reference_mode` switches its adapters off, so no copy is made
    (and the anchor stays the base model, also after a warm start)."""
    if is_lora(model):
        return model
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class Trainer:
    """Runs the resumable RL loop over the parts of a config.

    Args:
        config: the run's :class:`~flowgrpo.config.TrainConfig`.
        parts: what :func:`flowgrpo.components.build` made of it (built here when None).
        model, tokenizer, env_factory, reward: ready-made parts for ``build`` (only without ``parts``).
    """

    def __init__(
        self,
        config: TrainConfig,
        parts: Components | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        env_factory: Callable[[], Environment] | None = None,
        reward: GroupScorer | None = None,
    ) -> None:
        self.cfg = cfg = config
        # torchrun: join the process group first (nccl on cuda:LOCAL_RANK, set before the build)
        device = resolve_device(cfg.model.device)
        self.dist = distributed.init_from_env(device)
        distributed.check_supported(cfg, self.dist)
        if parts is None:
            parts = build(cfg, model=model, tokenizer=tokenizer, env_factory=env_factory, reward=reward)
        elif any(x is not None for x in (model, tokenizer, env_factory, reward)):
            raise ValueError("pass either built parts or the pieces to build them from, not both")
        self.parts = parts
        # every tensor of the update is created here: the policy's device
        self.device = parts.device
        if self.dist.enabled and self.device.type != device.type:
            raise ValueError(
                f"under torchrun the policy must be on this rank's {device} (model.device="
                f"{cfg.model.device}), but the model passed in is on {self.device}"
            )
        self.model.train()
        # The KL anchor: skipped entirely (no copy, no forward) when kl_coef is 0.
        self.ref_model = frozen_reference(self.model) if cfg.algorithm.kl_coef > 0 else None
        self.critic = critic_of(
            cfg, self.model, parts.autocast
        )  # PPO's value model; None for group baselines
        self.engine = RolloutEngine(parts.backend, parts.tokenizer, cfg.rollout, agent=parts.agent)
        # rollout.source=gateway: episodes come from agent programs calling the policy over HTTP
        self.gateway: GatewayRollout | None = None
        if cfg.rollout.source == "gateway":
            if self.dist.enabled or cfg.train.async_staleness:
                raise ValueError(
                    "rollout.source=gateway runs in one process with synchronous rollouts: unset "
                    "train.async_staleness and run without torchrun"
                )
            assert cfg.rollout.gateway is not None  # the config's validator says so
            self.gateway = GatewayRollout(parts.backend, parts.tokenizer, cfg.rollout, cfg.rollout.gateway)
        # train.parallel=fsdp2 under torchrun: the trained copy is sharded (flowgrpo.training.fsdp); the full
        # model keeps serving rollout, evaluation and checkpoints
        self.sharded = ShardedPolicy(self.model, self.dist.world_size, self.device) if self._fsdp() else None
        self.optimizer = adamw(
            self.sharded.module if self.sharded is not None else self.model,
            lr=cfg.train.lr,
            betas=cfg.train.betas,
            weight_decay=cfg.train.weight_decay,
        )
        self.scaler = loss_scale_for(parts.autocast)  # float16 autocast: dynamic loss scaling
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_lambda(cfg.train.lr_schedule, cfg.train.steps, cfg.train.warmup_steps, cfg.train.min_lr_ratio),
        )
        self.stream: TaskSampler = make_sampler(cfg.curriculum, parts.tasks("train"), cfg.train.seed)
        # train.async_staleness > 0: a rollout thread samples ahead (flowgrpo.training.async_rollout)
        self.replica = rollout_replica(cfg, parts) if cfg.train.async_staleness else None
        self.replay: DemoReplay | None = None  # sft.replay_coef: built once training starts
        if self.replica is not None:
            self.engine.backend = self.replica  # the rollout thread samples its own copy
        self.producer: AsyncRollout | None = None
        self._stage = -1  # the curriculum.difficulty stage the environment was built for
        self._stream_state: dict[str, int] | None = None  # of the last batch trained on (async)
        self.idle = IdleWatch(cfg.train.group_size)  # says so when steps train nothing
        self.step = 0
        self.counters = {"nan_skipped_steps": 0, "sft_done": 0}
        self._warned_ratio = False
        self.out = Path(cfg.run.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        self._mine: set[str] = set()  # ids of the trajectories this rank rolled out (torchrun)
        self._stop_signal: int | None = None
        self.metrics: MetricsLogger | None = None  # rank 0 alone writes the run directory
        if self.dist.is_main:
            self.metrics = MetricsLogger(
                self.out / "metrics.jsonl", log_to=cfg.run.log_to, config=cfg.model_dump(mode="json")
            )
            self.out.mkdir(parents=True, exist_ok=True)
            dump_config(cfg, self.out / "config.yaml")
        if cfg.run.resume:
            self.resume(None if cfg.run.resume is True else cfg.run.resume)

    def _fsdp(self) -> bool:
        if self.cfg.train.parallel != "fsdp2":
            return False
        if not self.dist.enabled:
            log.info("train.parallel=fsdp2 with one process: nothing to shard, training the model as is")
        return self.dist.enabled

    # the parts the loop uses most, by name
    @property
    def model(self) -> Any:
        return self.parts.model

    @property
    def tokenizer(self) -> Any:
        return self.parts.tokenizer

    @property
    def env_factory(self) -> Callable[[], Environment]:
        return self.parts.env_factory

    @property
    def reward(self) -> GroupScorer:
        return self.parts.reward

    @reward.setter
    def reward(self, reward: GroupScorer) -> None:
        self.parts.reward = reward

    # ------------------------------------------------------------------ the loop
    def train(self, until_step: int | None = None, *, eval_last_step: bool = True) -> dict[str, Any]:
        """Run RL steps until ``config.train.steps`` (or ``until_step``), checkpointing every
        ``run.save_every`` steps and at the end, with a held-out evaluation every ``run.eval_every``
        steps (``eval_last_step=False`` skips it at the last step, for a caller that evaluates the
        final policy on more tasks). SIGINT/SIGTERM stop the rollout within one decode step (the
        step is discarded) or finish the current update, write a checkpoint of the last complete
        step and return (``status: "interrupted"``); see :meth:`stop_on_signals`. A pending ``sft``
        warm start runs first, in the same block: a signal during its supervised epochs returns
        ``interrupted`` at step 0 with nothing saved; once it ends, step 0 is checkpointed."""
        from tqdm.auto import tqdm

        log.info(
            "numerics on %s: sampling from %s, update %s, TIS %s",
            self.device,
            f"a {self.parts.rollout_dtype} copy" if self.parts.rollout_dtype else "the fp32 weights",
            f"under {self.parts.autocast} autocast" if self.parts.autocast else "in fp32",
            self.parts.tis,
        )
        cfg = self.cfg
        target = min(until_step or cfg.train.steps, cfg.train.steps)
        with self.stop_on_signals():
            if cfg.sft.enabled and self.step == 0 and not self.counters["sft_done"]:
                try:
                    self.warm_start()
                except interrupt.Interrupted:  # between supervised batches: nothing to keep
                    log.warning(
                        "signal %d: the warm start was cut short; nothing is saved, and the same call "
                        "starts it again",
                        self._stop_signal,
                    )
                    return {"status": "interrupted", "step": self.step}
                self.save()  # a crash during RL resumes after the warm start, not before it
            if cfg.sft.replay_coef and self.replay is None and self.step < target:
                self.replay = build_replay(self.parts)  # the warm start's demonstrations, regenerated
            distributed.broadcast_parameters(self.model, self.dist)  # every rank starts from rank 0's
            if self.sharded is not None:
                self.sharded.load_from(self.model)
            last: dict[str, Any] = {}
            status = "finished"
            bar = tqdm(
                total=target, initial=self.step, disable=not cfg.run.progress, desc="flowgrpo", unit="step"
            )
            if cfg.train.async_staleness and self.step < target:
                if self.replica is not None:  # the policy as it is now: warm-started, resumed
                    self.replica.sync_weights(self.model, version=self.step)
                self.producer = AsyncRollout(
                    self.collect,
                    staleness=cfg.train.async_staleness,
                    first_step=self.step,
                    last_step=target,
                    before_batch=self.replica.refresh if self.replica is not None else None,
                )
            while self.step < target:
                stream_before = self.stream.state_dict() if self.producer is None else None
                try:
                    last = self.train_step()
                except interrupt.Interrupted:  # stopped mid-rollout: the step never happened
                    if stream_before is not None:
                        self.stream.load_state_dict(stream_before)  # its tasks are drawn again
                    log.warning(
                        "signal %d: step %d discarded mid-rollout; checkpointing at step %d and stopping",
                        self._stop_signal,
                        self.step + 1,
                        self.step,
                    )
                    status = "interrupted"
                    break
                bar.update(1)
                bar.set_postfix(
                    reward=f"{last['reward_mean']:.3f}",
                    acc=f"{last['accuracy']:.2f}",
                    tok_s=f"{last['tokens_per_s']:.0f}",
                )
                if (
                    self.metrics is not None
                    and cfg.run.eval_every
                    and self.step % cfg.run.eval_every == 0
                    and (eval_last_step or self.step < target)
                    and self._stop_signal is None  # the caller evaluates once the stop is handled
                ):
                    try:
                        ev = self.evaluate(n=cfg.run.eval_n, label=f"step{self.step}", record=True)
                    except interrupt.Interrupted:
                        log.warning(
                            "signal %d: the evaluation at step %d was cut short and is not recorded",
                            self._stop_signal,
                            self.step,
                        )
                    else:
                        self.metrics.log(
                            self.step,
                            {
                                "eval/accuracy": ev.accuracy,
                                "eval/ci95_low": ev.ci95[0],
                                "eval/ci95_high": ev.ci95[1],
                            },
                        )
                if self._stop_signal is not None:
                    log.warning(
                        "signal %d: checkpointing at step %d and stopping", self._stop_signal, self.step
                    )
                    status = "interrupted"
                    break
                if cfg.run.save_every and self.step % cfg.run.save_every == 0:
                    self.save()
            bar.close()
            if self.producer is not None:
                self.producer.close()
                self.producer = None
                if self._stream_state is not None:  # batches drawn ahead are drawn again next time
                    self.stream.load_state_dict(self._stream_state)
            if not (cfg.run.save_every and self.step % cfg.run.save_every == 0) or status == "interrupted":
                self.save()  # inside the block: a signal here lets the checkpoint finish
        if self.dist.is_main:
            self.idle.summary()
        return {"status": status, "step": self.step, **last}

    def close(self) -> None:
        """Stop what the trainer started beside itself (the gateway of ``rollout.source=gateway``)."""
        if self.gateway is not None:
            self.gateway.close()
            self.gateway = None

    def train_step(self) -> dict[str, Any]:
        """One RL step: rollout -> rewards -> advantages -> updates -> logs. Returns its metrics."""
        cfg, t0 = self.cfg, time.monotonic()
        asynchronous: dict[str, float] = {}
        if self.producer is None:
            batch = self.collect(self.step)
        else:  # sampled by the rollout thread, up to async_staleness versions behind
            batch = self.producer.take(self.step)
            self._stream_state = batch.stream_state
            asynchronous = staleness_stats(batch.groups, self.step, cfg.train.async_staleness)
        interrupt.check()  # a signal during the rollout: its episodes ended early, train on none
        groups, train_groups, rounds = batch.groups, batch.train_groups, batch.rounds
        release_free_heap()  # the rollout's freed caches, before the update allocates its own
        t_rollout = time.monotonic() - t0
        trajs = [t for g in train_groups for t in g.trajectories if t.turns and t.excluded is None]
        t1 = time.monotonic()
        upd = self.update(trajs)
        release_free_heap()  # the update's activations and gradients, before the next rollout
        if upd["optimizer_steps"]:
            # the next rollout samples the updated policy: version step + 1
            self.parts.backend.sync_weights(self.model, version=self.step + 1)
            if self.replica is not None:
                self.replica.sync_weights(self.model, version=self.step + 1)
        t_update = time.monotonic() - t1
        with warnings.catch_warnings():  # a step whose update was skipped still advances the schedule
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()
        self.step += 1
        if self.producer is not None:
            self.producer.updated(self.step)
        if cfg.run.save_trajectories and self.dist.is_main:
            self._save_trajectories(groups)
        stats = rollout_stats(groups, self.parts.parser)
        m = {
            **stats,
            **upd,
            "groups_trained": float(len(train_groups)),
            "groups_sampled": float(len(groups)),
            "resample_rounds": float(rounds),
            **asynchronous,
            "episodes_masked_truncated": float(
                sum(not self._trainable(t) for t in trajs if t.excluded is None)
            ),
            "lr": self.scheduler.get_last_lr()[0],
            "time/rollout_s": t_rollout,
            "time/update_s": t_update,
            "time/step_s": time.monotonic() - t0,
            "tokens_per_s": (stats["action_tokens"] / t_rollout) if t_rollout > 0 else 0.0,
            "update_tokens_per_s": upd.get("train_tokens", 0.0) / t_update if t_update > 0 else 0.0,
            **{k: float(v) for k, v in self.counters.items()},
        }
        if self.metrics is not None:
            self.metrics.log(self.step, m)
        self.idle.observe(self.step, m)
        return m

    def collect(self, step: int) -> RolloutBatch:
        """The rollout of ``step``: groups of the next ``tasks_per_step`` tasks, plus DAPO's
        resample rounds to refill groups dropped for equal rewards (the rollout thread's job when
        ``train.async_staleness`` > 0)."""
        cfg, t0 = self.cfg, time.monotonic()
        self._reseed(step)
        self._difficulty(step)
        self._mine = set()
        groups = self._rollout(cfg.train.tasks_per_step)
        train_groups = [g for g in groups if not self._drop(g)]
        rounds = 0
        while rounds < cfg.train.resample_rounds and len(train_groups) < cfg.train.tasks_per_step:
            extra = self._rollout(cfg.train.tasks_per_step - len(train_groups))
            groups += extra
            train_groups += [g for g in extra if not self._drop(g)]
            rounds += 1
        return RolloutBatch(
            step, groups, train_groups, rounds, self.stream.state_dict(), time.monotonic() - t0
        )

    def _rollout(self, n_tasks: int) -> list[TrajectoryGroup]:
        """Groups of the next ``n_tasks`` tasks, rolled out with the current policy, scored, and
        given advantages (each group is normalised on its own, so rounds can be mixed)."""
        cfg = self.cfg
        tasks = self.stream.next(n_tasks)
        # torchrun: this rank's shard of the tasks, seeded as in one call over all of them
        mine = distributed.shard(len(tasks), self.dist.rank, self.dist.world_size)
        if self.gateway is not None:  # the agent programs posted the rewards themselves
            groups = self.gateway.run_groups(tasks, cfg.train.group_size, policy_version=self.step)
            log.info("gateway rollout: %s", summarize_gateway(groups))
        else:
            groups = self.engine.run_groups(
                self.env_factory,
                tasks[mine.start : mine.stop],
                cfg.train.group_size,
                policy_version=self.step,
                first_episode=mine.start * cfg.train.group_size,
            )
            self.reward.score_groups(groups)
        self._mine.update(t.id for g in groups for t in g.trajectories)
        groups = distributed.gather_groups(groups, self.dist)  # every rank: all groups, task order
        self._episode_rules(groups)
        self.parts.estimator(groups)
        self.stream.observe(groups)  # a curriculum's pass rates
        return groups

    def _difficulty(self, step: int) -> None:
        """``curriculum.difficulty``: from a stage's step on, episodes and training tasks come from
        the environment rebuilt with that stage's kwargs (held-out evaluation keeps ``env``)."""
        stage = self.cfg.curriculum.stage_at(step)
        if stage < 0 or stage == self._stage:
            return
        env = self.cfg.env.model_copy(
            update={"kwargs": {**self.cfg.env.kwargs, **self.cfg.curriculum.difficulty[stage].env_kwargs}}
        )
        self.parts.env_factory = env_factory_of(env)
        self.stream.set_tasks(self.parts.env_factory().tasks("train"), stage)
        self._stage = stage
        log.info("step %d: difficulty stage %d, env kwargs %s", step, stage, env.kwargs)

    def _episode_rules(self, groups: list[TrajectoryGroup]) -> None:
        """Termination-aware exclusion and DAPO's overlong penalty, before the advantages."""
        a = self.cfg.algorithm
        exclude_terminations(groups, a.exclude_terminations)
        if a.overlong.buffer_len:
            apply_overlong_penalty(
                groups,
                max_tokens=self.cfg.action_token_budget,
                buffer_len=a.overlong.buffer_len,
                factor=a.overlong.penalty_factor,
            )

    def _trainable(self, traj: Trajectory) -> bool:
        """Excluded episodes, and truncated ones under overlong filtering, never reach the loss."""
        if traj.excluded is not None:
            return False
        return not (
            self.cfg.algorithm.overlong.mask_truncated and is_truncated(traj, self.cfg.action_token_budget)
        )

    def _drop(self, group: TrajectoryGroup) -> bool:
        """Whether ``group`` is left out of the update: equal rewards give it no signal."""
        # A critic gives equal-reward groups a signal (its values differ), so PPO keeps them.
        return (
            self.critic is None
            and self.cfg.train.drop_zero_variance_groups
            and is_zero_variance(group, turn_discount=self.cfg.algorithm.turn_discount)
        )

    def update(self, trajs: Sequence[Trajectory]) -> dict[str, float]:
        """Policy updates on one rollout batch: ``epochs_per_batch`` passes, each split into
        ``minibatches_per_batch`` optimizer steps over whole trajectories."""
        cfg = self.cfg
        trajs = [t for t in trajs if self._trainable(t)]
        if not trajs:
            return {"optimizer_steps": 0.0}
        batch_rows = build_rows(trajs, pack=cfg.train.pack_rows)
        # torchrun: every rank holds the whole batch and trains its own rows; the weights are the
        # whole batch's, so the ranks' gradients sum to a 1-rank run's (flowgrpo.training.distributed)
        rows = [r for r in batch_rows if r.traj_id in self._mine] if self.dist.enabled else batch_rows
        critic_m = {}
        if self.critic is not None:  # PPO: per-token GAE advantages replace the estimator's
            critic_m = self.critic.prepare(
                rows, trajs, micro_batch_tokens=cfg.train.micro_batch_tokens, pad_id=self.parts.pad_id
            )
        ref = None
        if self.ref_model is not None:
            with reference_mode(self.ref_model) as ref_model:
                ref = self._precompute(ref_model, rows)
        # TIS takes the trainer's logprobs as the old policy: with one optimizer step per batch those
        # are the first pass's own (detached), so only several steps need a pass before the first
        several = cfg.train.epochs_per_batch > 1 or cfg.train.minibatches_per_batch > 1
        old = self._precompute(self.model, rows) if self.parts.tis != "off" and several else None
        keep = self._high_entropy_tokens(rows) if cfg.algorithm.entropy_top_q is not None else None
        by_seq: dict[int, list[Row]] = {}
        for r in batch_rows:
            by_seq.setdefault(r.seq_index, []).append(r)
        seqs = list(by_seq)
        agg: dict[str, float] = {}
        first: dict[str, float] = {}
        steps = 0
        gen = torch.Generator().manual_seed(cfg.train.seed * 7919 + self.step)
        for _ in range(cfg.train.epochs_per_batch):
            perm = [seqs[i] for i in torch.randperm(len(seqs), generator=gen).tolist()]
            n_mb = min(cfg.train.minibatches_per_batch, len(perm))
            for k in range(n_mb):
                part = perm[k * len(perm) // n_mb : (k + 1) * len(perm) // n_mb]
                mb_rows = [r for s in part for r in by_seq[s]]
                m = self._optimizer_step(
                    [r for r in mb_rows if r.traj_id in self._mine] if self.dist.enabled else mb_rows,
                    ref,
                    old,
                    keep=keep,
                    weights_over=mb_rows if self.dist.enabled else None,
                    measure_sampler=steps == 0,
                )
                if steps == 0:  # the first minibatch only: later ones see an updated policy
                    first = {k: m.pop(k) for k in list(m) if k.startswith("sampler_ratio_")}
                steps += 1
                for key, v in m.items():
                    agg[key] = agg.get(key, 0.0) + v
        if self.sharded is not None:  # rollout, evaluation and checkpoints read the full model
            self.sharded.copy_to(self.model)
        out = {k: v / steps for k, v in agg.items()}
        out.update(first)
        out["train_tokens"] = agg.get("train_tokens", 0.0)
        out["optimizer_steps"] = float(steps)
        if self.scaler.enabled:
            out["loss_scale"] = self.scaler.scale_value  # after this step's updates
        if self.critic is not None:
            self.critic.end_batch()
        out.update(critic_m)
        return out

    def _optimizer_step(
        self,
        rows: list[Row],
        ref: dict[int, torch.Tensor] | None,
        old: dict[int, torch.Tensor] | None,
        *,
        keep: dict[int, torch.Tensor] | None = None,
        weights_over: list[Row] | None = None,
        measure_sampler: bool = False,
    ) -> dict[str, float]:
        """One optimizer step over ``rows``; ``measure_sampler`` adds ``sampler_ratio_mean/min/max``
        (this rank's action tokens), meaningful before the batch's first update."""
        cfg, a = self.cfg, self.cfg.algorithm
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.zero_grad()
        mb_action_tokens = float(sum(r.num_action_tokens for r in rows))
        sums: dict[str, float] = {}
        tokens = 0.0
        finite = loss_finite = True
        mbs = list(
            micro_batches(
                rows,
                cfg.train.micro_batch_tokens,
                agg=a.agg,
                norm_len=a.norm_len,
                pad_id=self.parts.pad_id,
                weights_over=weights_over,
                device=self.device,
            )
        )
        # fsdp2: every rank runs as many forward/backward passes as the busiest one (the same
        # collectives in the same order)
        idle = (
            distributed.max_over_ranks(len(mbs), self.dist, device=self.device) - len(mbs)
            if self.sharded is not None
            else 0
        )
        ratio_parts: list[dict[str, float]] = []
        for mb in mbs:
            lp, ent = self._policy_logprobs(mb, with_entropy=True, entropy_grad=a.entropy_coef > 0)
            if measure_sampler:
                ratio_parts.append(sampler_ratio_stats(lp, mb.old_logprobs, mb.loss_mask))
            old_lp, is_w = mb.old_logprobs, None
            if self.parts.tis != "off":  # the trainer's old policy; correct the sampler gap with TIS
                old_lp = self._gather(old, mb) if old is not None else lp.detach()
                is_w = truncated_is_weights(
                    old_lp,
                    mb.old_logprobs,
                    mb.loss_mask,
                    cap=a.tis_cap,
                    mode=self.parts.tis,
                    seq_index=mb.seq_index,
                )
            loss, m = policy_loss(
                lp,
                old_lp,
                mb.advantages,
                mb.loss_mask,
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                dual_clip=a.dual_clip,
                ref_logprobs=self._gather(ref, mb) if ref is not None else None,
                kl_coef=a.kl_coef,
                kl_estimator=a.kl_estimator,
                token_weights=mb.token_weights,
                is_weights=is_w,
                loss=a.loss,
                seq_index=mb.seq_index,
                turn_index=mb.turn_index,
                entropy=ent,
                entropy_coef=a.entropy_coef,
                pg_mask=self._gather(keep, mb) if keep is not None else None,
            )
            if self.critic is not None:  # PPO: + vf_coef * clipped value loss
                v_loss, vm = self.critic.loss(mb, mb_action_tokens)
                loss = loss + a.ppo.vf_coef * v_loss
                m.update({f"ppo/{k}": v for k, v in vm.items() if k != "tokens"})
            if not torch.isfinite(loss):
                finite = loss_finite = False
                if self.sharded is None:
                    break
            scaled = self.scaler.scale(loss)  # float16: lifts small gradients out of fp16 underflow
            # fsdp2: FSDP2 averages gradients over ranks, and the ranks' shares must add up
            (scaled * self.sharded.loss_scale if self.sharded is not None else scaled).backward()
            if not finite:  # fsdp2: the passes still ran, so the ranks stay in step; the step is skipped
                continue
            n = m["tokens"]
            tokens += n
            sums["loss"] = sums.get("loss", 0.0) + loss.item()
            for k, v in m.items():
                if k != "tokens":
                    sums[k] = sums.get(k, 0.0) + v * n
            sums["entropy"] = sums.get("entropy", 0.0) + float((ent.detach() * mb.loss_mask).sum())
        replayed: dict[str, float] = {}
        if self.replay is not None and finite:  # + replay_coef * the demonstrations' NLL (PPO-ptx)
            replayed = self.replay.backward(
                lambda mb: self._policy_logprobs(mb)[0],
                token_budget=cfg.train.micro_batch_tokens,
                pad_id=self.parts.pad_id,
                device=self.device,
                scale=self.scaler.scale,
            )
        for _ in range(idle):
            self.sharded.idle_pass(self.parts.pad_id)
        if self.sharded is not None:
            params = self.sharded.parameters()
        else:
            params = [p for p in self.model.parameters() if p.requires_grad]
        if self.dist.enabled:  # sum gradients (fsdp2: reduced into the shards) and metrics; skip together
            if self.sharded is None:
                finite = distributed.all_reduce_gradients(params, finite, self.dist)
            else:
                finite = distributed.all_finite(finite, self.dist, device=self.device)
            sums = distributed.sum_over_ranks({**sums, "\0tokens": tokens}, self.dist)
            tokens = sums.pop("\0tokens")
        grad_norm = float("nan")
        if finite:
            self.scaler.unscale_([*params, *(self.critic.params if self.critic is not None else [])])
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip or float("inf")))
            finite = math.isfinite(grad_norm)
        scale = self.scaler.scale_value
        self.scaler.update(found_inf=not finite)
        if not finite:
            self.counters["nan_skipped_steps"] += 1
            if self.scaler.enabled and loss_finite:  # expected now and then: the scale adapts
                log.info(
                    "step %d: fp16 gradient overflow at loss scale %g; skipping this optimizer step, scale -> %g",
                    self.step,
                    scale,
                    self.scaler.scale_value,
                )
            else:
                log.warning("step %d: non-finite loss or gradient; skipping this optimizer step", self.step)
            self.optimizer.zero_grad(set_to_none=True)
            if self.critic is not None:
                self.critic.zero_grad()
            return {"skipped": 1.0}
        self.optimizer.step()
        out = {k: (v / tokens if tokens and k != "loss" else v) for k, v in sums.items()}
        out.update(self._sampler_ratio(ratio_parts), **replayed)
        if self.critic is not None:
            out["ppo/value_grad_norm"] = self.critic.step(cfg.train.grad_clip)
        out.update(grad_norm=grad_norm, train_tokens=tokens, skipped=0.0)
        return out

    # ------------------------------------------------------------------ helpers of the update
    def _sampler_ratio(self, parts: list[dict[str, float]]) -> dict[str, float]:
        """The micro-batches' :func:`~flowgrpo.algorithms.loss.sampler_ratio_stats` merged into step metrics;
        warns once when the sampler is trusted as the old policy (``tis`` off) but disagrees."""
        parts = [p for p in parts if p["tokens"]]
        if not parts:
            return {}
        n = sum(p["tokens"] for p in parts)
        out = {
            "sampler_ratio_mean": sum(p["mean"] * p["tokens"] for p in parts) / n,
            "sampler_ratio_min": min(p["min"] for p in parts),
            "sampler_ratio_max": max(p["max"] for p in parts),
        }
        off = max(out["sampler_ratio_max"] - 1.0, 1.0 - out["sampler_ratio_min"])
        if self.parts.tis == "off" and off > SAMPLER_RATIO_TOLERANCE and not self._warned_ratio:
            self._warned_ratio = True
            log.warning(
                "step %d: the sampler's logprobs differ from the trainer's before any update (ratio %.4f-%.4f, "
                "tolerance 1 +- %g) and algorithm.tis is off, so the loss treats the gap as policy change: "
                "set algorithm.tis=token (or auto)",
                self.step,
                out["sampler_ratio_min"],
                out["sampler_ratio_max"],
                SAMPLER_RATIO_TOLERANCE,
            )
        return out

    def _policy_logprobs(self, mb: MicroBatch, *, with_entropy: bool = False, entropy_grad: bool = False):
        """Logprobs of the trained policy (its FSDP2 shards under fsdp2), with the graph."""
        if self.sharded is None:
            return self._logprobs(self.model, mb, with_entropy=with_entropy, entropy_grad=entropy_grad)
        return self.sharded.logprobs(
            mb.input_ids, mb.attention_mask, mb.loss_mask, **self._logprob_options(with_entropy, entropy_grad)
        )

    def _logprob_options(self, with_entropy: bool, entropy_grad: bool) -> dict[str, Any]:
        return {
            "temperature": self.cfg.rollout.logprob_temperature,
            "autocast_dtype": self.parts.autocast,
            "chunk_size": self.cfg.train.logprob_chunk,
            "with_entropy": with_entropy,
            "entropy_grad": entropy_grad,
        }

    def _logprobs(
        self, model: Any, mb: MicroBatch, *, with_entropy: bool = False, entropy_grad: bool = False
    ):
        return action_logprobs(
            model,
            mb.input_ids,
            mb.attention_mask,
            mb.loss_mask,
            **self._logprob_options(with_entropy, entropy_grad),
        )

    @torch.no_grad()
    def _high_entropy_tokens(self, rows: list[Row]) -> dict[int, torch.Tensor]:
        """Per-row 0/1 masks ``(len(row),)`` of the action tokens whose entropy under the policy
        before this update is in the top ``algorithm.entropy_top_q`` of the whole batch (fixed
        before the first micro-batch, so micro-batch sums stay exact)."""
        ents: dict[int, torch.Tensor] = {}
        for mb in micro_batches(
            rows, self.cfg.train.micro_batch_tokens, pad_id=self.parts.pad_id, device=self.device
        ):
            _, ent = self._logprobs(self.model, mb, with_entropy=True)
            for i, r in enumerate(mb.rows):
                ents[id(r)] = ent[i, : len(r)].clone()  # (len(r),)
        on = torch.cat(
            [ents[id(r)][torch.tensor(r.loss_mask, dtype=torch.bool, device=self.device)] for r in rows]
        )  # (N,)
        threshold = entropy_top_q_threshold(on, float(self.cfg.algorithm.entropy_top_q or 1.0))
        return {k: (e >= threshold).float() for k, e in ents.items()}

    @torch.no_grad()
    def _precompute(self, model: Any, rows: list[Row]) -> dict[int, torch.Tensor]:
        """Per-row logprobs under ``model`` (no graph), keyed by ``id(row)``."""
        out: dict[int, torch.Tensor] = {}
        for mb in micro_batches(
            rows, self.cfg.train.micro_batch_tokens, pad_id=self.parts.pad_id, device=self.device
        ):
            lp, _ = self._logprobs(model, mb)
            for i, r in enumerate(mb.rows):
                out[id(r)] = lp[i, : len(r)].clone()
        return out

    @staticmethod
    def _gather(cache: dict[int, torch.Tensor], mb: MicroBatch) -> torch.Tensor:
        t = torch.zeros_like(mb.old_logprobs)  # (B, T)
        for i, r in enumerate(mb.rows):
            t[i, : len(r)] = cache[id(r)]
        return t

    def _reseed(self, step: int) -> None:
        # torchrun: ranks sampling without a rollout seed draw from distinct streams (rank 0's is
        # a 1-rank run's)
        seed_everything(self.cfg.train.seed * 1_000_003 + step + 1_000_000_007 * self.dist.rank)

    def _save_trajectories(self, groups: list[TrajectoryGroup]) -> None:
        from flowgrpo.runs.store import TrajectoryWriter

        with TrajectoryWriter(self.out / "trajectories" / f"step_{self.step:06d}.jsonl") as w:
            w.write_groups(groups)

    # ------------------------------------------------------------------ checkpoints and signals
    def save(self) -> Path | None:
        """Checkpoint this step. Under torchrun every rank calls it: rank 0 writes (the others
        return None; under fsdp2 they first help gather the whole optimizer state), and no rank
        returns before the checkpoint is complete."""
        sharded_state = self.sharded.optimizer_state(self.optimizer) if self.sharded is not None else None
        path = self._write_checkpoint(sharded_state) if self.dist.is_main else None
        distributed.barrier(self.dist)  # no rank goes on (e.g. to resume from it) before it is on disk
        return path

    def _write_checkpoint(self, sharded_state: dict[str, Any] | None) -> Path:
        # the rollout thread may have drawn ahead: save the position of the last batch trained on
        stream = self._stream_state if self.producer is not None and self._stream_state else None
        extra = {
            "stream": stream or self.stream.state_dict(),
            "counters": dict(self.counters),
            # fsdp2 gathers the optimizer state keyed by parameter name, torch's own keys are indices
            "optimizer_keys": "name" if self.sharded is not None else "index",
        }
        if self.critic is not None:
            extra["critic"] = self.critic.state_dict()
        if self.scaler.enabled:
            extra["loss_scale"] = self.scaler.state_dict()
        return save_checkpoint(
            self.ckpt_root,
            self.step,
            model=self.model,
            optimizer_state=sharded_state if sharded_state is not None else self.optimizer.state_dict(),
            scheduler=self.scheduler,
            extra=extra,
            keep_last=self.cfg.run.keep_last,
            reference=self._reference_pointer(),
        )

    def _reference_pointer(self) -> ReferencePointer | None:
        """The initial model (rebuilt from the config on resume) or, after a warm start, the
        warm-started weights written once beside the checkpoints."""
        if self.ref_model is None:
            return None
        if not self.counters["sft_done"] or self.ref_model is self.model:  # LoRA: the base, adapters off
            return ReferencePointer(kind="initial", model=self.cfg.model.name)
        if not (self.ckpt_root / REFERENCE_FILE).is_file():
            return write_reference(self.ckpt_root, self.ref_model)
        return ReferencePointer(kind="file", path=REFERENCE_FILE.as_posix())

    def resume(self, path: str | Path | None = None) -> bool:
        """Load ``path`` (default: the latest checkpoint of this run); False when there is none
        (:func:`flowgrpo.training.resume.choose_checkpoint` says what happens to a run whose checkpoints
        vanished or are unreadable)."""
        data = choose_checkpoint(self.out, path, self.cfg.run)
        if data is None:
            return False
        load_policy_state(self.model, data.policy, source=data.path)
        keys = data.state["extra"].get("optimizer_keys", "index")
        if data.optimizer is not None and keys != ("name" if self.sharded is not None else "index"):
            written = "with" if keys == "name" else "without"
            raise ValueError(
                f"{data.path}: its optimizer state was written {written} train.parallel=fsdp2 under "
                f"torchrun; resume it the same way ({written} fsdp2)"
            )
        if self.sharded is not None:
            self.sharded.load_from(self.model)
            if data.optimizer is not None:
                self.sharded.load_optimizer_state(self.optimizer, data.optimizer)
        elif data.optimizer is not None:
            self.optimizer.load_state_dict(data.optimizer)
        if data.state.get("scheduler") is not None:
            self.scheduler.load_state_dict(data.state["scheduler"])
        set_rng_state(data.state["rng"])
        self.step = data.step
        self.stream.load_state_dict(data.state["extra"]["stream"])
        self.counters.update(data.state["extra"].get("counters", {}))
        if self.critic is not None and "critic" in data.state["extra"]:
            self.critic.load_state_dict(data.state["extra"]["critic"])
        if "loss_scale" in data.state["extra"]:
            self.scaler.load_state_dict(data.state["extra"]["loss_scale"])
        if self.ref_model is not None:
            if "ref_model" in data.state["extra"]:  # the one-file format copied the reference
                self.ref_model.load_state_dict(data.state["extra"]["ref_model"])
            elif data.reference is not None:
                load_reference(self.ckpt_root, data.reference, self.ref_model)
        self.parts.backend.sync_weights(self.model, version=self.step)
        log.info("resumed from %s at step %d", data.path, self.step)
        if self.dist.is_main:
            rewound = rewind_records(self.out, self.step)  # the steps that re-run are recorded once
            (log.warning if rewound.moved else log.info)("%s", rewound.describe(self.step))
        return True

    @property
    def stop_signal(self) -> int | None:
        """The signal that asked this trainer to stop, if one did."""
        return self._stop_signal

    @contextmanager
    def stop_on_signals(self):
        """SIGINT/SIGTERM set a flag; the loop checkpoints after the current step and returns.
        The flag is also :func:`flowgrpo.utils.interrupt.request_stop`, which the ``hf`` backend's decode
        thread checks before every forward pass: a signal during a rollout stops it within one
        decode step and the step is discarded; during an update the current step's optimizer steps
        finish (``epochs_per_batch * minibatches_per_batch``, one by default). A second signal exits
        at once (status 128 + signal number) without a checkpoint or a traceback.

        The main job holds its final evaluation in a block of its own: a first signal there cuts
        the evaluation short (:class:`~flowgrpo.utils.interrupt.Interrupted`) instead of killing the
        process, and after a stop during training the next signal exits at once."""

        def exit_now(signum, frame):
            os.write(2, f"flowgrpo: second signal {signum}: exiting without a checkpoint\n".encode())
            os._exit(128 + signum)

        def handler(signum, frame):
            if self._stop_signal is not None:  # the second signal: leave now, without a trace
                exit_now(signum, frame)
            self._stop_signal = signum
            interrupt.request_stop()

        old = {}
        try:
            for s in (signal.SIGINT, signal.SIGTERM):
                old[s] = signal.signal(s, handler)
        except ValueError:  # not the main thread: no handlers
            pass
        interrupt.clear()
        try:
            yield
        finally:
            interrupt.clear()
            for s, h in old.items():
                # After a stop, a second signal while the caller winds down (report, exit) still
                # exits at once and says so; a handler of the caller's own is put back as it was.
                stopping = self._stop_signal is not None and h in (signal.SIG_DFL, signal.default_int_handler)
                signal.signal(s, exit_now if stopping else h)

    # ------------------------------------------------------------------ evaluation and warm start
    def evaluate(
        self,
        split: Split = "test",
        n: int | None = None,
        *,
        greedy: bool = True,
        samples: int = 1,
        label: str = "eval",
        record: bool = False,
    ) -> EvalResult:
        """:func:`flowgrpo.runs.evaluation.evaluate` of the current policy at this step; ``record`` adds
        it to the run directory (``RUN/eval.jsonl`` and ``RUN/eval/LABEL.jsonl``). A stop requested
        by a signal while it ran cuts its episodes short: then it raises
        :class:`~flowgrpo.utils.interrupt.Interrupted` and records nothing."""
        result, groups = evaluate(
            self.parts,
            split,
            n,
            greedy=greedy,
            samples=samples,
            label=label,
            step=self.step,
            progress=self.cfg.run.progress,
        )
        release_free_heap()  # the evaluation's caches, before training allocates again
        interrupt.check()
        if record:
            record_evaluation(self.out, result, groups)
        return result

    def warm_start(self) -> list[dict[str, float]]:
        """The ``sft`` section (:func:`flowgrpo.training.sft.warm_start`); the reference becomes the
        warm-started policy, so the KL term anchors RL to it rather than to the raw model."""
        from flowgrpo.training.sft import warm_start

        hist = warm_start(self.parts)
        if self.ref_model is not None and self.ref_model is not self.model:
            self.ref_model.load_state_dict(self.model.state_dict())
            if self.dist.is_main:
                write_reference(self.ckpt_root, self.ref_model)  # once; checkpoints point to it
        self.parts.backend.sync_weights(self.model)
        self.counters["sft_done"] = 1
        for i, h in enumerate(hist):
            if self.metrics is not None:
                self.metrics.log(0, {f"sft/{k}": v for k, v in h.items()} | {"sft/epoch": i})
        return hist


def train(config: TrainConfig) -> dict[str, Any]:
    """Build a :class:`Trainer` from ``config`` and run it."""
    trainer = Trainer(config)
    try:
        return trainer.train()
    finally:
        trainer.close()


def train_from_args(config_path: str | None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The ``flowgrpo train CONFIG [--set key=value ...]`` command: load, report errors, run."""
    from flowgrpo.config import load_config

    return train(load_config(config_path, list(overrides)))


__all__ = ["TaskStream", "Trainer", "frozen_reference", "lr_lambda", "train", "train_from_args"]
