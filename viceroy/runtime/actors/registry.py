"""The controller's side of actors: one `Registry` per mesh, one `ActorRecord` per spawned
actor mesh. Records know which actors live, are stopped or failed, how many calls each has in
flight (for `choose`; calls given up on count until they end there), and relay the requests
ranks send for actor meshes they were given (failing at once a wait for one that closes a
cycle of waits between actors, see `cycles`).
Stopping them (`stop()`, and at the mesh's shutdown) is in `stopping`; marking, spawning,
restarting them and hearing of their deaths in `record_lifecycle`."""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

from viceroy.runtime import serialize
from viceroy.runtime.actors import plain
from viceroy.runtime.actors.actor_mesh import ActorMesh, ActorMeshInfo, OnResult, failed_future
from viceroy.runtime.actors.answers import GIVE_UP, ONEWAY_ERROR, OW_DONE, OW_WAIT, REQUEST, WAIT
from viceroy.runtime.actors.cycles import Waits
from viceroy.runtime.actors.oneway import Oneway
from viceroy.runtime.actors.record_lifecycle import RecordLifecycle
from viceroy.runtime.actors.stopping import PendingStop, stop_all
from viceroy.runtime.actors.supervision import ActorFailure, deliver
from viceroy.runtime.call_peers import STOPPED
from viceroy.runtime.controller import Controller, Event
from viceroy.runtime.errors import MeshError, RankFailure
from viceroy.runtime.future import Future
from viceroy.runtime.shape import Shape, describe_ranks, format_rank_set
from viceroy.runtime.values import ValueMesh

_SENT: Future[Any] = Future()  # what a broadcast returns: sent, nothing to wait for
_SENT._set_result(None)


# What a MeshError for a dead rank says to do, for calls on actors (restarting ranks is not enough).
_DIED_HINT = ("restart() on the actor mesh brings back the dead ranks and respawns their actors "
              "(mesh.restart alone brings back no actor); the other actors keep their state.")


class ActorRecord(RecordLifecycle):
    """The controller's state of one spawned actor mesh (shared by all its views)."""

    def __init__(self, controller: Controller, info: ActorMeshInfo, shape: Shape, owner: Any,
                 spawn_msg: tuple[dict[str, Any], list[Any], list[Any]]) -> None:
        self.controller = controller
        self.info = info
        self.shape = shape
        self.owner = owner
        self.spawn_msg = spawn_msg  # to respawn failed actors with the same arguments
        self.status: dict[int, str] = dict.fromkeys(shape.ranks, "starting")  # live|stopped|failed
        self.reasons: dict[int, str] = {}
        self.unhandled: list[ActorFailure] = []
        self._inflight: dict[int, set[int]] = {}  # calls waited on -> the actors that owe an answer
        # Calls given up on (interrupted, a sync endpoint runs on) -> the actors still running
        # them: busy for `choose` until they answer (see `_forget_answered`).
        self._given_up: dict[int, set[int]] = {}
        self._keys = itertools.count()
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._stops: list[PendingStop] = []
        self.oneway = Oneway(controller, info.id)  # broadcasts, coalesced

    def label(self, shape: Shape) -> str:
        return f"{self.name} ({shape.describe()})"

    # --- calls ---------------------------------------------------------------------------------

    def pack(self, args: tuple[Any, ...], kwargs: dict[str, Any], qualname: str) -> tuple[list[Any], list[Any]]:
        refs: list[Any] = []
        try:
            payload, bufs = plain.dumps((args, kwargs), seen_refs=refs)
        except Exception:
            serialize.check_picklable({f"{qualname} argument {i}": a for i, a in enumerate(args)}
                                      | {f"{qualname} argument {k!r}": v for k, v in kwargs.items()})
            raise
        for ref in refs:
            ref.check_usable_on(self.controller, self.shape)
        return [payload], [b.raw() for b in bufs]

    def check_callable(self, shape: Shape, adverb: str = "call") -> None:
        """Raise when actors of `shape` are stopped (for choose: when all that run are), naming
        those that still run."""
        if self.controller.closed:
            raise self.controller.closed_error(f"actor mesh {self.label(shape)}")
        with self._lock:
            stopped = [r for r in shape.ranks if self.status[r] in ("stopped", "stopping")]
            stopping = [r for r in stopped if self.status[r] == "stopping"]
            live = [r for r in shape.ranks if self.status[r] == "live"]
        if stopped and not (adverb == "choose" and live):  # choose picks among those that run
            state = (f"is stopping (still busy on {format_rank_set(stopping)})" if stopping
                     else "was stopped")
            others = (f"its actors on {describe_ranks(live)} still run: call them through a slice or select of "
                      f"it (actors.select({live})), or " if live else "")
            raise RuntimeError(
                f"actor mesh {self.label(shape)} {state} ({'rank' if len(stopped) == 1 else 'ranks'} "
                f"{format_rank_set(stopped)}); {others}spawn a new one with mesh.spawn({self.name}, ...)"
            )

    def send(self, shape: Shape, endpoint: str, adverb: str, signed: list[Any], data: list[Any],
             on_result: OnResult | None = None, fields: dict[str, Any] | None = None) -> Future[Any]:
        """One message per actor of `shape`. The arguments are pickled in `signed`/`data`, or
        inline in the header (`fields`, see plain.inline)."""
        what = f"{self.name}.{endpoint}" + ("" if adverb == "call" else f" ({adverb})")
        if adverb == "choose" and self._given_up:
            self._forget_answered()
        with self._lock:
            if adverb == "choose":
                live = [r for r in shape.ranks if self.status[r] == "live"]
                if live:
                    load = {r: sum(r in p for p in (*self._inflight.values(), *self._given_up.values())) for r in live}
                    least = min(load.values())
                    idle = [r for r in live if load[r] == least]
                    shape = shape.select([idle[next(self._turn) % len(idle)]])
            gone = {r: self.reasons.get(r, "failed") for r in shape.ranks if self.status[r] != "live"}
            if not gone and adverb != "broadcast":
                key = next(self._keys)
                pending = self._inflight[key] = set(shape.ranks)
        if gone:
            n = len(shape)
            others = "" if len(gone) == n else (
                f" to any of its {n} actors; the others answer through a slice or select of it")
            fut = failed_future(
                what, {r: RankFailure("unavailable", f"its actor is gone: {why}") for r, why in gone.items()},
                f"Nothing was sent{others}. restart() on the actor mesh respawns failed actors.", total=n,
            )
            if adverb == "broadcast":  # no future carries it: say so now
                fut.get()
            return fut
        if adverb == "broadcast":
            self.oneway.send(tuple(shape.ranks), endpoint, signed, data)
            return _SENT
        self.oneway.flush()  # queued broadcasts to these actors go first

        def result(rank: int, ok: bool, value: Any) -> None:
            with self._lock:
                pending.discard(rank)
            if on_result is not None:
                on_result(rank, ok, value)

        extra = {"a": "call", "actor": self.info.id, "ep": endpoint, **(fields or {})}
        # A death ends the call at once (after the grace of a stop): the others run on, their
        # answers are dropped when they come; one actor's error, though, waits for the others.
        fut = self.controller.submit("actor", shape, extra, signed, data, label=what, fail_fast=False,
                                     on_result=result, died_hint=_DIED_HINT, death_ends=True)
        fut.what = what  # a timeout in get() names the endpoint, not "call 5"

        def finished(f: Future[Any]) -> None:
            with self._lock:
                self._inflight.pop(key, None)
                if pending:  # given up on where it still runs (answers came to `result`): still busy there
                    self._given_up[f.call_id] = pending

        fut.add_done_callback(finished)
        return fut

    def _forget_answered(self) -> None:
        """The actors that answered a call given up on since (or whose rank died) are free
        again. The controller is asked outside our lock: its IO thread takes ours under its own."""
        with self._lock:
            calls = list(self._given_up)
        running = {call_id: self.controller.still_running(call_id) for call_id in calls}
        with self._lock:
            for call_id, ranks in running.items():
                if (busy := self._given_up.get(call_id)) is not None:
                    busy &= ranks
                    if not busy:
                        del self._given_up[call_id]

    def on_oneway_error(self, rank: int, endpoint: str, summary: str, tb: str) -> None:
        deliver(self, ActorFailure(self.label(self.shape), (rank,), "error", f"{self.name}.{endpoint}: {summary}", tb),
                False)

    def supervise(self, shape: Shape, failure: ActorFailure) -> Future[Any]:
        """Run ``__supervise__(failure)`` on these (owner) actors; -> ValueMesh of what they returned."""
        with self._lock:
            live = [r for r in shape.ranks if self.status[r] == "live"]
        if not live:
            return failed_future(f"{self.name}.__supervise__", {
                r: RankFailure("unavailable", "the owner's actor is gone") for r in shape.ranks})
        signed, data = self.pack((failure,), {}, f"{self.name}.__supervise__")
        self.oneway.flush()
        return self.controller.submit("actor", Shape({"ranks": len(live)}, live),
                                      {"a": "supervise", "actor": self.info.id}, signed, data,
                                      label=f"{self.name}.__supervise__", fail_fast=False)


class Registry:
    """Every actor mesh of one controller: the `Client` of controller-side actor meshes."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.records: dict[str, ActorRecord] = {}
        self._ids = itertools.count(1)
        self._unsubscribe: Callable[[], None] = controller.subscribe(self._on_event)
        # Controller-side handles alive per actor mesh. An actor mesh whose last handle is
        # garbage, and that was never pickled (sent to ranks, given as an owner), is stopped:
        # rerunning `a = mesh.spawn(A)` cost every rank a thread and 3 fds per run, forever.
        self._handles: dict[str, int] = {}
        self._shared: set[str] = set()
        self._handles_lock = threading.Lock()
        self.waits = Waits(controller.unanswered, self._name_of)  # requests relayed, actors blocked on them

    def _name_of(self, actor_id: str) -> str:
        record = self.records.get(actor_id)
        return record.name if record is not None else actor_id

    def new_id(self, name: str) -> str:
        return f"{name}-{next(self._ids)}"

    def invoke(self, info: ActorMeshInfo, shape: Shape, endpoint: str, adverb: str,
               args: tuple[Any, ...], kwargs: dict[str, Any], on_result: OnResult | None = None) -> Future[Any]:
        record = self.control(info)
        record.check_callable(shape, adverb)
        fields = plain.inline(args, kwargs) if adverb != "broadcast" else None  # broadcasts batch pickles
        if fields is not None:
            return record.send(shape, endpoint, adverb, [], [], on_result, fields)
        signed, data = record.pack(args, kwargs, f"{record.name}.{endpoint}")
        return record.send(shape, endpoint, adverb, signed, data, on_result)

    def control(self, info: ActorMeshInfo) -> ActorRecord:
        return self.records[info.id]

    def mesh(self, info: ActorMeshInfo, shape: Shape) -> ActorMesh:
        m = ActorMesh(info, shape, self)
        with self._handles_lock:
            self._handles[info.id] = self._handles.get(info.id, 0) + 1
        # The callback only queues (it may run in the middle of anything, locks held).
        fin = weakref.finalize(m, self.controller.call_soon, functools.partial(self._dropped, info.id))
        fin.atexit = False
        return m

    def shared(self, info: ActorMeshInfo) -> None:
        with self._handles_lock:
            self._shared.add(info.id)

    def _dropped(self, actor_id: str) -> None:
        """A controller-side handle is gone (on the IO thread): after the last one, stop the
        actors and forget them, unless the mesh may be held elsewhere."""
        with self._handles_lock:
            left = self._handles.get(actor_id, 1) - 1
            if left > 0:
                self._handles[actor_id] = left
                return
            self._handles.pop(actor_id, None)
            if actor_id in self._shared:
                return
            record = self.records.pop(actor_id, None)
        if record is not None and not self.controller.closed:
            record.drop()

    def stop_all(self) -> None:
        """As the mesh shuts down: stop every live actor mesh (see `stopping.stop_all`)."""
        stop_all(list(self.records.values()), self.controller)

    # --- events (controller IO thread) -------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        if event["type"] == "rank_exit":
            for record in list(self.records.values()):
                record.on_rank_exit(event["rank"], event["reason"])
        elif event["type"] == "publish" and event["kind"] == REQUEST:
            self._on_request(event["rank"], event["data"])
        elif event["type"] == "publish" and event["kind"] == ONEWAY_ERROR:
            d = event["data"]
            failed = self.records.get(d["actor"])
            if failed is not None:
                failed.on_oneway_error(d["rank"], d["ep"], d["summary"], d["tb"])
        elif event["type"] == "publish" and event["kind"] == WAIT:
            try:
                self._on_wait(event["rank"], event["data"])
            except Exception:  # the mesh closed meanwhile; never break the IO thread
                if not self.controller.closed:
                    raise
        elif event["type"] == "publish" and event["kind"] == GIVE_UP:
            relay = self.waits.relay_of(event["rank"], event["data"]["req"])
            if relay is not None and not self.controller.closed:
                self.controller.cancel(relay.call, f"cancelled: the endpoint on rank {relay.rank} that awaited it "
                                                   "gave up (its task was cancelled)")
        elif event["type"] == "publish" and event["kind"] in (OW_WAIT, OW_DONE):
            try:
                self._on_oneway_peers(event["rank"], event["kind"], event["data"])
            except Exception:  # the mesh closed meanwhile; never break the IO thread
                if not self.controller.closed:
                    raise

    def _on_oneway_peers(self, rank: int, kind: str, d: dict[str, Any]) -> None:
        """A rank waits in a collective of a broadcast (OW_WAIT): ask the members it names
        whether they finished it; those whose actor died (None) or was stopped (STOPPED: its
        rank no longer has it, and would never answer) are said so at once. A member finished
        it (OW_DONE): tell the rank that asked, with the collectives it started."""
        record = self.records.get(d["actor"])
        if record is None:
            return
        if kind == OW_DONE:
            self.controller.send_oneway("actor", [d["asker"]], {"a": "ow_peers", "ow": d["ow"],
                                                                "done": [[rank, d["cc"]]]})
            return
        members = [r for r in d["members"] if r in record.status]
        gone = {r: None if record.status[r] == "failed" else STOPPED
                for r in members if record.status[r] in ("failed", "stopped")}
        if gone:
            self.controller.send_oneway("actor", [rank], {"a": "ow_peers", "ow": d["ow"],
                                                          "done": [[r, how] for r, how in gone.items()]})
        if asked := [r for r in members if r not in gone]:
            question = {"a": "ow_status", "actor": d["actor"], "ow": d["ow"], "asker": rank}
            if "cc" in d:  # the asker finished it (see actors/host.py)
                question["asker_cc"] = d["cc"]
            self.controller.send_oneway("actor", asked, question)

    def _on_request(self, from_rank: int, req: dict[str, Any]) -> None:
        """A rank calls an actor mesh it was given: send it on, and the outcome back."""
        record = self.records.get(req["actor"])
        if record is None:
            self._reply(from_rank, req, ("raise", RuntimeError(f"actor mesh {req['name']} is unknown to this mesh")))
            return
        try:
            record.check_callable(Shape(req["dims"], req["ranks"]), req["adverb"])
            fut = record.send(Shape(req["dims"], req["ranks"]), req["ep"], req["adverb"], [req["args"]],
                              req["bufs"])
        except Exception as exc:
            self._reply(from_rank, req, ("raise", exc))
            return
        if req["adverb"] != "broadcast":
            spec = record.info.endpoints.get(req["ep"])
            relay = self.waits.relayed(from_rank, req["req"], record.info.id, f"{record.name}.{req['ep']}",
                                       fut.call_id, spec is not None and spec.concurrent)

            def reply(f: Future[Any]) -> None:
                if self.waits.replying(relay):  # not failed already, for closing a cycle of waits
                    self._reply(from_rank, req, _outcome(f))

            fut.add_done_callback(reply)

    def _on_wait(self, rank: int, d: dict[str, Any]) -> None:
        """An endpoint that holds its actor blocks on a request (see `cycles`): when that closes
        a cycle of waits, its call is cancelled (dropped where it is still queued) and the
        request fails at once; the others then unwind."""
        found = self.waits.on_wait(rank, d)
        if found is None:
            return
        relay, why = found
        self.controller.cancel(relay.call, "cancelled: its caller waited in a cycle of waits between actors")
        self._reply(relay.rank, {"req": relay.req, "adverb": "call"}, ("raise", RuntimeError(why)))

    def _reply(self, rank: int, req: dict[str, Any], outcome: tuple[Any, ...]) -> None:
        if req["adverb"] == "broadcast" or self.controller.closed:
            return
        try:
            payload, bufs = serialize.dumps(outcome)
        except Exception as exc:  # e.g. a value that unpickled here but cannot pickle back
            payload, bufs = serialize.dumps(("raise", TypeError(f"the result cannot be sent to rank {rank}: {exc}")))
        self.controller.submit("actor", Shape({"ranks": 1}, [rank]), {"a": "reply", "req": req["req"]},
                               [payload], [b.raw() for b in bufs], label="actor reply", fail_fast=False)



def _outcome(f: Future[Any]) -> tuple[Any, ...]:
    exc = f.exception()
    if exc is None:
        vm: ValueMesh[Any] = f.get()
        return ("ok", vm)
    if isinstance(exc, MeshError):
        return ("mesh_error", exc.what, exc.failures, exc.partial, exc.hint)
    return ("raise", exc)


_by_token: weakref.WeakValueDictionary[str, Registry] = weakref.WeakValueDictionary()
_registries_lock = threading.Lock()


def registry_for(controller: Controller) -> Registry:
    # Kept on the controller itself (a cycle the collector frees with it), not in a global
    # table that would keep every controller ever started alive.
    with _registries_lock:
        reg: Registry | None = getattr(controller, "_actor_registry", None)
        if reg is None:
            reg = Registry(controller)
            controller._actor_registry = reg  # type: ignore[attr-defined]
            _by_token[controller.token] = reg
        return reg


def registry_for_token(token: str) -> Registry | None:
    return _by_token.get(token)
