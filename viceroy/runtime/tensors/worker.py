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


# A queued op is a tuple (func, args, kwargs, slots, out, where, factory):
#   args, kwargs   the call's arguments; kwargs may be None
#   slots          positions in `args` holding tensor ids (flat arguments), or None: the
#                  arguments hold `Slot`s anywhere in their trees
#   out            the id the result gets (int), None (keep nothing), or a list with an id or
#                  None per leaf of the result
#   where          (file, line) of the controller line that issued it
#   factory        a tensor made from nothing: it goes on this rank's device unless placed
Op = tuple


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
            return _lookup(tab, x.id)
        return x

    try:
        for func, args, kwargs, slots, out, where, factory in ops:
            try:
                if slots is None:
                    args, kwargs = pytree.tree_map(resolve, (args, kwargs))
                elif slots:
                    args = list(args)
                    for i in slots:
                        try:
                            args[i] = tab[args[i]]
                        except KeyError:
                            raise OpFailed(_MISSING.format(args[i])) from None
                if factory and kwargs.get("device") in (None, "cuda"):
                    kwargs = {**kwargs, "device": _device()}
                result = func(*args, **kwargs) if kwargs else func(*args)
            except OpFailed as exc:
                raise OpFailed(f"{_name(func)} (issued at {where[0]}, line {where[1]}): {exc}") from None
            except Exception as exc:
                raise OpFailed(f"{_name(func)} (issued at {where[0]}, line {where[1]}) failed: "
                               f"{type(exc).__name__}: {exc}") from exc
            if type(out) is int:
                tab[out] = result
            elif out is not None:
                for tid, leaf in zip(out, pytree.tree_leaves(result), strict=False):
                    if tid is not None:
                        tab[tid] = leaf
    finally:
        # Frees were recorded after every op of this batch that uses them was queued: apply
        # them last.
        for tid in frees:
            tab.pop(tid, None)


_MISSING = ("tensor #{} does not exist here (an earlier op that made it failed or was interrupted, or this rank "
            "was restarted since)")


def _lookup(tab: dict[int, Any], tid: int) -> Any:
    try:
        return tab[tid]
    except KeyError:
        raise OpFailed(_MISSING.format(tid)) from None


def _name(func: Any) -> str:
    return getattr(func, "__name__", str(func))


def reduced(t: Any, op: str, groups: dict[int, tuple[int, ...]], label: str) -> Any:
    """A reduced copy of `t` across this rank's group (computed on the controller from the
    view's dims), over the data plane."""
    from viceroy.runtime.collectives import all_reduce
    from viceroy.runtime.collectives.groups import Group

    return all_reduce(t.clone(), op=op, dims=Group(groups[context().rank], label))


def moved(src: int, dst: int, pairs: list[tuple[int, int]], movers: tuple[int, ...], shape: tuple[int, ...],
          dtype: Any, where: tuple[str, int], label: str) -> None:
    """Tensor `src` of each source rank becomes tensor `dst` of its partner (`pairs`: (source
    rank, target rank)), rank to rank over the data plane; `movers` are the ranks that send or
    receive. The tensor lands on the target rank's own device. A rank paired with itself copies."""
    import torch

    from viceroy.runtime.collectives.api import exchange
    from viceroy.runtime.collectives.groups import Group

    me = context().rank
    to = next((d for s, d in pairs if s == me), None)
    frm = next((s for s, d in pairs if d == me), None)
    tab = table()
    try:
        out = None if to is None else _lookup(tab, src).detach().to(_device()).contiguous()
        if out is not None and to == me:
            tab[dst] = out.clone()
            return
        into = None if frm is None else torch.empty(shape, dtype=dtype, device=_device())
        exchange(out, to, into, frm, Group(movers, label), "to_mesh")
    except OpFailed as exc:
        raise OpFailed(f"to_mesh (issued at {where[0]}, line {where[1]}): {exc}") from None
    if into is not None:
        tab[dst] = into


def resolve(tid: int, token: str, describe: str) -> Any:
    """A MeshTensor sent to the ranks, as this rank's own tensor (see MeshTensor.as_handle)."""
    if context().mesh_token != token:
        raise ValueError(f"a MeshTensor of mesh ({describe}) reached a rank of another mesh")
    return _lookup(table(), tid)


def get(tid: int) -> Any:
    """This rank's tensor, on the CPU."""
    return _lookup(table(), tid).detach().cpu()


def summary(tid: int) -> dict[str, Any]:
    t = _lookup(table(), tid)
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
