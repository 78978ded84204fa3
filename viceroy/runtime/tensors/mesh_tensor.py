"""`MeshTensor`: on the controller, a handle to one tensor per rank.

It is a torch.Tensor subclass over a *meta* tensor (shape and dtype, no data), so torch ops on
it run here on the meta device first: a shape or dtype error is raised at the user's line and
nothing reaches the ranks. Ops that pass are queued and sent to the ranks in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

if TYPE_CHECKING:
    from viceroy.runtime.tensors.engine import Engine

# Asking for data that lives on the ranks: explain instead of failing inside torch.
_NEEDS_DATA = {
    "item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__array__",
    "__len__", "__iter__", "__format__", "__reduce_ex__",
}


class MeshTensor(torch.Tensor):
    """One tensor per rank of a mesh, operated on from the controller.

    >>> with mesh.activate():
    ...     a = torch.randn(1024, 1024)
    ...     b = (a @ a.T).relu().sum(dim=0)
    >>> b                       # shape, dtype, mesh: nothing fetched
    >>> b.fetch()               # ValueMesh of CPU tensors
    """

    _engine: Engine
    _id: int
    _sig: tuple[Any, ...]  # (shape, stride, dtype): the key of the engine's meta-result cache

    @staticmethod
    def __new__(cls, meta: torch.Tensor, engine: Engine, tid: int, sig: tuple[Any, ...] | None = None) -> MeshTensor:
        t = torch.Tensor._make_subclass(cls, meta)
        t._engine = engine
        t._id = tid
        t._sig = sig or (tuple(meta.shape), meta.stride(), meta.dtype)
        engine.track(t, tid)
        return t

    def _refresh_sig(self) -> None:
        """After an in-place op, which may change the shape (``unsqueeze_``, ``resize_``)."""
        with torch._C.DisableTorchFunctionSubclass():
            self._sig = (tuple(self.shape), self.stride(), self.dtype)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # (all done in __new__)
        pass

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if not kwargs:  # the common case: MeshTensors of one mesh among plain arguments
            engine = None
            for a in args:
                t = type(a)
                if t is MeshTensor:
                    if engine is None:
                        engine = a._engine
                    elif a._engine is not engine:
                        break
                elif t is list or t is tuple or t is dict:
                    break
            else:
                if engine is not None and getattr(func, "__name__", None) not in _NEEDS_DATA:
                    return engine.dispatch(func, args, kwargs, flat=True)
        name = getattr(func, "__name__", str(func))
        if name in _NEEDS_DATA:
            raise RuntimeError(
                f"{name}() needs the data, which lives on the ranks (one tensor per rank): "
                "use .fetch() for a ValueMesh of tensors, or .fetch(gpus=0) for one rank's"
            )
        leaves = args if not kwargs and not any(isinstance(a, list | tuple | dict) for a in args) else pytree.tree_leaves((args, kwargs))
        engines = {t._engine for t in leaves if isinstance(t, MeshTensor)}
        if len(engines) > 1:
            descs = sorted(e.describe() for e in engines)
            raise ValueError(f"{name} mixes tensors of different meshes ({' and '.join(descs)}); "
                             "move one with .fetch() and push, or keep the work on one mesh")
        (engine,) = engines
        return engine.dispatch(func, args, kwargs)

    # --- controller-side conveniences -----------------------------------------------------

    def fetch(self, **coords: int) -> Any:
        """Every rank's tensor (a ValueMesh of CPU tensors), or one rank's: ``fetch(gpus=0)``.
        Waits for the queued ops; an op that failed on a rank raises here, naming its line."""
        return self._engine.fetch(self, coords)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        with torch._C.DisableTorchFunctionSubclass():
            shape, dtype = tuple(self.shape), self.dtype
        return f"MeshTensor(shape={shape}, dtype={str(dtype).removeprefix('torch.')}, mesh={self._engine.describe()})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))
