"""One actor on a rank: its thread, event loop and FIFO queue of messages (`ActorHost`), and
the rank's table of them. `host.handle` posts each actor message here, from the control thread;
the actor's thread runs them in order: its constructor, endpoints (sync, async, or concurrent
async as tasks of its loop), `__supervise__` and the stop (`__cleanup__`).

Each call runs within its own `call_peers` state, so its collectives are watched by the call.
A one-way broadcast (id < ONEWAY) that waits in a collective asks who of its peers finished it
(OW_WAIT), and is remembered when it ends, with the collectives it started, for peers that ask
(`finished_oneway`, `oneway_record`; those that ask before it ended here are answered at its
end). One that
failed here holds the actor's next collective until its peers have finished it too
(`settling.oneway_failed`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from viceroy.runtime import call_peers, devices, serialize, settling
from viceroy.runtime import context as context_mod
from viceroy.runtime.actors import answers, output
from viceroy.runtime.actors.oneway_record import OnewayRecord
from viceroy.runtime.actors.rank_client import Running, running_endpoint
from viceroy.runtime.execution import format_user_traceback, restore_filename
from viceroy.runtime.shape import expand_runs

_actors: dict[str, ActorHost] = {}  # actor id -> its host on this rank
_lock = threading.Lock()


def add(host: ActorHost) -> None:
    with _lock:
        _actors[host.id] = host


def get(actor_id: str) -> ActorHost | None:
    with _lock:
        return _actors.get(actor_id)


def cancel(call_id: int) -> bool:
    """True when `call_id` is an actor call on this rank (queued: answered "interrupted" at
    once; running async: cancelled; see `ActorHost.cancel`)."""
    with _lock:
        hosts = list(_actors.values())
    return any(h.cancel(call_id) for h in hosts)


class ActorHost:
    """One actor on this rank: its thread, event loop and message queue.

    The thread waits for work on a plain lock while nothing is awaiting (one futex wake per
    message; an asyncio wake-up costs several times more), and runs the event loop only while
    an async endpoint runs or concurrent ones are pending."""

    def __init__(self, actor_id: str, name: str, view: list[Any] | None = None) -> None:
        self.id = actor_id
        self.name = name
        self.view = view  # [names, sizes, runs] of the view it was spawned on; None: the whole mesh
        self.instance: Any = None
        self.files: dict[str, str] = {}
        self.stopping = False  # a stop arrived: calls sent after it are refused...
        self.cancelling = False  # ...and async endpoints are cancelled (see begin_stop)
        self.stopped = False
        self.loop = asyncio.new_event_loop()
        # A plain deque: a burst of messages (pipelined broadcasts) costs one wake-up, not one each.
        self.queue: deque[Any] = deque()
        self.qlock = threading.Lock()
        self.idle: str | None = None  # how the thread waits for work: "thread" (bell) | "loop" (wake)
        self.bell = threading.Lock()
        self.bell.acquire()
        self.wake = asyncio.Event()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.running: dict[int, asyncio.Future[Any] | None] = {}  # call id -> its task (None: sync)
        self.cancel_asked: set[int] = set()  # running calls cancelled before they had a task
        self.oneway = OnewayRecord()  # its one-way calls, for peers that ask (under qlock)
        self._outside: tuple[Any, frozenset[int]] = ((), frozenset())  # (a call's rank runs, ranks not in it)
        # One-way calls that failed here: a later collective waits for their peers to finish them.
        self.unsettled: list[call_peers.CallPeers] = []
        # Named after the actor (not "viceroy-..."): its frames are user code, shown by stacks.
        threading.Thread(target=self._main, name=f"actor {name}", daemon=True).start()

    def outside(self, runs: list[list[int]]) -> frozenset[int]:
        """The ranks of this actor mesh that a call sent to `runs` does not reach (control
        thread; the last answer is kept: calls in a row go to the same ranks)."""
        key = tuple(map(tuple, runs))
        if self._outside[0] != key:
            called = set(expand_runs(runs))
            self._outside = (key, frozenset(r for r in self._ranks() if r not in called))
        return self._outside[1]

    def _ranks(self) -> Iterable[int]:
        """The ranks of this actor mesh."""
        return expand_runs(self.view[2]) if self.view is not None else range(context_mod.context().world_size)

    def finished_oneway(self, call_id: int, asker: int | None = None, asker_cc: Any = None) -> dict[str, list[Any]] | None:
        """The collectives one-way call `call_id` started here, if it finished (None: not yet,
        or too long ago). `asker`: the rank asking, answered when the call ends if it runs now
        or is not taken yet; `asker_cc`: the collectives it started in it, if it finished it."""
        with self.qlock:
            running = call_id in self.running
            cc = self.oneway.finished(call_id, running, asker, asker_cc)
        if cc is None and running and asker_cc is not None:  # word for its wait, if it waits in one
            call_peers.peers_done(call_id, {asker: asker_cc})  # type: ignore[dict-item]
        return cc

    def _ask(self, call_id: int, members: Sequence[int]) -> None:
        """One-way call `call_id` waits in a collective (or, having failed here, holds a later
        one: then with the collectives it started here): ask who of `members` finished it."""
        others = [r for r in members if r != answers.rank.rank]
        if others:
            ask: dict[str, Any] = {"actor": self.id, "ow": call_id, "members": others}
            if (cc := self.finished_oneway(call_id)) is not None:
                ask["cc"] = cc
            answers.rank._publish(answers.OW_WAIT, ask)

    def post(self, msg: Any) -> None:
        self.post_many([msg])

    def post_many(self, msgs: list[Any]) -> None:
        with self.qlock:
            if self.stopped or (self.stopping and msgs[0][1] != "stop"):
                for msg in msgs:
                    self._refuse(msg)
                return
            self.queue.extend(msgs)
            idle, self.idle = self.idle, None
        if idle == "thread":
            self.bell.release()
        elif idle == "loop":
            self.loop.call_soon_threadsafe(self.wake.set)

    def begin_stop(self, cancel: bool = True) -> None:
        """On the control thread, as a stop arrives (before it is queued): calls that come
        after it are refused, and (`cancel`) async endpoints running or queued before it are
        cancelled (their callers get "interrupted"); a running sync endpoint runs to its end,
        then the stop runs (``__cleanup__``) and the thread ends. Without `cancel` (the stop of
        an actor mesh nobody holds any more), what came before runs to its end first."""
        with self.qlock:
            self.stopping = True
            self.cancelling = cancel
            if not cancel:
                return
            tasks = [t for t in self.running.values() if t is not None]
            for call_id in self.running:  # one waiting in a collective ends too
                call_peers.cancel(call_id)
        for task in tasks:
            with contextlib.suppress(RuntimeError):  # its loop closed: the actor ended meanwhile
                self.loop.call_soon_threadsafe(task.cancel)

    def cancel(self, call_id: int) -> bool:
        """Drop a queued call, or cancel a running async one; False if it is not ours. A sync
        endpoint cannot be stopped from outside its thread: it runs to its end, unless it waits
        in a viceroy collective, which ends "interrupted". A stop is never
        dropped (the actor would live on with nobody able to reach it): it goes on."""
        with self.qlock:
            for msg in self.queue:
                if msg[0] == call_id:
                    if msg[1] == "stop":
                        return True
                    self.queue.remove(msg)
                    answers.interrupted(call_id, "interrupted before it started")
                    return True
            if call_id not in self.running:
                return False
            task = self.running.get(call_id)
            if task is None:  # sync, or an awaitable's task not made yet: `_run` cancels it then
                self.cancel_asked.add(call_id)
        if task is not None:
            self.loop.call_soon_threadsafe(task.cancel)
        # A viceroy collective it waits in (sync or async: either blocks the thread) ends at
        # its next look, "interrupted"; other sync code runs to its end.
        call_peers.cancel(call_id)
        return True

    def _next(self) -> Any:
        if self.tasks:  # let pending concurrent endpoints move on between messages
            self.loop.run_until_complete(asyncio.sleep(0))
        while True:
            with self.qlock:
                if self.queue:
                    return self.queue.popleft()
                idle = self.idle = "loop" if self.tasks else "thread"
            if idle == "thread":
                self.bell.acquire()
            else:
                self.loop.run_until_complete(self._woken())

    async def _woken(self) -> None:
        await self.wake.wait()
        self.wake.clear()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        if self.view is not None:  # constructor and endpoints see the mesh it was spawned on
            context_mod.set_thread_view(context_mod.view_of(*self.view))
        while not self.stopped:
            call_id, kind, ep, signed, data, oneway, outside = self._next()
            devices.make_current()  # this thread's CUDA device: the rank's GPU, once CUDA runs
            if self.stopped:
                self._refuse((call_id, kind, ep))
            elif kind == "spawn":
                self._construct(call_id, signed, data, outside)
            elif kind == "stop":
                self.loop.run_until_complete(self._stop(call_id))
            elif kind == "supervise":
                hook = getattr(self.instance, "__supervise__", None)
                if hook is None:
                    answers.reply(call_id, False)
                else:
                    self._run(call_id, hook, signed, data, False, ())
            else:
                fn = getattr(self.instance, ep)
                if getattr(fn, "__viceroy_endpoint__", {}).get("concurrent"):
                    task = self.loop.create_task(self._run_concurrent(call_id, fn, signed, data, oneway, outside))
                    self.tasks.add(task)
                    task.add_done_callback(functools.partial(self._task_done, call_id))
                else:
                    self._run(call_id, fn, signed, data, oneway, outside)
        self.loop.close()  # its selector and self-pipe: 3 fds, else held until a full collection

    def _task_done(self, call_id: int, task: asyncio.Future[Any]) -> None:
        self.tasks.discard(task)
        if not self.tasks:
            self.wake.set()  # the thread may go back to waiting on its bell
        if task.cancelled():  # cancelled before it first ran: `_run` could not answer
            answers.interrupted(call_id)

    def _construct(self, call_id: int, signed: list[Any], data: list[Any], outside: frozenset[int] | tuple[()]) -> None:
        # A call as an endpoint's: its collectives are watched too.
        with self._call(call_id, False, None, outside, constructing=True):
            try:
                cls, args, kwargs = serialize.loads(signed[0], data)
                _restore_filenames(cls, self.files)
                self.instance = cls(*args, **kwargs)
            except BaseException as exc:
                self._close()
                self._end(call_id, None, False, exc=exc)
                return
            self._end(call_id, None, False)

    @contextlib.contextmanager
    def _call(self, call_id: int, oneway: bool, task: asyncio.Future[Any] | None = None,
              outside: frozenset[int] | tuple[()] = (), constructing: bool = False) -> Iterator[None]:
        """One call handled here: its output tagged with it, `cancel` able to find it, and its
        collectives watched as a cell's are (`call_peers`), by this call. `outside`: the ranks
        of the actor mesh it was not sent to. A one-way call (id < 0) asks its peers who
        finished it, and is remembered here when it ends, for peers that ask; one that failed
        here holds this actor's next collective until the peers that ran it finished it too."""
        output.begin(call_id)
        self.running[call_id] = task
        peers = call_peers.begin_call(call_id, told=call_id != answers.ONEWAY, outside=outside,
                                      ask=self._ask if call_id < answers.ONEWAY else None, actor=True,
                                      constructing=constructing, settle=self.unsettled)
        if self.oneway.word:  # peers that finished this one-way call said so before it started here
            with self.qlock:
                word = self.oneway.take_word(call_id)
            if word:
                call_peers.peers_done(call_id, word)
        try:
            yield
        finally:
            asked: set[int] | None = None
            with self.qlock:
                self.running.pop(call_id, None)
                self.cancel_asked.discard(call_id)
                if call_id < answers.ONEWAY:
                    asked = self.oneway.ended(call_id, cc := call_peers.counts())
            for asker in asked or ():  # peers that asked before it ended here
                answers.oneway_done(self.id, call_id, asker, cc)
            if (failed := call_peers.end_call(peers)) is not None:  # a one-way call that failed here
                settling.keep(failed, frozenset(self._ranks()).difference(outside, (answers.rank.rank,)))

    def _run(self, call_id: int, fn: Any, signed: list[Any], data: list[Any], oneway: bool,
             outside: frozenset[int] | tuple[()]) -> None:
        """A call handled on the actor's thread: sync, or async awaited to its end. Either
        holds the actor until it returns: it must not wait for a call to this very actor."""
        running = running_endpoint.set(self._running(fn, call_id, concurrent=False))
        try:
            self._run_holding(call_id, fn, signed, data, oneway, outside)
        finally:
            running_endpoint.reset(running)

    def _running(self, fn: Any, call_id: int, concurrent: bool) -> Running:
        return Running(self.id, getattr(fn, "__qualname__", "the endpoint"), call_id, getattr(fn, "__name__", ""),
                       concurrent)

    def _run_holding(self, call_id: int, fn: Any, signed: list[Any], data: list[Any], oneway: bool,
                     outside: frozenset[int] | tuple[()]) -> None:
        with self._call(call_id, oneway, None, outside):
            try:
                args, kwargs = _arguments(signed, data)
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):  # a task of its own, so that `cancel` can stop it
                    task = asyncio.ensure_future(value, loop=self.loop)
                    with self.qlock:  # a stop or cancel that came meanwhile cancels it (see begin_stop)
                        self.running[call_id] = task
                        if (self.stopping and self.cancelling) or call_id in self.cancel_asked:
                            task.cancel()
                    value = self.loop.run_until_complete(task)
            except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the actor lives on
                self._end(call_id, fn, oneway, exc=exc)
                return
            self._end(call_id, fn, oneway, value)

    async def _run_concurrent(self, call_id: int, fn: Any, signed: list[Any], data: list[Any], oneway: bool,
                              outside: frozenset[int] | tuple[()]) -> None:
        # A task of its own, in a copy of the context, so its output is tagged apart.
        running_endpoint.set(self._running(fn, call_id, concurrent=True))
        with self._call(call_id, oneway, asyncio.current_task(), outside):
            try:
                args, kwargs = _arguments(signed, data)
                value = await fn(*args, **kwargs)
            except BaseException as exc:
                self._end(call_id, fn, oneway, exc=exc)
                return
            self._end(call_id, fn, oneway, value)

    def _end(self, call_id: int, fn: Any, oneway: bool, value: Any = None, exc: BaseException | None = None) -> None:
        """Answer a call: its value, its error, or "interrupted" (cancelled, or a collective it
        waited in ended by `cancel`)."""
        output.end(answers.rank._send_output)
        if exc is not None and oneway:
            settling.oneway_failed()  # its peers may wait in one of its collectives yet
        if exc is None:
            if not oneway:
                answers.reply(call_id, value, getattr(fn, "__qualname__", "the endpoint"))
        elif isinstance(exc, asyncio.CancelledError) or (isinstance(exc, KeyboardInterrupt) and call_peers.cancelled()):
            answers.interrupted(call_id)
        else:
            answers.error(call_id, *format_user_traceback(exc), (self.id, getattr(fn, "__name__", "")))

    def _refuse(self, msg: Any) -> None:
        call_id, kind, ep = msg[:3]
        if kind == "stop":  # stopping or stopped already: what it asks for
            answers.ok(call_id)
            return
        answers.error(call_id, "RuntimeError", f"RuntimeError: actor {self.name} on rank {answers.rank.rank} was stopped",
               "", (self.id, ep or kind))

    def _close(self) -> None:
        with self.qlock:  # whatever was sent before the stop is answered now, not lost
            self.stopped = True
            left, self.queue = list(self.queue), deque()
        for msg in left:
            self._refuse(msg)
        with _lock:
            _actors.pop(self.id, None)

    async def _stop(self, call_id: int) -> None:
        self._close()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # they answer "interrupted"
        cleanup = getattr(self.instance, "__cleanup__", None)
        output.begin(call_id)
        try:
            if cleanup is not None:
                value = cleanup()
                if inspect.isawaitable(value):
                    await value
        except BaseException as exc:
            output.end(answers.rank._send_output)
            answers.error(call_id, *format_user_traceback(exc))
            return
        output.end(answers.rank._send_output)
        answers.ok(call_id)


def _arguments(signed: Any, data: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) of a call: already decoded from the header, or pickled in its frames."""
    if isinstance(signed, tuple):
        return signed
    args, kwargs = serialize.loads(signed[0], data)
    return args, kwargs


def _restore_filenames(cls: type, files: dict[str, str]) -> None:
    for klass in cls.__mro__:
        for attr in vars(klass).values():
            fn = getattr(attr, "__func__", attr)
            restore_filename(fn, files.get(getattr(fn, "__qualname__", "")))
