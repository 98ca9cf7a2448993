"""The learning matrix: does the RL phase improve held-out greedy accuracy over its own warm start,
in every seed and on every numeric path, and does it hold when the run is longer?

    python -m benchmarks.learning_matrix --config examples/calculator_agent.yaml --seeds 0 1 2 \\
        --precision fp32 bf16 --run                      # run the missing arms, then print the table
    python -m benchmarks.learning_matrix --config examples/calculator_agent.yaml --seeds 0 1 2 \\
        --precision fp32 bf16                            # print the table of the arms already run
    python -m benchmarks.learning_matrix ... --run --jobs 6  # on a GPU: six arms side by side
    python -m benchmarks.learning_matrix ... --per-step  # also sampler ratio, entropy, groups with a
                                                         # signal, KL and time of every RL step
    python -m benchmarks.learning_matrix ... --run --jobs 6 --stop-after 420  # a lent GPU's minutes:
                                                         # arms still running at 420 s checkpoint and
                                                         # evaluate the step they reached
    python -m benchmarks.learning_matrix ... --run --stop-after 8400  # again later: --run goes on
                                                         # from each stopped arm's last checkpoint
    python -m benchmarks.learning_matrix ... --steps 15  # the 5x-longer arms of the same recipe, each
                                                         # also paired with its config-length arm
    python -m benchmarks.learning_matrix ... --steps 75 --versus-step 30  # each arm's end against
                                                         # its own step 30, per arm and pooled
    python -m benchmarks.learning_matrix ... --steps 15 --label anchored \
        --set train.lr_schedule=cosine --set algorithm.kl_coef=0.05  # a recipe variant, in arms of its
                                                         # own name, paired with the config's arms
                                                         # (and with its 15-step arms where run)

An arm is the README's main job, unchanged but for its seed and precision: ``flowgrpo train CONFIG
--set train.seed=S --set model.autocast=... --eval-n N`` in a process of its own, writing
``ROOT/<config>/<precision>-seed<S>[-steps<K>][-<label>]/``: ``--label`` names a recipe variant
(its ``--set`` overrides), so its arms never overwrite or stand in for the config's own.
``train.seed`` reseeds the warm start too (its demonstration order and its sampling), so each arm is
compared with its own warm start, on the same held-out tasks (greedy), by an exact McNemar test.
The pooled row concatenates the paired outcomes of every arm of a config: under "RL changes
nothing" each discordant pair is a fair coin in every arm, so the pooled McNemar test is valid
across arms with different warm starts.

An arm's checkpoints (~2.6 GB for the calculator agent: the warm start and the saved steps that
``run.keep_last`` keeps, with their optimizer state) are deleted once its evaluations are read
back, since the table needs only ``eval.jsonl``; ``--keep-checkpoints`` keeps them, to export or
resume an arm. An arm that a signal or a crash stopped before its last step keeps them too, and the
next ``--run`` continues it from its latest checkpoint (``run.resume=true``), so a run longer than
one sitting is the same command repeated; on another machine it is left as it stands, since its
steps would mix two numeric paths.

Every arm records the machine it ran on (CPU model and flags, GPU, torch) in ``machine.json`` and
its wall time and peak resident memory in ``wall.json``; the table names both per row. Compare an
arm only with its own warm start and with arms of the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from benchmarks._common import machine_info
from flowgrpo.algorithms.stats import PairedComparison, paired_difference
from flowgrpo.config import parse_override
from flowgrpo.modeling.hardware import fast_bf16, resolve_device
from flowgrpo.runs.checkpoint import checkpoint_step
from flowgrpo.runs.evaluation import EvalResult
from flowgrpo.runs.rundir import RunDir

PRECISIONS: dict[str, list[str]] = {
    "fp32": ["model.autocast=null", "model.rollout_dtype=float32"],
    "bf16": ["model.autocast=bfloat16", "model.rollout_dtype=bfloat16"],
    "bf16-sampling": ["model.autocast=null", "model.rollout_dtype=bfloat16"],
    "fp16": ["model.autocast=float16", "model.rollout_dtype=float16"],
    "fp16-sampling": ["model.autocast=null", "model.rollout_dtype=float16"],
    "auto": ["model.autocast=auto", "model.rollout_dtype=auto"],
}
"""The numeric paths an arm can take: the overrides that select sampling and update precision
(``algorithm.tis: auto`` then corrects the sampler/trainer gap wherever they differ; ``auto``: the
config's rules for this machine)."""

BF16_PATHS = ("bf16", "bf16-sampling")
"""The paths that compute in bf16: the matrix measures them only where bf16 is native."""


def machine_label(m: dict[str, Any]) -> str:
    if m.get("gpu"):
        return str(m["gpu"])
    flags = m.get("cpu_flags", [])
    native = "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "avx2"
    return f"{m.get('cores')}-core CPU ({native})"


def arm_name(precision: str, seed: int, steps: int | None, label: str | None = None) -> str:
    return f"{precision}-seed{seed}" + (f"-steps{steps}" if steps else "") + (f"-{label}" if label else "")


def run_arm(
    config: str,
    out: Path,
    precision: str,
    seed: int,
    steps: int | None,
    eval_n: int,
    extra: list[str],
    *,
    stop_at: float | None = None,
    resume: bool = False,
) -> int:
    """The main job for one arm, in its own process (a crash or a kill loses only this arm);
    ``stop_at``: see :func:`run_logged`; ``resume``: go on from the arm's latest checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        (out / "machine.json").write_text(json.dumps(machine_info(), indent=1))
    sets = [
        *PRECISIONS[precision],
        f"train.seed={seed}",
        f"run.output_dir={out}",
        "run.progress=false",
        *extra,
        *(["run.resume=true"] if resume else []),
    ]
    if steps:
        sets.append(f"train.steps={steps}")
    cmd = [sys.executable, "-m", "flowgrpo", "train", config, "--eval-n", str(eval_n), "--untrained-n", "0"]
    cmd += ["--no-report"] + [a for s in sets for a in ("--set", s)]
    print("$", " ".join(cmd), flush=True)
    resume = resume or resumes(extra)
    rc, wall_min, peak_gb = run_logged(cmd, out / "train.log", append=resume, stop_at=stop_at)
    record_cost(out / "wall.json", rc, wall_min, peak_gb, resume=resume)
    return rc


NUMERIC_MACHINE = ("cpu", "cpu_flags", "gpu", "torch")
"""What of ``machine_info()`` decides an arm's numerics: an arm is continued only where these match."""


def same_numerics(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in NUMERIC_MACHINE)


def resumes(overrides: list[str]) -> bool:
    """Whether ``--set`` overrides resume the arm's run: the last ``run.resume`` wins, parsed as
    ``flowgrpo train`` parses it (``true``, ``True``, ``yes`` or a checkpoint's path resume)."""
    value: object = False
    for text in overrides:
        path, parsed = parse_override(text)
        if path == ["run", "resume"]:
            value = parsed
    return bool(value)


def record_cost(path: Path, rc: int, wall_min: float, peak_gb: float, *, resume: bool) -> None:
    """Write an arm's exit code, wall minutes and peak memory to ``path``. A resumed run adds its
    minutes to those already recorded and keeps the higher peak, so the table's wall column is what
    the whole arm cost, not its last piece."""
    earlier = json.loads(path.read_text()) if resume and path.is_file() else {}
    cost = {
        "rc": rc,
        "wall_min": earlier.get("wall_min", 0.0) + wall_min,
        "peak_rss_gb": max(earlier.get("peak_rss_gb", 0.0), peak_gb),
        "runs": earlier.get("runs", 1 if earlier else 0) + 1,
    }
    path.write_text(json.dumps(cost))


def run_logged(
    cmd: list[str], log: Path, *, append: bool = False, stop_at: float | None = None
) -> tuple[int, float, float]:
    """Run ``cmd`` with its output in ``log`` (after what it holds when ``append``, as for a resumed
    arm); returns its exit code, wall minutes and peak resident memory in GB (``ru_maxrss`` of that
    child from ``os.wait4``). An arm's peak is what decides whether a recipe fits a machine: a
    12-step search run outgrew 24 GiB (docs/learning.md 10.3).

    ``stop_at`` (a ``time.monotonic()`` instant): SIGTERM the child if it is still running then; a
    training run checkpoints and evaluates the step it reached, as on a lent machine whose minutes
    end before the arm's steps do."""
    t0 = time.monotonic()
    with open(log, "a" if append else "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        exited, lock = threading.Event(), threading.Lock()

        def stop() -> None:
            with lock:
                if not exited.is_set():
                    proc.send_signal(signal.SIGTERM)

        timer = threading.Timer(max(0.0, stop_at - t0), stop) if stop_at is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its pid is still its own
        with lock:
            exited.set()
        if timer is not None:
            timer.cancel()
        _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, (time.monotonic() - t0) / 60, rusage.ru_maxrss * 1024 / 1e9


def prune_checkpoints(out: Path) -> int:
    """Delete an arm's ``checkpoints/``; returns the bytes freed."""
    root = out / "checkpoints"
    if not root.is_dir():
        return 0
    freed = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    shutil.rmtree(root)
    return freed


def shared_tasks(a: EvalResult, b: EvalResult) -> list[str]:
    """The task ids both evaluations hold, in ``a``'s order."""
    return [t for t in a.per_task if t in b.per_task]


def paired_outcomes(a: EvalResult, b: EvalResult) -> tuple[list[int], list[int]]:
    """Per-task outcomes of two evaluations on the tasks both hold, in ``a``'s order: the pairs of
    one paired test, which pooled tests concatenate across arms."""
    shared = shared_tasks(a, b)
    return a.outcomes(shared), b.outcomes(shared)


class Arm:
    """One finished arm, read back from its run directory."""

    def __init__(self, out: Path) -> None:
        self.out = out
        evals = RunDir(out).evals()
        warm = [e for e in evals if e.label == "warm"]
        final = [e for e in evals if e.label.startswith("step") and e.n == warm[-1].n] if warm else []
        if not warm or not final:
            raise ValueError(f"{out}: no warm-start and final evaluation of the same n in eval.jsonl")
        self.warm, self.final = warm[-1], final[-1]
        self.a, self.b = paired_outcomes(self.warm, self.final)
        self.cmp: PairedComparison = paired_difference(self.a, self.b)
        curve = [e for e in evals if e.label.startswith("step") and e is not self.final]
        self.curve = [(e.label, e.accuracy, e.n) for e in curve]
        # step -> its widest evaluation: a curve on the first 200 tasks pairs with a final on 500
        self.steps_evaluated: dict[int, EvalResult] = {}
        for e in evals:
            wider = e.step not in self.steps_evaluated or e.n > self.steps_evaluated[e.step].n
            if e.label.startswith("step") and wider:
                self.steps_evaluated[e.step] = e
        mfile = out / "machine.json"
        self.machine = json.loads(mfile.read_text()) if mfile.is_file() else {}
        wall = out / "wall.json"
        spent = json.loads(wall.read_text()) if wall.is_file() else {}
        self.wall_min: float | None = spent.get("wall_min")
        self.peak_rss_gb: float | None = spent.get("peak_rss_gb")
        cfg = out / "config.yaml"
        self.steps: int | None = yaml.safe_load(cfg.read_text())["train"]["steps"] if cfg.is_file() else None

    @property
    def stopped_early(self) -> bool:
        """Its final evaluation is of a step before ``train.steps``: a signal or a crash stopped it."""
        return self.steps is not None and self.final.step < self.steps

    @property
    def trained_to(self) -> int | None:
        """The step of its latest checkpoint; None when it kept none."""
        latest = RunDir(self.out).latest_checkpoint()
        return None if latest is None else checkpoint_step(latest)


def difference_cells(c: PairedComparison) -> str:
    """``difference [95% CI] | p`` of one paired comparison, in points."""
    lo, hi = c.ci95
    return f"{100 * c.difference:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] | {c.p_value:.2g}"


def wall_cell(arm: Arm) -> str:
    """``47 min, peak 17.3 GB``: what the arm cost, where it was recorded."""
    parts = [f"{arm.wall_min:.0f} min"] if arm.wall_min else []
    parts += [f"peak {arm.peak_rss_gb:.1f} GB"] if arm.peak_rss_gb else []
    return ", ".join(parts) or "-"


def pool_command(rows: list[tuple[str, Arm]]) -> str:
    """The arms' 2x2 counts (warm start against final) as a ``benchmarks.pool_tables`` command: how
    they join a pooled test with arms whose run directories stayed on another machine."""
    return "python -m benchmarks.pool_tables " + " ".join(
        f"--arm {name}={arm.cmp.counts}" for name, arm in rows
    )


def table(rows: list[tuple[str, Arm]], pooled: PairedComparison | None) -> str:
    head = (
        "| arm | machine | warm start | after RL | difference [95% CI] | p | curve during RL | wall, memory |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name, arm in rows:
        c = arm.cmp
        curve = " ".join(f"{acc:.2f}" for _, acc, _ in arm.curve) or "-"
        n_curve = arm.curve[0][2] if arm.curve else None
        reached = f" (step {arm.final.step} of {arm.steps})" if arm.stopped_early else ""
        lines.append(
            f"| {name} | {machine_label(arm.machine)} | {c.accuracy_a:.3f} | {c.accuracy_b:.3f}{reached} | "
            f"{difference_cells(c)} | "
            f"{curve}{f' (n={n_curve})' if n_curve else ''} | "
            f"{wall_cell(arm)} |"
        )
    if pooled is not None:
        machines = {machine_label(arm.machine) for _, arm in rows}
        where = machines.pop() if len(machines) == 1 else "several"
        lines.append(
            f"| **pooled** ({len(rows)} arms, n={pooled.n}) | {where} | {pooled.accuracy_a:.3f} | {pooled.accuracy_b:.3f} | "
            f"{difference_cells(pooled)} | | |"
        )
    return head + "\n".join(lines)


def step_signals(out: Path) -> list[dict[str, float]]:
    """The RL steps of an arm's ``metrics.jsonl`` (not the warm start's or the evaluations' lines):
    what says why an arm gained or not (docs/learning.md section 10): how far the sampler's logprobs
    sit from the trainer's at the first update, exploration, how many sampled groups carried a
    signal, the distance from the warm start, and where the step's time went. A step whose groups
    all carried one reward has no update, and is kept: it is what "groups trained 0/G" counts."""
    return [m.values for m in RunDir(out).metrics() if "episodes" in m.values]


def signals_table(rows: list[tuple[str, Arm]]) -> str:
    """One line per arm, one comma-separated entry per RL step: "-" for a step without the field
    (no update: no ratio, entropy or KL), a lone "-" where the run predates the field."""
    cells = {
        "ratio": lambda s: f"{s['sampler_ratio_min']:.2f}-{s['sampler_ratio_max']:.2f}",
        "entropy": lambda s: f"{s['entropy']:.3f}",
        "groups": lambda s: f"{s['groups_trained']:.0f}/{s['groups_sampled']:.0f}",
        "kl": lambda s: f"{s['kl'] if abs(s['kl']) >= 5e-4 else 0.0:.3f}",  # k1 estimates dip below 0
        "time": lambda s: f"{s['time/rollout_s']:.0f}+{s['time/update_s']:.0f} s",
    }

    def entry(step: dict[str, float], cell: Any) -> str:
        try:
            return cell(step)
        except KeyError:
            return "-"

    def per_step(steps: list[dict[str, float]], cell: Any) -> str:
        entries = [entry(s, cell) for s in steps]
        return "-" if set(entries) == {"-"} else ", ".join(entries)

    head = (
        "| arm | sampler ratio min-max | entropy (nats/token) | groups trained / sampled | KL | "
        "rollout + update |\n|---|---|---|---|---|---|\n"
    )
    lines = []
    for name, arm in rows:
        if st := step_signals(arm.out):
            lines.append(f"| {name} | " + " | ".join(per_step(st, c) for c in cells.values()) + " |")
    return head + "\n".join(lines) if lines else ""


def versus_short(rows: list[tuple[str, Arm]], short: dict[str, Arm]) -> str:
    """Each longer (or relabelled) arm's final checkpoint against the final checkpoint of the config's
    own run (its steps, no label; same seed and precision), paired on the tasks both evaluated, per arm
    and pooled: is more RL, or the variant, worse than what the config gives? The last column counts
    the tasks on which the two warm starts agree: all of them when the warm start is reproducible, so
    the difference is the RL phase's alone."""
    head = (
        "| arm | config's run: after RL | this arm: after RL | difference [95% CI] | p | warm starts agree |\n"
        "|---|---|---|---|---|---|\n"
    )
    lines, a, b = [], [], []
    for name, arm in rows:
        base = short.get(name)
        if base is None:
            continue
        xa, xb = paired_outcomes(base.final, arm.final)
        a += xa
        b += xb
        c = paired_difference(xa, xb)
        wa, wb = paired_outcomes(base.warm, arm.warm)
        agree = sum(x == y for x, y in zip(wa, wb, strict=True))
        lines.append(
            f"| {name} | {c.accuracy_a:.3f} (step {base.final.step}) | {c.accuracy_b:.3f} (step {arm.final.step}) | "
            f"{difference_cells(c)} | {agree}/{len(wa)} |"
        )
    return head + "\n".join(with_pooled(lines, a, b, empty_cells=1)) if lines else ""


def versus_step(rows: list[tuple[str, Arm]], step: int) -> str:
    """Each arm's final checkpoint against its own evaluation at ``step`` (same run), paired on the
    tasks both evaluated (all of them, or the first ``run.eval_n`` when the curve is narrower than the
    final), and the pooled test over the arms that have one: does running on from ``step`` end at or
    above it? Arms resumed from a shorter run carry that run's evaluations, so ``step`` can be the
    short run's end. The peak column is the curve's highest evaluation on those tasks and how far the
    final sits below it there: a spike and decay shows there. The peak is picked after the fact, so
    it gets no p-value."""
    head = (
        f"| arm | step {step} | after RL | difference [95% CI] | p | peak of the curve | final - peak |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    lines, a, b = [], [], []
    for name, arm in rows:
        short = arm.steps_evaluated.get(step)
        if short is None or short is arm.final:
            continue
        shared = shared_tasks(short, arm.final)
        xa, xb = short.outcomes(shared), arm.final.outcomes(shared)
        a += xa
        b += xb
        c = paired_difference(xa, xb)
        on_shared = {  # step -> accuracy on the paired tasks, for every evaluation that holds them all
            s: sum(e.outcomes(shared)) / (len(shared) * e.samples)
            for s, e in arm.steps_evaluated.items()
            if all(t in e.per_task for t in shared)
        }
        peak = max(on_shared, key=lambda s: (on_shared[s], -s))
        n = f" (n={len(shared)})" if len(shared) < arm.final.n else ""
        lines.append(
            f"| {name} | {c.accuracy_a:.3f}{n} | {c.accuracy_b:.3f} (step {arm.final.step}) | {difference_cells(c)} | "
            f"{on_shared[peak]:.3f} (step {peak}) | {100 * (c.accuracy_b - on_shared[peak]):+.1f} |"
        )
    return head + "\n".join(with_pooled(lines, a, b, empty_cells=2)) if lines else ""


def with_pooled(lines: list[str], a: list[int], b: list[int], empty_cells: int) -> list[str]:
    """The table's rows, and below them, when there are two or more, the pooled test of their
    concatenated paired outcomes ``a`` and ``b`` (see the module docstring), with ``empty_cells``
    blank columns after the p-value."""
    if len(lines) < 2:
        return lines
    pooled = paired_difference(a, b)
    return [
        *lines,
        f"| **pooled** ({len(lines)} arms, n={pooled.n}) | {pooled.accuracy_a:.3f} | {pooled.accuracy_b:.3f} | "
        f"{difference_cells(pooled)} |" + " |" * empty_cells,
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="examples/calculator_agent.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--precision", nargs="+", default=["fp32"], choices=sorted(PRECISIONS))
    ap.add_argument(
        "--steps", type=int, default=None, help="train.steps of every arm (default: the config's)"
    )
    ap.add_argument(
        "--eval-n", type=int, default=500, help="held-out tasks of the warm and final evaluations"
    )
    ap.add_argument("--root", default="runs/matrix")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--label",
        default=None,
        help="name of the recipe variant the --set overrides make; appended to its arms' names",
    )
    ap.add_argument(
        "--run",
        action="store_true",
        help="run the arms that have no final evaluation yet, and continue from its latest checkpoint "
        "each arm that stopped before its last step on this machine",
    )
    ap.add_argument(
        "--per-step",
        action="store_true",
        help="also print each arm's per-step signals: sampler ratio, entropy, groups with a signal, KL, time",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="arms run at once (default 1). One GPU serves several arms of a small model: the demo's "
        "six arms took 286 s side by side on one H200. On a CPU keep 1: arms would share its cores",
    )
    ap.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="SIGTERM every arm still running SECONDS after this command started: each checkpoints and "
        "evaluates the step it reached (the table shows that step), as a lent GPU's minutes require",
    )
    ap.add_argument(
        "--versus-step",
        type=int,
        default=None,
        metavar="STEP",
        help="also pair each arm's final checkpoint with its own evaluation at STEP, per arm and pooled: "
        "a run continued past STEP (run.resume=true with more train.steps) against where it stood",
    )
    ap.add_argument(
        "--allow-emulated",
        action="store_true",
        help="run bf16 arms on a machine without native bf16 (a CPU without avx512_bf16/AMX), where "
        "decoding is emulated and several times slower; refused without this flag",
    )
    ap.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep the checkpoints of the arms this command runs (default: delete them once evaluated, "
        "unless the arm stopped before its last step)",
    )
    args = ap.parse_args(argv)
    stop_at = None if args.stop_after is None else time.monotonic() + args.stop_after

    base = Path(args.root) / Path(args.config).stem
    order: list[str] = []
    done: dict[str, Arm] = {}
    todo: list[tuple[str, Path, str, int, bool]] = []  # (name, out, precision, seed, resume)
    missing: list[str] = []
    here = machine_info() if args.run else {}  # only --run compares machines or starts arms
    for precision in args.precision:
        for seed in args.seeds:
            name = arm_name(precision, seed, args.steps, args.label)
            out = base / name
            order.append(name)
            try:
                arm = Arm(out)
            except (OSError, ValueError):
                if args.run:
                    todo.append((name, out, precision, seed, False))
                else:
                    missing.append(name)
                continue
            if args.run and arm.stopped_early and arm.trained_to is not None:
                if same_numerics(arm.machine, here):
                    todo.append((name, out, precision, seed, True))
                    continue
                print(
                    f"{name}: stopped at step {arm.final.step} of {arm.steps} on {machine_label(arm.machine)} "
                    f"({arm.machine.get('cpu')}, torch {arm.machine.get('torch')}); not continued here, "
                    "where its remaining steps would take another numeric path",
                    file=sys.stderr,
                )
            done[name] = arm

    emulated = sorted({p for _, _, p, _, _ in todo if p in BF16_PATHS})
    if emulated and not args.allow_emulated and not fast_bf16(resolve_device("auto").type):
        print(
            f"--precision {' '.join(emulated)}: this machine ({machine_label(here)}) has no native bf16, "
            "so those arms would sample under emulation, several times slower, on a numeric path that says "
            "nothing about where bf16 is native. Run --precision fp32 (or auto) here, or add --allow-emulated",
            file=sys.stderr,
        )
        return 2

    def run_one(item: tuple[str, Path, str, int, bool]) -> int | None:
        _, out, precision, seed, resume = item
        if stop_at is not None and time.monotonic() >= stop_at:
            return None  # its deadline passed while it queued: not started
        return run_arm(
            args.config,
            out,
            precision,
            seed,
            args.steps,
            args.eval_n,
            args.overrides,
            stop_at=stop_at,
            resume=resume,
        )

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each arm is a process of its own
        exit_codes = list(pool.map(run_one, todo))
    for (name, out, _, _, resume), rc in zip(todo, exit_codes, strict=True):
        if rc is None:
            print(f"{name}: not started, --stop-after {args.stop_after:g} s had passed", file=sys.stderr)
            if not resume:
                missing.append(name)
                continue
        try:
            done[name] = Arm(out)
        except (OSError, ValueError) as e:
            print(f"{name}: exit {rc}, no result ({e}); see {out / 'train.log'}", file=sys.stderr)
            missing.append(name)
            continue
        arm = done[name]
        if arm.stopped_early and arm.trained_to == arm.steps:
            print(
                f"{name}: trained all {arm.steps} steps, but its final evaluation was cut short, so the "
                f"table shows step {arm.final.step}; kept its checkpoints in {out / 'checkpoints'} "
                f"(--run again evaluates step {arm.steps})"
            )
        elif arm.stopped_early:
            print(
                f"{name}: stopped at step {arm.final.step} of {arm.steps}; kept its checkpoints "
                f"in {out / 'checkpoints'} (--run again continues it)"
            )
        elif not args.keep_checkpoints and (freed := prune_checkpoints(out)):
            print(f"{name}: deleted its checkpoints ({freed / 2**30:.1f} GiB; --keep-checkpoints keeps them)")
    rows = [(name, done[name]) for name in order if name in done]
    missing.sort(key=order.index)
    pooled = None
    if len(rows) > 1:
        pooled = paired_difference([x for _, r in rows for x in r.a], [x for _, r in rows for x in r.b])
    print(f"{args.config}: warm start vs after RL, greedy, paired on the same held-out tasks\n")
    print(table(rows, pooled))
    if rows:
        print("\n2x2 counts (both right, only the warm start, only the final, neither), to pool elsewhere:\n")
        print(f"    {pool_command(rows)}")
    if args.per_step and (signals := signals_table(rows)):
        print("\nper RL step, from each arm's metrics.jsonl (first minibatch's sampler ratio)\n")
        print(signals)
    # a longer or relabelled arm against the config's own run; a labelled longer arm also against
    # the config's run of its own length, the control that isolates the variant's --set overrides
    what = " ".join(filter(None, [f"{args.steps}-step" if args.steps else "", args.label]))
    baselines: list[int | None] = [None] if args.steps or args.label else []
    if args.steps and args.label:
        baselines.append(args.steps)
    for steps in baselines:
        short: dict[str, Arm] = {}
        for precision in args.precision:
            for seed in args.seeds:
                with contextlib.suppress(OSError, ValueError):
                    name = arm_name(precision, seed, args.steps, args.label)
                    short[name] = Arm(base / arm_name(precision, seed, steps))
        if vs := versus_short(rows, short):
            run = f"{steps}-step run" if steps else "run"
            print(f"\nthe {what} arms against the config's own {run}, final vs final, same tasks\n")
            print(vs)
    if args.versus_step is not None:
        vs_step = versus_step(rows, args.versus_step)
        print(f"\nafter RL against each arm's own step {args.versus_step}, same tasks\n")
        print(vs_step or f"no arm has an evaluation at step {args.versus_step} before its final")
    if missing:
        print(f"\nnot run yet: {', '.join(missing)} (add --run)")
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
