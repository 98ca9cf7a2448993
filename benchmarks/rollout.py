"""Rollout speed on this machine: our engine vs bare ``model.generate``, and multi-turn vs lock-step waves.

Run: ``python benchmarks/rollout.py [--n 16] [--new 64] [--turns 3] [--multi-new 32] [--device cuda]`` (a few minutes
on 2 cores; ``--model tiny`` is the smoke test's random model). Figures are printed, never asserted.

1. Single turn: the same N distinct chat prompts, same batch size, the same precision (bf16 autocast
   over fp32 weights where bf16 is native, else fp32), sampled at temperature 1. Bare
   ``model.generate`` keeps every row decoding until the longest ends; our loop drops finished rows.
   Useful tokens/s counts tokens up to and including the stop token; median of ``--reps`` runs.
   Then the same prompts with every row decoding exactly ``--new`` tokens on both sides: ms per
   decode step, free of the run-to-run noise of how long sampled rows run.
2. Multi-turn: N episodes (N/G tasks x G, as GRPO samples them) x up to T turns with a tool that
   sleeps ``--sleep`` (default 200 ms; ``--jitter J``: a uniform draw in [sleep - J, sleep + J])
   after every action, at most ``--batch`` rows decoding at once (default N).
   ``--prompt agent`` (default) renders a real tool-using prompt (the arithmetic environment's system
   prompt and calculator description, ~220 tokens); ``--prompt short`` a one-line one. Every side
   follows the engine's rules: a turn cut by the token limit ends its episode, and an action ends at
   the end of its first sentence (so episodes really take several turns). Three ways to run the
   same episodes:

   - ``engine``: our rollout engine, continuous scheduling -- each turn joins the running batch the
     moment its tool returns, and each episode's keys/values are kept between its turns;
   - ``engine/lockstep``: the same engine with ``scheduling="lockstep"`` (every live episode's turn
     in one wave, issued when the last tool has returned; bit-exact reruns), to separate what the
     decode loop buys from what the scheduling buys;
   - ``waves/generate``: what a loop around ``model.generate`` does -- every live episode's turn in
     lock-step (generate the wave in batches, re-reading every context from scratch; then all tools
     concurrently; then the next wave).

   Samples differ between sides (different random streams), so episodes differ in length: compare
   turns/s and tokens/s, printed with the work each side did.
3. ``--precision``: the numeric modes side by side in one process, on the same prompts: where the
   sampler computes (the fp32 weights, the fp32 weights under bf16 autocast, a bf16 or fp16 copy)
   and where the update computes (fp32, or bf16 or loss-scaled fp16 autocast over fp32 master
   weights). Per mode: ms per decode step (every row decoding exactly ``--new`` tokens), single-turn
   tok/s, seconds per update (forward + backward + AdamW over ``--update-rows`` x ``--update-len``
   tokens, plus refreshing the copy), and the sampler/trainer ratio ``exp(trainer - sampler
   logprob)`` of the sampled tokens before any update (1 when they agree; what ``sampler_ratio_*``
   reports in training).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import torch

from flowgrpo.algorithms.loss import sampler_ratio_stats
from flowgrpo.chat.format import ChatFormat
from flowgrpo.env import BaseEnvironment, StepResult
from flowgrpo.modeling.hardware import cpu_flags, resolve_autocast
from flowgrpo.modeling.logprobs import action_logprobs, autocast_context
from flowgrpo.modeling.models import load_model, tiny_model
from flowgrpo.rollout.backends.base import SamplingParams
from flowgrpo.rollout.backends.hf import HFBackend
from flowgrpo.rollout.engine import RolloutConfig, RolloutEngine
from flowgrpo.training.loss_scale import loss_scale_for
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
    "What is the opposite of cold?",
    "Name a fruit that is yellow.",
    "How many legs does a spider have?",
    "What do bees make?",
    "Spell the word cat backwards.",
    "What is 100 minus 37?",
    "Name a planet in our solar system.",
    "What colour is the sky on a clear day?",
]


class _Parser:
    def parse(self, text: str) -> ParsedAction:
        return ParsedAction(message=Message(role="assistant", content=text))

    def format_instructions(self, tools) -> str:
        return ""


class SleepEnv(BaseEnvironment):
    """Every action gets a 'tool' observation after ``sleep_s`` (+- a uniform ``jitter_s``); never
    finishes (runs to max_turns).

    ``agent=True`` renders like a real tool-using agent: the ``arithmetic`` environment's system
    prompt, calculator tool description and parser (a ~220-token prompt), on its training problems.
    Otherwise a one-line system prompt and short questions.
    """

    name = "sleep"

    def __init__(
        self, sleep_s: float = 0.2, single_turn: bool = False, agent: bool = False, jitter_s: float = 0.0
    ) -> None:
        self.sleep_s, self.single_turn, self.jitter_s = sleep_s, single_turn, jitter_s
        self.tools: list = []
        self.parser = _Parser()
        self.system_prompt = "You are a helpful assistant."
        if agent:
            from flowgrpo.env import make

            real = make("arithmetic")
            self.tools, self.parser, self.system_prompt = list(real.tools), real.parser, real.system_prompt

    async def reset(self, task: Task) -> list[Message]:
        return [Message(role="system", content=self.system_prompt), Message(role="user", content=task.prompt)]

    async def step(self, action: ParsedAction) -> StepResult:
        if self.single_turn:
            return StepResult(terminated=True)
        await asyncio.sleep(max(0.0, self.sleep_s + random.uniform(-self.jitter_s, self.jitter_s)))
        return StepResult(observations=[Message(role="user", content="Tool says: 42. Continue.")])

    def tasks(self, split):
        return []


def _tasks(n: int, agent: bool = False) -> list[Task]:
    if agent:
        from flowgrpo.env import make

        return make("arithmetic").tasks("train")[:n]
    return [Task(id=str(i), prompt=QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]


def _generate(model, tok, prompts, new, stop_ids, fixed=False):
    """Bare ``model.generate`` on left-padded prompts; returns per row (useful ids, finish reason).
    ``fixed``: every row decodes exactly ``new`` tokens (stop ids ignored)."""
    width = max(map(len, prompts))
    dev = model.device
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + list(p) for p in prompts], device=dev)
    pad = torch.tensor([width - len(p) for p in prompts], device=dev)
    mask = (torch.arange(width, device=dev)[None, :] >= pad[:, None]).long()
    with torch.inference_mode(), autocast_context(AUTOCAST):
        g = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_token_id=list(stop_ids),
            pad_token_id=tok.pad_token_id,
            min_new_tokens=new if fixed else None,
        )
    out = []
    for row in g[:, width:].tolist():
        cut = next((j for j, t in enumerate(row) if t in stop_ids), None)
        out.append((row[: cut + 1], "stop") if cut is not None else (row, "length"))
    return out


def bench_single(model, tok, n, new, reps):
    chat = ChatFormat(tok)
    prompts = [
        chat.initial_ids(
            chat.prompt_messages([Message(role="user", content=t.prompt)], SleepEnv().system_prompt)
        )
        for t in _tasks(n)
    ]
    stop = tok.eos_token_id
    rates: dict[str, list[float]] = {"generate": [], "engine": []}
    for rep in range(reps):
        torch.manual_seed(rep)
        t0 = time.perf_counter()
        res = _generate(model, tok, prompts, new, {stop})
        dt = time.perf_counter() - t0
        toks = sum(len(ids) for ids, _ in res)
        rates["generate"].append(toks / dt)
        print(f"  generate: {toks} tok in {dt:.2f}s = {toks / dt:.1f} tok/s")

        backend = HFBackend(model, tok, max_batch_size=n, autocast_dtype=AUTOCAST)
        cfg = RolloutConfig(
            max_turns=1, max_new_tokens=new, sampling=SamplingParams(temperature=1.0, seed=rep)
        )
        eng = RolloutEngine(backend, tok, cfg)
        t0 = time.perf_counter()
        groups = eng.run_groups(lambda: SleepEnv(single_turn=True), _tasks(n), group_size=1)
        dt = time.perf_counter() - t0
        toks = sum(t.num_action_tokens for g in groups for t in g.trajectories)
        rates["engine"].append(toks / dt)
        print(f"    engine: {toks} tok in {dt:.2f}s = {toks / dt:.1f} tok/s")
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"== single turn: {n} prompts, batch {n}, <= {new} new tokens, autocast {AUTOCAST or 'off (fp32)'}, "
        f"T=1.0, median of {reps} =="
    )
    print(
        f"engine {med['engine']:.1f} tok/s / generate {med['generate']:.1f} tok/s = {med['engine'] / med['generate']:.2f}x"
    )
    # The same prompts, every row decoding exactly `new` tokens on both sides: the cost of a decode
    # step without the sampling noise of how long rows run (the figure above varies +-10% with it).
    steps: dict[str, list[float]] = {"generate": [], "backend": []}
    backend = HFBackend(model, tok, max_batch_size=n, autocast_dtype=AUTOCAST)
    fixed = SamplingParams(temperature=1.0, max_new_tokens=new, stop_token_ids=[-1])
    for rep in range(reps):
        torch.manual_seed(rep)
        t0 = time.perf_counter()
        _generate(model, tok, prompts, new, {stop}, fixed=True)
        steps["generate"].append((time.perf_counter() - t0) / new)
        backend.clear_prefix_cache()
        t0 = time.perf_counter()
        backend.generate_sync(prompts, fixed)
        steps["backend"].append((time.perf_counter() - t0) / new)
    ms = {k: statistics.median(v) * 1000 for k, v in steps.items()}
    print(
        f"== fixed length: {n} rows x exactly {new} tokens, median of {reps}: generate {ms['generate']:.1f} ms/step, "
        f"our backend {ms['backend']:.1f} ms/step = {ms['generate'] / ms['backend']:.2f}x =="
    )


async def _waves(tok, episodes, turns, make_env, bs, generate):
    """Lock-step waves: every live episode's turn, generated in batches of ``bs``, then all tools."""
    envs = [make_env() for _ in episodes]
    chat = ChatFormat(tok, tools=envs[0].tools, parser=envs[0].parser)
    hist = [
        chat.prompt_messages(await e.reset(t), e.system_prompt) for e, t in zip(envs, episodes, strict=True)
    ]
    ctx = [chat.initial_ids(h) for h in hist]
    live = list(range(len(episodes)))
    n_turns = n_tokens = 0
    for _ in range(turns):
        res = []
        for s in range(0, len(live), bs):
            res += await generate([ctx[i] for i in live[s : s + bs]])
        n_turns += len(res)
        n_tokens += sum(len(ids) for ids, _ in res)
        going = [(i, ids) for i, (ids, reason) in zip(live, res, strict=True) if reason == "stop"]
        steps = await asyncio.gather(
            *(envs[i].step(ParsedAction(message=Message(role="assistant", content="x"))) for i, _ in going)
        )
        for (i, ids), st in zip(going, steps, strict=True):
            delta = chat.observation_delta(hist[i], ids, st.observations)
            hist[i] = [*hist[i], Message(role="assistant", content=tok.decode(ids)), *st.observations]
            ctx[i] = ctx[i] + ids + delta
        live = [i for i, _ in going]
    return n_turns, n_tokens


def sentence_end_ids(tok) -> set[int]:
    """Ids of tokens whose text ends a sentence or a line."""
    ends = (".", "?", "!", "\n")
    return {i for i in range(len(tok)) if tok.decode([i]).rstrip(" ").endswith(ends)}


def bench_multi(model, tok, n, group, new, turns, sleep_s, bs, agent, jitter_s=0.0):
    tasks = _tasks(n // group, agent)
    episodes = [t for t in tasks for _ in range(group)]  # the engine's order: G episodes per task
    cfg = RolloutConfig(
        max_turns=turns,
        max_new_tokens=new,
        max_context_tokens=4096,
        sampling=SamplingParams(temperature=1.0, seed=0),
    )

    def make_env():
        return SleepEnv(sleep_s, agent=agent, jitter_s=jitter_s)

    # an action ends at the end of its first sentence (or turn): short turns, so episodes really
    # run several turns instead of rambling into the token limit on the first
    stop_ids = set(ChatFormat(tok).end_of_turn_ids) | sentence_end_ids(tok)
    cfg.sampling.stop_token_ids = sorted(stop_ids)
    rows = []
    for name, scheduling in (("engine", "continuous"), ("engine/lockstep", "lockstep")):
        backend = HFBackend(model, tok, max_batch_size=bs, autocast_dtype=AUTOCAST)
        eng = RolloutEngine(backend, tok, cfg.model_copy(update={"scheduling": scheduling}))
        t0 = time.perf_counter()
        groups = eng.run_groups(make_env, tasks, group_size=group)
        trajs = [t for g in groups for t in g.trajectories]
        rows.append(
            (
                name,
                time.perf_counter() - t0,
                sum(len(t.turns) for t in trajs),
                sum(t.num_action_tokens for t in trajs),
            )
        )
        if scheduling == "continuous":
            hit, fed = backend.stats["prefix_hit_tokens"], backend.stats["prefill_tokens"]

    async def by_generate(prompts):
        return _generate(model, tok, prompts, new, stop_ids)

    torch.manual_seed(0)
    t0 = time.perf_counter()
    n_turns, n_tokens = asyncio.run(_waves(tok, episodes, turns, make_env, bs, by_generate))
    rows.append(("waves/generate", time.perf_counter() - t0, n_turns, n_tokens))

    print(
        f"== multi-turn, {'agent prompt' if agent else 'short prompt'}: {len(tasks)} tasks x G={group}, <= {turns} turns, "
        f"tool sleeps {sleep_s * 1000:.0f} +- {jitter_s * 1000:.0f} ms, batch <= {bs}, <= {new} new tokens/turn, autocast {AUTOCAST or 'off (fp32)'} =="
    )
    for name, dt, n_turns, n_tokens in rows:
        print(
            f"{name:>15}: {n_turns} turns, {n_tokens} tok in {dt:.2f}s = {n_turns / dt:.2f} turns/s, {n_tokens / dt:.1f} tok/s"
        )
    print(f"engine prefix cache: {hit} prompt tokens reused, {fed} prefilled")
    e = rows[0]
    for name, dt, n_turns, n_tokens in rows[1:]:
        print(
            f"engine speed-up over {name}: {(e[2] / e[1]) / (n_turns / dt):.2f}x turns/s, "
            f"{(e[3] / e[1]) / (n_tokens / dt):.2f}x tok/s"
        )


# (name, sampler: HFBackend keyword arguments, update autocast)
PRECISIONS = {
    "fp32": ({}, None),
    "bf16-autocast": ({"autocast_dtype": "bfloat16"}, "bfloat16"),
    "bf16-copy/fp32-update": ({"inference_dtype": "bfloat16"}, None),
    "bf16-copy/autocast-update": ({"inference_dtype": "bfloat16"}, "bfloat16"),
    "fp16-copy/fp32-update": ({"inference_dtype": "float16"}, None),
    "fp16-copy/fp16-update": ({"inference_dtype": "float16"}, "float16"),  # with dynamic loss scaling
}


def _update_seconds(model, autocast, rows, length, reps, copy_backend):
    """Seconds of one update (forward + backward + AdamW over rows x length tokens, the second half
    of each row trained on), plus the inference copy's refresh when there is one; median of reps.
    The model's weights are restored afterwards."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
    scaler = loss_scale_for(autocast)  # float16: as the trainer scales it (an overflow is timed all the same)
    dev = model.device
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (rows, length), generator=g).to(dev)
    attn = torch.ones(rows, length, dtype=torch.long, device=dev)
    mask = torch.zeros(rows, length, device=dev)
    mask[:, length // 2 :] = 1
    model.train()
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        lp, _ = action_logprobs(model, ids, attn, mask, autocast_dtype=autocast, share_prefix=False)
        scaler.scale(-(lp * mask).sum() / mask.sum()).backward()
        scaler.unscale_(model.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
        if copy_backend is not None:
            copy_backend.sync_weights(model)
            copy_backend._check_weights()  # the refresh a real step pays before its next rollout
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # kernels still queued belong to this update
        times.append(time.perf_counter() - t0)
    model.eval()
    model.load_state_dict(saved)
    return statistics.median(times[1:])


def bench_precision(model, tok, n, new, reps, modes, update_rows, update_len):
    """The numeric modes side by side (docstring, item 3)."""
    chat = ChatFormat(tok)
    prompts = [
        chat.initial_ids(
            chat.prompt_messages([Message(role="user", content=t.prompt)], SleepEnv().system_prompt)
        )
        for t in _tasks(n)
    ]
    fixed = SamplingParams(temperature=1.0, max_new_tokens=new, stop_token_ids=[-1], seed=0)
    free = SamplingParams(temperature=1.0, max_new_tokens=new, seed=0)
    backends = {m: HFBackend(model, tok, max_batch_size=n, **PRECISIONS[m][0]) for m in modes}
    ms: dict[str, list[float]] = {m: [] for m in modes}
    tps: dict[str, list[float]] = {m: [] for m in modes}
    sampled: dict[str, list] = {}
    for be in backends.values():  # warm-up: first-call allocations, building the decode view / copy
        be.generate_sync(prompts[:2], fixed.model_copy(update={"max_new_tokens": 2}))
    for _ in range(reps):  # modes interleaved, so machine noise hits them alike
        for m, be in backends.items():
            be.clear_prefix_cache()
            t0 = time.perf_counter()
            be.generate_sync(prompts, fixed)
            ms[m].append((time.perf_counter() - t0) / new * 1000)
            be.clear_prefix_cache()
            t0 = time.perf_counter()
            res = be.generate_sync(prompts, free)
            tps[m].append(sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0))
            sampled[m] = res
    upd: dict[str | None, float] = {}
    ratio: dict[str, dict[str, float]] = {}
    for m in modes:
        kw, autocast = PRECISIONS[m]
        key = f"{autocast}/{'copy' if 'inference_dtype' in kw else 'shared'}"
        if key not in upd:
            upd[key] = _update_seconds(
                model,
                autocast,
                update_rows,
                update_len,
                reps,
                backends[m] if "inference_dtype" in kw else None,
            )
        # the trainer's logprobs of what this mode's sampler drew (the weights are the sampler's)
        rows = [list(p) + list(r.token_ids) for p, r in zip(prompts, sampled[m], strict=True)]
        width = max(map(len, rows))
        dev = model.device
        ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows], device=dev)
        attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=dev)
        mask = torch.zeros(len(rows), width, device=dev)
        sampler = torch.zeros(len(rows), width, device=dev)
        for b, (p, r) in enumerate(zip(prompts, sampled[m], strict=True)):
            mask[b, len(p) : len(p) + len(r.token_ids)] = 1
            sampler[b, len(p) : len(p) + len(r.token_ids)] = torch.tensor(r.logprobs, device=dev)
        with torch.no_grad():
            lp, _ = action_logprobs(model, ids, attn, mask, autocast_dtype=autocast)
        ratio[m] = sampler_ratio_stats(lp, sampler, mask)
        ratio[m]["update_s"] = upd[key]
    flags = sorted(f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16") if f in cpu_flags())
    where = (
        torch.cuda.get_device_name(model.device)
        if model.device.type == "cuda"
        else f"{torch.get_num_threads()} threads, CPU flags {flags or 'no native bf16'}"
    )
    print(
        f"== precision: {n} rows, {new} tokens, T=1.0, median of {reps}; torch {torch.__version__}, {where} =="
    )
    print(
        f"{'mode':>26} {'ms/decode step':>15} {'tok/s':>7} {'s/update':>9} "
        f"{'ratio mean':>11} {'ratio min':>10} {'ratio max':>10}"
    )
    for m in modes:
        r = ratio[m]
        print(
            f"{m:>26} {statistics.median(ms[m]):>15.1f} {statistics.median(tps[m]):>7.1f} {r['update_s']:>9.2f} "
            f"{r['mean']:>11.4f} {r['min']:>10.4f} {r['max']:>10.4f}"
        )
    print(
        f"(update: {update_rows} x {update_len} tokens, half trained; ratio: exp(trainer - sampler logprob) over "
        f"{int(ratio[modes[0]]['tokens'])}+ sampled tokens, before any update)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--group", type=int, default=4, help="multi-turn: episodes per task (GRPO's G)")
    ap.add_argument("--prompt", choices=["agent", "short"], default="agent", help="multi-turn prompt style")
    ap.add_argument("--multi-new", type=int, default=32)
    ap.add_argument(
        "--batch", type=int, default=None, help="multi-turn: most rows decoding at once (default n)"
    )
    ap.add_argument("--sleep", type=float, default=0.2)
    ap.add_argument("--jitter", type=float, default=0.0, help="multi-turn: tool latency +- this (uniform), s")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where the model runs: cpu, cuda, cuda:N")
    ap.add_argument(
        "--model", default="smollm2-135m", help="a load_model name/path, or 'tiny' (random, smoke test)"
    )
    ap.add_argument(
        "--precision",
        nargs="*",
        choices=list(PRECISIONS),
        default=None,
        help="only the precision comparison (item 3), of these modes (none named: all)",
    )
    ap.add_argument("--update-rows", type=int, default=8)
    ap.add_argument("--update-len", type=int, default=256)
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--skip-multi", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = tiny_model() if a.model == "tiny" else load_model(a.model)
    model.to(a.device).eval()
    if a.precision is not None:
        modes = a.precision or list(PRECISIONS)
        bench_precision(model, tok, a.n, a.new, a.reps, modes, a.update_rows, a.update_len)
        return
    if not a.skip_single:
        bench_single(model, tok, a.n, a.new, a.reps)
    if not a.skip_multi:
        bench_multi(
            model,
            tok,
            a.n,
            a.group,
            a.multi_new,
            a.turns,
            a.sleep,
            a.batch or a.n,
            a.prompt == "agent",
            a.jitter,
        )


if __name__ == "__main__":
    main()
