"""`async for` over an endpoint's `stream()`: on the controller (an async cell, asyncio.run) the
values come as they arrive, a failure after the good ones, and cancelling the task that waits
cancels the call on the ranks; in a concurrent endpoint, the values of every actor once all
answered, its own actor mesh's too (awaiting leaves the actor free)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

import viceroy as vr
from tests.actors.test_actors import Counter, StreamNapper
from tests.conftest import wait_until
from viceroy.runtime.actors.stream import Stream


class Gatherer(Counter):
    @vr.endpoint(concurrent=True)
    async def gather_from(self, others: vr.ActorMesh) -> list[int]:
        return [v async for v in others.nap_rank_delay.stream(0.0)]


async def _arrivals(stream: AsyncIterator[int]) -> list[tuple[int, float]]:
    t0 = time.monotonic()
    return [(v, time.monotonic() - t0) async for v in stream]


def test_async_for_yields_values_as_they_arrive(start_mesh):
    mesh = start_mesh(gpus=3)
    nappers = mesh.spawn(Counter, 0)
    arrivals = asyncio.run(_arrivals(nappers.nap_rank_delay.stream(0.5)))
    assert [r for r, _ in arrivals] == [2, 1, 0]
    assert arrivals[2][1] - arrivals[0][1] >= 0.6  # rank 2's came ~1 s before rank 0's, not with it


def test_async_for_raises_after_the_good_values_when_an_actor_failed(start_mesh):
    mesh = start_mesh(gpus=3)
    nappers = mesh.spawn(Counter, 0)
    seen: list[int] = []

    async def take() -> None:
        async for v in nappers.fail_on.stream(1):
            seen.append(v)

    with pytest.raises(vr.MeshError, match="rank 1: ValueError: rank 1 refuses"):
        asyncio.run(take())
    assert sorted(seen) == [0, 2]


def test_cancelling_the_task_that_awaits_a_stream_cancels_the_call_on_the_ranks(start_mesh):
    mesh = start_mesh(gpus=2)
    nappers = mesh.spawn(StreamNapper)

    async def main() -> None:
        task = asyncio.ensure_future(_arrivals(nappers.nap.stream()))
        await asyncio.to_thread(wait_until, lambda: all("napping" in mesh.logs(r) for r in (0, 1)), 10,
                                "both endpoints to be awaiting")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    t0 = time.monotonic()
    assert nappers.ping.call().get(timeout=20).values() == ["pong", "pong"]
    assert time.monotonic() - t0 < 3  # not behind a 30 s nap


def test_a_value_that_comes_after_the_awaiting_task_was_cancelled_wakes_no_one():
    # It woke the cancelled task's loop, closed by then: RuntimeError in the runtime's IO thread.
    values = Stream()

    async def cancelled_wait() -> None:
        task = asyncio.ensure_future(values.__anext__())
        await asyncio.sleep(0)  # it waits now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_wait())
    values.put(7)
    assert next(values) == 7  # kept for whoever takes it next


@pytest.mark.parametrize("own", [False, True], ids=["other actors", "its own actor mesh"])
def test_a_concurrent_endpoint_iterates_a_stream_with_async_for(start_mesh, own):
    # Its own actor mesh too: awaiting leaves the actor free to answer (a blocking wait there
    # fails at once: tests/actors/test_actor_cycles.py).
    mesh = start_mesh(gpus=2)
    nappers = mesh.spawn(Gatherer, 0)
    gatherer = nappers.slice(gpus=0) if own else mesh.select([1]).spawn(Gatherer, 0)
    assert gatherer.gather_from.call_one(nappers).get(timeout=20) == [0, 1]  # in rank order, all at once
