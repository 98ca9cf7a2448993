"""A stop requested by a signal, seen by every thread of the process within one unit of work.

The trainer's SIGINT/SIGTERM handler calls :func:`request_stop`; the decode loop of the ``hf``
backend (a worker thread, where a Python signal handler never runs) calls :func:`check` before each
prefill and each decode step, so a stop lands within one forward pass instead of after a whole
rollout (minutes on a real model). The trainer discards the interrupted step, writes a checkpoint
of the last complete one and returns.
"""

from __future__ import annotations

import threading

_STOP = threading.Event()


class Interrupted(Exception):
    """Raised where work stops because a stop was requested (:func:`request_stop`)."""


def request_stop() -> None:
    _STOP.set()


def clear() -> None:
    _STOP.clear()


def stop_requested() -> bool:
    return _STOP.is_set()


def check() -> None:
    """:class:`Interrupted` when a stop was requested; nothing otherwise (an Event read: ~50 ns)."""
    if _STOP.is_set():
        raise Interrupted("stopped by a signal")


__all__ = ["Interrupted", "check", "clear", "request_stop", "stop_requested"]
