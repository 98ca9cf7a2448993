"""A failing reward never kills a run: the episode is excluded (``Trajectory.excluded``), leaves its
group's baseline and the update, and the step's metrics count it."""

from __future__ import annotations

import math

import pytest

from flowgrpo.algorithms.advantages import compute_advantages
from flowgrpo.config import load_config
from flowgrpo.env import BaseEnvironment, StepResult
from flowgrpo.modeling.models import tiny_model
from flowgrpo.rewards import CompositeReward, JudgeReward, Missing, RewardSpec, as_score
from flowgrpo.runs.rundir import RunDir
from flowgrpo.training.trainer import Trainer
from flowgrpo.types import Message, ParsedAction, Task, Trajectory, TrajectoryGroup, Turn
from tests.toy import PlainParser


def _group(n: int = 4) -> TrajectoryGroup:
    trajs = [
        Trajectory(
            id=f"t{i}",
            turns=[
                Turn(
                    prompt_ids=[1],
                    action_ids=[2],
                    action_logprobs=[-1.0],
                    action=Message(role="assistant", content=str(i)),
                )
            ],
        )
        for i in range(n)
    ]
    return TrajectoryGroup(task=Task(id="task", prompt="p", answer="1"), trajectories=trajs)


def test_as_score_reads_numbers_and_names_what_is_not_one():
    assert as_score(1) == 1.0 and as_score(True) == 1.0 and as_score("0.5") == 0.5
    for bad, why in [
        (10**5000, "not a number"),
        ("abc", "not a number"),
        (float("nan"), "non-finite"),
        ("9" * 5000, "non-finite"),
        (None, "None"),
        ([1], "not a number"),
    ]:
        m = as_score(bad)
        assert isinstance(m, Missing) and why in m.reason, (bad, m)


def test_a_raising_or_unparseable_reward_excludes_only_its_episode():
    def flaky(traj, task):
        i = int(traj.id[1:])
        return (
            [1.0, RuntimeError, 10**5000, 0.0][i] if i != 1 else (_ for _ in ()).throw(RuntimeError("boom"))
        )

    g = _group()
    CompositeReward(
        [RewardSpec(name="flaky"), RewardSpec(name="const", weight=0.5)],
        fns={"flaky": flaky, "const": lambda traj, task: 1.0},
    ).score_groups([g])
    t0, t1, t2, t3 = g.trajectories
    assert t0.excluded is None and t0.reward == 1.5 and t3.reward == 0.5
    assert t1.excluded == "reward:flaky: RuntimeError: boom"
    assert t2.excluded == "reward:flaky: not a number (int of 16610 bits: OverflowError)"
    assert t1.reward == 0.0 and t1.reward_breakdown == {"const": 1.0}  # the parts that scored are kept
    # The excluded episodes leave the baseline: the group is {1.5, 0.5} -> +-1/sqrt(2) after std scaling.
    compute_advantages([g], "flow_grpo")
    assert t1.turns[0].advantage == 0.0 and t2.turns[0].advantage == 0.0
    assert t0.turns[0].advantage == pytest.approx(1 / math.sqrt(2), abs=1e-4)
    assert t3.turns[0].advantage == pytest.approx(-1 / math.sqrt(2), abs=1e-4)


def test_a_failing_group_reward_excludes_its_group_only():
    calls = []

    def group_reward(group):
        calls.append(group.group_id)
        if len(calls) == 1:
            raise ValueError("embedder down")
        return [0.0, 1.0]  # wrong length for a group of 4

    g1, g2 = _group(), _group()
    CompositeReward([RewardSpec(name="div")], fns={"div": group_reward}).score_groups([g1, g2])
    assert all(t.excluded == "reward:div: ValueError: embedder down" for t in g1.trajectories)
    assert all(t.excluded == "reward:div: gave 2 values for 4 trajectories" for t in g2.trajectories)


class _DownClient:
    async def complete(self, messages):
        raise ConnectionError("HTTP 500")


class _SometimesClient:
    async def complete(self, messages):
        return (
            "SCORE: 0.8" if "0" in messages[0]["content"].split("turn 1]")[1][:3] else "I cannot grade this"
        )


def test_judge_failures_exclude_the_episode_by_default():
    g = _group(2)
    CompositeReward(
        [RewardSpec(name="judge")], fns={"judge": JudgeReward(client=_DownClient())}
    ).score_groups([g])
    assert all(
        t.excluded.startswith("reward:judge: judge: call failed (ConnectionError: HTTP 500)")
        for t in g.trajectories
    )
    g = _group(2)
    judge = JudgeReward(client=_SometimesClient())
    CompositeReward([RewardSpec(name="judge")], fns={"judge": judge}).score_groups([g])
    assert g.trajectories[0].reward == 0.8 and g.trajectories[0].excluded is None
    assert g.trajectories[1].excluded.startswith("reward:judge: judge: reply has no score")
    assert judge.failures == 1 and judge.calls == 2


class _OneTurnEnv(BaseEnvironment):
    name = "one_turn"
    tools: list = []
    parser = PlainParser()

    async def reset(self, task: Task) -> list[Message]:
        return [Message(role="user", content=task.prompt)]

    async def step(self, action: ParsedAction) -> StepResult:
        return StepResult(terminated=True)

    def tasks(self, split: str) -> list[Task]:
        return [Task(id=f"{split}-{i}", prompt=f"task {i}") for i in range(4)]


def test_a_run_with_a_crashing_reward_finishes_and_counts_the_failures(tmp_path, one_thread):
    model, tok = tiny_model(seed=0)

    def crashy(traj, task):  # a 5000-digit number on the first token's parity, else a score
        return 10**5000 if traj.turns[0].action_ids[0] % 2 else float(traj.turns[0].action_ids[0] % 3 == 0)

    cfg = load_config(
        None,
        [
            f"run.output_dir={tmp_path / 'r'}",
            "run.progress=false",
            "run.save_every=0",
            "model.autocast=null",
            "rollout.max_turns=1",
            "rollout.max_new_tokens=2",
            "rewards=[{name: crashy}]",
            "train.steps=2",
            "train.tasks_per_step=2",
            "train.group_size=4",
            "train.micro_batch_tokens=256",
        ],
    )
    reward = CompositeReward([RewardSpec(name="crashy")], fns={"crashy": crashy})
    out = Trainer(cfg, model=model, tokenizer=tok, env_factory=_OneTurnEnv, reward=reward).train()
    assert out["status"] == "finished"
    rows = [m.values for m in RunDir(tmp_path / "r").metrics() if "episodes_excluded" in m.values]
    assert len(rows) == 2 and sum(r["episodes_excluded"] for r in rows) > 0
    assert all(r.get("excluded/reward", 0.0) == r["episodes_excluded"] for r in rows)
