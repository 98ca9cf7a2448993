"""Parsing a policy's text into tool calls and a final answer.

- ``ParseError``: the only exception a parser's ``parse`` may raise (for input that is not text at
  all); malformed *text* never raises, it becomes ``ParsedAction.errors``.
- ``ActionParser`` protocol: ``parse(text) -> ParsedAction``; ``format_instructions(tools) -> str``.
- ``HermesParser(answer_tag="answer")``: the Hermes / Qwen2.5 format,
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>`` (any number
  per turn) and ``<answer>...</answer>`` for the final answer; ``format_call`` / ``format_answer``
  write actions in that format (used by oracle policies).
- ``extract_answer(text, tag="answer") -> str | None``: the last complete answer's content.

Why text-level parsing: a trajectory keeps the exact sampled tokens, and the parser only reads
their decoded text. Models whose chat template renders ``tools=`` (Qwen2.5, Hermes) already use this
format; for templates that ignore tools (SmolLM2) :meth:`HermesParser.format_instructions` writes
the system-prompt text that teaches it.

Division of labour with :func:`flowgrpo.tool.execute_tool_calls`: the parser reports *syntax*
errors (bad JSON with its position, a call without a name, unclosed tags); unknown tools and
invalid arguments are reported by ``execute_tool_calls`` as the tool's observation, tied to the
call's id, so the model reads each error next to the call that caused it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from flowgrpo.tool import Tool, to_openai_schema
from flowgrpo.types import Message, ParsedAction, ToolCall, new_id


class ParseError(Exception):
    """Raised by a parser only for input that is not text; malformed text goes to ``errors``."""


@runtime_checkable
class ActionParser(Protocol):
    """Text of one action -> a :class:`ParsedAction` (malformed parts go to its ``errors``), and
    the instructions that teach a model the format when its chat template ignores ``tools=``."""

    def parse(self, text: str) -> ParsedAction: ...

    def format_instructions(self, tools: Sequence[Tool]) -> str: ...


def _tag_re(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    t = re.escape(tag)
    return re.compile(rf"<\s*{t}\s*>"), re.compile(rf"<\s*/\s*{t}\s*>")


def extract_answer(text: str, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>...</tag>`` in ``text``, stripped; ``None`` if none."""
    if not isinstance(text, str):
        return None
    t = re.escape(tag)
    matches = re.findall(rf"<\s*{t}\s*>(.*?)<\s*/\s*{t}\s*>", text, flags=re.DOTALL)
    return matches[-1].strip() if matches else None


def _example_value(prop: dict[str, Any]) -> Any:
    if prop.get("examples"):
        return prop["examples"][0]
    if "default" in prop and prop["default"] is not None:
        return prop["default"]
    kind = prop.get("type")
    if kind == "integer":
        return 3
    if kind == "number":
        return 2.5
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return {}
    return "..."


def _short_signature(tool: Tool) -> str:
    params = to_openai_schema(tool)["function"]["parameters"]
    required = set(params.get("required", []))
    parts = []
    for k, v in params.get("properties", {}).items():
        kind = v.get("type") or "/".join(a.get("type", "any") for a in v.get("anyOf", [])) or "any"
        desc = f" - {v['description']}" if v.get("description") else ""
        opt = "" if k in required else ", optional"
        parts.append(f'"{k}" ({kind}{opt}){desc}')
    return "; ".join(parts) if parts else "no arguments"


class HermesParser:
    """Hermes / Qwen2.5 tool calls plus a tagged final answer.

    Lenient where it costs nothing (whitespace and newlines around the JSON and inside the tags,
    ``arguments`` given as a JSON string, a last ``<tool_call>`` left unclosed because generation
    stopped at the closing tag), strict where it matters (the JSON itself).
    """

    def __init__(self, answer_tag: str = "answer", call_tag: str = "tool_call") -> None:
        if not re.fullmatch(r"\w+", answer_tag) or not re.fullmatch(r"\w+", call_tag):
            raise ValueError("answer_tag and call_tag must be words, e.g. 'answer' and 'tool_call'")
        self.answer_tag = answer_tag
        self.call_tag = call_tag
        self._open, self._close = _tag_re(call_tag)
        self._aopen, self._aclose = _tag_re(answer_tag)

    # ---- writing ---------------------------------------------------------------------------
    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"<{self.call_tag}>{body}</{self.call_tag}>"

    def format_answer(self, answer: str) -> str:
        return f"<{self.answer_tag}>{answer}</{self.answer_tag}>"

    def format_instructions(self, tools: Sequence[Tool]) -> str:
        """Short system-prompt text teaching the format, with one concrete example call.

        Written for small models (SmolLM2-135M): one rule per line, the example is a real call
        of the first tool, and the answer convention comes last.
        """
        lines = []
        if tools:
            first = tools[0]
            props = to_openai_schema(first)["function"]["parameters"].get("properties", {})
            example = self.format_call(first.name, {k: _example_value(v) for k, v in props.items()})
            lines += [
                "You can use tools. To call a tool, write exactly:",
                example,
                "Then wait: the result comes back in the next message.",
                "",
                "Tools:",
            ]
            for t in tools:
                lines.append(
                    f"- {t.name}: {t.description.strip().splitlines()[0] if t.description else ''} "
                    f"Arguments: {_short_signature(t)}"
                )
            lines.append("")
        lines.append(f"When you know the final answer, write it as {self.format_answer('...')}")
        return "\n".join(lines)

    # ---- reading ---------------------------------------------------------------------------
    def _parse_call(self, body: str, index: int, errors: list[str]) -> ToolCall | None:
        where = f"tool call {index}"
        stripped = body.strip()
        if not stripped:
            errors.append(f"{where} is empty. Write {self.format_call('tool_name', {'arg': 'value'})}")
            return None
        try:
            obj, end = json.JSONDecoder(strict=False).raw_decode(stripped)
        except json.JSONDecodeError as e:
            errors.append(
                f"{where}: invalid JSON at line {e.lineno} column {e.colno} (char {e.pos}): {e.msg} "
                f"near {stripped[max(0, e.pos - 10) : e.pos + 10]!r}. "
                f'The content must be one JSON object like {{"name": "tool_name", "arguments": {{...}}}}'
            )
            return None
        if stripped[end:].strip():
            errors.append(
                f"{where}: unexpected text after the JSON object at char {end}: {stripped[end : end + 20]!r}. "
                "Put exactly one JSON object in each tool call."
            )
            return None
        if not isinstance(obj, dict):
            errors.append(
                f'{where}: expected a JSON object with "name" and "arguments", got {type(obj).__name__}'
            )
            return None
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            errors.append(f'{where}: missing "name" (a string naming the tool)')
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # OpenAI-style: arguments as a JSON string
            try:
                args = json.loads(args, strict=False) if args.strip() else {}
            except json.JSONDecodeError as e:
                errors.append(
                    f'{where}: "arguments" is a string that is not valid JSON ({e.msg} at char {e.pos})'
                )
                return None
        if args is None:
            args = {}
        if not isinstance(args, dict):
            errors.append(f'{where}: "arguments" must be a JSON object, got {type(args).__name__}')
            return None
        extra = set(obj) - {"name", "arguments", "parameters", "id"}
        if extra:
            errors.append(f'{where}: unexpected keys {sorted(extra)}; only "name" and "arguments" are read')
        call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else new_id("call_")
        return ToolCall(id=call_id, name=name.strip(), arguments=args)

    def parse(self, text: str) -> ParsedAction:
        """Parse one sampled action; never raises for any ``str`` (errors go to ``errors``)."""
        if not isinstance(text, str):
            raise ParseError(f"expected the action as text (str), got {type(text).__name__}")
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        index = 0
        while True:
            m = self._open.search(text, pos)
            if m is None:
                break
            index += 1
            close = self._close.search(text, m.end())
            nxt = self._open.search(text, m.end())
            if close is not None and (nxt is None or close.start() < nxt.start()):
                body, pos = text[m.end() : close.start()], close.end()
            else:
                # unclosed: accept it if the call is the last thing in the text (generation stopped at
                # the closing tag), otherwise it swallowed the next call.
                end = nxt.start() if nxt is not None else len(text)
                body, pos = text[m.end() : end], end
                if nxt is not None:
                    errors.append(f"tool call {index} is missing its closing </{self.call_tag}>")
                    continue
            call = self._parse_call(body, index, errors)
            if call is not None:
                calls.append(call)
        stray = len(self._close.findall(text)) - len(self._open.findall(text))
        if stray > 0:
            errors.append(f"found </{self.call_tag}> without a matching <{self.call_tag}>")
        answer = extract_answer(text, self.answer_tag)
        if answer is None and self._aopen.search(text):
            errors.append(f"<{self.answer_tag}> is not closed: write {self.format_answer('...')}")
        message = Message(role="assistant", content=text, tool_calls=calls)
        return ParsedAction(message=message, answer=answer, errors=errors)


__all__ = ["ActionParser", "HermesParser", "ParseError", "extract_answer"]
