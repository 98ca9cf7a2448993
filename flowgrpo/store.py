"""Append-only JSONL trajectory storage: one trajectory per line.

Crash safety: each record is written as one ``write`` of a complete line and flushed (``fsync``
optional), so a process killed mid-write can only tear the *last* line. The reader reports and
skips a torn last line; a writer reopening such a file first terminates the torn fragment so the
next record starts on a line of its own. A record with an unknown ``schema_version`` is a clear
error, never a silent misread.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from flowgrpo.types import SCHEMA_VERSION, Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)


class StoreError(ValueError):
    """A trajectory file that cannot be read as written."""


class TrajectoryWriter:
    """Appends trajectories to a JSONL file. Use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike, *, fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._f = open(self.path, "ab")  # noqa: SIM115 - closed in close()
        if self._f.tell() > 0 and not _ends_with_newline(self.path):
            # A previous writer was killed mid-line: end the torn fragment so it stays isolated.
            self._f.write(b"\n")
            self._flush()

    def write(self, traj: Trajectory) -> None:
        line = traj.model_dump_json().encode() + b"\n"
        self._f.write(line)
        self._flush()

    def write_many(self, trajs: Iterable[Trajectory]) -> None:
        for t in trajs:
            self.write(t)

    def write_groups(self, groups: Iterable[TrajectoryGroup]) -> None:
        for g in groups:
            self.write_many(g.trajectories)

    def _flush(self) -> None:
        self._f.flush()
        if self.fsync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class JsonLine(NamedTuple):
    """One record of a JSONL file: its 1-based line number, the parsed value, whether it is the
    file's last record (the only one a crash can tear)."""

    number: int
    data: Any
    last: bool


def iter_jsonl(path: str | os.PathLike, *, strict: bool = True) -> Iterator[JsonLine]:
    """The records of an append-only JSONL file in order, blank lines skipped.

    A line that is not JSON is skipped with a warning when it is the last line (a torn write) or
    when ``strict=False``; otherwise it raises :class:`StoreError` naming the file and line. Every
    append-only file of a run (trajectories, metrics, evaluations) is read through here.
    """
    path = Path(path)
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    # The text after the final "\n" is either empty or a torn record.
    last_idx = max(i for i, ln in enumerate(lines) if ln.strip() or i == 0)
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        lineno = i + 1
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            torn = i == last_idx
            if torn or not strict:
                log.warning(
                    "%s:%d: skipping %s record (%d bytes): %s",
                    path,
                    lineno,
                    "a truncated last" if torn else "an unreadable",
                    len(raw),
                    e,
                )
                continue
            raise StoreError(f"{path}:{lineno}: not valid JSON ({e})") from e
        yield JsonLine(lineno, data, i == last_idx)


def iter_trajectories(path: str | os.PathLike, *, strict: bool = True) -> Iterator[Trajectory]:
    """Yield the trajectories of a JSONL file in order.

    A line that does not parse is skipped with a warning when it is the last line (a torn write)
    or when ``strict=False``; otherwise it raises :class:`StoreError` naming the line.
    """
    for line in iter_jsonl(path, strict=strict):
        data = line.data
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"{path}:{line.number}: schema_version {version!r} is not supported by this flowgrpo "
                f"(it reads version {SCHEMA_VERSION}); read it with the flowgrpo version that wrote it"
            )
        try:
            yield Trajectory.model_validate(data)
        except ValidationError as e:
            if line.last or not strict:
                log.warning("%s:%d: skipping an invalid record: %s", path, line.number, e)
                continue
            raise StoreError(f"{path}:{line.number}: not a valid trajectory: {e}") from e


def read_trajectories(path: str | os.PathLike, *, strict: bool = True) -> list[Trajectory]:
    return list(iter_trajectories(path, strict=strict))


def group_trajectories(trajs: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    """Trajectories by ``group_id``, in first-seen order."""
    out: dict[str, list[Trajectory]] = {}
    for t in trajs:
        out.setdefault(t.group_id, []).append(t)
    return out
