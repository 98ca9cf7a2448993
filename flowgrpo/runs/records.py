"""Rewinding a run's records to the step it resumes from, so no step is recorded twice.

A run killed between checkpoints has written trajectories and metrics for steps after its last
checkpoint; resuming re-runs those steps. Left in place, ``trajectories/step_NNNNNN.jsonl`` would
hold two copies of a step and ``metrics.jsonl`` two lines for it. :func:`rewind_records` moves every
record of a later step (and torn lines) aside into ``RUN/superseded/<time>/`` before the first step
re-runs: nothing is deleted, and the run's own files read as one straight run.

Records per step: ``trajectories/step_NNNNNN.jsonl`` (by file name), ``metrics.jsonl`` and
``eval.jsonl`` (by their ``step`` field), ``eval/LABEL.jsonl`` (the episodes of an evaluation moved
aside, unless a kept evaluation has the same label).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


@dataclass
class Rewound:
    """What :func:`rewind_records` moved aside, and where."""

    folder: Path | None = None
    trajectory_files: list[str] = field(default_factory=list)
    metric_lines: int = 0
    eval_lines: int = 0
    eval_files: list[str] = field(default_factory=list)
    torn_lines: int = 0

    @property
    def moved(self) -> bool:
        return bool(self.trajectory_files or self.metric_lines or self.eval_lines or self.eval_files)

    def describe(self, step: int) -> str:
        if not self.moved and not self.torn_lines:
            return f"resuming at step {step}: no records of later steps to move aside"
        return (
            f"resuming at step {step}: moved the records of later steps to {self.folder} "
            f"({len(self.trajectory_files)} trajectory files, {self.metric_lines} metrics lines, "
            f"{self.eval_lines} evaluations, {len(self.eval_files)} evaluation episode files, "
            f"{self.torn_lines} torn lines); they re-run from here"
        )


def rewind_records(out: str | os.PathLike, step: int) -> Rewound:
    """Move every record of a step after ``step`` out of the run directory ``out`` (see the module
    docstring). Idempotent: a second call finds nothing to move."""
    out = Path(out)
    done = Rewound()
    aside = out / "superseded" / time.strftime("%Y%m%d-%H%M%S")

    def folder() -> Path:
        if done.folder is None:
            n = 0
            while (candidate := aside.with_name(f"{aside.name}-{n}" if n else aside.name)).exists():
                n += 1
            candidate.mkdir(parents=True)
            done.folder = candidate
        return done.folder

    traj = out / "trajectories"
    if traj.is_dir():
        for p in sorted(traj.iterdir()):
            m = _STEP_FILE.match(p.name)
            if m and int(m.group(1)) > step:
                (folder() / "trajectories").mkdir(exist_ok=True)
                os.replace(p, folder() / "trajectories" / p.name)
                done.trajectory_files.append(p.name)

    later, torn = _split_lines(out / "metrics.jsonl", step, folder)
    done.metric_lines, done.torn_lines = later, torn
    kept_labels: set[str] = set()
    moved_labels: set[str] = set()
    later, torn = _split_lines(out / "eval.jsonl", step, folder, kept_labels, moved_labels)
    done.eval_lines, done.torn_lines = later, done.torn_lines + torn
    for label in sorted(moved_labels - kept_labels):
        p = out / "eval" / f"{label}.jsonl"
        if p.is_file():
            (folder() / "eval").mkdir(exist_ok=True)
            os.replace(p, folder() / "eval" / p.name)
            done.eval_files.append(p.name)
    return done


def _split_lines(
    path: Path,
    step: int,
    folder,
    kept_labels: set[str] | None = None,
    moved_labels: set[str] | None = None,
) -> tuple[int, int]:
    """Keep the lines of ``path`` whose ``step`` is at most ``step``; append the others to the same
    file name in the superseded folder. Returns (later lines, torn lines) moved."""
    if not path.is_file():
        return 0, 0
    keep, move = [], []
    later = torn = 0
    for raw in path.read_bytes().split(b"\n"):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            rec_step = rec["step"] if isinstance(rec, dict) else None
        except (ValueError, KeyError, RecursionError):
            rec, rec_step = None, None
        if isinstance(rec_step, int) and rec_step <= step:
            keep.append(raw)
            if kept_labels is not None and isinstance(rec.get("label"), str):
                kept_labels.add(rec["label"])
            continue
        move.append(raw)
        if isinstance(rec_step, int):
            later += 1
            if moved_labels is not None and isinstance(rec.get("label"), str):
                moved_labels.add(rec["label"])
        else:
            torn += 1
    if not move:
        return 0, 0
    with open(folder() / path.name, "ab") as f:
        f.write(b"".join(line + b"\n" for line in move))
    tmp = path.with_name(path.name + ".rewind")
    tmp.write_bytes(b"".join(line + b"\n" for line in keep))
    os.replace(tmp, path)  # atomic: a crash here leaves the old file or the new one, never half
    return later, torn


__all__ = ["Rewound", "rewind_records"]
