"""The flow agent's evolving memory M: one typed record per step, rendered into every prompt.

AgentFlow keeps ``{"Action Step k": {tool_name, sub_goal, command, result}}`` and renders the whole
dict into the planner's prompt (``agentflow/models/memory.py``). Here a record is typed and also
holds the verifier's verdict, and the rendered text has a cap in tokens.

Truncation rule (stated, deterministic):

1. When a step is recorded, its tool result is cut to ``result_max_chars`` characters (a cut
   ends with ``" ..."``).
2. When the rendered memory exceeds ``max_tokens`` tokens, the oldest records are left out first
   (replaced by one line ``"(N earlier steps omitted)"``); the newest record is always kept.
3. If the newest record alone still exceeds the cap, its text is cut to the first ``max_tokens``
   tokens (the sub-goal and tool come first, so they survive).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

Verdict = Literal["STOP", "CONTINUE"]
EMPTY = "(none yet)"


class MemoryRecord(BaseModel):
    """One step: the planner's sub-goal and tool, the executor's command, a summary of the tool's
    result, and the verifier's verdict (None until the verifier has read the step)."""

    model_config = ConfigDict(extra="forbid")
    step: int
    sub_goal: str
    tool: str
    command: str
    result: str
    verdict: Verdict | None = None

    def render(self) -> str:
        lines = [
            f"Step {self.step}:",
            f"  Sub-goal: {self.sub_goal}",
            f"  Tool: {self.tool}",
            f"  Command: {self.command}",
            f"  Result: {self.result}",
        ]
        if self.verdict is not None:
            lines.append(f"  Verifier: {self.verdict}")
        return "\n".join(lines)


def summarize_result(text: str, max_chars: int) -> str:
    """Rule 1: the result cut to ``max_chars`` characters (whitespace runs collapsed first)."""
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[: max(0, max_chars - 4)] + " ..."


class Memory:
    """The records of one episode, in step order.

    Args:
        encode / decode: the tokenizer's text <-> ids, to measure and cut the rendered text.
        max_tokens: the cap of :meth:`render` (rules 2 and 3 of the module docstring).
        result_max_chars: rule 1.
    """

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        decode: Callable[[Sequence[int]], str],
        *,
        max_tokens: int,
        result_max_chars: int,
    ) -> None:
        self.encode, self.decode = encode, decode
        self.max_tokens, self.result_max_chars = max_tokens, result_max_chars
        self.records: list[MemoryRecord] = []

    def add(self, step: int, sub_goal: str, tool: str, command: str, result: str) -> MemoryRecord:
        rec = MemoryRecord(
            step=step,
            sub_goal=sub_goal,
            tool=tool,
            command=command,
            result=summarize_result(result, self.result_max_chars),
        )
        self.records.append(rec)
        return rec

    def render(self) -> str:
        """The memory as prompt text, within ``max_tokens`` tokens."""
        if not self.records:
            return EMPTY
        blocks = [r.render() for r in self.records]
        for first in range(len(blocks)):
            kept = blocks[first:]
            text = "\n".join(([f"({first} earlier steps omitted)"] if first else []) + kept)
            if len(self.encode(text)) <= self.max_tokens:
                return text
        return self.decode(self.encode(blocks[-1])[: self.max_tokens])  # rule 3

    def snapshot(self) -> list[dict]:
        """The records as JSON-ready dicts (stored in each planner turn's metadata)."""
        return [r.model_dump(mode="json") for r in self.records]


__all__ = ["EMPTY", "Memory", "MemoryRecord", "Verdict", "summarize_result"]
