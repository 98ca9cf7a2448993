"""The episode layer: running multi-turn episodes of a policy against environments and tools.

- :mod:`~flowgrpo.rollout.engine`: the async episode loop and the scheduler that batches generation.
- :mod:`~flowgrpo.rollout.backends`: where tokens come from (``hf``, ``openai``, ``vllm``).
- :mod:`~flowgrpo.rollout.agentflow`: AgentFlow's planner / executor / verifier / generator agent.

May import: :mod:`flowgrpo.env`, :mod:`flowgrpo.chat`, :mod:`flowgrpo.modeling`, :mod:`flowgrpo.tool`,
:mod:`flowgrpo.sandbox`, :mod:`flowgrpo.algorithms`, :mod:`flowgrpo.utils`, :mod:`flowgrpo.types`.
"""
