"""Answer rewards: ``accuracy`` (the final answer against the gold one) and ``format``.

Math answers are compared by value with sympy (``1,234`` = ``1234``; ``0.5`` = ``1/2`` =
``\\boxed{\\frac{1}{2}}``; ``$18.00`` = ``18 dollars`` = ``18``; ``50%`` = ``50`` or ``0.5``; unicode
minus), never by substring (``118`` is not ``18``). Text answers: normalised exact match or token F1
(SQuAD normalisation). Code answers: the task's hidden tests run in the sandbox
(:mod:`flowgrpo.rewards.code`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import string
from collections import Counter
from typing import Any, Literal

from flowgrpo.rewards.base import Reward, final_answer, final_text
from flowgrpo.rewards.code import run_code_tests
from flowgrpo.sandbox.bounded import BudgetExceeded, shared_pool
from flowgrpo.types import Task, Trajectory
from flowgrpo.utils.aio import run_in_thread, run_sync

log = logging.getLogger(__name__)

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_DIGITS = re.compile(r"\\[dt]?frac\s*(?:\{([^{}]*)\}|(\d))\s*(?:\{([^{}]*)\}|(\d))")
_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree")
_BRACED_POWER = re.compile(r"\^\s*\{([^{}]*)\}")
_SCI = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?|\.\d+)[eE]([-+]?\d{1,4})(?![\w.])")
_LEADING_ZEROS = re.compile(r"(?<![\d.,])0+(?=\d)")
# A power the numeric path evaluates: an integer base of at most 4 digits to an integer exponent
# of at most 3 digits, not itself raised again (9999**999 is about 13,000 bits: instant).
_SAFE_POWER = re.compile(r"(?<![\w.)])\d{1,4}\*\*\(?[-+]?\d{1,3}\)?(?![\w.(]|\*\*)")
MAX_ANSWER_CHARS = 1000  # the normaliser reads at most this much of an answer
SYMBOLIC_BUDGET_S = 2.0  # wall-clock budget of one symbolic comparison (in a worker process)
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d])")


def _strip_boxed(s: str) -> str:
    """The content of the last ``\\boxed{...}`` (nested braces handled), else ``s``."""
    matches = list(_BOXED.finditer(s))
    if not matches:
        return s
    start = matches[-1].end()
    depth = 1
    for i in range(start, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return s[start:i]
    return s[start:]


def normalize_math(s: str) -> tuple[str, bool]:
    """A math answer reduced to a plain expression string, and whether it carried a percent sign.

    Handles ``\\boxed{}``, ``$...$``, ``\\frac{a}{b}``, thousands separators, currency, units and
    trailing words ("18 dollars"), a leading "x =" or "answer:", unicode minus, ``^`` powers.
    """
    s = _strip_boxed(s.strip()[:MAX_ANSWER_CHARS])
    s = s.replace("\u2212", "-").replace("\u2013", "-").replace("\u00d7", "*").replace("\u00f7", "/")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    s = _TEXT.sub(r" \1 ", s)  # \text{ cm} -> " cm " (a unit word, dropped below)
    s = _DEGREES.sub("", s)  # 90^\circ, 90^{\circ}, 90°
    s = _BRACED_POWER.sub(r"^(\1)", s)  # 10^{5} -> 10^(5)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = _FRAC_DIGITS.sub(lambda m: f"({m[1] or m[2]})/({m[3] or m[4]})", s)  # \frac12, \frac{1}2
    s = _SCI.sub(r"\1*10^(\2)", s)  # 1.5e3, 1.5E-3
    s = s.replace("\\%", "%").replace("$", "").replace("\\", "")
    percent = "%" in s or bool(re.search(r"\bper\s*cent\b|\bpercent\b", s, re.I))
    s = s.replace("%", "")
    s = re.sub(r"\bper\s*cent\b|\bpercent\b", "", s, flags=re.I)
    s = re.sub(r"^\s*(?:the\s+)?(?:final\s+)?(?:answer|result)\s*(?:is|:|=)?\s*", "", s, flags=re.I)
    s = re.sub(r"^\s*[a-zA-Z]\s*=\s*", "", s)  # "x = 5"
    s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    s = _LEADING_ZEROS.sub("", s)  # 007 -> 7 (a Python int literal cannot have leading zeros)
    s = re.sub(r"[€£¥]|\b(?:USD|EUR|GBP)\b", "", s)
    # drop unit words around a number: "18 dollars", "3.5 kg", "about 7 apples each"
    # (a unit is a word after a space or 2+ letters, so "2x" keeps its variable)
    if re.search(r"\d", s):
        s = re.sub(r"(?:\s*/\s*[A-Za-z]|\s+[A-Za-z]|[A-Za-z]{2})[A-Za-z\s'./]*$", "", s.strip()).strip()
    s = re.sub(r"^[A-Za-z][A-Za-z\s']*?(?=[-+(\d.])", "", s).strip()
    s = s.rstrip(".").strip().replace("^", "**")
    return s, percent


def parse_number(s: str) -> Any | None:
    """A sympy number for a normalised numeric expression, or None.

    Only digits, ``. + - * / ( )`` and spaces are parsed (nothing else reaches sympify), and the only
    powers are small ones (``2**10``, ``10**(-3)``: a base of at most 4 digits, an exponent of at most
    3, at most 4 of them, none raised again), so a hostile answer cannot make the reward evaluate
    arbitrary code or hang.
    """
    import sympy

    if not s or len(s) > 200 or not re.fullmatch(r"[-+*/().\d\s]+", s) or not re.search(r"\d", s):
        return None
    powers = s.count("**")
    if powers and (powers > 4 or len(_SAFE_POWER.findall(s)) != powers):
        return None
    try:
        v = sympy.sympify(s, rational=True)
    except (sympy.SympifyError, SyntaxError, TypeError, ValueError, ArithmeticError, RecursionError):
        return None
    return v if getattr(v, "is_number", False) and v.is_finite else None


def math_equal(pred: str | None, gold: str | None, *, rel_tol: float = 1e-6) -> bool:
    """Whether two math answers have the same value (see :func:`normalize_math`).

    Percent: ``"50%"`` equals gold ``"50"`` and gold ``"0.5"``. Falls back to comparing normalised
    strings when either side is not a number (e.g. ``"x+1"`` vs ``"1+x"`` via sympy simplify).
    """
    if pred is None or gold is None:
        return False
    (p, p_pct), (g, g_pct) = normalize_math(pred), normalize_math(gold)
    pv, gv = parse_number(p), parse_number(g)
    if pv is not None and gv is not None:
        cands_p = [pv] + ([pv / 100] if p_pct else [])
        cands_g = [gv] + ([gv / 100] if g_pct else [])
        for a in cands_p:
            for b in cands_g:
                if a == b:
                    return True
                fa, fb = float(a), float(b)
                if math.isclose(fa, fb, rel_tol=rel_tol, abs_tol=1e-9):
                    return True
        return False
    if p and p == g:
        return True
    if not _symbolic_candidate(p) or not _symbolic_candidate(g):
        return False
    try:
        return shared_pool().call(_symbolic_equal, p, g, timeout_s=SYMBOLIC_BUDGET_S)
    except BudgetExceeded as e:
        log.warning("symbolic comparison of %r and %r stopped: %s; scored as not equal", p, g, e)
        return False


def _symbolic_candidate(s: str) -> bool:
    """Small expressions in single-letter variables (e.g. ``2x+1``): what :func:`_symbolic_equal`
    reads; checked here so other answers never cost a worker round trip."""
    if not s or len(s) > 100 or "**" in s or not re.fullmatch(r"[-+*/().\d\sa-z]+", s):
        return False
    return not re.search(r"[a-z]{2,}", s) and bool(re.search(r"[a-z]", s))


def _symbolic_equal(a: str, b: str) -> bool:
    """sympy equality for small symbolic expressions in single-letter variables (e.g. 2x+1).

    Runs in a worker process under :data:`SYMBOLIC_BUDGET_S` (see :func:`math_equal`): ``simplify``
    has no time bound of its own (a 53-character answer held the reward for ~25 s)."""
    if not (_symbolic_candidate(a) and _symbolic_candidate(b)):
        return False
    try:
        from sympy.parsing.sympy_parser import (
            implicit_multiplication_application,
            parse_expr,
            standard_transformations,
        )

        tr = (*standard_transformations, implicit_multiplication_application)
        import sympy

        return bool(
            sympy.simplify(parse_expr(a, transformations=tr) - parse_expr(b, transformations=tr)) == 0
        )
    except Exception:
        return False


def normalize_text(s: str) -> str:
    """Lowercase, drop punctuation and articles (a, an, the), collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(pred: str | None, gold: str | None) -> float:
    if pred is None or gold is None:
        return 0.0
    return float(normalize_text(pred) == normalize_text(gold))


def f1_score(pred: str | None, gold: str | None) -> float:
    """Token-level F1 between normalised strings (SQuAD, Rajpurkar et al. 2016)."""
    if pred is None or gold is None:
        return 0.0
    p, g = normalize_text(pred).split(), normalize_text(gold).split()
    if not p or not g:
        return float(p == g)
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


AnswerType = Literal["auto", "math", "text", "code"]


class AccuracyReward(Reward):
    """1.0 when the final answer matches the gold one (text: EM, or F1 with ``text_metric="f1"``).

    ``answer_type="auto"`` reads ``task.metadata["answer_type"]``, else treats a numeric gold answer
    as math and anything else as text. Code tasks need ``metadata["tests"]`` (assert statements);
    ``allow_weak_isolation`` lets them run where the sandbox has no isolation (see ``grade_code``).
    """

    def __init__(
        self,
        *,
        answer_type: AnswerType = "auto",
        text_metric: Literal["em", "f1"] = "em",
        answer_tag: str = "answer",
        code_timeout_s: float = 10.0,
        allow_weak_isolation: bool = False,
    ) -> None:
        self.answer_type, self.text_metric = answer_type, text_metric
        self.answer_tag, self.code_timeout_s = answer_tag, code_timeout_s
        self.allow_weak_isolation = allow_weak_isolation

    def kind(self, task: Task) -> str:
        if self.answer_type != "auto":
            return self.answer_type
        declared = task.metadata.get("answer_type")
        if declared in ("math", "text", "code"):
            return declared
        if task.answer is not None and parse_number(normalize_math(task.answer)[0]) is not None:
            return "math"
        return "text"

    def score_answer(self, answer: str | None, task: Task) -> float:
        """Score a bare answer string (math/text tasks)."""
        kind = self.kind(task)
        if kind == "math":
            return float(math_equal(answer, task.answer))
        if kind == "text":
            golds = [task.answer, *task.metadata.get("aliases", [])]
            metric = f1_score if self.text_metric == "f1" else exact_match
            return max((metric(answer, g) for g in golds if g is not None), default=0.0)
        raise ValueError("code answers are scored asynchronously: use ascore")

    async def ascore(self, traj: Trajectory, task: Task) -> float:
        answer = final_answer(traj, self.answer_tag)
        if self.kind(task) == "code":
            tests = task.metadata.get("tests")
            if answer is None or not tests:
                return 0.0
            return float(
                await run_code_tests(
                    answer,
                    tests,
                    timeout_s=self.code_timeout_s,
                    allow_weak_isolation=self.allow_weak_isolation,
                )
            )
        # off the event loop: a symbolic comparison waits up to SYMBOLIC_BUDGET_S for its worker
        return await run_in_thread(self.score_answer, answer, task)

    def score(self, traj: Trajectory, task: Task) -> float:
        return run_sync(self.ascore(traj, task))


class FormatReward(Reward):
    """Format: ``answer_weight`` if the last action holds exactly one complete answer tag, plus
    ``tool_weight`` times the fraction of actions whose tool calls all parse. With
    ``partial_credit=False`` the score is 1 only when both hold everywhere, else 0."""

    def __init__(
        self,
        *,
        answer_tag: str = "answer",
        answer_weight: float = 0.5,
        tool_weight: float = 0.5,
        partial_credit: bool = True,
        parser: Any = None,
    ) -> None:
        if answer_weight < 0 or tool_weight < 0 or answer_weight + tool_weight <= 0:
            raise ValueError("answer_weight and tool_weight must be >= 0 with a positive sum")
        total = answer_weight + tool_weight
        self.answer_weight, self.tool_weight = answer_weight / total, tool_weight / total
        self.answer_tag, self.partial_credit = answer_tag, partial_credit
        self._parser = parser

    @property
    def parser(self) -> Any:
        if self._parser is None:
            from flowgrpo.chat.parsing import HermesParser

            self._parser = HermesParser(answer_tag=self.answer_tag)
        return self._parser

    def answer_ok(self, text: str) -> bool:
        tag = re.escape(self.answer_tag)
        opens = len(re.findall(rf"<{tag}>", text))
        closes = len(re.findall(rf"</{tag}>", text))
        return opens == 1 and closes == 1 and re.search(rf"<{tag}>.*?</{tag}>", text, re.S) is not None

    def tool_fraction(self, traj: Trajectory) -> float:
        if not traj.turns:
            return 0.0
        ok = 0
        for turn in traj.turns:
            with contextlib.suppress(Exception):  # a parser crash counts as malformed
                ok += not self.parser.parse(turn.action.content).errors
        return ok / len(traj.turns)

    def score(self, traj: Trajectory, task: Task) -> float:
        a = float(self.answer_ok(final_text(traj)))
        t = self.tool_fraction(traj)
        if not self.partial_credit:
            return float(a == 1.0 and t == 1.0)
        return self.answer_weight * a + self.tool_weight * t
