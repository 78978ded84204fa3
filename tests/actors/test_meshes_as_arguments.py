"""Actor meshes passed as arguments: an actor calls another actor mesh's endpoints, with every
adverb, from sync and async endpoints, and the answers (and failures) come back to it."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import viceroy as vr
from tests.conftest import wait_running, wait_until


class Loader(vr.Actor):
    def __init__(self, batches: int) -> None:
        self.left = list(range(batches))
        self.served: list[int] = []

    @vr.endpoint
    def next(self) -> tuple[int, int]:
        batch = self.left.pop(0)
        self.served.append(batch)
        return vr.context().rank, batch

    @vr.endpoint
    def note(self, tag: str) -> None:
        self.served.append(-1 if tag == "epoch" else -2)

    @vr.endpoint
    def log(self) -> list[int]:
        return self.served

    @vr.endpoint
    def broken(self) -> None:
        raise ValueError("the shard file is corrupt")


class Trainer(vr.Actor):
    """The issue's example: ``trainers = mesh.spawn(Trainer, loaders)``."""

    def __init__(self, loaders: vr.ActorMesh) -> None:
        rank = vr.context().rank
        self.mine = loaders.slice(gpus=rank)  # the loader beside this trainer
        self.loaders = loaders

    @vr.endpoint
    def step(self) -> tuple[int, int]:
        return self.mine.next.call_one().get(timeout=10)

    @vr.endpoint
    async def step_async(self) -> tuple[int, int]:
        return await self.mine.next.call_one()

    @vr.endpoint
    def any_loader(self) -> int:
        rank, _ = self.loaders.next.choose().get(timeout=10)
        return int(rank)

    @vr.endpoint
    def everyone(self) -> list[int]:
        return [b for _, b in self.loaders.next.call().get(timeout=10).values()]

    @vr.endpoint
    def streamed(self) -> list[tuple[int, int]]:
        return sorted(self.loaders.next.stream())

    @vr.endpoint
    def new_epoch(self) -> None:
        self.loaders.note.broadcast("epoch")

    @vr.endpoint
    def try_broken(self) -> str:
        try:
            self.mine.broken.call_one().get(timeout=10)
        except vr.MeshError as exc:
            return str(exc)
        return "no error"

    @vr.endpoint
    def bad_call(self) -> str:
        try:
            self.mine.next.call_one("unexpected")
        except TypeError as exc:
            return str(exc)
        return "no error"


def test_trainers_call_their_loaders_from_sync_and_async_endpoints(start_mesh):
    mesh = start_mesh(gpus=2)
    loaders = mesh.spawn(Loader, 10)
    trainers = mesh.spawn(Trainer, loaders)
    assert trainers.step.call().get(timeout=20).values() == [(0, 0), (1, 0)]
    assert trainers.step_async.call().get(timeout=20).values() == [(0, 1), (1, 1)]
    assert trainers.slice(gpus=1).step.call_one().get(timeout=20) == (1, 2)
    assert loaders.log.call().get().values() == [[0, 1], [0, 1, 2]]


def test_an_actor_uses_every_adverb_on_a_mesh_it_was_given(start_mesh):
    mesh = start_mesh(gpus=2)
    loaders = mesh.spawn(Loader, 10)
    boss = mesh.slice(gpus=0).spawn(Trainer, loaders)
    assert boss.everyone.call_one().get(timeout=20) == [0, 0]
    assert boss.streamed.call_one().get(timeout=20) == [(0, 1), (1, 1)]
    assert boss.any_loader.call_one().get(timeout=20) in (0, 1)
    boss.new_epoch.call_one().get(timeout=20)
    # The broadcast is one-way; the loaders still see it before a later call from the boss.
    wait_until(lambda: all(-1 in log for log in loaders.log.call().get().values()), 10, "the broadcast")


def test_errors_on_the_called_mesh_reach_the_calling_actor(start_mesh):
    mesh = start_mesh(gpus=1)
    loaders = mesh.spawn(Loader, 1)
    trainers = mesh.spawn(Trainer, loaders)
    msg = trainers.try_broken.call_one().get(timeout=20)
    assert "rank 0" in msg and "ValueError: the shard file is corrupt" in msg
    assert "Loader.broken" in msg
    # Arguments are checked against the signature on the calling rank, before anything is sent.
    assert trainers.bad_call.call_one().get(timeout=20) == "Loader.next(): too many positional arguments"
    loaders.stop()
    with pytest.raises(vr.MeshError, match="stopped") as info:
        trainers.step.call_one().get(timeout=20)
    # The trainer's traceback shows its own line, not the futures plumbing under .get().
    assert "return self.mine.next.call_one().get(timeout=10)" in str(info.value)
    assert "concurrent/futures" not in str(info.value) and "_base.py" not in str(info.value), str(info.value)


def test_actor_meshes_travel_inside_endpoint_arguments_too(start_mesh):
    mesh = start_mesh(gpus=2)
    loaders = mesh.spawn(Loader, 5)

    class Relay(vr.Actor):
        @vr.endpoint
        async def pull(self, sources: dict[str, vr.ActorMesh]) -> list[tuple[int, int]]:
            return sorted((await sources["data"].next.call()).values())

    relay = mesh.slice(gpus=1).spawn(Relay)
    assert relay.pull.call_one({"data": loaders}).get(timeout=20) == [(0, 0), (1, 0)]
    assert asyncio.run(_await(relay.pull.call_one({"data": loaders}))) == [(0, 1), (1, 1)]


async def _await(fut: vr.Future) -> object:
    return await fut


def test_a_call_from_an_actor_that_times_out_names_the_endpoint(start_mesh):
    mesh = start_mesh(gpus=2)

    class Slow(vr.Actor):
        @vr.endpoint
        def wait(self, s: float) -> float:
            import time

            time.sleep(s)
            return s

    class Caller(vr.Actor):
        def __init__(self, slow: vr.ActorMesh) -> None:
            self.slow = slow

        @vr.endpoint
        def impatient(self) -> str:
            try:
                self.slow.wait.call_one(2.0).get(timeout=0.2)
            except TimeoutError as exc:
                return str(exc)
            return "no timeout"

    slow = mesh.slice(gpus=1).spawn(Slow)
    caller = mesh.slice(gpus=0).spawn(Caller, slow)
    msg = caller.impatient.call_one().get(timeout=20)
    assert msg.startswith("Slow.wait still running after 0.2 s; it goes on"), msg
    assert "call -1" not in msg
    assert slow.wait.call_one(0.0).get(timeout=20) == 0.0  # after the first, which went on


class Forwarder(vr.Actor):
    def __init__(self, loaders: vr.ActorMesh) -> None:
        self.loaders = loaders

    @vr.endpoint
    def send_a_lock(self) -> object:
        import threading

        return self.loaders.note.call(threading.Lock()).get(timeout=10)


def test_an_unpicklable_argument_from_an_actor_is_named_as_on_the_controller(start_mesh):
    # It was cloudpickle's bare "cannot pickle '_thread.lock' object", with its frames.
    import re
    import threading

    mesh = start_mesh(gpus=2)
    loaders = mesh.slice(gpus=slice(1, 2)).spawn(Loader, 1)
    named = "Loader.note argument 0 (lock) cannot be sent to the ranks: cannot pickle '_thread.lock' object"
    with pytest.raises(TypeError, match=re.escape(named)):
        loaders.note.call(threading.Lock())
    forwarders = mesh.slice(gpus=slice(0, 1)).spawn(Forwarder, loaders)
    with pytest.raises(vr.MeshError) as info:
        forwarders.send_a_lock.call_one().get(timeout=20)
    message = str(info.value)
    assert f"TypeError: {named}" in message, message
    assert "cloudpickle" not in message, message


class Peer(vr.Actor):
    """Actors that hold their own actor mesh: ``peers.set_peers.call(peers)``."""

    def __init__(self) -> None:
        self.peers: vr.ActorMesh | None = None

    @vr.endpoint
    def set_peers(self, peers: vr.ActorMesh) -> None:
        self.peers = peers

    @vr.endpoint
    def pong(self) -> int:
        return vr.context().rank

    @vr.endpoint
    def nap(self, seconds: float) -> None:
        import time

        time.sleep(seconds)

    @vr.endpoint
    def ping_all(self) -> list[int]:
        assert self.peers is not None
        return self.peers.pong.call().get(timeout=10).values()

    @vr.endpoint
    def ping_self(self) -> int:
        assert self.peers is not None
        return self.peers.slice(gpus=vr.context().rank).pong.call_one().get(timeout=10)

    @vr.endpoint
    def stream_all(self) -> list[int]:
        assert self.peers is not None
        return list(self.peers.pong.stream())

    @vr.endpoint
    async def ping_all_async(self) -> list[int]:
        assert self.peers is not None
        return (await self.peers.pong.call()).values()

    @vr.endpoint(concurrent=True)
    async def ping_all_concurrent(self) -> list[int]:
        assert self.peers is not None
        return (await self.peers.pong.call()).values()

    @vr.endpoint
    def wait_for_nap(self, rank: int) -> None:
        assert self.peers is not None
        self.peers.slice(gpus=rank).nap.call_one(30).get()

    @vr.endpoint
    def stream_nap(self, rank: int) -> None:
        assert self.peers is not None
        list(self.peers.slice(gpus=rank).nap.stream(30))


@pytest.fixture
def peers(start_mesh) -> vr.ActorMesh:
    actors = start_mesh(gpus=2).spawn(Peer)
    actors.set_peers.call(actors).get(timeout=10)
    return actors


@pytest.mark.parametrize("endpoint", ["ping_all", "ping_self", "ping_all_async", "stream_all"])
def test_an_endpoint_waiting_for_a_call_on_its_own_actor_fails_at_once_saying_why(peers, endpoint):
    # It waited forever (its own actor takes the next message only once it returns), and so
    # did every later call to these actors (a stream's wait was not even checked).
    with pytest.raises(vr.MeshError) as info:
        getattr(peers, endpoint).call().get(timeout=5)
    msg = str(info.value)
    pong = "Peer.pong (stream)" if endpoint == "stream_all" else "Peer.pong"
    assert f"rank 0: RuntimeError: Peer.{endpoint} on rank 0 waits for {pong}, which includes this very actor" \
        in msg, msg
    assert "concurrent=True" in msg, msg
    if endpoint != "ping_self":
        assert "call only the other actors (rank 1, through a slice or select)" in msg, msg
    assert peers.pong.call().get(timeout=5).values() == [0, 1]


def test_a_concurrent_endpoint_may_await_a_call_on_its_own_actor(peers):
    assert peers.ping_all_concurrent.call().get(timeout=10).values() == [[0, 1], [0, 1]]


@pytest.mark.parametrize("endpoint", ["wait_for_nap", "stream_nap"])
def test_interrupting_the_mesh_releases_an_endpoint_waiting_for_another_actors_call(start_mesh, endpoint):
    # The waiting endpoint ran on until the call it waited for ended (30 s here), its actor
    # deaf to everything meanwhile, and its caller was told it "did not stop".
    mesh = start_mesh(gpus=2)
    peers = mesh.spawn(Peer)
    peers.set_peers.call(peers).get(timeout=10)
    waiting = getattr(peers.slice(gpus=0), endpoint).call_one(1)
    wait_running(mesh.select([1]), "time.sleep")
    mesh.interrupt()
    with pytest.raises(vr.MeshError) as info:
        waiting.get(timeout=5)
    assert info.value.failures[0].kind == "interrupted", info.value
    assert "did not stop" not in str(info.value), info.value
    assert peers.slice(gpus=0).pong.call_one().get(timeout=5) == 0  # free again, while rank 1 naps on


# --- an endpoint giving up on a call it made --------------------------------------------------


class Sleeper(vr.Actor):
    @vr.endpoint(concurrent=True)
    async def nap(self, marks: str) -> str:
        open(f"{marks}.started", "w").close()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            open(f"{marks}.cancelled", "w").close()
            raise
        return "slept"

    @vr.endpoint
    def ready(self) -> int:
        return vr.context().rank


class Impatient(vr.Actor):
    def __init__(self, sleepers: vr.ActorMesh) -> None:
        self.sleeper = sleepers.slice(gpus=1)

    @vr.endpoint(concurrent=True)
    async def give_up(self, marks: str, how: str) -> str:
        """Await the nap; once it runs on rank 1, give up: `wait_for` timing out (a call), or the
        awaiting task cancelled (a stream)."""
        async def stream() -> list[str]:
            return [v async for v in self.sleeper.nap.stream(marks)]

        task = asyncio.ensure_future(self.sleeper.nap.call_one(marks) if how == "call" else stream())
        deadline = time.monotonic() + 30
        while not os.path.exists(f"{marks}.started") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        try:
            if how == "call":
                await asyncio.wait_for(task, timeout=0.2)  # cancels the task as it times out
            else:
                task.cancel()
                await task
        except (TimeoutError, asyncio.CancelledError):
            return "gave up"
        return "did not give up"


@pytest.mark.parametrize("how", ["call", "stream"])
def test_an_endpoint_that_stops_awaiting_a_call_cancels_it_where_it_runs(start_mesh, tmp_path, how):
    """``asyncio.wait_for`` timing out (or any cancel of the awaiting task) gives up on the call:
    as on the controller, the call is cancelled on its ranks. It ran on (here for 60 s, holding what it
    held) with nobody left to take its answer."""
    mesh = start_mesh(gpus=2)
    sleepers = mesh.spawn(Sleeper)
    impatient = mesh.slice(gpus=0).spawn(Impatient, sleepers)
    marks = str(tmp_path / "nap")
    assert impatient.give_up.call_one(marks, how).get(timeout=30) == "gave up"
    assert os.path.exists(f"{marks}.started")
    wait_until(lambda: os.path.exists(f"{marks}.cancelled"), 10, "the call given up on to be cancelled on rank 1")
    assert sleepers.ready.call().get(timeout=10).values() == [0, 1]
