"""A real one-node Slurm cluster started by the tests: munged with its own key and socket,
slurmctld and slurmd (Debian's slurm-wlm) with a configuration in a temp dir and non-default
ports. Two partitions of the one node: `debug` (the default, shared by up to 64 jobs) and `whole`
(a job there has the node to itself, so the next one queues behind it). Daemons are stopped by
the pids in their pid files. `make test` installs slurm-wlm and munge (.ci/system-deps)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.conftest import wait_until

DAEMONS = ("munged", "slurmctld", "slurmd")


def skip_reason() -> str | None:
    missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge; make test does, as root)"
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root"
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = socket.gethostname()
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        r = self.root
        r.chmod(0o700)
        for d in ("state", "spool", "log"):
            (r / d).mkdir()
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        try:
            subprocess.run(
                ["munged", "--force", f"--socket={r}/munge.sock", f"--key-file={key}", f"--log-file={r}/log/munged.log",
                 f"--pid-file={r}/munged.pid", f"--seed-file={r}/munged.seed"],
                check=True, capture_output=True, timeout=30,
            )
            ctld_port, d_port = _free_ports(2)
            self.conf.write_text(CONFIG.format(node=self.node, root=r, cpus=os.cpu_count(), ctld=ctld_port, slurmd=d_port))
            for daemon in ("slurmctld", "slurmd"):
                subprocess.run([daemon, "-f", str(self.conf)], check=True, capture_output=True, timeout=30, env=self.env)
            wait_until(lambda: self.sinfo() == "idle", 30, f"the Slurm node to be idle (log: {r}/log)")
        except BaseException:
            self.stop()
            raise
        return self

    def sinfo(self) -> str:
        """The node's state ("idle"), as each partition sees it."""
        proc = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=self.env)
        return " ".join(sorted(set(proc.stdout.split())))

    def run(self, *argv: str) -> str:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, check=True, timeout=60).stdout

    def jobs(self) -> list[str]:
        """Job ids in the queue (any state)."""
        return self.run("squeue", "-h", "-o", "%i").split()

    def stop(self) -> None:
        """Cancel every job, then stop the daemons by their pid files (also after a failed start)."""
        if self.conf.exists():
            subprocess.run(["scancel", "--full", "--user=root"], capture_output=True, env=self.env, timeout=30)
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.root / f"{name}.pid"
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
                wait_until(lambda pid=pid: not _alive(pid), 15, f"{name} (pid {pid}) to stop")
            except ProcessLookupError:
                pass
            except AssertionError:
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


CONFIG = """\
ClusterName=viceroytest
SlurmctldHost={node}
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
InactiveLimit=0
KillWait=2
NodeName={node} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:64
PartitionName=whole Nodes={node} MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
"""
