"""flowgrpo serve implements a request's parameters or refuses them with a 400 naming them."""

from __future__ import annotations

import httpx
import pytest

from flowgrpo.gateway.openai_request import cut_at_stop, unsupported_params
from flowgrpo.gateway.serve import make_server, serve_in_thread
from flowgrpo.modeling.models import tiny_model
from flowgrpo.rollout.backends.hf import HFBackend

CHAT = [{"role": "user", "content": "What is 12 + 7?"}]


@pytest.fixture(scope="module")
def url():
    model, tok = tiny_model()
    server = make_server(HFBackend(model, tok), tok, model_name="tiny")
    serve_in_thread(server)
    yield server.url
    server.shutdown()
    server.server_close()


def post(url: str, path: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/{path}", json={"model": "tiny", **body}, timeout=60)


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
@pytest.mark.parametrize(
    ("param", "value"),
    [("stream", True), ("presence_penalty", 0.5), ("logit_bias", {"5": 10}), ("tools", [{}])],
)
def test_an_unimplemented_parameter_is_a_400_naming_it(url, path, param, value):
    body = {"messages": CHAT} if path.startswith("chat") else {"prompt": "What is"}
    r = post(url, path, max_tokens=2, **body, **{param: value})
    assert r.status_code == 400
    err = r.json()["error"]
    assert f"'{param}'" in err["message"] and err["type"] == "invalid_request_error"


def test_neutral_values_ask_for_nothing_and_are_accepted(url):
    r = post(url, "chat/completions", messages=CHAT, max_tokens=2, stream=False, presence_penalty=0, user="u")
    assert r.status_code == 200


def test_usage_has_total_tokens(url):
    for path, body in (("chat/completions", {"messages": CHAT}), ("completions", {"prompt": "What is"})):
        u = post(url, path, max_tokens=3, temperature=0.0, **body).json()["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] > 0


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_stop_strings_cut_the_text_before_the_first_one(url, path):
    body = {"messages": CHAT} if path.startswith("chat") else {"prompt": "What is 12"}

    def text(r):
        c = r.json()["choices"][0]
        return (c["message"]["content"] if path.startswith("chat") else c["text"]), c

    full, _ = text(post(url, path, max_tokens=24, temperature=0.0, stop_token_ids=[999999], **body))
    assert len(full) > 6, full  # greedy, no stop: the tiny model's 24 tokens
    stop = full[3:6]
    cut, choice = text(
        post(url, path, max_tokens=24, temperature=0.0, stop=[stop], stop_token_ids=[999999], **body)
    )
    assert cut == full[: full.find(stop)] and choice["finish_reason"] == "stop"
    if not path.startswith("chat"):
        assert len(choice["token_ids"]) < 24  # the tokens after the stop string are dropped too


def test_completions_logprobs_k_returns_the_top_k_per_token(url):
    r = post(url, "completions", prompt="What is", max_tokens=3, temperature=0.0, logprobs=3)
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["top_logprobs"]) == len(lp["tokens"]) == 3
    for token, top in zip(lp["tokens"], lp["top_logprobs"], strict=True):
        assert len(top) <= 3 and max(top, key=top.get) == token  # greedy: the sampled token is the top one
    assert post(url, "completions", prompt="x", max_tokens=1, logprobs=99).status_code == 400


def test_chat_logprobs_without_top_logprobs_still_gives_each_tokens_logprob(url):
    c = post(url, "chat/completions", messages=CHAT, max_tokens=2, logprobs=True).json()["choices"][0]
    content = c["logprobs"]["content"]
    assert len(content) >= 1 and all(e["top_logprobs"] == [] and e["logprob"] <= 0 for e in content)
    r = post(url, "chat/completions", messages=CHAT, max_tokens=2, top_logprobs=2)
    assert r.status_code == 400 and "'logprobs': true" in r.json()["error"]["message"]


def test_cut_at_stop_finds_a_stop_string_spanning_tokens():
    pieces = {1: "ab", 2: "c<", 3: "/s", 4: ">tail"}

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    assert cut_at_stop([1, 2, 3, 4], decode, ["</s>"]) == (4, "abc")
    assert cut_at_stop([1, 2, 3, 4], decode, ["zz"]) is None
    assert cut_at_stop([1, 2], decode, ["b", "c"]) == (1, "a")


def test_unsupported_params_lists_only_what_asks_for_something():
    body = {"prompt": "x", "stream": False, "echo": True, "best_of": 1, "suffix": None, "top_k": 3}
    assert unsupported_params(body, "completions") == ["echo"]
