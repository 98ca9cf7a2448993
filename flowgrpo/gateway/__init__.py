"""The gateway: a policy behind an OpenAI-compatible HTTP API (Starlette under uvicorn) that
agent programs the project does not own call, and that can record their episodes as trajectories.

- :mod:`~flowgrpo.gateway.app`: the server (completions, chat, weight loading; safety limits).
- :mod:`~flowgrpo.gateway.openai_request`: each request parameter implemented or refused.
- :mod:`~flowgrpo.gateway.toplogprobs`: the ``logprobs`` / ``top_logprobs`` fields.

Why a layer of its own, below ``training | serving``: the ``flowgrpo serve`` command (serving) and
the trainer's gateway rollouts (training, ``rollout.source: gateway``) both run this server, and
those two siblings may not import each other.

May import: :mod:`flowgrpo.runs` and every layer below it; never :mod:`flowgrpo.training` or
:mod:`flowgrpo.serving`.
"""
