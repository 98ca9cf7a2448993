"""SIGTERM/SIGINT on a real training process (the ``flowgrpo train`` command, tiny model, long
generations): the first signal stops the rollout within a decode step, checkpoints the last
complete step and exits 0; a second signal exits at once, without an abort trace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.toy import CALCULATOR, SMALL, make_trainer

# A stop leaves the trainer's "exit at once" handlers for the process's wind-down; each test here
# gets pytest's back.
pytestmark = pytest.mark.usefixtures("signal_handlers_restored")

# Long episodes (4 tasks x 8 episodes x 3 turns x up to 400 tokens) so a signal lands mid-rollout.
SETTINGS = [
    "model.name=tiny",
    "model.autocast=null",
    "env.name=arithmetic",
    "train.steps=1000",
    "train.tasks_per_step=4",
    "train.group_size=8",
    "rollout.max_turns=3",
    "rollout.max_new_tokens=400",
    "run.save_every=0",
    "run.progress=false",
]


def _start(out: Path) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "flowgrpo",
        "train",
        str(out.parent / "cfg.yaml"),
        "--eval-n",
        "0",
        "--no-report",
    ]
    for s in [*SETTINGS, f"run.output_dir={out}"]:
        argv += ["--set", s]
    (out.parent / "cfg.yaml").write_text("model:\n  name: tiny\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_rollout(proc: subprocess.Popen, out: Path) -> None:
    """Until the trainer has started (its config is written), then a moment into the rollout."""
    deadline = time.monotonic() + 120
    while not (out / "config.yaml").is_file():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the trainer did not start"
        time.sleep(0.2)
    time.sleep(2.0)


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_a_signal_mid_rollout_checkpoints_and_exits_0(tmp_path, signum):
    out = tmp_path / "run"
    proc = _start(out)
    _wait_for_rollout(proc, out)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)  # a whole step would take far longer
    assert proc.returncode == 0, err
    assert f"signal {int(signum)}: step" in err and "discarded mid-rollout" in err, err
    assert "Traceback" not in err
    assert (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir())


def test_a_second_signal_exits_at_once_without_a_trace(tmp_path):
    out = tmp_path / "run"
    proc = _start(out)
    _wait_for_rollout(proc, out)
    # Signals that arrive before Python runs the first one's handler merge into one (on a loaded
    # machine the main thread can sit in one C call for longer than any fixed pause), so keep
    # signalling until the process is gone: whichever signal the handler sees second is the test.
    deadline = time.monotonic() + 60
    proc.send_signal(signal.SIGTERM)
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the process outlived a minute of signals"
        time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "Aborted" not in err and "core dumped" not in err
    if proc.returncode == -signal.SIGTERM:
        # The run wound down between two signals and the next one landed while the interpreter
        # finalized, where Python has restored the default action. The process had already stopped
        # cleanly, which is what the second signal asks for.
        assert "saved checkpoint" in err, err
        return
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "second signal 15: exiting without a checkpoint" in err


def _after_a_sigterm(fn):
    """``fn`` that first sends this process SIGTERM (the trainer's handler runs in the main thread)."""

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return fn(*args, **kwargs)

    return signalled


def test_a_signal_during_a_periodic_evaluation_records_no_cut_short_result(tmp_path, monkeypatch, caplog):
    """The evaluation that a stop cuts short is not the policy's accuracy: nothing is recorded at
    that step, so the caller's own evaluation after the stop (``flowgrpo train``'s final one) runs
    on the checkpointed policy with the stop cleared."""
    from flowgrpo.runs.rundir import RunDir
    from flowgrpo.training import trainer as trainer_module

    real = trainer_module.evaluate
    t = make_trainer(tmp_path, "train.steps=3", "run.eval_every=1", "run.eval_n=4", "run.save_every=0")
    monkeypatch.setattr(trainer_module, "evaluate", _after_a_sigterm(real))
    result = t.train()
    assert result["status"] == "interrupted" and t.step == 1
    assert "the evaluation at step 1 was cut short and is not recorded" in caplog.text
    assert RunDir(t.out).find_eval("step1") is None
    monkeypatch.setattr(trainer_module, "evaluate", real)
    after = t.evaluate(n=4, label="step1", record=True)  # what the pipeline runs next
    assert after.n == 4 and "error" not in after.terminations, after.terminations
    assert RunDir(t.out).find_eval("step1") is not None
    assert (t.out / "checkpoints").is_dir()


def test_a_signal_during_the_final_evaluation_loses_only_that_evaluation(tmp_path, monkeypatch, caplog):
    """After the last step's checkpoint, a signal cuts the main job's final evaluation short:
    nothing is recorded, the job ends as interrupted and says how to evaluate the checkpoint; a
    signal there no longer kills the process with the default action."""
    from flowgrpo.runs.rundir import RunDir
    from flowgrpo.training import trainer as trainer_module

    t = make_trainer(tmp_path, "train.steps=2", "run.save_every=0")
    t.train(until_step=1)  # a first piece of the run, as a resumed job would have done
    monkeypatch.setattr(trainer_module, "evaluate", _after_a_sigterm(trainer_module.evaluate))
    out = _run_job(t)
    assert out["train"]["status"] == "interrupted" and out["after"] is None and t.step == 2
    assert "the final evaluation was cut short and is not recorded" in caplog.text
    assert "run.resume=true" in caplog.text
    assert RunDir(t.out).find_eval("step2") is None
    assert (t.out / "checkpoints" / "step_000002").is_dir()


# The replay tests' tiny calculator run (a short warm start), one demonstration per supervised batch
# so that a stop lands between batches, and no replay.
WARM = [*SMALL, "sft.batch_trajectories=1", "sft.replay_coef=0"]


def _warm_job(tmp_path, *overrides: str):
    from flowgrpo.config import load_config
    from flowgrpo.training.trainer import Trainer

    return Trainer(load_config(CALCULATOR, [*WARM, f"run.output_dir={tmp_path / 'run'}", *overrides]))


def _run_job(trainer, eval_n: int = 4) -> dict:
    from flowgrpo.training.pipeline import _train_and_evaluate

    return _train_and_evaluate(
        trainer, trainer.cfg, time.monotonic(), eval_n=eval_n, untrained_n=0, report=False
    )


def test_a_signal_during_the_warm_start_stops_the_job_without_a_checkpoint(tmp_path, monkeypatch, caplog):
    """The supervised epochs stop between batches: the job ends as interrupted (exit 0) and
    saves nothing, so the same command starts the warm start again."""
    from flowgrpo.training import sft

    t = _warm_job(tmp_path)
    monkeypatch.setattr(sft, "action_logprobs", _after_a_sigterm(sft.action_logprobs))
    out = _run_job(t)
    assert out["train"]["status"] == "interrupted" and out["warm"] is None and t.step == 0
    assert not t.counters["sft_done"]
    assert "signal 15: the warm start was cut short; nothing is saved" in caplog.text
    assert not (t.out / "checkpoints").is_dir() or not any((t.out / "checkpoints").glob("step_*"))


def test_trainer_train_runs_a_pending_warm_start_under_its_signal_handlers(tmp_path, monkeypatch, caplog):
    """A library caller's ``Trainer.train()`` runs the warm start itself: a signal during its
    supervised epochs returns ``interrupted`` at step 0 (no default kill, nothing saved), and the
    same call on a fresh trainer warm-starts, checkpoints step 0 and trains."""
    from flowgrpo.runs.rundir import RunDir
    from flowgrpo.training import sft

    t = _warm_job(tmp_path)
    real = sft.action_logprobs
    monkeypatch.setattr(sft, "action_logprobs", _after_a_sigterm(real))
    assert t.train() == {"status": "interrupted", "step": 0}
    assert not t.counters["sft_done"] and RunDir(t.out).latest_checkpoint() is None
    assert "signal 15: the warm start was cut short; nothing is saved" in caplog.text
    del t

    monkeypatch.setattr(sft, "action_logprobs", real)
    t = _warm_job(tmp_path)
    assert t.train()["status"] == "finished" and t.counters["sft_done"] and t.step == 1
    assert [c.step for c in RunDir(t.out).checkpoints()] == [0, 1]  # step 0: the warm start


def test_a_signal_during_the_warm_evaluation_keeps_the_warm_start_and_resume_evaluates_it(
    tmp_path, monkeypatch, caplog
):
    """The step-0 checkpoint is written before the warm start's evaluation: a stop there loses
    only the evaluation, and the resumed job runs it (without a second warm start) before RL."""
    from flowgrpo.runs.rundir import RunDir
    from flowgrpo.training import trainer as trainer_module

    real = trainer_module.evaluate
    t = _warm_job(tmp_path)
    monkeypatch.setattr(trainer_module, "evaluate", _after_a_sigterm(real))
    out = _run_job(t)
    assert out["train"]["status"] == "interrupted" and out["warm"] is None and t.step == 0
    assert "the warm start's evaluation was cut short and is not recorded" in caplog.text
    assert "run.resume=true" in caplog.text
    assert RunDir(t.out).find_eval("warm") is None and RunDir(t.out).latest_checkpoint() is not None
    del t

    monkeypatch.setattr(trainer_module, "evaluate", real)
    resumed = _warm_job(tmp_path, "run.resume=true")
    assert resumed.step == 0 and resumed.counters["sft_done"]
    monkeypatch.setattr(resumed, "warm_start", lambda: pytest.fail("the warm start ran twice"))
    out = _run_job(resumed)
    assert out["train"]["status"] == "finished" and resumed.step == 1
    assert out["warm"] is not None and out["warm"].n == 4 and out["after"] is not None
    assert RunDir(resumed.out).find_eval("warm") is not None


def test_a_signal_while_the_replay_is_built_stops_before_the_first_step(tmp_path, monkeypatch, caplog):
    """``sft.replay_coef`` regenerates the warm start's demonstrations before RL starts: a signal
    then no longer takes the default action (the process killed) but stops the run cleanly, with
    the step it stands at checkpointed."""
    from flowgrpo.training import trainer as trainer_module

    t = _warm_job(tmp_path, "sft.replay_coef=0.3", "sft.replay_trajectories=2")
    t.warm_start()
    monkeypatch.setattr(trainer_module, "build_replay", _after_a_sigterm(trainer_module.build_replay))
    result = t.train()
    assert result["status"] == "interrupted" and t.step == 0
    assert "signal 15: step 1 discarded mid-rollout" in caplog.text
    assert (t.out / "checkpoints" / "step_000000").is_dir()
