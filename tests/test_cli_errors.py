"""Config and command-line mistakes are one line on stderr and exit status 2, never a traceback
or a silent default run."""

from __future__ import annotations

import pytest

from flowgrpo.cli import main


def _fails(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    out = capsys.readouterr().err.strip()
    err = out.splitlines()[-1]  # after flowgrpo's own progress log lines, if any
    assert e.value.code == 2 and err.startswith("error: "), out
    assert "Traceback" not in out and "error:" not in out[: -len(err)], out
    return err


def _train(path, *sets: str) -> list[str]:
    argv = ["train", str(path), "--eval-n", "0", "--no-report"]
    for s in sets:
        argv += ["--set", s]
    return argv


def test_an_empty_config_file_is_an_error(tmp_path, capsys):
    cfg = tmp_path / "empty.yaml"
    cfg.write_text("")
    err = _fails(capsys, _train(cfg, f"run.output_dir={tmp_path / 'out'}"))
    assert f"{cfg} is empty" in err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_group_size_one_is_an_error_for_group_estimators(tmp_path, capsys):
    cfg = tmp_path / "g1.yaml"
    cfg.write_text("train:\n  group_size: 1\n")
    err = _fails(capsys, _train(cfg))
    assert "train.group_size=1 leaves every episode alone in its group" in err


def test_an_unknown_environment_lists_the_registered_ones(tmp_path, capsys):
    cfg = tmp_path / "env.yaml"
    cfg.write_text("env:\n  name: arithmetik\n")
    err = _fails(capsys, _train(cfg, "model.name=tiny"))
    assert "unknown environment 'arithmetik'; did you mean 'arithmetic'?" in err
    assert "registered: " in err and "multihop" in err


def test_an_unknown_model_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "model.yaml"
    cfg.write_text("model:\n  name: no-such-model\n")
    err = _fails(capsys, _train(cfg))
    assert "'no-such-model' is not an embedded model (['smollm2-135m'" in err


def test_an_unwritable_output_directory_names_path_and_errno(tmp_path, capsys):
    cfg = tmp_path / "ro.yaml"
    cfg.write_text("model:\n  name: tiny\n")
    err = _fails(capsys, _train(cfg, "run.output_dir=/sys/flowgrpo-run"))  # read-only, even for root
    assert "cannot write /sys/flowgrpo-run" in err and "[Errno" in err


@pytest.mark.parametrize(
    ("argv_sets", "expected"),
    [
        (["model.device=cuda"], "model.device=cuda: this torch"),  # CPU-only here (tests see no GPU)
        (["model.device=cuda:1"], "model.device=cuda:1: this torch"),
        (["model.device=gpu"], "unknown device 'gpu'; did you mean 'cuda'?"),
    ],
)
def test_a_device_this_machine_lacks_says_how_to_get_one(tmp_path, capsys, argv_sets, expected):
    cfg = tmp_path / "dev.yaml"
    cfg.write_text("model:\n  name: tiny\n")
    err = _fails(capsys, _train(cfg, f"run.output_dir={tmp_path / 'out'}", *argv_sets))
    assert expected in err
    if "this torch" in expected:
        assert "model.device=cpu (or auto)" in err
    assert not (tmp_path / "out" / "checkpoints").exists()  # nothing trained


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A config, a run directory (config.yaml, checkpoints/ with one checkpoint directory) and an
    empty directory: enough for the command line to resolve what it was given."""
    from flowgrpo.config import dump_config, load_config

    root = tmp_path_factory.mktemp("cli")
    cfg = root / "tiny.yaml"
    cfg.write_text(
        "model: {name: tiny, autocast: null}\ntrain: {steps: 1, tasks_per_step: 2, group_size: 2}\n"
        f"rollout: {{max_turns: 1, max_new_tokens: 8}}\nrun: {{output_dir: {root / 'out'}}}\n"
    )
    run = root / "run"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / "state.pt").write_bytes(b"")
    dump_config(load_config(cfg, [f"run.output_dir={run}"]), run / "config.yaml")
    (root / "empty").mkdir()
    return {
        "cfg": str(cfg),
        "run": str(run),
        "ckpt": str(run / "checkpoints" / "step_000001"),
        "root": str(root),
    }


# (argv with {cfg}/{run}/{ckpt}/{root} placeholders, what the one line on stderr must say)
BAD_INVOCATIONS = [
    (["eval", "{root}/runs/nope"], "no run directory, model directory, checkpoint or config file at"),
    (["eval", "{root}/empty"], "is neither a run directory (no config.yaml) nor a model directory"),
    (
        ["eval", "{ckpt}"],
        "is a checkpoint, not a run: evaluate it with flowgrpo eval {run} --checkpoint {ckpt}",
    ),
    (["eval", "{run}", "--n", "0"], "argument --n: 0 is below 1"),
    (["eval", "{run}", "--samples", "-1"], "argument --samples: -1 is below 0"),
    (["eval", "{run}", "--n", "2", "--checkpoint", "{root}/nope"], "no checkpoint at {root}/nope"),
    (["train", "{cfg}", "--eval_n", "0"], "unrecognized arguments: --eval_n (did you mean --eval-n?)"),
    (["train", "{cfg}", "--eval-n", "-1"], "argument --eval-n: -1 is below 0"),
    (["nosuchcmd"], "invalid choice: 'nosuchcmd'"),
    (["serve", "--model", "tiny", "--port", "99999"], "99999 is not a TCP port"),
    (["replay", "{run}", "--env-kwargs", "{{bad"], "is not JSON"),
    (["replay", "{run}", "--limit", "x"], "argument --limit: 'x' is not an integer"),
    (
        ["train", "{cfg}", "--set", "train.async_staleness=1", "--set", "algorithm.tis=off"],
        "train.async_staleness=1 trains on samples of older",
    ),
    (
        ["train", "{cfg}", "--set", "rollout.backend=openai"],
        "rollout.backend=openai needs the server's address",
    ),
    (["train", "{cfg}", "--set", "model=tiny"], "model is a section, not a value"),
    (["train", "{cfg}", "--set", "train.lr=[1,"], "the value is not valid YAML (line 1, column 4"),
    (
        ["train", "{cfg}", "--set", "rewards.0.name=nosuch"],
        "rewards: unknown reward 'nosuch'; known: accuracy",
    ),
    (["train", "{cfg}", "--set", "rewards.0.kwargs.nosuch=1"], "got an unexpected keyword argument 'nosuch'"),
    (
        ["train", "{cfg}", "--set", "env.kwargs.nosuch=1"],
        "env.kwargs: environment 'arithmetic' does not take",
    ),
    (["train", "{cfg}", "--set", "env.name=flowgrpo_no_such_module:Env"], "cannot import module"),
    (["train", "{run}", "--set", "run.resume={root}/nope"], "no checkpoint at {root}/nope"),
    (
        [
            "train",
            "{cfg}",
            "--set",
            "algorithm.name=ppo",
            "--set",
            "algorithm.ppo.value_model_path={root}/nope",
        ],
        "algorithm.ppo.value_model_path='{root}/nope' is not a local Hugging Face model directory",
    ),
    pytest.param(
        ["train", "{cfg}", "--set", "rollout.backend=vllm"],
        "the vllm backend needs vLLM",
        marks=pytest.mark.skipif(_has("vllm"), reason="vLLM is installed here"),
    ),
    pytest.param(
        ["train", "{cfg}", "--set", "run.log_to=[jsonl, wandb]"],
        "run.log_to contains wandb, which is not installed",
        marks=pytest.mark.skipif(_has("wandb"), reason="wandb is installed here"),
    ),
]


@pytest.mark.parametrize(
    ("argv", "expected"), BAD_INVOCATIONS, ids=lambda v: " ".join(v)[:50] if isinstance(v, list) else None
)
def test_bad_invocations_are_one_line_and_exit_2(argv, expected, dirs, capsys):
    argv = [a.format(**dirs) for a in argv]
    if argv[0] == "train" and "--eval_n" not in argv:
        argv += ["--eval-n", "0", "--no-report"]
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0], err
    assert expected.format(**dirs) in lines[0], lines[0]
