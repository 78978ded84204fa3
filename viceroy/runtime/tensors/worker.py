"""The tensor engine on a rank: a table of this rank's tensors by id, and the ops that fill it.

Functions here are sent by reference (this module is importable on every rank) and run on the
rank's main thread, in order with its other calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from viceroy.runtime.context import context

_TABLE = "__viceroy_tensors__"


@dataclass(frozen=True)
class Slot:
    """Stands for tensor `id` of the rank's table inside an op's arguments."""

    id: int


@dataclass
class Op:
    func: Any
    args: Any
    kwargs: dict[str, Any]
    out_ids: list[int | None]
    where: str
    factory: bool = False


class OpFailed(RuntimeError):
    """An op issued on the controller failed on this rank."""


def table() -> dict[int, Any]:
    tab: dict[int, Any] = context().namespace.setdefault(_TABLE, {})
    return tab


def _device() -> Any:
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def pack_ops(ops: list[Op]) -> bytes | list[Op]:
    """Ops pickled with the standard (C) pickler: torch functions and methods travel by name,
    several times faster than through cloudpickle. Ops holding code defined in a notebook
    (a lambda as an argument) need cloudpickle: those stay a list."""
    import pickle

    try:
        return pickle.dumps(ops, protocol=5)
    except Exception:
        return ops


def apply_batch(packed: bytes | list[Op], frees: list[int]) -> None:
    import pickle

    from torch.utils import _pytree as pytree

    ops: list[Op] = pickle.loads(packed) if isinstance(packed, bytes) else packed

    tab = table()

    def resolve(x: Any) -> Any:
        if isinstance(x, Slot):
            try:
                return tab[x.id]
            except KeyError:
                raise OpFailed(f"tensor #{x.id} does not exist here (an earlier op that made it failed)") from None
        return x

    try:
        for op in ops:
            name = getattr(op.func, "__name__", str(op.func))
            try:
                args, kwargs = pytree.tree_map(resolve, (op.args, op.kwargs))
                if op.factory and kwargs.get("device") in (None, "cuda"):
                    kwargs = {**kwargs, "device": _device()}
                out = op.func(*args, **kwargs)
            except OpFailed as exc:
                raise OpFailed(f"{name} (issued at {op.where}): {exc}") from None
            except Exception as exc:
                raise OpFailed(f"{name} (issued at {op.where}) failed: {type(exc).__name__}: {exc}") from exc
            for tid, leaf in zip(op.out_ids, pytree.tree_leaves(out), strict=False):
                if tid is not None:
                    tab[tid] = leaf
    finally:
        # Frees were recorded after every op of this batch that uses them was queued: apply
        # them last.
        for tid in frees:
            tab.pop(tid, None)


def reduced(t: Any, op: str, groups: dict[int, tuple[int, ...]], label: str) -> Any:
    """A reduced copy of `t` across this rank's group (computed on the controller from the
    view's dims), over the data plane."""
    from viceroy.runtime.collectives import all_reduce
    from viceroy.runtime.collectives.groups import Group

    return all_reduce(t.clone(), op=op, dims=Group(groups[context().rank], label))


def get(tid: int) -> Any:
    """This rank's tensor, on the CPU."""
    try:
        t = table()[tid]
    except KeyError:
        raise OpFailed(f"tensor #{tid} does not exist here (freed, or an op that made it failed)") from None
    return t.detach().cpu()


def summary(tid: int) -> dict[str, Any]:
    t = table()[tid]
    f = t.detach().float()
    return {
        "shape": tuple(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "device": str(t.device),
        "min": float(f.min()) if t.numel() else None,
        "max": float(f.max()) if t.numel() else None,
        "mean": float(f.mean()) if t.numel() else None,
        "norm": float(f.norm()) if t.numel() else None,
    }


def count() -> int:
    """How many engine tensors this rank holds (for tests and `inspect`)."""
    return len(table())
