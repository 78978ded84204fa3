"""The ``viceroy.mesh`` comm target: mesh state for the widget and the JupyterLab panel.

A front end opens a comm with target ``viceroy.mesh``; the kernel answers with a state snapshot
and sends a new one whenever the mesh changes (at most ~10 per second). Messages from the front
end are requests:

    {"request": "snapshot"}                 -> {"type": "state", "dims", "ranks", "calls", "auto"}
    {"request": "logs", "rank": 2}          -> {"type": "logs", "rank": 2, "text": "..."}
    {"request": "stacks"}                   -> {"type": "stacks", "stacks": {"0": "..."}}
    {"request": "interrupt"}                -> {"type": "interrupted", "ranks": [...]}

Comm messages may arrive on a subshell thread while a cell runs, so the handlers only enqueue;
one worker thread does the work and sends the replies (sending on iopub is thread-safe).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

from viceroy.extension.session import MeshSession

TARGET = "viceroy.mesh"
MIN_INTERVAL = 0.1  # seconds between state pushes


class StateChannel:
    """Serves the comm target for one `MeshSession`."""

    def __init__(self, session: MeshSession) -> None:
        self.session = session
        self._comms: dict[str, Any] = {}
        self._work: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def register(self) -> None:
        """Register the target with the kernel's comm manager and watch the session."""
        import comm

        comm.get_comm_manager().register_target(TARGET, self._on_open)
        self.session.add_listener(self.changed)

    def unregister(self) -> None:
        import comm

        self.session.remove_listener(self.changed)
        manager = comm.get_comm_manager()
        if manager.targets.get(TARGET) == self._on_open:
            manager.unregister_target(TARGET, self._on_open)
        self._work.put(("stop", None))

    # --- handlers: enqueue only --------------------------------------------------------------

    def _on_open(self, c: Any, msg: dict[str, Any]) -> None:
        c.on_msg(lambda m: self._work.put(("request", (c, m["content"]["data"]))))
        c.on_close(lambda m: self._work.put(("closed", c)))
        self._work.put(("opened", c))
        self._ensure_thread()

    def changed(self) -> None:
        """The session's state changed (called on any thread)."""
        if self._comms:
            self._work.put(("dirty", None))

    # --- the worker --------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="viceroy-comm", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        last_push = 0.0
        dirty = False
        while True:
            timeout = max(0.0, last_push + MIN_INTERVAL - time.monotonic()) if dirty else None
            try:
                kind, item = self._work.get(timeout=timeout)
            except queue.Empty:
                kind, item = "flush", None
            if kind == "stop":
                return
            if kind == "opened":
                self._comms[item.comm_id] = item
                self._send(item, self.session.state.snapshot())
            elif kind == "closed":
                self._comms.pop(item.comm_id, None)
            elif kind == "dirty":
                dirty = True
            elif kind == "request":
                self._request(*item)
            if dirty and time.monotonic() - last_push >= MIN_INTERVAL:
                snap = self.session.state.snapshot()
                for c in list(self._comms.values()):
                    self._send(c, snap)
                last_push, dirty = time.monotonic(), False

    def _request(self, c: Any, data: Any) -> None:
        req = data.get("request") if isinstance(data, dict) else None
        mesh = self.session.mesh
        try:
            if req == "snapshot":
                self._send(c, self.session.state.snapshot())
            elif mesh is None and req in ("logs", "stacks", "interrupt"):
                self._send(c, {"type": "error", "request": req, "message": "no mesh is up"})
            elif req == "logs":
                rank = int(data.get("rank", -1))
                text = mesh.logs(rank, tail=int(data.get("tail", 200)))  # type: ignore[union-attr]
                self._send(c, {"type": "logs", "rank": rank, "text": text})
            elif req == "stacks":
                stacks = mesh.stacks().by_rank()  # type: ignore[union-attr]
                self._send(c, {"type": "stacks", "stacks": {str(r): s for r, s in stacks.items()}})
            elif req == "interrupt":
                mesh.interrupt()  # type: ignore[union-attr]
                self._send(c, {"type": "interrupted", "ranks": list(mesh.ranks)})  # type: ignore[union-attr]
            else:
                self._send(
                    c, {"type": "error", "request": req, "message": f"unknown request {req!r}"}
                )
        except Exception as e:  # a bad request must not kill the worker
            self._send(c, {"type": "error", "request": req, "message": f"{type(e).__name__}: {e}"})

    @staticmethod
    def _send(c: Any, data: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # the front end went away
            c.send(data)
