"""End to end: a tiny model learns a trivially learnable toy environment; kill-and-resume is exact."""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch

from flowgrpo.config import TrainConfig, load_config
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.runs.rundir import RunDir
from flowgrpo.runs.store import read_trajectories
from flowgrpo.training.sft import demonstrations, supervised_epochs
from tests.toy import EXACT, make_trainer, params

pytestmark = pytest.mark.usefixtures("one_thread")


def test_reward_rises_on_the_toy_environment(tmp_path):
    tr = make_trainer(tmp_path, "train.steps=12", "run.save_every=0")
    out = tr.train()
    assert out["status"] == "finished" and tr.step == 12
    rows = [m.values for m in RunDir(tmp_path / "run").metrics() if "reward_mean" in m.values]
    first = sum(r["reward_mean"] for r in rows[:3]) / 3
    last = sum(r["reward_mean"] for r in rows[-3:]) / 3
    assert last > first + 0.25, (first, last)
    assert all("kl" in r and "clip_frac" in r and "entropy" in r for r in rows if r.get("optimizer_steps"))
    # trajectories saved per step, with advantages
    trajs = read_trajectories(tmp_path / "run" / "trajectories" / "step_000001.jsonl")
    assert len(trajs) == 24 and all(t.turns[0].advantage is not None for t in trajs)
    ev = tr.evaluate(n=4)
    assert ev.n == 4 and 0.0 <= ev.accuracy <= 1.0 and ev.mean_turns == 1.0
    assert ev.ci95[0] <= ev.accuracy <= ev.ci95[1] and len(ev.per_task) == 4


def test_kill_and_resume_gives_identical_parameters(tmp_path):
    common = (
        EXACT,
        "train.steps=3",
        "run.save_every=1",
        "train.epochs_per_batch=2",
        "train.minibatches_per_batch=2",
        "train.lr_schedule=cosine",
        "train.warmup_steps=1",
    )
    straight = make_trainer(tmp_path, *common, name="straight")
    straight.train()
    first = make_trainer(tmp_path, *common, name="split")
    first.train(until_step=1)
    assert first.step == 1
    del first
    resumed = make_trainer(tmp_path, *common, "run.resume=true", name="split")
    assert resumed.step == 1
    resumed.train()
    a, b = params(straight.model), params(resumed.model)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert (
        straight.optimizer.state_dict()["state"][0]["step"]
        == resumed.optimizer.state_dict()["state"][0]["step"]
    )


def test_sigterm_checkpoints_then_resume_is_exact(tmp_path, signal_handlers_restored):
    common = (EXACT, "train.steps=2", "run.save_every=0")
    straight = make_trainer(tmp_path, *common, name="straight")
    straight.train()
    victim = make_trainer(tmp_path, *common, name="killed")
    orig = victim.train_step

    def step_then_signal():
        m = orig()
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal, delivered to our handler
        return m

    victim.train_step = step_then_signal
    out = victim.train()
    assert out["status"] == "interrupted" and victim.step == 1
    assert (tmp_path / "killed" / "checkpoints" / "step_000001" / "state.pt").is_file()
    resumed = make_trainer(tmp_path, *common, "run.resume=true", name="killed")
    resumed.train()
    for k, v in params(straight.model).items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k


def test_nan_loss_skips_the_step_and_is_counted(tmp_path, caplog):
    from flowgrpo.algorithms.advantages import compute_advantages

    tr = make_trainer(tmp_path, "train.steps=1", "run.save_every=0")
    groups = tr.engine.run_groups(tr.env_factory, tr.stream.next(2), 4)
    tr.reward.score_groups(groups)
    compute_advantages(groups, "grpo_dr")
    for g in groups:  # make sure there is a learning signal
        g.trajectories[0].turns[0].advantage = 1.0
    with torch.no_grad():
        tr.model.model.norm.weight[0] = float("nan")  # poisons every forward pass of the update
    before = params(tr.model)
    m = tr.update([t for g in groups for t in g.trajectories])
    assert m["skipped"] == 1.0 and tr.counters["nan_skipped_steps"] == 1
    assert "non-finite" in caplog.text
    for k, v in params(tr.model).items():
        assert torch.equal(v.nan_to_num(7.0), before[k].nan_to_num(7.0)), k
    assert not tr.optimizer.state  # the optimizer never stepped


def test_reference_model_is_frozen_and_skipped_without_kl(tmp_path):
    tr = make_trainer(tmp_path, "algorithm.kl_coef=0.0", name="nokl")
    assert tr.ref_model is None
    tr = make_trainer(tmp_path, name="kl")
    assert not tr.ref_model.training
    assert all(not p.requires_grad for p in tr.ref_model.parameters())
    assert tr.ref_model is not tr.model


@pytest.mark.parametrize("autocast", ["null", "float16"])  # float16: the warm start scales its loss too
def test_sft_on_demonstrations_lowers_the_loss(tmp_path, autocast):
    tr = make_trainer(tmp_path, "train.steps=1", f"model.autocast={autocast}")

    # demonstrations: a text policy that always says the same thing, through the rollout engine
    class Say:
        async def act(self, messages):
            return "The answer is 19."

    demos = demonstrations(tr.parts, 4, policy=Say())
    assert len(demos) == 4 and all(
        t.turns and all(lp == 0.0 for lp in t.turns[0].action_logprobs) for t in demos
    )
    hist = supervised_epochs(tr.parts, demos, epochs=4, lr=1e-2)
    assert hist[-1]["loss"] < hist[0]["loss"] * 0.7
    assert math.isfinite(hist[-1]["loss"])


def test_config_defaults_validate():
    cfg = TrainConfig()
    assert cfg.algorithm.estimator == "flow_grpo" and cfg.rewards[0].name == "accuracy"


def test_dynamic_sampling_refills_groups_dropped_for_equal_rewards(tmp_path):
    """DAPO's dynamic sampling: tasks with an even index always score 0 (no signal); extra rounds on
    fresh tasks refill the update batch, never past ``tasks_per_step`` groups."""

    def reward(traj, task) -> float:
        ids = traj.turns[0].action_ids if traj.turns else []
        if int(task.id.split("-")[1]) % 2 == 0:
            return 0.0
        return 1.0 if ids and ids[0] % 2 == 0 else 0.0

    def run(name: str, rounds: int) -> list[dict]:
        tr = make_trainer(tmp_path, "train.steps=3", f"train.resample_rounds={rounds}", name=name)
        tr.reward = CompositeReward([RewardSpec(name="first_token")], fns={"first_token": reward})
        tr.train()
        return [m.values for m in RunDir(tmp_path / name).metrics() if "groups_trained" in m.values]

    plain, refilled = run("plain", 0), run("refilled", 4)
    assert all(r["groups_sampled"] == 4 and r["resample_rounds"] == 0 for r in plain)
    assert all(r["groups_trained"] <= 4 for r in plain + refilled)
    assert sum(r["groups_trained"] for r in refilled) > sum(r["groups_trained"] for r in plain)
    assert any(r["resample_rounds"] > 0 and r["groups_sampled"] > 4 for r in refilled)


def test_resampling_without_dropping_is_a_config_error():
    with pytest.raises(Exception, match="drop_zero_variance_groups"):
        load_config(None, ["train.resample_rounds=2", "train.drop_zero_variance_groups=false"])


def test_update_leaves_excluded_trajectories_out(tmp_path):
    from flowgrpo.algorithms.advantages import compute_advantages

    tr = make_trainer(tmp_path, "train.steps=1", "run.save_every=0")
    groups = tr.engine.run_groups(tr.env_factory, tr.stream.next(1), 4)
    tr.reward.score_groups(groups)
    compute_advantages(groups, "grpo_dr")
    trajs = groups[0].trajectories
    for t in trajs:
        t.turns[0].advantage = 1.0
        t.excluded = "termination:error"
    before = params(tr.model)
    assert tr.update(trajs) == {"optimizer_steps": 0.0}  # nothing left to train on
    assert all(torch.equal(v, before[k]) for k, v in params(tr.model).items())
    trajs[0].excluded = None
    m = tr.update(trajs)
    assert m["optimizer_steps"] == 1.0
    assert m["train_tokens"] == float(trajs[0].num_action_tokens)  # only the scored episode's tokens


def test_resuming_from_an_older_checkpoint_records_each_step_once(tmp_path, caplog):
    """A run reached step 3 but resumes from its step-2 checkpoint (as after a kill between
    checkpoints): step 3 re-runs and replaces its trajectories and metrics instead of adding a
    second copy; the superseded records are moved aside, and the log says so."""
    import logging

    common = (EXACT, "train.steps=3", "run.save_every=2")
    make_trainer(tmp_path, *common).train()
    run = tmp_path / "run"
    older = run / "checkpoints" / "step_000002"
    resumed = make_trainer(tmp_path, *common, f"run.resume={older}")
    assert resumed.step == 2
    with caplog.at_level(logging.WARNING):
        resumed.train()
    rd = RunDir(run)
    assert [m.step for m in rd.metrics() if "reward_mean" in m.values] == [1, 2, 3]
    assert len(rd.trajectories(3)) == 24  # 4 tasks x 6, once
    assert "resuming at step 2: moved the records of later steps to" in caplog.text
    aside = next((run / "superseded").iterdir())
    assert len(read_trajectories(aside / "trajectories" / "step_000003.jsonl")) == 24


def test_every_step_reports_the_sampler_trainer_ratio_before_its_first_update(tmp_path):
    """fp32 sampler and trainer: the on-policy ratio is 1 within the stated tolerance, and with
    several minibatches the later (off-policy) ones do not leak into it."""
    from flowgrpo.training.trainer import SAMPLER_RATIO_TOLERANCE

    tr = make_trainer(
        tmp_path,
        "train.steps=2",
        "run.save_every=0",
        "model.rollout_dtype=float32",
        "train.minibatches_per_batch=2",
    )
    tr.train()
    rows = [m.values for m in RunDir(tmp_path / "run").metrics() if m.values.get("optimizer_steps")]
    assert rows
    for r in rows:
        assert r["sampler_ratio_min"] <= r["sampler_ratio_mean"] <= r["sampler_ratio_max"]
        assert abs(r["sampler_ratio_min"] - 1) < SAMPLER_RATIO_TOLERANCE
        assert abs(r["sampler_ratio_max"] - 1) < SAMPLER_RATIO_TOLERANCE
