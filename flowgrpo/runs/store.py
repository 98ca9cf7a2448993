"""Append-only JSONL trajectory storage: one trajectory per line.

Crash safety: each record is written as one ``write`` of a complete line and flushed (``fsync``
optional), so a process killed mid-write tears at most the line it was writing. A writer reopening
such a file first terminates the torn fragment so the next record starts on a line of its own, and
the reader skips a torn or garbage line wherever it is, with a warning naming file and line. A
record with an unknown ``schema_version`` is a clear error, never a silent misread.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

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
        self._f.write(encode_record(traj) + b"\n")
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


def encode_record(record: BaseModel) -> bytes:
    """One JSON line (without its newline) for ``record``, always valid UTF-8.

    Text that UTF-8 cannot encode (a lone surrogate, which a JSON ``"\\ud800"`` escape in model
    output decodes to) is written as a JSON ``\\uXXXX`` escape instead of raising: the record reads
    back exactly as it was, and one bad string never stops a run from saving its trajectories."""
    try:
        return record.model_dump_json().encode()
    except PydanticSerializationError:
        log.warning("a %s holds text UTF-8 cannot encode; writing it escaped", type(record).__name__)
        return json.dumps(record.model_dump(mode="json"), ensure_ascii=True).encode()


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


def iter_jsonl(path: str | os.PathLike) -> Iterator[JsonLine]:
    """The records of an append-only JSONL file in order, blank lines skipped.

    A line that is not JSON (a write torn by a crash, wherever a later writer resumed after it, or
    garbage) is skipped with a warning naming the file and line: it loses only itself. Every
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
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            log.warning(
                "%s:%d: skipping %s record (%d bytes): %s",
                path,
                lineno,
                "a truncated last" if i == last_idx else "a torn or unreadable",
                len(raw),
                e,
            )
            continue
        yield JsonLine(lineno, data, i == last_idx)


def iter_trajectories(path: str | os.PathLike) -> Iterator[Trajectory]:
    """Yield the trajectories of a JSONL file in order.

    A line that is not JSON or not a trajectory is skipped with a warning naming the file and line
    (see :func:`iter_jsonl`); a record of another ``schema_version`` is a :class:`StoreError`.
    """
    for line in iter_jsonl(path):
        data = line.data
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != SCHEMA_VERSION:
            if not isinstance(version, int):
                log.warning("%s:%d: skipping a record that is not a trajectory", path, line.number)
                continue
            raise StoreError(
                f"{path}:{line.number}: schema_version {version!r} is not supported by this flowgrpo "
                f"(it reads version {SCHEMA_VERSION}); read it with the flowgrpo version that wrote it"
            )
        try:
            yield Trajectory.model_validate(data)
        except ValidationError as e:
            log.warning("%s:%d: skipping an invalid trajectory: %s", path, line.number, e)


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    return list(iter_trajectories(path))


def append_line(path: str | os.PathLike, line: bytes | str, *, fsync: bool = False) -> None:
    """Append one record to a JSONL file as one ``write`` of a complete line.

    When the file does not end with a newline (a writer was killed mid-line) the fragment is ended
    first, so a new record is never glued onto it: the torn line loses only itself."""
    data = line.encode() if isinstance(line, str) else line
    path = Path(path)
    with open(path, "ab") as f:
        if f.tell() > 0 and not _ends_with_newline(path):
            data = b"\n" + data
        f.write(data if data.endswith(b"\n") else data + b"\n")
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def group_trajectories(trajs: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    """Trajectories by ``group_id``, in first-seen order."""
    out: dict[str, list[Trajectory]] = {}
    for t in trajs:
        out.setdefault(t.group_id, []).append(t)
    return out
