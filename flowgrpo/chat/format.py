"""The chat layer: messages and tool schemas rendered to token ids with the model's chat template.

Why token deltas. Training needs the exact ids the policy saw and sampled; re-tokenizing decoded
text does not round-trip. So a conversation is built incrementally:

``ids(turn k+1) = ids(turn k) + sampled ids + tail + observation delta``

- the first prompt is ``render(system + user, add_generation_prompt=True)``, tokenized once;
- assistant turns keep exactly the sampled ids (never re-rendered);
- ``tail`` is what the template writes after an assistant message's content (ChatML:
  ``<|im_end|>\\n``) minus the end-of-turn token the model already sampled when it stopped on it
  (so ``...answer<|im_end|>`` gets only ``\\n``; a turn cut by the token limit gets the whole tail,
  which closes the turn the way the template would);
- the observation delta is ``render(history + observations, add_generation_prompt=True)`` minus
  ``render(history)``: the observation messages plus the generation prompt of the next turn.

This is only correct for templates that are *prefix-preserving* (rendering more messages only
appends text). :class:`ChatFormat` checks that at start-up with sentinel messages, once with plain
assistant content and once with a ``<think>...</think>`` block in it, and raises
:class:`ChatTemplateError` naming the template and the turn otherwise (e.g. Qwen3 templates, which
write an empty think block into the last assistant turn only, or strip earlier reasoning);
:meth:`ChatFormat.observation_delta` names the turn where a later conversation breaks it.

Tool prompt fallback. Templates with tool support render ``tools=`` (JSON schemas) into the
prompt. Templates without it (SmolLM2's ChatML) silently ignore ``tools=``; we detect this by
rendering with and without tools and comparing. Then the parser's
``format_instructions(tools)`` (tool-call format, tool list with schemas, answer convention) is
appended to the system message.

Tool observations are rendered with role ``"tool"`` if the template renders that role's content;
otherwise consecutive tool messages become one ``"user"`` message whose content wraps each result
as ``<tool_response>\\n...\\n</tool_response>`` (the Hermes/Qwen convention).

SmolLM2's template inserts "You are a helpful AI assistant named SmolLM..." when the first message
is not a system message: :meth:`ChatFormat.prompt_messages` always puts the environment's system
prompt first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowgrpo.chat.parsing import ActionParser
from flowgrpo.types import Message

_SENT_A = "\u2063ASSISTANT_SENTINEL_7f3a\u2063"
_SENT_T = "\u2063TOOL_SENTINEL_91c2\u2063"
_SENT_U = "\u2063USER_SENTINEL_4be0\u2063"
_SENT_S = "\u2063SYSTEM_SENTINEL_d41d\u2063"
_SENT_R = "\u2063REASONING_SENTINEL_0b7e\u2063"
_THINKING = f"<think>\n{_SENT_R}\n</think>\n\n{_SENT_A}"  # a thinking model's turn


class ChatTemplateError(ValueError):
    """A chat template that cannot be used for token-delta rendering; the message says why."""


def _schema(tool: Any) -> dict[str, Any]:
    from flowgrpo.tool import to_openai_schema

    return to_openai_schema(tool)


class ChatFormat:
    """Renders an environment's conversation to token ids, turn by turn.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: the environment's tools (rendered with the template's tool support or, without it,
            with ``parser.format_instructions(tools)`` in the system message).
        parser: the environment's action parser (needs ``format_instructions`` only for the fallback).
        end_of_turn_ids: token ids that end an assistant turn (default: the tokenizer's eos id and
            ``<|im_end|>`` if it exists). Used as stop ids and to trim the template's tail.
        tool_role: force (True/False) or auto-detect (None) rendering observations with role "tool".
        template_name: how errors name the template (default: the tokenizer's ``name_or_path``).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        tools: Sequence[Any] = (),
        parser: ActionParser | None = None,
        end_of_turn_ids: Sequence[int] | None = None,
        tool_role: bool | None = None,
        template_name: str | None = None,
    ) -> None:
        self.template_name = template_name or str(tokenizer.name_or_path or "the tokenizer's chat template")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ChatTemplateError(
                "the tokenizer has no chat_template; set tokenizer.chat_template (e.g. "
                "flowgrpo.modeling.models.CHATML_TEMPLATE) before building a ChatFormat"
            )
        self.tokenizer = tokenizer
        self.tools = list(tools)
        self.parser = parser
        self.tool_schemas = [_schema(t) for t in self.tools]
        if end_of_turn_ids is None:
            eot: list[int] = []
            if tokenizer.eos_token_id is not None:
                eot.append(int(tokenizer.eos_token_id))
            im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
            if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end not in eot:
                eot.append(im_end)
            end_of_turn_ids = eot
        self.end_of_turn_ids = [int(i) for i in end_of_turn_ids]
        self.native_tools = bool(self.tool_schemas) and self._template_renders_tools()
        if self.tool_schemas and not self.native_tools and parser is None:
            raise ChatTemplateError(
                "the chat template ignores tools= and no parser with format_instructions(tools) was "
                "given for the tool-prompt fallback"
            )
        self.tool_role = self._template_renders_tool_role() if tool_role is None else tool_role
        self._check_prefix_preserving()

    # ---------------------------------------------------------------- rendering primitives
    def render(self, messages: Sequence[Message | dict[str, Any]], *, add_generation_prompt: bool) -> str:
        """The template's text for ``messages`` (tool schemas included when natively supported)."""
        dicts = [m.to_chat_dict() if isinstance(m, Message) else m for m in messages]
        kw: dict[str, Any] = {}
        if self.native_tools:
            kw["tools"] = self.tool_schemas
        return self.tokenizer.apply_chat_template(
            dicts, tokenize=False, add_generation_prompt=add_generation_prompt, **kw
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text (special tokens in the text are parsed, none are added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _render_plain(self, dicts: list[dict[str, Any]], gen: bool, **kw: Any) -> str:
        return self.tokenizer.apply_chat_template(dicts, tokenize=False, add_generation_prompt=gen, **kw)

    def _template_renders_tools(self) -> bool:
        base = [{"role": "system", "content": _SENT_S}, {"role": "user", "content": _SENT_U}]
        try:
            with_tools = self._render_plain(base, True, tools=self.tool_schemas)
        except Exception:
            return False
        return with_tools != self._render_plain(base, True)

    def _template_renders_tool_role(self) -> bool:
        msgs = [
            {"role": "system", "content": _SENT_S},
            {"role": "user", "content": _SENT_U},
            {"role": "assistant", "content": _SENT_A},
            {"role": "tool", "content": _SENT_T, "tool_call_id": "call_0", "name": "t"},
        ]
        try:
            return _SENT_T in self._render_plain(msgs, True)
        except Exception:
            return False

    def _check_prefix_preserving(self) -> None:
        """Turn 1 -> 2 with sentinel messages: the assistant's content must follow the generation
        prompt verbatim, and adding an observation must only append text, both for plain content
        and for content that opens with a ``<think>`` block."""
        sys_user = [Message(role="system", content=_SENT_S), Message(role="user", content=_SENT_U)]
        p = self.render(sys_user, add_generation_prompt=True)
        obs = self.observation_messages([Message(role="tool", content=_SENT_T, tool_call_id="c", name="t")])
        problems = []
        for label, content in (("", _SENT_A), (" with a <think> block", _THINKING)):
            asst = [*sys_user, Message(role="assistant", content=content)]
            a = self.render(asst, add_generation_prompt=False)
            b = self.render([*asst, *obs], add_generation_prompt=True)
            if not a.startswith(p + content):
                problems.append(
                    f"the assistant message{label} is not written verbatim after the generation prompt "
                    f"({_difference(p + content, a)})"
                )
            elif not b.startswith(a):
                problems.append(
                    f"rendering an observation after an assistant message{label} changes earlier text "
                    f"({_difference(a, b)})"
                )
        if problems:
            raise ChatTemplateError(
                f"chat template {self.template_name!r} is not prefix-preserving at turn 1 -> 2: "
                + "; ".join(problems)
                + ". Multi-turn token deltas would not match what the model saw. Use a ChatML-like "
                "template (flowgrpo.modeling.models.CHATML_TEMPLATE) or an environment whose turns set "
                "resets_context."
            )

    # ---------------------------------------------------------------- conversation pieces
    def system_content(self, system_prompt: str) -> str:
        """The system message text: the env's prompt plus, for templates without tool support,
        the parser's tool-format instructions."""
        if self.tool_schemas and not self.native_tools:
            instr = self.parser.format_instructions(self.tools)
            return f"{system_prompt}\n\n{instr}" if system_prompt else instr
        return system_prompt

    def prompt_messages(self, messages: Sequence[Message], system_prompt: str = "") -> list[Message]:
        """The opening messages with exactly one system message first (the env's own, extended by
        the tool fallback); ``system_prompt`` is used when ``messages`` have none."""
        msgs = list(messages)
        if msgs and msgs[0].role == "system":
            first, rest = msgs[0], msgs[1:]
            sys_text = first.content
        else:
            rest = msgs
            sys_text = system_prompt
        return [Message(role="system", content=self.system_content(sys_text)), *rest]

    def observation_messages(self, observations: Sequence[Message]) -> list[Message]:
        """Observations as the template can render them: role "tool", or (fallback) consecutive
        tool messages merged into one user message of ``<tool_response>`` blocks."""
        if self.tool_role:
            return list(observations)
        out: list[Message] = []
        buf: list[str] = []
        for m in observations:
            if m.role == "tool":
                buf.append(f"<tool_response>\n{m.content}\n</tool_response>")
                continue
            if buf:
                out.append(Message(role="user", content="\n".join(buf)))
                buf = []
            out.append(m)
        if buf:
            out.append(Message(role="user", content="\n".join(buf)))
        return out

    def initial_ids(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the opening prompt (messages already normalised by :meth:`prompt_messages`),
        ending with the generation prompt of the first assistant turn."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def assistant_tail(self, history: Sequence[Message], action_ids: Sequence[int]) -> str:
        """Text the template writes after an assistant message's content, minus the end-of-turn
        token the model already sampled (``action_ids[-1]``) when it stopped on one."""
        rendered = self.render(
            [*history, Message(role="assistant", content=_SENT_A)], add_generation_prompt=False
        )
        i = rendered.rfind(_SENT_A)
        if i < 0:
            raise ChatTemplateError("the chat template dropped the assistant content")
        tail = rendered[i + len(_SENT_A) :]
        if action_ids and int(action_ids[-1]) in self.end_of_turn_ids:
            tok_text = self.tokenizer.decode([int(action_ids[-1])], skip_special_tokens=False)
            if tail.startswith(tok_text):
                tail = tail[len(tok_text) :]
        return tail

    def observation_delta(
        self, history: Sequence[Message], action_ids: Sequence[int], observations: Sequence[Message]
    ) -> list[int]:
        """Ids to feed after an assistant turn: tail + observation messages + next generation prompt.

        ``history`` is the conversation up to (not including) the assistant message whose sampled
        ids are ``action_ids``; ``observations`` the messages the environment returned.
        """
        tail = self.assistant_tail(history, action_ids)
        with_asst = [*history, Message(role="assistant", content=_SENT_A)]
        a = self.render(with_asst, add_generation_prompt=False)
        b = self.render([*with_asst, *self.observation_messages(observations)], add_generation_prompt=True)
        if not b.startswith(a):
            turn = 1 + sum(m.role == "assistant" for m in history)
            raise ChatTemplateError(
                f"chat template {self.template_name!r} is not prefix-preserving at turn {turn} -> "
                f"{turn + 1}: rendering these observations changes earlier text ({_difference(a, b)})"
            )
        return self.encode(tail + b[len(a) :])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def _difference(expected: str, got: str) -> str:
    """Where ``got`` stops extending ``expected``, shown as short reprs of both around it."""
    i = 0
    while i < min(len(expected), len(got)) and expected[i] == got[i]:
        i += 1

    def show(text: str) -> str:
        piece = text[max(0, i - 10) : i + 30]
        for sentinel, name in _NAMES.items():
            piece = piece.replace(sentinel, name)
        return repr(piece)

    return f"at character {i}: expected {show(expected)}, the template wrote {show(got)}"


_NAMES = {
    _SENT_A: "<content>",
    _SENT_R: "<reasoning>",
    _SENT_T: "<tool>",
    _SENT_U: "<user>",
    _SENT_S: "<system>",
}


__all__ = ["ChatFormat", "ChatTemplateError"]
