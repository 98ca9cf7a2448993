"""The ``openai`` backend: any OpenAI-compatible server over HTTP (httpx).

Two modes, for two uses:

- **Training rollouts** (:meth:`OpenAIBackend.generate`): ``POST /v1/completions`` with the prompt
  as a list of token ids, ``logprobs=0`` and ``return_tokens_as_token_ids=true`` (the vLLM
  dialect; ``flowgrpo serve`` speaks it too). The sampled ids are read from ``choice.token_ids``
  when present, else from the ``"token_id:N"`` strings of ``logprobs.tokens``; their logprobs
  from ``logprobs.token_logprobs``. A server that returns neither cannot be used for training
  and the error says so. For logprobs of the *processed* distribution (after temperature), start
  vLLM with ``--logprobs-mode processed_logprobs``.
- **Evaluation and judging** (:meth:`OpenAIBackend.chat`): ``POST /v1/chat/completions`` in text
  mode; never used for training data (text does not round-trip to ids).

Every request has a timeout, is retried with exponential backoff on transport errors, 429 and 5xx,
and runs under a concurrency limit (a semaphore), so a batch of prompts becomes concurrent
requests that a server like vLLM batches continuously on its side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from flowgrpo.rollout.backends.base import BackendBase, GenerationResult, SamplingParams, prompt_limits
from flowgrpo.types import Message
from flowgrpo.utils.http import RetriesExhausted, request_with_retries

log = logging.getLogger(__name__)


class OpenAIBackendError(RuntimeError):
    """A request that failed for good (after retries, or a 4xx); the message has the server's reply."""


class OpenAIBackend(BackendBase):
    """A :class:`~flowgrpo.rollout.backends.base.RolloutBackend` for an OpenAI-compatible server.

    Args:
        base_url: the server root, e.g. ``http://127.0.0.1:8000/v1`` (``/v1`` is added if missing).
        model: the model name the server knows.
        api_key: sent as a bearer token when given.
        timeout_s: per request.
        max_retries: retries after the first attempt (transport errors, 429, 5xx).
        max_concurrency: requests in flight at once.
        max_batch_size: what the rollout scheduler may send in one ``generate`` call.
        weight_sync_dir: where :meth:`sync_weights` writes the trainer's weights for the server to
            load (``flowgrpo serve``'s ``/v1/load_weights``; a directory both can read); None: the
            server keeps its own weights.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 32,
        max_batch_size: int = 256,
        weight_sync_dir: str | None = None,
    ) -> None:
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self.max_batch_size = max_batch_size
        self._sem: asyncio.Semaphore | None = None
        self._warned_stale = False
        self._sem_loop: Any = None
        self.weight_sync_dir = weight_sync_dir
        self.policy_version: int | None = None  # the last version the server confirmed loading

    def sync_weights(self, model: Any, *, version: int | None = None) -> None:
        """Push ``model``'s weights to the server: written to ``weight_sync_dir`` (a LoRA policy
        merged), then ``POST /v1/load_weights {path, version}``; the server answers once it has
        copied them, so the next completions sample the new policy and report ``version``.

        Without ``weight_sync_dir`` the server keeps its own weights and this client cannot push
        them: after the first update the rollouts come from an older policy than the one trained.
        Said once, with the remedy."""
        if self.weight_sync_dir is not None:
            self._push_weights(model, (self.policy_version or 0) + 1 if version is None else version)
            return
        if not self._warned_stale:
            self._warned_stale = True
            log.warning(
                "rollout.backend=openai: the server at %s keeps its own weights, so rollouts lag the "
                "trained policy after the first update; algorithm.tis=token corrects the loss for it",
                self.base_url,
            )

    def _push_weights(self, model: Any, version: int) -> None:
        import httpx

        from flowgrpo.modeling.weightsync import write_weights

        assert self.weight_sync_dir is not None
        path = write_weights(model, self.weight_sync_dir, version)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            r = httpx.post(
                self.base_url + "/load_weights",
                json={"path": str(path.resolve()), "version": version},
                headers=headers,
                timeout=max(self.timeout_s, 600.0),
            )
        except httpx.TransportError as e:
            raise OpenAIBackendError(f"weight sync to {self.base_url} failed: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise OpenAIBackendError(
                f"weight sync to {self.base_url} failed: HTTP {r.status_code}: {r.text[:500]} (the server "
                "must implement POST /v1/load_weights, as flowgrpo serve does; or unset "
                "rollout.server.weight_sync_dir)"
            )
        previous = self.policy_version
        self.policy_version = version
        if previous is not None and previous != version:  # the server holds the new one now
            from flowgrpo.modeling.weightsync import weights_path

            weights_path(self.weight_sync_dir, previous).unlink(missing_ok=True)

    # ------------------------------------------------------------------ plumbing
    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:  # semaphores are bound to one loop
            self._sem, self._sem_loop = asyncio.Semaphore(self.max_concurrency), loop
        return self._sem

    async def _post(self, client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with self._semaphore():
            try:
                r = await request_with_retries(
                    client,
                    "POST",
                    self.base_url + path,
                    json=body,
                    headers=headers,
                    timeout_s=self.timeout_s,
                    retries=self.max_retries,
                    backoff_s=self.backoff_s,
                )
            except RetriesExhausted as e:
                raise OpenAIBackendError(f"{path} {e}") from e
        if r.status_code != 200:
            raise OpenAIBackendError(f"{path} failed: HTTP {r.status_code}: {r.text[:500]}")
        return r.json()

    def _client(self) -> Any:
        import httpx

        return httpx.AsyncClient(limits=httpx.Limits(max_connections=self.max_concurrency))

    # ------------------------------------------------------------------ training: token ids
    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        """One ``/v1/completions`` request per prompt (token ids in, ids + logprobs out), concurrently."""
        limits = prompt_limits(params, len(prompts), max_new_tokens)
        async with self._client() as client:
            return list(
                await asyncio.gather(
                    *(
                        self._complete(client, list(p), params, m, i)
                        for i, (p, m) in enumerate(zip(prompts, limits, strict=True))
                    )
                )
            )

    async def _complete(
        self, client: Any, prompt: list[int], params: SamplingParams, limit: int, index: int
    ) -> GenerationResult:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": limit,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed + index  # distinct streams per prompt, reproducible
        data = await self._post(client, "/completions", body)
        return parse_completion_choice(data["choices"][0], data.get("policy_version"))

    # ------------------------------------------------------------------ evaluation / judging: text
    async def chat(
        self,
        messages: Sequence[Message | dict[str, Any]],
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        **extra: Any,
    ) -> str:
        """The assistant's reply text (text mode: for evaluation and judges, never for training)."""
        data = await self.chat_response(messages, temperature=temperature, max_tokens=max_tokens, **extra)
        return data["choices"][0]["message"]["content"] or ""

    async def chat_response(
        self,
        messages: Sequence[Message | dict[str, Any]],
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        **extra: Any,
    ) -> dict[str, Any]:
        """The whole ``/chat/completions`` reply, for fields beyond the text (``logprobs`` with
        ``top_logprobs``: the verifier reward)."""
        body = {
            "model": self.model,
            "messages": [m.to_chat_dict() if isinstance(m, Message) else m for m in messages],
            "temperature": temperature,
            "max_tokens": max_tokens,
            **extra,
        }
        async with self._client() as client:
            return await self._post(client, "/chat/completions", body)

    async def models(self) -> list[str]:
        """Model ids the server lists."""
        import httpx

        async with httpx.AsyncClient() as client:
            r = await client.get(self.base_url + "/models", timeout=self.timeout_s)
            r.raise_for_status()
            return [m["id"] for m in r.json()["data"]]


def parse_completion_choice(choice: dict[str, Any], policy_version: int | None = None) -> GenerationResult:
    """Token ids, logprobs and finish reason from a ``/v1/completions`` choice (vLLM dialect), with
    the policy version the server reports (on the choice, else the response's ``policy_version``)."""
    lp = choice.get("logprobs") or {}
    token_logprobs = lp.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None and lp.get("tokens") is not None:
        try:
            ids = [int(str(t).removeprefix("token_id:")) for t in lp["tokens"]]
        except ValueError:
            ids = None
    if ids is None or token_logprobs is None:
        raise OpenAIBackendError(
            "the server returned no token ids/logprobs: training needs a server that accepts token-id "
            "prompts and returns ids (vLLM: `return_tokens_as_token_ids`, or `flowgrpo serve`)"
        )
    if len(ids) != len(token_logprobs):
        raise OpenAIBackendError(f"server returned {len(ids)} token ids but {len(token_logprobs)} logprobs")
    reason = "length" if choice.get("finish_reason") == "length" else "stop"
    logprobs = [float(x) if x is not None else 0.0 for x in token_logprobs]
    version = choice.get("policy_version", policy_version)
    return GenerationResult(
        token_ids=[int(i) for i in ids],
        logprobs=logprobs,
        finish_reason=reason,
        policy_version=int(version) if version is not None else None,
    )


__all__ = ["OpenAIBackend", "OpenAIBackendError", "parse_completion_choice"]
