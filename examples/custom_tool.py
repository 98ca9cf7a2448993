"""Define a tool with @tool, adapt one from LangChain, run a parsed Hermes action through them, then
run short episodes with the tools in an environment through the RolloutEngine.

Run: python examples/custom_tool.py                        # tiny random model, seconds
     python examples/custom_tool.py --model smollm2-135m   # the embedded model
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from langchain_core.tools import tool as lc_tool

from flowgrpo.chat.parsing import HermesParser
from flowgrpo.env import Split, Task, ToolEnv, render_tool_call, tool_results
from flowgrpo.tool import ToolError, execute_tool_calls, from_langchain, tool
from flowgrpo.types import Message


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


async def demo_tools() -> None:
    tools = [unit_price, from_langchain(word_count)]
    parser = HermesParser()
    print("System-prompt text for models whose chat template ignores tools:\n")
    print(parser.format_instructions(tools), "\n")
    # In training, this text is sampled by the policy inside RolloutEngine (flowgrpo.rollout.engine), and the
    # environment's step() runs execute_tool_calls; here we play the policy by hand.
    action = parser.parse(
        "I will compute both.\n"
        '<tool_call>{"name": "unit_price", "arguments": {"total": 12.5, "count": 5}}</tool_call>\n'
        '<tool_call>{"name": "word_count", "arguments": {"text": "three little words"}}</tool_call>\n'
        '<tool_call>{"name": "unit_price", "arguments": {"total": 1}}</tool_call>'
    )
    for message in await execute_tool_calls(tools, action.message.tool_calls):
        print(f"{message.name}: {message.content}")


class ShopEnv(ToolEnv):
    """Unit-price questions; the tools above are the environment's tools."""

    name = "shop"
    system_prompt = "Use the unit_price tool, then give the price alone as <answer>NUMBER</answer>."

    def __init__(self, **kwargs: Any) -> None:
        super().__init__([unit_price, from_langchain(word_count)], **kwargs)
        self._tasks = [
            Task(
                id=f"shop-{n}-{c}",
                prompt=f"{c} pens cost {n * c / 4:g} euros. What does one pen cost?",
                answer=f"{n / 4:g}",
                metadata={"total": n * c / 4, "count": c},
            )
            for n in range(1, 21)
            for c in (2, 3, 5)
        ]

    def tasks(self, split: Split) -> list[Task]:
        return [t for i, t in enumerate(self._tasks) if (i % 5 == 0) == (split == "test")]


class ShopPolicy:
    """A scripted text policy: call the tool with the question's numbers, answer with its output."""

    def __init__(self, env: ShopEnv) -> None:
        self.by_prompt = {t.prompt: t for t in env._tasks}

    async def act(self, messages: list[Message]) -> str:
        if results := tool_results(messages):
            return f"<answer>{results[-1].content}</answer>"
        m = self.by_prompt[messages[1].content].metadata
        return render_tool_call("unit_price", {"total": m["total"], "count": m["count"]})


def rollouts(
    model_name: str = "tiny", *, n_tasks: int = 2, group_size: int = 2, max_new_tokens: int = 32
) -> dict[str, Any]:
    """The scripted policy and the model, each through the rollout engine, scored by the trainer's rewards."""
    from flowgrpo.components import build
    from flowgrpo.config import load_config
    from flowgrpo.rollout.engine import RolloutEngine, run_text_policy

    cfg = load_config(
        None,
        [
            f"model.name={model_name}",
            "rollout.max_turns=3",
            f"rollout.max_new_tokens={max_new_tokens}",
            "rollout.max_context_tokens=1024",
            "rewards=[{name: accuracy}, {name: format, weight: 0.1}]",
        ],
    )
    parts = build(cfg, env_factory=ShopEnv)  # the model, its backend and the rewards of the config
    tasks = parts.tasks("train")[:n_tasks]
    # A text policy costs no generation: give it room so its actions are never truncated.
    scripted = run_text_policy(
        # a callable env -> policy gives each episode a fresh policy bound to its environment
        parts.env_factory,
        tasks,
        lambda env: ShopPolicy(env),
        parts.tokenizer,
        cfg.rollout.model_copy(update={"max_new_tokens": 256}),
    )
    sampled = RolloutEngine(parts.backend, parts.tokenizer, cfg.rollout).run_groups(
        parts.env_factory, tasks, group_size
    )
    reward = parts.reward
    for name, groups in (("scripted policy", scripted), (f"model {model_name}", sampled)):
        reward.score_groups(groups)
        trajs = [t for g in groups for t in g.trajectories]
        print(
            f"{name}: {len(trajs)} episodes, mean reward {sum(t.reward for t in trajs) / len(trajs):.2f}, "
            f"{sum(t.num_tokens for t in trajs)} tokens, terminations {sorted({t.termination.value for t in trajs})}"
        )
    return {"scripted": scripted, "sampled": sampled}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description="custom tools: definition, execution, rollouts")
    p.add_argument("--model", default="tiny", help="'tiny' (random, seconds) or e.g. smollm2-135m")
    p.add_argument("--max-new-tokens", type=int, default=32, help="per model turn")
    args = p.parse_args(argv)
    asyncio.run(demo_tools())
    print()
    return rollouts(args.model, max_new_tokens=args.max_new_tokens)


if __name__ == "__main__":
    main()
