"""flowgrpo.env: registry, entry points, ToolEnv step semantics, check_environment."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from flowgrpo.chat.parsing import HermesParser
from flowgrpo.env import (
    DEFAULT_NUDGE,
    EnvCheckError,
    EnvError,
    Environment,
    Task,
    ToolEnv,
    check_environment,
    list_envs,
    make,
    register,
    render_tool_call,
    run_oracle,
)
from flowgrpo.tool import tool
from flowgrpo.types import Message, ParsedAction, ToolCall

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_env.py"


SLOW_ECHO_SPANS: list[tuple[str, str]] = []  # ("start" | "end", text), in the order they happened


@tool
async def slow_echo(text: str) -> str:
    """Echo the text after 0.3 s.

    Args:
        text: What to echo.
    """
    SLOW_ECHO_SPANS.append(("start", text))
    await asyncio.sleep(0.3)
    SLOW_ECHO_SPANS.append(("end", text))
    return text


class EchoEnv(ToolEnv):
    name = "echo"
    system_prompt = "Echo things."

    def __init__(self, n: int = 10, overlap: bool = False, **kw):
        super().__init__([slow_echo], **kw)
        self.n, self.overlap = n, overlap

    def tasks(self, split):
        start = 0 if split == "train" or self.overlap else self.n
        return [
            Task(id=f"{split}-{i}", prompt=f"echo {i}", answer=str(i)) for i in range(start, start + self.n)
        ]

    async def check_answer(self, answer, task):
        return answer == task.answer


def act(text: str) -> ParsedAction:
    return HermesParser().parse(text)


def test_builtins_are_discovered_through_entry_points() -> None:
    assert {"arithmetic", "multihop", "coding"} <= set(list_envs())
    with pytest.raises(KeyError, match=r"entry-points\.\"flowgrpo\.envs\""):
        make("no-such-env")


def test_register_make_and_spec() -> None:
    register("echo-test", EchoEnv)
    env = make("echo-test", n=4)
    assert isinstance(env, Environment)
    assert env.spec.name == "echo-test" and env.spec.kwargs == {"n": 4}
    assert len(env.tasks("test")) == 4


def test_toolenv_step_semantics() -> None:
    async def go() -> None:
        env = EchoEnv()
        with pytest.raises(EnvError, match="before reset"):
            await env.step(act("hi"))
        msgs = await env.reset(env.tasks("train")[3])
        assert [m.role for m in msgs] == ["system", "user"] and msgs[1].content == "echo 3"
        # nothing to do -> the nudge
        r = await env.step(act("hmm"))
        assert [m.content for m in r.observations] == [DEFAULT_NUDGE] and not r.terminated
        # a parse error -> an error observation the model reads
        r = await env.step(act("<tool_call>{bad json</tool_call>"))
        assert r.observations[0].role == "user" and r.observations[0].content.startswith("Error:")
        # two calls run concurrently (the second starts before the first ends), and keep their order and ids
        text = render_tool_call("slow_echo", {"text": "a"}) + render_tool_call("slow_echo", {"text": "b"})
        a = act(text)
        SLOW_ECHO_SPANS.clear()
        r = await env.step(a)
        assert [kind for kind, _ in SLOW_ECHO_SPANS] == ["start", "start", "end", "end"], SLOW_ECHO_SPANS
        assert [m.content for m in r.observations] == ["a", "b"]
        assert [m.tool_call_id for m in r.observations] == [c.id for c in a.message.tool_calls]
        # bad arguments -> an error observation bound to the call
        call = ToolCall(name="slow_echo", arguments={"txt": "a"})
        r = await env.step(ParsedAction(message=Message(role="assistant", tool_calls=[call])))
        assert r.observations[0].tool_call_id == call.id and "Error" in r.observations[0].content
        # the answer ends the episode; tool calls beside it are not run
        r = await env.step(act("<answer>3</answer>" + render_tool_call("slow_echo", {"text": "x"})))
        assert r.terminated and r.observations == [] and r.info == {"answer": "3", "correct": True}
        with pytest.raises(EnvError, match="after the episode ended"):
            await env.step(act("again"))
        # reset makes the instance reusable
        await env.reset(env.tasks("test")[0])
        r = await env.step(act("<answer>wrong</answer>"))
        assert r.info["correct"] is False

    asyncio.run(go())


def test_max_steps_truncates() -> None:
    async def go() -> None:
        env = EchoEnv(max_steps=2)
        await env.reset(env.tasks("train")[0])
        assert not (await env.step(act("a"))).truncated
        assert (await env.step(act("b"))).truncated
        with pytest.raises(EnvError):
            await env.step(act("c"))

    asyncio.run(go())


def test_check_environment_passes_a_good_env() -> None:
    warnings = check_environment(EchoEnv(), make_env=EchoEnv)
    assert warnings == []


@pytest.mark.parametrize("max_steps", [1, 2, 3])
def test_check_environment_reports_on_an_env_that_truncates(max_steps: int) -> None:
    """An env whose episodes are cut short after one step is not broken: the checks stop where
    the episode ended and say what they could not check, instead of stepping a finished episode."""
    warnings = check_environment(EchoEnv(max_steps=max_steps), make_env=lambda: EchoEnv(max_steps=max_steps))
    assert len(warnings) == 3 and all("truncated before the answer step; not checked" in w for w in warnings)


def test_check_environment_catches_overlapping_splits() -> None:
    with pytest.raises(EnvCheckError, match="train and test share 10 prompts"):
        check_environment(EchoEnv(overlap=True))


def test_check_environment_catches_nondeterminism_across_instances() -> None:
    counter = iter(range(1000))

    class Drifting(EchoEnv):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.offset = next(counter) * 100

        def tasks(self, split):
            return [
                t.model_copy(update={"prompt": f"{t.prompt}+{self.offset}"}) for t in super().tasks(split)
            ]

    with pytest.raises(EnvCheckError, match="differs between two instances"):
        check_environment(Drifting(), make_env=Drifting)


def test_check_environment_catches_protocol_breaks() -> None:
    class NoEnd(EchoEnv):
        async def step(self, action):
            r = await super().step(action)
            self.done = False  # never ends: stepping after the answer does not raise
            r.terminated = False
            return r

    with pytest.raises(EnvCheckError, match="must end the episode"):
        check_environment(NoEnd())

    class Silent(EchoEnv):
        nudge = ""

        async def step(self, action):
            r = await super().step(action)
            r.observations = [m for m in r.observations if m.content]
            return r

    with pytest.raises(EnvCheckError, match="no observation"):
        check_environment(Silent())

    class NoDescription(EchoEnv):
        def __init__(self, **kw):
            super().__init__(**kw)

            def bad_fn(text: str) -> str:
                return text

            bad = tool(bad_fn, name="bad", description="x")
            bad.description = ""
            self.tools = [*self.tools, bad]

    with pytest.raises(EnvCheckError, match="no description"):
        check_environment(NoDescription())


def test_example_custom_env_passes_and_is_short() -> None:
    assert len(EXAMPLE.read_text().splitlines()) < 60
    spec = importlib.util.spec_from_file_location("custom_env_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    env = make("capitals")
    check_environment(env)

    async def solve_all() -> list[bool]:
        return [(await run_oracle(env, t))[0].info["correct"] for t in env.tasks("test")]

    assert all(asyncio.run(solve_all()))


def test_check_environment_inside_a_running_loop() -> None:
    async def go() -> list[str]:
        return check_environment(EchoEnv(), make_env=EchoEnv)

    assert asyncio.run(go()) == []
