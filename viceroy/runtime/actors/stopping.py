"""Stopping actor meshes, the controller's side: `stop()`, which cancels running async endpoints,
waits for a running sync one to end and says so when it returns first; the stops a mesh's
shutdown makes (`stop_all`: bounded, never raising); and ``__cleanup__`` errors, raised or, for a
stop nobody waits on any more, printed. `Stopping` is a mixin of `ActorRecord`, which owns the
state declared here."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from viceroy.runtime.actors.actor_mesh import ActorMeshInfo
from viceroy.runtime.actors.oneway import Oneway
from viceroy.runtime.arguments import check_seconds
from viceroy.runtime.controller import Controller
from viceroy.runtime.errors import MeshError, RankFailure
from viceroy.runtime.future import Future
from viceroy.runtime.shape import Shape, format_rank_set

SHUTDOWN_STOP_S = 1.5  # how long a mesh's shutdown waits for its actors' __cleanup__, all together
STOP_TIMEOUT_S = 10.0  # how long stop() waits by default (an actor busy in a sync endpoint)


@dataclass
class PendingStop:
    ranks: tuple[int, ...]
    fut: Future[Any]
    late: bool = False  # stop() returned before it was done (said so then)
    reported: bool = False  # its __cleanup__ errors were raised (or printed)


class Stopping:
    controller: Controller
    info: ActorMeshInfo
    shape: Shape  # the whole actor mesh's
    status: dict[int, str]  # rank -> live | stopping | stopped | failed | starting
    oneway: Oneway
    _lock: threading.Lock
    _stops: list[PendingStop]
    # ActorRecord's
    label: Callable[[Shape], str]
    mark: Callable[..., None]

    @property
    def name(self) -> str:
        return self.info.cls_name

    def stop(self, shape: Shape, timeout: float | None = STOP_TIMEOUT_S) -> None:
        """Stop the live actors of `shape` and wait up to `timeout` s for them. An actor busy in
        a sync endpoint stops when it ends; one not done by then is "stopping" (repr says so,
        and a line on stderr), takes no new call, and becomes "stopped" when its stop answers.
        A ``__cleanup__`` that raised raises a MeshError naming its ranks, with the traceback
        (the actors are stopped all the same; one that raises after stop() returned is
        printed). Dead ranks are no error. An interrupt while waiting leaves the stop going on."""
        timeout = check_seconds(timeout, none="waiting as long as it takes")  # before the stop is sent
        waits = self.send_stop(shape)
        _wait(waits, None if timeout is None else time.monotonic() + timeout)
        self.settle(waits, shape, f"stop() of actor mesh {self.label(shape)}: not stopped yet on {{ranks}} after "
                    f"{timeout} s (busy in a sync endpoint, which runs to its end): the stop follows it, running "
                    "__cleanup__, and no new calls are taken meanwhile. repr() says 'stopping' until then.")

    def send_stop(self, shape: Shape) -> list[PendingStop]:
        """Send a stop to the live actors of `shape`, without waiting; -> the stops to wait on
        (this one, and earlier ones still going on there)."""
        with self._lock:
            live = [r for r in shape.ranks if self.status[r] == "live"]
            for r in shape.ranks:
                if self.status[r] != "stopping":
                    self.status[r] = "stopping" if r in live else "stopped"
            waits = [p for p in self._stops if not p.fut.done() and set(p.ranks) & set(shape.ranks)]
        if live and self.controller.closed:
            self.mark(live, "stopped")  # its ranks are gone, and their actors with them
        elif live:
            self.oneway.flush()
            fut = self.controller.submit("actor", Shape({"ranks": len(live)}, live),
                                         {"a": "stop", "actor": self.info.id}, label=f"stop {self.name}",
                                         fail_fast=False, on_result=self._stop_answered)
            fut._on_interrupt = None  # Ctrl-C in stop(): the actors stop all the same
            pending = PendingStop(tuple(live), fut)
            with self._lock:
                self._stops.append(pending)
            fut.add_done_callback(functools.partial(self._stop_done, pending))
            waits.append(pending)
        return waits

    def settle(self, waits: list[PendingStop], shape: Shape, not_yet: str) -> None:
        """After waiting on `waits`: say which actors of `shape` are not stopped yet (`not_yet`,
        with {ranks} and {they}), and raise a MeshError for ``__cleanup__``s that raised."""
        late: list[int] = []
        errors: dict[int, RankFailure] = {}
        total = 0
        with self._lock:
            for pending in waits:
                if not pending.fut.done():
                    pending.late = True
                    late += [r for r in pending.ranks if r in shape.ranks and self.status[r] == "stopping"]
                elif not pending.reported:
                    pending.reported = True
                    total += len(pending.ranks)
                    errors |= _cleanup_errors(pending.fut)
        if late:
            ranks = f"{'rank' if len(late) == 1 else 'ranks'} {format_rank_set(late)}"
            print("viceroy: " + not_yet.format(ranks=ranks, they="it" if len(late) == 1 else "they"), file=sys.stderr)
        if errors:
            raise _cleanup_failed(self.name, errors, total)

    def _stop_answered(self, rank: int, ok: bool, value: Any) -> None:
        """A rank answered a stop (on the IO thread): its actor is stopped, unless the stop was
        given up on there (an interrupt): it may still be running, so it stays "stopping"."""
        if ok or value.kind not in ("interrupted", "timeout"):
            with self._lock:
                self.status[rank] = "stopped"

    def _stop_done(self, pending: PendingStop, fut: Future[Any]) -> None:
        """A stop ended (IO thread). When its caller stopped waiting before, nobody raises its
        ``__cleanup__`` errors: print them."""
        with self._lock:
            self._stops.remove(pending)
            report = pending.late and not pending.reported
            pending.reported = pending.reported or report
        errors = _cleanup_errors(fut) if report else {}
        if errors:
            print(f"viceroy: after stop() returned: {_cleanup_failed(self.name, errors, len(pending.ranks))}", file=sys.stderr)


def stop_all(records: Iterable[Stopping], controller: Controller, timeout: float = SHUTDOWN_STOP_S) -> None:
    """As the mesh shuts down (`Controller.shutdown`, before it closes): stop every live actor
    mesh of `records`, so their ``__cleanup__``s run, waiting at most `timeout` s for all of
    them together. What raised, or was not done by then (an actor busy in a sync endpoint), is
    printed to stderr; nothing raises, and an interrupt only ends the wait."""
    sends: list[tuple[Stopping, list[PendingStop]]] = []
    for record in records:
        try:
            sends.append((record, record.send_stop(record.shape)))
        except Exception:  # the controller is closing: nothing more can be sent
            break
    if not any(waits for _, waits in sends) or threading.current_thread() is controller._io:
        return  # (on the IO thread, which reads the answers, waiting would only stall)
    deadline = time.monotonic() + timeout
    with contextlib.suppress(KeyboardInterrupt):  # shutting down all the same: the wait is what it ends
        _wait([pending for _, waits in sends for pending in waits], deadline)
    for record, waits in sends:
        try:
            record.settle(waits, record.shape, f"the mesh shut down while actor mesh {record.label(record.shape)} "
                          f"was busy on {{ranks}} (a sync endpoint, {timeout} s after the stop): "
                          "{they} did not run __cleanup__")
        except MeshError as exc:
            print(f"viceroy: as the mesh shut down: {exc}", file=sys.stderr)


def _wait(waits: list[PendingStop], deadline: float | None) -> None:
    """Wait for `waits` to end, until `deadline` (monotonic; None: for good)."""
    for pending in waits:
        with contextlib.suppress(concurrent.futures.TimeoutError):
            pending.fut._cf.exception(None if deadline is None else max(0.0, deadline - time.monotonic()))


def _cleanup_errors(fut: Future[Any]) -> dict[int, RankFailure]:
    """The ranks whose ``__cleanup__`` raised, of a stop that ended (dead ranks are no error:
    their actors are gone as asked)."""
    exc = fut.exception()
    if not isinstance(exc, MeshError):
        return {}
    return {r: f for r, f in exc.failures.items() if f.kind == "error"}


def _cleanup_failed(name: str, errors: dict[int, RankFailure], total: int) -> MeshError:
    return MeshError(f"{name}.__cleanup__", errors, total=total, hint="The actors are stopped all the same.")
