"""Pipelined broadcasts, coalesced. A `broadcast` is a message no rank answers, so a loop of
them is limited by the cost of each send (a signed message and a socket send per rank on the
controller, a receive and a check on each rank). `Oneway` queues them per actor mesh and lets the
controller's IO thread send whatever has piled up as one message per rank ("batch"), which
the rank unpacks into the actor's queue in order.

Each broadcast carries an id of its own ("ow", negative, unique in this process): a rank
waiting in a collective of one asks who finished it by that id (see actors/actor_thread.py).

Order: every other message to the same actor mesh (a call, a stop, a relayed call from a rank)
first `flush`es, under the same lock as the IO thread's flush, so nothing overtakes a queued
broadcast. Broadcasts with out-of-band buffers (large arrays) are not queued: they flush, then
go at once as before.
"""

from __future__ import annotations

import itertools
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from viceroy.runtime.controller import Controller


_ids = itertools.count(1)  # one-way ids, process-wide: two actor meshes may share a rank


class Oneway:
    def __init__(self, controller: Controller, actor_id: str) -> None:
        self.controller = controller
        self.actor_id = actor_id
        self._lock = threading.Lock()  # held while sending: no send overtakes another
        self._pending: list[tuple[tuple[int, ...], str, Any, int]] = []  # (ranks, endpoint, payload, id)
        self._scheduled = False

    def send(self, ranks: tuple[int, ...], endpoint: str, signed: list[Any], data: list[Any]) -> None:
        ow = -next(_ids)
        if data or len(signed) != 1:
            with self._lock:
                self._flush_locked()
                self.controller.send_oneway("actor", ranks, {"a": "call", "actor": self.actor_id, "ep": endpoint,
                                                             "ow": ow}, signed, data)
            return
        with self._lock:
            self._pending.append((ranks, endpoint, signed[0], ow))
            if self._scheduled:
                return
            self._scheduled = True
        self.controller.call_soon(self._flush_from_io_thread)

    def flush(self) -> None:
        """Send what is queued now (before another message to the same actors). Always under
        the lock: the IO thread may be sending a batch it already took."""
        with self._lock:
            self._flush_locked()

    def _flush_from_io_thread(self) -> None:
        try:
            with self._lock:
                self._flush_locked()
        except Exception as exc:  # the mesh closed meanwhile; never break the IO thread
            if not self.controller.closed:
                print(f"viceroy: queued broadcasts could not be sent: {exc!r}", file=sys.stderr)

    def _flush_locked(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        self._scheduled = False
        i = 0
        while i < len(pending):  # runs of messages to the same ranks: one message per rank each
            ranks = pending[i][0]
            j = i
            while j < len(pending) and pending[j][0] == ranks:
                j += 1
            run = pending[i:j]
            if len(run) == 1:
                extra: dict[str, Any] = {"a": "call", "actor": self.actor_id, "ep": run[0][1], "ow": run[0][3]}
            else:
                extra = {"a": "batch", "actor": self.actor_id, "eps": [m[1] for m in run], "ows": [m[3] for m in run]}
            self.controller.send_oneway("actor", ranks, extra, [m[2] for m in run])
            i = j
