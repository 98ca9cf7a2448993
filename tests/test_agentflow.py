"""The flow agent (agent.kind: flow): parsing, memory cap, the episode loop's endings, training
rows (only planner tokens), and one RL step end to end."""

from __future__ import annotations

import asyncio

import pytest
import torch

from flowgrpo.chat.format import ChatFormat
from flowgrpo.config import ConfigError, TrainConfig, load_config
from flowgrpo.env import make
from flowgrpo.modeling.models import tiny_tokenizer
from flowgrpo.rewards import CompositeReward, RewardSpec
from flowgrpo.rollout.agentflow import (
    AgentConfig,
    FlowAgent,
    Memory,
    ModuleReply,
    Prompts,
    parse_plan,
    parse_verdict,
)
from flowgrpo.rollout.backends.base import GenerationResult
from flowgrpo.rollout.engine import RolloutConfig
from flowgrpo.runs.replay import format_trajectory
from flowgrpo.runs.report import trajectory_html
from flowgrpo.training.batching import build_rows
from flowgrpo.types import Termination, Trajectory, TrajectoryGroup

pytestmark = pytest.mark.usefixtures("one_thread")


def test_parse_plan_and_verdict():
    text = "Sub-goal: add 20 and 59\nmore words\nTool: Calculator"
    assert parse_plan(text, ["calculator"]) == ("add 20 and 59 more words", "calculator")
    assert parse_plan("Sub-goal: x\nTool name: **web_search**", ["web_search"]) == ("x", "web_search")
    assert parse_plan("Sub-goal: x\nTool: hammer", ["calculator"]) == ("x", None)
    assert parse_plan("no format at all", ["calculator"]) == ("", None)
    assert parse_verdict("Conclusion: STOP") == "STOP"
    assert parse_verdict("we could stop.. Conclusion: CONTINUE") == "CONTINUE"
    assert parse_verdict("Conclusion: maybe, stop here") == "STOP"  # AgentFlow's fallback: 'stop' anywhere
    assert parse_verdict("Conclusion: unsure") == "CONTINUE"


def test_memory_cap_drops_oldest_then_cuts_the_newest():
    def enc(s):
        return [ord(c) for c in s]  # one token per character: lengths are countable by hand

    def dec(ids):
        return "".join(map(chr, ids))

    m = Memory(enc, dec, max_tokens=10_000, result_max_chars=10)
    assert m.render() == "(none yet)"
    r = m.add(1, "g", "t", "c", "abcdefghijklmnop")
    assert r.result == "abcdef ..."  # rule 1: 10 characters, the cut marked
    block1 = "Step 1:\n  Sub-goal: g\n  Tool: t\n  Command: c\n  Result: abcdef ..."
    assert m.render() == block1
    m.add(2, "h", "t", "c", "ok")
    block2 = "Step 2:\n  Sub-goal: h\n  Tool: t\n  Command: c\n  Result: ok"
    assert m.render() == block1 + "\n" + block2
    m.max_tokens = len(block1) + len(block2)  # both blocks fit, not with the newline between them
    assert m.render() == "(1 earlier steps omitted)\n" + block2  # rule 2
    m.max_tokens = 20
    assert m.render() == block2[:20]  # rule 3: the newest record cut to the cap
    assert [d["step"] for d in m.snapshot()] == [1, 2]


def test_config_default_is_the_tool_agent_and_prompts_are_checked():
    assert TrainConfig().agent.kind == "tool"
    cfg = load_config(None, ["agent.kind=flow", "agent.max_steps=2", "agent.executor.source=reference"])
    assert cfg.agent.kind == "flow" and cfg.agent.executor.source == "reference"
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(None, ['agent.prompts.planner="Q {question}"'])
    with pytest.raises(ConfigError, match=r"server\.base_url"):
        load_config(None, ["agent.verifier.source=server"])
    with pytest.raises(ConfigError, match="did you mean"):
        load_config(None, ["agent.max_step=2"])


class Scripted:
    """A frozen module that replies with fixed texts in turn (its prefix is part of the text)."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.prompts: list[str] = []

    async def reply(self, system: str, user: str, prefix: str) -> ModuleReply:
        self.prompts.append(user)
        text = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
        return ModuleReply(text=text, prompt_tokens=7, new_tokens=3)


def planner_actor(chat: ChatFormat, *texts: str):
    """The planner's actions as the rollout engine would return them: the text's ids + end of turn."""
    left = list(texts)

    async def act(ids, limit, conv):
        text = left.pop(0) if len(left) > 1 else left[0]
        out = [*chat.encode(text), chat.end_of_turn_ids[0]]
        return GenerationResult(token_ids=out, logprobs=[-0.5] * len(out), finish_reason="stop")

    return act


def run_flow(agent_cfg: AgentConfig, plans, executor, verifier, generator, task_index=0):
    tok = tiny_tokenizer()
    env = make("arithmetic")
    task = env.tasks("train")[task_index]
    agent = FlowAgent(agent_cfg, tok, executor=executor, verifier=verifier, generator=generator)
    traj = Trajectory(task_id=task.id, env=env.name)
    act = planner_actor(agent.chat, *plans)
    asyncio.run(agent.run_episode(env, task, act, traj, RolloutConfig(max_context_tokens=8192)))
    return traj, task


def test_flow_episode_verifier_stops_and_generator_answers():
    tok_env = make("arithmetic")
    task = tok_env.tasks("train")[0]
    gold = task.answer
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "' + gold + '"}}</tool_call>'
    executor = Scripted(call)
    verifier = Scripted("Conclusion: CONTINUE", "Conclusion: STOP")
    generator = Scripted(f"<answer>{gold}</answer>")
    plans = ["Sub-goal: compute it\nTool: calculator"]
    traj, task = run_flow(AgentConfig(kind="flow", max_steps=4), plans, executor, verifier, generator)
    assert traj.termination == Termination.verifier_stop
    assert len(traj.turns) == 2 and all(t.resets_context for t in traj.turns)
    t0 = traj.turns[0]
    assert [(m.role, m.name) for m in t0.observations] == [
        ("assistant", "executor"),
        ("tool", "calculator"),
        ("assistant", "verifier"),
    ]
    assert t0.observations[1].content.strip() == gold  # the real calculator ran the executor's call
    # each planner prompt is rebuilt from q, K, M: the second one holds step 1's record
    assert "Step 1:" not in traj.turns[0].metadata["flow"]["memory_in"]
    assert "Step 1:" in traj.turns[1].metadata["flow"]["memory_in"]
    assert traj.turns[1].metadata["flow"]["memory"][0]["verdict"] == "CONTINUE"
    assert traj.turns[1].metadata["flow"]["memory"][1]["verdict"] == "STOP"
    # the generator's answer is the trajectory's final message, and the env checked it
    assert traj.final_message.name == "generator"
    assert traj.metadata["flow"]["answer"] == gold and traj.metadata["flow"]["info"]["correct"] is True
    assert traj.metadata["flow"]["module_tokens"] == {"executor": 20, "verifier": 20, "generator": 10}
    group = TrajectoryGroup(task=task, trajectories=[traj])
    CompositeReward([RewardSpec(name="accuracy")]).score_groups([group])
    assert traj.reward == 1.0
    # training rows: one per planner turn, the loss mask exactly on the planner's sampled tokens
    for t in traj.turns:
        t.advantage = 0.5
    rows = build_rows([traj])
    assert len(rows) == 2
    for row, turn in zip(rows, traj.turns, strict=True):
        assert row.input_ids == turn.prompt_ids + turn.action_ids
        assert sum(row.loss_mask) == len(turn.action_ids)
        assert row.input_ids[-len(turn.action_ids) :] == turn.action_ids
    # replay and the HTML report show each module's input and output and the memory
    text = format_trajectory(traj)
    for part in ("[executor input]", "[verifier output]", "[generator output]", "[memory after this step]"):
        assert part in text
    assert "memory after this step" in trajectory_html(traj, None, scale=1.0)


def test_flow_episode_endings():
    gen = Scripted("<answer>1</answer>")
    # max_steps reached: the generator still answers
    traj, _ = run_flow(
        AgentConfig(kind="flow", max_steps=2),
        ["Sub-goal: x\nTool: calculator"],
        Scripted('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'),
        Scripted("Conclusion: CONTINUE"),
        gen,
    )
    assert traj.termination == Termination.max_turns and len(traj.turns) == 2
    assert traj.final_message.content == "<answer>1</answer>"
    # a plan naming no known tool runs no command; the failure is in memory, not an exception
    executor = Scripted("never used")
    traj, _ = run_flow(
        AgentConfig(kind="flow", max_steps=1), ["Sub-goal: x\nTool: hammer"], executor, Scripted("STOP"), gen
    )
    assert executor.prompts == [] and traj.termination == Termination.verifier_stop
    assert "no known tool" in traj.turns[0].metadata["flow"]["memory"][0]["result"]
    # a planner prompt that does not fit the context: no turn at all
    tok = tiny_tokenizer()
    env = make("arithmetic")
    agent = FlowAgent(AgentConfig(kind="flow"), tok, executor=gen, verifier=gen, generator=gen)
    traj = Trajectory()
    asyncio.run(
        agent.run_episode(
            env,
            env.tasks("train")[0],
            planner_actor(agent.chat, "x"),
            traj,
            RolloutConfig(max_context_tokens=8),
        )
    )
    assert traj.termination == Termination.context_overflow and traj.turns == []


def test_prompt_override_reaches_the_module():
    prompts = Prompts(verifier="Is this enough for {query}? {memory}")
    verifier = Scripted("STOP")
    run_flow(
        AgentConfig(kind="flow", max_steps=1, prompts=prompts),
        ["Sub-goal: x\nTool: hammer"],
        Scripted("-"),
        verifier,
        Scripted("<answer>1</answer>"),
    )
    assert verifier.prompts[0].startswith("Is this enough for ")


def test_tiny_model_one_rl_step_trains_only_planner_tokens(tmp_path):
    """rollout -> reward -> advantages -> update with the tiny model; every module is the policy."""
    from flowgrpo.training.trainer import Trainer

    cfg = load_config(
        None,
        [
            "model.name=tiny",
            "env.name=arithmetic",
            "agent.kind=flow",
            "agent.max_steps=2",
            "agent.executor.max_new_tokens=6",
            "agent.verifier.max_new_tokens=3",
            "agent.generator.max_new_tokens=3",
            "agent.memory_max_tokens=64",
            "agent.result_max_chars=32",
            "rollout.max_new_tokens=6",
            "rollout.sampling.temperature=1.0",
            "train.tasks_per_step=1",
            "train.group_size=2",
            "train.steps=1",
            "train.drop_zero_variance_groups=false",
            "algorithm.kl_coef=0.01",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
        ],
    )
    trainer = Trainer(cfg)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    groups = trainer._rollout(1)
    trajs = [t for g in groups for t in g.trajectories]
    assert all(t.termination != Termination.error for t in trajs), [t.metadata.get("error") for t in trajs]
    assert all(t.turns and all(turn.resets_context for turn in t.turns) for t in trajs)
    assert all(turn.advantage is not None for t in trajs for turn in t.turns)
    for t in trajs:  # every planner turn carries its trajectory's advantage
        assert len({turn.advantage for turn in t.turns}) == 1
    for t in trajs:  # make the group's outcomes differ so the update has a signal
        for turn in t.turns:
            turn.advantage = 1.0 if t is trajs[0] else -1.0
    m = trainer.update(trajs)
    assert m["optimizer_steps"] == 1.0
    assert m["train_tokens"] == sum(len(turn.action_ids) for t in trajs for turn in t.turns)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("env_name", ["arithmetic", "multihop"])
def test_embedded_model_flow_rl_step(tmp_path, env_name):
    """SmolLM2-135M as planner (trained) and as executor, verifier and generator (the policy under
    no_grad): rollout -> reward -> advantages -> update, then replay shows every module."""
    from flowgrpo.training.trainer import Trainer

    cfg = load_config(
        None,
        [
            "model.name=smollm2-135m",
            f"env.name={env_name}",
            "agent.kind=flow",
            "agent.max_steps=2",
            "agent.executor.max_new_tokens=48",
            "agent.verifier.max_new_tokens=4",
            "agent.generator.max_new_tokens=16",
            "rollout.max_new_tokens=32",
            "rollout.sampling.temperature=1.0",
            "train.tasks_per_step=1",
            "train.group_size=2",
            "train.steps=1",
            "train.lr=1e-5",
            "train.drop_zero_variance_groups=false",
            "algorithm.kl_coef=0.01",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
        ],
    )
    trainer = Trainer(cfg)
    m = trainer.train_step()
    from flowgrpo.runs.store import read_trajectories

    trajs = [t for f in sorted((tmp_path / "trajectories").glob("*.jsonl")) for t in read_trajectories(f)]
    assert len(trajs) == 2 and all(t.termination != Termination.error for t in trajs)
    assert all(turn.resets_context and turn.advantage is not None for t in trajs for turn in t.turns)
    assert m["optimizer_steps"] == 1.0
    assert m["train_tokens"] == sum(len(turn.action_ids) for t in trajs for turn in t.turns)
    text = format_trajectory(trajs[0], trainer.tokenizer)
    assert "[planner output]" in text and "[memory after this step]" in text and "[generator output]" in text


@pytest.mark.parametrize("env_name", ["arithmetic", "multihop"])
def test_oracle_demonstrates_the_flow_format(env_name):
    """The warm start of the flow agent: the environment's oracle scripts every module of real flow
    episodes; planner turns are exact-token trajectories, the policy-served modules' replies become
    one-turn trajectories whose prompts end with the module's prefix."""
    from flowgrpo import components
    from flowgrpo.training import sft

    cfg = load_config(
        None,
        [
            "model.name=tiny",
            f"env.name={env_name}",
            "agent.kind=flow",
            "agent.generator.source=reference",  # not the policy: its replies are not the policy's to learn
            "rollout.max_new_tokens=64",
            "run.progress=false",
        ],
    )
    parts = components.build(cfg)
    demos = sft.demonstrations(parts, 6)
    tok = parts.tokenizer
    assert [t.reward for t in demos] == [1.0] * 6  # the oracle's answers are right
    for t in demos:
        assert t.termination == Termination.verifier_stop
        verdicts = [turn.metadata["flow"]["verifier"]["verdict"] for turn in t.turns]
        assert verdicts == ["CONTINUE"] * (len(t.turns) - 1) + ["STOP"]  # stop once the answer is found
        for turn in t.turns:
            assert turn.resets_context and turn.action_ids[-1] in ChatFormat(tok).end_of_turn_ids
            tools = [x.name for x in parts.probe_env.tools]
            goal, tool = parse_plan(Prompts().planner_prefix + tok.decode(turn.action_ids[:-1]), tools)
            assert goal and tool == tools[0]
        assert t.metadata["flow"]["answer"] is not None
    if env_name == "multihop":  # chains of 1 to 3 hops: one search each
        assert {len(t.turns) for t in demos} > {1}
    rows = sft.module_rows(parts, demos)
    turns = sum(len(t.turns) for t in demos)
    assert [r.metadata["module"] for r in rows].count("executor") == turns
    assert [r.metadata["module"] for r in rows].count("verifier") == turns
    assert "generator" not in {r.metadata["module"] for r in rows}
    for r in rows:
        [turn] = r.turns
        prefix = (
            Prompts().executor_prefix if r.metadata["module"] == "executor" else Prompts().verifier_prefix
        )
        assert tok.decode(turn.prompt_ids).endswith("assistant\n" + prefix)
        assert prefix + tok.decode(turn.action_ids[:-1]) == turn.action.content
    assert rows[1].turns[0].action.content in ("Conclusion: STOP", "Conclusion: CONTINUE")
    hist = sft.supervised_epochs(parts, sft.successful(demos + rows), epochs=1)
    assert hist[0]["tokens"] == sum(len(turn.action_ids) for t in demos + rows for turn in t.turns)
