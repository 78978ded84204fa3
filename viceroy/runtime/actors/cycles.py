"""Cycles of waits between actors, found on the controller. A plain endpoint (not concurrent)
holds its actor until it returns: the actor takes no other message meanwhile; a concurrent one
holds it while it blocks in a wait (`.get()` stops the event loop that runs the endpoints).
When A's `step` waits for B's `process`, and `process` waits for A's `callback`, which cannot
start before `step` returns, neither can go on. A wait for a call on the waiting actor itself
fails on the rank (rank_client._waits_on_self); one through other actors is seen here.

Every request a rank sends (REQUEST) is relayed as a controller call (a `Relay`, kept until its
reply goes). An endpoint that blocks on a request's reply says so (WAIT,
rank_client._tell_wait), and again if it stops waiting before the reply. One that holds its
actor blocks the actor instance (actor mesh id, rank); a concurrent one that awaits blocks only
its own call on that rank (call, rank): either is then blocked on that request (a `Wait`). On
each new wait, follow who waits for whom: a blocked one waits for the ranks its request's call
has not answered yet; on each, the call is held up by the instance there when it is blocked
itself (its own endpoint runs, the call waits behind it; or it is that call), or it is a
concurrent call blocked itself. Back at the one that started: a cycle, and the request that
closed it is failed at once (its call cancelled), which unwinds the others.

Only who is blocked now counts: an endpoint that keeps the future and returns blocks nothing,
and a blocked instance whose endpoint answered its call meanwhile is no longer in the way. A
call on a concurrent endpoint is held up by a blocked actor while it waits in the queue (sent
after the blocked endpoint's call) or, sent before, while the blocked endpoint stops the actor's
event loop (a sync endpoint, or `.get()`): one that awaits lets it run as a task."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Instance = tuple[str, int]  # (actor mesh id, rank): one actor, blocked by an endpoint that holds it
Awaiting = tuple[int, int]  # (call, rank): a concurrent endpoint's call, blocked (its actor is not)
Node = Instance | Awaiting


@dataclass
class Relay:
    """A request from a rank, relayed as controller call `call`, until its reply goes."""

    rank: int  # who asked
    req: int  # its id on that rank
    actor: str  # the actor mesh it calls
    what: str  # "B.process"
    call: int  # the controller call it became
    concurrent: bool  # the endpoint called overlaps with others (concurrent=True)
    replied: bool = False
    waiter: Node | None = None  # who is blocked on it, if one is


@dataclass
class Wait:
    """An endpoint blocked on a request's reply: one that holds its actor, or a concurrent one."""

    relay: Relay
    call: int  # the call its endpoint runs in (<= 0: a one-way call, not tracked by the controller)
    ep: str  # its endpoint's name
    actor: str  # its actor mesh's id
    concurrent: bool = False  # its endpoint is concurrent
    awaiting: bool = False  # an `await`: the actor's event loop runs, concurrent endpoints go on

    @property
    def holds(self) -> bool:
        """Its endpoint holds its actor: one not concurrent, or a concurrent one that blocks."""
        return not (self.concurrent and self.awaiting)


class Waits:
    """Requests in flight and the actors blocked on them, for one controller."""

    def __init__(self, unanswered: Callable[[int], list[int]], name_of: Callable[[str], str]) -> None:
        self._unanswered = unanswered  # Controller.unanswered
        self._name_of = name_of  # actor mesh id -> its class name
        self._relays: dict[tuple[int, int], Relay] = {}
        self._blocked: dict[Node, Wait] = {}  # an actor (Instance) or a concurrent call (Awaiting) -> its wait
        self._lock = threading.Lock()

    def relayed(self, rank: int, req: int, actor: str, what: str, call: int, concurrent: bool) -> Relay:
        relay = Relay(rank, req, actor, what, call, concurrent)
        with self._lock:
            self._relays[(rank, req)] = relay
        return relay

    def relay_of(self, rank: int, req: int) -> Relay | None:
        """Request `req` of rank `rank`, while its reply has not gone."""
        with self._lock:
            relay = self._relays.get((rank, req))
            return None if relay is None or relay.replied else relay

    def replying(self, relay: Relay) -> bool:
        """Its reply goes now: forget it. False when it went already (a cycle's error)."""
        with self._lock:
            if relay.replied:
                return False
            self._forget(relay)
            return True

    def _forget(self, relay: Relay) -> None:
        relay.replied = True
        if self._relays.get((relay.rank, relay.req)) is relay:
            del self._relays[(relay.rank, relay.req)]
        if relay.waiter is not None and (w := self._blocked.get(relay.waiter)) is not None and w.relay is relay:
            del self._blocked[relay.waiter]

    def blocked(self) -> dict[Node, str]:
        """Who is blocked now, on what: (actor mesh id, rank), or (call, rank) for a concurrent
        endpoint -> "B.process" (tests, debugging)."""
        with self._lock:
            return {inst: w.relay.what for inst, w in self._blocked.items()}

    def on_wait(self, rank: int, d: dict[str, Any]) -> tuple[Relay, str] | None:
        """Rank `rank` says an endpoint blocks on request d["req"] (or, with "over", no longer
        does); one that holds its actor blocks it, a concurrent one that awaits only its call.
        -> the request to fail now and why, when this wait closes a cycle (it counts as replied
        from here: the caller replies with the error). A call waits for one request at a time:
        only its endpoint's own task is told (rank_client._tell_wait)."""
        with self._lock:
            relay = self._relays.get((rank, d["req"]))
            if relay is None or relay.replied:
                return None  # answered already (the reply crossed this notice)
            wait = Wait(relay, d["call"], d["ep"], d["actor"], d["conc"], d["awaiting"])
            inst: Node = (wait.actor, rank) if wait.holds else (wait.call, rank)
            if d["over"]:
                w = self._blocked.get(inst)
                if w is not None and w.relay is relay:
                    del self._blocked[inst]
                    relay.waiter = None
                return None
            self._blocked[inst] = wait
            relay.waiter = inst
            path = self._cycle(inst, wait)
            if path is None:
                return None
            self._forget(relay)
            return relay, self._message(path)

    def _holds_up(self, wait: Wait, inst: Instance) -> Wait | None:
        """The wait of `inst`, if its blocked endpoint holds up `wait`'s call there (which it
        has not answered)."""
        other = self._blocked.get(inst)
        if other is None or other.relay.replied:
            return None
        if other.call > 0 and inst[1] not in self._unanswered(other.call):
            return None  # its endpoint returned meanwhile (the word that it no longer waits is on its way)
        if wait.relay.concurrent and other.awaiting and not (other.call > 0 and wait.relay.call > other.call):
            return None  # sent before, a concurrent call runs as a task beside an endpoint that awaits
        return other

    def _cycle(self, start: Node, wait: Wait) -> list[tuple[Node, Wait]] | None:
        """The blocked actors and calls from `start` (blocked in `wait`) around to `start`
        again, each waiting for the next; None when there is no such cycle."""
        path: list[tuple[Node, Wait]] = []
        seen = {start}

        def walk(node: Node, w: Wait) -> bool:
            path.append((node, w))
            for r in self._unanswered(w.relay.call):
                inst: Instance = (w.relay.actor, r)
                awaiting: Awaiting = (w.relay.call, r)  # the call itself, in a concurrent endpoint that waits
                for nxt, other in ((inst, self._holds_up(w, inst)), (awaiting, self._blocked.get(awaiting))):
                    if other is None or other.relay.replied:
                        continue
                    if nxt == start:
                        return True
                    if nxt not in seen:
                        seen.add(nxt)
                        if walk(nxt, other):
                            return True
            path.pop()
            return False

        return path if walk(start, wait) else None

    def _message(self, path: list[tuple[Node, Wait]]) -> str:
        def endpoint(w: Wait) -> str:
            return f"{self._name_of(w.actor)}.{w.ep}"

        hops: list[str] = []
        holders: list[Wait] = []  # the waits of endpoints that hold up a call queued behind them
        for i, (inst, w) in enumerate(path):
            nxt, nw = path[(i + 1) % len(path)]
            if nw.call == w.relay.call:
                why = f"which itself waits for {nw.relay.what}"
            else:
                start = "go on" if w.relay.concurrent and w.relay.call < nw.call else "start"  # a task, stalled
                until = f"while {endpoint(nw)} blocks" if nw.concurrent else f"before {endpoint(nw)} returns"
                why = f"which cannot {start} {until} there"
                if all(h is not nw for h in holders):
                    holders.append(nw)
            hops.append(f"{endpoint(w)} on rank {inst[1]} waits for {w.relay.what} on rank {nxt[1]}, {why}")
        first, w0 = path[0]
        holders = holders or [w for _, w in path if w.holds]
        make = " or ".join(dict.fromkeys(endpoint(w) for w in holders if not w.concurrent))
        blocking = " or ".join(dict.fromkeys(endpoint(w) for w in holders if w.concurrent))
        instead = ["do not wait in one of them (.broadcast(), or keep the future and return)"]
        instead += [f"make {make} an `@vr.endpoint(concurrent=True) async def` that awaits it"] if make else []
        instead += [f"`await` it in {blocking} (a blocking wait there stops its actor's event loop)"] if blocking else []
        return (f"A cycle of waits between actors: {'; '.join(hops)}. An actor handles one message at a "
                f"time and an endpoint holds its actor until it returns (a concurrent one while it blocks, in .get()), "
                f"so none of them can go on: all would wait forever. So this wait ({endpoint(w0)} on rank "
                f"{first[1]} for {w0.relay.what}) fails, and that call is cancelled. Instead {', or '.join(instead)}")
