"""Rollout engine tests: exact token bookkeeping, limits, errors, batching, text policies.

A scripted environment (one ``add`` tool, a tiny Hermes-style parser) implements the Environment
protocol directly, and a scripted policy backend says fixed text per turn, so the expected token
ids can be computed by hand from the chat template. The real HF backend over a tiny random model
runs the same loop end to end.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Sequence

from pydantic import BaseModel

from flowgrpo.env import BaseEnvironment, StepResult
from flowgrpo.tool import execute_tool_calls
from flowgrpo.types import Message, ParsedAction, Task, ToolCall
from tests.stand_ins import ScriptedBackend

SYSTEM = "You add numbers with the add tool."


class AddArgs(BaseModel):
    a: int
    b: int


class AddTool:
    name = "add"
    description = "Add two integers."
    args_schema = AddArgs
    timeout_s: float | None = 5.0

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s

    async def run(self, args: AddArgs) -> str:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return str(args.a + args.b)


class TinyParser:
    """``<tool_call>{json}</tool_call>`` calls and an ``<answer>...</answer>`` final answer."""

    def parse(self, text: str) -> ParsedAction:
        calls, errors = [], []
        for i, m in enumerate(re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.S)):
            try:
                d = json.loads(m.group(1))
                calls.append(ToolCall(id=f"call_{i}", name=d["name"], arguments=d.get("arguments", {})))
            except (ValueError, KeyError) as e:
                errors.append(f"bad tool call: {e}")
        ans = re.findall(r"<answer>(.*?)</answer>", text, re.S)
        msg = Message(role="assistant", content=text, tool_calls=calls)
        return ParsedAction(message=msg, answer=ans[-1].strip() if ans else None, errors=errors)

    def format_instructions(self, tools: Sequence) -> str:
        names = ", ".join(t.name for t in tools)
        return f'Call tools as <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>. Tools: {names}.'


class AddEnv(BaseEnvironment):
    """Answer ``a + b``; every non-final step returns the tool results (or a nudge)."""

    name = "add"

    def __init__(
        self, *, fail_on_step: bool = False, delay_s: float = 0.0, never_finish: bool = False
    ) -> None:
        self.tools = [AddTool(delay_s)]
        self.parser = TinyParser()
        self.system_prompt = SYSTEM
        self.fail_on_step = fail_on_step
        self.never_finish = never_finish

    async def reset(self, task: Task) -> list[Message]:
        return [Message(role="system", content=SYSTEM), Message(role="user", content=task.prompt)]

    async def step(self, action: ParsedAction) -> StepResult:
        if self.fail_on_step:
            raise RuntimeError("scripted env failure")
        if action.answer is not None and not self.never_finish:
            return StepResult(terminated=True, reward=1.0)
        obs = await execute_tool_calls({t.name: t for t in self.tools}, action.message.tool_calls)
        obs += [Message(role="user", content=e) for e in action.errors]
        if not obs:
            obs = [Message(role="user", content="Call a tool or answer.")]
        return StepResult(observations=obs)

    def tasks(self, split: str) -> list[Task]:
        return [Task(id=f"{split}-0", prompt="What is 2 + 3?", answer="5")]


CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
ANSWER = "<answer>5</answer>"


# ------------------------------------------------------------------------------------ tests
import pytest  # noqa: E402
import torch  # noqa: E402

from flowgrpo.chat.format import ChatFormat  # noqa: E402
from flowgrpo.modeling.logprobs import common_prefix_len  # noqa: E402
from flowgrpo.modeling.models import tiny_model, tiny_tokenizer  # noqa: E402
from flowgrpo.rollout.backends.hf import HFBackend  # noqa: E402
from flowgrpo.rollout.engine import RolloutConfig, RolloutEngine, run_text_policy  # noqa: E402
from flowgrpo.types import Termination  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _engine(backend, tok, **cfg):
    return RolloutEngine(backend, tok, RolloutConfig(**cfg))


def _task(i=0):
    return Task(id=f"t{i}", prompt=f"What is 2 + 3? ({i})", answer="5")


def test_ids_are_exactly_what_was_fed_and_sampled(tok):
    be = ScriptedBackend(tok, [CALL, ANSWER])
    [group] = _engine(be, tok).run_groups(AddEnv, [_task()], group_size=2)
    assert len(group.trajectories) == 2
    for traj in group.trajectories:
        assert traj.termination == Termination.finished
        assert [t.action.content for t in traj.turns] == [CALL, ANSWER]
        assert traj.turns[0].action.tool_calls[0].name == "add"
        assert traj.turns[0].observations[0].content == "5"
        assert traj.turns[1].action_logprobs == [-0.25] * len(traj.turns[1].action_ids)
    # every prompt the backend saw is the trajectory's context, every result its action
    fed = [(p, r) for prompts, results in be.calls for p, r in zip(prompts, results, strict=True)]
    assert len(fed) == 4
    for traj in group.trajectories:
        for k, turn in enumerate(traj.turns):
            ctx = traj.context_ids(k)
            matches = [r for p, r in fed if p == ctx]
            assert matches and matches[0].token_ids == turn.action_ids


def test_decoded_tokens_equal_the_rendered_conversation(tok):
    be = ScriptedBackend(tok, [CALL, ANSWER])
    [group] = _engine(be, tok).run_groups(AddEnv, [_task()], group_size=1)
    traj = group.trajectories[0]
    all_ids = traj.context_ids(1) + traj.turns[1].action_ids
    expected = (
        f"<|im_start|>system\n{SYSTEM}\n\n"
        + TinyParser().format_instructions([AddTool()])
        + "<|im_end|>\n<|im_start|>user\nWhat is 2 + 3? (0)<|im_end|>\n"
        + f"<|im_start|>assistant\n{CALL}<|im_end|>\n"
        + "<|im_start|>tool\n5<|im_end|>\n"
        + f"<|im_start|>assistant\n{ANSWER}<|im_end|>"
    )
    assert tok.decode(all_ids, skip_special_tokens=False) == expected
    # the stop token is sampled once, never duplicated by the template's tail
    assert (
        traj.turns[1].prompt_ids[: len(tok("\n", add_special_tokens=False)["input_ids"])]
        == tok("\n", add_special_tokens=False)["input_ids"]
    )


def test_only_sampled_tokens_are_marked_for_loss(tok):
    be = ScriptedBackend(tok, [CALL, CALL, ANSWER])
    [group] = _engine(be, tok).run_groups(AddEnv, [_task()], group_size=1)
    traj = group.trajectories[0]
    ids, mask = [], []
    for t in traj.turns:
        ids += t.prompt_ids + t.action_ids
        mask += [0] * len(t.prompt_ids) + [1] * len(t.action_ids)
    sampled = [r.token_ids for _, results in be.calls for r in results]
    marked, run = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            run.append(i)
        elif run:
            marked.append(run)
            run = []
    marked.append(run)
    assert marked == sampled
    assert sum(mask) == traj.num_action_tokens == sum(len(s) for s in sampled)


def test_limits_give_their_terminations(tok):
    # max_turns: the env never finishes
    be = ScriptedBackend(tok, [CALL])
    [g] = _engine(be, tok, max_turns=3).run_groups(lambda: AddEnv(never_finish=True), [_task()], 1)
    assert g.trajectories[0].termination == Termination.max_turns and len(g.trajectories[0].turns) == 3
    # max_tokens: the action is cut by the per-turn limit
    be = ScriptedBackend(tok, [CALL])
    [g] = _engine(be, tok, max_new_tokens=5).run_groups(AddEnv, [_task()], 1)
    t = g.trajectories[0]
    assert t.termination == Termination.max_tokens and len(t.turns[0].action_ids) == 5
    assert t.turns[0].finish_reason == "length"
    # context_overflow: the observation would not fit
    be = ScriptedBackend(tok, [CALL, ANSWER])
    first = len(_first_prompt(tok))
    call_len = len(tok(CALL, add_special_tokens=False)["input_ids"]) + 1
    [g] = _engine(be, tok, max_context_tokens=first + call_len + 3).run_groups(AddEnv, [_task()], 1)
    t = g.trajectories[0]
    assert t.termination == Termination.context_overflow and len(t.turns) == 1
    assert t.turns[0].observations[0].content == "5"
    # context_overflow: the prompt itself does not fit
    [g] = _engine(be, tok, max_context_tokens=first).run_groups(AddEnv, [_task()], 1)
    assert g.trajectories[0].termination == Termination.context_overflow and g.trajectories[0].turns == []
    # context_overflow: generation capped by the room left in the context
    [g] = _engine(ScriptedBackend(tok, [CALL]), tok, max_context_tokens=first + 4).run_groups(
        AddEnv, [_task()], 1
    )
    t = g.trajectories[0]
    assert t.termination == Termination.context_overflow and len(t.turns[0].action_ids) == 4


def _first_prompt(tok):
    env = AddEnv()
    chat = ChatFormat(tok, tools=env.tools, parser=env.parser)
    msgs = chat.prompt_messages(asyncio.run(env.reset(_task())), SYSTEM)
    return chat.initial_ids(msgs)


def test_a_failing_env_ends_only_its_episode(tok):
    made = []

    def factory():
        env = AddEnv(fail_on_step=len(made) == 1)
        made.append(env)
        return env

    be = ScriptedBackend(tok, [CALL, ANSWER])
    [g] = _engine(be, tok).run_groups(factory, [_task()], group_size=3)
    terms = [t.termination for t in g.trajectories]
    assert terms == [Termination.finished, Termination.error, Termination.finished]
    assert "scripted env failure" in g.trajectories[1].metadata["error"]
    assert len(g.trajectories[1].turns) == 1  # the action that triggered the failure is kept


def test_a_failing_backend_call_errors_the_episodes_of_that_batch(tok):
    class Boom(ScriptedBackend):
        async def generate(self, prompts, params, *, max_new_tokens=None):
            raise RuntimeError("backend down")

    [g] = _engine(Boom(tok, [CALL]), tok).run_groups(AddEnv, [_task()], group_size=2)
    assert all(t.termination == Termination.error for t in g.trajectories)
    assert "backend down" in g.trajectories[0].metadata["error"]


def test_groups_batch_generation_and_overlap_tool_latency(tok):
    be = ScriptedBackend(tok, [CALL, ANSWER])
    eng = _engine(be, tok, batch_wait_ms=50)
    groups = eng.run_groups(lambda: AddEnv(delay_s=0.05), [_task(0), _task(1), _task(2)], group_size=4)
    assert [g.task.id for g in groups] == ["t0", "t1", "t2"]
    assert all(len(g.trajectories) == 4 for g in groups)
    assert len({t.group_id for g in groups for t in g.trajectories}) == 3
    # all 12 episodes wait on generation together: two batched calls of 12, not 24 calls
    assert eng.last_batch_sizes == [12, 12]


def test_max_batch_size_splits_batches(tok):
    be = ScriptedBackend(tok, [ANSWER], max_batch_size=5)
    eng = _engine(be, tok)
    eng.run_groups(AddEnv, [_task()], group_size=12)
    assert eng.last_batch_sizes == [5, 5, 2]


def _assert_logprobs_are_the_models(model, traj) -> None:
    """Every turn's recorded logprobs are the model's own at the sampled ids (a fresh full pass)."""
    for k, turn in enumerate(traj.turns):
        ctx = torch.tensor([traj.context_ids(k) + turn.action_ids])
        with torch.no_grad():
            logits = model(ctx).logits[0, len(traj.context_ids(k)) - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(turn.action_ids)[:, None])[:, 0]
        assert torch.allclose(lp, torch.tensor(turn.action_logprobs), atol=1e-4)


def test_hf_backend_end_to_end_with_tiny_model(tok):
    model, tok2 = tiny_model(tok)
    be = HFBackend(model, tok2, max_batch_size=8)
    cfg = dict(max_turns=2, max_new_tokens=12, sampling={"temperature": 1.0, "seed": 3})
    model.train()
    groups = _engine(be, tok2, **cfg).run_groups(AddEnv, [_task(0), _task(1)], group_size=3)
    assert model.training  # generation restores the training mode
    for g in groups:
        for t in g.trajectories:
            assert t.termination in (Termination.max_tokens, Termination.max_turns, Termination.finished)
            _assert_logprobs_are_the_models(model, t)


class _Oracle:
    async def act(self, messages):
        return ANSWER if messages[-1].role == "tool" else CALL


def test_text_policy_gives_exact_ids_and_zero_logprobs(tok):
    [g] = run_text_policy(AddEnv, [_task()], _Oracle(), tok, RolloutConfig(), group_size=2)
    for t in g.trajectories:
        assert t.termination == Termination.finished
        assert t.turns[0].action_ids == tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert all(lp == 0.0 for turn in t.turns for lp in turn.action_logprobs)
        assert t.turns[1].action.content == ANSWER
    # same ids as the model-backend path with the same actions
    [g2] = _engine(ScriptedBackend(tok, [CALL, ANSWER]), tok).run_groups(AddEnv, [_task()], 1)
    t2 = g2.trajectories[0]
    assert [x.prompt_ids + x.action_ids for x in g.trajectories[0].turns] == [
        x.prompt_ids + x.action_ids for x in t2.turns
    ]


def test_continuous_scheduling_reuses_each_episodes_cache_across_turns(tok):
    model, tok2 = tiny_model(tok)
    be = HFBackend(model, tok2, max_batch_size=8)
    stops = list(range(len(tok2)))  # every token stops: one-token actions, so episodes run 3 turns
    cfg = dict(
        max_turns=3, max_new_tokens=4, sampling={"temperature": 1.0, "seed": 1, "stop_token_ids": stops}
    )
    eng = _engine(be, tok2, **cfg)
    groups = eng.run_groups(lambda: AddEnv(never_finish=True), [_task(0), _task(1)], group_size=3)
    trajs = [t for g in groups for t in g.trajectories]
    assert all(len(t.turns) == 3 and t.termination == Termination.max_turns for t in trajs)
    contexts = sum(len(t.context_ids(k)) for t in trajs for k in range(3))
    firsts = list({tuple(t.turns[0].prompt_ids) for t in trajs})
    root = min(common_prefix_len(firsts), min(map(len, firsts)) - 1)  # the system prompt they share
    assert len(firsts) == 2 and root >= be.min_shared_root
    # turn 1: the shared opening once, then the 2 distinct task prompts' rests (6 episodes); later
    # turns: only the new delta
    later = sum(len(turn.prompt_ids) for t in trajs for turn in t.turns[1:])
    first = root + sum(len(f) - root for f in firsts)
    assert be.stats["prefill_tokens"] == first + later + 6 * 2  # + each turn's last sampled token
    assert be.stats["prefix_hit_tokens"] > contexts / 2
    assert len(be.prefix_cache) == 0  # released when the rollout ended
    for t in trajs:
        _assert_logprobs_are_the_models(model, t)


def test_continuous_scheduling_sends_each_turn_alone_with_its_own_seed(tok):
    class Continuous(ScriptedBackend):
        continuous_batching = True

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.seeds: list[int] = []

        async def generate(self, prompts, params, *, max_new_tokens=None):
            self.seeds.append(params.seed)
            return await super().generate(prompts, params, max_new_tokens=max_new_tokens)

    be = Continuous(tok, [CALL, ANSWER])
    cfg = dict(sampling={"seed": 7})
    groups = _engine(be, tok, **cfg).run_groups(AddEnv, [_task(0), _task(1)], group_size=2)
    assert all(t.termination == Termination.finished for g in groups for t in g.trajectories)
    assert [len(p) for p, _ in be.calls] == [1] * 8  # 4 episodes x 2 turns, never collected
    assert len(set(be.seeds)) == 8
    static = ScriptedBackend(tok, [CALL, ANSWER])
    _engine(static, tok, scheduling="static", **cfg).run_groups(AddEnv, [_task(0), _task(1)], group_size=2)
    assert [len(p) for p, _ in static.calls] == [4, 4]


class _JitteryEnv(AddEnv):
    """Steps take 0-30 ms, drawn from the OS's entropy: no two runs share their timings."""

    async def step(self, action: ParsedAction) -> StepResult:
        await asyncio.sleep(random.SystemRandom().uniform(0.0, 0.03))
        return await super().step(action)


def _episode_tags(prompts: list[list[int]], tok) -> list[str]:
    """The ``(i)`` task tag each prompt carries, in call order."""
    return [re.search(r"\(\d\)", tok.decode(p)).group(0) for p in prompts]


def test_lockstep_waves_are_whole_and_in_episode_order_whatever_the_tools_take(tok):
    tasks = [_task(i) for i in range(4)]
    runs = []
    for _ in range(2):
        be = ScriptedBackend(tok, [CALL, CALL, ANSWER], max_batch_size=3)
        eng = _engine(be, tok, scheduling="lockstep", batch_wait_ms=0)
        groups = eng.run_groups(lambda: _JitteryEnv(delay_s=0.01), tasks, group_size=2)
        assert all(t.termination == Termination.finished for g in groups for t in g.trajectories)
        # 8 episodes, 3 turns each: every wave holds all 8, split 3 + 3 + 2 by max_batch_size
        assert eng.last_batch_sizes == [3, 3, 2] * 3
        waves = [[tag for p, _ in be.calls[w : w + 3] for tag in _episode_tags(p, tok)] for w in (0, 3, 6)]
        assert waves == [["(0)", "(0)", "(1)", "(1)", "(2)", "(2)", "(3)", "(3)"]] * 3
        runs.append([p for p, _ in be.calls])
    assert runs[0] == runs[1]


def test_lockstep_reruns_on_the_hf_backend_are_bit_exact_despite_jittery_tools(tok):
    model, tok2 = tiny_model(tok)
    stops = list(range(0, len(tok2), 7))  # actions of varied lengths, so rows retire at different steps
    cfg = dict(
        scheduling="lockstep",
        max_turns=3,
        max_new_tokens=6,
        sampling={"temperature": 1.0, "seed": 5, "stop_token_ids": stops},
    )
    runs = []
    for _ in range(2):
        be = HFBackend(model, tok2, max_batch_size=4)
        groups = _engine(be, tok2, **cfg).run_groups(
            lambda: _JitteryEnv(never_finish=True), [_task(0), _task(1), _task(2)], group_size=3
        )
        trajs = [t for g in groups for t in g.trajectories]
        runs.append(
            [(turn.prompt_ids, turn.action_ids, turn.action_logprobs) for t in trajs for turn in t.turns]
        )
    assert len({len(turns) for turns in runs}) == 1 and len(runs[0]) >= 9
    assert runs[0] == runs[1]  # every id and every float logprob equal
