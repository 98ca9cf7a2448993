"""The flow agent vs the plain multi-turn tool agent from the same weights, on held-out tasks.

    python -m benchmarks.flow_vs_tool --config examples/search_agent.yaml --weights runs/warm-cache/warm-XXXX.pt --n 30
    python -m benchmarks.flow_vs_tool --runs runs/arms/flow-10min:step2 runs/arms/multihop-recipe:step2

Both agents run greedy on the same first ``n`` test tasks with the same policy weights (a cached
warm start when ``--weights`` is given); for the flow agent every frozen module is that policy
under no_grad. Prints, per agent: accuracy with its Wilson 95% interval, tokens per episode (for
the flow agent the planner's prompt and action tokens plus every frozen module's prompt and
generated tokens) and wall seconds; then the paired comparison (exact McNemar). Writes
``--out`` (JSON) with the same numbers.

``--runs FLOW_RUN:LABEL TOOL_RUN:LABEL`` compares two recorded evaluations instead (e.g. each agent
after its own warm start and the same minutes of RL, from ``benchmarks.learning`` arms): accuracy on
the tasks both evaluated, the paired difference, tokens per episode of the recorded episodes, and
each arm's seconds per RL step (``arm.json``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from flowgrpo.algorithms.stats import wilson_interval
from flowgrpo.components import build
from flowgrpo.config import load_config
from flowgrpo.runs.evaluation import compare, evaluate
from flowgrpo.types import Trajectory


def tokens_per_episode(trajs: list[Trajectory]) -> float:
    total = 0
    for t in trajs:
        total += t.num_tokens
        flow = t.metadata.get("flow")
        if isinstance(flow, dict):
            total += sum(flow.get("module_tokens", {}).values())
    return total / max(len(trajs), 1)


def compare_runs(flow: str, tool: str) -> dict[str, Any]:
    """Two recorded evaluations (``RUN:LABEL``), compared on the tasks they share."""
    from flowgrpo.runs.rundir import RunDir

    out: dict[str, Any] = {}
    results = {}
    for name, spec in (("flow", flow), ("tool", tool)):
        path, label = spec.rsplit(":", 1)
        run = RunDir(path)
        res = run.find_eval(label)
        if res is None:
            raise SystemExit(
                f"error: {path} has no evaluation {label!r} (it has: {', '.join(run.eval_labels())})"
            )
        results[name] = res
        arm = Path(path) / "arm.json"
        steps = json.loads(arm.read_text()).get("step_s", []) if arm.is_file() else []
        trajs = run.eval_episodes(label)
        out[name] = {
            "run": path,
            "label": label,
            "step": res.step,
            "tokens_per_episode": tokens_per_episode(trajs),
            "seconds_per_rl_step": steps,
        }
    shared = [t for t in results["flow"].per_task if t in results["tool"].per_task]
    for name, res in results.items():
        ok = res.outcomes(shared)
        lo, hi = wilson_interval(sum(ok), len(ok))
        out[name].update(n=len(ok), accuracy=sum(ok) / len(ok), ci95=(lo, hi))
        print(
            f"{name}: {out[name]['run']} {out[name]['label']} (step {res.step}): {sum(ok)}/{len(ok)} = "
            f"{out[name]['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]  tokens/episode {out[name]['tokens_per_episode']:.0f}  "
            f"s/RL step {[round(x) for x in out[name]['seconds_per_rl_step']]}",
            flush=True,
        )
    cmp = compare(results["flow"], results["tool"])
    out["flow_minus_tool"] = cmp.model_dump()
    print(cmp.summary("flow", "tool"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="examples/search_agent.yaml")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--set", action="append", default=[], help="override for the flow agent's config")
    ap.add_argument("--out", default="runs/flow_vs_tool.json")
    ap.add_argument("--runs", nargs=2, metavar=("FLOW_RUN:LABEL", "TOOL_RUN:LABEL"), default=None)
    args = ap.parse_args()
    if args.runs:
        out = compare_runs(*args.runs)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
        return
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
            "tokens_per_episode": tokens_per_episode([t for g in groups for t in g.trajectories]),
            "wall_s": wall,
            "terminations": res.terminations,
            "mean_turns": res.mean_turns,
        }
        print(f"{name}: {res.summary()}  tokens/episode {out[name]['tokens_per_episode']:.0f}", flush=True)
    cmp = compare(results["flow"], results["tool"])
    out["flow_minus_tool"] = cmp.model_dump()
    print(cmp.summary("flow", "tool"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
