"""The server runs on Starlette under uvicorn: loopback by default, an optional bearer token, a
request size limit, OpenAI-style error bodies, and concurrent requests decoded in one batch."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from flowgrpo.gateway.serve import make_server, serve_in_thread
from flowgrpo.modeling.models import tiny_model
from flowgrpo.rollout.backends.hf import HFBackend


@pytest.fixture(scope="module")
def guarded():
    model, tok = tiny_model()
    backend = HFBackend(model, tok)
    server = make_server(backend, tok, model_name="tiny", api_key="s3cret", max_request_bytes=4096)
    serve_in_thread(server)
    yield server, backend
    server.shutdown()
    server.server_close()


def error_of(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_binds_loopback_by_default(guarded):
    server, _ = guarded
    assert server.url.startswith("http://127.0.0.1:")


def test_a_request_without_the_key_is_a_401_and_health_needs_none(guarded):
    server, _ = guarded
    r = httpx.get(f"{server.url}/v1/models")
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    r = httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    r = httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert r.json()["data"][0]["id"] == "tiny"


def test_a_body_over_the_limit_is_a_413_and_malformed_requests_are_400s(guarded):
    server, _ = guarded
    auth = {"Authorization": "Bearer s3cret"}
    r = httpx.post(f"{server.url}/v1/completions", headers=auth, json={"prompt": "x" * 5000})
    assert r.status_code == 413 and "4096" in error_of(r)["message"]
    r = httpx.post(f"{server.url}/v1/completions", headers=auth, content=b"{not json")
    assert r.status_code == 400 and error_of(r)["message"].startswith("bad JSON body")
    r = httpx.post(f"{server.url}/v1/completions", headers=auth, json=[1, 2])
    assert r.status_code == 400
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=auth, json={"messages": "hi"})
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    r = httpx.post(f"{server.url}/v1/nowhere", headers=auth, json={})
    assert r.status_code == 404 and error_of(r)["message"] == "unknown path /v1/nowhere"
    r = httpx.get(f"{server.url}/v1/completions", headers=auth)
    assert r.status_code == 405 and error_of(r)["code"] == 405


def test_concurrent_requests_are_decoded_in_one_running_batch(guarded):
    server, backend = guarded
    auth = {"Authorization": "Bearer s3cret"}
    before = dict(backend.stats)

    async def go():
        async with httpx.AsyncClient(headers=auth, timeout=60) as client:
            body = {"prompt": [1, 5, 6, 7], "max_tokens": 8, "stop_token_ids": [-1], "temperature": 1.0}
            rs = await asyncio.gather(
                *(client.post(f"{server.url}/v1/completions", json=body) for _ in range(8))
            )
        return [r.json() for r in rs]

    outs = asyncio.run(go())
    assert all(len(o["choices"][0]["token_ids"]) == 8 for o in outs)
    calls = backend.stats["calls"] - before["calls"]
    steps = backend.stats["decode_steps"] - before["decode_steps"]
    assert calls == 8
    assert steps < 8 * 8  # one request at a time would take 8 x 8 decode steps; a shared batch fewer
