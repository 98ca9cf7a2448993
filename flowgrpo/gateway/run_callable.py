"""``python -m flowgrpo.gateway.run_callable package.module:function``: run a Python agent as the
process of one gateway episode (``rollout.gateway.callable``).

The function is called with the episode's :class:`~flowgrpo.gateway.client.EpisodeContext` (awaited
when it is a coroutine function). A number it returns is posted as the episode's reward, a
``(reward, breakdown)`` pair as reward and parts; ``None`` means it posted the reward itself. An
exception exits non-zero: the trainer ends that episode alone, as failed.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys

from flowgrpo.gateway.client import EpisodeContext, post_reward


def main(argv: list[str]) -> int:
    if len(argv) != 1 or ":" not in argv[0]:
        print("usage: python -m flowgrpo.gateway.run_callable package.module:function", file=sys.stderr)
        return 2
    module_name, _, attr = argv[0].partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    ctx = EpisodeContext.from_env()
    result = asyncio.run(fn(ctx)) if inspect.iscoroutinefunction(fn) else fn(ctx)
    if result is None:
        return 0
    if isinstance(result, tuple):
        reward, breakdown = result
        post_reward(float(reward), dict(breakdown))
    else:
        post_reward(float(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
