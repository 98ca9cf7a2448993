"""One learning arm: warm start (cached), then Flow-GRPO for a wall-clock budget, with held-out
evaluations along the way and a paired test against the warm start at the end.

    python -m benchmarks.learning --name lr3e-5 --minutes 12 --set train.lr=3e-5
    python -m benchmarks.learning --name probe --minutes 0 --passk 100      # warm start only: pass@k
    python -m benchmarks.learning --name sft-control --minutes 12 --control sft

Every arm of a sweep starts from the same warm-started weights (cached under ``--warm-cache`` and
keyed by the config's model, environment and ``sft`` section), evaluates on the same held-out tasks
(greedy, ``--eval-n``), and gets the same budget of training minutes (rollout + update; evaluation
time is not counted). ``--control sft`` spends the budget on more supervised epochs over fresh
oracle demonstrations instead of RL: the honest comparison for "RL helps".

Writes ``OUT/arm.json`` (config overrides, curve of held-out accuracy with 95% intervals against
training minutes, the paired comparison with the warm start, wall times) and the run's usual files
(metrics, trajectories, ``eval.jsonl``); prints one summary line per evaluation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from flowgrpo.config import load_config
from flowgrpo.runs.evaluation import EvalResult, compare
from flowgrpo.training.sft import demonstrations, supervised_epochs
from flowgrpo.training.trainer import Trainer


def warm_key(cfg: Any) -> str:
    spec = {
        "model": cfg.model.name,
        "env": cfg.env.model_dump(mode="json"),
        "sft": cfg.sft.model_dump(mode="json"),
    }
    spec["rollout"] = {"max_turns": cfg.rollout.max_turns, "max_new_tokens": cfg.rollout.max_new_tokens}
    if cfg.agent.kind != "tool":  # another agent's warm start demonstrates another format
        spec["agent"] = cfg.agent.model_dump(mode="json")
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def warm_start(trainer: Trainer, cache: Path) -> float:
    """Load the cached warm-started weights, or run the warm start and cache them; returns seconds."""
    cfg = trainer.cfg
    path = cache / f"warm-{warm_key(cfg)}.pt"
    t0 = time.monotonic()
    if path.is_file():
        trainer.model.load_state_dict(torch.load(path, map_location="cpu"))
        if trainer.ref_model is not None:
            trainer.ref_model.load_state_dict(trainer.model.state_dict())
        trainer.parts.backend.sync_weights(trainer.model)
        trainer.counters["sft_done"] = 1
        print(f"warm start: loaded {path}", flush=True)
        return 0.0
    trainer.warm_start()
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(trainer.model.state_dict(), tmp)
    tmp.rename(path)
    secs = time.monotonic() - t0
    print(f"warm start: {secs:.0f} s, cached at {path}", flush=True)
    return secs


def run_eval(trainer: Trainer, n: int, label: str, split: str = "test", samples: int = 1) -> EvalResult:
    res = trainer.evaluate(split, n, samples=samples, greedy=samples == 1, label=label, record=True)
    print(res.summary(), flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="examples/calculator_agent.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--name", required=True)
    ap.add_argument("--root", default="runs/arms")
    ap.add_argument("--warm-cache", default="runs/warm-cache")
    ap.add_argument("--minutes", type=float, default=12.0, help="training budget (rollout + update)")
    ap.add_argument("--eval-n", type=int, default=500)
    ap.add_argument("--eval-every-min", type=float, default=4.0, help="held-out evaluation interval")
    ap.add_argument(
        "--passk", type=int, default=0, help="also sample 8 episodes on this many train/test tasks"
    )
    ap.add_argument("--control", choices=["rl", "sft"], default="rl")
    args = ap.parse_args(argv)

    out = Path(args.root) / args.name
    if out.exists() and any(out.iterdir()):
        print(f"{out} exists: choose another --name or remove it", file=sys.stderr)
        return 2
    cfg = load_config(args.config, [*args.overrides, f"run.output_dir={out}", "run.progress=false"])
    t_start = time.monotonic()
    trainer = Trainer(cfg)
    warm_s = warm_start(trainer, Path(args.warm_cache))
    curve: list[dict[str, Any]] = []
    warm_eval = Path(args.warm_cache) / f"warm-{warm_key(cfg)}-eval{args.eval_n}.json"
    warm_trajs = warm_eval.with_suffix(".jsonl")
    if warm_eval.is_file() and warm_trajs.is_file():  # every arm starts from the same weights
        warm = EvalResult.model_validate_json(warm_eval.read_text())
        with open(out / "eval.jsonl", "a") as f:
            f.write(warm.model_dump_json() + "\n")
        (out / "eval").mkdir(exist_ok=True)
        shutil.copyfile(warm_trajs, out / "eval" / "warm.jsonl")
        print(warm.summary(), "(cached)", flush=True)
    else:
        warm = run_eval(trainer, args.eval_n, "warm")
        warm_eval.write_text(warm.model_dump_json())
        shutil.copyfile(out / "eval" / "warm.jsonl", warm_trajs)
    curve.append({"step": 0, "train_min": 0.0, "accuracy": warm.accuracy, "ci95": warm.ci95})
    if args.passk:
        for split in ("train", "test"):
            run_eval(trainer, args.passk, f"warm-pass@8-{split}", split=split, samples=8)

    budget = args.minutes * 60
    trained = 0.0
    next_eval = args.eval_every_min * 60
    last = warm
    sft_seen = cfg.sft.tasks
    step_s: list[float] = []
    while trained < budget:
        t0 = time.monotonic()
        if args.control == "rl":
            m = trainer.train_step()
            # the soundness checks of docs/learning.md: ratio ~1 on fresh samples, KL, entropy,
            # zero-variance groups, gradient norm
            print(
                f"step {trainer.step}: sampled acc {m['accuracy']:.2f} reward {m['reward_mean']:.3f} "
                f"groups {m['groups_trained']:.0f}/{m['groups_sampled']:.0f} "
                f"ratio {m.get('ratio_mean', 1):.3f} [{m.get('ratio_min', 1):.2f}, {m.get('ratio_max', 1):.2f}] "
                f"clip {m.get('clip_frac', 0):.3f} kl {m.get('kl', 0):.4f} ent {m.get('entropy', 0):.3f} "
                f"gnorm {m.get('grad_norm', 0):.2f} turns {m['turns_mean']:.2f} {m['time/step_s']:.1f} s",
                flush=True,
            )
        else:  # the same minutes on fresh supervised demonstrations
            demos = [t for t in demonstrations(trainer.parts, cfg.sft.tasks, offset=sft_seen) if t.reward > 0]
            sft_seen += cfg.sft.tasks
            h = supervised_epochs(
                trainer.parts, demos, epochs=1, lr=cfg.sft.lr, batch_trajectories=cfg.sft.batch_trajectories
            )
            trainer.step += 1
            print(f"sft round {trainer.step}: {len(demos)} demos, loss {h[-1]['loss']:.4f}", flush=True)
        step_s.append(time.monotonic() - t0)
        trained += step_s[-1]
        if trained >= next_eval or trained >= budget:
            next_eval += args.eval_every_min * 60
            last = run_eval(trainer, args.eval_n, f"step{trainer.step}")
            curve.append(
                {
                    "step": trainer.step,
                    "train_min": trained / 60,
                    "accuracy": last.accuracy,
                    "ci95": last.ci95,
                }
            )
    cmp = compare(warm, last)
    print(cmp.summary("warm", f"step {trainer.step}"), flush=True)
    record = {
        "name": args.name,
        "config": args.config,
        "overrides": args.overrides,
        "control": args.control,
        "minutes": args.minutes,
        "steps": trainer.step,
        "warm_start_s": warm_s,
        "train_min": trained / 60,
        "wall_min": (time.monotonic() - t_start) / 60,
        "step_s": step_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "curve": curve,
        "final": {"accuracy": last.accuracy, "ci95": last.ci95, "n": last.n},
        "vs_warm": cmp.model_dump(),
    }
    (out / "arm.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
