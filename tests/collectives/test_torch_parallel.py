"""DTensor, FSDP2 and tensor parallelism run unchanged over `vr.device_mesh()` on CPU ranks (gloo):
the promise `device_mesh` makes, kept by running torch's own parallel APIs on a 2x2 mesh."""

from __future__ import annotations

TWO_D = """
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

dm = vr.device_mesh()
tp_ranks = dist.get_process_group_ranks(dm.get_group("tp"))
dp_ranks = dist.get_process_group_ranks(dm.get_group("dp"))

full = torch.arange(16.0).reshape(4, 4)
d = distribute_tensor(full, dm, [Shard(0), Shard(1)])
piece = d.to_local().tolist()
doubled = (d * 2).full_tensor()

def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

g = torch.Generator().manual_seed(coords["dp"])  # a data shard per dp row
X = torch.randn(64, 8, generator=g)
Y = X.sum(1, keepdim=True)
reference = net()(X).detach()
model = parallelize_module(net(), dm["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
tp_matches = torch.allclose(model(X), reference, atol=1e-5)
fully_shard(model, mesh=dm["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for _ in range(30):
    loss = torch.nn.functional.mse_loss(model(X), Y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
w = model[0].weight
"""


def test_dtensor_fsdp2_and_tensor_parallelism_run_over_the_device_mesh(torch_mesh):
    mesh = torch_mesh(dp=2, tp=2)
    mesh.run(TWO_D, timeout=120)
    # The DeviceMesh's groups are the viceroy mesh's dims: tp pairs ranks of one dp row.
    groups = mesh.run("tp_ranks, dp_ranks").values()
    assert groups == [([0, 1], [0, 2]), ([0, 1], [1, 3]), ([2, 3], [0, 2]), ([2, 3], [1, 3])]
    # DTensor: each rank holds its block of a tensor sharded over both dims.
    assert mesh.run("piece").values() == [[[0.0, 1.0], [4.0, 5.0]], [[2.0, 3.0], [6.0, 7.0]],
                                          [[8.0, 9.0], [12.0, 13.0]], [[10.0, 11.0], [14.0, 15.0]]]
    assert mesh.run("torch.equal(doubled, full * 2)").values() == [True] * 4
    # Tensor parallelism: the column/row-split model computes what the whole one does.
    assert mesh.run("tp_matches").values() == [True] * 4
    # FSDP2 over dp on top of TP: the loss falls on every rank, each holds a quarter of the
    # weight, and the weight gathered whole is the same everywhere.
    out = mesh.run("losses[-1] < 0.2 * losses[0], isinstance(w, DTensor), tuple(w.to_local().shape)").values()
    assert out == [(True, True, (8, 8))] * 4, out
    whole = mesh.run("w.full_tensor()").values()
    assert all(t.shape == (32, 8) and t.equal(whole[0]) for t in whole)
