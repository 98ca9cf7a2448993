"""Tools the policy acts through.

CONTRACT (other modules rely on these names; extend, do not rename):
- ``ToolError``: raised by a tool (or by :func:`invoke`) for a failure the model should read.
- ``ToolOutput(content, artifact=None)``: what a call returns (``artifact``: raw data kept for
  rewards/replay, never shown to the model).
- ``Tool`` protocol: ``name``, ``description``, ``args_schema`` (a pydantic model class),
  ``timeout_s`` (float | None) and ``async run(args: BaseModel) -> str | ToolOutput``.
- ``async invoke(tool, arguments: dict, *, timeout_s=None) -> ToolOutput``: validates ``arguments``
  against ``args_schema``, runs with a timeout, raises ``ToolError`` with a model-readable message.
- ``async execute_tool_calls(tools: Mapping[str, Tool], calls, *, timeout_s=None) -> list[Message]``:
  runs calls concurrently; never raises for a bad call: every result, error or not, is a
  ``Message(role="tool", tool_call_id=call.id, name=call.name, content=...)`` in call order.
- ``to_openai_schema(tool) -> dict``: OpenAI function-calling JSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from flowgrpo.types import Message, ToolCall


class ToolError(Exception):
    """A tool failure whose message is shown to the model as the observation."""


class ToolOutput(BaseModel):
    content: str
    artifact: Any = None


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    args_schema: type[BaseModel]
    timeout_s: float | None

    async def run(self, args: BaseModel) -> str | ToolOutput: ...


def _validation_message(tool: Tool, e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        parts.append(f"{loc}: {err['msg']}")
    return f"invalid arguments for {tool.name}: " + "; ".join(parts)


async def invoke(tool: Tool, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> ToolOutput:
    try:
        args = tool.args_schema.model_validate(dict(arguments))
    except ValidationError as e:
        raise ToolError(_validation_message(tool, e)) from e
    limit = timeout_s if timeout_s is not None else tool.timeout_s
    try:
        out = await asyncio.wait_for(tool.run(args), timeout=limit)
    except asyncio.TimeoutError as e:
        raise ToolError(f"{tool.name} timed out after {limit} s") from e
    except ToolError:
        raise
    except Exception as e:  # a bug in a tool is an observation, not a crashed run
        raise ToolError(f"{tool.name} failed: {type(e).__name__}: {e}") from e
    return out if isinstance(out, ToolOutput) else ToolOutput(content=str(out))


async def _one(tools: Mapping[str, Tool], call: ToolCall, timeout_s: float | None) -> Message:
    tool = tools.get(call.name)
    if tool is None:
        content = f"Error: unknown tool {call.name!r}; available tools: {', '.join(sorted(tools)) or '(none)'}"
    else:
        try:
            content = (await invoke(tool, call.arguments, timeout_s=timeout_s)).content
        except ToolError as e:
            content = f"Error: {e}"
    return Message(role="tool", tool_call_id=call.id, name=call.name, content=content)


async def execute_tool_calls(
    tools: Mapping[str, Tool], calls: Sequence[ToolCall], *, timeout_s: float | None = None
) -> list[Message]:
    return list(await asyncio.gather(*(_one(tools, c, timeout_s) for c in calls)))


def to_openai_schema(tool: Tool) -> dict[str, Any]:
    schema = tool.args_schema.model_json_schema()
    schema.pop("title", None)
    return {"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": schema}}
