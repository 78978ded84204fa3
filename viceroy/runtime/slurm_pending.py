"""Why a pending Slurm job waits (squeue's reason), and which reasons Slurm never resolves by
itself: those end a request at once instead of waiting out its allocation_timeout
(`slurm.SlurmLauncher`)."""

from __future__ import annotations

import re
import subprocess

# Pending reasons (`squeue -o %r`; https://slurm.schedmd.com/job_reason_codes.html) that Slurm
# never resolves by itself: the request is outside what the partition, account or QOS allows, or
# refers to something that will not come. Only the user changing the request (or an admin the
# configuration) ends them, so waiting out allocation_timeout helps nobody: the job is cancelled
# at once. Each: what it means, what to do ({partition} is filled in).
#  - PartitionNodeLimit: more nodes than the partition has, or outside its MinNodes/MaxNodes. (Nodes
#    that are down or drained count: with one of a partition's two nodes down, a 2-node request
#    pends as ReqNodeNotAvail, checked with slurm-wlm 22.05.)
#  - PartitionTimeLimit: a time limit (-t) above the partition's MaxTime.
#  - PartitionConfig: the fallback for "breaks some limit of the partition", e.g. more tasks per
#    node than its nodes have CPUs. It is also the reason at submission (salloc: "Requested
#    partition configuration not available now") until the scheduler names the limit, which took
#    from 1 s to over 3 s on the test cluster: the error gives the partition's own limits instead.
#  - BadConstraints ("never expected to be runnable"), DependencyNeverSatisfied, ReservationDeleted,
#    DeadLine, InvalidAccount/InvalidQOS, AccountNotAllowed/QOSNotAllowed, MaxMemPerLimit, and the
#    per-job limits of an account or QOS (PER_JOB_LIMIT: AssocMax*PerJob*, QOSMax*PerNode, ...,
#    QOSMin*): this request alone exceeds them, whatever else runs.
# Everything else keeps the wait, unknown reasons included: Resources and Priority (other jobs
# hold the nodes), ReqNodeNotAvail/NodeDown (nodes down, drained or reserved: often back soon),
# PartitionDown/PartitionInactive (an admin's state), BeginTime, Dependency, Licenses,
# Reservation, JobHeld*, and the aggregate limits (*Grp*, *PerUser, *PerAccount, MaxJobs): they
# clear as other jobs end.
_PARTITION = "`scontrol show partition {partition}` shows its limits"
_ACCOUNT = ("name an account (-A) and QOS (--qos) you may use on this partition in salloc_options; "
            "`sacctmgr show assoc user=$USER` lists yours")
NEVER_GRANTED: dict[str, tuple[str, str]] = {
    "PartitionNodeLimit": (
        "the node count is outside the partition's limits: more nodes than it has, or beyond its MaxNodes or MinNodes",
        "ask for fewer nodes (fewer hosts=, or more agents on each node with agents_per_node=) or name a bigger "
        "partition in salloc_options (-p); `sinfo -p {partition}` lists its nodes, " + _PARTITION),
    "PartitionTimeLimit": (
        "the time limit asked for is above the partition's MaxTime",
        "ask for less time (-t in salloc_options) or name another partition (-p); " + _PARTITION),
    "PartitionConfig": (
        "the request breaks a limit of the partition: more nodes than it has, more tasks per node (agents_per_node) "
        "than its nodes have CPUs, a time above its MaxTime, ...",
        "ask for fewer nodes (fewer hosts=), less on each (agents_per_node=; CPUs, GPUs, memory or time in "
        "salloc_options) or name another partition (-p); " + _PARTITION + ", `sinfo -p {partition} -o '%D %c %m %G'` "
        "its nodes"),
    "BadConstraints": (
        "the job's requirements can never be satisfied",
        "check the constraints and resources in salloc_options against the nodes: `sinfo -o '%P %D %c %m %f %G'`"),
    "DependencyNeverSatisfied": (
        "it depends on a job that will never satisfy the dependency",
        "drop or fix --dependency in salloc_options"),
    "ReservationDeleted": (
        "the reservation it asked for no longer exists",
        "drop or change --reservation in salloc_options; `scontrol show reservation` lists them"),
    "DeadLine": ("it cannot end by its --deadline", "give a later --deadline in salloc_options, or none"),
    "InvalidAccount": ("its account is invalid", _ACCOUNT),
    "InvalidQOS": ("its QOS is invalid", _ACCOUNT),
    "AccountNotAllowed": ("its account may not use this partition", _ACCOUNT),
    "QOSNotAllowed": ("its QOS may not be used by its account or on this partition", _ACCOUNT),
    "MaxMemPerLimit": (
        "the memory asked for is above the limit per CPU or per node",
        "ask for less memory (--mem, --mem-per-cpu in salloc_options)"),
}
# A limit on each job of an account (association) or QOS that this request exceeds by itself
# (AssocMaxNodePerJobLimit, QOSMaxGRESPerNode, QOSMaxWallDurationPerJobLimit, ...), or a
# minimum it does not reach (QOSMinGRES, ...). Not *PerUser/*PerAccount: those add up other jobs.
PER_JOB_LIMIT = re.compile(r"(Assoc|QOS)Max\w*Per(Job|Node)\w*|QOSMin\w+")
_PER_JOB = (
    "the request is beyond a per-job limit of its account or QOS",
    "ask for less (nodes, time, CPUs, GPUs, memory) or use another account or QOS (-A, --qos in salloc_options); "
    "`sacctmgr show qos` and `sacctmgr show assoc user=$USER` list the limits")
POLL_S, POLL_LATER_S = 1.0, 5.0  # a pending job's reason is asked every POLL_S for 10 s, then less often


def reason_code(reason: str) -> str:
    """The code in squeue's %r: "ReqNodeNotAvail, UnavailableNodes:n1" -> "ReqNodeNotAvail"."""
    return reason.split(",", 1)[0].strip()


def never_granted(reason: str) -> tuple[str, str] | None:
    """(what it means, what to do) if a job pending for `reason` will never start by itself."""
    code = reason_code(reason)
    if code in NEVER_GRANTED:
        return NEVER_GRANTED[code]
    return _PER_JOB if PER_JOB_LIMIT.fullmatch(code) else None


def partition_limits(partition: str) -> str:
    """"; partition P has TotalNodes=1 MaxNodes=UNLIMITED ..." (`scontrol show partition`), or ""."""
    try:
        shown = subprocess.run(["scontrol", "show", "partition", "-o", partition], capture_output=True, text=True,
                               timeout=10).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    fields = dict(f.split("=", 1) for f in shown if "=" in f)
    limits = [f"{k}={fields[k]}" for k in ("TotalNodes", "TotalCPUs", "MinNodes", "MaxNodes", "MaxCPUsPerNode",
                                           "MaxTime") if k in fields]
    return f"; partition {partition} has {' '.join(limits)}" if limits else ""


def why_pending(job: str) -> tuple[str, str] | None:
    """(reason, partition) of `job` while it is pending (`squeue -o %r`); None if it is not,
    or squeue cannot say (the wait goes on as if it were pending for a passing reason)."""
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T|%P|%r"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    state, _, rest = proc.stdout.strip().partition("|")
    partition, _, reason = rest.partition("|")
    return (reason, partition) if proc.returncode == 0 and state == "PENDING" and reason else None
