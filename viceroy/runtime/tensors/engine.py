"""The tensor engine on the controller: checks each torch op on meta tensors, queues it, and
sends queued ops to the ranks in order, in batches (one mesh call per batch, not per op).

An op that fails on a rank surfaces at the next fetch, with the controller line that issued it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from viceroy.runtime.errors import MeshError
from viceroy.runtime.tensors import worker
from viceroy.runtime.tensors.mesh_tensor import MeshTensor

if TYPE_CHECKING:
    from viceroy.runtime.mesh import Mesh

# Torch functions that make tensors from nothing: under activate() they make MeshTensors.
FACTORIES = {
    torch.randn, torch.rand, torch.randint, torch.zeros, torch.ones, torch.empty, torch.full,
    torch.arange, torch.linspace, torch.eye, torch.tensor, torch.randperm, torch.normal,
}
BATCH_MAX = 256  # ops queued before a batch goes out on its own
_SKIP_DIRS = (
    os.path.dirname(str(torch.__file__)),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # viceroy/runtime
    os.path.dirname(os.path.abspath(str(contextlib.__file__))),
)


class Engine:
    """One per mesh view: the queue of ops for its ranks and the ids of their tensors."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self._next_id = 0
        self._lock = threading.Lock()
        self._queue: list[worker.Op] = []
        self._frees: list[int] = []
        self._pending: list[Any] = []  # futures of batches sent
        # Meta results by op signature: a loop of the same ops is checked once, not each time
        # (meta kernels cost up to a millisecond each).
        self._plans: dict[Any, _Plan] = {}
        self._refs: dict[int, weakref.ref[MeshTensor]] = {}

    def describe(self) -> str:
        return self.mesh._shape.describe()

    # --- recording -----------------------------------------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def factory(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> MeshTensor:
        with torch._C.DisableTorchFunctionSubclass():
            meta = func(*args, **{**kwargs, "device": "meta"})
        tid = self._new_id()
        self._enqueue(worker.Op(func, args, kwargs, [tid], _where(), factory=True))
        return MeshTensor(meta, self, tid)

    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], flat: bool = False) -> Any:
        """Check `func` on meta tensors here (raising shape errors at the user's line), then
        queue it for the ranks and return MeshTensors for its tensor outputs. `flat`: the
        caller saw that no argument is a container."""
        flat = flat or (not any(isinstance(x, _CONTAINERS) for x in args) and not any(
            isinstance(x, _CONTAINERS) for x in kwargs.values()
        ))
        in_leaves = [*args, *kwargs.values()] if flat else pytree.tree_leaves((args, kwargs))
        key = _signature(func, in_leaves)
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            plan = _plan(func, args, kwargs, in_leaves)
            if key is not None and len(self._plans) < 4096:
                self._plans[key] = plan
        if plan.answer is not _NO_ANSWER:
            return plan.answer  # a question about metadata (shape, dtype, dim...): answered here
        out_ids: list[int | None] = []
        results: list[Any] = []
        for kind, value in plan.outputs:
            if kind == "value":
                out_ids.append(None)
                results.append(value)
            elif kind == "input":  # in place: the op returned its input
                same = in_leaves[value]
                same._refresh_sig()
                out_ids.append(same._id)
                results.append(same)
            else:
                shape, stride, dtype = value
                tid = self._new_id()
                out_ids.append(tid)
                meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
                results.append(MeshTensor(meta, self, tid, value))  # value: the tensor's signature
        if flat:
            slot_args = tuple(_to_slot(x) for x in args)
            slot_kwargs = {k: _to_slot(v) for k, v in kwargs.items()}
        else:
            slot_args, slot_kwargs = pytree.tree_map(_to_slot, (args, kwargs))
        self._enqueue(worker.Op(func, slot_args, slot_kwargs, out_ids, _where()))
        return results[0] if plan.single else pytree.tree_unflatten(results, plan.spec)

    def rank_op(self, t: MeshTensor, fn: Any, *args: Any) -> MeshTensor:
        """Queue ``fn(tensor, *args)`` on every rank; its result (same shape and dtype) becomes
        a new MeshTensor. For functions meta tensors cannot check, like collectives."""
        with torch._C.DisableTorchFunctionSubclass():
            meta = torch.empty_like(t.as_subclass(torch.Tensor))
        tid = self._new_id()
        self._enqueue(worker.Op(fn, (worker.Slot(t._id), *args), {}, [tid], _where()))
        return MeshTensor(meta, self, tid)

    def _enqueue(self, op: worker.Op) -> None:
        self._queue.append(op)
        if len(self._queue) >= BATCH_MAX:
            self.flush()

    def track(self, t: MeshTensor, tid: int) -> None:
        """Free tensor `tid` on the ranks once `t` is garbage (a weak reference's callback: far
        cheaper per op than weakref.finalize)."""
        def gone(_ref: weakref.ref[MeshTensor], tid: int = tid) -> None:
            self.release(tid)

        self._refs[tid] = weakref.ref(t, gone)

    def release(self, tid: int) -> None:
        """A MeshTensor was garbage-collected: free its tensor on the ranks, with the next batch."""
        self._refs.pop(tid, None)
        with self._lock:
            self._frees.append(tid)
            n = len(self._frees)
        if n >= BATCH_MAX and not self.mesh._controller.closed:
            try:
                self.flush()
            except Exception:
                pass  # the next flush retries; never raise from a finalizer

    # --- sending ---------------------------------------------------------------------------

    def flush(self) -> None:
        with self._lock:
            ops, self._queue = self._queue, []
            frees, self._frees = self._frees, []
        if not ops and not frees:
            return
        if self.mesh._controller.closed:
            return
        # No fail-fast: every rank runs its own ops to the end (or to its own error), so the
        # ranks' tensor tables stay consistent with each other.
        fut = self.mesh.run(worker.apply_batch, worker.pack_ops(ops), frees, block=False, label="tensor ops", fail_fast=False)
        self._pending.append(fut)

    def sync(self) -> None:
        """Send what is queued and wait for it; raise the first failure."""
        self.flush()
        pending, self._pending = self._pending, []
        first: BaseException | None = None
        for fut in pending:
            try:
                fut.get()
            except MeshError as exc:
                first = first or exc
        if first is not None:
            raise first

    def fetch(self, t: MeshTensor, coords: dict[str, int]) -> Any:
        self.sync()
        view = self.mesh.slice(**coords) if coords else self.mesh
        vals = view.run(worker.get, t._id, label="fetch")
        return vals.values()[0] if coords and len(view.ranks) == 1 else vals

    def run_on_ranks(self, fn: Any, *args: Any, label: str) -> Any:
        """Call a worker function after every queued op has run."""
        self.sync()
        return self.mesh.run(fn, *args, label=label)


class _ActivateMode(TorchFunctionMode):
    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func not in FACTORIES:
            for x in args:
                if type(x) is MeshTensor:
                    # Straight to the tensor's own handler: calling func again would cost a
                    # second round of torch's dispatch for the same answer.
                    return MeshTensor.__torch_function__(func, types, args, kwargs)
            return func(*args, **kwargs)
        if not any(isinstance(x, MeshTensor) for x in pytree.tree_leaves((args, kwargs))):
            if kwargs.get("device") not in (None, "cuda"):
                return func(*args, **kwargs)  # an explicit device: a local tensor, on purpose
            return self.engine.factory(func, args, kwargs)
        return func(*args, **kwargs)


@contextmanager
def activate(engine: Engine) -> Iterator[Engine]:
    with _ActivateMode(engine):
        yield engine
    engine.flush()


_NO_ANSWER = object()


@dataclass(frozen=True)
class _Plan:
    """What an op makes, from its meta run: per output leaf ("value", v) | ("input", index of
    the input leaf it returns) | ("new", (shape, stride, dtype)); or a direct `answer`."""

    outputs: tuple[tuple[str, Any], ...]
    spec: Any
    answer: Any = _NO_ANSWER
    single: bool = False  # the op returns one tensor (the common case: no tree to rebuild)


def _plan(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], in_leaves: list[Any]) -> _Plan:
    with torch._C.DisableTorchFunctionSubclass():
        metas = {id(x): x.as_subclass(torch.Tensor) for x in in_leaves if isinstance(x, MeshTensor)}
        meta_args, meta_kwargs = pytree.tree_map(lambda x: metas.get(id(x), x), (args, kwargs))
        out = func(*meta_args, **meta_kwargs)
    leaves, spec = pytree.tree_flatten(out)
    name = getattr(func, "__name__", "")
    if not any(isinstance(leaf, torch.Tensor) for leaf in leaves) and not (name.endswith("_") or name == "__setitem__"):
        return _Plan((), spec, answer=out)
    meta_leaves = pytree.tree_leaves((meta_args, meta_kwargs))
    outputs: list[tuple[str, Any]] = []
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            outputs.append(("value", leaf))
            continue
        same = next((i for i, m in enumerate(meta_leaves) if m is leaf and isinstance(in_leaves[i], MeshTensor)), None)
        if same is not None:
            outputs.append(("input", same))
        else:
            outputs.append(("new", (tuple(leaf.shape), tuple(leaf.stride()), leaf.dtype)))
    return _Plan(tuple(outputs), spec, single=not isinstance(out, _CONTAINERS) and len(outputs) == 1)


_CONTAINERS = (list, tuple, dict)


def _signature(func: Any, leaves: list[Any]) -> Any:
    """A hashable key for an op and the shapes of its inputs; None when not cacheable."""
    parts: list[Any] = [func]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            if not isinstance(x, MeshTensor):
                return None  # a local tensor's values may matter (indexing): check each time
            parts.append(x._sig)
        elif isinstance(x, int | float | bool | str | type(None) | torch.dtype | torch.device | slice | type(Ellipsis)):
            parts.append((type(x), x if not isinstance(x, slice) else (x.start, x.stop, x.step)))
        else:
            return None
    return tuple(parts)


def _to_slot(x: Any) -> Any:
    return worker.Slot(x._id) if isinstance(x, MeshTensor) else x


def _where() -> str:
    """The user's line that issued an op (outside torch and viceroy)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_SKIP_DIRS):
        f = f.f_back  # type: ignore[assignment]
    if f is None:
        return "?"
    return f"{f.f_code.co_filename}, line {f.f_lineno}"
