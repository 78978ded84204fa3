"""Collectives in actor endpoints are watched as those of `mesh.run` are: a peer actor that
raises before the collective, skips it, dies, passes a different tensor, or is interrupted
releases the actors waiting in it, with an error naming the rank, and the actors' next
collective gives the right answer. Real processes, real kills."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

import viceroy as vr
from tests.conftest import Owner, fails_within, wait_running, wait_until
from viceroy.runtime import outcomes

ANSWER = [10.0, 10.0]  # the sum over 4 ranks of (rank + 1)


class Reducer(vr.Actor):
    @vr.endpoint
    def reduce(self, fail_on: int = -1, skip_on: int = -1, nap_on: int = -1) -> list[float]:
        import torch

        rank = vr.context().rank
        if rank == fail_on:
            raise ValueError(f"rank {rank} gives up")
        if rank == nap_on:
            time.sleep(60)
        t = torch.ones(2) * (rank + 1)
        if rank != skip_on:
            vr.all_reduce(t)
        return t.tolist()

    @vr.endpoint
    async def reduce_async(self, fail_on: int = -1) -> list[float]:
        import torch

        rank = vr.context().rank
        await asyncio.sleep(0)
        if rank == fail_on:
            raise ValueError(f"rank {rank} gives up")
        t = torch.ones(2) * (rank + 1)
        vr.all_reduce(t)
        return t.tolist()

    @vr.endpoint
    async def wait_or_reduce(self, waiter: int) -> list[float]:
        import torch

        rank = vr.context().rank
        if rank == waiter:  # cancellable: an interrupt ends it
            await asyncio.sleep(60)
        t = torch.ones(2) * (rank + 1)
        vr.all_reduce(t)
        return t.tolist()

    @vr.endpoint
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)

    @vr.endpoint
    def fails(self) -> None:
        raise ValueError(f"rank {vr.context().rank} fails")

    @vr.endpoint
    def mismatched(self) -> list[float]:
        import torch

        t = torch.ones(1 + vr.context().rank)
        vr.all_reduce(t)
        return t.tolist()


@pytest.fixture
def mesh(torch_mesh) -> vr.Mesh:
    return torch_mesh(gpus=4)


@pytest.fixture
def reducers(mesh) -> vr.ActorMesh:
    actors = mesh.spawn(Reducer)
    assert actors.reduce.call().get(timeout=30).values() == [ANSWER] * 4  # the group exists: the others really wait in it
    return actors


def _failure(fut: vr.Future, within: float) -> tuple[float, vr.MeshError]:
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=60)
    return time.monotonic() - t0, info.value


@pytest.mark.parametrize("endpoint", ["reduce", "reduce_async"])
def test_an_actor_raising_before_a_collective_releases_the_others_naming_it(reducers, endpoint):
    took, err = _failure(getattr(reducers, endpoint).call(fail_on=2), 5)
    assert took < 5, err
    assert "ValueError: rank 2 gives up" in err.failures[2].summary
    for r in (0, 1, 3):
        assert err.failures[r].summary.startswith("viceroy.CollectiveError: all_reduce('sum') over"), err.failures[r]
        assert "rank 2 finished the call without joining this collective" in err.failures[r].summary, err.failures[r]
    assert reducers.reduce.call().get(timeout=30).values() == [ANSWER] * 4


def test_an_actor_skipping_a_collective_releases_the_others_naming_it(reducers):
    took, err = _failure(reducers.reduce.call(skip_on=1), 5)
    assert took < 5, err
    assert set(err.failures) == {0, 2, 3}, err
    assert "rank 1 finished the call without joining this collective" in str(err), err
    assert reducers.reduce.call().get(timeout=30).values() == [ANSWER] * 4


def test_an_actor_skipping_a_collective_with_a_call_queued_behind_fails_both_instead_of_crossing(
        reducers, monkeypatch):
    # Rank 1's actor skipped the all_reduce of its first call and went on to the second's,
    # which met the others' of the first: both calls "succeeded" with each other's data, and
    # the others' second all_reduce waited for a partner that had gone. The word that rank 1
    # finished is held back here so that the two really meet, as they do when rank 1 is quick.
    monkeypatch.setattr(outcomes, "PEERS_DONE_AFTER_S", 600.0)
    first, second = reducers.reduce.call(skip_on=1), reducers.reduce.call()
    err = _failure(first, 30)[1]
    assert set(err.failures) == {0, 2, 3} and err.partial == {1: [2.0, 2.0]}, err
    for r in (0, 2, 3):
        assert ("it started 1 collective over ranks 0-3 in this call, rank 1 only 0: its 1st met collectives "
                "from outside this call") in err.failures[r].summary, err.failures[r]
    err = _failure(second, 30)[1]
    assert not err.partial, err  # rank 1's share of the first call's sum is not passed off as this one's
    assert "may have met those of" in err.failures[1].summary, err.failures[1]
    # The others, left waiting for rank 1 in the second call's all_reduce, are released: each
    # by its cancel ("interrupted"), or, where a peer's cancel gave the group up before its own
    # cancel came (a slow hour of CI saw it once), by the group's connections closing.
    released = {r for r, f in err.failures.items() if f.kind == "interrupted" or f.exc_type == "CollectiveError"}
    assert released == {0, 1, 2, 3} and any(err.failures[r].kind == "interrupted" for r in (0, 2, 3)), err
    assert reducers.reduce.call().get(timeout=30).values() == [ANSWER] * 4


def test_an_actor_whose_rank_dies_releases_the_others_at_once(mesh, reducers):
    fut = reducers.reduce.call(nap_on=3)
    wait_running(mesh.select([3]), "time.sleep")
    wait_running(mesh.select([0, 1, 2]), "vr.all_reduce")
    err = fails_within(fut, lambda: os.kill(mesh.pids()[3], signal.SIGKILL), 5)
    assert set(err.failures) == {0, 1, 2, 3} and err.failures[3].kind == "died", err
    # Told by the controller ("rank 3 died, while the others waited in it"), or by gloo first
    # ("lost its connection to rank 3"): either way released, naming it.
    for r in (0, 1, 2):
        assert "rank 3" in err.failures[r].summary, err


def test_interrupting_the_mesh_releases_actors_waiting_in_a_collective(mesh, reducers):
    fut = reducers.wait_or_reduce.call(waiter=0)
    wait_running(mesh.select([1, 2, 3]), "vr.all_reduce")
    t0 = time.monotonic()
    mesh.interrupt()
    assert time.monotonic() - t0 < 1.5
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=5)
    # Each is interrupted, or released first by a peer's giving the collective up as it was.
    assert info.value.failures[0].kind == "interrupted", info.value
    assert "interrupted" in str(info.value) and set(info.value.failures) == {0, 1, 2, 3}, info.value
    assert reducers.reduce.call().get(timeout=30).values() == [ANSWER] * 4


def test_actors_passing_tensors_of_different_shapes_fail_naming_each_ranks(reducers):
    took, err = _failure(reducers.mismatched.call(), 15)
    assert took < 15, err
    assert "passed different tensors or operations" in str(err), err
    assert "rank 1: all_reduce('sum') float32[2]" in str(err), err
    assert reducers.reduce.call().get(timeout=30).values() == [ANSWER] * 4


class ReducingInInit(vr.Actor):
    def __init__(self, fail_on: int) -> None:
        import torch

        if vr.context().rank == fail_on:
            raise ValueError("gives up before the collective")
        t = torch.ones(1)
        vr.all_reduce(t)
        self.total = t.item()

    @vr.endpoint
    def get(self) -> float:
        return self.total


def test_a_constructor_raising_before_a_collective_releases_the_others_naming_it(torch_mesh):
    # The constructor ran outside any watched call: the other ranks' constructors waited in the
    # collective for rank 1 until its timeout (600 s), and spawn with them.
    mesh = torch_mesh(gpus=3)
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        mesh.spawn(ReducingInInit, 1)
    msg = str(info.value)
    assert time.monotonic() - t0 < 15, msg
    assert "rank 1: ValueError: gives up before the collective" in msg, msg
    assert "rank 1 finished the call without joining this collective" in msg, msg
    assert mesh.spawn(ReducingInInit, -1).get.call().get(timeout=30).values() == [3.0] * 3


def test_restarting_an_actor_whose_constructor_runs_a_collective_fails_at_once_saying_why(torch_mesh):
    # The respawned constructor waited in the collective for actors that do not run it again,
    # until the collective's timeout (600 s): restart() hung meanwhile.
    mesh = torch_mesh(gpus=3)
    actors = mesh.spawn(ReducingInInit, -1)
    os.kill(mesh.pids()[1], signal.SIGKILL)
    wait_until(lambda: 1 in actors.failures, 10, "rank 1's actor to be marked failed")
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        actors.restart(timeout=30)
    msg = str(info.value)
    assert time.monotonic() - t0 < 10, msg
    assert "ranks 0,2 of the group are not being restarted" in msg, msg
    assert "stop the actor mesh and spawn it again" in msg, msg
    actors.stop()
    assert mesh.spawn(ReducingInInit, -1).get.call().get(timeout=30).values() == [3.0] * 3


class Pair(vr.Actor):
    @vr.endpoint
    def reduce_over(self, dims: str | None = None) -> list[float]:
        import torch

        t = torch.ones(2) * (vr.context().rank + 1)
        vr.all_reduce(t, dims=dims)
        return t.tolist()

    @vr.endpoint
    def send_to(self, dst: int) -> None:
        import torch

        vr.send(torch.ones(2) * (vr.context().rank + 1), dst)

    @vr.endpoint
    def recv_from(self, src: int) -> list[float]:
        import torch

        return vr.recv(torch.zeros(2), src).tolist()


def test_an_endpoint_called_on_a_slice_refuses_a_collective_over_actors_not_called_at_once(reducers):
    # The called actors waited in the collective for actors the call never reached, until its
    # timeout (600 s), then failed with a backend timeout naming nobody.
    took, err = _failure(reducers.slice(gpus=slice(0, 2)).reduce.call(), 5)
    assert took < 5, err
    assert set(err.failures) == {0, 1}, err
    for r in (0, 1):
        summary = err.failures[r].summary
        assert summary.startswith("viceroy.CollectiveError: all_reduce('sum') over the whole mesh (ranks 0-3): "
                                  "ranks 2-3 of the group are not in this call"), summary
        assert "Call the endpoint on the whole actor mesh, or run the collective over a group of the called actors" \
            in summary, summary
    took, err = _failure(reducers.reduce.choose(), 5)  # one actor: the others are not in the call either
    assert took < 5 and "are not in this call" in str(err), err
    assert reducers.reduce.call().get(timeout=30).values() == [ANSWER] * 4


def test_an_endpoint_called_on_a_slice_runs_collectives_among_the_called_actors_and_point_to_point(mesh):
    pairs = mesh.split(gpus=("dp", "tp"), tp=2).spawn(Pair)
    # A group within the call: tp at dp=1 is ranks 2-3, both called.
    assert pairs.slice(dp=1).reduce_over.call(dims="tp").get(timeout=30).values() == [[7.0, 7.0]] * 2
    # Point to point with an actor outside the call, in a call of its own: not refused.
    sent = pairs.slice(dp=0, tp=0).send_to.call_one(3)
    assert pairs.slice(dp=1, tp=1).recv_from.call_one(0).get(timeout=30) == [1.0, 1.0]
    assert sent.get(timeout=30) is None


@pytest.mark.parametrize(("kwargs", "culprit", "what"), [
    ({"fail_on": 2}, 2, "ValueError: rank 2 gives up"),
    ({"skip_on": 1}, 1, None),
])
def test_a_broadcast_whose_actor_raises_or_skips_before_a_collective_releases_the_others(mesh, kwargs, culprit, what):
    # Nobody watched a broadcast's collectives: the others waited in theirs until its timeout
    # (600 s), and only then did their failures reach the owner.
    owner = Owner()
    actors = mesh.spawn(Reducer, owner=owner)
    assert actors.reduce.call().get(timeout=30).values() == [ANSWER] * 4  # the group exists
    t0 = time.monotonic()
    actors.reduce.broadcast(**kwargs)
    others = {0, 1, 2, 3} - {culprit}
    wait_until(lambda: others <= owner.by_rank().keys(), 5, "the others' failures to reach the owner")
    assert time.monotonic() - t0 < 5
    failures = owner.by_rank()
    for r in others:
        assert f"all_reduce('sum') over the whole mesh (ranks 0-3): rank {culprit} finished the call without " \
               "joining this collective" in failures[r], failures
    if what is not None:
        wait_until(lambda: culprit in owner.by_rank(), 5, "the culprit's own failure")
        assert what in owner.by_rank()[culprit]
    else:
        assert culprit not in failures
    assert actors.reduce.call().get(timeout=30).values() == [ANSWER] * 4


@pytest.mark.parametrize(("ask_every_s", "others_late"), [(None, False), (600.0, False), (600.0, True)],
                         ids=["asking", "told", "told-before-the-others-start-it"])
def test_a_call_queued_behind_a_broadcast_that_raised_on_one_rank_does_not_meet_its_collective(
        mesh, ask_every_s, others_late):
    # Rank 2's broadcast raised before its all_reduce, and rank 2 went straight on to the call
    # queued behind it: that call's all_reduce met the others' all_reduce of the broadcast (the
    # same operation on the same communicator), each side returned the other's data, and the
    # others then waited in the call's all_reduce for rank 2, which had finished the call.
    # "told": the ranks' own asks (every second) pushed past the test, the word goes with rank
    # 2's question (it finished the broadcast) and with the answers the others give as they end
    # it, even where the question comes before they started it.
    if ask_every_s is not None:
        mesh.run(f"import viceroy.runtime.call_peers as _cp\n_cp.ASK_EVERY_S = {ask_every_s}")
    owner = Owner()
    actors = mesh.spawn(Reducer, owner=owner)
    assert actors.reduce.call().get(timeout=30).values() == [ANSWER] * 4  # the group exists
    if others_late:
        napping = actors.select([0, 1, 3]).nap.call(1.0)  # the broadcast queues behind it there
    actors.reduce.broadcast(fail_on=2)
    assert actors.reduce.call().get(timeout=30).values() == [ANSWER] * 4
    if others_late:
        assert napping.get(timeout=30).values() == [None] * 3
    wait_until(lambda: {0, 1, 2, 3} <= owner.by_rank().keys(), 10, "every rank's failure of the broadcast")
    failures = owner.by_rank()
    assert "ValueError: rank 2 gives up" in failures[2]
    for r in (0, 1, 3):
        assert "rank 2 finished the call without joining this collective" in failures[r], failures
    assert actors.reduce.call().get(timeout=30).values() == [ANSWER] * 4


def test_collectives_after_broadcasts_that_raised_everywhere_go_on_at_once(mesh):
    # Each rank waits, before its next collective, for the others to have finished the
    # broadcasts that raised on it: here they all have, and say so at once. A run of them is
    # waited on as one (the last: an actor takes its messages in order).
    owner = Owner()
    actors = mesh.spawn(Reducer, owner=owner)
    assert actors.reduce.call().get(timeout=30).values() == [ANSWER] * 4
    for _ in range(50):
        actors.fails.broadcast()
    t0 = time.monotonic()
    assert actors.reduce.call().get(timeout=30).values() == [ANSWER] * 4
    assert time.monotonic() - t0 < 5  # not the 30 s a rank waits at most for its peers' word
    wait_until(lambda: len(owner.failures) >= 50, 10, "the broadcasts' failures")
    assert all("ValueError" in f.summary for f in owner.failures)


class Gated(vr.Actor):
    @vr.endpoint
    def hold(self, gate: str) -> None:
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)

    @vr.endpoint
    async def reduce_after(self, gate: str | None = None) -> list[float]:
        import torch

        deadline = time.monotonic() + 60
        while gate and vr.context().rank == 0 and not os.path.exists(gate) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        t = torch.ones(2)
        vr.all_reduce(t)
        return t.tolist()


def test_a_broadcast_waiting_in_a_collective_for_a_stopped_actor_fails_saying_it_was_stopped(torch_mesh, tmp_path):
    # Rank 1's actor was stopped before it ran the broadcast (a stop cancels the async endpoints
    # queued before it): asked who finished it, nobody answered for rank 1 (its actor was gone
    # there), and rank 0 waited in the all_reduce for good.
    mesh = torch_mesh(gpus=2)
    owner = Owner()
    actors = mesh.spawn(Gated, owner=owner)
    assert actors.reduce_after.call().get(timeout=30).values() == [[2.0, 2.0]] * 2  # the group exists
    held, go = tmp_path / "held", tmp_path / "go"
    busy = actors.select([1]).hold.call_one(str(held))  # the broadcast queues behind it on rank 1
    actors.reduce_after.broadcast(str(go))  # rank 0 joins the all_reduce once `go` exists
    actors.select([1]).stop(timeout=0.1)  # rank 1 is busy: it stops once `hold` returns
    held.touch()
    assert busy.get(timeout=10) is None
    actors.select([1]).stop()  # waits for the stop sent before: rank 1's actor is gone
    assert "1 stopped" in repr(actors), repr(actors)
    t0 = time.monotonic()
    go.touch()
    wait_until(lambda: 0 in owner.by_rank(), 10, "rank 0's failure to reach the owner")
    assert time.monotonic() - t0 < 5
    failure = owner.by_rank()[0]
    assert "all_reduce('sum') over the whole mesh (ranks 0-1): rank 1's actor was stopped, while the others " \
           "waited in it." in failure, failure
    assert "died" not in failure and "without joining" not in failure, failure
    assert 1 not in owner.by_rank()  # its broadcast was cancelled by the stop: no failure of its own


class Learner(vr.Actor):
    @vr.endpoint
    def train(self) -> list[float]:
        import torch

        self.w = torch.ones(2)
        vr.all_reduce(self.w)  # over its own actor mesh: ranks 0-1
        return self.w.tolist()

    @vr.endpoint
    def send_weights(self, dst: int) -> None:
        vr.send(self.w * (vr.context().rank + 1), dst)


class Generator(vr.Actor):
    @vr.endpoint
    def receive_weights(self, src: int) -> list[float]:
        import torch

        self.w = vr.recv(torch.zeros(2), src)
        return self.w.tolist()


def test_actors_of_two_actor_meshes_on_separate_slices_exchange_weights_point_to_point(mesh):
    # The RL loop's weight sync: send/recv refused a peer outside the actor's own slice
    # ("rank 2 is not in this call ... would wait forever"), though another actor mesh runs there.
    learners = mesh.slice(gpus=slice(0, 2)).spawn(Learner)
    generators = mesh.slice(gpus=slice(2, 4)).spawn(Generator)
    assert learners.train.call().get(timeout=30).values() == [[2.0, 2.0]] * 2
    for src, dst in ((0, 2), (1, 3)):
        sent = learners.select([src]).send_weights.call_one(dst)
        got = generators.select([dst]).receive_weights.call_one(src).get(timeout=30)
        assert got == [2.0 * (src + 1)] * 2
        assert sent.get(timeout=30) is None
