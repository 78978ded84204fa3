"""What the notebook knows about its mesh right now, and how a front end is told of changes.

`MeshState` folds runtime events (and polled resource use) into one record per rank; events
arrive on the runtime's IO thread while front ends read snapshots from others, so every access
holds one lock and snapshots are plain copies. `Stream` turns successive snapshots into the
numbered messages one front end receives: a full ``state`` first (and after a gap), then
``diff``s holding only the changed fields (the wire format: `viceroy.extension.comm`).
`rank_hosts` reads what the runtime's events leave out: where each rank runs.

>>> s = MeshState()
>>> s.reset({"gpus": 2}, {0: "idle", 1: "idle"})
>>> s.apply({"type": "rank_exit", "rank": 1, "reason": "SIGKILL"})
True
>>> s.snapshot()["ranks"][1]["state"]
'dead'
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from viceroy.extension.terminal import terminal_line

LAST_LINE_CHARS = 200
LABEL_CHARS = 80
PARTIAL_CHARS = 4 * LAST_LINE_CHARS  # of a line still being written, kept until its newline
STATES = ("starting", "idle", "running", "done", "error", "dead", "interrupted")
FAILED_STATES = ("error", "dead")
# How a finished call leaves a rank, by the failure kind the rank reported.
_AFTER_CALL = {"error": "error", "interrupted": "interrupted", "timeout": "interrupted"}


# Terminal escapes (colours, cursor moves, titles) and other control characters: a tile shows
# text, and a browser would draw them as boxes or "[32m".
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])|[\x00-\x08\x0b-\x1f\x7f]")


def plain_text(text: str) -> str:
    """``text`` without terminal escape sequences and control characters (tabs and newlines
    stay; a ``\\r`` rewrite is resolved by `terminal_line`, per line)."""
    return _ESCAPES.sub("", text)


def rank_coords(dims: dict[str, int], rank_position: int) -> dict[str, int]:
    """Row-major coordinates of the n-th rank of a mesh with these dims."""
    coords: dict[str, int] = {}
    rest = rank_position
    for name, size in reversed(list(dims.items())):
        coords[name] = rest % size
        rest //= size
    return {name: coords[name] for name in dims}


def first_line(text: str, limit: int = LABEL_CHARS) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters (with an ellipsis)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def summarize(ranks: Iterable[dict[str, Any]]) -> dict[str, int]:
    """``{"total", "alive", "running", "starting", "failed"}``; failed counts ranks in error or
    dead; starting, ranks not up yet (a mesh coming up, a restart)."""
    states = [r["state"] for r in ranks]
    return {
        "total": len(states),
        "alive": sum(s != "dead" for s in states),
        "running": states.count("running"),
        "starting": states.count("starting"),
        "failed": sum(s in FAILED_STATES for s in states),
    }


def _new_record(rank: int, coords: dict[str, int], state: str, host: str, pid: int | None) -> dict[str, Any]:
    return {
        "rank": rank, "coords": coords, "host": host, "state": state, "call": None, "label": "",
        "started": None, "elapsed": None, "rss": None, "gpu_mem": None, "gpu_util": None,
        "last_line": "", "pid": pid, "exit": None, "error": None,
    }


def rank_hosts(mesh: Any) -> dict[int, str]:
    """rank -> the host it runs on, as its launcher names it (this machine's name locally)."""
    controller = getattr(mesh, "_controller", None)
    host_of: dict[int, int] = getattr(controller, "_host_of", {})
    names = [str(getattr(h, "address", h)) for h in getattr(getattr(controller, "launcher", None), "hosts", [])]
    here = socket.gethostname()
    return {r: names[h] if h < len(names) else here for r, h in host_of.items()}


class MeshState:
    """Thread-safe record of the mesh's shape, each rank's state and work, and the calls in flight.

    A rank is "idle" only before its first call, "running" while any call runs on it, then
    "done", "error" or "interrupted" by how its last call ended; "dead" once its process exited,
    "starting" while it is (re)started. ``clock`` gives the epoch seconds stamped on calls.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._dims: dict[str, int] | None = None
        self._ranks: dict[int, dict[str, Any]] = {}
        self._calls: dict[int, dict[str, Any]] = {}
        self._in_flight: dict[int, list[int]] = {}  # rank -> calls running there, oldest first
        self._tracebacks: dict[int, str] = {}
        self._partial: dict[tuple[int, str], str] = {}  # (rank, stream) -> its unfinished line
        self.auto = False

    def reset(
        self,
        dims: dict[str, int] | None,
        states: dict[int, str] | None = None,
        pids: dict[int, int] | None = None,
        hosts: dict[int, str] | None = None,
    ) -> None:
        """A new mesh (or none, when ``dims`` is None); ``states`` as `Mesh.states` gives them."""
        with self._lock:
            self._dims = dict(dims) if dims is not None else None
            self._calls.clear()
            self._in_flight.clear()
            self._tracebacks.clear()
            self._partial.clear()
            self._ranks = {
                r: _new_record(
                    r, rank_coords(self._dims or {}, i), "running" if s == "running" else s,
                    (hosts or {}).get(r, "localhost"), (pids or {}).get(r),
                )
                for i, (r, s) in enumerate(sorted((states or {}).items()))
            }

    def starting(self, ranks: Iterable[int]) -> None:
        """These ranks are being (re)started: their exits until ready do not make them dead."""
        with self._lock:
            for r in ranks:
                if r in self._ranks:
                    self._ranks[r]["state"] = "starting"

    def set_states(self, states: dict[int, str]) -> bool:
        """Reconcile with the runtime's own view (`Mesh.states`): a dead, starting or idle rank
        there is so here, except that a rank idle there after a call keeps how the call ended.
        A rank still "running" here only for calls that have finished, and idle there, was given
        up on by those calls (it answered too late): it becomes "interrupted". True if anything
        changed."""
        changed = False
        with self._lock:
            for r, theirs in states.items():
                rec = self._ranks.get(r)
                if rec is None:
                    continue
                ours = rec["state"]
                new = ours
                if theirs in ("dead", "starting"):
                    new = theirs
                elif theirs == "idle" and ours in ("dead", "starting"):
                    new = "idle"
                elif theirs == "idle" and ours == "running" and not any(
                    c in self._calls for c in self._in_flight.get(r, [])
                ):
                    new = "interrupted"
                    self._in_flight.pop(r, None)
                    self._finish_timing(rec)
                if new != ours:
                    rec["state"], changed = new, True
        return changed

    def apply(self, ev: dict[str, Any]) -> bool:
        """Fold one runtime event in; True if the snapshot changed.

        A ``rank_done`` event may carry the rank's failure (``kind``, ``summary``, ``tb``);
        without it a failed rank counts as "error" with no summary.
        """
        kind = ev.get("type")
        with self._lock:
            rec = self._ranks.get(ev.get("rank", -1))
            if kind == "output" and rec is not None:
                last = self._feed(rec["rank"], str(ev.get("stream")), ev.get("text") or "")
                if last is not None and last != rec["last_line"]:
                    rec["last_line"] = last
                    return True
                return False
            if kind == "call_started":
                return self._call_started(ev)
            if kind == "rank_done" and rec is not None:
                return self._rank_done(rec, ev)
            if kind == "ranks_done":  # successes, one event per host
                done = {"call": ev.get("call"), "ok": True}
                hit = [self._rank_done(r, done) for r in map(self._ranks.get, ev.get("ranks", ())) if r is not None]
                return any(hit)
            if kind == "call_finished":
                return self._calls.pop(ev.get("call", -1), None) is not None
            if kind == "rank_exit" and rec is not None:
                self._in_flight.pop(rec["rank"], None)
                if rec["state"] == "running":
                    self._finish_timing(rec)
                if rec["state"] != "starting":  # a restart replaces the process: not a death
                    rec["state"] = "dead"
                rec["exit"], rec["pid"] = ev.get("reason"), None
                return True
            if kind == "rank_ready" and rec is not None:
                # A fresh process: nothing has run on it yet.
                rec.update(
                    state="idle", pid=ev.get("pid"), exit=None, call=None, label="", started=None,
                    elapsed=None, last_line="", error=None, rss=None, gpu_mem=None, gpu_util=None,
                )
                self._in_flight.pop(rec["rank"], None)
                self._tracebacks.pop(rec["rank"], None)
                for stream in [k for k in self._partial if k[0] == rec["rank"]]:
                    del self._partial[stream]
                return True
        return False

    def _feed(self, rank: int, stream: str, text: str) -> str | None:
        """The line a terminal would show last after this chunk of a rank's stream, as plain
        text of at most LAST_LINE_CHARS; None if the chunk shows nothing new. Chunks end
        anywhere (a flush, a pipe's buffer): the unfinished line of each stream is kept and
        continued by its next chunk."""
        key = (rank, stream)
        *complete, rest = (self._partial.pop(key, "") + text).split("\n")
        if rest:
            self._partial[key] = terminal_line(rest)[:PARTIAL_CHARS]
        for line in (rest, *reversed(complete)):
            shown = plain_text(terminal_line(line))
            if shown.strip():
                return shown[:LAST_LINE_CHARS]
        return None

    def _call_started(self, ev: dict[str, Any]) -> bool:
        now = self._clock()
        label = first_line(ev.get("label") or "")
        call = ev["call"]
        ranks = list(ev.get("ranks", []))
        self._calls[call] = {"call": call, "label": label, "ranks": ranks, "started": now}
        for r in ranks:
            rec = self._ranks.get(r)
            if rec is None or rec["state"] in ("dead", "starting"):
                continue
            self._in_flight.setdefault(r, []).append(call)
            rec.update(state="running", call=call, label=label, started=now, elapsed=None)
        return True

    def _rank_done(self, rec: dict[str, Any], ev: dict[str, Any]) -> bool:
        r, call = rec["rank"], ev.get("call")
        calls = self._in_flight.get(r, [])
        if call in calls:
            # Calls started here before this one that have finished (given up on: interrupted
            # ranks deaf to it ran on) are over on this rank too, though it never answered them.
            at = calls.index(call)
            calls[: at + 1] = [c for c in calls[:at] if c in self._calls]
        elif call is not None and rec["call"] is not None and rec["call"] != call:
            return False  # a late answer to a call given up on, after a later call started here
        if ev.get("ok"):
            outcome = "done"
        else:
            outcome = _AFTER_CALL.get(ev.get("kind") or "error", "error")
            if outcome == "error":
                rec["error"] = first_line(plain_text(ev.get("summary") or ""), LAST_LINE_CHARS) or "failed"
                self._tracebacks[r] = ev.get("tb") or ""
        if calls:  # another call still runs here (the Python API can overlap calls)
            latest = self._calls.get(calls[-1])
            if latest is not None:
                rec.update(call=latest["call"], label=latest["label"], started=latest["started"])
            return True
        self._in_flight.pop(r, None)
        if rec["state"] in ("dead", "starting"):
            return True
        rec["state"] = outcome
        self._finish_timing(rec)
        return True

    def _finish_timing(self, rec: dict[str, Any]) -> None:
        if rec["started"] is not None and rec["elapsed"] is None:
            rec["elapsed"] = round(max(0.0, self._clock() - rec["started"]), 3)

    def apply_stats(self, ranks: dict[int, dict[str, Any]]) -> bool:
        """Fold in per-rank ``rss``, ``gpu_mem``, ``gpu_util`` (as `Mesh.stats` gives them)."""
        changed = False
        with self._lock:
            for r, stats in ranks.items():
                rec = self._ranks.get(r)
                if rec is None or rec["state"] == "dead":
                    continue
                for key in ("rss", "gpu_mem", "gpu_util"):
                    if key in stats and stats[key] != rec[key]:
                        rec[key], changed = stats[key], True
        return changed

    def traceback(self, rank: int) -> str:
        """The full traceback (user frames) of this rank's last error; "" if none."""
        with self._lock:
            if rank not in self._ranks:
                raise IndexError(f"no rank {rank} in this mesh")
            return self._tracebacks.get(rank, "")

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy: ``{"type": "state", "dims", "ranks", "calls", "auto", "summary"}``
        (`Stream` adds the ``seq``)."""
        with self._lock:
            ranks = [dict(self._ranks[r], coords=dict(self._ranks[r]["coords"])) for r in sorted(self._ranks)]
            return {
                "type": "state",
                "dims": dict(self._dims) if self._dims is not None else None,
                "ranks": ranks,
                "calls": [dict(c, ranks=list(c["ranks"])) for c in self._calls.values()],
                "auto": self.auto,
                "summary": summarize(ranks),
            }

    def states(self) -> dict[int, str]:
        with self._lock:
            return {r: info["state"] for r, info in self._ranks.items()}


def diff_ranks(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{"<rank>": {only the fields that changed}}`` between two rank lists of the same ranks."""
    before = {r["rank"]: r for r in old}
    out: dict[str, dict[str, Any]] = {}
    for rec in new:
        prev = before.get(rec["rank"], {})
        changed = {k: v for k, v in rec.items() if prev.get(k, object()) != v}
        if changed:
            out[str(rec["rank"])] = changed
    return out


class Stream:
    """The numbered messages one front end receives, made from successive snapshots.

    ``seq`` grows by one per message, snapshots and diffs alike. `next` gives a full ``state``
    the first time, when asked (`want_snapshot`, e.g. after the front end saw a gap) and when
    the mesh's shape changed; otherwise a ``diff`` of what changed since the last message, or
    None when nothing did.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.want_snapshot = True
        self._sent: dict[str, Any] | None = None

    def next(self, snap: dict[str, Any], memo: dict[int, Any] | None = None) -> dict[str, Any] | None:
        """The message that brings this front end to ``snap``, or None. Streams that last sent
        the same snapshot share one diff through ``memo`` (one dict per ``snap``)."""
        sent = self._sent
        same_shape = (
            sent is not None
            and sent["dims"] == snap["dims"]
            and [r["rank"] for r in sent["ranks"]] == [r["rank"] for r in snap["ranks"]]
        )
        if self.want_snapshot or sent is None or not same_shape:
            self.want_snapshot = False
            return self._number(snap, dict(snap))
        if memo is None or id(sent) not in memo:
            ranks = diff_ranks(sent["ranks"], snap["ranks"])
            if memo is not None:
                memo[id(sent)] = ranks
        else:
            ranks = memo[id(sent)]
        if not ranks and all(sent[k] == snap[k] for k in ("calls", "auto", "summary")):
            return None
        msg = {"type": "diff", "ranks": ranks, "calls": snap["calls"], "auto": snap["auto"], "summary": snap["summary"]}
        return self._number(snap, msg)

    def _number(self, snap: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        self._sent = snap
        msg["seq"] = self.seq
        return msg
