"""Collectives on real ranks (gloo, CPU tensors): results, groups along dims, arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest

import viceroy as vr
from tests.collectives.conftest import SETUP


def test_all_reduce_over_the_whole_mesh_and_along_each_dim(torch_mesh):
    mesh = torch_mesh(dp=2, tp=2)
    out = mesh.run(
        "t = torch.ones(3) * rank; vr.all_reduce(t)\n"
        "a = torch.ones(1) * rank; vr.all_reduce(a, dims='tp')\n"
        "b = torch.ones(1) * rank; vr.all_reduce(b, op='max', dims='dp')\n"
        "t.tolist(), a.item(), b.item()"
    )
    assert out.item(dp=0, tp=0) == ([6.0] * 3, 1.0, 2.0)
    assert out.item(dp=1, tp=1) == ([6.0] * 3, 5.0, 3.0)


def test_gather_scatter_broadcast_point_to_point_and_barrier(torch_mesh):
    mesh = torch_mesh(gpus=4)
    out = mesh.run(
        "g = vr.all_gather(torch.tensor([rank, 10 * rank]))\n"
        "s = vr.reduce_scatter(torch.arange(8.) + rank)\n"
        "w = torch.full((2,), float(rank)); vr.broadcast(w, src=2)\n"
        "avg = vr.all_reduce(torch.ones(1) * rank, op='avg').item()\n"
        "got = None\n"
        "if rank == 0: vr.send(torch.tensor([42.0]), dst=3)\n"
        "if rank == 3: got = vr.recv(torch.zeros(1), src=0).item()\n"
        "vr.barrier()\n"
        "g.tolist(), s.tolist(), w.tolist(), avg, got"
    )
    for r in range(4):
        g, s, w, avg, got = out.item(gpus=r)
        assert g == [[i, 10 * i] for i in range(4)]
        assert s == [4 * (2 * r) + 6, 4 * (2 * r + 1) + 6]  # sum over ranks of chunk r
        assert w == [2.0, 2.0]
        assert avg == 1.5
        assert got == (42.0 if r == 3 else None)


def test_ranks_other_than_0_talk_before_rank_0_ever_used_a_collective(torch_mesh):
    mesh = torch_mesh(gpus=3)
    pair = mesh.slice(gpus=slice(1, 3))  # rank 0 hosts the rendezvous store, and is not here
    got = pair.run(
        "got = None\n"
        "if rank == 1: vr.send(torch.tensor([7.0]), dst=2)\n"
        "if rank == 2: got = vr.recv(torch.zeros(1), src=1).item()\n"
        "got", timeout=30)
    assert got.values() == [None, 7.0]


def test_building_groups_reuses_a_ranks_store_connection(torch_mesh):
    # A TCPStore connect may take 5 s at random: torch resolves the peer's address back to a
    # name (getnameinfo on ::ffff:127.0.0.1, which /etc/hosts does not answer), on the client
    # and in the server's thread, and a DNS query left unanswered costs the resolver's 5 s. A
    # fresh client per group build made ~1 build in 3 stall. Counted, not timed: whether a
    # query goes unanswered depends on the machine's DNS, a count does not.
    mesh = torch_mesh(gpus=4)
    mesh.run("t = torch.ones(1); vr.all_reduce(t)")  # connected, one group built
    sp = mesh.split(gpus=("a", "b"), b=2)
    made = sp.run(
        "import torch.distributed as dist\n"
        "real, made = dist.TCPStore, []\n"
        "dist.TCPStore = lambda *a, **k: made.append(1) or real(*a, **k)\n"
        "try:\n"
        "    for pairs in ([(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]):  # a group each\n"
        "        lo, hi = next(p for p in pairs if rank in p)\n"
        "        t = torch.full((2,), float(rank))\n"
        "        vr.send(t, hi) if rank == lo else vr.recv(t, lo)\n"
        "    vr.all_reduce(t, dims='a'); vr.all_reduce(t, dims='b')\n"
        "finally:\n"
        "    dist.TCPStore = real\n"
        "len(made)", timeout=60)
    assert made.values() == [0, 0, 0, 0]  # five groups built on each rank, no new connection


def test_a_send_longer_than_a_wait_slice_arrives_whole(torch_mesh):
    mesh = torch_mesh(gpus=2)
    got = mesh.run(
        "t = torch.arange(32 << 20, dtype=torch.float32) if rank == 0 else torch.zeros(32 << 20)\n"
        "vr.barrier()\n"
        "if rank == 1: time.sleep(0.5)  # the sender waits for the receiver longer than a slice\n"
        "(vr.send(t, dst=1) if rank == 0 else vr.recv(t, src=0))\n"
        "bool((t == torch.arange(32 << 20, dtype=torch.float32)).all())", timeout=60)
    assert got.values() == [True, True]


def test_numpy_arrays_are_reduced_in_place(torch_mesh):
    mesh = torch_mesh(gpus=2)
    out = mesh.run("import numpy as np\na = np.ones(4, dtype=np.float32) * (rank + 1)\nvr.all_reduce(a); a.tolist()")
    assert out.item(gpus=1) == [3.0] * 4


def test_bad_arguments_fail_on_the_rank_with_what_to_do(torch_mesh):
    mesh = torch_mesh(gpus=2)
    with pytest.raises(vr.MeshError, match=r"its dims are \['gpus'\]"):
        mesh.run("vr.all_reduce(torch.ones(1), dims='hosts')")
    with pytest.raises(vr.MeshError, match="one of sum"):
        mesh.run("vr.all_reduce(torch.ones(1), op='mean')")
    with pytest.raises(vr.MeshError, match="cuts the first dim into 2 equal chunks"):
        mesh.run("vr.reduce_scatter(torch.ones(3))")
    with pytest.raises(vr.MeshError, match="contiguous"):
        mesh.run("vr.all_reduce(torch.ones(4, 4).t())")
    # A global rank given as src along a dim said only "src=3 is not a position in dims gpus at
    # hosts=1 (ranks 2-3) (0..1)"
    with pytest.raises(vr.MeshError, match=r"ValueError: broadcast: src=2 is not a position in the whole mesh \(ranks "
                                           r"0-1\), of 2 members: src counts 0\.\.1 along the group \(the sender's "
                                           r"position in it, its coordinate along the dim for one dim\)"):
        mesh.run("vr.broadcast(torch.ones(1), src=2)", fail_fast=False)
    # None of that touched a communicator: the next collective works.
    assert mesh.run("t = torch.ones(1); vr.all_reduce(t); t.item()").item(gpus=0) == 2.0


def test_arguments_of_the_wrong_kind_are_named_with_what_to_pass(torch_mesh):
    mesh = torch_mesh(gpus=2)
    for code, what in [
        ("vr.all_reduce(torch.ones(1), dims=0)", r"TypeError: dims takes a dim name or a list of dim names "
                                                 r"\(dims='gpus', dims=\['dp', 'tp'\]\), or None for the whole mesh; "
                                                 r"got 0\. This rank's dims are \['gpus'\]"),
        ("vr.all_gather(torch.ones(1), dims=['gpus', 1])", r"TypeError: dims takes .*got \['gpus', 1\]"),
        ("vr.all_reduce(torch.ones(2).to_sparse())", r"ValueError: all_reduce needs a dense tensor; this one is "
                                                     r"sparse_coo: pass t\.to_dense\(\)"),
        ("vr.broadcast(torch.ones(2, device='meta'))", r"ValueError: broadcast needs a tensor with data; this one is "
                                                       r"on the meta device"),
        # src/dst as a str reached `0 <= src` ("'<=' not supported between instances of 'int' and 'str'")
        ("vr.broadcast(torch.ones(1), src='0')", r"TypeError: broadcast: src must be an int, the sender's position in "
                                                 r"the group \(src=0\); got '0' \(str\)"),
        ("vr.broadcast(torch.ones(1), src=True)", r"TypeError: broadcast: src must be an int, .*; got True \(bool\)"),
        ("vr.send(torch.ones(1), dst='1')", r"TypeError: send: dst must be an int, the global rank to send to "
                                            r"\(dst=1\); got '1' \(str\)"),
        ("vr.recv(torch.ones(1), src=1.0)", r"TypeError: recv: src must be an int, the global rank to receive from "
                                            r"\(src=1\); got 1\.0 \(float\)"),
        # numpy arrays were told to call t.contiguous(), which they lack, and an object array got
        # torch's "can't convert np.ndarray of type numpy.object_"
        ("import numpy as np; vr.all_gather(np.ones((2, 2))[:, 0])",
         r"ValueError: all_gather needs a contiguous array: pass np\.ascontiguousarray\(a\)"),
        ("import numpy as np; vr.all_reduce(np.array([1, 'x'], dtype=object))",
         r"TypeError: all_reduce takes numpy arrays of numbers or bools; this one's dtype is object: convert it "
         r"\(a\.astype\(np\.float32\)\)"),
        # A read-only array was written all the same (np.frombuffer(b) changed the bytes b)
        ("import numpy as np; vr.broadcast(np.frombuffer(bytes(8), dtype=np.float32))",
         r"ValueError: broadcast writes its result into the array, and this one is read-only \(a view of bytes, or "
         r"writeable=False\): pass a writable copy \(a\.copy\(\)\)"),
        ("import numpy as np; vr.broadcast(np.float32(1))",
         r"TypeError: broadcast takes a torch tensor, a numpy array or a CuPy array; got a numpy float32: pass "
         r"np\.array\(\[x\]\)"),
    ]:
        with pytest.raises(vr.MeshError, match=what):
            mesh.run(code)
    assert mesh.run("t = torch.ones(1); vr.all_reduce(t, dims=('gpus',)); t.item()").values() == [2.0, 2.0]
    code = "t = torch.full((1,), rank + 1.0); vr.broadcast(t, src=torch.tensor(1)); t.item()"  # an int all the same
    assert mesh.run(code).values() == [2.0, 2.0]


def test_avg_of_an_integer_tensor_is_refused_before_anything_is_sent(torch_mesh):
    """As vr.reduce does: a ValueError saying what to do, the tensor untouched (not left holding
    the sum), and the group's communicator kept (not aborted and rebuilt)."""
    mesh = torch_mesh(gpus=2)
    mesh.run("from viceroy.runtime.collectives import entries as C\nvr.all_reduce(torch.ones(1))\n"
             "built = {k: id(e) for k, e in C.cache.items()}")
    for code in ("vr.all_reduce(t, op='avg')", "vr.reduce_scatter(torch.arange(4) + rank, op='avg')"):
        with pytest.raises(vr.MeshError, match="ValueError: .*'avg' needs a floating-point tensor; this one is "
                                               r"int64: convert it first \(t.float\(\)\)") as info:
            # (not fail-fast: a rank whose call was stopped before it began would have no `t`)
            mesh.run(f"t = torch.tensor([rank + 1])\n{code}", fail_fast=False)
        assert "aborted" not in str(info.value) and "CollectiveError" not in str(info.value)
        assert mesh.run("t.tolist()").values() == [[1], [2]]
    assert mesh.run("built == {k: id(e) for k, e in C.cache.items()}").values() == [True, True]
    assert mesh.run("t = torch.tensor([rank + 1.0]); vr.all_reduce(t, op='avg'); t.item()").values() == [1.5, 1.5]


@pytest.mark.parametrize("code, what", [
    ("vr.all_reduce(torch.ones(2), op='band')",
     r"ValueError: all_reduce 'band' is bitwise: it needs an integer or bool tensor; this one is float32"),
    ("vr.reduce_scatter(torch.ones(2, dtype=torch.complex64), op='max')",
     r"ValueError: reduce_scatter 'max' of a complex tensor: complex numbers are reduced with 'sum' or 'avg' only"),
])
def test_an_op_the_tensors_dtype_cannot_take_is_refused_before_anything_is_sent(torch_mesh, code, what):
    """gloo refused them once the collective had begun, on some ranks and not others (rank 1's
    'band' of floats completed while rank 0's failed), aborting the group's communicator."""
    mesh = torch_mesh(gpus=2)
    mesh.run("from viceroy.runtime.collectives import entries as C\nvr.all_reduce(torch.ones(1))\n"
             "built = {k: id(e) for k, e in C.cache.items()}")
    with pytest.raises(vr.MeshError, match=what) as info:
        mesh.run(code, fail_fast=False)
    assert "failed on 2 of 2 ranks" in str(info.value) and "aborted" not in str(info.value), info.value
    assert mesh.run("built == {k: id(e) for k, e in C.cache.items()}").values() == [True, True]
    assert mesh.run("t = torch.tensor([rank + 1]); vr.all_reduce(t, op='bxor'); t.item()").values() == [3, 3]


def test_stock_torch_distributed_code_runs_beside_viceroy_collectives(torch_mesh):
    mesh = torch_mesh(dp=2, tp=2)
    out = mesh.run(
        "import torch.distributed as dist\n"
        "dist.init_process_group()\n"  # env://, the mesh sets the variables
        "x = torch.ones(1) * rank; dist.all_reduce(x)\n"
        "y = torch.ones(1); vr.all_reduce(y, dims='tp')\n"
        "dm = vr.device_mesh()\n"
        "z = torch.ones(1); dist.all_reduce(z, group=dm.get_group('dp'))\n"
        "x.item(), y.item(), dm.mesh_dim_names, tuple(dm.mesh.shape), z.item()"
    )
    assert set(out.values()) == {(6.0, 2.0, ("dp", "tp"), (2, 2), 2.0)}


def test_reinit_process_group_with_a_backend_it_cannot_make_keeps_the_current_group(torch_mesh):
    # A misspelt backend destroyed the user's default group first, then failed in torch
    # ("AssertionError: Unknown backend type ncl"): no group left at all.
    mesh = torch_mesh(gpus=2)
    mesh.run("import torch.distributed as dist\ndist.init_process_group()")
    bad = {"ncl": r"'ncl' is no torch\.distributed backend \(gloo, nccl, "}
    if not mesh.run("dist.is_nccl_available()").item(gpus=0):
        bad["nccl"] = r"'nccl' is not available in this torch build"
    for backend, what in bad.items():
        with pytest.raises(vr.MeshError, match=rf"ranks 0-1: ValueError: reinit_process_group\(backend='{backend}'\): "
                                               rf"{what}.*; the current group is kept"):
            mesh.run(f"vr.reinit_process_group({backend!r})", timeout=30, fail_fast=False)
    got = mesh.run("t = torch.ones(1) * (rank + 1); dist.all_reduce(t); dist.is_initialized(), t.item()", timeout=30)
    assert got.values() == [(True, 3.0)] * 2


def test_nccl_is_skipped_with_a_clear_message_without_cupy_or_a_gpu():
    from viceroy.runtime.collectives.nccl import NcclBackend

    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here: bench/gpu_check.sh covers nccl")
    except ImportError:
        pass
    why = NcclBackend().unavailable()
    assert why is not None and "skipped: needs CuPy and a GPU" in why and "viceroy-kernel[gpu]" in why
    assert "cupy" not in sys.modules  # never half-imported


@pytest.mark.parametrize("uid", [bytes(range(256))[::2], tuple(range(-128, 128, 2))], ids=["cupy14", "cupy13"])
def test_the_nccl_unique_id_crosses_the_store_in_the_form_cupy_gave_it(uid):
    # CuPy 14 gives (and takes back) the id as bytes, CuPy 13 as a tuple of signed chars; the
    # ranks past the first build their communicator from what the store hands them.
    from viceroy.runtime.collectives.nccl import unique_id_from, unique_id_text

    back = unique_id_from(unique_id_text(uid).encode())  # TCPStore.get gives bytes
    assert back == uid and type(back) is type(uid)


def test_importing_viceroy_imports_neither_torch_nor_cupy():
    code = "import sys, viceroy; print('torch' in sys.modules, 'cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_taken_rendezvous_port_is_named_with_what_to_do(start_mesh):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        mesh = start_mesh(preload=["torch"], gpus=2, env={"MASTER_PORT": str(port)})
        with pytest.raises(vr.MeshError) as info:
            mesh.run("import torch, viceroy as vr\nvr.all_reduce(torch.ones(1))", timeout=60)
    text = str(info.value)
    assert f"MASTER_PORT {port} is taken on rank 0's host" in text, text
    assert "env={'MASTER_PORT'" in text and "--env MASTER_PORT=" in text


def test_the_rendezvous_port_can_be_chosen_for_every_mesh(start_mesh, monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("VICEROY_MASTER_PORT", str(port))
    mesh = start_mesh(preload=["torch"], gpus=2)
    assert mesh.run("import os\nos.environ['MASTER_PORT']").values() == [str(port)] * 2
    assert mesh.run("import torch, viceroy as vr\nt = torch.ones(1)\nvr.all_reduce(t)\nt.item()").values() == [2.0, 2.0]
    monkeypatch.setenv("VICEROY_MASTER_PORT", "http")
    with pytest.raises(ValueError, match="VICEROY_MASTER_PORT='http' is not a port number"):
        vr.Mesh.local(gpus=1, preload=[])


def test_the_collective_timeout_in_the_mesh_env_reaches_ranks_forked_from_a_torch_template(start_mesh):
    # The template imports the collectives before the mesh's environment is the rank's own.
    mesh = start_mesh(gpus=1, preload=["torch"], env={"VICEROY_COLLECTIVE_TIMEOUT": "7"})
    got = mesh.run("from viceroy.runtime.collectives import entries as c\nc.current_timeout()")
    assert got.values() == [7.0]


@pytest.mark.parametrize("value", ["10s", "0", "-5", "nan"])
def test_a_collective_timeout_in_the_env_that_is_no_number_of_seconds_is_named(start_mesh, value):
    # "10s" failed every collective with "could not convert string to float: '10s'", naming
    # neither the variable nor where it came from; "0" or "-5" built groups that gave up at once.
    mesh = start_mesh(gpus=2, preload=["torch"], env={"VICEROY_COLLECTIVE_TIMEOUT": value})
    mesh.run(SETUP)
    with pytest.raises(vr.MeshError, match=rf"ranks 0-1: ValueError: VICEROY_COLLECTIVE_TIMEOUT={value!r} \(in the "
                                           r"ranks' environment\) is no number of seconds > 0: set it to e\.g\. 600"):
        mesh.run("vr.all_reduce(torch.ones(1))", timeout=30, fail_fast=False)


def test_ranks_sharing_a_gpu_are_named_before_nccl_refuses_them():
    # NCCL's own word for two members on one GPU is "invalid usage": the group says which.
    # Members are [rank, host name, boot id, PCI bus id, device index].
    from viceroy.runtime.collectives.nccl import shared_gpus

    one_each = [[0, "a", "boot-a", "0000:1b:00.0", 0], [1, "a", "boot-a", "0000:2c:00.0", 1],
                [2, "b", "boot-b", "0000:1b:00.0", 0],
                [3, "a", "boot-c", "0000:1b:00.0", 0]]  # another machine of the same name
    assert shared_gpus(one_each) == ""
    why = shared_gpus([[0, "a", "boot-a", "0000:1b:00.0", 0], [1, "a", "boot-a", "0000:1b:00.0", 0],
                       [2, "a", "boot-a", "0000:1b:00.0", 0], [3, "b", "boot-b", "0000:1b:00.0", 0],
                       [4, "b", "boot-b", "0000:2c:00.0", 1]])
    assert why.startswith("ranks 0-2 share GPU 0 of a (0000:1b:00.0), and NCCL takes one rank per GPU"), why
    assert "(the group found 1 on a, 2 on b)" in why and "--backend gloo" in why
