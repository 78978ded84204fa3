"""Actors on a real local mesh: spawning, the adverbs, ordering, bad input, and errors."""

from __future__ import annotations

import asyncio
import os
import time
import warnings

import pytest

import viceroy as vr
from tests.conftest import wait_until


class Counter(vr.Actor):
    def __init__(self, start: int) -> None:
        self.n = start
        self.log: list[tuple[str, float, float]] = []

    @vr.endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @vr.endpoint
    def value(self) -> int:
        return self.n

    @vr.endpoint
    async def slow(self, tag: str, delay: float) -> str:
        t0 = time.monotonic()
        await asyncio.sleep(delay)
        self.log.append((tag, t0, time.monotonic()))
        return tag

    @vr.endpoint
    def history(self) -> list[tuple[str, float, float]]:
        return self.log

    @vr.endpoint
    def fail(self, msg: str) -> None:
        raise ValueError(msg)

    @vr.endpoint
    def lock(self) -> object:
        import threading

        return threading.Lock()

    @vr.endpoint
    def nap(self, s: float) -> int:
        time.sleep(s)
        return vr.context().rank

    @vr.endpoint
    def nap_rank_delay(self, scale: float) -> int:
        rank = vr.context().rank
        time.sleep((2 - rank) * scale)
        return rank

    @vr.endpoint
    def fail_on(self, rank: int) -> int:
        if vr.context().rank == rank:
            raise ValueError(f"rank {rank} refuses")
        return vr.context().rank

    def helper(self) -> None:
        pass


class Gate(vr.Actor):
    def __init__(self) -> None:
        self.opened: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self.opened is None:
            self.opened = asyncio.Event()
        return self.opened

    @vr.endpoint(concurrent=True)
    async def wait(self) -> str:
        await asyncio.wait_for(self._event().wait(), 10)
        return "passed"

    @vr.endpoint(concurrent=True)
    async def open(self) -> None:
        self._event().set()


class Picky(vr.Actor):
    def __init__(self, bad_rank: int) -> None:
        if vr.context().rank == bad_rank:
            raise RuntimeError(f"no room on rank {bad_rank}")


class Caller(vr.Actor):
    def __init__(self, counters: vr.ActorMesh) -> None:
        self.counters = counters

    @vr.endpoint
    def bump_all(self, by: int) -> list[int]:
        return self.counters.incr.call(by=by).get().values()

    @vr.endpoint
    async def bump_one(self) -> int:
        return await self.counters.slice(gpus=0).incr.call_one(by=100)


def test_call_returns_a_value_mesh_shaped_like_the_mesh(start_mesh):
    mesh = start_mesh(gpus=4)
    counters = mesh.spawn(Counter, 0)
    vals = counters.incr.call(by=2).get()
    assert isinstance(vals, vr.ValueMesh) and vals.dims == {"gpus": 4}
    assert vals.values() == [2, 2, 2, 2]
    assert counters.slice(gpus=1).incr.call_one().get() == 3
    assert counters.value.call().get().values() == [2, 3, 2, 2]
    assert counters.split(gpus=("a", "b"), b=2).slice(b=1).value.call().get().values() == [3, 2]


def test_broadcast_is_fire_and_forget_but_ordered_per_actor(start_mesh):
    mesh = start_mesh(gpus=2)
    counters = mesh.spawn(Counter, 0)
    for _ in range(200):
        assert counters.incr.broadcast() is None
    assert counters.value.call().get().values() == [200, 200]


def test_choose_sends_to_the_least_loaded_actor(start_mesh):
    mesh = start_mesh(gpus=2)
    counters = mesh.spawn(Counter, 0)
    busy = counters.slice(gpus=0).nap.call_one(1.0)  # rank 0 has a call in flight
    chosen = [counters.nap.choose(0.0).get(timeout=10) for _ in range(3)]
    assert chosen == [1, 1, 1]
    assert busy.get(timeout=10) == 0
    assert {counters.incr.choose().get() for _ in range(4)} <= {1, 2, 3}


class Holder(vr.Actor):
    @vr.endpoint
    def hold(self, started: str, gate: str) -> None:
        open(started, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)

    @vr.endpoint
    def where(self) -> int:
        return vr.context().rank


def test_choose_passes_over_an_actor_still_running_a_call_given_up_on(start_mesh, tmp_path):
    # Interrupted, a sync endpoint runs on to its end; the controller gives its call up (the
    # future fails), and choose counted that actor idle: every other call went behind it.
    mesh = start_mesh(gpus=2)
    holders = mesh.spawn(Holder)
    started, gate = tmp_path / "started", tmp_path / "gate"
    busy = holders.slice(gpus=0).hold.call_one(str(started), str(gate))
    try:
        wait_until(started.exists, 10, "rank 0's endpoint to start")
        mesh.interrupt()
        with pytest.raises(vr.MeshError, match="runs to its end"):
            busy.get(timeout=10)  # given up on: rank 0 still runs it
        assert [holders.where.choose().get(timeout=5) for _ in range(4)] == [1] * 4
    finally:
        gate.touch()
    assert holders.slice(gpus=0).where.call_one().get(timeout=10) == 0  # after its late answer
    assert {holders.where.choose().get(timeout=10) for _ in range(4)} == {0, 1}  # idle again: chosen too


def test_stream_yields_results_as_they_arrive(start_mesh):
    mesh = start_mesh(gpus=3)
    counters = mesh.spawn(Counter, 0)
    t0 = time.monotonic()
    arrivals = [(rank, time.monotonic() - t0) for rank in counters.nap_rank_delay.stream(0.4)]
    assert [r for r, _ in arrivals] == [2, 1, 0]  # rank 2 sleeps least
    assert arrivals[0][1] < 0.5 and arrivals[2][1] >= 0.75


def test_stream_raises_after_the_good_values_when_some_actor_failed(start_mesh):
    mesh = start_mesh(gpus=3)
    counters = mesh.spawn(Counter, 0)
    seen = []
    with pytest.raises(vr.MeshError, match="rank 1: ValueError: rank 1 refuses"):
        for v in counters.fail_on.stream(1):
            seen.append(v)
    assert sorted(seen) == [0, 2]


def test_async_endpoints_run_one_at_a_time_in_order_by_default(start_mesh):
    mesh = start_mesh(gpus=1)
    counters = mesh.spawn(Counter, 0)
    futs = [counters.slow.call_one(tag, 0.2 if tag == "a" else 0.0) for tag in "abc"]
    assert [f.get(timeout=10) for f in futs] == ["a", "b", "c"]
    log = counters.history.call_one().get()
    assert [t for t, _, _ in log] == ["a", "b", "c"]
    assert log[1][1] >= log[0][2] and log[2][1] >= log[1][2]  # no overlap


def test_concurrent_endpoints_overlap(start_mesh):
    mesh = start_mesh(gpus=1)
    gates = mesh.spawn(Gate)
    waiting = gates.wait.call_one()  # would block the actor forever if calls could not overlap
    gates.open.call_one().get(timeout=10)
    assert waiting.get(timeout=10) == "passed"


def test_actors_answer_while_a_cell_runs_and_share_ranks_with_mesh_state(start_mesh):
    mesh = start_mesh(gpus=2)
    mesh.run("x = rank + 40")
    a = mesh.spawn(Counter, 0)
    b = mesh.spawn(Counter, 100)
    cell = mesh.run("import time\ntime.sleep(4)\nx", block=False)
    assert a.incr.call().get(timeout=10).values() == [1, 1]
    assert b.incr.call().get(timeout=10).values() == [101, 101]
    assert not cell.done()  # answered while the cell still ran: did not wait for it
    assert cell.get(timeout=10).values() == [40, 41]
    assert mesh.run(lambda: vr.context().rank).values() == [0, 1]


def test_futures_work_with_get_and_await_without_warnings(start_mesh):
    mesh = start_mesh(gpus=2)
    counters = mesh.spawn(Counter, 0)

    async def main() -> tuple[object, object]:
        return await counters.incr.call(), await counters.slice(gpus=1).incr.call_one()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert counters.incr.call().get().values() == [1, 1]
        vals, one = asyncio.run(main())
    assert vals.values() == [2, 2] and one == 3  # type: ignore[attr-defined]


def test_actor_meshes_passed_to_actors_can_be_called_from_there(start_mesh):
    mesh = start_mesh(gpus=3)
    counters = mesh.slice(gpus=slice(1, 3)).spawn(Counter, 0)
    callers = mesh.slice(gpus=0).spawn(Caller, counters)
    assert callers.bump_all.call_one(5).get(timeout=20) == [5, 5]
    assert callers.bump_one.call_one().get(timeout=20) == 105
    assert counters.value.call().get().values() == [105, 5]


def test_endpoint_arguments_are_checked_on_the_controller(start_mesh):
    mesh = start_mesh(gpus=1)
    counters = mesh.spawn(Counter, 0)
    with pytest.raises(TypeError, match=r"Counter\.incr\(by: int = 1\).*unexpected keyword argument 'step'"):
        counters.incr.call(step=2)
    with pytest.raises(TypeError, match=r"Counter\.slow.*missing a required argument: 'delay'"):
        counters.slow.call_one("x")
    with pytest.raises(TypeError, match=r"Counter\(start: int\)"):
        mesh.spawn(Counter)
    with pytest.raises(TypeError, match="through an adverb"):
        counters.incr()
    assert counters.value.call_one().get() == 0  # nothing was sent


def test_calling_a_non_endpoint_lists_the_endpoints(start_mesh):
    mesh = start_mesh(gpus=1)
    counters = mesh.spawn(Counter, 0)
    with pytest.raises(AttributeError, match=r"no endpoint 'helper'; its endpoints are: fail, fail_on, history, incr"):
        counters.helper.call()


def test_call_one_needs_a_one_actor_mesh(start_mesh):
    mesh = start_mesh(gpus=2)
    counters = mesh.spawn(Counter, 0)
    with pytest.raises(ValueError, match="call_one needs an actor mesh of one actor; this one has 2"):
        counters.incr.call_one()


def test_endpoint_exceptions_reach_the_caller_with_rank_and_source_line(start_mesh):
    mesh = start_mesh(gpus=2)
    counters = mesh.spawn(Counter, 0)
    with pytest.raises(vr.MeshError) as err:
        counters.fail.call("bad input").get()
    text = str(err.value)
    assert "Counter.fail failed on 2 of 2 ranks" in text
    assert "ranks 0-1: ValueError: bad input" in text
    assert __file__ in text and "raise ValueError(msg)" in text
    assert counters.incr.call().get().values() == [1, 1]  # the actors live on


def test_unpicklable_return_values_fail_clearly(start_mesh):
    mesh = start_mesh(gpus=1)
    counters = mesh.spawn(Counter, 0)
    with pytest.raises(vr.MeshError, match=r"TypeError: .*lock returned lock, which cannot be sent back"):
        counters.lock.call_one().get()
    assert counters.incr.call_one().get() == 1


def test_constructor_errors_are_reported_per_rank(start_mesh):
    mesh = start_mesh(gpus=3)
    with pytest.raises(vr.MeshError) as err:
        mesh.spawn(Picky, 1)
    assert err.value.ranks == [1]
    assert "rank 1: RuntimeError: no room on rank 1" in str(err.value)
    assert mesh.spawn(Picky, 7).dims == {"gpus": 3}


def test_stopped_actor_meshes_refuse_calls(start_mesh):
    mesh = start_mesh(gpus=2)
    counters = mesh.spawn(Counter, 0)
    counters.stop()
    with pytest.raises(RuntimeError, match=r"actor mesh Counter \(gpus=2\) was stopped \(ranks 0-1\)"):
        counters.incr.call()  # it said "(rank 0-1)"
    with pytest.raises(RuntimeError, match="was stopped"):
        counters.slice(gpus=0).incr.broadcast()
    again = mesh.spawn(Counter, 5)
    assert again.incr.call().get().values() == [6, 6]


def test_an_actor_mesh_of_another_mesh_is_refused_before_sending(start_mesh):
    # It was sent, and every rank of the other mesh failed unpickling it.
    mesh, other = start_mesh(gpus=2), start_mesh(gpus=1)
    counters = mesh.spawn(Counter, 0)
    here = other.spawn(Counter, 0)
    message = r"actor mesh Counter was spawned on another mesh, not on this one \(gpus=1\)"
    with pytest.raises(ValueError, match=message):
        other.run(lambda c: 1, counters)
    with pytest.raises(ValueError, match=message):
        here.incr.call(by=counters)
    assert mesh.run(lambda c: type(c).__name__, counters).values() == ["ActorMesh"] * 2


def test_a_bad_stop_timeout_is_refused_before_the_actors_are_stopped(start_mesh):
    mesh = start_mesh(gpus=1)
    counters = mesh.spawn(Counter, 0)
    with pytest.raises(ValueError, match=r"timeout='x': give a positive, finite number of seconds"):
        counters.stop(timeout="x")
    assert counters.incr.call().get().values() == [1], "the actors were not stopped"


def test_unpicklable_arguments_are_named_before_sending(start_mesh):
    import threading

    mesh = start_mesh(gpus=1)
    counters = mesh.spawn(Counter, 0)
    with pytest.raises(TypeError, match=r"Counter\.incr argument 'by' \(lock\) cannot be sent"):
        counters.incr.call(by=threading.Lock())
    assert counters.value.call_one().get() == 0
    # spawn's said "argument 0 (lock) cannot be sent", naming neither spawn nor the class
    with pytest.raises(TypeError, match=r"^spawn Counter: argument 0 \(lock\) cannot be sent"):
        mesh.spawn(Counter, threading.Lock())


def test_calls_after_shutdown_fail_clearly_and_pending_calls_end(start_mesh):
    mesh = start_mesh(gpus=1)
    counters = mesh.spawn(Counter, 0)
    pending = counters.nap.call_one(30)
    mesh.shutdown()
    with pytest.raises(Exception, match="shut down"):
        pending.get(timeout=5)
    with pytest.raises(RuntimeError, match=r"actor mesh Counter \(gpus=1\) belongs to a mesh that was shut down"):
        counters.incr.call()


class Talker(vr.Actor):
    @vr.endpoint
    def say(self, text: str) -> int:
        print(text)
        return 1


def test_endpoint_output_is_tagged_with_the_call_that_printed_it(start_mesh):
    mesh = start_mesh(gpus=2)
    talkers = mesh.spawn(Talker)
    events: list[dict] = []
    mesh.subscribe(lambda ev: events.append(ev) if ev["type"] == "output" else None)
    fut = talkers.say.call("hello from an actor")
    fut.get(timeout=10)
    lines = [(ev["rank"], ev["call"]) for ev in events if "hello from an actor" in ev["text"]]
    assert sorted(lines) == [(0, fut.call_id), (1, fut.call_id)]


class Sleeper(vr.Actor):
    def __init__(self, path: str) -> None:
        self.path = path

    @vr.endpoint
    def sleep(self, s: float) -> str:
        time.sleep(s)
        return "slept"

    def __cleanup__(self) -> None:
        with open(self.path, "w") as f:
            f.write(f"cleaned up on rank {vr.context().rank}")


def test_each_actor_has_its_own_thread_and_stop_runs_cleanup(start_mesh, tmp_path):
    mesh = start_mesh(gpus=1)
    sleeper = mesh.spawn(Sleeper, str(tmp_path / "cleanup.txt"))
    counters = mesh.spawn(Counter, 0)
    busy = sleeper.sleep.call_one(4)
    assert counters.incr.call_one().get(timeout=10) == 1
    assert not busy.done()  # answered while the sleeper still slept: not stuck behind it
    assert busy.get(timeout=10) == "slept"
    sleeper.stop()
    assert (tmp_path / "cleanup.txt").read_text() == "cleaned up on rank 0"


def test_actors_work_through_host_agents_too(start_mesh):
    mesh = start_mesh(hosts=2, gpus=1)  # two agents that relay, as across machines
    counters = mesh.spawn(Counter, 0)
    for _ in range(20):
        counters.incr.broadcast()
    assert counters.value.call().get(timeout=10).values() == [20, 20]
    assert sorted(counters.incr.stream()) == [21, 21]
    callers = mesh.slice(hosts=0).spawn(Caller, counters.slice(hosts=1))
    assert callers.bump_one.call_one().get(timeout=10) == 121


def _cancel_on_rank(call_id: int) -> bool:
    from viceroy.runtime.actors import answers, host

    return host.cancel(answers.rank, call_id)


def test_rank_side_cancel_stops_async_endpoints_and_drops_queued_calls(start_mesh):
    # What the rank's control thread calls on "cancel", invoked here directly (through
    # mesh.run, on the rank's main thread) to check each case.
    mesh = start_mesh(gpus=1)
    counters = mesh.spawn(Counter, 0)
    running = counters.slow.call_one("long", 30)
    queued = counters.incr.call_one()
    wait_s = time.monotonic()
    # mesh.run takes the work socket, actor calls the control socket: no order between them,
    # so wait until the rank has the calls (the real cancel comes on the control socket, after).
    for fut in (queued, running):
        wait_until(lambda f=fut: mesh.run(_cancel_on_rank, f.call_id).values() == [True], 10, "the call to arrive")
    with pytest.raises(vr.MeshError, match="interrupted"):
        running.get(timeout=10)
    with pytest.raises(vr.MeshError, match="interrupted before it started"):
        queued.get(timeout=10)
    assert time.monotonic() - wait_s < 5
    assert mesh.run(_cancel_on_rank, 10_000).values() == [False]
    assert counters.value.call_one().get() == 0  # the dropped incr never ran; the actor lives on


class Late(vr.Actor):
    @vr.endpoint
    def later(self, sync_s: float) -> object:
        time.sleep(sync_s)  # a sync part first (a decorator's, say), then the awaitable to run
        return asyncio.sleep(30)


def test_a_cancel_before_an_awaitable_has_its_task_still_stops_it(start_mesh):
    # The cancel lands while the endpoint has no task yet: it must not be forgotten.
    mesh = start_mesh(gpus=1)
    late = mesh.spawn(Late)
    running = late.later.call_one(1.0)
    wait_until(lambda: mesh.run(_cancel_on_rank, running.call_id).values() == [True], 10, "the call to start")
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError, match="interrupted"):
        running.get(timeout=20)
    assert time.monotonic() - t0 < 5  # not the 30 s the awaitable would have slept
    assert mesh.run(_cancel_on_rank, running.call_id).values() == [False]  # forgotten once over


def test_stop_answers_every_call_sent_before_it(start_mesh):
    mesh = start_mesh(gpus=1)
    gates = mesh.spawn(Gate)
    counters = mesh.spawn(Counter, 0)
    waiting = gates.wait.call_one()  # a concurrent endpoint, blocked until stop cancels it
    busy = counters.nap.call_one(0.5)
    queued = counters.incr.call_one()  # behind the nap: stop is a message like others, after it
    t0 = time.monotonic()
    gates.stop()
    counters.stop()
    assert time.monotonic() - t0 < 5
    with pytest.raises(vr.MeshError, match="interrupted"):
        waiting.get(timeout=10)
    assert busy.get(timeout=10) == 0
    assert queued.get(timeout=10) == 1


class Napper(vr.Actor):
    @vr.endpoint
    async def nap(self) -> None:
        print("napping", flush=True)
        await asyncio.sleep(30)


def test_interrupting_the_mesh_cancels_running_async_endpoints_at_once(start_mesh):
    mesh = start_mesh(gpus=2)
    nappers = mesh.spawn(Napper)
    fut = nappers.nap.call()
    wait_until(lambda: all("napping" in mesh.logs(r) for r in (0, 1)), 10, "both endpoints to be awaiting")
    t0 = time.monotonic()
    mesh.interrupt()
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=5)
    assert time.monotonic() - t0 < 0.9  # cancelled, not given up on after the grace period
    assert "did not stop" not in str(info.value) and "before it started" not in str(info.value)
    counters = mesh.spawn(Counter, 0)
    assert counters.incr.call().get().values() == [1, 1]  # the ranks and their actors live on


class SyncNapper(vr.Actor):
    @vr.endpoint
    def nap(self, seconds: float) -> str:
        print("napping", flush=True)
        time.sleep(seconds)
        return "woke"


def test_an_interrupted_sync_endpoint_is_said_to_run_to_its_end_and_then_the_actor_answers(start_mesh):
    # The message was the one for code: "(busy in native code?). It stays busy; mesh.restart()
    # ends it", though the endpoint runs to its end and the actor answers after it.
    mesh = start_mesh(gpus=1)
    nappers = mesh.spawn(SyncNapper)
    fut = nappers.nap.call(3.0)
    wait_until(lambda: "napping" in mesh.logs(0), 10, "the endpoint to start")
    mesh.interrupt()
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=10)
    message = str(info.value)
    assert "a sync endpoint, once started, runs to its end" in message, message
    assert "native code" not in message and "restart" not in message
    assert nappers.nap.call_one(0).get(timeout=10) == "woke"  # as it said: the actor answers next


class SlowToStart(vr.Actor):
    def __init__(self, seconds: float) -> None:
        if vr.context().rank == 1:
            time.sleep(seconds)  # on the actor's thread: an interrupt does not stop it

    @vr.endpoint
    def ping(self) -> int:
        return 1


def _actors_on_ranks(mesh: vr.Mesh) -> list[list[str]]:
    return mesh.run("from viceroy.runtime.actors import actor_thread\nsorted(actor_thread._actors)", timeout=10).values()


@pytest.mark.parametrize("how", ["mesh.interrupt()", "Ctrl-C"])
def test_an_interrupted_spawn_leaves_no_actor_behind(start_mesh, how):
    # The actors made on the ranks that had answered, and the one still being constructed,
    # lived on with nobody holding them (Ctrl-C), or the one being constructed did (interrupt).
    import os
    import signal
    import threading

    mesh = start_mesh(gpus=2)
    t0 = time.monotonic()
    stop = (mesh.interrupt if how == "mesh.interrupt()" else lambda: os.kill(os.getpid(), signal.SIGINT))
    wait_until_spawning = threading.Timer(1.0, stop)
    wait_until_spawning.start()
    with pytest.raises((vr.MeshError, KeyboardInterrupt)):
        mesh.spawn(SlowToStart, 3.0)
    assert time.monotonic() - t0 < 3.0  # the interrupt ended the wait
    wait_until(lambda: _actors_on_ranks(mesh) == [[], []], 10, "no actor left on any rank")


class WhereAmI(vr.Actor):
    def __init__(self) -> None:
        self.at_start = vr.context().coords

    @vr.endpoint
    def where(self) -> tuple[dict[str, int], dict[str, int], dict[str, int], tuple[int, ...]]:
        from viceroy.runtime.collectives.groups import group_for

        ctx = vr.context()
        return self.at_start, ctx.coords, ctx.dims, group_for(None).ranks  # group_for(None): vr.all_reduce(t)'s

    @vr.endpoint
    async def where_async(self) -> dict[str, int]:
        return vr.context().coords


def test_an_actor_spawned_on_a_view_sees_the_view_in_its_constructor_and_endpoints(start_mesh):
    # It saw the whole mesh: a vr.all_reduce(t) with no dims in an endpoint waited forever for
    # ranks outside the actor mesh, and on a split the coords were {"gpus": n}.
    mesh = start_mesh(gpus=4)
    half = mesh.slice(gpus=slice(2, 4)).spawn(WhereAmI)
    assert half.where.call().get(timeout=10).values() == [
        ({"gpus": 0}, {"gpus": 0}, {"gpus": 2}, (2, 3)),
        ({"gpus": 1}, {"gpus": 1}, {"gpus": 2}, (2, 3)),
    ]
    assert half.where_async.call().get(timeout=10).values() == [{"gpus": 0}, {"gpus": 1}]
    split = mesh.split(gpus=("dp", "tp"), tp=2).spawn(WhereAmI)
    got = split.where.call().get(timeout=10).values()
    assert [g[1] for g in got] == [{"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]
    assert got[0][2] == {"dp": 2, "tp": 2} and got[0][3] == (0, 1, 2, 3)
    whole = mesh.spawn(WhereAmI)  # on the mesh itself: the mesh's coords, as before
    assert whole.where.call().get(timeout=10).values()[3] == ({"gpus": 3}, {"gpus": 3}, {"gpus": 4}, (0, 1, 2, 3))
    assert mesh.run("coords, mesh").values()[3] == ({"gpus": 3}, {"gpus": 4})  # the main thread's untouched


class StreamNapper(vr.Actor):
    @vr.endpoint
    async def nap(self) -> str:
        print("napping", flush=True)
        await asyncio.sleep(30)
        return "woke"

    @vr.endpoint
    def ping(self) -> str:
        return "pong"


def test_ctrl_c_while_iterating_a_stream_cancels_the_call_on_the_ranks(start_mesh):
    # The KeyboardInterrupt came, but the endpoints ran on (call().get() cancels them): the
    # next call waited behind them.
    import os
    import signal
    import threading

    mesh = start_mesh(gpus=2)
    nappers = mesh.spawn(StreamNapper)

    def ctrl_c_once_napping() -> None:
        wait_until(lambda: all("napping" in mesh.logs(r) for r in (0, 1)), 10, "both endpoints to be awaiting")
        os.kill(os.getpid(), signal.SIGINT)

    ctrl_c = threading.Thread(target=ctrl_c_once_napping)
    ctrl_c.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in nappers.nap.stream():
                pass
    finally:
        ctrl_c.join()
    t0 = time.monotonic()
    assert nappers.ping.call().get(timeout=20).values() == ["pong", "pong"]
    assert time.monotonic() - t0 < 3  # not behind a 30 s nap


def test_a_call_that_times_out_names_its_endpoint_and_a_shut_down_meshs_actors_say_so(start_mesh):
    # The timeout said "call 5 still running after 0.2 s"; the repr after shutdown "2 live".
    mesh = start_mesh(gpus=2)
    counters = mesh.spawn(Counter, 0)
    with pytest.raises(TimeoutError) as info:
        counters.slow.call("x", 30).get(timeout=0.2)
    assert str(info.value).startswith("Counter.slow still running after 0.2 s; wait longer"), info.value
    with pytest.raises(TimeoutError, match=r"^Counter\.slow still running after 0\.2 s"):
        counters.slice(gpus=0).slow.call_one("y", 30).get(timeout=0.2)
    mesh.interrupt()
    assert repr(counters) == "<viceroy.ActorMesh Counter (gpus=2): 2 live>"
    mesh.shutdown()
    assert repr(counters) == "<viceroy.ActorMesh Counter (gpus=2): its mesh was shut down>"
