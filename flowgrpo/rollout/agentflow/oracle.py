"""Demonstrations in the flow agent's format, for its supervised warm start.

Why: a warm start on the tool agent's format teaches a small model to write tool calls, not plans;
measured on ``multihop`` the untrained flow agent scores 0/20 where the tool agent scores 10/20
(docs/agentflow.md). AgentFlow starts from an instruction-tuned planner that already plans; a 135M
model needs to be shown the format first, like the tool agent.

The environment's oracle (the tool agent's scripted policy, :meth:`Environment.oracle`) drives all
four modules of a real flow episode (:class:`~flowgrpo.rollout.agentflow.FlowAgent`, its prompts, memory and
tools), through a *script*: the conversation the oracle would have had as a tool agent. At each step
the oracle's next action decides every module's text:

- planner: ``Sub-goal: <the call's arguments>`` / ``Tool: <the call's tool>``;
- executor: the oracle's tool call, in the executor's Hermes format (the environment runs it; its
  result extends the script);
- verifier: ``Conclusion: STOP`` when the oracle's next action is its answer, ``CONTINUE`` otherwise;
- generator: ``<answer>...</answer>`` with the oracle's answer.

The planner turns are ordinary trajectories (exact token ids). :func:`module_demonstrations` turns
the frozen modules' recorded inputs and outputs into single-turn trajectories of their own, for a
warm start of modules that share the policy's weights (``source: policy``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Literal

from flowgrpo.chat.format import ChatFormat
from flowgrpo.chat.parsing import ActionParser, ParseError
from flowgrpo.env import Environment, EnvSpec, Oracle, StepResult, render_tool_call
from flowgrpo.rollout.agentflow.agent import FlowAgent
from flowgrpo.rollout.agentflow.config import AgentConfig
from flowgrpo.rollout.agentflow.modules import ModuleReply
from flowgrpo.rollout.engine import Actor, RolloutConfig, text_actor
from flowgrpo.tool import Tool
from flowgrpo.types import Message, ParsedAction, Task, Trajectory, Turn


class _Script:
    """One episode's oracle and the conversation it would have had as a tool agent."""

    def __init__(self, oracle: Oracle, parser: ActionParser) -> None:
        self.oracle, self.parser = oracle, parser
        self.conversation: list[Message] = []
        self._next: ParsedAction | None = None

    async def next_action(self) -> ParsedAction:
        """The oracle's next action on the conversation so far (asked once per step)."""
        if self._next is None:
            text = await self.oracle.act(list(self.conversation))
            try:
                self._next = self.parser.parse(text)
            except ParseError as e:
                raise RuntimeError(f"the environment's oracle wrote an unparsable action: {e}") from e
        return self._next

    def record_step(self, action_text: str, observations: Sequence[Message]) -> None:
        self.conversation += [Message(role="assistant", content=action_text), *observations]
        self._next = None


class _ScriptedEnv:
    """The environment, seen through the script: its opening messages start the oracle's
    conversation and every executed tool call extends it with the call's observations."""

    def __init__(self, env: Environment, script: _Script, chat: ChatFormat) -> None:
        self._env, self._script, self._chat = env, script, chat

    @property
    def name(self) -> str:
        return self._env.name

    @property
    def tools(self) -> Sequence[Tool]:
        return self._env.tools

    @property
    def parser(self) -> ActionParser:
        return self._env.parser

    @property
    def system_prompt(self) -> str:
        return self._env.system_prompt

    @property
    def spec(self) -> EnvSpec | None:
        return self._env.spec

    @property
    def tool_timeout_s(self) -> float | None:
        return self._env.tool_timeout_s

    @tool_timeout_s.setter
    def tool_timeout_s(self, value: float | None) -> None:
        self._env.tool_timeout_s = value

    async def reset(self, task: Task) -> list[Message]:
        opening = await self._env.reset(task)
        self._script.conversation = self._chat.prompt_messages(opening, self._env.system_prompt)
        return opening

    async def step(self, action: ParsedAction) -> StepResult:
        result = await self._env.step(action)
        if action.message.tool_calls:
            self._script.record_step(action.message.content, result.observations)
        return result

    def tasks(self, split: Any) -> list[Task]:
        return self._env.tasks(split)

    def oracle(self) -> Oracle | None:
        return self._env.oracle()


def _sub_goal(parsed: ParsedAction) -> tuple[str, str]:
    """``(sub_goal, tool)`` of the oracle's next call: the arguments' values, in order, are what
    the executor has to put into the call (e.g. a search query or an expression)."""
    call = parsed.message.tool_calls[0]
    goal = " ".join(str(v) for v in call.arguments.values()) or call.name
    return " ".join(goal.split()), call.name


class _PlannerScript:
    """The planner's text: ``Sub-goal: ...`` and ``Tool: ...`` from the oracle's next call, less the
    reply prefix the agent writes into the prompt."""

    def __init__(self, script: _Script, prefix: str, tool_names: list[str]) -> None:
        self.script, self.prefix, self.tool_names = script, prefix, tool_names

    async def act(self, messages: list[Message]) -> str:
        parsed = await self.script.next_action()
        if parsed.message.tool_calls:
            goal, tool = _sub_goal(parsed)
        else:  # the oracle would answer now: plan a step that looks the question up again
            goal, tool = "check the answer to the question", self.tool_names[0]
        text = f"Sub-goal: {goal}\nTool: {tool}"
        return text[len(self.prefix) :] if text.startswith(self.prefix) else text


class _ModuleScript:
    """One frozen module's text from the script (:class:`~flowgrpo.rollout.agentflow.modules.TextModule`)."""

    def __init__(self, script: _Script, role: Literal["executor", "verifier", "generator"]) -> None:
        self.script, self.role = script, role

    async def reply(self, system: str, user: str, prefix: str) -> ModuleReply:
        parsed = await self.script.next_action()
        if self.role == "executor":  # the call alone, in the executor's format (the oracle may think first)
            out = "".join(render_tool_call(c.name, c.arguments) for c in parsed.message.tool_calls) or prefix
        elif self.role == "verifier":
            out = "Conclusion: " + ("STOP" if parsed.answer is not None else "CONTINUE")
        else:
            out = f"<answer>{parsed.answer if parsed.answer is not None else ''}</answer>"
        return ModuleReply(text=out)


class FlowOracleAgent:
    """An :class:`~flowgrpo.rollout.engine.EpisodeAgent` that runs the flow agent with every module
    scripted by the environment's oracle. The engine's ``act`` is not used: the script writes the
    planner's text, tokenized as a text policy's (``encode(text) + [end-of-turn]``)."""

    def __init__(self, config: AgentConfig, tokenizer: Any) -> None:
        self.config, self.tokenizer = config, tokenizer

    async def run_episode(
        self, env: Environment, task: Task, act: Actor, traj: Trajectory, rollout: RolloutConfig
    ) -> None:
        oracle = env.oracle()
        if oracle is None:
            raise TypeError(f"environment {env.name!r} has no oracle: it cannot demonstrate the flow format")
        chat = ChatFormat(self.tokenizer, tools=list(env.tools), parser=env.parser)
        script = _Script(oracle, env.parser)
        agent = FlowAgent(
            self.config,
            self.tokenizer,
            executor=_ModuleScript(script, "executor"),
            verifier=_ModuleScript(script, "verifier"),
            generator=_ModuleScript(script, "generator"),
        )
        planner = _PlannerScript(script, self.config.prompts.planner_prefix, [t.name for t in env.tools])
        await agent.run_episode(
            _ScriptedEnv(env, script, chat), task, text_actor(planner)(chat), traj, rollout
        )


MODULES = ("executor", "verifier", "generator")


def module_demonstrations(
    trajectories: Sequence[Trajectory],
    config: AgentConfig,
    tokenizer: Any,
    *,
    modules: Collection[str] = MODULES,
) -> list[Trajectory]:
    """The replies of the frozen ``modules`` recorded in flow ``trajectories``, each as a one-turn trajectory
    (prompt: the module's system and user prompt as the chat template renders them, plus its reply
    prefix; action: the rest of the reply and the end-of-turn token, exactly what
    :class:`~flowgrpo.rollout.agentflow.modules.BackendModule` would have to generate). Each keeps its
    episode's reward and group; replies that do not start with their prefix are left out."""
    chat = ChatFormat(tokenizer)
    eot = list(chat.end_of_turn_ids[:1])
    p = config.prompts
    prefixes = {"executor": p.executor_prefix, "verifier": p.verifier_prefix, "generator": p.generator_prefix}
    out: list[Trajectory] = []
    for traj in trajectories:
        ios = [(m, t.metadata.get("flow", {}).get(m)) for t in traj.turns for m in ("executor", "verifier")]
        ios.append(("generator", traj.metadata.get("flow", {}).get("generator")))
        for module, io in ios:
            if not io or module not in modules:
                continue
            prefix = prefixes[module]
            if not io["output"].startswith(prefix):
                continue
            msgs = [Message(role="system", content=io["system"]), Message(role="user", content=io["prompt"])]
            ids = chat.initial_ids(msgs) + (chat.encode(prefix) if prefix else [])
            action = chat.encode(io["output"][len(prefix) :]) + eot
            out.append(
                Trajectory(
                    group_id=traj.group_id,
                    task_id=traj.task_id,
                    env=traj.env,
                    turns=[
                        Turn(
                            prompt_ids=ids,
                            action_ids=action,
                            action_logprobs=[0.0] * len(action),
                            action=Message(role="assistant", content=io["output"]),
                            resets_context=True,
                        )
                    ],
                    reward=traj.reward,
                    termination=traj.termination,
                    metadata={"module": module},
                )
            )
    return out


__all__ = ["FlowOracleAgent", "module_demonstrations"]
