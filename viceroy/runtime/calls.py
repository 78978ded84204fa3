"""A call in flight: which ranks answered, with what, and how it ends (a ValueMesh or one
grouped MeshError)."""

from __future__ import annotations

import itertools
import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from viceroy.runtime import serialize, shm
from viceroy.runtime.errors import MeshError, RankFailure
from viceroy.runtime.future import Future
from viceroy.runtime.shape import Shape
from viceroy.runtime.values import ValueMesh

_loads = pickle.loads  # plain values: no out-of-band buffers to make writable

# After a call is cancelled, how long its ranks get to stop before the call ends without them.
STOP_GRACE_S = 1.0
# What the ranks that did not stop in time are said to be doing: code, or an actor's endpoint
# (on an actor thread, which no interrupt reaches; see actors/actor_thread.py).
STUCK_HINT = "(busy in native code?), and runs on until it returns or mesh.restart() ends it"
ACTOR_STUCK_HINT = ("(a sync endpoint, once started, runs to its end; an async one stops at once). "
                    "The actor takes its next message when it ends")
# What the ranks still running a call that a death ended (see `Call.death_ends`) are said to do.
NOT_WAITED_FOR = ("still running it: its answer is dropped when it comes (the actor takes its next message "
                  "once it is free)")


@dataclass
class Call:
    id: int
    label: str
    shape: Shape
    future: Future[Any]
    fail_fast: bool
    deadline: float | None
    timeout: float | None
    results: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, RankFailure] = field(default_factory=dict)
    stop_reason: str | None = None
    stop_deadline: float | None = None
    shm_paths: list[str] = field(default_factory=list)
    on_result: Callable[[int, bool, Any], None] | None = None
    died_hint: str = "Bring dead ranks back with mesh.restart(failed_only=True); the others keep their state."
    stuck_hint: str = STUCK_HINT
    on_main_thread: bool = True  # runs on the ranks' main thread (not an actor's endpoint)
    queue: str = ""  # the queue it waits in on the ranks: "" the main thread's, else its actor mesh's id
    # A rank's death ends the call for the caller STOP_GRACE_S later, whoever is still running
    # it; they are not cancelled (actor endpoints: the others run on, their answers dropped).
    death_ends: bool = False
    cancelled: bool = True  # stopped (see outcomes._stop) by a cancel sent to the ranks
    # Cancelled, and not for a rank's failure (fail-fast): called off (an interrupt, a timeout,
    # a cancel). A collective that then fails on a rank was ended by a member cancelled first.
    called_off: bool = False
    # Telling the ranks still running it who finished (see call_peers): the collectives each
    # answered rank started, when to tell first, and who was told of already.
    collectives: dict[int, dict[str, Any]] = field(default_factory=dict)
    notice_at: float | None = None
    told: set[int] = field(default_factory=set)
    # Groups (by name) whose collectives crossed out of a call queued before this one, and that
    # call: what this one's collectives on them returned is not trusted (see crossing.py).
    distrust: dict[str, str] = field(default_factory=dict)

    def missing(self) -> list[int]:
        return [r for r in self.shape.ranks if r not in self.results and r not in self.failures]

    def answered(self, r: int) -> bool:
        return r in self.results or r in self.failures

    def complete(self) -> bool:
        """Every rank answered (results and failures only ever hold ranks of the call, once)."""
        return len(self.results) + len(self.failures) >= len(self.shape.ranks)

    def record_scalars(self, ranks: list[int], values: list[Any]) -> list[int]:
        """Scalar results from one agent, in a column of its header (see `answers.aggregate`).
        Answers already recorded are dropped. Returns the ranks recorded."""
        if len(values) != len(ranks):  # never from our agents
            self._garbled(ranks, "column lengths do not match")
            return []
        if not (self.results.keys().isdisjoint(ranks) and self.failures.keys().isdisjoint(ranks)):
            fresh = [(r, v) for r, v in zip(ranks, values, strict=True) if not self.answered(r)]
            ranks, values = [r for r, _ in fresh], [v for _, v in fresh]
        self.results.update(zip(ranks, values, strict=True))
        self._stream(ranks)
        return ranks

    def record_packed(self, ranks: list[int], lens: list[int] | None, blob: Any) -> tuple[list[int], list[int]]:
        """Plain successes from one agent, in columns (see `answers.aggregate`): the ranks, the
        length of each one's pickle in `blob` (0: no value; `lens` None: none has a value).
        The usual case is a few C-speed passes, not Python per rank. Answers already recorded
        (late, or repeated) are dropped. Returns (ranks now succeeded, ranks now failed)."""
        fresh = self.results.keys().isdisjoint(ranks) and self.failures.keys().isdisjoint(ranks)
        if lens is None:
            if not fresh:
                ranks = [r for r in ranks if not self.answered(r)]
            self.results.update(dict.fromkeys(ranks))
            self._stream(ranks)
            return ranks, []
        view = memoryview(blob.buffer if hasattr(blob, "buffer") else blob)
        if len(lens) != len(ranks) or sum(lens) != view.nbytes:  # never from our agents
            return [], self._garbled(ranks, "packed lengths do not match")
        ends = list(itertools.accumulate(lens))
        if fresh:
            try:
                values = [_loads(view[e - n : e]) if n else None for n, e in zip(lens, ends, strict=True)]
            except Exception:
                pass  # one of them does not unpickle: find which, below
            else:
                self.results.update(zip(ranks, values, strict=True))
                self._stream(ranks)
                return ranks, []
        ok: list[int] = []
        bad = []
        for r, n, e in zip(ranks, lens, ends, strict=True):
            if self.answered(r):
                continue
            try:
                self.results[r] = _loads(view[e - n : e]) if n else None
                ok.append(r)
            except Exception as exc:
                self.failures[r] = RankFailure(
                    "error", f"its result could not be unpickled on the controller: {type(exc).__name__}: {exc}")
                bad.append(r)
        self._stream(ok + bad)
        return ok, bad

    def _garbled(self, ranks: list[int], why: str) -> list[int]:
        """Fail the ranks of a column that does not add up; returns those newly failed."""
        bad = [r for r in ranks if not self.answered(r)]
        for r in bad:
            self.failures[r] = RankFailure("error", f"its answer arrived garbled from its agent ({why})")
        self._stream(bad)
        return bad

    def _stream(self, ranks: list[int]) -> None:
        """Tell the streaming consumer (if any) about these ranks' answers."""
        if self.on_result is None:
            return
        for r in ranks:
            ok = r in self.results
            self.on_result(r, ok, self.results[r] if ok else self.failures[r])

    def record(
        self,
        item: dict[str, Any],
        signed: list[Any],
        data: list[Any],
        mesh_token: str,
        on_release: Callable[[str], None] | None = None,
    ) -> bool:
        """One rank's answer (an item of a "results" message). Returns True when it is a real
        failure (not an interruption), which fail-fast acts on. `on_release(path)` hands a
        shared-memory file back to the rank once its map here is garbage (see `shm.Segments`)."""
        r = item["r"]
        if "cc" in item:
            self.collectives[r] = item["cc"]
        if item["ok"] and "v" in item:  # a scalar, in the header
            self.results[r] = item["v"]
        elif item["ok"]:
            try:
                if "shm" in item:
                    data = shm.restore(data, item["shm"], mesh_token, unlink=True, on_release=on_release)
                self.results[r] = serialize.loads(signed[0], data) if signed else None
            except Exception as exc:
                self.failures[r] = RankFailure(
                    "error", f"its result could not be unpickled on the controller: {type(exc).__name__}: {exc}"
                )
        else:
            kind, summary = item.get("kind", "error"), item.get("summary", "failed")
            tb, etype = item.get("tb", ""), item.get("etype", "")
            if self.called_off and kind == "error" and etype == "CollectiveError":
                # Cut by a member that the cancel reached first (they go out rank by rank, and
                # each aborts what it waits in): not a failure of its own, whatever broke first.
                kind, tb, etype = "interrupted", "", ""
            if kind == "interrupted" and self.stop_reason and self.cancelled:
                summary = self.stop_reason
            if item.get("where"):
                summary += f" (at {item['where']})"
            self.failures[r] = RankFailure(kind, summary, tb, etype)
        self._stream([r])
        return r in self.failures and self.failures[r].kind != "interrupted"

    def untold(self) -> list[list[Any]]:
        """``[rank, {group: collectives started}]`` for each rank that answered since the
        ranks still running were last told (and marks them told); ``[rank, None]`` for one
        that died (how far it got is unknown, and no collective of it can end now)."""
        new = [r for r in (*self.results, *self.failures) if r not in self.told]
        self.told.update(new)
        return [[r, None if r in self.failures and self.failures[r].kind == "died" else self.collectives.get(r, {})]
                for r in sorted(new)]

    def give_up_on_missing(self) -> None:
        """The grace after a stop is over: the ranks still busy are reported as such."""
        why = f"did not stop within {STOP_GRACE_S} s {self.stuck_hint}" if self.cancelled else NOT_WAITED_FOR
        for r in self.missing():
            self.failures[r] = RankFailure("interrupted", f"{self.stop_reason}; {why}")

    def resolve(self) -> None:
        """Settle the future: a ValueMesh, or one MeshError grouping every failure."""
        if self.failures:
            hint = self.died_hint if any(f.kind == "died" for f in self.failures.values()) else ""
            self.future._set_exception(MeshError(self.label, dict(self.failures), dict(self.results), hint))
        else:
            self.future._set_result(ValueMesh._adopt(self.shape, self.results))


@dataclass
class Query:
    """A control request answered by every targeted rank (stacks, stats)."""

    expected: set[Any]  # rank ids, and ("agent", host) for questions agents answer too
    deadline: float
    replies: dict[Any, Any] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
