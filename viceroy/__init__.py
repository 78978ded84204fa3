"""Viceroy: drive a mesh of processes, one per GPU, from one Python process or notebook.

    import viceroy as vr
    with vr.Mesh.local(gpus=4) as mesh:
        mesh.run("x = rank * 10\nx")          # ValueMesh of every rank's x

The tensor engine's functions (`reduce`, `inspect`, `assemble`) and `MeshTensor` are here too,
imported on first use: they need torch, and ``import viceroy`` does not import it.
"""

from typing import TYPE_CHECKING, Any

from viceroy.runtime.actors import Actor, ActorFailure, ActorMesh, endpoint
from viceroy.runtime.collectives import (
    CollectiveError,
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    check_collectives,
    recv,
    reduce_scatter,
    reinit_process_group,
    send,
)
from viceroy.runtime.context import Context, context
from viceroy.runtime.device_mesh import device_mesh
from viceroy.runtime.errors import MeshError, PreloadWarning, RankFailure
from viceroy.runtime.future import Future
from viceroy.runtime.mesh import Mesh
from viceroy.runtime.values import ValueMesh

__all__ = [
    "Actor",
    "ActorFailure",
    "ActorMesh",
    "CollectiveError",
    "Context",
    "Future",
    "Mesh",
    "MeshError",
    "PreloadWarning",
    "RankFailure",
    "ValueMesh",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "check_collectives",
    "context",
    "device_mesh",
    "endpoint",
    "recv",
    "reduce_scatter",
    "reinit_process_group",
    "send",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from viceroy.runtime.tensors import MeshTensor, assemble, inspect, reduce  # noqa: F401

_TENSOR_ENGINE = ("MeshTensor", "assemble", "inspect", "reduce")


def __getattr__(name: str) -> Any:
    """``vr.reduce(t, "sum", dims="gpus")``, ``vr.inspect(t)``, ``vr.assemble(t, dims=...)``:
    the tensor engine, imported (with torch) when first asked for."""
    if name in _TENSOR_ENGINE:
        from viceroy.runtime import tensors

        return getattr(tensors, name)
    raise AttributeError(f"module 'viceroy' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext viceroy`: the %mesh magics in any IPython kernel."""
    from viceroy.extension import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    from viceroy.extension import unload_ipython_extension as _unload

    _unload(ipython)
