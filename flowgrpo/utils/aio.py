"""Bridging sync and async code."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(coro)``, also from a thread that already runs an event loop (a notebook, an
    async caller of a sync API): then the coroutine runs on a fresh loop in a worker thread, and its
    result or exception comes back to the caller."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:
            box["error"] = e

    th = threading.Thread(target=target)
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


async def run_in_thread(fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)`` in a new daemon thread that nothing ever joins.

    Unlike ``asyncio.to_thread`` (the loop's default executor, which ``asyncio.run`` waits for at
    shutdown), a call abandoned by ``asyncio.wait_for`` here cannot delay anything: the awaiting
    task gets its ``TimeoutError`` at once, the event loop closes, and the interpreter exits without
    waiting for the thread. Python threads cannot be killed, so the abandoned call runs on (or sleeps
    on) until it returns by itself; its late result is dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()
    ctx = contextvars.copy_context()

    def deliver(ok: bool, value: Any) -> None:
        if future.done():  # cancelled by a timeout: nobody wants the result any more
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            value, ok = ctx.run(fn, *args, **kwargs), True
        except BaseException as e:  # delivered to the awaiting task, re-raised there
            value, ok = e, False
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(deliver, ok, value)

    name = f"flowgrpo-call-{getattr(fn, '__name__', 'fn')}"
    threading.Thread(target=target, name=name, daemon=True).start()
    return await future
