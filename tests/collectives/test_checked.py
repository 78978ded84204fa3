"""Checked collectives (``vr.check_collectives()`` / ``VICEROY_CHECK_COLLECTIVES=1``): a mismatch
the backends would complete with wrong values (same byte size, other dtype, op or root) ends the
collective on every member before anything is sent, naming what each rank passed; matching
calls still give the right answers, and the communicator stays usable."""

from __future__ import annotations

import time

import pytest

import viceroy as vr
from tests.collectives.conftest import SETUP
from tests.collectives.test_faults import assert_next_collective_is_right

pytestmark = pytest.mark.timeout(120)


def checked_failure(mesh: vr.Mesh, code: str) -> tuple[float, vr.MeshError]:
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        mesh.run(code, timeout=60, fail_fast=False)
    return time.monotonic() - t0, info.value


@pytest.fixture
def checked_mesh(torch_mesh):
    mesh = torch_mesh(gpus=2)
    mesh.run("vr.check_collectives()")
    return mesh


def test_unchecked_a_same_size_dtype_mismatch_completes_with_reinterpreted_bytes(torch_mesh):
    # What checking is for: without it the backend adds int32 bits to float32 bits, silently.
    mesh = torch_mesh(gpus=2)
    got = mesh.run("t = torch.ones(2, dtype=torch.float32 if rank == 0 else torch.int32)\n"
                   "vr.all_reduce(t)\nt.tolist()").values()
    assert got[0] != [2.0, 2.0]


@pytest.mark.parametrize("code, rank0, rank1", [
    ("t = torch.ones(2, dtype=torch.float32 if rank == 0 else torch.int32); vr.all_reduce(t)",
     "all_reduce('sum') float32[2]", "all_reduce('sum') int32[2]"),
    ("vr.all_reduce(torch.ones(2), op='sum' if rank == 0 else 'max')",
     "all_reduce('sum') float32[2]", "all_reduce('max') float32[2]"),
    ("vr.all_reduce(torch.ones(2, 3) if rank == 0 else torch.ones(3, 2))",
     "all_reduce('sum') float32[2, 3]", "all_reduce('sum') float32[3, 2]"),
    ("vr.broadcast(torch.ones(2), src=rank)", "broadcast(src=0) float32[2]", "broadcast(src=1) float32[2]"),
    ("vr.send(torch.ones(2), dst=1) if rank == 0 else vr.recv(torch.ones(4), src=0)",
     "send/recv float32[2]", "send/recv float32[4]"),
])
def test_checked_a_mismatch_ends_the_collective_on_every_rank_naming_what_each_passed(checked_mesh, code, rank0, rank1):
    took, err = checked_failure(checked_mesh, code)
    assert took < 5, str(err)
    assert sorted(err.failures) == [0, 1], "every member stops, not only one"
    msg = str(err)
    assert "passed different tensors or operations" in msg and "nothing was sent" in msg, msg
    assert f"rank 0: {rank0}; rank 1: {rank1}" in msg, msg
    assert_next_collective_is_right(checked_mesh, 2)


def test_checked_collectives_that_match_give_the_right_answers(checked_mesh):
    got = checked_mesh.run(
        "t = torch.ones(2) * (rank + 1); vr.all_reduce(t)\n"
        "g = vr.all_gather(torch.tensor([rank]))\n"
        "rs = vr.reduce_scatter(torch.arange(4.) + rank)\n"
        "b = vr.broadcast(torch.tensor([float(rank)]), src=1)\n"
        "vr.barrier()\n"
        "if rank == 0: vr.send(torch.tensor([7.0]), dst=1); r = None\n"
        "else: r = vr.recv(torch.zeros(1), src=0).item()\n"
        "t.tolist(), g.flatten().tolist(), rs.tolist(), b.item(), r").values()
    assert got == [([3.0, 3.0], [0, 1], [1.0, 3.0], 1.0, None), ([3.0, 3.0], [0, 1], [5.0, 7.0], 1.0, 7.0)]


def test_checking_follows_the_environment_and_can_be_turned_off(start_mesh):
    mesh = start_mesh(gpus=2, preload=["torch"], env={"VICEROY_CHECK_COLLECTIVES": "1"})
    mesh.run(SETUP)
    code = "t = torch.ones(2, dtype=torch.float32 if rank == 0 else torch.int32); vr.all_reduce(t); t.tolist()"
    _, err = checked_failure(mesh, code)
    assert "rank 1: all_reduce('sum') int32[2]" in str(err)
    mesh.run("vr.check_collectives(False)")
    mesh.run(code)  # unchecked again: it completes (with wrong values) instead of raising


def test_a_setting_that_is_no_bool_is_refused_and_false_in_the_environment_means_off(start_mesh):
    # check_collectives("off") turned checking on (any non-empty str is true), and so did
    # VICEROY_CHECK_COLLECTIVES=false (only "" and "0" meant off).
    mesh = start_mesh(gpus=2, preload=["torch"], env={"VICEROY_CHECK_COLLECTIVES": "false"})
    mesh.run(SETUP)
    mesh.run(MISMATCH)  # unchecked: it completes (with wrong values) instead of raising
    with pytest.raises(vr.MeshError, match=r"TypeError: check_collectives takes True or False; got 'off' \(str\)"):
        mesh.run("vr.check_collectives('off')")
    mesh.run(MISMATCH)  # still unchecked


MISMATCH = "t = torch.ones(2, dtype=torch.float32 if rank == 0 else torch.int32); vr.all_reduce(t); t.tolist()"


def test_ranks_that_disagree_on_checking_are_told_so_instead_of_misreading_the_comparison(torch_mesh):
    mesh = torch_mesh(gpus=2)
    mesh.run("vr.all_reduce(torch.ones(2))")  # a communicator built unchecked on both
    mesh.run("if rank == 0: vr.check_collectives()")  # only rank 0 turns it on
    took, err = checked_failure(mesh, MISMATCH)
    assert took < 5, str(err)
    assert sorted(err.failures) == [0, 1], str(err)
    assert "collectives are checked on rank 0 but not on rank 1; nothing was sent" in str(err), str(err)
    assert "vr.check_collectives()" in str(err)
    mesh.run("vr.check_collectives()")  # now on every rank: the comparison runs, and refuses
    _, err = checked_failure(mesh, MISMATCH)
    assert "rank 0: all_reduce('sum') float32[2]; rank 1: all_reduce('sum') int32[2]" in str(err), str(err)
    assert_next_collective_is_right(mesh, 2)


def test_a_rank_restarted_alone_starts_unchecked_and_its_next_collective_says_so(torch_mesh):
    mesh = torch_mesh(gpus=2)
    mesh.run("vr.check_collectives(); vr.all_reduce(torch.ones(2))")
    with pytest.raises(vr.MeshError):
        mesh.run("if rank == 1: os.kill(os.getpid(), signal.SIGKILL)\nvr.all_reduce(torch.ones(2))", timeout=60)
    mesh.restart(failed_only=True)
    mesh.run(SETUP)
    took, err = checked_failure(mesh, MISMATCH)  # unchecked, rank 1 would return wrong values
    assert took < 5, str(err)
    assert "collectives are checked on rank 0 but not on rank 1" in str(err), str(err)
    assert "a rank restarted alone starts unchecked" in str(err)
