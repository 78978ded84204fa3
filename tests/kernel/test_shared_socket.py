"""`SharedSocket` (viceroy/kernel/shared_socket.py) on a real ROUTER socket that a ZMQStream
reads on its own thread's loop, as ipykernel's shell-channel thread reads the shell socket:
other threads' sends go out directly, and a request that arrives while they send is still read
at once (a send that took it in hands it to the reading thread); sends from several threads and
the stream's own at once lose nothing."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from tornado.ioloop import IOLoop
from zmq.eventloop.zmqstream import ZMQStream

from tests.conftest import wait_until
from viceroy.kernel.shared_socket import SharedSocket

pytestmark = pytest.mark.timeout(60)


class Served:
    """A ROUTER read by a ZMQStream on a thread of its own, and a DEALER talking to it."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.SNDHWM, 0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.RCVHWM, 0)
        self.dealer.setsockopt(zmq.IDENTITY, b"client")
        self.dealer.connect(f"tcp://127.0.0.1:{port}")
        self.got: list[list[bytes]] = []
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), name="reader")
        self.thread.start()
        assert ready.wait(10)
        self.shared = SharedSocket(self.router, self.loop, self.stream)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        self.loop = IOLoop.current()
        self.stream = ZMQStream(self.router, self.loop)
        self.stream.on_recv(self.got.append)
        ready.set()
        self.loop.start()
        self.loop.close()

    def on_loop(self, f: Any) -> None:
        done = threading.Event()
        self.loop.add_callback(lambda: (f(), done.set()))
        assert done.wait(10)

    def received(self, n: int, what: str) -> None:
        """Wait (5 s at most) until the ROUTER has read `n` requests."""
        wait_until(lambda: len(self.got) >= n, 5, what, interval=0.001)

    def close(self) -> None:
        self.loop.add_callback(self.loop.stop)
        self.thread.join(10)
        self.stream.close(linger=0)
        self.dealer.close(linger=0)
        self.ctx.term()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    try:
        yield s
    finally:
        s.close()


def _handshake(served: Served) -> None:
    served.dealer.send(b"hello")
    served.received(1, "the ROUTER to read the first request")


def test_a_request_arriving_while_another_thread_sends_is_read_at_once(served):
    _handshake(served)
    stop = threading.Event()
    sent = 0

    def keep_replying() -> None:
        nonlocal sent
        while not stop.is_set():
            served.shared.send(lambda: served.router.send_multipart([b"client", b"reply"]))
            sent += 1

    sender = threading.Thread(target=keep_replying)
    sender.start()
    try:
        for i in range(50):
            served.dealer.send(str(i).encode())
            served.received(2 + i, f"request {i} to be read")
    finally:
        stop.set()
        sender.join()
    assert sent > 0
    assert [m[1] for m in served.got[1:]] == [str(i).encode() for i in range(50)]
    for _ in range(sent):  # and every reply reached the client
        assert served.dealer.poll(5000)
        assert served.dealer.recv() == b"reply"


def test_sends_from_several_threads_and_the_streams_own_all_arrive_in_each_ones_order(served):
    _handshake(served)

    def send_directly(t: int) -> None:
        for i in range(500):
            served.shared.send(lambda i=i: served.router.send_multipart([b"client", f"{t}:{i}".encode()]))

    def send_through_the_stream() -> None:  # the reading thread's own sends, as the stream queues them
        for i in range(500):
            with served.shared.lock:
                served.stream.send_multipart([b"client", f"s:{i}".encode()])

    threads = [threading.Thread(target=send_directly, args=(t,)) for t in range(3)]
    threads.append(threading.Thread(target=lambda: served.on_loop(send_through_the_stream)))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    got = []
    for _ in range(2000):
        assert served.dealer.poll(5000), f"{len(got)} of 2000 arrived"
        got.append(served.dealer.recv().decode().split(":"))
    for who in ("0", "1", "2", "s"):
        assert [int(i) for w, i in got if w == who] == list(range(500))


def test_an_interrupt_during_a_send_on_the_main_thread_never_cuts_a_message_in_two(served):
    """Ctrl-C lands on the main thread, which now sends messages itself: a KeyboardInterrupt
    between two frames of one message would leave half of it in the socket, and the next
    message's frames would be glued to it. It is held until the message is out."""
    _handshake(served)
    main = threading.get_ident()
    stop = threading.Event()

    def interrupt_often() -> None:
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.0002)

    frames = [b"client"] + [b"f%d" % i for i in range(12)]
    interrupts = sent = 0
    armed = False  # the handler raises only around the send (so the test's own loop is left alone)

    def interrupt(*_: Any) -> None:
        if armed:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    interrupter = threading.Thread(target=interrupt_often)
    interrupter.start()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                armed = True
                served.shared.send(lambda: served.router.send_multipart(frames))
                armed = False
                sent += 1
            except KeyboardInterrupt:
                armed = False
                interrupts += 1
    finally:
        armed = False
        stop.set()
        interrupter.join()
        signal.signal(signal.SIGINT, previous)
    assert interrupts > 0
    got = 0
    while served.dealer.poll(1000):
        assert served.dealer.recv_multipart() == frames[1:]
        got += 1
    assert got >= sent  # the ones interrupted after they went out arrived too, whole
