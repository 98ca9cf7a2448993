"""Tools the policy acts through.

- ``ToolError``: raised by a tool (or by :func:`invoke`) for a failure the model should read.
- ``ToolOutput(content, artifact=None)``: what a call returns (``artifact``: raw data kept for
  rewards/replay, never shown to the model).
- ``Tool`` protocol: ``name``, ``description``, ``args_schema`` (a pydantic model class),
  ``timeout_s`` (float | None) and ``async run(args: BaseModel) -> str | ToolOutput``.
- ``async invoke(tool, arguments: dict, *, timeout_s=None) -> ToolOutput``: validates ``arguments``
  against ``args_schema``, runs with a timeout, raises ``ToolError`` with a model-readable message.
- ``async execute_tool_calls(tools: Mapping[str, Tool], calls, *, timeout_s=None) -> list[Message]``:
  runs calls concurrently; never raises for a bad call: every result, error or not, is a
  ``Message(role="tool", tool_call_id=call.id, name=call.name, content=...)`` in call order.
- ``to_openai_schema(tool) -> dict``: OpenAI function-calling JSON.
- ``@tool`` / ``tool(fn, name=..., timeout_s=...)``: a :class:`FunctionTool` from a typed sync or
  async function; the Google-style docstring gives the description and per-argument descriptions.
- ``from_langchain(base_tool) -> Tool`` and ``to_langchain(tool) -> StructuredTool``.
- ``make_tool(name, **kw)`` / ``list_tools()`` / ``register_tool(name, factory)``: the tool registry,
  filled from the entry-point group ``"flowgrpo.tools"`` (built-ins are declared there too).

Why errors are text: a run must never crash because a 135M-parameter policy wrote a bad call. Bad
arguments, unknown tools, timeouts and exceptions inside a tool all become an observation that says
what went wrong and how to fix it; the policy learns from it like from any other observation.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol, get_type_hints, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from flowgrpo.types import Message, ToolCall
from flowgrpo.utils.aio import run_in_thread, run_sync
from flowgrpo.utils.plugins import build as build_plugin
from flowgrpo.utils.plugins import is_spec, load_object

ENTRY_POINT_GROUP = "flowgrpo.tools"


class ToolError(Exception):
    """A tool failure whose message is shown to the model as the observation."""


class ToolOutput(BaseModel):
    """What one call returns: ``content`` (the text the model reads) and an optional ``artifact``
    (raw data for rewards, replay or debugging; never rendered into the prompt)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    content: str
    artifact: Any = None


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    args_schema: type[BaseModel]
    timeout_s: float | None

    async def run(self, args: BaseModel) -> str | ToolOutput: ...


# --------------------------------------------------------------------------------------------
# Calling tools
# --------------------------------------------------------------------------------------------


def _signature_hint(tool: Tool) -> str:
    """``{"expression": string}``-style reminder of the expected arguments (for error messages)."""
    props = to_openai_schema(tool)["function"]["parameters"].get("properties", {})
    parts = [f'"{k}": {v.get("type", "any")}' for k, v in props.items()]
    return "{" + ", ".join(parts) + "}"


def _validation_message(tool: Tool, e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unexpected argument"
        parts.append(f"{loc}: {msg}")
    return (
        f"invalid arguments for {tool.name}: "
        + "; ".join(parts)
        + f". Expected arguments: {_signature_hint(tool)}"
    )


def _to_output(out: Any) -> ToolOutput:
    if isinstance(out, ToolOutput):
        return out
    if isinstance(out, str):
        return ToolOutput(content=out)
    if isinstance(out, BaseModel):
        return ToolOutput(content=out.model_dump_json(), artifact=out)
    try:
        return ToolOutput(content=json.dumps(out, ensure_ascii=False, default=str), artifact=out)
    except (TypeError, ValueError):
        return ToolOutput(content=str(out), artifact=out)


async def invoke(tool: Tool, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> ToolOutput:
    """Validate ``arguments`` against ``tool.args_schema`` and run the tool under a timeout.

    ``timeout_s`` overrides ``tool.timeout_s``; ``None`` in both means no limit. Every failure is a
    :class:`ToolError` whose message is written for the model to read.
    """
    if not isinstance(arguments, Mapping):
        raise ToolError(
            f"arguments for {tool.name} must be a JSON object, got {type(arguments).__name__}. "
            f"Expected arguments: {_signature_hint(tool)}"
        )
    try:
        args = tool.args_schema.model_validate(dict(arguments))
    except ValidationError as e:
        raise ToolError(_validation_message(tool, e)) from e
    limit = timeout_s if timeout_s is not None else tool.timeout_s
    try:
        out = await asyncio.wait_for(tool.run(args), timeout=limit)
    except asyncio.TimeoutError as e:
        raise ToolError(f"{tool.name} timed out after {limit:g} s") from e
    except ToolError:
        raise
    except Exception as e:  # a bug in a tool is an observation, not a crashed run
        raise ToolError(f"{tool.name} failed: {type(e).__name__}: {e}") from e
    return _to_output(out)


async def _one(tools: Mapping[str, Tool], call: ToolCall, timeout_s: float | None) -> Message:
    tool = tools.get(call.name)
    if tool is None:
        content = (
            f"Error: unknown tool {call.name!r}; available tools: {', '.join(sorted(tools)) or '(none)'}"
        )
    else:
        try:
            content = (await invoke(tool, call.arguments, timeout_s=timeout_s)).content
        except ToolError as e:
            content = f"Error: {e}"
    return Message(role="tool", tool_call_id=call.id, name=call.name, content=content)


async def execute_tool_calls(
    tools: Mapping[str, Tool] | Sequence[Tool], calls: Sequence[ToolCall], *, timeout_s: float | None = None
) -> list[Message]:
    """Run ``calls`` concurrently; one ``tool`` message per call, in call order; never raises for a
    bad call (unknown tool, bad arguments, timeout, exception). ``tools`` may also be a sequence."""
    if not isinstance(tools, Mapping):
        tools = {t.name: t for t in tools}
    return list(await asyncio.gather(*(_one(tools, c, timeout_s) for c in calls)))


# --------------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------------


def _strip_titles(schema: Any) -> Any:
    """Remove pydantic's auto-generated ``title`` keywords (noise for a small model), keeping
    properties that happen to be *named* "title"."""
    if isinstance(schema, list):
        return [_strip_titles(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k == "title" and isinstance(v, str):
            continue
        if k in ("properties", "$defs", "definitions") and isinstance(v, dict):
            out[k] = {name: _strip_titles(sub) for name, sub in v.items()}
        else:
            out[k] = _strip_titles(v)
    return out


def to_openai_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI function-calling JSON for ``tool`` (also what HF chat templates take as ``tools=``)."""
    schema = _strip_titles(tool.args_schema.model_json_schema())
    schema.setdefault("properties", {})
    schema["type"] = "object"
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": schema},
    }


# --------------------------------------------------------------------------------------------
# @tool: build a tool from a typed function
# --------------------------------------------------------------------------------------------

_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Return|Yields|Raises|Examples?|Notes?)\s*:\s*$"
)
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def parse_google_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {argument: description}).

    The description is everything before the first section header; ``Args:`` entries may be
    ``name: text`` or ``name (type): text`` and continue on more-indented lines.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    desc: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent = None
    for line in lines:
        m = _SECTION.match(line)
        if m:
            section = m.group(1).lower()
            current = None
            arg_indent = None
            continue
        if section is None:
            desc.append(line)
        elif section in ("args", "arguments", "parameters"):
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            am = _ARG_LINE.match(line.strip())
            if am and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = am.group(1).lstrip("*")
                args[current] = am.group(3).strip()
            elif current is not None:
                args[current] = (args[current] + " " + line.strip()).strip()
    return "\n".join(desc).strip(), args


class FunctionTool:
    """A :class:`Tool` around a plain function (what ``@tool`` returns).

    A sync function runs in a daemon thread of its own (:func:`flowgrpo.utils.aio.run_in_thread`) so a
    slow tool never blocks the event loop on which other episodes are generating, and one that
    overruns its timeout is abandoned: the episode moves on with a timeout observation, and the
    loop's shutdown and the process's exit do not wait for it (``asyncio.to_thread`` would hold
    every ``asyncio.run`` until the call returned). Python threads cannot be killed, so the
    abandoned call keeps its thread until it returns by itself: untrusted or CPU-bound work belongs
    in a subprocess (see ``flowgrpo.tools.code``).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        description: str,
        args_schema: type[BaseModel],
        timeout_s: float | None = None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.description = description
        self.args_schema = args_schema
        self.timeout_s = timeout_s
        self._is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    async def run(self, args: BaseModel) -> str | ToolOutput:
        kwargs = {k: getattr(args, k) for k in type(args).model_fields}
        if self._is_async:
            return await self.fn(**kwargs)
        return await run_in_thread(self.fn, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the tool object calls the original function (handy in tests)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool(name={self.name!r})"


def _args_model(fn: Callable[..., Any], name: str, arg_docs: Mapping[str, str]) -> type[BaseModel]:
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as e:  # unresolvable forward references
        raise TypeError(f"@tool could not resolve the type hints of {fn.__qualname__}: {e}") from e
    fields: dict[str, Any] = {}
    for pname, p in sig.parameters.items():
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"@tool needs named parameters; {fn.__qualname__} has *{pname}")
        if pname not in hints:
            raise TypeError(
                f"@tool needs a type hint for every parameter: add one to {pname!r} of {fn.__qualname__} "
                "(the JSON schema the model sees is built from it)"
            )
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[pname] = (hints[pname], Field(default, description=arg_docs.get(pname)))
    model_name = "".join(part.capitalize() for part in re.split(r"[^0-9a-zA-Z]+", name) if part) + "Args"
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
) -> Any:
    """Build a :class:`FunctionTool` from a typed, documented function (sync or async).

    Usable bare (``@tool``) or with options (``@tool(name="add", timeout_s=2)``). The docstring's
    summary becomes the description and its ``Args:`` entries the parameter descriptions in the
    JSON schema. The function returns a ``str`` (shown to the model), a :class:`ToolOutput`
    (content + artifact), or any JSON-serialisable value (shown as JSON, kept as the artifact); it
    raises :class:`ToolError` for failures the model should read.

    Example::

        @tool
        def add(a: int, b: int) -> str:
            \"\"\"Add two integers.

            Args:
                a: The first addend.
                b: The second addend.
            \"\"\"
            return str(a + b)
    """

    def build(f: Callable[..., Any]) -> FunctionTool:
        doc_desc, arg_docs = parse_google_docstring(f.__doc__)
        tname = name or f.__name__
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}", tname):
            raise ValueError(f"tool name {tname!r} must match [A-Za-z_][A-Za-z0-9_-]* (at most 64 chars)")
        desc = description or doc_desc
        if not desc:
            raise ValueError(
                f"@tool needs a description: give {f.__qualname__} a docstring or pass description="
            )
        return FunctionTool(
            f, name=tname, description=desc, args_schema=_args_model(f, tname, arg_docs), timeout_s=timeout_s
        )

    return build if fn is None else build(fn)


# --------------------------------------------------------------------------------------------
# LangChain adapters (langchain-core is a core dependency, but imported lazily: it is slow to import)
# --------------------------------------------------------------------------------------------


class LangChainTool:
    """A :class:`Tool` that runs a langchain-core ``BaseTool`` (see :func:`from_langchain`)."""

    def __init__(self, base_tool: Any, *, timeout_s: float | None = None) -> None:
        self.base_tool = base_tool
        from langchain_core.tools import BaseTool, StructuredTool

        self.name: str = base_tool.name
        self.description: str = base_tool.description or ""
        self.timeout_s = timeout_s
        # A tool with an async implementation is awaited; a sync one runs in a thread nothing joins,
        # so a call abandoned at its timeout never holds the event loop's shutdown.
        self.native_async = (
            base_tool.coroutine is not None
            if isinstance(base_tool, StructuredTool)
            else type(base_tool)._arun is not BaseTool._arun
        )
        schema = base_tool.args_schema
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            self.args_schema: type[BaseModel] = schema
        else:  # a JSON-schema dict (or nothing): accept the named properties, validated by the tool itself
            props = (base_tool.args or {}) if schema is not None else {}
            required = set(schema.get("required", [])) if isinstance(schema, dict) else set()
            fields = {
                k: (Any, Field(... if k in required else None, description=v.get("description")))
                for k, v in props.items()
            }
            self.args_schema = create_model(
                f"{self.name}Args", __config__=ConfigDict(extra="forbid"), **fields
            )

    async def run(self, args: BaseModel) -> str | ToolOutput:
        from langchain_core.tools import ToolException

        payload = args.model_dump(exclude_unset=True)
        call = {"name": self.name, "args": payload, "id": "flowgrpo", "type": "tool_call"}
        try:
            if self.native_async:
                msg = await self.base_tool.ainvoke(call)
            else:  # langchain would run it in the loop's executor, which asyncio.run waits for
                msg = await run_in_thread(self.base_tool.invoke, call)
        except ToolException as e:
            raise ToolError(str(e)) from e
        content = msg.content if isinstance(msg.content, str) else json.dumps(msg.content, ensure_ascii=False)
        return ToolOutput(content=content, artifact=getattr(msg, "artifact", None))


def from_langchain(base_tool: Any, *, timeout_s: float | None = None) -> LangChainTool:
    """Adapt a langchain-core ``BaseTool`` (``StructuredTool``, ``@tool``-made, subclasses) to a
    flowgrpo :class:`Tool`. ``ToolException`` becomes :class:`ToolError`; an artifact returned by a
    ``response_format="content_and_artifact"`` tool is kept as ``ToolOutput.artifact``."""
    from langchain_core.tools import BaseTool

    if not isinstance(base_tool, BaseTool):
        raise TypeError(f"from_langchain expects a langchain_core BaseTool, got {type(base_tool).__name__}")
    return LangChainTool(base_tool, timeout_s=timeout_s)


def to_langchain(t: Tool) -> Any:
    """Wrap a flowgrpo :class:`Tool` as a langchain-core ``StructuredTool`` (sync and async).

    The LangChain tool returns ``(content, artifact)`` (``response_format="content_and_artifact"``);
    a :class:`ToolError` is raised as ``ToolException`` and, with ``handle_tool_error=True``, shown
    to the LangChain agent as the tool's answer, as in flowgrpo.
    """
    from langchain_core.tools import StructuredTool, ToolException

    async def acall(**kwargs: Any) -> tuple[str, Any]:
        try:
            out = await invoke(t, kwargs)
        except ToolError as e:
            raise ToolException(str(e)) from e
        return out.content, out.artifact

    def call(**kwargs: Any) -> tuple[str, Any]:
        return run_sync(acall(**kwargs))

    return StructuredTool.from_function(
        func=call,
        coroutine=acall,
        name=t.name,
        description=t.description,
        args_schema=t.args_schema,
        response_format="content_and_artifact",
        handle_tool_error=True,
    )


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Tool]] = {}


class UnknownToolError(KeyError):
    """``make_tool`` was given a name nobody registered (a KeyError with a readable message)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def register_tool(name: str, factory: Callable[..., Tool]) -> None:
    """Register a tool factory in this process (third-party packages use the entry-point group
    ``"flowgrpo.tools"`` instead, which needs no import-time side effects)."""
    _REGISTRY[name] = factory


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def list_tools() -> list[str]:
    """Names accepted by :func:`make_tool`: in-process registrations and installed entry points."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def make_tool(name: str, **kwargs: Any) -> Tool:
    """Build the tool registered as ``name`` with ``kwargs`` (e.g. ``make_tool("search", corpus="docs.jsonl")``)."""
    factory = _REGISTRY.get(name)
    if factory is not None:
        return factory(**kwargs)
    if is_spec(name):  # module:attr or path/to/file.py:attr
        return build_plugin(load_object(name), kwargs, what="tool", name=name)
    ep = _entry_points().get(name)
    if ep is None:
        raise UnknownToolError(
            f"unknown tool {name!r}; available: {', '.join(list_tools()) or '(none)'}. Third-party tools "
            f'register under the entry-point group "{ENTRY_POINT_GROUP}" (reinstall the package after adding one), '
            "or name one as module:attr or path/to/file.py:attr."
        )
    # An entry point names a factory (a Tool class) or a ready tool (a @tool-decorated function).
    return build_plugin(ep.load(), kwargs, what="tool", name=name)


__all__ = [
    "ENTRY_POINT_GROUP",
    "FunctionTool",
    "LangChainTool",
    "Tool",
    "ToolError",
    "ToolOutput",
    "UnknownToolError",
    "execute_tool_calls",
    "from_langchain",
    "invoke",
    "list_tools",
    "make_tool",
    "parse_google_docstring",
    "register_tool",
    "to_langchain",
    "to_openai_schema",
    "tool",
]
