"""Retries in one place: transport errors, 429 and 5xx are retried with backoff; other answers are
the caller's; the jitter never moves the seeded global RNG."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from flowgrpo.utils.http import RetriesExhausted, request_with_retries, retryable_status


def test_retryable_statuses():
    assert retryable_status(429) and retryable_status(500) and retryable_status(503)
    assert not retryable_status(200) and not retryable_status(400) and not retryable_status(404)


def run(statuses: list[int], retries: int) -> tuple[object, int]:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(statuses[min(len(seen) - 1, len(statuses) - 1)], text="busy")

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await request_with_retries(client, "POST", "http://x/v1", retries=retries, backoff_s=0.001)

    try:
        return asyncio.run(go()), len(seen)
    except RetriesExhausted as e:
        return e, len(seen)


def test_a_retryable_status_is_retried_then_the_answer_returned():
    random.seed(7)
    expected = random.random()
    random.seed(7)
    r, n = run([503, 429, 200], retries=3)
    assert r.status_code == 200 and n == 3
    assert random.random() == expected  # the backoff's jitter left the global RNG alone


def test_a_client_error_is_returned_at_once_and_exhaustion_says_why():
    r, n = run([404], retries=3)
    assert r.status_code == 404 and n == 1
    err, n = run([503], retries=1)
    assert n == 2 and isinstance(err, RetriesExhausted) and err.attempts == 2
    assert str(err) == "failed after 2 attempts: HTTP 503: busy"
    with pytest.raises(RetriesExhausted):
        raise err
