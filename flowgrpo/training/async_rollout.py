"""Rollout and update overlapped, with a staleness bound (``train.async_staleness: k``).

Why: in the synchronous loop the update waits for the rollout and the rollout for the update. With
``k >= 1`` a rollout thread samples the batches of steps ``t+1 .. t+k`` while step ``t`` updates
(the one-step-off-policy pipeline of AReaL, Fu et al. 2025, and of verl/SkyRL's async trainers).
The price is off-policy data: a batch of step ``s`` may come from policy version ``s - k``. The loss
corrects for it with the recorded sampler logprobs: ``algorithm.tis`` recomputes the "old" logprobs
under the current policy and weights each token by ``min(pi_old / pi_sampler, cap)`` (truncated
importance sampling, :func:`flowgrpo.algorithms.loss.truncated_is_weights`), so the config refuses
``async_staleness > 0`` with ``tis: off``.

- :class:`ReplicaBackend`: the rollout thread's own copy of the policy (the ``hf`` backend shares
  the trainer's module, which the update changes in place mid-rollout). The trainer pushes weights
  after each update (:meth:`ReplicaBackend.sync_weights`, a snapshot of the trainable tensors); the
  rollout thread adopts the newest snapshot when it starts a batch, and every result carries the
  version that sampled it (as a served policy reports it), so ``Trajectory.policy_version`` is exact.
  A served policy (``rollout.backend: openai`` with weight sync) needs no replica: the server holds
  its own copy and reports versions itself.
- :class:`AsyncRollout`: the rollout thread. It produces the batch of step ``s`` only once
  ``s <= (updates done) + k``, so no batch is sampled more than ``k`` versions behind the step that
  trains on it; the trainer drops any trajectory older than that (possible only with a server that
  lags, counted in ``async/stale_dropped``).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from flowgrpo.rollout.backends.base import BackendBase, GenerationResult, RolloutBackend, SamplingParams
from flowgrpo.types import TrajectoryGroup


class ReplicaBackend(BackendBase):
    """A rollout backend over a private copy of the policy, fed with weight snapshots.

    ``make_backend(module)`` builds the inner backend (the ``hf`` one) over the copy.
    """

    def __init__(self, model: torch.nn.Module, make_backend: Callable[[Any], RolloutBackend]) -> None:
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.inner = make_backend(self.model)
        self.max_batch_size = self.inner.max_batch_size
        self.continuous_batching = self.inner.continuous_batching
        self.version = 0
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None
        self._lock = threading.Lock()
        self._trainable = [n for n, p in model.named_parameters() if p.requires_grad]

    def sync_weights(self, model: Any, *, version: int | None = None) -> None:
        """Snapshot ``model``'s trainable tensors (the only ones an update changes); the rollout
        thread adopts them at its next :meth:`refresh`. Called by the trainer's thread."""
        params = dict(model.named_parameters())
        snap = {n: params[n].detach().clone() for n in self._trainable}
        with self._lock:
            self._pending = (snap, self.version + 1 if version is None else version)

    def refresh(self) -> int:
        """Adopt the newest snapshot (rollout thread, between batches); returns the version now held."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            snap, version = pending
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for n, t in snap.items():
                    params[n].copy_(t)
            self.inner.sync_weights(self.model, version=version)  # drops cached prefixes
            self.version = version
        return self.version

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        results = await self.inner.generate(prompts, params, max_new_tokens=max_new_tokens)
        return [r.model_copy(update={"policy_version": self.version}) for r in results]

    def clear_prefix_cache(self) -> None:
        self.inner.clear_prefix_cache()


@dataclass
class RolloutBatch:
    """What the rollout thread hands the trainer for one step."""

    step: int
    groups: list[TrajectoryGroup]
    train_groups: list[TrajectoryGroup]
    rounds: int
    stream_state: dict[str, int]
    """The task stream's position after this batch drew its tasks (what a checkpoint saves)."""
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


class AsyncRollout:
    """The rollout thread: ``collect(step)`` for ``first_step, first_step + 1, ...`` up to
    ``last_step``, each started only when ``step <= updates_done + staleness``.

    The trainer calls :meth:`take` for the batch of its current step and :meth:`updated` after each
    step; :meth:`close` stops the thread (an error in it is raised again by :meth:`take`).
    """

    def __init__(
        self,
        collect: Callable[[int], RolloutBatch],
        *,
        staleness: int,
        first_step: int,
        last_step: int,
        before_batch: Callable[[], Any] | None = None,
    ) -> None:
        if staleness < 1:
            raise ValueError("AsyncRollout needs staleness >= 1 (0 is the synchronous loop)")
        self.collect = collect
        self.staleness = staleness
        self.before_batch = before_batch
        self.last_step = last_step
        self._done = first_step
        self._next = first_step
        self._ready: dict[int, RolloutBatch] = {}
        self._error: BaseException | None = None
        self._stop = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="flowgrpo-rollout", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stop or self._next <= self._done + self.staleness)
                if self._stop or self._next >= self.last_step:
                    return
                step = self._next
            try:
                if self.before_batch is not None:
                    self.before_batch()
                batch = self.collect(step)
            except BaseException as e:  # handed to the trainer's thread by take()
                with self._cv:
                    self._error = e
                    self._cv.notify_all()
                return
            with self._cv:
                self._ready[step] = batch
                self._next = step + 1
                self._cv.notify_all()

    def take(self, step: int) -> RolloutBatch:
        """The batch of ``step`` (waits for it)."""
        with self._cv:
            self._cv.wait_for(lambda: step in self._ready or self._error is not None)
            if step in self._ready:
                return self._ready.pop(step)
            assert self._error is not None
            raise RuntimeError(
                f"the rollout thread failed: {type(self._error).__name__}: {self._error}"
            ) from (self._error)

    def updated(self, steps_done: int) -> None:
        """The trainer finished ``steps_done`` steps: batches up to ``steps_done + staleness`` may start."""
        with self._cv:
            self._done = steps_done
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join()


def staleness_stats(groups: Sequence[TrajectoryGroup], step: int, staleness: int) -> dict[str, float]:
    """Exclude every trajectory sampled more than ``staleness`` versions before ``step`` from the
    update (``Trajectory.excluded = "stale: ..."``, after its group's advantages were computed);
    return the batch's mean and largest age in versions and how many were dropped."""
    ages, dropped = [], 0
    for g in groups:
        for t in g.trajectories:
            age = step - t.policy_version
            ages.append(age)
            if age > staleness and t.excluded is None:
                t.excluded = f"stale: sampled by policy version {t.policy_version}, {age} behind step {step}"
                dropped += 1
    return {
        "async/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
        "async/staleness_max": float(max(ages, default=0)),
        "async/stale_dropped": float(dropped),
    }


def rollout_replica(cfg: Any, parts: Any) -> ReplicaBackend | None:
    """The rollout thread's copy of the policy when the backend samples the trainer's own module
    (``hf``); None when it samples elsewhere (a server or vLLM engine that receives weights)."""
    if cfg.rollout.backend != "hf":
        return None
    from flowgrpo.components import make_backend

    return ReplicaBackend(
        parts.model, lambda m: make_backend(cfg, m, parts.tokenizer, parts.autocast, parts.rollout_dtype)
    )


__all__ = ["AsyncRollout", "ReplicaBackend", "RolloutBatch", "rollout_replica", "staleness_stats"]
