"""Property-based tests: the parser, the answer normaliser and the calculator return, or give a
clear error, for arbitrary text. Fixed seed (``derandomize``), bounded examples; the per-example
deadline is a hang detector, generous on purpose."""

from __future__ import annotations

from datetime import timedelta

from flowgrpo.tools.calculator import evaluate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowgrpo.chat.parsing import HermesParser
from flowgrpo.rewards.answers import math_equal, normalize_math, parse_number
from flowgrpo.sandbox.bounded import BudgetExceeded, shared_pool
from flowgrpo.tool import ToolError

FUZZ = settings(
    derandomize=True,
    database=None,
    max_examples=150,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow],
)

_parser_pieces = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "{", "}", "[", "]", '"', ":", ",", '"name"',
     '"arguments"', '"calc"', "\\ud800", "\\u0000", "\\", "\n", " ", "null", "1e999", "<", ">", "/"]
)  # fmt: skip
_math_pieces = st.sampled_from(
    ["\\frac", "\\boxed{", "{", "}", "^", "**", "e", "E", "10", "0", "7", ".", ",", "%", "$", "\\text{",
     "\\circ", "x", "/", "(", ")", "-", "+", "*", " ", "km", "sqrt", "\\times", "9", "99"]
)  # fmt: skip
_calc_pieces = st.sampled_from(
    ["9", "99", "**", "^", "!", "(", ")", "sqrt", "sin", "exp", "factorial", "log", "pi", "e", ",", ".",
     "%", " of ", "/", "-", "+", "*", "1e300", "_", "x", "round", "binomial", "tan", "Mod", "[", "lambda"]
)  # fmt: skip


def _text(pieces: st.SearchStrategy[str], max_size: int = 40) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(pieces, st.text(max_size=4)), max_size=max_size).map("".join)


@FUZZ
@given(_text(_parser_pieces, 60))
def test_parser_returns_for_any_text(text):
    action = HermesParser(max_calls=8).parse(text)
    for call in action.message.tool_calls:  # what reaches tools and the store encodes as UTF-8
        call.model_dump_json().encode("utf-8")
    assert all(isinstance(e, str) and e for e in action.errors)


@FUZZ
@given(_text(_math_pieces), _text(_math_pieces, 10))
def test_answer_normaliser_returns_for_any_text(pred, gold):
    s, percent = normalize_math(pred)
    assert isinstance(s, str) and isinstance(percent, bool)
    parse_number(s)
    assert isinstance(math_equal(pred, gold), bool)


@FUZZ
@given(_text(_calc_pieces, 20))
def test_calculator_returns_or_explains_for_any_text(expression):
    try:
        out = shared_pool().call(evaluate, expression, timeout_s=2.0)
    except ToolError as e:
        assert str(e).strip()  # every error carries a message
    except BudgetExceeded:
        pass  # stopped at the budget, worker killed: a clear error too
    else:
        assert isinstance(out, str) and out
