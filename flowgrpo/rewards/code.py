"""Code answers: the task's hidden tests run after the answer's code in the sandbox."""

from __future__ import annotations

import re

from flowgrpo.sandbox import SandboxLimits, arun_python

TESTS_PASSED_SENTINEL = "__FLOWGRPO_ALL_TESTS_PASSED__"


def extract_code(text: str) -> str:
    """The code in an answer: the last fenced block if any, else the text itself."""
    blocks = re.findall(r"```(?:python|py)?[^\n]*\n(.*?)```", text, flags=re.S)
    return (blocks[-1] if blocks else text).strip("\n")


def build_test_program(code: str, tests: str) -> str:
    """The program that runs ``tests`` (asserts) after ``code`` and prints the sentinel if all pass."""
    return f"{code}\n\n{tests}\n\nprint({TESTS_PASSED_SENTINEL!r})\n"


async def run_code_tests(
    code: str, tests: str, *, timeout_s: float = 10.0, allow_weak_isolation: bool = False
) -> bool:
    """Whether ``code`` passes ``tests`` in the code sandbox (:func:`flowgrpo.sandbox.arun_python`).

    Raises :class:`flowgrpo.sandbox.SandboxUnavailableError` where no isolation works, unless
    ``allow_weak_isolation`` accepts running the answer with rlimits only."""
    program = build_test_program(extract_code(code), tests)
    res = await arun_python(
        program, SandboxLimits(wall_s=timeout_s, allow_weak_isolation=allow_weak_isolation)
    )
    return res.exit_code == 0 and TESTS_PASSED_SENTINEL in res.stdout
