"""File-system helpers shared by the modules that write state a crash must not corrupt."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``target``; on success it replaces ``target`` in one
    rename, on any error it is removed. A reader therefore sees the old directory or the complete
    new one, never a half-written one (a model cache, a checkpoint)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def exclusive_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive advisory lock on the file ``path`` (created if missing) for the block: a
    second process (or thread) entering the block with the same path waits until the first leaves.
    For work that several processes would otherwise all do at once and then overwrite, such as the
    first conversion of the embedded model when six training runs start side by side on one GPU.
    Where there is no ``fcntl`` (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
