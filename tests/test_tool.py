"""flowgrpo.tool: @tool, invoke/execute_tool_calls, schemas, LangChain adapters, registry."""

from __future__ import annotations

import asyncio
import threading

import pytest
from pydantic import BaseModel

from flowgrpo.tool import (
    FunctionTool,
    Tool,
    ToolError,
    ToolOutput,
    execute_tool_calls,
    from_langchain,
    invoke,
    list_tools,
    make_tool,
    parse_google_docstring,
    register_tool,
    to_langchain,
    to_openai_schema,
    tool,
)
from flowgrpo.types import ToolCall


@tool
def add(a: int, b: int = 1) -> str:
    """Add two integers.

    Args:
        a: The first addend.
        b (int): The second addend,
            one by default.

    Returns:
        The sum as text.
    """
    return str(a + b)


@tool(name="sleepy", timeout_s=0.2)
async def slow(seconds: float) -> str:
    """Sleep, then say done.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "done"


@tool
def fail(reason: str) -> str:
    """Always fails.

    Args:
        reason: What to say.
    """
    raise ToolError(f"cannot do it: {reason}")


@tool
def buggy(x: int) -> str:
    """Has a bug."""
    return str(1 // x)


@tool
def stats(values: list[float]) -> ToolOutput:
    """Mean of numbers, with the raw list as the artifact.

    Args:
        values: The numbers.
    """
    return ToolOutput(content=f"{sum(values) / len(values):g}", artifact={"n": len(values)})


def test_function_tool_is_a_tool_with_docstring_schema():
    assert isinstance(add, FunctionTool) and isinstance(add, Tool)
    assert add.name == "add" and add.description == "Add two integers."
    assert add(2, 3) == "5"  # still callable as the plain function
    schema = to_openai_schema(add)
    assert schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first addend."},
                    "b": {
                        "type": "integer",
                        "default": 1,
                        "description": "The second addend, one by default.",
                    },
                },
                "required": ["a"],
                "additionalProperties": False,
            },
        },
    }


def test_parse_google_docstring_sections():
    desc, args = parse_google_docstring(
        """Search the web.

        Longer text.

        Args:
            query (str): What to look for.
            k: How many
              results.
        Raises:
            ToolError: never.
        """
    )
    assert desc == "Search the web.\n\nLonger text."
    assert args == {"query": "What to look for.", "k": "How many results."}


def test_tool_requires_hints_and_description():
    with pytest.raises(TypeError, match="type hint"):

        @tool
        def f(x) -> str:
            """Doc."""
            return x

    with pytest.raises(ValueError, match="docstring"):

        @tool
        def g(x: int) -> str:
            return str(x)


def test_invoke_validates_and_converts():
    out = asyncio.run(invoke(add, {"a": "4", "b": 5}))
    assert out == ToolOutput(content="9")
    with pytest.raises(ToolError) as e:
        asyncio.run(invoke(add, {"b": 2, "c": 3}))
    msg = str(e.value)
    assert (
        "invalid arguments for add" in msg and "a: Field required" in msg and "c: unexpected argument" in msg
    )
    assert 'Expected arguments: {"a": integer, "b": integer}' in msg
    out = asyncio.run(invoke(stats, {"values": [1, 2, 6]}))
    assert out.content == "3" and out.artifact == {"n": 3}


def test_invoke_errors_timeout_and_bugs():
    with pytest.raises(ToolError, match=r"sleepy timed out after 0\.2 s"):
        asyncio.run(invoke(slow, {"seconds": 5}))
    assert asyncio.run(invoke(slow, {"seconds": 0.3}, timeout_s=2)).content == "done"
    with pytest.raises(ToolError, match="cannot do it: x"):
        asyncio.run(invoke(fail, {"reason": "x"}))
    with pytest.raises(ToolError, match="buggy failed: ZeroDivisionError"):
        asyncio.run(invoke(buggy, {"x": 0}))


def test_execute_tool_calls_in_order_never_raises():
    calls = [
        ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2}),
        ToolCall(id="c2", name="nope", arguments={}),
        ToolCall(id="c3", name="add", arguments={"a": "x"}),
        ToolCall(id="c4", name="sleepy", arguments={"seconds": 1}),
        ToolCall(id="c5", name="fail", arguments={"reason": "r"}),
    ]
    msgs = asyncio.run(execute_tool_calls([add, slow, fail], calls))
    assert [m.tool_call_id for m in msgs] == ["c1", "c2", "c3", "c4", "c5"]
    assert all(m.role == "tool" for m in msgs)
    assert msgs[0].content == "3" and msgs[0].name == "add"
    assert msgs[1].content == "Error: unknown tool 'nope'; available tools: add, fail, sleepy"
    assert msgs[2].content.startswith("Error: invalid arguments for add: a: Input should be a valid integer")
    assert msgs[3].content == "Error: sleepy timed out after 0.2 s"
    assert msgs[4].content == "Error: cannot do it: r"


def test_sync_tool_does_not_block_event_loop():
    # all three calls must be inside the tool at once to pass the barrier (one at a time, the first
    # would wait there until the timeout and fail), and they block until the event loop has ticked
    # 10 times: a loop blocked by the tools would never tick
    together = threading.Barrier(3, timeout=60)
    loop_ticked = threading.Event()

    @tool
    def blocking(seconds: float) -> str:
        """Block the calling thread until the event loop has ticked.

        Args:
            seconds: How long to wait at most.
        """
        together.wait()
        if not loop_ticked.wait(seconds):
            return "the event loop did not run while this tool blocked"
        return threading.current_thread().name

    async def main() -> list[str]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
                if ticks == 10:
                    loop_ticked.set()

        task = asyncio.create_task(ticker())
        msgs = await execute_tool_calls(
            {"blocking": blocking}, [ToolCall(name="blocking", arguments={"seconds": 60}) for _ in range(3)]
        )
        task.cancel()
        return [m.content for m in msgs]

    names = asyncio.run(main())
    assert names == ["flowgrpo-call-blocking"] * 3, names  # each in a worker thread, none stalled


def test_from_langchain_structured_tool_and_decorator():
    from langchain_core.tools import StructuredTool, ToolException
    from langchain_core.tools import tool as lc_tool

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    t = from_langchain(StructuredTool.from_function(multiply))
    assert isinstance(t, Tool) and t.name == "multiply"
    assert asyncio.run(invoke(t, {"a": 6, "b": 7})).content == "42"
    with pytest.raises(ToolError, match="a: Field required"):
        asyncio.run(invoke(t, {"b": 7}))

    @lc_tool(parse_docstring=True, response_format="content_and_artifact")
    def lookup(key: str) -> tuple[str, dict]:
        """Look a key up.

        Args:
            key: The key to find.
        """
        if key == "bad":
            raise ToolException("no such key: bad")
        return f"value of {key}", {"key": key}

    t2 = from_langchain(lookup)
    schema = to_openai_schema(t2)["function"]
    assert schema["name"] == "lookup" and schema["description"] == "Look a key up."
    assert schema["parameters"]["properties"]["key"] == {"type": "string", "description": "The key to find."}
    out = asyncio.run(invoke(t2, {"key": "k1"}))
    assert out.content == "value of k1" and out.artifact == {"key": "k1"}
    msgs = asyncio.run(execute_tool_calls([t2], [ToolCall(id="x", name="lookup", arguments={"key": "bad"})]))
    assert msgs[0].content == "Error: no such key: bad"


def test_to_langchain_roundtrip():
    from langchain_core.messages import ToolMessage

    lc = to_langchain(add)
    assert lc.name == "add" and lc.description == "Add two integers."
    assert lc.invoke({"a": 2, "b": 40}) == "42"
    assert asyncio.run(lc.ainvoke({"a": 1})) == "2"
    msg = lc.invoke({"name": "add", "args": {"a": 1, "b": 1}, "id": "t1", "type": "tool_call"})
    assert isinstance(msg, ToolMessage) and msg.content == "2"
    lcs = to_langchain(stats)
    msg = lcs.invoke({"name": "stats", "args": {"values": [2, 4]}, "id": "t2", "type": "tool_call"})
    assert msg.content == "3" and msg.artifact == {"n": 2}
    # a ToolError is shown to the LangChain agent as the tool's answer
    assert to_langchain(fail).invoke({"reason": "z"}) == "cannot do it: z"
    # and back again
    back = from_langchain(lc)
    assert asyncio.run(invoke(back, {"a": 5, "b": 5})).content == "10"


def test_registry_entry_points_and_register():
    assert {"calculator", "code", "search"} <= set(list_tools())

    class Echo:
        name = "echo"
        description = "Echo the text."
        timeout_s = None

        class args_schema(BaseModel):
            text: str

        def __init__(self, prefix: str = "") -> None:
            self.prefix = prefix

        async def run(self, args: BaseModel) -> str:
            return self.prefix + args.text  # type: ignore[attr-defined]

    register_tool("echo", Echo)
    t = make_tool("echo", prefix="> ")
    assert asyncio.run(invoke(t, {"text": "hi"})).content == "> hi"
    assert "echo" in list_tools()
    with pytest.raises(KeyError, match=r"unknown tool 'nope'; available: .*calculator"):
        make_tool("nope")


def test_make_builtin_calculator_through_entry_point():
    calc = make_tool("calculator")
    assert calc.name == "calculator"
    assert asyncio.run(invoke(calc, {"expression": "2+3*4"})).content == "14"


_HUNG_TOOL_SCRIPT = """
import asyncio, sys, threading, time
from flowgrpo.tool import ToolCall, execute_tool_calls, tool

@tool(timeout_s=0.5)
def forever() -> str:
    '''Never returns.'''
    threading.Event().wait()

@tool(timeout_s=2)
def sleeps_40s() -> str:
    '''Sleeps 40 s, far past its 2 s timeout.'''
    time.sleep(40)
    return "late"

for name in ("forever", "sleeps_40s"):
    t0 = time.monotonic()
    msgs = asyncio.run(execute_tool_calls([forever, sleeps_40s], [ToolCall(name=name, arguments={})]))
    print(name, round(time.monotonic() - t0, 1), msgs[0].content, flush=True)
"""


def test_a_hung_sync_tool_is_abandoned_at_its_timeout():
    """A sync tool that never returns, and one that sleeps 40 s under a 2 s timeout: each call
    ends with a timeout observation, the event loop shuts down and the process exits, although
    both threads are still blocked (the run would otherwise hang forever / for 40 s)."""
    import subprocess
    import sys

    # the 30 s limit is the check: with the loop waiting for the threads this hangs forever
    r = subprocess.run([sys.executable, "-c", _HUNG_TOOL_SCRIPT], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = [ln.split(" ", 2) for ln in r.stdout.splitlines()]
    assert [(name, msg) for name, _, msg in lines] == [
        ("forever", "Error: forever timed out after 0.5 s"),
        ("sleeps_40s", "Error: sleeps_40s timed out after 2 s"),
    ]


_HUNG_LANGCHAIN_SCRIPT = """
import asyncio, threading, time
from langchain_core.tools import tool as lc_tool
from flowgrpo.tool import ToolCall, execute_tool_calls, from_langchain

@lc_tool
def forever() -> str:
    '''Never returns.'''
    threading.Event().wait()

@lc_tool
async def answers() -> str:
    '''An async LangChain tool: awaited natively.'''
    return "42"

hung, native = from_langchain(forever, timeout_s=0.5), from_langchain(answers)
assert not hung.native_async and native.native_async
for name in ("forever", "answers"):
    t0 = time.monotonic()
    msgs = asyncio.run(execute_tool_calls([hung, native], [ToolCall(name=name, arguments={})]))
    print(name, round(time.monotonic() - t0, 1), msgs[0].content, flush=True)
"""


def test_a_hung_sync_langchain_tool_is_abandoned_at_its_timeout():
    """A sync LangChain tool runs in a thread nothing joins (langchain's own ainvoke would use the
    loop's executor, which asyncio.run waits for: the process would never exit)."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", _HUNG_LANGCHAIN_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    lines = [ln.split(" ", 2) for ln in r.stdout.splitlines()]
    assert [(name, msg) for name, _, msg in lines] == [
        ("forever", "Error: forever timed out after 0.5 s"),
        ("answers", "42"),
    ]
