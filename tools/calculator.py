"""An exact calculator tool built on sympy, safe against hostile input.

The expression is parsed with Python's ``ast`` module (parsing only, never ``eval``) and walked
node by node over a whitelist: numbers, ``+ - * / // % **``, unary signs, a fixed set of functions
and constants. Every intermediate result is evaluated by sympy, exactly: ``0.1`` is the rational
1/10, ``sqrt(8)`` is ``2*sqrt(2)``.

Why not ``sympy.sympify``: it calls ``eval`` on the string and will happily try ``9**9**9**9``.
Here the walker bounds every operation *before* running it: the expression length and nesting depth,
the bit size of powers (``|exponent| * log2|base|``), factorial and binomial arguments, and the size
of every intermediate rational. An oversize request is a :class:`ToolError` in microseconds.
Formatting is bounded too (simplification only of small expressions, periodic functions only of
arguments below 2**64), and as a last line anything beyond plain arithmetic runs in a worker
process (:mod:`flowgrpo.sandbox.bounded`) killed at ``budget_s``: sympy cannot be interrupted, and a thread
would keep burning a core after the episode moved on. A call costs about half a millisecond; plain
arithmetic (40 characters or fewer, no parentheses) runs inline.

Output: ``"12"`` for an integer, ``"391/4 = 97.75"`` for a fraction, ``"sqrt(2) = 1.41421356237310"``
for an irrational; short, because a 135M model reads it.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

import sympy
from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.sandbox.bounded import BudgetExceeded, shared_pool
from flowgrpo.tool import ToolError

MAX_CHARS = 500  # longer input is refused before parsing
MAX_DEPTH = 300  # AST nesting depth (a flat sum of 250 terms is 250 deep)
MAX_BITS = 10_000  # size bound for any intermediate integer / rational (about 3,000 digits)
MAX_FACTORIAL = 1_000
DIGITS = 15  # significant digits of the decimal approximation
MAX_EXACT_CHARS = 60  # longer exact forms are shown as the decimal only

_FUNCS: dict[str, Any] = {
    "sqrt": sympy.sqrt,
    "cbrt": sympy.cbrt,
    "root": sympy.root,
    "exp": sympy.exp,
    "ln": sympy.log,
    "log10": lambda x: sympy.log(x, 10),
    "log2": lambda x: sympy.log(x, 2),
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "asin": sympy.asin,
    "acos": sympy.acos,
    "atan": sympy.atan,
    "sinh": sympy.sinh,
    "cosh": sympy.cosh,
    "tanh": sympy.tanh,
    "abs": sympy.Abs,
    "floor": sympy.floor,
    "ceil": sympy.ceiling,
    "ceiling": sympy.ceiling,
    "gcd": sympy.gcd,
    "lcm": sympy.lcm,
    "min": sympy.Min,
    "max": sympy.Max,
}
_CONSTS: dict[str, Any] = {
    "pi": sympy.pi,
    "e": sympy.E,
    "E": sympy.E,
    "tau": 2 * sympy.pi,
    "deg": sympy.pi / 180,  # sin(30*deg) for degrees
}
_PERIODIC = ("sin", "cos", "tan")
_SPECIAL = ("log", "factorial", "binomial", "round")
KNOWN_NAMES = sorted([*_FUNCS, *_SPECIAL, *_CONSTS])

# "15% of 80" -> "15/100*80", "20%" at the end or before an operator -> "(20/100)"; "7 % 3" stays modulo
_PERCENT_OF = re.compile(r"(\d+(?:\.\d+)?)\s*%\s*of\b")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%(?=\s*(?:$|[-+*/)^,]))")


def _normalise(expr: str) -> str:
    s = expr.strip().rstrip("=").strip()
    s = s.replace("^", "**").replace("×", "*").replace("÷", "/").replace("−", "-").replace("√", "sqrt")
    s = _PERCENT_OF.sub(r"(\1/100)*", s)
    s = _PERCENT.sub(r"(\1/100)", s)
    return s


def _bits(x: sympy.Rational) -> int:
    return max(int(abs(x.p)).bit_length(), int(x.q).bit_length())


def _log2_abs(x: sympy.Expr) -> float:
    """log2 |x| for a number (rational or not), without expanding it."""
    if isinstance(x, sympy.Rational):
        return math.log2(abs(x.p)) - math.log2(x.q) if x.p else -math.inf
    v = abs(complex(x.evalf(15)))
    return math.log2(v) if v > 0 else -math.inf


class _Evaluator:
    def __init__(self, source: str) -> None:
        self.source = source

    def check(self, value: sympy.Expr) -> sympy.Expr:
        if isinstance(value, sympy.Rational) and _bits(value) > MAX_BITS:
            raise ToolError(f"result too large (over {MAX_BITS} bits); try a smaller computation")
        return value

    def eval(self, node: ast.AST, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ToolError(f"expression nested too deeply (limit {MAX_DEPTH} levels)")
        d = depth + 1
        if isinstance(node, ast.Expression):
            return self.eval(node.body, d)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise ToolError(f"unsupported value {node.value!r}: use numbers only")
            text = (ast.get_source_segment(self.source, node) or repr(node.value)).replace("_", "")
            if isinstance(node.value, int):
                return self.check(sympy.Integer(node.value))
            _, _, exp = text.lower().partition("e")
            if exp and abs(int(exp)) > 1000:
                raise ToolError(f"exponent of {text} is too large")
            return self.check(sympy.Rational(text))  # exact decimal: 0.1 is 1/10
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.eval(node.operand, d)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            left, right = self.eval(node.left, d), self.eval(node.right, d)
            return self.check(self.binop(node.op, left, right))
        if isinstance(node, ast.Name):
            if node.id in _CONSTS:
                return _CONSTS[node.id]
            raise ToolError(f"unknown name {node.id!r}; known names: {', '.join(KNOWN_NAMES)}")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.keywords:
                raise ToolError("only plain function calls like sqrt(2) are supported")
            fname = node.func.id
            args = [self.eval(a, d) for a in node.args]
            return self.check(self.call(fname, args))
        if isinstance(node, ast.Tuple):
            raise ToolError("unexpected comma: write numbers without thousands separators (1000, not 1,000)")
        raise ToolError(f"unsupported syntax {type(node).__name__}: use numbers, + - * / ** %, and functions")

    def binop(self, op: ast.operator, a: Any, b: Any) -> Any:
        if isinstance(op, ast.Add):
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)):
            if b == 0:
                raise ToolError("division by zero")
            if isinstance(op, ast.Div):
                return a / b
            return sympy.floor(a / b) if isinstance(op, ast.FloorDiv) else sympy.Mod(a, b)
        if isinstance(op, ast.Pow):
            return self.power(a, b)
        raise ToolError(f"unsupported operator {type(op).__name__}")

    def power(self, base: Any, exp: Any) -> Any:
        if base == 0 and exp.is_negative:
            raise ToolError("division by zero (0 raised to a negative power)")
        if exp.is_number and base.is_number and base not in (0, 1, -1):
            if not exp.is_real:
                raise ToolError("complex exponents are not supported")
            e = abs(float(exp))
            if isinstance(exp, sympy.Rational) and exp.q > 1000:
                raise ToolError("exponent denominator too large (limit 1000)")
            if isinstance(base, sympy.Rational):
                size = e * max(math.log2(abs(base.p)) if base.p else 0.0, math.log2(base.q))
            else:
                size = e * abs(_log2_abs(base))
            if size > MAX_BITS or e > 1e6:
                raise ToolError(
                    f"power too large (about {size:.3g} bits, limit {MAX_BITS}); try a smaller exponent"
                )
        return base**exp

    def call(self, fname: str, args: list[Any]) -> Any:
        if fname == "log":
            if len(args) not in (1, 2):
                raise ToolError("log takes 1 or 2 arguments: log(x) (natural) or log(x, base)")
            return sympy.log(*args)
        if fname == "factorial":
            (n,) = self.arity(fname, args, 1)
            if not (n.is_integer and n >= 0):
                raise ToolError("factorial needs a non-negative integer")
            if n > MAX_FACTORIAL:
                raise ToolError(f"factorial argument too large (limit {MAX_FACTORIAL})")
            return sympy.factorial(n)
        if fname == "binomial":
            n, k = self.arity(fname, args, 2)
            if not (n.is_integer and k.is_integer):
                raise ToolError("binomial needs integers")
            if abs(n) > 10 * MAX_FACTORIAL:
                raise ToolError(f"binomial argument too large (limit {10 * MAX_FACTORIAL})")
            return sympy.binomial(n, k)
        if fname == "round":
            if len(args) not in (1, 2):
                raise ToolError("round takes 1 or 2 arguments: round(x) or round(x, digits)")
            digits = int(args[1]) if len(args) == 2 else 0
            if abs(digits) > 100:
                raise ToolError("round: at most 100 digits")
            scale = sympy.Integer(10) ** digits
            return sympy.floor(args[0] * scale + sympy.Rational(1, 2)) / scale
        for a in args:
            if isinstance(a, sympy.Rational) and _bits(a) > 1_000:
                raise ToolError(f"{fname}: argument too large (limit about 300 digits)")
        fn = _FUNCS.get(fname)
        if fn is None:
            raise ToolError(f"unknown function {fname!r}; known names: {', '.join(KNOWN_NAMES)}")
        if fname in ("exp", "sinh", "cosh") and args and args[0].is_number and abs(float(args[0])) > 1e5:
            raise ToolError(f"{fname} argument too large")
        if fname in _PERIODIC and args and args[0].is_number and _log2_abs(args[0]) > 64:
            # the value needs the argument reduced modulo pi to full precision: seconds of mpmath
            raise ToolError(f"{fname} argument too large (limit 2**64)")
        try:
            return fn(*args)
        except TypeError as e:
            raise ToolError(f"wrong number of arguments for {fname}: {e}") from e

    @staticmethod
    def arity(fname: str, args: list[Any], n: int) -> list[Any]:
        if len(args) != n:
            raise ToolError(f"{fname} takes {n} argument{'s' if n > 1 else ''}, got {len(args)}")
        return args


def _decimal(value: sympy.Expr) -> str:
    v = sympy.N(value, DIGITS)
    re_, im = v.as_real_imag()
    if im == 0:
        return _fmt(re_)
    imag = f"{_fmt(abs(im))}*I"
    if re_ == 0:
        return imag if im > 0 else f"-{imag}"
    return f"{_fmt(re_)} {'+' if im > 0 else '-'} {imag}"


def _fmt(v: sympy.Expr) -> str:
    """15 significant digits, trailing zeros dropped, scientific notation for large/small values."""
    f = sympy.Float(v, DIGITS)
    if f == 0:
        return "0"
    try:
        x = float(f)
    except OverflowError:
        x = math.inf
    if math.isinf(x):  # beyond float range: let mpmath print it
        return str(f)
    return f"{x:.{DIGITS}g}"


def evaluate(expression: str) -> str:
    """Evaluate ``expression`` exactly and format the result; raises ToolError with a fix-it hint."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("empty expression: write something like 12*(3+4)")
    if len(expression) > MAX_CHARS:
        raise ToolError(f"expression too long ({len(expression)} characters, limit {MAX_CHARS})")
    source = _normalise(expression)
    if "=" in source or "<" in source or ">" in source:
        raise ToolError("write an expression to evaluate, not an equation or comparison")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as e:
        raise ToolError(f"cannot parse {expression!r}: {e.msg} at column {e.offset}") from e
    except (RecursionError, MemoryError, ValueError) as e:
        raise ToolError(f"cannot parse {expression!r}: too complex") from e
    try:
        return format_value(_Evaluator(source).eval(tree))
    except ToolError:
        raise
    except RecursionError as e:
        raise ToolError("expression too complex") from e
    except Exception as e:  # sympy's own failures: always a message the model can read
        detail = str(e).strip() or "no detail"
        raise ToolError(f"cannot evaluate {expression!r}: {type(e).__name__}: {detail[:200]}") from e


def format_value(value: Any) -> str:
    """``"12"``, ``"391/4 = 97.75"``, ``"sqrt(2) = 1.41421356237310"`` (ASCII, short)."""
    value = sympy.sympify(value)
    if value.has(sympy.zoo, sympy.oo, -sympy.oo, sympy.nan):
        raise ToolError("the result is undefined or infinite (e.g. division by zero, log(0))")
    if isinstance(value, sympy.Integer):
        s = str(value)
        if len(s) <= MAX_EXACT_CHARS:
            return s
        return f"{_decimal(value)} (an integer with {len(s.lstrip('-'))} digits)"
    if value.free_symbols:
        raise ToolError("the expression has unknown symbols")
    if not isinstance(value, sympy.Rational) and sympy.count_ops(value) <= 20:
        value = sympy.simplify(value)
    exact = sympy.sstr(value)
    approx = _decimal(value)
    if isinstance(value, sympy.Integer):
        return exact if len(exact) <= MAX_EXACT_CHARS else approx
    if len(exact) > MAX_EXACT_CHARS:
        return f"≈ {approx}"
    return exact if exact == approx else f"{exact} = {approx}"


class CalculatorArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    expression: str = Field(
        description="A math expression, e.g. 391/4 or sqrt(2)*3 or 15% of 80",
        examples=["(12+7)*3"],
    )


class Calculator:
    """The ``calculator`` tool: exact arithmetic with sympy (no ``eval``)."""

    name = "calculator"
    description = "Evaluate a math expression exactly (fractions, powers, sqrt, sin, log, %)."
    args_schema = CalculatorArgs

    def __init__(self, timeout_s: float | None = 5.0, *, budget_s: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self.budget_s = budget_s
        shared_pool().prestart()

    async def run(self, args: BaseModel) -> str:
        expression = args.expression  # type: ignore[attr-defined]
        if len(expression) <= 40 and "(" not in expression:
            return evaluate(expression)  # tiny (numbers and operators, sizes checked): inline
        # Anything with functions runs in a worker process killed at the budget: sympy's
        # evaluation and formatting cannot be interrupted, and a thread would burn a core on.
        try:
            return await shared_pool().acall(evaluate, expression, timeout_s=self.budget_s)
        except BudgetExceeded:
            raise ToolError(
                f"the calculation took longer than {self.budget_s:g} s and was stopped; "
                "split it into smaller steps"
            ) from None


__all__ = ["Calculator", "CalculatorArgs", "evaluate", "format_value"]
