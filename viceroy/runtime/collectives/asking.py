"""Asking the rendezvous store without waiting on it in C++: the TCPStore client is asked from
a thread of its own, in order, and callers wait in Python slices, so an interrupt gets through,
and at most ASK_S. A server that does not answer in that time (its host cut off: the
connection stays open, and an operation would wait until TCP gives up, minutes later) counts
as lost, and every further operation on the connection fails at once."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from viceroy.runtime.collectives.waiting import SLICE_S

ASK_S = 5.0  # the longest a caller waits for the server to answer one operation (it takes ms)


class StoreUnreachable(RuntimeError):
    """The server did not answer within ASK_S: its host is cut off, or gone."""


class Ask:
    """One operation on the store, run by its connection's thread (see `Asking`)."""

    def __init__(self, op: Callable[[Any], Any]) -> None:
        self.op = op
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self, raw: Any) -> None:
        try:
            self._value = self.op(raw)
        except BaseException as exc:  # handed to whoever waits for it
            self._error = exc
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, seconds: float) -> None:
        self._done.wait(seconds)

    def value(self) -> Any:
        """The operation's result, once `done` (raises what it raised)."""
        if self._error is not None:
            raise self._error
        return self._value


class Asking:
    """A TCPStore client asked from a thread of its own, in order; callers wait in slices, so
    an interrupt gets through, and at most ASK_S: then the connection counts as lost (`lost`,
    and `on_lost` is told), and every operation on it fails at once with StoreUnreachable. The
    thread left waiting in C++ ends when TCP gives up."""

    def __init__(self, raw: Any, where: str, on_lost: Callable[[Asking], None]) -> None:
        self.raw, self.where, self.lost = raw, where, False
        self._busy_since: float | None = None  # when the operation in flight was handed over
        self._on_lost = on_lost
        self._jobs: queue.SimpleQueue[Ask | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="viceroy-store-client", daemon=True).start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self.lost:
                job.fail(self._unreachable())
                continue
            self._busy_since = time.monotonic()
            job.run(self.raw)
            self._busy_since = None

    def _unreachable(self) -> StoreUnreachable:
        return StoreUnreachable(f"the rendezvous store at {self.where} (on rank 0) did not answer "
                                f"within {ASK_S:.0f} s: is rank 0's host reachable?")

    def start(self, op: Callable[[Any], Any]) -> Ask:
        """Hand `op(raw client)` to the connection's thread; `poll` the Ask, or `wait` for it."""
        ask = Ask(op)
        if self.lost:
            ask.fail(self._unreachable())
        else:
            self._jobs.put(ask)
        return ask

    def poll(self, ask: Ask) -> bool:
        """Whether `ask` is done; raises StoreUnreachable once the operation in flight has
        waited for the server longer than ASK_S (the connection is then lost)."""
        if ask.done():
            return True
        since = self._busy_since
        if self.lost or (since is not None and time.monotonic() - since > ASK_S):
            self._give_up()
        return False

    def wait(self, ask: Ask) -> Any:
        """`ask`'s result, within ASK_S (else StoreUnreachable)."""
        deadline = time.monotonic() + ASK_S
        while not self.poll(ask):
            if time.monotonic() > deadline:
                self._give_up()
            ask.wait(SLICE_S)
        return ask.value()

    def _give_up(self) -> None:
        if not self.lost:
            self.lost = True
            self._on_lost(self)
        raise self._unreachable()

    def close(self) -> None:
        """No more operations: the thread ends once it is free (a lost one fails those queued)."""
        self._jobs.put(None)

    # The operations callers use, each waited for as above.
    def add(self, key: str, amount: int) -> int:
        return self.wait(self.start(lambda s: s.add(key, amount)))

    def set(self, key: str, value: str) -> None:
        self.wait(self.start(lambda s: s.set(key, value)))

    def get(self, key: str) -> bytes:
        return self.wait(self.start(lambda s: s.get(key)))

    def check(self, keys: list[str]) -> bool:
        return self.wait(self.start(lambda s: s.check(keys)))

    def append(self, key: str, value: str) -> None:
        self.wait(self.start(lambda s: s.append(key, value)))

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self.wait(self.start(lambda s: s.compare_set(key, expected, desired)))
