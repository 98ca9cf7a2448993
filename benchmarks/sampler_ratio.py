"""The sampler/trainer ratio of a real RL step, per numeric mode.

Run: ``python benchmarks/sampler_ratio.py [MODE ...]`` (~1 min per mode on 2 cores). One step of
``examples/calculator_agent.yaml`` with the embedded SmolLM2-135M (no warm start, 4 tasks x G=4, 2
turns of <= 64 tokens, every group kept), printing the trainer's ``sampler_ratio_mean/min/max``:
``exp(trainer - sampler logprob)`` over the action tokens of the first minibatch, before any update
(1 when sampler and trainer agree), and what ``algorithm.tis: auto`` resolved to. Figures are
printed, never asserted; docs/benchmarks.md, "Precision".
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from flowgrpo.config import load_config
from flowgrpo.runs.rundir import RunDir
from flowgrpo.training.trainer import Trainer

MODES = {
    "fp32": ["model.autocast=null", "model.rollout_dtype=float32"],
    "bf16-autocast": ["model.autocast=bfloat16", "model.rollout_dtype=float32"],
    "bf16-copy/fp32-update": ["model.autocast=null", "model.rollout_dtype=bfloat16"],
    "auto": [],  # this machine's defaults (on an avx512_bf16 CPU: bf16 copy, autocast update)
}

STEP = [
    "run.progress=false",
    "run.eval_every=0",
    "run.save_every=0",
    "run.save_trajectories=false",
    "sft.enabled=false",
    "sft.replay_coef=0",
    "train.steps=1",
    "train.tasks_per_step=4",
    "train.group_size=4",
    "train.resample_rounds=0",
    "train.drop_zero_variance_groups=false",  # the untrained policy's groups often tie; measure them all
    "rollout.max_turns=2",
    "rollout.max_new_tokens=64",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modes", nargs="*", choices=list(MODES), default=list(MODES))
    ap.add_argument("--config", default="examples/calculator_agent.yaml")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for name in a.modes:
        out = tempfile.mkdtemp()
        cfg = load_config(a.config, [f"run.output_dir={out}", *STEP, *MODES[name]])
        t0 = time.time()
        tr = Trainer(cfg)
        tr.train_step()
        r = [m.values for m in RunDir(out).metrics() if "sampler_ratio_mean" in m.values][-1]
        print(
            f"{name:>22}: autocast={tr.parts.autocast} rollout_dtype={tr.parts.rollout_dtype} "
            f"tis={tr.parts.tis} tokens={r['train_tokens']:.0f} ratio mean {r['sampler_ratio_mean']:.5f} "
            f"min {r['sampler_ratio_min']:.6f} max {r['sampler_ratio_max']:.6f} ({time.time() - t0:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
