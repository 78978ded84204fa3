"""`MeshTensor.to_mesh`: a tensor handed from one view of a mesh to another of the same sizes
(pipeline stages), rank to rank over the data plane; the controller sends one command and no
data passes through it. On the ranks, `rank_ops.moved` does the send and the receive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from viceroy.runtime.shape import describe_meshes, format_rank_set
from viceroy.runtime.tensors import rank_ops
from viceroy.runtime.tensors.mesh_tensor import MeshTensor, where

if TYPE_CHECKING:
    from viceroy.runtime.tensors.engine import Engine


def move(source: Engine, t: MeshTensor, target: Engine) -> MeshTensor:
    """`t` (a tensor of `source`'s view) on `target`'s view: position i of the source view
    sends its tensor to position i of the target's (row-major), rank to rank. One call over the
    ranks of both views, after what each has queued; its failure surfaces at the next sync of either. Refused at once
    (MeshError, no handle) when a rank of either view is dead."""
    src, dst = source.mesh, target.mesh
    if src._controller is not dst._controller:
        raise source.foreign(target.describe(), what="to_mesh: ", usual=(
            f"to_mesh moves a tensor between views of one mesh; the tensor's mesh and the target are different "
            f"meshes ({describe_meshes((source.describe(), target.describe()))}): fetch it and push it instead"))
    if list(src.dims.values()) != list(dst.dims.values()):
        raise ValueError(
            f"to_mesh pairs ranks position by position, so the views need the same sizes; "
            f"the tensor is on ({source.describe()}), the target is ({target.describe()}): "
            "split, flatten or rename one to match")
    pairs = list(zip(src.ranks, dst.ranks, strict=True))
    movers = tuple(sorted({r for s, d in pairs if s != d for r in (s, d)}))
    union = sorted(set(src.ranks) | set(dst.ranks))
    with torch._C.DisableTorchFunctionSubclass():
        shape, dtype = tuple(t.shape), t.dtype
    tid = source._new_id()
    source.flush()
    target.flush()
    label = f"to_mesh ({source.describe()} -> {target.describe()})"
    view = src._reshaped(src._controller.shape.select(union))
    fut = view._run(rank_ops.moved, t._id, tid, pairs, movers, shape, dtype, where(), label,
                   block=False, label=f"to_mesh (ranks {format_rank_set(src.ranks)} -> "
                   f"{format_rank_set(dst.ranks)})", fail_fast=True)
    refused = fut.exception(0) if fut.done() else None
    if refused is not None:
        # Not sent (a rank of either view is dead): say so here, naming the ranks and the
        # restart, and give no handle, rather than one whose tensor exists nowhere.
        raise refused
    for engine in (source, target):
        with engine._send_lock:
            engine._pending.append(fut)
    return MeshTensor(torch.empty(shape, dtype=dtype, device="meta"), target, tid)
