"""What an actor's rank knows of its one-way calls (broadcasts), for peers that ask whether it
finished one (see actors/host.py): the collectives each finished one started, the latest it
finished, and, for one running or not taken yet, who asked (answered at its end) and the word of
those that had finished it (for its wait on them, once it starts).

One-way ids decrease in the order sent, and an actor takes its messages in order: a call whose
id is at or above the latest finished one's, and that is not running, has finished."""

from __future__ import annotations

import collections
from typing import Any

_KEEP = 1024  # finished one-way calls with collectives remembered; askers and word kept as many


class OnewayRecord:
    """Called only holding the actor's queue lock (`ActorHost.qlock`), under which its calls
    start and end."""

    __slots__ = ("asked", "counts", "mark", "word")

    def __init__(self) -> None:
        # Finished calls that started collectives -> those counts, latest last; those that
        # started none are told by `mark`, the latest finished.
        self.counts: collections.OrderedDict[int, dict[str, list[Any]]] = collections.OrderedDict()
        self.mark = 0
        self.asked: dict[int, set[int]] = {}  # running or not taken yet -> ranks that asked
        self.word: dict[int, dict[int, Any]] = {}  # ... -> {rank that finished it: its counts}

    def finished(self, call_id: int, running: bool, asker: int | None, asker_cc: Any) -> dict[str, list[Any]] | None:
        """The collectives call `call_id` started here, if it finished (None: not yet, or too
        long ago). Otherwise `asker` is answered at its end, and its word (`asker_cc`: the
        collectives it started in it, if it finished it) kept for the call."""
        if (cc := self.counts.get(call_id)) is not None:
            return cc
        if not running and call_id >= self.mark:
            return {}  # taken before the latest finished one, and not running: done, with no collective
        if asker is not None:
            self.asked.setdefault(call_id, set()).add(asker)
            if asker_cc is not None:
                self.word.setdefault(call_id, {})[asker] = asker_cc
            for kept in (self.asked, self.word):
                while len(kept) > _KEEP:  # calls that never came (the actor stopped first)
                    del kept[next(iter(kept))]
        return None

    def take_word(self, call_id: int) -> dict[int, Any] | None:
        """The word of peers that finished call `call_id` before it started here."""
        return self.word.pop(call_id, None)

    def ended(self, call_id: int, cc: dict[str, list[Any]]) -> set[int] | None:
        """Call `call_id` ended here, having started the collectives `cc`: the ranks that asked
        meanwhile, to answer."""
        self.mark = min(self.mark, call_id)
        if cc:
            self.counts[call_id] = cc
            if len(self.counts) > _KEEP:
                self.counts.popitem(last=False)
        return self.asked.pop(call_id, None) if self.asked else None
