"""Whether the members of a collective passed the same thing: the slow path of
`communicators.run`. Backends do not notice members that pass different shapes, dtypes or
operations; they wait for bytes that never come. So an operation still waiting after
CHECK_AFTER_S writes its signature (``all_reduce('sum') float32[4]``) into the rendezvous store
under the operation's key, and compares it with those the other waiting members wrote (members
that finished the operation write none)."""

from __future__ import annotations

import time

from viceroy.runtime.collectives.store import rendezvous
from viceroy.runtime.context import context
from viceroy.runtime.shape import describe_ranks

CHECK_AFTER_S = 2.0  # an operation waiting this long compares what each member passed
LOOK_EVERY_S = 0.5


class Agreement:
    """One member's signature for the operation keyed `key` in the store of `incarnation`."""

    def __init__(self, key: str, incarnation: str, sig: str) -> None:
        self.key, self.incarnation, self.sig = key, incarnation, sig
        self.next_at = time.monotonic() + CHECK_AFTER_S
        self.written = False

    def mismatch(self) -> str | None:
        """"rank 0: float32[1]; rank 1: float32[2]" when the members' signatures differ, else
        None (also before CHECK_AFTER_S, and between looks)."""
        now = time.monotonic()
        if now < self.next_at:
            return None
        self.next_at = now + LOOK_EVERY_S
        live = rendezvous.current()
        if live is None or live[1] != self.incarnation:
            return None
        store = live[0]
        try:
            if not self.written:  # one key for all: two store round trips per look, however many
                store.append(self.key, f"{context().rank}\t{self.sig}\n")
                self.written = True
            written = store.get(self.key).decode()
        except RuntimeError:  # the store is gone (with rank 0): the connections say more
            return None
        sigs: dict[str, list[int]] = {}
        for line in written.splitlines():
            rank, _, sig = line.partition("\t")
            sigs.setdefault(sig, []).append(int(rank))
        if len(sigs) < 2:
            return None
        return "; ".join(f"{describe_ranks(ranks)}: {sig}" for sig, ranks in sorted(sigs.items(), key=lambda kv: kv[1]))
