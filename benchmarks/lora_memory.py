"""Resident memory of the trainer with and without LoRA on the embedded model (SmolLM2-135M).

Each arm runs in its own process (peak RSS is per process): build the Trainer (policy, and for full
fine-tuning the frozen reference copy; LoRA uses the base with adapters off instead), then one RL
step of a small batch (optimizer state appears at the first step). Reported: RSS after build, peak
RSS after the step, trainable parameters.

    python -m benchmarks.lora_memory
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(lora: bool) -> None:
    import tempfile

    from flowgrpo.config import load_config
    from flowgrpo.training.trainer import Trainer

    overrides = [
        f"run.output_dir={tempfile.mkdtemp()}",
        "run.progress=false",
        "run.save_every=0",
        "run.save_trajectories=false",
        "algorithm.kl_coef=0.01",
        "train.tasks_per_step=1",
        "train.group_size=2",
        "train.drop_zero_variance_groups=false",
        "train.resample_rounds=0",
        "sft.enabled=false",
        "sft.replay_coef=0",
        "rollout.max_new_tokens=16",
        "rollout.max_turns=1",
    ]
    if lora:
        overrides.append("model.lora={r: 16, alpha: 32, target_modules: all-linear}")
    tr = Trainer(load_config("examples/calculator_agent.yaml", overrides))
    built = rss_mb()
    tr.train_step()
    print(
        json.dumps(
            {
                "lora": lora,
                "rss_after_build_mb": round(built),
                "peak_rss_after_one_step_mb": round(
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                ),
                "trainable_params": sum(p.numel() for p in tr.model.parameters() if p.requires_grad),
                "reference_is_a_copy": tr.ref_model is not tr.model,
            }
        ),
        flush=True,
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2] == "lora")
        return 0
    for arm in ("full", "lora"):
        subprocess.run([sys.executable, "-m", "benchmarks.lora_memory", "--child", arm], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
