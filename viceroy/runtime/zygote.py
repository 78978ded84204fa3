"""The fork server: imports the heavy modules once (torch, ...), then forks ranks on request.

Ranks forked from a warm template start in milliseconds instead of seconds. Nothing here may
initialise CUDA before a fork. The agent is a child subreaper, and each rank is forked twice
(the middle process exits at once), so ranks become the agent's children: the agent learns of a
rank's death from waitpid(). Each rank leads a process group of its own, so that what user code
starts on it goes with it (see procs.end_descendants).

Protocol on stdin/stdout, one JSON object per line:
  agent -> zygote: {"config": {...}} once, then {"spawn": {rank config}} per rank
  zygote -> agent: {"ready": true, "preloaded": [...], "failed": {...}}, then {"rank": r, "pid": p}
and, on the Unix socket ``config["fd_sock"]``, before each {"rank": r, "pid": p}: the read ends
of that rank's stdout and stderr pipes (SCM_RIGHTS), with the rank's number as the data.
Its stdin's end is the agent's: when the agent was killed (it cleaned up nothing), the fork
server removes the agent's socket directory (``config["rundir"]``) on its way out.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import sys
import time
from typing import Any

from viceroy.runtime.procs import orphaned, remove_run_dir


def _spawn(rank_cfg: dict[str, Any], lifeline_fd: int, fd_sock: socket.socket | None) -> int:
    # The rank's stdout and stderr pipes, made here: the agent gets their read ends too, to
    # read out what the rank wrote but did not send before it died (a crash's last words).
    outputs = {1: os.pipe(), 2: os.pipe()} if fd_sock is not None else {}
    if outputs:
        rank_cfg = {**rank_cfg, "output_pipes": {str(fd): list(p) for fd, p in outputs.items()}}
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                with contextlib.suppress(OSError):
                    os.setpgid(0, 0)
                os.close(w)
                if fd_sock is not None:
                    fd_sock.close()
                from viceroy.runtime import rank_start

                rank_start.main(rank_cfg, lifeline_fd)  # never returns
            with contextlib.suppress(OSError):  # here too: its group exists once its pid is told
                os.setpgid(pid, pid)
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    if fd_sock is not None:
        socket.send_fds(fd_sock, [str(rank_cfg["rank"]).encode()], [outputs[1][0], outputs[2][0]])
        for pr, pw in outputs.values():
            os.close(pr)
            os.close(pw)
    data = b""
    while chunk := os.read(r, 64):
        data += chunk
    os.close(r)
    os.waitpid(middle, 0)
    return int(data)


def main() -> None:
    line = sys.stdin.readline()
    if not line:
        return
    cfg = json.loads(line)["config"]
    for p in reversed(cfg.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    t0 = time.perf_counter()
    preloaded, failed = [], {}
    # Our own rank code and its dependencies first, then what the user asked to warm up.
    for name in ["viceroy.runtime.rank", *cfg.get("preload", [])]:
        try:
            importlib.import_module(name)
            preloaded.append(name)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
    if "torch" in preloaded:
        # Track torch's own gloo groups from the start, so an interrupt can abort them.
        try:
            from viceroy.runtime import collectives

            collectives.install_torch_hooks()
        except Exception as exc:
            failed["viceroy.runtime.collectives"] = f"{type(exc).__name__}: {exc}"
    lifeline_fd = cfg["lifeline_fd"]
    fd_sock = socket.socket(fileno=cfg["fd_sock"]) if cfg.get("fd_sock") is not None else None
    agent = os.getppid()
    _reply({"ready": True, "preloaded": preloaded, "failed": failed, "seconds": time.perf_counter() - t0})
    for line in sys.stdin:
        req = json.loads(line)
        pid = _spawn(req["spawn"], lifeline_fd, fd_sock)
        _reply({"rank": req["spawn"]["rank"], "pid": pid})
    if cfg.get("rundir") and orphaned(agent):
        remove_run_dir(cfg["rundir"])


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
