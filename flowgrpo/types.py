"""The data model: token-in, token-out trajectories.

A trajectory keeps the exact token ids the policy saw and sampled, never text to be re-tokenized
(chat templates do not round-trip). Storage is linear in tokens: each :class:`Turn` holds only the
tokens fed since the previous action (``prompt_ids``), so the full context of turn ``k`` is the
concatenation of every earlier turn's ``prompt_ids + action_ids`` followed by its own
``prompt_ids`` -- unless the turn ``resets_context`` (a fresh prompt, e.g. a Flow-GRPO planner that
sees a memory summary), in which case its ``prompt_ids`` are the whole context.

Everything here is plain pydantic v2 and imports nothing heavy.
"""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1
"""Version of the on-disk trajectory format. Bump it when a field changes meaning."""

Role = Literal["system", "user", "assistant", "tool"]


def new_id(prefix: str = "") -> str:
    """A short random id (12 hex chars), optionally prefixed."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCall(_Model):
    """A call the policy asked for: ``name`` with JSON ``arguments``."""

    id: str = Field(default_factory=lambda: new_id("call_"))
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Message(_Model):
    """One chat message. ``tool`` messages answer the call whose id is ``tool_call_id``."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    def to_chat_dict(self) -> dict[str, Any]:
        """The OpenAI/HF chat-template dict form of this message."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        return d


class Termination(str, Enum):
    """Why an episode ended."""

    finished = "finished"  # the environment said the episode is over (e.g. a final answer)
    max_turns = "max_turns"  # turn limit reached
    max_tokens = "max_tokens"  # the last action hit the per-turn new-token limit without finishing
    context_overflow = "context_overflow"  # the next prompt would not fit the context budget
    error = "error"  # the environment or a tool raised; the message is in metadata["error"]
    verifier_stop = "verifier_stop"  # the flow agent's verifier judged the memory enough (docs/agentflow.md)


class Task(_Model):
    """One problem an environment can pose. ``answer`` is the gold answer when there is one."""

    id: str
    prompt: str
    answer: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Turn(_Model):
    """One policy action and what came back.

    ``prompt_ids`` are the tokens fed since the previous action (the whole prompt on the first turn
    or when ``resets_context``); ``action_ids`` are the sampled tokens (trained on) and
    ``action_logprobs`` the sampler's log-probabilities of them under the distribution it actually
    sampled from (after temperature). Observations are kept as messages; their tokens appear in the
    next turn's ``prompt_ids``.
    """

    prompt_ids: list[int]
    action_ids: list[int]
    action_logprobs: list[float]
    action: Message
    observations: list[Message] = Field(default_factory=list)
    reward: float = 0.0
    advantage: float | None = None
    resets_context: bool = False
    finish_reason: Literal["stop", "length"] = "stop"
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _lengths_match(self) -> Turn:
        if len(self.action_ids) != len(self.action_logprobs):
            raise ValueError(
                f"action_ids has {len(self.action_ids)} tokens but action_logprobs has "
                f"{len(self.action_logprobs)}: the sampler must return one logprob per sampled token"
            )
        return self


class Trajectory(_Model):
    """One episode of one task. ``reward`` is the outcome reward; ``reward_breakdown`` its parts.

    ``excluded`` (a reason, ``"<source>:<detail>"``) takes the episode out of training: advantage
    estimators compute group statistics over the non-excluded episodes only and give excluded ones
    advantage 0, and the trainer leaves them out of the update (docs/algorithms.md, "Excluded
    episodes")."""

    schema_version: int = SCHEMA_VERSION
    id: str = Field(default_factory=lambda: new_id("traj_"))
    group_id: str = ""
    task_id: str = ""
    env: str = ""
    turns: list[Turn] = Field(default_factory=list)
    reward: float = 0.0
    reward_breakdown: dict[str, float] = Field(default_factory=dict)
    termination: Termination = Termination.finished
    policy_version: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)
    excluded: str | None = Field(
        None,
        description="why this episode is left out of the update and out of its group's baseline "
        "(e.g. 'termination:error', 'reward:verifier unreachable'); None: it takes part. Excluded "
        "episodes get advantage 0 and are kept in the store for inspection",
    )

    def context_ids(self, turn_index: int) -> list[int]:
        """The full token context the policy saw before sampling turn ``turn_index``."""
        start = 0
        for k in range(turn_index, -1, -1):
            if self.turns[k].resets_context:
                start = k
                break
        ids: list[int] = []
        for t in self.turns[start:turn_index]:
            ids += t.prompt_ids + t.action_ids
        return ids + self.turns[turn_index].prompt_ids

    @property
    def num_tokens(self) -> int:
        """Stored tokens (prompt deltas + actions): linear in the episode length."""
        return sum(len(t.prompt_ids) + len(t.action_ids) for t in self.turns)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(t.action_ids) for t in self.turns)

    @property
    def final_message(self) -> Message | None:
        """Where the final answer is: the last action of the episode, or the last observation of the
        last turn when that is an assistant message (a frozen module that answered after the last
        action: the flow agent's generator)."""
        if not self.turns:
            return None
        last = self.turns[-1]
        if last.observations and last.observations[-1].role == "assistant":
            return last.observations[-1]
        return last.action


class TrajectoryGroup(_Model):
    """The G episodes of one task: the unit over which GRPO normalises rewards."""

    group_id: str = Field(default_factory=lambda: new_id("group_"))
    task: Task
    trajectories: list[Trajectory] = Field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]


class ParsedAction(_Model):
    """A policy's sampled text, parsed: the assistant ``message`` (raw text as content, well-formed
    tool calls in ``tool_calls``), the final ``answer`` if the answer convention was used, and
    ``errors``: one model-readable explanation per malformed part (bad JSON with its position, a
    call without a name...). The environment turns errors into observations the model sees."""

    message: Message
    answer: str | None = None
    errors: list[str] = Field(default_factory=list)
