"""No hang, ever: a rank that raises before a collective, dies inside one, or is interrupted
ends the call on every rank quickly, with an error naming the rank; the communicator is
rebuilt on next use and the next collective gives the right answer. Real processes, real kills.
"""

from __future__ import annotations

import os
import re
import signal
import struct
import time

import pytest

import viceroy as vr
from tests.collectives.conftest import SETUP
from tests.conftest import fails_within, wait_running, wait_until
from viceroy.runtime import outcomes

NEXT = "t = torch.ones(2) * (rank + 1); vr.all_reduce(t); t.tolist()"


def timed_failure(mesh: vr.Mesh, code: str, **kw: object) -> tuple[float, str]:
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        mesh.run(code, timeout=60, **kw)
    return time.monotonic() - t0, str(info.value)


def assert_next_collective_is_right(mesh: vr.Mesh, n: int) -> None:
    expected = [float(n * (n + 1) // 2)] * 2
    assert set(map(tuple, mesh.run(NEXT, timeout=30).values())) == {tuple(expected)}


def test_a_rank_raising_before_a_collective_ends_it_everywhere(torch_mesh):
    mesh = torch_mesh(gpus=4)
    mesh.run(NEXT)  # the communicator exists: the others really block in it
    took, msg = timed_failure(mesh, "if rank == 2: 1/0\nt = torch.ones(2); vr.all_reduce(t)")
    assert took < 5
    assert "rank 2: ZeroDivisionError" in msg
    assert "stopped by fail-fast after rank 2 failed" in msg
    # Rank 2 never saw the failure; its stale communicator must not leak the aborted round's
    # data into the next one.
    assert_next_collective_is_right(mesh, 4)


def test_ranks_stopped_in_a_collective_are_said_to_be_at_the_users_line_only(torch_mesh):
    # The location named the stdlib frame the collective waited in, under the runtime's own
    # frames: "(at <mesh-cell-3>, line 4: vr.all_reduce(t) (in threading.py, line 1139))".
    mesh = torch_mesh(gpus=2)  # no communicator yet: rank 0 waits for rank 1 to build one
    took, msg = timed_failure(mesh, "if rank == 1:\n    time.sleep(0.5)\n    1/0\nt = torch.ones(2); vr.all_reduce(t)")
    assert took < 5, msg
    stopped = next(line for line in msg.splitlines() if "stopped by fail-fast" in line)
    assert re.fullmatch(r"rank 0: stopped by fail-fast after rank 1 failed "
                        r"\(at <mesh-cell-\d+>, line 4: t = torch.ones\(2\); vr.all_reduce\(t\)\)", stopped), stopped


def test_a_rank_dying_inside_a_collective_is_named_and_a_restart_recovers(torch_mesh):
    mesh = torch_mesh(gpus=4)
    code = ("for i in range(400):\n"
            "    if rank == 1 and i == 200: os.kill(os.getpid(), signal.SIGKILL)\n"
            "    vr.all_reduce(torch.ones(1000))")
    took, msg = timed_failure(mesh, code)
    assert took < 5
    assert "rank 1: died (SIGKILL)" in msg
    assert "connection to rank 1 was lost" in msg or "stopped by fail-fast after rank 1 died" in msg
    mesh.restart(failed_only=True)
    mesh.run(SETUP)
    assert_next_collective_is_right(mesh, 4)


def test_losing_rank_0_and_the_store_it_hosts_recovers_after_restart(torch_mesh):
    mesh = torch_mesh(gpus=3)
    mesh.run(NEXT)
    took, msg = timed_failure(mesh, "if rank == 0: os.kill(os.getpid(), signal.SIGKILL)\nvr.all_reduce(torch.ones(2))")
    assert took < 5 and "rank 0: died (SIGKILL)" in msg
    mesh.restart(failed_only=True)
    mesh.run(SETUP)
    assert_next_collective_is_right(mesh, 3)


def test_interrupt_releases_ranks_blocked_in_a_collective(torch_mesh):
    mesh = torch_mesh(gpus=4)
    mesh.run(NEXT)
    fut = mesh.run("if rank == 3: time.sleep(60)\nelse: vr.all_reduce(torch.ones(2))", block=False)
    wait_running(mesh.slice(gpus=slice(0, 3)), "vr.all_reduce")  # the three are inside the collective
    assert "interrupted" in str(fails_within(fut, mesh.interrupt, 2, timeout=10))
    assert set(mesh.states().values()) == {"idle"}
    assert_next_collective_is_right(mesh, 4)


def test_a_rank_whose_collective_an_interrupted_peer_ended_counts_as_interrupted_too(torch_mesh):
    # The cancels of an interrupt go out rank by rank: a rank whose collective was ended by a
    # member interrupted first answered with that CollectiveError ("... the connection to rank
    # 2 was lost (it died, or left the collective)"), which the error then showed first, as
    # the call's failure, though nothing failed (CI: an actor call cancelled on ranks 0, 2 and 3
    # reported rank 3 so). Here rank 1 ignores SIGINT, so it always hears of it from a peer.
    mesh = torch_mesh(gpus=3)
    mesh.run(NEXT)
    code = ("if rank == 2:\n    time.sleep(60)\nelse:\n    previous = signal.getsignal(signal.SIGINT)\n"
            "    if rank == 1:\n        signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "    try:\n        vr.all_reduce(torch.ones(2))\n"
            "    finally:\n        signal.signal(signal.SIGINT, previous)")
    fut = mesh.run(code, block=False)
    wait_running(mesh.slice(gpus=slice(0, 2)), "vr.all_reduce")
    failures = fails_within(fut, mesh.interrupt, 5, timeout=10).failures
    assert {r: f.kind for r, f in failures.items()} == {0: "interrupted", 1: "interrupted", 2: "interrupted"}, failures
    assert failures[1].summary == "interrupted" and not failures[1].traceback, failures[1]
    assert_next_collective_is_right(mesh, 3)


def test_a_frozen_rank_0_does_not_hold_the_others_past_an_interrupt(torch_mesh):
    # Rank 0 hosts the rendezvous store: frozen, it answers nothing and its connections stay
    # open, so the others' store requests (their agreement check, their give-up record) must
    # not wait on it in C++, where no interrupt reaches.
    mesh = torch_mesh(gpus=3)
    mesh.run(NEXT)
    fut = mesh.run("if rank == 0: time.sleep(60)\nelse: vr.all_reduce(torch.ones(2))", block=False)
    wait_running(mesh.slice(gpus=slice(1, 3)), "vr.all_reduce")
    rank0 = mesh.pids()[0]
    os.kill(rank0, signal.SIGSTOP)
    try:
        assert "interrupted" in str(fails_within(fut, mesh.interrupt, 5, timeout=10))
        wait_until(lambda: [mesh.states()[r] for r in (1, 2)] == ["idle", "idle"], 10,
                   "ranks 1-2 to leave the collective")
    finally:
        os.kill(rank0, signal.SIGKILL)
    wait_until(lambda: mesh.states()[0] == "dead", 10, "rank 0 to be seen dead")
    mesh.restart(failed_only=True)
    mesh.run(SETUP)
    assert_next_collective_is_right(mesh, 3)


@pytest.mark.parametrize("blocked", ["send", "recv"])
def test_interrupt_releases_a_rank_blocked_in_a_send_or_receive(torch_mesh, blocked):
    mesh = torch_mesh(gpus=2)
    mesh.run("vr.barrier()")
    code = ("t = torch.ones(1 << 20)\n"
            f"if rank == 0: vr.{blocked}(t, 1)\n"  # its peer never answers
            "else: time.sleep(60)")
    fut = mesh.run(code, block=False)
    wait_running(mesh.slice(gpus=0), f"vr.{blocked}")
    assert "interrupted" in str(fails_within(fut, mesh.interrupt, 2, timeout=10))
    # Its waiter thread was let go too: every one is idle again, none left blocked in gloo.
    waiters = ("import threading\nfrom viceroy.runtime.collectives import gloo\n"
               "(sum(t.name == 'viceroy-gloo-p2p' for t in threading.enumerate()), gloo._waiters._idle)")
    wait_until(lambda: all(n == idle for n, idle in mesh.run(waiters).values()), 5, "the waiter to be let go")
    pair = mesh.run("t = torch.full((3,), 5.0) if rank == 0 else torch.zeros(3)\n"
                    "vr.send(t, 1) if rank == 0 else vr.recv(t, 0)\nt.tolist()", timeout=30)
    assert pair.values() == [[5.0] * 3] * 2


def test_an_interrupt_while_a_send_is_handed_to_its_waiter_loses_nothing(monkeypatch):
    import signal
    import threading

    from viceroy.runtime.collectives import gloo

    waiters = gloo._Waiters()
    real_start = threading.Thread.start

    def start_then_interrupt(self: threading.Thread) -> None:
        real_start(self)
        signal.raise_signal(signal.SIGINT)  # the stop button, while the waiter thread boots

    monkeypatch.setattr(threading.Thread, "start", start_then_interrupt)
    ran = threading.Event()

    class Op:
        def run(self) -> None:
            ran.set()

    try:
        waiters.put(Op())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        pass
    assert ran.wait(5), "the operation was never handed to the waiter"
    wait_until(lambda: waiters._idle == 1, 5, "the waiter to count itself idle")


def test_ranks_that_never_join_are_named_when_the_group_times_out(torch_mesh):
    mesh = torch_mesh(gpus=4)
    code = ("from viceroy.runtime import collectives as C\nC.set_timeout(2)\n"
            "if rank < 2: vr.all_reduce(torch.ones(1))\n"
            "else: time.sleep(30)  # ranks 2 and 3 never come")
    took, msg = timed_failure(mesh, code)
    assert took < 10
    assert "ranks 2-3 did not join within 2 s" in msg
    # One rank was "ranks 3"
    msg = timed_failure(mesh, code.replace("rank < 2", "rank < 3").replace("ranks 2 and 3", "rank 3"))[1]
    assert "rank 3 did not join within 2 s (is it running this code?)" in msg, msg


def test_abort_all_releases_a_stock_torch_distributed_collective(torch_mesh):
    """The runtime's interrupt path can call collectives.abort_all() on each rank (from its IO
    thread); stock code blocked in C++ (dist.all_reduce, DDP) then raises."""
    mesh = torch_mesh(gpus=3)
    code = ("import threading, torch.distributed as dist\n"
            "from viceroy.runtime import collectives as C\n"
            "C.install_torch_hooks(); dist.init_process_group(); dist.all_reduce(torch.ones(1))\n"
            "if rank == 2: time.sleep(3)\n"
            "else:\n"
            "    threading.Timer(0.5, C.abort_all).start(); t0 = time.monotonic()\n"
            "    try: dist.all_reduce(torch.ones(1)); released = None\n"
            "    except RuntimeError as e: released = (time.monotonic() - t0, 'Connection closed' in str(e))\n"
            "released if rank != 2 else None")
    out = mesh.run(code, timeout=30)
    for r in (0, 1):
        took, closed = out.item(gpus=r)
        assert took < 2 and closed


def test_a_blocked_collective_does_not_stop_other_threads(torch_mesh, tmp_path):
    mesh = torch_mesh(gpus=2)
    gate = tmp_path / "gate"  # rank 1 joins once the test has seen rank 0 waiting (30 s at most)
    fut = mesh.run("import os, time\nend = time.monotonic() + 30\n"
                   "while rank == 1 and not os.path.exists(gate) and time.monotonic() < end: time.sleep(0.02)\n"
                   "vr.all_reduce(torch.ones(1))", gate=str(gate), block=False)
    try:  # while rank 0 waits for rank 1, its IO thread still answers (stacks needs the GIL)
        wait_until(lambda: "all_reduce" in mesh.stacks(timeout=1).item(gpus=0), 10, "rank 0's stack in all_reduce")
    finally:
        gate.touch()
    fut.get(timeout=30)


def test_interrupt_while_the_group_is_still_forming(torch_mesh):
    mesh = torch_mesh(gpus=3)
    # First use: ranks 0-1 wait for rank 2 to build the communicator at all.
    fut = mesh.run("if rank == 2: time.sleep(60)\nelse: vr.all_reduce(torch.ones(2))", block=False)
    wait_running(mesh.slice(gpus=slice(0, 2)), "vr.all_reduce")
    assert "interrupted" in str(fails_within(fut, mesh.interrupt, 2, timeout=10))
    assert_next_collective_is_right(mesh, 3)


def test_a_member_that_left_an_attempt_unfinished_does_not_hang_the_next_one(torch_mesh):
    # An interrupt can cut a rank's give-up short (it may land even inside Thread.start), so
    # the rank still counts as a member of the generation it joined. Here rank 0 is made to
    # believe so, and comes late: ranks 1-2 are already waiting in generation 0 when rank 0
    # finds it stale, leaves it, and all three must meet in generation 1.
    mesh = torch_mesh(gpus=3)
    mesh.run("from viceroy.runtime.collectives import entries, store\n"
             "if rank == 0:\n"
             "    incarnation = store.rendezvous.get(30)[1]\n"
             "    entries.joined.add(f'viceroy/{incarnation}/gloo/0.1.2/g0')")
    late = mesh.run("if rank == 0: time.sleep(0.5)\n" + NEXT, timeout=30)
    assert late.values() == [[6.0, 6.0]] * 3
    joined = mesh.run("sorted(k.rsplit('/', 1)[1] for k in entries.joined)")
    assert joined.values() == [["g0", "g1"]] * 3  # ranks 1-2 moved on with rank 0
    assert_next_collective_is_right(mesh, 3)


def test_a_failure_in_one_dims_group_leaves_the_others_working(torch_mesh):
    mesh = torch_mesh(dp=2, tp=2)
    both = ("a = torch.ones(1) * rank; vr.all_reduce(a, dims='tp')\n"
            "b = torch.ones(1) * rank; vr.all_reduce(b, dims='dp')\n"
            "a.item(), b.item()")
    before = mesh.run(both)
    took, msg = timed_failure(mesh, "if rank == 1: 1/0\nvr.all_reduce(torch.ones(1), dims='tp')")
    assert took < 5 and "rank 1: ZeroDivisionError" in msg
    assert mesh.run(both) == before
    assert before.item(dp=1, tp=0) == (5.0, 2.0)


@pytest.mark.parametrize("dims", [{"gpus": 4}, {"hosts": 2, "gpus": 2}], ids=["direct", "relayed"])
def test_a_rank_that_skips_a_collective_releases_the_others_naming_it(torch_mesh, dims):
    # `if rank != 2: vr.all_reduce(t)`: rank 2 finishes the call; the others would wait for
    # it forever. The controller tells them who finished; they stop, naming rank 2.
    mesh = torch_mesh(**dims)
    mesh.run(NEXT)  # the group exists: the others really wait in the collective
    took, msg = timed_failure(mesh, "t = torch.ones(2)\nif rank != 2:\n    vr.all_reduce(t)")
    assert took < 5, msg
    assert "rank 2 finished the call without joining this collective" in msg, msg
    # The ranks that waited say the same, so they group as one (each named itself in its
    # message, "(rank 0 waited in it)": three groups of the same lines)
    assert not re.search(r"rank \d waited", msg), msg
    assert_next_collective_is_right(mesh, 4)


def test_a_rank_that_skips_the_first_collective_of_a_group_releases_the_others(torch_mesh):
    mesh = torch_mesh(gpus=3)
    took, msg = timed_failure(mesh, "t = torch.ones(2)\nif rank != 0:\n    vr.all_reduce(t, dims='gpus')",
                              fail_fast=False)
    assert took < 5, msg
    assert "rank 0 finished the call without joining this collective" in msg, msg
    assert "viceroy.CollectiveError: " in msg and "viceroy.runtime." not in msg, msg  # its public name
    assert_next_collective_is_right(mesh, 3)


@pytest.mark.parametrize("dims", [{"gpus": 4}, {"hosts": 2, "gpus": 2}], ids=["direct", "relayed"])
def test_a_rank_dying_before_it_joins_releases_the_others_at_once_without_fail_fast(torch_mesh, dims):
    # Without fail-fast nothing interrupts the ranks waiting for the group to form; they would
    # wait out the group's timeout. The controller tells them of the death instead.
    mesh = torch_mesh(**dims)
    fut = mesh.run("t = torch.ones(2)\nif rank == 3:\n    time.sleep(60)\nvr.all_reduce(t)", block=False, fail_fast=False)
    wait_running(mesh.select([3]), "time.sleep")
    wait_running(mesh.select([0, 1, 2]), "vr.all_reduce")
    msg = str(fails_within(fut, lambda: os.kill(mesh.pids()[3], signal.SIGKILL), 5))
    # One message for the three that waited (none nested in another's), and the death itself.
    assert ("ranks 0-2: viceroy.CollectiveError: all_reduce('sum') over the whole mesh (ranks 0-3): "
            "rank 3 died, while the others waited for the group to form.\n") in msg, msg
    assert "rank 3: died (SIGKILL)" in msg and "Every rank of a group" not in msg, msg
    mesh.restart(failed_only=True)
    mesh.run(SETUP)
    assert_next_collective_is_right(mesh, 4)


def test_rank_0_dying_before_its_store_is_up_releases_the_others_without_fail_fast(start_mesh):
    # Without torch preloaded, rank 0 opens the rendezvous store only once it uses a collective:
    # the others wait for it to come up, and nothing but the controller's word says it never will.
    mesh = start_mesh(gpus=3)
    mesh.run(SETUP)
    fut = mesh.run("t = torch.ones(2)\nif rank == 0:\n    time.sleep(60)\nvr.all_reduce(t)", block=False, fail_fast=False)
    wait_running(mesh.select([0]), "time.sleep")
    wait_running(mesh.select([1, 2]), "vr.all_reduce")
    msg = str(fails_within(fut, lambda: os.kill(mesh.pids()[0], signal.SIGKILL), 5))
    assert ("ranks 1-2: viceroy.CollectiveError: all_reduce('sum') over the whole mesh (ranks 0-2): rank 0 "
            "died, and the rendezvous store with it (it hosts it), while the others waited for it.") in msg, msg
    mesh.restart(failed_only=True)
    mesh.run(SETUP)
    assert_next_collective_is_right(mesh, 3)


def test_ranks_that_finished_are_blamed_only_by_groups_they_belong_to(torch_mesh):
    # Ranks 0-1 (a=0) take part in the whole-mesh all_reduce and finish; ranks 2-3 compute
    # past the controller's notice, then all_reduce over their own group along "b".
    mesh = torch_mesh(a=2, b=2)
    code = ("import time\nt = torch.ones(2); vr.all_reduce(t)\n"
            "if coords['a'] == 1:\n    time.sleep(1.5)\n    u = torch.ones(2) * rank; vr.all_reduce(u, dims='b')\n"
            "t.tolist()")
    assert mesh.run(code, timeout=30).values() == [[4.0, 4.0]] * 4
    assert mesh.slice(a=1).run("u.tolist()").values() == [[5.0, 5.0]] * 2


def test_a_rank_that_finds_the_group_given_up_reports_its_own_collective_and_the_cause(torch_mesh):
    """Rank 0 times out forming the group and records why; rank 1, which came later for a
    different collective over the same group, reads that record: its error names its own
    collective and the cause, without the other rank's message nested in it."""
    mesh = torch_mesh(gpus=4)
    code = ("from viceroy.runtime import collectives as C\nC.set_timeout(2)\n"
            "if rank == 0: vr.all_reduce(torch.ones(1))\n"
            "elif rank == 1: time.sleep(1); vr.broadcast(torch.ones(1), src=0)\n"
            "else: time.sleep(8)  # ranks 2 and 3 never come")
    with pytest.raises(vr.MeshError) as info:
        mesh.run(code, timeout=60, fail_fast=False)
    summaries = {r: f.summary for r, f in info.value.failures.items()}
    assert set(summaries) == {0, 1}, summaries
    assert "all_reduce('sum') over" in summaries[0] and "ranks 2-3 did not join within 2 s" in summaries[0]
    assert "broadcast over" in summaries[1] and "ranks 2-3 did not join within 2 s" in summaries[1]
    assert "all_reduce" not in summaries[1], summaries[1]


@pytest.mark.parametrize("n", [2, 4])
def test_ranks_passing_tensors_of_different_shapes_fail_naming_each_ranks(torch_mesh, n):
    """Backends wait for bytes that never come when shapes differ (all ranks, or all but one
    that got what it needed): the members still waiting compare what they passed and stop."""
    mesh = torch_mesh(gpus=n)
    took, msg = timed_failure(mesh, "t = torch.ones(rank + 1)\nvr.all_reduce(t)", fail_fast=False)
    assert took < 15, msg
    assert "passed different tensors or operations" in msg, msg
    assert "rank 1: all_reduce('sum') float32[2]" in msg, msg
    assert_next_collective_is_right(mesh, n)


@pytest.mark.parametrize("then", ["ends the call", "waits in the next collective", "computes, then ends the call"])
def test_a_mismatch_with_a_member_that_already_returned_fails_too(torch_mesh, then):
    """Rank 0 passes 1 element, rank 1 four: rank 0 gets what it needs and returns (its result
    as the backend gives it), so only rank 1 waits. What rank 0 passed still reaches it: with
    rank 0's answer when it ends the call, or from the store when it waits in a later one."""
    mesh = torch_mesh(gpus=2)
    after = {"ends the call": "", "waits in the next collective": "vr.all_reduce(torch.ones(2))\n",
             "computes, then ends the call": "time.sleep(3 if rank == 0 else 0)\n"}[then]
    took, msg = timed_failure(mesh, "import time\nt = torch.ones(1 + 3 * rank)\nvr.all_reduce(t)\n" + after, fail_fast=False)
    assert took < 15, msg
    assert "passed different tensors or operations" in msg, msg
    assert "rank 0: all_reduce('sum') float32[1]; rank 1: all_reduce('sum') float32[4]" in msg, msg
    assert_next_collective_is_right(mesh, 2)


def test_a_rank_gloo_aborts_for_a_size_mismatch_is_said_to_have_died_of_it(torch_mesh):
    # gloo ends a process (std::terminate, SIGABRT) that receives more bytes than it expects,
    # before any check of ours can run; the death said only "died (SIGABRT)". Rank 0 (the one
    # receiving too much) holds its output reader, so its last words stay in its pipes for its
    # agent to read out, as after any death (the reader could take them out, then die unsent).
    mesh = torch_mesh(gpus=2)
    hold = ("import gc\nfrom viceroy.runtime.output import OutputCapture\nif rank == 0:\n"
            "    next(o for o in gc.get_objects() if isinstance(o, OutputCapture))._sending.acquire()\n")
    took, msg = timed_failure(
        mesh, hold + "t = torch.ones(2, dtype=torch.float64 if rank == 1 else torch.float32)\nvr.all_reduce(t)", fail_fast=False)
    assert took < 10, msg
    assert "rank 0: died (SIGABRT): gloo ended it on receiving more bytes than it expected: the ranks passed tensors of different sizes or dtypes" in msg, msg
    mesh.restart(failed_only=True)
    mesh.run(SETUP)
    assert_next_collective_is_right(mesh, 2)


def test_a_reduce_scatter_of_different_sizes_or_one_a_rank_skips_ends_within_seconds(torch_mesh):
    # gloo's reduce_scatter ignores the time limit of a wait: the members' wait never came back
    # to look for a mismatch or a member that finished, and they hung until the group's timeout.
    mesh = torch_mesh(gpus=2)
    took, msg = timed_failure(mesh, "vr.reduce_scatter(torch.ones(2 * (rank + 1)))", fail_fast=False)
    assert took < 15, msg
    assert "rank 0: reduce_scatter('sum') float32[2]; rank 1: reduce_scatter('sum') float32[4]" in msg, msg
    assert_next_collective_is_right(mesh, 2)
    took, msg = timed_failure(mesh, "t = torch.ones(4)\nif rank != 1:\n    vr.reduce_scatter(t, op='avg')")
    assert took < 10, msg
    assert "rank 1 finished the call without joining this collective" in msg, msg
    assert mesh.run("vr.reduce_scatter(torch.arange(4.) * (rank + 1), op='avg').tolist()", timeout=30).values() == [
        [0.0, 1.5], [3.0, 4.5]]


@pytest.mark.parametrize("dims", [{"gpus": 2}, {"hosts": 2, "gpus": 1}], ids=["direct", "relayed"])
def test_a_collective_in_a_call_queued_behind_a_failed_one_never_pairs_with_the_failed_calls(
        torch_mesh, dims, tmp_path):
    # Calls sent without waiting (block=False, the tensor engine's batches) queue on each rank.
    # Rank 1 raises before the first call's all_reduce and goes straight on to the second's,
    # while rank 0 still waits in the first's (here it does not hear the interrupt at once): the
    # two all_reduces met, as the same operation on the same communicator. Rank 0's first call
    # then returned 1 + 100, rank 1's second too, and rank 0's second waited for a peer that
    # had already left. A rank whose call failed now starts its next collective only once that
    # call has ended everywhere.
    mesh = torch_mesh(**dims)
    mesh.run(NEXT)  # the communicator exists: rank 0 really blocks in it
    # Rank 1 raises only once rank 0 ignores SIGINT (a file says so): else fail-fast may stop
    # rank 0 before that line, a window a change in the ranks' timing alone can land in.
    deaf = tmp_path / "rank-0-ignores-sigint"
    first = (f"deaf_file = {str(deaf)!r}\nt = torch.ones(1)\n"
             "if rank == 1:\n"
             "    until = time.monotonic() + 30\n"
             "    while not os.path.exists(deaf_file) and time.monotonic() < until:\n"
             "        time.sleep(0.002)\n"
             "    raise ValueError('bad shard')\n"
             "deaf = signal.signal(signal.SIGINT, signal.SIG_IGN)\nopen(deaf_file, 'w').close()\n"
             "try:\n    vr.all_reduce(t)\nfinally:\n    signal.signal(signal.SIGINT, deaf)\nfloat(t)")
    second = "t = torch.full((1,), 100.0)\nvr.all_reduce(t)\nfloat(t)"
    f1 = mesh.run(first, block=False)
    f2 = mesh.run(second, block=False)
    with pytest.raises(vr.MeshError) as info:
        f1.result(timeout=30)
    assert "rank 1: ValueError: bad shard" in str(info.value)
    assert not info.value.partial, info.value.partial  # rank 0's all_reduce got 1 + 100
    assert "rank 0: viceroy.CollectiveError" in str(info.value), str(info.value)
    assert f2.result(timeout=30).values() == [200.0, 200.0]
    assert_next_collective_is_right(mesh, 2)


@pytest.mark.parametrize("dims", [{"gpus": 2}, {"hosts": 2, "gpus": 1}], ids=["direct", "relayed"])
def test_a_collective_skipped_with_a_call_queued_behind_fails_both_calls_instead_of_crossing(
        torch_mesh, dims, monkeypatch, tmp_path):
    # Rank 0 finishes the first call without its all_reduce and goes straight on to the
    # second's, which meets rank 1's of the first: each returned the other's data (1 + 100),
    # both calls "succeeded", and rank 1's second all_reduce waited for a partner that had
    # already gone. The word that rank 0 finished, which stops rank 1 when no call is queued,
    # is held back here so that the two really meet, as they do whenever rank 0 is quick.
    monkeypatch.setattr(outcomes, "PEERS_DONE_AFTER_S", 600.0)
    mesh = torch_mesh(**dims)
    mesh.run(NEXT)
    # Rank 1 answers the first call only once the controller has rank 0's answer to the second
    # (a file says so): else the first call may end, and cancel the second, while rank 0 is
    # still in it, and rank 0 reports that cancel instead of the distrust checked below.
    answered = tmp_path / "rank-0-answered-both"
    rank_0_answers: list[int] = []

    def on_event(ev: dict) -> None:
        if ev["type"] in ("rank_done", "ranks_done") and 0 in ev.get("ranks", [ev.get("rank")]):
            rank_0_answers.append(ev["call"])
            if len(rank_0_answers) == 2:
                answered.touch()

    mesh.subscribe(on_event)
    f1 = mesh.run(f"answered = {str(answered)!r}\nt = torch.ones(1)\n"
                  "if rank == 1:\n"
                  "    vr.all_reduce(t)\n"
                  "    until = time.monotonic() + 30\n"
                  "    while not os.path.exists(answered) and time.monotonic() < until:\n"
                  "        time.sleep(0.002)\n"
                  "float(t)", block=False)
    f2 = mesh.run("t = torch.full((1,), 100.0)\nvr.all_reduce(t)\nfloat(t)", block=False)
    with pytest.raises(vr.MeshError) as first:
        f1.result(timeout=30)
    assert first.value.partial == {0: 1.0}  # rank 0's own value is right: it only skipped
    assert ("rank 1: viceroy.CollectiveError: it started 1 collective over ranks 0-1 in this call, rank 0 only 0: "
            "its 1st met collectives from outside this call") in str(first.value), str(first.value)
    with pytest.raises(vr.MeshError) as second:
        f2.result(timeout=30)
    assert not second.value.partial, second.value.partial  # rank 0's 101 is not passed off as this call's
    failures = second.value.failures
    assert failures[0].summary.startswith("viceroy.CollectiveError: its collectives over ranks 0-1 may have met those "
                                          "of mesh.run"), failures[0].summary
    assert failures[1].kind == "interrupted" and "crossed out of that call" in failures[1].summary, failures[1]
    assert_next_collective_is_right(mesh, 2)


def test_ranks_that_catch_a_collective_error_and_go_on_are_not_taken_for_crossed_calls(torch_mesh):
    # The ranks that waited for rank 2 started one more all_reduce than it did, and succeeded:
    # counts alone would say their all_reduce met a collective from outside the call.
    mesh = torch_mesh(gpus=3)
    mesh.run(NEXT)
    code = ("t = torch.ones(1)\nif rank != 2:\n    try:\n        vr.all_reduce(t)\n"
            "    except vr.CollectiveError as e:\n        t = str(e)\nt if isinstance(t, str) else float(t)")
    values = mesh.run(code, timeout=60).values()
    assert values[2] == 1.0 and all("rank 2 finished the call without joining" in v for v in values[:2]), values
    assert_next_collective_is_right(mesh, 3)


@pytest.mark.parametrize("ending", ["peer closes with data unread", "peer resets", "cut here"])
def test_a_watch_sees_a_connection_end_in_one_look(ending):
    # Before every operation a gloo communicator asks its Watch whether all its connections are
    # still up; a peer that gave the group up while this rank was elsewhere closed them.
    import socket

    from viceroy.runtime.collectives import sockets

    with socket.create_server(("127.0.0.1", 0)) as server:
        mine = socket.create_connection(server.getsockname())
        theirs, _ = server.accept()
    other = socket.create_server(("127.0.0.1", 0))  # a second, healthy connection in the same watch
    mine2 = socket.create_connection(other.getsockname())
    theirs2, _ = other.accept()
    conns = [(s.fileno(), os.readlink(f"/proc/self/fd/{s.fileno()}")) for s in (mine, mine2)]
    watch = sockets.Watch(conns)
    try:
        assert watch.all_established()
        if ending == "peer closes with data unread":
            theirs.sendall(b"x" * 1000)
            theirs.close()
        elif ending == "peer resets":
            theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            theirs.close()
        else:
            watch.cut()
        wait_until(lambda: not watch.all_established(), 10, f"the watch to see it ({ending})", interval=0.001)
        if ending == "peer closes with data unread":
            assert len(mine.recv(1000, socket.MSG_PEEK)) == 1000  # it was still there to read
    finally:
        watch.close()
        for s in (mine, mine2, theirs, theirs2, other):
            s.close()
