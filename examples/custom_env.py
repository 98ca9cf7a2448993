"""A new environment in a few lines (run it: checks the env and its oracle). A package would declare
it as an entry point instead: [project.entry-points."flowgrpo.envs"] capitals = "pkg:CapitalsEnv"."""

import asyncio

from flowgrpo.env import Task, ToolEnv, check_environment, make, register, render_tool_call, run_oracle
from flowgrpo.tool import ToolError, tool

CAPITALS = {f"Country{i}": f"City{i * 7 % 100}" for i in range(100)}


@tool
def capital(country: str) -> str:
    """Look up the capital city of a country.

    Args:
        country: The country's name, e.g. Country3.
    """
    if country not in CAPITALS:
        raise ToolError(f"unknown country {country!r}; names look like Country3")
    return CAPITALS[country]


class CapitalsEnv(ToolEnv):
    name = "capitals"
    system_prompt = "Use the capital tool, then answer as <answer>CITY</answer>."

    def __init__(self, **kwargs):
        super().__init__([capital], **kwargs)

    def tasks(self, split):
        ids = range(80) if split == "train" else range(80, 100)  # disjoint splits
        return [
            Task(id=f"cap-{i}", prompt=f"Capital of Country{i}?", answer=CAPITALS[f"Country{i}"]) for i in ids
        ]

    async def check_answer(self, answer, task):
        return answer.strip() == task.answer

    def oracle(self):
        return CapitalsOracle()


class CapitalsOracle:
    async def act(self, messages):
        results = [m for m in messages if m.role == "tool"]
        if results:
            return f"<answer>{results[-1].content}</answer>"
        country = messages[-1].content.rsplit(" ", 1)[-1].rstrip("?")
        return render_tool_call("capital", {"country": country})


register("capitals", CapitalsEnv)

if __name__ == "__main__":
    env = make("capitals")
    check_environment(env)
    solved = [asyncio.run(run_oracle(env, t))[0].info["correct"] for t in env.tasks("test")]
    print(f"check_environment passed; the oracle solved {sum(solved)}/{len(solved)} test tasks")
