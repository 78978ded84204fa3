"""Rank code run on a view of the mesh (a split, slice, rename or selection) sees the view:
its `coords` and `mesh`, and collectives by the view's dim names and over the whole view."""

from __future__ import annotations

import time

import pytest

import viceroy as vr


def test_a_split_views_dims_name_the_collective_groups(torch_mesh):
    mesh = torch_mesh(gpus=4)
    sp = mesh.split(gpus=("dp", "tp"), tp=2)
    out = sp.run(
        "t = torch.ones(1) * rank; vr.all_reduce(t, dims='tp')\n"
        "u = torch.ones(1) * rank; vr.all_reduce(u, dims='dp')\n"
        "coords, mesh, vr.context().coords, t.item(), u.item()")
    assert out.values() == [
        ({"dp": 0, "tp": 0}, {"dp": 2, "tp": 2}, {"dp": 0, "tp": 0}, 1.0, 2.0),
        ({"dp": 0, "tp": 1}, {"dp": 2, "tp": 2}, {"dp": 0, "tp": 1}, 1.0, 4.0),
        ({"dp": 1, "tp": 0}, {"dp": 2, "tp": 2}, {"dp": 1, "tp": 0}, 5.0, 2.0),
        ({"dp": 1, "tp": 1}, {"dp": 2, "tp": 2}, {"dp": 1, "tp": 1}, 5.0, 4.0),
    ]
    # the mesh's own coordinates come back for calls on the mesh itself
    assert mesh.run("coords, mesh").values()[3] == ({"gpus": 3}, {"gpus": 4})


def test_the_whole_of_a_slice_is_its_ranks_not_the_mesh(torch_mesh):
    mesh = torch_mesh(gpus=4)
    half = mesh.slice(gpus=slice(2, 4))  # ranks 0 and 1 take no part: before, this waited for them
    out = half.run("t = torch.ones(1) * rank; vr.all_reduce(t); coords, t.item()", timeout=30)
    assert out.values() == [({"gpus": 0}, 5.0), ({"gpus": 1}, 5.0)]
    picked = mesh.select([3, 0])  # positions follow the selection's order
    got = picked.run("vr.all_gather(torch.tensor([rank])).flatten().tolist()", timeout=30).values()
    assert got == [[3, 0], [3, 0]]


def test_send_or_recv_with_a_rank_outside_the_view_fails_at_once(torch_mesh):
    mesh = torch_mesh(gpus=4)
    half = mesh.slice(gpus=slice(0, 2))  # rank 3 does not run this call: it waited for it forever
    began = time.monotonic()
    with pytest.raises(vr.MeshError, match=r"send: rank 3 is not in this call, which runs on ranks 0-1"):
        half.run("if rank == 0: vr.send(torch.ones(1), 3)", timeout=30)
    with pytest.raises(vr.MeshError, match=r"recv: rank 2 is not in this call, which runs on ranks 0-1"):
        half.run("if rank == 1: vr.recv(torch.ones(1), 2)", timeout=30)
    assert time.monotonic() - began < 20
    # a rank of the view is fine, on a view whose positions are not its global ranks too
    picked = mesh.select([3, 1])
    got = picked.run("t = torch.full((1,), float(rank))\n"
                     "vr.send(t, 1) if rank == 3 else vr.recv(t, 3)\n"
                     "t.item()", timeout=30)
    assert got.values() == [3.0, 3.0]


def test_device_mesh_takes_a_splits_dim_names_and_refuses_a_slice(torch_mesh):
    mesh = torch_mesh(gpus=4)
    sp = mesh.split(gpus=("dp", "tp"), tp=2)
    names = sp.run("dm = vr.device_mesh(); dm.mesh_dim_names, dm['tp'].size()", timeout=60).values()
    assert names == [(("dp", "tp"), 2)] * 4
    with pytest.raises(vr.MeshError, match="device_mesh\\(\\) spans every rank of the mesh"):
        mesh.slice(gpus=slice(0, 2)).run("vr.device_mesh()", timeout=30)


def test_device_mesh_refuses_a_device_type_the_ranks_cannot_use_before_making_a_group(torch_mesh):
    # device_mesh("gpu") made a DeviceMesh of device type "gpu", over a gloo default group it had
    # initialised; device_mesh("cuda") without a GPU failed in init_process_group with
    # "Distributed package doesn't have NCCL built in".
    mesh = torch_mesh(gpus=2)
    with pytest.raises(vr.MeshError, match=r"ValueError: device_mesh\(device_type='gpu'\): not a torch device "
                                           r"type; use 'cuda' \(the rank's GPU\) or 'cpu'"):
        mesh.run("vr.device_mesh('gpu')", timeout=30)
    if not mesh.run("torch.cuda.is_available()").item(gpus=0):
        with pytest.raises(vr.MeshError, match=r"ranks 0-1: ValueError: device_mesh\(device_type='cuda'\): this rank "
                                               r"has no GPU; use 'cpu', or leave device_type out"):
            mesh.run("vr.device_mesh('cuda')", timeout=30, fail_fast=False)
    assert mesh.run("import torch.distributed as dist\ndist.is_initialized()").values() == [False, False]
    assert mesh.run("vr.device_mesh('cpu').device_type", timeout=60).values() == ["cpu", "cpu"]


def test_device_mesh_is_made_again_over_the_group_reinit_process_group_gives(torch_mesh):
    """vr.reinit_process_group() on every rank (the documented recovery once a stock group was
    cut) leaves vr.device_mesh() working: cached while the default group stays, made over the
    new group after it (before, the cached one named the destroyed group's subgroups)."""
    sp = torch_mesh(gpus=4).split(gpus=("dp", "tp"), tp=2)
    sp.run("import torch.distributed as dist\ndm = vr.device_mesh()")
    use = "t = torch.ones(1); dist.all_reduce(t, group=vr.device_mesh().get_group('tp')); t.item()"
    assert sp.run(f"vr.device_mesh() is dm\n{use}").values() == [2.0] * 4
    sp.run("vr.reinit_process_group()", timeout=60)
    assert sp.run(f"{use}", timeout=60).values() == [2.0] * 4
    assert sp.run("vr.device_mesh() is not dm and vr.device_mesh() is vr.device_mesh()").values() == [True] * 4


class Where(vr.Actor):
    @vr.endpoint
    def coords_then_release(self):
        import threading

        import viceroy as vr

        seen = vr.context().coords
        threading.__dict__.setdefault("_viceroy_test_release", threading.Event()).set()
        return seen


def test_an_actor_answering_during_a_view_call_keeps_the_meshs_coords(torch_mesh):
    from tests.conftest import wait_running

    mesh = torch_mesh(gpus=2)
    where = mesh.spawn(Where)
    half = mesh.slice(gpus=slice(1, 2))
    fut = half.run(  # waits on its rank until the actor there has answered
        "import threading\n"
        "threading.__dict__.setdefault('_viceroy_test_release', threading.Event()).wait(30)\n"
        "coords", block=False)
    wait_running(half, "wait(30)")
    assert where.coords_then_release.call().get().values() == [{"gpus": 0}, {"gpus": 1}]
    assert fut.get(timeout=30).values() == [{"gpus": 0}]
