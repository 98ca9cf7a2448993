"""Define a tool with @tool, adapt one from LangChain, and run a parsed Hermes action through them.

Run: python examples/custom_tool.py
"""

from __future__ import annotations

import asyncio

from langchain_core.tools import tool as lc_tool

from flowgrpo.parsing import HermesParser
from flowgrpo.tool import ToolError, execute_tool_calls, from_langchain, tool


@tool(timeout_s=2.0)
def unit_price(total: float, count: int) -> str:
    """Price of one item when `count` items cost `total`.

    Args:
        total: What all the items cost together.
        count: How many items there are.
    """
    if count <= 0:
        raise ToolError("count must be a positive integer")
    return f"{total / count:g}"


@lc_tool(parse_docstring=True)
def word_count(text: str) -> int:
    """Count the words in a text.

    Args:
        text: The text to count.
    """
    return len(text.split())


async def main() -> None:
    tools = [unit_price, from_langchain(word_count)]
    parser = HermesParser()
    print("System-prompt text for models whose chat template ignores tools:\n")
    print(parser.format_instructions(tools), "\n")
    # In training, this text is sampled by the policy inside RolloutEngine (flowgrpo.rollout), and the
    # environment's step() runs execute_tool_calls; here we play the policy by hand.
    action = parser.parse(
        "I will compute both.\n"
        '<tool_call>{"name": "unit_price", "arguments": {"total": 12.5, "count": 5}}</tool_call>\n'
        '<tool_call>{"name": "word_count", "arguments": {"text": "three little words"}}</tool_call>\n'
        '<tool_call>{"name": "unit_price", "arguments": {"total": 1}}</tool_call>'
    )
    for message in await execute_tool_calls(tools, action.message.tool_calls):
        print(f"{message.name}: {message.content}")


if __name__ == "__main__":
    asyncio.run(main())
