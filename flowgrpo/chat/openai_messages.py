"""OpenAI chat requests in the chat layer's terms: ``tools`` as :class:`SchemaTool`, ``messages`` as
:class:`~flowgrpo.types.Message`, and a parsed action back as an OpenAI assistant message with
``tool_calls``.

Why here: a client's agent (LangChain, a loop over the ``openai`` client) must see its tools and
its tool results rendered exactly as a flowgrpo environment's are, so the gateway feeds them to the
same :class:`~flowgrpo.chat.format.ChatFormat` and parses the model's output with the same
:class:`~flowgrpo.chat.parsing.HermesParser` the environments use.

- A client's tool is only a schema (the client runs it): :class:`SchemaTool` carries the schema the
  client sent, unchanged, so what the model reads is exactly what the client declared.
- An assistant message the client sends back with ``tool_calls`` is rendered, for templates that do
  not render ``tool_calls`` themselves (SmolLM2's ChatML), as the text the model writes for them:
  its content followed by one ``<tool_call>{...}</tool_call>`` per call.
- Malformed input raises :class:`OpenAIFormatError`, whose message names the offending field.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from flowgrpo.chat.parsing import HermesParser
from flowgrpo.tool import ToolError
from flowgrpo.types import Message, ParsedAction, ToolCall


class OpenAIFormatError(ValueError):
    """A request's ``tools`` or ``messages`` that do not follow the OpenAI chat format; the
    message says which field and what was expected."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _args_model(name: str, parameters: dict[str, Any]) -> type[BaseModel]:
    """A pydantic model whose JSON schema is exactly ``parameters`` (what renders it: the chat
    template's ``tools=`` or the parser's instructions read the schema, never the fields)."""
    schema = copy.deepcopy(parameters)

    class ClientArgs(BaseModel):
        model_config = ConfigDict(extra="allow")

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(schema)

    ClientArgs.__name__ = f"{name}Args"
    return ClientArgs


class SchemaTool:
    """A :class:`~flowgrpo.tool.Tool` known only by the schema a client declared: rendered into
    the prompt like any tool, run by the client (the gateway never calls :meth:`run`)."""

    timeout_s: float | None = None

    def __init__(self, name: str, description: str, parameters: dict[str, Any]) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters
        self.args_schema: type[BaseModel] = _args_model(name, parameters)

    async def run(self, args: BaseModel) -> str:
        raise ToolError(f"{self.name} is the client's tool: the client runs it and sends back the result")


def tools_from_openai(tools: Any) -> list[SchemaTool]:
    """The request's ``tools`` (``[{"type": "function", "function": {name, description,
    parameters}}]``) as tools the chat layer renders."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise OpenAIFormatError("'tools' must be a list of {type: 'function', function: {...}}", "tools")
    out: list[SchemaTool] = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise OpenAIFormatError(
                f"'tools'[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}",
                "tools",
            )
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise OpenAIFormatError(f"'tools'[{i}].function.parameters must be a JSON schema object", "tools")
        desc = fn.get("description") or ""
        if not isinstance(desc, str):
            raise OpenAIFormatError(f"'tools'[{i}].function.description must be a string", "tools")
        out.append(SchemaTool(name.strip(), desc, params))
    if len({t.name for t in out}) != len(out):
        raise OpenAIFormatError("tool names must be unique", "tools")
    return out


def _content(value: Any, where: str) -> str:
    """A message's ``content``: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for p in value:
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise OpenAIFormatError(
                    f"{where}.content: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                    "messages",
                )
            parts.append(p["text"])
        return "".join(parts)
    raise OpenAIFormatError(f"{where}.content must be a string, null or a list of text parts", "messages")


def _tool_calls(value: Any, where: str) -> list[ToolCall]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise OpenAIFormatError(f"{where}.tool_calls must be a list", "messages")
    calls = []
    for j, c in enumerate(value):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise OpenAIFormatError(
                f"{where}.tool_calls[{j}] must be {{'id': ..., 'type': 'function', 'function': "
                "{'name': ..., 'arguments': '<JSON>'}}",
                "messages",
            )
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                raise OpenAIFormatError(
                    f"{where}.tool_calls[{j}].function.arguments is not JSON: {e.msg}", "messages"
                ) from e
        if not isinstance(args, dict):
            raise OpenAIFormatError(
                f"{where}.tool_calls[{j}].function.arguments must be a JSON object", "messages"
            )
        call_id = c.get("id") if isinstance(c.get("id"), str) and c.get("id") else f"call_{j}"
        calls.append(ToolCall(id=call_id, name=fn["name"], arguments=args))
    return calls


def messages_from_openai(messages: Any) -> list[Message]:
    """The request's ``messages`` as chat-layer messages (``developer`` is read as ``system``; a
    ``tool`` message without ``name`` takes the name of the call it answers)."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIFormatError("'messages' must be a non-empty list of {role, content}", "messages")
    out: list[Message] = []
    names: dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise OpenAIFormatError(f"{where} must be an object with 'role' and 'content'", "messages")
        role = m.get("role")
        role = "system" if role == "developer" else role
        if role not in ("system", "user", "assistant", "tool"):
            raise OpenAIFormatError(
                f"{where}.role must be system, developer, user, assistant or tool, got {role!r}", "messages"
            )
        content = _content(m.get("content"), where)
        if role == "assistant":
            calls = _tool_calls(m.get("tool_calls"), where)
            names.update({c.id: c.name for c in calls})
            out.append(Message(role="assistant", content=content, tool_calls=calls))
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise OpenAIFormatError(f"{where}: a tool message needs 'tool_call_id'", "messages")
            name = m.get("name") if isinstance(m.get("name"), str) else names.get(call_id)
            out.append(Message(role="tool", content=content, tool_call_id=call_id, name=name))
        else:
            out.append(Message(role=role, content=content))
    return out


def as_rendered(
    messages: Sequence[Message], parser: HermesParser, *, native_tool_calls: bool
) -> list[Message]:
    """Messages ready for a chat template: an assistant message's ``tool_calls`` written into its
    content in the parser's format when the template does not render ``tool_calls`` itself."""
    if native_tool_calls:
        return list(messages)
    out = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            calls = "".join(parser.format_call(c.name, c.arguments) for c in m.tool_calls)
            text = f"{m.content}\n{calls}" if m.content else calls
            out.append(Message(role="assistant", content=text))
        else:
            out.append(m)
    return out


def assistant_message(parsed: ParsedAction, parser: HermesParser, *, with_tools: bool) -> dict[str, Any]:
    """The OpenAI assistant message for a parsed action: with tools, its ``tool_calls`` (ids, names,
    JSON arguments) and as ``content`` the text outside the call tags (null when there is none, as
    OpenAI does); without tools, the text as it is."""
    text = parsed.message.content
    calls = parsed.message.tool_calls if with_tools else []
    if not calls:
        return {"role": "assistant", "content": text}
    content = strip_calls(text, parser).strip()
    return {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
            }
            for c in calls
        ],
    }


def strip_calls(text: str, parser: HermesParser) -> str:
    """``text`` without its ``<tool_call>...</tool_call>`` blocks (an unclosed last one included)."""
    opener, closer = f"<{parser.call_tag}>", f"</{parser.call_tag}>"
    out, pos = [], 0
    while True:
        i = text.find(opener, pos)
        if i < 0:
            out.append(text[pos:])
            break
        out.append(text[pos:i])
        j = text.find(closer, i)
        if j < 0:
            break
        pos = j + len(closer)
    return "".join(out)


def same_message(sent: Message, ours: Message) -> bool:
    """Whether a message the client sent back is the one we answered (content, or the same calls:
    clients re-serialise arguments and may drop the content of a tool-calling message)."""
    if sent.role != ours.role:
        return False
    if ours.tool_calls or sent.tool_calls:
        return [(c.id, c.name, c.arguments) for c in sent.tool_calls] == [
            (c.id, c.name, c.arguments) for c in ours.tool_calls
        ]
    return sent.content == ours.content


__all__ = [
    "OpenAIFormatError",
    "SchemaTool",
    "as_rendered",
    "assistant_message",
    "messages_from_openai",
    "same_message",
    "strip_calls",
    "tools_from_openai",
]
