"""AgentFlow's in-the-flow agentic system (``agent.kind: flow``): a trained planner and a frozen
executor, verifier and generator over an evolving memory. See docs/agentflow.md.

- :mod:`~flowgrpo.rollout.agentflow.config`: the ``agent`` config section.
- :mod:`~flowgrpo.rollout.agentflow.prompts`: every module's prompt, in one place.
- :mod:`~flowgrpo.rollout.agentflow.memory`: typed memory records and their token cap.
- :mod:`~flowgrpo.rollout.agentflow.modules`: where the frozen modules' text comes from.
- :mod:`~flowgrpo.rollout.agentflow.agent`: the episode loop.
"""

from __future__ import annotations

from typing import Any

from flowgrpo.rollout.agentflow.agent import FlowAgent, describe_tools, parse_plan, parse_verdict
from flowgrpo.rollout.agentflow.config import AgentConfig, ModuleConfig
from flowgrpo.rollout.agentflow.memory import Memory, MemoryRecord
from flowgrpo.rollout.agentflow.modules import (
    BackendModule,
    ModuleReply,
    ServerModule,
    TextModule,
    make_module,
)
from flowgrpo.rollout.agentflow.prompts import Prompts
from flowgrpo.rollout.backends.base import RolloutBackend


def build_flow_agent(
    config: AgentConfig, *, policy: Any, tokenizer: Any, backend: RolloutBackend, autocast: str | None = None
) -> FlowAgent:
    """The flow agent of an ``agent`` section around the run's policy, tokenizer and backend.
    Modules that name the same frozen source share one model (one copy of the reference)."""
    shared: dict[str, tuple[RolloutBackend, Any]] = {}

    def module(cfg: ModuleConfig) -> TextModule:
        return make_module(
            cfg, policy=policy, tokenizer=tokenizer, backend=backend, autocast=autocast, shared=shared
        )

    return FlowAgent(
        config,
        tokenizer,
        executor=module(config.executor),
        verifier=module(config.verifier),
        generator=module(config.generator),
    )


__all__ = [
    "AgentConfig",
    "BackendModule",
    "FlowAgent",
    "Memory",
    "MemoryRecord",
    "ModuleConfig",
    "ModuleReply",
    "Prompts",
    "ServerModule",
    "TextModule",
    "build_flow_agent",
    "describe_tools",
    "make_module",
    "parse_plan",
    "parse_verdict",
]
