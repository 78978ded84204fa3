"""Whether the members of a collective passed the same thing: the slow path of
`communicators.run`. Backends do not notice members that pass different shapes, dtypes or
operations; they wait for bytes that never come. So an operation still waiting after
CHECK_AFTER_S writes its signature (``all_reduce('sum') float32[4]``) into the rendezvous store
under the operation's key, and compares it with those the other waiting members wrote. A
mismatch the backend does not wait on (the same byte size in other dtypes, shapes or ops; a
receiving buffer larger than what is sent) completes with wrong values, unless collectives are
checked (`checking`: one more small collective per operation, so only on request).

A member that got its share despite the mismatch returned, and writes nothing for it; what it
passed still reaches the members left waiting. Waiting in a later operation on the group, it
writes the signature of its previous one too, under that one's key. Having finished the call,
it reported the signature of its last one with its answer, and the controller passes it on
(`call_peers.finished_with`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from viceroy.runtime import call_peers
from viceroy.runtime.collectives.asking import Ask, Asking
from viceroy.runtime.collectives.store import rendezvous
from viceroy.runtime.context import context
from viceroy.runtime.shape import describe_ranks

CHECK_AFTER_S = 2.0  # an operation waiting this long compares what each member passed
LOOK_EVERY_S = 0.5


class Agreement:
    """One member's signature `sig` for operation number `op` on the communicator whose store
    keys start with `prefix` (in the store of `incarnation`), and `previous`, its signature for
    the operation before (None: the first), among `members`."""

    def __init__(self, prefix: str, op: int, incarnation: str, sig: str, previous: str | None, members: Sequence[int]) -> None:
        self.key, self.incarnation, self.sig = f"{prefix}/sig{op}", incarnation, sig
        self.before = None if previous is None or op == 0 else (f"{prefix}/sig{op - 1}", previous)
        self.members = members
        self.next_at = time.monotonic() + CHECK_AFTER_S
        self.written = False
        self.me = context().rank
        self.look: tuple[Asking, Ask] | None = None  # the look on its way, and whom it asks

    def mismatch(self) -> str | None:
        """"rank 0: float32[1]; rank 1: float32[2]" when the members' signatures differ, else
        None (also before CHECK_AFTER_S, and while a look is on its way: the store is asked in
        the background, so a server that stopped answering never holds the caller)."""
        now = time.monotonic()
        if self.look is not None:
            store, look = self.look
            try:
                if not store.poll(look):
                    return None
                self.look = None
                written = look.value()
            except RuntimeError:  # the store is gone (with rank 0): the connections say more
                self.look = None
                return None
            return self._compare(written)
        if now < self.next_at:
            return None
        self.next_at = now + LOOK_EVERY_S
        live = rendezvous.current()
        if live is not None and live[1] == self.incarnation:
            self.look = (live[0], live[0].start(self._look))
        return None

    def _look(self, store: Any) -> str:
        """On the store's thread: write ours once, read everyone's (two round trips per look,
        however many members)."""
        if not self.written:
            store.append(self.key, f"{self.me}\t{self.sig}\n")
            if self.before is not None:  # for a member left waiting in it
                store.append(self.before[0], f"{self.me}\t{self.before[1]}\n")
            self.written = True
        return store.get(self.key).decode()

    def _compare(self, written: str) -> str | None:
        by_rank = {int(rank): sig for rank, _, sig in (line.partition("\t") for line in written.splitlines())}
        by_rank.update(call_peers.finished_with(self.members))
        sigs: dict[str, list[int]] = {}
        for rank, sig in sorted(by_rank.items()):
            sigs.setdefault(sig, []).append(rank)
        if len(sigs) < 2:
            return None
        return "; ".join(f"{describe_ranks(ranks)}: {sig}" for sig, ranks in sorted(sigs.items(), key=lambda kv: kv[1]))
