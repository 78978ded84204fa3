"""The tensor engine: torch on the controller, tensors on the ranks.

    with mesh.activate():
        a = torch.randn(1024, 1024)          # a MeshTensor: one tensor per rank
        b = (a @ a.T).relu().sum(dim=0)      # shapes checked here; ops run on the ranks
    b.fetch()                                # ValueMesh of CPU tensors
    vr.inspect(b)                            # a small summary per rank
    vr.assemble(a, dims={"gpus": 0})         # the pieces concatenated along tensor dim 0

Importing this package imports torch; `import viceroy` does not.
"""

from __future__ import annotations

from typing import Any

from viceroy.runtime.tensors import worker
from viceroy.runtime.tensors.mesh_tensor import MeshTensor

__all__ = ["MeshTensor", "assemble", "inspect"]


def inspect(t: MeshTensor) -> Any:
    """Per rank: shape, dtype, device, min, max, mean, norm (a ValueMesh of dicts)."""
    return t._engine.run_on_ranks(worker.summary, t._id, label="inspect")


def assemble(t: MeshTensor, dims: dict[str, int]) -> Any:
    """One tensor from every rank's piece: each mesh dim named in `dims` is concatenated along
    the tensor dim it maps to (``{"gpus": 0}``); mesh dims not named must hold copies (the piece
    at index 0 is used)."""
    import torch

    mesh_dims = t._engine.mesh.dims
    unknown = [d for d in dims if d not in mesh_dims]
    if unknown:
        raise ValueError(f"assemble: the mesh has no dim {unknown[0]!r}; its dims are {', '.join(mesh_dims)}")
    pieces = t.fetch()
    vm = pieces.slice(**{d: 0 for d in mesh_dims if d not in dims}) if len(dims) < len(mesh_dims) else pieces
    order = [d for d in vm.dims]

    def build(prefix: dict[str, int], k: int) -> Any:
        if k == len(order):
            return vm.item(**prefix)
        d = order[k]
        parts = [build({**prefix, d: i}, k + 1) for i in range(vm.dims[d])]
        return torch.cat(parts, dim=dims[d])

    return build({}, 0)
