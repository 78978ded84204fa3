"""How the calls in flight end: answers recorded (one rank's, or a host's in columns), ranks
coming up or dying (and replaced), deadlines and cancels, and the late answers of calls already
given up on.

A mixin of `Controller`, which owns the state declared here and runs these on its IO thread
(`_stop` and `_set_state` also from callers' threads, under the lock).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from viceroy.runtime import crossing, deaths, shm
from viceroy.runtime.calls import STOP_GRACE_S, Call, Query
from viceroy.runtime.errors import RankFailure
from viceroy.runtime.logs import RankLogs
from viceroy.runtime.shape import describe_ranks, expand_runs, rank_runs
from viceroy.runtime.wire import Signer

Event = dict[str, Any]

# A call answered by some ranks for this long: the others are told who finished (see
# call_peers), so one waiting in a collective for a rank that left without it stops waiting.
# Of a rank that died they are told at once.
PEERS_DONE_AFTER_S = 1.0

# A rank that crashed in native code: faulthandler wrote its Python stacks to its output.
_CRASHES = frozenset({"SIGSEGV", "SIGBUS", "SIGFPE", "SIGABRT"})
_STACKS_HINT = " (its Python stacks are in its output: mesh.logs({r}) / %mesh logs {r})"


class CallOutcomes:
    signer: Signer
    token: str
    logs: RankLogs
    _lock: threading.RLock
    _changed: threading.Condition
    _calls: dict[int, Call]
    _queries: dict[int, Query]
    _state: dict[int, str]
    _dead: set[int]
    _stuck: dict[int, dict[int, bool]]
    _exit_reason: dict[int, str]
    _never_ready: set[int]
    _pids: dict[int, int]
    _returns: shm.Returns
    _lender: shm.Lender
    _listeners: list[Callable[[Event], None]]

    def _to_ranks(self, ranks: Sequence[int], frames: list[Any], control: bool = False) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        raise NotImplementedError

    def _emit(self, event: Event) -> None:
        raise NotImplementedError

    def _stop(self, call: Call, reason: str, cancel: bool = True, failed: bool = False) -> None:
        """Cancel a call on the ranks that have not answered (`cancel` False: only stop waiting
        for them); those still busy after STOP_GRACE_S are given up on (see `_check_deadlines`).
        `failed`: for a rank's failure (fail-fast), not called off. Caller holds the lock."""
        if call.stop_reason is not None and (call.cancelled or not cancel):
            return
        if call.stop_reason is None:
            call.stop_deadline = time.monotonic() + STOP_GRACE_S
            call.called_off = cancel and not failed
        call.stop_reason = reason  # a cancel (Ctrl-C) after giving up on them still goes out
        call.cancelled = cancel
        missing = [r for r in call.missing() if self._state[r] != "dead"]
        if missing and cancel:
            frames = self.signer.pack({"op": "cancel", "id": call.id, "ranks": rank_runs(missing)})
            self._to_ranks(missing, frames, control=True)
        self._wake()

    def _next_deadline(self) -> float | None:
        if not self._deadlines_possible():
            return None
        now = time.monotonic()
        with self._lock:
            ds = [d for c in self._calls.values() for d in (c.deadline, c.stop_deadline, c.notice_at) if d]
            ds += [q.deadline for q in self._queries.values()]
        return max(0.0, min(ds) - now) if ds else None

    def _deadlines_possible(self) -> bool:
        return bool(self._queries) or any(c.deadline or c.stop_deadline or c.notice_at for c in self._calls.values())

    def _check_deadlines(self) -> None:
        if not self._deadlines_possible():
            return
        now = time.monotonic()
        done: list[Call] = []
        with self._lock:
            for call in list(self._calls.values()):
                if call.deadline and now >= call.deadline and call.stop_reason is None:
                    self._stop(call, f"timed out after {call.timeout} s")
                if call.notice_at and now >= call.notice_at:
                    call.notice_at = None
                    self._tell_peers_done(call)
                if call.stop_deadline and now >= call.stop_deadline:
                    for r in call.missing():  # still busy with it: "running" until it answers
                        self._stuck.setdefault(r, {})[call.id] = call.on_main_thread
                    call.give_up_on_missing()
                    done.append(call)
            for qid, q in list(self._queries.items()):
                if now >= q.deadline:
                    q.done.set()
                    del self._queries[qid]
        for call in done:
            self._finish(call)

    def _on_results(self, header: dict[str, Any], signed: list[Any], data: list[Any]) -> None:
        si = di = 0
        finished: list[Call] = []
        events: list[Event] = []
        with self._lock:
            call = self._calls.get(header["id"])
            if call is None and self._stuck:
                self._late_answer(header)
            if "vals" in header and call is not None:  # an agent's scalar results, in a column
                ok = call.record_scalars(expand_runs(header["vals"][0]), header["vals"][1])
                if ok:
                    events.append({"type": "ranks_done", "call": call.id, "ranks": ok})
            if "done" in header:  # its other plain successes, in columns (see answers.aggregate)
                si = 1
                if call is not None:
                    ok, bad = call.record_packed(expand_runs(header["done"]), header.get("packed"), signed[0])
                    if ok:
                        events.append({"type": "ranks_done", "call": call.id, "ranks": ok})
                    for r in bad:
                        f = call.failures[r]
                        events.append({"type": "rank_done", "call": call.id, "rank": r, "ok": False,
                                       "kind": f.kind, "summary": f.summary, "tb": f.traceback})
            for item in header["items"]:
                r, ns, nd = item["r"], item.get("signed", 0), len(item.get("lens", []))
                sig, dat = signed[si : si + ns], data[di : di + nd]
                si, di = si + ns, di + nd
                if "released" in item:  # pushed files it let go of
                    self._lender.released(r, item["released"])
                if call is None or call.answered(r):
                    for entry in item.get("shm", []):  # a late answer: its files go straight back
                        self._returns.released(r, entry[1])
                    continue
                if call.record(item, sig, dat, self.token, functools.partial(self._returns.released, r)) and call.fail_fast:
                    self._stop(call, f"stopped by fail-fast after rank {r} failed", failed=True)
                done: Event = {"type": "rank_done", "call": call.id, "rank": r, "ok": r in call.results}
                if r in call.failures:  # how it failed, for views of the mesh
                    f = call.failures[r]
                    done.update(kind=f.kind, summary=f.summary, tb=f.traceback)
                events.append(done)
            if call is not None and call.complete():
                finished.append(call)
            elif call is not None and call.stop_reason is None:
                if call.told:
                    self._tell_peers_done(call)  # told before: tell of the new ones at once
                elif call.notice_at is None:
                    call.notice_at = time.monotonic() + PEERS_DONE_AFTER_S
        if self._listeners:
            for ev in events:
                self._emit(ev)
        for c in finished:
            self._finish(c)

    def _tell_peers_done(self, call: Call) -> None:
        """Tell the ranks still running `call` which ranks finished it. Caller holds the lock."""
        done = call.untold()
        missing = [r for r in call.missing() if self._state[r] != "dead"]
        if done and missing:
            frames = self.signer.pack({"op": "peers_done", "id": call.id, "ranks": rank_runs(missing), "done": done})
            self._to_ranks(missing, frames, control=True)

    def _tell_settled(self, call: Call) -> None:
        """Tell the ranks a main-thread call failed on that it has ended everywhere: each holds
        its next collective until then (see settling.failed)."""
        if not call.failures or not call.on_main_thread:
            return
        with self._lock:
            failed = [r for r in call.failures if self._state.get(r) != "dead"]
        if failed:
            self._to_ranks(failed, self.signer.pack({"op": "settled", "id": call.id, "ranks": rank_runs(failed)}),
                           control=True)

    def _tell_peers_soon(self, call: Call) -> None:
        """Tell the ranks still running `call` of a death at the end of this IO round, once for
        every rank that died in it (a lost host's, say), so they all stop with the same words.
        Caller holds the lock."""
        call.notice_at = time.monotonic()
        self._wake()

    def _on_rank_exit(self, r: int, reason: str, respawning: bool, pid: int | None = None) -> None:
        self._on_ranks_exit([r], reason, respawning, pid)

    def _on_ranks_exit(
        self, ranks: Sequence[int], reason: str, respawning: bool = False, pid: int | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """`ranks` exited (`pid`: the process of the one rank, if known): their calls fail for
        them. `then` runs under the lock once all their states changed, before anyone waiting
        on them wakes: what it publishes (a lost host) is never seen with the ranks half dead."""
        whys = {r: deaths.explain(reason, functools.partial(self.logs.tail, r, 60)) for r in ranks}  # last words came first
        exited: list[int] = []
        finished: list[Call] = []
        with self._changed:
            for r in ranks:
                if pid is not None and self._pids.get(r) not in (None, pid):
                    continue  # a process already replaced (see `_on_rank_ready`): the new one is up
                exited.append(r)
                if pid is not None and r not in self._pids and not respawning:
                    self._never_ready.add(r)  # a process that never said hello (a restart's new one) died
                finished += self._exited(r, reason, respawning, whys[r])
            if then is not None:
                then()
            self._changed.notify_all()
        for r in exited:
            self._emit({"type": "rank_exit", "rank": r, "reason": reason})
        for c in finished:
            self._finish(c)

    def _exited(self, r: int, reason: str, respawning: bool, why: str | None) -> list[Call]:
        """Rank `r`'s process is gone: its calls fail there; -> those now complete. One that a
        death ends (`Call.death_ends`) stops waiting for the others (they end it STOP_GRACE_S
        later at most, see `_check_deadlines`). Caller holds the lock."""
        finished = []
        self._set_state(r, "starting" if respawning else "dead")
        self._stuck.pop(r, None)
        self._exit_reason[r] = reason
        self._pids.pop(r, None)
        self._lender.gone(r)  # what it mapped went with it
        for call in list(self._calls.values()):
            if r in call.shape.ranks and not call.answered(r):
                call.failures[r] = (RankFailure("interrupted", "restarted while it ran") if reason == "restarted"
                                    else RankFailure("died", f"died ({reason})" + (f": {why}" if why else "")
                                                     + (_STACKS_HINT.format(r=r) if reason in _CRASHES else "")))
                if call.fail_fast:
                    self._stop(call, f"stopped by fail-fast after rank {r} died", failed=True)
                if not call.missing():
                    finished.append(call)
                elif call.stop_reason is None:  # peers waiting in a collective for it stop
                    self._tell_peers_soon(call)
                    if call.death_ends:  # the others run on; the caller hears of it now
                        how = "was restarted" if reason == "restarted" else "died"
                        self._stop(call, f"not waited for after rank {r} {how}", cancel=False)
        return finished

    def _on_rank_ready(self, r: int, pid: int) -> None:
        ended: list[Call] = []
        with self._changed:
            replaced = self._pids.get(r) not in (None, pid)
            if replaced:
                # The new process is up before the agent's word that the old one exited (direct
                # mode: two channels; only a restart respawns): the old one's calls are over.
                ended = self._exited(r, "restarted", True, "")
            self._set_state(r, "idle")
            self._pids[r] = pid
            self._exit_reason.pop(r, None)
            self._never_ready.discard(r)
            self._changed.notify_all()
        if replaced:  # the agent's late word is dropped (its pid is not this one's)
            self._emit({"type": "rank_exit", "rank": r, "reason": "restarted"})
        for call in ended:
            self._finish(call)
        self._emit({"type": "rank_ready", "rank": r, "pid": pid})

    def _late_answer(self, header: dict[str, Any]) -> None:
        """A call given up on (see `_check_deadlines`) was answered after all: those ranks are
        free again. Caller holds the lock."""
        ranks = [item["r"] for item in header["items"]]
        for key in ("vals", "done"):
            if key in header:
                ranks += expand_runs(header[key][0] if key == "vals" else header[key])
        for r in ranks:
            calls = self._stuck.get(r)
            if calls is not None:
                calls.pop(header["id"], None)
                if not calls:
                    del self._stuck[r]

    def _check_crossing(self, call: Call) -> None:
        """Fail the ranks whose collectives crossed out of `call` into calls queued behind it,
        or met such (see crossing.py); cancel those calls on the groups' ranks."""
        if call.distrust:
            self._distrust(call, crossing.distrusted(call, call.distrust))
        groups = crossing.crossed(call)
        if not groups:
            return
        for bad in groups.values():
            self._distrust(call, bad)
        ranks = {r for g in groups for r in crossing.members(g)}
        why = call.label
        with self._lock:
            behind = [c for c in self._calls.values()
                      if c.id > call.id and c.queue == call.queue and not ranks.isdisjoint(c.shape.ranks)]
            for c in behind:
                c.distrust.update(dict.fromkeys(groups, why))
                self._stop(c, f"cancelled: the collectives of {why}, queued before it, crossed out of that call "
                              f"into the calls behind it on {describe_ranks(sorted(ranks))}")

    @staticmethod
    def _distrust(call: Call, bad: dict[int, RankFailure]) -> None:
        for r, failure in bad.items():
            call.results.pop(r, None)
            call.failures[r] = failure

    def _set_state(self, r: int, state: str) -> None:
        """Caller holds the lock."""
        self._state[r] = state
        if state == "dead":
            self._dead.add(r)
        else:
            self._dead.discard(r)

    def _finish(self, call: Call) -> None:
        with self._lock:
            if self._calls.pop(call.id, None) is None:
                return
        shm.discard(call.shm_paths)  # every rank has mapped it, or never will
        self._tell_settled(call)
        if call.collectives and call.results:
            self._check_crossing(call)
        self.logs.flush()
        self._emit({"type": "call_finished", "call": call.id, "ok": not call.failures})
        # Resolving the future wakes the caller: do it last, so this thread does not hold the
        # GIL against it right after.
        call.resolve()
