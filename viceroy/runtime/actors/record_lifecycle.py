"""An actor mesh's lifecycle on the controller, as the `RecordLifecycle` mixin of
`registry.ActorRecord`: marking its actors live, failed or stopped; spawning them (all or
nothing, the first time), dropping them when no handle is left, restarting the failed ones, and
hearing of their ranks' deaths. Sending calls to them is `registry`'s; stopping them `stopping`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from viceroy.runtime.actors.stopping import Stopping
from viceroy.runtime.actors.supervision import ActorFailure, deliver
from viceroy.runtime.arguments import check_seconds
from viceroy.runtime.errors import MeshError
from viceroy.runtime.future import Future
from viceroy.runtime.shape import Shape, describe_ranks

if TYPE_CHECKING:
    from viceroy.runtime.actors.registry import ActorRecord


class RecordLifecycle(Stopping):
    spawn_msg: tuple[dict[str, Any], list[Any], list[Any]]
    reasons: dict[int, str]
    unhandled: list[ActorFailure]
    _inflight: dict[int, set[int]]

    # --- lifecycle -----------------------------------------------------------------------------

    def mark(self, ranks: list[int], status: str, reason: str = "") -> None:
        with self._lock:
            for r in ranks:
                self.status[r] = status
                if reason:
                    self.reasons[r] = reason
                else:
                    self.reasons.pop(r, None)

    def spawn_on(self, ranks: list[int], timeout: float | None, all_or_nothing: bool) -> None:
        """Construct the actor on `ranks`. all_or_nothing (a first spawn): when some fail, stop
        the others too, so nothing half-made lingers; else (a restart) keep those that came up."""
        extra, signed, data = self.spawn_msg
        shape = self.shape if list(ranks) == list(self.shape.ranks) else self.shape.select(ranks)
        fut = self.controller.submit("actor", shape, extra, signed, data,
                                     label=f"spawn {self.name}", fail_fast=False, timeout=timeout)
        try:
            fut.get()
        except BaseException as exc:  # a MeshError, or an interrupt (the call is cancelled first)
            err = exc if isinstance(exc, MeshError) else _settled_error(fut)
            made = list(err.partial) if err is not None else []
            # Ranks that never answered (given up on, or the call not settled) may still be
            # constructing it: a stop queued behind the construction ends it there.
            unsure = list(ranks) if err is None else [
                r for r, f in err.failures.items() if f.kind in ("interrupted", "timeout")]
            self.mark(made, "live")
            for r, failure in (err.failures.items() if err is not None else ()):
                self.mark([r], "failed", f"spawning it failed: {failure.summary}")
            if all_or_nothing:
                if made:
                    self.stop(Shape({"ranks": len(made)}, made))
                if unsure and not self.controller.closed:
                    self.controller.send_oneway("actor", unsure, {"a": "stop", "actor": self.info.id})
            raise
        self.mark(ranks, "live")

    def drop(self) -> None:
        """No handle is left: stop every live actor without waiting (on the IO thread). Calls
        sent before are answered first (each actor handles its messages in order)."""
        with self._lock:
            live = [r for r in self.shape.ranks if self.status[r] == "live"]
            for r in self.shape.ranks:
                self.status[r] = "stopped"
        try:
            self.oneway.flush()
            if live:
                # "drain": what was sent before runs to its end (a broadcast's async endpoint too)
                self.controller.send_oneway("actor", live, {"a": "stop", "actor": self.info.id, "drain": True})
        except Exception:  # the mesh closed meanwhile: its ranks are gone with their actors
            pass

    def restart(self, shape: Shape, timeout: float) -> list[int]:
        """Respawn the failed actors of `shape`; -> their ranks. Raises (restarting nothing)
        when some of them were stopped: a stop is final."""
        timeout = check_seconds(timeout, none=None)  # before a dead rank is restarted
        if self.controller.closed:
            raise self.controller.closed_error(f"actor mesh {self.label(shape)}")
        with self._lock:
            failed = [r for r in shape.ranks if self.status[r] == "failed"]
            stopped = [r for r in shape.ranks if self.status[r] in ("stopped", "stopping")]
        if stopped:
            others = (f" Its failed actors ({describe_ranks(failed)}) restart through a slice or select of it "
                      "without the stopped ones." if failed else "")
            raise RuntimeError(
                f"restart() respawns actors that failed, but actor mesh {self.label(shape)} was stopped on "
                f"{describe_ranks(stopped)} (a stop is final), so nothing was restarted.{others} For new actors: "
                f"mesh.spawn({self.name}, ...)")
        if not failed:
            return []
        states = self.controller.states()
        dead = [r for r in failed if states[r] == "dead"]
        if dead:
            self.controller.restart(dead, timeout)
        self.spawn_on(failed, timeout, all_or_nothing=False)
        with self._lock:
            self.unhandled = [f for f in self.unhandled if not set(f.ranks) <= set(failed)]
        return failed

    def unhandled_on(self, shape: Shape) -> list[ActorFailure]:
        ranks = set(shape.ranks)
        with self._lock:
            return [f for f in self.unhandled if ranks & set(f.ranks)]

    def failed_on(self, shape: Shape) -> dict[int, str]:
        with self._lock:
            return {r: self.reasons.get(r, "failed") for r in shape.ranks if self.status[r] == "failed"}

    def describe(self, shape: Shape) -> str:
        if self.controller.closed:  # whatever they were, its actors are gone with their ranks
            return "its mesh was shut down"
        with self._lock:
            counts: dict[str, int] = {}
            for r in shape.ranks:
                counts[self.status[r]] = counts.get(self.status[r], 0) + 1
        return ", ".join(f"{n} {s}" for s, n in counts.items())

    def on_rank_exit(self, rank: int, reason: str) -> None:
        with self._lock:
            if self.status.get(rank) != "live":
                return
            self.status[rank] = "failed"
            restarted = reason == "restarted"  # mesh.restart(): the user knows; no report printed
            self.reasons[rank] = "its rank was restarted" if restarted else f"its rank died ({reason})"
            caller_knows = restarted or any(rank in p for p in self._inflight.values())
        deliver(cast("ActorRecord", self), ActorFailure(self.label(self.shape), (rank,), "died", f"died ({reason})"), caller_knows)


def _settled_error(fut: Future[Any]) -> MeshError | None:
    """The MeshError a cancelled call settled with, if it has (None if it has not yet)."""
    if not fut.done():
        return None
    exc = fut.exception()
    return exc if isinstance(exc, MeshError) else None
