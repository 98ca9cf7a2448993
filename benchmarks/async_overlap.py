"""Synchronous vs asynchronous rollout/update (``train.async_staleness``) for the same wall time.

Each arm trains the demo's recipe (``examples/calculator_agent.yaml``: SmolLM2-135M, arithmetic with
a calculator, cached warm start) for ``--seconds`` of RL wall time, then evaluates greedily on
``--eval-n`` held-out tasks. Reported per arm: RL steps finished, steps/s, and held-out accuracy with
its Wilson 95% interval. Both arms share the warm start (benchmarks/learning.py's cache), seeds and
machine settings; the async arm runs ``algorithm.tis=token`` (required) and the sync arm does too, so
the only difference is the overlap.

    python -m benchmarks.async_overlap --seconds 900 --eval-n 200            # this machine
    python -m benchmarks.async_overlap --device cuda --seconds 900 --eval-n 500

What overlap can buy: with rollout time R and update time U per step, sync takes R + U and async
max(R, U) when the two run on separate resources. On a 2-core CPU both halves compete for the same
two cores, so the expected gain is small or negative (the replica also costs a copy of the weights).
On a GPU node the rollout runs on a server / inference engine (or its own GPU) while the trainer
updates, which is where the ``max`` pays.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path

from benchmarks.learning import run_eval, warm_start
from flowgrpo.config import load_config
from flowgrpo.training.trainer import Trainer


def arm(args: argparse.Namespace, staleness: int) -> dict[str, float]:
    out = Path(args.out) / f"staleness{staleness}"
    overrides = [
        f"run.output_dir={out}",
        "run.eval_every=0",
        "run.save_every=0",
        "run.progress=false",
        "run.save_trajectories=false",
        "train.steps=10000",
        f"train.async_staleness={staleness}",
        "algorithm.tis=token",
        f"train.tasks_per_step={args.tasks_per_step}",
        f"train.group_size={args.group_size}",
    ]
    if args.device:
        overrides.append(f"model.device={args.device}")
    cfg = load_config(args.config, [*overrides, *args.set])
    tr = Trainer(cfg)
    warm_start(tr, Path(args.cache))
    stop = threading.Timer(args.seconds, lambda: setattr(tr, "_stop_signal", signal.SIGTERM))
    t0 = time.monotonic()
    stop.start()
    tr.train()  # finishes the step in flight when the timer fires, like a SIGTERM
    wall = time.monotonic() - t0
    stop.cancel()
    ev = run_eval(tr, args.eval_n, f"async{staleness}")
    return {
        "async_staleness": staleness,
        "steps": tr.step,
        "wall_s": round(wall, 1),
        "steps_per_s": round(tr.step / wall, 5),
        "accuracy": ev.accuracy,
        "ci95": list(ev.ci95),
        "n": ev.n,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="examples/calculator_agent.yaml")
    ap.add_argument("--seconds", type=float, default=900.0, help="RL wall time per arm")
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--tasks-per-step", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1])
    ap.add_argument(
        "--device",
        default=None,
        help="model.device: auto (default: cuda when there is a GPU), cpu, cuda or cuda:N",
    )
    ap.add_argument("--cache", default="runs/bench_cache")
    ap.add_argument("--out", default="runs/bench_async")
    ap.add_argument("--set", nargs="*", default=[], help="more config overrides")
    args = ap.parse_args(argv)
    rows = [arm(args, k) for k in args.staleness]
    for r in rows:
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
