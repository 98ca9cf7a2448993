"""Training: the loop that turns episodes into updates, and everything it needs around it.

- :mod:`~flowgrpo.training.trainer`: the RL loop (sample, score, advantages, update, log, save).
- :mod:`~flowgrpo.training.sft`: the supervised warm start.
- :mod:`~flowgrpo.training.batching`: trajectories packed into rows and micro-batches.
- :mod:`~flowgrpo.training.optim`: the optimizer and its schedule.
- :mod:`~flowgrpo.training.loss_scale`: dynamic loss scaling for a float16 update.
- :mod:`~flowgrpo.training.value`: PPO's critic.
- :mod:`~flowgrpo.training.resume`: picking up a run from its last checkpoint.
- :mod:`~flowgrpo.training.distributed`, :mod:`~flowgrpo.training.fsdp`: torchrun, DDP and FSDP2.
- :mod:`~flowgrpo.training.async_rollout`: rollouts one step ahead, with a staleness bound.
- :mod:`~flowgrpo.training.idle`: saying so when steps train nothing.
- :mod:`~flowgrpo.training.pipeline`: the main job (evaluate, train, evaluate, report).
- :mod:`~flowgrpo.training.debug`: rollout-only and overfit-one-batch modes.

May import: :mod:`flowgrpo.gateway` and every layer below it.
"""
