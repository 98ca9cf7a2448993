"""The main job: evaluate, train, evaluate again, and write the run's plot and report.

``flowgrpo train CONFIG`` runs :func:`train_and_evaluate`: held-out accuracy of the untrained policy
(greedy, the same prompts before and after), the trainer's loop (optional supervised warm start on
oracle demonstrations, then Flow-GRPO steps), held-out accuracy again, then ``RUN/eval.jsonl``,
``RUN/plot.png`` and ``RUN/report.html``. A resumed run skips the "before" evaluation it already has.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from flowgrpo.config import TrainConfig
from flowgrpo.env import Split
from flowgrpo.runs.evaluation import EvalResult, compare
from flowgrpo.runs.rundir import RunDir, RunError
from flowgrpo.utils.interrupt import Interrupted

log = logging.getLogger(__name__)


def train_and_evaluate(
    cfg: TrainConfig, *, eval_n: int | None = 100, untrained_n: int | None = None, report: bool = True
) -> dict[str, Any]:
    """Run the main job for ``cfg``; returns ``{"untrained", "warm", "after", "comparisons", "train",
    "wall_s"}``.

    Held-out evaluations are greedy on the same first ``eval_n`` test tasks, so every pair of them is
    compared with a paired test (exact McNemar) and the gain of RL is separated from the warm start's.
    ``untrained_n`` (default ``eval_n``) sizes the untrained policy's evaluation, whose episodes run to
    the token limit and cost several times a trained one's.
    """
    untrained_n = eval_n if untrained_n is None else untrained_n  # 0 skips it
    from flowgrpo.training.trainer import Trainer

    t0 = time.monotonic()
    trainer = Trainer(cfg)
    try:
        return _train_and_evaluate(trainer, cfg, t0, eval_n=eval_n, untrained_n=untrained_n, report=report)
    finally:
        trainer.close()  # what the trainer started beside itself (rollout.source=gateway's server)


def _train_and_evaluate(
    trainer: Any, cfg: TrainConfig, t0: float, *, eval_n: int | None, untrained_n: int | None, report: bool
) -> dict[str, Any]:
    if not trainer.dist.is_main:  # torchrun: rank 0 evaluates and reports; this rank trains in step
        # train() runs a pending warm start and joins the collective step-0 save rank 0 makes in _warm_start
        result = trainer.train(eval_last_step=not eval_n)
        return {
            "untrained": None,
            "warm": None,
            "after": None,
            "comparisons": {},
            "train": result,
            "wall_s": time.monotonic() - t0,
        }
    run = RunDir(trainer.out)
    before = run.find_eval("untrained")
    if untrained_n and before is None:
        print(f"evaluating the untrained policy on {untrained_n} held-out tasks (greedy) ...", flush=True)
        before = trainer.evaluate("test", untrained_n, label="untrained", record=True)
        print(before.summary(), flush=True)
    warm = run.find_eval("warm")
    if cfg.sft.enabled and trainer.step == 0:
        warm, stopped = _warm_start(trainer, cfg, eval_n, warm)
        if stopped:
            return {
                "untrained": before,
                "warm": warm,
                "after": None,
                "comparisons": {},
                "train": {"status": "interrupted", "step": 0},
                "wall_s": time.monotonic() - t0,
            }
    result = trainer.train(eval_last_step=not eval_n)
    after = None
    if eval_n:
        after = run.find_eval(f"step{trainer.step}")
        if after is None or after.n < eval_n:
            print(f"evaluating the trained policy on {eval_n} held-out tasks (greedy) ...", flush=True)
            after = _final_evaluation(trainer, eval_n)
            if after is None:
                result["status"] = "interrupted"
    if report:
        from flowgrpo.runs.report import build_report, plot_run

        plot_run(trainer.out)
        build_report(trainer.out)
    wall = time.monotonic() - t0
    print(
        f"\nrun directory: {trainer.out}  ({wall / 60:.1f} min, {result.get('status')} at step {trainer.step})"
    )
    for rec in (before, warm, after):
        if rec is not None:
            print(rec.summary())
    comparisons = {}
    if after is not None:
        for name, base in (("untrained", before), ("warm", warm)):
            if base is not None:
                cmp = compare(base, after)
                comparisons[name] = cmp.model_dump()
                print(cmp.summary(name, f"step {trainer.step}"))
    return {
        "untrained": before,
        "warm": warm,
        "after": after,
        "comparisons": comparisons,
        "train": result,
        "wall_s": wall,
    }


def _warm_start(
    trainer: Any, cfg: TrainConfig, eval_n: int | None, warm: EvalResult | None
) -> tuple[EvalResult | None, bool]:
    """The supervised warm start, its step-0 checkpoint and its held-out evaluation, in the
    trainer's stop-on-signals block; returns the warm evaluation and whether a signal stopped the
    job. A stop during the supervised epochs loses them (nothing is saved; the same command starts
    again). The checkpoint is written before the evaluation, so a stop there loses only the
    evaluation, and ``run.resume=true`` runs it first: a run resumed at step 0 without one has it."""
    with trainer.stop_on_signals():
        try:
            if not trainer.counters["sft_done"]:
                print(
                    f"warm start: supervised epochs on {cfg.sft.tasks} oracle demonstrations ...", flush=True
                )
                trainer.warm_start()
                trainer.save()  # a crash during RL resumes after the warm start, not before it
            if eval_n and warm is None:
                # Separates what the warm start taught from what Flow-GRPO adds afterwards.
                print(
                    f"evaluating the warm-started policy on {eval_n} held-out tasks (greedy) ...", flush=True
                )
                warm = trainer.evaluate("test", eval_n, label="warm", record=True)
                print(warm.summary(), flush=True)
        except Interrupted:
            if trainer.counters["sft_done"]:
                log.warning(
                    "signal %d: the warm start's evaluation was cut short and is not recorded; the "
                    "warm start is saved (step 0), and `flowgrpo train CONFIG --set run.output_dir=%s "
                    "--set run.resume=true` (the same overrides) evaluates it and goes on",
                    trainer.stop_signal,
                    trainer.out,
                )
            else:
                log.warning(
                    "signal %d: the warm start was cut short; nothing is saved, and the same command "
                    "starts it again",
                    trainer.stop_signal,
                )
            return warm, True
    return warm, False


def _final_evaluation(trainer: Any, n: int) -> EvalResult | None:
    """The trained policy's held-out evaluation; ``None`` when a signal cut it short. The
    checkpoint is written before it starts, so a stop here loses only the evaluation, and the
    message says how to run it again."""
    with trainer.stop_on_signals():
        try:
            return trainer.evaluate("test", n, label=f"step{trainer.step}", record=True)
        except Interrupted:
            log.warning(
                "signal %d: the final evaluation was cut short and is not recorded; the checkpoint of "
                "step %d is saved, and `flowgrpo train CONFIG --set run.output_dir=%s --set "
                "run.resume=true` (the same overrides) evaluates it",
                trainer.stop_signal,
                trainer.step,
                trainer.out,
            )
            return None


def evaluate_run(
    cfg: TrainConfig,
    *,
    split: Split = "test",
    n: int | None = None,
    greedy: bool = True,
    samples: int = 1,
    checkpoint: str | None = None,
    label: str = "eval",
    record: bool = False,
) -> EvalResult:
    """Evaluate the latest (or a given) checkpoint of a run, or the untrained model of a config
    (``checkpoint="untrained"``): the config's parts with the checkpoint's policy weights, and no
    optimizer or reference model."""
    from flowgrpo.components import build
    from flowgrpo.runs.checkpoint import checkpoint_state_file, load_checkpoint
    from flowgrpo.runs.evaluation import evaluate, record_evaluation

    if checkpoint not in (None, "untrained"):
        checkpoint_state_file(checkpoint)  # a mistyped path fails before any model is loaded
    parts = build(cfg)
    step = 0
    if checkpoint != "untrained":
        path = Path(checkpoint) if checkpoint else None
        if path is None and Path(cfg.run.output_dir).is_dir():
            path = RunDir(cfg.run.output_dir).latest_checkpoint()
        if path is not None:
            step = int(load_checkpoint(path, model=parts.model, restore_rng=False)["step"])
            parts.backend.sync_weights(parts.model)
    result, groups = evaluate(
        parts,
        split,
        n,
        greedy=greedy,
        samples=samples,
        label=label,
        step=step,
        progress=cfg.run.progress,
    )
    if record:
        record_evaluation(cfg.run.output_dir, result, groups)
    return result


def side_label(side: str) -> str:
    """``untrained`` / ``warm`` / a step number -> the label its evaluation is recorded under."""
    if side in ("untrained", "warm"):
        return side
    if side.isdigit():
        return f"step{int(side)}"
    raise ValueError(f"a checkpoint to compare is 'untrained', 'warm' or a step number, got {side!r}")


def compare_checkpoints(
    cfg: TrainConfig, a: str, b: str, *, split: Split = "test", n: int = 500
) -> dict[str, Any]:
    """Compare two checkpoints of a run on the same first ``n`` tasks of ``split`` (greedy).

    Each side reuses its recorded evaluation in ``RUN/eval.jsonl`` when that covered at least ``n``
    tasks, or every task of the split when it has fewer (multihop's 191 test questions satisfy the
    default 500); otherwise it is evaluated now (``warm`` is the step-0 checkpoint written after the
    warm start) and recorded. Returns both results and the paired comparison.
    """
    from flowgrpo.components import env_factory_of

    n = min(n, len(env_factory_of(cfg.env)().tasks(split)))
    run = RunDir(cfg.run.output_dir)
    results = {}
    for side in (a, b):
        label = side_label(side)
        found = run.find_eval(label, split)
        if found is None or found.n < n:
            if side == "untrained":
                ckpt = "untrained"
            else:
                try:
                    path = run.checkpoint(0 if side == "warm" else int(side))
                except RunError as e:
                    raise FileNotFoundError(
                        f"no recorded evaluation of {side!r} on {n} {split} tasks, and {e}; compare "
                        "'untrained', a step that still has a checkpoint, or lower --n"
                    ) from None
                ckpt = str(path)
            print(f"evaluating {side} on {n} {split} tasks (greedy) ...", flush=True)
            found = evaluate_run(cfg, split=split, n=n, checkpoint=ckpt, label=label, record=True)
        results[side] = found
    return {"a": results[a], "b": results[b], "comparison": compare(results[a], results[b], n=n)}
