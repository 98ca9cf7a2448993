"""Agent programs for tests/test_gateway_training.py, run by the trainer's gateway rollout as
``python -m flowgrpo.gateway.run_callable gateway_test_agents:FUNCTION`` (tests/ on PYTHONPATH)."""

from __future__ import annotations

import time

import openai

from flowgrpo.gateway.client import EpisodeContext


def by_index(ctx: EpisodeContext) -> float:
    """Episode ``...-0`` answers (reward 1), ``-1`` crashes after a model call, ``-2`` hangs."""
    index = ctx.episode_id.rsplit("-", 1)[1]
    if index == "2":
        time.sleep(600)
    client = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
    client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": ctx.task["prompt"]}], max_tokens=4
    )
    if index == "1":
        raise RuntimeError("the agent's own bug")
    return 1.0
