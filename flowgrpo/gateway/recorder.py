"""Recording agent episodes at the gateway as ordinary, token-exact :class:`~flowgrpo.types.Trajectory` s.

An agent program (LangChain, a loop over the ``openai`` client) sends its whole conversation with
every request. The recorder keeps, per episode, the token context the policy has seen so far and
builds each turn's prompt the way the rollout engine does for a :class:`~flowgrpo.env.ToolEnv`:

- the first request renders ``system + user`` (the tools in the system prompt) once;
- a later request whose messages are the previous request's messages, then our reply (recognised by
  its content or its tool-call ids), then new messages (tool results, a user message), feeds only
  ``ChatFormat.observation_delta``: the template's tail after the sampled ids, the new messages,
  the next generation prompt. The sampled ids are never re-rendered, so ``Trajectory.context_ids``
  is exactly what the policy saw;
- any other request (the client rewrote or dropped earlier messages, changed its tools, retried a
  turn) starts a new segment: its prompt is rendered whole and the turn ``resets_context``. Such
  turns are counted (``Trajectory.metadata["context_resets"]``): a trainer still trains on them
  correctly, they only cost prefill.

An episode ends with its reward (``POST /v1/episodes/{id}/reward`` or :meth:`EpisodeRecorder.close`)
or is ended by its owner (:meth:`EpisodeRecorder.end`: a crashed agent program); it is then written
to ``RUN_DIR/trajectories/step_NNNNNN.jsonl`` (``NNNNNN``: the oldest policy version that sampled
it), where replay, report and the trainer read trajectories.

Ids come from clients, so they are checked against :data:`ID_PATTERN` before use; they are never
part of a path (file names are made of the policy version only), so no request can make the
recorder read or write outside ``RUN_DIR``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flowgrpo.chat.format import ChatFormat
from flowgrpo.chat.openai_messages import as_rendered, same_message
from flowgrpo.rollout.backends.base import GenerationResult
from flowgrpo.types import Message, ParsedAction, Termination, Trajectory, Turn

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
"""Episode, task and group ids: 1-128 characters, letters, digits and ``_ . : @ -``, not starting
with a dot (no path separator, no ``..``)."""


class RecordingError(ValueError):
    """A request the recorder refuses; ``status`` is the HTTP status, ``code`` OpenAI's error code."""

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_episode") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def check_id(value: Any, what: str) -> str:
    """``value`` if it is a valid id (see :data:`ID_PATTERN`), else a :class:`RecordingError`."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise RecordingError(
            f"{what} must be 1-128 characters of letters, digits and _ . : @ - (not starting with a dot), "
            f"got {value!r}"
        )
    return value


class RecorderLimits(BaseModel):
    """What one recorded episode may use; a request beyond a limit is refused with a 400 and the
    episode's termination says which limit ended it."""

    model_config = ConfigDict(extra="forbid")
    max_turns: int = Field(64, ge=1, description="model calls per episode")
    max_context_tokens: int = Field(
        8192, ge=16, description="tokens of an episode's context (prompt + sampled) in one segment"
    )
    max_new_tokens: int = Field(512, ge=1, description="default and largest max_tokens of a recorded request")
    max_open_episodes: int = Field(4096, ge=1, description="episodes recorded at once (memory bound)")


@dataclass
class Episode:
    """One episode being recorded: its trajectory so far and the state that extends its context."""

    id: str
    traj: Trajectory
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    chat_key: str | None = None
    sent: list[Message] = field(default_factory=list)  # the messages of the last request
    reply: Message | None = None  # our answer to it, as the client will send it back
    history: list[Message] = field(default_factory=list)  # as rendered, for observation deltas
    context: list[int] = field(default_factory=list)  # every token of the current segment
    last_action: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    closed: bool = False

    def prepare(self, chat: ChatFormat, chat_key: str, messages: Sequence[Message]) -> tuple[list[int], bool]:
        """The prompt ids of the next turn and whether it starts a new segment (``resets_context``)."""
        n = len(self.sent)
        extends = (
            self.reply is not None
            and chat_key == self.chat_key
            and len(messages) > n + 1
            and list(messages[:n]) == self.sent
            and same_message(messages[n], self.reply)
        )
        if extends:
            observations = list(messages[n + 1 :])
            self.traj.turns[-1].observations = observations
            delta = chat.observation_delta(self.history, self.last_action, observations)
            assistant = Message(role="assistant", content=self.traj.turns[-1].action.content)
            self.pending_history = [*self.history, assistant, *chat.observation_messages(observations)]
            return delta, False
        rendered = chat.prompt_messages(
            as_rendered(messages, chat.parser, native_tool_calls=chat.native_tools)  # type: ignore[arg-type]
        )
        self.pending_history = rendered
        return chat.initial_ids(rendered), bool(self.traj.turns)

    pending_history: list[Message] = field(default_factory=list)

    def record(
        self,
        *,
        chat: ChatFormat,
        chat_key: str,
        messages: Sequence[Message],
        prompt_ids: list[int],
        resets: bool,
        result: GenerationResult,
        parsed: ParsedAction,
        reply: Message,
        version: int,
    ) -> Turn:
        """Append the sampled turn and remember what the next request must repeat to extend it."""
        turn = Turn(
            prompt_ids=prompt_ids,
            action_ids=list(result.token_ids),
            action_logprobs=list(result.logprobs),
            action=parsed.message,
            resets_context=resets,
            finish_reason=result.finish_reason,
            metadata={"policy_version": version},
        )
        self.traj.turns.append(turn)
        if resets:
            self.traj.metadata["context_resets"] = self.traj.metadata.get("context_resets", 0) + 1
            self.context = []
        self.context += prompt_ids + list(result.token_ids)
        self.history = self.pending_history
        self.last_action = list(result.token_ids)
        self.chat_key = chat_key
        self.sent = list(messages)
        self.reply = reply
        self.versions.append(version)
        self.traj.policy_version = min(self.versions)
        return turn

    def full_prompt(self, prompt_ids: list[int], resets: bool) -> list[int]:
        """What the policy sees for the next turn: the segment so far, then ``prompt_ids``."""
        return list(prompt_ids) if resets or not self.traj.turns else [*self.context, *prompt_ids]


class EpisodeRecorder:
    """The episodes being recorded and those ended, written to ``run_dir`` when one is given.

    ``open`` registers an episode (the trainer does so before it starts the agent program; a
    ``flowgrpo serve --record`` client's first request does); ``close`` ends it with its reward;
    ``end`` ends it without one (its agent crashed or timed out); :meth:`wait` gives a future that
    resolves to the finished trajectory. Thread-safe where it matters: futures and the file.
    """

    def __init__(self, run_dir: str | Path | None = None, limits: RecorderLimits | None = None) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.limits = limits or RecorderLimits()
        self.episodes: dict[str, Episode] = {}
        self.finished: dict[str, Trajectory] = {}
        self._futures: dict[str, concurrent.futures.Future[Trajectory]] = {}
        self._lock = threading.Lock()
        self.written = 0

    # ----------------------------------------------------------------- lifecycle
    def open(
        self,
        episode_id: str,
        *,
        task_id: str = "",
        group_id: str = "",
        env: str = "gateway",
        metadata: dict[str, Any] | None = None,
    ) -> Episode:
        """Start recording ``episode_id`` (its first request does this when nobody registered it)."""
        check_id(episode_id, "the episode id")
        if task_id:
            check_id(task_id, "the task id")
        if group_id:
            check_id(group_id, "the group id")
        with self._lock:
            if episode_id in self.episodes:
                return self.episodes[episode_id]
            if episode_id in self.finished:
                raise RecordingError(
                    f"episode {episode_id!r} has ended (its reward was posted); use a new id for a new episode",
                    status=409,
                    code="episode_closed",
                )
            if len(self.episodes) >= self.limits.max_open_episodes:
                raise RecordingError(
                    f"{len(self.episodes)} episodes are open (max_open_episodes): post their rewards first",
                    status=429,
                    code="too_many_episodes",
                )
            traj = Trajectory(
                id=episode_id,
                task_id=task_id,
                group_id=group_id or (f"task:{task_id}" if task_id else episode_id),
                env=env,
                termination=Termination.finished,
                metadata={"source": "gateway", **(metadata or {})},
            )
            ep = Episode(id=episode_id, traj=traj)
            self.episodes[episode_id] = ep
            self._futures.setdefault(episode_id, concurrent.futures.Future())
            return ep

    def get(self, episode_id: str) -> Episode:
        check_id(episode_id, "the episode id")
        ep = self.episodes.get(episode_id)
        if ep is None:
            status, what = (
                (409, "has ended") if episode_id in self.finished else (404, "is not being recorded")
            )
            raise RecordingError(f"episode {episode_id!r} {what}", status=status, code="episode_not_open")
        return ep

    def wait(self, episode_id: str) -> concurrent.futures.Future[Trajectory]:
        """A future of the episode's trajectory, resolved when it is closed or ended."""
        with self._lock:
            fut = self._futures.setdefault(episode_id, concurrent.futures.Future())
            if episode_id in self.finished and not fut.done():
                fut.set_result(self.finished[episode_id])
            return fut

    def close(
        self,
        episode_id: str,
        reward: float,
        breakdown: dict[str, float] | None = None,
        *,
        task_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Trajectory:
        """End the episode with its reward (and its parts); a limit that ended it earlier keeps its
        termination."""
        ep = self.get(episode_id)
        if not ep.traj.turns:
            raise RecordingError(
                f"episode {episode_id!r} has no recorded model call: send its chat requests with the "
                "episode id (X-Episode-Id header, 'user' field or /episodes/ID/v1) first",
                status=409,
                code="episode_empty",
            )
        if task_id:
            ep.traj.task_id = check_id(task_id, "the task id")
            if ep.traj.group_id == episode_id:
                ep.traj.group_id = f"task:{task_id}"
        if ep.traj.termination == Termination.finished and ep.traj.turns[-1].finish_reason == "length":
            ep.traj.termination = Termination.max_tokens  # as the engine says of a cut last action
        ep.traj.reward = float(reward)
        ep.traj.reward_breakdown = {k: float(v) for k, v in (breakdown or {}).items()}
        if metadata:
            ep.traj.metadata["client"] = metadata
        return self._finish(ep)

    def end(
        self,
        episode_id: str,
        termination: Termination,
        *,
        error: str | None = None,
        excluded: str | None = None,
    ) -> Trajectory:
        """End an episode without a reward (reward 0): its agent crashed, timed out, or never called.
        ``excluded`` takes it out of the update and its group's baseline."""
        with self._lock:
            ep = self.episodes.get(episode_id)
        if ep is None:  # never opened (the agent died before its first call) or already ended
            if episode_id in self.finished:
                return self.finished[episode_id]
            ep = self.open(episode_id)
        ep.traj.termination = termination
        if error:
            ep.traj.metadata["error"] = error
        ep.traj.excluded = excluded
        return self._finish(ep)

    def end_open(self, reason: str) -> list[Trajectory]:
        """End every open episode (the server is stopping): written, excluded, so nothing is lost."""
        return [
            self.end(eid, Termination.error, error=reason, excluded=f"gateway:{reason}")
            for eid in list(self.episodes)
        ]

    def _finish(self, ep: Episode) -> Trajectory:
        with self._lock:
            if ep.closed:
                return ep.traj
            ep.closed = True
            self.episodes.pop(ep.id, None)
            self.finished[ep.id] = ep.traj
            if self.run_dir is not None:
                from flowgrpo.runs.store import append_line, encode_record

                folder = self.run_dir / "trajectories"
                folder.mkdir(parents=True, exist_ok=True)
                append_line(folder / f"step_{ep.traj.policy_version:06d}.jsonl", encode_record(ep.traj))
                self.written += 1
            fut = self._futures.setdefault(ep.id, concurrent.futures.Future())
            if not fut.done():
                fut.set_result(ep.traj)
        return ep.traj

    def forget(self, episode_ids: Sequence[str]) -> None:
        """Drop ended episodes from memory (the trainer has taken them)."""
        with self._lock:
            for eid in episode_ids:
                self.finished.pop(eid, None)
                self._futures.pop(eid, None)


__all__ = ["ID_PATTERN", "Episode", "EpisodeRecorder", "RecorderLimits", "RecordingError", "check_id"]
