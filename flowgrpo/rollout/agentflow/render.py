"""The flow agent's record of a step (``Turn.metadata["flow"]``) and of the episode's end
(``Trajectory.metadata["flow"]``) as text and HTML, for ``flowgrpo replay`` and the HTML report:
each module's input and output, the tool result, the verdict and the memory after the step."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + ln for ln in (str(text).splitlines() or [""]))


def _memory_lines(records: Any) -> str:
    if not records:
        return "(empty)"
    return "\n".join(
        f"step {r.get('step')}: sub-goal {r.get('sub_goal')!r} | tool {r.get('tool')} | command "
        f"{r.get('command')} | result {r.get('result')!r} | verdict {r.get('verdict')}"
        for r in records
    )


def _modules(meta: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    out = []
    for name in ("planner", "executor", "verifier", "generator"):
        io = meta.get(name)
        if isinstance(io, Mapping):
            out.append((name, io))
    return out


def flow_text(meta: Mapping[str, Any]) -> str:
    """One step's (or the episode end's) flow record as indented text."""
    lines: list[str] = []
    if "memory_in" in meta:
        lines += ["    [memory M the planner read]", _indent(meta["memory_in"])]
    for name, io in _modules(meta):
        lines += [
            f"    [{name} input]",
            _indent(io.get("prompt", "")),
            f"    [{name} output]",
            _indent(io.get("output", "")),
        ]
    if "tool_result" in meta:
        lines += ["    [tool result]", _indent(meta["tool_result"])]
    if "answer" in meta:
        lines.append(f"    [final answer] {meta.get('answer')}")
    if "memory" in meta:
        lines += [
            "    [memory after this step]" if "step" in meta else "    [final memory]",
            _indent(_memory_lines(meta["memory"])),
        ]
    return "\n".join(lines)


def flow_html(meta: Mapping[str, Any]) -> str:
    """One step's (or the episode end's) flow record as collapsible HTML blocks."""
    e = html.escape
    parts = []
    if "memory_in" in meta:
        parts.append(
            f"<details><summary>memory M (planner input)</summary><pre>{e(str(meta['memory_in']))}</pre></details>"
        )
    for name, io in _modules(meta):
        parts.append(
            f"<details><summary>{e(name)}: input / output</summary><pre>{e(str(io.get('prompt', '')))}</pre>"
            f"<pre><b>{e(str(io.get('output', '')))}</b></pre></details>"
        )
    if "memory" in meta:
        parts.append(
            f"<details><summary>memory after this step</summary><pre>{e(_memory_lines(meta['memory']))}</pre></details>"
        )
    return f'<div class="flow">{"".join(parts)}</div>'


__all__ = ["flow_html", "flow_text"]
