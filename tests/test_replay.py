"""Replay: a real run directory (oracle and wrong-answer episodes run through the rollout engine's
text-policy path with the tiny tokenizer, scored by the real rewards, advantages by Flow-GRPO),
printed, rescored and re-executed against the real arithmetic environment.

``build_run`` is also used by tests/test_report.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowgrpo import env as env_mod
from flowgrpo.algorithms.advantages import compute_advantages
from flowgrpo.cli import main
from flowgrpo.config import TrainConfig, dump_config
from flowgrpo.modeling.models import tiny_tokenizer
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.rollout.engine import RolloutConfig, run_text_policy
from flowgrpo.runs.evaluation import summarize
from flowgrpo.runs.metrics import MetricsLogger
from flowgrpo.runs.replay import (
    format_summary,
    format_trajectory,
    make_run_env_factory,
    reexecute,
    rescore,
    select_trajectories,
    tasks_by_id,
)
from flowgrpo.runs.rundir import RunDir, RunError
from flowgrpo.runs.store import TrajectoryWriter
from flowgrpo.types import Message, Trajectory

ENV_KWARGS = {"seed": 3, "num_train": 6, "num_test": 3}

# ----------------------------------------------------------------------------- the environment


ENV_NAME = "arithmetic"


def make_env():
    return env_mod.make(ENV_NAME, **ENV_KWARGS)


class WrongPolicy:
    """Answers 0 at once, without the calculator (a wrong, tool-less episode)."""

    async def act(self, messages: list[Message]) -> str:
        return "I think it is zero.\n<answer>0</answer>"


def _alternating_policy():
    n = {"i": 0}

    def for_env(env):
        n["i"] += 1
        return env.oracle() if n["i"] % 2 else WrongPolicy()

    return for_env


# ----------------------------------------------------------------------------- the run directory


def build_run(run_dir: Path, *, steps: int = 3, group_size: int = 2) -> Path:
    """A run directory as the trainer writes it, from real rollouts (text policies), real rewards
    and real advantages, through the trainer's writers (dump_config, MetricsLogger, TrajectoryWriter,
    EvalResult lines). Step s trains on tasks s-1 and s (2 groups of ``group_size``)."""
    tok = tiny_tokenizer()
    env = make_env()
    train = env.tasks("train")
    cfg = RolloutConfig(max_turns=4, max_new_tokens=512, max_context_tokens=4096)
    composite = CompositeReward([RewardSpec(name="accuracy"), RewardSpec(name="format", weight=0.2)])
    run_dir.mkdir(parents=True, exist_ok=True)
    config = TrainConfig.model_validate(
        {
            "model": {"name": "tiny"},
            "env": {"name": ENV_NAME, "kwargs": ENV_KWARGS},
            "rewards": [{"name": "accuracy", "weight": 1.0}, {"name": "format", "weight": 0.2}],
            "train": {"group_size": group_size, "tasks_per_step": 2},
            "run": {"output_dir": str(run_dir)},
        }
    )
    dump_config(config, run_dir / "config.yaml")
    metrics = MetricsLogger(run_dir / "metrics.jsonl")
    with open(run_dir / "eval.jsonl", "w") as ef:
        for step in range(1, steps + 1):
            tasks = [train[(step - 1) % len(train)], train[step % len(train)]]
            # step 1: half the episodes answer wrong; later steps: all oracle (the policy "learns")
            policy = _alternating_policy() if step == 1 else None
            groups = run_text_policy(
                make_env, tasks, policy, tok, cfg, group_size=group_size, policy_version=step - 1
            )
            composite.score_groups(groups)
            compute_advantages(groups, "flow_grpo")
            trajs = [t for g in groups for t in g.trajectories]
            with TrajectoryWriter(run_dir / "trajectories" / f"step_{step:06d}.jsonl") as w:
                w.write_groups(groups)
            acc = sum(t.reward_breakdown["accuracy"] for t in trajs) / len(trajs)
            metrics.log(
                step,
                {
                    "reward_mean": sum(t.reward for t in trajs) / len(trajs),
                    "accuracy": acc,
                    "loss": 0.5 / step,
                    "kl": 0.01 * step,
                    "clip_frac": 0.0,
                    "entropy": 1.0,
                    "tokens_per_s": 100.0,
                    "lr": 1e-5,
                },
            )
            if step in (1, steps):  # as Trainer.evaluate(record=True) appends it
                ef.write(summarize(groups, label=f"step{step}", step=step).model_dump_json() + "\n")
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("run") / "RUN")


# ----------------------------------------------------------------------------- tests


def test_run_dir_reads_every_part(run_dir):
    run = RunDir(run_dir)
    assert run.steps() == [1, 2, 3]
    assert [m.step for m in run.metrics()] == [1, 2, 3]
    assert [e.step for e in run.evals()] == [1, 3]
    assert (run.config().env.name, run.config().env.kwargs) == (ENV_NAME, ENV_KWARGS)
    assert run.config().model.name == "tiny"
    step1 = run.trajectories(1)
    assert len(step1) == 4 and all(isinstance(t, Trajectory) for t in step1)
    # step 1 alternates oracle (right, 2 turns) and wrong (1 turn): accuracy 1, 0, 1, 0
    assert [t.reward_breakdown["accuracy"] for t in step1] == [1.0, 0.0, 1.0, 0.0]
    assert run.metrics()[0].values["accuracy"] == 0.5


def test_run_dir_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(RunError, match="not a directory"):
        RunDir(tmp_path / "nope")
    with pytest.raises(RunError, match="not a flowgrpo run directory"):
        RunDir(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2')  # torn last line: skipped
    run = RunDir(tmp_path)
    assert [(m.step, m.values) for m in run.metrics()] == [(1, {})]
    with pytest.raises(RunError, match="no step_"):
        select_trajectories(run)


def test_select_trajectories(run_dir):
    run = RunDir(run_dir)
    step, trajs = select_trajectories(run)
    assert step == 3 and len(trajs) == 4
    task = run.trajectories(2)[0].task_id
    step, trajs = select_trajectories(run, step=2, task=task)
    assert step == 2 and len(trajs) == 2 and {t.task_id for t in trajs} == {task}
    _, [one] = select_trajectories(run, step=2, task=task, traj=1)
    assert one is trajs[1]
    _, [same] = select_trajectories(run, step=2, traj=one.id)
    assert same is one
    with pytest.raises(RunError, match="saved steps: 1-3"):
        select_trajectories(run, step=9)
    with pytest.raises(RunError, match="out of range"):
        select_trajectories(run, step=2, traj=4)


def test_format_trajectory_turn_by_turn(run_dir):
    run = RunDir(run_dir)
    traj = run.trajectories(1)[0]  # an oracle episode: calculator call, then the answer
    tasks = tasks_by_id(make_env())
    task = tasks[traj.task_id]
    assert len(traj.turns) == 2
    text = format_trajectory(traj, task=task)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert lines[0] == f"== trajectory {traj.id} =="
    t0, t1 = traj.turns
    # rewards 1.0 (accuracy) and 1.0 (format, weight 0.2) -> 1.2; group rewards (1.2, 0.0 + 0.2*f)
    assert f"reward {traj.reward:.3f}" in text and "accuracy=1.000" in text
    assert f"-- turn 1/2  prompt {len(t0.prompt_ids)} tok  action {len(t0.action_ids)} tok" in text
    assert f"-- turn 2/2  prompt {len(t1.prompt_ids)} tok  action {len(t1.action_ids)} tok" in text
    assert f"advantage {t0.advantage:+.3f}" in text and t0.advantage > 0
    assert "termination finished" in text
    assert task.prompt in text  # no tokenizer: the task's prompt stands in for the opening tokens
    call = t0.action.tool_calls[0]
    assert f"-> call calculator({json.dumps(call.arguments)})" in text
    assert f"[tool calculator] (answers {call.id})" in text
    assert t0.observations[0].content in text
    assert f"final answer: {task.answer}" in text
    total = sum(len(t.prompt_ids) for t in traj.turns)
    assert f"tokens {traj.num_tokens} (prompt/observation {total}, action {traj.num_action_tokens})" in text

    # with the tokenizer, the opening prompt is decoded from its exact token ids
    tok = tiny_tokenizer()
    text_tok = format_trajectory(traj, tokenizer=tok)
    assert "<|im_start|>system" in text_tok and task.prompt in text_tok
    # colour only on request
    assert "\x1b[32m" in format_trajectory(traj, color=True)


def test_format_summary(run_dir):
    run = RunDir(run_dir)
    trajs = run.trajectories(1)
    text = format_summary(trajs, step=1)
    assert len(text.splitlines()) == 1 + 4 + 1
    mean = sum(t.reward for t in trajs) / 4
    assert text.splitlines()[-1] == f"4 trajectories at step 1, mean reward {mean:.3f}"


def test_rescore_with_other_rewards(run_dir):
    run = RunDir(run_dir)
    trajs = run.trajectories(1)
    tasks = tasks_by_id(make_env())
    rep = rescore(trajs, ["accuracy"], tasks)
    assert [r.new_reward for r in rep.rows] == [1.0, 0.0, 1.0, 0.0]
    assert rep.new_mean == 0.5
    assert [r.old_reward for r in rep.rows] == [t.reward for t in trajs]
    assert all(set(r.new_breakdown) == {"accuracy"} for r in rep.rows)
    # the originals are untouched
    assert set(trajs[0].reward_breakdown) == {"accuracy", "format"}
    table = rep.format()
    assert table.splitlines()[-1].startswith("mean") and " 0.500" in table.splitlines()[-1]
    with pytest.raises(RunError, match="not among the environment's tasks"):
        rescore(trajs, ["accuracy"], {})


def test_reexecute_reproduces_and_finds_a_tampered_observation(run_dir):
    run = RunDir(run_dir)
    trajs = [t for s in run.steps() for t in run.trajectories(s)]
    factory = make_run_env_factory(run)
    rep = reexecute(trajs, factory)
    n_obs = sum(len(u.observations) for t in trajs for u in t.turns)
    assert n_obs >= 6  # every oracle episode has one calculator observation
    assert rep.ok, rep.format()
    assert rep.trajectories == len(trajs) and rep.identical == rep.compared == n_obs

    tampered = trajs[0].model_copy(deep=True)
    obs = tampered.turns[0].observations[0]
    real = obs.content
    obs.content = "41" if real != "41" else "42"
    rep = reexecute([tampered, trajs[1]], factory)
    assert len(rep.diffs) == 1
    d = rep.diffs[0]
    assert (d.traj_id, d.turn, d.index) == (tampered.id, 0, 0)
    assert d.recorded.content == obs.content and d.replayed.content == real
    n = sum(len(u.observations) for t in (tampered, trajs[1]) for u in t.turns)
    assert rep.identical == n - 1 and rep.compared == n
    assert f"{n - 1}/{n} observations identical, 1 differences" in rep.format()


def test_reexecute_reports_termination_mismatch(run_dir):
    run = RunDir(run_dir)
    traj = run.trajectories(2)[0].model_copy(deep=True)
    # drop the answer turn: the record now says 'finished' after a tool call the env does not end on
    traj.turns = traj.turns[:1]
    rep = reexecute([traj], make_run_env_factory(run))
    assert [d.note for d in rep.diffs] == [
        "the record ends with termination 'finished' but the environment did not terminate"
    ]


def test_cli_replay(run_dir, capsys):
    run = RunDir(run_dir)
    task = run.trajectories(1)[0].task_id
    assert (
        main(["replay", str(run_dir), "--step", "1", "--task", task, "--traj", "0", "--color", "never"]) == 0
    )
    out = capsys.readouterr().out
    assert out.count("== step 1") == 1 and "-- turn 2/2" in out and "\x1b[" not in out
    assert main(["replay", str(run_dir), "--step", "1", "--rescore", "accuracy"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("mean") and "0.500" in out.splitlines()[-1]
    assert main(["replay", str(run_dir), "--reexecute"]) == 0
    out = capsys.readouterr().out
    assert "4 trajectories re-executed" in out and "0 differences" in out
    assert main(["replay", str(run_dir), "--step", "7"]) == 2
    assert "saved steps: 1-3" in capsys.readouterr().err


def test_cli_envs_and_tools(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "arithmetic" in out and "calculator" in out
    assert main(["tools"]) == 0
    out = capsys.readouterr().out
    assert "calculator" in out
