"""flowgrpo.sandbox.bounded: pure functions under a time budget in a worker process killed on overrun."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from flowgrpo.sandbox.bounded import BudgetExceeded, WorkerPool


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(size=1, memory_mb=512)
    yield p
    p.close()


def test_results_and_exceptions_come_back(pool):
    started = pool.started
    assert pool.call(divmod, 17, 5, timeout_s=30) == (3, 2)
    with pytest.raises(ZeroDivisionError):
        pool.call(divmod, 1, 0, timeout_s=30)
    assert pool.call(divmod, 17, 5, timeout_s=30) == (3, 2)
    assert pool.started == max(started, 1)  # one worker served all three calls


def test_an_overrun_kills_the_worker_and_the_next_call_gets_a_fresh_one(pool):
    pid = pool.call(os.getpid, timeout_s=30)
    started = pool.started
    assert pid != os.getpid()
    with pytest.raises(BudgetExceeded, match=r"sleep ran past 0\.2 s"):
        pool.call(time.sleep, 3600, timeout_s=0.2)
    with pytest.raises(ProcessLookupError):  # killed, not left sleeping (or burning a core)
        os.kill(pid, 0)
    assert pool.call(os.getpid, timeout_s=30) not in (pid, os.getpid())
    assert pool.started == started + 1


def test_a_memory_explosion_fails_in_the_worker(pool):
    with pytest.raises(MemoryError):
        pool.call(bytearray, 4 * 2**30, timeout_s=30)  # 4 GB against a 512 MB cap
    assert pool.call(divmod, 7, 2, timeout_s=30) == (3, 1)


def test_acall_does_not_block_the_event_loop(pool):
    async def main() -> tuple[tuple[int, int], int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        with pytest.raises(BudgetExceeded):
            await pool.acall(time.sleep, 60, timeout_s=0.5)
        out = await pool.acall(divmod, 9, 4, timeout_s=30)
        task.cancel()
        return out, ticks

    out, ticks = asyncio.run(main())
    assert out == (2, 1) and ticks >= 10  # the loop ran while the worker slept
