"""The verifier reward: P(Yes) / (P(Yes) + P(No)) from a local model's logits (batched) and from an
OpenAI-compatible server's top_logprobs (``flowgrpo serve`` on a free loopback port)."""

from __future__ import annotations

import math
import socket

import pytest
import torch

from flowgrpo.gateway.serve import make_server, serve_in_thread
from flowgrpo.modeling.models import tiny_model
from flowgrpo.rewards import CompositeReward, Missing, RewardSpec, VerifierReward
from flowgrpo.rewards.verifier import HFVerifier, OpenAIVerifier, render_ids, yes_no_probability
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.rollout.backends.openai import OpenAIBackend
from flowgrpo.types import Message, Task, Trajectory, TrajectoryGroup, Turn
from flowgrpo.utils.aio import run_sync

CHAT = [{"role": "user", "content": "Is 1 + 1 = 2? Reply with Yes or No."}]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return tiny_model(seed=3)


@pytest.fixture(scope="module")
def server(tiny):
    model, tok = tiny
    srv = make_server(HFBackend(model, tok), tok, model_name="tiny")
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def _last_logprobs(model, tok, chat) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([render_ids(tok, chat)])).logits[0, -1].float(), -1)


def _one_token_words(tok, ids) -> list[str]:
    """Words from ``ids`` that tokenize back to exactly that id and carry no spaces."""
    out = []
    for i in ids:
        w = tok.decode([i])
        if w and w == w.strip() and tok(w, add_special_tokens=False)["input_ids"] == [i] and w not in out:
            out.append(w)
    return out


def test_yes_no_probability_by_hand():
    assert yes_no_probability(0.3, 0.1) == pytest.approx(0.75)
    assert isinstance(yes_no_probability(0.0, 0.0), Missing)


def test_local_verifier_reads_the_next_token_distribution_and_batches_exactly(tiny):
    model, tok = tiny
    logp = _last_logprobs(model, tok, CHAT)
    w = _one_token_words(tok, logp.topk(40).indices.tolist())[:4]
    v = HFVerifier(model, tok, yes_words=w[:2], no_words=w[2:4], batch_size=2)
    ids = [tok(x, add_special_tokens=False)["input_ids"][0] for x in w]
    assert v.yes_ids == ids[:2] and v.no_ids == ids[2:4]
    (p_yes, p_no), *_ = v.probabilities([CHAT])
    assert p_yes == pytest.approx(float(logp[ids[:2]].exp().sum()), rel=1e-4)
    assert p_no == pytest.approx(float(logp[ids[2:]].exp().sum()), rel=1e-4)
    # A batch of prompts of different lengths (right padded) gives each prompt's own values.
    longer = [{"role": "user", "content": "Is 12 * 12 = 144? Think about it, then reply with Yes or No."}]
    batched = v.probabilities([CHAT, longer, CHAT])
    alone = v.probabilities([longer])
    assert batched[0] == pytest.approx((p_yes, p_no), rel=1e-4) and batched[1] == pytest.approx(
        alone[0], rel=1e-4
    )
    with pytest.raises(ValueError, match="overlap"):
        HFVerifier(model, tok, yes_words=w[:2], no_words=w[1:3])


def test_flowgrpo_serve_returns_top_logprobs_of_the_raw_distribution(tiny, server):
    model, tok = tiny
    data = run_sync(
        OpenAIBackend(server.url, "tiny").chat_response(CHAT, max_tokens=2, logprobs=True, top_logprobs=5)
    )
    content = data["choices"][0]["logprobs"]["content"]
    assert 1 <= len(content) <= 2 and all(len(e["top_logprobs"]) == 5 for e in content)  # one per token
    expected = _last_logprobs(model, tok, CHAT).topk(5)
    top = content[0]["top_logprobs"]
    assert [e["token"] for e in top] == [tok.decode([i]) for i in expected.indices.tolist()]
    assert [e["logprob"] for e in top] == pytest.approx(expected.values.tolist(), abs=1e-4)
    with pytest.raises(Exception, match="top_logprobs"):
        run_sync(
            OpenAIBackend(server.url, "tiny", max_retries=0).chat_response(
                CHAT, logprobs=True, top_logprobs=99
            )
        )


def test_verifier_over_the_server_matches_the_local_model(tiny, server):
    model, tok = tiny
    logp = _last_logprobs(model, tok, CHAT)
    w = _one_token_words(tok, logp.topk(20).indices.tolist())[:2]
    local = HFVerifier(model, tok, yes_words=w[:1], no_words=w[1:2]).probabilities([CHAT])[0]
    remote = run_sync(OpenAIVerifier(server.url, "tiny", yes_words=w[:1], no_words=w[1:2]).probability(CHAT))
    assert remote == pytest.approx(local[0] / (local[0] + local[1]), rel=1e-4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group() -> TrajectoryGroup:
    def traj(text: str) -> Trajectory:
        turn = Turn(
            prompt_ids=[1],
            action_ids=[2],
            action_logprobs=[-1.0],
            action=Message(role="assistant", content=text),
        )
        return Trajectory(turns=[turn])

    return TrajectoryGroup(
        task=Task(id="t", prompt="What is 1 + 1?", answer="2"),
        trajectories=[traj("<answer>2</answer>"), traj("<answer>3</answer>"), traj("")],
    )


def test_verifier_reward_end_to_end_and_an_unreachable_verifier_excludes(tiny, server):
    model, tok = tiny
    g = _group()
    CompositeReward(
        [RewardSpec(name="verifier")], fns={"verifier": VerifierReward(model=model, tokenizer=tok)}
    ).score_groups([g])
    a, b, empty = g.trajectories
    assert 0.0 < a.reward < 1.0 and a.reward != b.reward and a.excluded is None
    assert empty.reward == 0.0 and empty.excluded is None  # no final answer: not asked, reward 0
    down = VerifierReward(base_url=f"http://127.0.0.1:{_free_port()}/v1", max_retries=0, timeout_s=2)
    g = _group()
    CompositeReward([RewardSpec(name="verifier")], fns={"verifier": down}).score_groups([g])
    assert g.trajectories[0].excluded.startswith("reward:verifier: verifier: OpenAIBackendError")
    assert g.trajectories[2].excluded is None
    with pytest.raises(ValueError, match="exactly one verifier"):
        VerifierReward(model=model, tokenizer=tok, base_url="http://x")


@pytest.mark.slow
def test_embedded_model_verifies_its_own_answers_locally_and_through_serve():
    from flowgrpo.modeling.models import load_model

    model, tok = load_model("smollm2-135m")
    srv = make_server(HFBackend(model, tok), tok, model_name="smollm2")
    serve_in_thread(srv)
    try:
        local = VerifierReward(model=model, tokenizer=tok)
        remote = VerifierReward(base_url=srv.url, server_model="smollm2", timeout_s=600)
        g1, g2 = _group(), _group()
        CompositeReward([RewardSpec(name="verifier")], fns={"verifier": local}).score_groups([g1])
        CompositeReward([RewardSpec(name="verifier")], fns={"verifier": remote}).score_groups([g2])
        for x, y in zip(g1.trajectories[:2], g2.trajectories[:2], strict=True):
            assert x.excluded is None and y.excluded is None
            assert x.reward == pytest.approx(y.reward, abs=1e-3) and math.isfinite(x.reward)
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_verifier_example_config_validates():
    from pathlib import Path

    from flowgrpo.config import load_config

    cfg = load_config(Path(__file__).parent.parent / "examples" / "calculator_verifier.yaml")
    assert [r.name for r in cfg.rewards] == ["verifier", "format"]
    assert cfg.rewards[0].kwargs["hf_model"] == "smollm2-135m"
