"""The flow agent: AgentFlow's in-the-flow agentic system (Li et al. 2025, "In-the-Flow Agentic
System Optimization for Effective Planning and Tool Use", and lupantech/AgentFlow ``solver.py``).

One episode, for a query q, a toolset K and an evolving memory M (empty at first)::

    for t = 1 .. max_steps:
        a_t   = planner(q, K, M)                -> sub-goal and tool      (the policy: TRAINED)
        cmd   = executor(q, sub-goal, tool)     -> one tool call          (frozen)
        o_t   = env.step(cmd)                   -> the tool's result      (the environment)
        M    += record(t, sub-goal, tool, cmd, summary of o_t)
        v_t   = verifier(q, M)                  -> STOP or CONTINUE       (frozen)
        if v_t == STOP: break
    answer = generator(q, M)                                              (frozen)

Only the planner is trained. Each planner turn is a :class:`~flowgrpo.types.Turn` with
``resets_context=True``: its ``prompt_ids`` are the whole prompt rebuilt from q, K and M, so it is
its own training row and sample (:mod:`flowgrpo.training.batching`), and the trajectory's outcome advantage
reaches every planner turn (``flow_grpo``). The executor's, the tool's and the verifier's text are
the turn's observations; the generator's reply is the last observation of the last turn, where
:attr:`~flowgrpo.types.Trajectory.final_message` finds the answer. None of their tokens enter a
training row. Each turn's ``metadata["flow"]`` keeps every module's input and output and the
memory, for replay.

Every way an episode ends is its :class:`~flowgrpo.types.Termination`: ``verifier_stop`` (the
verifier said STOP), ``max_turns`` (``max_steps`` planner turns; also the environment's own step
limit, with ``metadata["truncated_by_env"]``), ``finished`` (the environment ended the episode
itself), ``context_overflow`` (a planner prompt does not fit ``rollout.max_context_tokens``) and
``error`` (a module, the environment or a tool raised; set by the rollout engine). The generator
answers after every ending but ``error``, as AgentFlow's solver always writes its final output.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from flowgrpo.chat.format import ChatFormat
from flowgrpo.chat.parsing import ParseError
from flowgrpo.env import Environment, render_tool_call
from flowgrpo.rollout.agentflow.config import AgentConfig
from flowgrpo.rollout.agentflow.memory import Memory, Verdict
from flowgrpo.rollout.agentflow.modules import ModuleReply, TextModule
from flowgrpo.rollout.engine import Actor, RolloutConfig
from flowgrpo.tool import Tool, to_openai_schema
from flowgrpo.types import Message, ParsedAction, Task, Termination, Trajectory, Turn

_SUB_GOAL = re.compile(r"sub[\s_-]*goal\s*:\s*(.*?)(?=^\s*tool(?:[\s_-]*name)?\s*:|\Z)", re.I | re.S | re.M)
_TOOL = re.compile(r"^\s*\**\s*tool(?:[\s_-]*name)?\s*\**\s*:\s*(.+)$", re.I | re.M)
_CONCLUSION = re.compile(r"conclusion\**:?\s*\**\s*(\w+)", re.I)


def _canonical(name: str) -> str:
    return "_".join(p for p in re.split(r"[\s_\-]+", re.sub(r"[`*\"'.,;:()\[\]]", " ", name).lower()) if p)


def parse_plan(text: str, tool_names: list[str]) -> tuple[str, str | None]:
    """The planner's ``(sub_goal, tool)``: the last ``Sub-goal:`` and ``Tool:`` of ``text``; the
    tool is matched to ``tool_names`` ignoring case, spaces, underscores and quotes (AgentFlow's
    ``normalize_tool_name``), and is None when no tool matches."""
    goals = _SUB_GOAL.findall(text)
    sub_goal = " ".join(goals[-1].split()) if goals else ""
    tools = _TOOL.findall(text)
    if not tools:
        return sub_goal, None
    want = _canonical(tools[-1])
    by_canon = {_canonical(n): n for n in tool_names}
    if want in by_canon:
        return sub_goal, by_canon[want]
    first = want.split("_")[0] if want else ""
    return sub_goal, by_canon.get(first)


def parse_verdict(text: str) -> Verdict:
    """AgentFlow's ``Verifier.extract_conclusion``: the last ``Conclusion: X`` if X is STOP or
    CONTINUE; else STOP if "stop" appears anywhere, CONTINUE if "continue" does; else CONTINUE."""
    for m in reversed(list(_CONCLUSION.finditer(text))):
        word = m.group(1).upper()
        if word in ("STOP", "CONTINUE"):
            return word  # type: ignore[return-value]
        break
    low = text.lower()
    if "stop" in low:
        return "STOP"
    return "CONTINUE"


def describe_tools(tools: list[Tool]) -> str:
    """K as prompt text: one line per tool, name and description."""
    return "\n".join(f"- {t.name}: {' '.join(t.description.split())}" for t in tools) or "(no tools)"


def _tool_schema(tool: Tool) -> tuple[str, str]:
    """The tool's arguments as JSON, and a well-formed example call (Hermes format) of it."""
    props = to_openai_schema(tool)["function"]["parameters"].get("properties", {})
    schema = json.dumps({k: v.get("description", v.get("type", "")) for k, v in props.items()})
    return schema, render_tool_call(tool.name, {k: "..." for k in props})


def _io(system: str, prompt: str, reply: ModuleReply) -> dict[str, Any]:
    return {
        "system": system,
        "prompt": prompt,
        "output": reply.text,
        "prompt_tokens": reply.prompt_tokens,
        "new_tokens": reply.new_tokens,
    }


class FlowAgent:
    """Runs flow-agent episodes inside the rollout engine (:class:`~flowgrpo.rollout.engine.EpisodeAgent`).

    Args:
        config: the ``agent`` section (limits, prompts).
        tokenizer: the policy's tokenizer (renders the planner's prompts).
        executor / verifier / generator: the frozen modules (:func:`~flowgrpo.rollout.agentflow.modules.make_module`).
    """

    def __init__(
        self,
        config: AgentConfig,
        tokenizer: Any,
        *,
        executor: TextModule,
        verifier: TextModule,
        generator: TextModule,
    ) -> None:
        self.config = config
        self.chat = ChatFormat(tokenizer)  # K is written into the planner prompt, not the system message
        self.executor, self.verifier, self.generator = executor, verifier, generator

    async def run_episode(
        self, env: Environment, task: Task, act: Actor, traj: Trajectory, rollout: RolloutConfig
    ) -> None:
        """Fill ``traj`` (turns, termination, metadata) with one episode of ``task`` in ``env``."""
        cfg, p = self.config, self.config.prompts
        step_timeout = rollout.step_timeout_s or 3 * rollout.tool_timeout_s + 5
        opening = await env.reset(task)
        query = next((m.content for m in reversed(opening) if m.role == "user"), task.prompt)
        tools = list(env.tools)
        by_name = {t.name: t for t in tools}
        memory = Memory(
            self.chat.encode,
            self.chat.decode,
            max_tokens=cfg.memory_max_tokens,
            result_max_chars=cfg.result_max_chars,
        )
        env_done = False
        cost = {"executor": 0, "verifier": 0, "generator": 0}
        traj.termination = Termination.max_turns
        for step in range(1, cfg.max_steps + 1):
            # planner: a_t ~ pi(q, K, M), from a prompt rebuilt from scratch
            memory_text = memory.render()
            prompt = p.planner.format(
                query=query,
                tools=describe_tools(tools),
                memory=memory_text,
                step=step,
                max_steps=cfg.max_steps,
            )
            msgs = [Message(role="system", content=p.planner_system), Message(role="user", content=prompt)]
            ids = self.chat.initial_ids(msgs) + (
                self.chat.encode(p.planner_prefix) if p.planner_prefix else []
            )
            if len(ids) + 1 > rollout.max_context_tokens:
                traj.termination = Termination.context_overflow
                traj.metadata["prompt_tokens"] = len(ids)
                break
            limit = min(rollout.max_new_tokens, rollout.max_context_tokens - len(ids))
            res = await act(ids, limit, msgs)
            body = list(res.token_ids)
            if body and body[-1] in self.chat.end_of_turn_ids:
                body = body[:-1]
            plan_text = p.planner_prefix + self.chat.decode(body)
            sub_goal, tool_name = parse_plan(plan_text, list(by_name))
            turn = Turn(
                prompt_ids=ids,
                action_ids=list(res.token_ids),
                action_logprobs=list(res.logprobs),
                action=Message(role="assistant", content=plan_text),
                resets_context=True,
                finish_reason=res.finish_reason,
            )
            traj.turns.append(turn)
            flow: dict[str, Any] = {
                "step": step,
                "memory_in": memory_text,
                "planner": {"system": p.planner_system, "prompt": prompt, "output": plan_text},
                "sub_goal": sub_goal,
                "tool": tool_name,
            }
            # executor: the sub-goal becomes one tool call; the environment runs it
            if tool_name is None:
                command = ""
                result = f"No command was run: the plan names no known tool (tools: {', '.join(by_name)})."
                observations = [Message(role="user", content=result)]
                flow["executor"] = None
            else:
                schema, example = _tool_schema(by_name[tool_name])
                ex_prompt = p.executor.format(
                    query=query, sub_goal=sub_goal, tool=tool_name, tool_schema=schema, example=example
                )
                ex = await self.executor.reply(p.executor_system, ex_prompt, p.executor_prefix)
                cost["executor"] += ex.prompt_tokens + ex.new_tokens
                flow["executor"] = _io(p.executor_system, ex_prompt, ex)
                try:
                    parsed = env.parser.parse(ex.text)
                except ParseError as e:
                    parsed = ParsedAction(message=Message(role="assistant", content=ex.text), errors=[str(e)])
                parsed = parsed.model_copy(update={"answer": None})  # the executor acts, it never answers
                calls = parsed.message.tool_calls
                command = "; ".join(json.dumps({"name": c.name, "arguments": c.arguments}) for c in calls)
                try:
                    stepped = await asyncio.wait_for(env.step(parsed), step_timeout)
                except asyncio.TimeoutError as e:
                    raise RuntimeError(f"env.step took longer than {step_timeout} s") from e
                observations = [
                    Message(role="assistant", name="executor", content=ex.text),
                    *stepped.observations,
                ]
                result = "\n".join(o.content for o in stepped.observations)
                turn.reward = float(stepped.reward)
                if stepped.terminated or stepped.truncated:
                    env_done = True
                    traj.termination = Termination.finished if stepped.terminated else Termination.max_turns
                    if stepped.truncated and not stepped.terminated:
                        traj.metadata["truncated_by_env"] = True
            record = memory.add(step, sub_goal, tool_name or "(none)", command or "(none)", result)
            flow["tool_result"] = result
            # verifier: is M enough to answer q?
            ver_prompt = p.verifier.format(query=query, memory=memory.render())
            ver = await self.verifier.reply(p.verifier_system, ver_prompt, p.verifier_prefix)
            cost["verifier"] += ver.prompt_tokens + ver.new_tokens
            record.verdict = parse_verdict(ver.text)
            flow["verifier"] = {**_io(p.verifier_system, ver_prompt, ver), "verdict": record.verdict}
            flow["memory"] = memory.snapshot()
            turn.observations = [*observations, Message(role="assistant", name="verifier", content=ver.text)]
            turn.metadata["flow"] = flow
            if env_done:
                break
            if record.verdict == "STOP":
                traj.termination = Termination.verifier_stop
                break
        final: dict[str, Any] = {"memory": memory.snapshot(), "generator": None, "answer": None}
        if traj.turns:
            # generator: the final answer from q and M
            gen_prompt = p.generator.format(query=query, memory=memory.render())
            gen = await self.generator.reply(p.generator_system, gen_prompt, p.generator_prefix)
            cost["generator"] += gen.prompt_tokens + gen.new_tokens
            answer_msg = Message(role="assistant", name="generator", content=gen.text)
            traj.turns[-1].observations.append(answer_msg)
            try:
                answer = env.parser.parse(gen.text).answer
            except ParseError:
                answer = None
            final.update(generator=_io(p.generator_system, gen_prompt, gen), answer=answer)
            if answer is not None and not env_done:
                done = await asyncio.wait_for(
                    env.step(ParsedAction(message=answer_msg, answer=answer)), step_timeout
                )
                if done.info:
                    final["info"] = json.loads(json.dumps(done.info, default=str))
        final["module_tokens"] = cost
        traj.metadata["flow"] = final


__all__ = ["FlowAgent", "describe_tools", "parse_plan", "parse_verdict"]
