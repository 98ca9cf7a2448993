"""Config errors point TRL and verl names at ours instead of aliasing them silently."""

from __future__ import annotations

import pytest

from flowgrpo.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("override", "ours"),
    [
        ("train.learning_rate=1e-5", "train.lr"),
        ("num_generations=8", "train.group_size"),
        ("algorithm.beta=0.04", "algorithm.kl_coef"),
        ("algorithm.loss_type=dr_grpo", "algorithm.agg"),
        ("rollout.max_completion_length=256", "rollout.max_new_tokens"),
        ("algorithm.estimator=grpo", "flow_grpo"),
        ("algorithm.agg=dr_grpo", "seq_mean_token_sum_norm"),
        ("algorithm.kl_estimator=low_var_kl", "k3"),
    ],
)
def test_a_trl_or_verl_name_points_to_ours(override, ours):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert ours in str(err.value) and "TRL/verl" in str(err.value)


def test_a_plain_typo_still_gets_did_you_mean():
    with pytest.raises(ConfigError, match=r"did you mean 'train\.group_size'"):
        load_config(None, ["train.group_sise=4"])
