"""The flow agent vs the plain multi-turn tool agent from the same weights, on held-out tasks.

    python -m benchmarks.flow_vs_tool --config examples/search_agent.yaml --weights runs/warm-cache/warm-XXXX.pt --n 30

Both agents run greedy on the same first ``n`` test tasks with the same policy weights (a cached
warm start when ``--weights`` is given); for the flow agent every frozen module is that policy
under no_grad. Prints, per agent: accuracy with its Wilson 95% interval, tokens per episode (for
the flow agent the planner's prompt and action tokens plus every frozen module's prompt and
generated tokens) and wall seconds; then the paired comparison (exact McNemar). Writes
``--out`` (JSON) with the same numbers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from flowgrpo.components import build
from flowgrpo.config import load_config
from flowgrpo.evaluation import compare, evaluate


def tokens_per_episode(groups) -> float:
    trajs = [t for g in groups for t in g.trajectories]
    total = 0
    for t in trajs:
        total += t.num_tokens
        flow = t.metadata.get("flow")
        if isinstance(flow, dict):
            total += sum(flow.get("module_tokens", {}).values())
    return total / max(len(trajs), 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="examples/search_agent.yaml")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--set", action="append", default=[], help="override for the flow agent's config")
    ap.add_argument("--out", default="runs/flow_vs_tool.json")
    args = ap.parse_args()
    tool_cfg = load_config(args.config, ["run.progress=false"])
    parts = build(tool_cfg)
    if args.weights:
        parts.model.load_state_dict(torch.load(args.weights, map_location="cpu"))
        parts.backend.sync_weights(parts.model)
    flow_cfg = load_config(args.config, ["run.progress=false", "agent.kind=flow", *args.set])
    flow_parts = build(flow_cfg, model=parts.model, tokenizer=parts.tokenizer, backend=parts.backend)
    out = {"config": args.config, "weights": args.weights, "n": args.n, "flow_overrides": args.set}
    results = {}
    for name, p in (("tool", parts), ("flow", flow_parts)):
        t0 = time.monotonic()
        res, groups = evaluate(p, "test", args.n, label=name)
        wall = time.monotonic() - t0
        results[name] = res
        out[name] = {
            "accuracy": res.accuracy,
            "ci95": res.ci95,
            "tokens_per_episode": tokens_per_episode(groups),
            "wall_s": wall,
            "terminations": res.terminations,
            "mean_turns": res.mean_turns,
        }
        print(f"{name}: {res.summary()}  tokens/episode {out[name]['tokens_per_episode']:.0f}", flush=True)
    cmp = compare(results["flow"], results["tool"])
    out["flow_minus_tool"] = cmp.model_dump()
    print(f"flow - tool: {cmp}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
