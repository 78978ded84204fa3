"""Actor meshes used from a rank: an `ActorMesh` unpickled on a rank (passed to an actor, or in
an endpoint's arguments) gets a `RankClient`, which sends its calls to the controller as
requests; the controller sends them on like its own calls and replies to the rank, where
`resolve_reply` settles the waiting `Future` (``.get()`` in sync endpoints, ``await`` in async
ones). An endpoint (`running_endpoint`) that blocks on such a future tells the controller (WAIT,
see `_tell_wait`), which fails a wait that closes a cycle between actors (actors/cycles.py); one
that gives up awaiting it tells the controller too (GIVE_UP), which cancels the call."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import threading
from typing import Any, NamedTuple

from viceroy.runtime import context as context_mod
from viceroy.runtime import serialize
from viceroy.runtime.actors import plain
from viceroy.runtime.actors.actor_mesh import ActorMesh, ActorMeshInfo, OnResult, RankFuture
from viceroy.runtime.actors.answers import GIVE_UP, REQUEST, WAIT
from viceroy.runtime.errors import MeshError
from viceroy.runtime.future import Future
from viceroy.runtime.shape import Shape, describe_ranks

_replies: dict[int, Future[Any]] = {}
_lock = threading.Lock()


class Running(NamedTuple):
    """An endpoint running. One that is not concurrent holds its actor until it returns (the
    actor handles nothing else meanwhile); a concurrent one holds it only while it blocks in a
    wait (`.get()` stops the event loop that runs the actor's endpoints)."""

    actor: str  # the actor mesh's id
    qualname: str  # the endpoint's function
    call: int  # the call it runs in (the controller's id; a one-way call's is <= 0)
    ep: str  # the endpoint's name
    concurrent: bool  # @vr.endpoint(concurrent=True)


# The endpoint running in this context (a concurrent one's task has a context of its own).
running_endpoint: contextvars.ContextVar[Running | None] = contextvars.ContextVar("viceroy_running_endpoint",
                                                                                 default=None)


class RankClient:
    """Sends a rank's calls on actor meshes to the controller, which relays them (one hop
    more than direct, but the controller stays the one place that knows which actors live)."""

    _ids = itertools.count(1)

    def mesh(self, info: ActorMeshInfo, shape: Shape) -> ActorMesh:
        return ActorMesh(info, shape, self)

    def shared(self, info: ActorMeshInfo) -> None:
        pass  # the controller's handles decide

    def invoke(self, info: ActorMeshInfo, shape: Shape, endpoint: str, adverb: str,
               args: tuple[Any, ...], kwargs: dict[str, Any], on_result: OnResult | None = None) -> Future[Any]:
        try:
            payload, bufs = plain.dumps((args, kwargs))
        except Exception:  # name the argument, as on the controller (ActorRecord.pack)
            qualname = f"{info.cls_name}.{endpoint}"
            serialize.check_picklable({f"{qualname} argument {i}": a for i, a in enumerate(args)}
                                      | {f"{qualname} argument {k!r}": v for k, v in kwargs.items()})
            raise
        req = next(self._ids)
        fut = RankFuture(f"{info.cls_name}.{endpoint}" + ("" if adverb == "call" else f" ({adverb})"))
        if adverb != "broadcast":
            with _lock:
                _replies[req] = fut
        request = {"req": req, "actor": info.id, "name": info.cls_name, "dims": shape.dims,
                   "ranks": list(shape.ranks), "ep": endpoint, "adverb": "call" if adverb == "stream" else adverb,
                   "args": payload, "bufs": [bytes(b.raw()) for b in bufs]}
        context_mod.context()._publish(REQUEST, request)
        # `on_result` goes unused: a stream from a rank yields once every actor answered (the
        # controller replies once), from the RankFuture (see ActorMesh.stream)
        if adverb == "broadcast":
            fut._set_result(None)
            return fut
        fut.on_wait = functools.partial(_tell_wait, req)
        fut._on_interrupt = functools.partial(_give_up, req)  # (a task awaiting it was cancelled)
        if (running := running_endpoint.get()) is not None and running.actor == info.id:
            fut.waits_on_self = _waits_on_self(running.qualname, fut.what, shape, adverb, running.concurrent)
            fut.blocking_only = running.concurrent  # a concurrent endpoint may await it: its actor is free
        return fut

    def control(self, info: ActorMeshInfo) -> Any:
        raise RuntimeError(
            f"stop, restart and failures of actor mesh {info.cls_name} are for its owner on the "
            "controller, not for an actor on a rank"
        )


def _waits_on_self(endpoint: str, what: str, shape: Shape, adverb: str, concurrent: bool) -> str | None:
    """Why waiting for a call on `shape` of the actor mesh whose `endpoint` runs here can
    never end (None: it can): the call includes this very actor, which takes its next message
    only once `endpoint` returns; or, `concurrent`, once a blocking wait in it (`.get()`, which
    stops the actor's event loop) ends."""
    me = context_mod.context().rank
    if me not in shape.ranks or (adverb == "choose" and len(shape.ranks) > 1):  # choose picks another
        return None
    others = [r for r in shape.ranks if r != me]
    instead = (f"call only the other actors ({describe_ranks(others)}, through a slice or select), "
               if others else "")
    if concurrent:
        return (f"{endpoint} on rank {me} blocks in a wait for {what}, which includes this very actor (rank {me}): "
                f"a blocking wait (.get(), iterating a stream) in an async endpoint stops the actor's event loop, so "
                f"that call cannot start, and both would wait forever. Instead `await` it ({endpoint} is concurrent: "
                f"the actor takes other messages meanwhile), or {instead}do not wait for it")
    return (f"{endpoint} on rank {me} waits for {what}, which includes this very actor (rank {me}): an actor "
            f"handles one message at a time, so that call cannot start before {endpoint} returns, and both would "
            f"wait forever. Instead {instead}do not wait for it (.broadcast(), or keep the future), or make "
            f"{endpoint} an `@vr.endpoint(concurrent=True) async def` that awaits it")


def _tell_wait(req: int, over: bool, awaiting: bool) -> bool:
    """A future of request `req` blocks (`over`: no longer blocks, though not done) in this
    context: if an endpoint runs here, tell the controller, which fails the wait at once when
    it closes a cycle of waits between actors. -> whether it was told. Who waits is who waits
    now (a future kept by one endpoint may be waited for by another).
    `awaiting`: an ``await``, which blocks only the endpoint's own task (a task it started may
    await while the endpoint returns)."""
    holding = running_endpoint.get()
    if holding is None:  # no endpoint runs here (a thread the user started, say)
        return False
    if holding.concurrent and awaiting and holding.call <= 0:  # it holds nothing, and none waits
        return False  # for a one-way call: it can be in no cycle
    if awaiting and not over:
        from viceroy.runtime.actors import actor_thread  # imports this module

        host = actor_thread.get(holding.actor)
        try:
            mine = host is not None and host.running.get(holding.call) is asyncio.current_task()
        except RuntimeError:  # no loop runs here: driven by hand
            mine = False
        if not mine:
            return False
    context_mod.context()._publish(WAIT, {"req": req, "actor": holding.actor, "call": holding.call,
                                          "ep": holding.ep, "over": over, "conc": holding.concurrent,
                                          "awaiting": awaiting})
    return True


def _give_up(req: int, cancelled: bool = True) -> None:
    """The task awaiting request `req` was cancelled (``asyncio.wait_for`` timed out, say): the
    controller cancels the call it relayed, on its ranks (queued: dropped; a running async
    endpoint: cancelled), as it cancels its own. Its reply, when it comes, settles a future nobody
    awaits. (`cancelled`, False for Ctrl-C on the controller, changes nothing here: a rank has none.)"""
    context_mod.context()._publish(GIVE_UP, {"req": req})


def resolve_reply(req: int, signed: list[Any], data: list[Any]) -> None:
    with _lock:
        fut = _replies.pop(req, None)
    if fut is None:
        return
    outcome = serialize.loads(signed[0], data)
    if outcome[0] == "ok":
        fut._set_result(outcome[1])
    elif outcome[0] == "mesh_error":
        fut._set_exception(MeshError(*outcome[1:]))
    else:
        fut._set_exception(outcome[1])


def _actor_mesh_from_wire(info: ActorMeshInfo, dims: dict[str, int], ranks: tuple[int, ...]) -> ActorMesh:
    """Unpickling an actor mesh: on a rank it calls through the controller; on the controller
    it is the controller's own again."""
    shape = Shape(dims, ranks)
    if context_mod._current is not None:
        if context_mod._current.mesh_token != info.token:
            raise ValueError(f"actor mesh {info.cls_name} belongs to another mesh than this rank's")
        return ActorMesh(info, shape, RankClient())
    from viceroy.runtime.actors.registry import registry_for_token

    reg = registry_for_token(info.token)
    if reg is None:
        raise ValueError(f"actor mesh {info.cls_name} belongs to a mesh that is not running here")
    return reg.mesh(info, shape)
