"""The engine's own operations on a rank, beside the user's torch ops that `worker` applies:
a reduction, a deep copy and a move to another view, each over the data plane where it needs
one. Sent by the engine as calls (`engine.rank_op`, batches, `view._run`)."""

from __future__ import annotations

from typing import Any

from viceroy.runtime.context import context
from viceroy.runtime.tensors.worker import OpFailed, failures, lookup, rank_device, table


def reduced(t: Any, op: str, groups: dict[int, tuple[int, ...]], label: str) -> Any:
    """A reduced copy of `t` across this rank's group (computed on the controller from the
    view's dims), over the data plane."""
    import torch

    from viceroy.runtime.collectives import all_reduce
    from viceroy.runtime.collectives.groups import Group

    # A contiguous copy: all_reduce needs one, and a view (``t.T``) clones to its own strides.
    return all_reduce(t.clone(memory_format=torch.contiguous_format), op=op, dims=Group(groups[context().rank], label))


reduced.op_name = "vr.reduce"  # type: ignore[attr-defined]  # (how messages name it: worker._name)


def deepcopied(t: Any) -> Any:
    """``copy.deepcopy`` of a MeshTensor issued on the controller, on this rank: a copy of the
    values (a clone: the same strides), with the same requires_grad and a copy of its ``.grad``;
    a leaf, with no history (torch's own deepcopy refuses a tensor that is not a leaf)."""
    import torch

    with torch.no_grad():
        out = t.clone()
        if t.is_leaf and t.grad is not None:
            out.grad = t.grad.clone()
    if t.requires_grad:
        out.requires_grad_(True)
    return out


deepcopied.op_name = "copy.deepcopy"  # type: ignore[attr-defined]


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
    at = f"to_mesh (issued at {where[0]}, line {where[1]})"
    try:
        out = None if to is None else lookup(tab, src).detach().to(rank_device()).contiguous()
        if out is not None and to == me:
            tab[dst] = out.clone()
            return
        into = None if frm is None else torch.empty(shape, dtype=dtype, device=rank_device())
        exchange(out, to, into, frm, Group(movers, label), "to_mesh")
    except OpFailed as exc:
        if frm is not None:
            failures()[dst] = f"{at} failed: {exc}"
        raise OpFailed(f"{at}: {exc}") from None
    except BaseException as exc:
        if frm is not None:  # the tensor it should have received has no value here
            why = ("was interrupted (its source rank failed, as the sync after it said, or the controller "
                   "stopped it)") if isinstance(exc, KeyboardInterrupt) else f"failed: {type(exc).__name__}: {exc}"
            failures()[dst] = f"{at} {why}"
        raise
    if into is not None:
        tab[dst] = into
