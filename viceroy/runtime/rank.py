"""A rank: one worker process of the mesh.

Threads: the main thread receives work and runs user code, one job at a time, in the order the
controller sent them; an IO thread receives control messages on a socket of its own and handles
them at once (cancel, stacks) even while the main thread is busy; a reader thread forwards output; a lifeline thread ends the
process, with the process group it leads (what user code started), when its agent is gone.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import threading
import time
import traceback
import types
from typing import Any

from viceroy.runtime import (
    call_peers,
    compiled,
    crash_report,
    devices,
    handles,
    resources,
    serialize,
    settling,
    shm,
)
from viceroy.runtime import context as context_mod
from viceroy.runtime.execution import (
    Executor,
    register_source,
    restore_filename,
    user_location,
)
from viceroy.runtime.held_signals import HeldSignals
from viceroy.runtime.output import OutputCapture, owned
from viceroy.runtime.rank_channels import RankChannels
from viceroy.runtime.user_errors import described
from viceroy.runtime.wire import Signer

_RESEND_INTERRUPT_S = 0.1
_ABORT_COLLECTIVES_AFTER_S = 0.3
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


class Rank:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.rank: int = cfg["rank"]
        self.signer = Signer(bytes.fromhex(cfg["key"]))
        self.direct = bool(cfg.get("direct"))
        # Work, control, and where what it sends goes (see rank_channels).
        self.channels = RankChannels(cfg, self.signer)
        self.token: str = cfg["token"]
        # Big results go back through shared-memory files the controller hands back for reuse.
        self.segments = shm.Segments(self.token) if self.direct and shm.available() else None
        # Pushed files it no longer maps, told with its next answer (the controller's Lender).
        self.let_go: collections.deque[str] = collections.deque()
        # Reentrant, so that a thread can tell it holds it (a signal handler run inside a send
        # must not send: `OutputCapture` leaves its output to the reader).
        self.send_lock = threading.RLock()
        self.sender: int | None = None  # the thread sending a message now
        # Messages to send, in order: one sent while its thread was in the middle of one
        # waits here to go right after it (see `_send`).
        self.outbox: collections.deque[list[Any]] = collections.deque()
        # Signal handlers set on the rank (the user's, its own) wait for a message half sent.
        self.signals = HeldSignals(self.rank, sending=lambda: self.sender == self.main_ident,
                                   in_user_code=lambda: self.in_user_code)
        self.signals.install()

        self.state_lock = threading.Lock()
        self.current: int | None = None
        self.in_user_code = False
        self.interrupt_target: int | None = None
        self.cancelled: set[int] = set()
        self.main_ident = threading.get_ident()

        namespace = _namespace_module().__dict__
        namespace.update({"__builtins__": __builtins__, "rank": self.rank})
        context_mod.provide(namespace, dict(cfg["coords"]), dict(cfg["dims"]))
        self.executor = Executor(namespace)
        context_mod._set_context(
            context_mod.Context(
                rank=self.rank,
                coords=dict(cfg["coords"]),
                dims=dict(cfg["dims"]),
                local_rank=cfg["local_rank"],
                world_size=cfg["world_size"],
                device=cfg.get("device"),
                host=cfg["host"],
                namespace=namespace,
                mesh_token=cfg["token"],
                _publish=self._publish,
            )
        )
        pipes = {int(fd): (r, w) for fd, (r, w) in cfg.get("output_pipes", {}).items()}
        self.output = OutputCapture(self._send_output, cfg["output_limit"], self.rank, lambda: self.current, pipes,
                                    sending_here=lambda: owned(self.send_lock))
        # A crash (segfault, abort) writes every thread's Python stack to a file the agent reads
        # after the rank died: the cell shows where it was.
        crash_report.enable(cfg.get("crash_file"))
        signal.signal(signal.SIGINT, self._on_sigint)

    # --- sending ---------------------------------------------------------------------------

    def _send(self, header: dict[str, Any], signed: list[Any] = [], data: list[Any] = []) -> None:  # noqa: B006
        header["r"] = self.rank
        frames = self.signer.pack(header, signed, data)
        me = threading.get_ident()
        with self.send_lock:
            # A message goes in pieces, from Python. A signal handler run between two on the
            # main thread waits for the rest (`HeldSignals`): had it raised there (an interrupt,
            # a timeout), half a message would garble the ones after it, the call's result
            # perhaps. A message sent by a handler that is not held (set past signal.signal),
            # or by a finalizer run there, goes right after, by the send further out.
            self.outbox.append(frames)
            if self.sender == me:
                return
            while self.outbox:  # again: one added just after the inner loop ended
                self.sender = me
                try:
                    while self.outbox:
                        self.channels.deliver(self.outbox.popleft())
                finally:
                    self.sender = None
        if me == self.main_ident:
            self.signals.run_held()

    def _send_result(self, item: dict[str, Any], signed: list[Any], data: list[Any]) -> None:
        """One rank's answer to a call, in the same shape as an agent's aggregate."""
        call_id = item.pop("id")
        item.pop("op", None)
        item["r"] = self.rank
        item["signed"] = len(signed)
        if self.let_go:
            item["released"] = [self.let_go.popleft() for _ in range(len(self.let_go))]
        if data and self.direct:  # big arrays back to the controller through shared memory
            data, entries, _ = shm.offload(data, self.token, self.segments)
            if entries:
                item["shm"] = entries
        if data:
            item["lens"] = [memoryview(d).nbytes for d in data]
        self._send({"op": "results", "id": call_id, "items": [item]}, signed, data)

    def _send_output(self, stream: str, data: bytes, call: int | None) -> None:
        self._send({"op": "out", "s": stream, "id": call}, [data])

    def _publish(self, kind: str, data: Any) -> None:
        payload, bufs = serialize.dumps(data)
        self.output.send_written()  # what this rank printed before a display goes before it
        self._send({"op": "pub", "kind": kind, "id": self.current}, [payload], [b.raw() for b in bufs])

    # --- IO thread ---------------------------------------------------------------------------

    def serve(self) -> None:
        self.channels.hello(self.rank, os.getpid())
        threading.Thread(target=self._control_loop, name="viceroy-io", daemon=True).start()
        self._work()

    def _control_loop(self) -> None:
        while True:
            header, signed, data = self.channels.receive_control()
            op = header.get("op")
            if op == "actor":
                # Actor messages are handled off the main thread, so actors answer while a cell
                # runs; viceroy.runtime.actors owns them.
                from viceroy.runtime.actors.host import handle

                handle(self, header, signed, data)
            elif op == "cancel":
                actors = sys.modules.get("viceroy.runtime.actors.host")  # loaded once an actor lives here
                if actors is None or not actors.cancel(self, header["id"]):
                    self._cancel(header["id"])  # a call on the main thread
            elif op == "peers_done":  # ranks that finished the call this one still runs
                call_peers.peers_done(header["id"], {int(r): cc for r, cc in header["done"]})
            elif op == "settled":  # a call that failed here has ended on every rank
                settling.settled(header["id"])
            elif op == "stacks":
                self._send({"op": "stacks", "id": header["id"]}, [_all_stacks(self.main_ident, self.in_user_code, self.executor.awaiting()).encode()])
            elif op == "stats":
                self._send({"op": "stats", "id": header["id"], "dropped": self.signer.dropped, **resources.use()})

    def _cancel(self, call_id: int) -> None:
        with self.state_lock:
            if self.current == call_id:
                self.interrupt_target = call_id
            else:
                self.cancelled.add(call_id)
                return
        threading.Thread(target=self._interrupt_until_done, args=(call_id,), name="viceroy-interrupt", daemon=True).start()

    def _interrupt_until_done(self, call_id: int) -> None:
        # Keep interrupting until the call ends: user code may swallow one KeyboardInterrupt.
        started, aborted = time.monotonic(), False
        while True:
            with self.state_lock:
                if self.current != call_id:
                    return
            signal.pthread_kill(self.main_ident, signal.SIGINT)
            if not aborted and time.monotonic() - started > _ABORT_COLLECTIVES_AFTER_S:
                # Still running: likely blocked inside a collective's C++ wait, which a signal
                # cannot break. Cutting the communicators' connections can.
                aborted = True
                collectives = sys.modules.get("viceroy.runtime.collectives")
                if collectives is not None:
                    try:
                        collectives.abort_all()
                    except Exception:
                        traceback.print_exc()
            time.sleep(_RESEND_INTERRUPT_S)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # (Held while the main thread sends a message: raised once it is all sent.)
        if self.in_user_code and self.interrupt_target is not None and self.interrupt_target == self.current:
            raise KeyboardInterrupt

    # --- main thread -------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            header, signed, data = self.channels.receive_work()
            if "returned" in header and self.segments is not None:
                self.segments.returned(header["returned"].get(str(self.rank), []))
            call_id = header["id"]
            settling.main_call_starts(call_id)
            with self.state_lock:
                if self.cancelled:  # ids grow; a cancel for an older call came after it ended
                    self.cancelled = {c for c in self.cancelled if c >= call_id}
                if call_id in self.cancelled:
                    self.cancelled.discard(call_id)
                    skipped = True
                else:
                    self.current = call_id
                    peers = call_peers.begin_call(call_id)
                    skipped = False
            if skipped:
                self._never_mapped(header)
                settling.failed(call_id)
                self._send_result(
                    {"op": "result", "id": call_id, "ok": False, "kind": "interrupted",
                     "summary": "interrupted before it started", "tb": ""}, [], []
                )
                continue
            self.output.begin_call(call_id)
            devices.make_current()
            reply = self._run_job(header, signed, data)
            if cc := call_peers.counts():  # collectives it started: peers still waiting compare
                reply[0]["cc"] = cc
            call_peers.end_call(peers)
            if not reply[0]["ok"]:  # its peers may still wait in one of its collectives
                settling.failed(call_id)
            with self.state_lock:
                self.current = None
                self.interrupt_target = None
            self.output.end_call()
            self._send_result(*reply)

    def _never_mapped(self, header: dict[str, Any]) -> None:
        """The lent files of a call this rank did not map (skipped, or failed before): let go."""
        self.let_go.extend(e[1] for e in header.get("shm", []) if len(e) > 3 and e[3])

    def _run_user(self, header: dict[str, Any], signed: list[Any], data: list[Any]) -> Any:
        """A call's code or function, in this rank's namespace. Interruptible only while the
        user's code runs (not while a view's coordinates are put back after it)."""
        if "code" in header:
            if "pyc" in header:  # the controller's compiled code, last
                compiled.take(header["code"], header["pyc"], signed[-1])
                signed = signed[:-1]
            if signed:  # names bound for this code (handles resolve to our values)
                handles.bind_names(self.executor.namespace, lambda: serialize.loads(signed[0], data))
            self.in_user_code = True
            try:
                return self.executor.run_code(header["code"], header["filename"])
            finally:
                self.in_user_code = False
        fn, args, kwargs = serialize.loads(signed[0], data)
        restore_filename(fn, header.get("fn_file"))
        self.in_user_code = True
        try:
            return self.executor.call(fn, args, kwargs)
        finally:
            self.in_user_code = False

    def _run_job(self, header: dict[str, Any], signed: list[Any], data: list[Any]) -> tuple[dict[str, Any], list[Any], list[Any]]:
        call_id = header["id"]
        try:
            try:
                for filename, source in header.get("sources", {}).items():
                    register_source(filename, source)
                if "shm" in header:
                    try:
                        data = shm.restore(data, header["shm"], self.token, unlink=False, on_release=self.let_go.append)
                    except BaseException:
                        self._never_mapped(header)
                        raise
                if header["op"] == "push":
                    values = serialize.loads(signed[0], data)
                    if "scatter" in header:  # one value per rank: keep ours
                        values = {header["scatter"]: values[self.rank]}
                    self.in_user_code = True
                    self.executor.namespace.update(values)
                    value = None
                else:
                    view = header.get("view")
                    if view:
                        with context_mod.calling_view(view[0], view[1], header["ranks"]):
                            value = self._run_user(header, signed, data)
                    else:  # the whole mesh: no view to put in place (nor a null context to enter)
                        value = self._run_user(header, signed, data)
            finally:
                self.in_user_code = False
        except KeyboardInterrupt as exc:
            # Where the user's code was; else where the call says it stopped (the tensor
            # engine's batch: the op it ran, and the controller line that issued it).
            where = user_location(exc) or (str(exc) if exc.args else "")
            return ({"op": "result", "id": call_id, "ok": False, "kind": "interrupted",
                     "summary": "interrupted", "where": where}, [], [])
        except BaseException as exc:  # SystemExit too: the rank lives on
            etype, summary, tb = described(exc)
            return ({"op": "result", "id": call_id, "ok": False, "kind": "error",
                     "etype": etype, "summary": summary, "tb": tb}, [], [])
        if value is None:
            return {"op": "result", "id": call_id, "ok": True}, [], []
        if serialize.json_scalar(value):  # in the header: the agent sends a host's as one column
            return {"op": "result", "id": call_id, "ok": True, "v": value}, [], []
        try:
            payload, bufs = serialize.dumps(value, to_host=True)  # GPU tensors arrive on the CPU
        except Exception as exc:
            return ({"op": "result", "id": call_id, "ok": False, "kind": "error", "etype": "TypeError",
                     "summary": f"TypeError: the result ({type(value).__name__}) cannot be sent back "
                                f"to the controller: {exc}. Return something picklable, or keep it on "
                                "the rank (assign it to a variable).",
                     "tb": ""}, [], [])
        return {"op": "result", "id": call_id, "ok": True}, [payload], [b.raw() for b in bufs]


def _all_stacks(main_ident: int, main_busy: bool, awaiting: list[Any]) -> str:
    """The user's threads and frames; none of the runtime's own. `awaiting`: the frames of the
    code the main thread's call awaits in (its loop runs on that thread, with none of them)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, str(ident))
        if name.startswith("viceroy-"):
            continue
        if ident == main_ident and not main_busy:
            parts.append(f"Thread {name}:\n  (idle: waiting for work)\n")
            continue
        frames = [f for f in traceback.extract_stack(frame) if not _is_runtime_file(f.filename)]
        stack = "".join(traceback.format_list(frames)) or "  (idle)\n"
        if ident == main_ident and awaiting:
            waits = traceback.StackSummary.extract(((f, f.f_lineno) for f in awaiting), lookup_lines=True)
            stack += "  awaiting in:\n" + "".join(traceback.format_list(waits))
        parts.append(f"Thread {name}:\n{stack}")
    return "\n".join(parts)


def _is_runtime_file(filename: str) -> bool:
    return filename.startswith(_RUNTIME_DIR) or filename.startswith("<frozen ")


def _namespace_module() -> types.ModuleType:
    """The module whose globals the rank's code runs in, "__mesh__", importable as a script's
    ``__main__`` is: dataclasses, pickle, torch.save and typing look classes up by their
    module. Its values travel to the controller by value (cloudpickle), as ``__main__``'s do,
    since no module of that name exists there."""
    import cloudpickle

    module = types.ModuleType("__mesh__")
    sys.modules["__mesh__"] = module
    cloudpickle.register_pickle_by_value(module)
    return module
