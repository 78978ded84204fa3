"""An actor mesh nobody can reach any more is stopped: rerunning a notebook's
``counters = mesh.spawn(Counter)`` must not leave one more actor thread (and its event loop's
fds) on every rank each time."""

from __future__ import annotations

import asyncio
import gc
import os

import psutil

import viceroy as vr
from tests.conftest import wait_until


class Echo(vr.Actor):
    @vr.endpoint
    def echo(self, x: int) -> int:
        return x

    @vr.endpoint
    async def later(self, x: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return x


def _use(mesh: vr.Mesh) -> list[tuple[int, int]]:
    """(threads, open fds) of each rank."""
    return [(psutil.Process(p).num_threads(), len(os.listdir(f"/proc/{p}/fd"))) for p in mesh.pids().values()]


def test_dropped_actor_meshes_are_stopped_and_their_threads_and_fds_freed(start_mesh):
    mesh = start_mesh(gpus=2)
    a = mesh.spawn(Echo)
    assert a.echo.call(1).get().values() == [1, 1]
    del a
    gc.collect()
    before = _use(mesh)
    for i in range(100):  # a cell rerun 100 times
        a = mesh.spawn(Echo)
        assert a.echo.call(i).get().values() == [i, i]
    del a
    gc.collect()
    # Before: each rank held 100 more threads and 300 more fds, for good.
    wait_until(
        lambda: all(t - t0 <= 3 and f - f0 <= 9 for (t, f), (t0, f0) in zip(_use(mesh), before, strict=True)),
        10, f"the dropped actors to stop (threads, fds before: {before})",
    )


def test_a_call_in_flight_keeps_its_dropped_actor_mesh_until_it_ends(start_mesh):
    mesh = start_mesh(gpus=2)
    fut = mesh.spawn(Echo).later.call(7, 0.5)  # the handle is garbage at once
    gc.collect()
    assert fut.get(timeout=10).values() == [7, 7]


def test_an_actor_mesh_sent_to_ranks_is_not_stopped_when_dropped_here(start_mesh):
    mesh = start_mesh(gpus=2)
    a = mesh.spawn(Echo)
    mesh.run("global kept; kept = a", a=a)  # the ranks keep it
    del a
    gc.collect()
    assert mesh.run("kept.echo.call(5).get().values()").values() == [[5, 5], [5, 5]]


class Writer(vr.Actor):
    @vr.endpoint
    async def write_later(self, path: str, delay: float) -> None:
        await asyncio.sleep(delay)
        with open(f"{path}-{vr.context().rank}", "w") as f:
            f.write("written")


def test_a_broadcast_sent_before_the_last_handle_is_dropped_still_runs_to_its_end(start_mesh, tmp_path):
    # The stop of a dropped actor mesh lets what was sent before it finish (stop() cancels
    # running async endpoints; a drop has nobody asking for that).
    mesh = start_mesh(gpus=2)
    writers = mesh.spawn(Writer)
    writers.write_later.broadcast(str(tmp_path / "out"), 0.5)
    del writers
    gc.collect()
    wait_until(lambda: sorted(os.listdir(tmp_path)) == ["out-0", "out-1"], 10, "both writes")
    wait_until(lambda: mesh.run("from viceroy.runtime.actors import actor_thread\nsorted(actor_thread._actors)", timeout=10).values()
               == [[], []], 10, "the actors to be stopped after it")
