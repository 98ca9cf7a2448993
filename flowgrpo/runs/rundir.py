"""A training run's directory, read back with types.

The trainer (:mod:`flowgrpo.training.trainer`) writes one directory per run::

    RUN/config.yaml                        the resolved TrainConfig (flowgrpo.config.dump_config)
    RUN/metrics.jsonl                      {"step": N, name: value, ...} per log call (MetricsLogger)
    RUN/eval.jsonl                         one EvalResult per recorded evaluation, oldest first
    RUN/eval/LABEL.jsonl                   the episodes of the latest evaluation called LABEL
    RUN/trajectories/step_NNNNNN.jsonl     the trajectories of each training step (flowgrpo.runs.store)
    RUN/checkpoints/step_NNNNNN/state.pt   checkpoints, and the ``latest`` pointer (flowgrpo.runs.checkpoint)

:class:`RunDir` is the one reader of it; replay, the report, evaluation and resume go through it.
The config comes back as a validated :class:`~flowgrpo.config.TrainConfig`, metrics as
:class:`MetricRecord`, evaluations as :class:`~flowgrpo.runs.evaluation.EvalResult`, episodes as
:class:`~flowgrpo.types.Trajectory`, checkpoints as :class:`CheckpointRef`.

The JSONL files are append-only; a process killed mid-write tears the line it was writing, and a
later writer starts on a fresh line after it. A torn or garbage line, wherever it is, is skipped
with a warning naming the file and the line: it loses only itself.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from flowgrpo.config import ConfigError, TrainConfig, apply_overrides, config_from_dict, upgrade_saved_config
from flowgrpo.runs.evaluation import EvalResult
from flowgrpo.runs.store import StoreError, iter_jsonl, iter_trajectories
from flowgrpo.types import Trajectory

log = logging.getLogger(__name__)

T = TypeVar("T")

STEP_NAME_RE = re.compile(r"^step_(\d+)$")
PARTS = ("config.yaml", "metrics.jsonl", "eval.jsonl", "trajectories", "checkpoints")


class RunError(ValueError):
    """A run directory that cannot be read; the message says what is missing and how to fix it."""


class MetricRecord(BaseModel):
    """One line of ``metrics.jsonl``: the step and the values logged at it. Non-finite values,
    which :class:`~flowgrpo.runs.metrics.MetricsLogger` writes as the strings ``"nan"``/``"inf"``,
    come back as floats."""

    model_config = ConfigDict(frozen=True)

    step: int
    values: dict[str, float]


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint directory (``RUN/checkpoints/step_NNNNNN``) and the step it was saved at."""

    step: int
    path: Path


class RunDir:
    """A training run's directory, read with types.

    Metrics and evaluations are read from disk on every call (a running trainer appends to them);
    the config and each step's trajectories are read once.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise RunError(f"{self.path} is not a directory; pass the run directory the trainer wrote (RUN/)")
        if not any((self.path / p).exists() for p in PARTS):
            raise RunError(
                f"{self.path} holds none of {', '.join(PARTS)}: it is not a flowgrpo run directory "
                "(the trainer's run.output_dir)"
            )
        self._config: TrainConfig | None = None
        self._trajectories: dict[int, list[Trajectory]] = {}

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    # ------------------------------------------------------------------ config

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    def has_config(self) -> bool:
        return self.config_path.is_file()

    def config(self, overrides: Sequence[str] = ()) -> TrainConfig:
        """The run's :class:`TrainConfig` with ``run.output_dir`` pointing here (a moved run still
        finds itself), then dotted ``overrides`` (``["rollout.max_turns=3"]``; a bad one raises
        :class:`~flowgrpo.config.ConfigError`). A config that does not validate against this
        version of flowgrpo is a :class:`RunError` naming the wrong key."""
        if self._config is None:
            if not self.has_config():
                raise RunError(
                    f"{self.path} has no config.yaml: the trainer writes one when a run starts; "
                    "pass a run directory the trainer wrote, or a config file"
                )
            try:
                data = yaml.safe_load(self.config_path.read_text())
                if not isinstance(data, dict):
                    raise ConfigError("config.yaml does not hold a mapping of sections")
                for change in upgrade_saved_config(data):
                    log.info("%s: read with today's keys (%s)", self.config_path, change)
                cfg = config_from_dict(data)
            except (ConfigError, yaml.YAMLError) as e:
                raise RunError(
                    f"{self.config_path} does not validate against this flowgrpo's TrainConfig "
                    f"(a run written by another version?): {e}"
                ) from None
            cfg.run.output_dir = str(self.path)
            self._config = cfg
        if overrides:
            return config_from_dict(apply_overrides(self._config.model_dump(mode="json"), list(overrides)))
        return self._config.model_copy(deep=True)

    # ------------------------------------------------------------------ metrics and evaluations

    def metrics(self) -> list[MetricRecord]:
        """Every line of ``metrics.jsonl`` in order (``[]`` before the first step)."""

        def parse(rec: dict[str, Any]) -> MetricRecord:
            values = {k: v for k, v in rec.items() if k != "step"}
            return MetricRecord.model_validate({"step": rec.get("step"), "values": values})

        return self._read(self.path / "metrics.jsonl", parse)

    def evals(self) -> list[EvalResult]:
        """The recorded evaluations (``eval.jsonl``), oldest first. Lines written before results
        carried a confidence interval (no ``ci95``) are skipped with a warning."""
        path = self.path / "eval.jsonl"
        found = self._read(path, lambda rec: EvalResult.model_validate(rec) if "ci95" in rec else None)
        out = [e for e in found if e is not None]
        if len(out) < len(found):
            log.warning(
                "%s: skipped %d evaluations of an older format (no ci95)", path, len(found) - len(out)
            )
        return out

    def find_eval(self, label: str, split: str = "test") -> EvalResult | None:
        """The latest greedy evaluation called ``label`` on ``split``, or None."""
        hits = [e for e in self.evals() if e.label == label and e.split == split and e.greedy]
        return hits[-1] if hits else None

    def eval_labels(self) -> list[str]:
        """Labels of the evaluations whose episodes were recorded (``eval/LABEL.jsonl``)."""
        folder = self.path / "eval"
        return sorted(p.stem for p in folder.glob("*.jsonl")) if folder.is_dir() else []

    def eval_episodes(self, label: str) -> list[Trajectory]:
        """The episodes of the latest recorded evaluation called ``label``."""
        path = self.path / "eval" / f"{label}.jsonl"
        if not path.is_file():
            raise RunError(
                f"{path} does not exist: no recorded episodes of an evaluation called {label!r} "
                f"(recorded: {', '.join(self.eval_labels()) or 'none'}); evaluate with record=True"
            )
        return self._read_trajectories(path)

    # ------------------------------------------------------------------ trajectories

    def _step_files(self) -> dict[int, Path]:
        folder = self.path / "trajectories"
        out: dict[int, Path] = {}
        if folder.is_dir():
            for p in folder.glob("step_*.jsonl"):
                m = STEP_NAME_RE.match(p.stem)
                if m and p.is_file():
                    out[int(m.group(1))] = p
        return out

    def steps(self) -> list[int]:
        """Steps with saved trajectories, ascending."""
        return sorted(self._step_files())

    def trajectories(self, step: int) -> list[Trajectory]:
        """The trajectories saved at ``step`` (parsed on first access: a long run holds hundreds of
        MB of token ids, and replaying one step should not parse them all)."""
        if step not in self._trajectories:
            files = self._step_files()
            if step not in files:
                where = self.path / "trajectories"
                raise RunError(
                    f"no trajectories saved for step {step} in {where}; saved steps: {ranges(sorted(files))}"
                )
            self._trajectories[step] = self._read_trajectories(files[step])
        return self._trajectories[step]

    # ------------------------------------------------------------------ checkpoints

    @property
    def checkpoint_root(self) -> Path:
        return self.path / "checkpoints"

    def checkpoints(self) -> list[CheckpointRef]:
        """Complete checkpoints (those with ``state.pt``), by step."""
        from flowgrpo.runs.checkpoint import list_checkpoints

        refs = []
        for p in list_checkpoints(self.checkpoint_root):
            m = STEP_NAME_RE.match(p.name)
            if m:
                refs.append(CheckpointRef(int(m.group(1)), p))
        return sorted(refs, key=lambda r: r.step)

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint ``checkpoints/latest`` names (or the highest step), None when there is none."""
        from flowgrpo.runs.checkpoint import latest_checkpoint

        return latest_checkpoint(self.checkpoint_root)

    def checkpoint(self, step: int) -> Path:
        """The checkpoint saved at ``step``; a :class:`RunError` lists the saved ones otherwise."""
        refs = self.checkpoints()
        for r in refs:
            if r.step == step:
                return r.path
        saved = ranges([r.step for r in refs])
        raise RunError(
            f"no checkpoint of step {step} in {self.checkpoint_root}; saved steps: {saved} "
            "(run.keep_last prunes older ones)"
        )

    # ------------------------------------------------------------------ reading

    def _read(self, path: Path, parse: Callable[[dict[str, Any]], T]) -> list[T]:
        """``parse`` of every record of a JSONL file (``[]`` when it does not exist). A record that
        is torn, not an object or does not validate is skipped with a warning naming file and line."""
        if not path.is_file():
            return []
        out: list[T] = []
        for line in iter_jsonl(path):
            if not isinstance(line.data, dict):
                log.warning(
                    "%s:%d: skipping a record that is not a JSON object (%s)",
                    path,
                    line.number,
                    type(line.data).__name__,
                )
                continue
            try:
                out.append(parse(line.data))
            except ValidationError as e:
                log.warning("%s:%d: skipping an invalid record: %s", path, line.number, e)
        return out

    def _read_trajectories(self, path: Path) -> list[Trajectory]:
        try:
            return list(iter_trajectories(path))
        except StoreError as e:
            raise RunError(str(e)) from e


def ranges(steps: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"`` (``"(none)"`` when empty)."""
    if not steps:
        return "(none)"
    parts, start, prev = [], steps[0], steps[0]
    for s in [*steps[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(parts)


__all__ = ["CheckpointRef", "MetricRecord", "RunDir", "RunError", "ranges"]
