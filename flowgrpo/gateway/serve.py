"""``flowgrpo serve``: load a policy and serve it over the OpenAI-compatible API of
:mod:`flowgrpo.gateway.app` (Starlette under uvicorn), optionally recording episodes.

The HTTP app itself lives in :mod:`flowgrpo.gateway` because the trainer serves its own policy
through it too (``rollout.source: gateway``); this module is the command: load the model, build
the backend, bind, serve until interrupted. ``make_server`` and ``serve_in_thread`` are re-exported
here, where callers have always imported them.
"""

from __future__ import annotations

from flowgrpo.gateway.app import FlowGRPOServer, PolicyServer, make_server, serve_in_thread


def main(
    model: str,
    *,
    host: str,
    port: int,
    autocast: str | None,
    max_batch_size: int,
    model_name: str | None,
    step: int | None = None,
    api_key: str | None = None,
    max_request_bytes: int | None = None,
    record: str | None = None,
    max_episode_turns: int = 64,
    max_episode_tokens: int = 8192,
    device: str = "auto",
) -> int:
    """Entry point of ``flowgrpo serve``: load ``model`` (a run directory's checkpoint, an exported
    directory, a model name) on ``device`` and serve until interrupted."""
    from flowgrpo.gateway.app import DEFAULT_MAX_REQUEST_BYTES
    from flowgrpo.gateway.recorder import EpisodeRecorder, RecorderLimits
    from flowgrpo.rollout.backends.hf import HFBackend
    from flowgrpo.runs.export import load_served_policy

    m, tok = load_served_policy(model, step=step, device=device)
    backend = HFBackend(m, tok, max_batch_size=max_batch_size, autocast_dtype=autocast)
    recorder = None
    if record:
        limits = RecorderLimits(max_turns=max_episode_turns, max_context_tokens=max_episode_tokens)
        recorder = EpisodeRecorder(record, limits)
    server = make_server(
        backend,
        tok,
        model_name=model_name or model,
        host=host,
        port=port,
        api_key=api_key,
        max_request_bytes=max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
        recorder=recorder,
    )
    print(f"flowgrpo serve: {model} at {server.url}/v1", flush=True)
    if record:
        print(f"flowgrpo serve: recording episodes into {record}/trajectories/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if recorder is not None:  # what was left open is written, excluded, never lost
            recorder.end_open("server stopped before the episode's reward")
    return 0


__all__ = ["FlowGRPOServer", "PolicyServer", "main", "make_server", "serve_in_thread"]
