"""Cycles of waits between actors: A's endpoint waits for B's, which waits for a call on A,
queued behind the first. Both waited forever; the wait that closes the cycle now fails at once,
naming each endpoint and rank, and both actor meshes go on. Only who is blocked now counts: an
endpoint that kept the future and returned, or that waits for something else, makes no cycle.
A concurrent endpoint counts too: while it awaits, its call waits; while it blocks in .get(), its
actor does."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

import viceroy as vr
from tests.conftest import wait_until
from viceroy.runtime.actors.registry import registry_for


class Front(vr.Actor):
    def __init__(self) -> None:
        self.kept: vr.Future | None = None

    @vr.endpoint
    def step(self, back: vr.ActorMesh, me: vr.ActorMesh, ep: str = "process") -> int:
        return getattr(back, ep).call_one(me).get(timeout=30)

    @vr.endpoint(concurrent=True)
    async def step_concurrent(self, back: vr.ActorMesh, me: vr.ActorMesh) -> int:
        return await back.process.call_one(me)

    @vr.endpoint
    def step_via(self, middle: vr.ActorMesh, back: vr.ActorMesh, me: vr.ActorMesh) -> int:
        return middle.relay.call_one(back, me).get(timeout=30)

    @vr.endpoint
    def step_and_return(self, back: vr.ActorMesh, me: vr.ActorMesh) -> str:
        self.kept = back.process.call_one(me)
        return "sent"

    @vr.endpoint
    def step_then_hold(self, back: vr.ActorMesh, me: vr.ActorMesh, holder: vr.ActorMesh, path: str) -> str:
        self.kept = back.process.call_one(me)
        holder.hold.call_one(path).get(timeout=30)  # blocked, but not on back.process
        return "held"

    @vr.endpoint
    def step_late(self, back: vr.ActorMesh, me: vr.ActorMesh, path: str) -> int:
        fut = back.process.call_one(me)
        _wait_for_file(path)  # until Back.process waits for Front.callback
        return fut.get(timeout=30)

    @vr.endpoint
    def step_after(self, back: vr.ActorMesh, path: str) -> int | None:
        _wait_for_file(path)  # until Back.process_concurrent_get blocks in its .get()
        return back.last_value.call_one().get(timeout=30)

    @vr.endpoint
    def step_conc(self, back: vr.ActorMesh, path: str) -> str:
        return back.conc_gate.call_one(path).get(timeout=30)

    @vr.endpoint(concurrent=True)
    async def self_get(self, me: vr.ActorMesh) -> int:
        return me.callback.call_one().get(timeout=30)  # blocks this actor's event loop

    @vr.endpoint(concurrent=True)
    async def self_await(self, me: vr.ActorMesh) -> int:
        return await me.callback.call_one()

    @vr.endpoint
    def kept_value(self) -> int:
        assert self.kept is not None
        return self.kept.get(timeout=30)

    @vr.endpoint
    def callback(self) -> int:
        return 100 + vr.context().rank


class Back(vr.Actor):
    def __init__(self) -> None:
        self.last: int | None = None

    @vr.endpoint
    def process(self, front: vr.ActorMesh) -> int:
        self.last = front.callback.call_one().get(timeout=30) + 1
        return self.last

    @vr.endpoint(concurrent=True)
    async def process_concurrent(self, front: vr.ActorMesh) -> int:
        self.last = await front.callback.call_one() + 1
        return self.last

    @vr.endpoint(concurrent=True)
    async def process_concurrent_get(self, front: vr.ActorMesh) -> int:
        self.last = front.callback.call_one().get(timeout=30) + 1  # blocks this actor's event loop
        return self.last

    @vr.endpoint(concurrent=True)
    async def conc_gate(self, path: str) -> str:
        while not os.path.exists(path):  # a task on the actor's event loop
            await asyncio.sleep(0.01)
        return "through"

    @vr.endpoint
    def process_stream(self, front: vr.ActorMesh) -> int:
        self.last = next(iter(front.callback.stream())) + 1
        return self.last

    @vr.endpoint
    async def process_async(self, front: vr.ActorMesh) -> int:
        self.last = await front.callback.call_one() + 1
        return self.last

    @vr.endpoint
    def last_value(self) -> int | None:
        return self.last


class Middle(vr.Actor):
    @vr.endpoint
    def relay(self, back: vr.ActorMesh, front: vr.ActorMesh) -> int:
        return back.process.call_one(front).get(timeout=30) + 10


class Holder(vr.Actor):
    @vr.endpoint
    def hold(self, path: str) -> None:
        _wait_for_file(path)


def _wait_for_file(path: str) -> None:
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def _front_and_back(start_mesh: Any, **dims: int) -> tuple[vr.Mesh, vr.ActorMesh, vr.ActorMesh]:
    """A mesh of two ranks (`dims`, default gpus=2): Front on rank 0, Back on rank 1."""
    mesh = start_mesh(**(dims or {"gpus": 2}))
    return mesh, mesh.select([0]).spawn(Front), mesh.select([1]).spawn(Back)


def _fails_fast(fut: vr.Future, within: float = 5.0) -> str:
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=20)
    took = time.monotonic() - t0
    assert took < within, f"the cycle failed after {took:.1f} s, not within {within} s"
    return str(info.value)


@pytest.mark.parametrize("ep", ["process", "process_async", "process_stream", "process_concurrent"])
@pytest.mark.parametrize("dims", [{"gpus": 2}, {"hosts": 2, "gpus": 1}], ids=["one host", "two hosts"])
def test_two_actors_waiting_for_each_other_fail_at_once_saying_why(start_mesh, dims, ep):
    # Front.step waits for Back.process, which waits for Front.callback, queued behind Front.step:
    # both waited until their timeout (forever without one), their actors deaf meanwhile. (A
    # stream's wait was not even told, nor a concurrent endpoint's, whose actor is free but whose
    # call waits all the same.)
    _, front, back = _front_and_back(start_mesh, **dims)
    msg = _fails_fast(front.step.call_one(back, front, ep))
    assert "A cycle of waits between actors" in msg, msg
    for part in (f"Front.step on rank 0 waits for Back.{ep} on rank 1",
                 f"Back.{ep} on rank 1 waits for Front.callback on rank 0, which cannot start before Front.step "
                 "returns there",
                 "none of them can go on",
                 "do not wait in one of them (.broadcast(), or keep the future and return)",
                 "make Front.step an `@vr.endpoint(concurrent=True) async def`"):
        assert part in msg, msg
    # Both actor meshes go on.
    assert front.callback.call_one().get(timeout=5) == 100
    assert getattr(back, ep).call_one(front).get(timeout=10) == 101


def test_the_advice_holds_a_concurrent_endpoint_that_waits_makes_no_cycle(start_mesh):
    # As the cycle's message says: Front.step_concurrent awaits Back.process, which waits for
    # Front.callback; Front is free meanwhile, so callback runs. Its wait is told (it could close
    # a cycle through its own call) but is none here.
    mesh, front, back = _front_and_back(start_mesh)
    assert front.step_concurrent.call_one(back, front).get(timeout=10) == 101
    assert registry_for(mesh._controller).waits.blocked() == {}


def test_a_concurrent_endpoint_blocked_in_get_holds_its_actor(start_mesh, tmp_path):
    # Back.process_concurrent_get blocks in .get() for Front.callback, queued behind
    # Front.step_after, which then waits for Back.last_value: that one cannot start while the
    # blocking .get() stops Back's event loop. Seen as a concurrent call waiting (its actor
    # free), this cycle was missed and both waited until their timeout.
    mesh, front, back = _front_and_back(start_mesh)
    go = tmp_path / "go"
    first = front.step_after.call_one(back, str(go))
    blocked = back.process_concurrent_get.call_one(front)
    waits = registry_for(mesh._controller).waits
    wait_until(lambda: list(waits.blocked().values()) == ["Front.callback"], 10,
               "Back.process_concurrent_get to block")
    go.write_text("")
    msg = _fails_fast(first)
    for part in ("Front.step_after on rank 0 waits for Back.last_value on rank 1, which cannot start while "
                 "Back.process_concurrent_get blocks there",
                 "Back.process_concurrent_get on rank 1 waits for Front.callback on rank 0, which cannot start "
                 "before Front.step_after returns there",
                 "make Front.step_after an `@vr.endpoint(concurrent=True) async def` that awaits it",
                 "`await` it in Back.process_concurrent_get (a blocking wait there stops its actor's event loop)"):
        assert part in msg, msg
    assert blocked.get(timeout=10) == 101
    assert waits.blocked() == {}


def test_a_concurrent_endpoint_may_await_its_own_actor_but_not_block_on_it(start_mesh):
    # Awaiting a call on its own actor is fine (the actor takes it meanwhile); a blocking .get()
    # stops the event loop that would run it, and waited forever.
    mesh = start_mesh(gpus=1)
    front = mesh.spawn(Front)
    assert front.self_await.call_one(front).get(timeout=10) == 100
    msg = _fails_fast(front.self_get.call_one(front))
    assert ("Front.self_get on rank 0 blocks in a wait for Front.callback, which includes this very actor "
            "(rank 0): a blocking wait (.get(), iterating a stream) in an async endpoint stops the actor's event "
            "loop") in msg, msg
    assert "Instead `await` it (Front.self_get is concurrent" in msg, msg
    assert front.callback.call_one().get(timeout=5) == 100


def test_a_sync_endpoint_stalls_a_concurrent_call_sent_before_it(start_mesh, tmp_path):
    # Front.step_conc waits for Back.conc_gate, a concurrent endpoint already running as a task;
    # then Back.process (sync) blocks in .get() for Front.callback, queued behind Front.step_conc.
    # The task cannot go on while a sync endpoint holds the actor's thread: a cycle, once taken
    # for a concurrent call running beside it (both waited until their timeout).
    mesh, front, back = _front_and_back(start_mesh)
    go = tmp_path / "go"
    first = front.step_conc.call_one(back, str(go))
    waits = registry_for(mesh._controller).waits
    wait_until(lambda: list(waits.blocked().values()) == ["Back.conc_gate"], 10, "Front.step_conc to wait")
    msg = _fails_fast(back.process.call_one(front))
    for part in ("Back.process on rank 1 waits for Front.callback on rank 0, which cannot start before "
                 "Front.step_conc returns there",
                 "Front.step_conc on rank 0 waits for Back.conc_gate on rank 1, which cannot go on before "
                 "Back.process returns there",
                 "So this wait (Back.process on rank 1 for Front.callback) fails"):
        assert part in msg, msg
    go.write_text("")
    assert first.get(timeout=10) == "through"
    assert waits.blocked() == {}


def test_the_wait_that_closes_the_cycle_fails_whichever_it_is(start_mesh, tmp_path):
    # Back.process waits for Front.callback first; Front.step_late's wait, which comes after,
    # closes the cycle: it fails (Back.process, running, is cancelled, or ends with Front.callback).
    mesh, front, back = _front_and_back(start_mesh)
    go = tmp_path / "go"
    fut = front.step_late.call_one(back, front, str(go))
    waits = registry_for(mesh._controller).waits
    wait_until(lambda: list(waits.blocked().values()) == ["Front.callback"], 10, "Back.process to wait")
    go.write_text("")
    msg = _fails_fast(fut)
    assert "So this wait (Front.step_late on rank 0 for Back.process) fails, and that call is cancelled" in msg, msg
    assert "Back.process on rank 1 waits for Front.callback on rank 0, which cannot start before " \
        "Front.step_late returns there" in msg, msg
    assert back.process.call_one(front).get(timeout=10) == 101
    assert waits.blocked() == {}


def test_three_actors_waiting_in_a_ring_fail_at_once(start_mesh):
    mesh = start_mesh(gpus=3)
    front = mesh.select([0]).spawn(Front)
    middle = mesh.select([1]).spawn(Middle)
    back = mesh.select([2]).spawn(Back)
    msg = _fails_fast(front.step_via.call_one(middle, back, front))
    for part in ("Front.step_via on rank 0 waits for Middle.relay on rank 1",
                 "Middle.relay on rank 1 waits for Back.process on rank 2",
                 "Back.process on rank 2 waits for Front.callback on rank 0, which cannot start before "
                 "Front.step_via returns there"):
        assert part in msg, msg
    assert middle.relay.call_one(back, front).get(timeout=10) == 111
    assert registry_for(mesh._controller).waits.blocked() == {}


def test_an_endpoint_that_kept_the_future_and_returned_makes_no_cycle(start_mesh):
    # Front.step_and_return called Back.process and returned: Back.process's wait for
    # Front.callback ends once the call before it returned.
    _, front, back = _front_and_back(start_mesh)
    assert front.step_and_return.call_one(back, front).get(timeout=10) == "sent"
    assert back.last_value.call_one().get(timeout=10) == 101  # queued behind Back.process
    assert front.kept_value.call_one().get(timeout=10) == 101


def test_an_endpoint_blocked_on_another_call_makes_no_cycle(start_mesh, tmp_path):
    # Front.step_then_hold called Back.process, then waits for Holder.hold (not for Back.process):
    # Back.process's wait for Front.callback, queued behind it, ends once Holder.hold returns.
    # Who made which call would see a cycle; who waits for whom now sees none.
    mesh = start_mesh(gpus=3)
    front = mesh.select([0]).spawn(Front)
    back = mesh.select([1]).spawn(Back)
    holder = mesh.select([2]).spawn(Holder)
    go = tmp_path / "go"
    held = front.step_then_hold.call_one(back, front, holder, str(go))
    waits = registry_for(mesh._controller).waits
    wait_until(lambda: sorted(waits.blocked().values()) == ["Front.callback", "Holder.hold"], 10,
               "Front to wait for Holder.hold and Back for Front.callback")
    go.write_text("")
    assert held.get(timeout=10) == "held"
    assert back.last_value.call_one().get(timeout=10) == 101
    assert front.kept_value.call_one().get(timeout=10) == 101
    assert waits.blocked() == {}
