"""What an agent program needs to take part in gateway training, without importing anything heavy.

The trainer (``rollout.source: gateway``) starts each agent program with its episode in the
environment (:data:`ENV_VARS`); an agent built on the ``openai`` client or LangChain reads
``OPENAI_BASE_URL`` (which already routes its calls to its episode) and ``OPENAI_API_KEY`` as it
always does, and calls :func:`post_reward` once it has scored its answer.

    from flowgrpo.gateway.client import EpisodeContext, post_reward

    ctx = EpisodeContext.from_env()          # url, episode id, task (prompt, answer, metadata)
    ...run the agent against ctx.base_url...
    post_reward(1.0 if correct else 0.0, {"accuracy": float(correct)})
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

ENV_VARS = {
    "FLOWGRPO_GATEWAY_URL": "the gateway's root, e.g. http://127.0.0.1:8000",
    "FLOWGRPO_EPISODE_ID": "this episode's id",
    "FLOWGRPO_TASK_ID": "the task's id (episodes of one task form a GRPO group)",
    "FLOWGRPO_TASK": "the task as JSON: {id, prompt, answer, metadata}",
    "FLOWGRPO_API_KEY": "the gateway's bearer token ('unused' when it has none)",
    "OPENAI_BASE_URL": "FLOWGRPO_GATEWAY_URL/episodes/EPISODE_ID/v1: every call of this agent is recorded",
    "OPENAI_API_KEY": "the same as FLOWGRPO_API_KEY",
}
"""What the trainer puts in an agent program's environment."""


class GatewayClientError(RuntimeError):
    """The gateway refused a call; the message is the gateway's own."""


@dataclass
class EpisodeContext:
    """One episode as an agent program sees it."""

    gateway_url: str
    episode_id: str
    task_id: str = ""
    task: dict[str, Any] = field(default_factory=dict)
    api_key: str = "unused"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL that records every call into this episode."""
        return f"{self.gateway_url}/episodes/{self.episode_id}/v1"

    @property
    def headers(self) -> dict[str, str]:
        """Headers that tie a call to this episode when the base URL cannot carry it."""
        return {"X-Episode-Id": self.episode_id, "X-Task-Id": self.task_id}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EpisodeContext:
        env = os.environ if environ is None else environ
        missing = [k for k in ("FLOWGRPO_GATEWAY_URL", "FLOWGRPO_EPISODE_ID") if not env.get(k)]
        if missing:
            raise GatewayClientError(
                f"{', '.join(missing)} not set: this program is meant to be started by flowgrpo's trainer "
                "(rollout.source: gateway), which sets them; set them by hand to run it against "
                "`flowgrpo serve --record`"
            )
        task = json.loads(env.get("FLOWGRPO_TASK") or "{}")
        return cls(
            gateway_url=env["FLOWGRPO_GATEWAY_URL"].rstrip("/"),
            episode_id=env["FLOWGRPO_EPISODE_ID"],
            task_id=env.get("FLOWGRPO_TASK_ID", task.get("id", "")),
            task=task,
            api_key=env.get("FLOWGRPO_API_KEY") or "unused",
        )


def post_reward(
    reward: float,
    breakdown: Mapping[str, float] | None = None,
    *,
    episode_id: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    task_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Close an episode with its reward (``POST /v1/episodes/{id}/reward``) and return the gateway's
    summary (turns, termination, policy version). Without arguments the episode, URL and key come
    from the environment the trainer set (:meth:`EpisodeContext.from_env`); ``base_url`` may be the
    gateway's root or its ``.../v1``."""
    if episode_id is None or base_url is None:
        ctx = EpisodeContext.from_env()
        episode_id = episode_id or ctx.episode_id
        base_url = base_url or ctx.gateway_url
        api_key = api_key or ctx.api_key
    root = base_url.rstrip("/").removesuffix("/v1")
    body: dict[str, Any] = {"reward": float(reward), "breakdown": dict(breakdown or {})}
    if task_id:
        body["task_id"] = task_id
    if metadata:
        body["metadata"] = dict(metadata)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key and api_key != "unused" else {}
    r = httpx.post(f"{root}/v1/episodes/{episode_id}/reward", json=body, headers=headers, timeout=timeout_s)
    if r.status_code != 200:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text
        raise GatewayClientError(f"the gateway refused the reward (HTTP {r.status_code}): {message}")
    return r.json()


__all__ = ["ENV_VARS", "EpisodeContext", "GatewayClientError", "post_reward"]
