"""The Slurm launcher: one agent per node, each a job step started with `srun`.

Inside an allocation (``salloc``/``sbatch``: $SLURM_JOB_ID is set) the steps run in it;
otherwise the launcher asks for one and holds it with a small command run under ``salloc``
whose stdin is a pipe from this process: the allocation ends when the mesh shuts down, and
also when this process dies by any signal (the pipe closes, the command exits, salloc gives
the allocation back). While the request is still pending there is no command yet to see the
pipe close: a guard process (guard.py) holding a lifeline of its own from this process sends
salloc SIGTERM when it breaks, on which salloc withdraws the request. So a killed kernel
leaves no salloc and no job behind, granted or pending. While it is pending, Slurm is asked
why (squeue's reason): one it never resolves by itself (slurm_pending.NEVER_GRANTED, e.g. more nodes than the
partition has) cancels the job at once and says what to change, instead of waiting out
`allocation_timeout`.

Each agent is ``srun --jobid J --overlap -N1 -n1 -w NODE python -m viceroy.runtime.agent``:
its configuration, key included, goes on srun's stdin (Slurm forwards it to the task), never
on a command line, and that stdin stays open as the agent's lifeline, as with ssh.

Several agents may share a node (``agents_per_node``, e.g. one per GPU group, or a test cluster
of one node). Ranks connect back to the controller's address: pass ``interface=`` an address
the nodes can reach (loopback by default, which only works on a one-node cluster).
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from viceroy.runtime.arguments import check_argv, check_count, check_python, check_seconds
from viceroy.runtime.forkserver import Lines
from viceroy.runtime.guard import start_guard, stop_guard
from viceroy.runtime.launcher import (
    AgentProcess,
    HostPlan,
    Launcher,
    agent_env,
    plan_by_hosts,
    start_child_agent,
    with_master_addr,
)
from viceroy.runtime.slurm_pending import (
    POLL_LATER_S,
    POLL_S,
    never_granted,
    partition_limits,
    reason_code,
    why_pending,
)


class SlurmError(RuntimeError):
    pass


def _run(argv: list[str], timeout: float = 30.0) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed here: the Slurm launcher needs Slurm's client commands") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(argv)}` did not answer within {timeout:.0f} s; is slurmctld up (sinfo)?") from None
    if proc.returncode != 0:
        raise SlurmError(f"`{' '.join(argv)}` failed (exit code {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout + proc.stderr


def expand_nodelist(nodelist: str) -> list[str]:
    """``node[1-3],gpu7`` -> ["node1", "node2", "node3", "gpu7"] (Slurm's own expansion)."""
    return _run(["scontrol", "show", "hostnames", nodelist]).split()


@dataclass
class SlurmLauncher(Launcher):
    """Agents as Slurm job steps; see the module's docstring."""

    python: str = sys.executable
    agents_per_node: int = 1
    srun_options: Sequence[str] = field(default_factory=tuple)
    salloc_options: Sequence[str] = field(default_factory=tuple)
    allocation_timeout: float = 300.0
    name = "slurm"
    same_host = False

    def __post_init__(self) -> None:
        check_python(self.python, "the nodes'")
        self.agents_per_node = check_count(self.agents_per_node, "agents_per_node", "agents (mesh hosts) per node")
        self.allocation_timeout = check_seconds(self.allocation_timeout, "allocation_timeout", none=None)
        self.srun_options = check_argv(self.srun_options, "srun_options", "srun", "-p gpu -t 60")
        self.salloc_options = check_argv(self.salloc_options, "salloc_options", "salloc", "-p gpu -t 60")
        self.job_id: str | None = None
        self.nodes: list[str] = []
        self._holder: subprocess.Popen[bytes] | None = None  # salloc holding the allocation we asked for
        self._guard: subprocess.Popen[bytes] | None = None  # ends salloc if this process dies (guard.py)
        self._said: list[str] = []  # what salloc has said so far
        self._reason = ""  # why Slurm last said the job was pending

    @staticmethod
    def hosts_in_allocation(agents_per_node: int = 1) -> int | None:
        """How many hosts the current allocation holds (None outside one)."""
        job = os.environ.get("SLURM_JOB_ID")
        var = "SLURM_JOB_NUM_NODES" if os.environ.get("SLURM_JOB_NUM_NODES") else "SLURM_NNODES"
        n = os.environ.get(var)
        if not job or not n:
            return None
        try:
            nodes = int(n)
        except ValueError:
            nodes = 0
        if nodes < 1:
            raise SlurmError(
                f"${var}={n!r} is not a number of nodes: in a Slurm allocation ($SLURM_JOB_ID={job}) Slurm sets it to "
                f"the allocation's node count. Unset it or set it to that count (`scontrol show job {job}` says "
                "NumNodes), or say how many hosts: Mesh.slurm(hosts=N, ...)"
            )
        return nodes * agents_per_node

    def plan(self, dims: dict[str, int]) -> list[HostPlan]:
        if list(dims)[:1] != ["hosts"]:
            raise ValueError(f"a Slurm mesh's first dim is 'hosts' (one agent each), e.g. hosts=4, gpus=8; got {dims}")
        hosts = dims["hosts"]
        if hosts % self.agents_per_node:
            raise ValueError(f"hosts={hosts} does not split into nodes of agents_per_node={self.agents_per_node}")
        self._allocate(hosts // self.agents_per_node)
        return plan_by_hosts(dims)

    def _allocate(self, n_nodes: int) -> None:
        if self.job_id is not None:
            return
        if shutil.which("srun") is None:
            raise SlurmError("srun is not installed here: the Slurm launcher needs Slurm's client commands")
        job = os.environ.get("SLURM_JOB_ID")
        if job:
            nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
            nodes = expand_nodelist(nodelist) if nodelist else []
            if len(nodes) < n_nodes:
                raise SlurmError(
                    f"allocation {job} has {len(nodes)} node(s) ({nodelist or 'none listed'}) but the mesh needs "
                    f"{n_nodes} ({self.agents_per_node} agent(s) per node); ask salloc for more, or lower hosts="
                )
            self.job_id, self.nodes = job, nodes[:n_nodes]
            return
        wait = max(1, int(self.allocation_timeout))
        # The holder runs here, on this machine, under salloc: this process's Python, not the
        # nodes' (`python`, which may not exist here).
        argv = ["salloc", f"--immediate={wait}", f"--nodes={n_nodes}", f"--ntasks-per-node={self.agents_per_node}",
                "--job-name=viceroy", *self.salloc_options, sys.executable, "-c", _HOLD]
        try:
            # Its own session: the kernel's SIGINT to its process group must not reach salloc.
            self._holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, start_new_session=True)
        except FileNotFoundError:
            raise SlurmError("salloc is not installed here: the Slurm launcher needs Slurm's client commands") from None
        try:
            self._guard = start_guard(self._holder.pid, "salloc")
            t0 = time.monotonic()
            granted = self._wait_for_grant(n_nodes, wait)
            if not granted:
                said = self._holder_error()
                what = (f"no allocation of {n_nodes} node(s) within {wait} s" if time.monotonic() - t0 >= wait
                        else f"salloc refused an allocation of {n_nodes} node(s)")
                if self._reason:
                    said += f"; Slurm's last pending reason: {self._reason}"
                given = (f"check salloc_options={list(self.salloc_options)!r} (--salloc-options) and `sinfo`"
                         if self.salloc_options else "check `sinfo`, pass salloc_options (partition, time)")
                raise SlurmError(f"{what} ({said}); {given}, or put several agents on a node with agents_per_node")
            self.job_id, nodelist = granted.split()
            self.nodes = expand_nodelist(nodelist)
        except BaseException:
            self.close()
            raise

    def _wait_for_grant(self, n_nodes: int, wait: int) -> str:
        """The holder's first line ("JOB NODELIST"), or "" if salloc gave up or the wait passed.
        While the job is pending, Slurm is asked why (`why_pending`) every POLL_S seconds, then
        every POLL_LATER_S: a reason it never resolves by itself cancels the job and raises at once
        (slurm_pending.NEVER_GRANTED); otherwise the user is told once what is being waited for."""
        holder = self._holder
        assert holder is not None and holder.stdout is not None and holder.stderr is not None
        out, err = Lines(holder.stdout.fileno()), Lines(holder.stderr.fileno())
        deadline = time.monotonic() + wait + 30
        job = ""  # the pending job, once salloc names it
        queued = next_ask = 0.0  # when salloc said it queued; when to ask Slurm next
        told = False
        while not out.closed:
            now = time.monotonic()
            if now >= deadline:
                return ""
            until = deadline if not queued else min(deadline, next_ask)
            watch = [holder.stdout] if err.closed else [holder.stdout, holder.stderr]
            ready = select.select(watch, [], [], max(0.0, until - now))[0]
            if holder.stderr in ready:
                for line in err.read():
                    said = line.decode(errors="replace").strip()
                    self._said.append(said)
                    if said.startswith("salloc: Pending job allocation "):
                        job = said.rsplit(" ", 1)[1]
                    if "queued and waiting for resources" in said:
                        queued = next_ask = time.monotonic()
            if holder.stdout in ready:
                got = out.read()
                if got:
                    return got[0].decode(errors="replace").strip()
            now = time.monotonic()
            if not queued or now < next_ask:
                continue
            next_ask = now + (POLL_S if now - queued < 10 else POLL_LATER_S)
            why = why_pending(job) if job else None
            if why is not None:
                self._reason, partition = why
                never = never_granted(self._reason)
                if never is not None:
                    raise self._never_granted(job, partition, n_nodes, *never)
            if not told:
                told = True
                # Slurm's reason (None: not looked at yet), and what salloc said before
                # ("Requested partition configuration not available now")
                reason = f". Pending reason: {self._reason}" if self._reason not in ("", "None") else ""
                said = "; ".join(self._salloc_said())
                print(f"viceroy: Slurm job {job or '?'} queued and waiting for resources ({n_nodes} node(s) x "
                      f"{self.agents_per_node} task(s)); waiting up to {wait} s (allocation_timeout=), "
                      f"interrupt to give up{reason}" + (f". Slurm says: {said}" if said else ""), flush=True)
        return ""

    def _never_granted(self, job: str, partition: str, n_nodes: int, means: str, todo: str) -> SlurmError:
        """Cancel pending `job`, whose reason Slurm never resolves; the error saying so.
        (close() then stops salloc, which has already exited or withdraws it again.)"""
        try:
            subprocess.run(["scancel", job], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        asked = f"{n_nodes} node(s) x {self.agents_per_node} agent(s) per node, partition {partition}"
        if self.salloc_options:
            asked += f", salloc_options={list(self.salloc_options)!r}"
        said = "; ".join(self._salloc_said())
        if reason_code(self._reason).startswith("Partition"):
            means += partition_limits(partition)
        return SlurmError(
            f"Slurm will never grant the allocation asked for ({asked}): job {job} was pending with reason "
            f"{self._reason} ({means}{'; salloc: ' + said if said else ''}), so it was cancelled: "
            + todo.format(partition=partition)
        )

    def _salloc_said(self) -> list[str]:
        """What salloc said about the request, less its news of the queueing itself."""
        return [w.removeprefix("salloc: ") for w in self._said
                if w and "Pending job allocation" not in w and "queued and waiting" not in w]

    def _holder_error(self) -> str:
        """What salloc said when it gave up (it is stopped first if it is still waiting)."""
        holder = self._holder
        assert holder is not None and holder.stderr is not None
        self._stop_holder()
        rest = holder.stderr.read().decode(errors="replace").splitlines()
        said = "; ".join(line.strip() for line in [*self._said, *rest] if line.strip())
        return said or f"salloc exited with code {holder.returncode} and said nothing"

    def _stop_holder(self, grace: float = 5.0) -> None:
        """End salloc: once granted, by closing the holding command's stdin (salloc then gives
        the allocation back); while still waiting, by SIGTERM, on which salloc withdraws its
        request (SIGKILL would leave the job pending in the queue)."""
        holder = self._holder
        assert holder is not None
        if holder.stdin and not holder.stdin.closed:
            try:
                holder.stdin.close()
            except OSError:
                pass
        if self.job_id is None and holder.poll() is None:
            holder.terminate()
        try:
            holder.wait(timeout=grace if self.job_id is None else 15)
        except subprocess.TimeoutExpired:
            if self.job_id is not None:
                subprocess.run(["scancel", self.job_id], capture_output=True, timeout=30)
            holder.kill()
            holder.wait()

    def node_of(self, host: int) -> str:
        return self.nodes[host // self.agents_per_node]

    def srun_argv(self, host: int) -> list[str]:
        assert self.job_id is not None
        return [
            "srun", f"--jobid={self.job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={self.node_of(host)}",
            f"--job-name=viceroy-agent{host}", "--kill-on-bad-exit=0", "--quiet", *self.srun_options,
            self.python, "-m", "viceroy.runtime.agent",
        ]

    def start(self, host: HostPlan, config: dict[str, Any]) -> AgentProcess:
        # torch.distributed's rendezvous is on rank 0, on the first node
        config = with_master_addr(config, self.nodes[0])
        agent = start_child_agent(self.srun_argv(host.index), config, host.index, env=agent_env())
        agent.label = f"host {host.index} ({self.node_of(host.index)}, Slurm job {self.job_id})"
        agent.advise = functools.partial(self.advice, self.node_of(host.index), config["controller_in"])
        return agent

    def advice(self, node: str, controller: str, words: str) -> str:
        """What to do about an agent step on `node` that ended saying `words`."""
        if self._allocation_ended(words):
            return (f"the mesh's allocation, Slurm job {self.job_id}, has ended (time limit, scancel or preemption): "
                    "its nodes are no longer this mesh's, so mesh.restart(failed_only=True) cannot bring them "
                    "back; shut this mesh down and start a new one (Mesh.slurm(...) asks for a new allocation)")
        if self.srun_options and any(w in words for w in ("srun: unrecognized option", "srun: invalid option",
                                                             "srun: error: Invalid")):
            return (f"srun refused the agents' step: check srun_options={list(self.srun_options)!r} "
                    "(--srun-options), e.g. with `srun --help`")
        if f"execve(): {self.python}: Permission denied" in words:
            return (f"{self.python} on {node} cannot be run there (not an executable file): name the nodes' Python, "
                    "Mesh.slurm(..., python=PATH)")
        if f"{self.python}: No such file or directory" in words:
            return f"there is no {self.python} on {node}: name the nodes' Python, Mesh.slurm(..., python=PATH)"
        if "No module named" in words:
            return (f"{self.python} on {node} lacks viceroy or a module it needs: install viceroy-kernel for it, "
                    "or name a Python that has it (python=PATH)")
        if "nothing from the controller" in words:
            return (f"{node} could not reach the controller at {controller}: listen on an address of this machine "
                    "that the nodes can reach (interface=ADDR, --listen ADDR)")
        return ""

    def _allocation_ended(self, words: str) -> bool:
        """Whether the job holding the nodes is over: srun says so, or squeue no longer lists it
        as running."""
        if self.job_id is None:
            return False
        if any(w in words for w in ("DUE TO TIME LIMIT", "DUE TO PREEMPTION", "has expired")):
            return True
        try:
            out = subprocess.run(["squeue", "-h", "-j", self.job_id, "-o", "%T"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if out.returncode != 0:
            return "Invalid job id" in out.stderr
        return out.stdout.strip() != "RUNNING"  # not listed any more: over

    def close(self) -> None:
        holder = self._holder
        if holder is None:
            return
        self._stop_holder()
        self._holder = None
        for pipe in (holder.stdout, holder.stderr):
            if pipe:
                pipe.close()
        if self._guard is not None:  # salloc is gone: the guard exits on EOF
            stop_guard(self._guard)
            self._guard = None


# Run under salloc, inside the allocation: say which one it is, then hold it until stdin closes.
_HOLD = ("import os, sys; print(os.environ['SLURM_JOB_ID'], os.environ['SLURM_JOB_NODELIST'], flush=True); "
         "sys.stdin.read()")

