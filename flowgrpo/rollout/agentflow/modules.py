"""The frozen modules' text generators: the policy under ``no_grad`` (through the rollout backend),
a frozen copy of it, another local model, or an OpenAI-compatible endpoint.

A module gets a system prompt, a user prompt and a reply prefix and returns its reply as text; its
tokens never enter a training row (only the planner's do), so a module may use any model and any
tokenizer. :func:`make_module` builds one from a :class:`~flowgrpo.rollout.agentflow.config.ModuleConfig`.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from flowgrpo.chat.format import ChatFormat
from flowgrpo.rollout.agentflow.config import ModuleConfig
from flowgrpo.rollout.backends.base import RolloutBackend, SamplingParams
from flowgrpo.types import Message


class ModuleReply(BaseModel):
    """What a module wrote (its prefix included) and what it cost."""

    model_config = ConfigDict(extra="forbid")
    text: str
    prompt_tokens: int = 0
    new_tokens: int = 0
    finish_reason: str = "stop"


@runtime_checkable
class TextModule(Protocol):
    """A frozen module: ``(system, user, prefix) -> reply`` whose text starts with ``prefix``."""

    async def reply(self, system: str, user: str, prefix: str) -> ModuleReply: ...


class BackendModule:
    """A module served by a token-level :class:`RolloutBackend` with its own tokenizer: the prompt
    is rendered with the chat template, the prefix appended after the generation prompt, and the
    continuation decoded. With the rollout's own ``hf`` backend this is the policy under
    ``no_grad`` (generation never builds a graph)."""

    def __init__(self, backend: RolloutBackend, tokenizer: Any, params: SamplingParams) -> None:
        self.backend, self.params = backend, params
        self.chat = ChatFormat(tokenizer)
        if not params.stop_token_ids:
            self.params = params.model_copy(update={"stop_token_ids": list(self.chat.end_of_turn_ids)})

    async def reply(self, system: str, user: str, prefix: str) -> ModuleReply:
        msgs = [Message(role="system", content=system), Message(role="user", content=user)]
        ids = self.chat.initial_ids(msgs) + (self.chat.encode(prefix) if prefix else [])
        res = (await self.backend.generate([ids], self.params))[0]
        body = list(res.token_ids)
        if body and body[-1] in self.chat.end_of_turn_ids:
            body = body[:-1]
        return ModuleReply(
            text=prefix + self.chat.decode(body),
            prompt_tokens=len(ids),
            new_tokens=len(res.token_ids),
            finish_reason=res.finish_reason,
        )


class ServerModule:
    """A module behind an OpenAI-compatible ``/chat/completions`` endpoint (text mode). Chat APIs
    cannot continue a prefix, so the prefix is put in front of a reply that does not start with it."""

    def __init__(self, client: Any, temperature: float, max_new_tokens: int) -> None:
        self.client, self.temperature, self.max_new_tokens = client, temperature, max_new_tokens

    async def reply(self, system: str, user: str, prefix: str) -> ModuleReply:
        msgs = [Message(role="system", content=system), Message(role="user", content=user)]
        text = await self.client.chat(msgs, temperature=self.temperature, max_tokens=self.max_new_tokens)
        if prefix and not text.lstrip().startswith(prefix.strip()):
            text = prefix + text
        return ModuleReply(text=text)


def make_module(
    cfg: ModuleConfig,
    *,
    policy: Any,
    tokenizer: Any,
    backend: RolloutBackend,
    autocast: str | None,
    shared: dict[str, tuple[RolloutBackend, Any]] | None = None,
) -> TextModule:
    """The module ``cfg`` describes; ``policy``/``tokenizer``/``backend`` are the run's own.
    ``shared`` holds the models already loaded for other modules (by source and model), so modules
    naming the same frozen model share one copy."""
    params = SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
    if cfg.source == "policy":
        return BackendModule(backend, tokenizer, params)
    if cfg.source == "server":
        from flowgrpo.rollout.backends.openai import OpenAIBackend

        s = cfg.server
        assert s.base_url is not None  # ModuleConfig refuses server without it
        client = OpenAIBackend(
            s.base_url, s.model or "default", timeout_s=s.timeout_s, max_retries=s.max_retries
        )
        return ServerModule(client, cfg.temperature, cfg.max_new_tokens)
    shared = {} if shared is None else shared
    key = f"{cfg.source}:{cfg.model}"
    if key not in shared:
        from flowgrpo.rollout.backends.hf import HFBackend

        if cfg.source == "reference":
            model, tok = frozen_copy(policy), tokenizer
        else:
            from flowgrpo.modeling import models

            assert cfg.model is not None  # ModuleConfig refuses model without it
            device = next(policy.parameters()).device  # beside the policy: one GPU serves the flow
            if cfg.model == "tiny":
                model, tok = models.tiny_model(device=device)
            else:
                model, tok = models.load_model(cfg.model, device=device)
            model = frozen_copy(model)
        shared[key] = (HFBackend(model, tok, autocast_dtype=autocast), tok)
    module_backend, module_tok = shared[key]
    return BackendModule(module_backend, module_tok, params)


def frozen_copy(model: Any) -> Any:
    """A copy of ``model`` in eval mode without gradients (AgentFlow's fixed engine)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


__all__ = ["BackendModule", "ModuleReply", "ServerModule", "TextModule", "frozen_copy", "make_module"]
