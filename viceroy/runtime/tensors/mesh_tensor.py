"""`MeshTensor`: on the controller, a handle to one tensor per rank.

It is a torch.Tensor subclass over a *meta* tensor (shape and dtype, no data), so torch ops on
it run here on the meta device first: a shape or dtype error is raised at the user's line and
nothing reaches the ranks. Ops that pass are queued and sent to the ranks in order.

The common op (flat arguments: MeshTensors of one mesh among scalars, an op seen before) takes
the short road in `torch_function`: no tree walk, no meta kernel, one small tuple queued.
Everything else goes to `Engine.dispatch`.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import weakref
from typing import TYPE_CHECKING, Any

import torch

from viceroy.runtime.file_names import SHOWN, shown
from viceroy.runtime.shape import describe_meshes, describe_ranks
from viceroy.runtime.tensors.refusals import (
    check_needs_no_data,
    module_reads_grad,
    needs_data,
    repointed,
)
from viceroy.runtime.tensors.worker import IN_PLACE_DUNDERS

if TYPE_CHECKING:
    from viceroy.runtime.tensors.engine import Engine

BATCH_MAX = 256  # ops queued before a batch goes out on its own

# What a plan does with an op (the engine's meta-result cache, keyed by op and input signatures).
NEW = 0  # one new tensor
INPLACE = 1  # returns one of its inputs (index `plan.index`), same shape
VALUE = 2  # runs on the ranks, returns a plain value here (``__setitem__``: None)
ANSWER = 3  # a question about metadata (shape, dtype, dim...): answered here, nothing sent
GENERAL = 4  # anything else (several outputs, trees): Engine.dispatch builds the result

# Argument types whose value goes into a plan's key as it is (hashable, and few distinct values
# in a loop); anything else sends the op down the general road.
KEYABLE = frozenset({int, float, bool, str, type(None), type(Ellipsis), torch.dtype, torch.device, torch.Size})

_SIGS: dict[tuple[Any, ...], int] = {}
_SHAPES: dict[int, tuple[int, ...]] = {}  # sig -> its shape

_GETITEM = torch.Tensor.__getitem__
_ANY_INDEX = object()  # in the key of ``x[i]``: any int within x's first dim (one plan for all)


def sig_of(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, grad: bool = False) -> int:
    """A small int standing for (shape, stride, dtype, requires_grad): cheap to hash in a plan's
    key. Ids are never reused, so dropping the table (when huge) only costs cache misses."""
    key = (shape, stride, dtype, grad)
    sig = _SIGS.get(key)
    if sig is None:
        if len(_SIGS) >= 1 << 16:
            _SIGS.clear()
            _SHAPES.clear()
        global _next_sig
        _next_sig += 1
        sig = _SIGS[key] = _next_sig
        _SHAPES[sig] = shape
    return sig


_next_sig = 0


class MeshTensor(torch.Tensor):
    """One tensor per rank of a mesh, operated on from the controller.

    >>> with mesh.activate():
    ...     a = torch.randn(1024, 1024)
    ...     b = (a @ a.T).relu().sum(dim=0)
    >>> b                       # shape, dtype, mesh: nothing fetched
    >>> b.fetch()               # ValueMesh of CPU tensors
    """

    __slots__ = ("_engine", "_id", "_sig")
    _engine: Engine
    _id: int
    _sig: int  # sig_of(shape, stride, dtype): the key of the engine's meta-result cache

    @staticmethod
    def __new__(cls, meta: torch.Tensor, engine: Engine, tid: int, sig: int | None = None) -> MeshTensor:
        if sig is None:
            sig = sig_of(tuple(meta.shape), meta.stride(), meta.dtype, meta.requires_grad)
        return new(engine, meta, tid, sig)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # (all done in __new__)
        pass

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        return torch_function(cls, func, types, args, kwargs)

    @staticmethod
    def _fallback(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
        return _general(func, args, kwargs)

    # --- controller-side conveniences -----------------------------------------------------

    def fetch(self, **coords: int) -> Any:
        """Every rank's tensor (a ValueMesh of CPU tensors), or one rank's: ``fetch(gpus=0)``
        (a slice keeps its dim, as in mesh.slice: ``fetch(gpus=slice(0, 2))`` is a ValueMesh).
        Waits for the queued ops; an op that failed on a rank raises here, naming its line."""
        return self._engine.fetch(self, coords)

    def as_handle(self) -> tuple[Any, tuple[Any, ...]]:
        """How a MeshTensor travels to the ranks (an argument of `mesh.run`, a keyword of a
        code string, a controller name read by a `%%mesh` cell): as a handle that each rank
        resolves to its own tensor. The ops queued so far go out first, so it exists there.
        Rank code may change its values in place, not its shape or dtype."""
        from viceroy.runtime.tensors import rank_reads

        engine = self._engine
        engine.flush()
        return rank_reads.resolve, (self._id, engine.mesh._controller.token, engine.describe())

    def check_usable_on(self, controller: Any, shape: Any) -> None:
        """Raise here, before sending, when the ranks of `shape` cannot resolve this tensor."""
        from viceroy.runtime.shape import format_rank_set

        engine = self._engine
        if engine.mesh._controller is not controller:
            raise engine.foreign(shape.describe(), f"a MeshTensor of mesh ({engine.describe()}) cannot be used on "
                                 f"another mesh ({shape.describe()}): fetch it and push it instead")
        have = set(engine.mesh.ranks)
        missing = [r for r in shape.ranks if r not in have]
        if missing:
            raise ValueError(
                f"this MeshTensor has a piece on ranks {format_rank_set(have)} ({engine.describe()}); "
                f"ranks {format_rank_set(missing)} of this call have none: run on its view, or move "
                "it there with .to_mesh(view)")

    def to_mesh(self, mesh: Any) -> MeshTensor:
        """This tensor on another view of the same mesh, moved rank to rank over the data
        plane (the controller sends one command; no data passes through it). The views must
        have the same sizes; position i of this view sends to position i of `mesh`:

        >>> h1 = h0.to_mesh(mesh.slice(stage=1))   # h0 lives on mesh.slice(stage=0)

        The result lives on each target rank's own device (its GPU, or the CPU)."""
        from viceroy.runtime.mesh import Mesh
        from viceroy.runtime.tensors.engine import engine_for
        from viceroy.runtime.tensors.moves import move

        if not isinstance(mesh, Mesh):
            raise TypeError(f"to_mesh takes a Mesh (a view of this tensor's mesh), got {type(mesh).__name__}")
        return move(self._engine, self, engine_for(mesh))

    def __deepcopy__(self, memo: dict[int, Any]) -> MeshTensor:
        """``copy.deepcopy(t)``, and so of a model built under ``activate()`` (an EMA or target
        network): a copy of each rank's tensor, made on the ranks in order with the other ops
        (the same strides and requires_grad, and its ``.grad`` copied too; a leaf, with no
        history), as a new MeshTensor. What ``memo`` holds is kept (a tensor met twice is
        copied once), and so are attributes of this one (a Parameter stays a Parameter)."""
        done = memo.get(id(self))
        if done is not None:
            return done
        out = self._engine.copied(self)
        memo[id(self)] = out
        if self.__dict__:  # (``_is_param`` of a Parameter, the user's own attributes)
            out.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return out

    def set_(self, *args: Any, **kwargs: Any) -> MeshTensor:
        """Refused: torch's ``set_`` does not go through ``__torch_function__``, so the tensor
        engine would never see it; only the controller's meta tensor would change."""
        raise RuntimeError(repointed("t.set_(...)"))

    def __len__(self) -> int:
        """The size of dim 0, as for a tensor: metadata, answered here."""
        with torch._C.DisableTorchFunctionSubclass():
            shape = tuple(self.shape)
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    def __format__(self, spec: str) -> str:
        """``f"{t}"`` is the repr (shape, dtype, mesh); a format spec (``:.2f``) needs values."""
        if not spec:
            return repr(self)
        raise RuntimeError(needs_data(f"formatting a MeshTensor with {spec!r}"))

    def __contains__(self, item: Any) -> bool:
        raise RuntimeError(needs_data("`x in t`"))

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        with torch._C.DisableTorchFunctionSubclass():
            shape, dtype = tuple(self.shape), self.dtype
        return f"MeshTensor(shape={shape}, dtype={str(dtype).removeprefix('torch.')}, mesh={self._engine.describe()})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


class _Ref(weakref.ref):
    """The engine's weak reference to a MeshTensor: its callback frees tensor `tid` on the ranks
    (far cheaper per op than weakref.finalize; one shared callback, no closure per tensor)."""

    __slots__ = ("tid",)
    tid: int


_make_subclass = torch.Tensor._make_subclass
_default_dtype = torch.get_default_dtype
_grad_enabled = torch.is_grad_enabled
_autocast = torch._C._is_any_autocast_enabled


def new(engine: Engine, meta: torch.Tensor, tid: int, sig: int) -> MeshTensor:
    """A MeshTensor over (an alias of) `meta`, tracked so that the ranks free `tid` once it is
    garbage. `meta` may be shared: each MeshTensor gets its own alias of it."""
    t: MeshTensor = _make_subclass(MeshTensor, meta, meta.requires_grad)
    t._engine = engine
    t._id = tid
    t._sig = sig
    r = _Ref(t, engine._gone)
    r.tid = tid
    engine._refs[tid] = r
    return t


def torch_function(owner: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
    """``__torch_function__`` both of MeshTensor (`owner`: the class) and of the activate() mode
    (`owner`: the mode): one function, so that the common op costs one Python call.

    The short road: flat arguments (MeshTensors of one mesh among keyable values) and an op
    whose meta result is cached. Anything else goes to `owner._fallback`."""
    engine: Engine | None = None
    key: list[Any] = [func]
    ids: list[Any] = []
    for a in args:
        t = type(a)
        if t is MeshTensor:
            e = a._engine
            if e is not engine:
                if engine is not None:
                    break  # two meshes: the general road explains
                engine = e
            key.append(a._sig)
            ids.append(a._id)
        elif t in KEYABLE:
            key.append(t)  # the type too: 1, 1.0 and True are equal keys, not equal ops
            key.append(a)
            ids.append(a)
        else:
            break
    else:
        if engine is not None:
            if kwargs:
                for name, v in kwargs.items():
                    t = type(v)
                    if t not in KEYABLE:
                        return owner._fallback(func, args, kwargs)
                    key.append(name)
                    key.append(t)
                    key.append(v)
            else:
                kwargs = None
            if func is _GETITEM and len(key) == 4 and key[2] is int:
                # x[i] in a loop: the same plan for every i within the first dim (its value
                # still goes to the ranks); one out of it is keyed by value, and the meta run
                # raises torch's IndexError
                dims = _SHAPES.get(key[1])
                if dims and -dims[0] <= key[3] < dims[0]:
                    key[3] = _ANY_INDEX
            if _default_dtype() is not engine._dtype or _grad_enabled() is not engine._grad or _autocast():
                engine.check_modes(func)  # (before the plan: plans hold for one dtype and grad mode)
            k = tuple(key)
            plan = engine._plans.get(k)
            if plan is None:
                return engine.dispatch(func, args, kwargs or {}, flat=True, key=k)
            kind = plan.kind
            if kind is NEW:
                tid = next(engine._ids)
                out: Any = new(engine, plan.meta, tid, plan.sig)
            elif kind is INPLACE:
                out = args[plan.index]
                tid = out._id
            elif kind is ANSWER:
                return plan.answer
            elif kind is VALUE:
                out = plan.answer
                tid = None
            else:
                return engine.dispatch(func, args, kwargs or {}, flat=True, plan=plan)
            engine._enqueue((func, ids, kwargs, plan.slots, tid, where(), False))
            return out
    return owner._fallback(func, args, kwargs)


def mutates(name: str, kwargs: dict[str, Any] | None) -> bool:
    """Whether an op changes its first argument in place (``x.add_``, ``x[i] = v``, ``x += y``)
    or writes into ``out=``."""
    return (name.endswith("_") and not name.startswith("__")) or name in IN_PLACE_DUNDERS or \
        bool(kwargs and kwargs.get("out") is not None)


def _check_local_target(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """An op with a MeshTensor argument that would change a *local* tensor in place."""
    if not mutates(name, kwargs):
        return
    out = kwargs.get("out")
    targets = list(out) if isinstance(out, list | tuple) else [out] if out is not None else []
    if not targets and args:
        targets = [args[0]]
    if any(isinstance(x, torch.Tensor) and type(x) is not MeshTensor for x in targets):
        what = "loc[...] = mesh_t" if name == "__setitem__" else f"{name}(..., out=loc)" if out is not None \
            else f"loc.{name}(mesh_t)"
        # (A RuntimeError, as torch's own in-place refusals: ``loc += t`` turns a TypeError
        # into NotImplemented, and Python would then rebind loc to a new MeshTensor.)
        raise RuntimeError(
            f"{what}: a local tensor cannot be updated in place from rank data (a MeshTensor is one tensor per "
            "rank, on the ranks): compute a new MeshTensor instead (mesh_t + loc), or fetch first: "
            f"loc.{name if name != '__setitem__' else 'copy_'}(mesh_t.fetch(gpus=0))")


def _general(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """Any op with a MeshTensor among its arguments (nested, in two meshes, next to values
    that cannot key a plan)."""
    from torch.utils import _pytree as pytree

    kwargs = kwargs or {}
    name = getattr(func, "__name__", str(func))
    if module_reads_grad(func):
        return None
    check_needs_no_data(name, func)
    _check_local_target(name, args, kwargs)
    engines = {t._engine for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, MeshTensor)}
    if len(engines) > 1:
        if len({id(e.mesh._controller) for e in engines}) == 1:  # views of one mesh
            descs = sorted(f"{e.describe()}, {describe_ranks(e.mesh._shape.ranks)}" for e in engines)
            fix = ("bring one onto the other's view first: t.to_mesh(view) moves it rank to rank"
                   if len({len(e.mesh._shape.ranks) for e in engines}) == 1 else
                   "keep the work on one view, or move data with .fetch() and push")
            raise ValueError(f"{name} mixes tensors of different views of one mesh ({' and '.join(descs)}); {fix}")
        first, *rest = sorted(engines, key=lambda e: not e._controller.closed)  # one shut down first
        raise first.foreign(rest[0].describe(), what=f"{name}: ", usual=(
            f"{name} mixes tensors of different meshes ({describe_meshes(e.describe() for e in engines)}); "
            "move one with .fetch() and push, or keep the work on one mesh"))
    (engine,) = engines
    return engine.dispatch(func, args, kwargs)


_SKIP_DIRS = (
    os.path.dirname(str(torch.__file__)),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # viceroy/runtime
    os.path.dirname(os.path.abspath(str(contextlib.__file__))),
)
_SKIP_FILES: dict[str, bool] = {}  # file name -> inside torch, viceroy or the standard library


def _skip(name: str) -> bool:
    if len(_SKIP_FILES) > 4096:
        _SKIP_FILES.clear()
    inside = _SKIP_FILES[name] = name.startswith(_SKIP_DIRS)
    return inside


def where() -> tuple[str, int]:
    """The user's line that issued an op (outside torch, viceroy and the standard library):
    (file, line), looking from the frame that called this one's caller; the file as messages
    name it (`file_names`)."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        inside = _SKIP_FILES.get(name)
        if inside is None:
            inside = _skip(name)
        if not inside:
            return (SHOWN.get(name) or shown(name), f.f_lineno)
        f = f.f_back  # type: ignore[assignment]
    return ("?", 0)

