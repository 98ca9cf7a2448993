"""A LangChain tool in a flowgrpo environment: adapt it, roll it out, (optionally) train on it.

A real langchain-core tool (``StructuredTool.from_function``, the same object a LangChain agent
would use) becomes a flowgrpo :class:`~flowgrpo.tool.Tool` with ``from_langchain``: its pydantic
args schema validates the model's arguments, and a ``ToolException`` becomes a model-readable
error observation. An environment (``unit_convert``) asks unit-conversion questions that need the
tool, and the script then

1. runs the environment's oracle through the rollout engine's text-policy path (exact token ids,
   what a supervised warm start trains on),
2. runs the policy model itself through ``RolloutEngine`` (groups of sampled episodes), scored by
   the same rewards the trainer uses,
3. with ``--train-steps N``, trains on the environment with :class:`~flowgrpo.training.trainer.Trainer`
   (registered by name, so a YAML config could say ``env: {name: unit_convert}`` too).

Run:  python examples/langchain_tool.py                      # tiny random model, seconds
      python examples/langchain_tool.py --model smollm2-135m --train-steps 4 --out runs/unit_convert
"""

from __future__ import annotations

import argparse
import asyncio
import random
from typing import Any

from langchain_core.tools import StructuredTool, ToolException
from pydantic import BaseModel, Field

from flowgrpo.env import Split, Task, ToolEnv, check_environment, register, render_tool_call, tool_results
from flowgrpo.tool import from_langchain
from flowgrpo.types import Message

# metres (length) or grams (mass) per unit
UNITS: dict[str, tuple[str, float]] = {
    "mm": ("length", 0.001),
    "cm": ("length", 0.01),
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "inch": ("length", 0.0254),
    "ft": ("length", 0.3048),
    "mile": ("length", 1609.344),
    "g": ("mass", 1.0),
    "kg": ("mass", 1000.0),
    "lb": ("mass", 453.59237),
    "oz": ("mass", 28.349523125),
}


class ConvertArgs(BaseModel):
    value: float = Field(description="The quantity to convert, e.g. 3.5.")
    from_unit: str = Field(description=f"Its unit, one of: {', '.join(UNITS)}.")
    to_unit: str = Field(description="The unit wanted (same kind: length or mass).")


def _convert(value: float, from_unit: str, to_unit: str) -> str:
    for u in (from_unit, to_unit):
        if u not in UNITS:
            raise ToolException(f"unknown unit {u!r}; use one of {', '.join(UNITS)}")
    (kind_a, fa), (kind_b, fb) = UNITS[from_unit], UNITS[to_unit]
    if kind_a != kind_b:
        raise ToolException(f"cannot convert {kind_a} ({from_unit}) to {kind_b} ({to_unit})")
    return f"{round(value * fa / fb, 4):g}"


# The LangChain side: exactly what a LangChain/LangGraph agent would be given.
convert_lc = StructuredTool.from_function(
    func=_convert,
    name="convert",
    description="Convert a length or mass between units (mm, cm, m, km, inch, ft, mile, g, kg, lb, oz).",
    args_schema=ConvertArgs,
    handle_tool_error=False,  # let ToolException through: from_langchain turns it into a ToolError
)


class UnitConvertEnv(ToolEnv):
    """Unit-conversion questions answered with the LangChain ``convert`` tool."""

    name = "unit_convert"
    system_prompt = (
        "Answer the unit-conversion question. Use the convert tool for the arithmetic, then give the "
        "number alone as <answer>NUMBER</answer>."
    )

    def __init__(self, *, seed: int = 0, num_tasks: int = 200, **kwargs: Any) -> None:
        super().__init__([from_langchain(convert_lc, timeout_s=2.0)], **kwargs)
        rng = random.Random(seed)
        pairs = [(a, b) for a in UNITS for b in UNITS if a != b and UNITS[a][0] == UNITS[b][0]]
        self._tasks: list[Task] = []
        seen: set[str] = set()
        while len(self._tasks) < num_tasks:  # unique prompts, so the splits cannot share one
            a, b = rng.choice(pairs)
            value = rng.choice([rng.randint(1, 99), round(rng.uniform(0.5, 50), 1)])
            prompt = f"How many {b} are {value:g} {a}?"
            if prompt in seen:
                continue
            seen.add(prompt)
            self._tasks.append(
                Task(
                    id=f"unit-{seed}-{len(self._tasks):04d}",
                    prompt=prompt,
                    answer=_convert(value, a, b),
                    metadata={"answer_type": "numeric", "value": value, "from": a, "to": b},
                )
            )

    def tasks(self, split: Split) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        cut = len(self._tasks) * 4 // 5  # disjoint: the first 80% train, the rest test
        return self._tasks[:cut] if split == "train" else self._tasks[cut:]

    async def check_answer(self, answer: str, task: Task) -> bool | None:
        try:
            return abs(float(answer) - float(task.answer or "nan")) <= 1e-3 * max(
                1.0, abs(float(task.answer or 0))
            )
        except ValueError:
            return False

    def oracle(self) -> UnitConvertOracle:
        return UnitConvertOracle({t.prompt: t for t in self._tasks})


class UnitConvertOracle:
    """Calls the tool once with the question's numbers, then answers with the tool's output."""

    def __init__(self, by_prompt: dict[str, Task]) -> None:
        self.by_prompt = by_prompt

    async def act(self, messages: list[Message]) -> str:
        results = tool_results(messages)
        if results:
            return f"<answer>{results[-1].content}</answer>"
        task = self.by_prompt[next(m.content for m in messages if m.role == "user")]
        m = task.metadata
        return render_tool_call("convert", {"value": m["value"], "from_unit": m["from"], "to_unit": m["to"]})


register("unit_convert", UnitConvertEnv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="'tiny' (random, for a smoke run) or e.g. smollm2-135m")
    p.add_argument("--tasks", type=int, default=2, help="tasks per rollout (default 2)")
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=64,
        help="per model turn (a SmolLM2 call is ~35 tokens; the tiny byte-level tokenizer needs ~100)",
    )
    p.add_argument("--train-steps", type=int, default=0, help="Flow-GRPO steps after the rollouts (0: none)")
    p.add_argument("--out", default="runs/unit_convert", help="run directory for --train-steps")
    args = p.parse_args(argv)

    from flowgrpo.components import build
    from flowgrpo.config import load_config
    from flowgrpo.rollout.engine import RolloutEngine, run_text_policy
    from flowgrpo.runs.metrics import rollout_stats

    env = UnitConvertEnv()
    # protocol, splits, tool schemas, oracle: fails loudly with what to fix
    check_environment(env, make_env=UnitConvertEnv)
    tool = env.tools[0]
    print(f"adapted LangChain tool {tool.name!r} -> args schema {sorted(tool.args_schema.model_fields)}")
    # A ToolException from the LangChain tool becomes an error observation, never a crash:
    from flowgrpo.tool import execute_tool_calls
    from flowgrpo.types import ToolCall

    [bad] = asyncio.run(
        execute_tool_calls(
            env.tools_by_name,
            [ToolCall(name="convert", arguments={"value": 1, "from_unit": "kg", "to_unit": "m"})],
        )
    )
    print(f"bad call -> observation: {bad.content}")

    # One config for the rollouts below and the optional training run: build() makes the model,
    # its rollout backend, the environment (by its registered name) and the rewards from it.
    tcfg = load_config(
        None,
        [
            f"model.name={args.model}",
            "env.name=unit_convert",
            "rollout.max_turns=3",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            "rollout.max_context_tokens=1024",
            "rewards=[{name: accuracy}, {name: format, weight: 0.1}]",
            f"train.steps={max(1, args.train_steps)}",
            f"train.tasks_per_step={args.tasks}",
            f"train.group_size={args.group_size}",
            f"run.output_dir={args.out}",
            "run.progress=false",
            "sft.enabled=true",
            f"sft.tasks={max(4, args.tasks)}",
            "sft.epochs=1",
        ],
    )
    parts = build(tcfg)
    cfg, tok, reward = tcfg.rollout, parts.tokenizer, parts.reward
    tasks = parts.tasks("train")[: args.tasks]

    # 1. The oracle through the text-policy path: token-exact demonstrations (no generation, so a
    #    generous per-turn limit costs nothing and never truncates a demonstration).
    demos = run_text_policy(
        parts.env_factory, tasks, None, tok, cfg.model_copy(update={"max_new_tokens": 256})
    )
    reward.score_groups(demos)
    d = demos[0].trajectories[0]
    print(
        f"oracle: {len(d.turns)} turns, {d.num_tokens} tokens, reward {d.reward:.2f}, "
        f"tool said {d.turns[0].observations[0].content!r}, answer {d.turns[-1].action.content!r}"
    )

    # 2. The model through RolloutEngine: groups of sampled episodes.
    engine = RolloutEngine(parts.backend, tok, cfg)
    groups = engine.run_groups(parts.env_factory, tasks, args.group_size)
    reward.score_groups(groups)
    stats = rollout_stats(groups, env.parser)
    print(
        f"model {args.model}: {int(stats['episodes'])} episodes, reward {stats['reward_mean']:.3f}, "
        f"accuracy {stats['accuracy']:.2f}, turns {stats['turns_mean']:.2f}"
    )

    result: dict[str, Any] = {"demos": demos, "groups": groups, "stats": stats}
    # 3. Optional: train on the environment (by its registered name).
    if args.train_steps:
        from flowgrpo.training.trainer import Trainer

        trainer = Trainer(tcfg, parts)
        result["train"] = trainer.train()
        print(f"trained {trainer.step} steps: {result['train'].get('status')}; run directory {args.out}")
    return result


if __name__ == "__main__":
    main()
