"""Pure functions run under a time budget in a worker process that is killed when it overruns.

Why a process: CPU-bound library code (sympy simplification, formatting of huge numbers) cannot be
interrupted from Python, and a thread cannot be killed: a "timed-out" call on a thread keeps
burning a core after its caller moved on. Here the call runs in a long-lived worker process (a pipe
round trip, no start-up per call); a call that overruns its budget gets its worker killed (SIGKILL)
and :class:`BudgetExceeded`, and the next call starts a fresh worker.

- ``WorkerPool(size=2, memory_mb=2048)``: ``call(fn, *args, timeout_s=...)`` (blocking: the caller
  waits on the pipe, using no CPU) and ``await acall(...)`` (off the event loop). ``fn`` and its
  arguments must be picklable (a module-level function). The worker's address space is capped at
  ``memory_mb`` (``RLIMIT_AS``), so a call that explodes in memory fails in the worker, not the host.
- ``shared_pool()``: the process-wide pool the calculator and the accuracy reward use.

Workers are fresh interpreters (``python -c``) that import ``sympy`` once, die with their parent, and
serve calls over a socket pair until the parent closes it.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from flowgrpo.utils.aio import run_in_thread

_T = TypeVar("_T")


STARTUP_TIMEOUT_S = 120.0  # an interpreter importing sympy; not part of any call's budget


class BudgetExceeded(Exception):
    """A bounded call ran past its time budget, or its worker died (memory cap, crash)."""


def _serve(conn: Any, memory_mb: int | None) -> None:
    """The worker's loop: receive ``(fn, args)``, send back ``(ok, value)``."""
    if memory_mb:
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):  # the parent closed the pipe or died: exit
            return
        try:
            reply: tuple[bool, Any] = (True, fn(*args))
        except BaseException as e:  # sent back to the caller, raised there
            reply = (False, e)
        try:
            conn.send(reply)
        except OSError:  # the parent is gone (it exited, or killed this call's wait)
            return
        except Exception as e:  # an unpicklable result or exception: say so in words
            conn.send((False, RuntimeError(f"{type(reply[1]).__name__}: {reply[1]} ({e})")))


def _worker_main(fd: int, memory_mb: int) -> None:
    """Entry point of a worker process (``python -c``): serve on the inherited socket ``fd``."""
    import ctypes
    import socket

    with contextlib.suppress(Exception):  # Linux: die with the parent (PR_SET_PDEATHSIG = 1)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    import sympy  # noqa: F401 - loaded once per worker, not on the first call

    conn = Connection(socket.socket(fileno=fd).detach())
    try:
        conn.send("ready")  # start-up (seconds on a loaded machine) is not charged to the first call
    except OSError:  # the parent exited while this worker was starting: nothing to serve
        return
    _serve(conn, memory_mb or None)


class _Worker:
    """A worker process started with ``python -c`` (not ``multiprocessing``: spawn and forkserver
    re-import the user's ``__main__``, which breaks scripts without a ``__main__`` guard, and fork
    would copy the trainer's threads' locks and its model's memory)."""

    def __init__(self, memory_mb: int | None) -> None:
        parent, child = socket.socketpair()
        code = f"from flowgrpo.sandbox.bounded import _worker_main; _worker_main({child.fileno()}, {memory_mb or 0})"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.ready = False

    def wait_ready(self) -> None:
        if not self.ready:
            if not self.conn.poll(STARTUP_TIMEOUT_S) or self.conn.recv() != "ready":
                raise EOFError("the worker did not start")
            self.ready = True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.conn.close()


class WorkerPool:
    """Up to ``size`` worker processes, each serving one call at a time (see the module docstring)."""

    def __init__(self, size: int = 2, *, memory_mb: int | None = 2048) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size, self.memory_mb = size, memory_mb
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.started = 0  # workers started so far (a restart after each overrun)

    def call(self, fn: Callable[..., _T], *args: Any, timeout_s: float) -> _T:
        """``fn(*args)`` in a worker; :class:`BudgetExceeded` after ``timeout_s`` seconds (the
        worker is killed). An exception raised by ``fn`` is re-raised here."""
        with self._slots:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.kill()
                worker = _Worker(self.memory_mb)
                self.started += 1
            try:
                worker.wait_ready()
                worker.conn.send((fn, args))
                if not worker.conn.poll(timeout_s):
                    worker.kill()
                    raise BudgetExceeded(f"{getattr(fn, '__name__', 'the call')} ran past {timeout_s:g} s")
                ok, value = worker.conn.recv()
            except (EOFError, OSError) as e:
                worker.kill()
                raise BudgetExceeded(
                    f"{getattr(fn, '__name__', 'the call')}: its worker died (memory cap of "
                    f"{self.memory_mb} MB?): {type(e).__name__}"
                ) from None
            with self._lock:
                self._idle.append(worker)
        if not ok:
            raise value
        return value

    def prestart(self) -> None:
        """Start the workers now (a process launch, milliseconds); they import sympy in the
        background while the caller goes on, so the first call does not wait seconds for it."""
        with self._lock:
            missing = self.size - len(self._idle)
            fresh = [_Worker(self.memory_mb) for _ in range(max(missing, 0))]
            self._idle.extend(fresh)
            self.started += len(fresh)

    def warm(self) -> None:
        """:meth:`prestart`, then wait until every idle worker is ready to serve."""
        self.prestart()
        with self._lock:
            for w in self._idle:
                w.wait_ready()

    async def acall(self, fn: Callable[..., _T], *args: Any, timeout_s: float) -> _T:
        """:meth:`call` without blocking the event loop (the wait happens in a thread)."""
        return await run_in_thread(self.call, fn, *args, timeout_s=timeout_s)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()


_SHARED: WorkerPool | None = None


def shared_pool() -> WorkerPool:
    """The process-wide pool (two workers, started on first use)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = WorkerPool()
    return _SHARED


__all__ = ["BudgetExceeded", "WorkerPool", "shared_pool"]
