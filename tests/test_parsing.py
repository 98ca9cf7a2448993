"""flowgrpo.chat.parsing: Hermes tool calls, answers, error messages, format instructions."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowgrpo.chat.parsing import ActionParser, HermesParser, ParseError, extract_answer
from flowgrpo.tool import ToolError, execute_tool_calls, tool

P = HermesParser()


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. 12*7.
    """
    if expression == "12*7":
        return "84"
    raise ToolError("only 12*7 here")


def test_is_action_parser():
    assert isinstance(P, ActionParser) and P.answer_tag == "answer"


def test_single_call():
    a = P.parse(
        'Let me compute.\n<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
    )
    assert a.errors == [] and a.answer is None
    assert len(a.message.tool_calls) == 1
    call = a.message.tool_calls[0]
    assert call.name == "calculator" and call.arguments == {"expression": "12*7"}
    assert call.id.startswith("call_")
    assert a.message.role == "assistant" and a.message.content.startswith("Let me compute.")


def test_several_calls_and_whitespace_variants():
    text = (
        "<tool_call>\n"
        '{"name": "search",\n "arguments": {"query": "capital of France"}}\n'
        "</tool_call>\n"
        '< tool_call >  {"name":"calculator","arguments":{"expression":"1+1"}}  </ tool_call >'
        '<tool_call>{"name": "noargs"}</tool_call>'
    )
    a = P.parse(text)
    assert a.errors == []
    assert [(c.name, c.arguments) for c in a.message.tool_calls] == [
        ("search", {"query": "capital of France"}),
        ("calculator", {"expression": "1+1"}),
        ("noargs", {}),
    ]
    assert len({c.id for c in a.message.tool_calls}) == 3


def test_arguments_as_string_newline_in_code_and_unclosed_last_call():
    a = P.parse('<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>')
    assert a.errors == [] and a.message.tool_calls[0].arguments == {"code": "print(1)"}
    # a literal newline inside a JSON string (models do this with code) is accepted
    a = P.parse('<tool_call>{"name": "python", "arguments": {"code": "x = 1\nprint(x)"}}</tool_call>')
    assert a.errors == [] and a.message.tool_calls[0].arguments == {"code": "x = 1\nprint(x)"}
    # generation stopped at the closing tag: the last call is unclosed but complete
    a = P.parse('<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}')
    assert a.errors == [] and a.message.tool_calls[0].name == "calculator"


def test_bad_json_reports_position():
    a = P.parse('<tool_call>{"name": "calculator" "arguments": {}}</tool_call>')
    assert a.message.tool_calls == []
    assert a.errors == [
        "tool call 1: invalid JSON at line 1 column 23 (char 22): Expecting ',' delimiter "
        "near 'lculator\" \"arguments'. "
        'The content must be one JSON object like {"name": "tool_name", "arguments": {...}}'
    ]


def test_other_malformed_calls():
    cases = {
        "<tool_call>  </tool_call>": "tool call 1 is empty",
        '<tool_call>["calculator"]</tool_call>': "expected a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': 'missing "name"',
        '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>': '"arguments" must be a JSON object, got list',
        '<tool_call>{"name": "c", "arguments": {}}} </tool_call>': "unexpected text after the JSON object",
        '<tool_call>{"name": "c"}<tool_call>{"name": "d"}</tool_call>': "tool call 1 is missing its closing </tool_call>",
        '{"name": "c"}</tool_call>': "found </tool_call> without a matching <tool_call>",
        "<answer>42": "<answer> is not closed",
    }
    for text, expected in cases.items():
        a = P.parse(text)
        assert len(a.errors) == 1 and expected in a.errors[0], (text, a.errors)
    # the good call after the unclosed one still counts
    assert [
        c.name
        for c in P.parse('<tool_call>{"name": "c"}<tool_call>{"name": "d"}</tool_call>').message.tool_calls
    ] == ["d"]


def test_answer_convention():
    a = P.parse("The total is 84.\n<answer> 84 </answer>")
    assert a.answer == "84" and a.errors == [] and a.message.tool_calls == []
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_answer("no answer") is None
    assert extract_answer("<final>x</final>", tag="final") == "x"
    custom = HermesParser(answer_tag="final")
    assert custom.parse("<final>7</final>").answer == "7"
    assert custom.parse("<answer>7</answer>").answer is None
    assert custom.format_answer("7") == "<final>7</final>"


def test_unknown_tool_and_bad_arguments_become_observations():
    a = P.parse(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
        '<tool_call>{"name": "calc", "arguments": {"expression": "1"}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
    )
    msgs = asyncio.run(execute_tool_calls([calculator], a.message.tool_calls))
    assert [m.content for m in msgs] == [
        "84",
        "Error: unknown tool 'calc'; available tools: calculator",
        "Error: invalid arguments for calculator: expression: Field required; expr: unexpected argument. "
        'Expected arguments: {"expression": string}',
    ]


def test_format_call_roundtrip():
    text = P.format_call("calculator", {"expression": "3/4"})
    assert text == '<tool_call>{"name": "calculator", "arguments": {"expression": "3/4"}}</tool_call>'
    assert P.parse(text).message.tool_calls[0].arguments == {"expression": "3/4"}


def test_format_instructions_short_and_concrete():
    text = P.format_instructions([calculator])
    assert text == (
        "You can use tools. To call a tool, write exactly:\n"
        '<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call>\n'
        "Then wait: the result comes back in the next message.\n"
        "\n"
        "Tools:\n"
        '- calculator: Evaluate an arithmetic expression. Arguments: "expression" (string) - The expression, e.g. 12*7.\n'
        "\n"
        "When you know the final answer, write it as <answer>...</answer>"
    )
    assert len(text) < 500
    # the example call in the instructions parses cleanly
    example = text.splitlines()[1]
    assert P.parse(example).errors == []
    assert P.format_instructions([]) == "When you know the final answer, write it as <answer>...</answer>"


def test_parse_error_only_for_non_text():
    with pytest.raises(ParseError):
        P.parse(None)  # type: ignore[arg-type]


_fragments = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "< tool_call >",
        "<answer>",
        "</answer>",
        "{",
        "}",
        '"name"',
        ":",
        ",",
        '"arguments"',
        "[",
        "]",
        '"',
        "\\",
        "\n",
        " ",
        "null",
        "1e999",
        '"calculator"',
        "\x00",
        "\ud800",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_fragments, st.text(max_size=8)), max_size=30).map("".join))
def test_parser_never_raises_on_arbitrary_text(text):
    a = P.parse(text)
    for call in a.message.tool_calls:
        json.dumps(call.arguments)  # well-formed calls carry JSON-able arguments
        assert call.name
    assert all(isinstance(e, str) and e for e in a.errors)
