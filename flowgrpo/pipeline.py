"""The main job: evaluate, train, evaluate again, and write the run's plot and report.

``flowgrpo train CONFIG`` runs :func:`train_and_evaluate`: held-out accuracy of the untrained policy
(greedy, the same prompts before and after), the trainer's loop (optional supervised warm start on
oracle demonstrations, then Flow-GRPO steps), held-out accuracy again, then ``RUN/eval.jsonl``,
``RUN/plot.png`` and ``RUN/report.html``. A resumed run skips the "before" evaluation it already has.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from flowgrpo.config import TrainConfig

log = logging.getLogger(__name__)


def eval_record(stats: dict[str, float], *, step: int, split: str, label: str) -> dict[str, Any]:
    """One line of ``RUN/eval.jsonl`` from :func:`flowgrpo.metrics.rollout_stats` output."""
    return {
        "step": step,
        "split": split,
        "label": label,
        "n": int(stats.get("episodes", 0)),
        "accuracy": stats.get("accuracy", 0.0),
        "reward_mean": stats.get("reward_mean", 0.0),
        "mean_turns": stats.get("turns_mean", 0.0),
        "valid_tool_call_rate": stats.get("valid_tool_call_rate"),
        "terminations": {
            k.split("/", 1)[1]: int(v) for k, v in stats.items() if k.startswith("termination/")
        },
    }


def format_eval(rec: dict[str, Any]) -> str:
    vt = rec["valid_tool_call_rate"]
    terms = ", ".join(f"{k} {v}" for k, v in sorted(rec["terminations"].items()))
    return (
        f"{rec['label']:>7} (step {rec['step']}, {rec['split']}, n={rec['n']}): "
        f"accuracy {rec['accuracy']:.3f}  reward {rec['reward_mean']:.3f}  turns {rec['mean_turns']:.2f}  "
        f"valid tool calls {'-' if vt is None else f'{vt:.2f}'}  [{terms}]"
    )


def _append_jsonl(path: Path, rec: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_and_evaluate(cfg: TrainConfig, *, eval_n: int | None = 100, report: bool = True) -> dict[str, Any]:
    """Run the main job for ``cfg``; returns ``{"before", "after", "train", "wall_s"}``."""
    from flowgrpo.trainer import Trainer

    t0 = time.monotonic()
    trainer = Trainer(cfg)
    evals = trainer.out / "eval.jsonl"
    before = next((r for r in _read_jsonl(evals) if r.get("label") == "before"), None)
    if eval_n and before is None:
        print(f"evaluating the untrained policy on {eval_n} held-out tasks (greedy) ...", flush=True)
        before = eval_record(
            trainer.evaluate("test", eval_n), step=trainer.step, split="test", label="before"
        )
        _append_jsonl(evals, before)
        print(format_eval(before), flush=True)
    if cfg.sft.enabled and trainer.step == 0 and not trainer.counters["sft_done"]:
        print(f"warm start: supervised epochs on {cfg.sft.tasks} oracle demonstrations ...", flush=True)
        trainer.warm_start()
        trainer.save()  # a crash during RL resumes after the warm start, not before it
        if eval_n:
            # Separates what the warm start taught from what Flow-GRPO adds afterwards.
            mid = eval_record(trainer.evaluate("test", eval_n), step=0, split="test", label="warm")
            _append_jsonl(evals, mid)
            print(format_eval(mid), flush=True)
    result = trainer.train()
    after = None
    if eval_n:
        print(f"evaluating the trained policy on {eval_n} held-out tasks (greedy) ...", flush=True)
        after = eval_record(trainer.evaluate("test", eval_n), step=trainer.step, split="test", label="after")
        _append_jsonl(evals, after)
    if report:
        from flowgrpo.report import build_report, plot_run

        plot_run(trainer.out)
        build_report(trainer.out)
    wall = time.monotonic() - t0
    print(
        f"\nrun directory: {trainer.out}  ({wall / 60:.1f} min, {result.get('status')} at step {trainer.step})"
    )
    for rec in _read_jsonl(evals):
        if rec.get("label") in ("before", "warm"):
            print(format_eval(rec))
    if after:
        print(format_eval(after))
    if before and after:
        print(
            f"held-out accuracy (greedy, same prompts): {before['accuracy']:.3f} -> {after['accuracy']:.3f} "
            f"({100 * (after['accuracy'] - before['accuracy']):+.1f} points)"
        )
    return {"before": before, "after": after, "train": result, "wall_s": wall}


def evaluate_run(
    cfg: TrainConfig,
    *,
    split: str = "test",
    n: int | None = None,
    greedy: bool = True,
    checkpoint: str | None = None,
) -> dict[str, Any]:
    """Evaluate the latest (or a given) checkpoint of a run, or the untrained model of a config."""
    from flowgrpo.trainer import Trainer

    cfg = cfg.model_copy(deep=True)
    cfg.run.resume = checkpoint or (Path(cfg.run.output_dir) / "checkpoints").is_dir()
    trainer = Trainer(cfg)
    rec = eval_record(trainer.evaluate(split, n, greedy=greedy), step=trainer.step, split=split, label="eval")
    return rec
