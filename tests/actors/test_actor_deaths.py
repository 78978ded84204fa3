"""A rank dying under an actor endpoint call fails the call within about a second (as it does a
`mesh.run`), without waiting for the actors still running it; their late answers are dropped."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import viceroy as vr
from tests.conftest import Owner, fails_within, wait_running, wait_until


class Sleeper(vr.Actor):
    def __init__(self) -> None:
        self.calls = 0

    @vr.endpoint
    def nap(self, flag: str) -> int:
        """Rank 0 answers at once; the others sleep until `flag` exists (30 s at most)."""
        self.calls += 1
        rank = vr.context().rank
        if rank != 0:
            deadline = time.monotonic() + 30
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.05)
        return rank * 10

    @vr.endpoint
    def count(self) -> int:
        return self.calls


def _tables_clean(mesh: vr.Mesh) -> bool:
    c = mesh._controller
    with c._lock:
        return not c._calls and not c._stuck


def test_a_dead_rank_fails_an_endpoint_call_at_once_and_late_answers_are_dropped(start_mesh, tmp_path, capfd):
    mesh = start_mesh(gpus=4)
    owner = Owner()
    sleepers = mesh.spawn(Sleeper, owner=owner)
    flag = str(tmp_path / "wake")
    fut = sleepers.nap.call(flag)
    wait_running(mesh.select([1, 2, 3]), "time.sleep")
    wait_until(lambda: mesh.states()[0] == "idle", 10, "rank 0 to answer")

    err = fails_within(fut, lambda: os.kill(mesh.pids()[2], signal.SIGKILL), 3, timeout=10)
    assert err.failures[2].kind == "died" and "died (SIGKILL)" in err.failures[2].summary, err
    assert err.partial == {0: 0}, err
    assert str(err).startswith("Sleeper.nap failed on 1 of 4 ranks\nrank 2: died (SIGKILL)"), err
    assert "restart() on the actor mesh" in str(err), err
    # The others are still in it: said so, not reported as failed.
    for r in (1, 3):
        assert err.failures[r].kind == "interrupted", err
        assert "rank 2 died" in err.failures[r].summary and "dropped" in err.failures[r].summary, err
    assert mesh.states() == {0: "idle", 1: "running", 2: "dead", 3: "running"}

    Path(flag).touch()  # the sleepers answer now: late, dropped
    wait_until(lambda: _tables_clean(mesh), 10, "the late answers to be dropped")
    assert mesh.states() == {0: "idle", 1: "idle", 2: "dead", 3: "idle"}
    live = sleepers.select([0, 1, 3])
    assert live.nap.call(flag).get(timeout=10).values() == [0, 10, 30]
    assert live.count.call().get(timeout=10).values() == [2, 2, 2]

    # The death reached supervision once, and nothing was printed of it or of the late answers.
    assert [(f.kind, f.ranks) for f in owner.failures] == [("died", (2,))]
    assert sleepers.restart(timeout=30) == [2]
    assert sleepers.nap.call(flag).get(timeout=30).values() == [0, 10, 20, 30]
    assert sleepers.count.call().get(timeout=10).values() == [3, 3, 1, 3]
    assert [(f.kind, f.ranks) for f in owner.failures] == [("died", (2,))]
    assert wait_until(lambda: _tables_clean(mesh), 5, "no call left in flight")
    err_text = capfd.readouterr().err
    assert "IO thread" not in err_text and "Traceback" not in err_text, err_text


def test_a_dead_rank_ends_a_stream_after_the_values_already_come(start_mesh, tmp_path):
    mesh = start_mesh(gpus=3)
    sleepers = mesh.spawn(Sleeper)
    flag = str(tmp_path / "wake")
    values = sleepers.nap.stream(flag)
    assert next(values) == 0  # rank 0's, at once
    wait_running(mesh.select([1, 2]), "time.sleep")
    t0 = time.monotonic()
    os.kill(mesh.pids()[1], signal.SIGKILL)
    try:
        next(values)
    except vr.MeshError as exc:
        err = exc
    else:
        raise AssertionError("the stream yielded a late value instead of the death's error")
    took = time.monotonic() - t0
    assert took < 3, f"the stream ended {took:.1f} s after the death, not within 3 s"
    assert err.failures[1].kind == "died" and err.partial == {0: 0}, err
    Path(flag).touch()
    wait_until(lambda: _tables_clean(mesh), 10, "the late answer to be dropped")
    assert sleepers.select([0, 2]).nap.call(flag).get(timeout=10).values() == [0, 20]


class AsyncSleeper(vr.Actor):
    @vr.endpoint
    async def nap(self) -> int:
        rank = vr.context().rank
        if rank != 0:
            print("napping", flush=True)
            await asyncio.sleep(30)
        return rank

    @vr.endpoint
    def ping(self) -> str:
        return "pong"


def test_interrupting_a_call_a_death_is_ending_still_cancels_it_on_the_others(start_mesh):
    # In the second between a death and the call's end, the call was no longer waited for but
    # not cancelled either: an interrupt then was lost, and the async endpoints napped on.
    mesh = start_mesh(gpus=3)
    sleepers = mesh.spawn(AsyncSleeper)
    fut = sleepers.nap.call()
    wait_until(lambda: all("napping" in mesh.logs(r) for r in (1, 2)), 10, "both endpoints to be awaiting")
    os.kill(mesh.pids()[2], signal.SIGKILL)
    wait_until(lambda: mesh.states()[2] == "dead", 5, "the controller to hear of the death", interval=0.005)
    mesh.interrupt()
    try:
        fut.get(timeout=5)
    except vr.MeshError as exc:
        err = exc
    assert err.failures[2].kind == "died" and err.partial == {0: 0}, err
    assert err.failures[1].kind == "interrupted" and "not waited for" not in err.failures[1].summary, err
    t0 = time.monotonic()
    assert sleepers.select([0, 1]).ping.call().get(timeout=20).values() == ["pong", "pong"]
    assert time.monotonic() - t0 < 3  # not behind a 30 s nap
