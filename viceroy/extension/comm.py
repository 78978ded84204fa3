"""Live mesh state for front ends: the ``viceroy.mesh`` comm target and the MeshView widgets.

Every front end (a comm opened on target ``viceroy.mesh`` by the JupyterLab side panel, or a
`MeshView` widget) gets its own numbered stream of messages; ``seq`` grows by one per message:

    {"type": "state", "seq", "dims", "ranks": [...], "calls": [...], "auto", "summary"}
        the full snapshot: on open, on request, and when the mesh's shape changed
    {"type": "diff", "seq", "ranks": {"<rank>": {changed fields}}, "calls", "auto", "summary"}
        what changed since the previous message (``calls`` is the full list)

at most 5 per second per front end (changes in between are coalesced), none when nothing
changed. A front end that sees a gap in ``seq`` asks for a snapshot. Requests and replies:

    {"request": "snapshot"}                  -> the next message is a "state"
    {"request": "logs", "rank": 2, "tail"?}  -> {"type": "logs", "rank": 2, "text": "..."}
    {"request": "traceback", "rank": 2}      -> {"type": "traceback", "rank": 2, "text": "..."}
    {"request": "stacks"}                    -> {"type": "stacks", "stacks": {"0": "..."}}
    {"request": "interrupt"}                 -> {"type": "interrupted", "ranks": [...]}
    {"request": "restart_failed"}            -> {"type": "restarted", "ranks": [...]}
    {"request": "alive"}                     -> nothing (see below)
    anything that fails                      -> {"type": "error", "request", "message"}

A page that goes away closes its comm, but one that dies (a crashed tab, a lost network) cannot:
the kernel would stream to it for good. So the side panel says "alive" every 30 s, and a comm
front end that said it once and then nothing for `SILENCE_S` is taken for gone: its comm is
closed (a page still there, back from a suspended laptop, connects again). Widgets live as
long as their model, as ipywidgets decide, and front ends that never said "alive" (an older
side panel) are never timed out.

Comm messages may arrive on a subshell thread while a cell runs, so handlers only enqueue. One
thread pumps state messages, one serves requests (a restart takes seconds; state keeps
flowing meanwhile), one polls the ranks' memory and GPU use every 2 s while a front end is open.
"""

from __future__ import annotations

import math
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from viceroy.extension.session import MeshSession
from viceroy.extension.state import Stream, plain_text
from viceroy.extension.terminal import terminal_line

TARGET = "viceroy.mesh"
MIN_INTERVAL = 0.2  # seconds between messages to one front end: at most 5 per second
STATS_INTERVAL = 2.0  # seconds between polls of the ranks' memory and GPU use
STATS_TIMEOUT = 1.5
LOG_TAIL = 200
SILENCE_S = 180.0  # browsers run a hidden tab's timers once a minute at worst: 3 pings missed
REQUESTS = ("snapshot", "logs", "traceback", "stacks", "interrupt", "restart_failed")

Send = Callable[[dict[str, Any]], None]
_channels: weakref.WeakKeyDictionary[MeshSession, StateChannel] = weakref.WeakKeyDictionary()


def plain_lines(text: str) -> str:
    """Log text as a terminal shows it, for a view that shows text: each line's ``\\r``
    rewrites resolved, colour and other escape sequences dropped."""
    return "\n".join(plain_text(terminal_line(line)) for line in text.split("\n"))


def route_by_header(c: Any) -> None:
    """Let the front end's requests on comm `c` reach the subshell they were sent to, and its
    close the main shell.

    ipykernel (7.2+) sends a comm's incoming messages to the subshell its last outgoing message
    was published from, and a message published from any thread but a subshell's counts as the
    main shell's. Everything here is published from worker threads, so a front end's request
    (interrupt, logs) would wait behind the running cell. Route by the message's own header.
    A close (its data holds no request) goes to the main shell, which is always there: the page
    closing the comm is going away, and JupyterLab deletes its subshell as it goes, at times
    before the close reached it, which then dropped the close.

    A widget's requests come wrapped: anywidget sends ``{"method": "custom", "content":
    {"request": ...}}`` on the widget's comm, so the request is looked for there too."""
    if hasattr(c, "_reply_subshell_for"):
        c._reply_subshell_for = lambda data, default: default if is_request(data) else None


def is_request(data: Any) -> bool:
    """Whether a comm message's ``data`` is a front end's request: the side panel's
    ``{"request": ...}``, or a widget's ``{"method": "custom", "content": {"request": ...}}``."""
    if not isinstance(data, dict):
        return False
    if "request" in data:
        return True
    content = data.get("content")
    return data.get("method") == "custom" and isinstance(content, dict) and "request" in content


class FrontEnd:
    """One front end: how to reach it, its numbered `Stream`, and when it last got a message.

    ``send`` takes diffs and replies; ``send_state`` full snapshots (a widget syncs those as a
    trait, so a saved notebook keeps them); by default both go through ``send``. ``close``
    ends a front end taken for gone; ``heard`` is when it last said it is alive (None: it never
    did, and is never timed out).
    """

    def __init__(self, send: Send, send_state: Send | None = None, close: Callable[[], None] | None = None) -> None:
        self.stream = Stream()
        self.sent_at = -math.inf
        self.pending = True
        self.heard: float | None = None
        self._send = send
        self._send_state = send_state or send
        self._close = close

    def close(self) -> None:
        if self._close is not None:
            try:
                self._close()
            except Exception:  # the kernel is going down, or the comm is closed already
                pass

    def deliver(self, msg: dict[str, Any]) -> bool:
        """Send one message; False when the front end is gone."""
        try:
            (self._send_state if msg.get("type") == "state" else self._send)(msg)
            return True
        except Exception:
            return False


class StateChannel:
    """Serves the mesh state of one `MeshSession` to every front end watching it."""

    def __init__(
        self,
        session: MeshSession,
        clock: Callable[[], float] = time.monotonic,
        stats_interval: float = STATS_INTERVAL,
        silence: float = SILENCE_S,
    ) -> None:
        self.session = session
        self.clock = clock
        self.stats_interval = stats_interval
        self.silence = silence
        self._front_ends: dict[int, FrontEnd] = {}
        self._cond = threading.Condition()
        self._requests: queue.SimpleQueue[tuple[FrontEnd, Any] | None] = queue.SimpleQueue()
        self._threads: dict[str, threading.Thread] = {}
        self._running = False
        self._stop = threading.Event()

    # --- lifecycle ---------------------------------------------------------------------------

    def register(self) -> None:
        """Register the comm target with the kernel's comm manager and start serving."""
        import comm

        comm.get_comm_manager().register_target(TARGET, self._on_open)
        self.start()

    def unregister(self) -> None:
        import comm

        manager = comm.get_comm_manager()
        if manager.targets.get(TARGET) == self._on_open:
            manager.unregister_target(TARGET, self._on_open)
        self.stop()

    def start(self) -> None:
        """Watch the session; front ends attached from now on are served by threads."""
        _channels[self.session] = self
        self.session.add_listener(self.changed)
        with self._cond:
            self._running = True
            if self._front_ends:
                self._ensure_threads()

    def stop(self) -> None:
        self.session.remove_listener(self.changed)
        if _channels.get(self.session) is self:
            del _channels[self.session]
        with self._cond:
            self._running = False
            self._stop.set()
            self._cond.notify_all()
        self._requests.put(None)

    def attach(self, fe: FrontEnd) -> None:
        with self._cond:
            self._front_ends[id(fe)] = fe
            if self._running:
                self._ensure_threads()
            self._cond.notify_all()

    def detach(self, fe: FrontEnd) -> None:
        with self._cond:
            self._front_ends.pop(id(fe), None)

    @property
    def front_ends(self) -> int:
        with self._cond:
            return len(self._front_ends)

    # --- from any thread: enqueue only -------------------------------------------------------

    def changed(self) -> None:
        """The session's state changed (called on any thread, for every runtime event). Wakes
        the pump only for a front end that had nothing pending: for the others it is already
        waiting out their throttle interval."""
        with self._cond:
            idle = [fe for fe in self._front_ends.values() if not fe.pending]
            for fe in idle:
                fe.pending = True
            if idle:
                self._cond.notify_all()

    def request(self, fe: FrontEnd, data: Any) -> None:
        """A front end's request: a snapshot is the pump's next message to it; the rest is
        served in order by the request thread."""
        kind = data.get("request") if isinstance(data, dict) else None
        if kind == "alive" or fe.heard is not None:
            fe.heard = self.clock()
        if kind == "alive":
            return
        if kind == "snapshot":
            with self._cond:
                fe.stream.want_snapshot = fe.pending = True
                self._cond.notify_all()
            return
        self._requests.put((fe, data))

    def _on_open(self, c: Any, msg: dict[str, Any]) -> None:
        route_by_header(c)
        fe = FrontEnd(c.send, close=c.close)
        c.on_msg(lambda m: self.request(fe, m["content"]["data"]))
        c.on_close(lambda m: self.detach(fe))
        self.attach(fe)

    # --- state messages ----------------------------------------------------------------------

    def flush(self, now: float | None = None) -> float | None:
        """Send each front end that is due its next message (see `Stream`); returns the seconds
        until the next one falls due, or None when none is pending."""
        now = self.clock() if now is None else now
        with self._cond:
            due = [fe for fe in self._front_ends.values() if fe.pending and now - fe.sent_at >= MIN_INTERVAL]
            for fe in due:
                fe.pending = False
        if due:
            snap = self.session.state.snapshot()
            memo: dict[int, Any] = {}  # front ends flushed together share their diffs
            for fe in due:
                msg = fe.stream.next(snap, memo)
                if msg is None:
                    continue
                fe.sent_at = now
                if not fe.deliver(msg):
                    self.detach(fe)
        return self._next_due(now)

    def expire(self, now: float | None = None) -> int:
        """Close the front ends silent for longer than `silence` since they last said they are
        alive (see the module's docstring); how many."""
        now = self.clock() if now is None else now
        with self._cond:
            gone = [fe for fe in self._front_ends.values() if fe.heard is not None and now - fe.heard > self.silence]
            for fe in gone:
                self._front_ends.pop(id(fe), None)
        for fe in gone:
            fe.close()
        return len(gone)

    def _next_due(self, now: float) -> float | None:
        with self._cond:
            waits = [fe.sent_at + MIN_INTERVAL - now for fe in self._front_ends.values() if fe.pending]
        return max(0.0, min(waits)) if waits else None

    def _pump(self) -> None:
        while not self._stop.is_set():
            self.flush()
            with self._cond:
                wait = self._next_due(self.clock())
                if wait != 0.0 and not self._stop.is_set():
                    self._cond.wait(wait)

    # --- requests ----------------------------------------------------------------------------

    def _serve_requests(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:  # stop() woke us
                if self._stop.is_set():
                    return
                continue
            fe, data = item
            fe.deliver(self.answer(data))

    def answer(self, data: Any) -> dict[str, Any]:
        """The reply to one request (never raises: failures become ``{"type": "error"}``)."""
        req = data.get("request") if isinstance(data, dict) else None
        try:
            return self._answer(req, data)
        except Exception as e:  # a bad request must not kill the worker
            return {"type": "error", "request": req, "message": f"{type(e).__name__}: {e}"}

    def _answer(self, req: Any, data: Any) -> dict[str, Any]:
        def error(message: str) -> dict[str, Any]:
            return {"type": "error", "request": req, "message": message}

        if req not in REQUESTS:
            return error(f"unknown request {req!r}; known: {', '.join(REQUESTS)}")
        if req == "snapshot":
            return dict(self.session.state.snapshot(), type="state")  # unnumbered; see request()
        mesh = self.session.mesh
        if mesh is None:
            return error("no mesh is up: start one with `%mesh up gpus=4`")
        rank = data.get("rank")
        if req in ("logs", "traceback") and not isinstance(rank, int):
            return error(f"request {req!r} needs \"rank\": an int (one of ranks {mesh.ranks[0]}..{mesh.ranks[-1]})")
        if req == "logs":
            text = mesh.logs(rank, tail=int(data.get("tail", LOG_TAIL)))
            return {"type": "logs", "rank": rank, "text": plain_lines(text)}
        if req == "traceback":
            return {"type": "traceback", "rank": rank, "text": plain_lines(self.session.state.traceback(rank))}
        if req == "stacks":
            return {"type": "stacks", "stacks": {str(r): plain_lines(s) for r, s in mesh.stacks().by_rank().items()}}
        if req == "interrupt":
            running = sorted(r for r, s in self.session.state.states().items() if s == "running")
            mesh.interrupt()
            return {"type": "interrupted", "ranks": running}
        dead = sorted(r for r, s in mesh.states().items() if s == "dead")
        if dead:
            self.session.restart(failed_only=True)
        return {"type": "restarted", "ranks": dead}

    # --- resource use ------------------------------------------------------------------------

    def poll_stats(self) -> bool:
        """Ask the ranks for their memory and GPU use, and reconcile states with the runtime's;
        True if the state changed (front ends then hear of it)."""
        mesh = self.session.mesh
        if mesh is None:
            return False
        try:
            stats = mesh.stats(timeout=STATS_TIMEOUT)["ranks"]
            states = mesh.states()
        except Exception:  # the mesh is shutting down; the next poll sees the new one
            return False
        state = self.session.state
        changed = state.apply_stats(stats) | state.set_states(states)
        if changed:
            self.changed()
        return changed

    def _poll(self) -> None:
        # One thread, so a poll never overlaps the previous one.
        while not self._stop.wait(self.stats_interval):
            self.expire()
            if self.front_ends:
                self.poll_stats()

    def _ensure_threads(self) -> None:
        """Start the pump, request and stats threads that are not running (caller holds the
        lock); one of each at most, so one thread numbers each front end's messages."""
        self._stop.clear()
        for name, fn in (("state", self._pump), ("requests", self._serve_requests), ("stats", self._poll)):
            thread = self._threads.get(name)
            if thread is None or not thread.is_alive():
                self._threads[name] = threading.Thread(target=fn, name=f"viceroy-{name}", daemon=True)
                self._threads[name].start()


def channel_for(session: MeshSession) -> StateChannel:
    """The running `StateChannel` of ``session`` (the extension registers one); one is started,
    without a comm target, where the extension is not loaded."""
    channel = _channels.get(session)
    if channel is None:
        channel = StateChannel(session)
        channel.start()
    return channel

