"""The served weights' lock: completion requests read them together, a weight load writes them alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class AsyncReadWriteLock:
    """Many readers (completion requests) or one writer (a weight load) at a time, on one event
    loop; a waiting writer holds back new readers, so a load is not starved by a stream of requests."""

    def __init__(self) -> None:
        self._cv = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        async with self._cv:
            await self._cv.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cv:
                self._readers -= 1
                self._cv.notify_all()

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        async with self._cv:
            self._writers_waiting += 1
            await self._cv.wait_for(lambda: not self._writer and not self._readers)
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            async with self._cv:
                self._writer = False
                self._cv.notify_all()


__all__ = ["AsyncReadWriteLock"]
