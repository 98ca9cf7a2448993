"""Every prompt of the flow agent, in one place; each can be overridden in the config
(``agent.prompts.planner: "..."``).

Modelled on AgentFlow's ``Planner.generate_next_step``, ``Executor.generate_tool_command``,
``Verifier.verificate_context`` and ``Planner.generate_direct_output`` (lupantech/AgentFlow,
``agentflow/agentflow/models/``), shortened for small models: one instruction per line and a fixed
output format. A module's ``*_prefix`` is written as the start of its reply (the model continues
from it): it pins the format for models that do not follow instructions well. A prefix belongs to
the prompt, so the planner is never trained on it.

Template fields (``str.format``):

- planner: ``{query}`` (q), ``{tools}`` (K: name and description of each tool), ``{memory}`` (M,
  rendered under its token cap), ``{step}``, ``{max_steps}``
- executor: ``{query}``, ``{sub_goal}``, ``{tool}``, ``{tool_schema}`` (JSON arguments), ``{example}``
  (a well-formed call of that tool)
- verifier and generator: ``{query}``, ``{memory}``
"""

from __future__ import annotations

import string

from pydantic import BaseModel, ConfigDict, model_validator

PLANNER_SYSTEM = "You plan the next step of solving a question with tools. You do not answer it."
PLANNER = """Question: {query}

Tools:
{tools}

Previous steps:
{memory}

This is step {step} of {max_steps}. Choose the single best tool for the next step and a concrete \
sub-goal for it that builds on the previous steps. Reply in exactly this format:
Sub-goal: <what the tool must find or compute>
Tool: <tool name>"""
PLANNER_PREFIX = "Sub-goal:"

EXECUTOR_SYSTEM = "You turn a sub-goal into one tool call."
EXECUTOR = """Question: {query}
Sub-goal: {sub_goal}
Tool: {tool}
Arguments: {tool_schema}

Write one call of {tool} that achieves the sub-goal, like this:
{example}"""
EXECUTOR_PREFIX = "<tool_call>"

VERIFIER_SYSTEM = "You check whether the steps so far are enough to answer a question."
VERIFIER = """Question: {query}

Steps so far:
{memory}

Do the results above contain the answer to the question? If yes, reply "Conclusion: STOP". If \
more tool calls are needed, reply "Conclusion: CONTINUE"."""
VERIFIER_PREFIX = "Conclusion:"

GENERATOR_SYSTEM = "You answer a question from the results of the steps taken."
GENERATOR = """Question: {query}

Steps taken:
{memory}

Give the final answer to the question, as short as possible, inside <answer></answer>."""
GENERATOR_PREFIX = "<answer>"

FIELDS: dict[str, set[str]] = {
    "planner": {"query", "tools", "memory", "step", "max_steps"},
    "executor": {"query", "sub_goal", "tool", "tool_schema", "example"},
    "verifier": {"query", "memory"},
    "generator": {"query", "memory"},
}


class Prompts(BaseModel):
    """The four modules' system prompts, templates and reply prefixes (defaults above)."""

    model_config = ConfigDict(extra="forbid")
    planner_system: str = PLANNER_SYSTEM
    planner: str = PLANNER
    planner_prefix: str = PLANNER_PREFIX
    executor_system: str = EXECUTOR_SYSTEM
    executor: str = EXECUTOR
    executor_prefix: str = EXECUTOR_PREFIX
    verifier_system: str = VERIFIER_SYSTEM
    verifier: str = VERIFIER
    verifier_prefix: str = VERIFIER_PREFIX
    generator_system: str = GENERATOR_SYSTEM
    generator: str = GENERATOR
    generator_prefix: str = GENERATOR_PREFIX

    @model_validator(mode="after")
    def _known_fields(self) -> Prompts:
        for module, allowed in FIELDS.items():
            template = getattr(self, module)
            try:
                used = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as e:
                raise ValueError(f"agent.prompts.{module} is not a valid format string: {e}") from None
            unknown = sorted(u for u in used if u.split(".")[0].split("[")[0] not in allowed)
            if unknown:
                raise ValueError(
                    f"agent.prompts.{module} uses unknown field(s) {unknown}; it can use "
                    f"{sorted(allowed)} (write a literal brace as {{{{ or }}}})"
                )
        return self


__all__ = ["FIELDS", "Prompts"]
