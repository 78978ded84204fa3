"""The controller's hosts: starting the mesh and restarting its ranks, launching each host's
agent, heartbeats both ways, and giving a host up when its agent falls silent or exits (its
ranks dead, its calls failed naming it), so that `restart(failed_only=True)` can launch it
again as a new generation.

A mixin of `Controller`, which owns the state declared here; kept apart because it is one
concern with its own thread (the heartbeat) and its own failure story.
"""

from __future__ import annotations

import functools
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from viceroy.runtime.errors import MeshStartError
from viceroy.runtime.launcher import AgentProcess, HostPlan, Launcher
from viceroy.runtime.logs import RankLogs
from viceroy.runtime.procs import HEARTBEAT_S, remove_socket_dir
from viceroy.runtime.shape import Shape, describe_ranks
from viceroy.runtime.transport import ControllerSockets
from viceroy.runtime.wire import Signer

# An attached agent is given up when its first heartbeat has not come within the host timeout
# and this much more (it has its configuration; it starts its fork server and connects back).
FIRST_BEAT_GRACE_S = 5.0
# How long ending what a lost launch left on its host may take (one ssh, killed after that).
REMAINS_TIMEOUT_S = 10.0
# ... and at shutdown, when every host still to be seen to is tried at once.
REMAINS_AT_SHUTDOWN_S = 5.0
LAST_WORDS_LINES = 20  # of a rank that died while restarting, shown in restart's error


class Remains:
    """One launch of a host whose processes may still run there, where `AgentProcess.kill`
    could not reach them (a frozen agent on another host, its ranks with it). Ended at most
    once, by the first of: the give-up, a restart of that host, the shutdown; a try that
    failed (the host out of reach) is tried again by the next."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        self._lock = threading.Lock()
        self.ended = False
        self.why: str | None = None

    def end(self, timeout: float) -> str | None:
        """None once nothing is left; else why not (the host named, what to do)."""
        with self._lock:  # a second caller waits for the first one's try
            if not self.ended:
                self.why = self.agent.end_remains(timeout)
                self.ended = self.why is None
            return self.why


class HostLifecycle:
    launcher: Launcher
    shape: Shape
    signer: Signer
    _sockets: ControllerSockets
    _config: dict[str, Any]
    _direct: bool
    _closed: bool
    _plans: dict[int, HostPlan]
    _gen: dict[int, int]
    _last_seen: dict[int, float]
    _lost: dict[int, str]
    _agents: dict[int, AgentProcess]
    _agent_gen: dict[int, int]
    _remains: list[Remains]
    agent_info: dict[int, dict[str, Any]]
    _host_of: dict[int, int]
    _state: dict[int, str]
    _dead: set[int]
    _exit_reason: dict[int, str]
    _never_ready: set[int]
    _agents_ready: set[int]
    logs: RankLogs
    _host_timeout: float
    _startup_error: str | None
    _lock: threading.RLock
    _changed: threading.Condition
    _beat_thread: threading.Thread
    _beats_stop: threading.Event

    def call_soon(self, task: Callable[[], None]) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _set_state(self, r: int, state: str) -> None:
        raise NotImplementedError

    def _broadcast(self, header: dict[str, Any], hosts: set[int] | None = None) -> None:
        raise NotImplementedError

    def _handle_received(self) -> None:
        raise NotImplementedError

    def _on_ranks_exit(
        self, ranks: Sequence[int], reason: str, respawning: bool = False, pid: int | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        raise NotImplementedError

    # --- starting and restarting -----------------------------------------------------------

    def start(self, timeout: float) -> None:
        """Launch the agents; return when every rank has answered."""
        try:
            plans = self.launcher.plan(self.shape.dims)
            self._direct = self.launcher.same_host and len(plans) == 1
            for plan in plans:
                self._plans[plan.index] = plan
                for rc in plan.ranks:
                    self._host_of[rc["rank"]] = plan.index
                self._launch(plan.index)
            self._beat_thread.start()
            deadline = time.monotonic() + timeout
            with self._changed:
                while not (all(s == "idle" for s in self._state.values()) and self._plans.keys() <= self._agents_ready):
                    left = deadline - time.monotonic()
                    if self._startup_error or left <= 0 or self._dead:
                        break
                    self._changed.wait(left)
                error = self._startup_error
                if self._dead and not error:  # no point waiting for the others: say why now
                    error = self._exited_while("starting", sorted(self._dead))
                waiting = [r for r, s in self._state.items() if s != "idle"]
        except BaseException:  # an interrupt while waiting for the ranks, too
            self.shutdown()  # nothing half-started stays behind
            raise
        if error or waiting:
            # A lost host's last words are in its reason already (its log may be gone by now).
            # Each host's log under its name: whose words are whose.
            tails = {h: a.log_tail().strip() for h, a in sorted(self._agents.items()) if h not in self._lost}
            logs = "\n".join(f"{self._agents[h].label}:\n" + textwrap.indent(t, "  ") for h, t in tails.items() if t)
            late = sorted({self._host_of[r] for r in waiting})
            on = "; ".join(self._agents[h].label for h in late if h in self._agents)
            self.shutdown()
            what = error or f"{describe_ranks(waiting)} did not start within {timeout} s" + (f" (on {on})" if on else "")
            raise MeshStartError(f"the mesh did not start: {what}" + (f"\nagent logs:\n{logs}" if logs else ""))

    def restart(self, ranks: Sequence[int], timeout: float = 60.0) -> None:
        if not ranks:
            return
        with self._lock:
            self._check_open()
            for r in ranks:
                self._set_state(r, "starting")
                self._never_ready.discard(r)
            lost = {self._host_of[r] for r in ranks} & set(self._lost)
            for h in lost:  # a new agent for a lost host brings all its ranks back
                ranks = list(ranks) + [r for r in self._plans[h].ranks_ids() if r not in ranks]
                for r in self._plans[h].ranks_ids():
                    self._set_state(r, "starting")
                    self._never_ready.discard(r)
            marks = {r: self.logs.mark(r) for r in ranks}  # an error shows only what this life printed
        for h in sorted(lost):
            self._launch(h)
        others = [r for r in ranks if self._host_of[r] not in lost]
        if others:
            self._broadcast({"op": "restart", "ranks": others})
        deadline = time.monotonic() + timeout
        with self._changed:
            while any(self._state[r] != "idle" for r in ranks):
                again = {self._host_of[r] for r in ranks} & set(self._lost)
                if again:
                    raise RuntimeError("during restart: " + "\n".join(self._lost[h] for h in sorted(again)))
                died = [r for r in ranks if r in self._never_ready]
                if died:  # no point waiting for them: say why now
                    again_hint = "; mesh.restart(failed_only=True) tries again"
                    raise RuntimeError(self._exited_while("restarting", died, again_hint, marks))
                left = deadline - time.monotonic()
                if left <= 0:
                    late = [r for r in ranks if self._state[r] != "idle"]
                    raise RuntimeError(f"{describe_ranks(late)} did not come back within {timeout} s"
                                       + self._give_up_late({self._host_of[r] for r in late} & lost, timeout))
                self._changed.wait(left)

    def _exited_while(self, doing: str, ranks: list[int], hint: str = "", since: dict[int, int] | None = None) -> str:
        """Why `ranks` exited before they were up, with what each printed last (a traceback,
        often: it is written to the rank's output pipes from its first moment); `since`: each
        rank's log mark from before this life began."""
        why = sorted({self._exit_reason.get(r, "exited") for r in ranks})
        words = "".join(f"\nrank {r}'s last output:\n" + textwrap.indent(t, "  ")
                        for r in ranks if (t := self.logs.tail(r, LAST_WORDS_LINES, (since or {}).get(r))))
        return f"{describe_ranks(ranks)} exited while {doing} ({'; '.join(why)}){hint}{words}"

    def _give_up_late(self, hosts: set[int], timeout: float) -> str:
        """Under `_changed`: the relaunched `hosts` whose agent did not come back in time are lost
        again (their ranks dead, their launch stopped), so a later `restart(failed_only=True)`
        tries them again; returns why, with each host's last words (or how to attach one)."""
        why = f"no agent came back within {timeout} s of mesh.restart"
        for h in hosts:
            self.call_soon(functools.partial(self._host_lost, h, self._gen[h], why))
        give = time.monotonic() + 10
        while any(h not in self._lost for h in hosts) and time.monotonic() < give:
            self._changed.wait(give - time.monotonic())  # `_host_lost` notifies
        return "".join(f"\n{self._lost[h]}" for h in sorted(hosts) if h in self._lost)

    # --- one host's agent -------------------------------------------------------------------

    def _agent_ident(self, h: int) -> bytes:
        return f"agent-{h}.{self._gen.get(h, 0)}".encode()

    def _launch(self, h: int) -> None:
        """Start (or, after a loss, start again) host `h`'s agent, as a new generation."""
        plan = self._plans[h]
        for why in self._end_remains(h, REMAINS_TIMEOUT_S):  # the old launch must not run beside the new
            print(f"viceroy: restarting host {h} all the same: {why}", file=sys.__stderr__, flush=True)
        gen = self._gen[h] = self._gen.get(h, -1) + 1
        self._last_seen.pop(h, None)
        self._lost.pop(h, None)
        cfg = {**self._config, "host": h, "gen": gen, "ranks": plan.ranks, "direct": self._direct}
        agent = self.launcher.start(plan, cfg)
        self._agents[h] = agent
        self._agent_gen[h] = gen
        threading.Thread(target=self._watch_agent, args=(agent, gen), name="viceroy-agent-watch", daemon=True).start()

    def _heartbeats(self) -> None:
        """Beat to every live agent; give up a host whose agent has been silent too long."""
        beat = self.signer.pack({"op": "heartbeat"})
        tick = time.monotonic()
        while not self._closed:
            now = time.monotonic()
            starved = now - tick > HEARTBEAT_S + 1.0  # this process was not running: judge nobody
            tick = now
            for h in list(self._agents):
                if h in self._lost:
                    continue
                if self._closed:
                    return
                self._sockets.send_once(self._agent_ident(h), beat)
                seen = self._last_seen.get(h)
                if seen is not None and now - seen > self._host_timeout and not starved:
                    self.call_soon(functools.partial(self._host_silent, h, self._gen[h]))
                gen = self._agent_gen.get(h)
                if gen != self._gen[h]:
                    continue  # being launched again: `_agents[h]` is still the old launch's
                attached = getattr(self._agents[h], "attached_at", None)
                if seen is None and attached is not None and not starved \
                        and now - attached > self._host_timeout + FIRST_BEAT_GRACE_S:
                    self.call_soon(functools.partial(self._host_never_heard, h, gen))
            self._beats_stop.wait(HEARTBEAT_S)

    def _host_silent(self, h: int, gen: int) -> None:
        """On the IO thread: read what has arrived (beats may be queued behind a busy moment),
        and give the host up only if it is still silent."""
        self._handle_received()
        seen = self._last_seen.get(h)
        silent = time.monotonic() - seen if seen is not None else 0.0
        if silent > self._host_timeout:
            why = f"no heartbeat from its agent for {silent:.1f} s: a cut link, a host down, or a frozen agent"
            self._host_lost(h, gen, why)

    def _host_never_heard(self, h: int, gen: int) -> None:
        """On the IO thread: an attached agent took its host's configuration and has not been
        heard from since (no process of ours to watch: only its first heartbeat tells)."""
        self._handle_received()
        agent = self._agents.get(h)
        attached = getattr(agent, "attached_at", None)
        if h in self._last_seen or attached is None or self._agent_gen.get(h) != gen:
            return
        ports = getattr(agent, "ports", "")
        why = (f"its agent took the host's configuration {time.monotonic() - attached:.1f} s ago and was never "
               "heard from: it died right after attaching, or it cannot reach the mesh's other ports on this "
               f"machine{f' ({ports})' if ports else ''}; a firewall that lets only the attach port through "
               "blocks them: open those ports too (or start the agent again)")
        self._host_lost(h, gen, why)

    def _host_lost(self, h: int, gen: int, why: str) -> None:
        """On the IO thread: host `h` (launch `gen`) is gone; its ranks are dead, its calls fail
        naming it. `restart(failed_only=True)` launches it again."""
        if self._closed or self._gen.get(h) != gen or h in self._lost:
            return
        agent = self._agents[h]
        reason = f"{agent.label} lost: {why}"
        log = agent.log_tail(5).strip()
        advice = agent.advice(log)
        lost = reason + (f"; its agent's last words:\n{log}" if log else "") + (f"\n{advice}" if advice else "")
        remains = Remains(agent)
        with self._lock:  # before the loss is seen: a restart or shutdown right after ends it
            self._remains.append(remains)
        with self._changed:
            starting = any(s == "starting" for r, s in self._state.items() if self._host_of.get(r) == h)

        def publish() -> None:  # with the ranks dead, before anyone waiting wakes
            if starting:
                self._startup_error = lost  # read now: the log goes with the agent
            self._lost[h] = lost

        self._on_ranks_exit([r for r in self._plans[h].ranks_ids() if self._state[r] != "dead"], reason, then=publish)
        where = self.agent_info.get(h, {}).get("endpoints", [""])[0] if self.launcher.same_host else ""
        threading.Thread(target=self._put_down, args=(agent, where, remains), name="viceroy-agent-kill", daemon=True).start()

    @staticmethod
    def _put_down(agent: AgentProcess, rank_inbox: str, remains: Remains) -> None:
        """Kill a lost host's agent with its fork server and ranks, and, on this machine, remove
        the socket directory none of them lived to remove (`rank_inbox` is ``ipc://DIR/in``);
        on another host, end what is left there (a frozen agent outlives its ssh client)."""
        agent.kill()
        remove_socket_dir(rank_inbox)
        remains.end(REMAINS_TIMEOUT_S)  # a failure is tried again on restart, and at shutdown

    def _end_remains(self, h: int | None, timeout: float, also: Sequence[AgentProcess] = ()) -> list[str]:
        """End what lost launches of host `h` (of every host: None), and the agents `also`, left
        on their hosts, all at once, within about `timeout` s. Returns why, for each that could
        not be ended (blocks: never on the event loop)."""
        with self._lock:
            todo = [r for r in self._remains if h is None or r.agent.host == h]
            self._remains = [r for r in self._remains if r not in todo]
        todo += [Remains(a) for a in also]
        if not todo:
            return []
        threads = [threading.Thread(target=r.end, args=(timeout,), name="viceroy-remains", daemon=True) for r in todo]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout + 2.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        failed = [r for r in todo if not r.ended]
        with self._lock:
            self._remains += failed  # tried again later (a restart, the shutdown)
        return [r.why or f"{r.agent.label}: its old agent may still run there" for r in failed]

    def lost_hosts(self) -> dict[int, str]:
        """host -> why it was given up, for hosts lost and not yet restarted."""
        return dict(self._lost)

    def _watch_agent(self, agent: AgentProcess, gen: int) -> None:
        code = agent.wait()
        if not self._closed:
            self.call_soon(lambda: self._host_lost(agent.host, gen, f"its agent on host {agent.host} exited ({agent.describe_exit(code)})"))
