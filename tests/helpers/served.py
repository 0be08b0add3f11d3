"""Run a coroutine in a trio run whose nursery also serves background work; what a run store holds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from xetfs.read.runs import RunStore

T = TypeVar("T")


def run_served(start: Callable[[trio.Nursery], None], body: Callable[[], Awaitable[T]]) -> T:
    """``await body()`` after ``start(nursery)``; its exception is raised as is (not in a group)."""

    async def main() -> T | Exception:
        async with trio.open_nursery() as nursery:
            start(nursery)
            try:
                return await body()
            except Exception as exc:
                return exc
            finally:
                nursery.cancel_scope.cancel()

    result = trio.run(main)
    if isinstance(result, Exception):
        raise result
    return result


def holds(runs: RunStore, xorb_hash: bytes, chunk: int) -> bool:
    """Whether a held run of ``runs`` has chunk ``chunk`` of the xorb."""
    return runs.held(xorb_hash, chunk, chunk + 1) is not None
