"""The ``agent`` section of a run's config: which agent runs the episodes.

``kind: tool`` (the default) is the plain multi-turn tool agent of :mod:`flowgrpo.rollout.engine`: one
conversation that grows turn after turn. ``kind: flow`` is AgentFlow's in-the-flow agentic system
(Li et al. 2025): a trained planner over a query, an evolving memory and a toolset, with a frozen
executor, verifier and generator (:mod:`flowgrpo.rollout.agentflow.agent`). Each frozen module names where
its text comes from (:class:`ModuleConfig`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowgrpo.rollout.agentflow.prompts import Prompts
from flowgrpo.rollout.backends.base import ServerConfig

ModuleSource = Literal["policy", "reference", "model", "server"]


class ModuleConfig(BaseModel):
    """Where a frozen module's text comes from, and how it is decoded.

    - ``policy``: the policy itself through the rollout backend, under ``no_grad`` (its current
      weights: the module improves with the planner's updates; AgentFlow's setting when all four
      modules share one model).
    - ``reference``: a frozen copy of the policy as loaded (before any update or warm start).
    - ``model``: another local model (``model``: an embedded name, an HF directory or a ``.gguf``).
    - ``server``: any OpenAI-compatible endpoint (``server.base_url``), e.g. ``flowgrpo serve``.
    """

    model_config = ConfigDict(extra="forbid")
    source: ModuleSource = "policy"
    model: str | None = Field(None, description="source=model: the model to load")
    server: ServerConfig = Field(default_factory=ServerConfig)
    temperature: float = Field(0.0, ge=0.0, description="0: greedy (AgentFlow's frozen engines)")
    max_new_tokens: int = Field(96, ge=1)

    @model_validator(mode="after")
    def _source_named(self) -> ModuleConfig:
        if self.source == "model" and not self.model:
            raise ValueError("source=model needs the model: set model: smollm2-135m (or a path)")
        if self.source == "server" and not self.server.base_url:
            raise ValueError(
                "source=server needs the endpoint: set server.base_url (e.g. http://127.0.0.1:8000/v1 "
                "after `flowgrpo serve --model ... --port 8000`)"
            )
        return self


class AgentConfig(BaseModel):
    """Which agent runs episodes (``kind``), and the flow agent's modules, limits and prompts."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    kind: Literal["tool", "flow"] = Field(
        "tool",
        description="tool: the plain multi-turn tool agent; flow: planner (trained) + executor, "
        "verifier, generator (frozen) over an evolving memory (docs/agentflow.md)",
    )
    planner: Literal["policy"] = Field(
        "policy", description="the planner is the trained policy (the only module trained)"
    )
    executor: ModuleConfig = Field(default_factory=ModuleConfig)
    verifier: ModuleConfig = Field(default_factory=ModuleConfig)
    generator: ModuleConfig = Field(default_factory=ModuleConfig)
    max_steps: int = Field(3, ge=1, description="planner turns per episode (the loop's bound)")
    memory_max_tokens: int = Field(
        384, ge=16, description="cap of the memory text rendered into a prompt (oldest records go first)"
    )
    result_max_chars: int = Field(300, ge=16, description="a tool result is cut to this many characters")
    prompts: Prompts = Field(default_factory=Prompts)


__all__ = ["AgentConfig", "ModuleConfig", "ModuleSource"]
