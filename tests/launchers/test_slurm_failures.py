"""What a user sees when a Slurm mesh cannot start, against a real one-node cluster: salloc's
refusal reported as such, a request Slurm will never grant cancelled within seconds (one that
only queues behind another job still waits), a Python missing on the nodes named, and an
interrupted wait for an allocation, or a controller killed during it, that leaves nothing in the
queue."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

import viceroy as vr
from tests.conftest import live_pids, wait_until


def test_an_allocation_salloc_refuses_is_reported_at_once_in_its_words(slurm):
    from viceroy.runtime.slurm import SlurmError

    t0 = time.monotonic()
    with pytest.raises(SlurmError) as info:
        vr.Mesh.slurm(hosts=1, gpus=1, salloc_options=["-p", "nosuch"], preload=[], echo=False)
    message = str(info.value)
    assert message.startswith("salloc refused an allocation of 1 node(s) ("), message  # not "within 300 s"
    assert "invalid partition" in message.lower()
    assert time.monotonic() - t0 < 10
    assert slurm.jobs() == []


def test_a_python_missing_on_the_nodes_is_named_and_the_allocation_given_back(slurm):
    # python= is the nodes' Python; the command holding the allocation runs here, under this
    # process's Python (it ran python= here too, so salloc failed: "no allocation within 300 s").
    with pytest.raises(RuntimeError) as info:
        vr.Mesh.slurm(hosts=1, gpus=1, python="/nonexistent/python", preload=[], echo=False)
    message = str(info.value)
    assert f"host 0 ({slurm.node}, Slurm job" in message, message
    assert "/nonexistent/python: No such file or directory" in message
    assert f"there is no /nonexistent/python on {slurm.node}: name the nodes' Python" in message
    wait_until(lambda: slurm.jobs() == [], 10, "the allocation to be given back")


def test_a_python_the_nodes_cannot_run_is_named_as_such(slurm, tmp_path):
    # srun's words alone ("execve(): ...: Permission denied"), nothing saying what to do
    with pytest.raises(RuntimeError) as info:
        vr.Mesh.slurm(hosts=1, gpus=1, python=str(tmp_path), preload=[], echo=False)  # a directory
    message = str(info.value)
    assert f"{tmp_path} on {slurm.node} cannot be run there (not an executable file): name the nodes' Python" in message
    wait_until(lambda: slurm.jobs() == [], 10, "the allocation to be given back")


WAITER = textwrap.dedent("""
    import viceroy as vr
    # BeginTime: Slurm holds the job for an hour, a wait that may end (not a request it never grants)
    vr.Mesh.slurm(hosts=1, gpus=1, allocation_timeout=120, salloc_options=["--begin=now+1hour"], preload=[],
                  echo=False)
""")


def test_interrupting_the_wait_for_an_allocation_withdraws_it_at_once(slurm):
    proc = subprocess.Popen([sys.executable, "-c", WAITER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jobs: list[str] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the user is told what is being waited for, and how long
        assert "queued and waiting for resources (1 node(s) x 1 task(s)); waiting up to 120 s" in line, line
        assert line.rstrip().endswith("interrupt to give up. Pending reason: BeginTime"), line  # Slurm's why
        jobs = slurm.jobs()
        assert len(jobs) == 1
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)  # the stop button
        rest = proc.communicate(timeout=30)[0]
        assert "KeyboardInterrupt" in rest
        assert time.monotonic() - t0 < 8  # it waited 15 s for salloc
        # salloc was SIGKILLed while waiting: the job stayed pending in the queue for good
        wait_until(lambda: jobs[0] not in slurm.jobs(), 5, f"pending job {jobs[0]} to leave the queue")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for job in jobs:
            subprocess.run(["scancel", job], capture_output=True)  # only if the test failed


def test_a_controller_killed_while_waiting_for_an_allocation_leaves_no_salloc_nor_job(slurm):
    # salloc waited on in a session of its own: SIGKILLing the kernel left it, and its pending
    # job, in the queue until the cluster could grant it (an allocation for nobody)
    proc = subprocess.Popen([sys.executable, "-c", WAITER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jobs: list[str] = []
    sallocs: list[int] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "queued and waiting for resources" in line, line
        jobs = slurm.jobs()
        assert len(jobs) == 1
        children = psutil.Process(proc.pid).children(recursive=True)
        sallocs = [p.pid for p in children if p.name() == "salloc"]
        assert len(sallocs) == 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_until(lambda: not live_pids(sallocs), 5, f"the dead controller's salloc (pid {sallocs}) to exit")
        left = [p.pid for p in children]  # its guard too
        wait_until(lambda: not live_pids(left), 5, f"every process the dead controller started (pids {left}) to exit")
        wait_until(lambda: jobs[0] not in slurm.jobs(), 5, f"the dead controller's pending job {jobs[0]} to leave the queue")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in live_pids(sallocs):  # only if the test failed
            os.kill(pid, signal.SIGTERM)  # salloc withdraws its request
        for job in jobs:
            subprocess.run(["scancel", job], capture_output=True)


@pytest.mark.parametrize("reason", [
    "PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints", "DependencyNeverSatisfied",
    "InvalidAccount", "QOSNotAllowed", "ReservationDeleted", "MaxMemPerLimit", "QOSMaxNodePerJobLimit",
    "AssocMaxCpuPerNode", "QOSMaxWallDurationPerJobLimit", "AssocMaxGRESMinutesPerJob", "QOSMinGRES",
])
def test_reasons_slurm_never_resolves_are_final(reason):
    from viceroy.runtime.slurm_pending import never_granted

    assert never_granted(reason) is not None


@pytest.mark.parametrize("reason", [
    "Resources", "Priority", "None", "", "BeginTime", "Dependency", "Licenses", "Reservation", "JobHeldUser",
    "PartitionDown", "PartitionInactive", "NodeDown", "ReqNodeNotAvail, UnavailableNodes:node[3-4]",
    "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions",  # 22.05's words
    "AssocGrpCpuLimit", "QOSGrpNodeLimit", "QOSMaxNodePerUserLimit", "QOSMaxJobsPerUserLimit", "AssocMaxJobsLimit",
    "QOSMaxSubmitJobPerUserLimit", "MaxCpuPerAccount", "AccountingPolicy", "SomeReasonOfALaterSlurm",
])
def test_reasons_that_may_pass_keep_the_wait(reason):
    # other jobs ending, a node or partition back, a start time reached: waiting is right
    from viceroy.runtime.slurm_pending import never_granted

    assert never_granted(reason) is None


@pytest.mark.parametrize(("dims", "asked"), [
    ({"hosts": 3}, "3 node(s) x 1 agent(s) per node, partition debug"),
    ({"hosts": 4, "agents_per_node": 2}, "2 node(s) x 2 agent(s) per node, partition debug"),
    # more tasks on the node than it has CPUs
    ({"hosts": os.cpu_count() + 1, "agents_per_node": os.cpu_count() + 1},
     f"1 node(s) x {os.cpu_count() + 1} agent(s) per node, partition debug"),
])
def test_a_request_the_cluster_can_never_grant_is_cancelled_within_seconds(slurm, capsys, dims, asked):
    # It waited the whole allocation_timeout (300 s), told only "queued and waiting for resources".
    from viceroy.runtime.slurm import SlurmError

    t0 = time.monotonic()
    with pytest.raises(SlurmError) as info:
        vr.Mesh.slurm(gpus=1, **dims, preload=[], echo=False)
    took = time.monotonic() - t0
    message = str(info.value)
    assert message.startswith(f"Slurm will never grant the allocation asked for ({asked}): job "), message
    # PartitionConfig at first (what salloc said), PartitionNodeLimit once the scheduler has looked
    assert re.search(r"was pending with reason Partition(Config|NodeLimit) \(the (request breaks a limit of the "
                     r"partition|node count is outside the partition's limits): more nodes than it has", message), message
    assert f"partition debug has TotalNodes=1 TotalCPUs={os.cpu_count()} MinNodes=0 MaxNodes=UNLIMITED" in message, message
    assert "salloc: Requested partition configuration not available now" in message  # salloc's words too
    assert "so it was cancelled: ask for " in message  # what to do
    assert took < 15, took
    assert slurm.jobs() == []  # cancelled, not left pending
    assert "waiting up to" not in capsys.readouterr().out  # no "waiting" notice for a request refused
    here = psutil.Process().children(recursive=True)
    assert not [p for p in here if "salloc" in p.name() or "viceroy.runtime.guard" in " ".join(p.cmdline())], here


def test_a_request_queued_behind_another_job_waits_for_it(slurm, capsys):
    # `whole`: a job there has the node to itself, so ours queues behind the user's other job
    slurm.run("salloc", "--no-shell", "--partition=whole", "--nodes=1", "--job-name=before-ours")
    before = slurm.run("squeue", "-h", "-n", "before-ours", "-o", "%i").strip()
    ends = threading.Timer(8, lambda: subprocess.run(["scancel", before], capture_output=True))
    ends.start()
    try:
        t0 = time.monotonic()
        with vr.Mesh.slurm(hosts=1, gpus=1, salloc_options=["-p", "whole"], allocation_timeout=60, preload=[],
                           echo=False) as mesh:
            assert time.monotonic() - t0 >= 8  # it waited for the other job to end (not cancelled at once)
            assert mesh.run("rank").values() == [0]
            job = mesh._controller.launcher.job_id
        told = capsys.readouterr().out
        assert f"Slurm job {job} queued and waiting for resources (1 node(s) x 1 task(s)); waiting up to 60 s" in told
        assert "Pending reason: Priority" in told or "Pending reason: Resources" in told, told
        wait_until(lambda: slurm.jobs() == [], 10, "the allocation to be given back")
    finally:
        ends.cancel()
        subprocess.run(["scancel", before], capture_output=True)


@pytest.mark.parametrize(("var", "value"), [("SLURM_JOB_NUM_NODES", "two"), ("SLURM_JOB_NUM_NODES", "0"),
                                            ("SLURM_NNODES", "1.5")])
def test_a_node_count_in_the_environment_that_is_not_one_is_named(nothing_may_start, monkeypatch, var, value):
    # int("two") inside Mesh.slurm: a ValueError naming neither the variable nor what to do
    from viceroy.runtime.slurm import SlurmError

    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv(var, value)
    with pytest.raises(SlurmError) as info:
        vr.Mesh.slurm(gpus=1, preload=[], echo=False)
    message = str(info.value)
    assert message.startswith(f"${var}={value!r} is not a number of nodes: in a Slurm allocation ($SLURM_JOB_ID=77)"), message
    assert "Unset it or set it to that count" in message and "Mesh.slurm(hosts=N, ...)" in message


def test_zero_hosts_is_refused_naming_the_dim():
    # hosts=0 was taken for "no hosts given" and asked for the allocation's nodes.
    with pytest.raises(ValueError, match="dim 'hosts' must be a positive int, got 0"):
        vr.Mesh.slurm(hosts=0, gpus=1, preload=[], echo=False)


def test_an_ended_allocation_says_a_new_mesh_is_needed_not_restart(slurm):
    mesh = vr.Mesh.slurm(hosts=2, gpus=1, agents_per_node=2, preload=[], echo=False)
    rundirs = [i["endpoints"][0].removeprefix("ipc://").rsplit("/", 1)[0] for i in mesh._controller.agent_info.values()]
    try:
        subprocess.run(["scancel", mesh._controller.launcher.job_id], check=True)  # as a time limit would
        wait_until(lambda: len(mesh._controller.lost_hosts()) == 2, 60, "both hosts to be given up")
        # Slurm's SIGTERM: each agent ends its ranks and removes its socket directory (one node: here)
        wait_until(lambda: not any(os.path.exists(d) for d in rundirs), 10, "the agents' socket directories to go")
        for why in mesh._controller.lost_hosts().values():
            assert "has ended (time limit, scancel or preemption)" in why
            assert "start a new one" in why
    finally:
        mesh.shutdown()


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"agents_per_node": 0}, ValueError, "agents_per_node=0: give a positive whole number of agents"),
    ({"agents_per_node": True}, ValueError, "agents_per_node=True: give a positive whole number of agents"),
    ({"agents_per_node": "2"}, ValueError, "agents_per_node='2': give a positive whole number of agents"),
    ({"allocation_timeout": -1}, ValueError, "allocation_timeout=-1: give a positive, finite number of seconds"),
    ({"allocation_timeout": "60"}, ValueError, "allocation_timeout='60': give a positive, finite number of seconds"),
    ({"salloc_options": "-p gpu"}, TypeError, "salloc_options='-p gpu': give a list of salloc's arguments"),
    ({"srun_options": ["--exclusive", 1]}, TypeError, "srun_options=['--exclusive', 1]: give a list of srun's arguments"),
    ({"python": ""}, ValueError, "python='': give the path of the nodes' Python"),
])
def test_bad_slurm_arguments_are_refused_naming_them_before_salloc_runs(nothing_may_start, kwargs, error, message):
    # agents_per_node=0 was a ZeroDivisionError; True, a timeout of -1 or a string of options
    # went to salloc (one letter per argument), "60" failed inside (int()).
    with pytest.raises(error) as info:
        vr.Mesh.slurm(hosts=2, gpus=1, preload=[], echo=False, **kwargs)
    assert str(info.value).startswith(message), str(info.value)


def test_options_salloc_or_srun_refuse_are_named_with_what_to_do(slurm):
    from viceroy.runtime.slurm import SlurmError

    # "pass salloc_options (partition, time)" to someone who had, wrongly
    with pytest.raises(SlurmError, match=r"^salloc refused an allocation of 1 node\(s\) \(.*Invalid --time specification"
                                         r"\); check salloc_options=\['-t', 'abc'\] \(--salloc-options\) and `sinfo`"):
        vr.Mesh.slurm(hosts=1, gpus=1, salloc_options=["-t", "abc"], preload=[], echo=False)
    # srun's words alone, nothing naming the option
    with pytest.raises(RuntimeError) as info:
        vr.Mesh.slurm(hosts=1, gpus=1, srun_options=["--bogus"], preload=[], echo=False)
    message = str(info.value)
    assert f"host 0 ({slurm.node}, Slurm job" in message and "unrecognized option '--bogus'" in message, message
    assert "srun refused the agents' step: check srun_options=['--bogus'] (--srun-options)" in message, message
    wait_until(lambda: slurm.jobs() == [], 10, "the allocation to be given back")
