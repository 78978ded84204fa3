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

from collections.abc import Mapping
from typing import Any

from viceroy.runtime.arguments import as_int
from viceroy.runtime.collectives.backend import check_op
from viceroy.runtime.tensors import rank_ops, rank_reads
from viceroy.runtime.tensors.mesh_tensor import MeshTensor

__all__ = ["MeshTensor", "assemble", "inspect", "reduce"]

_OPS = ("sum", "avg", "product", "min", "max")  # (the collectives take bitwise ones too)


def reduce(t: MeshTensor, op: str = "sum", dims: str | list[str] | None = None) -> MeshTensor:
    """Reduce across the ranks of `dims` (default: the whole mesh) over the data plane — the
    controller sends one command, the tensors move rank to rank. Returns a new MeshTensor
    holding the result on every rank of each group.

    >>> total = vr.reduce(b, "sum", dims="gpus")

    On the ranks' own tensors (rank code), use ``vr.all_reduce`` instead.
    """
    _check_mesh_tensor(t, "reduce")
    import torch

    with torch._C.DisableTorchFunctionSubclass():
        dtype = t.dtype
    check_op(op, dtype, "reduce", _OPS)  # as the ranks' all_reduce would, before anything is sent
    mesh = t._engine.mesh
    names = _reduce_dims(dims, list(mesh.dims))
    # Each rank's group: the ranks of this view that share its coordinates on the other dims.
    others = [d for d in mesh.dims if d not in names]
    groups: dict[int, tuple[int, ...]] = {}
    for coords, rank in zip(mesh._shape.coords(), mesh.ranks, strict=True):
        groups[rank] = tuple(mesh._shape.slice(**{d: coords[d] for d in others}).ranks)
    label = f"reduce over {', '.join(names)}"
    return t._engine.rank_op(t, rank_ops.reduced, op, groups, label)


def _reduce_dims(dims: Any, mesh_dims: list[str]) -> list[str]:
    """`dims` as a list of distinct names of the mesh's dims (None: all of them), checked before
    anything is sent."""
    if dims is None:
        return mesh_dims
    names = [dims] if isinstance(dims, str) else dims
    if not isinstance(names, list | tuple) or not all(isinstance(d, str) for d in names):
        raise TypeError(f"reduce: dims takes a dim name or a list of dim names (dims='gpus', dims=['dp', 'tp']), "
                        f"or None for the whole mesh; got {dims!r}. The mesh's dims are {', '.join(mesh_dims)}")
    if not names:  # (torch's sum(dim=[]) sums over every dim: say which is meant)
        raise ValueError(f"reduce: dims={dims!r} names no dim, so nothing would be reduced: name the dims to reduce "
                         f"over (dims={mesh_dims[0]!r}), or leave dims out for the whole mesh "
                         f"({', '.join(mesh_dims)})")
    for d in names:
        if d not in mesh_dims:
            raise ValueError(f"reduce: the mesh has no dim {d!r}; its dims are {', '.join(mesh_dims)}")
    twice = [d for i, d in enumerate(names) if d in names[:i]]
    if twice:
        raise ValueError(f"reduce: dims {list(names)} must name distinct dims of the mesh ({twice[0]!r} is named "
                         f"twice): name each once; its dims are {', '.join(mesh_dims)}")
    return list(names)


def _check_mesh_tensor(t: Any, name: str) -> None:
    if not isinstance(t, MeshTensor):
        raise TypeError(f"vr.{name} takes a MeshTensor (made under mesh.activate()); got {type(t).__name__}"
                        + (". In rank code, vr.all_reduce reduces a rank's own tensor" if name == "reduce" else ""))


def inspect(t: MeshTensor) -> Any:
    """Per rank: shape, dtype, device, min, max, mean, norm (a ValueMesh of dicts). A complex
    tensor has no min or max (None), a complex mean, and the norm of its complex values."""
    _check_mesh_tensor(t, "inspect")
    return t._engine.run_on_ranks(rank_reads.summary, t._id, label="inspect")


def assemble(t: MeshTensor, dims: Mapping[str, int]) -> Any:
    """One tensor from every rank's piece: each mesh dim named in `dims` is concatenated along
    the tensor dim it maps to (``{"gpus": 0}``); mesh dims not named must hold copies (the piece
    at index 0 is used)."""
    import torch

    _check_mesh_tensor(t, "assemble")
    mesh_dims = t._engine.mesh.dims
    if not isinstance(dims, Mapping):
        example = {dims if type(dims) is str and dims in mesh_dims else next(iter(mesh_dims), "gpus"): 0}
        raise TypeError(f"assemble: dims maps each mesh dim to the tensor dim its pieces are concatenated along "
                        f"(dims={example!r}); got {dims!r}. The mesh's dims are {', '.join(mesh_dims)}")
    unknown = [d for d in dims if d not in mesh_dims]
    if unknown:
        raise ValueError(f"assemble: the mesh has no dim {unknown[0]!r}; its dims are {', '.join(mesh_dims)}")
    ndim = t.dim()
    if ndim == 0 and dims:
        raise ValueError(f"assemble concatenates the pieces along tensor dims, and these are 0-d (one number per "
                         f"rank), with none to concatenate along: give them one first, "
                         f"vr.assemble(t.reshape(1), dims={dims!r}), or take t.fetch() for each rank's value")
    low, high = -max(ndim, 1), max(ndim, 1) - 1
    along: dict[str, int] = {}
    for d, k in dims.items():
        i = as_int(k)  # numpy's ints too
        if i is None:
            raise TypeError(f"assemble: mesh dim {d!r} maps to {k!r}: give a tensor dim, an int from {low} to {high} "
                            f"(the pieces have shape {list(t.shape)})")
        if not low <= i <= high:
            raise ValueError(f"assemble: mesh dim {d!r} maps to tensor dim {k!r}, but the pieces have "
                             f"{ndim} dim{'s' if ndim != 1 else ''} (shape {list(t.shape)}): give a tensor "
                             f"dim from {low} to {high}")
        along[d] = i
    pieces = t.fetch()
    vm = pieces.slice(**{d: 0 for d in mesh_dims if d not in dims}) if len(dims) < len(mesh_dims) else pieces
    order = [d for d in vm.dims]

    def build(prefix: dict[str, int], k: int) -> Any:
        if k == len(order):
            return vm.item(**prefix)
        d = order[k]
        parts = [build({**prefix, d: i}, k + 1) for i in range(vm.dims[d])]
        return torch.cat(parts, dim=along[d])

    return build({}, 0)
