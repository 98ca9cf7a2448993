"""``flowgrpo serve``: a policy behind an OpenAI-compatible HTTP API, with weight sync.

- :mod:`~flowgrpo.serving.serve`: the command (load a model, serve it until interrupted).

The HTTP app, the request parameters and the recording of agent episodes are in
:mod:`flowgrpo.gateway`, which the trainer uses too.

May import: :mod:`flowgrpo.gateway` and every layer below it; never :mod:`flowgrpo.training`.
"""
