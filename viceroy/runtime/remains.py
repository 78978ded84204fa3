"""Ending what one launch of an agent left on its host, when the agent cannot be asked to.

A frozen agent (SIGSTOP, a hang) reads neither its lifeline nor its controller's silence, and
its ranks live as long as it does: killing the ssh client that started it leaves all of them
running on the host. So the ssh launcher tags each agent it starts with a fresh nonce in its
environment (``VICEROY_AGENT_ID``, which its fork server and ranks inherit), and to end that
launch it runs this file on the host, fed to the host's Python on stdin::

    ssh HOST PYTHON - NONCE  < remains.py

It imports nothing but the standard library, so it needs no viceroy there, of any version.
Every process whose environment carries the nonce, and everything below one (a subreaper's
orphans, daemons included), is stopped (SIGSTOP: none can fork or restart anything meanwhile)
until a scan finds nothing new, then killed (SIGKILL). The nonce is fresh per launch: nothing
else is ever matched, not a recycled pid, not another mesh's agent, not the host's next launch.
Nothing is killed by name.
"""

from __future__ import annotations

import os
import re
import signal
import sys

TAG = "VICEROY_AGENT_ID"
RANK_TAG = "VICEROY_RANK_ID"  # the same for one rank's life: what it starts goes with it
NONCE = re.compile(r"[0-9a-f]{16,64}")


def process_table() -> dict[int, tuple[int, int, bool]] | None:
    """pid -> (parent, process group, alive) of every process /proc shows; None without /proc.
    Not alive: a zombie, dead but for its exit status. (Here, not in procs, which uses it too:
    this file must run on a host with nothing but the standard library.)"""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        state, ppid, pgid = stat[stat.rindex(b")") + 2:].split()[:3]  # the name may hold anything
        table[int(name)] = (int(ppid), int(pgid), state not in (b"Z", b"X"))
    return table


def _table() -> dict[int, int] | None:
    """pid -> parent of each live process; None without /proc."""
    table = process_table()
    return None if table is None else {pid: ppid for pid, (ppid, _, alive) in table.items() if alive}


def _tagged(pids: set[int], mark: bytes) -> set[int]:
    """Those of `pids` whose environment holds `mark` (``NAME=VALUE``), as far as we may read it."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.add(pid)
        except OSError:  # gone, or not ours to read (then not ours to kill either)
            continue
    return found


def end_launch(nonce: str, tag: str = TAG) -> int | None:
    """Stop, then kill, every process whose `tag` is `nonce`, and everything below them. Returns
    how many were killed; None where there is no /proc to find them in."""
    mark, me = f"{tag}={nonce}".encode(), os.getpid()
    held: set[int] = set()
    checked: set[int] = set()  # environments read already: a pid's environment never changes
    while True:
        table = _table()
        if table is None:
            return None
        roots = held | _tagged(set(table) - checked - held, mark)
        checked |= set(table)
        children: dict[int, list[int]] = {}
        for pid, ppid in table.items():
            children.setdefault(ppid, []).append(pid)
        found, todo = set(roots), list(roots)
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        new = (found & set(table)) - held - {me}
        if not new:
            break
        for pid in new:  # held still: nothing they do can add to the count from here
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            held.add(pid)
    for pid in held:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(held)


def rundir_prefix(nonce: str) -> str:
    """How the name of the socket directory of the agent launched with `nonce` starts (in its
    temp directory): the directory a killed agent could not remove is found by it."""
    return f"viceroy-agent-{nonce[:12]}-"


def remove_rundirs(nonce: str) -> None:
    import glob
    import shutil
    import tempfile

    for path in glob.glob(os.path.join(tempfile.gettempdir(), rundir_prefix(nonce) + "*")):
        shutil.rmtree(path, ignore_errors=True)


def new_nonce() -> str:
    """A fresh tag for one launch of an agent."""
    import secrets

    return secrets.token_hex(12)


def end_over_ssh(ssh: list[str], python: str, nonce: str, where: str, timeout: float) -> str | None:
    """On the controller: run this file on a host through `ssh` (the ssh command line up to and
    including the host) with the host's `python` (as the remote shell reads it), to end the
    launch tagged `nonce`; given up after `timeout` s (the ssh killed, none left behind). None
    when it ran; else why not, naming `where` (the host) and what to do."""
    import subprocess

    with open(__file__, "rb") as f:
        source = f.read()
    argv = [*ssh, f"exec {python} - {nonce}"]
    try:
        proc = subprocess.run(argv, input=source, capture_output=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:  # (run() kills the ssh, and waits for it)
        why = f"no answer within {timeout:.0f} s"
    except OSError as e:
        why = str(e)
    else:
        if proc.returncode == 0:
            return None
        words = proc.stderr.decode(errors="replace").strip().splitlines()
        why = f"exit code {proc.returncode}" + (f": {words[-1]}" if words else "")
    return (f"could not end the old agent of {where} on its host ({why}); it and its ranks may still run "
            f"there. Find them on that host with `grep -l {TAG}={nonce} /proc/[0-9]*/environ`, and "
            "kill them (kill -9 PID)")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not NONCE.fullmatch(argv[1]):
        print(f"usage: python - NONCE < remains.py   (NONCE: the {TAG} of the launch to end)", file=sys.stderr)
        return 2
    ended = end_launch(argv[1])
    if ended is None:
        print("no /proc on this host: cannot find the agent's processes", file=sys.stderr)
        return 3
    remove_rundirs(argv[1])  # what the agent, killed, could not remove
    print(f"ended {ended} process(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
