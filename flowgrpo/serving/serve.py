"""``flowgrpo serve``: a small OpenAI-compatible HTTP server over the hf backend (stdlib only).

Why: evaluation, LLM judges and remote rollouts talk to models through the OpenAI API; this lets
any local model (the embedded SmolLM2, a checkpoint) answer such clients, and it is the real
server the ``openai`` backend is tested against. It speaks the vLLM dialect for training use:

- ``GET /v1/models``
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
  :func:`flowgrpo.serving.toplogprobs.top_logprobs_content`): the verifier reward reads P(Yes) from it.
- ``POST /v1/load_weights`` ``{"path": FILE, "version": N}``: the trainer's weight sync
  (:mod:`flowgrpo.modeling.weightsync`): the safetensors file's tensors are copied into the served model
  between requests (requests in flight finish on the old weights; new ones wait for the copy).
  Every completion reports the ``policy_version`` that sampled it (0 until the first load), at the
  top level and on each choice.

Requests are served by a thread each and decoded one call at a time (the model is shared); a
request with several prompts is decoded as one batch. This is a development and test server, not
a production one: no authentication, no streaming. A parameter it does not implement (``stream:
true``, penalties, ``logit_bias``...) is refused with a 400 that names it
(:mod:`flowgrpo.serving.openai_request`), never silently ignored; ``usage`` has ``total_tokens``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flowgrpo.modeling.weightsync import WeightSyncError, load_weights
from flowgrpo.rollout.backends.base import GenerationResult, SamplingParams
from flowgrpo.serving.openai_request import (
    Endpoint,
    cut_at_stop,
    stop_strings,
    unsupported_message,
    unsupported_params,
)

log = logging.getLogger(__name__)


class _BadRequest(ValueError):
    pass


def _accepted_stops(body: dict[str, Any], endpoint: Endpoint) -> list[str]:
    """Refuse (400) a request that asks for something not implemented; return its stop strings."""
    names = unsupported_params(body, endpoint)
    if names:
        raise _BadRequest(unsupported_message(names, endpoint))
    try:
        return stop_strings(body)
    except ValueError as e:
        raise _BadRequest(str(e)) from e


def _stopped(r: GenerationResult, decode: Any, stops: list[str]) -> tuple[GenerationResult, str]:
    """The result cut at its first stop string (finish reason ``stop``) and its text."""
    cut = cut_at_stop(r.token_ids, decode, stops)
    if cut is None:
        return r, decode(r.token_ids)
    k, text = cut
    update = {"token_ids": r.token_ids[:k], "logprobs": r.logprobs[:k], "finish_reason": "stop"}
    return r.model_copy(update=update), text


def _params(body: dict[str, Any], default_stop: list[int]) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=max(0, int(body.get("top_k", 0) or 0)),
            max_new_tokens=int(body.get("max_tokens") or body.get("max_completion_tokens") or 16),
            stop_token_ids=list(body.get("stop_token_ids") or default_stop),
            seed=body.get("seed"),
        )
    except (ValueError, TypeError) as e:
        raise _BadRequest(f"bad sampling parameters: {e}") from e


class FlowGRPOServer(ThreadingHTTPServer):
    """The HTTP server; ``backend`` is an :class:`~flowgrpo.rollout.backends.hf.HFBackend`."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], backend: Any, tokenizer: Any, model_name: str) -> None:
        super().__init__(address, _Handler)
        self.backend = backend
        self.tokenizer = tokenizer
        self.model_name = model_name
        eos = tokenizer.eos_token_id
        self.default_stop = [int(eos)] if eos is not None else []
        self.policy_version = 0
        self.weights_lock = ReadWriteLock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    # ----------------------------------------------------------------- endpoint logic
    def _decoder(self, body: dict[str, Any]) -> Any:
        skip = bool(body.get("skip_special_tokens", True))
        return lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip)

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        stops = _accepted_stops(body, "completions")
        k_top = body.get("logprobs")
        if k_top is not None and (
            not isinstance(k_top, int) or isinstance(k_top, bool) or not 0 <= k_top <= 20
        ):
            raise _BadRequest("'logprobs' must be an integer from 0 to 20 (top alternatives per token)")
        prompt = body.get("prompt")
        if prompt is None:
            raise _BadRequest("'prompt' is required (text, a list of token ids, or a list of either)")
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt:
            prompts = prompt
        else:
            raise _BadRequest("'prompt' must be a non-empty string or list")
        ids = []
        for p in prompts:
            if isinstance(p, str):
                ids.append(self.tokenizer(p, add_special_tokens=False)["input_ids"])
            elif isinstance(p, list) and all(isinstance(i, int) for i in p) and p:
                ids.append(p)
            else:
                raise _BadRequest("each prompt must be a string or a non-empty list of token ids")
        n = int(body.get("n", 1))
        ids = [p for p in ids for _ in range(n)]
        params = _params(body, self.default_stop)
        with self.weights_lock.reading():
            version = self.policy_version
            results = self.backend.generate_sync(ids, params)
        cut = [_stopped(r, self._decoder(body), stops) for r in results]
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
                    from flowgrpo.serving.toplogprobs import top_logprobs_content

                    content = top_logprobs_content(
                        self.backend.model, self.tokenizer, ids[i], r.token_ids, k_top
                    )
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
            "usage": _usage(sum(len(p) for p in ids), sum(len(r.token_ids) for r in results)),
        }

    def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        stops = _accepted_stops(body, "chat")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("'messages' must be a non-empty list of {role, content}")
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:
            raise _BadRequest(f"cannot render messages with the chat template: {e}") from e
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        n = int(body.get("n", 1))
        params = _params(body, self.default_stop)
        with self.weights_lock.reading():
            version = self.policy_version
            results = self.backend.generate_sync([ids] * n, params)
        cut = [_stopped(r, self._decoder(body), stops) for r in results]
        results = [r for r, _ in cut]
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "finish_reason": r.finish_reason,
            }
            for i, (r, text) in enumerate(cut)
        ]
        k = body.get("top_logprobs") or 0
        if body.get("top_logprobs") is not None and not body.get("logprobs"):
            raise _BadRequest("'top_logprobs' needs 'logprobs': true")
        if body.get("logprobs"):  # each generated token's logprob, with its top k alternatives
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 20:
                raise _BadRequest("'top_logprobs' must be an integer from 0 to 20")
            from flowgrpo.serving.toplogprobs import top_logprobs_content

            for choice, r in zip(choices, results, strict=True):
                content = top_logprobs_content(self.backend.model, self.tokenizer, ids, r.token_ids, k)
                choice["logprobs"] = {"content": content}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "policy_version": version,
            "choices": choices,
            "usage": _usage(len(ids) * n, sum(len(r.token_ids) for r in results)),
        }

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        """Copy the trainer's weights file into the served model and adopt its version."""
        path, version = body.get("path"), body.get("version")
        if not isinstance(path, str) or not isinstance(version, int) or isinstance(version, bool):
            raise _BadRequest("'path' (a safetensors file) and 'version' (an integer) are required")
        with self.weights_lock.writing():
            try:
                n = load_weights(self.backend.model, path)
            except WeightSyncError as e:
                raise _BadRequest(str(e)) from e
            self.backend.sync_weights(self.backend.model, version=version)  # drops cached prefixes
            self.policy_version = version
        log.info("loaded policy version %d from %s (%d tensors)", version, path, n)
        return {"policy_version": version, "tensors": n}


class ReadWriteLock:
    """Many readers (completion requests) or one writer (a weight load) at a time; a waiting writer
    holds back new readers, so a load is not starved by a stream of requests."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cv:
            self._cv.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            with self._cv:
                self._readers -= 1
                self._cv.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._cv:
            self._writers_waiting += 1
            self._cv.wait_for(lambda: not self._writer and not self._readers)
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cv:
                self._writer = False
                self._cv.notify_all()


class _Handler(BaseHTTPRequestHandler):
    server: FlowGRPOServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # route to logging, not stderr
        log.debug("%s - %s", self.address_string(), format % args)

    def _send(self, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str) -> None:
        self._send(code, {"error": {"message": message, "type": "invalid_request_error", "code": code}})

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send(
                200,
                {
                    "object": "list",
                    "data": [{"id": self.server.model_name, "object": "model", "owned_by": "flowgrpo"}],
                },
            )
        elif self.path.rstrip("/") in ("/health", ""):
            self._send(200, {"status": "ok"})
        else:
            self._error(404, f"unknown path {self.path}")

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise _BadRequest("the request body must be a JSON object")
        except (ValueError, _BadRequest) as e:
            self._error(400, f"bad JSON body: {e}")
            return
        route = {
            "/v1/completions": self.server.completions,
            "/v1/chat/completions": self.server.chat_completions,
            "/v1/load_weights": self.server.load_weights,
        }
        fn = route.get(self.path.rstrip("/"))
        if fn is None:
            self._error(404, f"unknown path {self.path}")
            return
        try:
            self._send(200, fn(body))
        except _BadRequest as e:
            self._error(400, str(e))
        except Exception as e:  # a server bug must not kill the thread silently
            log.exception("request failed")
            self._error(500, f"{type(e).__name__}: {e}")


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def make_server(
    backend: Any, tokenizer: Any, *, model_name: str = "flowgrpo", host: str = "127.0.0.1", port: int = 0
) -> FlowGRPOServer:
    """A bound (not yet serving) server; ``port=0`` picks a free port (see ``server.url``)."""
    return FlowGRPOServer((host, port), backend, tokenizer, model_name)


def serve_in_thread(server: FlowGRPOServer) -> threading.Thread:
    """Start ``server.serve_forever`` in a daemon thread (call ``server.shutdown()`` to stop)."""
    t = threading.Thread(target=server.serve_forever, name="flowgrpo-serve", daemon=True)
    t.start()
    return t


def main(
    model: str,
    *,
    host: str,
    port: int,
    autocast: str | None,
    max_batch_size: int,
    model_name: str | None,
    step: int | None = None,
    device: str = "auto",
) -> int:
    """Entry point of ``flowgrpo serve``: load ``model`` (a run directory's checkpoint, an exported
    directory, a model name) on ``device`` and serve until interrupted."""
    from flowgrpo.rollout.backends.hf import HFBackend
    from flowgrpo.runs.export import load_served_policy

    m, tok = load_served_policy(model, step=step, device=device)
    backend = HFBackend(m, tok, max_batch_size=max_batch_size, autocast_dtype=autocast)
    server = make_server(backend, tok, model_name=model_name or model, host=host, port=port)
    print(f"flowgrpo serve: {model} at {server.url}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


__all__ = ["FlowGRPOServer", "main", "make_server", "serve_in_thread"]
