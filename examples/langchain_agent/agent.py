"""A small calculator agent written with LangChain, trained by flowgrpo without being rewritten.

It is an ordinary LangChain tool-calling loop: a ``ChatOpenAI`` chat model with a ``@tool``
calculator bound (``.bind_tools``), langchain-core messages (``SystemMessage``, ``HumanMessage``,
``AIMessage``, ``ToolMessage``), the tool run on every call the model makes, until the model answers
or ``MAX_TURNS`` calls were made. Nothing in it knows about RL: it talks to whatever
OpenAI-compatible server ``OPENAI_BASE_URL`` names.

Trained with ``flowgrpo train examples/langchain_agent/config.yaml``: the trainer serves its policy
through the gateway and starts this program once per episode with the episode in its environment
(``OPENAI_BASE_URL`` already routes every call to its episode, ``FLOWGRPO_TASK`` is the task). The
program scores its own answer (``reward``: 1 for the right integer, plus 0.1 for using the answer
format, as the ``accuracy`` and ``format`` rewards of examples/calculator_agent.yaml) and posts it
with :func:`flowgrpo.gateway.client.post_reward`.

Run it by hand against ``flowgrpo serve --record RUN_DIR``::

    FLOWGRPO_GATEWAY_URL=http://127.0.0.1:8000 FLOWGRPO_EPISODE_ID=ep-1 \\
    OPENAI_BASE_URL=http://127.0.0.1:8000/episodes/ep-1/v1 OPENAI_API_KEY=unused \\
    FLOWGRPO_TASK='{"id": "t1", "prompt": "Ana has 12 apples. She buys 7 more. How many?", "answer": "19"}' \\
    python examples/langchain_agent/agent.py
"""

from __future__ import annotations

import os
import re
import sys

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

SYSTEM_PROMPT = (
    "Solve the math problem. Use the calculator tool for arithmetic. "
    "Give the final answer as <answer>N</answer>."
)
MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "3"))


@tool(parse_docstring=True)
def calculator(expression: str) -> str:
    """Evaluate a math expression exactly (fractions, powers, sqrt, sin, log, %).

    Args:
        expression: A math expression, e.g. 391/4 or sqrt(2)*3 or 15% of 80
    """
    from flowgrpo.tools.calculator import Calculator

    from flowgrpo.tool import ToolError, invoke
    from flowgrpo.utils.aio import run_sync

    try:  # flowgrpo's calculator: exact, and safe against hostile expressions
        return run_sync(invoke(Calculator(), {"expression": expression})).content
    except ToolError as e:
        return f"Error: {e}"


def run_agent(
    llm, question: str, *, system_prompt: str = SYSTEM_PROMPT, max_turns: int = MAX_TURNS
) -> list[BaseMessage]:
    """The agent: ask, run the tools the model calls, until it answers; the whole conversation."""
    model = llm.bind_tools([calculator])
    messages: list[BaseMessage] = [SystemMessage(system_prompt), HumanMessage(question)]
    for _ in range(max_turns):
        ai = model.invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            break
        for call in ai.tool_calls:
            messages.append(ToolMessage(calculator.invoke(call["args"]), tool_call_id=call["id"]))
    return messages


def reward(messages: list[BaseMessage], gold: str | None) -> tuple[float, dict[str, float]]:
    """1 for the right integer in the last <answer>, plus 0.1 for answering in the format at all."""
    text = messages[-1].content if isinstance(messages[-1].content, str) else ""
    found = re.findall(r"<answer>\s*(.*?)\s*</answer>", text, flags=re.S)
    answer = found[-1].replace(",", "") if found else None
    correct = answer is not None and gold is not None and _number(answer) == _number(gold)
    parts = {"accuracy": float(correct), "format": float(answer is not None)}
    return parts["accuracy"] + 0.1 * parts["format"], parts


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def main() -> int:
    from langchain_openai import ChatOpenAI

    from flowgrpo.gateway.client import EpisodeContext, post_reward

    ctx = EpisodeContext.from_env()
    llm = ChatOpenAI(
        base_url=ctx.base_url,  # .../episodes/EPISODE_ID/v1: every call is recorded into this episode
        api_key=ctx.api_key,
        model="policy",
        max_retries=0,
        timeout=float(os.environ.get("AGENT_TIMEOUT_S", "300")),
    )
    messages = run_agent(llm, ctx.task["prompt"])
    value, parts = reward(messages, ctx.task.get("answer"))
    post_reward(value, parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
