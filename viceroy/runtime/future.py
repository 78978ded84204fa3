"""`Future`: the one future type of the API (runs, actor calls, fetches)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from viceroy.runtime.arguments import check_seconds

T = TypeVar("T")


class Future(Generic[T]):
    """The result of a call that may still be running on the mesh.

    >>> fut = mesh.run("import time; time.sleep(1); rank", block=False)
    >>> fut.done()
    False
    >>> fut.get(timeout=5)          # or `await fut` in an async cell, or fut.result()

    Interrupting the controller while it waits in `get` (Ctrl-C, the notebook's stop button)
    interrupts the ranks running this call, then raises KeyboardInterrupt. Cancelling a task
    that awaits it (``asyncio.wait_for`` timing out, say) cancels the call on its ranks, and
    the event loop goes on at once.
    """

    __slots__ = ("_cf", "_on_interrupt", "call_id", "what")

    def __init__(self, call_id: int = -1, on_interrupt: Callable[[bool], None] | None = None, what: str = "") -> None:
        self._cf: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._on_interrupt = on_interrupt  # called with True for a cancelled task, False for Ctrl-C
        self.call_id = call_id
        self.what = what  # what a timeout names ("Counter.incr"); "" -> "call <id>"

    # --- consumer side ---------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> T:
        """Wait for the value; raise the call's error (a `MeshError` for mesh calls)."""
        timeout = check_seconds(timeout, none="waiting as long as it takes")
        try:
            exc = self._cf.exception(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"{self.what or f'call {self.call_id}'} still running after {timeout} s; "
                "wait longer with .get(), or stop it with mesh.interrupt()"
            ) from None
        except KeyboardInterrupt:
            self._stop_call()
            raise
        if exc is not None:  # raised here, not by the stdlib's result(): its frames would show
            try:             # in the user's traceback (on a rank, an actor calling an actor)
                raise exc
            finally:
                del exc  # no cycle through this frame
        return self._cf.result()

    result = get

    def done(self) -> bool:
        return self._cf.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._cf.exception(timeout)

    def add_done_callback(self, fn: Callable[[Future[T]], Any]) -> None:
        """Call ``fn(self)`` when done (at once if already done), on whichever thread finishes it."""
        self._cf.add_done_callback(lambda _cf: fn(self))

    def __await__(self) -> Generator[Any, None, T]:
        # Bridge by hand rather than with asyncio.wrap_future: its chaining would cancel our
        # future when the awaiting task is cancelled, and then the ranks would never hear of it.
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()

        def copy(cf: concurrent.futures.Future[T]) -> None:
            if waiter.done():
                return
            exc = cf.exception()
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(cf.result())

        self._cf.add_done_callback(lambda cf: loop.call_soon_threadsafe(copy, cf))
        try:
            return (yield from waiter.__await__())
        except asyncio.CancelledError:
            self._stop_call(cancelled=True)
            raise
        except KeyboardInterrupt:
            self._stop_call()
            raise

    def _stop_call(self, cancelled: bool = False) -> None:
        """Its waiter was interrupted (Ctrl-C), or was a task that was cancelled: stop the call
        on the ranks running it, if it still runs."""
        if self._on_interrupt is not None and not self._cf.done():
            self._on_interrupt(cancelled)

    def __repr__(self) -> str:
        state = "done" if self._cf.done() else "running"
        return f"<viceroy.Future call {self.call_id} {state}>"

    # --- producer side (runtime internal) --------------------------------------------------

    def _set_result(self, value: T) -> None:
        if not self._cf.done():
            self._cf.set_result(value)

    def _set_exception(self, exc: BaseException) -> None:
        if not self._cf.done():
            self._cf.set_exception(exc)
