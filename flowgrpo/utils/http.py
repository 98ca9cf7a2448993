"""The one place HTTP calls are retried: the OpenAI-compatible backend (rollouts, judges,
verifiers) and the HTTP search tool go through :func:`request_with_retries`.

Why httpx and no retry library: httpx is already the client (async, timeouts per request), and
the policy is four lines: retry transport errors (connect errors, timeouts, resets), HTTP 429 and
5xx; hand every other answer back to the caller, who knows what a 4xx means for it. The backoff
doubles per attempt with up to 50% jitter drawn from a private generator, so retries never move
the seeded global RNG that makes runs reproducible.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

_JITTER = random.Random()


class RetriesExhausted(RuntimeError):
    """Every attempt failed with a retryable error; ``last`` is the last one's reason."""

    def __init__(self, attempts: int, last: str) -> None:
        super().__init__(f"failed after {attempts} attempts: {last}")
        self.attempts, self.last = attempts, last


def retryable_status(status: int) -> bool:
    """Rate limits and server errors: worth another attempt."""
    return status == 429 or status >= 500


async def request_with_retries(
    client: Any,
    method: str,
    url: str,
    *,
    retries: int,
    backoff_s: float,
    timeout_s: float | None = None,
    **kwargs: Any,
) -> Any:
    """``client.request(method, url, ...)`` (an ``httpx.AsyncClient``), retried ``retries`` times
    after a transport error or a retryable status, waiting ``backoff_s * 2**attempt`` (times 1 to
    1.5) between attempts. Returns the first non-retryable response; raises
    :class:`RetriesExhausted` when none came."""
    import httpx

    last = ""
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1) * (1.0 + 0.5 * _JITTER.random()))
        try:
            r = await client.request(method, url, timeout=timeout_s, **kwargs)
        except httpx.TransportError as e:  # connect errors, timeouts, resets
            last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            continue
        if not retryable_status(r.status_code):
            return r
        last = f"HTTP {r.status_code}" + (f": {r.text[:500]}" if r.text else "")
    raise RetriesExhausted(retries + 1, last)


__all__ = ["RetriesExhausted", "request_with_retries", "retryable_status"]
