"""The openai backend against a real OpenAI-compatible server on 127.0.0.1: ``flowgrpo serve``'s
server over the hf backend with a tiny random model (token-id prompts, ids + logprobs back), plus
small stdlib servers that fail or stall, for retries and timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from flowgrpo.gateway.serve import make_server, serve_in_thread
from flowgrpo.modeling.models import tiny_model
from flowgrpo.rollout.backends.base import RolloutBackend, SamplingParams
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.rollout.backends.openai import OpenAIBackend, OpenAIBackendError, parse_completion_choice
from flowgrpo.types import Message

PROMPTS = [[1, 40, 41, 42], [1, 50, 51, 52, 53, 54]]


@pytest.fixture(scope="module")
def served():
    model, tok = tiny_model()
    hf = HFBackend(model, tok)
    server = make_server(hf, tok, model_name="tiny")
    serve_in_thread(server)
    yield server, hf, model, tok
    server.shutdown()
    server.server_close()


def test_models_endpoint(served):
    server, *_ = served
    be = OpenAIBackend(server.url, "tiny")
    assert isinstance(be, RolloutBackend)
    assert asyncio.run(be.models()) == ["tiny"]


def test_token_id_generation_matches_the_local_backend(served):
    server, hf, _model, _tok = served
    be = OpenAIBackend(server.url + "/v1", "tiny", max_concurrency=2)
    params = SamplingParams(temperature=0.8, max_new_tokens=7, seed=11, stop_token_ids=[-5])
    remote = asyncio.run(be.generate(PROMPTS, params, max_new_tokens=[3, 7]))
    # the client gives prompt i the seed 11 + i; the server's requests may share a decode batch,
    # which changes float rounding but not the per-request random stream
    for i, (p, r) in enumerate(zip(PROMPTS, remote, strict=True)):
        local = hf.generate_sync(
            [p], params.model_copy(update={"seed": 11 + i, "max_new_tokens": [3, 7][i]})
        )[0]
        assert r.token_ids == local.token_ids and r.finish_reason == local.finish_reason
        assert max(abs(a - b) for a, b in zip(r.logprobs, local.logprobs, strict=True)) < 1e-5
    assert [len(r.token_ids) for r in remote] == [3, 7]
    assert all(r.finish_reason == "length" for r in remote)


def test_completions_wire_format(served):
    server, _, _, _tok = served
    body = {
        "model": "tiny",
        "prompt": "What is",
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "stop_token_ids": [-5],
    }
    data = httpx.post(server.url + "/v1/completions", json=body).json()
    choice = data["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert len(choice["logprobs"]["token_logprobs"]) == 4 and choice["finish_reason"] == "length"
    assert parse_completion_choice(choice).token_ids == choice["token_ids"]
    bad = httpx.post(server.url + "/v1/completions", json={"model": "tiny"})
    assert bad.status_code == 400 and "prompt" in bad.json()["error"]["message"]


def test_chat_text_mode(served):
    server, hf, _, tok = served
    be = OpenAIBackend(server.url, "tiny")
    msgs = [Message(role="system", content="s"), Message(role="user", content="hi")]
    text = asyncio.run(be.chat(msgs, temperature=0.0, max_tokens=5))
    ids = tok(
        tok.apply_chat_template([m.to_chat_dict() for m in msgs], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    local = hf.generate_sync([ids], SamplingParams(temperature=0.0, max_new_tokens=5))[0]
    assert text == tok.decode(local.token_ids, skip_special_tokens=True)


class _Flaky(BaseHTTPRequestHandler):
    """Fails with 503 for the first ``fail`` requests, then answers a fixed completion."""

    fail = 2
    seen = 0
    delay_s = 0.0

    def log_message(self, *a):
        pass

    def do_POST(self):
        cls = type(self)
        cls.seen += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(cls.delay_s)
        if cls.seen <= cls.fail:
            code, payload = 503, {"error": {"message": "busy"}}
        else:
            choice = {
                "token_ids": [5, 2],
                "logprobs": {"token_logprobs": [-1.0, -0.5]},
                "finish_reason": "stop",
            }
            code, payload = 200, {"choices": [choice]}
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the client timed out first (the timeout test)
            self.wfile.write(data)


def _start(handler):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_retries_then_succeeds_and_gives_up_with_the_reason():
    handler = type("H", (_Flaky,), {"fail": 2, "seen": 0})
    srv, url = _start(handler)
    try:
        be = OpenAIBackend(url, "m", max_retries=2, backoff_s=0.01)
        [r] = asyncio.run(be.generate([[1, 2]], SamplingParams()))
        assert (r.token_ids, r.logprobs, r.finish_reason) == ([5, 2], [-1.0, -0.5], "stop")
        assert handler.seen == 3
        handler.seen, handler.fail = 0, 10
        with pytest.raises(OpenAIBackendError, match=r"after 2 attempts.*503"):
            asyncio.run(
                OpenAIBackend(url, "m", max_retries=1, backoff_s=0.01).generate([[1]], SamplingParams())
            )
    finally:
        srv.shutdown()


def test_timeout_is_retried_and_reported():
    handler = type("H", (_Flaky,), {"fail": 0, "seen": 0, "delay_s": 0.5})
    srv, url = _start(handler)
    try:
        be = OpenAIBackend(url, "m", timeout_s=0.1, max_retries=1, backoff_s=0.01)
        with pytest.raises(OpenAIBackendError, match="ReadTimeout"):
            asyncio.run(be.generate([[1]], SamplingParams()))
    finally:
        srv.shutdown()


def test_server_without_token_ids_is_refused_for_training():
    with pytest.raises(OpenAIBackendError, match="token ids"):
        parse_completion_choice({"text": "hi", "finish_reason": "stop", "logprobs": None})


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_flowgrpo_serve_command():
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowgrpo", "serve", "--model", "tiny", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        be = OpenAIBackend(f"http://127.0.0.1:{port}", "tiny")
        deadline = time.time() + 180  # a loaded 2-core machine takes minutes to import and start
        while True:
            try:
                assert asyncio.run(be.models()) == ["tiny"]
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.time() < deadline, "server did not start in 180 s"
                time.sleep(0.3)
        [r] = asyncio.run(be.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3, stop_token_ids=[-5])))
        assert len(r.token_ids) == 3
    finally:
        proc.terminate()
        proc.wait(10)
