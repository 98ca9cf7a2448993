"""``arithmetic``: multi-step arithmetic word problems solved with the calculator.

Problems are generated (GSM8K-like, seeded): a person starts with some items and a chain of
operations changes the count ("buys 5 more", "gives 4 away", "shares them equally among 3 friends
and keeps one share", "doubles them"); the question asks for the final count. Every intermediate
value is a non-negative integer, so the gold answer is an integer. Difficulty = number of operations
and size of the numbers: level 1 (the default) is 1-3 operations on numbers below 100 with short
prompts and a short system prompt, sized for SmolLM2-135M; ``difficulty=[1, 2]`` mixes levels;
every knob is a constructor kwarg.

Real GSM8K-format data (``{"question": ..., "answer": "... #### 42"}`` JSONL) loads from a local
file with ``data_files={"train": path, "test": path}``, or through ``datasets`` with
``hf_dataset="openai/gsm8k"`` when that package is installed (this downloads: never in tests).

Splits: a generated problem belongs to the test split iff a hash of its prompt falls in the test
fraction, so train and test never share a prompt and a problem's split does not depend on how many
tasks were asked for.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any

from flowgrpo.env import Split, Task, TaskOracle, ToolEnv, render_tool_call, tool_results
from flowgrpo.types import Message

SYSTEM_PROMPT = (
    "Solve the math problem. Use the calculator tool for arithmetic. "
    "Give the final answer as <answer>N</answer>."
)

LEVELS: dict[int, dict[str, Any]] = {
    # num_ops: (min, max) operations; max_number: largest operand; max_value: cap on any
    # intermediate count; max_factor: largest multiplier/divisor.
    1: {"num_ops": (1, 3), "max_number": 99, "max_value": 999, "max_factor": 5},
    2: {"num_ops": (2, 4), "max_number": 999, "max_value": 9_999, "max_factor": 12},
    3: {"num_ops": (3, 6), "max_number": 9_999, "max_value": 999_999, "max_factor": 25},
}

_NAMES = [
    ("Ana", "She"), ("Ben", "He"), ("Cara", "She"), ("Dev", "He"), ("Eli", "He"), ("Fay", "She"),
    ("Gus", "He"), ("Hana", "She"), ("Ivo", "He"), ("Jia", "She"), ("Kofi", "He"), ("Lea", "She"),
    ("Max", "He"), ("Nia", "She"), ("Omar", "He"), ("Pia", "She"), ("Raj", "He"), ("Sara", "She"),
    ("Tom", "He"), ("Uma", "She"), ("Vic", "He"), ("Wen", "She"), ("Yusuf", "He"), ("Zoe", "She"),
]  # fmt: skip
_ITEMS = [
    "apples", "marbles", "stickers", "books", "coins", "pencils", "cookies", "stamps", "shells",
    "cards", "eggs", "beads", "toy cars", "balloons", "candies", "plums",
]  # fmt: skip


def _split_of(prompt: str, test_fraction: float) -> Split:
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big") / 2**64
    return "test" if h < test_fraction else "train"


def generate_problem(rng: random.Random, level: dict[str, Any]) -> tuple[str, str, int]:
    """One word problem: (prompt, calculator expression for the whole problem, integer answer)."""
    name, pron = rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    max_n, max_v, max_f = level["max_number"], level["max_value"], level["max_factor"]
    lo, hi = level["num_ops"]
    n_ops = rng.randint(lo, hi)
    if rng.random() < 0.25:  # "a boxes of b" counts as the first operation
        a, b = rng.randint(2, max(2, min(max_f * 2, max_n))), rng.randint(2, max_n)
        while a * b > max_v:
            b = max(2, b // 2)
        value, expr = a * b, f"{a} * {b}"
        sentences = [f"{name} has {a} boxes with {b} {item} in each box."]
        n_ops -= 1
    else:
        value = rng.randint(2, max_n)
        expr, sentences = str(value), [f"{name} has {value} {item}."]
    low_prec = False  # the expression's top operator is + or - (needs parentheses before * or /)
    for _ in range(n_ops):
        divisors = [d for d in range(2, max_f + 1) if value % d == 0 and value // d >= 1]
        choices = ["add", "sub", "mul", "div"]
        if value < 2:
            choices.remove("sub")
        if value * 2 > max_v:
            choices.remove("mul")
        if not divisors:
            choices.remove("div")
        op = rng.choice(choices)
        if op == "add":
            b = rng.randint(1, min(max_n, max(1, max_v - value)))
            value, expr, low_prec = value + b, f"{expr} + {b}", True
            obj = "her" if pron == "She" else "him"
            sentences.append(
                rng.choice(
                    [f"{pron} buys {b} more.", f"{pron} finds {b} more.", f"A friend gives {obj} {b} more."]
                )
            )
        elif op == "sub":
            b = rng.randint(1, min(max_n, value - 1))
            value, expr, low_prec = value - b, f"{expr} - {b}", True
            sentences.append(
                rng.choice(
                    [f"{pron} gives {b} away.", f"{pron} loses {b} of them.", f"{pron} uses {b} of them."]
                )
            )
        elif op == "mul":
            f = rng.randint(2, max(2, min(max_f, max_v // max(value, 1))))
            e = f"({expr})" if low_prec else expr
            value, expr, low_prec = value * f, f"{e} * {f}", False
            word = {2: "doubles", 3: "triples"}.get(f)
            sentences.append(
                f"{pron} {word} them."
                if word and rng.random() < 0.5
                else f"Then {pron.lower()} has {f} times as many."
            )
        else:
            d = rng.choice(divisors)
            e = f"({expr})" if low_prec else expr
            value, expr, low_prec = value // d, f"{e} / {d}", False
            sentences.append(f"{pron} shares them equally among {d} friends and keeps one share.")
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), expr, value


def parse_gsm8k_answer(answer: str) -> str:
    """The final number of a GSM8K answer ("... #### 1,234" -> "1234")."""
    if "####" not in answer:
        raise ValueError(f"not a GSM8K answer (no '####'): {answer[-80:]!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def load_gsm8k_jsonl(path: str | Path, *, split: Split, prefix: str = "gsm8k") -> list[Task]:
    """Tasks from a GSM8K-format JSONL file (one ``{"question", "answer"}`` object a line)."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            try:
                q, a = row["question"], row["answer"]
            except KeyError as e:
                raise ValueError(f"{path}:{i + 1}: GSM8K rows need 'question' and 'answer' keys") from e
            tasks.append(_gsm8k_task(q, a, f"{prefix}-{split}-{i:05d}"))
    return tasks


def _gsm8k_task(question: str, answer: str, task_id: str) -> Task:
    gold = parse_gsm8k_answer(answer)
    return Task(
        id=task_id,
        prompt=question.strip(),
        answer=gold,
        metadata={"answer_type": "math", "solution": answer, "expression": gold},
    )


def load_gsm8k_hf(name: str = "openai/gsm8k", *, split: Split, config: str = "main") -> list[Task]:
    """GSM8K through ``datasets`` (downloads unless cached; never used by the tests)."""
    try:
        import datasets
    except ImportError as e:
        raise ImportError("hf_dataset= needs the `datasets` package: pip install datasets") from e
    ds = datasets.load_dataset(name, config, split=split)
    return [_gsm8k_task(r["question"], r["answer"], f"gsm8k-{split}-{i:05d}") for i, r in enumerate(ds)]


def _number_text(text: str) -> str | None:
    """The last number in a calculator output, as an integer string when it is integral."""
    nums = re.findall(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?", text)
    if not nums:
        return None
    x = float(nums[-1].replace(",", ""))
    return str(round(x)) if abs(x - round(x)) < 1e-9 else nums[-1].replace(",", "")


class ArithmeticOracle(TaskOracle):
    """Calls the calculator once with the whole problem's expression, then answers with its output."""

    async def act(self, messages: list[Message]) -> str:
        task = self.task_for(messages)
        results = [m for m in tool_results(messages) if m.name == "calculator"]
        if results and not results[-1].content.startswith("Error"):
            value = _number_text(results[-1].content)
            if value is not None:
                return f"The calculator gives {value}.\n<answer>{value}</answer>"
        expr = task.metadata.get("expression") or task.answer or "0"
        return "I will compute the whole problem at once.\n" + render_tool_call(
            "calculator", {"expression": expr}
        )


class ArithmeticEnv(ToolEnv):
    """Arithmetic word problems with a calculator tool.

    Args:
        seed: seeds the generator (same seed -> same tasks).
        difficulty: a preset level (1, 2 or 3, see ``LEVELS``), or a list of levels for a mix: each
            problem draws its level uniformly from the list (``[1, 2]``: about half each; repeat a
            level to weight it); a task's level is in ``metadata["level"]``. The kwargs below override every level.
        num_ops: (min, max) operations per problem.
        max_number: largest operand; max_value: cap on intermediate counts; max_factor: largest
            multiplier or divisor.
        num_train / num_test: how many generated tasks per split.
        test_fraction: share of the problem space hashed into the test split.
        data_files: ``{"train": path, "test": path}`` GSM8K-format JSONL instead of generation.
        hf_dataset: a ``datasets`` name (e.g. ``"openai/gsm8k"``) instead of generation.
        tools: override the tool list (default: the built-in calculator).
    """

    name = "arithmetic"
    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        *,
        seed: int = 0,
        difficulty: int | list[int] = 1,
        num_ops: tuple[int, int] | None = None,
        max_number: int | None = None,
        max_value: int | None = None,
        max_factor: int | None = None,
        num_train: int = 2000,
        num_test: int = 200,
        test_fraction: float = 0.2,
        data_files: dict[str, str] | None = None,
        hf_dataset: str | None = None,
        tools: list[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        wanted = [difficulty] if isinstance(difficulty, int) else list(difficulty)
        bad = [d for d in wanted if d not in LEVELS]
        if not wanted or bad:
            raise ValueError(
                f"difficulty must be one of {sorted(LEVELS)} or a non-empty list of them, got {difficulty}"
            )
        overrides = {
            "num_ops": num_ops,
            "max_number": max_number,
            "max_value": max_value,
            "max_factor": max_factor,
        }
        levels: dict[int, dict[str, Any]] = {}
        for d in wanted:
            level = dict(LEVELS[d])
            for k, v in overrides.items():
                if v is not None:
                    level[k] = tuple(v) if k == "num_ops" else v
            if level["num_ops"][0] < 1 or level["num_ops"][0] > level["num_ops"][1]:
                raise ValueError(f"num_ops must be (min, max) with 1 <= min <= max, got {level['num_ops']}")
            if level["max_number"] < 2 or level["max_factor"] < 2:
                raise ValueError("max_number and max_factor must be >= 2")
            levels[d] = level
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        if tools is None:
            from flowgrpo.tools.calculator import Calculator

            tools = [Calculator()]
        super().__init__(tools, **kwargs)
        self.seed, self.difficulty, self.levels = seed, wanted, levels
        self.num_train, self.num_test, self.test_fraction = num_train, num_test, test_fraction
        self.data_files, self.hf_dataset = data_files, hf_dataset
        self._cache: dict[str, list[Task]] = {}

    def tasks(self, split: Split) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if split not in self._cache:
            if self.data_files is not None:
                self._cache[split] = load_gsm8k_jsonl(self.data_files[split], split=split)
            elif self.hf_dataset is not None:
                self._cache[split] = load_gsm8k_hf(self.hf_dataset, split=split)
            else:
                self._cache.update(self._generate())
        return list(self._cache[split])

    def _generate(self) -> dict[str, list[Task]]:
        rng = random.Random(f"arithmetic:{self.seed}")
        want = {"train": self.num_train, "test": self.num_test}
        out: dict[str, list[Task]] = {"train": [], "test": []}
        seen: set[str] = set()
        attempts = 0
        while len(out["train"]) < want["train"] or len(out["test"]) < want["test"]:
            attempts += 1
            if attempts > 50 * (want["train"] + want["test"]) + 1000:
                raise ValueError(
                    f"could not generate {want} distinct problems at levels {self.levels}: "
                    "raise max_number / num_ops or ask for fewer tasks"
                )
            # one level: the stream of problems draws nothing extra (the same tasks as ever)
            d = self.difficulty[0] if len(self.difficulty) == 1 else rng.choice(self.difficulty)
            prompt, expr, value = generate_problem(rng, self.levels[d])
            if prompt in seen:
                continue
            seen.add(prompt)
            split = _split_of(prompt, self.test_fraction)
            if len(out[split]) >= want[split]:
                continue
            n = len(out[split])
            out[split].append(
                Task(
                    id=f"arithmetic-{self.seed}-{split}-{n:05d}",
                    prompt=prompt,
                    answer=str(value),
                    metadata={
                        "answer_type": "math",
                        "expression": expr,
                        "num_ops": expr.count(" ") // 2,
                        "level": d,
                    },
                )
            )
        return out

    async def check_answer(self, answer: str, task: Task) -> bool | None:
        from flowgrpo.rewards import math_equal

        return None if task.answer is None else math_equal(answer, task.answer)

    def oracle(self) -> ArithmeticOracle:
        return ArithmeticOracle(self.tasks("train") + self.tasks("test"))
