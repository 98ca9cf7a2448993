"""examples/langchain_agent: the LangChain calculator agent's recorded episodes are token for token
what ToolEnv's would be for the same turns, and the example trains (a short run on the embedded
model with tiny settings)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from langchain_openai import ChatOpenAI

from flowgrpo.cli import main as cli_main
from flowgrpo.env import ToolEnv
from flowgrpo.gateway.client import post_reward
from flowgrpo.gateway.recorder import EpisodeRecorder
from flowgrpo.gateway.serve import make_server, serve_in_thread
from flowgrpo.modeling.models import tiny_tokenizer
from flowgrpo.rollout.engine import RolloutConfig, RolloutEngine
from flowgrpo.runs.rundir import RunDir
from flowgrpo.tool import from_langchain
from flowgrpo.types import Task
from tests.stand_ins import ScriptedBackend

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "langchain_agent"
TASK = Task(
    id="t-1", prompt="Ana has 12 apples. She buys 7 more. How many apples does Ana have now?", answer="19"
)
SCRIPT = [
    'Let me compute.\n<tool_call>{"name": "calculator", "arguments": {"expression": "12 + 7"}}</tool_call>',
    "It is 19.\n<answer>19</answer>",
]


def load_agent():
    spec = importlib.util.spec_from_file_location("langchain_agent_example", EXAMPLE / "agent.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_agents_episode_has_the_token_ids_tool_env_would_have(tmp_path):
    agent = load_agent()
    tok = tiny_tokenizer()
    server = make_server(ScriptedBackend(tok, SCRIPT), tok, recorder=EpisodeRecorder(tmp_path))
    serve_in_thread(server)
    try:
        llm = ChatOpenAI(
            base_url=f"{server.url}/episodes/ep-1/v1", api_key="unused", model="policy", max_retries=0
        )
        messages = agent.run_agent(llm, TASK.prompt)
        value, parts = agent.reward(messages, TASK.answer)
        assert parts == {"accuracy": 1.0, "format": 1.0} and value == 1.1
        assert messages[2].tool_calls and messages[3].content == "19"  # the real calculator ran
        post_reward(value, parts, base_url=server.url, episode_id="ep-1")
    finally:
        server.shutdown()
        server.server_close()
    [recorded] = RunDir(tmp_path).trajectories(0)

    engine = RolloutEngine(
        ScriptedBackend(tok, SCRIPT), tok, RolloutConfig(max_turns=3, max_context_tokens=4096)
    )
    env = lambda: ToolEnv([from_langchain(agent.calculator)], system_prompt=agent.SYSTEM_PROMPT)  # noqa: E731
    [reference] = engine.run_groups(env, [TASK], 1)[0].trajectories
    assert len(recorded.turns) == len(reference.turns) == 2
    for k, (mine, ref) in enumerate(zip(recorded.turns, reference.turns, strict=True)):
        assert mine.prompt_ids == ref.prompt_ids and mine.action_ids == ref.action_ids
        assert recorded.context_ids(k) == reference.context_ids(k)
    assert recorded.reward == 1.1 and recorded.reward_breakdown == parts


def test_the_example_trains_one_step_on_the_embedded_model(tmp_path):
    sets = [
        "train.steps=1",
        "train.tasks_per_step=2",
        "train.group_size=2",
        "train.drop_zero_variance_groups=false",
        "sft.enabled=false",
        "rollout.max_new_tokens=12",
        "rollout.max_turns=2",
        "rollout.gateway.env.AGENT_MAX_TURNS='2'",
        f"rollout.gateway.cwd={EXAMPLE.parents[1]}",
        "run.eval_every=0",
        "run.progress=false",
        "model.autocast=null",
        f"run.output_dir={tmp_path}",
    ]
    args = [
        "train",
        str(EXAMPLE / "config.yaml"),
        *[a for s in sets for a in ("--set", s)],
        "--eval-n",
        "0",
        "--no-report",
    ]
    assert cli_main(args) == 0
    trajs = RunDir(tmp_path).trajectories(1)
    assert len(trajs) == 4 and all(t.env == "gateway" and t.excluded is None for t in trajs)
    assert all(set(t.reward_breakdown) == {"accuracy", "format"} for t in trajs)  # the example's reward
    assert all(
        t.turns and all(len(u.action_ids) == len(u.action_logprobs) > 0 for u in t.turns) for t in trajs
    )
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(m["step"] == 1 and "loss" in m for m in metrics)  # the update ran on them
