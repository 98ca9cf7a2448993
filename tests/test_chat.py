"""Chat layer tests: token deltas at the ``<|im_end|>\\n`` boundary, the tool-prompt fallback for
templates that ignore ``tools=``, the tool-role fallback, and the prefix-preservation check."""

from __future__ import annotations

import pytest

from flowgrpo.chat.format import ChatFormat, ChatTemplateError
from flowgrpo.modeling.models import tiny_tokenizer
from flowgrpo.types import Message
from tests.stand_ins import StubCalculator, StubParser

# SmolLM2-135M-Instruct's template (copied from the model): default system prompt, no tools.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A ChatML template with native tool support (Hermes style) and no "tool" role (tool results
# must come as user messages).
TOOLS_NO_TOOL_ROLE = (
    "{% for message in messages %}{% if message['role'] != 'tool' %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{% if loop.first and tools %}{{ '\n<tools>' }}{% for t in tools %}{{ t['function']['name'] }}"
    "{% endfor %}{{ '</tools>' }}{% endif %}{{ '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Not prefix-preserving: only the last assistant message keeps its content.
DROPS_OLD_CONTENT = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] != 'assistant' or loop.last %}{{ message['content'] }}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _tok(template=None):
    tok = tiny_tokenizer()
    if template is not None:
        tok.chat_template = template
    return tok


def _opening(chat):
    return chat.prompt_messages([Message(role="user", content="hi")], "Be brief.")


def test_smollm2_template_gets_the_tool_prompt_fallback_and_no_default_system_prompt():
    chat = ChatFormat(_tok(SMOLLM2_TEMPLATE), tools=[StubCalculator()], parser=StubParser())
    assert not chat.native_tools and chat.tool_role
    text = chat.decode(chat.initial_ids(_opening(chat)))
    assert text == (
        "<|im_start|>system\nBe brief.\n\nTOOLS: calculator<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "SmolLM" not in text


def test_no_tools_keeps_the_system_prompt_as_is():
    chat = ChatFormat(_tok(SMOLLM2_TEMPLATE))
    assert chat.prompt_messages([Message(role="user", content="x")], "S")[0].content == "S"


def test_fallback_without_format_instructions_is_a_clear_error():
    with pytest.raises(ChatTemplateError, match="format_instructions"):
        ChatFormat(_tok(SMOLLM2_TEMPLATE), tools=[StubCalculator()], parser=None)


def test_native_tool_template_and_user_wrapped_observations():
    chat = ChatFormat(_tok(TOOLS_NO_TOOL_ROLE), tools=[StubCalculator()], parser=StubParser())
    assert chat.native_tools and not chat.tool_role
    opening = _opening(chat)
    assert opening[0].content == "Be brief."  # tools come from the template, not the fallback
    assert "<tools>calculator</tools>" in chat.decode(chat.initial_ids(opening))
    obs = [
        Message(role="tool", content="4", tool_call_id="a", name="calculator"),
        Message(role="tool", content="9", tool_call_id="b", name="calculator"),
    ]
    eos = chat.tokenizer.eos_token_id
    delta = chat.observation_delta(opening, [*chat.encode("calls"), eos], obs)
    assert chat.decode(delta) == (
        "\n<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n9\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_delta_boundary_after_eos_and_after_a_length_cut():
    tok = _tok()
    chat = ChatFormat(tok, tools=[StubCalculator()], parser=StubParser())
    opening = _opening(chat)
    obs = [Message(role="tool", content="5", tool_call_id="c", name="calculator")]
    action = chat.encode("call it")
    stopped = chat.observation_delta(opening, [*action, tok.eos_token_id], obs)
    cut = chat.observation_delta(opening, action, obs)
    after = "<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    assert chat.decode(stopped) == "\n" + after  # <|im_end|> was sampled: only the newline is added
    assert chat.decode(cut) == "<|im_end|>\n" + after  # cut turn: the template's tail closes it
    # concatenated ids decode to the template's own rendering of the conversation
    history = [*opening, Message(role="assistant", content="call it"), *obs]
    full = chat.initial_ids(opening) + action + [tok.eos_token_id] + stopped
    assert chat.decode(full) == chat.render(history, add_generation_prompt=True)


def test_non_prefix_preserving_template_is_refused():
    with pytest.raises(ChatTemplateError, match="prefix-preserving"):
        ChatFormat(_tok(DROPS_OLD_CONTENT))


def test_missing_template_is_a_clear_error():
    tok = _tok()
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="chat_template"):
        ChatFormat(tok)
