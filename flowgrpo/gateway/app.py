"""The OpenAI-compatible HTTP app over a rollout backend, on Starlette under uvicorn.

Why: evaluation, LLM judges and remote rollouts talk to models through the OpenAI API; this lets
any local model (the embedded SmolLM2, a checkpoint) answer such clients, and it is the real
server the ``openai`` backend is tested against. It speaks the vLLM dialect for training use:

- ``GET /v1/models``, ``GET /health``
- ``POST /v1/completions``: ``prompt`` as text, a list of token ids, or a list of either;
  ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop`` (strings),
  ``stop_token_ids``;
  with ``logprobs: k`` (0 to 20) the choice carries ``logprobs.token_logprobs`` (under the
  processed distribution, as vLLM's ``logprobs_mode="processed_logprobs"``), for ``k > 0``
  ``logprobs.top_logprobs`` (the model's top ``k`` per position, one ``{token: logprob}`` each) and ``logprobs.tokens``
  (``"token_id:N"`` strings when ``return_tokens_as_token_ids`` is true); every choice also
  carries ``token_ids`` (the sampled ids, stop token included).
- ``POST /v1/chat/completions``: ``messages`` rendered with the model's chat template (text mode,
  for evaluation and judging); with ``logprobs: true`` and ``top_logprobs: k`` each choice carries
  ``logprobs.content`` (every generated token with its top ``k`` alternatives, OpenAI's format, from
  :func:`flowgrpo.gateway.toplogprobs.top_logprobs_content`): the verifier reward reads P(Yes) from it.
- ``POST /v1/load_weights`` ``{"path": FILE, "version": N}``: the trainer's weight sync
  (:mod:`flowgrpo.modeling.weightsync`): the safetensors file's tensors are copied into the served model
  between requests (requests in flight finish on the old weights; new ones wait for the copy).
  Every completion reports the ``policy_version`` that sampled it (0 until the first load), at the
  top level and on each choice.

Why an ASGI stack (Starlette under uvicorn) and not ``http.server``: every request is a coroutine
that awaits the backend's ``generate``, so requests from many clients are in flight at once and the
``hf`` backend's continuous-batching engine decodes them in one running batch; a thread per request
over a blocking call decoded them one call at a time. Starlette gives routing and request handling
that are maintained and tested elsewhere; uvicorn the HTTP/1.1 server.

Safety: the CLI binds loopback by default; ``api_key`` (optional) requires
``Authorization: Bearer <key>`` on every endpoint but ``/health``; a body over ``max_request_bytes``
is refused with a 413 before it is read whole; every error is an OpenAI-style body
``{"error": {"message", "type", "param", "code"}}``. A parameter it does not implement
(``stream: true``, penalties, ``logit_bias``...) is refused with a 400 that names it
(:mod:`flowgrpo.gateway.openai_request`), never silently ignored; ``usage`` has ``total_tokens``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from flowgrpo.chat.openai_messages import OpenAIFormatError
from flowgrpo.chat.parsing import HermesParser
from flowgrpo.gateway.agent_chat import AgentChat
from flowgrpo.gateway.errors import BadRequest, GatewayError, http_error
from flowgrpo.gateway.recorder import EpisodeRecorder, RecordingError, check_id
from flowgrpo.gateway.rwlock import AsyncReadWriteLock
from flowgrpo.gateway.sampling import accepted_stops, chat_logprobs_k, sampling_params, stopped, usage
from flowgrpo.modeling.weightsync import WeightSyncError, load_weights
from flowgrpo.rollout.backends.base import GenerationResult, RolloutBackend, SamplingParams
from flowgrpo.rollout.backends.hf import HFBackend

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 8 * 2**20
"""8 MiB: a long agent conversation with tool schemas is well under it; a runaway client is not."""


class RewardPost(BaseModel):
    """The body of ``POST /v1/episodes/{id}/reward``."""

    model_config = ConfigDict(extra="forbid")
    reward: float = Field(..., allow_inf_nan=False)
    breakdown: dict[str, float] = Field(default_factory=dict)
    task_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


Handler = Callable[[Request], Awaitable[dict[str, Any]]]


class PolicyServer:
    """The HTTP server: a Starlette app over a rollout backend (an
    :class:`~flowgrpo.rollout.backends.hf.HFBackend` serves its ``model`` too),
    run by uvicorn on a socket bound at construction (so ``url`` is known before serving; ``port=0``
    picks a free port).

    Run it with :meth:`serve_forever` (blocking; the CLI) or :func:`serve_in_thread`; stop it with
    :meth:`shutdown` and release the port with :meth:`server_close`.
    """

    def __init__(
        self,
        backend: RolloutBackend,
        tokenizer: Any,
        *,
        model: Any = None,
        model_name: str = "flowgrpo",
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        recorder: EpisodeRecorder | None = None,
        sampling: SamplingParams | None = None,
    ) -> None:
        self.backend = backend
        self.sampling = sampling
        """Imposed on recorded requests (temperature, top-p, top-k) when set: a trainer scores the
        recorded logprobs under its own sampling settings, whatever the agent program asks for."""
        self.model = model if model is not None or not isinstance(backend, HFBackend) else backend.model
        """The served model itself, for what needs more than sampling (top logprobs, weight loads);
        None for a backend that only samples."""
        self.recorder = recorder
        self.parser = HermesParser()
        self._agents = AgentChat(self)
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.api_key = api_key or None
        self.max_request_bytes = int(max_request_bytes)
        eos = tokenizer.eos_token_id
        self.default_stop = [int(eos)] if eos is not None else []
        self.policy_version = 0
        self._lock: AsyncReadWriteLock | None = None  # made on the serving loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._uvicorn: Any = None
        self._stopped = threading.Event()
        self._started = threading.Event()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(512)
        self._sock.setblocking(False)
        self.server_address = self._sock.getsockname()[:2]
        self.app = Starlette(routes=self.routes(), exception_handlers={HTTPException: http_error})
        if host not in ("127.0.0.1", "::1", "localhost") and self.api_key is None:
            log.warning(
                "serving on %s without an api key: anyone who can reach this address can use the "
                "model; pass --api-key (or bind 127.0.0.1)",
                host,
            )

    # ----------------------------------------------------------------- routing
    def routes(self) -> list[Route]:
        """The endpoints; a subclass (the recording gateway) adds its own."""
        return [
            Route("/health", self._endpoint(self._health, auth=False), methods=["GET"]),
            Route("/", self._endpoint(self._health, auth=False), methods=["GET"]),
            Route("/v1/models", self._endpoint(self._models), methods=["GET"]),
            Route("/v1/completions", self._endpoint(self._json(self.completions)), methods=["POST"]),
            Route(
                "/v1/chat/completions",
                self._endpoint(self._json_request(self.chat_completions)),
                methods=["POST"],
            ),
            Route("/v1/load_weights", self._endpoint(self._json(self.load_weights)), methods=["POST"]),
            # An agent that can only be given a base URL records through the path:
            # OPENAI_BASE_URL=http://HOST:PORT/episodes/EPISODE_ID/v1
            Route(
                "/episodes/{episode_id}/v1/chat/completions",
                self._endpoint(self._json_request(self.chat_completions)),
                methods=["POST"],
            ),
            Route("/episodes/{episode_id}/v1/models", self._endpoint(self._models), methods=["GET"]),
            Route("/v1/episodes/{episode_id}/reward", self._endpoint(self._reward), methods=["POST"]),
            Route("/v1/episodes/{episode_id}", self._endpoint(self._episode_info), methods=["GET"]),
        ]

    def _endpoint(self, fn: Handler, *, auth: bool = True) -> Callable[[Request], Awaitable[JSONResponse]]:
        """``fn`` with authentication and every failure turned into an OpenAI-style error body."""

        async def endpoint(request: Request) -> JSONResponse:
            try:
                if auth:
                    self._authenticate(request)
                return JSONResponse(await fn(request))
            except GatewayError as e:
                return JSONResponse(e.body(), status_code=e.status)
            except RecordingError as e:
                err = GatewayError(e.status, str(e), code=e.code)
                return JSONResponse(err.body(), status_code=e.status)
            except OpenAIFormatError as e:
                return JSONResponse(BadRequest(str(e), param=e.param).body(), status_code=400)
            except Exception as e:  # a server bug answers 500 with its name, and is logged
                log.exception("request to %s failed", request.url.path)
                err = GatewayError(500, f"{type(e).__name__}: {e}", type="server_error")
                return JSONResponse(err.body(), status_code=500)

        return endpoint

    def _authenticate(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), self.api_key):
            raise GatewayError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' with the key the server was "
                "started with (openai.OpenAI(api_key=...), ChatOpenAI(api_key=...))",
                type="authentication_error",
                code="invalid_api_key",
            )

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The request's JSON object, read at most ``max_request_bytes`` (413 beyond)."""
        declared = request.headers.get("content-length")
        too_big = GatewayError(
            413,
            f"request body larger than {self.max_request_bytes} bytes (the server's max_request_bytes)",
            code="request_too_large",
        )
        if declared is not None and declared.isdigit() and int(declared) > self.max_request_bytes:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_request_bytes:
                raise too_big
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks) or b"{}")
        except (ValueError, RecursionError) as e:
            raise BadRequest(f"bad JSON body: {e}") from e
        if not isinstance(body, dict):
            raise BadRequest("bad JSON body: the request body must be a JSON object")
        return body

    def _json(self, fn: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> Handler:
        async def handler(request: Request) -> dict[str, Any]:
            return await fn(await self.read_json(request))

        return handler

    def _json_request(self, fn: Callable[[dict[str, Any], Request], Awaitable[dict[str, Any]]]) -> Handler:
        async def handler(request: Request) -> dict[str, Any]:
            return await fn(await self.read_json(request), request)

        return handler

    async def _health(self, request: Request) -> dict[str, Any]:
        return {"status": "ok", "policy_version": self.policy_version}

    async def _models(self, request: Request) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.model_name, "object": "model", "owned_by": "flowgrpo"}],
        }

    # ----------------------------------------------------------------- endpoint logic
    @property
    def weights_lock(self) -> AsyncReadWriteLock:
        if self._lock is None:
            self._lock = AsyncReadWriteLock()
        return self._lock

    def _decoder(self, body: dict[str, Any]) -> Callable[[list[int]], str]:
        skip = bool(body.get("skip_special_tokens", True))
        return lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip)

    async def generate(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[list[GenerationResult], int]:
        """Sample every prompt through the backend's running batch; the results and the policy
        version that sampled them (a weight load waits for these to finish)."""
        async with self.weights_lock.reading():
            version = self.policy_version
            results = await self.backend.generate(prompts, params)
        return results, version

    async def top_logprobs(self, prompt: list[int], token_ids: list[int], k: int) -> list[dict[str, Any]]:
        from flowgrpo.gateway.toplogprobs import top_logprobs_content

        model = self._local_model("top logprobs")
        async with self.weights_lock.reading():
            return await asyncio.to_thread(top_logprobs_content, model, self.tokenizer, prompt, token_ids, k)

    def _local_model(self, what: str) -> Any:
        if self.model is None:
            raise BadRequest(f"{what} need the served model itself; this server's backend only samples")
        return self.model

    async def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        stops = accepted_stops(body, "completions")
        k_top = body.get("logprobs")
        if k_top is not None and (
            not isinstance(k_top, int) or isinstance(k_top, bool) or not 0 <= k_top <= 20
        ):
            raise BadRequest(
                "'logprobs' must be an integer from 0 to 20 (top alternatives per token)", param="logprobs"
            )
        prompt = body.get("prompt")
        if prompt is None:
            raise BadRequest(
                "'prompt' is required (text, a list of token ids, or a list of either)", param="prompt"
            )
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt:
            prompts = prompt
        else:
            raise BadRequest("'prompt' must be a non-empty string or list", param="prompt")
        ids = []
        for p in prompts:
            if isinstance(p, str):
                ids.append(self.tokenizer(p, add_special_tokens=False)["input_ids"])
            elif isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool) for i in p):
                ids.append(p)
            else:
                raise BadRequest(
                    "each prompt must be a string or a non-empty list of token ids", param="prompt"
                )
        params = sampling_params(body, self.default_stop)
        n = int(body.get("n", 1))
        ids = [p for p in ids for _ in range(n)]
        results, version = await self.generate(ids, params)
        cut = [stopped(r, self._decoder(body), stops) for r in results]
        results = [r for r, _ in cut]
        want_lp = body.get("logprobs") is not None
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        choices = []
        for i, (r, text) in enumerate(cut):
            choice: dict[str, Any] = {
                "index": i,
                "text": text,
                "finish_reason": r.finish_reason,
                "token_ids": r.token_ids,
                "logprobs": None,
                "policy_version": version,
            }
            if want_lp:
                tokens = (
                    [f"token_id:{t}" for t in r.token_ids]
                    if as_ids
                    else [self.tokenizer.decode([t]) for t in r.token_ids]
                )
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": r.logprobs}
                if k_top:  # the model's own top-k per position (log-softmax of the logits)
                    content = await self.top_logprobs(ids[i], r.token_ids, k_top)
                    choice["logprobs"]["top_logprobs"] = [
                        {alt["token"]: alt["logprob"] for alt in c["top_logprobs"]} for c in content
                    ]
            choices.append(choice)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "policy_version": version,
            "choices": choices,
            "usage": usage(sum(len(p) for p in ids), sum(len(r.token_ids) for r in results)),
        }

    async def chat_completions(self, body: dict[str, Any], request: Request | None = None) -> dict[str, Any]:
        """Chat. A request with ``tools`` or one that belongs to a recorded episode goes through the
        chat layer (:meth:`AgentChat.chat <flowgrpo.gateway.agent_chat.AgentChat.chat>`); any other
        is text mode, rendered as it is."""
        episode = self._agents.episode_of(body, request)
        if episode is not None or body.get("tools") or body.get("tool_choice") is not None:
            return await self._agents.chat(body, episode)
        return await self.text_chat(body)

    async def text_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Text-mode chat: the messages rendered with the model's chat template as they are (for
        evaluation and judging)."""
        stops = accepted_stops(body, "chat")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list of {role, content}", param="messages")
        k = chat_logprobs_k(body)
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:
            raise BadRequest(f"cannot render messages with the chat template: {e}", param="messages") from e
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        n = int(body.get("n", 1))
        params = sampling_params(body, self.default_stop)
        results, version = await self.generate([ids] * n, params)
        cut = [stopped(r, self._decoder(body), stops) for r in results]
        results = [r for r, _ in cut]
        choices: list[dict[str, Any]] = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "finish_reason": r.finish_reason,
            }
            for i, (r, text) in enumerate(cut)
        ]
        if k is not None:  # each generated token's logprob, with its top k alternatives
            for choice, r in zip(choices, results, strict=True):
                choice["logprobs"] = {"content": await self.top_logprobs(ids, r.token_ids, k)}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "policy_version": version,
            "choices": choices,
            "usage": usage(len(ids) * n, sum(len(r.token_ids) for r in results)),
        }

    async def _reward(self, request: Request) -> dict[str, Any]:
        """``POST /v1/episodes/{id}/reward`` ``{"reward": R, "breakdown": {...}, "task_id": ...}``:
        end the episode with its reward; it is written to the run directory."""
        if self.recorder is None:
            raise GatewayError(
                404, "this server records no episodes: start it with --record RUN_DIR", code="not_recording"
            )
        body = await self.read_json(request)
        try:
            post = RewardPost.model_validate(body)
        except ValidationError as e:
            raise BadRequest(f"bad reward: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from e
        episode_id = check_id(request.path_params["episode_id"], "the episode id")
        ep = self.recorder.get(episode_id)
        async with ep.lock:  # a request of this episode in flight is recorded first
            traj = self.recorder.close(
                episode_id, post.reward, post.breakdown, task_id=post.task_id, metadata=post.metadata
            )
        return {
            "episode_id": episode_id,
            "task_id": traj.task_id,
            "turns": len(traj.turns),
            "reward": traj.reward,
            "termination": traj.termination.value,
            "policy_version": traj.policy_version,
        }

    async def _episode_info(self, request: Request) -> dict[str, Any]:
        if self.recorder is None:
            raise GatewayError(404, "this server records no episodes: start it with --record RUN_DIR")
        ep = self.recorder.get(request.path_params["episode_id"])
        return {
            "episode_id": ep.id,
            "task_id": ep.traj.task_id,
            "turns": len(ep.traj.turns),
            "context_tokens": len(ep.context),
            "context_resets": ep.traj.metadata.get("context_resets", 0),
        }

    async def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        """Copy the trainer's weights file into the served model and adopt its version."""
        path, version = body.get("path"), body.get("version")
        if not isinstance(path, str) or not isinstance(version, int) or isinstance(version, bool):
            raise BadRequest("'path' (a safetensors file) and 'version' (an integer) are required")
        model = self._local_model("weight loads")
        async with self.weights_lock.writing():
            try:
                n = await asyncio.to_thread(load_weights, model, path)
            except WeightSyncError as e:
                raise BadRequest(str(e), param="path") from e
            self.backend.sync_weights(model, version=version)  # drops cached prefixes
            self.policy_version = version
        log.info("loaded policy version %d from %s (%d tensors)", version, path, n)
        return {"policy_version": version, "tensors": n}

    async def set_policy_version(self, version: int) -> None:
        """The served model's weights were changed in place by their owner (the trainer): requests
        from now on report ``version``; one in flight finishes first; cached prefixes are dropped."""
        async with self.weights_lock.writing():
            self.backend.sync_weights(self.model, version=version)
            self.policy_version = version

    # ----------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_forever(self) -> None:
        """Serve on this thread until :meth:`shutdown` (or Ctrl-C on the main thread)."""
        import uvicorn

        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,  # leave the process's logging alone
            access_log=False,
            timeout_keep_alive=30,
        )
        self._uvicorn = uvicorn.Server(config)

        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._lock = AsyncReadWriteLock()
            self._started.set()
            await self._uvicorn.serve(sockets=[self._sock])

        try:
            asyncio.run(run())
        finally:
            self._stopped.set()

    def wait_started(self, timeout: float = 30.0) -> None:
        if not self._started.wait(timeout):
            raise TimeoutError(f"the server did not start within {timeout} s")

    def call_soon(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the serving loop from another thread and return its result (e.g. a
        weight change under the write lock, from the trainer)."""
        if self._loop is None:
            raise RuntimeError("the server is not serving: start it with serve_in_thread(server)")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)  # type: ignore[arg-type]

    def shutdown(self) -> None:
        """Stop serving (requests in flight finish) and wait until the serving loop has ended."""
        if self._uvicorn is None:
            return
        self._uvicorn.should_exit = True
        self._stopped.wait(30)

    def server_close(self) -> None:
        """Release the listening socket."""
        self._sock.close()


def make_server(
    backend: RolloutBackend,
    tokenizer: Any,
    *,
    model: Any = None,
    model_name: str = "flowgrpo",
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    recorder: EpisodeRecorder | None = None,
    sampling: SamplingParams | None = None,
) -> PolicyServer:
    """A bound (not yet serving) server; ``port=0`` picks a free port (see ``server.url``)."""
    return PolicyServer(
        backend,
        tokenizer,
        model=model,
        model_name=model_name,
        host=host,
        port=port,
        api_key=api_key,
        max_request_bytes=max_request_bytes,
        recorder=recorder,
        sampling=sampling,
    )


def serve_in_thread(server: PolicyServer) -> threading.Thread:
    """Start ``server.serve_forever`` in a daemon thread and return once it accepts requests (call
    ``server.shutdown()`` to stop)."""
    t = threading.Thread(target=server.serve_forever, name="flowgrpo-serve", daemon=True)
    t.start()
    server.wait_started()
    return t


FlowGRPOServer = PolicyServer
"""The name this class had when it ran on ``http.server``."""

__all__ = [
    "FlowGRPOServer",
    "PolicyServer",
    "make_server",
    "serve_in_thread",
]
