"""Local links (viceroy.runtime.links): the controller <-> rank work path on one host, over real
Unix sockets, with the controller's end served the way its IO thread serves it."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from tests.conftest import wait_until
from viceroy.runtime import links
from viceroy.runtime.links import BrokenLink, LinkServer, RankLink, Reader, encode

pytestmark = pytest.mark.timeout(60)


def _stream(messages: list[list[object]]) -> bytes:
    return b"".join(bytes(b) for m in messages for b in encode(m))


def test_a_stream_cut_anywhere_gives_back_the_same_messages():
    grid = np.arange(12, dtype=np.float32).reshape(3, 4)
    messages = [[b"head", b"", grid, memoryview(b"tail")], [b"x"], [b"" * 3, b"a" * 70000]]
    expected = [[bytes(memoryview(f).cast("B")) for f in m] for m in messages]
    stream = _stream(messages)
    for cut in (1, 7, 4096, len(stream)):
        reader, got = Reader(), []
        for i in range(0, len(stream), cut):
            got.extend(reader.feed(stream[i : i + cut]))
        assert [[bytes(f) for f in m] for m in got] == expected, cut
        got[0][2][:4] = b"\0\0\0\0"  # frames are writable, as arrays made from them must be
    assert np.frombuffer(got[0][2], np.float32).reshape(3, 4)[0].tolist() == [0, 1, 2, 3]


def test_bytes_that_are_not_messages_are_refused():
    head = links._HEAD.pack(16, 2) + (5).to_bytes(8, "little") + (9).to_bytes(8, "little")
    with pytest.raises(BrokenLink, match="do not add up"):
        Reader().feed(head + b"\0" * 16)
    with pytest.raises(BrokenLink, match="not one of ours"):
        Reader().feed(links._HEAD.pack(8, 3))  # too small for its frames' lengths
    with pytest.raises(BrokenLink, match="not one of ours"):
        Reader().feed(b"\xff" * 12)  # a size no message has: refused now, not waited for


class Controller:
    """A LinkServer served on a thread as the controller's IO thread serves it."""

    def __init__(self, path: str) -> None:
        self.links = LinkServer(path)
        self.poller = zmq.Poller()
        self.poller.register(self.links.fd, zmq.POLLIN)
        self.got: queue.Queue[tuple[list[bytes], links.Link]] = queue.Queue()
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped:
            self.links.watch(self.poller)
            ready = dict(self.poller.poll(10))
            for frames, link in self.links.service(ready, self.poller):
                self.got.put(([bytes(f) for f in frames], link))

    def next(self) -> tuple[list[bytes], links.Link]:
        return self.got.get(timeout=10)

    def close(self) -> None:
        self.stopped = True
        self.thread.join(5)
        self.links.close()


@pytest.fixture
def controller(tmp_path) -> Iterator[Controller]:
    c = Controller(str(tmp_path / "links"))
    yield c
    c.close()


def _hello(controller: Controller, rank: int) -> RankLink:
    link = RankLink(controller.links.path)
    link.send([f"hello {rank}".encode()])
    frames, server_end = controller.next()
    assert frames == [f"hello {rank}".encode()]
    controller.links.bind(rank, server_end)
    return link


def test_a_rank_that_is_not_reading_never_blocks_the_sender_and_gets_everything_in_order(controller):
    rank = _hello(controller, 3)
    blob = os.urandom(1 << 20)
    started = time.monotonic()
    for i in range(24):  # 24 MB: far more than the socket holds while the rank reads nothing
        controller.links.send(3, [f"call {i}".encode(), blob])
    assert time.monotonic() - started < 5  # (blocking would never return: nobody reads yet)
    for i in range(24):
        frames = rank.recv()
        assert frames is not None
        assert bytes(frames[0]) == f"call {i}".encode()
        assert bytes(frames[1]) == blob
    for i in range(100):  # and back, in order, each whole
        rank.send([b"out", str(i).encode()])
    assert [controller.next()[0][1] for _ in range(100)] == [str(i).encode() for i in range(100)]


def test_a_rank_just_starting_is_waited_for_and_one_that_never_comes_gets_nothing(controller):
    assert controller.links.send(7, [b"lost"]) is False  # nobody: given up after a moment
    started = time.monotonic()  # ranks of one call share one deadline: a past one waits no more
    assert controller.links.send(8, [b"lost"], deadline=started) is False
    assert time.monotonic() - started < links.CONNECT_WAIT_S / 2
    later = threading.Timer(0.2, lambda: box.append(_hello(controller, 5)))
    box: list[RankLink] = []
    later.start()
    controller.links.send(5, [b"first call"])  # waits for the rank's hello
    later.join()
    frames = box[0].recv()
    assert frames is not None and bytes(frames[0]) == b"first call"


def test_a_restarted_rank_takes_its_link_over_and_the_old_one_is_forgotten(controller):
    old = _hello(controller, 2)
    new = _hello(controller, 2)  # the restarted process says hello before the old one's EOF
    old.sock.close()
    controller.links.send(2, [b"to the new one"])
    frames = new.recv()
    assert frames is not None and bytes(frames[0]) == b"to the new one"
    # the old link's end of file did not unbind the new one
    wait_until(lambda: len(controller.links._links) == 1, 5, "the old link to be closed")
    controller.links.send(2, [b"still the new one"])
    frames = new.recv()
    assert frames is not None and bytes(frames[0]) == b"still the new one"


def test_a_rank_sees_the_end_when_the_controller_goes(controller):
    rank = _hello(controller, 0)
    controller.close()
    assert rank.recv() is None
    with pytest.raises(OSError):
        for _ in range(100):  # the first write may still land in the socket's buffer
            rank.send([b"x" * 65536])


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_ranks_wait_for_calls_in_batch_policy_and_run_them_in_the_users(start_mesh):
    """A call wakes its ranks without preempting the controller (see RankLink.recv); the code
    runs under SCHED_OTHER as usual, and a policy the user set stays theirs."""
    mesh = start_mesh(gpus=2)
    pids = mesh.pids()
    wait_until(lambda: all(os.sched_getscheduler(p) == os.SCHED_BATCH for p in pids.values()), 10,
               "idle ranks' main threads to be SCHED_BATCH")
    assert mesh.run("import os\nos.sched_getscheduler(0)").values() == [os.SCHED_OTHER] * 2
    mesh.run("os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))")
    assert mesh.run("os.sched_getscheduler(0)").values() == [os.SCHED_IDLE] * 2
    assert [os.sched_getscheduler(p) for p in pids.values()] == [os.SCHED_IDLE] * 2
