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
    with pytest.raises(ConfigError, match=r"algorithm\.loss"):
        load_config(None, ["algorithm.loss=gpso"])
    with pytest.raises(
        ConfigError,
        match=r"algorithm\.dual_clip=3\.0 applies to algorithm\.loss=ppo_clip only, not algorithm\.loss=cispo",
    ):
        load_config(None, ["algorithm.loss=cispo", "algorithm.dual_clip=3"])


@pytest.fixture
def trainer(tmp_path):
    from tests.toy import make_trainer

    def make(*overrides: str):
        return make_trainer(tmp_path, "train.steps=1", "run.save_every=0", *overrides)

    return make


@pytest.mark.parametrize("kind", ["gspo", "cispo"])
def test_sequence_losses_run_an_update(trainer, kind):
    import math

    tr = trainer(f"algorithm.loss={kind}", "algorithm.agg=turn_mean")
    m = tr.train_step()
    assert m["optimizer_steps"] == 1.0 and math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])


def test_overlong_and_exclusion_config():
    cfg = load_config(None, ["rollout.max_turns=2", "rollout.max_new_tokens=64"])
    assert cfg.action_token_budget == 128 and cfg.algorithm.overlong.buffer_len == 0
    assert load_config(None, ["algorithm.overlong.max_tokens=300"]).action_token_budget == 300
    with pytest.raises(
        ConfigError, match="buffer_len=128 must be smaller than the trajectory's action-token"
    ):
        load_config(
            None, ["rollout.max_turns=2", "rollout.max_new_tokens=64", "algorithm.overlong.buffer_len=128"]
        )
    cfg = load_config(None, ["algorithm.exclude_terminations=[error, context_overflow]"])
    assert [t.value for t in cfg.algorithm.exclude_terminations] == ["error", "context_overflow"]
    with pytest.raises(ConfigError, match="exclude_terminations"):
        load_config(None, ["algorithm.exclude_terminations=[eror]"])
    with pytest.raises(ConfigError, match="would drop every episode that ended normally"):
        load_config(None, ["algorithm.exclude_terminations=[finished]"])


def test_trainer_applies_overlong_rules_and_exclusion(trainer):
    # max_new_tokens=2, max_turns=1: every episode's 2 tokens hit the budget of 2
    tr = trainer("algorithm.overlong.buffer_len=1", "algorithm.overlong.penalty_factor=0.5")
    groups = tr._rollout(2)
    for g in groups:
        for t in g.trajectories:
            n = t.num_action_tokens
            assert t.reward_breakdown["overlong"] == (-0.5 if n == 2 else 0.0)
    tr = trainer("algorithm.overlong.mask_truncated=true")
    m = tr.train_step()
    assert m["episodes_masked_truncated"] == m["episodes"] and m["optimizer_steps"] == 0.0
    tr = trainer("algorithm.exclude_terminations=[max_tokens]")
    m = tr.train_step()
    assert m["episodes_excluded"] == m.get("termination/max_tokens", 0.0)


def test_entropy_options(trainer):
    with pytest.raises(ConfigError, match="entropy_top_q"):
        load_config(None, ["algorithm.entropy_top_q=1.5"])
    with pytest.raises(ConfigError, match="entropy_coef"):
        load_config(None, ["algorithm.entropy_coef=-0.1"])
    tr = trainer("algorithm.entropy_coef=0.01", "algorithm.entropy_top_q=0.2")
    m = tr.train_step()
    assert m["optimizer_steps"] == 1.0 and "entropy" in m
    assert 0.0 < m["pg_token_frac"] <= 0.5  # about the top fifth (ties at the threshold included)
