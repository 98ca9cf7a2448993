"""The token-in/token-out chat layer against other families' chat templates (tests/templates/*.jinja,
written for these tests in the style of Qwen2.5, Qwen3 and Llama 3.1; loaded onto the tiny tokenizer
with each family's special tokens added).

For every template a three-turn tool episode is run the way the rollout engine runs it: the first
prompt rendered once, then per turn the sampled ids plus :meth:`ChatFormat.observation_delta`. Either
every prompt is exactly the tokens of the whole conversation rendered by the template (and so an
exact extension of the previous prompt plus the sampled action), or ChatFormat refuses the
template, naming it and the turn where the prefix breaks."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from flowgrpo.chat.format import ChatFormat, ChatTemplateError
from flowgrpo.modeling.models import tiny_tokenizer
from flowgrpo.types import Message
from tests.stand_ins import StubCalculator, StubParser

TEMPLATES = Path(__file__).parent / "templates"

# special tokens of each family (single tokens, as in the real vocabularies) and the token a
# model samples to end its turn
CHATML = (["<|im_start|>", "<|im_end|>"], "<|im_end|>")
LLAMA3 = (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|eot_id|>")


def chat_format(name: str, family: tuple[list[str], str]) -> ChatFormat:
    specials, eot = family
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [s for s in specials if s not in tok.get_vocab()]})
    tok.chat_template = (TEMPLATES / name).read_text()
    return ChatFormat(
        tok,
        tools=[StubCalculator()],
        parser=StubParser(),
        end_of_turn_ids=[tok.convert_tokens_to_ids(eot)],
        template_name=name,
    )


def actions(thinking: bool) -> list[str]:
    think = "<think>\nI should compute it.\n</think>\n\n" if thinking else ""
    return [
        f'{think}<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{k} + 1"}}}}\n</tool_call>'
        for k in range(3)
    ]


def run_episode(chat: ChatFormat, texts: list[str]) -> list[list[int]]:
    """The prompts of each turn, built incrementally; each checked against a full re-render."""
    eot = chat.end_of_turn_ids[0]
    history = chat.prompt_messages([Message(role="user", content="What is 2 + 1?")], "Use the calculator.")
    ids = chat.initial_ids(history)
    prompts = [ids]
    for k, text in enumerate(texts):
        action = [*chat.encode(text), eot]  # the model stops on its end-of-turn token
        obs = [Message(role="tool", content=str(k + 1), tool_call_id=f"call_{k}", name="calculator")]
        delta = chat.observation_delta(history, action, obs)
        history = [*history, Message(role="assistant", content=text), *chat.observation_messages(obs)]
        new = ids + action + delta
        assert new[: len(ids) + len(action)] == ids + action  # an exact extension of the last prompt
        full = chat.encode(chat.render(history, add_generation_prompt=True))
        assert new == full, (
            f"{chat.template_name} turn {k + 1}: incremental prompt differs from the full render\n"
            f"{chat.decode(new)!r}\n{chat.decode(full)!r}"
        )
        ids = new
        prompts.append(ids)
    return prompts


@pytest.mark.parametrize(
    "name, family, thinking",
    [
        ("qwen2.5.jinja", CHATML, False),
        ("qwen2.5.jinja", CHATML, True),  # think blocks are plain content to Qwen2.5: kept
        ("llama3.jinja", LLAMA3, False),
    ],
)
def test_multi_turn_prompts_are_exact_token_extensions(name, family, thinking):
    chat = chat_format(name, family)
    assert chat.native_tools  # both render tools= themselves
    prompts = run_episode(chat, actions(thinking))
    assert len(prompts) == 4 and all(len(b) > len(a) for a, b in itertools.pairwise(prompts))


def test_qwen25_renders_observations_as_tool_responses():
    chat = chat_format("qwen2.5.jinja", CHATML)
    assert chat.tool_role  # the template renders role "tool" itself, as <tool_response> in a user turn
    prompts = run_episode(chat, actions(False)[:1])
    text = chat.decode(prompts[-1])
    assert text.endswith(
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_llama3_observation_delta_is_an_ipython_message():
    chat = chat_format("llama3.jinja", LLAMA3)
    text = chat.decode(run_episode(chat, actions(False)[:1])[-1])
    assert text.endswith(
        "</tool_call><|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n1<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


@pytest.mark.parametrize(
    "name, why",
    [
        # the last assistant turn gets an empty <think></think> block the generation prompt lacks
        ("qwen3.jinja", "is not written verbatim after the generation prompt"),
        # earlier assistant turns lose their <think> block once an observation follows
        ("qwen3_strip_think.jinja", "after an assistant message with a <think> block changes earlier text"),
    ],
)
def test_thinking_templates_are_refused_naming_template_and_turn(name, why):
    with pytest.raises(ChatTemplateError) as e:
        chat_format(name, CHATML)
    msg = str(e.value)
    assert f"chat template {name!r} is not prefix-preserving at turn 1 -> 2" in msg
    assert why in msg and "at character" in msg


def test_the_stripping_is_real_and_would_have_broken_the_prompt():
    """What the refusal prevents: with qwen3_strip_think, the conversation the model is trained on
    (sampled ids kept) is not what the template renders for turn 2."""
    tok = tiny_tokenizer()
    tok.chat_template = (TEMPLATES / "qwen3_strip_think.jinja").read_text()
    text = actions(True)[0]
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": text},
    ]
    alone = tok.apply_chat_template(msgs, tokenize=False)
    followed = tok.apply_chat_template([*msgs, {"role": "tool", "content": "1"}], tokenize=False)
    assert "<think>" in alone and "<think>" not in followed and not followed.startswith(alone)


def test_a_break_at_a_later_turn_names_that_turn():
    """A template that only breaks once two assistant turns exist: the start-up check passes and
    observation_delta names turn 2."""
    template = (
        (TEMPLATES / "qwen2.5.jinja")
        .read_text()
        .replace(
            "{%- for message in messages %}",
            "{%- set n = messages | selectattr('role', 'equalto', 'assistant') | list | length %}"
            "{%- for message in messages %}{%- if n > 1 and message.role == 'assistant' and not loop.last %}"
            "{%- continue %}{%- endif %}",
            1,
        )
    )
    tok = tiny_tokenizer()
    tok.chat_template = template
    chat = ChatFormat(tok, tools=[StubCalculator()], parser=StubParser(), template_name="drops-history")
    with pytest.raises(ChatTemplateError, match=r"'drops-history' is not prefix-preserving at turn 2 -> 3"):
        run_episode(chat, actions(False))
