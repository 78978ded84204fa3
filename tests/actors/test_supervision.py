"""Supervision: dead ranks and failed broadcasts go to the owner's __supervise__, or to the
callers waiting, or are kept and reported once; never raised in an unrelated later call."""

from __future__ import annotations

import os
import signal
import time

import pytest

import viceroy as vr
from tests.conftest import Owner, wait_until
from viceroy.runtime.actors import supervision


class Worker(vr.Actor):
    def __init__(self, start: int) -> None:
        self.n = start

    @vr.endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @vr.endpoint
    def hang(self) -> None:
        time.sleep(60)

    @vr.endpoint
    def fail(self) -> None:
        raise KeyError("lost batch")


class Boss(vr.Actor):
    def __init__(self, handles: bool) -> None:
        self.handles = handles
        self.seen: list[tuple[str, tuple[int, ...], str]] = []

    def __supervise__(self, failure: vr.ActorFailure) -> bool:
        self.seen.append((failure.kind, failure.ranks, failure.summary))
        return self.handles

    @vr.endpoint
    def failures_seen(self) -> list[tuple[str, tuple[int, ...], str]]:
        return self.seen


def kill(mesh: vr.Mesh, rank: int) -> None:
    os.kill(mesh.pids()[rank], signal.SIGKILL)  # a rank process this test started


def test_a_dead_rank_fails_pending_calls_and_restart_respawns_only_its_actor(start_mesh, capsys):
    mesh = start_mesh(gpus=3)
    workers = mesh.spawn(Worker, 10)
    assert workers.incr.call().get().values() == [11, 11, 11]
    pending = workers.slice(gpus=1).hang.call_one()
    kill(mesh, 1)
    with pytest.raises(vr.MeshError, match=r"rank 1: died \(SIGKILL\)") as died:
        pending.get(timeout=10)
    assert "restart() on the actor mesh brings back the dead ranks and respawns their actors" in str(died.value)
    wait_until(lambda: workers.failures, 5, "the actor mesh to notice")
    assert list(workers.failures) == [1]
    assert "not handled" not in capsys.readouterr().err  # the caller heard of it already
    with pytest.raises(vr.MeshError, match=r"rank 1: its actor is gone: its rank died \(SIGKILL\)") as info:
        workers.incr.call().get(timeout=5)
    # The call was for three actors; one is gone, and nothing went to the other two either.
    assert str(info.value).startswith("Worker.incr failed on 1 of 3 ranks\n")
    assert "Nothing was sent to any of its 3 actors; the others answer through a slice" in str(info.value)
    assert workers.slice(gpus=slice(0, 3, 2)).incr.call().get().values() == [12, 12]
    assert workers.incr.choose().get(timeout=5) in (13, 13)  # only live actors are chosen
    workers.restart()
    assert workers.failures == {}
    assert workers.incr.call().get(timeout=10).values()[1] == 11  # fresh actor on rank 1
    assert workers.slice(gpus=0).incr.call_one().get() >= 13  # the others kept their state


def test_an_owner_actor_supervises_and_handles_a_rank_death(start_mesh, capsys):
    mesh = start_mesh(gpus=3)
    boss = mesh.slice(gpus=0).spawn(Boss, True)
    workers = mesh.slice(gpus=slice(1, 3)).spawn(Worker, 0, owner=boss)
    kill(mesh, 2)
    seen = wait_until(lambda: boss.failures_seen.call_one().get(timeout=5), 10, "__supervise__ to run")
    assert seen == [("died", (2,), "died (SIGKILL)")]
    assert "unhandled" not in capsys.readouterr().err
    assert mesh.slice(gpus=slice(0, 2)).run("1").values() == [1, 1]  # unrelated later calls: no error
    assert workers.slice(gpus=0).incr.call_one().get() == 1


def test_unhandled_failures_are_kept_and_printed_once_never_raised_later(start_mesh, capsys):
    mesh = start_mesh(gpus=2)
    boss = mesh.slice(gpus=0).spawn(Boss, False)  # sees the failure, does not handle it
    workers = mesh.slice(gpus=1).spawn(Worker, 0, owner=boss)
    kill(mesh, 1)
    wait_until(lambda: "unhandled actor failure" in capsys.readouterr().err, 10, "the failure report")
    assert workers.failures == {1: "its rank died (SIGKILL)"}
    assert [(f.kind, f.ranks) for f in workers.unhandled] == [("died", (1,))]
    assert boss.failures_seen.call_one().get() == [("died", (1,), "died (SIGKILL)")]
    assert mesh.slice(gpus=0).run("'fine'").values() == ["fine"]


def test_a_failed_broadcast_goes_to_the_owner(start_mesh):
    mesh = start_mesh(gpus=2)
    owner = Owner()
    workers = mesh.spawn(Worker, 0, owner=owner)
    workers.fail.broadcast()
    wait_until(lambda: len(owner.failures) == 2, 10, "both failures")
    assert {f.ranks for f in owner.failures} == {(0,), (1,)}
    assert all(f.kind == "error" and "KeyError: 'lost batch'" in f.summary for f in owner.failures)
    assert "Worker (gpus=2)" in str(owner.failures[0])
    assert workers.incr.call().get().values() == [1, 1]  # the actors live on


def test_restart_brings_back_a_rank_restarted_by_hand_too(start_mesh):
    mesh = start_mesh(gpus=2)
    workers = mesh.spawn(Worker, 5)
    kill(mesh, 0)
    wait_until(lambda: workers.failures, 5, "the actor mesh to notice")
    mesh.restart(failed_only=True)
    workers.restart()
    assert workers.incr.call().get(timeout=10).values() == [6, 6]


class Fragile(vr.Actor):
    def __init__(self, flag: str) -> None:
        if os.path.exists(flag):
            raise RuntimeError("cannot start again")

    @vr.endpoint
    def ok(self) -> bool:
        return True


def test_a_restart_that_fails_keeps_the_other_actors_and_says_why(start_mesh, tmp_path):
    flag = tmp_path / "broken"
    mesh = start_mesh(gpus=2)
    actors = mesh.spawn(Fragile, str(flag))
    kill(mesh, 1)
    wait_until(lambda: actors.failures, 5, "the actor mesh to notice")
    flag.write_text("")
    with pytest.raises(vr.MeshError, match="rank 1: RuntimeError: cannot start again"):
        actors.restart()
    assert actors.failures == {1: "spawning it failed: RuntimeError: cannot start again"}
    assert actors.slice(gpus=0).ok.call_one().get() is True
    flag.unlink()
    actors.restart()
    assert actors.ok.call().get().values() == [True, True]


def test_a_failed_broadcast_nobody_handles_is_kept_for_the_actor_mesh(start_mesh, capsys):
    mesh = start_mesh(gpus=2)
    workers = mesh.spawn(Worker, 0)
    workers.fail.broadcast()
    wait_until(lambda: len(workers.unhandled) == 2, 10, "both failures kept")
    assert all(f.kind == "error" and "KeyError: 'lost batch'" in f.summary for f in workers.unhandled)
    assert [f.ranks for f in workers.slice(gpus=1).unhandled] == [(1,)]
    assert workers.failures == {}  # the actors live on: nothing is gone


def test_a_broadcast_that_raises_everywhere_is_reported_in_one_line_with_its_ranks(start_mesh, capfd):
    mesh = start_mesh(gpus=3)
    workers = mesh.spawn(Worker, 0)
    workers.fail.broadcast()
    err = wait_until(lambda: "unhandled actor failure" in (e := capfd.readouterr().err) and e, 10, "the report")
    lines = [ln for ln in err.splitlines() if "unhandled actor failure" in ln]
    assert len(lines) == 1, err  # not one per rank
    assert "Worker (gpus=3): ranks 0-2: Worker.fail: KeyError: 'lost batch'" in lines[0]
    assert len(workers.unhandled) == 3  # each rank's failure is kept


def test_restarting_the_mesh_is_not_reported_as_actor_deaths(start_mesh, capfd):
    # A full mesh.restart() printed "unhandled actor failure: ... died (SIGKILL)" once per rank.
    mesh = start_mesh(gpus=2)
    workers = mesh.spawn(Worker, 0)
    assert workers.incr.call().get().values() == [1, 1]
    mesh.restart()
    wait_until(lambda: len(workers.unhandled) == 2, 10, "both actors to be marked gone")
    assert {f.summary for f in workers.unhandled} == {"died (restarted)"}
    with pytest.raises(vr.MeshError, match="its actor is gone: its rank was restarted"):
        workers.incr.call().get()
    supervision.reports.flush()  # what would have been printed, printed now
    assert "unhandled actor failure" not in capfd.readouterr().err
    workers.restart()
    assert workers.incr.call().get().values() == [1, 1]


def test_two_actor_meshes_of_one_class_and_shape_are_reported_apart(start_mesh, capfd):
    # Their failures were merged into one line ("rank 0-1" of one "Worker (gpus=2)").
    mesh = start_mesh(gpus=2)
    first, second = mesh.spawn(Worker, 0), mesh.spawn(Worker, 0)
    first.slice(gpus=0).fail.broadcast()
    second.slice(gpus=1).fail.broadcast()
    wait_until(lambda: len(first.unhandled) == len(second.unhandled) == 1, 10, "both failures kept")
    supervision.reports.flush()
    lines = sorted(ln for ln in capfd.readouterr().err.splitlines() if "unhandled actor failure" in ln)
    assert len(lines) == 2, lines
    ids = {first._info.id: "rank 0", second._info.id: "rank 1"}
    for line, (mesh_id, rank) in zip(lines, sorted(ids.items()), strict=True):
        assert f"Worker (gpus=2) [{mesh_id}]: {rank}: Worker.fail: KeyError" in line, line


def test_restart_says_what_it_respawned_and_refuses_stopped_actors(start_mesh):
    # On an actor mesh partly stopped, restart() did nothing and said nothing.
    mesh = start_mesh(gpus=3)
    workers = mesh.spawn(Worker, 5)
    assert workers.restart() == []  # nothing had failed
    kill(mesh, 2)
    wait_until(lambda: workers.failures, 5, "the actor mesh to notice")
    workers.slice(gpus=0).stop()
    with pytest.raises(RuntimeError) as info:
        workers.restart()
    assert str(info.value) == (
        "restart() respawns actors that failed, but actor mesh Worker (gpus=3) was stopped on rank 0 (a stop is "
        "final), so nothing was restarted. Its failed actors (rank 2) restart through a slice or select of it "
        "without the stopped ones. For new actors: mesh.spawn(Worker, ...)")
    assert workers.failures == {2: "its rank died (SIGKILL)"}  # untouched
    assert workers.slice(gpus=slice(1, 3)).restart() == [2]
    assert workers.slice(gpus=slice(1, 3)).incr.call().get(timeout=10).values() == [6, 6]


def test_a_bad_restart_timeout_is_refused_before_the_dead_ranks_are_restarted(start_mesh, capsys):
    # The dead rank was restarted first, then restart() failed on the deadline's arithmetic.
    import numpy as np

    mesh = start_mesh(gpus=2)
    workers = mesh.spawn(Worker, 0, owner=Owner())
    kill(mesh, 1)
    wait_until(lambda: workers.failures, 5, "the actor mesh to notice")
    with pytest.raises(ValueError, match=r"timeout='x': give a positive, finite number of seconds"):
        workers.restart(timeout="x")
    assert mesh.states()[1] == "dead", "the refused restart restarted the rank"
    assert workers.restart(timeout=np.int64(60)) == [1]  # numpy's seconds are seconds
    assert workers.incr.call().get(timeout=10).values() == [1, 1]
