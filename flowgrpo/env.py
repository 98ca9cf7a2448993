"""Environments: multi-turn text episodes over tools.

- ``Task`` (re-exported from flowgrpo.types): id, prompt, answer, metadata.
- ``StepResult``: observations (list[Message]), reward (per-turn shaping, default 0),
  terminated (the episode reached its end, e.g. a final answer), truncated (cut short by the env),
  info (dict).
- :class:`Environment`: every member the rollout, the trainer and the checks use (see its
  docstring). One instance runs one episode at a time; the rollout makes one instance per
  concurrent episode. :class:`BaseEnvironment` gives the optional members their defaults.
- ``register(name, factory)``, ``make(name, **kw) -> Environment``, ``list_envs() -> list[str]``.
- Discovery of third-party environments through the entry-point group ``"flowgrpo.envs"`` (our
  built-ins are declared there too, so a plugin package is a first-class citizen). An explicit
  :func:`register` wins over an entry point of the same name.
- :class:`ToolEnv`: the base class that does the common work of a tool-using env (run the calls
  concurrently with :func:`flowgrpo.tool.execute_tool_calls`, turn ``ParsedAction.errors`` into
  observations, nudge a model that neither calls a tool nor answers, terminate on the answer), so a
  new environment is a task list, a tool list and a system prompt.
- :class:`Oracle` protocol: ``async act(messages) -> str`` -- a scripted policy that solves tasks
  through the real tools; ``env.oracle()`` returns one for every built-in environment.
- :func:`check_environment`: a conformance checker in the style of Gymnasium's
  ``utils.env_checker.check_env`` (result types, tool schemas, error feedback, step after the end
  is an error, seeded determinism, train/test disjointness, the oracle's output type).

Observation roles: results of tool calls are ``role="tool"`` messages (with ``tool_call_id``);
feedback from the environment itself (parse errors, the nudge) is a ``role="user"`` message, because
it answers no call and chat templates without tool support render ``user`` everywhere.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.chat.parsing import ActionParser, HermesParser
from flowgrpo.tool import Tool, execute_tool_calls, to_openai_schema
from flowgrpo.types import Message, ParsedAction, Task, ToolCall
from flowgrpo.utils.aio import run_sync
from flowgrpo.utils.plugins import is_spec, load_object

log = logging.getLogger(__name__)

Split = Literal["train", "test"]
ENTRY_POINT_GROUP = "flowgrpo.envs"


class StepResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    observations: list[Message] = Field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class Oracle(Protocol):
    """A scripted policy: given the conversation so far, the next action as text in the env parser's
    format. Oracles act only on what they see in ``messages`` (the real tools' outputs included), so
    running one through the rollout engine yields ordinary demonstration trajectories."""

    async def act(self, messages: list[Message]) -> str: ...


@runtime_checkable
class Environment(Protocol):
    """What the rollout engine, the trainer and :func:`check_environment` use of an environment.

    - ``name``: recorded in every trajectory.
    - ``tools``: rendered into the prompt by the chat layer; ``parser`` (an ``ActionParser``) fixes
      the action format; ``system_prompt`` is the opening instruction without tool descriptions.
    - ``tool_timeout_s``: seconds per tool call; the rollout sets it from ``rollout.tool_timeout_s``
      (None: each tool's own limit).
    - ``spec``: how the instance was made (:func:`make` sets it), or None.
    - ``reset(task)`` -> the opening messages (system + user); ``step(action)`` -> a StepResult;
      ``tasks(split)`` -> the tasks of ``"train"`` or ``"test"``.
    - ``oracle()``: a scripted policy that solves the tasks through the real tools (demonstrations
      for a supervised warm start), or None when the environment has none.
    """

    name: str
    tools: Sequence[Tool]
    parser: ActionParser
    system_prompt: str
    tool_timeout_s: float | None
    spec: EnvSpec | None

    async def reset(self, task: Task) -> list[Message]: ...

    async def step(self, action: ParsedAction) -> StepResult: ...

    def tasks(self, split: Split) -> list[Task]: ...

    def oracle(self) -> Oracle | None: ...


class TaskOracle:
    """Base for oracles that know their environment's tasks (gold answers, reference solutions) and
    recognise the current one by its prompt, the first user message of the conversation."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        self._by_prompt = {t.prompt: t for t in tasks}

    def task_for(self, messages: list[Message]) -> Task:
        prompt = next((m.content for m in messages if m.role == "user"), None)
        task = self._by_prompt.get(prompt) if prompt is not None else None
        if task is None:
            raise KeyError(f"{type(self).__name__} only knows its own environment's tasks")
        return task


class EnvError(RuntimeError):
    """Misuse of an environment (step before reset, step after the episode ended...)."""


class EnvSpec(BaseModel):
    """How an instance was made: ``make(spec.name, **spec.kwargs)`` builds an identical one."""

    model_config = ConfigDict(extra="forbid")
    name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Environment]] = {}
_ENTRY_POINTS_LOADED = False
_EP_LOCK = threading.Lock()


def register(name: str, factory: Callable[..., Environment]) -> None:
    """Register ``factory`` (a class or a function returning an Environment) under ``name``."""
    if not name or not isinstance(name, str):
        raise ValueError(f"environment name must be a non-empty string, got {name!r}")
    _REGISTRY[name] = factory


class _EntryPointFactory:
    """Loads the entry point on first use, so listing envs never imports heavy plugin modules."""

    def __init__(self, ep: Any) -> None:
        self.ep = ep
        self._target: Callable[..., Environment] | None = None

    def __call__(self, **kwargs: Any) -> Environment:
        if self._target is None:
            try:
                self._target = self.ep.load()
            except Exception as e:
                raise ImportError(
                    f"environment {self.ep.name!r} is declared by the entry point {self.ep.value!r} "
                    f"(group {ENTRY_POINT_GROUP!r}) but could not be imported: {type(e).__name__}: {e}. "
                    "Reinstall the package that provides it (pip install -e . for the built-ins)."
                ) from e
        return self._target(**kwargs)


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    with _EP_LOCK:
        if _ENTRY_POINTS_LOADED:
            return
        _ENTRY_POINTS_LOADED = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            _REGISTRY.setdefault(ep.name, _EntryPointFactory(ep))


def make(name: str, **kwargs: Any) -> Environment:
    """Build a registered environment. ``env.spec`` records how, for re-creation and checks."""
    _load_entry_points()
    if name not in _REGISTRY and is_spec(name):  # module:attr or path/to/file.py:attr
        factory = load_object(name)
    elif name not in _REGISTRY:
        raise KeyError(
            f"unknown environment {name!r}; registered: {', '.join(list_envs()) or '(none)'}. "
            f"Register one with flowgrpo.env.register(name, factory) or declare it in your package's "
            f'entry points: [project.entry-points."{ENTRY_POINT_GROUP}"] {name} = "pkg.module:Class", '
            "or name it as module:Class or path/to/file.py:Class"
        )
    else:
        factory = _REGISTRY[name]
    env = factory(**kwargs)
    env.spec = EnvSpec(name=name, kwargs=dict(kwargs))
    return env


def list_envs() -> list[str]:
    """Names of every registered environment (explicit registrations and entry points)."""
    _load_entry_points()
    return sorted(_REGISTRY)


# ---------------------------------------------------------------------------------------------
# ToolEnv: the common base class
# ---------------------------------------------------------------------------------------------

DEFAULT_NUDGE = (
    "You neither called a tool nor gave a final answer. Call a tool, or give the final answer as "
    "<answer>...</answer>."
)


class BaseEnvironment:
    """Defaults for the optional members of :class:`Environment`: no tools, the tools' own time
    limits, no spec, no oracle. A subclass sets ``name``, ``parser`` and ``system_prompt`` and writes
    ``reset``, ``step`` and ``tasks``."""

    name: str = "env"
    tools: Sequence[Tool] = ()
    system_prompt: str = ""
    tool_timeout_s: float | None = None
    spec: EnvSpec | None = None

    def oracle(self) -> Oracle | None:
        """No scripted policy: a supervised warm start needs demonstrations from elsewhere."""
        return None


class ToolEnv(BaseEnvironment):
    """Base class for tool-using environments.

    A subclass sets ``name`` and ``system_prompt``, passes its tools to ``__init__`` and implements
    :meth:`tasks`; optionally :meth:`check_answer` (exposed as ``info["correct"]`` when the episode
    ends; training rewards come from :mod:`flowgrpo.rewards`, not from here), :meth:`user_prompt`
    and :meth:`oracle`. One instance runs one episode at a time.

    ``step`` semantics, in order:
    1. ``action.answer`` is set -> the episode ends (``terminated=True``); any tool calls in the
       same action are *not* run (the answer is final); ``info`` holds ``answer`` and ``correct``.
    2. Every message in ``action.errors`` becomes a ``user`` observation (what was wrong, how to fix).
    3. Well-formed tool calls run concurrently (``execute_tool_calls``: bad arguments, unknown tools,
       timeouts and tool crashes become ``tool`` observations, never exceptions).
    4. An action with no call, no answer and no error gets the nudge observation.
    ``max_steps`` (None = no limit; the rollout has its own turn limit) truncates the episode.
    """

    name: str = "tool_env"
    system_prompt: str = ""
    nudge: str = DEFAULT_NUDGE

    def __init__(
        self,
        tools: Sequence[Tool] = (),
        *,
        parser: ActionParser | None = None,
        system_prompt: str | None = None,
        tool_timeout_s: float | None = None,
        max_steps: int | None = None,
    ) -> None:
        self.tools: list[Tool] = list(tools)
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.parser: ActionParser = parser if parser is not None else HermesParser()
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self.tool_timeout_s = tool_timeout_s
        self.max_steps = max_steps
        self.task: Task | None = None
        self.done = False
        self.num_steps = 0

    @property
    def tools_by_name(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}

    # -- to override ---------------------------------------------------------------------------
    def tasks(self, split: Split) -> list[Task]:
        raise NotImplementedError(f"{type(self).__name__} must implement tasks(split)")

    def user_prompt(self, task: Task) -> str:
        """The first user message. Default: the task's prompt."""
        return task.prompt

    async def check_answer(self, answer: str, task: Task) -> bool | None:
        """Whether ``answer`` solves ``task`` (None = the env cannot tell)."""
        return None

    # -- the protocol --------------------------------------------------------------------------
    async def reset(self, task: Task) -> list[Message]:
        if not isinstance(task, Task):
            raise TypeError(f"reset() takes a flowgrpo.types.Task, got {type(task).__name__}")
        self.task = task
        self.done = False
        self.num_steps = 0
        return [
            Message(role="system", content=self.system_prompt),
            Message(role="user", content=self.user_prompt(task)),
        ]

    async def step(self, action: ParsedAction) -> StepResult:
        if self.task is None:
            raise EnvError(f"{self.name}: step() called before reset(task)")
        if self.done:
            raise EnvError(f"{self.name}: step() called after the episode ended; call reset(task) first")
        if not isinstance(action, ParsedAction):
            raise TypeError(f"step() takes a flowgrpo.types.ParsedAction, got {type(action).__name__}")
        self.num_steps += 1
        if action.answer is not None:
            self.done = True
            correct = await self.check_answer(action.answer, self.task)
            return StepResult(terminated=True, info={"answer": action.answer, "correct": correct})
        observations = [Message(role="user", content=f"Error: {err}") for err in action.errors]
        calls = action.message.tool_calls
        if calls:
            observations += await execute_tool_calls(self.tools_by_name, calls, timeout_s=self.tool_timeout_s)
        if not observations:
            observations = [Message(role="user", content=self.nudge)]
        truncated = self.max_steps is not None and self.num_steps >= self.max_steps
        if truncated:
            self.done = True
        return StepResult(
            observations=observations,
            truncated=truncated,
            info={"num_tool_calls": len(calls), "num_errors": len(action.errors)},
        )


# ---------------------------------------------------------------------------------------------
# Helpers shared by oracles
# ---------------------------------------------------------------------------------------------


def last_user_prompt(messages: Sequence[Message]) -> str:
    """The first user message's content (the task prompt of a ToolEnv episode)."""
    for m in messages:
        if m.role == "user":
            return m.content
    raise ValueError("no user message in the conversation")


def tool_results(messages: Sequence[Message]) -> list[Message]:
    """The tool observations after the first user message, in order."""
    return [m for m in messages if m.role == "tool"]


def render_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A Hermes-format tool call (``<tool_call>{...}</tool_call>``), as the HermesParser reads it."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": dict(arguments)}) + "</tool_call>"


# ---------------------------------------------------------------------------------------------
# Conformance checker
# ---------------------------------------------------------------------------------------------


_ENV_MEMBERS = (
    "name",
    "tools",
    "parser",
    "system_prompt",
    "tool_timeout_s",
    "spec",
    "reset",
    "step",
    "tasks",
    "oracle",
)


class EnvCheckError(AssertionError):
    """An environment that breaks the protocol; the message lists every problem found."""


def _check_step_result(r: Any, where: str, problems: list[str]) -> bool:
    if not isinstance(r, StepResult):
        problems.append(f"{where}: step() must return a StepResult, got {type(r).__name__}")
        return False
    if not all(isinstance(m, Message) for m in r.observations):
        problems.append(f"{where}: observations must be flowgrpo Message objects")
    if not isinstance(r.reward, (int, float)) or not math.isfinite(r.reward):
        problems.append(f"{where}: reward must be a finite float, got {r.reward!r}")
    if not isinstance(r.terminated, bool) or not isinstance(r.truncated, bool):
        problems.append(f"{where}: terminated/truncated must be bools")
    try:
        json.dumps(r.info, default=str)
    except (TypeError, ValueError) as e:
        problems.append(f"{where}: info must be JSON-serialisable ({e})")
    return True


async def acheck_environment(
    env: Environment,
    *,
    make_env: Callable[[], Environment] | None = None,
    max_tasks_checked: int = 3,
    check_oracle: bool = True,
) -> list[str]:
    """Check ``env`` against the protocol; return warnings, raise :class:`EnvCheckError` on problems.

    ``make_env`` builds a second instance with the same configuration, to check that task
    generation is deterministic under the seed (default: ``make(env.spec.name, **env.spec.kwargs)``
    when the env came from :func:`make`). The env is left reset on a fresh task afterwards.
    """
    problems: list[str] = []
    warnings: list[str] = []

    # 1. static attributes
    if not isinstance(env, Environment):
        members = dir(env)
        missing = [a for a in _ENV_MEMBERS if a not in members]
        raise EnvCheckError(
            f"{type(env).__name__} does not implement the Environment protocol (missing: {missing}); "
            "subclass flowgrpo.env.BaseEnvironment for the optional members' defaults"
        )
    if not isinstance(env.name, str) or not env.name:
        problems.append("name must be a non-empty string")
    if not isinstance(env.system_prompt, str):
        problems.append("system_prompt must be a string")
    if not isinstance(env.parser, ActionParser):
        problems.append("parser must have parse(text) -> ParsedAction and format_instructions(tools) -> str")
    tool_names: list[str] = []
    for t in env.tools:
        if not isinstance(t, Tool):
            problems.append(
                f"tool {t!r} does not implement the Tool protocol (name, description, args_schema, timeout_s, run)"
            )
            continue
        tool_names.append(t.name)
        if not t.description:
            problems.append(f"tool {t.name!r} has no description (the model reads it to decide when to call)")
        if not (isinstance(t.args_schema, type) and issubclass(t.args_schema, BaseModel)):
            problems.append(f"tool {t.name!r}: args_schema must be a pydantic model class")
            continue
        try:
            schema = to_openai_schema(t)
            json.dumps(schema)
            if schema["function"]["parameters"].get("type") != "object":
                problems.append(f"tool {t.name!r}: parameters schema must be a JSON object schema")
        except Exception as e:
            problems.append(f"tool {t.name!r}: to_openai_schema failed: {type(e).__name__}: {e}")
    if len(set(tool_names)) != len(tool_names):
        problems.append(f"tool names must be unique, got {tool_names}")

    # 2. tasks: types, unique ids, train/test disjoint, deterministic
    splits: dict[str, list[Task]] = {}
    for split in ("train", "test"):
        try:
            ts = env.tasks(split)
        except Exception as e:
            problems.append(f"tasks({split!r}) raised {type(e).__name__}: {e}")
            continue
        if not isinstance(ts, list) or not all(isinstance(x, Task) for x in ts):
            problems.append(f"tasks({split!r}) must return list[Task]")
            continue
        if not ts:
            problems.append(f"tasks({split!r}) is empty")
        ids = [x.id for x in ts]
        if len(set(ids)) != len(ids):
            problems.append(f"tasks({split!r}) has duplicate ids")
        if env.tasks(split) != ts:
            problems.append(f"tasks({split!r}) is not deterministic: two calls gave different tasks")
        splits[split] = ts
    if "train" in splits and "test" in splits:
        tr, te = splits["train"], splits["test"]
        if {x.id for x in tr} & {x.id for x in te}:
            problems.append("train and test share task ids")
        shared = {x.prompt for x in tr} & {x.prompt for x in te}
        if shared:
            problems.append(f"train and test share {len(shared)} prompts, e.g. {next(iter(shared))[:80]!r}")
    spec = env.spec
    if make_env is None and spec is not None:

        def make_env() -> Environment:
            return make(spec.name, **spec.kwargs)

    if make_env is not None and splits:
        other = make_env()
        for split, ts in splits.items():
            if other.tasks(split) != ts:
                problems.append(f"tasks({split!r}) differs between two instances with the same config (seed)")
    elif make_env is None:
        warnings.append(
            "determinism across instances not checked: pass make_env or build the env with make()"
        )

    if problems:  # without tasks the dynamic checks below cannot run
        raise EnvCheckError(f"{type(env).__name__} failed check_environment:\n- " + "\n- ".join(problems))

    # 3. dynamic checks on a few tasks
    try:
        await env.step(ParsedAction(message=Message(role="assistant", content="hi")))
        problems.append("step() before any reset() must raise (EnvError), it returned")
    except Exception:
        pass
    sample = (splits["train"][: max(1, max_tasks_checked - 1)] + splits["test"][:1])[:max_tasks_checked]
    for task in sample:
        where = f"task {task.id!r}"
        try:
            msgs = await env.reset(task)
            if not isinstance(msgs, list) or not msgs or not all(isinstance(m, Message) for m in msgs):
                problems.append(f"{where}: reset() must return a non-empty list[Message]")
                continue
            if msgs[-1].role != "user":
                problems.append(
                    f"{where}: reset() must end with the user message, got role {msgs[-1].role!r}"
                )
            if msgs[0].role == "system" and msgs[0].content != env.system_prompt:
                warnings.append(f"{where}: the system message differs from env.system_prompt")
            # a plain message: some feedback, not an end
            r = await env.step(ParsedAction(message=Message(role="assistant", content="Let me think.")))
            if _check_step_result(r, f"{where} plain step", problems):
                if r.terminated:
                    warnings.append(f"{where}: a plain message without tool call or answer ended the episode")
                elif not r.observations:
                    problems.append(
                        f"{where}: a plain message got no observation (the model is left without feedback)"
                    )
            # a parse error becomes an observation
            if not _ended(r):
                r = await env.step(
                    ParsedAction(
                        message=Message(role="assistant", content="<tool_call>{bad"),
                        errors=["bad JSON at char 1"],
                    )
                )
                ok = _check_step_result(r, f"{where} parse-error step", problems)
                if ok and not _ended(r) and not any("bad JSON" in m.content for m in r.observations):
                    problems.append(
                        f"{where}: ParsedAction.errors must be shown to the model as observations"
                    )
            # a bad tool call becomes an error observation bound to its call id
            if env.tools and not _ended(r):
                call = ToolCall(name=env.tools[0].name, arguments={"__no_such_argument__": 1})
                r = await env.step(
                    ParsedAction(message=Message(role="assistant", content="", tool_calls=[call]))
                )
                ok = _check_step_result(r, f"{where} bad-call step", problems)
                if (
                    ok
                    and not _ended(r)
                    and not any(m.role == "tool" and m.tool_call_id == call.id for m in r.observations)
                ):
                    problems.append(
                        f"{where}: a tool call must be answered by a tool message with its tool_call_id"
                    )
                unknown = ToolCall(name="__no_such_tool__", arguments={})
                if not _ended(r):
                    r = await env.step(
                        ParsedAction(message=Message(role="assistant", content="", tool_calls=[unknown]))
                    )
                    ok = _check_step_result(r, f"{where} unknown-tool step", problems)
                    if ok and not _ended(r) and not any(m.tool_call_id == unknown.id for m in r.observations):
                        problems.append(f"{where}: an unknown tool must give an error observation")
            # the answer convention ends the episode; stepping afterwards is an error
            if not _ended(r):
                ans = task.answer if task.answer is not None else "x"
                r = await env.step(
                    ParsedAction(
                        message=Message(role="assistant", content=f"<answer>{ans}</answer>"), answer=ans
                    )
                )
                if _check_step_result(r, f"{where} answer step", problems) and not _ended(r):
                    problems.append(
                        f"{where}: an action with an answer must end the episode (terminated=True)"
                    )
            elif isinstance(r, StepResult) and r.truncated and not r.terminated:
                warnings.append(f"{where}: the episode was truncated before the answer step; not checked")
            try:
                await env.step(ParsedAction(message=Message(role="assistant", content="again")))
                problems.append(f"{where}: step() after the episode ended must raise (EnvError), it returned")
            except Exception:
                pass
        except Exception as e:  # an env that raises mid-episode is a finding, not a crashed check
            problems.append(f"{where}: the checks stopped at {type(e).__name__}: {e}")

    # 4. the oracle, if any, produces text
    oracle = env.oracle() if check_oracle else None
    if oracle is not None:
        if not isinstance(oracle, Oracle):
            problems.append("env.oracle() must return an object with async act(messages) -> str")
        else:
            msgs = await env.reset(splits["test"][0])
            text = await oracle.act(msgs)
            if not isinstance(text, str) or not text:
                problems.append(f"oracle.act() must return non-empty text, got {text!r}")
            else:
                action = env.parser.parse(text)
                if not isinstance(action, ParsedAction):
                    problems.append("parser.parse must return a ParsedAction")
                elif action.errors:
                    problems.append(f"the oracle's first action does not parse cleanly: {action.errors}")
    if problems:
        raise EnvCheckError(f"{type(env).__name__} failed check_environment:\n- " + "\n- ".join(problems))
    if splits.get("test"):
        await env.reset(splits["test"][0])
    for w in warnings:
        log.warning("check_environment(%s): %s", env.name, w)
    return warnings


def _ended(r: object) -> bool:
    """Whether a step result ends the episode (terminated or truncated); anything that is not a
    StepResult (already reported) ends the checks of that task too."""
    return not isinstance(r, StepResult) or r.terminated or r.truncated


def check_environment(
    env: Environment,
    *,
    make_env: Callable[[], Environment] | None = None,
    max_tasks_checked: int = 3,
    check_oracle: bool = True,
) -> list[str]:
    """Synchronous :func:`acheck_environment` (works inside a running event loop too)."""
    return run_sync(
        acheck_environment(
            env, make_env=make_env, max_tasks_checked=max_tasks_checked, check_oracle=check_oracle
        )
    )


async def run_oracle(env: Environment, task: Task, *, max_turns: int = 8) -> tuple[StepResult, list[Message]]:
    """Run ``env.oracle()`` on one task through ``env.step`` (the real tools); return the last
    StepResult and the whole conversation. Used by tests and to sanity-check new environments."""
    oracle = env.oracle()
    if oracle is None:
        raise EnvError(f"environment {env.name!r} has no oracle")
    messages = await env.reset(task)
    result = StepResult()
    for _ in range(max_turns):
        text = await oracle.act(list(messages))
        action = env.parser.parse(text)
        messages.append(action.message)
        result = await env.step(action)
        messages.extend(result.observations)
        if result.terminated or result.truncated:
            break
    return result, messages


__all__ = [
    "DEFAULT_NUDGE",
    "ENTRY_POINT_GROUP",
    "EnvCheckError",
    "EnvError",
    "EnvSpec",
    "Environment",
    "Oracle",
    "Split",
    "StepResult",
    "Task",
    "ToolEnv",
    "acheck_environment",
    "check_environment",
    "last_user_prompt",
    "list_envs",
    "make",
    "register",
    "render_tool_call",
    "run_oracle",
    "tool_results",
]
