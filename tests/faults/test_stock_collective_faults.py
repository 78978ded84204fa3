"""Stock torch.distributed code blocked in C++ is released when a peer fails or on interrupt."""

import time

import pytest

import viceroy as vr
from tests.conftest import wait_running, wait_until

pytest.importorskip("torch")


def _init(mesh):
    def init():
        import torch.distributed as dist

        dist.init_process_group()

    mesh.run(init)


def test_a_rank_raising_releases_peers_blocked_in_a_stock_all_reduce(start_mesh):
    mesh = start_mesh(gpus=3, preload=["torch"])
    _init(mesh)
    code = (
        "import torch, torch.distributed as dist\n"
        "if rank == 1:\n    raise ValueError('no gradient for you')\n"
        "dist.all_reduce(torch.ones(4))"
    )
    t0 = time.monotonic()
    with pytest.raises(vr.MeshError) as info:
        mesh.run(code)
    assert time.monotonic() - t0 < 3.0
    assert "rank 1: ValueError: no gradient for you" in str(info.value)
    wait_until(lambda: set(mesh.states().values()) == {"idle"}, 3, "every rank to be idle")


def _interrupt_a_blocked_barrier(mesh: vr.Mesh) -> tuple[vr.MeshError, float]:
    """Rank 0 alone in a stock barrier (rank 1 never comes), interrupted: its error, and how
    long the interrupt took to end the call."""
    rank0 = mesh.slice(gpus=0)
    fut = rank0.run("import torch, torch.distributed as dist\ndist.barrier()", block=False)
    wait_running(rank0, "dist.barrier()")
    t0 = time.monotonic()
    mesh.interrupt()
    with pytest.raises(vr.MeshError) as info:
        fut.get(timeout=5)
    return info.value, time.monotonic() - t0


def test_interrupt_releases_ranks_blocked_in_a_stock_barrier(start_mesh):
    mesh = start_mesh(gpus=2, preload=["torch"])
    _init(mesh)
    _, took = _interrupt_a_blocked_barrier(mesh)
    assert took < 2.0
    assert mesh.run("rank").values() == [0, 1]


def test_a_stock_group_cut_to_release_a_collective_says_so_and_how_to_recover(start_mesh):
    mesh = start_mesh(gpus=2, preload=["torch"])
    _init(mesh)
    first, _ = _interrupt_a_blocked_barrier(mesh)
    # where the user's code was, and where in torch it was blocked
    assert "<mesh-cell" in str(first) and "dist.barrier()" in str(first)
    assert "(in torch/distributed/" in str(first)
    with pytest.raises(vr.MeshError) as info:  # each rank answers for itself (no fail-fast race)
        mesh.run("import torch, torch.distributed as dist\nt = torch.ones(2); dist.all_reduce(t)", timeout=20,
                 fail_fast=False)
    text = str(info.value)
    # on both ranks, what happened and the way out (gloo's own message stays in the traceback)
    for r in (0, 1):
        assert f"rank {r}: RuntimeError: this torch.distributed group lost its connections" in text, text
    assert "vr.reinit_process_group()" in text
    # ... which works, again and again (each time on rendezvous keys of its own: a plain
    # destroy + init reads the old group's, and a rank may dial a peer's closed port)
    for _ in range(3):
        got = mesh.run("import viceroy as vr\nvr.reinit_process_group()\n"
                       "t = torch.ones(2); dist.all_reduce(t); t.tolist()", timeout=30)
        assert got.values() == [[2.0, 2.0], [2.0, 2.0]]
