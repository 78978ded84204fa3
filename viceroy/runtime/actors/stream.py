"""The values of an endpoint's `stream()` call: `for v in s`, or `async for v in s` in an async
cell or a concurrent endpoint.

On the controller each actor's value is yielded as it arrives (`Stream`); when some actors
failed, a MeshError listing them is raised after the successful values. From an endpoint on a
rank the values come together, in rank order, once every actor answered (`RankStream`: the
controller replies once). On the controller, stopping the wait (Ctrl-C, a cancelled task)
cancels the call on the ranks, and values not taken yet stay queued; from an endpoint, an
interrupt of the endpoint ends its wait as it ends a `.get()`.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from viceroy.runtime.future import Future

_END = object()  # put once the call's future is done: what arrives after it is still yielded
_NOTHING = object()  # no value in yet


class Stream:
    """A stream's values as they arrive on the controller (see the module's docstring)."""

    __slots__ = ("_cond", "_ended", "_fut", "_items", "_wake")

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._wake: Callable[[], None] | None = None  # an async consumer's waiter
        self._fut: Future[Any] | None = None
        self._ended = False

    # --- producer side: the runtime's IO thread ---------------------------------------------

    def put(self, value: Any) -> None:
        with self._cond:
            self._items.append(value)
            self._cond.notify()
            wake, self._wake = self._wake, None
        if wake is not None:
            wake()

    def follow(self, fut: Future[Any]) -> Stream:
        """The stream ends with `fut`, the call's future (its error raised after the values)."""
        self._fut = fut
        fut.add_done_callback(lambda _f: self.put(_END))
        return self

    # --- consumer side ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            with self._cond:
                while (item := self._poll()) is _NOTHING:
                    self._cond.wait()
        except KeyboardInterrupt:
            self._stop()
            raise
        if item is _END:
            self._raise_error()
            raise StopIteration
        return item

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if (item := self._poll()) is _NOTHING:
                    waiter: asyncio.Future[None] = loop.create_future()
                    self._wake = wake = _waker(loop, waiter)
            if item is not _NOTHING:
                break
            try:
                await waiter
            except (asyncio.CancelledError, KeyboardInterrupt):
                with self._cond:
                    if self._wake is wake:
                        self._wake = None
                self._stop()
                raise
        if item is _END:
            self._raise_error()
            raise StopAsyncIteration
        return item

    def _poll(self) -> Any:
        """The next value; _END once the call ended and every value was taken (the values that
        came after the end marker go first); _NOTHING when none is in yet. Caller holds the lock."""
        while self._items:
            item = self._items.popleft()
            if item is not _END:
                return item
            self._ended = True
        return _END if self._ended else _NOTHING

    def _raise_error(self) -> None:
        assert self._fut is not None
        exc = self._fut.exception()
        if exc is not None:
            try:
                raise exc
            finally:
                del exc

    def _stop(self) -> None:
        if self._fut is not None:
            self._fut._stop_call()


def _waker(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]) -> Callable[[], None]:
    def set_done() -> None:
        if not waiter.done():
            waiter.set_result(None)

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(set_done)
        except RuntimeError:  # its loop was closed: no one waits any more
            pass

    return wake


class RankStream:
    """A stream from an endpoint: every actor's value, in rank order, once all answered. It waits
    as `RankFuture.get` does (or as awaiting it does): an interrupt of the endpoint ends the
    wait, and one that can never end (on its own actor, or closing a cycle of waits between
    actors) fails at once."""

    __slots__ = ("_fut", "_values")

    def __init__(self, fut: Future[Any]) -> None:
        self._fut = fut
        self._values: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._values is None:
            self._values = iter(self._fut.get().values())
        return next(self._values)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        if self._values is None:
            self._values = iter((await self._fut).values())
        try:
            return next(self._values)
        except StopIteration:
            raise StopAsyncIteration from None
