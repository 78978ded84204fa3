"""`hand_iopub_over` (viceroy/kernel/iopub.py) on a real ipykernel IOPub thread and XPUB socket,
as the kernel has them: a message sent while nothing waits goes out on the sender's thread
without waking the IOPub thread; what is handed over while the thread's loop is busy goes out in
that turn, in order, without waking it again; each thread's messages keep their order when
they go some queued and some inline, from many threads at once; a subscriber that joins while
another thread sends still gets its welcome; a failing item is reported and the rest still go;
a stopped thread runs items at once; an IOPub thread without the parts relied on (a future
ipykernel's) is left as it is."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import zmq
from ipykernel.iostream import IOPubThread
from jupyter_client.session import Session

from viceroy.kernel.iopub import hand_iopub_over

pytestmark = pytest.mark.timeout(60)


class Counted:
    """An IOPub thread whose wake-ups by this (the test's main) thread are counted: callbacks
    added to its loop, and messages on ipykernel's own wake-up pipe."""

    def __init__(self, thread: IOPubThread) -> None:
        self.thread = thread
        self.wakeups = 0
        add_callback = thread.io_loop.add_callback
        pipe = thread._event_pipe  # this thread's

        def counting(*args, **kwargs):
            self.wakeups += 1
            return add_callback(*args, **kwargs)

        class CountingPipe:
            def send(_, *args, **kwargs):
                self.wakeups += 1
                return pipe.send(*args, **kwargs)

        thread.io_loop.add_callback = counting
        thread._local.event_pipe = CountingPipe()

    def run_there(self, f) -> None:
        """Run `f` on the IOPub thread and wait for it."""
        done = threading.Event()

        def call() -> None:
            f()
            done.set()

        self.thread.schedule(call)
        assert done.wait(10), "the IOPub thread never ran what it was handed"

    def stop(self) -> None:
        if self.thread.thread.is_alive():  # end ipykernel's housekeeping task while its loop runs
            self.run_there(lambda: self.thread._event_pipe_gc_task.cancel())
            self.run_there(lambda: None)
        self.thread.stop()

    def held(self) -> tuple[threading.Event, threading.Event]:
        """Keep the thread busy until the returned `release` is set (`busy` once it is)."""
        busy, release = threading.Event(), threading.Event()

        def hold() -> None:
            busy.set()
            release.wait(10)

        self.thread.schedule(hold)
        assert busy.wait(10)
        return busy, release


@pytest.fixture
def iopub() -> Iterator[tuple[Counted, zmq.Socket]]:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)  # as ipykernel's kernel app makes it
    pub.setsockopt(zmq.SNDHWM, 0)  # the bursts below must all arrive
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    thread = IOPubThread(pub, session=Session(key=b""))
    thread.start()
    counted = Counted(thread)
    hand_iopub_over(thread)
    counted.wakeups = 0
    try:
        yield counted, sub
    finally:
        counted.stop()
        thread.close()
        sub.close(linger=0)
        ctx.term()


def _subscribed(counted: Counted, sub: zmq.Socket) -> None:
    """Wait until a message sent on the PUB socket reaches `sub` (a SUB joins late)."""
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    for _ in range(200):
        counted.thread.send_multipart([b"hello"])
        if poller.poll(50):
            while sub.poll(100):
                sub.recv_multipart()
            return
    raise AssertionError("the SUB socket never received anything")


def test_a_burst_goes_out_in_order_without_a_wakeup_each(iopub):
    counted, sub = iopub
    _subscribed(counted, sub)
    _, release = counted.held()
    before = counted.wakeups
    for i in range(50):
        counted.thread.send_multipart([b"msg", str(i).encode()])
    # The loop's turn that runs `hold` is still going: it sends these too, no new wake-up.
    assert counted.wakeups - before == 0
    release.set()
    got = [sub.recv_multipart()[1] for _ in range(50)]
    assert got == [str(i).encode() for i in range(50)]


def test_items_from_several_threads_all_run_each_threads_in_order(iopub):
    counted, _ = iopub
    ran: list[tuple[int, int]] = []

    def hand_over(t: int) -> None:
        for i in range(300):
            counted.thread.schedule(lambda t=t, i=i: ran.append((t, i)))

    threads = [threading.Thread(target=hand_over, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    counted.run_there(lambda: None)  # after everything handed over before it
    assert len(ran) == 1200
    for t in range(4):
        assert [i for tt, i in ran if tt == t] == list(range(300))


def test_a_failing_item_is_reported_and_the_rest_still_run(iopub, capfd):
    counted, _ = iopub
    ran: list[int] = []

    def fail() -> None:
        raise RuntimeError("socket trouble 7421")

    _, release = counted.held()
    counted.thread.schedule(lambda: ran.append(1))
    counted.thread.schedule(fail)
    counted.thread.schedule(lambda: ran.append(2))
    release.set()
    counted.run_there(lambda: ran.append(3))
    assert ran == [1, 2, 3]
    counted.run_there(lambda: ran.append(4))  # later hand-offs still wake the thread
    assert ran == [1, 2, 3, 4]
    assert "socket trouble 7421" in capfd.readouterr().err


def test_once_the_thread_stopped_items_run_at_once_on_the_caller(iopub):
    counted, _ = iopub
    counted.stop()
    ran: list[str] = []
    counted.thread.schedule(lambda: ran.append(threading.current_thread().name))
    assert ran == [threading.current_thread().name]


def _receive(sub: zmq.Socket, n: int) -> list[list[bytes]]:
    got = []
    for _ in range(n):
        assert sub.poll(10_000), f"{len(got)} of {n} messages arrived"
        got.append(sub.recv_multipart())
    return got


def test_a_message_sent_while_nothing_waits_goes_out_on_the_senders_thread(iopub):
    counted, sub = iopub
    _subscribed(counted, sub)
    senders: list[str] = []
    really_send = counted.thread._really_send

    def noting(*args, **kwargs):
        senders.append(threading.current_thread().name)
        return really_send(*args, **kwargs)

    counted.thread._really_send = noting
    before = counted.wakeups
    for i in range(20):
        counted.thread.send_multipart([b"inline", str(i).encode()])
    assert counted.wakeups == before  # the IOPub thread was never woken for them
    assert senders == [threading.current_thread().name] * 20
    assert [m[1] for m in _receive(sub, 20)] == [str(i).encode() for i in range(20)]


def test_messages_queued_behind_a_busy_thread_go_before_later_ones_sent_inline(iopub):
    counted, sub = iopub
    _subscribed(counted, sub)
    _, release = counted.held()
    for i in range(50):  # the thread is busy: these wait in its queue
        counted.thread.send_multipart([b"m", str(i).encode()])
    release.set()
    for i in range(50, 300):  # some still queued, then inline once the queue is empty
        counted.thread.send_multipart([b"m", str(i).encode()])
    assert [m[1] for m in _receive(sub, 300)] == [str(i).encode() for i in range(300)]


def test_many_threads_sending_at_once_lose_nothing_and_keep_each_threads_order(iopub):
    counted, sub = iopub
    _subscribed(counted, sub)
    flushes = []

    def send(t: int) -> None:
        for i in range(500):
            counted.thread.send_multipart([b"t", f"{t}:{i}".encode()])
            if i % 50 == 0:  # other work for the IOPub thread in between, as streams' flushes
                counted.thread.schedule(lambda: flushes.append(1))

    threads = [threading.Thread(target=send, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    got = [m[1].decode().split(":") for m in _receive(sub, 2000)]
    for t in range(4):
        assert [int(i) for tt, i in got if tt == str(t)] == list(range(500))
    counted.run_there(lambda: None)
    assert len(flushes) == 40


def test_a_subscriber_joining_while_another_thread_sends_gets_its_welcome(iopub):
    counted, sub = iopub
    _subscribed(counted, sub)
    stop = threading.Event()

    def keep_sending() -> None:
        while not stop.is_set():
            counted.thread.send_multipart([b"busy"])

    sender = threading.Thread(target=keep_sending)
    sender.start()
    late = sub.context.socket(zmq.SUB)
    try:
        for n in range(10):  # each a topic of its own: XPUB passes on a topic's first subscriber
            topic = f"late-{n}".encode()
            late.setsockopt(zmq.SUBSCRIBE, topic)
            if n == 0:
                late.connect(sub.getsockopt(zmq.LAST_ENDPOINT).decode())
            assert late.poll(10_000), f"no welcome for subscriber {n} within 10 s"
            frames = late.recv_multipart()
            assert frames[0] == topic and b"iopub_welcome" in b"".join(frames)
    finally:
        stop.set()
        sender.join()
        late.close(linger=0)


def test_once_the_thread_stopped_messages_go_at_once_on_the_caller(iopub):
    counted, _ = iopub
    counted.stop()  # its loop closed the socket as it ended: ipykernel drops what comes later
    sent: list[tuple[str, list[bytes]]] = []
    counted.thread._really_send = lambda msg: sent.append((threading.current_thread().name, msg))
    counted.thread.send_multipart([b"after", b"stop"])
    assert sent == [(threading.current_thread().name, [b"after", b"stop"])]


def test_an_iopub_thread_without_the_parts_relied_on_is_left_as_it_is(capfd):
    class Unknown:  # what a future ipykernel's IOPub thread might look like
        def send_multipart(self, msg):
            return msg

    thread = Unknown()
    assert hand_iopub_over(thread) is False
    assert thread.send_multipart([b"x"]) == [b"x"]  # ipykernel's own, untouched
    assert "_events" in capfd.readouterr().err


def test_an_iopub_thread_whose_loop_does_not_run_is_left_as_it_is(monkeypatch, capfd):
    import viceroy.kernel.shared_socket as shared_socket

    monkeypatch.setattr(shared_socket, "SWAP_TIMEOUT_S", 0.2)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    thread = IOPubThread(pub, session=Session(key=b""))  # never started: its loop runs nothing
    try:
        send = thread.send_multipart
        assert hand_iopub_over(thread) is False
        assert thread.send_multipart == send  # ipykernel's own, untouched
        assert "did not take the stream's new handler in 0.2 s" in capfd.readouterr().err
    finally:
        thread.io_loop.close(all_fds=True)
        ctx.term()
