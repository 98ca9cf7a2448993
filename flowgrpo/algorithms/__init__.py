"""The algorithms: pure functions of tensors and of the data model, nothing else.

- :mod:`~flowgrpo.algorithms.advantages`: the group estimators (Flow-GRPO, Dr.GRPO, RLOO, GiGPO).
- :mod:`~flowgrpo.algorithms.loss`: the clipped surrogate, the KL estimators, loss aggregation.
- :mod:`~flowgrpo.algorithms.ppo`: multi-turn GAE over the action tokens (the PPO baseline).
- :mod:`~flowgrpo.algorithms.episodes`: episode-level rules between scoring and advantages.
- :mod:`~flowgrpo.algorithms.curriculum`: which tasks a step samples.
- :mod:`~flowgrpo.algorithms.stats`: intervals and paired tests for accuracy claims.

May import: :mod:`flowgrpo.types`, torch, pydantic. Formulas and references: ``docs/algorithms.md``.
"""
