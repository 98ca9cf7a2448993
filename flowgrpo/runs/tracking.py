"""Experiment trackers: the step scalars of ``metrics.jsonl`` mirrored to TensorBoard or Weights &
Biases (``run.log_to``).

``metrics.jsonl`` stays the run's record (resume, replay, report and eval read it through
:class:`flowgrpo.runs.rundir.RunDir`); a tracker is a mirror that training writes and nothing reads back,
so evaluating or replaying a run never needs one installed. Each tracker package is imported only
when its tracker is asked for, with an install hint when it is missing.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal, Protocol

Tracker = Literal["jsonl", "tensorboard", "wandb"]
TRACKERS: tuple[str, ...] = ("jsonl", "tensorboard", "wandb")


class MetricSink(Protocol):
    """Receives the finite scalars of one step."""

    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars_of(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite int/float values of ``metrics`` (what a tracker can plot); bools and text drop."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class TensorBoardSink:
    """Scalars to ``RUN/tensorboard`` (``tensorboard --logdir RUN/tensorboard``)."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                "run.log_to contains tensorboard, which needs the tensorboard package: "
                "pip install 'flowgrpo[tensorboard]' (or remove it from run.log_to)"
            ) from e
        self.logdir = Path(logdir)
        self._writer = SummaryWriter(str(self.logdir))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Scalars to a Weights & Biases run. wandb's own environment decides where they go:
    ``WANDB_MODE=offline`` keeps them in ``RUN/wandb`` for a later ``wandb sync``, ``WANDB_PROJECT``
    names the project (default ``flowgrpo``); the run is named after the run directory."""

    def __init__(self, run_dir: str | os.PathLike, config: dict[str, Any] | None = None) -> None:
        try:
            import wandb
        except ImportError as e:
            from flowgrpo.utils.plugins import MissingExtraError

            raise MissingExtraError(
                "run.log_to contains wandb, which is not installed: pip install 'flowgrpo[wandb]' "
                "(set WANDB_MODE=offline to log without an account), or remove it from run.log_to"
            ) from e
        run_dir = Path(run_dir)
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "flowgrpo"),
            name=run_dir.name,
            dir=str(run_dir),
            config=config or {},
            resume="allow",
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


def make_sinks(
    log_to: list[str] | tuple[str, ...], run_dir: str | os.PathLike, config: dict[str, Any] | None = None
) -> list[MetricSink]:
    """The trackers named in ``log_to`` besides ``jsonl`` (which the metrics logger always writes)."""
    sinks: list[MetricSink] = []
    for name in log_to:
        if name == "tensorboard":
            sinks.append(TensorBoardSink(Path(run_dir) / "tensorboard"))
        elif name == "wandb":
            sinks.append(WandbSink(run_dir, config))
        elif name != "jsonl":
            raise ValueError(f"unknown tracker {name!r}; use some of {list(TRACKERS)}")
    return sinks


__all__ = ["TRACKERS", "MetricSink", "TensorBoardSink", "Tracker", "WandbSink", "make_sinks", "scalars_of"]
