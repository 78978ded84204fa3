"""Hosts as network namespaces (real veth links, real sshd in each): a host whose link is cut
is given up within 5 s, the running call fails naming it, and it comes back on restart once the
link returns. Needs root (skips otherwise)."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

import viceroy as vr
from tests.conftest import fails_within, live_pids, wait_running, wait_until
from tests.launchers.conftest import SSH_OPTS
from tests.launchers.netns import CONTROLLER_ADDR


def _mesh(ns_hosts, **dims):
    return vr.Mesh.ssh(
        ns_hosts.addresses, port=ns_hosts.port, identity=ns_hosts.identity, ssh_options=SSH_OPTS,
        interface=CONTROLLER_ADDR, preload=[], echo=False, **dims,
    )


def _remote_pids(mesh, host):
    """The agent, its fork server and its ranks for one host (all inside that namespace)."""
    ranks = [p for r, p in mesh.pids().items() if mesh._controller._host_of[r] == host]
    agent = psutil.Process(ranks[0]).parent()
    return [agent.pid, *(c.pid for c in agent.children()), *ranks]


def test_each_host_is_its_own_namespace_and_traffic_crosses_its_link(ns_hosts):
    mesh = _mesh(ns_hosts, gpus=2)
    try:
        before = [ns_hosts.net.bytes_through(i) for i in (1, 2)]
        nets = mesh.run("import os\nos.readlink('/proc/self/ns/net')").values()
        assert nets[0] == nets[1] != nets[2] == nets[3]
        assert os.readlink("/proc/self/ns/net") not in nets
        # each host's two ranks send 100 kB back each: it can only come over that host's link
        assert [len(v) for v in mesh.run("bytes(100_000)").values()] == [100_000] * 4
        after = [ns_hosts.net.bytes_through(i) for i in (1, 2)]
        assert all(a - b > 200_000 for a, b in zip(after, before, strict=True)), (before, after)
        # torch.distributed's rendezvous is rank 0's, on host 0, and the other host reaches it
        assert mesh.run("import os\nos.environ['MASTER_ADDR']").values() == ["10.213.1.2"] * 4
        rank0 = mesh.slice(hosts=0, gpus=0)
        rank0.run("import os, socket\nsrv = socket.create_server((os.environ['MASTER_ADDR'], 0))")
        port = rank0.run("srv.getsockname()[1]").values()[0]
        reach = f"import os, socket\nsocket.create_connection((os.environ['MASTER_ADDR'], {port}), timeout=5).close()"
        mesh.slice(hosts=1, gpus=1).run(reach)
    finally:
        mesh.shutdown()


def test_gloo_collectives_cross_hosts_whose_names_resolve_to_loopback(ns_hosts):
    # Every namespace shares this machine's /etc/hosts, where its name is 127.x: gloo would
    # bind there and tell the other host to connect to it. Ranks name their link instead.
    mesh = _mesh(ns_hosts, gpus=2)
    try:
        assert mesh.run("import os\nos.environ.get('GLOO_SOCKET_IFNAME')").values() == [
            ns_hosts.net.interface(1)] * 2 + [ns_hosts.net.interface(2)] * 2
        mesh.run("import torch, viceroy as vr\nimport torch.distributed as dist")
        assert mesh.run("t = torch.ones(1) * rank\nvr.all_reduce(t)\nt.item()").values() == [6.0] * 4
        stock = ("dist.init_process_group('gloo', rank=rank, world_size=4)\n"  # torchrun's way, env://
                 "u = torch.ones(1) * (rank + 1)\ndist.all_reduce(u)\ndist.destroy_process_group()\nu.item()")
        assert mesh.run(stock, timeout=60).values() == [10.0] * 4
    finally:
        mesh.shutdown()


@pytest.mark.slow  # waits out an agent's 10 s of silence
def test_a_cut_link_fails_the_call_naming_the_host_and_restart_brings_it_back(ns_hosts):
    mesh = _mesh(ns_hosts, gpus=2)
    try:
        mesh.run("x = rank * 10")
        old = _remote_pids(mesh, 1)
        fut = mesh.run("import time\ntime.sleep(60)", block=False)
        wait_running(mesh, "time.sleep")
        msg = str(fails_within(fut, lambda: ns_hosts.net.cut(2), 5.0, timeout=10))
        assert "ranks 2-3: died (host 1 (10.213.2.2, via ssh) lost" in msg, msg
        assert mesh.states() == {0: "idle", 1: "idle", 2: "dead", 3: "dead"}
        assert mesh.slice(hosts=0).run("x").values() == [0, 10]  # the other host carries on
        with pytest.raises(vr.MeshError, match="ranks 2-3: dead"):
            mesh.run("x")
        # Cut off, the old agent hears no controller and takes its ranks down by itself.
        wait_until(lambda: not live_pids(old), 15, f"the cut-off host's processes to exit: {live_pids(old)}")
        with pytest.raises(RuntimeError, match=r"(?s)during restart: host 1 \(10.213.2.2, via ssh\) lost: its agent "
                           r"on host 1 exited \(exit code 255\).*last words:.*10.213.2.2 port 2222: No route to host"):
            mesh.restart(failed_only=True)  # the link is still down: ssh says so
        ns_hosts.net.mend(2)
        mesh.restart(failed_only=True)
        assert mesh.states() == dict.fromkeys(range(4), "idle")
        assert mesh.run("globals().get('x')").values() == [0, 10, None, None]  # host 0 kept its state
        assert mesh.run("rank").values() == [0, 1, 2, 3]
    finally:
        ns_hosts.net.mend(2)
        mesh.shutdown()


@pytest.mark.slow  # waits out the cut-off agent's 10 s of silence
def test_a_cut_link_releases_the_other_hosts_ranks_from_a_collective_without_fail_fast(ns_hosts):
    # Cut off, host 1's ranks live on and their connections stay open: nothing but the
    # controller's word tells host 0's ranks, waiting in a collective with them, to stop.
    mesh = _mesh(ns_hosts, gpus=2)
    try:
        mesh.run("import time, torch, viceroy as vr\nt = torch.ones(2)\nvr.all_reduce(t)")  # the group exists
        old = _remote_pids(mesh, 1)
        fut = mesh.run("if coords['hosts'] == 1:\n    time.sleep(60)\nvr.all_reduce(t)", block=False, fail_fast=False)
        wait_running(mesh.slice(hosts=1), "time.sleep")
        wait_running(mesh.slice(hosts=0), "vr.all_reduce")
        msg = str(fails_within(fut, lambda: ns_hosts.net.cut(2), 5.0))
        assert ("ranks 0-1: viceroy.CollectiveError: all_reduce('sum') over the whole mesh (ranks 0-3): "
                "ranks 2-3 died, while the others waited in it.") in msg, msg
        assert "ranks 2-3: died (host 1 (10.213.2.2, via ssh) lost" in msg, msg
        host0 = mesh.slice(hosts=0)
        assert host0.run("u = torch.ones(1) * (rank + 1)\nvr.all_reduce(u)\nu.item()").values() == [3.0, 3.0]
        wait_until(lambda: not live_pids(old), 15, f"the cut-off host's processes to exit: {live_pids(old)}")
    finally:
        ns_hosts.net.mend(2)
        mesh.shutdown()


@pytest.mark.slow  # waits out the cut-off agent's 10 s of silence
@pytest.mark.parametrize("fail_fast", [True, False], ids=["interrupted", "told"])
def test_cutting_off_the_rendezvous_host_releases_the_ranks_waiting_in_a_collective(ns_hosts, fail_fast):
    # Host 0's rank 0 holds the rendezvous store. Cut off, its connections stay open and a
    # store request from host 1's ranks (the collective's agreement check, their give-up
    # record) would wait in C++ for minutes, deaf to interrupts and to the controller's word.
    mesh = _mesh(ns_hosts, gpus=2)
    try:
        mesh.run("import time, torch, viceroy as vr\nt = torch.ones(2)\nvr.all_reduce(t)")  # the group exists
        old = _remote_pids(mesh, 0)
        fut = mesh.run("if coords['hosts'] == 0:\n    time.sleep(60)\nvr.all_reduce(t)", block=False,
                       fail_fast=fail_fast)
        wait_running(mesh.slice(hosts=0), "time.sleep")
        wait_running(mesh.slice(hosts=1), "vr.all_reduce")
        # host 0 is given up 5 s after the cut: they have been waiting over 2 s by then, so
        # their agreement check asks the cut-off store
        msg = str(fails_within(fut, lambda: ns_hosts.net.cut(1), 12.0))
        assert "ranks 0-1: died (host 0 (10.213.1.2, via ssh) lost" in msg, msg
        if not fail_fast:
            assert "ranks 2-3: viceroy.CollectiveError: all_reduce('sum') over the whole mesh (ranks 0-3): " \
                   "ranks 0-1 died, while the others waited in it." in msg, msg
        assert mesh.slice(hosts=1).run("rank", timeout=10).values() == [2, 3]  # free, not stuck
        wait_until(lambda: not live_pids(old), 15, f"the cut-off host's processes to exit: {live_pids(old)}")
        ns_hosts.net.mend(1)
        mesh.restart(failed_only=True)
        # a new store on the new rank 0: host 1's ranks find it
        assert mesh.run("import torch, viceroy as vr\nu = torch.ones(1) * (rank + 1)\nvr.all_reduce(u)\nu.item()",
                        timeout=60).values() == [10.0] * 4
    finally:
        ns_hosts.net.mend(1)
        mesh.shutdown()


def test_a_killed_agent_fails_the_call_naming_the_host_and_restart_brings_it_back(ns_hosts):
    mesh = _mesh(ns_hosts, gpus=2)
    try:
        agent = _remote_pids(mesh, 0)[0]
        fut = mesh.run("import time\ntime.sleep(60)", block=False)
        wait_running(mesh, "time.sleep")
        t0 = time.monotonic()
        os.kill(agent, signal.SIGKILL)
        with pytest.raises(vr.MeshError, match=r"ranks 0-1: died \(host 0 \(10.213.1.2, via ssh\) lost"):
            fut.get(timeout=10)
        assert time.monotonic() - t0 < 5.0
        mesh.restart(failed_only=True)
        assert mesh.run("rank").values() == [0, 1, 2, 3]
    finally:
        mesh.shutdown()


def test_a_frozen_agent_given_up_is_ended_on_its_host_with_its_ranks(ns_hosts):
    # A frozen agent (SIGSTOP, a hang) never sees its lifeline or its silence limit: killing
    # the local ssh client leaves it, and its ranks, running on the host. The controller ends
    # it there, over a fresh ssh connection, when it gives the host up.
    mesh = _mesh(ns_hosts, gpus=2)
    frozen, old, new = None, [], []
    try:
        old = _remote_pids(mesh, 1)
        frozen = old[0]
        os.kill(frozen, signal.SIGSTOP)
        wait_until(lambda: 1 in mesh._controller.lost_hosts(), 10, "host 1 to be given up")
        assert mesh.states() == {0: "idle", 1: "idle", 2: "dead", 3: "dead"}
        wait_until(lambda: not live_pids(old), 10, f"the frozen host's agent and ranks to exit: {live_pids(old)}")
        mesh.restart(failed_only=True)
        new = _remote_pids(mesh, 1)
        assert not set(new) & set(old)
        assert mesh.run("rank").values() == [0, 1, 2, 3]
        ranks = [p for r, p in mesh.pids().items() if r in (2, 3)]
        assert live_pids(ranks) == ranks
    finally:
        mesh.shutdown()
        if frozen is not None and live_pids([frozen]):
            os.kill(frozen, signal.SIGKILL)
    wait_until(lambda: not live_pids([*old, *new]), 10, f"host 1's processes to exit: {live_pids([*old, *new])}")


def test_shutdown_ends_a_frozen_agent_not_yet_given_up_on_its_host(ns_hosts):
    mesh = _mesh(ns_hosts, gpus=2)
    frozen, pids = None, []
    try:
        pids = _remote_pids(mesh, 0) + _remote_pids(mesh, 1)
        frozen = _remote_pids(mesh, 1)[0]
        os.kill(frozen, signal.SIGSTOP)  # it will never hear the shutdown
    finally:
        mesh.shutdown()
        try:
            wait_until(lambda: not live_pids(pids), 10, f"every host's processes to exit: {live_pids(pids)}")
        finally:
            if frozen is not None and live_pids([frozen]):
                os.kill(frozen, signal.SIGKILL)


@pytest.mark.slow  # waits out an agent's 10 s of silence
def test_attached_agents_across_links_lose_a_host_and_take_a_new_agent_on_restart(ns_hosts, tmp_path):
    """Attach mode over real links: the controller listens on its own address; agents in each
    namespace connect to it. A cut host is given up; its agent, cut off, stops its ranks; a new
    agent (as a cluster's launcher would start) takes the host back on restart."""
    from tests.launchers.test_attach import _agent, _attach_later, _reap

    key_file, addr = str(tmp_path / "mesh.key"), f"{CONTROLLER_ADDR}:7790"
    ns = ns_hosts.net
    first = [_attach_later(addr, 1, "--key-file", key_file, "--host", str(h), prefix=ns.exec_argv(h + 1)) for h in (0, 1)]
    extra: list = []
    try:
        mesh = vr.Mesh.attach(hosts=2, gpus=1, listen=addr, key_file=key_file, preload=[], echo=False)
        for _, t in first:
            t.join()
        procs = [p for ps, _ in first for p in ps]
        try:
            nets = mesh.run("import os\nos.readlink('/proc/self/ns/net')").values()
            assert nets[0] != nets[1]
            # host 0's address, as its agent reached the controller, is the rendezvous
            assert mesh.run("import os\nos.environ['MASTER_ADDR']").values() == ["10.213.1.2"] * 2
            fut = mesh.run("import time\ntime.sleep(60)", block=False)
            wait_running(mesh, "time.sleep")
            t0 = time.monotonic()
            ns.cut(2)
            with pytest.raises(vr.MeshError, match=r"rank 1: died \(host 1 \(.*attached\) lost: no heartbeat"):
                fut.get(timeout=10)
            assert time.monotonic() - t0 < 5.0
            assert procs[1].wait(timeout=15) == 0  # cut off, it stopped its ranks and left
            assert "nothing from the controller" in procs[1].stderr.read()
            ns.mend(2)
            launcher = mesh._controller.launcher
            restart = threading.Thread(target=mesh.restart, kwargs={"failed_only": True})
            restart.start()
            wait_until(lambda: launcher.waiting() == [1], 10, "the mesh to wait for host 1 again")
            extra.append(_agent(addr, "--key-file", key_file, prefix=ns.exec_argv(2)))
            restart.join(timeout=60)
            assert mesh.run("rank").values() == [0, 1]
        finally:
            mesh.shutdown()
    finally:
        ns.mend(2)
        for _, t in first:
            t.join()
        _reap([p for ps, _ in first for p in ps] + extra)


def _localhost_and_node2(sshd, ns_hosts, tmp_path) -> list[str]:
    """ssh options for hostfile "localhost / node2": from node2, "localhost" is node2 itself."""
    config = tmp_path / "ssh_config"
    config.write_text(f"Host localhost\n  HostName 127.0.0.1\n  Port {sshd.port}\n  IdentityFile {sshd.identity}\n"
                      f"Host node2\n  HostName {ns_hosts.addresses[0]}\n  Port {ns_hosts.port}\n"
                      f"  IdentityFile {ns_hosts.identity}\n")
    return ["-F", str(config), *SSH_OPTS]


def test_host_0_named_localhost_gives_the_other_hosts_a_master_addr_they_reach(sshd, ns_hosts, tmp_path):
    options = _localhost_and_node2(sshd, ns_hosts, tmp_path)
    mesh = vr.Mesh.ssh(["localhost", "node2"], gpus=1, ssh_options=options,
                       interface=CONTROLLER_ADDR, preload=[], echo=False, startup_timeout=60)
    try:
        assert mesh.run("import os\nos.environ['MASTER_ADDR']").values() == [CONTROLLER_ADDR] * 2
    finally:
        mesh.shutdown()


def test_host_0_named_localhost_with_no_address_to_give_is_refused_unless_master_addr_is_given(sshd, ns_hosts, tmp_path):
    # Listening on every interface, the controller has no one address to give node2 for host 0.
    options = _localhost_and_node2(sshd, ns_hosts, tmp_path)
    with pytest.raises(ValueError, match=r"host 0 \(localhost\) is this machine by a loopback name, which host 1 "
                                         r"\(node2\) would read as itself.*interface=ADDR"):
        vr.Mesh.ssh(["localhost", "node2"], gpus=1, ssh_options=options, interface="0.0.0.0", preload=[], echo=False)
    with vr.Mesh.ssh(["localhost", "node2"], gpus=1, ssh_options=options, interface="0.0.0.0", preload=[],
                     echo=False, startup_timeout=60, env={"MASTER_ADDR": CONTROLLER_ADDR}) as mesh:
        assert mesh.run("import os\nos.environ['MASTER_ADDR']").values() == [CONTROLLER_ADDR] * 2


def test_an_attached_host_0_on_loopback_gives_the_others_the_address_they_reached(tmp_path):
    from tests.launchers.netns import Hosts, skip_reason
    from tests.launchers.test_attach import _agent, _attach_later, _port, _reap

    why = skip_reason()
    if why:
        pytest.skip(why)
    net = Hosts(1).open()
    key_file, port = str(tmp_path / "mesh.key"), _port()
    procs, t = _attach_later(f"127.0.0.1:{port}", 1, "--key-file", key_file, "--host", "0")
    try:
        def far_agent() -> None:
            wait_until(lambda: os.path.exists(key_file), 30, "the controller to write the key file")
            procs.append(_agent(f"{CONTROLLER_ADDR}:{port}", "--key-file", key_file, "--host", "1",
                                prefix=net.exec_argv(1)))

        far = threading.Thread(target=far_agent)
        far.start()
        try:
            with vr.Mesh.attach(hosts=2, gpus=1, listen=f"0.0.0.0:{port}", key_file=key_file, preload=[],
                                echo=False, startup_timeout=60) as mesh:
                assert mesh.run("import os\nos.environ['MASTER_ADDR']").values() == ["127.0.0.1", CONTROLLER_ADDR]
        finally:
            t.join()
            far.join()
            _reap(procs)
    finally:
        net.close()
