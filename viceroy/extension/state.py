"""What the notebook knows about its mesh right now, kept current from runtime events.

Events arrive on the runtime's IO thread while cells and comm handlers read snapshots from
others, so every access holds one lock and snapshots are plain copies.

>>> s = MeshState()
>>> s.reset({"gpus": 2}, {0: "idle", 1: "idle"})
>>> s.apply({"type": "rank_exit", "rank": 1, "reason": "SIGKILL"})
True
>>> s.snapshot()["ranks"][1]["state"]
'dead'
"""

from __future__ import annotations

import threading
from typing import Any

from viceroy.extension.output import terminal_line

LAST_LINE_CHARS = 200


def rank_coords(dims: dict[str, int], rank_position: int) -> dict[str, int]:
    """Row-major coordinates of the n-th rank of a mesh with these dims."""
    coords: dict[str, int] = {}
    rest = rank_position
    for name, size in reversed(list(dims.items())):
        coords[name] = rest % size
        rest //= size
    return {name: coords[name] for name in dims}


class MeshState:
    """Thread-safe record of the mesh's shape, each rank's state and last line, the running call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dims: dict[str, int] | None = None
        self._ranks: dict[int, dict[str, Any]] = {}
        self._calls: dict[int, dict[str, Any]] = {}
        self.auto = False

    def reset(self, dims: dict[str, int] | None, states: dict[int, str] | None = None) -> None:
        """A new mesh (or none, when ``dims`` is None)."""
        with self._lock:
            self._dims = dict(dims) if dims is not None else None
            self._calls.clear()
            self._ranks = {
                r: {
                    "rank": r,
                    "coords": rank_coords(self._dims or {}, i),
                    "state": state,
                    "last_line": "",
                    "pid": None,
                    "exit": None,
                }
                for i, (r, state) in enumerate(sorted((states or {}).items()))
            }

    def set_states(self, states: dict[int, str]) -> None:
        with self._lock:
            for r, state in states.items():
                if r in self._ranks:
                    self._ranks[r]["state"] = state

    def apply(self, ev: dict[str, Any]) -> bool:
        """Fold one runtime event in; True if the snapshot changed."""
        kind = ev.get("type")
        with self._lock:
            rank = self._ranks.get(ev.get("rank", -1))
            if kind == "output" and rank is not None:
                last = terminal_line(ev.get("text", "").rstrip("\n").rsplit("\n", 1)[-1])
                if last.strip():
                    rank["last_line"] = last[:LAST_LINE_CHARS]
                    return True
                return False
            if kind == "call_started":
                self._calls[ev["call"]] = {
                    "call": ev["call"],
                    "label": ev.get("label") or "",
                    "ranks": list(ev.get("ranks", [])),
                }
                for r in ev.get("ranks", []):
                    if r in self._ranks and self._ranks[r]["state"] != "dead":
                        self._ranks[r]["state"] = "running"
                return True
            if kind == "rank_done" and rank is not None:
                if rank["state"] == "running":
                    rank["state"] = "idle"
                return True
            if kind == "call_finished":
                self._calls.pop(ev.get("call", -1), None)
                return True
            if kind == "rank_exit" and rank is not None:
                rank["state"], rank["exit"] = "dead", ev.get("reason")
                return True
            if kind == "rank_ready" and rank is not None:
                rank["state"], rank["pid"], rank["exit"] = "idle", ev.get("pid"), None
                return True
        return False

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy: ``{"type": "state", "dims", "ranks": [...], "calls": [...], "auto"}``."""
        with self._lock:
            return {
                "type": "state",
                "dims": dict(self._dims) if self._dims is not None else None,
                "ranks": [
                    dict(self._ranks[r], coords=dict(self._ranks[r]["coords"]))
                    for r in sorted(self._ranks)
                ],
                "calls": [dict(c, ranks=list(c["ranks"])) for c in self._calls.values()],
                "auto": self.auto,
            }

    def states(self) -> dict[int, str]:
        with self._lock:
            return {r: info["state"] for r, info in self._ranks.items()}
