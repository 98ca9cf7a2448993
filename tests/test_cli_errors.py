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
