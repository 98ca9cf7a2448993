"""Agents the project does not own, through the gateway, with the real ``openai`` client:
``tools`` in, ``tool_calls`` out (the environments' parser), ``tool`` messages rendered by the
chat layer, and every turn of an episode recorded token-exactly, as the rollout engine records a
:class:`~flowgrpo.env.ToolEnv` episode.

The policy here is scripted (``ScriptedBackend``, the k-th assistant turn says ``script[k]``) so
the model calls a tool, which a random tiny model would not; one test runs the real tiny model.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from flowgrpo.tools.calculator import Calculator

from flowgrpo.env import ToolEnv
from flowgrpo.gateway.client import post_reward
from flowgrpo.gateway.recorder import EpisodeRecorder, RecorderLimits
from flowgrpo.gateway.serve import make_server, serve_in_thread
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.rollout.engine import RolloutConfig, RolloutEngine
from flowgrpo.runs.rundir import RunDir
from flowgrpo.tool import to_openai_schema
from flowgrpo.types import Task, Termination
from tests.stand_ins import ScriptedBackend

SYSTEM = "Solve the math problem. Use the calculator tool for arithmetic. Give the final answer as <answer>N</answer>."
TASK = Task(
    id="t-1", prompt="Ana has 12 apples. She buys 7 more. How many apples does Ana have now?", answer="19"
)
SCRIPT = [
    'I will add.\n<tool_call>{"name": "calculator", "arguments": {"expression": "12 + 7"}}</tool_call>',
    "The calculator gives 19.\n<answer>19</answer>",
]


@pytest.fixture
def scripted(tmp_path):
    tok = tiny_tokenizer()
    recorder = EpisodeRecorder(tmp_path / "run", RecorderLimits(max_turns=4, max_context_tokens=4096))
    backend = ScriptedBackend(tok, SCRIPT)
    server = make_server(backend, tok, model_name="tiny", recorder=recorder)
    serve_in_thread(server)
    yield server, recorder, backend, tok, tmp_path / "run"
    server.shutdown()
    server.server_close()


def client_for(server, **headers) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", default_headers=headers, max_retries=0
    )


def run_agent(client: openai.OpenAI, tool_result: str = "19", *, user: str | None = None) -> list[dict]:
    """A plain tool-calling loop over the openai client, as people write it."""
    tools = [to_openai_schema(Calculator())]
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK.prompt}]
    extra = {"user": user} if user else {}
    for _ in range(4):
        r = client.chat.completions.create(
            model="tiny", messages=messages, tools=tools, temperature=1.0, **extra
        )
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return messages
        for call in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_result})
    return messages


def test_tools_in_tool_calls_out_with_the_openai_client(scripted):
    server, *_ = scripted
    client = client_for(server)
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK.prompt}],
        tools=[to_openai_schema(Calculator())],
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "12 + 7"}
    assert choice.message.content == "I will add."  # the text outside the call tags


def test_an_episode_is_recorded_token_exactly_as_tool_env_records_it(scripted):
    server, _recorder, backend, tok, run = scripted
    messages = run_agent(client_for(server, **{"X-Episode-Id": "ep-1", "X-Task-Id": TASK.id}))
    assert messages[-1]["content"] == SCRIPT[1]
    out = post_reward(1.0, {"accuracy": 1.0}, base_url=f"{server.url}/v1", episode_id="ep-1")
    assert out["turns"] == 2 and out["task_id"] == TASK.id
    [recorded] = RunDir(run).trajectories(0)  # an ordinary trajectory file, read by the run reader
    assert recorded.reward == 1.0 and recorded.reward_breakdown == {"accuracy": 1.0}
    assert recorded.termination == Termination.finished and recorded.task_id == TASK.id

    # What the rollout engine records for a ToolEnv with the same tool, prompt and policy turns.
    env_backend = ScriptedBackend(tok, SCRIPT)
    engine = RolloutEngine(env_backend, tok, RolloutConfig(max_turns=4, max_context_tokens=4096))
    [group] = engine.run_groups(lambda: ToolEnv([Calculator()], system_prompt=SYSTEM), [TASK], 1)
    [reference] = group.trajectories
    assert len(reference.turns) == len(recorded.turns) == 2
    for mine, ref in zip(recorded.turns, reference.turns, strict=True):
        assert mine.prompt_ids == ref.prompt_ids
        assert mine.action_ids == ref.action_ids and mine.action_logprobs == ref.action_logprobs
        assert not mine.resets_context
    assert recorded.turns[0].observations[0].content == reference.turns[0].observations[0].content == "19"
    assert recorded.context_ids(1) == reference.context_ids(1)
    # and the ids the policy was actually fed are the recorded context, turn by turn
    fed = [prompts[0] for prompts, _ in backend.calls]
    assert fed == [recorded.context_ids(0), recorded.context_ids(1)]


def test_a_client_that_rewrites_history_starts_a_counted_new_segment(scripted):
    server, recorder, backend, tok, _run = scripted
    client = client_for(server)
    tools = [to_openai_schema(Calculator())]
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK.prompt}]
    r = client.chat.completions.create(model="tiny", messages=first, tools=tools, user="ep-rw")
    call = r.choices[0].message.tool_calls[0]
    rewritten = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Summary so far: Ana had 12 apples and bought 7."},  # the agent edited it
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "19"},
    ]
    client.chat.completions.create(model="tiny", messages=rewritten, tools=tools, user="ep-rw")
    traj = recorder.close("ep-rw", 0.5)
    assert [t.resets_context for t in traj.turns] == [False, True]
    assert traj.metadata["context_resets"] == 1
    # a new segment's prompt is the whole rendered conversation, with the call written as the model wrote it
    assert backend.calls[-1][0][0] == traj.turns[1].prompt_ids == traj.context_ids(1)
    assert '<tool_call>{"name": "calculator"' in tok.decode(traj.turns[1].prompt_ids)


def test_episode_limits_ids_and_rewards_are_checked(scripted):
    server, _recorder, *_ = scripted
    base = f"{server.url}/v1"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    for bad in ("../../etc/passwd", ".hidden", "a/b", "x" * 200):
        r = httpx.post(f"{base}/chat/completions", json=body, headers={"X-Episode-Id": bad})
        assert r.status_code == 400 and "episode id" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/episodes/..%2F..%2Fx/v1/chat/completions", json=body)
    assert r.status_code in (400, 404)
    r = httpx.post(f"{base}/episodes/nobody/reward", json={"reward": 1.0})
    assert r.status_code == 404 and r.json()["error"]["code"] == "episode_not_open"
    r = httpx.post(f"{server.url}/episodes/ep-lim/v1/chat/completions", json={**body, "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    for _ in range(4):  # max_turns=4, each request a new segment (same messages: a retry)
        assert httpx.post(f"{server.url}/episodes/ep-lim/v1/chat/completions", json=body).status_code == 200
    r = httpx.post(f"{server.url}/episodes/ep-lim/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "episode_too_long"
    r = httpx.post(f"{base}/episodes/ep-lim/reward", json={"reward": "lots"})
    assert r.status_code == 400
    r = httpx.post(f"{base}/episodes/ep-lim/reward", json={"reward": 0.0})
    assert r.json()["termination"] == "max_turns" and r.json()["turns"] == 4
    r = httpx.post(f"{server.url}/episodes/ep-lim/v1/chat/completions", json=body)
    assert r.status_code == 409  # ended: a new episode needs a new id
    r = httpx.post(f"{base}/chat/completions", json={**body, "tool_choice": "required", "tools": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


def test_the_real_tiny_model_records_its_sampled_ids_and_logprobs(tmp_path):
    model, tok = tiny_model()
    recorder = EpisodeRecorder(tmp_path)
    server = make_server(HFBackend(model, tok), tok, model_name="tiny", recorder=recorder)
    serve_in_thread(server)
    try:
        client = client_for(server, **{"X-Episode-Id": "real-1", "X-Task-Id": "t-9"})
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK.prompt}]
        r = client.chat.completions.create(
            model="tiny", messages=msgs, tools=[to_openai_schema(Calculator())], max_tokens=6
        )
        assert r.choices[0].finish_reason == "length"
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
        r2 = client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=6, tools=[to_openai_schema(Calculator())]
        )
        post_reward(0.0, base_url=f"{server.url}/v1", episode_id="real-1")
    finally:
        server.shutdown()
        server.server_close()
    [traj] = RunDir(tmp_path).trajectories(0)
    assert [len(t.action_ids) for t in traj.turns] == [6, 6]
    assert all(lp < 0 for t in traj.turns for lp in t.action_logprobs)
    assert traj.turns[0].action_ids == r.choices[0].model_extra["token_ids"]
    assert traj.turns[1].action_ids == r2.choices[0].model_extra["token_ids"]
    assert not traj.turns[1].resets_context  # a length-cut turn is extended with the template's whole tail


def test_langchain_chat_openai_with_bound_tools_is_recorded_as_tool_env_records_it(scripted):
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from flowgrpo.tool import from_langchain

    @tool(parse_docstring=True)
    def calculator(expression: str) -> str:
        """Evaluate a math expression exactly.

        Args:
            expression: A math expression, e.g. 391/4
        """
        return "19" if expression == "12 + 7" else "?"

    server, _recorder, _backend, tok, run = scripted
    llm = ChatOpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        model="tiny",
        max_retries=0,
        default_headers={"X-Episode-Id": "lc-1", "X-Task-Id": TASK.id},
    ).bind_tools([calculator])
    messages = [SystemMessage(SYSTEM), HumanMessage(TASK.prompt)]
    ai = llm.invoke(messages)
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("calculator", {"expression": "12 + 7"})]
    messages += [
        ai,
        ToolMessage(calculator.invoke(ai.tool_calls[0]["args"]), tool_call_id=ai.tool_calls[0]["id"]),
    ]
    final = llm.invoke(messages)
    assert not final.tool_calls and "<answer>19</answer>" in final.content
    post_reward(1.0, base_url=server.url, episode_id="lc-1")
    [recorded] = RunDir(run).trajectories(0)

    engine = RolloutEngine(
        ScriptedBackend(tok, SCRIPT), tok, RolloutConfig(max_turns=4, max_context_tokens=4096)
    )
    env = lambda: ToolEnv([from_langchain(calculator)], system_prompt=SYSTEM)  # noqa: E731
    [reference] = engine.run_groups(env, [TASK], 1)[0].trajectories
    assert [t.prompt_ids for t in recorded.turns] == [t.prompt_ids for t in reference.turns]
    assert [t.action_ids for t in recorded.turns] == [t.action_ids for t in reference.turns]


def test_flowgrpo_serve_record_on_the_command_line_writes_the_episode(tmp_path):
    """``flowgrpo serve --record RUN_DIR`` end to end: a process of its own on a free loopback port."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "flowgrpo", "serve", "--model", "tiny", "--port", "0", "--device", "cpu",
         "--record", str(tmp_path), "--max-episode-turns", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = None
        for line in proc.stdout:  # "flowgrpo serve: tiny at http://127.0.0.1:PORT/v1"
            if " at http" in line:
                url = line.split(" at ", 1)[1].strip()
                break
        assert url is not None, "the server never said where it listens"
        client = openai.OpenAI(base_url=url, api_key="unused", default_headers={"X-Episode-Id": "cli-1"})
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK.prompt}]
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5)
        post_reward(1.0, {"accuracy": 1.0}, base_url=url, episode_id="cli-1")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    [traj] = RunDir(tmp_path).trajectories(0)
    assert traj.reward == 1.0 and traj.reward_breakdown == {"accuracy": 1.0}
    assert traj.turns[0].action_ids == r.choices[0].model_extra["token_ids"]
