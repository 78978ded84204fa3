"""Pipelined broadcasts: coalesced on the way (see actors/oneway.py), yet every actor still
handles its messages in the order sent, interleaved with calls, slices, big arrays and
broadcasts that fail."""

from __future__ import annotations

import numpy as np
import pytest

import viceroy as vr
from tests.conftest import Owner, wait_until


class Recorder(vr.Actor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @vr.endpoint
    def note(self, i: int) -> None:
        if i < 0:
            raise ValueError(f"refused {i}")
        self.seen.append(i)

    @vr.endpoint
    def note_array(self, a: np.ndarray) -> None:
        self.seen.append(int(a[0]))

    @vr.endpoint
    def check(self, i: int) -> int:
        self.seen.append(i)
        return len(self.seen)

    @vr.endpoint
    def log(self) -> list[int]:
        return self.seen


def test_broadcasts_calls_slices_and_arrays_arrive_in_the_order_sent(start_mesh):
    mesh = start_mesh(gpus=2)
    owner = Owner()
    rec = mesh.spawn(Recorder, owner=owner)
    expected: dict[int, list[int]] = {0: [], 1: []}
    refused = 0
    for i in range(600):
        if i % 97 == 0:
            rec.note_array.broadcast(np.full(100_000, i))  # out-of-band buffers: sent at once
            targets = [0, 1]
        elif i % 50 == 0:
            assert rec.check.call(i).get().values() == [len(expected[0]) + 1, len(expected[1]) + 1]
            targets = [0, 1]
        elif i % 7 == 0:
            rec.slice(gpus=1).note.broadcast(i)
            targets = [1]
        elif i % 101 == 0:
            rec.note.broadcast(-i)  # fails on every actor: goes to the owner, the rest goes on
            refused += 1
            targets = []
        else:
            rec.note.broadcast(i)
            targets = [0, 1]
        for r in targets:
            expected[r].append(i)
    assert rec.log.call().get().values() == [expected[0], expected[1]]
    assert refused == 5
    wait_until(lambda: len(owner.failures) == 2 * refused, 10, "the failed broadcasts to reach the owner")
    assert all(f.kind == "error" and "ValueError: refused" in f.summary for f in owner.failures)


class Forwarder(vr.Actor):
    def __init__(self, target: vr.ActorMesh) -> None:
        self.target = target

    @vr.endpoint
    def forward(self, n: int) -> list[int]:
        for i in range(n):
            self.target.note.broadcast(i)
        return self.target.log.call().get(timeout=10).values()[0]


def test_broadcasts_from_a_rank_stay_ahead_of_its_later_calls(start_mesh):
    mesh = start_mesh(gpus=2)
    rec = mesh.slice(gpus=1).spawn(Recorder)
    fwd = mesh.slice(gpus=0).spawn(Forwarder, rec)
    assert fwd.forward.call_one(300).get(timeout=30) == list(range(300))


class Saver(Recorder):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def __cleanup__(self) -> None:
        with open(self.path, "w") as f:
            f.write(",".join(map(str, self.seen)))


def test_stop_comes_after_the_queued_broadcasts_and_later_ones_are_refused(start_mesh, tmp_path):
    mesh = start_mesh(gpus=1)
    saver = mesh.spawn(Saver, str(tmp_path / "seen"))
    for i in range(300):
        saver.note.broadcast(i)
    saver.stop()  # flushes what is queued first; the actor handles all of it, then stops
    assert (tmp_path / "seen").read_text() == ",".join(map(str, range(300)))
    with pytest.raises(RuntimeError, match="was stopped"):
        saver.note.broadcast(1)
