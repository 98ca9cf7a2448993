"""RunDir: a run directory read back with types.

One run directory comes from a real training run (`flowgrpo train` with the tiny model: two RL
steps, a held-out evaluation after each, a checkpoint after each); the others are written by the
trainer's own writers (dump_config, MetricsLogger, TrajectoryWriter, EvalResult lines,
save_checkpoint) and then damaged the way a crash or an older flowgrpo would damage them.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
import yaml

from flowgrpo.cli import main
from flowgrpo.config import ConfigError, TrainConfig, config_from_dict, dump_config
from flowgrpo.runs.checkpoint import save_checkpoint
from flowgrpo.runs.evaluation import EvalResult, record_evaluation
from flowgrpo.runs.metrics import MetricsLogger
from flowgrpo.runs.rundir import CheckpointRef, MetricRecord, RunDir, RunError
from flowgrpo.runs.store import TrajectoryWriter
from flowgrpo.types import Message, Trajectory, Turn

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY_RUN = [
    "model.name=tiny",
    "model.autocast=null",
    "train.steps=2",
    "train.tasks_per_step=2",
    "train.group_size=2",
    "train.drop_zero_variance_groups=false",
    "train.resample_rounds=0",
    "rollout.max_new_tokens=16",
    "sft.enabled=false",
    "sft.replay_coef=0",  # nothing to replay without the warm start
    "run.progress=false",
    "run.save_every=1",
    "run.eval_every=1",
    "run.eval_n=2",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained") / "RUN"
    sets = [a for kv in [*TINY_RUN, f"run.output_dir={out}"] for a in ("--set", kv)]
    assert (
        main(["train", str(EXAMPLES / "calculator_agent.yaml"), *sets, "--eval-n", "2", "--no-report"]) == 0
    )
    return out


def test_a_trained_run_reads_back_typed(trained):
    run = RunDir(trained)
    cfg = run.config()
    assert isinstance(cfg, TrainConfig)
    assert (cfg.model.name, cfg.env.name, cfg.train.steps, cfg.train.group_size) == (
        "tiny",
        "arithmetic",
        2,
        2,
    )
    assert cfg.run.output_dir == str(trained)

    metrics = run.metrics()
    assert all(isinstance(m, MetricRecord) for m in metrics)
    rl = [m for m in metrics if "episodes" in m.values]
    assert [m.step for m in rl] == [1, 2]
    assert all(m.values["episodes"] == 4.0 and "loss" in m.values for m in rl)  # 2 tasks x 2, an update ran
    # the evaluation after step 1 logs its accuracy as a record of its own, at the same step
    (ev1,) = [m for m in metrics if "eval/accuracy" in m.values]
    assert ev1.step == 1 and 0.0 <= ev1.values["eval/accuracy"] <= 1.0

    assert run.steps() == [1, 2]
    trajs = run.trajectories(1)
    assert len(trajs) == 4 and all(isinstance(t, Trajectory) for t in trajs)
    assert all(t.turns and t.turns[0].advantage is not None for t in trajs)
    assert run.trajectories(1) is trajs  # parsed once

    evals = run.evals()
    assert all(isinstance(e, EvalResult) for e in evals)
    assert [(e.label, e.step, e.n) for e in evals] == [("untrained", 0, 2), ("step1", 1, 2), ("step2", 2, 2)]
    assert run.find_eval("step2") == evals[-1] and run.find_eval("step2", split="train") is None
    assert run.find_eval("nope") is None
    episodes = run.eval_episodes("untrained")
    assert sorted(t.task_id for t in episodes) == sorted(evals[0].per_task)
    assert run.eval_labels() == ["step1", "step2", "untrained"]

    refs = run.checkpoints()
    assert refs == [
        CheckpointRef(1, trained / "checkpoints" / "step_000001"),
        CheckpointRef(2, trained / "checkpoints" / "step_000002"),
    ]
    assert run.latest_checkpoint() == run.checkpoint(2) == refs[-1].path
    assert (run.checkpoint(1) / "state.pt").is_file()
    with pytest.raises(RunError, match=r"no checkpoint of step 7 .*saved steps: 1-2"):
        run.checkpoint(7)
    with pytest.raises(RunError, match=r"no trajectories saved for step 5 .*saved steps: 1-2"):
        run.trajectories(5)
    with pytest.raises(RunError, match=r"called 'warm' \(recorded: step1, step2, untrained\)"):
        run.eval_episodes("warm")


def test_config_overrides_and_a_moved_run(trained, tmp_path):
    run = RunDir(trained)
    before = run.config()
    cfg = run.config(["rollout.max_turns=7", "train.lr=3e-5"])
    assert (cfg.rollout.max_turns, cfg.train.lr, cfg.model.name) == (7, 3e-5, "tiny")
    assert run.config() == before and before.rollout.max_turns != 7  # the run's own config is untouched
    before.train.lr = 1.0
    assert run.config().train.lr != 1.0  # callers get a copy
    with pytest.raises(ConfigError, match=r"did you mean 'train\.lr'"):
        run.config(["train.lrr=1e-5"])
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "config.yaml").write_bytes((trained / "config.yaml").read_bytes())
    assert RunDir(moved).config().run.output_dir == str(moved)


# ----------------------------------------------------------------------------- written by the writers


def _traj(i: int) -> Trajectory:
    return Trajectory(
        id=f"t{i}",
        task_id=f"task-{i}",
        env="arithmetic",
        reward=float(i % 2),
        reward_breakdown={"accuracy": float(i % 2)},
        turns=[
            Turn(
                prompt_ids=[1, 2, 3],
                action_ids=[4, 5],
                action_logprobs=[-0.5, -0.25],
                action=Message(role="assistant", content=f"<answer>{i}</answer>"),
                advantage=1.0 if i % 2 else -1.0,
            )
        ],
    )


def _eval(label: str, step: int, accuracy: float) -> EvalResult:
    return EvalResult(
        label=label,
        step=step,
        n=4,
        accuracy=accuracy,
        ci95=(0.0, 1.0),
        per_task={f"task-{i}": i % 2 for i in range(4)},
    )


def _write_run(root: Path) -> Path:
    """A run as the trainer writes it, through the trainer's writers."""
    cfg = TrainConfig.model_validate(
        {
            "model": {"name": "tiny"},
            "env": {"name": "arithmetic", "kwargs": {"seed": 3}},
            "run": {"output_dir": str(root)},
        }
    )
    root.mkdir(parents=True)
    dump_config(cfg, root / "config.yaml")
    log = MetricsLogger(root / "metrics.jsonl")
    for step in (1, 2, 3):
        log.log(step, {"reward_mean": step / 10, "kl": float("nan") if step == 2 else 0.01, "episodes": 4})
        with TrajectoryWriter(root / "trajectories" / f"step_{step:06d}.jsonl") as w:
            w.write_many(_traj(i) for i in range(4))
    with TrajectoryWriter(root / "eval" / "step3.jsonl") as w:
        w.write_many(_traj(i) for i in range(4))
    with open(root / "eval.jsonl", "a") as f:  # as Trainer.evaluate(record=True) appends
        for e in (_eval("untrained", 0, 0.25), _eval("step3", 3, 0.5), _eval("step3", 3, 0.75)):
            f.write(e.model_dump_json() + "\n")
    model = torch.nn.Linear(2, 2)
    for step in (3, 5):
        save_checkpoint(root / "checkpoints", step, model=model)
    return root


def _tear(path: Path, record: str) -> None:
    """Append half a record, as a process killed mid-write leaves it."""
    with open(path, "a") as f:
        f.write(record[: len(record) // 2])


@pytest.fixture
def written(tmp_path) -> Path:
    return _write_run(tmp_path / "RUN")


def test_records_written_by_the_writers_come_back_with_their_values(written):
    run = RunDir(written)
    cfg = run.config()
    assert (cfg.model.name, cfg.env.name, cfg.env.kwargs) == ("tiny", "arithmetic", {"seed": 3})
    m = run.metrics()
    assert [(r.step, r.values["reward_mean"], r.values["episodes"]) for r in m] == [
        (1, 0.1, 4.0),
        (2, 0.2, 4.0),
        (3, 0.3, 4.0),
    ]
    assert math.isnan(m[1].values["kl"]) and m[0].values["kl"] == 0.01  # MetricsLogger wrote "nan"
    assert run.steps() == [1, 2, 3] and run.trajectories(2) == [_traj(i) for i in range(4)]
    assert [(e.label, e.accuracy) for e in run.evals()] == [
        ("untrained", 0.25),
        ("step3", 0.5),
        ("step3", 0.75),
    ]
    assert run.find_eval("step3").accuracy == 0.75  # the latest of a label
    assert run.find_eval("step3").per_task == {"task-0": 0, "task-1": 1, "task-2": 0, "task-3": 1}
    assert run.eval_episodes("step3") == [_traj(i) for i in range(4)]
    assert [c.step for c in run.checkpoints()] == [3, 5] and run.latest_checkpoint().name == "step_000005"
    with pytest.raises(RunError, match=r"no checkpoint of step 4 in .*checkpoints; saved steps: 3, 5"):
        run.checkpoint(4)


def test_a_torn_last_line_is_skipped_with_a_warning(written, caplog):
    _tear(written / "metrics.jsonl", json.dumps({"step": 4, "reward_mean": 0.4}) + "\n")
    _tear(written / "eval.jsonl", _eval("step4", 4, 1.0).model_dump_json() + "\n")
    _tear(written / "trajectories" / "step_000003.jsonl", _traj(9).model_dump_json() + "\n")
    run = RunDir(written)
    with caplog.at_level(logging.WARNING):
        assert [m.step for m in run.metrics()] == [1, 2, 3]
        assert [e.label for e in run.evals()] == ["untrained", "step3", "step3"]
        assert [t.id for t in run.trajectories(3)] == ["t0", "t1", "t2", "t3"]
    assert caplog.text.count("truncated last") == 3


def test_a_torn_line_in_the_middle_loses_only_itself(written, caplog):
    """A writer killed mid-line, then the run resumed: the next records follow the fragment. Each
    of the three files still reads, minus the torn line, with a warning naming file and line."""
    metrics, evals = written / "metrics.jsonl", written / "eval.jsonl"
    traj_file = written / "trajectories" / "step_000003.jsonl"
    _tear(metrics, json.dumps({"step": 4, "reward_mean": 0.4}) + "\n")
    _tear(evals, _eval("step4", 4, 1.0).model_dump_json() + "\n")
    _tear(traj_file, _traj(9).model_dump_json() + "\n")
    # more records, through the writers the trainer uses
    MetricsLogger(metrics).log(4, {"reward_mean": 0.4})
    record_evaluation(written, _eval("step5", 5, 1.0), [])
    with TrajectoryWriter(traj_file) as w:
        w.write(_traj(7))
    run = RunDir(written)
    with caplog.at_level(logging.WARNING):
        assert [(m.step, m.values["reward_mean"]) for m in run.metrics()][-2:] == [(3, 0.3), (4, 0.4)]
        assert [e.label for e in run.evals()] == ["untrained", "step3", "step3", "step5"]
        assert [t.id for t in run.trajectories(3)] == ["t0", "t1", "t2", "t3", "t7"]
    for path, line in ((metrics, 4), (evals, 4), (traj_file, 5)):
        assert f"{path}:{line}: skipping a torn or unreadable record" in caplog.text


def test_garbage_in_the_middle_is_skipped_with_file_and_line(written, caplog):
    path = written / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "[1, 2]", '{"step": "two"}', *lines[1:]]) + "\n")
    epath = written / "eval.jsonl"
    elines = epath.read_text().splitlines()
    rec = json.loads(elines[1])
    rec["n"] = "many"
    elines[1] = json.dumps(rec)
    epath.write_text("\n".join(elines) + "\n")
    with caplog.at_level(logging.WARNING):
        assert [m.step for m in RunDir(written).metrics()] == [1, 2, 3]
        assert [e.accuracy for e in RunDir(written).evals()] == [0.25, 0.75]
    assert f"{path}:2: skipping a record that is not a JSON object" in caplog.text
    assert f"{path}:3: skipping an invalid record" in caplog.text
    assert f"{epath}:2: skipping an invalid record" in caplog.text


def test_evaluations_of_an_older_format_are_skipped(written, caplog):
    with open(written / "eval.jsonl", "a") as f:  # written before results carried an interval
        f.write(json.dumps({"step": 9, "split": "test", "accuracy": 1.0, "n": 4}) + "\n")
    with caplog.at_level(logging.WARNING):
        assert [e.step for e in RunDir(written).evals()] == [0, 3, 3]
    assert "older format" in caplog.text


def test_a_config_of_another_version_names_the_wrong_key(written, capsys):
    path = written / "config.yaml"
    data = yaml.safe_load(path.read_text())
    data["model"]["nmae"] = data["model"].pop("name")  # a key this TrainConfig does not have
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    run = RunDir(written)
    with pytest.raises(RunError) as e:
        run.config()
    msg = str(e.value)
    assert str(path) in msg and "does not validate" in msg
    assert "model.nmae: unknown key; did you mean 'model.name'?" in msg
    # the rest of the run is still readable, and the command line says the same and exits 2
    assert [m.step for m in run.metrics()] == [1, 2, 3]
    with pytest.raises(SystemExit) as ex:
        main(["eval", str(written)])
    assert ex.value.code == 2 and "did you mean 'model.name'" in capsys.readouterr().err


def test_a_saved_config_with_a_renamed_key_is_read_with_todays_keys(written):
    """Runs written before run.tensorboard became run.log_to still replay, report and evaluate."""
    path = written / "config.yaml"
    for old, want in ((True, ["jsonl", "tensorboard"]), (False, ["jsonl"])):
        data = yaml.safe_load(path.read_text())
        data["run"].pop("log_to", None)
        data["run"]["tensorboard"] = old
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        assert RunDir(written).config().run.log_to == want
    # a config a user writes with the old key is still refused with the new key named
    with pytest.raises(ConfigError, match=r"run\.log_to"):
        config_from_dict({"run": {"tensorboard": True}})


def test_not_a_run_directory(tmp_path):
    with pytest.raises(RunError, match="is not a directory"):
        RunDir(tmp_path / "missing")
    with pytest.raises(RunError, match=r"holds none of config\.yaml, metrics\.jsonl, eval\.jsonl"):
        RunDir(tmp_path)
    (tmp_path / "trajectories").mkdir()
    run = RunDir(tmp_path)
    assert (run.metrics(), run.evals(), run.steps(), run.checkpoints()) == ([], [], [], [])
    assert run.latest_checkpoint() is None and run.find_eval("step1") is None
    with pytest.raises(RunError, match=r"has no config\.yaml"):
        run.config()
    with pytest.raises(RunError, match=r"saved steps: \(none\)"):
        run.checkpoint(1)


def test_untrained_n_zero_skips_the_untrained_evaluation(tmp_path):
    out = tmp_path / "RUN"
    sets = [a for kv in [*TINY_RUN, f"run.output_dir={out}", "train.steps=1"] for a in ("--set", kv)]
    argv = ["train", str(EXAMPLES / "calculator_agent.yaml"), *sets, "--eval-n", "2", "--untrained-n", "0"]
    assert main([*argv, "--no-report"]) == 0
    assert [e.label for e in RunDir(out).evals()] == ["step1"]
