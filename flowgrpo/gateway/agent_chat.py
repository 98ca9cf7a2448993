"""Chat for agent programs, through the chat layer: ``tools`` rendered as an environment's are,
``tool`` messages as observations, the model's output parsed by the environments' parser into
``tool_calls``. A request that belongs to an episode (its id in the path, a header or the body) is
recorded token-exactly by the server's :class:`~flowgrpo.gateway.recorder.EpisodeRecorder`."""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from flowgrpo.chat.format import ChatFormat
from flowgrpo.chat.openai_messages import (
    SchemaTool,
    as_rendered,
    assistant_message,
    messages_from_openai,
    tools_from_openai,
)
from flowgrpo.chat.parsing import HermesParser
from flowgrpo.gateway.errors import BadRequest
from flowgrpo.gateway.recorder import RecordingError, check_id
from flowgrpo.gateway.sampling import accepted_stops, chat_logprobs_k, sampling_params, stopped, usage
from flowgrpo.rollout.backends.base import GenerationResult
from flowgrpo.types import Message, ParsedAction, Termination

if TYPE_CHECKING:
    from flowgrpo.gateway.app import PolicyServer


def _rendered(messages: list[Message], chat: ChatFormat, parser: HermesParser) -> list[Message]:
    return as_rendered(messages, parser, native_tool_calls=chat.native_tools)


class AgentChat:
    """The agent-chat path of a :class:`~flowgrpo.gateway.app.PolicyServer`: its chat formats
    (one per set of tools) and the requests that go through them."""

    def __init__(self, server: PolicyServer) -> None:
        self.server = server
        self._formats: OrderedDict[str, ChatFormat] = OrderedDict()

    def episode_of(self, body: dict[str, Any], request: Request | None) -> tuple[str, str, str] | None:
        """``(episode id, task id, group id)`` of a request to record (the path's
        ``/episodes/ID/v1``, the ``X-Episode-Id`` header or the ``user`` field; the task from
        ``X-Task-Id`` or ``metadata.task_id``); None when not recording or no id was sent."""
        if self.server.recorder is None:
            return None
        headers = request.headers if request is not None else {}
        params = request.path_params if request is not None else {}
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        episode = params.get("episode_id") or headers.get("x-episode-id") or meta.get("episode_id")
        if episode is None and isinstance(body.get("user"), str) and body["user"]:
            episode = body["user"]
        if episode is None:
            return None
        task = headers.get("x-task-id") or meta.get("task_id") or ""
        group = headers.get("x-group-id") or meta.get("group_id") or ""
        return check_id(episode, "the episode id"), task, group

    def chat_format(self, tools: list[SchemaTool]) -> tuple[ChatFormat, str]:
        """The chat layer for these tools (cached by their schemas) and its key."""
        key = json.dumps([[t.name, t.description, t.parameters] for t in tools], sort_keys=True)
        chat = self._formats.get(key)
        if chat is None:
            chat = ChatFormat(self.server.tokenizer, tools=tools, parser=self.server.parser)
            self._formats[key] = chat
            if len(self._formats) > 64:
                self._formats.popitem(last=False)
        else:
            self._formats.move_to_end(key)
        return chat, key

    async def chat(self, body: dict[str, Any], episode: tuple[str, str, str] | None) -> dict[str, Any]:
        """Chat through the chat layer: ``tools`` rendered as an environment's are, ``tool``
        messages as observations, the model's output parsed by the environments' parser into
        ``tool_calls``; with an episode id the turn is recorded token-exactly."""
        stops = accepted_stops(body, "chat")
        k = chat_logprobs_k(body)
        choice = body.get("tool_choice")
        if choice not in (None, "auto", "none"):
            raise BadRequest(
                "'tool_choice' may be 'auto' or 'none': the model decides which tool to call "
                "(a forced tool call would not be what the policy sampled)",
                param="tool_choice",
            )
        tools = tools_from_openai(body.get("tools"))
        messages = messages_from_openai(body.get("messages"))
        chat, key = self.chat_format(tools)
        with_tools = bool(tools) and choice != "none"
        limits = self.server.recorder.limits if self.server.recorder is not None else None
        cap = limits.max_new_tokens if limits is not None else 512
        asked = body.get("max_tokens") or body.get("max_completion_tokens") or cap
        params = sampling_params({**body, "max_tokens": asked}, list(chat.end_of_turn_ids))
        if episode is None:
            rendered = chat.prompt_messages(_rendered(messages, chat, self.server.parser))
            ids = chat.initial_ids(rendered)
            n = int(body.get("n", 1))
            results, version = await self.server.generate([ids] * n, params)
            out = self._response(body, chat, ids, results, version, stops, with_tools, k, None)
            await self._finish_logprobs(out, ids, k)
            return out
        if int(body.get("n", 1)) != 1:
            raise BadRequest("a recorded episode samples one answer per request: 'n' must be 1", param="n")
        assert self.server.recorder is not None and limits is not None
        episode_id, task_id, group_id = episode
        ep = self.server.recorder.open(episode_id, task_id=task_id, group_id=group_id)
        async with ep.lock:
            if ep.closed:
                raise RecordingError(f"episode {episode_id!r} has ended", status=409, code="episode_closed")
            if len(ep.traj.turns) >= limits.max_turns:
                ep.traj.termination = Termination.max_turns
                raise RecordingError(
                    f"episode {episode_id!r} reached max_turns={limits.max_turns} model calls; post its "
                    "reward (the server's recorder limits)",
                    code="episode_too_long",
                )
            ids, resets = ep.prepare(chat, key, messages)
            full = ep.full_prompt(ids, resets)
            room = limits.max_context_tokens - len(full)
            if room < 1:
                ep.traj.termination = Termination.context_overflow
                raise RecordingError(
                    f"episode {episode_id!r} would exceed max_context_tokens={limits.max_context_tokens}; "
                    "post its reward",
                    code="context_length_exceeded",
                )
            update: dict[str, Any] = {
                "max_new_tokens": min(params.max_new_tokens, limits.max_new_tokens, room)
            }
            if self.server.sampling is not None:
                update.update(
                    temperature=self.server.sampling.temperature,
                    top_p=self.server.sampling.top_p,
                    top_k=self.server.sampling.top_k,
                )
            params = params.model_copy(update=update)
            results, version = await self.server.generate([full], params)
            out = self._response(body, chat, full, results, version, stops, with_tools, k, episode_id)
            r, parsed = out.pop("_recorded")
            reply = out["choices"][0]["message"]
            ep.record(
                chat=chat,
                chat_key=key,
                messages=messages,
                prompt_ids=ids,
                resets=resets,
                result=r,
                parsed=parsed,
                reply=messages_from_openai([reply])[0],
                version=version,
            )
            if r.finish_reason == "length" and params.max_new_tokens == room:
                ep.traj.termination = Termination.context_overflow
        await self._finish_logprobs(out, full, k)
        return out

    def _response(
        self,
        body: dict[str, Any],
        chat: ChatFormat,
        ids: list[int],
        results: list[GenerationResult],
        version: int,
        stops: list[str],
        with_tools: bool,
        k: int | None,
        episode_id: str | None,
    ) -> dict[str, Any]:
        decode = chat.decode
        choices: list[dict[str, Any]] = []
        recorded: tuple[GenerationResult, ParsedAction] | None = None
        for i, raw in enumerate(results):
            r, _ = stopped(raw, decode, stops)
            eot = bool(r.token_ids) and r.token_ids[-1] in chat.end_of_turn_ids
            text = decode(r.token_ids[:-1] if eot else r.token_ids)
            parsed = self.server.parser.parse(text)
            message = assistant_message(parsed, self.server.parser, with_tools=with_tools)
            finish = "tool_calls" if message.get("tool_calls") else r.finish_reason
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "finish_reason": finish,
                    "token_ids": r.token_ids,
                    "policy_version": version,
                }
            )
            recorded = recorded or (r, parsed)
        out: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.server.model_name,
            "policy_version": version,
            "choices": choices,
            "usage": usage(len(ids) * len(results), sum(len(c["token_ids"]) for c in choices)),
        }
        if episode_id is not None:
            out["episode_id"] = episode_id
            out["_recorded"] = recorded
        return out

    async def _finish_logprobs(self, out: dict[str, Any], ids: list[int], k: int | None) -> None:
        if k is None:
            return
        for choice in out["choices"]:
            choice["logprobs"] = {"content": await self.server.top_logprobs(ids, choice["token_ids"], k)}


__all__ = ["AgentChat"]
