"""What a MeshTensor cannot do on the controller, where only its shape and dtype are, and the
message that says what to do instead: ops that need the values (``t.item()``, ``bool(t)``), ops
whose result's shape depends on them (``t.nonzero()``), autograd (its graph is on the ranks), and
ops torch runs without the tensor engine seeing them (``t.set_``, ``torch.utils.swap_tensors``),
and ops given an argument that cannot travel to the ranks.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from viceroy.runtime import serialize

# Asking for data that lives on the ranks: explain instead of failing inside torch.
_NEEDS_DATA = {
    "item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__complex__", "__array__",
    "__reduce_ex__", "equal", "allclose", "is_nonzero", "cpu", "__contains__",
}
# Python's conversions, named as the user wrote them rather than by torch's dunders.
_AS_WRITTEN = {
    "__contains__": "`x in t`",
    "__bool__": "bool(t) (`if t:`, `while t:`, `t and ...`, `assert t`)",
    "__float__": "float(t)",
    "__int__": "int(t)",
    "__complex__": "complex(t)",
    "__index__": "using t as an int (range(t), a list index)",
    "__array__": "np.asarray(t)",
    "__reduce_ex__": "pickling a MeshTensor (it is a handle: pass it to mesh.run, which sends each rank its own)",
}
# Ops whose result's shape depends on the values: meta tensors cannot tell it.
_DATA_SHAPED = {"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "bincount"}
_HOW = ("use .fetch() for a ValueMesh of tensors or .fetch(gpus=0) for one rank's, or run it on the ranks "
        "with mesh.run(fn, t) (each rank calls fn on its own tensor)")
_GRAD = torch.Tensor.grad


def needs_data(what: str) -> str:
    """`what` (``item()``, ``indexing with a boolean mask``...) needs the values: where they are."""
    return f"{what} needs the data, which lives on the ranks (one tensor per rank): {_HOW}"


def check_needs_no_data(name: str, func: Any = None) -> None:
    """`name` (``item``, ``numpy``, ``__bool__``...) cannot run here: the data is on the ranks.
    Nor can autograd's ``backward`` and ``.grad``: the graph is on the ranks."""
    if name in _NEEDS_DATA:
        raise RuntimeError(needs_data(_AS_WRITTEN.get(name) or f"{name}()"))
    if name in _DATA_SHAPED:
        raise RuntimeError(data_shaped(f"{name}()"))
    if name == "backward" or (func is not None and getattr(func, "__self__", None) is _GRAD):
        if name != "backward" and _on_stack(_OPTIM):
            raise RuntimeError(
                "torch.optim on the controller: the gradients are on the ranks, where autograd runs, and the "
                "optimizer reads them. Make the optimizer on the ranks, and step it there after each backward: "
                "mesh.run(\"import torch; opt = torch.optim.SGD(model.parameters(), lr=0.1)\", model=model) once, then "
                "mesh.run(lambda loss: loss.backward(), loss) and mesh.run(\"opt.step(); opt.zero_grad()\") "
                "(a model built under mesh.activate() is each rank's own model there)")
        if _on_stack(_TRACER):
            raise RuntimeError(
                "torch.compile cannot trace a MeshTensor: it traces on the controller, where a MeshTensor has only "
                "its shape and dtype (its data is on the ranks). Call the function uncompiled under mesh.activate(), "
                "or compile it on the ranks, where the tensors are: mesh.run(lambda t: torch.compile(fn)(t), t)")
        what = "backward()" if name == "backward" else "a MeshTensor's .grad"
        raise RuntimeError(
            f"{what}: autograd runs on the ranks, where each rank's graph is, not on the controller. Run the step "
            "there: mesh.run(lambda loss: loss.backward(), loss), then mesh.run(lambda w: w.grad, w) "
            "(MeshTensors are handles there: each rank gets its own tensor)")


_APPLY = torch.nn.Module._apply.__code__


def module_reads_grad(func: Any) -> bool:
    """Whether `func` is ``.grad`` read by ``torch.nn.Module._apply`` (``model.to(...)``,
    ``.cuda()``, ``.double()``), to convert each parameter's gradient too. The controller cannot
    know whether a rank's parameter has one: it reads None there (the parameters are converted
    on the ranks; a gradient rank code made stays as it was)."""
    if getattr(func, "__self__", None) is not _GRAD:
        return False
    f = sys._getframe(1)
    for _ in range(12):  # (the read is in _apply itself, a few of the engine's frames up)
        if f is None:
            return False
        if f.f_code is _APPLY:
            return True
        f = f.f_back  # type: ignore[assignment]
    return False


# Dynamo's tracer: on the stack while torch.compile traces (not merely where a function is
# wrapped by dynamo, as ``optimizer.zero_grad`` is: torch._disable_dynamo).
_TRACER = os.path.join("torch", "_dynamo", "symbolic_convert.py")


_OPTIM = os.path.join("torch", "optim", "")


def _on_stack(part: str) -> bool:
    """Whether a frame of a file whose path holds `part` is on the stack: dynamo's tracer (it
    reads a MeshTensor's ``.grad`` as it wraps one), or torch.optim (it reads gradients)."""
    f = sys._getframe(1)
    while f is not None:
        if part in f.f_code.co_filename:
            return True
        f = f.f_back  # type: ignore[assignment]
    return False


def repointed(what: str) -> str:
    """Why a MeshTensor cannot be made to hold another tensor's storage (``set_``,
    ``torch.utils.swap_tensors``: torch runs them without asking the tensor engine)."""
    return (f"{what} cannot be done to a MeshTensor: torch does it without the tensor engine seeing it, so "
            "the controller's shape would change and the ranks' tensor would not. Bind the name to the other "
            "tensor instead (t = other, or t = other.clone() for a copy of its own), or copy values into "
            "t in place with t.copy_(other) (same shape)")


def autocast_refused(name: str) -> str:
    """Why op `name` is refused while ``torch.autocast`` is on (see `Engine.check_modes`)."""
    return (f"{name}: torch.autocast is on, but it reaches neither the ranks nor the meta tensors the controller "
            "checks ops on, so this op would run in full precision there. Nothing was sent: cast explicitly "
            "under mesh.activate() (x.to(torch.bfloat16), model.to(torch.bfloat16)), or run the autocast "
            "region on the ranks: mesh.run(fn, x), with torch.autocast inside fn")


def data_shaped(what: str) -> str:
    return (f"{what}: the result's shape depends on the values, which live on the ranks (one tensor per rank, "
            "each may differ), so the controller cannot check it: run it on the ranks with mesh.run(fn, t) "
            "(each rank calls fn on its own tensor), or fetch first: .fetch(gpus=0)")


def handle_in_op(op: str, ref: Any) -> str:
    """Why a torch op (`op`) cannot take `ref`, a `mesh.ref` handle, and how to bring its value in."""
    return (f"{op}: its argument {ref!r} is a handle to a value rank code made, not a MeshTensor, so the "
            "controller knows neither its shape nor its dtype. Bring it into the tensor engine: make a MeshTensor "
            "of its shape and dtype under mesh.activate() (t = torch.empty(shape, dtype=dtype)), then copy each "
            "rank's value into it: mesh.run(lambda t, v: t.copy_(v), t, ref); or run the op on the ranks: "
            "mesh.run(fn, ref)")


# Argument types that always travel (pickled by the standard pickler with the op).
_SENDABLE = frozenset({int, float, bool, complex, str, type(None), type(Ellipsis), slice, torch.dtype, torch.device,
                       torch.Size, torch.layout, torch.memory_format})


def check_sendable(name: str, leaves: list[Any]) -> None:
    """Every argument of op `name` (`leaves`: its tree's leaves) can travel to the ranks: else a
    TypeError here, at the user's line, with nothing queued. (Queued, it would stop its whole
    batch from going out at the next flush, far from its line, and the ops with it.)"""
    for x in leaves:
        if type(x) in _SENDABLE:
            continue
        if isinstance(x, torch.Tensor):
            if getattr(x, "_engine", None) is None and x.is_meta:  # (a MeshTensor is meta here: not local)
                # (A RuntimeError: ``t + x`` turns a TypeError into NotImplemented, and Python's
                # own message would then name neither the meta device nor what to do.)
                raise RuntimeError(f"{name}(): one of its arguments is a local tensor on the meta device "
                                f"(shape {list(x.shape)}), which has no values to send to the ranks. Nothing was "
                                "sent: make it under mesh.activate() (a MeshTensor: device=t.device, or no device, "
                                "makes it on each rank's own device), or as a local tensor on the CPU")
            continue
        try:
            serialize.dumps(x)
        except Exception as exc:
            shown = repr(x) if len(repr(x)) <= 120 else f"{repr(x)[:117]}..."
            raise TypeError(f"{name}(): its argument {shown} cannot be sent to the ranks: {exc}. Nothing was sent: "
                            "give it something picklable, or run it on the ranks: mesh.run(fn, t) (each rank "
                            "calls fn on its own tensor)") from None
