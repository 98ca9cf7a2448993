"""``flowgrpo serve``: a policy behind an OpenAI-compatible HTTP API, with weight sync.

- :mod:`~flowgrpo.serving.serve`: the server.
- :mod:`~flowgrpo.serving.openai_request`: each request parameter implemented or refused.
- :mod:`~flowgrpo.serving.toplogprobs`: the ``logprobs`` / ``top_logprobs`` fields.

May import: :mod:`flowgrpo.runs` and every layer below it; never :mod:`flowgrpo.training`.
"""
