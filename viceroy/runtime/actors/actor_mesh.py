"""`ActorMesh`: the handle to one actor per rank of a (sub)mesh, with the mesh algebra of `Mesh`
(slice, split, flatten, rename, select) and one `Endpoint` per endpoint of the actor class.

The same class serves on the controller and on the ranks (an actor mesh passed to another
actor); only its `Client` differs: the controller's sends straight to the ranks, a rank's asks
the controller to send.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from viceroy.runtime import call_peers
from viceroy.runtime.actors.actor import EndpointSpec
from viceroy.runtime.actors.stream import RankStream, Stream
from viceroy.runtime.arguments import check_seconds
from viceroy.runtime.errors import MeshError, RankFailure
from viceroy.runtime.future import Future
from viceroy.runtime.shape import Shape, ShapeOps
from viceroy.runtime.values import ValueMesh

OnResult = Callable[[int, bool, Any], None]


@dataclass(frozen=True)
class ActorMeshInfo:
    """What identifies an actor mesh anywhere: sent along when it is passed to a rank."""

    id: str
    cls_name: str
    token: str  # the mesh's: an actor mesh means nothing to another mesh's ranks
    endpoints: dict[str, EndpointSpec]


class Client(Protocol):
    """How an actor mesh reaches its actors (controller side, or rank side through the
    controller)."""

    def invoke(self, info: ActorMeshInfo, shape: Shape, endpoint: str, adverb: str,
               args: tuple[Any, ...], kwargs: dict[str, Any], on_result: OnResult | None = None) -> Future[Any]:
        """Send one message per actor of `shape` (adverb "choose": to one of them, picked by
        load); the future resolves to a ValueMesh over the actors that answered."""
        ...

    def control(self, info: ActorMeshInfo) -> Any:
        """The controller's record of this actor mesh (stop, restart, failures)."""
        ...

    def mesh(self, info: ActorMeshInfo, shape: Shape) -> ActorMesh:
        """A handle on (part of) this actor mesh."""
        ...

    def shared(self, info: ActorMeshInfo) -> None:
        """The actor mesh is being pickled: sent to ranks, or kept somewhere else."""
        ...


class ActorMesh(ShapeOps):
    """One actor per rank. Endpoints are attributes: ``counters.incr.call(by=2)``.

    >>> counters = mesh.spawn(Counter, 0)
    >>> counters.incr.call(by=2).get()            # ValueMesh(gpus=4): all 2
    >>> counters.slice(gpus=1).incr.call_one().get()
    3
    """

    def __init__(self, info: ActorMeshInfo, shape: Shape, client: Client) -> None:
        self._info = info
        self._shape = shape
        self._client = client

    def _reshaped(self, shape: Shape) -> ActorMesh:
        return self._client.mesh(self._info, shape)

    def __getattr__(self, name: str) -> Endpoint:
        if name.startswith("__"):
            raise AttributeError(name)
        spec = self._info.endpoints.get(name)
        if spec is None:
            eps = ", ".join(sorted(self._info.endpoints)) or "none"
            raise AttributeError(
                f"{self._info.cls_name} has no endpoint {name!r}; its endpoints are: {eps}. "
                "Only methods marked @vr.endpoint can be called from outside the actor."
            )
        return Endpoint(self, spec)

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self._info.endpoints]

    def check_usable_on(self, controller: Any, shape: Shape) -> None:
        """Raise on the controller, before sending, if this actor mesh means nothing to the
        ranks of `shape` (it was spawned on another mesh)."""
        if self._info.token != controller.token:
            raise ValueError(
                f"actor mesh {self._info.cls_name} was spawned on another mesh, not on this one "
                f"({shape.describe()}): pass it only to calls on the mesh it was spawned on (a mesh that "
                "was shut down takes its actors with it: spawn them again on this one)")

    def __reduce__(self) -> tuple[Any, ...]:
        from viceroy.runtime.actors.rank_client import _actor_mesh_from_wire

        self._client.shared(self._info)  # others may hold it now: never stopped for being dropped

        return _actor_mesh_from_wire, (self._info, self._shape.dims, self._shape.ranks)

    def __repr__(self) -> str:
        try:
            state = self._client.control(self._info).describe(self._shape)
        except RuntimeError:
            state = "on a rank"
        return f"<viceroy.ActorMesh {self._info.cls_name} ({self._shape.describe()}): {state}>"

    # --- lifecycle (controller only) ---------------------------------------------------------

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop these actors: calls sent before are answered (running and queued async
        endpoints are cancelled: "interrupted"), their ``__cleanup__`` runs, their threads
        end; calling them afterwards raises. Waits up to `timeout` s (None: no limit): an
        actor busy in a sync endpoint stops when it ends; if that is later, stop() says so on
        stderr and the repr shows it "stopping" until it has."""
        self._client.control(self._info).stop(self._shape, timeout)

    def restart(self, timeout: float = 60.0) -> list[int]:
        """Respawn the actors that failed (their rank died), with the arguments they were first
        spawned with; dead ranks are restarted first (``mesh.restart(failed_only=True)``). The
        other actors keep running, with their state. -> the ranks whose actors were respawned
        ([] when none had failed). Stopped actors are not restarted (a stop is final): with
        any among these, it raises RuntimeError and restarts nothing."""
        ranks: list[int] = self._client.control(self._info).restart(self._shape, timeout)
        return ranks

    @property
    def failures(self) -> dict[int, str]:
        """rank -> why its actor is gone, for actors of this mesh that failed (until restart)."""
        return self._client.control(self._info).failed_on(self._shape)

    @property
    def unhandled(self) -> list[Any]:
        """The `ActorFailure`s of this mesh's actors that no owner handled (a broadcast that
        raised, a rank death), oldest first; those of actors restarted since are dropped."""
        return self._client.control(self._info).unhandled_on(self._shape)


class Endpoint:
    """An endpoint of every actor of an actor mesh, called through an adverb."""

    def __init__(self, mesh: ActorMesh, spec: EndpointSpec) -> None:
        self._mesh = mesh
        self._spec = spec

    def __repr__(self) -> str:
        return f"<viceroy.Endpoint {self._spec.qualname}{self._spec.signature} on {self._mesh._shape.describe()}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{self._spec.qualname} is an endpoint: call it through an adverb, e.g. "
            f".call(...) (every actor), .call_one(...) (one-actor mesh), .choose(...), "
            f".broadcast(...) or .stream(...)"
        )

    def _send(self, adverb: str, args: tuple[Any, ...], kwargs: dict[str, Any],
              shape: Shape | None = None, on_result: OnResult | None = None) -> Future[Any]:
        self._spec.check(args, kwargs)
        m = self._mesh
        fut = m._client.invoke(m._info, shape or m._shape, self._spec.name, adverb, args, kwargs, on_result)
        if not fut.done():  # the handle lives until its calls end: dropping it stops the actors
            fut.add_done_callback(functools.partial(_keep, m))
        return fut

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[Any]]:
        """Every actor runs the endpoint; the future resolves to a ValueMesh of their results
        (or fails with a MeshError naming each failed rank and its traceback)."""
        return self._send("call", args, kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """The only actor of a one-actor mesh (``actors.slice(gpus=1)``) runs it; -> its value."""
        n = len(self._mesh._shape)
        if n != 1:
            raise ValueError(
                f"call_one needs an actor mesh of one actor; this one has {n} "
                f"({self._mesh._shape.describe()}). Slice it first, e.g. .slice(...), or use .choose()"
            )
        return _first_value(self._send("call", args, kwargs))

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """One actor runs it, the least loaded (fewest calls in flight) of this mesh."""
        return _first_value(self._send("choose", args, kwargs))

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Every actor runs it; nothing comes back. Still ordered with the other messages to
        the same actors. A failure goes to the owner's ``__supervise__``, else is kept in
        ``actors.unhandled`` and printed once; so does that of actors waiting in a collective
        that a peer left (raised or skipped), within about a second."""
        self._send("broadcast", args, kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Stream | RankStream:
        """Every actor runs it; yields results as they arrive (``for v in ...``, or ``async for``
        in an async cell or a concurrent endpoint). When some actors failed, a MeshError listing
        them is raised after the successful results. An interrupt (Ctrl-C, a cancelled task)
        while it waits cancels the call on the ranks. From an endpoint the values come together,
        once every actor answered (see `viceroy.runtime.actors.stream`)."""
        values = Stream()

        def on_result(rank: int, ok: bool, value: Any) -> None:
            if ok:
                values.put(value)

        fut = self._send("stream", args, kwargs, on_result=on_result)
        if isinstance(fut, RankFuture):  # from an endpoint (see rank_client): the values come together
            return RankStream(fut)
        return values.follow(fut)


def _keep(_handle: ActorMesh, _fut: Future[Any]) -> None:
    """A done callback that only holds `_handle` (until the future is done)."""


_WAIT_SLICE_S = 0.05  # a rank future waits in slices, to notice its endpoint was interrupted


class RankFuture(Future[Any]):
    """The future of a call made from a rank (see rank_client): it has no call id, and
    mesh.interrupt() is the controller's; a timeout names the endpoint. Cancelling the task that
    awaits it asks the controller to cancel the call (rank_client._give_up).

    `waits_on_self`: why waiting for it can never end, if it cannot: the call includes the
    very actor whose endpoint would wait (see rank_client.running_endpoint); with
    `blocking_only`, only a blocking wait can (a concurrent endpoint may await it). `on_wait(over,
    awaiting)`: called as a wait for it (`get`, or `await`) blocks (over False) and, if it was
    told, as one ends before it is done (True); -> whether it was told (rank_client._tell_wait:
    the controller looks for a cycle of waits between actors)."""

    __slots__ = ("blocking_only", "on_wait", "waits_on_self")

    def __init__(self, what: str) -> None:
        super().__init__(-1, what=what)
        self.waits_on_self: str | None = None
        self.blocking_only = False  # waits_on_self holds for a blocking wait only (`await` it: it ends)
        self.on_wait: Callable[[bool, bool], bool] | None = None

    def _blocks(self, awaiting: bool) -> Callable[[bool, bool], bool] | None:
        """A wait for it starts: raise if it can never end; -> what to call as it ends early."""
        if self.waits_on_self is not None and not self.done() and not (awaiting and self.blocking_only):
            raise RuntimeError(self.waits_on_self)
        told = self.on_wait is not None and not self.done() and self.on_wait(False, awaiting)
        return self.on_wait if told else None

    def get(self, timeout: float | None = None) -> Any:
        """As `Future.get`; in an endpoint that is interrupted meanwhile (mesh.interrupt(),
        Ctrl-C on the controller), the wait ends with it."""
        timeout = check_seconds(timeout, none="waiting as long as it takes")
        ends = self._blocks(False)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                left = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - time.monotonic())
                try:
                    self._cf.exception(max(left, 0.0))
                    break
                except concurrent.futures.TimeoutError:
                    call_peers.check_cancelled()  # the endpoint that waits was interrupted
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"{self.what} still running after {timeout} s; it goes on: wait longer with "
                            ".get(timeout=...), or interrupt it from the controller (mesh.interrupt())"
                        ) from None
        finally:
            if ends is not None and not self.done():
                ends(True, False)
        return super().get()

    result = get

    def __await__(self) -> Generator[Any, None, Any]:
        ends = self._blocks(True)
        try:
            return (yield from super().__await__())
        finally:
            if ends is not None and not self.done():
                ends(True, True)


def _first_value(inner: Future[ValueMesh[Any]]) -> Future[Any]:
    """A future of the single value of a one-actor ValueMesh."""
    out: Future[Any]
    if isinstance(inner, RankFuture):
        out = RankFuture(inner.what)
        out.waits_on_self = inner.waits_on_self
        out.blocking_only = inner.blocking_only
        out.on_wait = inner.on_wait
    else:
        out = Future(inner.call_id, what=inner.what)
    out._on_interrupt = inner._on_interrupt  # giving up on it (Ctrl-C, a cancelled task) stops the call

    def copy(f: Future[ValueMesh[Any]]) -> None:
        exc = f.exception()
        if exc is not None:
            out._set_exception(exc)
        else:
            out._set_result(f.get().values()[0])

    inner.add_done_callback(copy)
    return out


def failed_future(what: str, failures: dict[int, RankFailure], hint: str = "", total: int | None = None) -> Future[Any]:
    """A call that ended before anything was sent; `total`: the actors it was for."""
    fut: Future[Any] = Future()
    fut._set_exception(MeshError(what, failures, {}, hint, total))
    return fut
