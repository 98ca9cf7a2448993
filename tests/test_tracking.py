"""run.log_to: the step scalars of metrics.jsonl mirrored to TensorBoard, read back from the event
file; trackers that are not installed give an install hint."""

from __future__ import annotations

import json
import sys

import pytest

from flowgrpo.config import ConfigError, load_config
from flowgrpo.runs.metrics import MetricsLogger
from flowgrpo.runs.tracking import make_sinks, scalars_of


def test_scalars_of_keeps_finite_numbers_only():
    m = {"a": 1, "b": 0.5, "c": float("nan"), "d": "text", "e": True, "f": float("inf")}
    assert scalars_of(m) == {"a": 1.0, "b": 0.5}


def test_tensorboard_gets_the_same_scalars_as_metrics_jsonl(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLogger(tmp_path / "metrics.jsonl", log_to=["jsonl", "tensorboard"])
    log.log(1, {"reward_mean": 0.25, "loss": -0.5, "note": "x"})
    log.log(2, {"reward_mean": 0.75, "loss": float("nan")})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward_mean"] for r in rows] == [0.25, 0.75]
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"reward_mean", "loss"}
    assert [(e.step, e.value) for e in acc.Scalars("reward_mean")] == [(1, 0.25), (2, 0.75)]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, -0.5)]  # NaN is not plotted


def test_missing_tracker_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # an import of wandb now fails
    with pytest.raises(ImportError, match=r"pip install 'flowgrpo\[wandb\]'"):
        make_sinks(["jsonl", "wandb"], tmp_path)


def test_log_to_config():
    assert load_config(None, []).run.log_to == ["jsonl"]
    with pytest.raises(ConfigError, match=r"run\.log_to"):
        load_config(None, ["run.log_to=[tensorbord]"])
    with pytest.raises(ConfigError, match=r"run\.tensorboard was replaced by run\.log_to"):
        load_config(None, ["run.tensorboard=true"])
