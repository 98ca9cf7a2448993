"""The gateway: a policy behind an OpenAI-compatible HTTP API (Starlette under uvicorn) that
agent programs the project does not own call, and that can record their episodes as trajectories.

- :mod:`~flowgrpo.gateway.serve`: the ``flowgrpo serve`` command (load a model, serve it).
- :mod:`~flowgrpo.gateway.app`: the server (completions, chat, weight loading; safety limits).
- :mod:`~flowgrpo.gateway.agent_chat`: chat with tools through the chat layer, recorded per episode.
- :mod:`~flowgrpo.gateway.openai_request`: each request parameter implemented or refused.
- :mod:`~flowgrpo.gateway.sampling`: a request's sampling settings, stop strings and ``usage``.
- :mod:`~flowgrpo.gateway.errors`: refusals as OpenAI-style error bodies.
- :mod:`~flowgrpo.gateway.rwlock`: requests read the served weights together, a weight load alone.
- :mod:`~flowgrpo.gateway.toplogprobs`: the ``logprobs`` / ``top_logprobs`` fields.
- :mod:`~flowgrpo.gateway.recorder`: agent episodes recorded as token-exact trajectories.
- :mod:`~flowgrpo.gateway.agents`: agent programs run once per episode (``rollout.source: gateway``).
- :mod:`~flowgrpo.gateway.client`, :mod:`~flowgrpo.gateway.run_callable`: what an agent program uses.

The trainer (``rollout.source: gateway``) runs the same server: this layer sits below training.

May import: :mod:`flowgrpo.runs` and every layer below it; never :mod:`flowgrpo.training`.
"""
