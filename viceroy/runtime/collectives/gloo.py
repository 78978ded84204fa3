"""gloo through torch.distributed, for CPU tensors (and numpy arrays, viewed as tensors).

Each group gets its own ``ProcessGroupGloo``, outside torch's registry of groups, so it never
clashes with the user's own ``init_process_group()``.
"""

from __future__ import annotations

import functools
import json
import queue
import threading
from datetime import timedelta
from typing import Any

from viceroy.runtime.collectives import sockets
from viceroy.runtime.collectives.backend import Backend, Communicator, Pending
from viceroy.runtime.collectives.store import address
from viceroy.runtime.collectives.waiting import interrupts_held

_TIMED_OUT = "Operation timed out!"


class _C10d:
    """torch.distributed's names, looked up once (the hot path is microseconds)."""

    def __init__(self) -> None:
        from torch.distributed import AllreduceOptions, ReduceOp

        self.AllreduceOptions = AllreduceOptions
        self.reduce_ops = {
            "sum": ReduceOp.SUM, "avg": ReduceOp.SUM, "product": ReduceOp.PRODUCT,
            "min": ReduceOp.MIN, "max": ReduceOp.MAX, "band": ReduceOp.BAND,
            "bor": ReduceOp.BOR, "bxor": ReduceOp.BXOR,
        }


_names: _C10d | None = None


def _c10d() -> _C10d:
    global _names
    if _names is None:
        _names = _C10d()
    return _names


@functools.lru_cache(maxsize=8)
def _slice(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


class GlooPending(Pending):
    def __init__(self, work: Any, after: Any = None) -> None:
        self._work = work
        self._after = after  # e.g. divide for "avg", once the sum is in

    def wait(self, seconds: float) -> bool:
        try:
            self._work.wait(_slice(seconds))
        except RuntimeError as exc:
            if str(exc).startswith(_TIMED_OUT):
                return False  # our slice ran out (if it just finished, the next wait says so)
            raise
        if self._after is not None:
            self._after()
            self._after = None
        return True


class WaitedPending(Pending):
    """A gloo operation whose wait cannot be sliced. A send's or a receive's wait that times
    out ends the operation with that error (gloo's unbound buffers); a reduce_scatter's ignores
    its time limit (it waits until done or the group's timeout, never coming back to look for
    a mismatch, a member that finished or an interrupt). So a waiter thread waits without a
    limit, and `wait` watches it in slices; an abort ends the thread's wait."""

    __slots__ = ("_after", "_done", "_error", "_work")

    def __init__(self, work: Any, after: Any = None) -> None:
        self._work = work
        self._after = after  # as GlooPending's, run by the thread that waits on this
        self._done = threading.Event()
        self._error: BaseException | None = None
        _waiters.put(self)

    def run(self) -> None:  # on a waiter thread
        try:
            self._work.wait()
        except BaseException as exc:  # handed to the thread that waits on this
            self._error = exc
        finally:
            self._work = None
            self._done.set()

    def wait(self, seconds: float) -> bool:
        if not self._done.wait(seconds):
            return False
        if self._error is not None:
            raise self._error
        if self._after is not None:
            self._after()
            self._after = None
        return True


class _Waiters:
    """Threads that wait on `WaitedPending` operations, kept between them: starting a thread
    per operation cost ~100 us, three times a small send itself. A new thread is started only
    when none is idle (every one waits on an operation still in flight)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[WaitedPending] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def put(self, op: WaitedPending) -> None:
        # Whole or not at all: an interrupt landing between the count and the queue (in
        # Thread.start's wait, say) would leave an operation nobody waits on, or a thread
        # counted busy forever.
        with interrupts_held():
            with self._lock:
                start = self._idle == 0
                if not start:
                    self._idle -= 1
            if start:
                threading.Thread(target=self._serve, name="viceroy-gloo-p2p", daemon=True).start()
            self._queue.put(op)

    def _serve(self) -> None:
        while True:
            self._queue.get().run()
            with self._lock:
                self._idle += 1


_waiters = _Waiters()


class GlooCommunicator(Communicator):
    def __init__(self, pg: Any, conns: list[sockets.Socket], peer_ports: dict[int, int]) -> None:
        self.pg = pg
        self._watch = sockets.Watch(conns)
        self._allreduce_opts: dict[str, Any] = {}
        self._peer_ports = peer_ports  # a peer's local port -> its group index
        self._lock = threading.Lock()
        self._aborted = False

    def _op(self, op: str) -> Any:
        return _c10d().reduce_ops[op]

    def _avg(self, t: Any, op: str) -> Any:
        if op != "avg":
            return None
        size = self.pg.size()
        return lambda: t.div_(size)

    def all_reduce(self, t: Any, op: str) -> Pending:
        opts = self._allreduce_opts.get(op)
        if opts is None:  # options are read at the call, so one object per op serves all
            opts = self._allreduce_opts[op] = _c10d().AllreduceOptions()
            opts.reduceOp = self._op(op)
        return GlooPending(self.pg.allreduce([t], opts), self._avg(t, op) if op == "avg" else None)

    def all_gather(self, outs: list[Any], t: Any) -> Pending:
        return GlooPending(self.pg.allgather([outs], [t]))

    def reduce_scatter(self, out: Any, ins: list[Any], op: str) -> Pending:
        from torch.distributed import ReduceScatterOptions

        opts = ReduceScatterOptions()
        opts.reduceOp = self._op(op)
        return WaitedPending(self.pg.reduce_scatter([out], [ins], opts), self._avg(out, op))

    def broadcast(self, t: Any, root: int) -> Pending:
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        return GlooPending(self.pg.broadcast([t], opts))

    def send(self, t: Any, peer: int) -> Pending:
        return WaitedPending(self.pg.send([t], peer, 0))

    def recv(self, t: Any, peer: int) -> Pending:
        return WaitedPending(self.pg.recv([t], peer, 0))

    def barrier(self) -> Pending:
        from torch.distributed import BarrierOptions

        return GlooPending(self.pg.barrier(BarrierOptions()))

    def abort(self) -> None:
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
        self._watch.cut()
        self._watch.close()

    def healthy(self) -> bool | None:
        return not self._aborted and self._watch.all_established()

    def lost_peer(self, error: BaseException) -> int | None:
        for port in sockets.ports_in(str(error)):
            if port in self._peer_ports:
                return self._peer_ports[port]
        return None


class GlooBackend(Backend):
    name = "gloo"

    @functools.cache  # noqa: B019 (one backend object per process)
    def unavailable(self) -> str | None:
        try:
            import torch.distributed as dist
        except ImportError:
            return "gloo needs torch: pip install torch"
        if not dist.is_available() or not dist.is_gloo_available():
            return "this torch build has no gloo backend"
        return None

    def accepts(self, t: Any) -> bool:
        import torch

        return isinstance(t, torch.Tensor) and t.device.type == "cpu"

    def is_failure(self, error: BaseException) -> bool:
        return isinstance(error, RuntimeError)

    def connect(self, store: Any, index: int, size: int, device: int | None, timeout: float) -> Communicator:
        from torch.distributed import ProcessGroupGloo

        store_port = address()[1]
        before = sockets.socket_fds()
        pg = ProcessGroupGloo(store, index, size, timedelta(seconds=timeout))
        new = {fd: link for fd, link in sockets.socket_fds().items() if before.get(fd) != link}
        mine = sockets.tcp_sockets(new, exclude_port=store_port)
        # Publish the ports of our connections, so a peer that loses one can say whose it was.
        store.set(f"ports/{index}", json.dumps(sorted({port for port, _ in mine.values()})))
        keys = [f"ports/{i}" for i in range(size)]
        store.wait(keys, timedelta(seconds=timeout))
        peer_ports = {
            port: i
            for i in range(size)
            if i != index
            for port in json.loads(store.get(f"ports/{i}"))
        }
        # Listeners are left alone: gloo's event loop does not expect accept() to fail.
        conns = [sock for sock, (_, listening) in mine.items() if not listening]
        return GlooCommunicator(pg, conns, peer_ports)
