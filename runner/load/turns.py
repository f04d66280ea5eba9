"""Multi-turn conversations over a `runner.load.client.Client`: a conversation's turns in order, each
sent its think time after the previous one ended, all to the server its first turn went to.

The workers (`runner.load.workers`) call these for closed-loop slots and open-loop arrivals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from runner.load.client import Client, at, now
from runner.load.workload import RequestSpec

__all__ = ["closed_conversations", "conversation", "sleep_until"]


async def closed_conversations(client: Client, specs: Sequence[RequestSpec], units: Sequence[tuple[int, int]],
                               take: Callable[[], int | None], slots: int) -> None:
    """`slots` conversations in flight: each slot takes the next conversation when its last one ends."""

    async def slot() -> None:
        while not client.expired:
            u = take()
            if u is None:
                return
            first, end = units[u]
            await conversation(client, specs, first, end, now())

    await asyncio.gather(*(slot() for _ in range(slots)))


async def conversation(client: Client, specs: Sequence[RequestSpec], first: int, end: int, due: float) -> None:
    """Requests `first` to `end - 1` in order, turn k+1 due `think_s` after turn k ended (its scheduled
    time); the first failed turn ends the conversation (the load generator records the later turns as
    not sent). The first turn's server (the balancer's pick) serves every turn: its prefix cache holds
    the conversation so far."""
    replica = None
    for i in range(first, end):
        if i > first:
            await sleep_until(client, due)
            if client.expired:
                return
        done = await client.request(i, specs[i], False, due, replica)
        if not done.ok:
            return
        replica = done.replica
        if i + 1 < end:
            due = done.end_s + specs[i + 1].think_s


async def sleep_until(client: Client, due: float) -> None:
    """Wait for `due` (or the point's deadline) on a timer, not a spin: a thinking conversation must not
    take the event loop from the streams being read."""
    if due <= now():
        return
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    timer = at(loop, min(due, client.deadline), wake)
    try:
        await fut
    finally:
        timer.cancel()
