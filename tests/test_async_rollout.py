"""train.async_staleness: the rollout thread samples ahead within the bound, the replica reports
the version that sampled each trajectory, stale ones are dropped, 0 is the synchronous loop."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from flowgrpo.config import ConfigError, load_config
from flowgrpo.modeling.models import tiny_model
from flowgrpo.rollout.backends.base import SamplingParams
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.runs.rundir import RunDir
from flowgrpo.training.async_rollout import AsyncRollout, ReplicaBackend, RolloutBatch, staleness_stats
from flowgrpo.types import Task, Trajectory, TrajectoryGroup
from tests.toy import EXACT, make_trainer, params

pytestmark = pytest.mark.usefixtures("one_thread")


def test_async_needs_the_importance_sampling_correction():
    with pytest.raises(ConfigError, match=r"algorithm\.tis=token"):
        load_config(None, ["train.async_staleness=1", "algorithm.tis=off"])
    assert load_config(None, ["train.async_staleness=1"]).algorithm.tis == "auto"  # resolves to token
    assert load_config(None, ["train.async_staleness=2", "algorithm.tis=token"]).train.async_staleness == 2
    assert load_config(None, []).train.async_staleness == 0


def test_the_rollout_thread_stays_within_the_staleness_bound():
    started: list[tuple[int, int]] = []  # (step, updates done when its rollout started)
    done = [0]
    three_started = threading.Event()

    def collect(step: int) -> RolloutBatch:
        started.append((step, done[0]))
        if len(started) == 3:
            three_started.set()
        return RolloutBatch(step, [], [], 0, {"epoch": 0, "pos": step}, 0.0)

    producer = AsyncRollout(collect, staleness=2, first_step=0, last_step=6)
    assert three_started.wait(10)
    for step in range(6):
        assert producer.take(step).step == step
        done[0] = step + 1
        producer.updated(step + 1)
    producer.close()
    assert [s for s, _ in started] == list(range(6))
    assert all(step <= done + 2 for step, done in started)
    assert started[:3] == [(0, 0), (1, 0), (2, 0)]  # two steps ahead before the first update ends


def test_an_error_in_the_rollout_thread_reaches_the_trainer():
    def collect(step: int) -> RolloutBatch:
        raise ValueError("env exploded")

    producer = AsyncRollout(collect, staleness=1, first_step=0, last_step=3)
    with pytest.raises(RuntimeError, match="env exploded"):
        producer.take(0)
    producer.close()


def test_replica_adopts_pushed_weights_only_between_batches_and_reports_their_version():
    model, tok = tiny_model(seed=0)
    replica = ReplicaBackend(model, lambda m: HFBackend(m, tok))
    assert replica.model is not model
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)  # an update
    replica.sync_weights(model, version=3)
    assert not torch.equal(replica.model.model.norm.weight, model.model.norm.weight)  # not yet
    params = SamplingParams(max_new_tokens=2, seed=0)
    assert asyncio.run(replica.generate([[5, 6, 7]], params))[0].policy_version == 0
    assert replica.refresh() == 3
    assert torch.equal(replica.model.model.norm.weight, model.model.norm.weight)
    assert asyncio.run(replica.generate([[5, 6, 7]], params))[0].policy_version == 3


def test_trajectories_older_than_the_bound_are_dropped():
    trajs = [Trajectory(policy_version=v) for v in (5, 4, 2)]
    g = TrajectoryGroup(task=Task(id="t", prompt="p"), trajectories=trajs)
    m = staleness_stats([g], step=5, staleness=2)
    assert [t.excluded is None for t in trajs] == [True, True, False]
    assert "3 behind step 5" in trajs[2].excluded
    assert m == {
        "async/staleness_mean": (0 + 1 + 3) / 3,
        "async/staleness_max": 3.0,
        "async/stale_dropped": 1.0,
    }


def test_async_training_samples_one_version_behind_and_saves_the_consumed_position(tmp_path):
    common = ("train.steps=4", "run.save_every=2", "algorithm.tis=token")
    tr = make_trainer(tmp_path, *common, "train.async_staleness=1", name="async")
    out = tr.train()
    assert out["status"] == "finished" and tr.step == 4 and tr.producer is None
    rd = RunDir(tmp_path / "async")
    for step in range(4):  # the batch of step s was sampled by version s - 1 or s
        versions = {t.policy_version for t in rd.trajectories(step + 1)}
        assert versions <= {max(step - 1, 0), step}, (step, versions)
    rows = [m.values for m in rd.metrics() if "async/staleness_max" in m.values]
    assert len(rows) == 4 and all(
        r["async/staleness_max"] <= 1 and r["async/stale_dropped"] == 0 for r in rows
    )
    # the checkpoint's task position is that of the batches trained on (4 x 4 tasks), as a sync run's
    sync = make_trainer(tmp_path, *common, name="sync")
    sync.train()
    assert tr.stream.state_dict() == sync.stream.state_dict()
    resumed = make_trainer(
        tmp_path, *common, "train.steps=5", "train.async_staleness=1", "run.resume=true", name="async"
    )
    assert resumed.step == 4 and resumed.stream.state_dict() == sync.stream.state_dict()
    resumed.train()  # the rollout thread's replica starts from the resumed weights
    assert {t.policy_version for t in rd.trajectories(5)} == {4}
    assert resumed.replica is not None and resumed.replica.version == 4


def test_async_staleness_zero_is_the_synchronous_loop(tmp_path):
    common = (EXACT, "train.steps=2", "run.save_every=0")
    default = make_trainer(tmp_path, *common, name="default")
    default.train()
    zero = make_trainer(tmp_path, *common, "train.async_staleness=0", name="zero")
    assert zero.replica is None and zero.engine.backend is zero.parts.backend
    zero.train()
    assert zero.producer is None
    a, b = params(default.model), params(zero.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
