"""The controller's side of a mesh: the table of calls in flight, rank states, and the IO thread
that turns replies into results, errors and events. Sockets are in `transport`, the IO thread
and what each message does in `inbound`, one call's bookkeeping in `calls`, how calls end in
`outcomes`; starting, restarting and hosts' agents in `hosts`.

One `Controller` per started mesh; `Mesh` objects are views (sub-meshes) over it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import secrets
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from viceroy.runtime import shm
from viceroy.runtime.arguments import check_seconds
from viceroy.runtime.calls import ACTOR_STUCK_HINT, Call, Query
from viceroy.runtime.compiled import Shipments
from viceroy.runtime.errors import MeshClosedError, MeshError, RankFailure
from viceroy.runtime.future import Future
from viceroy.runtime.hosts import REMAINS_AT_SHUTDOWN_S, HostLifecycle, Remains
from viceroy.runtime.inbound import Inbound
from viceroy.runtime.launcher import AgentProcess, HostPlan, Launcher, check_env, rendezvous_env
from viceroy.runtime.logs import RankLogs
from viceroy.runtime.outcomes import CallOutcomes, Event
from viceroy.runtime.procs import host_timeout
from viceroy.runtime.routing import Routing
from viceroy.runtime.shape import Shape, rank_runs
from viceroy.runtime.transport import ControllerSockets, whole_messages
from viceroy.runtime.wire import Signer, new_key

Listener = Callable[[Event], None]


class Controller(Routing, Inbound, CallOutcomes, HostLifecycle):
    def __init__(
        self,
        dims: dict[str, int],
        launcher: Launcher,
        *,
        interface: str = "127.0.0.1",
        echo: bool = True,
        output_limit: int = 1 << 20,
        preload: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        check_env(env)  # what can be refused is refused before any socket or thread exists
        rendezvous = rendezvous_env(interface)
        cwd = os.getcwd()
        self.shape = Shape(dims)
        self.launcher = launcher
        self.signer = Signer(launcher.mesh_key or new_key())  # attach mode: the user's key
        self.token = secrets.token_hex(6)  # names this mesh (handles, shared-memory files)
        self.logs = RankLogs(echo)
        self._listeners: list[Listener] = []
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._calls: dict[int, Call] = {}
        self._queries: dict[int, Query] = {}
        self._returns = shm.Returns()  # released result files, back to the ranks that made them
        self.shipments = Shipments()  # code strings sent with their compiled code
        self._lender = shm.Lender(self.token)  # pushes' files, written over once the ranks let go
        self._state: dict[int, str] = dict.fromkeys(self.shape.ranks, "starting")
        self._dead: set[int] = set()
        # rank -> calls given up on that it still runs (call id -> whether on its main thread)
        self._stuck: dict[int, dict[int, bool]] = {}
        self._hosts_of_ranks: dict[tuple[int, ...], list[int]] = {}  # routing, cached per rank set
        self._pids: dict[int, int] = {}
        self._exit_reason: dict[int, str] = {}
        self._never_ready: set[int] = set()  # ranks whose latest process exited before its hello
        self._agents: dict[int, AgentProcess] = {}
        self._agent_gen: dict[int, int] = {}  # the launch each of `_agents` is (behind `_gen` while one starts)
        self._remains: list[Remains] = []  # lost launches that may have left processes on their hosts
        self._host_of: dict[int, int] = {}
        # Hosts: which launch of each is current, when its agent was last heard, which are lost.
        self._plans: dict[int, HostPlan] = {}
        self._gen: dict[int, int] = {}
        self._last_seen: dict[int, float] = {}
        self._lost: dict[int, str] = {}
        self._host_timeout = host_timeout()
        self._beat_thread = threading.Thread(target=self._heartbeats, name="viceroy-heartbeat", daemon=True)
        self._beats_stop = threading.Event()  # set at shutdown: the beat thread ends at once, not after its nap
        self._tasks: deque[Callable[[], None]] = deque()
        self._closed = False
        self._shut_at: float | None = None  # time.time() of shutdown, for the errors of later calls
        # The tensor engine of each view of this mesh, by its shape (see runtime.tensors).
        self.engines: dict[Shape, Any] = {}
        self._startup_error: str | None = None
        self.agent_info: dict[int, dict[str, Any]] = {}
        self.preload_failures: dict[str, str] = {}  # module -> why a host could not preload it
        self._agents_ready: set[int] = set()  # hosts whose fork server has preloaded (or tried)

        self._sockets = ControllerSockets(launcher.same_host, interface)
        # Direct mode: one host, the controller's own. Ranks then talk to the controller itself
        # (no relay hop); the agent only spawns, reaps and reports.
        self._direct = False
        self._io = threading.Thread(target=self._io_loop, name="viceroy-controller-io", daemon=True)
        self._io.start()

        self._config = {
            "key": self.signer.key.hex(),
            "token": self.token,
            "controller_in": self._sockets.address_in,
            "controller_out": self._sockets.address_out,
            "controller_links": self._sockets.address_links,
            "dims": self.shape.dims,
            "world_size": len(self.shape),
            "cwd": cwd,
            "sys_path": [p or cwd for p in sys.path],
            "preload": list(preload),
            "output_limit": output_limit,
            "host_timeout": self._host_timeout,
            "env": {**rendezvous, **(env or {})},
        }
        _live.add(self)

    # --- lifecycle -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        actors = getattr(self, "_actor_registry", None)  # actors' __cleanup__ runs first (bounded)
        if actors is not None and not self._closed:
            with contextlib.suppress(Exception):
                actors.stop_all()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._beats_stop.set()
            self._shut_at = time.time()
            calls = list(self._calls.values())
            self._calls.clear()
        for call in calls:
            call.future._set_exception(MeshClosedError(
                f"the mesh was shut down while this call ({call.label}) ran; {START_AGAIN}"))
        with contextlib.suppress(zmq.ZMQError):
            self._broadcast({"op": "shutdown", "ranks": []}, hosts=set(self._agents) - set(self._lost))
        # Agents stop their ranks and exit by themselves; whatever is left after a second is
        # killed (with its whole session), and on other hosts, ended there: a frozen agent, given
        # up or not yet, outlives its ssh client, and its ranks with it.
        deadline = time.monotonic() + 1.0
        late = []
        for h, agent in self._agents.items():
            if agent.wait(max(0.0, deadline - time.monotonic())) is None and h not in self._lost:
                late.append(agent)
            agent.kill()
        for why in self._end_remains(None, REMAINS_AT_SHUTDOWN_S, late):
            print(f"viceroy: shutting down: {why}", file=sys.__stderr__, flush=True)
        self._wake()
        self._io.join(timeout=2)
        if self._beat_thread.ident is not None:
            self._beat_thread.join(timeout=2)
        self._sockets.close()
        self.launcher.close()
        self._lender.close()
        shm.discard_mesh(self.token)
        _live.discard(self)

    @property
    def closed(self) -> bool:
        return self._closed

    # --- calls -----------------------------------------------------------------------------

    def submit(
        self,
        op: str,
        shape: Shape,
        extra: dict[str, Any],
        signed: Sequence[Any] = (),
        data: Sequence[Any] = (),
        *,
        label: str,
        fail_fast: bool = True,
        timeout: float | None = None,
        on_result: Callable[[int, bool, Any], None] | None = None,
        died_hint: str | None = None,
        death_ends: bool = False,
    ) -> Future[Any]:
        """Send one call to every rank of `shape`; the future resolves to a ValueMesh, or fails
        with a MeshError. Op "actor" goes to the ranks' control thread (actors answer while
        a cell runs). `on_result(rank, ok, value_or_failure)` is called on the IO thread as each
        rank answers (for streaming adverbs). `died_hint`: what a MeshError for a rank death
        says to do, where restarting the ranks is not the whole answer (actors). `death_ends`
        (without fail_fast): a rank's death ends the call within STOP_GRACE_S all the same, the
        others not cancelled but given up on (actor endpoints; see `Call.death_ends`)."""
        timeout = check_seconds(timeout)  # a plain number: it goes into messages
        with self._lock:
            self._check_open()
            call_id = next(self._ids)
            fut: Future[Any] = Future(call_id, functools.partial(self._given_up, call_id))
            dead = [r for r in shape.ranks if r in self._dead] if self._dead else None
            if dead:
                fut._set_exception(MeshError(
                    label,
                    {r: RankFailure("unavailable", f"dead ({self._exit_reason.get(r, 'exited')}) before the call") for r in dead},
                    hint="Nothing was sent. Bring the dead ranks back with mesh.restart(failed_only=True).",
                    total=len(shape.ranks),
                ))
                return fut
            deadline = time.monotonic() + timeout if timeout else None
            call = Call(call_id, label, shape, fut, fail_fast, deadline, timeout, on_result=on_result,
                        death_ends=death_ends)
            if died_hint is not None:
                call.died_hint = died_hint
            if op == "actor":
                call.stuck_hint = ACTOR_STUCK_HINT
                call.on_main_thread = False
                call.queue = extra.get("actor", "")
            if self._direct and data:  # same host: big buffers through shared memory
                # Kept for reuse (see shm.Lender); an actor's host answers another way: not lent.
                lent = self._lender.to(shape.ranks) if op != "actor" else None
                data, entries, call.shm_paths = shm.offload(data, self.token, lent)
                if entries:
                    extra = {**extra, "shm": entries}
        # From here the call is registered and sent as one: an interrupt (the stop button)
        # is held back until it is out, then stops it on the ranks, since the caller, who
        # gets the KeyboardInterrupt and not the future, cannot.
        try:
            with whole_messages:
                with self._lock:
                    self._calls[call_id] = call
                if self._listeners:
                    self._emit({"type": "call_started", "call": call_id, "ranks": shape.ranks, "label": label})
                if shape is not self.shape and shape != self.shape:  # a view: ranks see its dims
                    extra = {**extra, "view": [list(shape.dims), list(shape.dims.values())]}
                frames = self.signer.pack(
                    {"op": op, "id": call_id, "ranks": shape.runs(), **self._returns.header(op, shape.runs()), **extra},
                    signed, data,
                )
                self._to_ranks(shape.ranks, frames, control=op == "actor")
        except KeyboardInterrupt:  # held back until the call was out
            self.cancel(call_id, "interrupted (KeyboardInterrupt on the controller)", wait=1.0)
            raise
        except BaseException:  # the call may not be out: nothing is waiting for it
            with self._lock:
                self._calls.pop(call_id, None)
            raise
        if deadline:
            self._wake()
        return fut

    def send_oneway(self, op: str, ranks: Sequence[int], extra: dict[str, Any], signed: Sequence[Any] = (), data: Sequence[Any] = ()) -> None:
        """A message no rank answers (call id 0): nothing to track, so senders can pipeline.
        Same socket as `submit`, so per-rank order with calls holds."""
        with self._lock:
            self._check_open()
        runs = rank_runs(ranks)
        frames = self.signer.pack({"op": op, "id": 0, "ranks": runs, **self._returns.header(op, runs), **extra}, signed, data)
        self._to_ranks(ranks, frames, control=op == "actor")

    def cancel(self, call_id: int, reason: str, wait: float = 0.0) -> None:
        with self._lock:
            call = self._calls.get(call_id)
            if call is None:
                return
            self._stop(call, reason)
        if wait:
            with contextlib.suppress(BaseException):
                call.future._cf.exception(wait)

    def _given_up(self, call_id: int, cancelled: bool) -> None:
        """Its future's waiter gave up. Ctrl-C: the call is interrupted, and the controller waits
        up to 1 s for it to end, so the KeyboardInterrupt comes once the ranks have stopped. A
        cancelled task: the call is cancelled without waiting, which would hold the event loop."""
        if cancelled:
            self.cancel(call_id, "cancelled (the task awaiting it was cancelled)")
        else:
            self.cancel(call_id, "interrupted (KeyboardInterrupt on the controller)", wait=1.0)

    def unanswered(self, call_id: int) -> list[int]:
        """The ranks that have not answered call `call_id` yet ([] once it ended, or unknown)."""
        with self._lock:
            call = self._calls.get(call_id)
            return call.missing() if call is not None else []

    def interrupt(self, ranks: Sequence[int], wait: float = 1.5) -> list[int]:
        """Cancel every call in flight on any of `ranks`; returns their ids."""
        wanted = set(ranks)
        with self._lock:
            calls = [c for c in self._calls.values() if wanted & set(c.shape.ranks)]
            for call in calls:
                self._stop(call, "interrupted")
        deadline = time.monotonic() + wait
        for call in calls:
            with contextlib.suppress(BaseException):
                call.future._cf.exception(max(0.0, deadline - time.monotonic()))
        return [c.id for c in calls]

    def query(self, op: str, ranks: Sequence[int], timeout: float = 3.0) -> dict[Any, Any]:
        """Ask live ranks something answered by their IO thread (works while they are busy).
        Replies are keyed by rank; for "stats" the agents answer too, keyed ("agent", host)."""
        timeout = check_seconds(timeout, none=None)
        with self._lock:
            self._check_open()
            live = [r for r in ranks if self._state[r] != "dead"]
            hosts = {self._host_of[r] for r in ranks}
            qid = next(self._ids)
            expected: set[Any] = set(live)
            if op == "stats":
                expected |= {("agent", h) for h in hosts}
            q = Query(expected, time.monotonic() + timeout)
            self._queries[qid] = q
        frames = self.signer.pack({"op": op, "id": qid, "ranks": rank_runs(live)})
        self._to_ranks(live, frames, control=True)
        if self._direct and op == "stats":
            self._broadcast({"op": op, "id": qid, "ranks": []}, hosts=hosts)
        q.done.wait(timeout)
        with self._lock:
            self._queries.pop(qid, None)
        return dict(q.replies)

    # --- state --------------------------------------------------------------------------------

    def states(self) -> dict[int, str]:
        """rank -> state; "running" while it owes an answer to a call in flight (worked out
        here, when asked, so calls pay nothing for it). After shutdown every rank is "dead"."""
        with self._lock:
            if self._closed:
                return dict.fromkeys(self._state, "dead")
            owing: set[int] = set(self._stuck)
            for call in self._calls.values():
                owing.update(call.missing())
            return {r: ("running" if s == "idle" and r in owing else s) for r, s in self._state.items()}

    def blocked_ranks(self) -> list[int]:
        """Ranks whose main thread still runs a call given up on (interrupted or timed out, and
        it did not stop): code sent to them waits until it ends. (An actor's endpoint runs on its
        own thread: a rank still running one given up on takes code at once.)"""
        with self._lock:
            return sorted(r for r, calls in self._stuck.items() if any(calls.values()))

    def still_running(self, call_id: int) -> set[int]:
        """The ranks still running call `call_id` after it was given up on (until they answer,
        or die): an actor there is busy with it (see `ActorRecord._forget_answered`)."""
        with self._lock:
            return {r for r, calls in self._stuck.items() if call_id in calls}

    def pids(self) -> dict[int, int]:
        with self._lock:  # none after shutdown: those numbers may already be another process's
            return {} if self._closed else dict(self._pids)

    def agent_processes(self) -> list[AgentProcess]:
        return list(self._agents.values())

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    # --- internals: sending ------------------------------------------------------------------

    def _check_open(self, what: str | None = None) -> None:
        """Raise MeshClosedError, before anything is sent, once the mesh was shut down. `what`:
        the thing the user touched, when not the mesh itself ("actor mesh C (gpus=2)")."""
        if self._closed:
            raise self.closed_error(what)

    def closed_error(self, what: str | None = None) -> MeshClosedError:
        """The error of a call made after `shutdown()`: when it was, and what to do."""
        at = self._shut_at
        when = "" if at is None else (
            f" at {time.strftime('%H:%M:%S', time.localtime(at))} ({max(0.0, time.time() - at):.0f} s ago)")
        subject = f"{what} belongs to a mesh that" if what else f"this mesh ({self.shape.describe()})"
        return MeshClosedError(f"{subject} was shut down{when}, before this call; nothing was sent. {START_AGAIN}")

START_AGAIN = "Start a new mesh: vr.Mesh.local(...) in Python, or %mesh up in a notebook."

_live: weakref.WeakSet[Controller] = weakref.WeakSet()


def shutdown_all() -> None:
    """Stop every mesh this process started (registered with atexit)."""
    for c in list(_live):
        with contextlib.suppress(Exception):
            c.shutdown()
