"""A run whose steps train nothing says so, with the likely causes."""

from __future__ import annotations

import logging

import pytest

from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.training.idle import IdleWatch, likely_causes
from tests.toy import make_trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_likely_causes_read_the_steps_metrics():
    m = {"episodes": 8.0, "reward_mean": 0.0, "reward_std": 0.0, "termination/max_tokens": 6.0}
    causes = likely_causes(m, group_size=8)
    assert causes[0].startswith("the reward is constant (0: no episode succeeds)")
    assert "6 of 8 episodes hit rollout.max_new_tokens" in causes[1] and len(causes) == 2
    assert "every episode scores the same" in likely_causes({"reward_mean": 1.0, "reward_std": 0.0}, 8)[0]
    assert "group_size=2" in likely_causes({"reward_std": 0.3}, 2)[0]
    assert likely_causes({"reward_std": 0.3}, 8) == [
        "each group's rewards were equal within it, though they differ across groups "
        "(zero_variance_groups in metrics.jsonl): the tasks are too easy or too hard for this "
        "policy at this train.group_size"
    ]
    assert likely_causes({}, 8) == [  # no reward spread recorded: nothing said about other groups
        "each group's rewards were equal within it (zero_variance_groups in metrics.jsonl): the "
        "tasks are too easy or too hard for this policy at this train.group_size"
    ]


def test_the_watch_warns_every_few_idle_steps_and_at_the_end(caplog):
    w = IdleWatch(group_size=8, every=2)
    with caplog.at_level(logging.WARNING, logger="flowgrpo.training.idle"):
        for step, n_opt in enumerate([1.0, 0.0, 0.0, 0.0], start=1):
            w.observe(step, {"optimizer_steps": n_opt, "reward_mean": 0.0, "reward_std": 0.0})
        assert len(caplog.records) == 1 and "2 of 3 RL steps so far trained nothing" in caplog.text
        assert w.summary().startswith("3 of 4 RL steps in this run trained nothing")
    assert IdleWatch(group_size=8).summary() is None


def test_a_run_with_constant_rewards_says_it_trained_nothing(tmp_path, caplog):
    tr = make_trainer(tmp_path, "train.steps=2", "run.save_every=0")
    tr.reward = CompositeReward([RewardSpec(name="zero")], fns={"zero": lambda traj, task: 0.0})
    with caplog.at_level(logging.WARNING, logger="flowgrpo.training.idle"):
        tr.train()
    assert "2 of 2 RL steps in this run trained nothing" in caplog.text
    assert "the reward is constant (0: no episode succeeds)" in caplog.text
