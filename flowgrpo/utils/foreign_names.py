"""The names TRL and verl users type, pointed at ours in config errors (never silently aliased: the
meanings differ in details a one-word alias would hide, e.g. TRL's ``beta`` is a KL coefficient
on a different estimator default, and verl's ``rollout.n`` sits in another section).

``KEYS``: a foreign key -> our dotted key and what differs. ``VALUES``: a foreign value of one of
our keys -> the value that means the same here.
"""

from __future__ import annotations

from typing import Any

KEYS: dict[str, str] = {
    # TRL GRPOConfig
    "learning_rate": "train.lr",
    "num_generations": "train.group_size (episodes per task)",
    "beta": "algorithm.kl_coef (the KL penalty's weight; algorithm.kl_estimator picks k1/k2/k3)",
    "loss_type": "algorithm.agg (TRL grpo -> seq_mean_token_mean, dr_grpo -> seq_mean_token_sum_norm, "
    "dapo/bnpo -> token_mean) and algorithm.estimator",
    "max_completion_length": "rollout.max_new_tokens (per turn; rollout.max_context_tokens bounds an episode)",
    "max_prompt_length": "rollout.max_context_tokens",
    "num_iterations": "train.epochs_per_batch",
    "epsilon": "algorithm.clip_low",
    "epsilon_high": "algorithm.clip_high",
    "scale_rewards": "algorithm.estimator (false: grpo_dr, which drops the std)",
    "max_steps": "train.steps",
    "max_grad_norm": "train.grad_clip",
    "lr_scheduler_type": "train.lr_schedule (constant, linear, cosine)",
    "save_steps": "run.save_every",
    "model_name_or_path": "model.name",
    "temperature": "rollout.sampling.temperature",
    # verl
    "adv_estimator": "algorithm.estimator (verl grpo -> flow_grpo)",
    "kl_loss_coef": "algorithm.kl_coef",
    "kl_loss_type": "algorithm.kl_estimator (verl low_var_kl -> k3)",
    "loss_agg_mode": "algorithm.agg (verl token-mean -> token_mean, seq-mean-token-mean -> "
    "seq_mean_token_mean, seq-mean-token-sum-norm -> seq_mean_token_sum_norm)",
    "clip_ratio_low": "algorithm.clip_low",
    "clip_ratio_high": "algorithm.clip_high",
    "ppo_epochs": "train.epochs_per_batch",
    "response_length": "rollout.max_new_tokens",
    "total_training_steps": "train.steps",
    "n": "train.group_size (verl's rollout.n)",
}

VALUES: dict[tuple[str, str], str] = {
    ("estimator", "grpo"): "flow_grpo (GRPO's group-normalised outcome advantage, given to every turn)",
    ("estimator", "dr_grpo"): "grpo_dr",
    ("agg", "grpo"): "seq_mean_token_mean (TRL's loss_type grpo)",
    ("agg", "dr_grpo"): "seq_mean_token_sum_norm (TRL's loss_type dr_grpo)",
    ("agg", "dapo"): "token_mean",
    ("agg", "bnpo"): "token_mean",
    ("agg", "token-mean"): "token_mean",
    ("agg", "seq-mean-token-mean"): "seq_mean_token_mean",
    ("agg", "seq-mean-token-sum-norm"): "seq_mean_token_sum_norm",
    ("kl_estimator", "low_var_kl"): "k3",
    ("kl_estimator", "kl"): "k1",
    ("kl_estimator", "mse"): "k2",
}


def key_hint(key: str) -> str | None:
    """``"TRL/verl's learning_rate is train.lr here"`` for a foreign key, None for others."""
    ours = KEYS.get(key)
    return f"TRL/verl's {key!r} is {ours} here" if ours else None


def value_hint(key: str, value: Any) -> str | None:
    """The value of ``key`` that means what a foreign ``value`` means, None when there is none."""
    ours = VALUES.get((key, value)) if isinstance(value, str) else None
    return f"the TRL/verl value {value!r} is {ours} here" if ours else None


__all__ = ["KEYS", "VALUES", "key_hint", "value_hint"]
