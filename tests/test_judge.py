"""The LLM-judge reward against a real OpenAI-compatible HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flowgrpo.rewards import (
    CompositeReward,
    JudgeReward,
    Missing,
    OpenAIChatClient,
    RewardSpec,
    make_reward,
    parse_score,
)
from flowgrpo.types import Message, Task, Trajectory, TrajectoryGroup, Turn


class JudgeServer:
    """A stdlib /v1/chat/completions server whose behaviour each test scripts.

    ``replies``: a function (request number, request body) -> (status, content or None, delay_s).
    """

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.replies = lambda n, body: (200, "SCORE: 0.8", 0.0)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                if self.path != "/v1/chat/completions":
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    n = len(server.requests)
                    server.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, content, delay = server.replies(n, body)
                    time.sleep(delay)
                    payload = (
                        {"choices": [{"message": {"role": "assistant", "content": content}}]}
                        if content is not None
                        else {"error": "boom"}
                    )
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[JudgeServer]:
    s = JudgeServer()
    yield s
    s.close()


TASK = Task(id="t", prompt="What is 2 + 3?", answer="5")


def make_group(n: int = 3) -> TrajectoryGroup:
    trajs = [
        Trajectory(
            id=f"traj{i}",
            turns=[
                Turn(
                    prompt_ids=[1],
                    action_ids=[2],
                    action_logprobs=[0.0],
                    action=Message(role="assistant", content=f"2 + 3 = 5, attempt {i}. <answer>5</answer>"),
                )
            ],
        )
        for i in range(n)
    ]
    return TrajectoryGroup(task=TASK, trajectories=trajs)


def test_judge_scores_through_the_server(server: JudgeServer) -> None:
    judge = make_reward("judge", base_url=server.url, model="qwen3-32b", api_key="secret")
    group = make_group(3)
    assert judge(group.trajectories[0], TASK) == pytest.approx(0.8)
    body = server.requests[0]["body"]
    assert body["model"] == "qwen3-32b" and server.requests[0]["auth"] == "Bearer secret"
    prompt = body["messages"][0]["content"]
    assert "What is 2 + 3?" in prompt and "Reference answer: 5" in prompt and "attempt 0" in prompt


def test_judge_concurrency_limit(server: JudgeServer) -> None:
    server.replies = lambda n, body: (200, f"SCORE: {n / 10}", 0.15)
    judge = JudgeReward(base_url=server.url, model="m", max_concurrency=2)
    groups = [make_group(3), make_group(3)]
    out = asyncio.run(judge.ascore_groups(groups))
    assert len(server.requests) == 6 and server.max_in_flight == 2
    assert sorted(v for g in out for v in g) == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])


def test_judge_retries_server_errors_then_succeeds(server: JudgeServer) -> None:
    server.replies = lambda n, body: (500, None, 0.0) if n < 2 else (200, "SCORE: 0.6", 0.0)
    client = OpenAIChatClient(server.url, "m", max_retries=2, backoff_s=0.01)
    judge = JudgeReward(client=client)
    assert judge(make_group(1).trajectories[0], TASK) == pytest.approx(0.6)
    assert len(server.requests) == 3 and judge.failures == 0


def test_judge_failures_give_the_fallback_never_a_crash(server: JudgeServer, caplog) -> None:
    # always 503: retries exhausted -> fallback
    server.replies = lambda n, body: (503, None, 0.0)
    judge = JudgeReward(
        client=OpenAIChatClient(server.url, "m", max_retries=1, backoff_s=0.01), fallback=0.25
    )
    assert judge(make_group(1).trajectories[0], TASK) == 0.25
    assert len(server.requests) == 2 and judge.failures == 1
    assert "using fallback 0.25" in caplog.text
    # timeout
    server.replies = lambda n, body: (200, "SCORE: 1", 1.0)
    judge = JudgeReward(base_url=server.url, model="m", timeout_s=0.2, max_retries=0, fallback=0.1)
    assert judge(make_group(1).trajectories[0], TASK) == 0.1
    # a reply without a score
    server.replies = lambda n, body: (200, "I refuse to grade this.", 0.0)
    judge = JudgeReward(base_url=server.url, model="m", fallback=0.0)
    assert judge(make_group(1).trajectories[0], TASK) == 0.0 and judge.failures == 1
    # 400 = configuration error: no retry, fallback
    before = len(server.requests)
    server.replies = lambda n, body: (400, None, 0.0)
    judge = JudgeReward(base_url=server.url, model="m", max_retries=3, fallback=0.0)
    assert judge(make_group(1).trajectories[0], TASK) == 0.0
    assert len(server.requests) == before + 1
    # nobody listening
    judge = JudgeReward(base_url="http://127.0.0.1:9/v1", model="m", max_retries=0, fallback=0.5)
    assert judge(make_group(1).trajectories[0], TASK) == 0.5


def test_judge_in_a_composite(server: JudgeServer) -> None:
    server.replies = lambda n, body: (200, '{"score": 0.5}', 0.0)
    comp = CompositeReward(
        [
            RewardSpec(name="accuracy"),
            RewardSpec(name="judge", weight=0.4, kwargs={"base_url": server.url, "model": "m"}),
        ]
    )
    g = make_group(2)
    comp.score_groups([g])
    for t in g.trajectories:
        assert t.reward_breakdown == {"accuracy": 1.0, "judge": 0.5}
        assert t.reward == pytest.approx(1.0 + 0.4 * 0.5)


def test_judge_with_a_local_hf_model() -> None:
    from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
    from flowgrpo.rewards import HFChatClient

    model, tok = tiny_model(tiny_tokenizer())
    judge = JudgeReward(client=HFChatClient(model, tok, max_new_tokens=4), fallback=0.3)
    # a random tiny model writes no parsable score (or a number): either way a value in [0, 1]
    v = judge(make_group(1).trajectories[0], TASK)
    assert 0.0 <= v <= 1.0 and judge.calls == 1


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("SCORE: 0.8", 0.8),
        ("score = 0.75", 0.75),
        ('{"score": 1}', 1.0),
        ("Reasoning is fine.\nScore: 7/10", 0.7),
        ("SCORE: 85%", 0.85),
        ("Score: 8", 0.8),  # a 10-point scale
        ("Score: 1.7", 0.17),
        ("0.3", 0.3),
        ("Rubric: score 0 if wrong, 1 if right.\nSCORE: 0.9", 0.9),  # the last score wins
        ("SCORE: -2", 0.0),  # clamped
        ("I give it 4 out of 5", None),  # no pattern we trust with several numbers
        ("no idea", None),
        ("", None),
    ],
)
def test_parse_score(reply: str, expected: float | None) -> None:
    got = parse_score(reply)
    assert got == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("SCORE: 4", 0.75),  # (4 - 1) / (5 - 1)
        ("Score: 1", 0.0),
        ("5", 1.0),
        ("SCORE: 4/5", 0.75),
        ("Clear steps, right answer: 3/5", 0.5),
        ("score = 2.5 because the steps are thin", 0.375),
        ("SCORE: 7", None),  # outside the rubric: no score, never clamped
        ("I think 3 or 4", None),  # two numbers, no score marker
        ("Rating 4/10", None),
        ("", None),
    ],
)
def test_rubric_scores_are_normalised_by_hand(reply, expected):
    from flowgrpo.rewards.judge import parse_rubric_score

    assert parse_rubric_score(reply, 1, 5) == (None if expected is None else pytest.approx(expected))


def test_judge_on_a_1_to_5_rubric_through_the_server(server: JudgeServer) -> None:
    server.replies = lambda n, body: (200, "The steps are right but wordy. SCORE: 4", 0.0)
    judge = make_reward("judge", base_url=server.url, model="m", score_range=[1, 5])
    assert judge(make_group(1).trajectories[0], TASK) == pytest.approx(0.75)
    server.replies = lambda n, body: (200, "SCORE: 9", 0.0)  # off the rubric: the episode gets no reward
    assert isinstance(judge(make_group(1).trajectories[0], TASK), Missing)
    assert judge.failures == 1
    with pytest.raises(ValueError, match=r"score_range must be \[low, high\]"):
        JudgeReward(base_url=server.url, score_range=[5, 1])
