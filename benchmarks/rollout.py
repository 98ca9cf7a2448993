"""Rollout speed on this machine: our engine vs bare ``model.generate``, and async tool overlap.

Run: ``python benchmarks/rollout.py [--n 16] [--new 64] [--threads 2]`` (a couple of minutes on 2 cores).
Figures are printed, never asserted: this machine is shared and noisy (quote ratios).

1. Single turn: the same N chat prompts, same batch size, the same precision (bf16 autocast over fp32
   weights where bf16 is native, else fp32), sampled
   at temperature 1. Bare ``model.generate`` keeps every row decoding until the longest ends; our
   loop drops finished rows. Useful tokens/s counts tokens up to and including the stop token.
2. Multi-turn: N episodes x T turns with a tool that sleeps 200 ms after every action, batch size
   N/2. "Waves" = every episode's turn in lock-step (generate the whole wave in batches, then run
   all tools concurrently, then the next wave); the engine instead lets the tools of one batch run
   while the next batch decodes.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from flowgrpo.backends.base import SamplingParams
from flowgrpo.backends.hf import HFBackend
from flowgrpo.chat import ChatFormat
from flowgrpo.env import StepResult
from flowgrpo.hardware import resolve_autocast
from flowgrpo.logprobs import autocast_context
from flowgrpo.models import load_model
from flowgrpo.rollout import RolloutConfig, RolloutEngine
from flowgrpo.types import Message, ParsedAction, Task

# bf16 autocast only where bf16 matmuls are native (AVX512-BF16/AMX/CUDA); fp32 elsewhere, on both sides.
AUTOCAST = resolve_autocast("auto", "cpu")

QUESTIONS = [
    "What is 17 + 25?",
    "Name a primary colour.",
    "Write one sentence about the sea.",
    "What is 9 times 8?",
    "Give a synonym of quick.",
    "Who wrote Hamlet?",
    "What is the capital of France?",
    "Count from 1 to 5.",
]


class _Parser:
    def parse(self, text: str) -> ParsedAction:
        return ParsedAction(message=Message(role="assistant", content=text))

    def format_instructions(self, tools) -> str:
        return ""


class SleepEnv:
    """Every action gets a 200 ms 'tool' observation; never finishes (runs to max_turns)."""

    name = "sleep"
    tools: list = []
    parser = _Parser()
    system_prompt = "You are a helpful assistant."

    def __init__(self, sleep_s: float = 0.2, single_turn: bool = False) -> None:
        self.sleep_s, self.single_turn = sleep_s, single_turn

    async def reset(self, task: Task) -> list[Message]:
        return [Message(role="system", content=self.system_prompt), Message(role="user", content=task.prompt)]

    async def step(self, action: ParsedAction) -> StepResult:
        if self.single_turn:
            return StepResult(terminated=True)
        await asyncio.sleep(self.sleep_s)
        return StepResult(observations=[Message(role="user", content="Tool says: 42. Continue.")])

    def tasks(self, split):
        return []


def useful(ids, stop):
    return ids.index(stop) + 1 if stop in ids else len(ids)


def bench_single(model, tok, n, new):
    chat = ChatFormat(tok)
    prompts = [
        chat.initial_ids(
            chat.prompt_messages([Message(role="user", content=QUESTIONS[i % 8])], SleepEnv.system_prompt)
        )
        for i in range(n)
    ]
    stop = tok.eos_token_id
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (ids != -1).long()
    for i, p in enumerate(prompts):
        mask[i, : width - len(p)] = 0
    out = {}
    for rep in range(2):
        torch.manual_seed(rep)
        t0 = time.perf_counter()
        with torch.inference_mode(), autocast_context(AUTOCAST):
            g = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                eos_token_id=stop,
                pad_token_id=tok.pad_token_id,
            )
        dt = time.perf_counter() - t0
        toks = sum(useful(r[width:].tolist(), stop) for r in g)
        out.setdefault("generate", []).append((toks, dt, g.shape[1] - width))

        backend = HFBackend(model, tok, max_batch_size=n, autocast_dtype=AUTOCAST)
        eng = RolloutEngine(
            backend,
            tok,
            RolloutConfig(
                max_turns=1, max_new_tokens=new, sampling=SamplingParams(temperature=1.0, seed=rep)
            ),
        )
        tasks = [Task(id=str(i), prompt=QUESTIONS[i % 8]) for i in range(n)]
        t0 = time.perf_counter()
        groups = eng.run_groups(lambda: SleepEnv(single_turn=True), tasks, group_size=1)
        dt = time.perf_counter() - t0
        toks = sum(t.num_action_tokens for g in groups for t in g.trajectories)
        out.setdefault("engine", []).append((toks, dt, backend.stats["decode_steps"]))
    print(
        f"\n== single turn: {n} prompts, batch {n}, <= {new} new tokens, autocast {AUTOCAST or 'off (fp32)'}, T=1.0 =="
    )
    best = {}
    for k, runs in out.items():
        rates = [t / d for t, d, _ in runs]
        best[k] = max(rates)
        print(f"{k:>9}: " + ", ".join(f"{t} tok in {d:.2f}s = {t / d:.1f} tok/s" for t, d, _ in runs))
    print(f"engine / generate (best of 2): {best['engine'] / best['generate']:.2f}x")


def bench_multi(model, tok, n, new, turns, sleep_s):
    cfg = RolloutConfig(
        max_turns=turns,
        max_new_tokens=new,
        max_context_tokens=4096,
        sampling=SamplingParams(temperature=1.0, seed=0),
    )
    tasks = [Task(id=str(i), prompt=QUESTIONS[i % 8]) for i in range(n)]
    bs = max(1, n // 2)

    backend = HFBackend(model, tok, max_batch_size=bs, autocast_dtype=AUTOCAST)
    eng = RolloutEngine(backend, tok, cfg.model_copy(update={"max_batch_size": bs}))
    t0 = time.perf_counter()
    groups = eng.run_groups(lambda: SleepEnv(sleep_s), tasks, group_size=1)
    t_engine = time.perf_counter() - t0
    tok_engine = sum(t.num_action_tokens for g in groups for t in g.trajectories)

    # lock-step waves with the same backend and batch size
    async def waves():
        envs = [SleepEnv(sleep_s) for _ in tasks]
        chat = ChatFormat(tok)
        hist = [
            chat.prompt_messages(await e.reset(t), e.system_prompt) for e, t in zip(envs, tasks, strict=True)
        ]
        ctx = [chat.initial_ids(h) for h in hist]
        total = 0
        params = cfg.sampling.model_copy(
            update={"max_new_tokens": new, "stop_token_ids": chat.end_of_turn_ids}
        )
        for _ in range(turns):
            res = []
            for s in range(0, n, bs):
                res += await backend.generate(ctx[s : s + bs], params)
            total += sum(len(r.token_ids) for r in res)
            steps = await asyncio.gather(
                *(e.step(ParsedAction(message=Message(role="assistant", content="x"))) for e in envs)
            )
            for i, (r, st) in enumerate(zip(res, steps, strict=True)):
                delta = chat.observation_delta(hist[i], r.token_ids, st.observations)
                hist[i] = [
                    *hist[i],
                    Message(role="assistant", content=tok.decode(r.token_ids)),
                    *st.observations,
                ]
                ctx[i] = ctx[i] + r.token_ids + delta
        return total

    t0 = time.perf_counter()
    tok_waves = asyncio.run(waves())
    t_waves = time.perf_counter() - t0
    print(
        f"\n== multi-turn: {n} episodes x {turns} turns, tool sleeps {sleep_s * 1000:.0f} ms, batch {bs}, "
        f"<= {new} new tokens/turn =="
    )
    print(
        f"   engine: {tok_engine} tok in {t_engine:.2f}s = {tok_engine / t_engine:.1f} tok/s "
        f"(batches {eng.last_batch_sizes})"
    )
    print(f"    waves: {tok_waves} tok in {t_waves:.2f}s = {tok_waves / t_waves:.1f} tok/s")
    print(f"engine speed-up over waves (tok/s): {(tok_engine / t_engine) / (tok_waves / t_waves):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--multi-new", type=int, default=16)
    ap.add_argument("--sleep", type=float, default=0.2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-single", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load_model("smollm2-135m")
    model.eval()
    if not a.skip_single:
        bench_single(model, tok, a.n, a.new)
    bench_multi(model, tok, a.n, a.multi_new, a.turns, a.sleep)


if __name__ == "__main__":
    main()
