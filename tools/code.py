"""The ``python`` tool: runs model-written code in the sandbox of :mod:`flowgrpo.sandbox.python`.

The sandbox itself (process isolation, limits, ``run_python``/``arun_python``) lives in the core so
that the code-test reward can use it without importing a plugin; its names are re-exported here.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.sandbox.python import (
    SandboxCapabilities,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    arun_python,
    require_isolation,
    run_python,
    sandbox_capabilities,
)
from flowgrpo.tool import ToolError, ToolOutput

_LIMIT_TEXT = {
    "wall": "time limit exceeded ({wall_s:g} s wall clock); the process was killed",
    "cpu": "CPU time limit exceeded ({cpu_s} s); the process was killed",
    "memory": "memory limit exceeded ({memory_mb} MB)",
    "processes": "process limit reached ({max_processes} processes)",
    "file_size": "file size limit exceeded ({file_size_mb} MB per file)",
    "disk": "disk space limit exceeded ({disk_mb} MB)",
    "output": "output limit exceeded ({max_output_bytes} bytes); the process was killed",
}


def format_result(r: SandboxResult, limits: SandboxLimits) -> str:
    """The observation the model reads: stdout, then stderr, then exit status / limit."""
    parts = []
    if r.stdout:
        parts.append(r.stdout.rstrip("\n"))
    if r.stderr:
        parts.append("stderr:\n" + r.stderr.rstrip("\n"))
    if r.limit_hit:
        parts.append("Error: " + _LIMIT_TEXT[r.limit_hit].format(**limits.model_dump()))
    elif r.signal is not None:
        parts.append(f"Error: killed by signal {signal.Signals(r.signal).name}")
    elif r.exit_code:
        parts.append(f"exit code {r.exit_code}")
    return "\n".join(parts) if parts else "(no output)"


class CodeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str = Field(description="Python code to run; print what you want to see", examples=["print(2**10)"])


class CodeTool:
    """The ``python`` tool: runs the code in the sandbox, shows stdout/stderr and the exit status.

    Construction fails with :class:`SandboxUnavailableError` when no isolation works on this host and
    ``limits.allow_weak_isolation`` is not set (in a config: ``allow_weak_isolation: true`` in the
    tool's limits, or in the ``coding`` environment's kwargs)."""

    name = "python"
    description = "Run Python code in a sandbox and return what it prints."
    args_schema = CodeArgs

    def __init__(
        self, limits: SandboxLimits | Mapping[str, Any] | None = None, *, max_code_chars: int = 20_000
    ) -> None:
        self.limits = limits if isinstance(limits, SandboxLimits) else SandboxLimits(**(limits or {}))
        require_isolation(self.limits)
        self.max_code_chars = max_code_chars
        self.timeout_s = self.limits.wall_s + 5.0  # the sandbox enforces wall_s itself

    async def run(self, args: BaseModel) -> ToolOutput:
        code = args.code  # type: ignore[attr-defined]
        if len(code) > self.max_code_chars:
            raise ToolError(f"code too long ({len(code)} characters, limit {self.max_code_chars})")
        r = await arun_python(code, self.limits)
        return ToolOutput(content=format_result(r, self.limits), artifact=r.model_dump())


__all__ = [
    "CodeArgs",
    "CodeTool",
    "SandboxCapabilities",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "arun_python",
    "format_result",
    "run_python",
    "sandbox_capabilities",
]
