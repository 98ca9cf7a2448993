"""Config fields of the optional algorithm knobs: validation errors say how to fix the value, and
each option reaches the update (tiny model; the maths is tested by hand in test_loss.py /
test_advantages.py)."""

from __future__ import annotations

import pytest

from flowgrpo.config import ConfigError, TrainConfig, load_config


def test_defaults_are_todays_behaviour():
    a = TrainConfig().algorithm
    assert a.loss == "ppo_clip"


def test_loss_choices_and_dual_clip_rule():
    assert load_config(None, ["algorithm.loss=gspo"]).algorithm.loss == "gspo"
    with pytest.raises(ConfigError, match="algorithm.loss"):
        load_config(None, ["algorithm.loss=gpso"])
    with pytest.raises(ConfigError, match="dual_clip applies to loss=ppo_clip only"):
        load_config(None, ["algorithm.loss=cispo", "algorithm.dual_clip=3"])


@pytest.fixture
def trainer(tmp_path):
    from test_trainer import make_trainer

    def make(*overrides: str):
        return make_trainer(tmp_path, "train.steps=1", "run.save_every=0", *overrides)

    return make


@pytest.mark.parametrize("kind", ["gspo", "cispo"])
def test_sequence_losses_run_an_update(trainer, kind):
    import math

    tr = trainer(f"algorithm.loss={kind}", "algorithm.agg=turn_mean")
    m = tr.train_step()
    assert m["optimizer_steps"] == 1.0 and math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
