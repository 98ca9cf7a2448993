"""``gsm8k``: grade-school math word problems, answered in one turn (or with the calculator).

The task set is GSM8K's format (``{"question": ..., "answer": "<reasoning> #### N"}``), from one of:

- ``source="sample"`` (the default): the 400-problem GSM8K-format sample shipped in
  ``envs/data/gsm8k_sample_{train,test}.jsonl`` -- generated from templates by
  :mod:`flowgrpo.envs.gsm8k_sample`, **not GSM8K** -- so the recipes run offline out of the box;
- ``source="hf"``: real GSM8K through ``datasets.load_dataset("gsm8k", "main")``, read only from
  the local ``datasets`` cache (the hub is switched to offline mode for the call, so nothing is
  downloaded at run time; a missing cache is an error that says how to fill it once);
- ``source="jsonl"``: your own files, ``data_files={"train": path, "test": path}``.

Single turn by default (Cobbe et al. 2021's setting, and the GRPO recipes of the seed figures):
no tools, ``max_steps=1``, the model reasons briefly and ends with ``<answer>N</answer>``.
``calculator=True`` adds the built-in calculator tool and allows several turns (the rollout's
``max_turns`` bounds them). The gold answer is the number after ``####``; ``info["correct"]``
compares by value (:func:`flowgrpo.rewards.math_equal`), as the ``accuracy`` reward does.

The oracle (for the supervised warm start) writes the reference reasoning with the calculator
annotations removed and answers with the gold number; with the calculator it first calls the tool
on the solution's last annotated computation.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args

from flowgrpo.envs.arithmetic import parse_gsm8k_answer
from flowgrpo.envs.gsm8k_sample import ANNOTATION, SAMPLE_FILES

from flowgrpo.env import Split, Task, TaskOracle, ToolEnv, render_tool_call, tool_results
from flowgrpo.types import Message

Source = Literal["sample", "hf", "jsonl"]

SYSTEM_PROMPT = (
    "Solve the math word problem. Reason step by step in a few short sentences, "
    "then give the final answer as a number: <answer>N</answer>."
)
CALCULATOR_PROMPT = (
    "Solve the math word problem. Use the calculator tool for arithmetic. "
    "Reason briefly, then give the final answer as a number: <answer>N</answer>."
)


def reasoning_of(solution: str) -> str:
    """A GSM8K solution's reasoning as a reader sees it: the text before ``####`` with the
    ``<<48/2=24>>`` calculator annotations removed ("48/2 = <<48/2=24>>24" -> "48/2 = 24")."""
    return ANNOTATION.sub("", solution.rsplit("####", 1)[0]).strip()


def gsm8k_task(question: str, solution: str, task_id: str) -> Task:
    return Task(
        id=task_id,
        prompt=question.strip(),
        answer=parse_gsm8k_answer(solution),
        metadata={"answer_type": "math", "solution": solution},
    )


def read_jsonl(path: str | Path, *, task_prefix: str) -> list[Task]:
    """Tasks from a GSM8K-format JSONL file; a bad line is an error naming the file and line."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                tasks.append(gsm8k_task(row["question"], row["answer"], f"{task_prefix}-{i - 1:05d}"))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(
                    f"{path}:{i}: not a GSM8K row ({type(e).__name__}: {e}); each line must be "
                    '{"question": "...", "answer": "<reasoning> #### N"}'
                ) from e
    return tasks


@contextlib.contextmanager
def _hub_offline(datasets: Any) -> Iterator[None]:
    """The Hugging Face hub and ``datasets`` in offline mode for the duration (environment
    variables and the flags already read into ``datasets.config`` when it was imported)."""
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    old_env = {k: os.environ.get(k) for k in names}
    old_cfg = {k: getattr(datasets.config, k) for k in names if hasattr(datasets.config, k)}
    os.environ.update(dict.fromkeys(names, "1"))
    for k in old_cfg:
        setattr(datasets.config, k, True)
    try:
        yield
    finally:
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k, v in old_cfg.items():
            setattr(datasets.config, k, v)


def load_cached_gsm8k(split: Split, *, name: str = "gsm8k", config: str = "main") -> list[Task]:
    """Real GSM8K from the local ``datasets`` cache only; never downloads."""
    how = (
        f"download it once while online: python -c \"import datasets; datasets.load_dataset('{name}', "
        f"'{config}')\" (or use source: sample, the shipped GSM8K-format sample, or source: jsonl "
        "with data_files)"
    )
    try:
        import datasets
    except ImportError as e:
        raise ValueError(
            f"gsm8k source 'hf' needs the `datasets` package: pip install datasets, then {how}"
        ) from e
    try:
        with _hub_offline(datasets):
            rows = datasets.load_dataset(name, config, split=split)
    except Exception as e:
        raise ValueError(
            f"gsm8k source 'hf': {name!r}/{config!r} split {split!r} is not in the local datasets cache "
            f"({type(e).__name__}: {e}). This environment never downloads at run time; {how}"
        ) from e
    return [gsm8k_task(r["question"], r["answer"], f"gsm8k-{split}-{i:05d}") for i, r in enumerate(rows)]


class GSM8KOracle(TaskOracle):
    """The reference reasoning and the gold number; with the calculator, one call first."""

    def __init__(self, tasks: list[Task], *, calculator: bool) -> None:
        super().__init__(tasks)
        self.calculator = calculator

    async def act(self, messages: list[Message]) -> str:
        task = self.task_for(messages)
        solution = str(task.metadata.get("solution", ""))
        steps = ANNOTATION.findall(solution)
        called = any(m.name == "calculator" for m in tool_results(messages))
        if self.calculator and steps and not called:
            return "I will check the last computation.\n" + render_tool_call(
                "calculator", {"expression": steps[-1][0]}
            )
        return f"{reasoning_of(solution)}\n<answer>{task.answer}</answer>"


class GSM8KEnv(ToolEnv):
    """GSM8K-format math word problems.

    Args:
        source: ``"sample"`` (shipped GSM8K-format sample, default), ``"hf"`` (real GSM8K from the
            local ``datasets`` cache) or ``"jsonl"`` (``data_files``).
        data_files: ``{"train": path, "test": path}`` for ``source="jsonl"``.
        hf_name / hf_config: the ``datasets`` name and config for ``source="hf"``.
        calculator: add the calculator tool (multi-turn); default single turn, no tools.
        num_train / num_test: keep only the first n tasks of a split (None: all).
        max_steps: the env's own turn limit (default 1 without tools, none with the calculator).
    """

    name = "gsm8k"
    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        *,
        source: Source = "sample",
        data_files: dict[str, str] | None = None,
        hf_name: str = "gsm8k",
        hf_config: str = "main",
        calculator: bool = False,
        num_train: int | None = None,
        num_test: int | None = None,
        max_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        if source not in get_args(Source):
            raise ValueError(f"gsm8k: source must be one of {list(get_args(Source))}, got {source!r}")
        if source == "jsonl":
            if not data_files or set(data_files) != {"train", "test"}:
                raise ValueError('gsm8k: source "jsonl" needs data_files={"train": path, "test": path}')
        elif data_files is not None:
            raise ValueError(f"gsm8k: data_files is only read with source: jsonl (source is {source!r})")
        for key, n in (("num_train", num_train), ("num_test", num_test)):
            if n is not None and n < 1:
                raise ValueError(f"gsm8k: {key} must be >= 1 or null (all tasks), got {n}")
        tools: list[Any] = []
        if calculator:
            from flowgrpo.tools.calculator import Calculator

            tools = [Calculator()]
            kwargs.setdefault("system_prompt", CALCULATOR_PROMPT)
        super().__init__(tools, max_steps=max_steps if max_steps is not None or calculator else 1, **kwargs)
        self.source, self.data_files, self.calculator = source, data_files, calculator
        self.hf_name, self.hf_config = hf_name, hf_config
        self.limits = {"train": num_train, "test": num_test}
        self._cache: dict[str, list[Task]] = {}

    def tasks(self, split: Split) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if split not in self._cache:
            if self.source == "sample":
                tasks = read_jsonl(SAMPLE_FILES[split], task_prefix=f"gsm8k-sample-{split}")
            elif self.source == "jsonl":
                assert self.data_files is not None  # checked in __init__
                tasks = read_jsonl(self.data_files[split], task_prefix=f"gsm8k-jsonl-{split}")
            else:
                tasks = load_cached_gsm8k(split, name=self.hf_name, config=self.hf_config)
            self._cache[split] = tasks[: self.limits[split]]
        return list(self._cache[split])

    async def check_answer(self, answer: str, task: Task) -> bool | None:
        from flowgrpo.rewards import math_equal

        return None if task.answer is None else math_equal(answer, task.answer)

    def oracle(self) -> GSM8KOracle:
        return GSM8KOracle(self.tasks("train") + self.tasks("test"), calculator=self.calculator)
