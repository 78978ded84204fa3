"""The host agent's ranks: one slot per rank, and their lifecycle (spawned through the fork
server, named by it, reaped on death with their last words, respawned when asked, ended on
shutdown). A mixin of `Agent`, which owns the state declared here and routes the messages;
kept apart because supervising processes is one concern and relaying messages another."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from viceroy.runtime import crash_report, remains
from viceroy.runtime.answers import Relay
from viceroy.runtime.forkserver import ChildExits, ForkServer, OutputPipes
from viceroy.runtime.procs import describe_exit, end_descendants, signal_group

LAST_WORDS_MAX = 1 << 20  # bytes read out of a dead rank's pipes, at most, per stream


@dataclass
class RankSlot:
    cfg: dict[str, Any]
    pid: int | None = None
    ready: bool = False
    hellos: int = 0
    alive: bool = False
    respawn: bool = False
    rank: int = -1
    tag: str = ""  # this life's VICEROY_RANK_ID (remains.RANK_TAG)
    crash_file: str = ""  # where this life's crash report goes (crash_report)
    output: OutputPipes = field(default_factory=lambda: OutputPipes([]))

    @property
    def work_ident(self) -> bytes:
        return f"w{self.rank}".encode()

    @property
    def control_ident(self) -> bytes:
        return f"c{self.rank}".encode()


class RankLifecycle:
    slots: dict[int, RankSlot]
    by_pid: dict[int, int]
    tag_of: dict[int, str]  # rank pid -> the tag of its life
    early_exits: dict[int, int]
    rundir: str
    zygote: ForkServer
    exits: ChildExits
    relay: Relay
    stopping: bool

    def _to_controller(self, header: dict[str, Any], signed: Iterable[Any] = (), data: Iterable[Any] = ()) -> None:
        raise NotImplementedError

    def _drain_ranks(self) -> None:
        raise NotImplementedError

    def _spawn(self, rank: int) -> None:
        slot = self.slots[rank]
        slot.pid, slot.ready, slot.alive, slot.respawn, slot.hellos = None, False, True, False, 0
        # Each life gets a tag of its own in its environment, which what it starts inherits: a
        # daemon that left its process group is found by it when the rank dies.
        slot.tag = remains.new_nonce()
        slot.crash_file = f"{self.rundir}/crash-{rank}-{slot.tag}"
        self.zygote.spawn({**slot.cfg, "env": {**slot.cfg.get("env", {}), remains.RANK_TAG: slot.tag},
                           "crash_file": slot.crash_file})

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """`sig` to each rank and its process group."""
        for slot in self.slots.values():
            if slot.pid and slot.alive:
                signal_group(slot.pid, sig)

    def _forking(self) -> bool:
        """Whether a rank's fork is in flight (the fork server has not named it yet)."""
        return any(s.alive and s.pid is None for s in self.slots.values())

    def _on_zygote_reply(self, msg: dict[str, Any]) -> None:
        if "ready" in msg:
            self._to_controller({"op": "agent_ready", "preloaded": msg["preloaded"], "failed": msg["failed"],
                                 "seconds": msg["seconds"]})
            return
        r, pid = msg["rank"], msg["pid"]
        self.slots[r].output.close()
        self.slots[r].output = self.zygote.output_pipes(r)
        self.slots[r].pid = pid
        self.by_pid[pid] = r
        self.tag_of[pid] = self.slots[r].tag
        if pid in self.early_exits:
            self._on_death(pid, self.early_exits.pop(pid))
        elif self.slots[r].respawn:  # restarted again while it was being forked
            signal_group(pid, signal.SIGKILL)
        if not self._forking():
            self.early_exits.clear()  # none of them was a rank

    def _on_death(self, pid: int, status: int) -> None:
        if pid == self.zygote.pid:
            if not self.stopping:
                self._to_controller({"op": "agent_error", "error": f"the fork server exited ({describe_exit(status)})"})
            return
        r = self.by_pid.pop(pid, None)
        if r is None:
            # A rank the fork server has not named yet, or something a rank started, left to
            # us (we are a subreaper) by a parent that died.
            if self._forking():
                self.early_exits[pid] = status
            return
        end_descendants(group=pid)  # what it started goes with it
        if tag := self.tag_of.pop(pid, ""):  # daemons too (scanning /proc takes a while: aside)
            threading.Thread(target=remains.end_launch, args=(tag, remains.RANK_TAG), name="viceroy-rank-remains",
                             daemon=True).start()
        slot = self.slots[r]
        if slot.pid != pid:
            return
        # Results the rank sent just before dying arrive first, then what it wrote but did not
        # send (a crash's last words), then its exit.
        self._drain_ranks()
        self._last_words(slot)
        slot.alive, slot.ready = False, False
        reason = "restarted" if slot.respawn else describe_exit(status)  # killed by us, as asked
        self.relay.rank_gone(r)
        self._to_controller({"op": "rank_exit", "r": r, "reason": reason, "respawning": slot.respawn, "pid": pid})
        if slot.respawn and not self.stopping:
            self._spawn(r)

    def _last_words(self, slot: RankSlot) -> None:
        """Send on what a dead rank's stdout and stderr pipes still hold, then its crash report
        if it wrote one, as its output."""
        for stream, data in slot.output.left(LAST_WORDS_MAX):
            self._to_controller({"op": "out", "s": stream, "id": None, "r": slot.rank}, [data])
        slot.output.close()
        if slot.crash_file and (report := crash_report.take(slot.crash_file, LAST_WORDS_MAX)):
            self._to_controller({"op": "out", "s": "stderr", "id": None, "r": slot.rank}, [report.encode()])

    def _end_ranks(self) -> None:
        self.kill_all(signal.SIGTERM)
        deadline = time.monotonic() + 0.5
        alive = {s.pid for s in self.slots.values() if s.alive and s.pid}
        while alive and time.monotonic() < deadline:
            exited = self.exits.wait(deadline - time.monotonic())
            if not exited:
                break
            alive -= {pid for pid, _ in exited}
        for pid in alive:
            signal_group(pid, signal.SIGKILL)
