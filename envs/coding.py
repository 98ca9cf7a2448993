"""``coding``: write a short Python function; hidden unit tests in the code sandbox decide.

The policy may run code with the ``python`` tool (the sandbox of ``flowgrpo.tools.code``) as often
as it likes, then answers with the function inside the answer tag (a fenced block is fine):
``<answer>```python\\ndef f(x): ...\\n```</answer>``. The episode's ``info["correct"]`` and the
``accuracy`` reward (``answer_type="code"``) run the task's hidden asserts after the answer in the
sandbox; the model never sees them.

Data: 41 tasks written for this project ship in ``envs/data/coding_tasks.jsonl`` (``id``, ``prompt``,
``entry_point``, ``solution``, ``tests``). HumanEval-style (``task_id``, ``prompt``,
``canonical_solution``, ``test``, ``entry_point``) and MBPP-style (``task_id``, ``text``, ``code``,
``test_list``) JSONL files load with ``data_files=path`` (the format is detected per row).
A task's split is a seeded hash of its id, so train and test never share a task.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from flowgrpo.env import Split, Task, TaskOracle, ToolEnv, render_tool_call, tool_results
from flowgrpo.types import Message

SYSTEM_PROMPT = (
    "Write the requested Python function. You may test code with the python tool. "
    "Give the final code as <answer>```python\n...\n```</answer>."
)
BUNDLED_TASKS = Path(__file__).parent / "data" / "coding_tasks.jsonl"


def task_from_row(row: dict[str, Any], *, index: int = 0) -> Task:
    """A Task from one JSONL row in the bundled, HumanEval or MBPP format."""
    if {"prompt", "entry_point", "solution", "tests"} <= row.keys() and "canonical_solution" not in row:
        tid, prompt, sol, tests, entry = (
            row["id"],
            row["prompt"],
            row["solution"],
            row["tests"],
            row["entry_point"],
        )
    elif {"prompt", "canonical_solution", "test", "entry_point"} <= row.keys():  # HumanEval
        tid, entry = str(row.get("task_id", index)), row["entry_point"]
        prompt = f"Complete the following Python function.\n```python\n{row['prompt'].rstrip()}\n```"
        sol = row["prompt"] + row["canonical_solution"]
        tests = f"{row['test']}\n\ncheck({entry})\n"
    elif {"text", "code", "test_list"} <= row.keys():  # MBPP
        tid = str(row.get("task_id", index))
        first = row["test_list"][0] if row["test_list"] else ""
        prompt = f"{row['text'].strip()} Your code should pass this test:\n{first}"
        sol = row["code"]
        setup = row.get("test_setup_code") or ""
        tests = f"{setup}\n" + "\n".join(row["test_list"]) + "\n"
        entry = first.split("assert", 1)[-1].strip().split("(", 1)[0].strip() if first else ""
    else:
        raise ValueError(
            f"row {index}: unknown coding-task format with keys {sorted(row)}; expected the bundled format "
            "(id, prompt, entry_point, solution, tests), HumanEval (task_id, prompt, canonical_solution, "
            "test, entry_point) or MBPP (task_id, text, code, test_list)"
        )
    return Task(
        id=f"coding-{tid}".replace("/", "-"),
        prompt=prompt,
        answer=None,
        metadata={"answer_type": "code", "entry_point": entry, "tests": tests, "solution": sol},
    )


def load_coding_jsonl(path: str | Path) -> list[Task]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [task_from_row(r, index=i) for i, r in enumerate(rows)]


def format_code_answer(code: str) -> str:
    return f"<answer>\n```python\n{code.rstrip()}\n```\n</answer>"


class CodingOracle(TaskOracle):
    """Runs the reference solution against a smoke test in the real sandbox, then answers with it."""

    async def act(self, messages: list[Message]) -> str:
        task = self.task_for(messages)
        solution: str = task.metadata["solution"]
        if not [m for m in tool_results(messages) if m.name == "python"]:
            entry = task.metadata.get("entry_point") or "solution"
            code = f"{solution.rstrip()}\n\nprint({entry!r}, 'defined:', callable({entry}))\n"
            return "Let me check my function first.\n" + render_tool_call("python", {"code": code})
        return "The function works.\n" + format_code_answer(solution)


class CodingEnv(ToolEnv):
    """Function-writing tasks checked by hidden tests in the code sandbox.

    Args:
        seed: seeds the train/test split.
        data_files: a JSONL file (or list of files) of tasks; default: the 41 bundled tasks.
        test_fraction: share of tasks hashed into the test split.
        code_timeout_s: limit for running the hidden tests of one answer.
        allow_weak_isolation: run the ``python`` tool and the hidden tests with rlimits only where no
            sandbox isolation (bubblewrap, unshare) works here; without it such a host refuses.
        tools: override the tool list (default: the built-in CodeTool).
    """

    name = "coding"
    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        *,
        seed: int = 0,
        data_files: str | list[str] | None = None,
        test_fraction: float = 0.3,
        code_timeout_s: float = 10.0,
        allow_weak_isolation: bool = False,
        tools: list[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        if tools is None:
            from flowgrpo.tools.code import CodeTool, SandboxLimits

            tools = [CodeTool(SandboxLimits(allow_weak_isolation=allow_weak_isolation))]
        super().__init__(tools, **kwargs)
        files = (
            [BUNDLED_TASKS]
            if data_files is None
            else [data_files]
            if isinstance(data_files, str)
            else data_files
        )
        self.seed, self.test_fraction, self.code_timeout_s = seed, test_fraction, code_timeout_s
        self.allow_weak_isolation = allow_weak_isolation
        self._all: list[Task] = []
        for f in files:
            self._all += load_coding_jsonl(f)
        ids = [t.id for t in self._all]
        if len(set(ids)) != len(ids):
            raise ValueError("coding tasks must have unique ids across data_files")

    def _split_of(self, task: Task) -> Split:
        h = int.from_bytes(hashlib.sha256(f"{self.seed}:{task.id}".encode()).digest()[:8], "big") / 2**64
        return "test" if h < self.test_fraction else "train"

    def tasks(self, split: Split) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        return [t for t in self._all if self._split_of(t) == split]

    async def check_answer(self, answer: str, task: Task) -> bool | None:
        from flowgrpo.rewards import run_code_tests

        tests = task.metadata.get("tests")
        if not tests:
            return None
        return await run_code_tests(
            answer, tests, timeout_s=self.code_timeout_s, allow_weak_isolation=self.allow_weak_isolation
        )

    def oracle(self) -> CodingOracle:
        return CodingOracle(self._all)
