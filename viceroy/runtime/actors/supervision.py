"""Supervision: where the failure of an actor goes when no call is waiting for it.

An actor fails when its rank dies (every actor mesh on that rank loses its actor there), or
when a `broadcast` to it raises (nobody waits for that result). The failure goes to the owner
named at spawn (``mesh.spawn(Worker, ps, owner=ps)``): an actor mesh, whose actors'
``__supervise__(failure)`` run on their ranks, or any object with ``__supervise__`` (run on a
thread of the controller). A true return handles it. Unhandled failures are kept in
``actors.unhandled`` and, when no pending call already reported them, printed once to stderr.
They are never raised into some later, unrelated cell.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from viceroy.runtime.shape import format_rank_set

if TYPE_CHECKING:
    from viceroy.runtime.actors.registry import ActorRecord


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
        return f"{self.actor_mesh}: rank {format_rank_set(self.ranks)}: {self.summary}"


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
        hint = " actors.restart() respawns it." if failure.kind == "died" else ""
        where = _last_user_line(failure.traceback)
        print(f"viceroy: unhandled actor failure: {failure}{where} (no owner handled it; define "
              f"__supervise__ on the owner).{hint}", file=sys.stderr)


def _last_user_line(tb: str) -> str:
    """`` (at file, line N)`` from a formatted traceback, or nothing."""
    frames = [ln.strip() for ln in tb.splitlines() if ln.strip().startswith('File "')]
    return f" (at {frames[-1][5:]})" if frames else ""
