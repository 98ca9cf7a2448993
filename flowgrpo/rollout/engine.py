"""The episode runner: many multi-turn episodes at once, with generation batched across them.

Every episode is an ``async`` loop::

    reset -> [generate -> parse -> env.step (tools run concurrently, with timeouts) -> observe]*

under three limits, each ending the episode with its :class:`~flowgrpo.types.Termination`:
``max_turns`` (turn count), ``max_new_tokens`` per turn (an action cut by it ends the episode
with ``max_tokens``) and ``max_context_tokens`` (a prompt or observation that would not leave
room for one more token ends it with ``context_overflow``; generation is capped at the room left,
and an action cut by that cap also ends it with ``context_overflow``).

Why a scheduler. A model decodes a batch far faster per token than one sequence at a time, but
episodes wait on tools at different moments. Three schedules:

- ``continuous`` (default, for backends with ``continuous_batching`` such as ``hf``): each
  episode sends its turn the moment it is ready; the backend admits it into the batch that is
  already decoding and keeps the episode's keys/values between turns, so one episode's tool call
  overlaps everyone else's decoding and a freed batch slot is refilled at the next step. Each
  request carries its own seed (episode, turn).
- ``static`` (and backends without continuous batching): the :class:`_Batcher` collects the
  requests of all live episodes -- for at most ``batch_wait_ms`` or until every live episode is
  waiting -- and sends them in one ``backend.generate`` call (up to ``max_batch_size`` prompts).
  Tools of other episodes still run during that call, but a batch is fixed once issued. Batches
  do not depend on timing when tools are instant, so reruns are bit-exact.
- ``lockstep``: waves. The batcher waits until every live episode has its next request ready (no
  deadline), orders the wave by (episode, turn) and issues it in calls of ``max_batch_size``, one
  after another. Which requests share a call, and in which order, then depends only on what the
  episodes did, never on how long their tools took, so reruns are bit-exact with any tools (given
  episodes that issue one request at a time, as the tool agent and AgentFlow's modules do). The
  price is the tail: a wave waits for its slowest tool and its longest action.

Token bookkeeping (see :mod:`flowgrpo.chat.format`): the first turn's ``prompt_ids`` are the rendered
opening messages; each later turn's ``prompt_ids`` are the delta after the previous action (the
template's end-of-turn tail, the observations and the next generation prompt); ``action_ids``
are exactly the sampled ids. So ``Trajectory.context_ids(k)`` is exactly what the model saw.

An environment, parser or tool that raises ends only its own episode (``Termination.error``, the
message in ``metadata["error"]``); the rest of the group carries on.

Text policies (:func:`rollout_text_policy`): an oracle's text actions are tokenized (plus the
end-of-turn token) and go through the same loop, giving normal trajectories with exact ids and
logprobs 0.0 -- demonstrations for a supervised warm-start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowgrpo.chat.format import ChatFormat
from flowgrpo.chat.parsing import ParseError
from flowgrpo.env import Environment
from flowgrpo.rollout.backends.base import (
    BackendName,
    GenerationResult,
    RolloutBackend,
    SamplingParams,
    ServerConfig,
    VLLMConfig,
)
from flowgrpo.types import Message, ParsedAction, Task, Termination, Trajectory, TrajectoryGroup, Turn
from flowgrpo.utils import interrupt

log = logging.getLogger(__name__)


class GatewayAgentConfig(BaseModel):
    """``rollout.source: gateway``: the agent program the trainer runs once per episode, as its own
    process, against the trainer's policy served by the gateway (docs/gateway.md).

    Exactly one of ``command`` (any program) or ``callable`` (a Python function) is given."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] | None = Field(
        None,
        description="the agent program's argv, e.g. ['{python}', examples/langchain_agent/agent.py] ('{python}': "
        "the trainer's interpreter); it finds "
        "its episode in the environment (OPENAI_BASE_URL, FLOWGRPO_EPISODE_ID, FLOWGRPO_TASK...) and posts "
        "its reward",
    )
    callable: str | None = Field(
        None,
        description="'package.module:function', called as function(EpisodeContext) in a process of its own; "
        "a number (or a (reward, breakdown) pair) it returns is posted as the reward",
    )
    timeout_s: float = Field(300.0, gt=0, description="an episode's program is killed after this long")
    max_concurrency: int = Field(16, ge=1, description="agent programs running at once")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment of every agent program")
    cwd: str | None = Field(
        None, description="working directory of the agent programs (default: the trainer's)"
    )

    @model_validator(mode="after")
    def _one_agent(self) -> GatewayAgentConfig:
        if (self.command is None) == (self.callable is None):
            raise ValueError(
                "rollout.gateway needs exactly one of 'command' (an argv list) or 'callable' "
                "('package.module:function')"
            )
        if self.command is not None and not self.command:
            raise ValueError("rollout.gateway.command is empty: give the agent program's argv")
        if self.callable is not None and ":" not in self.callable:
            raise ValueError(
                f"rollout.gateway.callable must be 'package.module:function', got {self.callable!r}"
            )
        return self


class RolloutConfig(BaseModel):
    """The backend that samples episodes, and the limits and sampling of rollouts."""

    model_config = ConfigDict(extra="forbid")
    source: Literal["engine", "gateway"] = Field(
        "engine",
        description="engine: episodes of the config's environment run by the rollout engine; gateway: "
        "episodes of an agent program the trainer runs per episode (rollout.gateway), its model calls "
        "recorded by the gateway and its reward posted by the program",
    )
    gateway: GatewayAgentConfig | None = Field(None, description="the agent program of source=gateway")
    backend: BackendName = Field(
        "hf",
        description="hf: the trainer's own model (CPU or GPU); openai: an OpenAI-compatible server "
        "(rollout.server.base_url); vllm: an in-process vLLM engine on a GPU (rollout.vllm)",
    )
    server: ServerConfig = Field(default_factory=ServerConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    max_turns: int = Field(4, ge=1)
    max_new_tokens: int = Field(256, ge=1, description="per turn")
    max_context_tokens: int = Field(2048, ge=2)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    tool_timeout_s: float = Field(10.0, gt=0, description="per tool call (given to every environment)")
    step_timeout_s: float | None = Field(
        None, gt=0, description="a whole env.step; default 3 * tool_timeout_s + 5"
    )
    max_batch_size: int | None = Field(
        None, ge=1, description="most generation requests in flight; default: backend.max_batch_size"
    )
    scheduling: Literal["continuous", "static", "lockstep"] = Field(
        "continuous",
        description=(
            "continuous: each episode's turn goes to the backend the moment it is ready and joins the "
            "running batch (backends with continuous_batching, e.g. hf); static: requests are collected "
            "for up to batch_wait_ms into batches issued one at a time (bit-exact reruns when tools are "
            "instant); lockstep: waves of every live episode's next turn in episode order, bit-exact "
            "reruns whatever the tools' timing"
        ),
    )
    batch_wait_ms: float = Field(
        5.0, ge=0, description="static scheduling: how long to collect requests before a batch"
    )

    @property
    def logprob_temperature(self) -> float:
        """The temperature the trainer scores actions under: the one they were sampled at (1 for
        greedy decoding, whose logprobs are those of the raw model). The warm start's supervised
        epochs score at it too, so the tempered sampler reproduces the demonstrations; a run at
        another temperature therefore starts RL from another warm start (docs/learning.md 14)."""
        t = self.sampling.temperature
        return t if t > 0 else 1.0

    @model_validator(mode="after")
    def _gateway_agent(self) -> RolloutConfig:
        if self.source == "gateway" and self.gateway is None:
            raise ValueError(
                "rollout.source=gateway needs the agent program: set rollout.gateway.command (an argv "
                "list) or rollout.gateway.callable ('package.module:function')"
            )
        if self.source == "gateway" and self.backend != "hf":
            raise ValueError(
                "rollout.source=gateway serves the trainer's own model: use rollout.backend=hf "
                f"(got {self.backend!r})"
            )
        return self

    @model_validator(mode="after")
    def _server_named(self) -> RolloutConfig:
        if self.backend == "openai" and not self.server.base_url:
            raise ValueError(
                "rollout.backend=openai needs the server's address: set rollout.server.base_url "
                "(e.g. http://127.0.0.1:8000/v1 after `flowgrpo serve --model ... --port 8000`)"
            )
        return self


@runtime_checkable
class TextPolicy(Protocol):
    """A policy that acts in text, e.g. an environment oracle."""

    async def act(self, messages: list[Message]) -> str: ...


class _Request:
    __slots__ = ("future", "ids", "limit", "order")

    def __init__(self, ids: list[int], limit: int, future: asyncio.Future, order: tuple[int, int]) -> None:
        self.ids, self.limit, self.future, self.order = ids, limit, future, order


class _Batcher:
    """Collects generation requests of live episodes and issues batched backend calls: after
    ``wait_s`` or once every live episode waits (static), or in waves of every live episode's next
    request, ordered by (episode, turn) (``lockstep``; ``wait_s`` unused)."""

    def __init__(
        self,
        backend: RolloutBackend,
        params: SamplingParams,
        max_batch: int,
        wait_s: float,
        *,
        lockstep: bool,
        expected: int,
    ) -> None:
        self.backend, self.params, self.max_batch, self.wait_s = backend, params, max_batch, wait_s
        self.lockstep = lockstep
        self.expected = expected  # episodes of this rollout; a lockstep wave waits until all have started
        self.started = 0
        self.pending: list[_Request] = []
        self.live = 0
        self._changed = asyncio.Event()
        self._calls = 0
        self.batch_sizes: list[int] = []
        self.gate: _FirstTurnGate | None = None

    def episode_started(self) -> None:
        self.live += 1
        self.started += 1

    def episode_ended(self) -> None:
        self.live -= 1
        self._changed.set()
        if self.gate is not None:
            self.gate.leave()

    async def submit(self, ids: list[int], limit: int, order: tuple[int, int]) -> GenerationResult:
        """``order``: (episode, turn), the request's place in a lockstep wave."""
        fut = asyncio.get_running_loop().create_future()
        self.pending.append(_Request(ids, limit, fut, order))
        self._changed.set()
        return await fut

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self._changed.clear()
            await self._changed.wait()

    async def run(self) -> None:
        while True:
            await self._until(lambda: bool(self.pending))
            if self.lockstep:
                # An episode between requests (running its tools) either asks again or ends; both
                # wake this wait, so it ends once the wave is whole.
                await self._until(lambda: self.started >= self.expected and len(self.pending) >= self.live)
                wave, self.pending = sorted(self.pending, key=lambda r: r.order), []
                for i in range(0, len(wave), self.max_batch):
                    await self._issue(wave[i : i + self.max_batch])
                continue
            deadline = time.monotonic() + self.wait_s
            while len(self.pending) < min(self.live, self.max_batch):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch :]
            await self._issue(batch)

    async def _issue(self, batch: list[_Request]) -> None:
        params = self.params
        if params.seed is not None:  # reproducible given the same schedule; distinct per call
            params = params.model_copy(update={"seed": params.seed + self._calls})
        self._calls += 1
        self.batch_sizes.append(len(batch))
        prompts = [r.ids for r in batch]
        try:
            results = await self.backend.generate(prompts, params, max_new_tokens=[r.limit for r in batch])
        except Exception as e:
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(e)
            return
        for r, res in zip(batch, results, strict=True):
            if not r.future.done():
                r.future.set_result(res)


class _FirstTurnGate:
    """Holds each episode's first request until every episode has one ready (or has ended).

    The episodes of a rollout start together, but each spends a few milliseconds rendering its
    prompt first; without the gate the first would start decoding alone and the rest would trickle
    in. Released together, the first turns are prefilled as one batch -- and the G identical
    prompts of a group once. Arrivals are tracked per asyncio task (one per episode).
    """

    def __init__(self, episodes: int) -> None:
        self.left = episodes
        self.arrived: set[int] = set()
        self.open = asyncio.Event()
        if episodes <= 0:
            self.open.set()

    def _count(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.open.set()

    async def arrive(self) -> None:
        self.arrived.add(id(asyncio.current_task()))
        self._count()
        await self.open.wait()

    def leave(self) -> None:
        """An episode ended; it no longer holds the gate if it never reached it."""
        if id(asyncio.current_task()) not in self.arrived:
            self._count()


def _jsonable(x: Any) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False


Actor = Callable[[list[int], int, list[Message]], Awaitable[GenerationResult]]
"""``(context_ids, max_new_tokens, conversation) -> GenerationResult``: one policy action."""


@runtime_checkable
class EpisodeAgent(Protocol):
    """An episode loop other than the plain tool agent's (e.g. :class:`flowgrpo.rollout.agentflow.FlowAgent`):
    it fills ``traj`` (turns, termination, metadata) for ``task`` in ``env``, sampling the policy's
    actions through ``act`` (so they join the engine's batching); an exception it raises ends the
    episode with ``Termination.error``."""

    async def run_episode(
        self, env: Environment, task: Task, act: Actor, traj: Trajectory, rollout: RolloutConfig
    ) -> None: ...


class RolloutEngine:
    """Runs groups of episodes against a backend.

    Args:
        backend: a :class:`~flowgrpo.rollout.backends.base.RolloutBackend` (None only for text policies).
        tokenizer: the policy's tokenizer (its chat template renders the conversation).
        config: limits and sampling.
        agent: runs each episode instead of the plain tool loop (None: the tool agent).
    """

    def __init__(
        self,
        backend: RolloutBackend | None,
        tokenizer: Any,
        config: RolloutConfig | None = None,
        *,
        agent: EpisodeAgent | None = None,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config or RolloutConfig()
        self.agent = agent
        self.last_batch_sizes: list[int] = []

    # ------------------------------------------------------------------ public API
    async def rollout_groups(
        self,
        env_factory: Callable[[], Environment],
        tasks: Sequence[Task],
        group_size: int,
        *,
        policy_version: int = 0,
        on_episode: Callable[[Trajectory], None] | None = None,
        first_episode: int = 0,
    ) -> list[TrajectoryGroup]:
        """``group_size`` episodes per task, all run concurrently; one group per task, in order.
        ``on_episode`` is called with each trajectory as its episode ends (e.g. a progress bar).
        ``first_episode`` numbers the episodes for their sampling seeds (continuous scheduling): a
        data-parallel rank rolling out tasks ``i..j`` of a call passes ``i * group_size``, so its
        episodes draw the seeds they would in one call over all tasks."""
        if self.backend is None:
            raise ValueError("this RolloutEngine has no backend; use rollout_text_policy for text policies")
        cfg = self.config
        backend = self.backend
        params = cfg.sampling.model_copy(update={"max_new_tokens": cfg.max_new_tokens})
        max_batch = cfg.max_batch_size or backend.max_batch_size
        batcher = _Batcher(
            backend,
            params,
            max_batch,
            cfg.batch_wait_ms / 1000,
            lockstep=cfg.scheduling == "lockstep",
            expected=len(tasks) * group_size,
        )
        continuous = cfg.scheduling == "continuous" and backend.continuous_batching
        in_flight = asyncio.Semaphore(max_batch)
        episodes = first_episode
        if continuous:
            batcher.gate = _FirstTurnGate(len(tasks) * group_size)

        def model_actor(chat: ChatFormat) -> Actor:
            nonlocal episodes
            if not params.stop_token_ids and not batcher.params.stop_token_ids:
                batcher.params = params.model_copy(update={"stop_token_ids": list(chat.end_of_turn_ids)})
            # Episodes are numbered in the order they start (the order of the tasks and samples).
            episode, turns = episodes, 0
            episodes += 1
            if not continuous:

                async def act(ids: list[int], limit: int, conv: list[Message]) -> GenerationResult:
                    nonlocal turns
                    turns += 1
                    return await batcher.submit(ids, limit, (episode, turns))

                return act

            # continuous: this episode's turns go straight to the backend's running batch, each with
            # its own seed (episode, turn), so its samples do not depend on when it arrives

            async def act_now(ids: list[int], limit: int, conv: list[Message]) -> GenerationResult:
                nonlocal turns
                p = batcher.params
                if p.seed is not None:
                    p = p.model_copy(update={"seed": p.seed * 1_000_003 + episode * 1009 + turns})
                if turns == 0 and batcher.gate is not None:
                    await batcher.gate.arrive()
                turns += 1
                async with in_flight:
                    return (await backend.generate([ids], p, max_new_tokens=[limit]))[0]

            return act_now

        runner = None if continuous else asyncio.create_task(batcher.run())
        try:
            groups = await self._run_groups(
                env_factory, tasks, group_size, policy_version, model_actor, batcher, on_episode
            )
        finally:
            if runner is not None:
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            backend.clear_prefix_cache()  # the episodes are over: their cached turns are dead weight
        self.last_batch_sizes = batcher.batch_sizes
        return groups

    def run_groups(
        self,
        env_factory: Callable[[], Environment],
        tasks: Sequence[Task],
        group_size: int,
        *,
        policy_version: int = 0,
        on_episode: Callable[[Trajectory], None] | None = None,
        first_episode: int = 0,
    ) -> list[TrajectoryGroup]:
        """Blocking wrapper of :meth:`rollout_groups` (must not be called inside a running loop)."""
        return asyncio.run(
            self.rollout_groups(
                env_factory,
                tasks,
                group_size,
                policy_version=policy_version,
                on_episode=on_episode,
                first_episode=first_episode,
            )
        )

    # ------------------------------------------------------------------ internals
    async def _run_groups(
        self, env_factory, tasks, group_size, policy_version, make_actor, batcher, on_episode=None
    ):
        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        groups = [TrajectoryGroup(task=t) for t in tasks]

        async def reported(job: Awaitable[Trajectory]) -> Trajectory:
            traj = await job
            if on_episode is not None:
                on_episode(traj)
            return traj

        jobs = []
        for g in groups:
            for _ in range(group_size):
                jobs.append(
                    reported(
                        self._episode(env_factory, g.task, g.group_id, policy_version, make_actor, batcher)
                    )
                )
        trajs = await asyncio.gather(*jobs)
        for i, g in enumerate(groups):
            g.trajectories = list(trajs[i * group_size : (i + 1) * group_size])
        return groups

    async def _episode(
        self,
        env_factory: Callable[[], Environment],
        task: Task,
        group_id: str,
        policy_version: int,
        make_actor: Callable[[ChatFormat], Actor],
        batcher: _Batcher | None,
    ) -> Trajectory:
        cfg = self.config
        traj = Trajectory(group_id=group_id, task_id=task.id, policy_version=policy_version)
        if batcher is not None:
            batcher.episode_started()
        t0 = time.monotonic()
        try:
            env = env_factory()
            traj.env = env.name
            env.tool_timeout_s = cfg.tool_timeout_s
            chat = ChatFormat(self.tokenizer, tools=list(env.tools), parser=env.parser)
            act = _recording_version(make_actor(chat), traj)
            if self.agent is not None:
                await self.agent.run_episode(env, task, act, traj, cfg)
                traj.metadata["wall_s"] = round(time.monotonic() - t0, 4)
                return traj
            opening = await env.reset(task)
            messages = chat.prompt_messages(opening, env.system_prompt)
            history: list[Message] = list(messages)  # as rendered (observations converted)
            conv: list[Message] = list(messages)  # as the env produced them (for text policies)
            prompt = chat.initial_ids(messages)
            context: list[int] = list(prompt)
            step_timeout = cfg.step_timeout_s or 3 * cfg.tool_timeout_s + 5
            traj.termination = Termination.max_turns
            if len(context) + 1 > cfg.max_context_tokens:
                traj.termination = Termination.context_overflow
                traj.metadata["prompt_tokens"] = len(context)
                return traj
            for _ in range(cfg.max_turns):
                room = cfg.max_context_tokens - len(context)
                limit = min(cfg.max_new_tokens, room)
                res = await act(list(context), limit, list(conv))
                action_ids = list(res.token_ids)
                body = (
                    action_ids[:-1] if action_ids and action_ids[-1] in chat.end_of_turn_ids else action_ids
                )
                text = self.tokenizer.decode(body, skip_special_tokens=False)
                parsed = self._parse(env, text)
                turn = Turn(
                    prompt_ids=prompt,
                    action_ids=action_ids,
                    action_logprobs=list(res.logprobs),
                    action=parsed.message,
                    finish_reason=res.finish_reason,
                )
                traj.turns.append(turn)
                context += action_ids
                if res.finish_reason == "length":
                    traj.termination = (
                        Termination.max_tokens
                        if limit >= cfg.max_new_tokens
                        else Termination.context_overflow
                    )
                    break
                try:
                    step = await asyncio.wait_for(env.step(parsed), step_timeout)
                except asyncio.TimeoutError as e:
                    raise RuntimeError(f"env.step took longer than {step_timeout} s") from e
                turn.observations = list(step.observations)
                turn.reward = float(step.reward)
                if step.info and _jsonable(step.info):
                    turn.metadata["info"] = step.info
                if step.terminated:
                    traj.termination = Termination.finished
                    break
                if step.truncated:
                    traj.termination = Termination.max_turns
                    traj.metadata["truncated_by_env"] = True
                    break
                delta = chat.observation_delta(history, action_ids, step.observations)
                assistant = Message(role="assistant", content=text)
                history += [assistant, *chat.observation_messages(step.observations)]
                conv += [assistant, *step.observations]
                if len(context) + len(delta) + 1 > cfg.max_context_tokens:
                    traj.termination = Termination.context_overflow
                    break
                prompt = delta
                context += delta
            else:
                traj.termination = Termination.max_turns
        except Exception as e:
            traj.termination = Termination.error
            traj.metadata["error"] = f"{type(e).__name__}: {e}"
            traj.metadata["traceback"] = traceback.format_exc(limit=6)
            if not isinstance(e, interrupt.Interrupted):  # a stop: the trainer says it once
                log.warning("episode of task %s ended with an error: %s", task.id, traj.metadata["error"])
        finally:
            if batcher is not None:
                batcher.episode_ended()
        traj.metadata["wall_s"] = round(time.monotonic() - t0, 4)
        return traj

    @staticmethod
    def _parse(env: Environment, text: str) -> ParsedAction:
        try:
            return env.parser.parse(text)
        except ParseError as e:
            return ParsedAction(message=Message(role="assistant", content=text), errors=[str(e)])


# ---------------------------------------------------------------------- text policies
def _recording_version(act: Actor, traj: Trajectory) -> Actor:
    """``act`` that sets ``traj.policy_version`` to the oldest version a backend reports for the
    episode's actions (a served policy may load new weights between turns); a backend that reports
    none leaves the engine's version."""
    reported = False

    async def recorded(ids: list[int], limit: int, conv: list[Message]) -> GenerationResult:
        nonlocal reported
        res = await act(ids, limit, conv)
        if res.policy_version is not None:
            v = res.policy_version
            traj.policy_version = v if not reported else min(traj.policy_version, v)
            reported = True
        return res

    return recorded


def text_actor(policy: TextPolicy) -> Callable[[ChatFormat], Actor]:
    """An :data:`Actor` factory for a text policy: its text is tokenized as ``encode(text) +
    [end-of-turn]`` (cut at the limit), with logprobs 0.0."""

    def make(chat: ChatFormat) -> Actor:
        eot = chat.end_of_turn_ids[0] if chat.end_of_turn_ids else None

        async def act(ids: list[int], limit: int, conv: list[Message]) -> GenerationResult:
            text = await policy.act(conv)
            out = chat.encode(text) + ([eot] if eot is not None else [])
            reason = "stop"
            if len(out) > limit:
                out, reason = out[:limit], "length"
            return GenerationResult(token_ids=out, logprobs=[0.0] * len(out), finish_reason=reason)

        return act

    return make


async def rollout_text_policy(
    env_factory: Callable[[], Environment],
    tasks: Sequence[Task],
    policy: TextPolicy | Callable[[Environment], TextPolicy] | None,
    tokenizer: Any,
    config: RolloutConfig | None = None,
    group_size: int = 1,
    *,
    policy_version: int = 0,
    agent: EpisodeAgent | None = None,
) -> list[TrajectoryGroup]:
    """Run a text policy through the rollout loop: trajectories with exact token ids, logprobs 0.0.

    ``policy`` is an object with ``async act(messages) -> str``, a callable ``env -> policy`` (a
    fresh policy per episode, e.g. ``lambda env: env.oracle()``), or None for each environment's
    own ``env.oracle()``. Actions are tokenized as ``encode(text) + [end-of-turn]``: exactly what the
    model would have to sample to produce that text and stop. ``agent`` runs each episode instead
    of the tool loop (e.g. :class:`flowgrpo.rollout.agentflow.oracle.FlowOracleAgent`).
    """
    engine = RolloutEngine(None, tokenizer, config, agent=agent)

    async def run_one(task: Task, group_id: str) -> Trajectory:
        holder: dict[str, Environment] = {}

        def f() -> Environment:
            env = env_factory()
            holder["env"] = env
            return env

        def make_actor(chat: ChatFormat) -> Actor:
            env = holder["env"]
            p: TextPolicy | None
            if policy is None:
                p = env.oracle()
                if p is None:
                    raise TypeError(
                        f"environment {env.name!r} has no oracle (env.oracle() is None); pass a policy"
                    )
            elif isinstance(policy, TextPolicy):
                p = policy
            elif callable(policy):
                p = policy(env)
            else:
                raise TypeError("policy must have `async act(messages)` or be a callable env -> policy")
            return text_actor(p)(chat)

        return await engine._episode(f, task, group_id, policy_version, make_actor, None)

    groups = [TrajectoryGroup(task=t) for t in tasks]
    trajs = await asyncio.gather(*(run_one(g.task, g.group_id) for g in groups for _ in range(group_size)))
    for i, g in enumerate(groups):
        g.trajectories = list(trajs[i * group_size : (i + 1) * group_size])
    return groups


def run_text_policy(*args: Any, **kwargs: Any) -> list[TrajectoryGroup]:
    """Blocking wrapper of :func:`rollout_text_policy` (same arguments)."""
    return asyncio.run(rollout_text_policy(*args, **kwargs))


__all__ = [
    "Actor",
    "EpisodeAgent",
    "RolloutConfig",
    "RolloutEngine",
    "TextPolicy",
    "rollout_text_policy",
    "run_text_policy",
    "text_actor",
]
