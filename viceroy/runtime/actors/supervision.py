"""Supervision: where the failure of an actor goes when no call is waiting for it.

An actor fails when its rank dies (every actor mesh on that rank loses its actor there), or
when a `broadcast` to it raises (nobody waits for that result). The failure goes to the owner
named at spawn (``mesh.spawn(Worker, ps, owner=ps)``): an actor mesh, whose actors'
``__supervise__(failure)`` run on their ranks, or any object with ``__supervise__`` (run on a
thread of the controller). A true return handles it. Unhandled failures are kept in
``actors.unhandled`` and, when no pending call already reported them, printed to stderr: one
line for each kind of failure with the ranks it happened on (a broadcast that raised on eight
ranks is one line), once the failures have stopped coming for `GATHER_S`. They are never raised
into some later, unrelated cell.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from viceroy.runtime.shape import describe_ranks

if TYPE_CHECKING:
    from viceroy.runtime.actors.registry import ActorRecord


GATHER_S = 0.2  # a report waits this long after the latest failure it gathers...
GATHER_MAX_S = 2.0  # ...but no longer than this after the first


@dataclass(frozen=True)
class ActorFailure:
    """What `__supervise__` receives.

    actor_mesh: e.g. ``"Worker (gpus=4)"``; ranks: where the actors failed; kind: "died" (the
    rank died; ``actors.restart()`` respawns it) or "error" (a broadcast raised; the actor lives
    on); summary: one line; traceback: the actor's, for errors.
    """

    actor_mesh: str
    ranks: tuple[int, ...]
    kind: Literal["died", "error"]
    summary: str
    traceback: str = field(default="", repr=False)

    def __str__(self) -> str:
        return f"{self.actor_mesh}: {describe_ranks(self.ranks)}: {self.summary}"


def deliver(record: ActorRecord, failure: ActorFailure, caller_knows: bool) -> None:
    """Give `failure` to the record's owner; if nobody handles it, keep and report it."""
    owner = record.owner
    if owner is None:
        _unhandled(record, failure, caller_knows)
        return
    from viceroy.runtime.actors.actor_mesh import ActorMesh

    if isinstance(owner, ActorMesh):
        fut = owner._client.control(owner._info).supervise(owner._shape, failure)

        def done(f: Any) -> None:
            exc = f.exception()
            if exc is not None:
                print(f"viceroy: the owner's __supervise__ failed on {failure}:\n{exc}", file=sys.stderr)
            if exc is not None or not any(f.get().values()):
                _unhandled(record, failure, caller_knows)

        fut.add_done_callback(done)
        return

    def run() -> None:
        try:
            handled = bool(owner.__supervise__(failure))
        except Exception as exc:
            print(f"viceroy: {type(owner).__name__}.__supervise__ raised on {failure}: {exc!r}", file=sys.stderr)
            handled = False
        if not handled:
            _unhandled(record, failure, caller_knows)

    threading.Thread(target=run, name="viceroy-supervise", daemon=True).start()


def _unhandled(record: ActorRecord, failure: ActorFailure, caller_knows: bool) -> None:
    record.unhandled.append(failure)
    if not caller_knows:
        reports.add(failure, record.info.id)


class _Reports:
    """Unhandled failures on their way to stderr. The same failure on several ranks (one
    broadcast raising everywhere, a host's ranks dying together) arrives rank by rank; it is
    printed once, with its rank set, when no more have come for `GATHER_S`. Failures of two
    actor meshes are never merged, even of the same class and shape (their ids tell them apart
    then)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str, str, str], set[int]] = {}
        self._first = self._last = 0.0
        self._printer: threading.Thread | None = None

    def add(self, failure: ActorFailure, mesh_id: str = "") -> None:
        key = (mesh_id, failure.actor_mesh, failure.kind, failure.summary, _last_user_line(failure.traceback))
        with self._lock:
            now = time.monotonic()
            if not self._pending:
                self._first = now
            self._last = now
            self._pending.setdefault(key, set()).update(failure.ranks)
            if self._printer is None:
                self._printer = threading.Thread(target=self._print_when_quiet, name="viceroy-failures", daemon=True)
                self._printer.start()

    def _print_when_quiet(self) -> None:
        while True:
            with self._lock:
                due = min(self._last + GATHER_S, self._first + GATHER_MAX_S)
                if time.monotonic() >= due:
                    self._printer = None
                    break
            time.sleep(max(0.0, due - time.monotonic()))
        self.flush()

    def flush(self) -> None:
        """Print what is gathered now (at exit, say)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        meshes: dict[str, set[str]] = {}  # label -> ids: two meshes of one label are told apart
        for mesh_id, actor_mesh, *_ in pending:
            meshes.setdefault(actor_mesh, set()).add(mesh_id)
        for (mesh_id, actor_mesh, kind, summary, where), ranks in pending.items():
            hint = f" actors.restart() respawns {'it' if len(ranks) == 1 else 'them'}." if kind == "died" else ""
            if len(meshes[actor_mesh]) > 1:
                actor_mesh = f"{actor_mesh} [{mesh_id}]"
            print(f"viceroy: unhandled actor failure: {actor_mesh}: {describe_ranks(sorted(ranks))}: {summary}{where} "
                  f"(no owner handled it; define __supervise__ on the owner).{hint}", file=sys.stderr)


reports = _Reports()
atexit.register(reports.flush)


def _last_user_line(tb: str) -> str:
    """`` (at file, line N)`` from a formatted traceback, or nothing."""
    frames = [ln.strip() for ln in tb.splitlines() if ln.strip().startswith('File "')]
    return f" (at {frames[-1][5:]})" if frames else ""
