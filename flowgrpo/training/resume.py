"""Which checkpoint a resumed run starts from, and what happens when there is none to trust.

Two failures must never pass silently (:class:`~flowgrpo.runs.checkpoint.CheckpointError`, one line each):

- the latest checkpoint is unreadable (an empty or truncated file after a full disk or a crash
  outside the atomic write): the error names the file; with ``run.resume_fallback`` the run resumes
  from the newest older checkpoint that reads, and says which;
- the checkpoints vanished while the run's records remain (``metrics.jsonl``, trajectories): starting
  from step 0 would write a second run into the first one's logs, so it is refused unless
  ``run.start_over`` is set, which moves the old records aside first.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from flowgrpo.config import RunSection
from flowgrpo.runs.checkpoint import CheckpointData, CheckpointError, read_checkpoint, resume_candidates

log = logging.getLogger(__name__)

RECORDS = ("metrics.jsonl", "trajectories", "eval.jsonl", "eval")


def earlier_records(out: str | os.PathLike) -> list[Path]:
    """The records of an earlier run in ``out`` that a fresh start would mix with its own."""
    out = Path(out)
    found = []
    metrics = out / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(metrics)
    traj = out / "trajectories"
    if traj.is_dir() and any(traj.glob("step_*.jsonl")):
        found.append(traj)
    return found


def move_aside(out: str | os.PathLike) -> Path:
    """Move the run's records into ``out/discarded-<UTC time>/`` and return that folder."""
    out = Path(out)
    target = out / time.strftime("discarded-%Y%m%dT%H%M%SZ", time.gmtime())
    target.mkdir(parents=True, exist_ok=False)
    for name in RECORDS:
        if (out / name).exists():
            shutil.move(str(out / name), str(target / name))
    return target


def choose_checkpoint(
    out: str | os.PathLike, path: str | os.PathLike | None, run: RunSection
) -> CheckpointData | None:
    """The checkpoint to resume from (read, nothing applied), or None to start from step 0.

    ``path``: an explicit checkpoint (its errors are final). Otherwise the latest under
    ``out/checkpoints``, falling back to older ones only with ``run.resume_fallback``.
    """
    if path is not None:
        return read_checkpoint(path)
    out = Path(out)
    root = out / "checkpoints"
    candidates = resume_candidates(root)
    if not candidates:
        records = earlier_records(out)
        if records and not run.start_over:
            raise CheckpointError(
                f"{out} holds an earlier run's records ({', '.join(p.name for p in records)}) but no "
                f"checkpoint under {root}: resuming would restart from step 0 into its logs; set "
                "run.start_over=true to start again (the old records are moved aside) or choose a new "
                "run.output_dir"
            )
        if records:
            log.warning("no checkpoint under %s: old records moved to %s", root, move_aside(out))
        log.info("no checkpoint under %s: starting from step 0", root)
        return None
    for i, candidate in enumerate(candidates):
        try:
            data = read_checkpoint(candidate)
        except CheckpointError as e:
            older = candidates[i + 1 :]
            if not older:
                raise CheckpointError(
                    f"{e}; no older intact checkpoint: set run.start_over=true to start again"
                ) from e
            if not run.resume_fallback:
                raise CheckpointError(
                    f"{e}; set run.resume_fallback=true to resume from the previous checkpoint "
                    f"({older[0].name}), or run.resume=PATH to choose one"
                ) from e
            log.warning("%s; falling back to %s", e, older[0])
            continue
        return data
    return None  # unreachable: the last candidate either returns or raises


__all__ = ["choose_checkpoint", "earlier_records", "move_aside"]
