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

_CALL_SHAPE = 'write one flat JSON object like {"name": "tool_name", "arguments": {...}}'


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


def _tag_spans(
    text: str, open_re: re.Pattern[str], close_re: re.Pattern[str]
) -> list[tuple[int, int, int, int]]:
    """``(open_start, open_end, close_start, close_end)`` of each complete ``<tag>...</tag>``, left
    to right, non-overlapping (the nearest closing tag after each opening one): the matches of
    ``<tag>(.*?)</tag>``, found in one pass over each tag's positions (linear in ``len(text)``,
    where the lazy regex rescans the rest of the text from every unclosed opening tag)."""
    opens = [(m.start(), m.end()) for m in open_re.finditer(text)]
    closes = [(m.start(), m.end()) for m in close_re.finditer(text)]
    spans = []
    j = 0
    pos = 0
    for o_start, o_end in opens:
        if o_start < pos:
            continue
        while j < len(closes) and closes[j][0] < o_end:
            j += 1
        if j == len(closes):
            break
        spans.append((o_start, o_end, *closes[j]))
        pos = closes[j][1]
    return spans


def extract_answer(text: str, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>...</tag>`` in ``text``, stripped; ``None`` if none.

    Linear in the length of the text, whatever the number of tags."""
    if not isinstance(text, str):
        return None
    spans = _tag_spans(text, *_tag_re(tag))
    if not spans:
        return None
    _, start, end, _ = spans[-1]
    return text[start:end].strip()


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

    def __init__(
        self, answer_tag: str = "answer", call_tag: str = "tool_call", *, max_calls: int = 32
    ) -> None:
        if not re.fullmatch(r"\w+", answer_tag) or not re.fullmatch(r"\w+", call_tag):
            raise ValueError("answer_tag and call_tag must be words, e.g. 'answer' and 'tool_call'")
        if max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, got {max_calls}")
        self.max_calls = max_calls
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
        except RecursionError:
            errors.append(f"{where}: the JSON is nested too deeply to read; {_CALL_SHAPE}")
            return None
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
            except RecursionError:
                errors.append(f'{where}: "arguments" is nested too deeply to read; {_CALL_SHAPE}')
                return None
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
        try:
            (name, args), scrubbed = _scrub_surrogates([name, args])
        except (RecursionError, ValueError):
            errors.append(f"{where}: the arguments are nested too deeply to use; {_CALL_SHAPE}")
            return None
        if scrubbed:
            errors.append(
                f"{where}: the call contains a lone UTF-16 surrogate escape (like \\ud800), which is not "
                "text; it was replaced by U+FFFD"
            )
        extra = set(obj) - {"name", "arguments", "parameters", "id"}
        if extra:
            errors.append(f'{where}: unexpected keys {sorted(extra)}; only "name" and "arguments" are read')
        call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else new_id("call_")
        return ToolCall(id=call_id, name=name.strip(), arguments=args)

    def parse(self, text: str) -> ParsedAction:
        """Parse one sampled action; never raises for any ``str`` (errors go to ``errors``).

        Linear in the length of the text: tag positions are found once and walked with pointers.
        More than ``max_calls`` tool-call tags give one error and no calls, not one error per tag.
        """
        if not isinstance(text, str):
            raise ParseError(f"expected the action as text (str), got {type(text).__name__}")
        calls: list[ToolCall] = []
        errors: list[str] = []
        opens = [(m.start(), m.end()) for m in self._open.finditer(text)]
        closes = [(m.start(), m.end()) for m in self._close.finditer(text)]
        if len(opens) > self.max_calls:
            errors.append(
                f"{len(opens)} <{self.call_tag}> tags in one action; at most {self.max_calls} calls are "
                "read per action, so none was run. Write one call per tag."
            )
        else:
            j = 0  # the first closing tag not yet passed
            for index, (_, o_end) in enumerate(opens, start=1):
                while j < len(closes) and closes[j][0] < o_end:
                    j += 1
                nxt = opens[index][0] if index < len(opens) else None
                if j < len(closes) and (nxt is None or closes[j][0] < nxt):
                    body = text[o_end : closes[j][0]]
                else:
                    # unclosed: accept it if the call is the last thing in the text (generation
                    # stopped at the closing tag), otherwise it swallowed the next call.
                    if nxt is not None:
                        errors.append(f"tool call {index} is missing its closing </{self.call_tag}>")
                        continue
                    body = text[o_end:]
                call = self._parse_call(body, index, errors)
                if call is not None:
                    calls.append(call)
        if len(closes) > len(opens):
            errors.append(f"found </{self.call_tag}> without a matching <{self.call_tag}>")
        answer = extract_answer(text, self.answer_tag)
        if answer is None and self._aopen.search(text):
            errors.append(f"<{self.answer_tag}> is not closed: write {self.format_answer('...')}")
        message = Message(role="assistant", content=text, tool_calls=calls)
        return ParsedAction(message=message, answer=answer, errors=errors)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _scrub_surrogates(obj: Any) -> tuple[Any, bool]:
    """``obj`` with every lone UTF-16 surrogate (JSON's ``"\\ud800"`` escape decodes to one) replaced
    by U+FFFD, and whether any was. A lone surrogate cannot be encoded as UTF-8: left in a call's
    arguments it would reach tools, tokenizers and the trajectory store as unencodable text."""
    dumped = json.dumps(obj, ensure_ascii=False)
    if not _SURROGATE.search(dumped):
        return obj, False
    return json.loads(_SURROGATE.sub("\ufffd", dumped)), True


__all__ = ["ActionParser", "HermesParser", "ParseError", "extract_answer"]
