"""`stop()`: what it does to calls in flight, `__cleanup__`, and the actors' threads, and what it
says when an actor is busy in a sync endpoint for longer than stop() waits."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import viceroy as vr
from tests.conftest import wait_until

_ACTOR_THREADS = "import threading\nsorted(t.name for t in threading.enumerate() if t.name.startswith('actor '))"


class Busy(vr.Actor):
    def __init__(self, marks: str) -> None:
        self.marks = marks

    @vr.endpoint
    async def asleep(self, seconds: float) -> str:
        open(os.path.join(self.marks, f"started-{vr.context().rank}"), "w").close()
        await asyncio.sleep(seconds)
        return "done"

    @vr.endpoint
    def until(self, path: str) -> str:
        """Sync, busy until `path` exists (a test's gate; at most 60 s)."""
        open(os.path.join(self.marks, f"started-{vr.context().rank}"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return "released"

    @vr.endpoint
    def ping(self) -> int:
        return 1

    def __cleanup__(self) -> None:
        open(os.path.join(self.marks, f"cleanup-{vr.context().rank}"), "w").close()


def _marks(path: object) -> list[str]:
    return sorted(os.listdir(str(path)))


def test_stop_cancels_a_running_async_endpoint_at_once_and_the_actor_really_stops(start_mesh, tmp_path):
    # It waited 10 s, then returned saying "stopped" while the actor ran on: its stop message
    # was cancelled on the ranks with the call that timed out, so __cleanup__ never ran.
    mesh = start_mesh(gpus=2)
    actors = mesh.spawn(Busy, str(tmp_path))
    fut = actors.asleep.call(60)
    wait_until(lambda: _marks(tmp_path) == ["started-0", "started-1"], 10, "the endpoints to start")
    t0 = time.monotonic()
    actors.stop()
    assert time.monotonic() - t0 < 3
    with pytest.raises(vr.MeshError, match="interrupted"):
        fut.get(timeout=5)
    assert "2 stopped" in repr(actors)
    assert _marks(tmp_path) == ["cleanup-0", "cleanup-1", "started-0", "started-1"]
    wait_until(lambda: mesh.run(_ACTOR_THREADS, timeout=10).values() == [[], []], 10, "the actor threads to end")


def test_stop_during_a_long_sync_endpoint_says_it_is_not_done_and_stops_when_it_ends(start_mesh, tmp_path, capfd):
    mesh = start_mesh(gpus=2)
    marks = tmp_path / "marks"
    marks.mkdir()
    gate = tmp_path / "gate"
    actors = mesh.spawn(Busy, str(marks))
    fut = actors.slice(gpus=1).until.call_one(str(gate))
    wait_until(lambda: _marks(marks) == ["started-1"], 10, "the endpoint to start")
    t0 = time.monotonic()
    actors.stop(timeout=3)  # rank 0 stops within it; rank 1 is held by the gate
    assert time.monotonic() - t0 < 6
    err = capfd.readouterr().err
    assert "not stopped yet on rank 1 after 3 s" in err and "repr() says 'stopping'" in err, err
    assert "1 stopped, 1 stopping" in repr(actors)
    with pytest.raises(RuntimeError, match=r"is stopping \(still busy on 1\)"):
        actors.ping.call()
    assert _marks(marks) == ["cleanup-0", "started-1"]  # rank 0 stopped; rank 1 not yet
    gate.touch()
    assert fut.get(timeout=10) == "released"  # the endpoint ran to its end, and answered
    wait_until(lambda: "2 stopped" in repr(actors), 10, "the stop to be answered")
    assert _marks(marks) == ["cleanup-0", "cleanup-1", "started-1"]
    assert mesh.run(_ACTOR_THREADS, timeout=10).values() == [[], []]
    actors.stop()  # stopped already: nothing to do, nothing said
    assert "not stopped yet" not in capfd.readouterr().err


class FailsToClean(vr.Actor):
    @vr.endpoint
    def ping(self) -> int:
        return 1

    def __cleanup__(self) -> None:
        if vr.context().rank == 1:
            raise RuntimeError("could not flush checkpoint")


def test_a_cleanup_that_raises_makes_stop_raise_naming_its_ranks(start_mesh):
    # stop() returned normally and the error was seen nowhere.
    mesh = start_mesh(gpus=2)
    actors = mesh.spawn(FailsToClean)
    with pytest.raises(vr.MeshError) as info:
        actors.stop()
    err = info.value
    assert err.ranks == [1] and err.what == "FailsToClean.__cleanup__"
    assert "RuntimeError: could not flush checkpoint" in str(err)
    assert 'raise RuntimeError("could not flush checkpoint")' in str(err)  # the actor's line
    assert "stopped all the same" in str(err)
    assert "2 stopped" in repr(actors)
    with pytest.raises(RuntimeError, match="was stopped"):
        actors.ping.call()


def test_shutting_the_mesh_down_runs_cleanup_and_never_waits_long_on_a_busy_actor(start_mesh, tmp_path, capfd):
    # __cleanup__ never ran when the mesh shut down (a with-block's end, say).
    mesh = start_mesh(gpus=2)
    marks = tmp_path / "marks"
    marks.mkdir()
    idle = mesh.spawn(Busy, str(marks))
    failing = mesh.spawn(FailsToClean)
    stuck_marks = tmp_path / "stuck"
    stuck_marks.mkdir()
    stuck = mesh.slice(gpus=slice(0, 1)).spawn(Busy, str(stuck_marks))
    stuck.until.call(str(tmp_path / "never"))
    wait_until(lambda: _marks(stuck_marks) == ["started-0"], 10, "the sync endpoint to start")
    t0 = time.monotonic()
    mesh.shutdown()
    took = time.monotonic() - t0
    assert took < 6, took  # about 1.5 s for the actors, then the ranks stop as before
    assert _marks(marks) == ["cleanup-0", "cleanup-1"]
    err = capfd.readouterr().err
    assert "as the mesh shut down: FailsToClean.__cleanup__ failed on 1 of 2 ranks" in err, err
    assert "could not flush checkpoint" in err
    assert "the mesh shut down while actor mesh Busy (gpus=1) was busy on rank 0" in err
    assert "it did not run __cleanup__" in err
    assert _marks(stuck_marks) == ["started-0"]
    for actors in (idle, failing):
        assert actors._client.control(actors._info).status == {0: "stopped", 1: "stopped"}
        assert "its mesh was shut down" in repr(actors)


def test_part_of_an_actor_mesh_stopped_choose_picks_a_running_actor_and_call_says_which_run(start_mesh, tmp_path):
    # choose() refused the whole mesh once any of its actors was stopped, though it picks among
    # the running ones when some failed; call() said "spawn a new one", not which still run.
    mesh = start_mesh(gpus=4)
    actors = mesh.spawn(Busy, str(tmp_path))
    actors.slice(gpus=slice(0, 2)).stop()
    assert {actors.ping.choose().get(timeout=10) for _ in range(4)} == {1}
    with pytest.raises(RuntimeError) as info:
        actors.ping.call()
    assert str(info.value) == (
        "actor mesh Busy (gpus=4) was stopped (ranks 0-1); its actors on ranks 2-3 still run: call them through a "
        "slice or select of it (actors.select([2, 3])), or spawn a new one with mesh.spawn(Busy, ...)")
    assert actors.select([2, 3]).ping.call().get(timeout=10).values() == [1, 1]
    actors.stop()
    with pytest.raises(RuntimeError, match=r"^actor mesh Busy \(gpus=4\) was stopped \(ranks 0-3\); spawn a new one"):
        actors.ping.choose()
