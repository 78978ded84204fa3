"""The host agent: one per host. Spawns and supervises the host's ranks (fork server, waitpid,
restarts) and reports their exits. When the mesh spans several hosts it also relays the
controller's messages to its ranks and sends one aggregate of their replies per call, so the
controller's work grows with hosts; when the controller's own host is the only one, ranks talk
to the controller directly and the agent stays out of the message path.

Started by a launcher with its configuration (the mesh key included) as the first line on
stdin. stdin stays open for the agent's life: its EOF means the controller is gone, and the
agent kills its ranks and exits.

What user code starts on a rank belongs to the mesh. Each rank leads a process group; when a
rank dies or is restarted, the rest of its group is killed with it. The agent is a child
subreaper, so nothing its ranks start can leave its tree, not even a daemon that double-forked
into a session of its own: when the agent stops (a shutdown, or its controller gone), it ends
every process below it before it exits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import Any

import zmq

from viceroy.runtime import devices, interfaces, multipart, remains, shm
from viceroy.runtime.agent_ranks import RankLifecycle, RankSlot
from viceroy.runtime.answers import Relay
from viceroy.runtime.forkserver import ChildExits, ForkServer
from viceroy.runtime.links import LinkServer
from viceroy.runtime.procs import (
    HEARTBEAT_S,
    agent_timeout,
    become_subreaper,
    clean_after_dead_parent,
    die_now,
    end_descendants,
    hold_lifeline,
    signal_group,
)
from viceroy.runtime.shape import RunSet
from viceroy.runtime.wire import BadMessage, Signer


class Agent(RankLifecycle):
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.host: int = cfg["host"]
        self.gen: int = cfg.get("gen", 0)  # which launch of this host (a restarted host is a new one)
        self.signer = Signer(bytes.fromhex(cfg["key"]))
        self.silence_limit = agent_timeout(cfg.get("host_timeout", 3.0))
        self.last_from_ctrl = time.monotonic()
        self.parent = os.getppid()  # the controller, when a local launcher started us
        become_subreaper()
        self.exits = ChildExits()
        self.lifeline_r, self.lifeline_w = os.pipe()
        tag = os.environ.get(remains.TAG, "")  # its launch's, by which a killed agent's is found
        self.rundir = tempfile.mkdtemp(prefix=remains.rundir_prefix(tag) if tag else "viceroy-agent-")  # 0700
        self.zygote = ForkServer(cfg.get("cwd"), cfg.get("sys_path", []), cfg.get("preload", []), self.lifeline_r, self.rundir)

        self.ctx = zmq.Context()
        self.from_ctrl = self.ctx.socket(zmq.DEALER)
        self.from_ctrl.setsockopt(zmq.IDENTITY, f"agent-{self.host}.{self.gen}".encode())
        self.from_ctrl.setsockopt(zmq.LINGER, 0)
        self.from_ctrl.connect(cfg["controller_in"])
        self.to_ctrl = self.ctx.socket(zmq.PUSH)
        self.to_ctrl.setsockopt(zmq.LINGER, 2000)
        self.to_ctrl.connect(cfg["controller_out"])

        self.to_ranks = self.ctx.socket(zmq.ROUTER)
        self.to_ranks.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.to_ranks.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.to_ranks.setsockopt(zmq.LINGER, 0)
        self.to_ranks.bind(f"ipc://{self.rundir}/in")
        self._poller = zmq.Poller()

        # One host alone on the controller's machine: the ranks talk to the controller directly
        # and this agent only spawns, reaps and reports. Otherwise it relays, and sends one
        # aggregate of its ranks' results per call; its ranks send on local links to it (their
        # messages survive their death; see links).
        self.direct = bool(cfg.get("direct"))
        self.rank_links = None if self.direct else LinkServer(f"{self.rundir}/links")
        self.slots: dict[int, RankSlot] = {}
        gpus, local_ranks = devices.visible_gpus(), len(cfg["ranks"])
        host_env = {**cfg.get("env", {})}
        host_env.update(interfaces.gloo_env({**os.environ, **host_env}))  # ranks inherit this environment
        for rc in cfg["ranks"]:
            gpu_env, device = devices.assign(rc["local_rank"], local_ranks, gpus)
            device_env = {"RANK": rc["rank"], "LOCAL_RANK": rc["local_rank"], "WORLD_SIZE": cfg["world_size"],
                          "LOCAL_WORLD_SIZE": local_ranks, **gpu_env}
            rank_cfg = {
                **rc,
                "device": device,
                "key": cfg["key"],
                "token": cfg["token"],
                "dims": cfg["dims"],
                "world_size": cfg["world_size"],
                "host": self.host,
                "output_limit": cfg["output_limit"],
                "inbox": cfg["controller_in"] if self.direct else f"ipc://{self.rundir}/in",
                "direct": self.direct,
                "links": cfg.get("controller_links") if self.rank_links is None else self.rank_links.path,
                "env": {**host_env, **device_env},
            }
            self.slots[rc["rank"]] = RankSlot(rank_cfg, rank=rc["rank"])
        self.by_pid: dict[int, int] = {}
        self.tag_of: dict[int, str] = {}
        self.early_exits: dict[int, int] = {}
        self.relay = Relay(self._to_controller)
        self.stopping = False

    # --- processes ---------------------------------------------------------------------------

    def _on_controller_gone(self) -> None:
        self._end_host()
        clean_after_dead_parent(self.parent, str(self.cfg.get("controller_in", "")))
        die_now(0)

    def _on_terminated(self, signum: int, frame: Any) -> None:
        """SIGTERM: the cluster ends the job (scancel, a time limit, preemption). What lives
        below the agent goes as when the controller is gone; then the agent dies of the signal,
        so that whoever waits for it sees why."""
        self._end_host()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _end_host(self) -> None:
        # The socket directory first: under Slurm the same EOF ends the job, and the step's
        # SIGTERM may come before the ranks are all down (what is connected stays connected).
        shutil.rmtree(self.rundir, ignore_errors=True)
        self.kill_all()
        end_descendants()  # the fork server, and whatever the ranks started, daemons included
        self.zygote.kill()
        shm.discard_mesh(self.cfg["token"])

    # --- messages ------------------------------------------------------------------------------

    def _to_controller(self, header: dict[str, Any], signed: Iterable[Any] = (), data: Iterable[Any] = ()) -> None:
        header["host"], header["gen"] = self.host, self.gen
        multipart.send(self.to_ctrl, self.signer.pack(header, list(signed), list(data)))

    def _send_rank(self, rank: int, frames: list[Any], control: bool = False) -> bool:
        slot = self.slots[rank]
        try:
            multipart.send(self.to_ranks, [slot.control_ident if control else slot.work_ident, *frames])
            return True
        except zmq.ZMQError:
            return False

    def _on_controller_message(self, frames: list[Any]) -> None:
        try:
            header, _, _ = self.signer.unpack(frames)
        except BadMessage:
            return
        self.last_from_ctrl = time.monotonic()
        op = header.get("op")
        if op == "heartbeat":
            return
        wanted = RunSet(header.get("ranks", ()))
        mine = [r for r in self.slots if r in wanted]
        if op in ("run", "push", "actor"):
            sent, refused = set(), []
            for r in mine:
                slot = self.slots[r]
                if slot.ready and self._send_rank(r, frames, control=op == "actor"):
                    sent.add(r)
                else:
                    refused.append({"r": r, "ok": False, "kind": "died", "summary": "not running", "signed": 0})
            if header["id"] != 0:  # 0: one-way (an actor broadcast): nobody waits for an answer
                self.relay.expect(header["id"], sent, refused)
        elif op in ("cancel", "peers_done", "settled"):
            for r in mine:
                if self.slots[r].ready:
                    self._send_rank(r, frames, control=True)
        elif op in ("stacks", "stats"):
            for r in mine:
                if self.slots[r].ready:
                    self._send_rank(r, frames, control=True)
            if op == "stats":
                self._to_controller({"op": "stats", "id": header["id"], "agent": self.host, "dropped": self.signer.dropped})
        elif op == "restart":
            for r in mine:
                slot = self.slots[r]
                if not slot.alive:
                    self._spawn(r)
                    continue
                slot.respawn = True
                if slot.pid:
                    signal_group(slot.pid, signal.SIGKILL)
                # else its fork is still in flight (a rank that talks to the controller directly
                # can be back there first): killed once the fork server names it
        elif op == "shutdown":
            self.stopping = True

    def _on_rank_message(self, frames: list[Any]) -> None:
        try:
            header, signed, data = self.signer.unpack(frames)
        except BadMessage:
            return
        op = header.get("op")
        if op == "results":
            (item,) = header["items"]
            self.relay.answer(header["id"], item, signed, data)
        else:  # out, pub, stacks, stats: already signed with the mesh key; pass through
            multipart.send(self.to_ctrl, frames)

    def _on_hello(self, frames: list[Any]) -> None:
        try:
            header, _, _ = self.signer.unpack(frames[1:])
        except BadMessage:
            return
        r = header.get("r")
        slot = self.slots.get(r) if isinstance(r, int) else None
        if slot is None or frames[0].bytes not in (slot.work_ident, slot.control_ident):
            return
        slot.hellos += 1
        if slot.hellos < 2:
            return
        slot.ready = True
        slot.pid = header["pid"]
        self.by_pid[header["pid"]] = slot.rank
        self._to_controller({"op": "rank_ready", "r": slot.rank, "pid": header["pid"]})

    def _drain_ranks(self) -> None:
        if self.rank_links is None:
            return
        for frames, _ in self.rank_links.read_all(self._poller):
            self._on_rank_message(frames)

    @staticmethod
    def _drain(sock: zmq.Socket[Any], handle: Any, limit: int = 256) -> None:
        """Handle what is queued on `sock` without going back to poll() for each message."""
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handle(frames)

    # --- main loop -------------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        """From a thread with its own socket: it proves the host and the process are alive,
        even while the event loop is busy forking or relaying."""
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 4)  # a cut link queues a few beats, not hours of them
        sock.connect(self.cfg["controller_out"])
        while not self.stopping:
            header = {"op": "heartbeat", "host": self.host, "gen": self.gen}
            try:
                sock.send_multipart(self.signer.pack(header), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            time.sleep(HEARTBEAT_S)
        sock.close()

    def _check_controller(self) -> None:
        silent = time.monotonic() - self.last_from_ctrl
        if silent > self.silence_limit:
            print(f"viceroy agent (host {self.host}): nothing from the controller at "
                  f"{self.cfg['controller_in']} for {silent:.1f} s; stopping this host's ranks",
                  file=sys.stderr, flush=True)
            self._on_controller_gone()

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_terminated)
        if self.cfg.get("stdin_lifeline", True):
            hold_lifeline(sys.stdin.fileno(), self._on_controller_gone)
        threading.Thread(target=self._heartbeat, name="viceroy-heartbeat", daemon=True).start()
        self._to_controller({"op": "agent_hello", "pid": os.getpid(), "zygote": self.zygote.pid,
                             "endpoints": [f"ipc://{self.rundir}/in", *([self.rank_links.path] if self.rank_links else [])]})
        for r in self.slots:
            self._spawn(r)
        poller = self._poller
        for sock in (self.from_ctrl, self.to_ranks):
            poller.register(sock, zmq.POLLIN)
        poller.register(self.exits.fileno(), zmq.POLLIN)
        poller.register(self.zygote.fileno(), zmq.POLLIN)
        if self.rank_links is not None:
            poller.register(self.rank_links.fd, zmq.POLLIN)
        wait = HEARTBEAT_S
        while not self.stopping:
            self._check_controller()
            ready = poller.poll(max(1, int(wait * 1000)))
            if self.rank_links is not None:
                for frames, _ in self.rank_links.service(dict(ready), poller):
                    self._on_rank_message(frames)
            for sock, _ in ready:
                if sock is self.from_ctrl:
                    self._drain(self.from_ctrl, self._on_controller_message)
                elif sock is self.to_ranks:
                    self._drain(self.to_ranks, self._on_hello)
                elif sock == self.exits.fileno():
                    for pid, status in self.exits.read():
                        self._on_death(pid, status)
                elif sock == self.zygote.fileno():
                    for msg in self.zygote.replies():
                        self._on_zygote_reply(msg)
                    if self.zygote.closed:
                        poller.unregister(self.zygote.fileno())
            wait = self.relay.flush_held(HEARTBEAT_S)
        self._shutdown()

    def _shutdown(self) -> None:
        """Ranks, and every process they started, get SIGTERM, then SIGKILL after a short grace;
        then the agent exits."""
        if not end_descendants(grace=0.5):  # no /proc to find them in: the ranks at least
            self._end_ranks()
        self.zygote.kill()
        shutil.rmtree(self.rundir, ignore_errors=True)
        self._to_controller({"op": "bye"})
        self.to_ctrl.close(linger=500)
        die_now(0)


def main() -> None:
    """`python -m viceroy.runtime.agent`: read the config line from stdin and serve."""
    line = sys.stdin.readline()
    if not line:
        sys.exit("viceroy agent: expected a configuration line on stdin")
    from viceroy.runtime.attach_agent import reach_controller

    Agent(reach_controller(json.loads(line), dict(os.environ))).run()


if __name__ == "__main__":
    main()
