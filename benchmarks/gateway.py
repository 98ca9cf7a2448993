"""Turns per second through the gateway: 16 agent programs at once against the same agents one
call at a time, side by side in one process run.

Each agent is a plain tool-calling loop over the real ``openai`` client (``AsyncOpenAI``) on an
``arithmetic`` task: it sends the system prompt, the task and the calculator's schema, runs the
calculator (flowgrpo's) on every tool call the model writes, and stops at an answer or after
``--turns`` model calls; every call is recorded (an episode per agent) and closed with a reward.
The server is the gateway (Starlette + uvicorn) over the ``hf`` backend.

- ``serial``: the agents run one after another, so the server has one request at a time; this is
  what an agent loop gets from a server that decodes one call at a time.
- ``concurrent``: all agents at once; their requests are in flight together and join the hf
  backend's continuous-batching engine's running batch.

Both arms use the same model, tasks, seeds and settings, in the same process (the serial arm first,
then the concurrent one, then the serial one again, and the median of each side is reported).
Output: one JSON line per arm, then a table.

    python -m benchmarks.gateway                       # SmolLM2-135M, fp32, 16 agents
    python -m benchmarks.gateway --model tiny --agents 4 --turns 2 --max-tokens 8   # seconds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from benchmarks._common import load_policy, machine_info


async def agent(
    client: Any, task: Any, tools: list[dict], calc: Any, args: argparse.Namespace, k: int
) -> int:
    """One agent program: returns the number of model calls it made."""
    from flowgrpo.envs.arithmetic import SYSTEM_PROMPT

    from flowgrpo.tool import ToolError, invoke

    messages: list[dict] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.prompt},
    ]
    calls = 0
    for turn in range(args.turns):
        r = await client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=tools,
            max_tokens=args.max_tokens,
            temperature=1.0,
            seed=args.seed * 1000 + k * 10 + turn,
        )
        calls += 1
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            messages.append({"role": "user", "content": "Continue. Use the calculator, then answer."})
            continue
        for call in msg.tool_calls:
            try:
                out = (await invoke(calc, json.loads(call.function.arguments or "{}"))).content
            except (ToolError, ValueError) as e:
                out = f"Error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    return calls


async def run_arm(
    server: Any, tasks: list[Any], args: argparse.Namespace, concurrent: bool, tag: str
) -> dict:
    import openai
    from flowgrpo.tools.calculator import Calculator

    from flowgrpo.gateway.client import post_reward
    from flowgrpo.tool import to_openai_schema

    calc = Calculator()
    tools = [to_openai_schema(calc)]

    async def one(k: int, task: Any) -> int:
        episode = f"{tag}-{k}"
        client = openai.AsyncOpenAI(
            base_url=f"{server.url}/episodes/{episode}/v1", api_key="unused", max_retries=0, timeout=600
        )
        try:
            n = await agent(client, task, tools, calc, args, k)
        finally:
            await client.close()
        await asyncio.to_thread(post_reward, 0.0, base_url=server.url, episode_id=episode)
        return n

    t0 = time.perf_counter()
    if concurrent:
        counts = await asyncio.gather(*(one(k, t) for k, t in enumerate(tasks)))
    else:
        counts = [await one(k, t) for k, t in enumerate(tasks)]
    wall = time.perf_counter() - t0
    trajs = [server.recorder.finished[f"{tag}-{k}"] for k in range(len(tasks))]
    tokens = sum(t.num_action_tokens for t in trajs)
    return {
        "arm": "concurrent" if concurrent else "serial",
        "agents": len(tasks),
        "turns": sum(counts),
        "wall_s": round(wall, 2),
        "turns_per_s": round(sum(counts) / wall, 3),
        "sampled_tokens_per_s": round(tokens / wall, 1),
        "context_resets": sum(t.metadata.get("context_resets", 0) for t in trajs),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m (embedded) or tiny")
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--turns", type=int, default=2, help="model calls per agent")
    p.add_argument("--max-tokens", type=int, default=48, help="per model call")
    p.add_argument(
        "--repeats", type=int, default=1, help="serial/concurrent pairs (serial once more at the end)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()

    import torch
    from flowgrpo.envs.arithmetic import ArithmeticEnv

    from flowgrpo.gateway.recorder import EpisodeRecorder, RecorderLimits
    from flowgrpo.gateway.serve import make_server, serve_in_thread
    from flowgrpo.rollout.backends.hf import HFBackend

    torch.manual_seed(args.seed)
    model, tok = load_policy(args.model, dtype=args.dtype, device=args.device)
    backend = HFBackend(model, tok, max_batch_size=max(16, args.agents))
    recorder = EpisodeRecorder(None, RecorderLimits(max_new_tokens=args.max_tokens))
    server = make_server(backend, tok, model_name="policy", recorder=recorder)
    serve_in_thread(server)
    tasks = ArithmeticEnv(seed=args.seed).tasks("train")[: args.agents]
    rows: list[dict] = []
    try:
        asyncio.run(run_arm(server, tasks[:2], args, True, "warmup"))
        for rep in range(args.repeats):
            for concurrent in (False, True):
                rows.append(
                    asyncio.run(run_arm(server, tasks, args, concurrent, f"r{rep}-{int(concurrent)}"))
                )
                print(json.dumps(rows[-1]), flush=True)
        rows.append(asyncio.run(run_arm(server, tasks, args, False, "last-serial")))
        print(json.dumps(rows[-1]), flush=True)
    finally:
        server.shutdown()
        server.server_close()
    info = machine_info()
    print(
        f"\nmachine: {info.get('cpu', '?')}, {info.get('cores')} cores, torch {torch.__version__}, {args.dtype}"
    )
    print(f"model {args.model}, {args.agents} agents x {args.turns} calls x <= {args.max_tokens} tokens")
    print(f"{'arm':<12}{'turns/s (median)':>18}{'tokens/s':>12}{'runs':>6}")
    med = {}
    for arm in ("serial", "concurrent"):
        mine = [r for r in rows if r["arm"] == arm]
        med[arm] = statistics.median(r["turns_per_s"] for r in mine)
        toks = statistics.median(r["sampled_tokens_per_s"] for r in mine)
        print(f"{arm:<12}{med[arm]:>18.3f}{toks:>12.1f}{len(mine):>6}")
    print(f"speed-up: {med['concurrent'] / med['serial']:.2f}x")


if __name__ == "__main__":
    main()
